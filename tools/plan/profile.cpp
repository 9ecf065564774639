// xpipe-plan profile: the reference MLP's layers measured on this machine -> model JSON.
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
  std::string out = "xpipe-plan-out/mlp.json";
  int repeats = 5;
};

json to_json(const sim::LayerSpec& l) {
  return {{"name", l.name},
          {"params", l.params},
          {"in_width", l.in_width},
          {"out_width", l.out_width},
          {"activation_floats", l.activation_floats},
          {"forward_flops", l.forward_flops},
          {"backward_flops", l.backward_flops},
          {"forward_fixed", l.forward_fixed},
          {"forward_per_sample", l.forward_per_sample},
          {"backward_fixed", l.backward_fixed},
          {"backward_per_sample", l.backward_per_sample},
          {"step_seconds", l.step_seconds}};
}

int run(const Options& o) {
  const fs::path out = o.out;
  std::printf(
      "profiling the reference MLP's layers (thread CPU time per action, reference order, host "
      "backend; %s)\n",
      machine_note().c_str());
  const auto layers = profile_mlp_layers(16, 128, 8, o.repeats);
  json j;
  j["name"] = "mlp 784-1024-1024-1024-10";
  j["measured_on"] =
      "host backend, one thread per stage, thread CPU time per action; " + machine_note();
  for (const auto& l : layers) {
    j["layers"].push_back(to_json(l));
    std::printf("  %-30s F %.1f + %.3f/sample us   B %.1f + %.3f/sample us   S %.1f us\n",
                l.name.c_str(), l.forward_fixed * 1e6, l.forward_per_sample * 1e6,
                l.backward_fixed * 1e6, l.backward_per_sample * 1e6, l.step_seconds * 1e6);
  }
  const sim::LinkCost ring = measure_ring(o.repeats);
  j["in_process_link"] = {{"latency", ring.latency},
                          {"bandwidth", ring.bandwidth},
                          {"note",
                           "SpscRing between two threads: latency half a one-float round "
                           "trip, bandwidth of a 256 KiB message copied in and out; "
                           "inside a Pipeline the copies are part of F and B"}};
  std::printf("  in-process ring: %.2f us + bytes / %.2f GB/s\n", ring.latency * 1e6,
              ring.bandwidth / 1e9);
  if (out.has_parent_path() && !out.parent_path().empty())
    fs::create_directories(out.parent_path());
  write_file_atomically(out, j.dump(2) + "\n");
  std::printf("  wrote %s\n", out.c_str());
  return 0;
}

}  // namespace

Subcommand add_profile(CLI::App& app) {
  auto* cli = app.add_subcommand("profile", "measure the reference MLP's layers -> model JSON");
  auto o = std::make_shared<Options>();
  cli->add_option("--out,-o", o->out, "model JSON to write");
  cli->add_option("--repeats", o->repeats, "profiling runs (medians)")->check(CLI::Range(1, 100));
  return {cli, [o] { return run(*o); }};
}

}  // namespace xpipe::tools::plan
