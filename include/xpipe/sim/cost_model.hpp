// The simulator's cost model: what each stage's forward, backward and step take, what a message
// between stages costs, what a stage holds in memory, and how many cores the stage threads share.
// Filled from measurements (tools/xpipe_plan.cpp profiles the host backend) or from an analytic
// description of devices and links we do not have (a roofline per layer).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "xpipe/core/error.hpp"
#include "xpipe/schedule/generators.hpp"
#include "xpipe/schedule/ir.hpp"

namespace xpipe::sim {

//! What one stage costs, at the micro-batch size the schedule runs.
struct StageCost {
  double forward = 0, backward = 0, step = 0;  // seconds per action
  // The halves of a split backward (I and W); both 0: half the backward each.
  double input_grad = 0, weight_grad = 0;
  double out_bytes = 0;            // activations it sends downstream per micro-batch
  double in_bytes = 0;             // gradient of its input it sends upstream per micro-batch
  double weight_bytes = 0;         // one copy of its weights
  double state_bytes = 0;          // gradient and optimizer moments (one copy each)
  double activation_bytes = 0;     // what one micro-batch in flight keeps for its backward
  double kept_gradient_bytes = 0;  // and in addition between the halves of a split backward
  double workspace_bytes = 0;      // what its layers need only during a call, once per stage
  int weight_copies = 1;           // weight buffers its predictor holds (live weights included)
};

//! A link between two neighbouring stages: a message of b bytes arrives latency + b / bandwidth
//! after it is sent. bandwidth 0 means the copy is already inside the actions (the in-process
//! ring: the producer copies into the slot, the consumer out of it).
struct LinkCost {
  double latency = 0;    // seconds
  double bandwidth = 0;  // bytes per second; 0: no transfer term
  double seconds(double bytes) const { return latency + (bandwidth > 0 ? bytes / bandwidth : 0.0); }
};

//! One measured message size of a link: its bytes and the seconds one message took.
struct LinkSample {
  double bytes = 0, seconds = 0;
};

//! latency + bytes / bandwidth fitted to measured messages by least squares in relative error,
//! so that every size counts alike from one float to megabytes: minimises
//! sum_i ((a + c bytes_i) / seconds_i - 1)^2 over a = latency >= 0 and c = 1 / bandwidth (a
//! negative latency is refitted as a line through the origin). Throws ConfigError naming the
//! samples when they hold fewer than two sizes, a time <= 0, or give no positive bandwidth (a
//! link that gets faster with size has no such model).
//! Usage: `LinkCost l = fit_link_cost({{4, 2e-7}, {1 << 20, 1.3e-4}});`
inline LinkCost fit_link_cost(const std::vector<LinkSample>& samples) {
  auto listed = [&] {
    std::string t;
    for (const LinkSample& q : samples)
      t += " (" + std::to_string(q.bytes) + " B, " + std::to_string(q.seconds) + " s)";
    return t;
  };
  double s11 = 0, s12 = 0, s22 = 0, r1 = 0, r2 = 0;
  for (const LinkSample& q : samples) {
    if (!(q.seconds > 0) || !(q.bytes >= 0))
      throw ConfigError("xpipe: fit_link_cost: a sample has seconds <= 0 or bytes < 0:" + listed());
    const double u = 1 / q.seconds, v = q.bytes / q.seconds;  // row [u v] . [a c] ~ 1
    s11 += u * u, s12 += u * v, s22 += v * v, r1 += u, r2 += v;
  }
  const double det = s11 * s22 - s12 * s12;
  if (samples.size() < 2 || !(det > 1e-12 * s11 * s22))
    throw ConfigError("xpipe: fit_link_cost: needs at least two message sizes:" + listed());
  double a = (r1 * s22 - r2 * s12) / det, c = (s11 * r2 - s12 * r1) / det;
  if (a < 0) a = 0, c = r2 / s22;
  if (!(c > 0)) throw ConfigError("xpipe: fit_link_cost: no positive bandwidth fits:" + listed());
  return {a, 1 / c};
}

//! How the stages pinned to one core share it (CostModel::sharing).
enum class CoreSharing {
  processor,          //!< each of the n actions running there at 1 / n of the core
  run_to_completion,  //!< one at a time, to its end; the others wait, first ready first
  //! One at a time; an action that becomes ready preempts the one running, which resumes when
  //! the core is free again (newest first). What Linux's wakeup preemption does: a thread that
  //! slept on a queue wakes ahead of the one that kept the core busy.
  newest_first,
};

//! The whole pipeline's costs. `cores`: compute units the stage threads share (0: one each;
//! fractional on a shared machine, where the stage threads get only part of it); when more
//! actions run than there are cores, each runs at cores / running of its speed (processor
//! sharing: what a fair OS scheduler gives busy threads). On a shared machine what n busy
//! threads get need not be n / running of a fixed number: `cores_with[n - 1]`, where given,
//! is the compute n running actions get together (measured), the last entry for larger n.
//! `core_of`, where given (one entry per stage), pins stage k to core `core_of[k]` instead:
//! each core is shared only by the running actions of its own stages, each at 1 / running (what
//! `ThreadedExecutor::cpus` does; an OS that places threads itself does not balance them as
//! evenly as one shared pool would, and pinning makes that placement known). `core_speed[c]`,
//! where given, is the share of core c this process gets (1: the whole core; less when other
//! processes run there), and each action on core c then runs at core_speed[c] / running.
//! `sharing` (with `core_of`) may replace that processor sharing by what Linux does with actions
//! shorter than its time slice (CoreSharing). The work per core is the same, and the time per
//! mini-batch changes little; each action's start and end, and each worker's idle time, do.
//! Usage:
//! `CostModel m; m.stages = {{.forward = 1e-3, .backward = 2e-3}}; m.cores = 2;`
struct CostModel {
  std::vector<StageCost> stages;
  std::vector<LinkCost> links;  // one per boundary b (stage b to b + 1); empty: `link` for all
  LinkCost link;
  double cores = 0;
  std::vector<double> cores_with;
  std::vector<int> core_of;
  std::vector<double> core_speed;
  CoreSharing sharing = CoreSharing::processor;  // with core_of only
  std::string source = "unspecified";            // where the numbers come from, for reports

  int stage_count() const { return static_cast<int>(stages.size()); }
  const LinkCost& link_at(int boundary) const {
    return links.empty() ? link : links.at(static_cast<std::size_t>(boundary));
  }
  //! The speed (1 = a whole core) of each of n actions running at once.
  double speed(int n) const {
    if (n <= 0) return 1.0;
    if (!cores_with.empty()) {
      const std::size_t i = std::min(static_cast<std::size_t>(n), cores_with.size()) - 1;
      const double total = static_cast<std::size_t>(n) <= cores_with.size()
                               ? cores_with[i]
                               : cores_with.back();  // no more compute for more threads
      return std::min(1.0, total / n);
    }
    return cores > 0 ? std::min(1.0, cores / n) : 1.0;
  }
  //! Seconds stage k's action `a` computes for (transfers aside).
  double seconds(int k, const Action& a) const {
    const StageCost& c = stages.at(static_cast<std::size_t>(k));
    const bool halves = c.input_grad > 0 || c.weight_grad > 0;
    // Indexed by ActionKind, in the kind table's order (a new kind must say its cost here).
    static_assert(action_kinds.size() == 5, "xpipe: CostModel::seconds: give the new kind a cost");
    const std::array<double, action_kinds.size()> by_kind{c.forward, c.backward, c.step,
                                                          halves ? c.input_grad : c.backward / 2,
                                                          halves ? c.weight_grad : c.backward / 2};
    return by_kind[static_cast<std::size_t>(a.kind)];
  }
  //! Each stage's forward, input-gradient and weight-gradient seconds as seconds() charges them
  //! (transfers aside): what zb_auto fits a schedule to.
  SplitBackwardCosts split_backward_costs() const {
    SplitBackwardCosts c;
    for (int k = 0; k < stage_count(); ++k) {
      c.forward.push_back(seconds(k, fwd(0)));
      c.input_grad.push_back(seconds(k, input_grad(0)));
      c.weight_grad.push_back(seconds(k, weight_grad(0)));
    }
    return c;
  }
  //! Bytes of the message stage k's action `a` sends (activations down, gradients up).
  double message_bytes(int k, const Action& a) const {
    const StageCost& c = stages.at(static_cast<std::size_t>(k));
    const Travel t = info(a.kind).travel;
    return t == Travel::Down ? c.out_bytes : t == Travel::Up ? c.in_bytes : 0;
  }

  //! Throws ConfigError naming the stage and field of a negative or non-finite number.
  void check() const {
    auto bad = [](double v) { return !std::isfinite(v) || v < 0; };
    for (std::size_t k = 0; k < stages.size(); ++k) {
      const StageCost& c = stages[k];
      const std::pair<const char*, double> fields[] = {
          {"forward", c.forward},
          {"backward", c.backward},
          {"step", c.step},
          {"input_grad", c.input_grad},
          {"weight_grad", c.weight_grad},
          {"out_bytes", c.out_bytes},
          {"in_bytes", c.in_bytes},
          {"weight_bytes", c.weight_bytes},
          {"state_bytes", c.state_bytes},
          {"activation_bytes", c.activation_bytes},
          {"kept_gradient_bytes", c.kept_gradient_bytes},
          {"workspace_bytes", c.workspace_bytes}};
      for (const auto& [name, v] : fields)
        if (bad(v))
          throw ConfigError("xpipe: cost model: stage " + std::to_string(k) + ": " + name +
                            " must be a finite number >= 0 (got " + std::to_string(v) + ")");
      if (c.weight_copies < 1)
        throw ConfigError("xpipe: cost model: stage " + std::to_string(k) +
                          ": weight_copies must be >= 1");
    }
    auto check_link = [&](const LinkCost& l, const std::string& where) {
      if (bad(l.latency) || bad(l.bandwidth))
        throw ConfigError("xpipe: cost model: " + where +
                          ": latency and bandwidth must be finite numbers >= 0");
    };
    check_link(link, "link");
    for (std::size_t b = 0; b < links.size(); ++b)
      check_link(links[b], "links[" + std::to_string(b) + "]");
    if (!links.empty() && links.size() + 1 != stages.size())
      throw ConfigError("xpipe: cost model: links must have one entry per stage boundary (" +
                        std::to_string(stages.size() - 1) + "), got " +
                        std::to_string(links.size()));
    if (bad(cores)) throw ConfigError("xpipe: cost model: cores must be a finite number >= 0");
    for (double c : cores_with)
      if (bad(c) || c <= 0)
        throw ConfigError("xpipe: cost model: cores_with entries must be finite numbers > 0");
    if (!core_of.empty() && static_cast<int>(core_of.size()) != stage_count())
      throw ConfigError("xpipe: cost model: core_of needs one core per stage (" +
                        std::to_string(stage_count()) + "), got " + std::to_string(core_of.size()));
    if (sharing != CoreSharing::processor && core_of.empty())
      throw ConfigError(
          "xpipe: cost model: a core sharing other than processor sharing needs core_of (which "
          "stage runs on which core)");
    for (int c : core_of) {
      if (c < 0) throw ConfigError("xpipe: cost model: core_of entries must be >= 0");
      if (!core_speed.empty() && c >= static_cast<int>(core_speed.size()))
        throw ConfigError("xpipe: cost model: core_of names core " + std::to_string(c) +
                          ", core_speed has " + std::to_string(core_speed.size()) + " entries");
    }
    for (double v : core_speed)
      if (!(v > 0) || !std::isfinite(v))
        throw ConfigError("xpipe: cost model: core_speed entries must be finite numbers > 0");
  }
};

// ---- Analytic costs: devices we do not have -------------------------------------------------

//! A compute device described by its peak rate, memory bandwidth and memory. `efficiency`: the
//! fraction of peak its GEMMs reach (measured on a device we have, assumed on one we do not).
struct DeviceSpec {
  std::string name = "device";
  double peak_flops = 0;        // FLOP/s
  double memory_bandwidth = 0;  // bytes/s
  double memory_bytes = 0;
  double efficiency = 1;
};

//! One layer of a model. Its time comes either from measurement (`*_fixed` + rows x
//! `*_per_sample`, fitted from runs at two micro-batch sizes) or, when those are all zero, from a
//! roofline on a DeviceSpec: max(FLOPs / (peak x efficiency), bytes moved / bandwidth).
struct LayerSpec {
  std::string name;
  double params = 0;                   // weights and biases
  double in_width = 0, out_width = 0;  // floats per sample in and out
  double activation_floats = 0;        // per sample, kept for the backward
  // Per sample of a batch, held once per stage (Stage::Workspace): its own buffers, summed over a
  // stage's layers, and its share of the stage's arena, of which a stage holds the largest.
  double workspace_floats = 0, arena_floats = 0;
  double forward_flops = 0, backward_flops = 0;        // per sample
  double forward_fixed = 0, forward_per_sample = 0;    // measured, seconds
  double backward_fixed = 0, backward_per_sample = 0;  // measured, seconds
  double step_seconds = 0;                             // measured optimizer step
  bool measured() const {
    return forward_fixed + forward_per_sample + backward_fixed + backward_per_sample > 0;
  }
};

//! Bytes per parameter the optimizer step reads and writes (Adam: w, g, m, v read; w, m, v
//! written: 7 floats).
inline constexpr double adam_step_bytes_per_param = 28;
//! Floats per parameter besides one weight copy: the gradient and Adam's two moments.
inline constexpr double adam_state_floats_per_param = 3;

namespace detail {
inline double roofline(double flops, double bytes, const DeviceSpec& d) {
  if (d.peak_flops <= 0 || d.memory_bandwidth <= 0)
    throw ConfigError("xpipe: device '" + d.name +
                      "': peak_flops and memory_bandwidth must be > 0 for an analytic cost");
  return std::max(flops / (d.peak_flops * std::max(d.efficiency, 1e-9)),
                  bytes / d.memory_bandwidth);
}
}  // namespace detail

//! Forward, backward and step seconds of layer `l` on `rows` samples (measured when it was,
//! else the roofline on `d`).
struct LayerTimes {
  double forward = 0, backward = 0, step = 0;
};
inline LayerTimes layer_times(const LayerSpec& l, double rows, const DeviceSpec& d) {
  if (l.measured())
    return {l.forward_fixed + rows * l.forward_per_sample,
            l.backward_fixed + rows * l.backward_per_sample, l.step_seconds};
  const double w = 4 * l.params, io = 4 * rows * (l.in_width + l.out_width);
  return {detail::roofline(rows * l.forward_flops, w + io, d),
          detail::roofline(rows * l.backward_flops, 2 * w + 2 * io, d),
          detail::roofline(0, adam_step_bytes_per_param * l.params, d)};
}

//! The StageCost of layers [first, last) of `layers` at `rows` samples per micro-batch, its
//! workspace sized for `batch` samples (a whole mini-batch, as a stage makes it; 0: rows).
//! Usage: `stage_cost(layers, 0, 2, 32, device, 128)`.
inline StageCost stage_cost(const std::vector<LayerSpec>& layers, std::size_t first,
                            std::size_t last, double rows, const DeviceSpec& d, double batch = 0) {
  if (first >= last || last > layers.size())
    throw ConfigError("xpipe: stage_cost: empty or out-of-range layer range");
  StageCost c;
  double params = 0, workspace = 0, arena = 0;
  for (std::size_t i = first; i < last; ++i) {
    const LayerTimes t = layer_times(layers[i], rows, d);
    c.forward += t.forward;
    c.backward += t.backward;
    c.step += t.step;
    params += layers[i].params;
    c.activation_bytes += 4 * rows * layers[i].activation_floats;
    // A split backward keeps the output gradient of each layer with parameters until its W.
    if (layers[i].params > 0) c.kept_gradient_bytes += 4 * rows * layers[i].out_width;
    workspace += layers[i].workspace_floats;
    arena = std::max(arena, layers[i].arena_floats);
  }
  c.workspace_bytes = 4 * (batch > 0 ? batch : rows) * (workspace + arena);
  c.out_bytes = 4 * rows * layers[last - 1].out_width;
  c.in_bytes = 4 * rows * layers[first].in_width;
  c.weight_bytes = 4 * params;
  c.state_bytes = 4 * adam_state_floats_per_param * params;
  return c;
}

}  // namespace xpipe::sim
