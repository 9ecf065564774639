// xpipe-plan simulate: one schedule under a model JSON's costs (zb-auto fitted to them): time
// per mini-batch, each stage's idle time and memory, the trace, timeline and schedule text, and
// what filling the bubbles saves.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "plan/common.hpp"
#include "plan/subcommands.hpp"
#include "xpipe/trace/chrome_trace.hpp"
#include "xpipe/trace/svg_timeline.hpp"

namespace xpipe::tools::plan {
namespace {

struct Options {
  std::string model, schedule = "gpipe";
  int stages = 2, micro_batches = 4, mini_batches = 4, batch = 128, cores = 0;
  double fill = 0;
  sim::DeviceSpec device{.name = "--peak-flops/--memory-bandwidth"};
  std::string out;
};

int simulate(const std::string& model_file, const std::string& schedule, int K, int M, int N,
             int batch, int cores, double fill_samples, const sim::DeviceSpec& device,
             const fs::path& out) {
  const json j = read_json(model_file, "--model");
  const auto layers = model_from(j, model_file);
  if (K < 1 || K > static_cast<int>(layers.size()))
    throw UsageError("--stages: " + std::to_string(K) + " is outside 1.." +
                     std::to_string(layers.size()) + " (the model's layers)");
  if (M < 1 || M > batch) throw UsageError("--micro-batches: must lie in 1..--batch");
  const double rows = static_cast<double>(batch) / M;
  const sim::DeviceSpec& none = device;  // for layers given by FLOPs, not measured times
  std::vector<double> w;
  for (const auto& l : layers) {
    const auto t = sim::layer_times(l, rows, none);
    w.push_back(t.forward + t.backward);
  }
  const auto first = sim::balanced_partition(w, K);
  sim::CostModel m;
  m.cores = cores;
  for (int k = 0; k < K; ++k)
    m.stages.push_back(sim::stage_cost(layers, first[k], k + 1 < K ? first[k + 1] : layers.size(),
                                       rows, none, batch));
  // zb-auto is fitted to these stages' costs; the other schedules ignore them.
  const Schedule s = make_schedule(schedule, K, M, N, m.split_backward_costs());
  const sim::SimResult r = sim::simulate(s, m);
  std::printf("%s K=%d M=%d N=%d batch %d, %d cores: %.3f ms per mini-batch, makespan %.3f ms\n",
              schedule.c_str(), K, M, N, batch, cores, r.per_mini_batch * 1e3, r.seconds * 1e3);
  for (int k = 0; k < K; ++k)
    std::printf(
        "  stage %d (layers %zu..): busy %.3f ms, idle %.1f%%, peak %d in flight, %.1f MiB\n", k,
        first[k], r.busy[k] * 1e3, 100 * r.bubble_fraction(k), r.peak_in_flight[k],
        r.peak_memory_bytes[k] / 1048576.0);
  if (fill_samples > 0) {
    // Non-trainable work: a forward of the whole model over fill_samples samples per mini-batch
    // (e.g. evaluation), each stage doing its own layers' share.
    std::vector<sim::FillWork> work;
    for (int k = 0; k < K; ++k) {
      double per_sample = 0;
      for (std::size_t i = first[k]; i < (k + 1 < K ? first[k + 1] : layers.size()); ++i)
        per_sample += sim::layer_times(layers[i], rows, device).forward / rows;
      work.push_back({fill_samples * N, per_sample});
    }
    const sim::FillResult f = sim::fill_bubbles(r.trace, work);
    std::printf(
        "bubble filling: %.0f forward samples per mini-batch per stage: outside the pipeline "
        "%.3f ms, filled into bubbles %.3f ms: saves %.3f ms (%.2fx)\n",
        fill_samples, f.outside_seconds * 1e3, f.filled_seconds * 1e3, f.saved_seconds() * 1e3,
        f.speedup());
  }
  if (!out.empty()) {
    write_out(out, "simulated.json", chrome_trace_json(r.trace, s, "simulated " + schedule));
    write_out(out, "simulated.svg", timeline_svg(r.trace, s));
    write_out(out, "schedule.txt", s.to_text());  // the order simulated (parse_schedule reads it)
  }
  return 0;
}

int run(const Options& o) {
  prepare_out(o.out);
  try {
    return simulate(o.model, o.schedule, o.stages, o.micro_batches, o.mini_batches, o.batch,
                    o.cores, o.fill, o.device, o.out);
  } catch (const ConfigError& e) {
    throw UsageError(e.what());
  }
}

}  // namespace

Subcommand add_simulate(CLI::App& app) {
  auto* cli = app.add_subcommand("simulate", "one schedule under a model JSON");
  auto o = std::make_shared<Options>();
  cli->add_option("--peak-flops", o->device.peak_flops, "device FLOP/s (layers given by FLOPs)")
      ->check(decimal_in(0, 1e30, "[0, 1e30]"));
  cli->add_option("--memory-bandwidth", o->device.memory_bandwidth, "device bytes/s")
      ->check(decimal_in(0, 1e30, "[0, 1e30]"));
  cli->add_option("--model", o->model, "model JSON")->required();
  cli->add_option("--schedule", o->schedule, "schedule")->check(CLI::IsMember(schedule_choices));
  cli->add_option("--stages,-K", o->stages, "stages");
  cli->add_option("--micro-batches,-M", o->micro_batches, "micro-batches");
  cli->add_option("--mini-batches", o->mini_batches, "mini-batches")->check(CLI::Range(1, 100000));
  cli->add_option("--batch", o->batch, "mini-batch rows")->check(CLI::Range(1, 1 << 20));
  cli->add_option("--cores", o->cores, "cores shared by the stages (0: one each)")
      ->check(CLI::Range(0, 4096));
  cli->add_option("--fill", o->fill,
                  "non-trainable forward samples per mini-batch to fill bubbles with")
      ->check(decimal_in(0, 1e9, "[0, 1e9]"));
  cli->add_option("--out", o->out, "folder for the trace and timeline");
  return {cli, [o] { return run(*o); }};
}

}  // namespace xpipe::tools::plan
