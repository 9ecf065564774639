// Must not compile: SequentialTrainer draws the weights, sums the loss and stages batches on the
// host, so on the CUDA backend it refuses at compile time, naming what to use instead, rather
// than touch device memory on the host at run time.
#include <xpipe/xpipe_cuda.cuh>

using namespace xpipe;

using Mlp = Stage<Linear<8, 4>, ReLU, Linear<4, 3>>;

double step(const CudaContext& ctx, ConstMatrix x, const std::int32_t* labels) {
  SequentialTrainer<Mlp, Adam, Cuda> t(Adam{}, 16, 1);
  return t.train_step(ctx, x, labels);
}
