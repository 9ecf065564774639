// Flatten<In>: the boundary from an image (Shape<C, H, W>) to a flat width, where a CNN's
// convolutions and pools hand over to its Linear layers, in PyTorch's order of the features.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "xpipe/core/shape.hpp"
#include "xpipe/kernels/image_layout.hpp"
#include "xpipe/layers/layer.hpp"
#include "xpipe/layers/pool.hpp"  // detail::shape_name, detail::check_image_views

namespace xpipe {

//! Takes an In image and gives the same In::size floats as a flat width (no out_shape), so the
//! layer after it may be any of that width: the channels-last image in planar order (channel,
//! then row, then column), PyTorch's nn.Flatten of an NCHW tensor. So the Linear layer after it
//! sees the features in the order a PyTorch model's does, its weights load and compare as they
//! are, and a checkpoint keeps its meaning whatever the layout inside the image layers.
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

  // Stage gives every layer its own output buffer, so Flatten copies, and the copy reorders:
  // one element per call through the backend's element loop, through each view's leading
  // dimension.

  //! y = each row of x in planar order.
  template <class Ctx>
  static void forward(const Ctx& ctx, const float* /*params*/, ConstMatrix x, Matrix y) {
    detail::check_image_views<Flatten>(x, y, "forward");
    planar_rows(ctx, dims_of<In>, x, y);
  }

  //! dx = each row of dy back to channels-last (nothing when dx is empty).
  template <class Ctx>
  static void backward(const Ctx& ctx, const float* /*params*/, float* /*grads*/,
                       bool /*accumulate*/, ConstMatrix /*x*/, ConstMatrix /*y*/, ConstMatrix dy,
                       Matrix dx) {
    if (dx.empty()) return;
    detail::check_image_views<Flatten>(dx, dy, "backward");
    channels_last_rows(ctx, dims_of<In>, dy, dx);
  }
};

static_assert(Layer<Flatten<Shape<1, 2, 2>>>);

}  // namespace xpipe
