// xpipe-plan: the simulator and planner from the command line.
//   xpipe-plan profile            measure the reference MLP's layers -> model JSON
//   xpipe-plan validate           simulated vs measured (threaded executor) time per mini-batch
//   xpipe-plan plan               rank dp x pp x M x schedule for a cluster by time to accuracy
//   xpipe-plan measure-efficiency epochs to a target accuracy vs global batch -> E(B) JSON
//   xpipe-plan simulate           one schedule under a cost model: traces, and bubble filling
//   xpipe-plan check-plan         the planner's step times against runs on this machine
//   xpipe-plan check-mpi          the same with the MPI executor, a rank per device (mpirun -np 2)
// Bad input (flags, JSON fields) is exit 2 with a message naming the flag or field.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "output_files.hpp"
#include "sim_profile.hpp"
#ifdef XPIPE_WITH_MPI
#include "sim_mpi.hpp"
#endif
#include "xpipe/xpipe.hpp"

using namespace xpipe;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

//! Bad input: exit 2.
struct UsageError : Error {
  using Error::Error;
};

// ---- JSON in, every field named on error ------------------------------------------------------

json read_json(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  if (!in) throw UsageError(what + ": cannot open '" + path + "'");
  try {
    return json::parse(in);
  } catch (const json::parse_error& e) {
    throw UsageError(what + " '" + path + "': malformed JSON: " + e.what());
  }
}

const json& member(const json& obj, const std::string& where, const char* key) {
  if (!obj.is_object()) throw UsageError(where + ": must be a JSON object");
  if (!obj.contains(key)) throw UsageError(where + "." + key + ": missing");
  return obj.at(key);
}

double number(const json& obj, const std::string& where, const char* key,
              std::optional<double> fallback = std::nullopt, double lo = 0) {
  if (!obj.is_object()) throw UsageError(where + ": must be a JSON object");
  if (!obj.contains(key)) {
    if (fallback) return *fallback;
    throw UsageError(where + "." + key + ": missing");
  }
  const json& v = obj.at(key);
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < lo)
    throw UsageError(where + "." + key + ": must be a finite number >= " + json(lo).dump() +
                     " (got " + v.dump() + ")");
  return v.get<double>();
}

std::string text(const json& obj, const std::string& where, const char* key, std::string fallback) {
  if (!obj.contains(key)) return fallback;
  if (!obj.at(key).is_string()) throw UsageError(where + "." + key + ": must be a string");
  return obj.at(key).get<std::string>();
}

sim::LinkCost link_from(const json& j, const std::string& where) {
  return {number(j, where, "latency", 0.0), number(j, where, "bandwidth", 0.0)};
}

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

std::vector<sim::LayerSpec> model_from(const json& j, const std::string& file) {
  const std::string where = "model '" + file + "'";
  const json& layers = member(j, where, "layers");
  if (!layers.is_array() || layers.empty())
    throw UsageError(where + ".layers: must be a non-empty array");
  std::vector<sim::LayerSpec> out;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const json& l = layers[i];
    const std::string at = where + ".layers[" + std::to_string(i) + "]";
    sim::LayerSpec s;
    s.name = text(l, at, "name", "layer " + std::to_string(i));
    s.params = number(l, at, "params");
    s.in_width = number(l, at, "in_width", std::nullopt, 1);
    s.out_width = number(l, at, "out_width", std::nullopt, 1);
    s.activation_floats = number(l, at, "activation_floats", 0.0);
    s.forward_flops = number(l, at, "forward_flops", 0.0);
    s.backward_flops = number(l, at, "backward_flops", 0.0);
    s.forward_fixed = number(l, at, "forward_fixed", 0.0);
    s.forward_per_sample = number(l, at, "forward_per_sample", 0.0);
    s.backward_fixed = number(l, at, "backward_fixed", 0.0);
    s.backward_per_sample = number(l, at, "backward_per_sample", 0.0);
    s.step_seconds = number(l, at, "step_seconds", 0.0);
    if (!s.measured() && (s.forward_flops <= 0 || s.backward_flops <= 0))
      throw UsageError(at +
                       ": needs measured times (forward_per_sample, backward_per_sample) or "
                       "forward_flops and backward_flops");
    out.push_back(s);
  }
  return out;
}

sim::ClusterSpec cluster_from(const json& j, const std::string& file) {
  const std::string where = "cluster '" + file + "'";
  sim::ClusterSpec c;
  c.name = text(j, where, "name", "cluster");
  c.devices = static_cast<int>(number(j, where, "devices", std::nullopt, 1));
  const json& d = member(j, where, "device");
  const std::string dw = where + ".device";
  c.device.name = text(d, dw, "name", "device");
  c.device.peak_flops = number(d, dw, "peak_flops", 0.0);
  c.device.memory_bandwidth = number(d, dw, "memory_bandwidth", 0.0);
  c.device.memory_bytes = number(d, dw, "memory_bytes", std::nullopt, 1);
  c.device.efficiency = number(d, dw, "efficiency", 1.0);
  c.cores_per_replica = number(j, where, "cores_per_replica", 0.0);
  if (j.contains("pipeline_link"))
    c.pipeline_link = link_from(j["pipeline_link"], where + ".pipeline_link");
  if (j.contains("allreduce_link"))
    c.allreduce_link = link_from(j["allreduce_link"], where + ".allreduce_link");
  c.price_per_hour = number(j, where, "price_per_hour", 0.0);
  if (j.contains("transient") && !j["transient"].is_boolean())
    throw UsageError(where + ".transient: must be true or false");
  c.transient = j.value("transient", false);
  c.revocations_per_hour = number(j, where, "revocations_per_hour",
                                  c.transient ? std::nullopt : std::optional<double>(0.0));
  c.checkpoint_fixed = number(j, where, "checkpoint_fixed", 0.0);
  c.checkpoint_bandwidth = number(j, where, "checkpoint_bandwidth", 0.0);
  c.restart_seconds = number(j, where, "restart_seconds", 0.0);
  c.on_demand_price_per_hour = number(j, where, "on_demand_price_per_hour", 0.0);
  return c;
}

sim::EfficiencyCurve efficiency_from(const json& j, const std::string& file, double& dataset) {
  const std::string where = "efficiency '" + file + "'";
  sim::EfficiencyCurve e;
  e.target = text(j, where, "target", "");
  const json& pts = member(j, where, "points");
  if (!pts.is_array() || pts.empty())
    throw UsageError(where + ".points: must be a non-empty array");
  for (std::size_t i = 0; i < pts.size(); ++i) {
    const std::string at = where + ".points[" + std::to_string(i) + "]";
    e.points.push_back({number(pts[i], at, "batch", std::nullopt, 1),
                        number(pts[i], at, "epochs", std::nullopt, 1e-9)});
  }
  if (dataset <= 0) dataset = number(j, where, "dataset_samples", std::nullopt, 1);
  try {
    e.check();
  } catch (const ConfigError& err) {
    throw UsageError(where + ": " + err.what());
  }
  return e;
}

//! One seed's own E(B), from the `per_seed` lists measure-efficiency writes beside each point
//! (empty when the file has none, or fewer than two seeds): the planner's answer under each
//! seed's curve says how much of it the seed-to-seed spread of E(B) can move.
struct SeedCurve {
  int seed = 0;
  sim::EfficiencyCurve curve;
};

std::vector<SeedCurve> seed_curves_from(const json& j, const std::string& file,
                                        const std::string& target) {
  const std::string where = "efficiency '" + file + "'";
  std::vector<SeedCurve> out;
  const json& pts = j.at("points");  // checked by efficiency_from
  if (!pts.front().contains("per_seed")) return out;
  for (std::size_t i = 0; i < pts.size(); ++i) {
    const std::string at = where + ".points[" + std::to_string(i) + "].per_seed";
    const json& list = member(pts[i], where + ".points[" + std::to_string(i) + "]", "per_seed");
    if (!list.is_array() || list.empty()) throw UsageError(at + ": must be a non-empty array");
    if (i > 0 && list.size() != out.size())
      throw UsageError(at + ": " + std::to_string(list.size()) + " seeds, points[0] has " +
                       std::to_string(out.size()));
    for (std::size_t s = 0; s < list.size(); ++s) {
      const std::string here = at + "[" + std::to_string(s) + "]";
      const int seed = static_cast<int>(number(list[s], here, "seed"));
      if (i == 0)
        out.push_back({seed, {{}, target + ", seed " + std::to_string(seed)}});
      else if (out[s].seed != seed)
        throw UsageError(here + ".seed: " + std::to_string(seed) + ", points[0] has seed " +
                         std::to_string(out[s].seed) + " there");
      out[s].curve.points.push_back({number(pts[i], where, "batch", std::nullopt, 1),
                                     number(list[s], here, "epochs", std::nullopt, 1e-9)});
    }
  }
  if (out.size() < 2) return {};
  for (auto& c : out) c.curve.check();
  return out;
}

std::vector<sim::StalenessPenalty> penalties_from(const json& j, const std::string& file) {
  const std::string where = "penalties '" + file + "'";
  const json& list = member(j, where, "penalties");
  if (!list.is_array()) throw UsageError(where + ".penalties: must be an array");
  std::vector<sim::StalenessPenalty> out;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string at = where + ".penalties[" + std::to_string(i) + "]";
    sim::StalenessPenalty p;
    p.schedule = text(list[i], at, "schedule", "");
    p.predictor = text(list[i], at, "predictor", "");
    bool known = false;
    for (const char* n : schedule_names) known = known || p.schedule == n;
    if (!known || p.schedule == "gpipe" || p.schedule == "1f1b-flush")
      throw UsageError(at + ".schedule: must be async-1f1b or 2bw (got '" + p.schedule + "')");
    known = false;
    for (const char* n : predictor_names) known = known || p.predictor == n;
    if (!known) throw UsageError(at + ".predictor: unknown predictor '" + p.predictor + "'");
    p.stages = static_cast<int>(number(list[i], at, "stages", std::nullopt, 2));
    p.epochs_factor = number(list[i], at, "epochs_factor", std::nullopt, 1e-9);
    out.push_back(p);
  }
  return out;
}

void write_out(const fs::path& dir, const std::string& name, const std::string& body) {
  tools::write_file_atomically(dir / name, body);
  std::printf("  wrote %s\n", (dir / name).c_str());
}

void run_gnuplot(const fs::path& dir, const std::string& script) {
  const std::string gnuplot = tools::find_program("gnuplot");
  if (gnuplot.empty()) {
    std::fprintf(stderr,
                 "xpipe-plan: gnuplot not found (Debian: gnuplot-nox); run 'gnuplot %s' "
                 "in %s later\n",
                 script.c_str(), dir.c_str());
    return;
  }
  if (const std::string why = tools::run_program(gnuplot, {"gnuplot", script}, dir); !why.empty())
    std::fprintf(stderr, "xpipe-plan: gnuplot %s: %s\n", script.c_str(), why.c_str());
}

std::string machine_note() {
  std::ifstream in("/proc/loadavg");
  std::string load;
  std::getline(in, load);
  return std::to_string(std::thread::hardware_concurrency()) + " cores, load average " + load;
}

// ---- profile ------------------------------------------------------------------------------------

int cmd_profile(const fs::path& out, int repeats) {
  std::printf(
      "profiling the reference MLP's layers (thread CPU time per action, reference order, host "
      "backend; %s)\n",
      machine_note().c_str());
  const auto layers = tools::profile_mlp_layers(16, 128, 8, repeats);
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
  const sim::LinkCost ring = tools::measure_ring(repeats);
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
  tools::write_file_atomically(out, j.dump(2) + "\n");
  std::printf("  wrote %s\n", out.c_str());
  return 0;
}

// ---- validate -----------------------------------------------------------------------------------

int cmd_validate(const fs::path& out, const std::vector<int>& Ks, const std::vector<int>& Ms,
                 const std::vector<std::string>& schedules, int N, int repeats, double max_error,
                 int cores, bool pin) {
  std::printf(
      "validation: simulated vs measured seconds per mini-batch, reference MLP, batch 128, "
      "%d mini-batches, median of %d. Cost model: each action's median wall time with the "
      "stages run one action at a time on their own threads (SerialThreadedExecutor), on the "
      "same Pipeline. %s (%s)\n\n",
      N, repeats,
      pin ? "Stage k pinned to CPU k mod cores; the simulator shares each core between its own "
            "stages, each core at the share a run gets of it relative to the profile, measured "
            "before and after each run ('cores free' column, per core: 1 when quiet); 'quiet' "
            "assumes whole cores"
          : "Threads placed by the OS (--no-pin); the simulator shares one pool: the compute "
            "1..K busy threads got, measured before and after each run ('cores free'); 'quiet' "
            "assumes whole cores",
      machine_note().c_str());
  for (int K : Ks)
    if (K != 2 && K != 4)
      throw UsageError("--stages: " + std::to_string(K) +
                       ": the reference MLP is compiled over 2 and 4 stages only");
  const sim::LinkCost ring = tools::measure_ring(3);
  std::printf("in-process ring hop (the simulator's link latency): %.2f us\n\n",
              ring.latency * 1e6);
  std::printf(
      "| K | schedule | M | measured ms | simulated ms | error | cores free | "
      "simulated quiet ms | error if quiet |\n|--:|---|--:|--:|--:|--:|--:|--:|--:|\n");
  json cells = json::array();
  std::string csv =
      "stages,schedule,predictor,micro_batches,measured_ms,simulated_ms,error,available_cores,"
      "simulated_quiet_ms,error_quiet\n";
  double worst = 0;
  for (int K : Ks)
    for (const std::string& s : schedules)
      for (int M : Ms) {
        if (s == "2bw" && M < K) {
          std::printf("| %d | %s | %d | n/a (2BW needs M >= K) | | | | | |\n", K, s.c_str(), M);
          continue;
        }
        const tools::Cell c =
            tools::validation_cell(K, s, M, 128, N, repeats, cores, ring.latency, pin);
        worst = std::max(worst, std::abs(c.error()));
        std::string free;
        for (double w : c.model.core_of.empty() ? c.model.cores_with : c.model.core_speed) {
          char b[16];
          std::snprintf(b, sizeof b, "%s%.2f", free.empty() ? "" : "/", w);
          free += b;
        }
        const double quiet_error = c.simulated_quiet / c.measured - 1;
        std::printf("| %d | %s | %d | %.3f | %.3f | %+.1f%% | %s | %.3f | %+.1f%% |\n", K,
                    s.c_str(), M, c.measured * 1e3, c.simulated * 1e3, 100 * c.error(),
                    free.c_str(), c.simulated_quiet * 1e3, 100 * quiet_error);
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
                  {"simulated_quiet_ms", c.simulated_quiet * 1e3}};
        for (const auto& st : c.model.stages)
          cell["stage_costs_ms"].push_back({{"forward", st.forward * 1e3},
                                            {"backward", st.backward * 1e3},
                                            {"step", st.step * 1e3}});
        cells.push_back(cell);
        if (!out.empty()) {
          const std::string stem = "k" + std::to_string(K) + "-" + s + "-m" + std::to_string(M);
          tools::write_file_atomically(
              out / (stem + ".measured.json"),
              chrome_trace_json(c.measured_trace, c.plan, stem + " measured"));
          tools::write_file_atomically(
              out / (stem + ".simulated.json"),
              chrome_trace_json(c.simulated_trace, c.plan, stem + " simulated"));
          tools::write_file_atomically(out / (stem + ".measured.svg"),
                                       timeline_svg(c.measured_trace, c.plan));
          tools::write_file_atomically(out / (stem + ".simulated.svg"),
                                       timeline_svg(c.simulated_trace, c.plan));
        }
      }
  std::printf("\nlargest |error|: %.1f%%\n", 100 * worst);
  if (!out.empty()) {
    write_out(out, "validation.csv", csv);
    write_out(out, "validation.json",
              json{{"machine", machine_note()},
                   {"mini_batches", N},
                   {"repeats", repeats},
                   {"cores", cores},
                   {"pinned", pin},
                   {"cells", cells}}
                      .dump(2) +
                  "\n");
  }
  if (max_error > 0 && worst > max_error) {
    std::fprintf(stderr, "xpipe-plan: validate: largest error %.1f%% exceeds --max-error %.1f%%\n",
                 100 * worst, 100 * max_error);
    return 3;
  }
  return 0;
}

// ---- plan ---------------------------------------------------------------------------------------

std::string fmt_time(double s) {
  char b[64];
  if (s < 120)
    std::snprintf(b, sizeof b, "%.1f s", s);
  else if (s < 7200)
    std::snprintf(b, sizeof b, "%.1f min", s / 60);
  else
    std::snprintf(b, sizeof b, "%.2f h", s / 3600);
  return b;
}

//! The best pure data-parallel plan and the best with pp > 1 on n devices (null: none).
std::pair<const sim::Plan*, const sim::Plan*> best_dp_and_hybrid(const sim::PlanResult& r, int n) {
  const sim::Plan *dp = nullptr, *hy = nullptr;
  for (const auto& p : r.plans) {  // ranked: the first of each kind is its best
    if (p.devices != n) continue;
    if (p.pp == 1 && !dp) dp = &p;
    if (p.pp > 1 && !hy) hy = &p;
  }
  return {dp, hy};
}

int cmd_plan(sim::PlanRequest req, const fs::path& out, int top,
             const std::vector<SeedCurve>& seed_curves) {
  const sim::PlanResult r = sim::make_plans(req);
  const auto& c = req.cluster;
  std::printf("%zu plans for %s (%d x %s%s), dataset %.0f samples, E(B): %s\n", r.plans.size(),
              c.name.c_str(), c.devices, c.device.name.c_str(),
              c.transient ? ", transient" : ", on-demand", req.dataset_samples,
              req.efficiency.target.c_str());
  std::printf(
      "dropped: %d over memory, %d global batches outside E(B)'s range, %d never finish\n\n",
      r.dropped_memory, r.dropped_no_efficiency, r.dropped_revocations);
  std::printf("%-4s %-34s %7s %9s %7s %8s %10s %10s %9s %8s", "rank", "plan (dp x pp)", "B",
              "step ms", "bubble", "epochs", "time", "expected", "cost", "mem MiB");
  if (c.transient) std::printf(" %10s %10s %7s", "ckpt cost", "ckpt every", "revoked");
  std::printf("\n");
  std::string csv =
      "rank,devices,dp,pp,micro_batches,batch_per_replica,schedule,predictor,global_batch,"
      "step_seconds,bubble,allreduce_seconds,epochs,steps,time_to_accuracy,cost,peak_memory_bytes,"
      "checkpoint_seconds,checkpoint_interval,expected_revocations,expected_seconds,expected_"
      "cost\n";
  json plans = json::array();
  for (std::size_t i = 0; i < r.plans.size(); ++i) {
    const sim::Plan& p = r.plans[i];
    if (static_cast<int>(i) < top)
      std::printf("%-4zu %-34s %7.0f %9.3f %6.1f%% %8.2f %10s %10s %9.4f %8.1f", i + 1,
                  p.label().c_str(), p.global_batch, p.step_seconds * 1e3, 100 * p.bubble, p.epochs,
                  fmt_time(p.time_to_accuracy).c_str(), fmt_time(p.expected_seconds).c_str(),
                  p.expected_cost, p.peak_memory_bytes / 1048576.0);
    if (static_cast<int>(i) < top && c.transient)
      std::printf(" %10s %10s %7.2f", fmt_time(p.checkpoint_seconds).c_str(),
                  fmt_time(p.checkpoint_interval).c_str(), p.expected_revocations);
    if (static_cast<int>(i) < top) std::printf("\n");
    char line[512];
    std::snprintf(
        line, sizeof line,
        "%zu,%d,%d,%d,%d,%d,%s,%s,%.0f,%.9g,%.6f,%.9g,%.6g,%.6g,%.9g,%.9g,%.0f,%.6g,%.6g,%.6g,"
        "%.9g,%.9g\n",
        i + 1, p.devices, p.dp, p.pp, p.micro_batches, p.batch_per_replica, p.schedule.c_str(),
        p.predictor.c_str(), p.global_batch, p.step_seconds, p.bubble, p.allreduce_seconds,
        p.epochs, p.steps, p.time_to_accuracy, p.cost, p.peak_memory_bytes, p.checkpoint_seconds,
        p.checkpoint_interval, p.expected_revocations, p.expected_seconds, p.expected_cost);
    csv += line;
    json pj{{"rank", i + 1},
            {"label", p.label()},
            {"devices", p.devices},
            {"dp", p.dp},
            {"pp", p.pp},
            {"micro_batches", p.micro_batches},
            {"batch_per_replica", p.batch_per_replica},
            {"schedule", p.schedule},
            {"predictor", p.predictor},
            {"first_layer", p.first_layer},
            {"global_batch", p.global_batch},
            {"step_seconds", p.step_seconds},
            {"bubble", p.bubble},
            {"allreduce_seconds", p.allreduce_seconds},
            {"epochs", p.epochs},
            {"time_to_accuracy", p.time_to_accuracy},
            {"cost", p.cost},
            {"peak_memory_bytes", p.peak_memory_bytes},
            {"expected_seconds", p.expected_seconds},
            {"expected_cost", p.expected_cost}};
    if (c.transient)
      pj["transient"] = {{"checkpoint_seconds", p.checkpoint_seconds},
                         {"checkpoint_interval", p.checkpoint_interval},
                         {"mtbf_seconds", p.mtbf_seconds},
                         {"expected_revocations", p.expected_revocations}};
    plans.push_back(pj);
  }
  if (c.transient && !r.plans.empty()) {
    const sim::Plan& p = r.plans.front();
    std::printf("\ntop plan %s on %d devices: on demand %s", p.label().c_str(), p.devices,
                fmt_time(p.time_to_accuracy).c_str());
    if (c.on_demand_price_per_hour > 0)
      std::printf(" for %.4f", p.devices * c.on_demand_price_per_hour * p.time_to_accuracy / 3600);
    std::printf(
        "; transient (%.2f revocations per device-hour, MTBF %s): checkpoint %s every %s "
        "(Young/Daly), %.2f revocations expected, %s for %.4f\n",
        c.revocations_per_hour, fmt_time(p.mtbf_seconds).c_str(),
        fmt_time(p.checkpoint_seconds).c_str(), fmt_time(p.checkpoint_interval).c_str(),
        p.expected_revocations, fmt_time(p.expected_seconds).c_str(), p.expected_cost);
  }
  // Best plan per device count, pure dp and best hybrid side by side: the hybrid argument.
  std::printf("\nbest per device count (expected time):\n%-8s %-34s %10s | %-34s %10s %s\n",
              "devices", "best pure dp", "time", "best with pp > 1", "time", "hybrid gain");
  std::string tta = "# devices best_dp_seconds best_hybrid_seconds best_any_seconds\n";
  std::vector<int> counts;
  for (const auto& p : r.plans)
    if (std::find(counts.begin(), counts.end(), p.devices) == counts.end())
      counts.push_back(p.devices);
  std::sort(counts.begin(), counts.end());
  for (int n : counts) {
    const auto [dp, hy] = best_dp_and_hybrid(r, n);
    const double a = dp ? dp->expected_seconds : NAN, b = hy ? hy->expected_seconds : NAN;
    std::printf("%-8d %-34s %10s | %-34s %10s", n, dp ? dp->label().c_str() : "-",
                dp ? fmt_time(a).c_str() : "-", hy ? hy->label().c_str() : "-",
                hy ? fmt_time(b).c_str() : "-");
    if (dp && hy) std::printf(" %+.1f%%", 100 * (a / b - 1));
    std::printf("\n");
    char line[128];
    std::snprintf(line, sizeof line, "%d %.6g %.6g %.6g\n", n, a, b, std::fmin(a, b));
    tta += line;
  }
  if (!seed_curves.empty()) {
    // The same question under each seed's own E(B): how far the seed-to-seed spread moves it.
    std::vector<sim::PlanResult> per_seed;
    for (const SeedCurve& sc : seed_curves) {
      sim::PlanRequest one = req;
      one.efficiency = sc.curve;
      per_seed.push_back(sim::make_plans(one));
    }
    std::printf("\nhybrid gain under each seed's own E(B) (%zu seeds):\n%-8s %-22s %s\n",
                seed_curves.size(), "devices", "hybrid wins", "gain per seed");
    for (int n : counts) {
      int wins = 0, both = 0;
      std::string gains;
      for (std::size_t s = 0; s < per_seed.size(); ++s) {
        const auto [dp, hy] = best_dp_and_hybrid(per_seed[s], n);
        char g[64];
        if (dp && hy) {
          const double gain = dp->expected_seconds / hy->expected_seconds - 1;
          ++both;
          wins += gain > 0;
          std::snprintf(g, sizeof g, " %+.1f%%", 100 * gain);
        } else {
          std::snprintf(g, sizeof g, " -");
        }
        gains += g;
      }
      if (both == 0) continue;
      std::printf("%-8d %-22s%s\n", n,
                  (std::to_string(wins) + " of " + std::to_string(both) + " seeds").c_str(),
                  gains.c_str());
    }
  }
  const auto front = sim::pareto_front(r.plans);
  std::string pareto = "# expected_seconds expected_cost label\n", all = pareto;
  std::printf("\nPareto front (expected time vs cost):\n");
  for (const auto& p : front) {
    std::printf("  %-34s %10s  %.4f\n", p.label().c_str(), fmt_time(p.expected_seconds).c_str(),
                p.expected_cost);
    pareto += std::to_string(p.expected_seconds) + " " + std::to_string(p.expected_cost) + " \"" +
              p.label() + "\"\n";
  }
  for (const auto& p : r.plans)
    all += std::to_string(p.expected_seconds) + " " + std::to_string(p.expected_cost) + "\n";
  if (out.empty()) return 0;
  write_out(out, "plans.csv", csv);
  write_out(out, "plans.json",
            json{{"cluster", c.name}, {"transient", c.transient}, {"plans", plans}}.dump(2) + "\n");
  write_out(out, "tta.dat", tta);
  write_out(out, "pareto.dat", pareto);
  write_out(out, "all.dat", all);
  write_out(
      out, "plan.gp",
      "set terminal svg size 800,500 dynamic\n"
      "set output 'tta.svg'\nset logscale xy\nset xlabel 'devices'\n"
      "set ylabel 'expected time to accuracy (s)'\nset key top right\n"
      "plot 'tta.dat' using 1:2 with linespoints title 'best pure data parallel', \\\n"
      "     'tta.dat' using 1:3 with linespoints title 'best dp x pp (pp > 1)'\n"
      "set output 'pareto.svg'\nunset logscale\nset logscale x\n"
      "set xlabel 'expected time to accuracy (s)'\nset ylabel 'expected cost'\n"
      "plot 'all.dat' using 1:2 with points pt 7 ps 0.4 lc rgb '#999999' title 'plans', \\\n"
      "     'pareto.dat' using 1:2 with linespoints pt 7 lc rgb '#c00000' title 'Pareto front'\n");
  run_gnuplot(out, "plan.gp");
  return 0;
}

// ---- measure-efficiency -------------------------------------------------------------------------

//! Epochs one seeded sequential training at global batch B takes to reach `target` test
//! accuracy, checked `evals_per_epoch` times an epoch (negative: not reached in max_epochs).
//! One thread (the epoch counts do not depend on it, and a shared machine punishes OpenMP
//! barriers that wait for a descheduled second thread). `last` gets the last accuracy checked.
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

//! E(B) over seeds: every (batch, seed) run is independent and deterministic, so `jobs` threads
//! take them in turn and the numbers do not depend on how many run at once. A batch's point is
//! the mean over its seeds (all must reach the target, else it is listed as not reached, with
//! each seed's outcome); the file is rewritten after every finished run, so an interrupted
//! measurement keeps what it finished ("pending" lists the batches still missing seeds).
int cmd_efficiency(const fs::path& out, const std::vector<int>& batches,
                   const std::vector<int>& seeds, int jobs, double target, double max_epochs,
                   int evals_per_epoch, float lr, const std::string& data_dir) {
  for (const auto* list : {&batches, &seeds}) {
    std::vector<int> sorted = *list;
    std::sort(sorted.begin(), sorted.end());
    if (const auto d = std::adjacent_find(sorted.begin(), sorted.end()); d != sorted.end())
      throw UsageError(std::string(list == &batches ? "--batches" : "--seeds") + ": " +
                       std::to_string(*d) + " is listed twice");
  }
  const DatasetPair data = load_fashion_mnist(data_dir);
  std::printf(
      "E(B): epochs to %.1f%% test accuracy on Fashion-MNIST, sequential MLP, Adam lr %g, "
      "checked %d times an epoch, at most %.0f epochs, seeds",
      100 * target, lr, evals_per_epoch, max_epochs);
  for (int s : seeds) std::printf(" %d", s);
  std::printf(", %d run%s at a time\n", jobs, jobs == 1 ? "" : "s");
  std::fflush(stdout);
  if (out.has_parent_path() && !out.parent_path().empty())
    fs::create_directories(out.parent_path());

  struct Run {
    bool done = false;
    double epochs = -1, last_accuracy = 0;
  };
  const std::size_t S = seeds.size();
  std::vector<Run> runs(batches.size() * S);  // batch-major
  std::mutex lock;                            // guards runs, the file and stdout
  const std::string target_text = "test accuracy >= " + std::to_string(target) +
                                  " on Fashion-MNIST (reference MLP, Adam lr " +
                                  std::to_string(lr) + ", sequential)";
  // Batch b's runs so far: each finished seed's outcome, and over them the mean, least and most
  // epochs (meaningful once every seed is done and reached the target).
  struct Summary {
    json per_seed = json::array();
    bool done = true, reached = true;
    double mean = 0, lo = 1e300, hi = -1e300;
  };
  auto summarize = [&](std::size_t b) {
    Summary m;
    for (std::size_t s = 0; s < S; ++s) {
      const Run& r = runs[b * S + s];
      m.done = m.done && r.done;
      if (!r.done) continue;
      m.per_seed.push_back({{"seed", seeds[s]},
                            {"epochs", r.epochs > 0 ? json(r.epochs) : json(nullptr)},
                            {"last_accuracy", r.last_accuracy}});
      m.reached = m.reached && r.epochs > 0;
      m.mean += r.epochs;  // a sum until the loop ends
      m.lo = std::min(m.lo, r.epochs);
      m.hi = std::max(m.hi, r.epochs);
    }
    m.mean /= static_cast<double>(S);
    return m;
  };
  auto write = [&] {  // with lock held
    json pts = json::array(), missed = json::array(), pending = json::array();
    for (std::size_t b = 0; b < batches.size(); ++b) {
      const Summary m = summarize(b);
      if (!m.done)
        pending.push_back({{"batch", batches[b]}, {"per_seed", m.per_seed}});
      else if (!m.reached)
        missed.push_back({{"batch", batches[b]}, {"per_seed", m.per_seed}});
      else
        pts.push_back({{"batch", batches[b]},
                       {"epochs", m.mean},
                       {"epochs_min", m.lo},
                       {"epochs_max", m.hi},
                       {"per_seed", m.per_seed}});
    }
    json j{{"target", target_text},
           {"dataset_samples", data.train.count},
           {"evals_per_epoch", evals_per_epoch},
           {"seeds", seeds},
           {"points", pts},
           {"not_reached", missed},
           {"measured_on", machine_note()}};
    if (!pending.empty()) j["pending"] = pending;
    tools::write_file_atomically(out, j.dump(2) + "\n");
  };

  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  auto work = [&] {
    try {
      for (std::size_t i; !failed && (i = next++) < runs.size();) {
        const int B = batches[i / S], seed = seeds[i % S];
        double last = 0;
        const double epochs = epochs_to_target(data, B, static_cast<std::uint64_t>(seed), target,
                                               max_epochs, evals_per_epoch, lr, last);
        const std::lock_guard<std::mutex> g(lock);
        runs[i] = {true, epochs, last};
        if (epochs > 0)
          std::printf("  B = %5d, seed %d: %.2f epochs\n", B, seed, epochs);
        else
          std::printf("  B = %5d, seed %d: not reached in %.0f epochs (last %.2f%%)\n", B, seed,
                      max_epochs, 100 * last);
        std::fflush(stdout);
        write();
      }
    } catch (...) {
      const std::lock_guard<std::mutex> g(lock);
      if (!error) error = std::current_exception();
      failed = true;
    }
  };
  {
    std::vector<std::jthread> pool;
    for (int j = 1; j < std::min<int>(jobs, static_cast<int>(runs.size())); ++j)
      pool.emplace_back(work);
    work();
  }
  if (error) std::rethrow_exception(error);
  std::printf("\n| B | epochs (mean over %zu seed%s) | min | max |\n|--:|--:|--:|--:|\n", S,
              S == 1 ? "" : "s");
  for (std::size_t b = 0; b < batches.size(); ++b) {
    const Summary m = summarize(b);
    if (m.reached)
      std::printf("| %d | %.2f | %.2f | %.2f |\n", batches[b], m.mean, m.lo, m.hi);
    else
      std::printf("| %d | not reached by every seed | | |\n", batches[b]);
  }
  std::printf("  wrote %s\n", out.c_str());
  return 0;
}

// ---- simulate -----------------------------------------------------------------------------------

int cmd_simulate(const std::string& model_file, const std::string& schedule, int K, int M, int N,
                 int batch, int cores, double fill_samples, const sim::DeviceSpec& device,
                 const fs::path& out) {
  const json j = read_json(model_file, "--model");
  const auto layers = model_from(j, model_file);
  if (K < 1 || K > static_cast<int>(layers.size()))
    throw UsageError("--stages: " + std::to_string(K) + " is outside 1.." +
                     std::to_string(layers.size()) + " (the model's layers)");
  if (M < 1 || M > batch) throw UsageError("--micro-batches: must lie in 1..--batch");
  const Schedule s = make_schedule(schedule, K, M, N);
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
    m.stages.push_back(
        sim::stage_cost(layers, first[k], k + 1 < K ? first[k + 1] : layers.size(), rows, none));
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
  }
  return 0;
}

// ---- check-plan: the planner's step times against runs this machine can make ----------------

//! What the checks ask the planner: the plans for up to 2 devices of one core each (as much
//! memory as needed, a flat E(B): step times only) at b rows per replica and M in {1, 2, 4}.
sim::PlanRequest two_device_request(const std::string& model_file, int b) {
  sim::PlanRequest req;
  req.layers = model_from(read_json(model_file, "--model"), model_file);
  req.cluster.devices = 2;
  req.cluster.device = {.name = "one core", .memory_bytes = 1e12};
  req.efficiency = {{{1, 1}, {1e9, 1}}, "flat (step times only)"};
  req.dataset_samples = 1;
  req.batch_per_replica = {b};
  req.micro_batches = {1, 2, 4};
  return req;
}

int cmd_check_plan(const std::string& model_file, int b, int N, int repeats) {
  sim::PlanRequest req = two_device_request(model_file, b);
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
      if (q.dp != dp || q.pp != pp) continue;
      double measured = 0;
      std::string how;
      std::vector<double> m, free;
      for (int i = 0; i < repeats; ++i) {
        const double before = tools::measure_available_cores(cores);
        if (pp == 1) {
          m.push_back(tools::measure_sequential_step(b, N, dp));
        } else {
          m.push_back(
              tools::validation_cell(pp, q.schedule, q.micro_batches, b, N, 1, cores).measured);
        }
        free.push_back(0.5 * (before + tools::measure_available_cores(cores)));
      }
      measured = tools::median(m);
      how = pp > 1    ? "Pipeline, ThreadedExecutor"
            : dp == 1 ? "SequentialTrainer, 1 thread"
                      : std::to_string(dp) + " SequentialTrainers side by side";
      // The same plan, its replicas sharing the cores this process was measured to get.
      const double avail = tools::median(free);
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

#ifdef XPIPE_WITH_MPI
// ---- check-mpi: the planner against the MPI executor, transfers and all-reduce included -------

//! Under `mpirun -np 2`: measures the MPI link and the all-reduce, gives the planner them as the
//! cluster's pipeline_link and allreduce_link, and runs every plan it makes for two devices
//! (2 x 1 pure data parallelism, 1 x 2 pipelines) with the MPI executor, a rank per device.
int cmd_check_mpi(const std::string& model_file, int b, int N, int repeats, double max_error,
                  const fs::path& out) {
  int rank = 0;
  XPIPE_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  const bool root = rank == 0;
  sim::PlanRequest req = two_device_request(model_file, b);
  req.device_counts = {2};
  // The runs are of the compiled reference MLP (tools/models.hpp): its layers must be these.
  const std::vector<index_t> reference{tools::mlp::A::param_count, tools::mlp::B::param_count,
                                       tools::mlp::C::param_count, tools::mlp::D::param_count};
  bool same = req.layers.size() == reference.size();
  for (std::size_t l = 0; same && l < reference.size(); ++l)
    same = req.layers[l].params == static_cast<double>(reference[l]);
  if (!same)
    throw UsageError("check-mpi: --model '" + model_file +
                     "' is not the reference MLP's four layers (784-1024-1024-1024-10), which "
                     "check-mpi runs: profile it with xpipe-plan profile");

  // 1. The link, at the sizes a step sends: one float up to a micro-batch's activations (rows
  // x 1024 floats) and past them.
  const double rows_1024 = 4.0 * b * 1024;  // bytes of a mini-batch's 1024-wide activations
  const std::vector<double> sizes{4, 4096, 65536, rows_1024 / 4, rows_1024, 4 << 20};
  const tools::MpiLinkProfile link = tools::measure_mpi_link(MPI_COMM_WORLD, sizes, repeats + 4);
  // 2. The gradient average 2 x 1 runs each step (the whole model's gradient over the 2
  // replicas), done as the executor does it: MPI_Iallreduce, its wait, the division by R.
  double params = 0;
  for (const sim::LayerSpec& l : req.layers) params += l.params;
  const double ar_measured = tools::measure_mpi_gradient_average(
      MPI_COMM_WORLD, static_cast<index_t>(params), repeats + 4);
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
    if (p.pp == 2 && p.first_layer != std::vector<std::size_t>{0, 2})
      throw ConfigError("check-mpi: the planner splits " + model_file +
                        " other than the compiled 2-stage split (layers 0-1 | 2-3): is it the "
                        "reference MLP?");
    const tools::MpiRunTime run =
        tools::time_mpi_plan(p.dp, p.pp, p.schedule, p.micro_batches, b, N, repeats);
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

std::vector<int> parse_ints(const std::string& flag, const std::string& csv, int lo) {
  std::vector<int> v;
  std::stringstream ss(csv);
  for (std::string item; std::getline(ss, item, ',');) {
    std::size_t used = 0;
    int x = 0;
    try {
      x = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || item.empty() || x < lo)
      throw UsageError(flag + ": '" + item + "' is not a whole number >= " + std::to_string(lo));
    v.push_back(x);
  }
  if (v.empty()) throw UsageError(flag + ": empty list");
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "xpipe-plan: simulate pipeline schedules, validate the simulator against the "
      "threaded executor, and plan dp x pp x M x schedule by time to accuracy and cost"};
  app.require_subcommand(1);
  std::string out;

  auto* profile = app.add_subcommand("profile", "measure the reference MLP's layers -> model JSON");
  std::string profile_out = "xpipe-plan-out/mlp.json";
  int repeats = 5;
  profile->add_option("--out,-o", profile_out, "model JSON to write");
  profile->add_option("--repeats", repeats, "profiling runs (medians)")->check(CLI::Range(1, 100));

  auto* validate = app.add_subcommand("validate", "simulated vs measured time per mini-batch");
  std::string v_stages = "2,4", v_micro = "1,2,4";
  std::vector<std::string> v_schedules{"gpipe", "1f1b-flush", "async-1f1b", "2bw"};
  int v_n = 24, v_repeats = 3, v_cores = static_cast<int>(std::thread::hardware_concurrency());
  double max_error = 0;
  validate->add_option("--stages", v_stages, "K values (2 and/or 4)");
  validate->add_option("--micro-batches,-M", v_micro, "M values");
  validate->add_option("--schedules", v_schedules, "schedules (comma-separated)")
      ->delimiter(',')
      ->check(CLI::IsMember({"gpipe", "1f1b-flush", "async-1f1b", "2bw"}));
  validate->add_option("--mini-batches", v_n, "mini-batches per run")->check(CLI::Range(2, 100000));
  validate->add_option("--repeats", v_repeats, "runs per cell (medians)")
      ->check(CLI::Range(1, 100));
  validate->add_option("--cores", v_cores, "cores the simulator gives the stage threads")
      ->check(CLI::Range(0, 4096));
  bool v_no_pin = false;
  validate->add_flag("--no-pin", v_no_pin,
                     "leave the stage threads where the OS puts them (default: stage k pinned to "
                     "CPU k mod cores, ThreadedExecutor::cpus, each core simulated as shared by "
                     "its own stages)");
  validate->add_option("--max-error", max_error, "exit 3 if any |error| exceeds this fraction")
      ->check(CLI::Range(0.0, 100.0));
  validate->add_option("--out", out, "folder for validation.csv/json and traces");

  auto* plan = app.add_subcommand("plan", "rank dp x pp x M x schedule for a cluster");
  std::string model_file, cluster_file, efficiency_file, penalties_file, batches = "128",
                                                                         micro = "1,2,4,8", devices;
  double dataset = 0;
  int top = 20;
  plan->add_option("--model", model_file, "model JSON (layers; xpipe-plan profile writes one)")
      ->required();
  plan->add_option("--cluster", cluster_file, "cluster JSON")->required();
  plan->add_option("--efficiency", efficiency_file, "E(B) JSON (xpipe-plan measure-efficiency)")
      ->required();
  plan->add_option("--penalties", penalties_file,
                   "measured staleness penalties JSON (async plans)");
  plan->add_option("--batch-per-replica", batches, "per-pipeline mini-batch sizes b (B = dp b)");
  plan->add_option("--micro-batches,-M", micro, "micro-batch counts");
  plan->add_option("--devices", devices, "device counts to plan (default 1, 2, 4, ..., all)");
  plan->add_option("--dataset", dataset, "samples per epoch (default: the efficiency file's)")
      ->check(CLI::Range(1.0, 1e15));
  plan->add_option("--top", top, "rows of the ranked table")->check(CLI::Range(1, 100000));
  plan->add_option("--out", out, "folder for plans.csv/json and gnuplot figures");

  auto* eff = app.add_subcommand("measure-efficiency", "epochs to a target accuracy vs batch");
  std::string e_batches = "32,64,128,256,512,1024", e_seeds = "1",
              e_out = "xpipe-plan-out/efficiency.json", data_dir = default_fashion_mnist_dir();
  double target = 0.85, max_epochs = 8;
  int evals = 4, e_jobs = 1;
  float lr = 1e-3f;
  eff->add_option("--batches", e_batches, "global batch sizes");
  eff->add_option("--seeds", e_seeds, "seeds; a batch's point is the mean over them");
  eff->add_option("--jobs,-j", e_jobs, "runs at a time (one thread each; same numbers)")
      ->check(CLI::Range(1, 256));
  eff->add_option("--target", target, "test accuracy to reach")->check(CLI::Range(0.1, 1.0));
  eff->add_option("--max-epochs", max_epochs, "give up after")->check(CLI::Range(1.0, 1000.0));
  eff->add_option("--evals-per-epoch", evals, "accuracy checks per epoch")
      ->check(CLI::Range(1, 1000));
  eff->add_option("--lr", lr, "Adam learning rate")->check(CLI::Range(1e-8, 10.0));
  eff->add_option("--data-dir", data_dir, "Fashion-MNIST IDX folder");
  eff->add_option("--out,-o", e_out, "E(B) JSON to write");

  auto* simc = app.add_subcommand("simulate", "one schedule under a model JSON");
  std::string s_model, s_schedule = "gpipe";
  int s_k = 2, s_m = 4, s_n = 4, s_batch = 128, s_cores = 0;
  double fill = 0;
  sim::DeviceSpec s_device{.name = "--peak-flops/--memory-bandwidth"};
  simc->add_option("--peak-flops", s_device.peak_flops, "device FLOP/s (layers given by FLOPs)")
      ->check(CLI::Range(0.0, 1e30));
  simc->add_option("--memory-bandwidth", s_device.memory_bandwidth, "device bytes/s")
      ->check(CLI::Range(0.0, 1e30));
  simc->add_option("--model", s_model, "model JSON")->required();
  simc->add_option("--schedule", s_schedule, "schedule")
      ->check(CLI::IsMember({"gpipe", "1f1b-flush", "async-1f1b", "2bw"}));
  simc->add_option("--stages,-K", s_k, "stages");
  simc->add_option("--micro-batches,-M", s_m, "micro-batches");
  simc->add_option("--mini-batches", s_n, "mini-batches")->check(CLI::Range(1, 100000));
  simc->add_option("--batch", s_batch, "mini-batch rows")->check(CLI::Range(1, 1 << 20));
  simc->add_option("--cores", s_cores, "cores shared by the stages (0: one each)")
      ->check(CLI::Range(0, 4096));
  simc->add_option("--fill", fill,
                   "non-trainable forward samples per mini-batch to fill bubbles with")
      ->check(CLI::Range(0.0, 1e9));
  simc->add_option("--out", out, "folder for the trace and timeline");

  auto* check = app.add_subcommand("check-plan", "planner step times vs runs on this machine");
  std::string c_model;
  int c_batch = 128, c_n = 24, c_repeats = 3;
  check->add_option("--model", c_model, "model JSON of the reference MLP (xpipe-plan profile)")
      ->required();
  check->add_option("--batch", c_batch, "per-replica batch")->check(CLI::Range(4, 1 << 16));
  check->add_option("--mini-batches", c_n, "steps per run")->check(CLI::Range(2, 100000));
  check->add_option("--repeats", c_repeats, "runs (medians)")->check(CLI::Range(1, 100));

  auto* check_mpi = app.add_subcommand(
      "check-mpi", "planner step times vs the MPI executor (run under mpirun -np 2)");
  std::string m_model;
  int m_batch = 128, m_n = 16, m_repeats = 3;
  check_mpi->add_option("--model", m_model, "model JSON of the reference MLP (xpipe-plan profile)")
      ->required();
  check_mpi->add_option("--batch", m_batch, "per-replica batch")->check(CLI::Range(4, 1 << 16));
  check_mpi->add_option("--mini-batches", m_n, "steps per run")->check(CLI::Range(2, 100000));
  check_mpi->add_option("--repeats", m_repeats, "runs (medians)")->check(CLI::Range(1, 100));
  double m_max_error = 0;
  check_mpi->add_option("--max-error", m_max_error, "exit 3 if any |error| exceeds this fraction")
      ->check(CLI::Range(0.0, 100.0));
  check_mpi->add_option("--out", out, "folder for check-mpi.json");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return e.get_exit_code() == 0 ? code : 2;  // --help is 0; every bad flag is 2
  }
  try {
    if (!out.empty())
      if (const std::string why = tools::prepare_output_dir(out); !why.empty())
        throw UsageError("--out '" + out + "': " + why);
    if (*profile) return cmd_profile(profile_out, repeats);
    if (*check) return cmd_check_plan(c_model, c_batch, c_n, c_repeats);
    if (*check_mpi) {
#ifdef XPIPE_WITH_MPI
      mpi_default_tuning();
      XPIPE_MPI_CHECK(MPI_Init(&argc, &argv));
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
        rc = cmd_check_mpi(m_model, m_batch, m_n, m_repeats, m_max_error, out);
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
    if (*validate)
      return cmd_validate(out, parse_ints("--stages", v_stages, 2),
                          parse_ints("--micro-batches", v_micro, 1), v_schedules, v_n, v_repeats,
                          max_error, v_cores, !v_no_pin);
    if (*eff)
      return cmd_efficiency(e_out, parse_ints("--batches", e_batches, 1),
                            parse_ints("--seeds", e_seeds, 0), e_jobs, target, max_epochs, evals,
                            lr, data_dir);
    if (*simc) {
      try {
        return cmd_simulate(s_model, s_schedule, s_k, s_m, s_n, s_batch, s_cores, fill, s_device,
                            out);
      } catch (const ConfigError& e) {
        throw UsageError(e.what());
      }
    }
    sim::PlanRequest req;
    req.layers = model_from(read_json(model_file, "--model"), model_file);
    req.cluster = cluster_from(read_json(cluster_file, "--cluster"), cluster_file);
    req.dataset_samples = dataset;
    const json efficiency_json = read_json(efficiency_file, "--efficiency");
    req.efficiency = efficiency_from(efficiency_json, efficiency_file, req.dataset_samples);
    std::vector<SeedCurve> seed_curves;
    try {
      seed_curves = seed_curves_from(efficiency_json, efficiency_file, req.efficiency.target);
    } catch (const ConfigError& e) {
      throw UsageError("efficiency '" + efficiency_file + "': per-seed curve: " + e.what());
    }
    if (!penalties_file.empty())
      req.penalties = penalties_from(read_json(penalties_file, "--penalties"), penalties_file);
    req.batch_per_replica = parse_ints("--batch-per-replica", batches, 1);
    req.micro_batches = parse_ints("--micro-batches", micro, 1);
    if (!devices.empty()) req.device_counts = parse_ints("--devices", devices, 1);
    try {
      return cmd_plan(req, out, top, seed_curves);
    } catch (const ConfigError& e) {  // impossible constraints: bad input too
      throw UsageError(e.what());
    }
  } catch (const UsageError& e) {
    std::fprintf(stderr, "xpipe-plan: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "xpipe-plan: %s\n", e.what());
    return 1;
  }
}
