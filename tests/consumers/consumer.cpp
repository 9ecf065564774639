// A program outside xpipe that uses it through the installed or sub-directory target.
#include <cstdio>
#include <xpipe/xpipe.hpp>

int main() {
  using Model = xpipe::Stage<xpipe::Linear<4, 8>, xpipe::ReLU, xpipe::Linear<8, 3>>;
  xpipe::SequentialTrainer<Model, xpipe::Adam> trainer(xpipe::Adam{.lr = 1e-2f}, 2, 1);
  const float x[] = {1, 0, 0, 1, 0, 1, 1, 0};
  const std::int32_t y[] = {0, 2};
  double first = 0, last = 0;
  for (int i = 0; i < 50; ++i) {
    last = trainer.train_step(xpipe::HostContext{}, {x, 2, 4}, y);
    if (i == 0) first = last;
  }
  if (!(last < first)) return 1;
  std::printf("consumer ok: loss %.4f -> %.4f\n", first, last);
  return 0;
}
