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

//! The CUDA backend's convolution: per chunk of images, an im2col kernel, one cuBLAS SGEMM (the
//! backend's row-major gemm, on the context's handle and stream) and a kernel that moves the
//! result between NCHW and channel-major (adding the bias in the forward). Why the column
//! matrices of a chunk sit side by side, (c k k) x (chunk oh ow), rather than one per image
//! for a strided-batched GEMM: one GEMM's N is then chunk oh ow, wide enough to fill cuBLAS's
//! tiles even for 4 x 4 images, and the weight gradient is one GEMM over every pixel of the
//! chunk instead of a GEMM per image (or per-image partial gradients summed after), the chunks
//! added with beta = 1 in order. The price is one pass over y or dy, oc oh ow floats an image;
//! the forward needs that pass for its bias anyway. The bias gradient sums each image's channel
//! in pixel order, then the images in order. Every call is asynchronous on ctx.stream and
//! allocates nothing; one plan gives the same bits on every run (cuBLAS pedantic FP32 math, as
//! CudaStreamContext sets, takes one algorithm per shape).
//! Usage: `ConvPlans<Cuda> plans{g}; plans.forward(ctx, g, x, w, b, y);`
template <>
class ConvPlans<Cuda> {
 public:
  //! Floats of the column and channel buffers together by default (64 MiB): chunk() is the most
  //! images that fit, at least 1, at most g.rows.
  static constexpr index_t default_workspace_floats = index_t{1} << 24;

  //! g.rows: the most images one call may take. Allocates the workspace on the current device
  //! (make the stage's device current first, as Pipeline does), the only allocation: every call
  //! after runs in it. `workspace_floats` bounds the column and channel buffers.
  explicit ConvPlans(const ConvGeometry& g, index_t workspace_floats = default_workspace_floats)
      : max_(g),
        chunk_(conv_chunk(g, workspace_floats)),
        cols_(conv_workspace_floats(g, chunk_).cols),
        channels_(conv_workspace_floats(g, chunk_).channels),
        plane_sums_(conv_workspace_floats(g, chunk_).plane_sums) {}

  //! y = conv(x, w) + b; b is unused when !g.bias. x: g.rows NCHW images, w: OIHW, y: NCHW.
  void forward(const CudaContext& ctx, const ConvGeometry& g, const float* x, const float* w,
               const float* b, float* y) {
    check(g, "forward");
    conv_forward_im2col(ctx, g, workspace(), x, w, b, y);
  }

  //! dx = conv^T(dy, w), the input gradient; overwrites dx.
  void backward_data(const CudaContext& ctx, const ConvGeometry& g, const float* w, const float* dy,
                     float* dx) {
    check(g, "backward_data");
    conv_backward_data_im2col(ctx, g, workspace(), w, dy, dx);
  }

  //! dw (+)= the weight gradient over all g.rows images; db (+)= dy summed over images and pixels
  //! per channel (db unused when !g.bias). `accumulate` adds to dw and db instead of overwriting.
  void backward_weights(const CudaContext& ctx, const ConvGeometry& g, const float* x,
                        const float* dy, float* dw, float* db, bool accumulate) {
    check(g, "backward_weights");
    conv_backward_weights_im2col(ctx, g, workspace(), x, dy, dw, db, accumulate);
  }

  //! Both gradients of one call, as ConvPlans<Host>::backward: dx (skipped when null), then
  //! dw (+)= and db (+)=. x is unused by the input gradient; the weights' pass reads it.
  void backward(const CudaContext& ctx, const ConvGeometry& g, const float* x, const float* w,
                const float* dy, float* dx, float* dw, float* db, bool accumulate) {
    if (dx != nullptr) backward_data(ctx, g, w, dy, dx);
    backward_weights(ctx, g, x, dy, dw, db, accumulate);
  }

  //! The most images one GEMM takes (the chunk the workspace holds).
  index_t chunk() const { return chunk_; }
  //! The geometry the plans were made for (rows: the most images a call may take).
  const ConvGeometry& geometry() const { return max_; }

 private:
  // The workspace is sized for max_: a call may take fewer images, never more or another shape.
  void check(const ConvGeometry& g, const char* call) const {
    if (g.rows <= 0 || g.rows > max_.rows || !(g.with_rows(max_.rows) == max_))
      throw ShapeError(std::string("xpipe: ConvPlans<Cuda>::") + call + ": convolution " +
                       conv_geometry_text(g) + " does not fit the plans made for " +
                       conv_geometry_text(max_));
  }

  ConvWorkspace workspace() { return {cols_.data(), channels_.data(), plane_sums_.data(), chunk_}; }

  ConvGeometry max_;
  index_t chunk_;
  DeviceBuffer<float> cols_, channels_, plane_sums_;
};

}  // namespace xpipe
