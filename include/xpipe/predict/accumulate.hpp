// Bounded drift by accumulation (after PACI, 2026): a stage accumulates the gradients of several
// mini-batches and steps once for all of them, so its weights change more slowly than the
// pipeline delays its gradients; no stashing, and optionally a prediction of the next step.
#pragma once

#include <algorithm>
#include <vector>

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
//! `predict` = 1 adds prediction of the accumulated step: a forward whose gradient will be
//! applied after u real steps of the stage (at most 1 when a_k is the delay, more with a smaller
//! `interval`) reads the weights extrapolated u steps along the optimizer's direction
//! (Optimizer::predict); the backward reads the live ones; 2 buffers then.
struct AccumulateToBound {
  static constexpr const char* name = "paci";
  int interval = 0;
  int predict = 0;

  template <class F>
  void hyper_parameters(F&& f) {
    f("interval", interval, HyperRange{0, 1e6});
    f("predict", predict, HyperRange{0, 1});
  }

  template <class O, class B>
  class State : public PredictorHooks {
   public:
    explicit State(const PredictorSetup& setup, const AccumulateToBound& p = {})
        : setup_(setup),
          interval_(p.interval > 0 ? p.interval
                                   : std::max(1, setup.analysis->max_forward_s(setup.stage))),
          steps_in_run_(setup.schedule->mini_batches),
          ahead_(p.predict ? steps_ahead(setup, interval_) : std::vector<int>{}),
          scratch_(p.predict ? setup.params : 0) {}

    //! a_k: mini-batches per real step.
    int interval() const { return interval_; }
    //! With `predict`: the real steps between micro-batch g's forward and the step that
    //! applies its gradient (what its forward extrapolates over).
    int steps_ahead(int g) const {
      return ahead_.empty() ? 0 : ahead_[static_cast<std::size_t>(g)];
    }

    template <class Ctx>
    const float* forward_weights(const Ctx& ctx, OptimizerState<O, B>& opt, int g) {
      const int u = steps_ahead(g);
      if (u == 0) return opt.weights();
      opt.predict(ctx, static_cast<float>(u), scratch_.data());
      return scratch_.data();
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
    int weight_copies() const { return ahead_.empty() ? 1 : 2; }

   private:
    // Schedule step t is a real step when (t + 1) % a == 0 or it is the call's last. F(g) reads
    // the weights after the real steps before its version v; its gradient, added before step
    // v + s (s its apply-time staleness), is applied by the first real step r >= v + s, so the
    // weights then have moved by the real steps t with v <= t < r.
    static std::vector<int> steps_ahead(const PredictorSetup& setup, int a) {
      const int N = setup.schedule->mini_batches;
      auto real = [&](int t) { return (t + 1) % a == 0 || t + 1 == N; };
      std::vector<int> out(static_cast<std::size_t>(setup.schedule->total_micro_batches()), 0);
      for (std::size_t g = 0; g < out.size(); ++g) {
        const ActionVersion& f = setup.analysis->forward(setup.stage, static_cast<int>(g));
        int r = f.version + f.apply_time;
        while (r < N - 1 && !real(r)) ++r;
        for (int t = f.version; t < r; ++t) out[g] += real(t) ? 1 : 0;
      }
      return out;
    }

    PredictorSetup setup_;
    int interval_, steps_in_run_;
    int pending_ = 0, seen_ = 0;
    std::vector<int> ahead_;  // [g]: steps_ahead(g); empty without `predict`
    typename B::template Buffer<float> scratch_;
  };
};
static_assert(Predictor<AccumulateToBound>);

}  // namespace xpipe
