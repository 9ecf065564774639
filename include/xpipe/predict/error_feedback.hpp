// PipeDream-2BW with an error-feedback correction (after Zmushko et al., 2026): the delay stays
// one step, and each update is pushed on by how much it changed since the previous one.
#pragma once

#include "xpipe/predict/stash.hpp"

namespace xpipe {

//! DoubleBufferedEF: DoubleBuffered (two versions, gradients applied with delay 1; the schedule
//! must need no more, M >= K for async 1F1B), and after each step the correction
//!   W_t+1 = W_t - u_t - gamma (u_t - u_t-1),
//! u_t the update the optimizer applied from the one-step-old gradient: u_t - u_t-1 estimates how
//! much the update computed on the current weights would differ, and the weights move on by it
//! (gamma = 1 by default; the first step of a train() call has no u_t-1 and is not corrected).
//! Our reading of the paper's optimizer-agnostic correction; written over the applied update, so
//! it works for every optimizer. Holds DoubleBuffered's buffers plus 2: the weights before the
//! step and u_t-1.
struct DoubleBufferedEF {
  static constexpr const char* name = "2bw-ef";
  float gamma = 1.f;

  template <class F>
  void hyper_parameters(F&& f) {
    f("gamma", gamma, HyperRange{0, 4});
  }

  template <class O, class B>
  class State : public detail::StashState<O, B> {
    using Stash = detail::StashState<O, B>;

   public:
    explicit State(const PredictorSetup& setup, const DoubleBufferedEF& p = {})
        : Stash(setup, 2, name),
          gamma_(p.gamma),
          params_(setup.params),
          before_(setup.params),
          last_update_(setup.params) {}

    template <class Ctx>
    bool apply_step(const Ctx& ctx, OptimizerState<O, B>& opt) {
      copy_buffer(ctx, opt.weights(), before_.data(), params_);
      opt.step(ctx);
      error_feedback(ctx, opt.weights(), before_.data(), last_update_.data(), params_,
                     has_last_ ? gamma_ : 0.f);
      has_last_ = true;
      return true;
    }
    int weight_copies() const { return Stash::weight_copies() + 2; }

   private:
    float gamma_;
    index_t params_;
    typename B::template Buffer<float> before_, last_update_;
    bool has_last_ = false;
  };
};
static_assert(Predictor<DoubleBufferedEF>);

}  // namespace xpipe
