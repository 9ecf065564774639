// Must not compile: a user layer without backward(...) inside a Stage of a Pipeline (a Stage
// checks the backend-free members; the Pipeline checks forward/backward on its backend).
#include "xpipe/xpipe.hpp"
struct NoBackward {
  static constexpr int in_width = 3, out_width = 3;
  static constexpr xpipe::index_t param_count = 0;
  static void init(std::span<float>, std::uint64_t) {}
  static void forward(const xpipe::HostContext&, const float*, xpipe::ConstMatrix, xpipe::Matrix) {}
};
using Bad = xpipe::Stage<NoBackward>;
int main() {
  xpipe::Pipeline<Bad> p;
  return static_cast<int>(p.stage_count);
}
