// The planner: enumerates data-parallel x pipeline splits (dp x pp) of a cluster, balanced layer
// partitions, micro-batch counts and schedules (one stage per device, or two: interleaved 1F1B,
// ZB-V, DualPipeV); simulates each plan's step; drops plans whose fullest device does not fit;
// ranks by time to accuracy = E(B) x (dataset / B) x step time (Pal et al.'s hybrid-parallelism
// argument) and by cost; and for transient (preemptible) devices adds checkpoints at the
// Young/Daly interval and the expected work lost to revocations (CM-DARE).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "xpipe/core/error.hpp"
#include "xpipe/schedule/generators.hpp"
#include "xpipe/sim/cost_model.hpp"
#include "xpipe/sim/simulate.hpp"

namespace xpipe::sim {

//! E(B): epochs to reach a target accuracy at global batch B, measured at a few B and
//! interpolated linearly in (log B, log E) between them; a B outside the measured range has no
//! E (the planner drops it rather than extrapolate).
struct EfficiencyCurve {
  struct Point {
    double batch = 0, epochs = 0;
  };
  std::vector<Point> points;  // sorted by batch by check()
  std::string target;         // e.g. "85% test accuracy on Fashion-MNIST"

  void check() {
    if (points.empty()) throw ConfigError("xpipe: efficiency curve: points is empty");
    for (std::size_t i = 0; i < points.size(); ++i)
      if (!(points[i].batch >= 1) || !(points[i].epochs > 0) || !std::isfinite(points[i].epochs))
        throw ConfigError("xpipe: efficiency curve: points[" + std::to_string(i) +
                          "]: batch must be >= 1 and epochs a finite number > 0");
    std::sort(points.begin(), points.end(),
              [](const Point& a, const Point& b) { return a.batch < b.batch; });
    for (std::size_t i = 1; i < points.size(); ++i)
      if (points[i].batch == points[i - 1].batch)
        throw ConfigError("xpipe: efficiency curve: batch " + std::to_string(points[i].batch) +
                          " appears twice");
  }
  bool covers(double b) const {
    return !points.empty() && b >= points.front().batch * (1 - 1e-9) &&
           b <= points.back().batch * (1 + 1e-9);
  }
  //! Epochs at batch b; throws ConfigError outside the measured range.
  double epochs(double b) const {
    if (!covers(b))
      throw ConfigError("xpipe: efficiency curve: batch " + std::to_string(b) +
                        " lies outside the measured range");
    if (points.size() == 1) return points[0].epochs;
    std::size_t i = 1;
    while (i + 1 < points.size() && points[i].batch < b) ++i;
    const Point &p = points[i - 1], &q = points[i];
    const double f = std::clamp(std::log(b / p.batch) / std::log(q.batch / p.batch), 0.0, 1.0);
    return std::exp(std::log(p.epochs) + f * (std::log(q.epochs) - std::log(p.epochs)));
  }
};

//! The devices to plan for. `revocations_per_hour` is per device (transient only); a
//! checkpoint takes checkpoint_fixed + bytes / checkpoint_bandwidth (CM-DARE's model).
struct ClusterSpec {
  std::string name = "cluster";
  int devices = 1;
  DeviceSpec device;
  double cores_per_replica = 0;  // cores one replica's stages share; 0: a device each
  LinkCost pipeline_link;        // between the devices of neighbouring stages
  LinkCost allreduce_link;       // what each device's gradient ring runs over
  double price_per_hour = 0;     // per device
  bool transient = false;
  double revocations_per_hour = 0;      // per device
  double checkpoint_fixed = 0;          // seconds
  double checkpoint_bandwidth = 0;      // bytes/s to the checkpoint store
  double restart_seconds = 0;           // to replace a revoked device and reload
  double on_demand_price_per_hour = 0;  // transient only: the on-demand price, for comparison
};

//! A measured accuracy penalty of an asynchronous (schedule, predictor, K): its epochs to the
//! target over the synchronous baseline's. Only schedules with an entry are planned, so no
//! staleness cost is invented.
struct StalenessPenalty {
  std::string schedule, predictor;
  int stages = 0;
  double epochs_factor = 1;
};

//! What to plan.
struct PlanRequest {
  std::vector<LayerSpec> layers;
  ClusterSpec cluster;
  EfficiencyCurve efficiency;
  double dataset_samples = 0;
  std::vector<int> batch_per_replica{128};  // per-pipeline mini-batch b; global B = dp x b
  std::vector<int> micro_batches{1, 2, 4, 8};
  std::vector<int> device_counts;           // empty: 1, 2, 4, ... up to cluster.devices
  std::vector<StalenessPenalty> penalties;  // async schedules planned only with one
  int simulated_mini_batches = 6;           // steady state from 2 and this many
};

//! One candidate plan and what the model predicts for it.
struct Plan {
  int devices = 0, dp = 1, pp = 1, micro_batches = 1, batch_per_replica = 0;
  std::string schedule = "gpipe", predictor = "latest";
  std::vector<std::size_t> first_layer;  // first layer of each stage (2 pp of them on devices
                                         // holding two: interleaved-1f1b, zb-v, dualpipev)
  double global_batch = 0, step_seconds = 0, epochs = 0, steps = 0;
  double allreduce_seconds = 0;  // per step, per stage (largest)
  double peak_memory_bytes = 0;  // the fullest device
  double bubble = 0;             // mean idle fraction of the stages in one step
  double time_to_accuracy = 0;   // seconds, no revocations
  double cost = 0;               // devices x hours x price
  // Transient devices (equal to the above on on-demand ones):
  double checkpoint_seconds = 0, checkpoint_interval = 0, mtbf_seconds = 0;
  double expected_revocations = 0, expected_seconds = 0, expected_cost = 0;
  std::string label() const {
    return std::to_string(dp) + "x" + std::to_string(pp) + " M=" + std::to_string(micro_batches) +
           " b=" + std::to_string(batch_per_replica) + " " + schedule +
           (predictor == "latest" ? "" : "+" + predictor);
  }
};

//! The outcome: plans ranked by expected time to accuracy (then cost), and what was dropped.
struct PlanResult {
  std::vector<Plan> plans;
  int dropped_memory = 0, dropped_no_efficiency = 0, dropped_revocations = 0;
  double smallest_memory_needed = std::numeric_limits<double>::infinity();
};

//! Contiguous partition of `cost` into `parts` groups minimising the largest group's sum
//! (exact, by dynamic programming); returns the first index of each group.
inline std::vector<std::size_t> balanced_partition(const std::vector<double>& cost, int parts) {
  const std::size_t n = cost.size(), P = static_cast<std::size_t>(parts);
  if (parts < 1 || P > n)
    throw ConfigError("xpipe: balanced_partition: cannot split " + std::to_string(n) +
                      " layers into " + std::to_string(parts) + " stages");
  std::vector<double> prefix(n + 1, 0);
  for (std::size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + cost[i];
  const double inf = std::numeric_limits<double>::infinity();
  // best[p][i]: least max-sum splitting the first i layers into p groups; cut[p][i]: last start.
  std::vector<std::vector<double>> best(P + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<std::size_t>> cut(P + 1, std::vector<std::size_t>(n + 1, 0));
  best[0][0] = 0;
  for (std::size_t p = 1; p <= P; ++p)
    for (std::size_t i = p; i <= n; ++i)
      for (std::size_t j = p - 1; j < i; ++j) {
        const double v = std::max(best[p - 1][j], prefix[i] - prefix[j]);
        if (v < best[p][i]) best[p][i] = v, cut[p][i] = j;
      }
  std::vector<std::size_t> first(P);
  for (std::size_t p = P, i = n; p >= 1; --p) {
    first[p - 1] = cut[p][i];
    i = cut[p][i];
  }
  return first;
}

//! Ring all-reduce of `bytes` among `dp` replicas: 2 (dp - 1) / dp of the bytes cross each link,
//! in 2 (dp - 1) latency-bound rounds.
inline double ring_allreduce_seconds(double bytes, int dp, const LinkCost& link) {
  if (dp <= 1) return 0;
  const double rounds = 2.0 * (dp - 1);
  return rounds * link.latency +
         (link.bandwidth > 0 ? 2.0 * (dp - 1) / dp * bytes / link.bandwidth : 0.0);
}

//! Young/Daly: the checkpoint interval that minimises expected overhead, sqrt(2 C MTBF).
inline double young_daly_interval(double checkpoint_seconds, double mtbf_seconds) {
  return std::sqrt(2 * checkpoint_seconds * mtbf_seconds);
}

//! Weight buffers the built-in predictor `name` holds at stage k (as predict/ sizes them).
inline int predictor_copies(const std::string& name, const StalenessAnalysis& a, int k) {
  if (name == "latest") return 1;
  if (name == "stash" || name == "2bw") return a.stash_versions[static_cast<std::size_t>(k)];
  if (name == "xpipe") return 1 + a.mini_batches_in_flight[static_cast<std::size_t>(k)];
  return 2;  // spectrain, pipeoptim: live + predicted
}

namespace detail {
inline void apply_transient(Plan& p, const ClusterSpec& c, double model_bytes) {
  p.expected_seconds = p.time_to_accuracy;
  p.expected_cost = p.cost;
  if (!c.transient || c.revocations_per_hour <= 0) return;
  // Any revoked device stops the synchronous job: the cluster's rate is devices x the rate.
  const double rate = p.devices * c.revocations_per_hour / 3600.0;
  p.mtbf_seconds = 1 / rate;
  p.checkpoint_seconds =
      c.checkpoint_fixed + (c.checkpoint_bandwidth > 0 ? model_bytes / c.checkpoint_bandwidth : 0);
  p.checkpoint_interval = young_daly_interval(p.checkpoint_seconds, p.mtbf_seconds);
  // Work W at checkpoint interval tau costs W (1 + C / tau) of running; each revocation loses
  // tau / 2 of it on average plus the restart. Expected time T solves
  // T = W (1 + C / tau) + (T / MTBF) (tau / 2 + R).
  const double lost = p.checkpoint_interval / 2 + c.restart_seconds;
  const double denom = 1 - lost / p.mtbf_seconds;
  if (denom <= 0) {
    p.expected_seconds = std::numeric_limits<double>::infinity();
  } else {
    p.expected_seconds =
        p.time_to_accuracy * (1 + p.checkpoint_seconds / p.checkpoint_interval) / denom;
  }
  p.expected_revocations = p.expected_seconds / p.mtbf_seconds;
  p.expected_cost = p.devices * c.price_per_hour * p.expected_seconds / 3600.0;
}
}  // namespace detail

//! Checks the request; throws ConfigError naming the field at fault.
inline void check_request(PlanRequest& r) {
  if (r.layers.empty()) throw ConfigError("xpipe: plan: model.layers is empty");
  for (std::size_t i = 0; i < r.layers.size(); ++i) {
    const LayerSpec& l = r.layers[i];
    const std::string at = "xpipe: plan: model.layers[" + std::to_string(i) + "]";
    if (!(l.params >= 0) || !(l.in_width > 0) || !(l.out_width > 0) || !(l.activation_floats >= 0))
      throw ConfigError(
          at + ": params >= 0, in_width > 0, out_width > 0 and activation_floats >= 0 needed");
    if (!l.measured() && !(l.forward_flops > 0 && l.backward_flops > 0))
      throw ConfigError(
          at +
          ": needs measured times (forward_per_sample, ...) or forward_flops and backward_flops");
  }
  const ClusterSpec& c = r.cluster;
  if (c.devices < 1) throw ConfigError("xpipe: plan: cluster.devices must be >= 1");
  if (!(c.device.memory_bytes > 0))
    throw ConfigError("xpipe: plan: cluster.device.memory_bytes must be > 0");
  if (!(c.price_per_hour >= 0))
    throw ConfigError("xpipe: plan: cluster.price_per_hour must be >= 0");
  if (c.transient && !(c.revocations_per_hour > 0))
    throw ConfigError(
        "xpipe: plan: cluster.revocations_per_hour must be > 0 for a transient cluster");
  if (!(r.dataset_samples >= 1)) throw ConfigError("xpipe: plan: dataset_samples must be >= 1");
  r.efficiency.check();
  for (int b : r.batch_per_replica)
    if (b < 1) throw ConfigError("xpipe: plan: batch_per_replica entries must be >= 1");
  for (int m : r.micro_batches)
    if (m < 1) throw ConfigError("xpipe: plan: micro_batches entries must be >= 1");
  if (r.simulated_mini_batches < 3)
    throw ConfigError("xpipe: plan: simulated_mini_batches must be >= 3");
}

//! Enumerates, simulates, filters and ranks. Throws ConfigError on a bad request, and when no
//! plan fits in memory (naming the smallest need and the device's memory).
inline PlanResult make_plans(PlanRequest r) {
  check_request(r);
  const ClusterSpec& c = r.cluster;
  std::vector<int> counts = r.device_counts;
  if (counts.empty()) {
    for (int n = 1; n <= c.devices; n *= 2) counts.push_back(n);
    if (counts.back() != c.devices) counts.push_back(c.devices);
  }
  double model_bytes = 0;
  for (const LayerSpec& l : r.layers)
    model_bytes += 4 * l.params * (1 + adam_state_floats_per_param);
  PlanResult out;
  struct Candidate {
    std::string schedule, predictor;
    double factor;
  };
  for (int n : counts) {
    if (n < 1 || n > c.devices)
      throw ConfigError("xpipe: plan: device_counts entry " + std::to_string(n) + " outside 1.." +
                        std::to_string(c.devices));
    for (int pp = 1; pp <= n && pp <= static_cast<int>(r.layers.size()); ++pp) {
      if (n % pp != 0) continue;
      const int dp = n / pp;
      std::vector<Candidate> schedules{{"gpipe", "latest", 1}};
      if (pp > 1) {
        schedules.push_back({"1f1b-flush", "latest", 1});
        schedules.push_back({"zb-h1", "latest", 1});
        schedules.push_back({"zb-h2", "latest", 1});    // faster, for 2 pp - 1 slots a stage
        schedules.push_back({"zb-auto", "latest", 1});  // ZB-H2's memory, fitted to the costs
        // Two stages per device (2 pp stages), where the model has the layers for them.
        if (2 * pp <= static_cast<int>(r.layers.size()))
          for (const char* v : {"interleaved-1f1b", "zb-v", "dualpipev"})
            schedules.push_back({v, "latest", 1});
        // A penalty's stages are K: pp, or 2 pp for a schedule of two stages per device.
        for (const StalenessPenalty& s : r.penalties)
          if (s.stages == pp * stages_per_worker(s.schedule))
            schedules.push_back({s.schedule, s.predictor, s.epochs_factor});
      }
      for (int b : r.batch_per_replica) {
        const double B = static_cast<double>(dp) * b;
        if (!r.efficiency.covers(B)) {
          ++out.dropped_no_efficiency;
          continue;
        }
        for (int M : r.micro_batches) {
          if (M > b || (pp == 1 && M > 1)) continue;
          const double rows = static_cast<double>(b) / M;
          // Balance by the layers' compute at this micro-batch size.
          std::vector<double> weight;
          for (const LayerSpec& l : r.layers) {
            const LayerTimes t = layer_times(l, rows, c.device);
            weight.push_back(t.forward + t.backward);
          }
          for (const Candidate& cand : schedules) {
            // K = pp stages, or 2 pp on devices that hold two each.
            const int K = pp * stages_per_worker(cand.schedule);
            if (K > static_cast<int>(r.layers.size())) continue;  // a layer per stage at least
            const std::vector<std::size_t> first = balanced_partition(weight, K);
            Plan p;
            p.devices = n, p.dp = dp, p.pp = pp, p.micro_batches = M, p.batch_per_replica = b;
            p.schedule = cand.schedule, p.predictor = cand.predictor, p.first_layer = first;
            p.global_batch = B;
            CostModel m;
            m.cores = c.cores_per_replica;
            m.link = c.pipeline_link;
            m.source = "plan";
            for (int k = 0; k < K; ++k) {
              const std::size_t f = first[static_cast<std::size_t>(k)];
              const std::size_t l =
                  k + 1 < K ? first[static_cast<std::size_t>(k) + 1] : r.layers.size();
              StageCost sc = stage_cost(r.layers, f, l, rows, c.device, b);
              const double ar = ring_allreduce_seconds(sc.weight_bytes, dp, c.allreduce_link);
              p.allreduce_seconds = std::max(p.allreduce_seconds, ar);
              sc.step += ar;
              m.stages.push_back(sc);
            }
            // zb-auto is fitted to these stages' costs; the others ignore them.
            const SplitBackwardCosts split = m.split_backward_costs();
            auto make = [&](int N) { return make_schedule(cand.schedule, K, M, N, split); };
            Schedule s1, s2;
            try {
              s1 = make(2);
              s2 = make(r.simulated_mini_batches);
            } catch (const ConfigError&) {
              continue;  // e.g. 2BW with M < K
            }
            const StalenessAnalysis a = analyze_staleness(s2);
            for (int k = 0; k < K; ++k)
              m.stages[static_cast<std::size_t>(k)].weight_copies =
                  predictor_copies(cand.predictor, a, k);
            const SimResult r1 = simulate(s1, m), r2 = simulate(s2, m);
            p.step_seconds = (r2.seconds - r1.seconds) / (r.simulated_mini_batches - 2);
            p.peak_memory_bytes = *std::max_element(r2.worker_peak_memory_bytes.begin(),
                                                    r2.worker_peak_memory_bytes.end());
            // Idle share of a steady-state step per device: the busy time the extra
            // mini-batches added to its stages.
            const std::vector<int> device = stage_workers(s2);
            std::vector<double> busy(static_cast<std::size_t>(pp), 0);
            for (int k = 0; k < K; ++k)
              busy[static_cast<std::size_t>(device[static_cast<std::size_t>(k)])] +=
                  r2.busy[k] - r1.busy[k];
            double idle = 0;
            for (double d : busy)
              idle += 1 - d / (r.simulated_mini_batches - 2) / std::max(p.step_seconds, 1e-300);
            p.bubble = std::max(0.0, idle / pp);
            out.smallest_memory_needed = std::min(out.smallest_memory_needed, p.peak_memory_bytes);
            if (p.peak_memory_bytes > c.device.memory_bytes) {
              ++out.dropped_memory;
              continue;
            }
            p.epochs = r.efficiency.epochs(B) * cand.factor;
            p.steps = p.epochs * r.dataset_samples / B;
            p.time_to_accuracy = p.steps * p.step_seconds;
            p.cost = n * c.price_per_hour * p.time_to_accuracy / 3600.0;
            detail::apply_transient(p, c, model_bytes);
            if (!std::isfinite(p.expected_seconds)) {
              ++out.dropped_revocations;
              continue;
            }
            out.plans.push_back(p);
          }
        }
      }
    }
  }
  if (out.plans.empty()) {
    if (out.dropped_memory > 0)
      throw ConfigError("xpipe: plan: no plan fits in memory: the smallest needs " +
                        std::to_string(out.smallest_memory_needed / 1048576.0) +
                        " MiB per device, cluster.device.memory_bytes gives " +
                        std::to_string(c.device.memory_bytes / 1048576.0) + " MiB");
    throw ConfigError("xpipe: plan: no plan to rank (" + std::to_string(out.dropped_no_efficiency) +
                      " global batches outside efficiency.points, " +
                      std::to_string(out.dropped_revocations) +
                      " plans never finish between revocations)");
  }
  // Fastest first, then cheapest; at equal time and cost (compared in single precision, so that
  // the simulation's rounding does not decide a tie) the plan needing less memory first.
  const auto rank = [](const Plan& p) {
    return std::tuple{static_cast<float>(p.expected_seconds), static_cast<float>(p.expected_cost),
                      p.peak_memory_bytes};
  };
  std::stable_sort(out.plans.begin(), out.plans.end(),
                   [&](const Plan& a, const Plan& b) { return rank(a) < rank(b); });
  return out;
}

//! The plans no other plan beats in both expected time and expected cost, fastest first.
inline std::vector<Plan> pareto_front(const std::vector<Plan>& plans) {
  std::vector<Plan> sorted = plans, front;
  std::stable_sort(sorted.begin(), sorted.end(), [](const Plan& a, const Plan& b) {
    return a.expected_seconds != b.expected_seconds ? a.expected_seconds < b.expected_seconds
                                                    : a.expected_cost < b.expected_cost;
  });
  double cheapest = std::numeric_limits<double>::infinity();
  for (const Plan& p : sorted)
    if (p.expected_cost < cheapest) {
      front.push_back(p);
      cheapest = p.expected_cost;
    }
  return front;
}

}  // namespace xpipe::sim
