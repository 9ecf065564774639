// Umbrella header of the CUDA backend: xpipe.hpp plus the CUDA tag, context and element loops,
// which every launcher in kernels/ops.hpp then runs on, the Linear layer's cuBLASLt epilogues,
// the vectorised loops of the flat optimizer and prediction passes, the device loss sums and
// the CUDA executor. Include from CUDA translation units linked to xpipe::cuda.
#pragma once

#include "xpipe/backend/cuda.cuh"
#include "xpipe/exec/cuda.cuh"
#include "xpipe/kernels/cuda/linear.cuh"
#include "xpipe/kernels/cuda/vectorized.cuh"
#include "xpipe/layers/loss.cuh"
#include "xpipe/xpipe.hpp"

static_assert(xpipe::Backend<xpipe::Cuda>);
