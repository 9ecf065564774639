// The dry run every analysis shares: each stage runs its list in order, as soon as the action
// its input comes from (schedule/dependencies.hpp) has ended, with a cost per action. Unit
// costs give the staleness analysis its clock; a measured cost model gives the simulator's.
#pragma once

#include <algorithm>
#include <array>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "xpipe/schedule/dependencies.hpp"
#include "xpipe/schedule/ir.hpp"
#include "xpipe/schedule/structure.hpp"
#include "xpipe/schedule/timing.hpp"

namespace xpipe {

//! Duration of one action on one stage (the simulator's cost model plugs in here).
using ActionCost = std::function<double(int stage, const Action&)>;

//! Unit cost: forward and backward take 1, each half of a split backward 1/2 (so splitting a
//! backward does not change the clock), a step 0 (it follows its backward at once).
inline double unit_cost(int, const Action& a) {
  if (!info(a.kind).on_micro_batch) return 0.0;
  return a.kind == ActionKind::InputGrad || a.kind == ActionKind::WeightGrad ? 0.5 : 1.0;
}

//! What a dry run enforces beside the links between stages.
struct DryRunRules {
  //! Global gradient-norm clipping (PipelineOptions::clip_norm): the step of mini-batch t also
  //! waits until every stage has run its gradient actions (B or W) of t.
  bool steps_wait_for_every_stage = false;
};

namespace detail {
// The dry run proper, on a schedule whose structure was checked (check_structure).
inline ExecutionTrace dry_run_checked(const Schedule& s, const ActionCost& cost,
                                      DryRunRules rules = {}) {
  const int K = s.stages, total = s.total_micro_batches();
  ExecutionTrace tl = ExecutionTrace::sized_for(s);
  // sent_at[travel][k][g]: when stage k's message of micro-batch g travelling that way was
  // ready (its F, or its B or I), -1 while it has not run. Keyed by direction, not kind: a
  // stage may receive the gradient of a whole B from its neighbour and send on that of an I.
  std::array<std::vector<std::vector<double>>, 3> sent_at;
  for (auto& by_stage : sent_at)
    by_stage.assign(static_cast<std::size_t>(K),
                    std::vector<double>(static_cast<std::size_t>(total), -1));
  auto sent_slot = [&](int k, const Action& a) -> double& {
    return sent_at[static_cast<std::size_t>(info(a.kind).travel)][static_cast<std::size_t>(k)]
                  [static_cast<std::size_t>(a.index)];
  };
  // Each worker runs its actions in its order, one at a time (a worker of one stage: that
  // stage's list).
  const std::vector<std::vector<WorkerStep>> steps = worker_steps(s);
  const int P = s.workers();
  std::vector<std::size_t> next(static_cast<std::size_t>(P), 0);
  std::vector<double> free_at(static_cast<std::size_t>(P), 0);
  // When the input of stage k's action a is available; false while its producer has not run.
  auto input_ready = [&](int k, const Action& a, double& ready) -> bool {
    const int from = producer_stage(K, k, a);
    ready = from < 0 ? 0.0 : sent_slot(from, a);
    return ready >= 0;
  };
  // Under rules.steps_wait_for_every_stage: per mini-batch, the gradient actions still to run
  // on any stage, and when the last that ran ended.
  const bool global_steps = rules.steps_wait_for_every_stage;
  std::vector<int> grads_left(global_steps ? static_cast<std::size_t>(s.mini_batches) : 0, 0);
  std::vector<double> grads_end(grads_left.size(), 0.0);
  const auto mini_batch_of = [&](const Action& a) {
    return static_cast<std::size_t>(a.index / s.micro_batches);
  };
  if (global_steps)
    for (const auto& list : s.actions)
      for (const Action& a : list)
        if (info(a.kind).adds_gradient) ++grads_left[mini_batch_of(a)];
  // A step waiting for another stage's gradient (global steps only).
  const auto step_waits = [&](const Action& a) {
    return global_steps && info(a.kind).applies_gradient &&
           grads_left[static_cast<std::size_t>(a.index)] > 0;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int w = 0; w < P; ++w) {
      const auto& mine = steps[static_cast<std::size_t>(w)];
      double ready = 0;
      while (next[w] < mine.size()) {
        const auto [k, p] = mine[next[w]];
        const Action& a = s.actions[static_cast<std::size_t>(k)][p];
        if (!input_ready(k, a, ready) || step_waits(a)) break;
        if (global_steps && info(a.kind).applies_gradient)
          ready = std::max(ready, grads_end[static_cast<std::size_t>(a.index)]);
        const double t0 = std::max(free_at[w], ready), t1 = t0 + cost(k, a);
        tl.stages[k][p] = {a, t0, t1};
        free_at[w] = t1;
        tl.seconds = std::max(tl.seconds, t1);
        if (info(a.kind).travel != Travel::None) sent_slot(k, a) = t1;
        if (global_steps && info(a.kind).adds_gradient) {
          --grads_left[mini_batch_of(a)];
          grads_end[mini_batch_of(a)] = std::max(grads_end[mini_batch_of(a)], t1);
        }
        ++next[w];
        progress = true;
      }
    }
  }
  std::string stuck;
  for (int w = 0; w < P; ++w) {
    const auto& mine = steps[static_cast<std::size_t>(w)];
    if (next[w] == mine.size()) continue;
    const auto [k, p] = mine[next[w]];
    const Action& a = s.actions[static_cast<std::size_t>(k)][p];
    stuck +=
        std::string("; ") + (s.has_virtual_stages() ? "worker " + std::to_string(w) + ", " : "") +
        detail::at(k, a, p) + " waits for " +
        (step_waits(a) ? "every stage's gradient of mini-batch " + std::to_string(a.index)
                       : to_string(a) + " of stage " + std::to_string(producer_stage(K, k, a)));
  }
  if (!stuck.empty()) throw ConfigError("xpipe: schedule '" + s.name + "' deadlocks" + stuck);
  return tl;
}

}  // namespace detail

//! As-soon-as-possible dry run: each worker runs its actions in order (one worker per stage, or
//! the schedule's worker_order), one at a time; an action waits for what its
//! producer stage sends (F(k, g) for F(k-1, g); B(k, g) or I(k, g) for the B or I of g at k+1).
//! Returns every action's start and end (the trace's `seconds` is the makespan). Throws ConfigError
//! on deadlock, naming what each stuck stage waits for, and on a schedule that fails
//! check_structure() (it checks first, so any Schedule value is safe to pass). `rules` adds
//! global clipping's wait of each step for every stage's gradient.
inline ExecutionTrace dry_run(const Schedule& s, const ActionCost& cost = unit_cost,
                              DryRunRules rules = {}) {
  check_structure(s);
  return detail::dry_run_checked(s, cost, rules);
}

//! Why global gradient-norm clipping (PipelineOptions::clip_norm) cannot run schedule `s`: each
//! step waits for every stage's gradient of its mini-batch, and a worker that steps one of its
//! stages before another's last gradient of that mini-batch waits forever. "" when it can run;
//! else the deadlock the dry run names (worker, stage, action and position). Pipeline::train
//! refuses such a schedule with it; a tool can ask before it loads any data.
inline std::string clipping_problem(const Schedule& s) {
  try {
    dry_run(s, unit_cost, DryRunRules{.steps_wait_for_every_stage = true});
  } catch (const ConfigError& e) {
    const std::string_view why = e.what(), prefix = "xpipe: ";
    return "each step waits for every stage's gradient, and " +
           std::string(why.starts_with(prefix) ? why.substr(prefix.size()) : why);
  }
  return "";
}

//! Seconds per mini-batch in the steady state of a schedule that repeats one mini-batch's order:
//! the dry run of three mini-batches less that of two, so the fill and the drain cancel.
//! `make(N)` builds the schedule for N mini-batches.
//! Usage: `steady_state_period([](int N) { return zb_h2(4, 8, N); }, cost)`.
template <class Make>
double steady_state_period(const Make& make, const ActionCost& cost = unit_cost) {
  return dry_run(make(3), cost).seconds - dry_run(make(2), cost).seconds;
}

//! Fraction of the run that worker w of `s` spent not computing: 1 - the time its stages' actions
//! took / the run's. For a schedule of one stage per worker, trace.bubble_fraction(w).
inline double worker_bubble_fraction(const ExecutionTrace& trace, const Schedule& s, int w) {
  check_structure(s);
  const std::vector<int> owner = stage_workers(s);
  double busy = 0;
  for (int k = 0; k < s.stages; ++k)
    if (owner[static_cast<std::size_t>(k)] == w)
      for (const ActionTiming& t : trace.stages[static_cast<std::size_t>(k)])
        busy += t.end - t.start;
  return trace.seconds > 0 ? 1.0 - busy / trace.seconds : 0.0;
}

}  // namespace xpipe
