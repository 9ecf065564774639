// Discrete-event simulation of a schedule IR under a cost model: each stage runs its list in
// order, as the executors do; an action starts when its input message has arrived (the one
// dependency rule, schedule/dependencies.hpp) and its output queue has room (the queue
// capacities the Pipeline gives its links), and stage threads share the machine's cores. The
// result is the same ExecutionTrace a measured run records, so the trace writers draw both.
// Also: bubble filling (DiffusionPipe), packing non-trainable work into each stage's idle time.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <deque>
#include <limits>
#include <string>
#include <vector>

#include "xpipe/schedule/dependencies.hpp"
#include "xpipe/schedule/ir.hpp"
#include "xpipe/schedule/staleness.hpp"
#include "xpipe/schedule/timing.hpp"
#include "xpipe/sim/cost_model.hpp"

namespace xpipe::sim {

//! Queue capacities per boundary (messages each direction holds); empty: what a Pipeline gives
//! its links, the micro-batches stage b holds in flight at most (analyze_staleness).
struct SimOptions {
  std::vector<int> capacity;
};

//! What a simulated run yields.
struct SimResult {
  ExecutionTrace trace;             // every action's start and end; trace.seconds = makespan
  std::vector<double> busy;         // per stage: seconds computing
  std::vector<int> peak_in_flight;  // per stage: micro-batches forwarded, gradient not added
  // Per stage: weights x copies + state + workspace + activations.
  std::vector<double> peak_memory_bytes;
  // Per worker (a device): its stages' weights x copies, state and workspaces, and the most
  // activation bytes
  // its stages hold at once, walked in the order it runs them; = peak_memory_bytes with one
  // stage per worker.
  std::vector<double> worker_peak_memory_bytes;
  double seconds = 0;         // makespan
  double per_mini_batch = 0;  // makespan / mini-batches
  double bubble_fraction(int k) const { return trace.bubble_fraction(k); }
};

namespace detail {
struct SimMessage {
  int index;       // micro-batch
  double arrival;  // when the consumer may pop it
};
}  // namespace detail

//! Simulates `s` under `cost`. Throws ConfigError on a schedule that fails validation, a cost
//! model with the wrong stage count or a bad number, and on a deadlock under the capacities
//! (naming what each stuck stage waits for). Usage: `auto r = simulate(gpipe(4, 4, 1), model);`
inline SimResult simulate(const Schedule& s, const CostModel& cost, const SimOptions& opt = {}) {
  const StalenessAnalysis analysis = analyze_staleness(s);  // validates the schedule
  const int K = s.stages;
  if (cost.stage_count() != K)
    throw ConfigError("xpipe: simulate: the cost model has " + std::to_string(cost.stage_count()) +
                      " stages, schedule '" + s.name + "' has " + std::to_string(K));
  cost.check();
  std::vector<int> capacity = opt.capacity;
  if (capacity.empty())
    for (int b = 0; b + 1 < K; ++b) capacity.push_back(std::max(1, analysis.max_in_flight[b]));
  if (static_cast<int>(capacity.size()) != std::max(0, K - 1))
    throw ConfigError("xpipe: simulate: capacity needs one entry per stage boundary (" +
                      std::to_string(K - 1) + ")");
  for (int c : capacity)
    if (c < 1) throw ConfigError("xpipe: simulate: every queue capacity must be >= 1");

  SimResult r;
  r.trace = ExecutionTrace::sized_for(s);
  r.busy.assign(K, 0);
  r.peak_in_flight.assign(K, 0);
  // Queues: [flow][boundary], messages pushed and not yet popped, in FIFO order.
  std::vector<std::deque<detail::SimMessage>> queues[2];
  queues[0].resize(static_cast<std::size_t>(std::max(0, K - 1)));
  queues[1].resize(static_cast<std::size_t>(std::max(0, K - 1)));
  auto queue = [&](Channel c) -> std::deque<detail::SimMessage>& {
    return queues[c.flow == Flow::Activations ? 0 : 1][static_cast<std::size_t>(c.boundary)];
  };
  std::vector<std::size_t> next(K, 0);
  std::vector<bool> running(K, false);
  std::vector<double> remaining(K, 0), rate(K, 1.0);
  std::vector<int> in_flight(K, 0);
  // A worker runs one action at a time, in its order: stage k's next action may start only when
  // it is its worker's next step and that worker is idle (always so with a worker per stage).
  const std::vector<std::vector<WorkerStep>> steps = worker_steps(s);
  const std::vector<int> owner = stage_workers(s);
  std::vector<std::size_t> worker_next(steps.size(), 0);
  std::vector<bool> worker_busy(steps.size(), false);
  auto workers_turn = [&](int k) {
    const std::size_t w = static_cast<std::size_t>(owner[static_cast<std::size_t>(k)]);
    return !worker_busy[w] && worker_next[w] < steps[w].size() &&
           steps[w][worker_next[w]].stage == k;
  };
  std::size_t total = 0, done = 0;
  for (const auto& l : s.actions) total += l.size();
  double now = 0;
  // Under run_to_completion: since when each stage's next action has been ready to start (-1:
  // not yet), which orders the wait for a busy core. Under newest_first: when each running
  // action started (a count), the newest running on its core.
  const bool one_per_core = cost.sharing == CoreSharing::run_to_completion;
  const bool newest_first = cost.sharing == CoreSharing::newest_first;
  std::vector<long> started_as(K, 0);
  long starts = 0;
  std::vector<double> ready_since(K, -1);
  std::vector<int> startable;
  startable.reserve(static_cast<std::size_t>(K));
  auto core_taken = [&](int k) {
    for (int j = 0; j < K; ++j)
      if (running[j] && cost.core_of[j] == cost.core_of[k]) return true;
    return false;
  };

  auto can_start = [&](int k, const Action& a) {
    const ActionChannels io = channels_of(K, k, a);
    if (io.in.exists()) {
      const auto& q = queue(io.in);
      if (q.empty() || q.front().index != a.index || q.front().arrival > now) return false;
    }
    if (io.out.exists() && static_cast<int>(queue(io.out).size()) >=
                               capacity[static_cast<std::size_t>(io.out.boundary)])
      return false;
    return true;
  };

  while (done < total) {
    // Start every action that can start now; a forward pops its input as it starts (the
    // consumer copies the message out first thing), which may free room for its producer.
    // Starting an action never stops another from starting (it pops, never pushes), so the
    // stages that can start are found first; under run_to_completion they then take their
    // cores in the order they became ready.
    for (bool started = true; started;) {
      started = false;
      startable.clear();
      for (int k = 0; k < K; ++k)
        if (!running[k] && next[k] < s.actions[k].size() && workers_turn(k) &&
            can_start(k, s.actions[k][next[k]]))
          startable.push_back(k);
      if (one_per_core) {
        for (int k : startable)
          if (ready_since[k] < 0) ready_since[k] = now;
        std::stable_sort(startable.begin(), startable.end(),
                         [&](int i, int j) { return ready_since[i] < ready_since[j]; });
      }
      // Newest first: of those ready at once, the lower stage is the newer (it runs first, as
      // under run_to_completion).
      if (newest_first) std::reverse(startable.begin(), startable.end());
      for (int k : startable) {
        if (one_per_core) {
          if (core_taken(k)) continue;
          ready_since[k] = -1;
        }
        const Action& a = s.actions[k][next[k]];
        running[k] = true;
        started_as[k] = ++starts;
        worker_busy[static_cast<std::size_t>(owner[static_cast<std::size_t>(k)])] = true;
        remaining[k] = cost.seconds(k, a);
        r.trace.stages[k][next[k]].start = now;
        if (info(a.kind).travel == Travel::Down) {
          const Channel in = channels_of(K, k, a).in;
          if (in.exists()) queue(in).pop_front();
        }
        if (info(a.kind).takes_slot)
          r.peak_in_flight[k] = std::max(r.peak_in_flight[k], ++in_flight[k]);
        started = true;
      }
    }
    const int n = static_cast<int>(std::count(running.begin(), running.end(), true));
    double arrival = std::numeric_limits<double>::infinity();
    for (const auto& side : queues)
      for (const auto& q : side)
        if (!q.empty() && q.front().arrival > now) arrival = std::min(arrival, q.front().arrival);
    if (n == 0) {
      if (arrival == std::numeric_limits<double>::infinity()) {
        std::string stuck;
        for (int k = 0; k < K; ++k) {
          if (next[k] >= s.actions[k].size() || !workers_turn(k)) continue;
          const Action& a = s.actions[k][next[k]];
          const ActionChannels io = channels_of(K, k, a);
          const bool input =
              !io.in.exists() || (!queue(io.in).empty() && queue(io.in).front().index == a.index);
          stuck +=
              "; stage " + std::to_string(k) + ": " + to_string(a) +
              (input
                   ? " waits for room in its output queue (capacity " +
                         std::to_string(capacity[static_cast<std::size_t>(io.out.boundary)]) + ")"
                   : " waits for its input from stage " + std::to_string(producer_stage(K, k, a)));
        }
        throw ConfigError("xpipe: simulate: schedule '" + s.name + "' deadlocks" + stuck);
      }
      now = arrival;
      continue;
    }
    // Processor sharing: with more actions running than cores, each gets cores / n; with the
    // stages pinned, each running action gets its core's speed / (the actions running there).
    for (int k = 0; k < K; ++k) {
      if (!running[k]) continue;
      if (cost.core_of.empty()) {
        rate[k] = cost.speed(n);
        continue;
      }
      const int core = cost.core_of[k];
      int sharing = 0;
      bool newest = true;  // (newest_first: only the newest on its core runs; the others wait)
      for (int j = 0; j < K; ++j)
        if (running[j] && cost.core_of[j] == core) {
          ++sharing;
          newest = newest && started_as[j] <= started_as[k];
        }
      const double speed =
          cost.core_speed.empty() ? 1.0 : cost.core_speed[static_cast<std::size_t>(core)];
      rate[k] = newest_first ? (newest ? speed : 0.0) : speed / sharing;
    }
    double finish = std::numeric_limits<double>::infinity();
    for (int k = 0; k < K; ++k)
      if (running[k] && rate[k] > 0) finish = std::min(finish, now + remaining[k] / rate[k]);
    const double until = std::min(finish, arrival);
    for (int k = 0; k < K; ++k)
      if (running[k]) remaining[k] -= (until - now) * rate[k];
    now = until;
    if (until < finish) continue;  // a message arrived first
    for (int k = 0; k < K; ++k) {
      // Done: this action ends now (a tolerance for the subtraction's rounding).
      if (!running[k] || remaining[k] > 1e-12 * std::max(1.0, now)) continue;
      const Action a = s.actions[k][next[k]];
      ActionTiming& t = r.trace.stages[k][next[k]];
      t.end = std::max(now, t.start);
      r.busy[k] += t.end - t.start;
      const ActionChannels io = channels_of(K, k, a);
      if (io.out.exists())
        queue(io.out).push_back(
            {a.index, now + cost.link_at(io.out.boundary).seconds(cost.message_bytes(k, a))});
      // A backward (or its I) pops its input (the gradient) only once it is done with it; the
      // slot stays in flight until the parameter gradient is added (B or W).
      if (info(a.kind).travel == Travel::Up && io.in.exists()) queue(io.in).pop_front();
      if (info(a.kind).frees_slot) --in_flight[k];
      running[k] = false;
      const std::size_t w = static_cast<std::size_t>(owner[static_cast<std::size_t>(k)]);
      worker_busy[w] = false;
      ++worker_next[w];
      ++next[k];
      ++done;
    }
  }
  r.seconds = r.trace.seconds = now;
  r.per_mini_batch = now / s.mini_batches;
  const bool split = s.splits_backward();
  std::vector<double> per_slot(static_cast<std::size_t>(K));
  for (int k = 0; k < K; ++k) {
    const StageCost& c = cost.stages[static_cast<std::size_t>(k)];
    per_slot[static_cast<std::size_t>(k)] =
        c.activation_bytes + (split ? c.kept_gradient_bytes : 0);
  }
  // A worker holds its stages' weights, state and workspaces throughout, and its slots as its
  // order has them.
  r.worker_peak_memory_bytes =
      worker_slot_peaks(s, [&](int k) { return per_slot[static_cast<std::size_t>(k)]; });
  for (int k = 0; k < K; ++k) {
    const StageCost& c = cost.stages[static_cast<std::size_t>(k)];
    const double fixed = c.weight_bytes * c.weight_copies + c.state_bytes + c.workspace_bytes;
    r.peak_memory_bytes.push_back(fixed +
                                  per_slot[static_cast<std::size_t>(k)] * r.peak_in_flight[k]);
    r.worker_peak_memory_bytes[static_cast<std::size_t>(owner[static_cast<std::size_t>(k)])] +=
        fixed;
  }
  return r;
}

// ---- Bubble filling (DiffusionPipe) -----------------------------------------------------------

//! Non-trainable work (a frozen encoder's forward, evaluation passes) of one stage's device:
//! `samples` samples at `seconds_per_sample` each, divisible along the batch down to one sample.
struct FillWork {
  double samples = 0;
  double seconds_per_sample = 0;
};

//! The result of packing: per stage, the samples placed inside idle periods, and the run's end
//! with the work filled in versus run outside the pipeline (after it, each device doing its own).
struct FillResult {
  std::vector<double> filled_samples;  // per stage
  std::vector<ActionTiming> pieces;    // unused Action; start/end of each piece, stage in index
  std::vector<int> piece_stage;
  double outside_seconds = 0;  // makespan + the longest stage's work, run after the pipeline
  double filled_seconds = 0;   // when the last stage's last piece (or the pipeline) ends
  double saved_seconds() const { return outside_seconds - filled_seconds; }
  double speedup() const { return filled_seconds > 0 ? outside_seconds / filled_seconds : 1.0; }
};

//! Greedily packs work[k] into stage k's idle periods of `trace`, earliest first: each gap takes
//! as many whole samples as fit (the work is split along the batch); what is left runs after
//! the pipeline. Throws ConfigError if work has the wrong stage count or a negative number.
inline FillResult fill_bubbles(const ExecutionTrace& trace, const std::vector<FillWork>& work) {
  const int K = static_cast<int>(trace.stages.size());
  if (static_cast<int>(work.size()) != K)
    throw ConfigError("xpipe: fill_bubbles: need one FillWork per stage (" + std::to_string(K) +
                      ")");
  FillResult r;
  r.filled_samples.assign(K, 0);
  double longest = 0;
  r.filled_seconds = trace.seconds;
  for (int k = 0; k < K; ++k) {
    const FillWork& w = work[static_cast<std::size_t>(k)];
    if (w.samples < 0 || w.seconds_per_sample < 0)
      throw ConfigError("xpipe: fill_bubbles: stage " + std::to_string(k) +
                        ": samples and seconds_per_sample must be >= 0");
    longest = std::max(longest, w.samples * w.seconds_per_sample);
    if (w.samples <= 0 || w.seconds_per_sample <= 0) continue;
    // Idle periods: before the first action, between actions, none after (the tail is "after").
    std::vector<std::pair<double, double>> gaps;
    double t = 0;
    for (const ActionTiming& a : trace.stages[static_cast<std::size_t>(k)]) {
      if (a.start > t) gaps.emplace_back(t, a.start);
      t = std::max(t, a.end);
    }
    if (trace.seconds > t) gaps.emplace_back(t, trace.seconds);
    double left = w.samples;
    for (const auto& [g0, g1] : gaps) {
      if (left <= 0) break;
      const double fit = std::min(left, std::floor((g1 - g0) / w.seconds_per_sample + 1e-9));
      if (fit < 1) continue;
      r.pieces.push_back({{}, g0, g0 + fit * w.seconds_per_sample});
      r.piece_stage.push_back(k);
      left -= fit;
      r.filled_samples[static_cast<std::size_t>(k)] += fit;
    }
    if (left > 0) {
      r.pieces.push_back({{}, trace.seconds, trace.seconds + left * w.seconds_per_sample});
      r.piece_stage.push_back(k);
      r.filled_seconds = std::max(r.filled_seconds, trace.seconds + left * w.seconds_per_sample);
    }
  }
  r.outside_seconds = trace.seconds + longest;
  return r;
}

}  // namespace xpipe::sim
