// Must not compile: a user predictor whose State cannot be built from a PredictorSetup.
#include "xpipe/xpipe.hpp"
using namespace xpipe;
struct NoSetup {
  static constexpr const char* name = "no-setup";
  template <class O, class B>
  struct State : PredictorHooks {
    State() = default;
    template <class Ctx>
    const float* forward_weights(const Ctx&, OptimizerState<O, B>& o, int) {
      return o.weights();
    }
    template <class Ctx>
    const float* backward_weights(const Ctx&, OptimizerState<O, B>& o, int) {
      return o.weights();
    }
    int weight_copies() const { return 1; }
  };
};
static_assert(check_predictor<NoSetup>());
int main() {}
