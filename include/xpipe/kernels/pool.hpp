// Image pooling (max, average, global average) forward and backward: the per-element math, the
// function objects and the launchers, written once for the host loop and the CUDA kernels.
#pragma once

#include <type_traits>

#include "xpipe/backend/host.hpp"
#include "xpipe/core/config.hpp"
#include "xpipe/core/conv_geometry.hpp"
#include "xpipe/core/shape.hpp"  // image_index, image_place
#include "xpipe/core/tensor.hpp"

// As in kernels/ops.hpp, the element loop each launcher calls (for_each_element, for_each_pixel)
// is found by argument-dependent lookup on the context: backend/host.hpp's for a HostContext, the
// CUDA kernels' (backend/cuda.cuh) for a CudaContext. Max pooling alone has loops of its own on
// the host (a pixel at a time, the channels innermost), deciding each cell by the same rule
// (math::max_pool_takes) as the device's functors. Every backward is a gather, one input
// element per call summing the output windows that hold it in a fixed order, but for max pooling
// over disjoint windows, a scatter that writes each cell once: no atomics, and bits that do not
// depend on the thread count or the order in which a GPU runs its threads.

namespace xpipe {

//! A square k x k pooling window over channels-last images c x h x w, the same stride and zero
//! padding on both axes, giving c x oh x ow. Trivially copyable: a CUDA kernel takes it by value.
//! Usage: `constexpr PoolGeometry g = pool_geometry(3, 6, 6, 2, 2, 0);  // g.oh == 3`
struct PoolGeometry {
  int c = 0, h = 0, w = 0;
  int k = 1, stride = 1, pad = 0;
  int oh = 0, ow = 0;

  //! Floats of one input image and of one output image.
  XPIPE_HOST_DEVICE index_t in_floats() const { return static_cast<index_t>(c) * h * w; }
  XPIPE_HOST_DEVICE index_t out_floats() const { return static_cast<index_t>(c) * oh * ow; }
  friend constexpr bool operator==(const PoolGeometry&, const PoolGeometry&) = default;
};

//! The geometry of k x k pooling with this stride and padding over c x h x w images.
constexpr PoolGeometry pool_geometry(int c, int h, int w, int k, int stride, int pad) {
  PoolGeometry g{c, h, w, k, stride, pad};
  g.oh = conv_out_extent(h, k, stride, pad);
  g.ow = conv_out_extent(w, k, stride, pad);
  return g;
}

namespace math {

//! Positions [begin, end) along one axis.
struct PoolSpan {
  int begin = 0, end = 0;
};

//! The input cells along one axis of `in` that window o covers, its padding cut off.
XPIPE_HOST_DEVICE PoolSpan pool_window_cells(int o, int k, int stride, int pad, int in) {
  const int first = o * stride - pad;
  return {first < 0 ? 0 : first, first + k < in ? first + k : in};
}

//! The windows along one axis of `out` whose cells include input cell i: those o with
//! o * stride - pad <= i < o * stride - pad + k.
XPIPE_HOST_DEVICE PoolSpan pool_windows_over(int i, int k, int stride, int pad, int out) {
  // The lower bound is ceil((i + pad - k + 1) / stride); integer division truncates towards
  // zero, so a negative numerator (a cell near the top edge) is clamped to window 0 first.
  const int low = i + pad - k + 1;
  const int first = low <= 0 ? 0 : (low + stride - 1) / stride;
  const int last = (i + pad) / stride + 1;
  return {first, last < out ? last : out};
}

//! Whether a window's scan, holding `best`, takes the next cell's value v instead. Strictly
//! greater keeps the first of equal maxima; v != v lets a NaN through, so a diverged input
//! reaches the loss check instead of vanishing behind a finite neighbour.
XPIPE_HOST_DEVICE bool max_pool_takes(float v, float best) {
  return v > best || v != v;
}

//! The maximum of one window and where it lies, as an index into one input image.
struct PoolMax {
  float value;
  int at;
};

//! The maximum of window (ch, oy, ox) and where it lies: the first maximum in row-major scan
//! order, or the last NaN when the window holds one (PyTorch's rule). Padding cells never win:
//! they stand for -infinity, and with pad <= k / 2 every window holds at least one input cell,
//! so the scan need only visit those.
XPIPE_HOST_DEVICE PoolMax max_pool_winner(const float* x, const PoolGeometry& g, int ch, int oy,
                                          int ox) {
  const PoolSpan ys = pool_window_cells(oy, g.k, g.stride, g.pad, g.h);
  const PoolSpan xs = pool_window_cells(ox, g.k, g.stride, g.pad, g.w);
  int best = static_cast<int>(image_index(g.c, g.w, ch, ys.begin, xs.begin));
  float best_value = x[best];
  for (int y = ys.begin; y < ys.end; ++y)
    for (int xx = xs.begin; xx < xs.end; ++xx) {
      const int at = static_cast<int>(image_index(g.c, g.w, ch, y, xx));
      const float v = x[at];
      if (max_pool_takes(v, best_value)) {
        best_value = v;
        best = at;
      }
    }
  return {best_value, best};
}

//! Where the maximum of window (ch, oy, ox) lies (max_pool_winner), as an index into one image.
XPIPE_HOST_DEVICE int max_pool_argmax(const float* x, const PoolGeometry& g, int ch, int oy,
                                      int ox) {
  return max_pool_winner(x, g, ch, oy, ox).at;
}

//! The gradient of input element i of one image: the sum of dy over the windows holding i
//! whose maximum (recomputed from x) is i, windows taken in row-major order.
XPIPE_HOST_DEVICE float max_pool_input_grad(const float* x, const float* dy, const PoolGeometry& g,
                                            int i) {
  const ImagePlace at = image_place(i, g.c, g.w);
  const PoolSpan oys = pool_windows_over(at.y, g.k, g.stride, g.pad, g.oh);
  const PoolSpan oxs = pool_windows_over(at.x, g.k, g.stride, g.pad, g.ow);
  float acc = 0.f;
  for (int oy = oys.begin; oy < oys.end; ++oy)
    for (int ox = oxs.begin; ox < oxs.end; ++ox)
      if (max_pool_argmax(x, g, at.ch, oy, ox) == i)
        acc += dy[image_index(g.c, g.ow, at.ch, oy, ox)];
  return acc;
}

//! Output element o of average pooling one image x: padding cells count as zeros, so the divisor
//! is k * k wherever the window lies (PyTorch's default count_include_pad=True). Cells are
//! summed in row-major order, as PyTorch's CPU kernel sums them.
XPIPE_HOST_DEVICE float avg_pool_output(const float* x, const PoolGeometry& g, int o) {
  const ImagePlace at = image_place(o, g.c, g.ow);
  const PoolSpan ys = pool_window_cells(at.y, g.k, g.stride, g.pad, g.h);
  const PoolSpan xs = pool_window_cells(at.x, g.k, g.stride, g.pad, g.w);
  float sum = 0.f;
  for (int y = ys.begin; y < ys.end; ++y)
    for (int xx = xs.begin; xx < xs.end; ++xx) sum += x[image_index(g.c, g.w, at.ch, y, xx)];
  return sum / static_cast<float>(g.k * g.k);
}

//! The gradient of input element i of one image under average pooling: dy / (k * k) summed
//! over the windows holding i, in row-major order.
XPIPE_HOST_DEVICE float avg_pool_input_grad(const float* dy, const PoolGeometry& g, int i) {
  const ImagePlace at = image_place(i, g.c, g.w);
  const PoolSpan oys = pool_windows_over(at.y, g.k, g.stride, g.pad, g.oh);
  const PoolSpan oxs = pool_windows_over(at.x, g.k, g.stride, g.pad, g.ow);
  const float area = static_cast<float>(g.k * g.k);
  float acc = 0.f;
  // Each window's share divided first, as PyTorch's backward does, so the sums agree bit for bit.
  for (int oy = oys.begin; oy < oys.end; ++oy)
    for (int ox = oxs.begin; ox < oxs.end; ++ox)
      acc += dy[image_index(g.c, g.ow, at.ch, oy, ox)] / area;
  return acc;
}

//! The mean of channel ch of one channels-last image x of `plane` pixels, `channels` deep, its
//! pixels summed in order.
XPIPE_HOST_DEVICE float global_avg_pool_output(const float* x, int channels, int plane, int ch) {
  float sum = 0.f;
  for (int j = 0; j < plane; ++j) sum += x[static_cast<index_t>(j) * channels + ch];
  return sum / static_cast<float>(plane);
}

//! The gradient of input element i of one channels-last image under global average pooling.
XPIPE_HOST_DEVICE float global_avg_pool_input_grad(const float* dy, int channels, int plane,
                                                   int i) {
  return dy[i % channels] / static_cast<float>(plane);
}

}  // namespace math

//! The function objects of the pooling launchers below: row r is one image, the column one
//! output element (forward) or one input element (backward).
namespace ops {

//! y(r, p, ch) = the maximum of channel ch over window p of image r (the output pixel p, at row
//! p / ow and column p % ow): for for_each_pixel, the channels innermost, where the window's
//! cells of consecutive channels lie next to each other.
struct MaxPoolForward {
  ConstMatrix x;
  Matrix y;
  PoolGeometry g;
  XPIPE_HOST_DEVICE void operator()(index_t r, index_t p, index_t ch) const {
    const int pixel = static_cast<int>(p);
    y.row(r)[p * g.c + ch] =
        math::max_pool_winner(x.row(r), g, static_cast<int>(ch), pixel / g.ow, pixel % g.ow).value;
  }
};

//! Where windows do not overlap (stride >= k): channel ch of window p of image r writes its k x
//! k cells of dx, dy at its maximum and 0 elsewhere. Each cell belongs to one window at most, so
//! no two calls write one place (what for_each_pixel asks), and the index arithmetic is done once
//! per window and channel instead of per cell.
struct MaxPoolBackwardDisjoint {
  ConstMatrix x, dy;
  Matrix dx;
  PoolGeometry g;
  XPIPE_HOST_DEVICE void operator()(index_t r, index_t p, index_t ch) const {
    const int pixel = static_cast<int>(p), oy = pixel / g.ow, ox = pixel % g.ow;
    const int c = static_cast<int>(ch);
    const int best = math::max_pool_winner(x.row(r), g, c, oy, ox).at;
    const math::PoolSpan ys = math::pool_window_cells(oy, g.k, g.stride, g.pad, g.h);
    const math::PoolSpan xs = math::pool_window_cells(ox, g.k, g.stride, g.pad, g.w);
    float* out = dx.row(r);
    const float d = dy.row(r)[p * g.c + ch];
    for (int y = ys.begin; y < ys.end; ++y)
      for (int xx = xs.begin; xx < xs.end; ++xx) {
        const int at = static_cast<int>(image_index(g.c, g.w, c, y, xx));
        out[at] = at == best ? d : 0.f;
      }
  }
};

//! m(r, c) = 0.
struct ZeroFill {
  Matrix m;
  XPIPE_HOST_DEVICE void operator()(index_t r, index_t c) const { m(r, c) = 0.f; }
};

//! dx(r, i) = the max-pooling gradient of input element i of image r.
struct MaxPoolBackward {
  ConstMatrix x, dy;
  Matrix dx;
  PoolGeometry g;
  XPIPE_HOST_DEVICE void operator()(index_t r, index_t i) const {
    dx(r, i) = math::max_pool_input_grad(x.row(r), dy.row(r), g, static_cast<int>(i));
  }
};

//! y(r, o) = the mean of window o of image r, padding included.
struct AvgPoolForward {
  ConstMatrix x;
  Matrix y;
  PoolGeometry g;
  XPIPE_HOST_DEVICE void operator()(index_t r, index_t o) const {
    y(r, o) = math::avg_pool_output(x.row(r), g, static_cast<int>(o));
  }
};

//! dx(r, i) = the average-pooling gradient of input element i of image r.
struct AvgPoolBackward {
  ConstMatrix dy;
  Matrix dx;
  PoolGeometry g;
  XPIPE_HOST_DEVICE void operator()(index_t r, index_t i) const {
    dx(r, i) = math::avg_pool_input_grad(dy.row(r), g, static_cast<int>(i));
  }
};

//! y(r, ch) = the mean of channel ch of image r (y.cols channels).
struct GlobalAvgPoolForward {
  ConstMatrix x;
  Matrix y;
  int plane;
  XPIPE_HOST_DEVICE void operator()(index_t r, index_t ch) const {
    y(r, ch) = math::global_avg_pool_output(x.row(r), static_cast<int>(y.cols), plane,
                                            static_cast<int>(ch));
  }
};

//! dx(r, i) = dy(r, channel of i) / plane (dy.cols channels).
struct GlobalAvgPoolBackward {
  ConstMatrix dy;
  Matrix dx;
  int plane;
  XPIPE_HOST_DEVICE void operator()(index_t r, index_t i) const {
    dx(r, i) = math::global_avg_pool_input_grad(dy.row(r), static_cast<int>(dy.cols), plane,
                                                static_cast<int>(i));
  }
};

}  // namespace ops

// The launchers take views the caller has checked: x and dx are rows x g.in_floats(), y and dy
// rows x g.out_floats() (global pooling: rows x channels * plane and rows x channels). The layers
// of layers/pool.hpp check them and throw a ShapeError naming themselves.

//! y = k x k max pooling of each row of x (one channels-last image per row): one thread per
//! output element on a device.
//! Usage: `max_pool_forward(cuda_ctx, pool_geometry(3, 6, 6, 2, 2, 0), x, y);`
template <class Ctx>
requires(!std::is_base_of_v<HostContext, Ctx>) void max_pool_forward(const Ctx& ctx,
                                                                     const PoolGeometry& g,
                                                                     ConstMatrix x, Matrix y) {
  for_each_pixel(ctx, y.rows, static_cast<index_t>(g.oh) * g.ow, g.c, ops::MaxPoolForward{x, y, g});
}

namespace detail {
// Output pixel i of a pooling of rows of `pixels` output pixels each: its row, its pixel in the
// row, and the input cells its window covers.
struct PoolWindow {
  index_t row;
  int pixel;
  math::PoolSpan ys, xs;
};
inline PoolWindow pool_window(const PoolGeometry& g, index_t pixels, index_t i) {
  const index_t row = i / pixels;
  const int pixel = static_cast<int>(i - row * pixels);
  return {row, pixel, math::pool_window_cells(pixel / g.ow, g.k, g.stride, g.pad, g.h),
          math::pool_window_cells(pixel % g.ow, g.k, g.stride, g.pad, g.w)};
}
}  // namespace detail

//! The forward on the host: per output pixel, the window's cells in row-major order with the
//! channels innermost, where they vectorise (a cell's channels lie next to each other), each
//! cell taken or not by math::max_pool_takes as the device's scan per element takes it: the same
//! bits, at memory speed where the scan per element ran at a tenth of it (branches the CPU could
//! not predict). Pixels are spread over ctx.threads.
//! Usage: `max_pool_forward(HostContext{}, pool_geometry(3, 6, 6, 2, 2, 0), x, y);`
inline void max_pool_forward(const HostContext& ctx, const PoolGeometry& g, ConstMatrix x,
                             Matrix y) {
  const index_t pixels = static_cast<index_t>(g.oh) * g.ow;
  for_each_index(ctx, y.rows * pixels, y.rows * y.cols, [=](index_t i) {
    const detail::PoolWindow win = detail::pool_window(g, pixels, i);
    const math::PoolSpan ys = win.ys, xs = win.xs;
    const int channels = g.c;
    const float* image = x.row(win.row);
    float* XPIPE_RESTRICT out = y.row(win.row) + static_cast<index_t>(win.pixel) * channels;
    const float* first = image + image_index(channels, g.w, 0, ys.begin, xs.begin);
    XPIPE_INDEPENDENT_ITERATIONS
    for (int ch = 0; ch < channels; ++ch) out[ch] = first[ch];
    for (int cy = ys.begin; cy < ys.end; ++cy)
      for (int cx = xs.begin; cx < xs.end; ++cx) {
        const float* cell = image + image_index(channels, g.w, 0, cy, cx);
        XPIPE_INDEPENDENT_ITERATIONS
        for (int ch = 0; ch < channels; ++ch)
          out[ch] = math::max_pool_takes(cell[ch], out[ch]) ? cell[ch] : out[ch];
      }
  });
}

namespace detail {
// The scatter of max pooling's backward over disjoint windows: one thread per (window, channel)
// on a device (ops::MaxPoolBackwardDisjoint).
template <class Ctx>
requires(!std::is_base_of_v<HostContext, Ctx>) void max_pool_scatter(const Ctx& ctx,
                                                                     const PoolGeometry& g,
                                                                     ConstMatrix x, ConstMatrix dy,
                                                                     Matrix dx) {
  for_each_pixel(ctx, dy.rows, static_cast<index_t>(g.oh) * g.ow, g.c,
                 ops::MaxPoolBackwardDisjoint{x, dy, dx, g});
}

// On the host, per window and block of 16 channels: the scan of max_pool_forward (host) keeping
// which cell won each channel, then each cell written, dy where it won and 0 elsewhere, the
// channels innermost. The winners are those of math::max_pool_winner: the same bits.
inline void max_pool_scatter(const HostContext& ctx, const PoolGeometry& g, ConstMatrix x,
                             ConstMatrix dy, Matrix dx) {
  constexpr int lanes = 16;
  const index_t pixels = static_cast<index_t>(g.oh) * g.ow;
  for_each_index(ctx, dy.rows * pixels, dx.rows * dx.cols, [=](index_t i) {
    const PoolWindow win = pool_window(g, pixels, i);
    const math::PoolSpan ys = win.ys, xs = win.xs;
    const index_t r = win.row;
    const int p = win.pixel, channels = g.c;
    const float* image = x.row(r);
    for (int c0 = 0; c0 < channels; c0 += lanes) {
      const int n = channels - c0 < lanes ? channels - c0 : lanes;
      float best[lanes];
      int won[lanes];  // the winning cell, numbered in scan order
      const float* first = image + image_index(channels, g.w, c0, ys.begin, xs.begin);
      for (int l = 0; l < n; ++l) best[l] = first[l], won[l] = 0;
      int q = 0;
      for (int cy = ys.begin; cy < ys.end; ++cy)
        for (int cx = xs.begin; cx < xs.end; ++cx, ++q) {
          const float* cell = image + image_index(channels, g.w, c0, cy, cx);
          XPIPE_INDEPENDENT_ITERATIONS
          for (int l = 0; l < n; ++l) {
            const bool take = math::max_pool_takes(cell[l], best[l]);
            best[l] = take ? cell[l] : best[l];
            won[l] = take ? q : won[l];
          }
        }
      const float* d = dy.row(r) + static_cast<index_t>(p) * channels + c0;
      q = 0;
      for (int cy = ys.begin; cy < ys.end; ++cy)
        for (int cx = xs.begin; cx < xs.end; ++cx, ++q) {
          float* XPIPE_RESTRICT out = dx.row(r) + image_index(channels, g.w, c0, cy, cx);
          XPIPE_INDEPENDENT_ITERATIONS
          for (int l = 0; l < n; ++l) out[l] = won[l] == q ? d[l] : 0.f;
        }
    }
  });
}
}  // namespace detail

//! dx = the input gradient of max pooling x, given the output gradient dy; dx may not alias dy.
//! Usage: `max_pool_backward(ctx, g, x, dy, dx);`
template <class Ctx>
void max_pool_backward(const Ctx& ctx, const PoolGeometry& g, ConstMatrix x, ConstMatrix dy,
                       Matrix dx) {
  if (g.stride >= g.k) {
    // Disjoint windows: a scatter per window (cells no window covers are zeroed first).
    const bool covered = g.pad == 0 && g.stride == g.k && g.h % g.k == 0 && g.w % g.k == 0;
    if (!covered) for_each_element(ctx, dx.rows, dx.cols, ops::ZeroFill{dx});
    detail::max_pool_scatter(ctx, g, x, dy, dx);
    return;
  }
  for_each_element(ctx, dx.rows, dx.cols, ops::MaxPoolBackward{x, dy, dx, g});
}

//! y = k x k average pooling of each row of x, dividing by k * k even where padding cuts the
//! window (PyTorch's count_include_pad=True). Usage: `avg_pool_forward(ctx, g, x, y);`
template <class Ctx>
void avg_pool_forward(const Ctx& ctx, const PoolGeometry& g, ConstMatrix x, Matrix y) {
  for_each_element(ctx, y.rows, y.cols, ops::AvgPoolForward{x, y, g});
}

//! dx = the input gradient of average pooling, given dy; dx may not alias dy.
//! Usage: `avg_pool_backward(ctx, g, dy, dx);`
template <class Ctx>
void avg_pool_backward(const Ctx& ctx, const PoolGeometry& g, ConstMatrix dy, Matrix dx) {
  for_each_element(ctx, dx.rows, dx.cols, ops::AvgPoolBackward{dy, dx, g});
}

//! y(r, ch) = the mean of the `plane` pixels' channel ch of row r of x (y.cols channels).
//! Usage: `global_avg_pool_forward(ctx, 5 * 5, x, y);`
template <class Ctx>
void global_avg_pool_forward(const Ctx& ctx, int plane, ConstMatrix x, Matrix y) {
  for_each_element(ctx, y.rows, y.cols, ops::GlobalAvgPoolForward{x, y, plane});
}

//! dx = the input gradient of global average pooling, given dy (one value per channel).
//! Usage: `global_avg_pool_backward(ctx, 5 * 5, dy, dx);`
template <class Ctx>
void global_avg_pool_backward(const Ctx& ctx, int plane, ConstMatrix dy, Matrix dx) {
  for_each_element(ctx, dx.rows, dx.cols, ops::GlobalAvgPoolBackward{dy, dx, plane});
}

}  // namespace xpipe
