// Umbrella header of the CUDA backend: xpipe.hpp plus the CUDA tag, context and launchers.
// Include from CUDA translation units linked to xpipe::cuda.
#pragma once

#include "xpipe/xpipe.hpp"
#include "xpipe/backend/cuda.cuh"
#include "xpipe/kernels/cuda/ops.cuh"

static_assert(xpipe::Backend<xpipe::Cuda>);
