// Umbrella header of the CUDA backend: xpipe.hpp plus the CUDA tag, context and element loops,
// which every launcher in kernels/ops.hpp then runs on. Include from CUDA translation units
// linked to xpipe::cuda.
#pragma once

#include "xpipe/backend/cuda.cuh"
#include "xpipe/exec/cuda.cuh"
#include "xpipe/layers/loss.cuh"
#include "xpipe/xpipe.hpp"

static_assert(xpipe::Backend<xpipe::Cuda>);
