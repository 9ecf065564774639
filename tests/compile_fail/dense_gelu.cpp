// Must not compile: Dense takes the activation's gradient from its output, which GELU's output
// does not determine; the message names the way to write it instead.
#include "xpipe/xpipe.hpp"
using Bad = xpipe::Stage<xpipe::Dense<4, 8, xpipe::GELU>, xpipe::Linear<8, 2>>;
int main() {
  return static_cast<int>(Bad::param_count);
}
