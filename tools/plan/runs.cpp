// xpipe-plan's choice of a model's runs by name (each model's are in its unit of the tools' model
// table, tools/runs_*.cpp) and the runs of SequentialTrainer<FashionMlp, Adam>, instantiated here.
#include "plan/runs.hpp"

#include <algorithm>

#include "plan/common.hpp"
#include "sim_profile.hpp"

namespace xpipe::tools::plan {
namespace {
UsageError unknown_model(const std::string& model) {
  std::string names;
  for (const std::string& m : plan_models) names += (names.empty() ? "" : ", ") + m;
  return UsageError("--model: '" + model + "' is none of " + names);
}
}  // namespace

Cell validation_cell(const std::string& model, int K, const std::string& schedule, int M,
                     index_t batch, int N, int repeats, int cores, double hop, bool pin) {
  if (model == "vgg")
    return vgg_validation_cell(K, schedule, M, batch, N, repeats, cores, hop, pin);
  if (model == "resnet")
    return resnet_validation_cell(K, schedule, M, batch, N, repeats, cores, hop, pin);
  if (model == "gpt")
    return gpt_validation_cell(K, schedule, M, batch, N, repeats, cores, hop, pin);
  if (model == "mlp")
    return mlp_validation_cell(K, schedule, M, batch, N, repeats, cores, hop, pin);
  throw unknown_model(model);
}

void require_reference_mlp(const std::vector<sim::LayerSpec>& layers, const std::string& model_file,
                           const std::string& command) {
  namespace mlp = models::mlp;
  const std::vector<index_t> reference{mlp::A::param_count, mlp::B::param_count,
                                       mlp::C::param_count, mlp::D::param_count};
  bool same = layers.size() == reference.size();
  for (std::size_t l = 0; same && l < reference.size(); ++l)
    same = layers[l].params == static_cast<double>(reference[l]);
  if (!same)
    throw UsageError(command + ": --model '" + model_file +
                     "' is not the reference MLP's four layers (784-1024-1024-1024-10), which " +
                     command + " runs: profile it with xpipe-plan profile --model mlp");
}

ModelPieces profile_pieces(const std::string& model, index_t small, index_t large, int N,
                           int repeats) {
  if (model == "vgg") return vgg_pieces(small, large, N, repeats);
  if (model == "resnet") return resnet_pieces(small, large, N, repeats);
  if (model == "gpt") return gpt_pieces(small, large, N, repeats);
  if (model == "mlp") return mlp_pieces(small, large, N, repeats);
  throw unknown_model(model);
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
