// xpipe-plan check-plan: the planner's step times against runs this machine can make (1 x 1,
// 2 x 1 and 1 x 2 of the reference MLP, a core per device), given the cores measured free; a
// model JSON of another model is refused.
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "plan/common.hpp"
#include "plan/runs.hpp"
#include "plan/subcommands.hpp"
#include "sim_profile.hpp"

namespace xpipe::tools::plan {
namespace {

struct Options {
  StepCheckFlags step{.mini_batches = 24};
};

int run(const Options& o) {
  const std::string& model_file = o.step.model;
  const int b = o.step.batch, N = o.step.mini_batches, repeats = o.step.repeats;
  sim::PlanRequest req = two_device_request(model_file, b);
  // The runs are of the compiled reference MLP: a prediction for another model would be set
  // against them.
  require_reference_mlp(req.layers, model_file, "check-plan");
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  std::printf(
      "planner step times (from %s; in-process, no all-reduce) against runs on this machine, "
      "batch %d per replica (%s). 'planner' is given the cores measured free before and after the "
      "run, "
      "'quiet' a core per device.\n\n| plan | planner ms | measured ms | error | cores free | "
      "quiet ms | measured how |\n|---|--:|--:|--:|--:|--:|---|\n",
      model_file.c_str(), b, machine_note().c_str());
  for (const auto& [dp, pp] : std::vector<std::pair<int, int>>{{1, 1}, {2, 1}, {1, 2}}) {
    req.device_counts = {dp * pp};
    req.cluster.cores_per_replica = 0;
    const sim::PlanResult quiet = sim::make_plans(req);
    for (const sim::Plan& q : quiet.plans) {
      // Measured on the compiled splits of one stage per device.
      if (q.dp != dp || q.pp != pp || stages_per_worker(q.schedule) > 1) continue;
      double measured = 0;
      std::string how;
      std::vector<double> m, free;
      for (int i = 0; i < repeats; ++i) {
        const double before = measure_available_cores(cores);
        if (pp == 1) {
          m.push_back(measure_sequential_step(b, N, dp));
        } else {
          m.push_back(
              validation_cell("mlp", pp, q.schedule, q.micro_batches, b, N, 1, cores).measured);
        }
        free.push_back(0.5 * (before + measure_available_cores(cores)));
      }
      measured = median(m);
      how = pp > 1    ? "Pipeline, ThreadedExecutor"
            : dp == 1 ? "SequentialTrainer, 1 thread"
                      : std::to_string(dp) + " SequentialTrainers side by side";
      // The same plan, its replicas sharing the cores this process was measured to get.
      const double avail = median(free);
      req.cluster.cores_per_replica = avail / dp;
      double predicted = 0;
      for (const sim::Plan& p : sim::make_plans(req).plans)
        if (p.label() == q.label()) predicted = p.step_seconds;
      std::printf("| %s | %.3f | %.3f | %+.1f%% | %.2f | %.3f | %s |\n", q.label().c_str(),
                  predicted * 1e3, measured * 1e3, 100 * (predicted / measured - 1), avail,
                  q.step_seconds * 1e3, how.c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

Subcommand add_check_plan(CLI::App& app) {
  auto* cli = app.add_subcommand("check-plan", "planner step times vs runs on this machine");
  auto o = std::make_shared<Options>();
  add_step_check_flags(cli, o->step);
  return {cli, [o] { return run(*o); }};
}

}  // namespace xpipe::tools::plan
