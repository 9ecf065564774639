// The geometry of one 2-D convolution over a batch, as every backend's convolution takes it
// (backend/host_conv.hpp: oneDNN primitives; kernels/cuda/conv.cuh: im2col + cuBLAS).
#pragma once

#include <string>

#include "xpipe/core/config.hpp"

namespace xpipe {

//! How the host computes a convolution (CUDA's im2col + GEMM ignores it: one algorithm there).
//! `winograd`: in each direction (forward, backward data, backward weights) oneDNN's Winograd
//! kernel F(4x4, 3x3) where it offers one for the shape (3x3, stride 1, channels in 16s, on an
//! AVX-512 core; about half the multiplications of the direct sum, and a few more rounding errors
//! in the tile transforms), its direct kernels elsewhere. `direct`: always the direct kernels, the
//! window's sum as PyTorch's CPU convolution computes it.
//! Usage: `Conv2d<S, 32, 3, ConvOptions{.padding = 1, .algorithm = ConvAlgorithm::direct}>`.
enum class ConvAlgorithm : unsigned char { winograd, direct };

//! A square-kernel convolution of `rows` channels-last images c x h x w into oc x oh x ow, with the
//! same stride and zero padding on both axes. Weights are OIHW (oc x c x k x k, PyTorch's layout),
//! then `oc` biases where `bias`. Trivially copyable: a CUDA kernel takes it by value.
struct ConvGeometry {
  index_t rows = 0;
  int c = 0, h = 0, w = 0;
  int oc = 0, oh = 0, ow = 0;
  int k = 1, stride = 1, pad = 0;
  bool bias = true;
  ConvAlgorithm algorithm = ConvAlgorithm::winograd;

  //! Floats of one input image, one output image, and the weights (without bias).
  XPIPE_HOST_DEVICE index_t in_floats() const { return static_cast<index_t>(c) * h * w; }
  XPIPE_HOST_DEVICE index_t out_floats() const { return static_cast<index_t>(oc) * oh * ow; }
  XPIPE_HOST_DEVICE index_t weight_floats() const { return static_cast<index_t>(oc) * c * k * k; }
  //! The same geometry over another number of images.
  constexpr ConvGeometry with_rows(index_t r) const {
    ConvGeometry g = *this;
    g.rows = r;
    return g;
  }
  friend constexpr bool operator==(const ConvGeometry&, const ConvGeometry&) = default;
};

//! The geometry of a convolution of `rows` c x h x w images into oc channels, its output extents
//! derived (conv_out_extent). Usage: `make_conv_geometry(32, 1, 28, 28, 16, 3, 1, 1)`.
constexpr ConvGeometry make_conv_geometry(index_t rows, int c, int h, int w, int oc, int k,
                                          int stride, int pad, bool bias = true,
                                          ConvAlgorithm algorithm = ConvAlgorithm::winograd);

//! "32x16x28x28 -> 16x28x28 (kernel 3, stride 1, padding 1)": how errors name a convolution.
inline std::string conv_geometry_text(const ConvGeometry& g) {
  const auto image = [](int c, int h, int w) {
    return std::to_string(c) + "x" + std::to_string(h) + "x" + std::to_string(w);
  };
  return std::to_string(g.rows) + "x" + image(g.c, g.h, g.w) + " -> " + image(g.oc, g.oh, g.ow) +
         " (kernel " + std::to_string(g.k) + ", stride " + std::to_string(g.stride) + ", padding " +
         std::to_string(g.pad) + (g.algorithm == ConvAlgorithm::direct ? ", direct" : "") + ")";
}

//! The output extent of a convolution or pooling window along one axis:
//! floor((in + 2 pad - k) / stride) + 1 (PyTorch's and oneDNN's definition).
constexpr int conv_out_extent(int in, int k, int stride, int pad) {
  return (in + 2 * pad - k) / stride + 1;
}

constexpr ConvGeometry make_conv_geometry(index_t rows, int c, int h, int w, int oc, int k,
                                          int stride, int pad, bool bias, ConvAlgorithm algorithm) {
  return ConvGeometry{rows,
                      c,
                      h,
                      w,
                      oc,
                      conv_out_extent(h, k, stride, pad),
                      conv_out_extent(w, k, stride, pad),
                      k,
                      stride,
                      pad,
                      bias,
                      algorithm};
}

}  // namespace xpipe
