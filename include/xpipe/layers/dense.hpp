// Dense<In, Out, Act>: a Linear layer and its activation as one layer, y = Act(x W + b), so the
// activation is applied where the bias is added (on CUDA by one kernel after the GEMM, or by
// the GEMM's epilogue where CudaLtPlans::forward_epilogues is on).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "xpipe/core/error.hpp"
#include "xpipe/kernels/activation.hpp"
#include "xpipe/kernels/ops.hpp"
#include "xpipe/layers/activation.hpp"
#include "xpipe/layers/layer.hpp"
#include "xpipe/layers/linear.hpp"

namespace xpipe {

//! A fully connected layer fused with its activation: parameters W (In x Out, row-major) then b,
//! as Linear<In, Out>, and the same results bit for bit on the host as `Linear<In, Out>, Act`.
//! It starts from the same weights too (it takes two of a model's layer numbers for seeding).
//! It keeps only its output (Linear then ReLU keep the pre-activation too), adds the bias and
//! applies Act in one pass (on CUDA a kernel after the GEMM, or the GEMM's epilogue), and takes
//! the activation's gradient from the output, so Act must be math::OutputDifferentiable (ReLU;
//! GELU is not: write `Linear<In, Out>, GELU`). The backward needs a gradient buffer of its own
//! (Stage passes its third scratch buffer).
//! Usage: `Stage<Dense<784, 1024, ReLU>, Dense<1024, 1024, ReLU>, Linear<1024, 10>>`.
template <int In, int Out, class Act, class Init = HeUniform>
struct Dense {
  static_assert(
      requires { typename Act::function; },
      "xpipe: Dense<In, Out, Act>: Act must be an activation layer such as ReLU");
  using function = typename Act::function;
  static_assert(math::OutputDifferentiable<function>,
                "xpipe: Dense<In, Out, Act>: Act's gradient must follow from its output (its "
                "function needs static backward_from_output(y, dy), as ReLU's has); for GELU "
                "write Linear<In, Out>, GELU");
  using linear = Linear<In, Out, Init>;
  static constexpr int in_width = In;
  static constexpr int out_width = Out;
  static constexpr index_t weight_count = linear::weight_count;
  static constexpr index_t param_count = linear::param_count;
  static constexpr double macs = linear::macs;
  //! Takes the two layer numbers of the `Linear<In, Out>, Act` it stands for (Stage::init), so
  //! a model with Dense layers starts from the weights of the same model written unfused.
  static constexpr std::size_t init_streams = 2;

  //! W from Init, b = 0: the draws of Linear<In, Out, Init> with the same seed.
  static void init(std::span<float> params, std::uint64_t seed) { linear::init(params, seed); }

  //! y = Act(x W + b).
  template <class Ctx>
  static void forward(const Ctx& ctx, const float* params, ConstMatrix x, Matrix y) {
    detail::check_fc_widths("Dense", In, Out, x, y, "forward");
    linear_forward<function>(ctx, x, params, params + weight_count, y);
  }

  //! dz = Act'(y) dy into `scratch` (at least rows x Out), then dW (+)= x^T dz, db (+)= column
  //! sums of dz, dx = dz W^T (skipped when dx is empty). Wrong widths, or a scratch buffer
  //! missing or too small, are a ShapeError naming the layer.
  template <class Ctx>
  static void backward(const Ctx& ctx, const float* params, float* grads, bool accumulate,
                       ConstMatrix x, ConstMatrix y, ConstMatrix dy, Matrix dx, Matrix scratch) {
    detail::check_fc_widths("Dense", In, Out, x, dy, "backward");
    if (scratch.data == nullptr || scratch.rows < dy.rows || scratch.cols < Out)
      throw ShapeError("xpipe: " + detail::fc_name("Dense", In, Out) +
                       "::backward: needs a scratch buffer of at least " + std::to_string(dy.rows) +
                       "x" + std::to_string(Out) + " for dz, got " + std::to_string(scratch.rows) +
                       "x" + std::to_string(scratch.cols) + " (Stage passes one)");
    const Matrix dz{scratch.data, dy.rows, Out};
    activation_backward_from_output<function>(ctx, y, dy, dz);
    linear::gradients(ctx, params, grads, accumulate, x, dz, dx);
  }

  //! The input half of a split backward: dz = Act'(y) dy, written over dy (the weight half reads
  //! it there), then dx = dz W^T (nothing when dx is empty).
  template <class Ctx>
  static void backward_input(const Ctx& ctx, const float* params, ConstMatrix x, ConstMatrix y,
                             Matrix dy, Matrix dx) {
    detail::check_fc_widths("Dense", In, Out, x, dy, "backward_input");
    activation_backward_from_output<function>(ctx, y, dy, dy);
    linear::input_gradient(ctx, params, dy, dx);
  }

  //! The weight half: dW (+)= x^T dz, db (+)= column sums of dz, with dz where backward_input
  //! left it.
  template <class Ctx>
  static void backward_weight(const Ctx& ctx, float* grads, bool accumulate, ConstMatrix x,
                              ConstMatrix y, ConstMatrix dz) {
    linear::backward_weight(ctx, grads, accumulate, x, y, dz);
  }
};

static_assert(Layer<Dense<4, 3, ReLU>> && splits_backward<Dense<4, 3, ReLU>>);

}  // namespace xpipe
