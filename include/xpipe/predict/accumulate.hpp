// Bounded drift by accumulation (after PACI, 2026): a stage accumulates the gradients of several
// mini-batches and steps once for all of them, so its weights change more slowly than the
// pipeline delays its gradients; no stashing, no prediction.
#pragma once

#include <algorithm>

#include "xpipe/predict/predictor.hpp"

namespace xpipe {

//! AccumulateToBound: stage k steps once every a_k mini-batches, a_k = its delay (the largest
//! apply-time s of its forwards; at least 1), with the mean of their gradients; the other Step
//! actions only let the gradients accumulate. Between a micro-batch's forward and the step that
//! applies its gradient lie at most s <= a_k schedule steps, so at most one real update: the
//! weights it was computed on are at most one version old. The last Step of a train() call
//! steps whatever has accumulated (nothing crosses an epoch). Forward and backward read the live
//! weights; holds 1 buffer. Stage k takes about 1 / a_k of the steps of the others.
//! `interval` (0, the default: each stage's delay) sets one a for every stage instead.
struct AccumulateToBound {
  static constexpr const char* name = "paci";
  int interval = 0;

  template <class F>
  void hyper_parameters(F&& f) {
    f("interval", interval, HyperRange{0, 1e6});
  }

  template <class O, class B>
  class State : public PredictorHooks {
   public:
    explicit State(const PredictorSetup& setup, const AccumulateToBound& p = {})
        : setup_(setup),
          interval_(p.interval > 0 ? p.interval
                                   : std::max(1, setup.analysis->max_forward_s(setup.stage))),
          steps_in_run_(setup.schedule->mini_batches) {}

    //! a_k: mini-batches per real step.
    int interval() const { return interval_; }

    template <class Ctx>
    const float* forward_weights(const Ctx&, OptimizerState<O, B>& opt, int) {
      return opt.weights();
    }
    template <class Ctx>
    const float* backward_weights(const Ctx&, OptimizerState<O, B>& opt, int) {
      return opt.weights();
    }
    template <class Ctx>
    bool apply_step(const Ctx& ctx, OptimizerState<O, B>& opt) {
      ++pending_;
      ++seen_;
      if (pending_ < interval_ && seen_ < steps_in_run_) return false;
      if (pending_ > 1)
        scale_buffer(ctx, opt.grads(), setup_.params, 1.f / static_cast<float>(pending_));
      opt.step(ctx);
      pending_ = 0;
      return true;
    }
    int weight_copies() const { return 1; }

   private:
    PredictorSetup setup_;
    int interval_, steps_in_run_;
    int pending_ = 0, seen_ = 0;
  };
};
static_assert(Predictor<AccumulateToBound>);

}  // namespace xpipe
