// xpipe-plan validate: the simulator against the threaded executor, seconds per mini-batch of
// a model (the reference MLP, the VGG or the ResNet of models/), simulated from each action's
// measured cost and measured on the same Pipeline.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "output_files.hpp"
#include "plan/common.hpp"
#include "plan/runs.hpp"
#include "plan/subcommands.hpp"
#include "sim_profile.hpp"

namespace xpipe::tools::plan {
namespace {

struct Options {
  std::string model = "mlp", stages = "2,4", micro_batches = "1,2,4";
  std::vector<std::string> schedules = schedule_choices;
  int mini_batches = 24, repeats = 3, cores = static_cast<int>(std::thread::hardware_concurrency());
  bool no_pin = false;
  double max_error = 0;
  std::string out;
};

int run(const Options& o) {
  prepare_out(o.out);
  const std::vector<int> Ms = parse_ints("--micro-batches", o.micro_batches, 1);
  const std::vector<int> Ks = parse_ints("--stages", o.stages, 2);
  const fs::path out = o.out;
  const int N = o.mini_batches, repeats = o.repeats, cores = o.cores;
  const bool pin = !o.no_pin;
  const index_t batch = plan_batch(o.model);
  for (int K : Ks)
    if (K != 2 && K != 4)
      throw UsageError("--stages: " + std::to_string(K) +
                       ": the models are compiled over 2 and 4 stages for validation");
  // A micro-batch holds a row at least (the gpt: a whole sequence).
  const index_t units = o.model == "gpt" ? batch / profile_rows("gpt").first : batch;
  for (int M : Ms)
    if (M > units)
      throw UsageError("--micro-batches: " + std::to_string(M) + " exceeds the " +
                       std::to_string(units) + (o.model == "gpt" ? " sequences" : " rows") +
                       " of a mini-batch");
  std::printf(
      "validation: simulated vs measured seconds per mini-batch, %s, batch %ld%s, "
      "%d mini-batches, median of %d. Cost model: each action's median wall time with the "
      "stages run one action at a time on their own threads (SerialThreadedExecutor), on the "
      "same Pipeline. %s (%s)\n\n",
      o.model == "mlp" ? "reference MLP" : o.model.c_str(), static_cast<long>(batch),
      o.model == "gpt" ? " tokens (16 sequences)" : "", N, repeats,
      pin ? "Stage k pinned to CPU k mod cores; the simulator shares each core between its own "
            "stages, each core at the share a run gets of it relative to the profile, measured "
            "before and after each run ('cores free' column, per core: 1 when quiet); 'quiet' "
            "assumes whole cores"
          : "Threads placed by the OS (--no-pin); the simulator shares one pool: the compute "
            "1..K busy threads got, measured before and after each run ('cores free'); 'quiet' "
            "assumes whole cores",
      machine_note().c_str());
  const sim::LinkCost ring = measure_ring(3);
  std::printf("in-process ring hop (the simulator's link latency): %.2f us\n\n",
              ring.latency * 1e6);
  std::printf(
      "| K | schedule | M | measured ms | simulated ms | error | cores free | "
      "simulated quiet ms | error if quiet | idle per worker, measured (simulated) |%s\n"
      "|--:|---|--:|--:|--:|--:|--:|--:|--:|---|%s\n",
      pin ? " the same, newest-first cores (simulated ms, idle per worker) |" : "",
      pin ? "---|" : "");
  json cells = json::array();
  std::string csv =
      "stages,schedule,predictor,micro_batches,measured_ms,simulated_ms,error,available_cores,"
      "simulated_quiet_ms,error_quiet\n";
  double worst = 0;
  for (int K : Ks)
    for (const std::string& s : o.schedules)
      for (int M : Ms) {
        if (s == "2bw" && M < K) {
          std::printf("| %d | %s | %d | n/a (2BW needs M >= K) | | | | | | |\n", K, s.c_str(), M);
          continue;
        }
        try {
          (void)make_schedule(s, K, M, 1);  // a shape the generator refuses is no cell
        } catch (const ConfigError& e) {
          std::printf("| %d | %s | %d | n/a (%s) | | | | | | |\n", K, s.c_str(), M, e.what());
          continue;
        }
        const Cell c =
            validation_cell(o.model, K, s, M, batch, N, repeats, cores, ring.latency, pin);
        worst = std::max(worst, std::abs(c.error()));
        std::string free;
        for (double w : c.model.core_of.empty() ? c.model.cores_with : c.model.core_speed) {
          char b[16];
          std::snprintf(b, sizeof b, "%s%.2f", free.empty() ? "" : "/", w);
          free += b;
        }
        const double quiet_error = c.simulated_quiet / c.measured - 1;
        // Each worker's idle fraction over the whole run (the bubble): measured, then simulated.
        std::vector<double> idle_measured, idle_simulated, idle_newest_first;
        std::string measured_idle, simulated_idle, newest_first_idle;
        auto add = [](std::string& to, int w, double v) {
          char b[32];
          std::snprintf(b, sizeof b, "%s%.1f", w == 0 ? "" : "/", 100 * v);
          to += b;
        };
        for (int w = 0; w < c.plan.workers(); ++w) {
          idle_measured.push_back(worker_bubble_fraction(c.measured_trace, c.plan, w));
          idle_simulated.push_back(worker_bubble_fraction(c.simulated_trace, c.plan, w));
          add(measured_idle, w, idle_measured.back());
          add(simulated_idle, w, idle_simulated.back());
          if (pin) {
            idle_newest_first.push_back(worker_bubble_fraction(c.newest_first_trace, c.plan, w));
            add(newest_first_idle, w, idle_newest_first.back());
          }
        }
        std::string newest_first_cells;
        if (pin) {
          char b[64];
          std::snprintf(b, sizeof b, " %.3f, ", c.simulated_newest_first * 1e3);
          newest_first_cells = b + newest_first_idle + "% |";
        }
        std::printf(
            "| %d | %s | %d | %.3f | %.3f | %+.1f%% | %s | %.3f | %+.1f%% | %s%% (%s%%) |%s\n", K,
            s.c_str(), M, c.measured * 1e3, c.simulated * 1e3, 100 * c.error(), free.c_str(),
            c.simulated_quiet * 1e3, 100 * quiet_error, measured_idle.c_str(),
            simulated_idle.c_str(), newest_first_cells.c_str());
        std::fflush(stdout);
        char line[320];
        std::snprintf(line, sizeof line, "%d,%s,%s,%d,%.6f,%.6f,%.6f,%.4f,%.6f,%.6f\n", K,
                      s.c_str(), c.predictor.c_str(), M, c.measured * 1e3, c.simulated * 1e3,
                      c.error(), c.available_cores, c.simulated_quiet * 1e3, quiet_error);
        csv += line;
        json cell{{"stages", K},
                  {"schedule", s},
                  {"predictor", c.predictor},
                  {"micro_batches", M},
                  {"measured_ms", c.measured * 1e3},
                  {"simulated_ms", c.simulated * 1e3},
                  {"error", c.error()},
                  {"available_cores", c.available_cores},
                  {"cores_with", c.model.cores_with},
                  {"core_speed", c.model.core_speed},
                  {"simulated_quiet_ms", c.simulated_quiet * 1e3},
                  {"idle_per_worker_measured", idle_measured},
                  {"idle_per_worker_simulated", idle_simulated}};
        if (pin) {
          cell["simulated_newest_first_ms"] = c.simulated_newest_first * 1e3;
          cell["idle_per_worker_newest_first"] = idle_newest_first;
        }
        for (const auto& st : c.model.stages) {
          json costs{{"forward", st.forward * 1e3},
                     {"backward", st.backward * 1e3},
                     {"step", st.step * 1e3}};
          if (c.plan.splits_backward()) {  // the halves, as profiled
            costs["input_grad"] = st.input_grad * 1e3;
            costs["weight_grad"] = st.weight_grad * 1e3;
          }
          cell["stage_costs_ms"].push_back(costs);
        }
        cells.push_back(cell);
        if (!out.empty()) {
          const std::string stem = "k" + std::to_string(K) + "-" + s + "-m" + std::to_string(M);
          write_file_atomically(out / (stem + ".measured.json"),
                                chrome_trace_json(c.measured_trace, c.plan, stem + " measured"));
          write_file_atomically(out / (stem + ".simulated.json"),
                                chrome_trace_json(c.simulated_trace, c.plan, stem + " simulated"));
          write_file_atomically(out / (stem + ".measured.svg"),
                                timeline_svg(c.measured_trace, c.plan));
          write_file_atomically(out / (stem + ".simulated.svg"),
                                timeline_svg(c.simulated_trace, c.plan));
        }
      }
  std::printf("\nlargest |error|: %.1f%%\n", 100 * worst);
  if (!out.empty()) {
    write_out(out, "validation.csv", csv);
    write_out(out, "validation.json",
              json{{"model", o.model},
                   {"machine", machine_note()},
                   {"mini_batches", N},
                   {"repeats", repeats},
                   {"cores", cores},
                   {"pinned", pin},
                   {"cells", cells}}
                      .dump(2) +
                  "\n");
  }
  if (o.max_error > 0 && worst > o.max_error) {
    std::fprintf(stderr, "xpipe-plan: validate: largest error %.1f%% exceeds --max-error %.1f%%\n",
                 100 * worst, 100 * o.max_error);
    return 3;
  }
  return 0;
}

}  // namespace

Subcommand add_validate(CLI::App& app) {
  auto* cli = app.add_subcommand("validate", "simulated vs measured time per mini-batch");
  auto o = std::make_shared<Options>();
  cli->add_option("--model", o->model, "mlp, vgg, resnet or gpt (models/)")
      ->check(CLI::IsMember(plan_models));
  cli->add_option("--stages", o->stages, "K values (2 and/or 4)");
  cli->add_option("--micro-batches,-M", o->micro_batches, "M values");
  cli->add_option("--schedules", o->schedules, "schedules (comma-separated)")
      ->delimiter(',')
      ->check(CLI::IsMember(schedule_choices));
  cli->add_option("--mini-batches", o->mini_batches, "mini-batches per run")
      ->check(CLI::Range(2, 100000));
  cli->add_option("--repeats", o->repeats, "runs per cell (medians)")->check(CLI::Range(1, 100));
  cli->add_option("--cores", o->cores, "cores the simulator gives the stage threads")
      ->check(CLI::Range(0, 4096));
  cli->add_flag("--no-pin", o->no_pin,
                "leave the stage threads where the OS puts them (default: stage k pinned to "
                "CPU k mod cores, ThreadedExecutor::cpus, each core simulated as shared by "
                "its own stages)");
  cli->add_option("--max-error", o->max_error, "exit 3 if any |error| exceeds this fraction")
      ->check(decimal_in(0, 100, "[0, 100]"));
  cli->add_option("--out", o->out, "folder for validation.csv/json and traces");
  return {cli, [o] { return run(*o); }};
}

}  // namespace xpipe::tools::plan
