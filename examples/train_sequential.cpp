// Sequential training of the 784-1024-1024-1024-10 MLP on Fashion-MNIST with Adam: the baseline
// every pipeline schedule is measured against. Prints per-epoch loss, test accuracy, samples/s.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <exception>

#include "xpipe/xpipe.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Sequential Fashion-MNIST training of the 784-1024-1024-1024-10 MLP (xpipe)"};
  int epochs = 3;
  long batch = 128;
  float lr = 1e-3f;
  unsigned long seed = 1;
  int threads = 2;
  std::string data_dir = xpipe::default_fashion_mnist_dir();
  app.add_option("--epochs", epochs, "Epochs to train")->check(CLI::Range(1, 1000));
  app.add_option("--batch", batch, "Mini-batch size")->check(CLI::Range(1L, 60000L));
  app.add_option("--lr", lr, "Adam learning rate")->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "Seed of initialisation and shuffling");
  app.add_option("--threads", threads, "Threads for GEMM and element passes")
      ->check(CLI::Range(1, 256));
  app.add_option("--data-dir", data_dir, "Directory holding the four Fashion-MNIST .gz files");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return e.get_exit_code() == 0 ? code : 2;
  }

  try {
    using Model = xpipe::models::FashionMlp;
    xpipe::ScopedFlushDenormals ftz;
    const xpipe::HostContext ctx{.threads = threads};
    const xpipe::DatasetPair data = xpipe::load_fashion_mnist(data_dir);
    std::printf("Fashion-MNIST: %ld train, %ld test images from %s\n", data.train.count,
                data.test.count, data_dir.c_str());
    std::printf(
        "model 784-1024-1024-1024-10 (%ld parameters), Adam lr %g, batch %ld, seed %lu, "
        "%d threads\n",
        static_cast<long>(Model::param_count), lr, batch, seed, threads);

    xpipe::SequentialTrainer<Model, xpipe::Adam> trainer(xpipe::Adam{.lr = lr}, batch, seed);
    xpipe::Batcher batcher(data.train, batch, seed);
    std::printf("%5s %12s %10s %12s %9s\n", "epoch", "train_loss", "test_acc", "samples/s",
                "seconds");
    for (int epoch = 1; epoch <= epochs; ++epoch) {
      const auto t0 = std::chrono::steady_clock::now();
      const double loss = trainer.train_epoch(ctx, batcher, static_cast<std::uint64_t>(epoch));
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double acc = trainer.evaluate(ctx, data.test);
      std::printf("%5d %12.4f %9.2f%% %12.0f %9.2f\n", epoch, loss, 100.0 * acc,
                  static_cast<double>(data.train.count) / secs, secs);
      std::fflush(stdout);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_sequential: %s\n", e.what());
    return 1;
  }
}
