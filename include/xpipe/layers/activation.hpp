// Parameter-free, width-preserving activation layers: ReLU and GELU.
#pragma once

#include <span>

#include "xpipe/kernels/ops.hpp"
#include "xpipe/layers/layer.hpp"

namespace xpipe {

//! An element-wise activation layer over a math functor from kernels/activation.hpp.
template <class Fn>
struct Activation {
  using function = Fn;
  static constexpr int in_width = any_width;
  static constexpr int out_width = any_width;
  static constexpr index_t param_count = 0;

  static void init(std::span<float>, std::uint64_t) {}

  template <class Ctx>
  static void forward(const Ctx& ctx, const float* /*params*/, ConstMatrix x, Matrix y) {
    activation_forward<Fn>(ctx, x, y);
  }

  template <class Ctx>
  static void backward(const Ctx& ctx, const float* /*params*/, float* /*grads*/,
                       bool /*accumulate*/, ConstMatrix x, ConstMatrix y, ConstMatrix dy,
                       Matrix dx) {
    if (!dx.empty()) activation_backward<Fn>(ctx, x, y, dy, dx);
  }
};

//! An activation layer: one that names its per-element function (`typename L::function`), which
//! a layer fusing it applies (Dense, BatchNormAct). Usage: `static_assert(ActivationLayer<ReLU>);`
template <class L>
concept ActivationLayer = requires {
  typename L::function;
};

//! max(x, 0).
using ReLU = Activation<math::Relu>;
//! x Phi(x), the exact (erf) form.
using GELU = Activation<math::Gelu>;

static_assert(Layer<ReLU> && ActivationLayer<ReLU>);
static_assert(Layer<GELU>);

}  // namespace xpipe
