// Must not compile: BatchNormAct takes the activation's gradient from its output, which GELU's
// output does not determine; the message names the way to write it instead.
#include "xpipe/xpipe.hpp"
using Bad = xpipe::Stage<xpipe::BatchNormAct<xpipe::Shape<4, 2, 2>, xpipe::GELU>>;
int main() {
  return static_cast<int>(Bad::param_count);
}
