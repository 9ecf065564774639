// Multi-step weight prediction: instead of W - s lr ΔW along today's direction, run the
// optimizer's own step s times on a scratch copy of the stage's state (weights and moments),
// with the last gradient held fixed: momentum, Adam's moments and bias corrections all roll
// forward (the idea of FTPipe-style "msnag" predictors).
#pragma once

#include <algorithm>
#include <array>

#include "xpipe/predict/predictor.hpp"

namespace xpipe {

//! MultiStep: every forward and backward reads the weights after s further steps of the stage's
//! optimizer (its apply-time s) from the current state, each with the gradient of the stage's
//! last step (zero before the first step of a train() call): exactly what s real steps with that
//! gradient would give, bit for bit, for any optimizer. Holds the live weights, the saved
//! gradient, the predicted weights and a scratch copy of each optimizer moment: 3 + moments
//! buffers (5 under Adam, 4 under SGD). Each prediction is s + 1 + moments passes; `max_steps`
//! (0, the default: none) caps the s rolled forward, trading the prediction for time.
struct MultiStep {
  static constexpr const char* name = "multistep";
  static constexpr StalenessTarget target = StalenessTarget::ApplyTime;
  int max_steps = 0;

  template <class F>
  void hyper_parameters(F&& f) {
    f("max_steps", max_steps, HyperRange{0, 1000});
  }

  template <class O, class B>
  class State : public PredictorHooks {
    static constexpr int moments = OptimizerState<O, B>::moment_buffers;

   public:
    explicit State(const PredictorSetup& setup, const MultiStep& p = {})
        : setup_(setup),
          max_steps_(p.max_steps),
          grad_(setup.params),
          weights_(setup.params),
          moment0_(moments > 0 ? setup.params : 0),
          moment1_(moments > 1 ? setup.params : 0) {}

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
    int weight_copies() const { return 3 + moments; }

   private:
    template <class Ctx>
    const float* at(const Ctx& ctx, OptimizerState<O, B>& opt, int s) {
      if (max_steps_ > 0) s = std::min(s, max_steps_);
      if (s == 0) return opt.weights();
      const index_t n = setup_.params;
      copy_buffer(ctx, opt.weights(), weights_.data(), n);
      if constexpr (moments > 0) copy_buffer(ctx, opt.moment(0), moment0_.data(), n);
      if constexpr (moments > 1) copy_buffer(ctx, opt.moment(1), moment1_.data(), n);
      FlatState ahead{
          weights_.data(), grad_.data(), {moment0_.data(), moment1_.data()}, n, opt.steps_taken()};
      // Each step ahead at its own rate (StepRates; the one rate without them).
      for (int i = 0; i < s; ++i, ++ahead.steps_taken)
        opt.optimizer_at(ahead.steps_taken + 1).step(ctx, ahead);
      return weights_.data();
    }

    PredictorSetup setup_;
    int max_steps_;
    typename B::template Buffer<float> grad_, weights_, moment0_, moment1_;
  };
};
static_assert(Predictor<MultiStep>);

}  // namespace xpipe
