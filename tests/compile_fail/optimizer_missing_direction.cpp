// Must not compile: an optimizer without direction(...) cannot drive weight prediction.
#include "xpipe/xpipe.hpp"
struct NoDirection {
  static constexpr int moment_count = 0;
  static constexpr const char* name = "nodir";
  float learning_rate() const { return 0.1f; }
  void step(const xpipe::HostContext&, const xpipe::FlatState&) const {}
};
int main() {
  xpipe::OptimizerState<NoDirection, xpipe::Host> st(NoDirection{}, 4);
  return static_cast<int>(st.size());
}
