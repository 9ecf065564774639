// Must not compile: layer 2 expects 512 inputs but layer 1 (ReLU) passes on 1024.
#include "xpipe/xpipe.hpp"
using Bad = xpipe::Stage<xpipe::Linear<784, 1024>, xpipe::ReLU, xpipe::Linear<512, 10>>;
int main() {
  return static_cast<int>(Bad::param_count);
}
