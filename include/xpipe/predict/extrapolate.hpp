// Extrapolating predictors, SpecTrain and PipeOptim: W_hat = W - s * lr * dW along the
// optimizer's own update direction, one fused pass (Optimizer::predict), s from the schedule.
#pragma once

#include <cstdint>

#include "xpipe/predict/predictor.hpp"

namespace xpipe {

//! Which actions of a micro-batch read extrapolated weights; the others read the live ones.
enum class PredictedActions : std::uint8_t { Forward, Backward, ForwardAndBackward };

//! The state every extrapolating predictor shares: each predicted action gets its own s under
//! `Target` and one prediction scratch serves them all, recomputed at each call (so the stage
//! holds 2 buffers: the live weights and the scratch). A predictor derives from it and adds its
//! name. Usage: `struct Mine : Extrapolate<StalenessTarget::ApplyTime,
//! PredictedActions::Forward> { static constexpr const char* name = "mine"; };`
template <StalenessTarget Target, PredictedActions Predicted>
struct Extrapolate {
  static constexpr StalenessTarget target = Target;

  template <class O, class B>
  class State : public PredictorHooks {
    static constexpr bool predicts_forward = Predicted != PredictedActions::Backward;
    static constexpr bool predicts_backward = Predicted != PredictedActions::Forward;

   public:
    explicit State(const PredictorSetup& setup) : setup_(setup), scratch_(setup.params) {}

    template <class Ctx>
    const float* forward_weights(const Ctx& ctx, OptimizerState<O, B>& opt, int g) {
      if constexpr (!predicts_forward)
        return opt.weights();
      else
        return at(ctx, opt, setup_.analysis->forward(setup_.stage, g).s(target));
    }
    template <class Ctx>
    const float* backward_weights(const Ctx& ctx, OptimizerState<O, B>& opt, int g) {
      if constexpr (!predicts_backward)
        return opt.weights();
      else
        return at(ctx, opt, setup_.analysis->backward(setup_.stage, g).s(target));
    }
    int weight_copies() const { return 2; }

   private:
    // At s = 0 the prediction is the live weights: no pass, no copy.
    template <class Ctx>
    const float* at(const Ctx& ctx, OptimizerState<O, B>& opt, int s) {
      if (s == 0) return opt.weights();
      opt.predict(ctx, static_cast<float>(s), scratch_.data());
      return scratch_.data();
    }

    PredictorSetup setup_;
    typename B::template Buffer<float> scratch_;
  };
};

//! SpecTrain: round-trip target, predicted separately for the forward and for the backward
//! (each action gets its own s). Meant for SGD with momentum (dW = momentum buffer), works with
//! any Optimizer. Holds 2 buffers: the live weights and one prediction scratch.
struct SpecTrain : Extrapolate<StalenessTarget::RoundTrip, PredictedActions::ForwardAndBackward> {
  static constexpr const char* name = "spectrain";
};

//! PipeOptim: the forward reads weights predicted over its apply-time s; the backward reads the
//! live weights. Holds 2 buffers.
struct PipeOptim : Extrapolate<StalenessTarget::ApplyTime, PredictedActions::Forward> {
  static constexpr const char* name = "pipeoptim";
};

static_assert(Predictor<SpecTrain>);
static_assert(Predictor<PipeOptim>);

}  // namespace xpipe
