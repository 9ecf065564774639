// Must not compile: a user layer without backward(...) inside a Stage.
#include "xpipe/xpipe.hpp"
struct NoBackward {
  static constexpr int in_width = 3, out_width = 3;
  static constexpr xpipe::index_t param_count = 0;
  static void init(std::span<float>, std::uint64_t) {}
  static void forward(const xpipe::HostContext&, const float*, xpipe::ConstMatrix, xpipe::Matrix) {}
};
using Bad = xpipe::Stage<NoBackward>;
int main() { return static_cast<int>(Bad::param_count); }
