// Must not compile: stage 1 outputs 64 columns, stage 2 expects 32.
#include "xpipe/xpipe.hpp"
using namespace xpipe;
using Bad = Pipeline<Stage<Linear<8, 16>>, Stage<Linear<16, 64>>, Stage<Linear<32, 4>>, XPipe>;
int main() {
  return Bad::stage_count;
}
