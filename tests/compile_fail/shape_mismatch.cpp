// Must not compile: layer 2 takes a 16x14x14 image, layer 0 gives 4x28x28 (the same 3136 floats).
#include "xpipe/xpipe.hpp"
using xpipe::ConvOptions;
using xpipe::Shape;
using Bad = xpipe::Stage<xpipe::Conv2d<Shape<1, 28, 28>, 4, 3, ConvOptions{.padding = 1}>,
                         xpipe::ReLU, xpipe::Conv2d<Shape<16, 14, 14>, 8, 3>>;
int main() {
  return static_cast<int>(Bad::param_count);
}
