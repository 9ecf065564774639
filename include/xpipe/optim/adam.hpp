// Adam (L2 weight decay added to the gradient) and AdamW (decoupled weight decay).
#pragma once

#include "xpipe/core/error.hpp"
#include "xpipe/kernels/ops.hpp"
#include "xpipe/optim/optimizer.hpp"

namespace xpipe {

//! Adam (Decoupled = false: weight decay, if any, is added to the gradient, L2) or AdamW
//! (Decoupled = true: w *= 1 - lr wd before the Adam update). Use the aliases Adam and AdamW.
//! Usage: `Adam{.lr = 1e-3f}`.
template <bool Decoupled>
struct BasicAdam {
  static constexpr int moment_count = 2;
  static constexpr const char* name = Decoupled ? "adamw" : "adam";
  // Each weight's update reads that weight, its gradient and moments alone: a step may be
  // taken layer by layer (steps_elementwise).
  static constexpr bool elementwise = true;
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = Decoupled ? 1e-2f : 0.f;

  float learning_rate() const { return lr; }

  //! Scalars with bias corrections for step t = steps_taken + 1 (`next`) or t = steps_taken.
  math::AdamScalars scalars(long t) const {
    if (!(lr > 0.f)) throw ConfigError("xpipe: Adam: learning rate must be > 0");
    if (!(beta1 >= 0.f && beta1 < 1.f && beta2 >= 0.f && beta2 < 1.f))
      throw ConfigError("xpipe: Adam: betas must lie in [0, 1)");
    return math::adam_scalars(lr, beta1, beta2, eps, weight_decay, Decoupled, t);
  }

  template <class Ctx>
  void step(const Ctx& ctx, const FlatState& s) const {
    adam_step(ctx, s.weights, s.grads, s.moments[0], s.moments[1], s.size,
              scalars(s.steps_taken + 1));
  }

  //! ΔW = m_hat / (sqrt(v_hat) + eps) with the corrections of the last step taken; zero before
  //! the first step (both moments are zero then).
  template <class Ctx>
  void direction(const Ctx& ctx, const FlatState& s, float* d) const {
    adam_direction(ctx, s.moments[0], s.moments[1], d, s.size,
                   scalars(s.steps_taken > 0 ? s.steps_taken : 1));
  }

  //! out = W - steps * lr * ΔW in one pass (XPipe's prediction over `steps` steps).
  template <class Ctx>
  void predict(const Ctx& ctx, const FlatState& s, float steps, float* out) const {
    adam_predict(ctx, s.weights, s.moments[0], s.moments[1], out, s.size, steps * lr,
                 scalars(s.steps_taken > 0 ? s.steps_taken : 1));
  }
};

using Adam = BasicAdam<false>;
using AdamW = BasicAdam<true>;
static_assert(Optimizer<Adam>);
static_assert(Optimizer<AdamW>);

}  // namespace xpipe
