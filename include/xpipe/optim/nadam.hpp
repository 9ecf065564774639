// NAdam (Adam with Nesterov momentum; Dozat 2016) and NAdamW: the optimizer PipeNAG runs under
// weight stashing, usually with a high beta1.
#pragma once

#include <string>

#include "xpipe/core/error.hpp"
#include "xpipe/kernels/ops.hpp"
#include "xpipe/optim/optimizer.hpp"

namespace xpipe {

//! NAdam (Decoupled = false: L2 weight decay added to the gradient) or NAdamW (decoupled): the
//! update reads the momentum one step ahead, w -= lr (c_m m_t + c_g g_t) / (sqrt(v_hat) + eps)
//! (math::nadam_scalars). `momentum_decay` psi sets the momentum schedule mu_t = beta1 (1 - 0.5 *
//! 0.96^(t psi)) of torch.optim.NAdam (whose default is 0.004); 0, the default here, keeps
//! mu_t = beta1 (c_m = beta1 / (1 - beta1^(t+1)), c_g = (1 - beta1) / (1 - beta1^t)).
//! Use the aliases NAdam and NAdamW. Usage: `NAdam{.lr = 1e-3f, .beta1 = 0.99f}`,
//! `NAdam{.lr = 1e-3f, .momentum_decay = 0.004f}` (PyTorch's NAdam).
template <bool Decoupled>
struct BasicNAdam {
  static constexpr int moment_count = 2;
  static constexpr const char* name = Decoupled ? "nadamw" : "nadam";
  // Each weight's update reads that weight, its gradient and moments alone: a step may be
  // taken layer by layer (steps_elementwise).
  static constexpr bool elementwise = true;
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = Decoupled ? 1e-2f : 0.f;
  float momentum_decay = 0.f;  //!< psi of the momentum schedule; 0: constant beta1

  float learning_rate() const { return lr; }

  math::NadamScalars scalars(long t) const {
    if (!(lr > 0.f)) throw ConfigError("xpipe: NAdam: learning rate must be > 0");
    if (!(beta1 >= 0.f && beta1 < 1.f && beta2 >= 0.f && beta2 < 1.f))
      throw ConfigError("xpipe: NAdam: betas must lie in [0, 1)");
    if (!(momentum_decay >= 0.f && momentum_decay < 1e6f))
      throw ConfigError("xpipe: NAdam: momentum_decay must lie in [0, 1e6), got " +
                        std::to_string(momentum_decay));
    return math::nadam_scalars(lr, beta1, beta2, eps, weight_decay, Decoupled, t, momentum_decay);
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
