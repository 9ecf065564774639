// Umbrella header of the CUDA backend: xpipe.hpp plus the CUDA tag, context and element loops
// (vectorised for the flat optimizer and prediction passes), which every launcher in
// kernels/ops.hpp then runs on, the Linear layer's cuBLASLt epilogues, the device loss sums and
// the CUDA executor. Include from CUDA translation units linked to xpipe::cuda.
#pragma once

#include "xpipe/backend/cuda.cuh"
#include "xpipe/exec/cuda.cuh"
#include "xpipe/kernels/cuda/attention.cuh"
#include "xpipe/kernels/cuda/conv.cuh"
#include "xpipe/kernels/cuda/linear.cuh"
#include "xpipe/layers/loss.cuh"
#include "xpipe/xpipe.hpp"

static_assert(xpipe::check_device_backend<xpipe::Cuda>());
