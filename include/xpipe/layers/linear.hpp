// Linear<In, Out>: y = x W + b, with W stored In x Out row-major in the stage's flat buffer.
#pragma once

#include <algorithm>
#include <span>
#include <string>

#include "xpipe/core/error.hpp"
#include "xpipe/kernels/ops.hpp"
#include "xpipe/layers/init.hpp"
#include "xpipe/layers/layer.hpp"

namespace xpipe {

namespace detail {
// "Linear<784, 1024>": how errors name a fully connected layer of kind `kind`.
inline std::string fc_name(const char* kind, int in, int out) {
  return std::string(kind) + "<" + std::to_string(in) + ", " + std::to_string(out) + ">";
}

// The widths check of a fully connected layer: its GEMMs take their sizes from the views, so an
// input of other than `in` columns or an output (gradient) of other than `out` is a ShapeError
// naming the layer and the call, not a product of the wrong shape. Called every forward and
// backward: it builds no string unless it throws.
inline void check_fc_widths(const char* kind, int in, int out, ConstMatrix x, ConstMatrix y,
                            const char* where) {
  if (x.cols != in || y.cols != out)
    throw ShapeError("xpipe: " + fc_name(kind, in, out) + "::" + where + ": got " +
                     std::to_string(x.cols) + " input and " + std::to_string(y.cols) +
                     " output columns");
}
}  // namespace detail

//! Fully connected layer. Parameters: W (In x Out, row-major) then b (Out).
//! Usage: `Stage<Linear<784, 1024>, ReLU, Linear<1024, 10>>`.
template <int In, int Out, class Init = HeUniform>
struct Linear {
  static_assert(In > 0 && Out > 0, "xpipe: Linear<In, Out>: widths must be positive");
  static constexpr int in_width = In;
  static constexpr int out_width = Out;
  static constexpr index_t weight_count = static_cast<index_t>(In) * Out;
  static constexpr index_t param_count = weight_count + Out;
  //! Multiply-adds of the forward per row (the backward does twice as many).
  static constexpr double macs = static_cast<double>(weight_count);
  //! Its input half reads dy and W, its weight half dy and x: they may run at once.
  static constexpr bool input_half_keeps_dy = true;

  //! W from Init, b = 0.
  static void init(std::span<float> params, std::uint64_t seed) {
    init_uniform<Init>(params.first(weight_count), In, Out, seed);
    std::fill(params.begin() + weight_count, params.end(), 0.f);
  }

  //! An input of other than In columns, or an output (gradient) of other than Out, is a
  //! ShapeError naming the layer (detail::check_fc_widths).
  static void check_widths(ConstMatrix in, ConstMatrix out, const char* where) {
    detail::check_fc_widths("Linear", In, Out, in, out, where);
  }

  //! y = x W + b.
  template <class Ctx>
  static void forward(const Ctx& ctx, const float* params, ConstMatrix x, Matrix y) {
    check_widths(x, y, "forward");
    linear_forward(ctx, x, params, params + weight_count, y);
  }

  //! dW (+)= x^T dy, db (+)= column sums of dy, dx = dy W^T (skipped when dx is empty).
  template <class Ctx>
  static void backward(const Ctx& ctx, const float* params, float* grads, bool accumulate,
                       ConstMatrix x, ConstMatrix /*y*/, ConstMatrix dy, Matrix dx) {
    check_widths(x, dy, "backward");
    gradients(ctx, params, grads, accumulate, x, dy, dx);
  }

  //! The input half of a split backward: dx = dy W^T (nothing when dx is empty); dy stays as it
  //! is, for backward_weight.
  template <class Ctx>
  static void backward_input(const Ctx& ctx, const float* params, ConstMatrix x, ConstMatrix /*y*/,
                             Matrix dy, Matrix dx) {
    check_widths(x, dy, "backward_input");
    input_gradient(ctx, params, dy, dx);
  }

  //! The weight half: dW (+)= x^T dy, db (+)= column sums of dy.
  template <class Ctx>
  static void backward_weight(const Ctx& ctx, float* grads, bool accumulate, ConstMatrix x,
                              ConstMatrix /*y*/, ConstMatrix dy) {
    check_widths(x, dy, "backward_weight");
    linear_param_grads(ctx, x, dy, grads, grads + weight_count, accumulate);
  }

  //! dx = dy W^T, unless dx is empty (views already checked).
  template <class Ctx>
  static void input_gradient(const Ctx& ctx, const float* params, ConstMatrix dy, Matrix dx) {
    if (!dx.empty())
      gemm(ctx, Trans::No, Trans::Yes, dy.rows, In, Out, 1.f, dy.data, dy.ld, params, Out, 0.f,
           dx.data, dx.ld);
  }

  //! backward's work on views already checked (Dense calls it with its dz as dy).
  template <class Ctx>
  static void gradients(const Ctx& ctx, const float* params, float* grads, bool accumulate,
                        ConstMatrix x, ConstMatrix dy, Matrix dx) {
    linear_param_grads(ctx, x, dy, grads, grads + weight_count, accumulate);
    input_gradient(ctx, params, dy, dx);
  }
};

static_assert(Layer<Linear<4, 3>> && splits_backward<Linear<4, 3>>);

}  // namespace xpipe
