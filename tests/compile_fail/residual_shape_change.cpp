// Must not compile: a residual block with the identity shortcut whose convolution turns 8
// channels into 16, so f(x) + x has no meaning (ProjectedResidual is the block for that).
#include "xpipe/layers/conv.hpp"
#include "xpipe/layers/residual.hpp"
using xpipe::ConvOptions;
using xpipe::Shape;
using Bad = xpipe::Residual<xpipe::Conv2d<Shape<8, 6, 6>, 16, 3, ConvOptions{.padding = 1}>>;
int main() {
  return static_cast<int>(Bad::param_count);
}
