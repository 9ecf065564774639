// Data-parallel replicas of a CUDA pipeline over 2 MPI ranks, each on a GPU of its own: every
// stage's gradient averaged on the GPUs by NCCL (DeviceReplicaMean<CudaContext>,
// comm/nccl_replicas.cuh), against the same replicas sharing GPU 0, whose gradients go through
// pinned host memory and MPI (NCCL refuses two ranks on one GPU). The executor must take each
// way, and both must train the same weights (bit for bit on two GPUs of one model; the check
// allows 1e-5 relative for GPUs that differ). Each replica trains on rows of its own.
// Started plainly it needs 2 CUDA devices and mpirun (on PATH, or $XPIPE_MPIRUN), then runs
// itself under `mpirun -np 2`; without them it says what is missing and exits 77 (CTest:
// skipped). The GPU machines at hand have one GPU: there it is skipped.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "mpi_launch.hpp"
#include "xpipe/comm/nccl_replicas.cuh"
#include "xpipe/exec/mpi.hpp"
#include "xpipe/xpipe_cuda.cuh"

namespace {

using namespace xpipe;

using S = Stage<Linear<48, 64>, ReLU, Linear<64, 10>>;
using P = Pipeline<S, AnyPredictor, AnyOptimizer, Cuda, MpiChannel>;
constexpr index_t batch = 16;  // per replica
constexpr int mini_batches = 6;

test::RankReport report;

// This replica's rows: drawn from a seed of its own, so the replicas' gradients differ.
struct Data {
  std::vector<float> x;
  std::vector<std::int32_t> y;
  index_t rows = batch * mini_batches;
  explicit Data(int replica) {
    x.resize(static_cast<std::size_t>(rows * 48));
    y.resize(static_cast<std::size_t>(rows));
    std::uint64_t s = 12345 + 977 * static_cast<std::uint64_t>(replica);
    for (float& v : x) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      v = static_cast<float>((s >> 40) % 2001) / 1000.f - 1.f;
    }
    for (std::size_t i = 0; i < y.size(); ++i)
      y[i] = static_cast<std::int32_t>((i * 7 + static_cast<std::size_t>(replica)) % 10);
  }
  EpochData epoch() const { return {ConstMatrix{x.data(), rows, 48}, y.data()}; }
};

struct Outcome {
  std::vector<float> weights;
  bool on_device = false;
  std::string error;
};

Outcome train(MpiExecutor& exec, int device, const Data& d) {
  Outcome o;
  try {
    P pipe(make_optimizer("adam", 1e-3f),
           PipelineOptions{.batch = batch, .micro_batches = 2, .seed = 5, .devices = {device}},
           make_predictor("latest"));
    const Schedule s = make_schedule("gpipe", 1, 2, mini_batches);
    for (int e = 0; e < 2; ++e) pipe.train(s, d.epoch(), exec);
    o.on_device = exec.replica_means_on_device();
    o.weights = pipe.weights();
  } catch (const std::exception& e) {
    o.error = e.what();
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) != "ranks")
    return test::launch_under_mpirun(argv[0], 2, 2, "the NCCL replica mean");
  mpi_default_tuning();
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &report.rank);
  try {
    MpiExecutor exec(MPI_COMM_WORLD, 2);  // 2 replicas of a 1-stage pipeline
    const Data d(exec.replica());
    const Outcome nccl = train(exec, report.rank, d);  // replica r on GPU r
    const Outcome pinned = train(exec, 0, d);          // both on GPU 0
    report("GPUs of their own: trained", nccl.error.empty(), nccl.error);
    report("GPUs of their own: averaged on the GPUs", nccl.on_device, "replica_means_on_device");
    report("one GPU shared: trained", pinned.error.empty(), pinned.error);
    report("one GPU shared: averaged through pinned memory", !pinned.on_device,
           "replica_means_on_device");
    if (nccl.error.empty() && pinned.error.empty()) {
      double worst = 0;
      for (std::size_t i = 0; i < nccl.weights.size(); ++i)
        worst =
            std::max(worst, std::fabs(static_cast<double>(nccl.weights[i]) - pinned.weights[i]) /
                                (std::fabs(static_cast<double>(pinned.weights[i])) + 1e-6));
      const bool bitwise = nccl.weights == pinned.weights;
      report("NCCL's weights = the pinned path's", worst <= 1e-5,
             bitwise ? "bit for bit" : "largest relative difference " + std::to_string(worst));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", report.rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  return report.finish("gpu nccl replicas");
}
