// Must not compile: BatchNormAct fuses an activation layer after the normalisation, and a Linear
// layer is none; the message says what Act must be.
#include "xpipe/xpipe.hpp"
using Bad = xpipe::Stage<xpipe::BatchNormAct<xpipe::Shape<4, 2, 2>, xpipe::Linear<16, 16>>>;
int main() {
  return static_cast<int>(Bad::param_count);
}
