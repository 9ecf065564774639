// PipeNAG (Ajanthan et al., ICML 2025): weight stashing plus the Nesterov form of the optimizer
// with a high momentum, whose look-ahead offsets the delay of asynchronous pipelining.
#pragma once

#include <algorithm>

#include "xpipe/optim/variants.hpp"
#include "xpipe/predict/stash.hpp"

namespace xpipe {

namespace detail {
//! Stashing (forward and backward on the same version) + steps in the Nesterov form of the
//! optimizer (NAdam for the Adam family, Nesterov SGD for SGD: optim/variants.hpp) with momentum
//! beta(k): `high` at every stage, or, per stage, beta + (versions(k) - 1) (high - beta) / K
//! from the optimizer's own beta (versions(k): the weight versions stage k stashes). A momentum
//! decay psi > 0 gives the NAdam form PyTorch's momentum schedule (math::nadam_mu); 0 keeps the
//! optimizer's own.
template <class O, class B>
class PipeNAGState : public StashState<O, B> {
 public:
  PipeNAGState(const PredictorSetup& setup, float high, bool per_stage, float momentum_decay,
               const char* owner)
      : StashState<O, B>(setup, 0, owner),
        high_(high),
        per_stage_(per_stage),
        momentum_decay_(momentum_decay) {}

  //! The momentum stage k steps with, given the optimizer's own.
  float momentum(float own) const {
    if (!per_stage_) return high_;
    const PredictorSetup& s = this->setup();
    const int versions = s.analysis->stash_versions[s.stage];
    const float beta = own + static_cast<float>(versions - 1) * (high_ - own) /
                                 static_cast<float>(s.schedule->stages);
    return std::max(own, beta);
  }

  template <class Ctx>
  bool apply_step(const Ctx& ctx, OptimizerState<O, B>& opt) {
    const auto form = nesterov_form(opt.optimizer(), momentum(momentum_of(opt.optimizer())));
    if constexpr (requires { with_momentum_decay(form, momentum_decay_); }) {
      if (momentum_decay_ > 0.f) {
        opt.step_with(ctx, with_momentum_decay(form, momentum_decay_));
        return true;
      }
    } else if (momentum_decay_ > 0.f) {
      throw ConfigError(
          "xpipe: pipenag: momentum_decay is NAdam's momentum schedule; this "
          "optimizer's Nesterov form takes none");
    }
    opt.step_with(ctx, form);
    return true;
  }

 private:
  float high_;
  bool per_stage_;
  float momentum_decay_;
};
}  // namespace detail

namespace detail {
//! PipeNAG with the momentum at every stage (PerStage false) or per stage (true).
template <bool PerStage>
struct BasicPipeNAG {
  static constexpr const char* name = PerStage ? "pipenag-k" : "pipenag";
  float momentum = 0.99f;
  float momentum_decay = 0.f;  //!< psi of NAdam's momentum schedule (PyTorch: 0.004); 0: none

  template <class F>
  void hyper_parameters(F&& f) {
    f("momentum", momentum, HyperRange{0, 1, false, true});
    f("momentum_decay", momentum_decay, HyperRange{0, 1e6, false, true});
  }
  template <class O, class B>
  struct State : PipeNAGState<O, B> {
    explicit State(const PredictorSetup& setup, const BasicPipeNAG& p = {})
        : PipeNAGState<O, B>(setup, p.momentum, PerStage, p.momentum_decay, name) {}
  };
};
}  // namespace detail

//! PipeNAG: stashing + Nesterov steps (NAdam / Nesterov SGD) with momentum `momentum` (0.99, as
//! in the authors' code) at every stage; `momentum_decay` 0.004 gives the NAdam steps PyTorch's
//! momentum schedule, as the authors' torch.optim.NAdam has by default. Holds what Stash holds.
using PipeNAG = detail::BasicPipeNAG<false>;
//! PipeNAG's per-stage variant: momentum beta + (versions(k) - 1) (momentum - beta) / K, higher
//! where the delay is longer (beta: the optimizer's own, e.g. Adam's 0.9; `momentum` 0.99).
using PipeNAGStaged = detail::BasicPipeNAG<true>;

static_assert(Predictor<PipeNAG>);
static_assert(Predictor<PipeNAGStaged>);

}  // namespace xpipe
