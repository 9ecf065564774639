// Per-element activation math (forward and gradient), written once for host and device.
#pragma once

#include <cmath>
#include <concepts>

#include "xpipe/core/config.hpp"
#include "xpipe/kernels/elementary.hpp"

namespace xpipe::math {

//! f(x) = x. Used where a Linear layer needs only its bias added.
struct Identity {
  static constexpr const char* name = "Identity";
  XPIPE_HOST_DEVICE static float forward(float x) { return x; }
  XPIPE_HOST_DEVICE static float backward(float /*x*/, float /*y*/, float dy) { return dy; }
  XPIPE_HOST_DEVICE static float backward_from_output(float /*y*/, float dy) { return dy; }
};

//! f(x) = max(x, 0); the gradient at 0 is taken as 0, as in PyTorch. A NaN input stays NaN
//! (written as x < 0 ? 0 : x), so divergence reaches the loss check instead of vanishing.
struct Relu {
  static constexpr const char* name = "ReLU";
  XPIPE_HOST_DEVICE static float forward(float x) { return x < 0.f ? 0.f : x; }
  //! dy where x > 0, +0 elsewhere (a NaN x too): the bits of `x > 0 ? dy : 0`, written as a mask
  //! on dy's bits. Inside a sum (BatchNormAct's channel sums) g++ 12 turned the select into a
  //! branch around the addition and ran the sum one element at a time, 40x slower; the mask it
  //! vectorises.
  XPIPE_HOST_DEVICE static float backward(float x, float /*y*/, float dy) {
    return float_from_bits(bits_from_float(dy) & (x > 0.f ? ~std::int32_t{0} : std::int32_t{0}));
  }
  //! The same gradient from the output alone: y = max(x, 0) > 0 exactly where x > 0 (a NaN x
  //! gives a NaN y, and both comparisons are false), so the bits equal backward's; the same mask.
  XPIPE_HOST_DEVICE static float backward_from_output(float y, float dy) {
    return float_from_bits(bits_from_float(dy) & (y > 0.f ? ~std::int32_t{0} : std::int32_t{0}));
  }
};

//! An activation whose gradient follows from its output y alone (ReLU, identity), so a layer
//! that fuses it into a GEMM need not keep the pre-activation (GELU's does not: x Phi(x) takes
//! some outputs at two inputs). Required: `static float backward_from_output(float y, float dy)`.
//! Usage: `static_assert(math::OutputDifferentiable<math::Relu>);`
template <class Act>
concept OutputDifferentiable = requires(float y, float dy) {
  { Act::backward_from_output(y, dy) } -> std::convertible_to<float>;
};

//! Exact GELU, f(x) = x * Phi(x) with Phi the standard normal CDF (PyTorch's default form),
//! erf and exp in plain arithmetic (elementary.hpp) so that the host vectorises the passes.
struct Gelu {
  static constexpr const char* name = "GELU";
  static constexpr float inv_sqrt2 = 0.70710678118654752440f;
  static constexpr float inv_sqrt_2pi = 0.39894228040143267794f;
  XPIPE_HOST_DEVICE static float forward(float x) {
    return 0.5f * x * (1.f + erf_poly(x * inv_sqrt2));
  }
  // d/dx [x Phi(x)] = Phi(x) + x phi(x), phi the standard normal density.
  XPIPE_HOST_DEVICE static float backward(float x, float /*y*/, float dy) {
    const float cdf = 0.5f * (1.f + erf_poly(x * inv_sqrt2));
    const float pdf = inv_sqrt_2pi * exp_poly(-0.5f * x * x);
    return dy * (cdf + x * pdf);
  }
};

//! One output element of a Linear layer: pre-activation z plus bias b, through Act.
template <class Act>
XPIPE_HOST_DEVICE float bias_activation(float z, float b) {
  return Act::forward(z + b);
}

static_assert(OutputDifferentiable<Relu> && OutputDifferentiable<Identity>);
static_assert(!OutputDifferentiable<Gelu>);

}  // namespace xpipe::math
