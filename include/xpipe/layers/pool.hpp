// Parameter-free image pooling layers over channels-last image rows: MaxPool2d and AvgPool2d
// (PyTorch's defaults) and GlobalAvgPool. The math is kernels/pool.hpp's, the same on every
// backend.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "xpipe/core/error.hpp"
#include "xpipe/core/shape.hpp"
#include "xpipe/kernels/pool.hpp"
#include "xpipe/layers/layer.hpp"

namespace xpipe {

namespace detail {

// "Shape<3, 6, 6>": how errors name an image shape.
template <ImageShape S>
std::string shape_name() {
  return "Shape<" + std::to_string(S::channels) + ", " + std::to_string(S::height) + ", " +
         std::to_string(S::width) + ">";
}

// The views check of a parameter-free image layer L (named by L::name()): its loops take their
// sizes from the views, so a view of other than L's widths, or two views of different row counts,
// is a ShapeError naming the layer and the call instead of reads past the end of a row. Called
// every forward and backward: it builds no string unless it throws.
template <class L>
void check_image_views(ConstMatrix in_side, ConstMatrix out_side, const char* where) {
  if (in_side.cols == L::in_width && out_side.cols == L::out_width && in_side.rows == out_side.rows)
    return;
  auto extent = [](ConstMatrix m) { return std::to_string(m.rows) + "x" + std::to_string(m.cols); };
  throw ShapeError("xpipe: " + L::name() + "::" + where + ": got views of " + extent(in_side) +
                   " (input side) and " + extent(out_side) + " (output side), expected " +
                   std::to_string(L::in_width) + " and " + std::to_string(L::out_width) +
                   " columns and as many rows");
}

// The output extent of valid pooling arguments; 1 for invalid ones, so that only Pool2dBase's
// static_asserts report them (and not a division by a zero stride or Shape's own check).
consteval int pool_extent(bool valid, int in, int k, int stride, int pad) {
  return valid ? conv_out_extent(in, k, stride, pad) : 1;
}

// What MaxPool2d and AvgPool2d share: their checked template arguments, shapes, geometry, and
// the members of a parameter-free layer.
template <ImageShape In, int Kernel, int Stride, int Padding>
struct Pool2dBase {
  static_assert(Kernel > 0,
                "xpipe: MaxPool2d/AvgPool2d<In, Kernel, Stride, Padding>: Kernel must be positive");
  static_assert(Stride > 0,
                "xpipe: MaxPool2d/AvgPool2d<In, Kernel, Stride, Padding>: Stride must be positive");
  static_assert(Padding >= 0,
                "xpipe: MaxPool2d/AvgPool2d<In, Kernel, Stride, Padding>: Padding must not be "
                "negative");
  static_assert(Padding <= Kernel / 2,
                "xpipe: MaxPool2d/AvgPool2d<In, Kernel, Stride, Padding>: Padding must be at most "
                "Kernel / 2 (PyTorch's rule; every window then holds an input cell)");
  static_assert((Kernel <= In::height + 2 * Padding) && (Kernel <= In::width + 2 * Padding),
                "xpipe: MaxPool2d/AvgPool2d<In, Kernel, Stride, Padding>: Kernel is larger than "
                "the padded input image");

  static constexpr bool valid_arguments =
      (Kernel > 0) && (Stride > 0) && (Padding >= 0) && (Padding <= Kernel / 2) &&
      (Kernel <= In::height + 2 * Padding) && (Kernel <= In::width + 2 * Padding);

  using in_shape = In;
  using out_shape =
      Shape<In::channels, pool_extent(valid_arguments, In::height, Kernel, Stride, Padding),
            pool_extent(valid_arguments, In::width, Kernel, Stride, Padding)>;
  static constexpr int in_width = In::size;
  static constexpr int out_width = out_shape::size;
  static constexpr index_t param_count = 0;
  //! The window, as the kernels take it.
  static constexpr PoolGeometry geometry =
      valid_arguments ? pool_geometry(In::channels, In::height, In::width, Kernel, Stride, Padding)
                      : PoolGeometry{};

  static void init(std::span<float>, std::uint64_t) {}

 protected:
  // "MaxPool2d<Shape<3, 6, 6>, 2, 2, 0>".
  static std::string name_as(const char* kind) {
    return std::string(kind) + "<" + shape_name<In>() + ", " + std::to_string(Kernel) + ", " +
           std::to_string(Stride) + ", " + std::to_string(Padding) + ">";
  }
};

}  // namespace detail

//! Max pooling over Kernel x Kernel windows of each channel of an In image, PyTorch's
//! max_pool2d: padding cells never win, and of equal maxima the first in row-major order takes
//! the gradient. Gives Shape<C, OH, OW>, OH = (H + 2 Padding - Kernel) / Stride + 1.
//! Usage: `Stage<MaxPool2d<Shape<1, 28, 28>, 2>, Flatten<Shape<1, 14, 14>>, Linear<196, 10>>`.
template <ImageShape In, int Kernel, int Stride = Kernel, int Padding = 0>
struct MaxPool2d : detail::Pool2dBase<In, Kernel, Stride, Padding> {
  using base = detail::Pool2dBase<In, Kernel, Stride, Padding>;

  //! "MaxPool2d<Shape<3, 6, 6>, 2, 2, 0>": how errors name the layer.
  static std::string name() { return base::name_as("MaxPool2d"); }

  //! y = the maximum of each window; views of other widths are a ShapeError naming the layer.
  template <class Ctx>
  static void forward(const Ctx& ctx, const float* /*params*/, ConstMatrix x, Matrix y) {
    detail::check_image_views<MaxPool2d>(x, y, "forward");
    max_pool_forward(ctx, base::geometry, x, y);
  }

  //! dx = dy routed to each window's maximum, recomputed from x (nothing when dx is empty).
  template <class Ctx>
  static void backward(const Ctx& ctx, const float* /*params*/, float* /*grads*/,
                       bool /*accumulate*/, ConstMatrix x, ConstMatrix /*y*/, ConstMatrix dy,
                       Matrix dx) {
    if (dx.empty()) return;
    detail::check_image_views<MaxPool2d>(x, dy, "backward");
    detail::check_image_views<MaxPool2d>(dx, dy, "backward");
    max_pool_backward(ctx, base::geometry, x, dy, dx);
  }
};

static_assert(Layer<MaxPool2d<Shape<1, 4, 4>, 2>>);
static_assert(Layer<MaxPool2d<Shape<2, 7, 7>, 3, 2, 1>>);

//! Average pooling over Kernel x Kernel windows of each channel of an In image, PyTorch's
//! avg_pool2d with its defaults: padding cells count as zeros, the divisor is always Kernel^2.
//! Usage: `Stage<AvgPool2d<Shape<3, 32, 32>, 2>, Flatten<Shape<3, 16, 16>>, Linear<768, 10>>`.
template <ImageShape In, int Kernel, int Stride = Kernel, int Padding = 0>
struct AvgPool2d : detail::Pool2dBase<In, Kernel, Stride, Padding> {
  using base = detail::Pool2dBase<In, Kernel, Stride, Padding>;

  //! "AvgPool2d<Shape<3, 6, 6>, 2, 2, 0>": how errors name the layer.
  static std::string name() { return base::name_as("AvgPool2d"); }

  //! y = the mean of each window.
  template <class Ctx>
  static void forward(const Ctx& ctx, const float* /*params*/, ConstMatrix x, Matrix y) {
    detail::check_image_views<AvgPool2d>(x, y, "forward");
    avg_pool_forward(ctx, base::geometry, x, y);
  }

  //! dx = dy / Kernel^2 summed over the windows holding each input (nothing when dx is empty).
  template <class Ctx>
  static void backward(const Ctx& ctx, const float* /*params*/, float* /*grads*/,
                       bool /*accumulate*/, ConstMatrix x, ConstMatrix /*y*/, ConstMatrix dy,
                       Matrix dx) {
    if (dx.empty()) return;
    detail::check_image_views<AvgPool2d>(x, dy, "backward");
    detail::check_image_views<AvgPool2d>(dx, dy, "backward");
    avg_pool_backward(ctx, base::geometry, dy, dx);
  }
};

static_assert(Layer<AvgPool2d<Shape<1, 4, 4>, 2>>);

//! The mean of each channel of an In image over its H x W cells, giving Shape<C, 1, 1>
//! (PyTorch's adaptive_avg_pool2d(x, 1)).
//! Usage: `Stage<GlobalAvgPool<Shape<64, 7, 7>>, Flatten<Shape<64, 1, 1>>, Linear<64, 10>>`.
template <ImageShape In>
struct GlobalAvgPool {
  using in_shape = In;
  using out_shape = Shape<In::channels, 1, 1>;
  static constexpr int in_width = In::size;
  static constexpr int out_width = In::channels;
  static constexpr index_t param_count = 0;
  //! Cells of one channel.
  static constexpr int plane = In::height * In::width;

  static void init(std::span<float>, std::uint64_t) {}

  //! "GlobalAvgPool<Shape<4, 5, 5>>": how errors name the layer.
  static std::string name() { return "GlobalAvgPool<" + detail::shape_name<In>() + ">"; }

  //! y(r, c) = the mean of channel c of image r.
  template <class Ctx>
  static void forward(const Ctx& ctx, const float* /*params*/, ConstMatrix x, Matrix y) {
    detail::check_image_views<GlobalAvgPool>(x, y, "forward");
    global_avg_pool_forward(ctx, plane, x, y);
  }

  //! dx = dy of the cell's channel / (H W) (nothing when dx is empty).
  template <class Ctx>
  static void backward(const Ctx& ctx, const float* /*params*/, float* /*grads*/,
                       bool /*accumulate*/, ConstMatrix x, ConstMatrix /*y*/, ConstMatrix dy,
                       Matrix dx) {
    if (dx.empty()) return;
    detail::check_image_views<GlobalAvgPool>(x, dy, "backward");
    detail::check_image_views<GlobalAvgPool>(dx, dy, "backward");
    global_avg_pool_backward(ctx, plane, dy, dx);
  }
};

static_assert(Layer<GlobalAvgPool<Shape<4, 5, 5>>>);

}  // namespace xpipe
