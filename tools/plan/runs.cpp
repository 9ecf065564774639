// The reference MLP's training runs (runs.hpp): the only translation unit of xpipe-plan that
// instantiates the Pipelines of sim_profile.hpp (validation_cell's K = 2 and 4, the 4-stage one
// shared with profile_mlp_layers) and SequentialTrainer<FashionMlp, Adam>.
#include "plan/runs.hpp"

#include <algorithm>

#include "sim_profile.hpp"

namespace xpipe::tools::plan {

Cell validation_cell(int K, const std::string& schedule, int M, index_t batch, int N, int repeats,
                     int cores, double hop, bool pin) {
  return tools::validation_cell(K, schedule, M, batch, N, repeats, cores, hop, pin);
}

std::vector<sim::LayerSpec> profile_mlp_layers(index_t small, index_t large, int N, int repeats) {
  return tools::profile_mlp_layers(small, large, N, repeats);
}

double measure_sequential_step(index_t b, int steps, int replicas) {
  return tools::measure_sequential_step(b, steps, replicas);
}

double epochs_to_target(const DatasetPair& data, int B, std::uint64_t seed, double target,
                        double max_epochs, int evals_per_epoch, float lr, double& last) {
  const HostContext ctx{.threads = 1};
  SequentialTrainer<models::FashionMlp, Adam> t(Adam{.lr = lr}, B, seed);
  Batcher batcher(data.train, B, seed);
  HostBuffer<float> x(static_cast<index_t>(B) * data.train.width);
  HostBuffer<std::int32_t> y(B);
  const Matrix xm{x.data(), B, data.train.width};
  const index_t per_epoch = batcher.batches_per_epoch();
  const index_t check_every = std::max<index_t>(1, per_epoch / evals_per_epoch);
  last = 0;
  for (int e = 1; e <= max_epochs; ++e) {
    batcher.start_epoch(static_cast<std::uint64_t>(e));
    index_t step = 0;
    while (const index_t rows = batcher.next(xm, y.data())) {
      t.train_step(ctx, xm.slice_rows(0, rows), y.data());
      ++step;
      if (step % check_every == 0 || step == per_epoch) {
        last = t.evaluate(ctx, data.test);
        if (last >= target) return (e - 1) + static_cast<double>(step) / per_epoch;
      }
    }
  }
  return -1;
}

}  // namespace xpipe::tools::plan
