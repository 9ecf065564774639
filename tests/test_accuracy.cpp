// Foundation acceptance: sequential Adam training of the MLP reaches >= 87% test accuracy on
// Fashion-MNIST after 3 epochs (batch 128, lr 1e-3, seed 1, 2 threads).
#include <catch2/catch.hpp>

#include "xpipe/xpipe.hpp"

TEST_CASE("MLP reaches 87% on Fashion-MNIST after 3 epochs", "[accuracy][slow]") {
  using Model = xpipe::models::FashionMlp;
  const xpipe::HostContext ctx{.threads = 2};
  xpipe::ScopedFlushDenormals ftz;
  const auto data = xpipe::load_fashion_mnist();
  xpipe::SequentialTrainer<Model, xpipe::Adam> trainer(xpipe::Adam{.lr = 1e-3f}, 128, 1);
  xpipe::Batcher batcher(data.train, 128, 1);
  double acc = 0, loss = 0;
  for (int epoch = 1; epoch <= 3; ++epoch) {
    loss = trainer.train_epoch(ctx, batcher, epoch);
    acc = trainer.evaluate(ctx, data.test);
    WARN("epoch " << epoch << ": train loss " << loss << ", test accuracy " << acc);
  }
  REQUIRE(acc >= 0.87);
  REQUIRE(loss < 0.35);
}
