// The reference MLP's Pipelines for both tools: xpipe-train's runs (1, 2, 4 stages), xpipe-plan's
// validation cells (2, 4), layer profile and check-mpi runs (1, 2); each split compiled here only.
#include "plan/runs.hpp"
#include "train_run.hpp"
#if defined(XPIPE_WITH_MPI)
#include "sim_mpi.hpp"
#endif

namespace xpipe::tools {
namespace train {

RunRecord run_mlp1(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  return run_stages<mlp::K1>(c, data, check);
}
RunRecord run_mlp2(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  return run_stages<mlp::K2a, mlp::K2b>(c, data, check);
}
RunRecord run_mlp4(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  return run_stages<mlp::A, mlp::B, mlp::C, mlp::D>(c, data, check);
}

}  // namespace train

namespace plan {

Cell mlp_validation_cell(int K, const std::string& schedule, int M, index_t batch, int N,
                         int repeats, int cores, double hop, bool pin) {
  return validation_cell_of<ModelPipeline<mlp::K2a, mlp::K2b>,
                            ModelPipeline<mlp::A, mlp::B, mlp::C, mlp::D>>(
      K, schedule, M, batch, N, repeats, cores, hop, pin);
}

ModelPieces mlp_pieces(index_t small, index_t large, int N, int repeats) {
  // The four layers (each with its ReLU; the last with the loss) are the 4-stage split itself,
  // the type its validation cells run; the 2-stage split (mlp::K2a, K2b) takes two each.
  return {"mlp 784-1024-1024-1024-10",
          profile_stages<ModelPipeline<mlp::A, mlp::B, mlp::C, mlp::D>>(
              {"linear 784x1024 + relu", "linear 1024x1024 + relu", "linear 1024x1024 + relu",
               "linear 1024x10 + softmax xent"},
              small, large, N, repeats),
          {{0, 2}, {0, 1, 2, 3}}};
}

}  // namespace plan

#if defined(XPIPE_WITH_MPI)
MpiRunTime time_mpi_plan(int dp, int pp, const std::string& schedule, int M, index_t batch, int N,
                         int repeats) {
  MpiExecutor exec(MPI_COMM_WORLD, dp);
  if (pp == 1) return time_mpi_run<ModelPipeline<mlp::K1>>(exec, schedule, M, batch, N, repeats);
  if (pp == 2)
    return time_mpi_run<ModelPipeline<mlp::K2a, mlp::K2b>>(exec, schedule, M, batch, N, repeats);
  throw ConfigError("xpipe-plan: check-mpi runs pp = 1 or 2 (got " + std::to_string(pp) + ")");
}
#endif

}  // namespace xpipe::tools
