// Weight prediction: SpecTrain and PipeOptim (XPipe is in predict/xpipe.hpp). Each extrapolates
// the live weights s steps along the optimizer's own update direction, W_hat = W - s * lr * dW,
// in one fused pass (Optimizer::predict), with s read off the schedule's staleness analysis.
#pragma once

#include "xpipe/predict/predictor.hpp"

namespace xpipe {

namespace detail {
//! One prediction buffer: W_hat = W - s lr dW computed on demand, or the live weights at s = 0.
template <class O, class B>
class PredictionScratch {
 public:
  explicit PredictionScratch(index_t params) : buffer_(params) {}
  template <class Ctx>
  const float* at(const Ctx& ctx, OptimizerState<O, B>& opt, int s) {
    if (s == 0) return opt.weights();
    opt.predict(ctx, static_cast<float>(s), buffer_.data());
    return buffer_.data();
  }

 private:
  typename B::template Buffer<float> buffer_;
};
}  // namespace detail

//! SpecTrain: round-trip target, predicted separately for the forward and for the backward
//! (each action gets its own s). Meant for SGD with momentum (dW = momentum buffer), works with
//! any Optimizer. Holds 2 buffers: the live weights and one prediction scratch.
struct SpecTrain {
  static constexpr const char* name = "spectrain";
  static constexpr StalenessTarget target = StalenessTarget::RoundTrip;

  template <class O, class B>
  class State : public PredictorHooks {
   public:
    explicit State(const PredictorSetup& setup) : setup_(setup), scratch_(setup.params) {}
    template <class Ctx>
    const float* forward_weights(const Ctx& ctx, OptimizerState<O, B>& opt, int g) {
      return scratch_.at(ctx, opt, setup_.analysis->forward(setup_.stage, g).s(target));
    }
    template <class Ctx>
    const float* backward_weights(const Ctx& ctx, OptimizerState<O, B>& opt, int g) {
      return scratch_.at(ctx, opt, setup_.analysis->backward(setup_.stage, g).s(target));
    }
    int weight_copies() const { return 2; }

   private:
    PredictorSetup setup_;
    detail::PredictionScratch<O, B> scratch_;
  };
};

//! PipeOptim: the forward reads weights predicted over its apply-time s; the backward reads the
//! live weights. Holds 2 buffers.
struct PipeOptim {
  static constexpr const char* name = "pipeoptim";
  static constexpr StalenessTarget target = StalenessTarget::ApplyTime;

  template <class O, class B>
  class State : public PredictorHooks {
   public:
    explicit State(const PredictorSetup& setup) : setup_(setup), scratch_(setup.params) {}
    template <class Ctx>
    const float* forward_weights(const Ctx& ctx, OptimizerState<O, B>& opt, int g) {
      return scratch_.at(ctx, opt, setup_.analysis->forward(setup_.stage, g).s(target));
    }
    template <class Ctx>
    const float* backward_weights(const Ctx&, OptimizerState<O, B>& opt, int) {
      return opt.weights();
    }
    int weight_copies() const { return 2; }

   private:
    PredictorSetup setup_;
    detail::PredictionScratch<O, B> scratch_;
  };
};

static_assert(Predictor<SpecTrain>);
static_assert(Predictor<PipeOptim>);

}  // namespace xpipe
