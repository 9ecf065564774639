// Multi-step weight prediction: instead of W - s lr ΔW along today's direction, roll the
// optimizer's own recurrences (momentum, Adam's moments and bias corrections) forward s steps on
// the assumption that the last gradient persists (the idea of FTPipe-style "msnag" predictors).
#pragma once

#include <string>

#include "xpipe/core/error.hpp"
#include "xpipe/predict/predictor.hpp"

namespace xpipe {

//! MultiStep: every forward and backward reads the weights rolled forward over its apply-time s
//! by the optimizer's `rollout(ctx, flat, g, s, out)` (SGD, Adam, AdamW and AnyOptimizer over
//! them have one), g = the gradient of the stage's last step (zero before the first). Holds 3
//! buffers: the live weights, the saved gradient and one prediction scratch.
struct MultiStep {
  static constexpr const char* name = "multistep";
  static constexpr StalenessTarget target = StalenessTarget::ApplyTime;

  template <class O, class B>
  class State : public PredictorHooks {
    static_assert(
        requires(const O& o, const typename B::Context& ctx, const FlatState& f, float* out) {
          o.rollout(ctx, f, out, 1, out);
        },
        "xpipe: MultiStep: the optimizer lacks rollout(ctx, const FlatState&, const "
        "float* g, int steps, float* out) const");

   public:
    explicit State(const PredictorSetup& setup)
        : setup_(setup), grad_(setup.params), scratch_(setup.params) {}

    template <class Ctx>
    const float* forward_weights(const Ctx& ctx, OptimizerState<O, B>& opt, int g) {
      return at(ctx, opt, setup_.analysis->forward(setup_.stage, g).apply_time);
    }
    template <class Ctx>
    const float* backward_weights(const Ctx& ctx, OptimizerState<O, B>& opt, int g) {
      return at(ctx, opt, setup_.analysis->backward(setup_.stage, g).apply_time);
    }
    //! Keeps the gradient this step applies: the one assumed to persist.
    template <class Ctx>
    void before_step(const Ctx& ctx, OptimizerState<O, B>& opt) {
      copy_buffer(ctx, opt.grads(), grad_.data(), setup_.params);
    }
    int weight_copies() const { return 3; }

   private:
    template <class Ctx>
    const float* at(const Ctx& ctx, OptimizerState<O, B>& opt, int s) {
      if (s == 0) return opt.weights();
      opt.optimizer().rollout(ctx, opt.flat(), grad_.data(), s, scratch_.data());
      return scratch_.data();
    }

    PredictorSetup setup_;
    typename B::template Buffer<float> grad_, scratch_;
  };
};
static_assert(Predictor<MultiStep>);

}  // namespace xpipe
