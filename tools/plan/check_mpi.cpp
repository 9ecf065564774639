// xpipe-plan check-mpi: the planner against the MPI executor, transfers and all-reduce included,
// a rank per device (mpirun -np 2). The MLP's Pipelines it runs (sim_mpi.hpp's time_mpi_plan)
// are compiled in tools/runs_mlp.cpp.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "plan/common.hpp"
#include "plan/runs.hpp"
#include "plan/subcommands.hpp"
#ifdef XPIPE_WITH_MPI
#include "sim_mpi.hpp"
#endif

namespace xpipe::tools::plan {
namespace {

struct Options {
  StepCheckFlags step{.mini_batches = 16};
  double max_error = 0;
  std::string out;
};

#ifdef XPIPE_WITH_MPI
//! Under `mpirun -np 2`: measures the MPI link and the all-reduce, gives the planner them as the
//! cluster's pipeline_link and allreduce_link, and runs every plan it makes for two devices
//! (2 x 1 pure data parallelism, 1 x 2 pipelines) with the MPI executor, a rank per device.
int check(const std::string& model_file, int b, int N, int repeats, double max_error,
          const fs::path& out) {
  int rank = 0;
  XPIPE_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  const bool root = rank == 0;
  sim::PlanRequest req = two_device_request(model_file, b);
  req.device_counts = {2};
  // The runs are of the compiled reference MLP (tools/models.hpp): its layers must be these.
  require_reference_mlp(req.layers, model_file, "check-mpi");

  // 1. The link, at the sizes a step sends: one float up to a micro-batch's activations (rows
  // x 1024 floats) and past them.
  const double rows_1024 = 4.0 * b * 1024;  // bytes of a mini-batch's 1024-wide activations
  const std::vector<double> sizes{4, 4096, 65536, rows_1024 / 4, rows_1024, 4 << 20};
  const MpiLinkProfile link = measure_mpi_link(MPI_COMM_WORLD, sizes, repeats + 4);
  // 2. The gradient average 2 x 1 runs each step (the whole model's gradient over the 2
  // replicas), done as the executor does it: MPI_Iallreduce, its wait, the division by R.
  double params = 0;
  for (const sim::LayerSpec& l : req.layers) params += l.params;
  const double ar_measured =
      measure_mpi_gradient_average(MPI_COMM_WORLD, static_cast<index_t>(params), repeats + 4);
  const double ar_on_link = sim::ring_allreduce_seconds(4 * params, 2, link.link);
  // The all-reduce's own link (the cluster's allreduce_link): the ping-pong latency, and the
  // bandwidth at which the planner's ring model (bytes / bandwidth + 2 latencies at dp = 2)
  // gives the measured average: a collective runs its own protocol, not the messages', and
  // the division by R is one more pass over the gradient.
  sim::LinkCost ar_link = link.link;
  ar_link.bandwidth = 4 * params / std::max(ar_measured - 2 * ar_link.latency, 1e-9);
  json j;
  j["measured_on"] = machine_note() + ", 2 MPI ranks";
  j["model"] = model_file;
  j["pipeline_link"] = {{"latency", link.link.latency}, {"bandwidth", link.link.bandwidth}};
  j["allreduce"] = {{"floats", params}, {"measured", ar_measured}, {"on_link", ar_on_link}};
  j["allreduce_link"] = {{"latency", ar_link.latency}, {"bandwidth", ar_link.bandwidth}};
  if (root) {
    std::printf(
        "MPI link, rank 0 <-> rank 1 (blocking ping-pong, half the round trip, median of "
        "%d; %s):\n\n| bytes | measured us | latency + bytes / bandwidth | error |\n"
        "|--:|--:|--:|--:|\n",
        repeats + 4, machine_note().c_str());
    for (const sim::LinkSample& s : link.samples) {
      const double model = link.link.seconds(s.bytes);
      std::printf("| %.0f | %.2f | %.2f | %+.1f%% |\n", s.bytes, s.seconds * 1e6, model * 1e6,
                  100 * (model / s.seconds - 1));
      j["link_samples"].push_back({{"bytes", s.bytes}, {"seconds", s.seconds}});
    }
    std::printf(
        "\nlink (pipeline_link): latency %.2f us, bandwidth %.3f GB/s\n"
        "gradient average over 2 ranks as the executor does it (MPI_Iallreduce, wait, division "
        "by R) of the model's %.0f floats: %.3f ms measured, %.3f ms by the ring model on that "
        "link (%+.1f%%)\n"
        "all-reduce link (allreduce_link): latency %.2f us, bandwidth %.3f GB/s\n\n"
        "planner step times (those links, a core per device) against the MPI executor, a rank "
        "per device, batch %d per replica, %d mini-batches, median of %d. 'share': the part of a "
        "core each rank got, measured around each run (1 when quiet); 'planner at share' = "
        "planner / share:\n\n| plan | planner ms | all-reduce ms | share | planner at share ms | "
        "measured ms | error |\n|---|--:|--:|--:|--:|--:|--:|\n",
        link.link.latency * 1e6, link.link.bandwidth / 1e9, params, ar_measured * 1e3,
        ar_on_link * 1e3, 100 * (ar_on_link / ar_measured - 1), ar_link.latency * 1e6,
        ar_link.bandwidth / 1e9, b, N, repeats);
    std::fflush(stdout);
  }
  req.cluster.pipeline_link = link.link;
  req.cluster.allreduce_link = ar_link;
  const sim::PlanResult plans = sim::make_plans(req);
  double worst = 0;
  for (const sim::Plan& p : plans.plans) {
    if (stages_per_worker(p.schedule) > 1) continue;  // a rank runs one stage
    if (p.pp == 2 && p.first_layer != std::vector<std::size_t>{0, 2})
      throw ConfigError("check-mpi: the planner splits " + model_file +
                        " other than the compiled 2-stage split (layers 0-1 | 2-3): is it the "
                        "reference MLP?");
    const MpiRunTime run = time_mpi_plan(p.dp, p.pp, p.schedule, p.micro_batches, b, N, repeats);
    // The planner gives each device a whole core; where the ranks got only part of theirs
    // (other processes on the machine), its step takes 1 / share as long.
    const double planned = p.step_seconds / run.share;
    const double error = planned / run.seconds - 1;
    worst = std::max(worst, std::fabs(error));  // the same on both ranks
    if (!root) continue;
    std::printf("| %s | %.3f | %.3f | %.2f | %.3f | %.3f | %+.1f%% |\n", p.label().c_str(),
                p.step_seconds * 1e3, p.allreduce_seconds * 1e3, run.share, planned * 1e3,
                run.seconds * 1e3, 100 * error);
    std::fflush(stdout);
    j["plans"].push_back({{"plan", p.label()},
                          {"planner", p.step_seconds},
                          {"allreduce", p.allreduce_seconds},
                          {"core_share", run.share},
                          {"measured", run.seconds}});
  }
  if (root) {
    std::printf("\nlargest |error| %.1f%%\n", 100 * worst);
    if (!out.empty()) write_out(out, "check-mpi.json", j.dump(2) + "\n");
  }
  return max_error > 0 && worst > max_error ? 3 : 0;
}

#endif

int run(const Options& o) {
  prepare_out(o.out);
#ifdef XPIPE_WITH_MPI
  mpi_default_tuning();
  XPIPE_MPI_CHECK(MPI_Init(nullptr, nullptr));
  int rc = 0, ranks = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (ranks != 2) {  // every rank sees it, so no rank waits for another; rank 0 says it
    if (rank == 0)
      std::fprintf(stderr,
                   "xpipe-plan: check-mpi: launch it on 2 ranks (mpirun -np 2 xpipe-plan "
                   "check-mpi ...), got %d\n",
                   ranks);
    MPI_Finalize();
    return 2;
  }
  try {
    rc = check(o.step.model, o.step.batch, o.step.mini_batches, o.step.repeats, o.max_error, o.out);
  } catch (const std::exception& e) {  // the other rank may wait for this one: end the job
    std::fprintf(stderr, "xpipe-plan: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, dynamic_cast<const UsageError*>(&e) ? 2 : 1);
  }
  MPI_Finalize();
  return rc;
#else
  throw UsageError("check-mpi: this xpipe-plan was built without MPI (XPIPE_ENABLE_MPI)");
#endif
}

}  // namespace

Subcommand add_check_mpi(CLI::App& app) {
  auto* cli = app.add_subcommand("check-mpi",
                                 "planner step times vs the MPI executor (run under mpirun -np 2)");
  auto o = std::make_shared<Options>();
  add_step_check_flags(cli, o->step);
  cli->add_option("--max-error", o->max_error, "exit 3 if any |error| exceeds this fraction")
      ->check(decimal_in(0, 100, "[0, 100]"));
  cli->add_option("--out", o->out, "folder for check-mpi.json");
  return {cli, [o] { return run(*o); }};
}

}  // namespace xpipe::tools::plan
