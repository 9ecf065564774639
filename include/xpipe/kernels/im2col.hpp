// 2-D convolution as GEMMs over column matrices (im2col), written once for every backend: the
// per-element math, its launchers, and the chunked forward / backward passes built on them.
#pragma once

#include <string>

#include "xpipe/backend/backend.hpp"  // the host backend and its gemm; CUDA's: backend/cuda.cuh
#include "xpipe/core/config.hpp"
#include "xpipe/core/conv_geometry.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/core/tensor.hpp"
#include "xpipe/kernels/ops.hpp"  // bias_grad: the second pass of the bias gradient

// A backend's convolution, specialised per backend (backend/host_conv.hpp, kernels/cuda/conv.cuh);
// declared here too, in the one spelling both headers use, so either may come first.
// clang-format off
namespace xpipe { template <class B> class ConvPlans; }
// clang-format on

// The column matrix of one image has a row per weight of an output channel, r = (ci k + ky) k +
// kx (OIHW's order, so the weights are an oc x (c k k) row-major matrix as stored), and a column
// per output pixel, p = oy ow + ox; so y_image = W cols, one GEMM. A chunk of n images keeps its
// column matrices side by side, (c k k) x (n oh ow) with image i in columns [i P, i P + P) (P =
// oh ow): then one GEMM covers the chunk (wide N even where images are small), and the weight
// gradient dW = dY cols^T is one GEMM whose inner dimension runs over every pixel of every image
// of the chunk, in the order the library fixes for that shape. Its left operand dY must then be
// oc x (n P), channel-major, which NCHW's dy is not: one pass copies it so (and the forward's
// GEMM output back, adding the bias on the way, a pass the bias needs anyway).

namespace xpipe {

namespace math {

//! Entry (r, p) of one image's column matrix: the input pixel weight r meets at output pixel p,
//! or 0 where the window lies over the zero padding. Usage:
//! `cols[r * P + p] = math::im2col_entry(g, x + i * g.in_floats(), r, p);`
XPIPE_HOST_DEVICE float im2col_entry(const ConvGeometry& g, const float* image, index_t r,
                                     index_t p) {
  // Split the row into (channel, kernel row, kernel column) and the column into the output pixel.
  const int kx = static_cast<int>(r % g.k), ky = static_cast<int>(r / g.k % g.k);
  const index_t ci = r / (static_cast<index_t>(g.k) * g.k);
  const int oy = static_cast<int>(p / g.ow), ox = static_cast<int>(p % g.ow);
  // The input pixel under that weight: the window's corner (oy s - pad, ox s - pad) plus (ky, kx).
  const int iy = oy * g.stride - g.pad + ky, ix = ox * g.stride - g.pad + kx;
  // Outside the image it reads the zero padding.
  if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) return 0.f;
  return image[(ci * g.h + iy) * g.w + ix];
}

//! The input gradient at pixel (ci, iy, ix) of one image: the sum of the entries of its column
//! matrix's gradient that im2col_entry filled from that pixel, gathered (no two threads write one
//! place, so no atomics) in the order ky, then kx, ascending: the same bits on every backend and
//! run. `cols` points at the image's column 0 and `ld` is the column buffer's row length.
//! Usage: `dx[(ci * g.h + iy) * g.w + ix] = math::col2im_entry(g, cols, ld, ci, iy, ix);`
XPIPE_HOST_DEVICE float col2im_entry(const ConvGeometry& g, const float* cols, index_t ld, int ci,
                                     int iy, int ix) {
  float acc = 0.f;
  // Kernel row ky reads this pixel from the output row oy with oy s - pad + ky = iy: that oy must
  // be whole, so only the ky congruent to iy + pad modulo the stride qualify.
  for (int ky = (iy + g.pad) % g.stride; ky < g.k; ky += g.stride) {
    // Larger ky reach back to earlier output rows: once before row 0, no later ky has one; an
    // oy past the last output row is a window the convolution does not have (this ky adds 0).
    if (iy + g.pad - ky < 0) break;
    const int oy = (iy + g.pad - ky) / g.stride;
    if (oy >= g.oh) continue;
    // Likewise along the row: kernel column kx meets it at output column ox.
    for (int kx = (ix + g.pad) % g.stride; kx < g.k; kx += g.stride) {
      if (ix + g.pad - kx < 0) break;
      const int ox = (ix + g.pad - kx) / g.stride;
      if (ox >= g.ow) continue;
      // Entry (r, p) of the column gradient, r = (ci k + ky) k + kx, p = oy ow + ox.
      const index_t r = (static_cast<index_t>(ci) * g.k + ky) * g.k + kx;
      acc += cols[r * ld + static_cast<index_t>(oy) * g.ow + ox];
    }
  }
  return acc;
}

//! v[0] + v[1] + ... + v[n - 1], added in that order: one image's channel of dy summed, the first
//! of the bias gradient's two passes. Usage: `sums[r] = math::plane_sum(dy + r * P, P);`
XPIPE_HOST_DEVICE float plane_sum(const float* v, index_t n) {
  float acc = 0.f;
  // The adds stay in order (the bits must not depend on the backend); unrolling only lets a GPU
  // thread issue several loads before their adds wait on them.
  XPIPE_UNROLL(8)
  for (index_t i = 0; i < n; ++i) acc += v[i];
  return acc;
}

}  // namespace math

namespace ops {

//! The column matrices of images [first, first + n) side by side: element (row R = r n + i,
//! column p) of an (c k k n) x P loop is entry (r, i P + p) of the (c k k) x (n P) buffer.
struct Im2col {
  ConvGeometry g;
  const float* x;
  index_t first, n;
  float* cols;
  XPIPE_HOST_DEVICE void operator()(index_t row, index_t p) const {
    const index_t r = row / n, i = row - r * n;
    const index_t P = static_cast<index_t>(g.oh) * g.ow;
    cols[row * P + p] = math::im2col_entry(g, x + (first + i) * g.in_floats(), r, p);
  }
};

//! dx of images [first, first + n) from their column gradients: element (row i c + ci, pixel q)
//! of an (n c) x (h w) loop, one input pixel each.
struct Col2im {
  ConvGeometry g;
  const float* cols;
  index_t first, n;
  float* dx;
  XPIPE_HOST_DEVICE void operator()(index_t row, index_t q) const {
    const index_t i = row / g.c, P = static_cast<index_t>(g.oh) * g.ow;
    const int ci = static_cast<int>(row - i * g.c);
    const int iy = static_cast<int>(q / g.w), ix = static_cast<int>(q % g.w);
    dx[(first * g.c + row) * g.h * g.w + q] =
        math::col2im_entry(g, cols + i * P, n * P, ci, iy, ix);
  }
};

//! y of images [first, first + n) from the GEMM's channel-major oc x (n P) output, plus the bias
//! (none where bias is null): element (row i oc + o, pixel p) of an (n oc) x P loop.
struct ImagesFromChannels {
  ConvGeometry g;
  const float* channels;
  const float* bias;
  index_t first, n;
  float* y;
  XPIPE_HOST_DEVICE void operator()(index_t row, index_t p) const {
    const index_t i = row / g.oc, o = row - i * g.oc, P = static_cast<index_t>(g.oh) * g.ow;
    float v = channels[(o * n + i) * P + p];
    if (bias != nullptr) v += bias[o];
    y[(first * g.oc + row) * P + p] = v;
  }
};

//! dy of images [first, first + n) copied channel-major, oc x (n P), the GEMMs' operand: element
//! (row o n + i, pixel p) of an (oc n) x P loop.
struct ChannelsFromImages {
  ConvGeometry g;
  const float* dy;
  index_t first, n;
  float* channels;
  XPIPE_HOST_DEVICE void operator()(index_t row, index_t p) const {
    const index_t o = row / n, i = row - o * n, P = static_cast<index_t>(g.oh) * g.ow;
    channels[row * P + p] = dy[((first + i) * g.oc + o) * P + p];
  }
};

//! sums[j] = the sum of plane j of dy (image j / oc, channel j % oc), in pixel order.
struct PlaneSums {
  const float* dy;
  index_t pixels;
  float* sums;
  XPIPE_HOST_DEVICE void operator()(index_t j) const {
    sums[j] = math::plane_sum(dy + j * pixels, pixels);
  }
};

}  // namespace ops

//! Fills the (c k k) x (n P) column buffer `cols` (P = oh ow; the layout is described at the top
//! of this file) from images [first, first + n) of x, NCHW rows of g.in_floats() floats.
//! Usage: `im2col(ctx, g, x, 0, g.rows, cols);`
template <class Ctx>
void im2col(const Ctx& ctx, const ConvGeometry& g, const float* x, index_t first, index_t n,
            float* cols) {
  const index_t kk = static_cast<index_t>(g.c) * g.k * g.k;
  for_each_element(ctx, kk * n, static_cast<index_t>(g.oh) * g.ow,
                   ops::Im2col{g, x, first, n, cols});
}

//! Writes dx of images [first, first + n) from their column gradients in `cols` (laid out as
//! im2col's): the adjoint of im2col, each input pixel gathering what it fed. Overwrites dx there.
//! Usage: `col2im(ctx, g, cols, 0, g.rows, dx);`
template <class Ctx>
void col2im(const Ctx& ctx, const ConvGeometry& g, const float* cols, index_t first, index_t n,
            float* dx) {
  for_each_element(ctx, n * g.c, static_cast<index_t>(g.h) * g.w,
                   ops::Col2im{g, cols, first, n, dx});
}

//! y[first + i][o][p] = channels[o][i P + p] + bias[o] (no bias where `bias` is null): the
//! convolution's bias added while its GEMM output, oc x (n P), returns to NCHW rows.
//! Usage: `conv_bias_to_images(ctx, g, channels, b, first, n, y);`
template <class Ctx>
void conv_bias_to_images(const Ctx& ctx, const ConvGeometry& g, const float* channels,
                         const float* bias, index_t first, index_t n, float* y) {
  for_each_element(ctx, n * g.oc, static_cast<index_t>(g.oh) * g.ow,
                   ops::ImagesFromChannels{g, channels, bias, first, n, y});
}

//! channels[o][i P + p] = dy[first + i][o][p]: NCHW rows of dy copied channel-major, oc x (n P).
//! Usage: `conv_images_to_channels(ctx, g, dy, first, n, channels);`
template <class Ctx>
void conv_images_to_channels(const Ctx& ctx, const ConvGeometry& g, const float* dy, index_t first,
                             index_t n, float* channels) {
  for_each_element(ctx, g.oc * n, static_cast<index_t>(g.oh) * g.ow,
                   ops::ChannelsFromImages{g, dy, first, n, channels});
}

//! db[o] (+)= the sum of dy over g.rows images and their oh ow pixels, in a fixed order: each
//! (image, channel) plane summed in pixel order into `sums` (g.rows x oc floats), then those
//! summed in image order (bias_grad). The same bits on every thread count and both backends.
//! Usage: `conv_bias_grad(ctx, g, dy, sums, db, false);`
template <class Ctx>
void conv_bias_grad(const Ctx& ctx, const ConvGeometry& g, const float* dy, float* sums, float* db,
                    bool accumulate) {
  const index_t planes = g.rows * g.oc, pixels = static_cast<index_t>(g.oh) * g.ow;
  for_each_index(ctx, planes, planes * pixels, ops::PlaneSums{dy, pixels, sums});
  bias_grad(ctx, ConstMatrix{sums, g.rows, g.oc}, db, accumulate);
}

//! The buffers of an im2col convolution that takes up to `chunk` images per GEMM, in the
//! context's memory; conv_workspace_floats says how large each must be.
struct ConvWorkspace {
  float* cols = nullptr;        //!< (c k k) x (chunk P): a chunk's column matrices
  float* channels = nullptr;    //!< oc x (chunk P): a chunk's y or dy, channel-major
  float* plane_sums = nullptr;  //!< g.rows x oc: dy summed per image and channel
  index_t chunk = 1;
};

//! The floats of ConvWorkspace's cols, channels and plane_sums for g and a chunk of images.
struct ConvWorkspaceFloats {
  index_t cols, channels, plane_sums;
};
inline ConvWorkspaceFloats conv_workspace_floats(const ConvGeometry& g, index_t chunk) {
  const index_t pixels = static_cast<index_t>(g.oh) * g.ow;
  return {static_cast<index_t>(g.c) * g.k * g.k * chunk * pixels, g.oc * chunk * pixels,
          g.rows * g.oc};
}

//! The most images (1 to g.rows) whose cols and channels fit in `floats` floats together.
inline index_t conv_chunk(const ConvGeometry& g, index_t floats) {
  const ConvWorkspaceFloats one = conv_workspace_floats(g, 1);
  const index_t fit = floats / (one.cols + one.channels);
  return fit < 1 ? 1 : fit > g.rows ? g.rows : fit;
}

//! y = conv(x, w) + b (b unused when !g.bias), ws.chunk images at a time: im2col, one GEMM
//! W (oc x c k k) times the columns, then back to NCHW with the bias. Usage:
//! `conv_forward_im2col(ctx, g, ws, x, w, b, y);`
template <class Ctx>
void conv_forward_im2col(const Ctx& ctx, const ConvGeometry& g, const ConvWorkspace& ws,
                         const float* x, const float* w, const float* b, float* y) {
  const index_t kk = static_cast<index_t>(g.c) * g.k * g.k,
                pixels = static_cast<index_t>(g.oh) * g.ow;
  for (index_t first = 0; first < g.rows; first += ws.chunk) {
    const index_t n = g.rows - first < ws.chunk ? g.rows - first : ws.chunk, cols = n * pixels;
    im2col(ctx, g, x, first, n, ws.cols);
    gemm(ctx, Trans::No, Trans::No, g.oc, cols, kk, 1.f, w, kk, ws.cols, cols, 0.f, ws.channels,
         cols);
    conv_bias_to_images(ctx, g, ws.channels, g.bias ? b : nullptr, first, n, y);
  }
}

//! dx = conv^T(dy, w): per chunk, dy channel-major, the column gradients W^T dY in one GEMM,
//! then col2im. Overwrites dx. Usage: `conv_backward_data_im2col(ctx, g, ws, w, dy, dx);`
template <class Ctx>
void conv_backward_data_im2col(const Ctx& ctx, const ConvGeometry& g, const ConvWorkspace& ws,
                               const float* w, const float* dy, float* dx) {
  const index_t kk = static_cast<index_t>(g.c) * g.k * g.k,
                pixels = static_cast<index_t>(g.oh) * g.ow;
  for (index_t first = 0; first < g.rows; first += ws.chunk) {
    const index_t n = g.rows - first < ws.chunk ? g.rows - first : ws.chunk, cols = n * pixels;
    conv_images_to_channels(ctx, g, dy, first, n, ws.channels);
    gemm(ctx, Trans::Yes, Trans::No, kk, cols, g.oc, 1.f, w, kk, ws.channels, cols, 0.f, ws.cols,
         cols);
    col2im(ctx, g, ws.cols, first, n, dx);
  }
}

//! dw (+)= sum over images of dy_i cols_i^T and db (+)= dy summed per channel (skipped when
//! !g.bias). Per chunk one GEMM dY (oc x n P) times the columns transposed, each chunk added with
//! beta = 1 in chunk order onto the first (which overwrites unless `accumulate`): a fixed order,
//! so one plan gives the same bits on every run. Usage:
//! `conv_backward_weights_im2col(ctx, g, ws, x, dy, dw, db, false);`
template <class Ctx>
void conv_backward_weights_im2col(const Ctx& ctx, const ConvGeometry& g, const ConvWorkspace& ws,
                                  const float* x, const float* dy, float* dw, float* db,
                                  bool accumulate) {
  const index_t kk = static_cast<index_t>(g.c) * g.k * g.k,
                pixels = static_cast<index_t>(g.oh) * g.ow;
  for (index_t first = 0; first < g.rows; first += ws.chunk) {
    const index_t n = g.rows - first < ws.chunk ? g.rows - first : ws.chunk, cols = n * pixels;
    im2col(ctx, g, x, first, n, ws.cols);
    conv_images_to_channels(ctx, g, dy, first, n, ws.channels);
    const float beta = first == 0 && !accumulate ? 0.f : 1.f;
    gemm(ctx, Trans::No, Trans::Yes, g.oc, kk, cols, 1.f, ws.channels, cols, ws.cols, cols, beta,
         dw, kk);
  }
  if (g.bias) conv_bias_grad(ctx, g, dy, ws.plane_sums, db, accumulate);
}

//! The im2col convolution of a backend B (CUDA's ConvPlans, and the emulated device's in the
//! tests): per chunk of images, an im2col kernel, one cuBLAS SGEMM (the
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
//! CudaStreamContext sets, takes one algorithm per shape). backward_data and backward_weights
//! are also the two parts of a split backward (Conv2d::backward_input, backward_weight): nothing
//! passes between them but x and dy, so a slot's weight part may run after other slots' work.
//! Usage: `Im2colConvPlans<Cuda> plans{g}; plans.forward(ctx, g, x, w, b, y);`
template <class B>
class Im2colConvPlans {
 public:
  //! Floats of the column and channel buffers together by default (64 MiB): chunk() is the most
  //! images that fit, at least 1, at most g.rows.
  static constexpr index_t default_workspace_floats = index_t{1} << 24;

  //! g.rows: the most images one call may take. Allocates the workspace on the current device
  //! (make the stage's device current first, as Pipeline does), the only allocation: every call
  //! after runs in it. `workspace_floats` bounds the column and channel buffers.
  explicit Im2colConvPlans(const ConvGeometry& g,
                           index_t workspace_floats = default_workspace_floats)
      : max_(g),
        chunk_(conv_chunk(g, workspace_floats)),
        cols_(conv_workspace_floats(g, chunk_).cols),
        channels_(conv_workspace_floats(g, chunk_).channels),
        plane_sums_(conv_workspace_floats(g, chunk_).plane_sums) {}

  //! y = conv(x, w) + b; b is unused when !g.bias. x: g.rows NCHW images, w: OIHW, y: NCHW.
  void forward(const typename B::Context& ctx, const ConvGeometry& g, const float* x,
               const float* w, const float* b, float* y) {
    check(g, "forward");
    conv_forward_im2col(ctx, g, workspace(), x, w, b, y);
  }

  //! dx = conv^T(dy, w), the input gradient; overwrites dx.
  void backward_data(const typename B::Context& ctx, const ConvGeometry& g, const float* w,
                     const float* dy, float* dx) {
    check(g, "backward_data");
    conv_backward_data_im2col(ctx, g, workspace(), w, dy, dx);
  }

  //! dw (+)= the weight gradient over all g.rows images; db (+)= dy summed over images and pixels
  //! per channel (db unused when !g.bias). `accumulate` adds to dw and db instead of overwriting.
  void backward_weights(const typename B::Context& ctx, const ConvGeometry& g, const float* x,
                        const float* dy, float* dw, float* db, bool accumulate) {
    check(g, "backward_weights");
    conv_backward_weights_im2col(ctx, g, workspace(), x, dy, dw, db, accumulate);
  }

  //! Both gradients of one call, as ConvPlans<Host>::backward: dx (skipped when null), then
  //! dw (+)= and db (+)=. x is unused by the input gradient; the weights' pass reads it.
  void backward(const typename B::Context& ctx, const ConvGeometry& g, const float* x,
                const float* w, const float* dy, float* dx, float* dw, float* db, bool accumulate) {
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
      throw ShapeError(std::string("xpipe: ConvPlans<" + std::string(B::name) + ">::") + call +
                       ": convolution " + conv_geometry_text(g) +
                       " does not fit the plans made for " + conv_geometry_text(max_));
  }

  ConvWorkspace workspace() { return {cols_.data(), channels_.data(), plane_sums_.data(), chunk_}; }

  ConvGeometry max_;
  index_t chunk_;
  typename B::template Buffer<float> cols_, channels_, plane_sums_;
};

}  // namespace xpipe
