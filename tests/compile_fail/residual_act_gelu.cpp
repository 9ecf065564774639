// Must not compile: ResidualAct takes the activation's gradient from the block's output, which
// GELU's output does not determine; the message names the way to write it instead.
#include "xpipe/xpipe.hpp"
using S = xpipe::Shape<4, 2, 2>;
using Bad = xpipe::Stage<xpipe::ResidualAct<xpipe::GELU, xpipe::BatchNorm2d<S>>>;
int main() {
  return static_cast<int>(Bad::param_count);
}
