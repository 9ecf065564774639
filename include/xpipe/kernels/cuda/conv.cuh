// ConvPlans<Cuda>: 2-D convolution on the GPU by im2col and cuBLAS, the passes and their math
// shared with the host (kernels/im2col.hpp); this file owns the workspace and checks shapes.
#pragma once

#if !defined(__CUDACC__)
#error "xpipe/kernels/cuda/conv.cuh is for CUDA translation units (nvcc); link xpipe::cuda"
#endif

#include <string>

#include "xpipe/backend/cuda.cuh"
#include "xpipe/core/config.hpp"
#include "xpipe/core/conv_geometry.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/kernels/im2col.hpp"

namespace xpipe {

//! The CUDA backend's convolution: im2col and one cuBLAS SGEMM per chunk of images
//! (Im2colConvPlans, kernels/im2col.hpp, whose passes the host tests run too).
//! Usage: `ConvPlans<Cuda> plans{g}; plans.forward(ctx, g, x, w, b, y);`
template <>
class ConvPlans<Cuda> : public Im2colConvPlans<Cuda> {
 public:
  using Im2colConvPlans<Cuda>::Im2colConvPlans;
};

}  // namespace xpipe
