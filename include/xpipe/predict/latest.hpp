// Latest: no remedy for staleness. Every action reads whatever weights the stage holds now, so
// under an asynchronous schedule forward and backward of a micro-batch may see different
// versions (the inconsistent baseline).
#pragma once

#include "xpipe/predict/predictor.hpp"

namespace xpipe {

//! No remedy: forward and backward read the live weights. Holds 1 weight buffer.
struct Latest {
  static constexpr const char* name = "latest";

  template <class O, class B>
  class State : public PredictorHooks {
   public:
    explicit State(const PredictorSetup&) {}
    template <class Ctx>
    const float* forward_weights(const Ctx&, OptimizerState<O, B>& opt, int) {
      return opt.weights();
    }
    template <class Ctx>
    const float* backward_weights(const Ctx&, OptimizerState<O, B>& opt, int) {
      return opt.weights();
    }
    int weight_copies() const { return 1; }
  };
};
static_assert(Predictor<Latest>);

}  // namespace xpipe
