// PipeMare (Yang et al., MLSys 2021): asynchronous pipelining with no stashing and no prediction;
// each stage's learning rate is scaled down by its delay, the scaling annealed away, and the
// backward corrects the weights it reads for the steps taken since the micro-batch's forward.
#pragma once

#include <algorithm>
#include <cmath>

#include "xpipe/optim/variants.hpp"
#include "xpipe/predict/predictor.hpp"

namespace xpipe {

//! PipeMare. Stage k's delay tau_k is the largest apply-time s of its forwards (K - 1 - k for
//! async 1F1B at M = 1).
//!   - Learning-rate rescheduling: step t (0-based, counted over the whole training) uses
//!     lr tau_k^-(1 - min(t / T, 1)): lr / tau_k at the start, the full lr from step T on. T is
//!     `anneal_steps`, or with 0 (the default) one epoch's mini-batches of the schedule trained.
//!   - Discrepancy correction: the backward of a micro-batch forwarded `lag` steps earlier reads
//!     W - lag * delta, where delta is an exponential average of the per-step weight change,
//!     delta = gamma delta + (1 - gamma) (W_t+1 - W_t), gamma = 1 - 1 / tau_k (an average over
//!     about tau_k steps): the weights extrapolated back to those the forward read.
//! Holds 3 buffers: the live weights, delta and one scratch. delta starts at zero with each
//! train() call (one epoch), so a resumed run computes the same bits.
struct PipeMare {
  static constexpr const char* name = "pipemare";
  int anneal_steps = 0;  // T; 0: the mini-batches of the schedule trained

  template <class F>
  void hyper_parameters(F&& f) {
    f("anneal_steps", anneal_steps, HyperRange{0, 1e9});
  }

  template <class O, class B>
  class State : public PredictorHooks {
   public:
    explicit State(const PredictorSetup& setup, const PipeMare& p = {})
        : setup_(setup),
          tau_(std::max(1, setup.analysis->max_forward_s(setup.stage))),
          anneal_steps_(
              std::max(1, p.anneal_steps > 0 ? p.anneal_steps : setup.schedule->mini_batches)),
          velocity_(setup.params),
          scratch_(setup.params) {}

    //! lr factor of step t (0-based): tau^-(1 - min(t / T, 1)).
    float rate_scale(long t) const {
      const double progress = std::min(1.0, static_cast<double>(t) / anneal_steps_);
      return static_cast<float>(std::pow(static_cast<double>(tau_), -(1.0 - progress)));
    }
    //! gamma of the velocity average: 1 - 1 / tau.
    float gamma() const { return 1.f - 1.f / static_cast<float>(tau_); }

    template <class Ctx>
    const float* forward_weights(const Ctx&, OptimizerState<O, B>& opt, int) {
      return opt.weights();
    }
    template <class Ctx>
    const float* backward_weights(const Ctx& ctx, OptimizerState<O, B>& opt, int g) {
      const auto& a = *setup_.analysis;
      const int lag = a.backward(setup_.stage, g).version - a.forward(setup_.stage, g).version;
      if (lag == 0) return opt.weights();
      const float* x[2] = {opt.weights(), velocity_.data()};
      const float c[2] = {1.f, -static_cast<float>(lag)};
      combine(ctx, x, c, 2, scratch_.data(), setup_.params);
      return scratch_.data();
    }
    //! Keeps the weights before the step (in the scratch: no backward runs during a step).
    template <class Ctx>
    void before_step(const Ctx& ctx, OptimizerState<O, B>& opt) {
      copy_buffer(ctx, opt.weights(), scratch_.data(), setup_.params);
    }
    template <class Ctx>
    bool apply_step(const Ctx& ctx, OptimizerState<O, B>& opt) {
      const O& o = opt.optimizer();
      opt.step_with(ctx, with_learning_rate(o, o.learning_rate() * rate_scale(opt.steps_taken())));
      velocity_update(ctx, velocity_.data(), opt.weights(), scratch_.data(), setup_.params,
                      gamma());
      return true;
    }
    int weight_copies() const { return 3; }

   private:
    PredictorSetup setup_;
    int tau_;
    int anneal_steps_;
    typename B::template Buffer<float> velocity_, scratch_;
  };
};
static_assert(Predictor<PipeMare>);

}  // namespace xpipe
