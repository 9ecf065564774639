// Shape<C, H, W>: the image shape a layer takes or gives, as a type. Activations stay rows x width
// matrices (each row one sample, its image channels-last: row, then column, then channel, as
// NHWC); a shape says how a width of C * H * W is laid out, so Stage and Pipeline can check more
// than the width. Also where a channels-last image keeps each value (image_index, image_place);
// whole rows go from and to planar order (NCHW, PyTorch's default) in kernels/image_layout.hpp.
#pragma once

#include <concepts>

#include "xpipe/core/config.hpp"

namespace xpipe {

//! The C x H x W image of one sample, flattened channels-last into C * H * W floats: channel c of
//! pixel (y, x) at (y W + x) C + c (image_index). Channels-last because oneDNN's convolutions run
//! on it directly, with no reorder around each call (docs/design.md, "Image layout").
//! Usage: `using Image = Shape<1, 28, 28>; static_assert(Image::size == 784);`
template <int C, int H, int W>
struct Shape {
  static_assert(C > 0 && H > 0 && W > 0, "xpipe: Shape<C, H, W>: every extent must be positive");
  static constexpr int channels = C;
  static constexpr int height = H;
  static constexpr int width = W;
  static constexpr int size = C * H * W;
};

//! A shape as a value, for compile-time checks whose messages print it (`Dims{1, 28, 28}`);
//! all zeros when a boundary carries a flat width with no image shape.
struct Dims {
  int c = 0, h = 0, w = 0;
  constexpr bool known() const { return c > 0; }
  constexpr int size() const { return c * h * w; }
  friend constexpr bool operator==(const Dims&, const Dims&) = default;
};

//! Where channel ch of pixel (y, x) lies in a channels-last image `channels` wide per pixel and
//! `width` pixels per row: (y width + x) channels + ch.
//! Usage: `x[r * Image::size + image_index(Image::channels, Image::width, c, y, x)]`
XPIPE_HOST_DEVICE constexpr index_t image_index(int channels, int width, int ch, int y, int x) {
  return (static_cast<index_t>(y) * width + x) * channels + ch;
}

//! A value's channel and pixel in a channels-last image: what image_index encodes.
struct ImagePlace {
  int ch = 0, y = 0, x = 0;
};

//! Where element i of a channels-last image `channels` deep and `width` wide lies: the inverse
//! of image_index. Usage: `const ImagePlace at = image_place(o, g.c, g.ow);`
XPIPE_HOST_DEVICE constexpr ImagePlace image_place(int i, int channels, int width) {
  const int pixel = i / channels, y = pixel / width;
  return {i - pixel * channels, y, pixel - y * width};
}

//! A type that describes an image shape (Shape<C, H, W> or one of its aliases).
template <class S>
concept ImageShape = requires {
  { S::channels } -> std::convertible_to<int>;
  { S::height } -> std::convertible_to<int>;
  { S::width } -> std::convertible_to<int>;
  { S::size } -> std::convertible_to<int>;
};

//! The Dims of a Shape type.
template <ImageShape S>
inline constexpr Dims dims_of = Dims{S::channels, S::height, S::width};

//! The image shape layer L takes (its `in_shape`), or no shape (Dims{}) for a flat input.
template <class L>
consteval Dims layer_in_dims() {
  if constexpr (requires { typename L::in_shape; })
    return dims_of<typename L::in_shape>;
  else
    return Dims{};
}

//! The image shape layer L gives (its `out_shape`), or no shape (Dims{}) for a flat output.
template <class L>
consteval Dims layer_out_dims() {
  if constexpr (requires { typename L::out_shape; })
    return dims_of<typename L::out_shape>;
  else
    return Dims{};
}

}  // namespace xpipe
