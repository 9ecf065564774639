// NAdam (Adam with Nesterov momentum; Dozat 2016) and NAdamW: the optimizer PipeNAG runs under
// weight stashing, usually with a high beta1.
#pragma once

#include "xpipe/core/error.hpp"
#include "xpipe/kernels/ops.hpp"
#include "xpipe/optim/optimizer.hpp"

namespace xpipe {

//! NAdam (Decoupled = false: L2 weight decay added to the gradient) or NAdamW (decoupled), with
//! a constant beta1 (no momentum-decay schedule): the update reads the momentum one step ahead,
//! w -= lr (beta1 m_t / (1 - beta1^(t+1)) + (1 - beta1) g_t / (1 - beta1^t)) / (sqrt(v_hat) + eps).
//! Use the aliases NAdam and NAdamW. Usage: `NAdam{.lr = 1e-3f, .beta1 = 0.99f}`.
template <bool Decoupled>
struct BasicNAdam {
  static constexpr int moment_count = 2;
  static constexpr const char* name = Decoupled ? "nadamw" : "nadam";
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = Decoupled ? 1e-2f : 0.f;

  float learning_rate() const { return lr; }

  math::NadamScalars scalars(long t) const {
    if (!(lr > 0.f)) throw ConfigError("xpipe: NAdam: learning rate must be > 0");
    if (!(beta1 >= 0.f && beta1 < 1.f && beta2 >= 0.f && beta2 < 1.f))
      throw ConfigError("xpipe: NAdam: betas must lie in [0, 1)");
    return math::nadam_scalars(lr, beta1, beta2, eps, weight_decay, Decoupled, t);
  }

  template <class Ctx>
  void step(const Ctx& ctx, const FlatState& s) const {
    nadam_step(ctx, s.weights, s.grads, s.moments[0], s.moments[1], s.size,
               scalars(s.steps_taken + 1));
  }

  //! ΔW = the next update if the next gradient were zero: c_m m / (sqrt(v_hat) + eps).
  template <class Ctx>
  void direction(const Ctx& ctx, const FlatState& s, float* d) const {
    nadam_predict(ctx, nullptr, s.moments[0], s.moments[1], d, s.size, 0.f,
                  scalars(s.steps_taken > 0 ? s.steps_taken : 1));
  }

  //! out = W - steps * lr * ΔW in one pass.
  template <class Ctx>
  void predict(const Ctx& ctx, const FlatState& s, float steps, float* out) const {
    nadam_predict(ctx, s.weights, s.moments[0], s.moments[1], out, s.size, steps * lr,
                  scalars(s.steps_taken > 0 ? s.steps_taken : 1));
  }
};

using NAdam = BasicNAdam<false>;
using NAdamW = BasicNAdam<true>;
static_assert(Optimizer<NAdam>);
static_assert(Optimizer<NAdamW>);

}  // namespace xpipe
