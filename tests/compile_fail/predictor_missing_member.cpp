// Must not compile: a user predictor whose State has no backward_weights(...).
#include "xpipe/xpipe.hpp"
using namespace xpipe;
struct HalfPredictor {
  static constexpr const char* name = "half";
  template <class O, class B>
  struct State {
    explicit State(const PredictorSetup&) {}
    const float* forward_weights(const HostContext&, OptimizerState<O, B>& o, int) {
      return o.weights();
    }
    void backward_done(int) {}
    void before_step(const HostContext&, OptimizerState<O, B>&) {}
    int weight_copies() const { return 1; }
  };
};
static_assert(check_predictor<HalfPredictor>());
int main() {}
