// Staleness analysis: for every action, the weight version it reads and its version difference
// s under the two targets of docs/design.md, plus what each stage must hold (activations in flight,
// stashed weight versions, mini-batches in flight). Derived from the schedule, never assumed.
#pragma once

#include <algorithm>
#include <vector>

#include "xpipe/schedule/validate.hpp"

namespace xpipe {

//! Which version difference a predictor extrapolates over.
enum class StalenessTarget {
  //! s = optimizer steps the stage takes between the action and the step that consumes this
  //! micro-batch's gradient (PipeOptim, XPipe).
  ApplyTime,
  //! s = steps the stage takes between the action and the end of the micro-batch's backward at
  //! stage 0 (inclusive), on a unit-time dry run, not counting the step that consumes this
  //! micro-batch's own gradient (SpecTrain).
  RoundTrip,
};

//! What the analysis knows about one action that reads weights: a Forward, or a Backward or its
//! InputGrad half (a WeightGrad reads none).
struct ActionVersion {
  int version = 0;     // steps the stage has taken before the action: the weights it reads
  int apply_time = 0;  // s under StalenessTarget::ApplyTime
  int round_trip = 0;  // s under StalenessTarget::RoundTrip
  int s(StalenessTarget t) const {
    return t == StalenessTarget::ApplyTime ? apply_time : round_trip;
  }
};

//! Per-stage results of the analysis. Usage: `auto a = analyze_staleness(async_1f1b(4, 1, 8));
//! a.forward(k, g).apply_time`.
struct StalenessAnalysis {
  int stages = 0, micro_batches = 0;
  // [stage][micro-batch g]; backward_of: its B or I
  std::vector<std::vector<ActionVersion>> forward_of, backward_of;
  std::vector<int> max_in_flight;  // micro-batches forwarded, their parameter gradient not added
  // Per worker: the most micro-batches its stages hold at once (= max_in_flight with one stage
  // per worker; under virtual stages at most the sum over its stages, less where they peak apart).
  std::vector<int> worker_max_in_flight;
  std::vector<int> stash_versions;          // most versions alive at once: live + in-flight's
  std::vector<int> mini_batches_in_flight;  // mini-batches begun, not yet fully backwarded

  const ActionVersion& forward(int k, int g) const { return forward_of[k][g]; }
  const ActionVersion& backward(int k, int g) const { return backward_of[k][g]; }
  //! Stage k's delay: the largest s of its forwards under target t (0 when it has none).
  int max_forward_s(int k, StalenessTarget t = StalenessTarget::ApplyTime) const {
    int most = 0;
    for (const ActionVersion& v : forward_of[k]) most = std::max(most, v.s(t));
    return most;
  }
};

//! Validates the schedule, then derives versions and s for every action (see StalenessTarget).
inline StalenessAnalysis analyze_staleness(const Schedule& s) {
  const ExecutionTrace tl = validate(s);  // the unit-cost dry run
  const int K = s.stages, M = s.micro_batches, total = s.total_micro_batches();
  StalenessAnalysis r;
  r.stages = K;
  r.micro_batches = M;
  r.forward_of.assign(K, std::vector<ActionVersion>(total));
  r.backward_of.assign(K, std::vector<ActionVersion>(total));
  r.max_in_flight.assign(K, 0);
  r.stash_versions.assign(K, 1);
  r.mini_batches_in_flight.assign(K, 0);

  // End of each micro-batch's backward at stage 0: the round trip's finish line.
  std::vector<double> home(total, 0);
  for (std::size_t p = 0; p < s.actions[0].size(); ++p)
    if (info(s.actions[0][p].kind).sends_gradient) home[s.actions[0][p].index] = tl.at(0, p).end;

  for (int k = 0; k < K; ++k) {
    const auto& list = s.actions[k];
    // Time of each step of this stage, in order (steps are validated to run S0, S1, ...).
    std::vector<double> step_time;
    std::vector<std::size_t> step_pos;
    step_time.reserve(static_cast<std::size_t>(s.mini_batches));
    step_pos.reserve(static_cast<std::size_t>(s.mini_batches));
    for (std::size_t p = 0; p < list.size(); ++p)
      if (list[p].kind == ActionKind::Step) {
        step_time.push_back(tl.at(k, p).start);
        step_pos.push_back(p);
      }
    int version = 0;
    std::vector<int> fwd_version(total, -1);
    std::vector<int> first_forward_seen(s.mini_batches, 0), backwards_done(s.mini_batches, 0);
    int live = 0, live_mini = 0;
    // Versions alive: the live weights plus every older version a micro-batch in flight was
    // forwarded on (its backward must read it: what weight stashing holds). users[v] counts the
    // micro-batches in flight on version v; `old` the versions older than the live one that
    // still have users. Only a Step can raise the count (the version it replaces turns old
    // while its micro-batches are in flight), so it is taken at every Step; counting at
    // forwards instead misses the steps of a short epoch's drain, which no forward follows.
    std::vector<int> users(static_cast<std::size_t>(s.mini_batches) + 1, 0);
    int old = 0;
    for (std::size_t p = 0; p < list.size(); ++p) {
      const Action& a = list[p];
      if (a.kind == ActionKind::Step) {
        if (users[version] > 0) ++old;
        ++version;
        r.stash_versions[k] = std::max(r.stash_versions[k], old + 1);
        continue;
      }
      const int g = a.index, t = s.mini_batch_of(g);
      const ActionKindInfo& kind = info(a.kind);
      if (kind.reads_weights) {
        ActionVersion v;
        v.version = version;
        v.apply_time = t - version;  // S(t) is this stage's step number t
        // Steps after this action (in list order) taken by the time the round trip ends (a
        // step at that very instant counts), except S(t), the step that consumes this very
        // gradient (so synchronous schedules give 0). With unit-time F and B this reproduces
        // SpecTrain's published floor(k/2) + K - k - 1 (forward) and floor(k/2) (backward) for
        // async 1F1B.
        for (std::size_t i = static_cast<std::size_t>(version); i < step_time.size(); ++i)
          if (step_pos[i] > p && step_time[i] <= home[g] && static_cast<int>(i) != t)
            ++v.round_trip;
        (kind.travel == Travel::Down ? r.forward_of : r.backward_of)[k][g] = v;
      }
      if (kind.takes_slot) {
        fwd_version[g] = version;
        ++users[version];
        ++live;
        if (first_forward_seen[t]++ == 0) ++live_mini;
      }
      // The version the forward read is needed until the input gradient is computed (a weight
      // gradient reads no weights); the slot until the parameter gradient is added.
      if (kind.sends_gradient && --users[fwd_version[g]] == 0 && fwd_version[g] < version) --old;
      if (kind.frees_slot) {
        --live;
        if (++backwards_done[t] == M) --live_mini;
      }
      r.max_in_flight[k] = std::max(r.max_in_flight[k], live + kind.frees_slot);
      r.mini_batches_in_flight[k] = std::max(
          r.mini_batches_in_flight[k], live_mini + (kind.frees_slot && backwards_done[t] == M));
    }
  }
  // A worker's slots depend on its own order alone: counted as per stage, over the actions of all
  // its stages in the order it runs them.
  r.worker_max_in_flight = worker_slot_peaks(s, [](int) { return 1; });
  return r;
}

}  // namespace xpipe
