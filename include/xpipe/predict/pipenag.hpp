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
//! beta(k): 0.99 at every stage, or, PerStage, beta + (versions(k) - 1) (0.99 - beta) / K from
//! the optimizer's own beta (versions(k): the weight versions stage k stashes).
template <bool PerStage, const char* Name>
struct BasicPipeNAG {
  static constexpr const char* name = Name;
  static constexpr float high_momentum = 0.99f;

  template <class O, class B>
  class State : public BasicStash<0, Name>::template State<O, B> {
    using Stash = typename BasicStash<0, Name>::template State<O, B>;

   public:
    explicit State(const PredictorSetup& setup) : Stash(setup), setup_(setup) {}

    //! The momentum stage k steps with, given the optimizer's own.
    float momentum(float own) const {
      if constexpr (!PerStage) {
        return high_momentum;
      } else {
        const int versions = setup_.analysis->stash_versions[setup_.stage];
        const float beta = own + static_cast<float>(versions - 1) * (high_momentum - own) /
                                     static_cast<float>(setup_.schedule->stages);
        return std::max(own, beta);
      }
    }

    template <class Ctx>
    bool apply_step(const Ctx& ctx, OptimizerState<O, B>& opt) {
      opt.step_with(ctx, nesterov_form(opt.optimizer(), momentum(momentum_of(opt.optimizer()))));
      return true;
    }

   private:
    PredictorSetup setup_;
  };
};
inline constexpr char pipenag_name[] = "pipenag";
inline constexpr char pipenag_staged_name[] = "pipenag-k";
}  // namespace detail

//! PipeNAG: stashing + Nesterov steps (NAdam / Nesterov SGD) with momentum 0.99 at every stage,
//! as in the authors' code. Holds what Stash holds.
using PipeNAG = detail::BasicPipeNAG<false, detail::pipenag_name>;
//! PipeNAG's per-stage variant: momentum beta + (versions(k) - 1) (0.99 - beta) / K, higher where
//! the delay is longer (beta: the optimizer's own, e.g. Adam's 0.9).
using PipeNAGStaged = detail::BasicPipeNAG<true, detail::pipenag_staged_name>;

static_assert(Predictor<PipeNAG>);
static_assert(Predictor<PipeNAGStaged>);

}  // namespace xpipe
