// Flatten<In>: the boundary from an image (Shape<C, H, W>) to a flat width, where a CNN's
// convolutions and pools hand over to its Linear layers.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "xpipe/core/shape.hpp"
#include "xpipe/kernels/activation.hpp"
#include "xpipe/kernels/ops.hpp"
#include "xpipe/layers/layer.hpp"
#include "xpipe/layers/pool.hpp"  // detail::shape_name, detail::check_image_views

namespace xpipe {

//! Takes an In image and gives the same In::size floats as a flat width (no out_shape), so the
//! layer after it may be any of that width. The rows are already NCHW-flattened, so the values
//! pass through unchanged; what changes is the shape Stage sees at the boundary.
//! Usage: `Stage<MaxPool2d<Shape<1, 4, 4>, 2>, Flatten<Shape<1, 2, 2>>, Linear<4, 3>>`.
template <ImageShape In>
struct Flatten {
  using in_shape = In;
  static constexpr int in_width = In::size;
  static constexpr int out_width = In::size;
  static constexpr index_t param_count = 0;

  static void init(std::span<float>, std::uint64_t) {}

  //! "Flatten<Shape<1, 2, 2>>": how errors name the layer.
  static std::string name() { return "Flatten<" + detail::shape_name<In>() + ">"; }

  // Stage gives every layer its own output buffer, so Flatten copies. The copy is the identity
  // activation's launcher: one element per call through the backend's element loop, reading
  // and writing through each view's leading dimension.

  //! y = x, row by row.
  template <class Ctx>
  static void forward(const Ctx& ctx, const float* /*params*/, ConstMatrix x, Matrix y) {
    detail::check_image_views<Flatten>(x, y, "forward");
    activation_forward<math::Identity>(ctx, x, y);
  }

  //! dx = dy, row by row (nothing when dx is empty).
  template <class Ctx>
  static void backward(const Ctx& ctx, const float* /*params*/, float* /*grads*/,
                       bool /*accumulate*/, ConstMatrix /*x*/, ConstMatrix /*y*/, ConstMatrix dy,
                       Matrix dx) {
    if (dx.empty()) return;
    detail::check_image_views<Flatten>(dx, dy, "backward");
    activation_forward<math::Identity>(ctx, dy, dx);
  }
};

static_assert(Layer<Flatten<Shape<1, 2, 2>>>);

}  // namespace xpipe
