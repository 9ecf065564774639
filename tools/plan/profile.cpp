// xpipe-plan profile: a model's pieces (the reference MLP's layers, a CNN's blocks) measured on
// this machine -> model JSON, and the splits of models/ weighed against the balanced ones.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "output_files.hpp"
#include "plan/common.hpp"
#include "plan/runs.hpp"
#include "plan/subcommands.hpp"
#include "sim_profile.hpp"

namespace xpipe::tools::plan {
namespace {

struct Options {
  std::string model = "mlp", out;
  int repeats = 5, batch = 0, micro_batches = 4;  // batch 0: plan_batch(model)
};

json to_json(const sim::LayerSpec& l) {
  return {{"name", l.name},
          {"params", l.params},
          {"in_width", l.in_width},
          {"out_width", l.out_width},
          {"activation_floats", l.activation_floats},
          {"workspace_floats", l.workspace_floats},
          {"arena_floats", l.arena_floats},
          {"forward_flops", l.forward_flops},
          {"backward_flops", l.backward_flops},
          {"forward_fixed", l.forward_fixed},
          {"forward_per_sample", l.forward_per_sample},
          {"backward_fixed", l.backward_fixed},
          {"backward_per_sample", l.backward_per_sample},
          {"step_seconds", l.step_seconds}};
}

// "0-2 | 3-5 | 6-7 | 8-10": the pieces of each stage of a split given by its first pieces.
std::string split_text(const std::vector<std::size_t>& first, std::size_t pieces) {
  std::string t;
  for (std::size_t k = 0; k < first.size(); ++k) {
    const std::size_t last = (k + 1 < first.size() ? first[k + 1] : pieces) - 1;
    t += (k ? " | " : "") + std::to_string(first[k]) +
         (last > first[k] ? "-" + std::to_string(last) : "");
  }
  return t;
}

// A split's stages, each its busy time per mini-batch (M forwards and backwards of batch / M
// rows, one step), and the slowest over the mean: what bounds a pipeline's throughput.
struct SplitTimes {
  std::vector<double> stage;
  double slowest_over_mean = 0;
};
SplitTimes split_times(const std::vector<double>& piece, const std::vector<std::size_t>& first) {
  SplitTimes t;
  for (std::size_t k = 0; k < first.size(); ++k) {
    const std::size_t end = k + 1 < first.size() ? first[k + 1] : piece.size();
    double sum = 0;
    for (std::size_t i = first[k]; i < end; ++i) sum += piece[i];
    t.stage.push_back(sum);
  }
  double total = 0, slowest = 0;
  for (double v : t.stage) total += v, slowest = std::max(slowest, v);
  t.slowest_over_mean = slowest * static_cast<double>(t.stage.size()) / total;
  return t;
}

std::string ms_list(const std::vector<double>& seconds) {
  std::string t;
  char b[32];
  for (double v : seconds) {
    std::snprintf(b, sizeof b, "%s%.1f", t.empty() ? "" : " / ", v * 1e3);
    t += b;
  }
  return t;
}

int run(const Options& given) {
  Options o = given;
  if (o.batch == 0) o.batch = static_cast<int>(plan_batch(o.model));
  if (o.batch % o.micro_batches != 0)
    throw UsageError("--batch " + std::to_string(o.batch) + " is not a multiple of -M " +
                     std::to_string(o.micro_batches));
  // The gpt's rows are tokens: each micro-batch whole sequences (its smaller profiled
  // micro-batch is one), as xpipe-train takes.
  if (const index_t sequence = profile_rows("gpt").first;
      o.model == "gpt" && o.batch % (sequence * o.micro_batches) != 0)
    throw UsageError("--batch " + std::to_string(o.batch) + " with -M " +
                     std::to_string(o.micro_batches) +
                     ": the gpt's rows are tokens, and each micro-batch must hold whole sequences "
                     "of " +
                     std::to_string(sequence) + ", so --batch a multiple of " +
                     std::to_string(sequence * o.micro_batches));
  const fs::path out = o.out.empty() ? "xpipe-plan-out/" + o.model + ".json" : o.out;
  prepare_out_file(out);
  std::printf(
      "profiling the %s's pieces (thread CPU time per action, reference order, host backend; "
      "%s)\n",
      o.model.c_str(), machine_note().c_str());
  const auto [small, large] = profile_rows(o.model);
  const ModelPieces m = profile_pieces(o.model, small, large, 8, o.repeats);
  json j;
  j["name"] = m.name;
  j["measured_on"] =
      "host backend, one thread per stage, thread CPU time per action; " + machine_note();
  for (const auto& l : m.pieces) {
    j["layers"].push_back(to_json(l));
    std::printf("  %-50s F %.1f + %.3f/sample us   B %.1f + %.3f/sample us   S %.1f us\n",
                l.name.c_str(), l.forward_fixed * 1e6, l.forward_per_sample * 1e6,
                l.backward_fixed * 1e6, l.backward_per_sample * 1e6, l.step_seconds * 1e6);
  }
  // Each piece's busy time per mini-batch at batch / M rows per micro-batch; the splits of
  // models/ against the partition of the pieces that minimises the slowest stage.
  const double rows = static_cast<double>(o.batch) / o.micro_batches;
  std::vector<double> piece;
  for (const auto& l : m.pieces) {
    const sim::LayerTimes t = sim::layer_times(l, rows, {});
    piece.push_back(o.micro_batches * (t.forward + t.backward) + t.step);
  }
  std::printf(
      "\nsplits, busy ms per stage and mini-batch (batch %d, M = %d), the slowest over the "
      "mean:\n",
      o.batch, o.micro_batches);
  for (const auto& first : m.splits) {
    const int K = static_cast<int>(first.size());
    const std::vector<std::size_t> best = sim::balanced_partition(piece, K);
    const SplitTimes now = split_times(piece, first), balanced = split_times(piece, best);
    std::printf("  K = %d  models/: pieces %s: %s ms (%.2f)\n", K,
                split_text(first, piece.size()).c_str(), ms_list(now.stage).c_str(),
                now.slowest_over_mean);
    std::printf("         balanced: pieces %s: %s ms (%.2f)\n",
                split_text(best, piece.size()).c_str(), ms_list(balanced.stage).c_str(),
                balanced.slowest_over_mean);
    j["splits"].push_back({{"stages", K},
                           {"batch", o.batch},
                           {"micro_batches", o.micro_batches},
                           {"models_first_pieces", first},
                           {"models_stage_ms", now.stage},
                           {"balanced_first_pieces", best},
                           {"balanced_stage_ms", balanced.stage}});
  }
  if (o.model == "mlp") {
    const sim::LinkCost ring = measure_ring(o.repeats);
    j["in_process_link"] = {{"latency", ring.latency},
                            {"bandwidth", ring.bandwidth},
                            {"note",
                             "SpscRing between two threads: latency half a one-float round "
                             "trip, bandwidth of a 256 KiB message copied in and out; "
                             "inside a Pipeline the copies are part of F and B"}};
    std::printf("  in-process ring: %.2f us + bytes / %.2f GB/s\n", ring.latency * 1e6,
                ring.bandwidth / 1e9);
  }
  write_file_atomically(out, j.dump(2) + "\n");
  std::printf("  wrote %s\n", out.c_str());
  return 0;
}

}  // namespace

Subcommand add_profile(CLI::App& app) {
  auto* cli = app.add_subcommand(
      "profile", "measure a model's pieces (layers, blocks) -> model JSON, and its splits");
  auto o = std::make_shared<Options>();
  cli->add_option("--model", o->model, "mlp, vgg, resnet or gpt (its samples are tokens)")
      ->check(CLI::IsMember(plan_models));
  cli->add_option("--out,-o", o->out, "model JSON to write (default xpipe-plan-out/MODEL.json)");
  cli->add_option("--batch", o->batch,
                  "mini-batch the splits are weighed at (default 128; the gpt: 2048 tokens)")
      ->check(CLI::Range(1, 1 << 20));
  cli->add_option("--micro-batches,-M", o->micro_batches, "micro-batches per mini-batch")
      ->check(CLI::Range(1, 1 << 20));
  cli->add_option("--repeats", o->repeats, "profiling runs (medians)")->check(CLI::Range(1, 100));
  return {cli, [o] { return run(*o); }};
}

}  // namespace xpipe::tools::plan
