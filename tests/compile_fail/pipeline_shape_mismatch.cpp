// Must not compile: stage 0 gives a 4x28x28 image, stage 1 takes 16x14x14 (the same 3136 floats).
#include "xpipe/xpipe.hpp"
using xpipe::ConvOptions;
using xpipe::Shape;
using S0 = xpipe::Stage<xpipe::Conv2d<Shape<1, 28, 28>, 4, 3, ConvOptions{.padding = 1}>>;
using S1 = xpipe::Stage<xpipe::Conv2d<Shape<16, 14, 14>, 8, 3>, xpipe::Linear<1152, 10>>;
using Bad = xpipe::Pipeline<S0, S1>;
int main() {
  return Bad::stage_count;
}
