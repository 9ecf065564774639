// 2-D convolution as GEMMs over column matrices (im2col), written once for every backend: the
// per-element math, its launchers, and the chunked forward / backward passes built on them.
#pragma once

#include <string>

#include "xpipe/backend/backend.hpp"  // the host backend and its gemm; CUDA's: backend/cuda.cuh
#include "xpipe/core/config.hpp"
#include "xpipe/core/conv_geometry.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/core/shape.hpp"  // image_index: where a channels-last image keeps a value
#include "xpipe/core/tensor.hpp"
#include "xpipe/kernels/ops.hpp"  // bias_activation_forward, bias_grad: the bias's passes

// A backend's convolution, specialised per backend (backend/host_conv.hpp, kernels/cuda/conv.cuh);
// declared here too, in the one spelling both headers use, so either may come first.
// clang-format off
namespace xpipe { template <class B> class ConvPlans; }
// clang-format on

// Images are channels-last: an image of oc x oh x ow is P = oh ow rows of oc floats, one per
// output pixel, and the images of a batch follow each other, so a chunk of n images' y is one
// (n P) x oc row-major matrix. The column matrix is laid out to match, pixel-major: (n P) x
// (c k k) row-major, row i P + p holding the patch under output pixel p of image i, its columns
// in OIHW's order r = (ci k + ky) k + kx (so the weights are an oc x (c k k) row-major matrix as
// stored). Then every GEMM takes y or dy as they lie: Y = cols W^T is written straight into y,
// the column gradients are dY W, the weight gradient dW = dY^T cols; no pass moves a chunk to
// and from channel-major, only the bias keeps a pass of its own (added over y; dy summed per
// image and channel). One GEMM covers a chunk (M = n P, tall even where images are small), and
// the weight gradient's inner dimension runs over every pixel of every image of the chunk, in the
// order the library fixes for that shape.

namespace xpipe {

namespace math {

//! Entry (p, r) of one image's column matrix: the input value weight r meets at output pixel p,
//! or 0 where the window lies over the zero padding. `image` is channels-last. Usage:
//! `cols[(i * P + p) * ckk + r] = math::im2col_entry(g, x + i * g.in_floats(), r, p);`
XPIPE_HOST_DEVICE float im2col_entry(const ConvGeometry& g, const float* image, index_t r,
                                     index_t p) {
  // Split the column into (channel, kernel row, kernel column) and the row into the output pixel.
  const int kx = static_cast<int>(r % g.k), ky = static_cast<int>(r / g.k % g.k);
  const int ci = static_cast<int>(r / (static_cast<index_t>(g.k) * g.k));
  const int oy = static_cast<int>(p / g.ow), ox = static_cast<int>(p % g.ow);
  // The input pixel under that weight: the window's corner (oy s - pad, ox s - pad) plus (ky, kx).
  const int iy = oy * g.stride - g.pad + ky, ix = ox * g.stride - g.pad + kx;
  // Outside the image it reads the zero padding.
  if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) return 0.f;
  return image[image_index(g.c, g.w, ci, iy, ix)];
}

//! The input gradient at channel ci of pixel (iy, ix) of one image: the sum of the entries of its
//! column matrix's gradient that im2col_entry filled from there, gathered (no two threads write
//! one place, so no atomics) in the order ky, then kx, ascending: the same bits on every backend
//! and run. `cols` points at the image's row 0 (P rows of c k k floats).
//! Usage: `dx[image_index(g.c, g.w, ci, iy, ix)] = math::col2im_entry(g, cols, ci, iy, ix);`
XPIPE_HOST_DEVICE float col2im_entry(const ConvGeometry& g, const float* cols, int ci, int iy,
                                     int ix) {
  const index_t ckk = static_cast<index_t>(g.c) * g.k * g.k;
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
      // Entry (p, r) of the column gradient, p = oy ow + ox, r = (ci k + ky) k + kx.
      const index_t p = static_cast<index_t>(oy) * g.ow + ox;
      acc += cols[p * ckk + (static_cast<index_t>(ci) * g.k + ky) * g.k + kx];
    }
  }
  return acc;
}

//! v[0] + v[stride] + ... + v[(n - 1) stride], added in that order: one image's channel of a
//! channels-last dy (every oc-th float) summed over its n pixels, the first of the bias
//! gradient's two passes. Usage: `sums[i * oc + o] = math::plane_sum(dy + i * P * oc + o, P, oc);`
XPIPE_HOST_DEVICE float plane_sum(const float* v, index_t n, index_t stride) {
  float acc = 0.f;
  // The adds stay in order (the bits must not depend on the backend); unrolling only lets a GPU
  // thread issue several loads before their adds wait on them.
  XPIPE_UNROLL(8)
  for (index_t i = 0; i < n; ++i) acc += v[i * stride];
  return acc;
}

}  // namespace math

namespace ops {

//! The column matrix of images [first, first + n): element (row i P + p, column r) of an
//! (n P) x (c k k) loop, consecutive threads writing consecutive columns of one row.
struct Im2col {
  ConvGeometry g;
  const float* x;
  index_t first;
  float* cols;
  XPIPE_HOST_DEVICE void operator()(index_t row, index_t r) const {
    const index_t P = static_cast<index_t>(g.oh) * g.ow, i = row / P;
    const index_t ckk = static_cast<index_t>(g.c) * g.k * g.k;
    cols[row * ckk + r] = math::im2col_entry(g, x + (first + i) * g.in_floats(), r, row - i * P);
  }
};

//! dx of images [first, first + n) from their column gradients: element (row i h w + q, channel
//! ci) of an (n h w) x c loop, one input value each; consecutive threads write consecutive
//! channels of one pixel.
struct Col2im {
  ConvGeometry g;
  const float* cols;
  index_t first;
  float* dx;
  XPIPE_HOST_DEVICE void operator()(index_t row, index_t ci) const {
    const index_t hw = static_cast<index_t>(g.h) * g.w, i = row / hw, q = row - i * hw;
    const index_t P = static_cast<index_t>(g.oh) * g.ow,
                  ckk = static_cast<index_t>(g.c) * g.k * g.k;
    const int iy = static_cast<int>(q / g.w), ix = static_cast<int>(q % g.w);
    dx[(first + i) * g.in_floats() + image_index(g.c, g.w, static_cast<int>(ci), iy, ix)] =
        math::col2im_entry(g, cols + i * P * ckk, static_cast<int>(ci), iy, ix);
  }
};

//! sums[j] = channel o of image i of dy summed in pixel order (j = i oc + o): one index per
//! (image, channel), consecutive threads reading consecutive channels of each pixel.
struct PlaneSums {
  const float* dy;
  index_t channels, pixels;
  float* sums;
  XPIPE_HOST_DEVICE void operator()(index_t j) const {
    const index_t i = j / channels, o = j - i * channels;
    sums[j] = math::plane_sum(dy + i * pixels * channels + o, pixels, channels);
  }
};

}  // namespace ops

//! Fills the (n P) x (c k k) column buffer `cols` (P = oh ow; the layout is described at the top
//! of this file) from images [first, first + n) of x, channels-last rows of g.in_floats() floats.
//! Usage: `im2col(ctx, g, x, 0, g.rows, cols);`
template <class Ctx>
void im2col(const Ctx& ctx, const ConvGeometry& g, const float* x, index_t first, index_t n,
            float* cols) {
  const index_t ckk = static_cast<index_t>(g.c) * g.k * g.k;
  for_each_element(ctx, n * g.oh * g.ow, ckk, ops::Im2col{g, x, first, cols});
}

//! Writes dx of images [first, first + n) from their column gradients in `cols` (laid out as
//! im2col's): the adjoint of im2col, each input value gathering what it fed. Overwrites dx there.
//! Usage: `col2im(ctx, g, cols, 0, g.rows, dx);`
template <class Ctx>
void col2im(const Ctx& ctx, const ConvGeometry& g, const float* cols, index_t first, index_t n,
            float* dx) {
  for_each_element(ctx, n * g.h * g.w, g.c, ops::Col2im{g, cols, first, dx});
}

//! db[o] (+)= the sum of dy over g.rows images and their oh ow pixels, in a fixed order: each
//! (image, channel) summed in pixel order into `sums` (g.rows x oc floats), then those summed in
//! image order (bias_grad). The same bits on every thread count and both backends.
//! Usage: `conv_bias_grad(ctx, g, dy, sums, db, false);`
template <class Ctx>
void conv_bias_grad(const Ctx& ctx, const ConvGeometry& g, const float* dy, float* sums, float* db,
                    bool accumulate) {
  const index_t planes = g.rows * g.oc, pixels = static_cast<index_t>(g.oh) * g.ow;
  for_each_index(ctx, planes, planes * pixels, ops::PlaneSums{dy, g.oc, pixels, sums});
  bias_grad(ctx, ConstMatrix{sums, g.rows, g.oc}, db, accumulate);
}

//! The buffers of an im2col convolution that takes up to `chunk` images per GEMM, in the
//! context's memory; conv_workspace_floats says how large each must be.
struct ConvWorkspace {
  float* cols = nullptr;        //!< (chunk P) x (c k k): a chunk's column matrix
  float* plane_sums = nullptr;  //!< g.rows x oc: dy summed per image and channel
  index_t chunk = 1;
};

//! The floats of ConvWorkspace's cols and plane_sums for g and a chunk of images.
struct ConvWorkspaceFloats {
  index_t cols, plane_sums;
};
constexpr ConvWorkspaceFloats conv_workspace_floats(const ConvGeometry& g, index_t chunk) {
  const index_t pixels = static_cast<index_t>(g.oh) * g.ow;
  return {chunk * pixels * g.c * g.k * g.k, g.rows * g.oc};
}

//! The most images (1 to g.rows) whose column matrix fits in `floats` floats.
constexpr index_t conv_chunk(const ConvGeometry& g, index_t floats) {
  const index_t fit = floats / conv_workspace_floats(g, 1).cols;
  return fit < 1 ? 1 : fit > g.rows ? g.rows : fit;
}

//! y = conv(x, w) + b (b unused when !g.bias), ws.chunk images at a time: im2col, then one GEMM
//! cols (n P x c k k) times W^T written straight into the chunk's y; the bias added after, one
//! pass over all of y. x and y are channels-last, w OIHW. Usage:
//! `conv_forward_im2col(ctx, g, ws, x, w, b, y);`
template <class Ctx>
void conv_forward_im2col(const Ctx& ctx, const ConvGeometry& g, const ConvWorkspace& ws,
                         const float* x, const float* w, const float* b, float* y) {
  const index_t ckk = static_cast<index_t>(g.c) * g.k * g.k,
                pixels = static_cast<index_t>(g.oh) * g.ow;
  for (index_t first = 0; first < g.rows; first += ws.chunk) {
    const index_t n = g.rows - first < ws.chunk ? g.rows - first : ws.chunk;
    im2col(ctx, g, x, first, n, ws.cols);
    gemm(ctx, Trans::No, Trans::Yes, n * pixels, g.oc, ckk, 1.f, ws.cols, ckk, w, ckk, 0.f,
         y + first * g.out_floats(), g.oc);
  }
  // y seen as g.rows P pixels of oc channels: the bias is a per-column add.
  const Matrix out{y, g.rows * pixels, g.oc};
  if (g.bias) bias_activation_forward<math::Identity>(ctx, out, b, out);
}

//! dx = conv^T(dy, w): per chunk, the column gradients dY (n P x oc) times W in one GEMM, read
//! from dy as it lies, then col2im. Overwrites dx. Usage:
//! `conv_backward_data_im2col(ctx, g, ws, w, dy, dx);`
template <class Ctx>
void conv_backward_data_im2col(const Ctx& ctx, const ConvGeometry& g, const ConvWorkspace& ws,
                               const float* w, const float* dy, float* dx) {
  const index_t ckk = static_cast<index_t>(g.c) * g.k * g.k,
                pixels = static_cast<index_t>(g.oh) * g.ow;
  for (index_t first = 0; first < g.rows; first += ws.chunk) {
    const index_t n = g.rows - first < ws.chunk ? g.rows - first : ws.chunk;
    gemm(ctx, Trans::No, Trans::No, n * pixels, ckk, g.oc, 1.f, dy + first * g.out_floats(), g.oc,
         w, ckk, 0.f, ws.cols, ckk);
    col2im(ctx, g, ws.cols, first, n, dx);
  }
}

//! dw (+)= sum over images of dy_i^T cols_i and db (+)= dy summed per channel (skipped when
//! !g.bias). Per chunk one GEMM dY^T (oc x n P) times the columns, each chunk added with beta = 1
//! in chunk order onto the first (which overwrites unless `accumulate`): a fixed order, so one
//! plan gives the same bits on every run. Usage:
//! `conv_backward_weights_im2col(ctx, g, ws, x, dy, dw, db, false);`
template <class Ctx>
void conv_backward_weights_im2col(const Ctx& ctx, const ConvGeometry& g, const ConvWorkspace& ws,
                                  const float* x, const float* dy, float* dw, float* db,
                                  bool accumulate) {
  const index_t ckk = static_cast<index_t>(g.c) * g.k * g.k,
                pixels = static_cast<index_t>(g.oh) * g.ow;
  for (index_t first = 0; first < g.rows; first += ws.chunk) {
    const index_t n = g.rows - first < ws.chunk ? g.rows - first : ws.chunk;
    im2col(ctx, g, x, first, n, ws.cols);
    const float beta = first == 0 && !accumulate ? 0.f : 1.f;
    gemm(ctx, Trans::Yes, Trans::No, g.oc, ckk, n * pixels, 1.f, dy + first * g.out_floats(), g.oc,
         ws.cols, ckk, beta, dw, ckk);
  }
  if (g.bias) conv_bias_grad(ctx, g, dy, ws.plane_sums, db, accumulate);
}

//! The im2col convolution of a backend B (CUDA's ConvPlans, and the emulated device's in the
//! tests): per chunk of images, an im2col kernel and one cuBLAS SGEMM (the backend's row-major
//! gemm, on the context's handle and stream), plus col2im for the input gradient and a pass for
//! the bias. Images are channels-last, so the column matrix is pixel-major, (chunk oh ow) x
//! (c k k): each GEMM then reads x's columns against y or dy as they lie, a chunk's images being
//! one (chunk oh ow) x oc matrix, and writes y or the column gradients in place; no pass moves
//! them to and from channel-major. Why one column matrix for the chunk rather than one per image
//! for a strided-batched GEMM: one GEMM's M is then chunk oh ow, large enough to fill cuBLAS's
//! tiles even for 4 x 4 images, and the weight gradient is one GEMM over every pixel of the chunk
//! instead of a GEMM per image (or per-image partial gradients summed after), the chunks added
//! with beta = 1 in order. The bias gradient sums each image's channel in pixel order, then the
//! images in order. Every call is asynchronous on ctx.stream and allocates nothing; one plan
//! gives the same bits on every run (cuBLAS pedantic FP32 math, as CudaStreamContext sets, takes
//! one algorithm per shape). backward_data and backward_weights are also the two parts of a split
//! backward (Conv2d::backward_input, backward_weight): nothing passes between them but x and dy,
//! so a slot's weight part may run after other slots' work.
//! Usage: `Im2colConvPlans<Cuda> plans{g}; plans.forward(ctx, g, x, w, b, y);`
template <class B>
class Im2colConvPlans {
 public:
  //! Floats of the column buffer by default (64 MiB): chunk() is the most images whose column
  //! matrix fits, at least 1, at most g.rows.
  static constexpr index_t default_workspace_floats = index_t{1} << 24;

  //! g.rows: the most images one call may take. Allocates the workspace on the current device
  //! (make the stage's device current first, as Pipeline does), the only allocation: every call
  //! after runs in it. `workspace_floats` bounds the column buffer.
  explicit Im2colConvPlans(const ConvGeometry& g,
                           index_t workspace_floats = default_workspace_floats)
      : max_(g),
        chunk_(conv_chunk(g, workspace_floats)),
        sizes_(conv_workspace_floats(max_, chunk_)),
        room_(nullptr, sizes_.cols + sizes_.plane_sums) {}

  //! The plans for g.rows images on the caller's memory: `arena` holds arena_floats(g) floats
  //! on B (a stage's arena, which its other layers' calls use too) and outlives the plans;
  //! nothing is allocated. A null arena: the plans allocate their own, as above.
  //! Usage: `Im2colConvPlans<Cuda> plans{g, arena.data()};`
  Im2colConvPlans(const ConvGeometry& g, float* arena)
      : max_(g),
        chunk_(conv_chunk(g, default_workspace_floats)),
        sizes_(conv_workspace_floats(max_, chunk_)),
        room_(arena, sizes_.cols + sizes_.plane_sums) {}

  //! Floats of the column buffer and the per-image bias sums for g at the default bound: what a
  //! call takes from an arena. Usage: `Buffer<float> arena(ConvPlans<Cuda>::arena_floats(g));`
  static constexpr index_t arena_floats(const ConvGeometry& g) {
    const ConvWorkspaceFloats f = conv_workspace_floats(g, conv_chunk(g, default_workspace_floats));
    return f.cols + f.plane_sums;
  }

  //! y = conv(x, w) + b; b is unused when !g.bias. x: g.rows channels-last images, w: OIHW, y:
  //! channels-last.
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

  // The column buffer of chunk_ images, then the per-image bias sums of max_.rows images.
  ConvWorkspace workspace() { return {room_.data(), room_.data() + sizes_.cols, chunk_}; }

  ConvGeometry max_;
  index_t chunk_;
  ConvWorkspaceFloats sizes_;  // the column buffer for chunk_ images, the bias sums for max_.rows
  ArenaOr<B> room_;            // their own, unless on an arena
};

}  // namespace xpipe
