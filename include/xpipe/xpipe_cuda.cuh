// Umbrella header of the CUDA backend: xpipe.hpp plus the CUDA tag, context and element loops,
// which every launcher in kernels/ops.hpp then runs on. Include from CUDA translation units
// linked to xpipe::cuda.
#pragma once

#include "xpipe/xpipe.hpp"
#include "xpipe/backend/cuda.cuh"

static_assert(xpipe::Backend<xpipe::Cuda>);
