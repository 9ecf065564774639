// xpipe-plan plan: every dp x pp x M x schedule for a cluster, ranked by expected time to
// accuracy (E(B) and the staleness penalties), with the hybrid's gain and the time/cost front.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "output_files.hpp"
#include "plan/common.hpp"
#include "plan/subcommands.hpp"
#include "xpipe/predict/builtin.hpp"

namespace xpipe::tools::plan {
namespace {

struct Options {
  std::string model_file, cluster_file, efficiency_file, penalties_file;
  std::string batches = "128", micro_batches = "1,2,4,8", devices;
  double dataset = 0;
  int top = 20;
  std::string out;
};

// ---- the cluster, E(B) and the penalties, every field named on error --------------------------

sim::LinkCost link_from(const json& j, const std::string& where) {
  return {number(j, where, "latency", 0.0), number(j, where, "bandwidth", 0.0)};
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

// The schedules of schedule_names whose forwards can read weights older than their mini-batch's
// (derived by the analysis on 4 stages and 4 micro-batches, not listed by hand): those a
// staleness penalty may name.
std::vector<std::string> asynchronous_schedules() {
  std::vector<std::string> out;
  for (const char* n : schedule_names) {
    const StalenessAnalysis a = analyze_staleness(make_schedule(n, 4, 4, 3));
    for (int k = 0; k < a.stages; ++k)
      if (a.max_forward_s(k) > 0) {
        out.push_back(n);
        break;
      }
  }
  return out;
}

bool asynchronous(const std::string& name) {
  const std::vector<std::string> names = asynchronous_schedules();
  return std::find(names.begin(), names.end(), name) != names.end();
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
    if (!asynchronous(p.schedule))
      throw UsageError(at + ".schedule: must be an asynchronous schedule: " +
                       join_names(asynchronous_schedules()) + " (got '" + p.schedule + "')");
    bool known = false;
    for (const char* n : predictor_names) known = known || p.predictor == n;
    if (!known) throw UsageError(at + ".predictor: unknown predictor '" + p.predictor + "'");
    p.stages = static_cast<int>(number(list[i], at, "stages", std::nullopt, 2));
    p.epochs_factor = number(list[i], at, "epochs_factor", std::nullopt, 1e-9);
    out.push_back(p);
  }
  return out;
}

// ---- the ranking, printed and written -----------------------------------------------------------

void run_gnuplot(const fs::path& dir, const std::string& script) {
  const std::string gnuplot = find_program("gnuplot");
  if (gnuplot.empty()) {
    std::fprintf(stderr,
                 "xpipe-plan: gnuplot not found (Debian: gnuplot-nox); run 'gnuplot %s' "
                 "in %s later\n",
                 script.c_str(), dir.c_str());
    return;
  }
  if (const std::string why = run_program(gnuplot, {"gnuplot", script}, dir); !why.empty())
    std::fprintf(stderr, "xpipe-plan: gnuplot %s: %s\n", script.c_str(), why.c_str());
}

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

//! Ranks the plans for `req` and prints them (the first `top`); into `out` if given, writes them
//! with the figures' data and a gnuplot script (run if gnuplot is installed).
int rank_plans(sim::PlanRequest req, const fs::path& out, int top,
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

int run(const Options& o) {
  prepare_out(o.out);
  sim::PlanRequest req;
  req.layers = model_from(read_json(o.model_file, "--model"), o.model_file);
  req.cluster = cluster_from(read_json(o.cluster_file, "--cluster"), o.cluster_file);
  req.dataset_samples = o.dataset;
  const json efficiency_json = read_json(o.efficiency_file, "--efficiency");
  req.efficiency = efficiency_from(efficiency_json, o.efficiency_file, req.dataset_samples);
  std::vector<SeedCurve> seed_curves;
  try {
    seed_curves = seed_curves_from(efficiency_json, o.efficiency_file, req.efficiency.target);
  } catch (const ConfigError& e) {
    throw UsageError("efficiency '" + o.efficiency_file + "': per-seed curve: " + e.what());
  }
  if (!o.penalties_file.empty())
    req.penalties = penalties_from(read_json(o.penalties_file, "--penalties"), o.penalties_file);
  req.batch_per_replica = parse_ints("--batch-per-replica", o.batches, 1);
  req.micro_batches = parse_ints("--micro-batches", o.micro_batches, 1);
  if (!o.devices.empty()) req.device_counts = parse_ints("--devices", o.devices, 1);
  try {
    return rank_plans(req, o.out, o.top, seed_curves);
  } catch (const ConfigError& e) {  // impossible constraints: bad input too
    throw UsageError(e.what());
  }
}

}  // namespace

Subcommand add_plan(CLI::App& app) {
  auto* cli = app.add_subcommand("plan", "rank dp x pp x M x schedule for a cluster");
  auto o = std::make_shared<Options>();
  cli->add_option("--model", o->model_file, "model JSON (layers; xpipe-plan profile writes one)")
      ->required();
  cli->add_option("--cluster", o->cluster_file, "cluster JSON")->required();
  cli->add_option("--efficiency", o->efficiency_file, "E(B) JSON (xpipe-plan measure-efficiency)")
      ->required();
  cli->add_option("--penalties", o->penalties_file,
                  "measured staleness penalties JSON (async plans)");
  cli->add_option("--batch-per-replica", o->batches, "per-pipeline mini-batch sizes b (B = dp b)");
  cli->add_option("--micro-batches,-M", o->micro_batches, "micro-batch counts");
  cli->add_option("--devices", o->devices, "device counts to plan (default 1, 2, 4, ..., all)");
  cli->add_option("--dataset", o->dataset, "samples per epoch (default: the efficiency file's)")
      ->check(decimal_in(1, 1e15, "[1, 1e15]"));
  cli->add_option("--top", o->top, "rows of the ranked table")->check(CLI::Range(1, 100000));
  cli->add_option("--out", o->out, "folder for plans.csv/json and gnuplot figures");
  return {cli, [o] { return run(*o); }};
}

}  // namespace xpipe::tools::plan
