// The structural check of a schedule: its shape within bounds, one list per stage, and in each
// list every action in range, none repeated and none missing. The dry run needs exactly this
// before it indexes anything; validate() adds the ordering rules on top.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "xpipe/core/error.hpp"
#include "xpipe/schedule/ir.hpp"

namespace xpipe {

namespace detail {
inline std::string at(int k, const Action& a, std::size_t pos) {
  return "stage " + std::to_string(k) + ": " + to_string(a) + " (position " + std::to_string(pos) +
         ")";
}

//! Where each action sits in one stage's list (-1: absent), per kind. Reused across stages, so
//! checking a schedule allocates for one stage at a time.
struct ActionPositions {
  std::array<std::vector<std::int64_t>, action_kinds.size()> of_kind;
  std::vector<std::int64_t>& of(ActionKind kind) { return of_kind[static_cast<std::size_t>(kind)]; }
  std::int64_t at(ActionKind kind, int index) const {
    return of_kind[static_cast<std::size_t>(kind)][static_cast<std::size_t>(index)];
  }
  //! Where micro-batch g's input gradient is sent (its B or I), and where its parameter gradient
  //! is added (its B or W): each exists exactly once once the structure is checked.
  std::int64_t gradient_sent(int g) const {
    return std::max(at(ActionKind::Backward, g), at(ActionKind::InputGrad, g));
  }
  std::int64_t gradient_added(int g) const {
    return std::max(at(ActionKind::Backward, g), at(ActionKind::WeightGrad, g));
  }
};

//! Records stage k's positions; throws ConfigError on an action out of range, a repeated one or
//! a missing one (named as missing, before any ordering rule could blame a later action). Every
//! micro-batch needs its F and either its B or both halves I and W, never both forms.
inline void locate_stage_actions(const Schedule& s, int k, ActionPositions& pos) {
  const int total = s.total_micro_batches(), N = s.mini_batches;
  const std::string where = "xpipe: schedule '" + s.name + "': ";
  const auto& list = s.actions[static_cast<std::size_t>(k)];
  for (const ActionKindInfo& i : action_kinds)
    pos.of(i.kind).assign(static_cast<std::size_t>(i.on_micro_batch ? total : N), -1);
  for (std::size_t p = 0; p < list.size(); ++p) {
    const Action& a = list[p];
    const bool on_micro = info(a.kind).on_micro_batch;
    const int limit = on_micro ? total : N;
    if (a.index < 0 || a.index >= limit)
      throw ConfigError(where + at(k, a, p) + " is out of range (" +
                        (on_micro ? "micro-batches" : "mini-batches") + " 0.." +
                        std::to_string(limit - 1) + ")");
    std::int64_t& slot = pos.of(a.kind)[static_cast<std::size_t>(a.index)];
    if (slot >= 0)
      throw ConfigError(where + at(k, a, p) + " duplicates the same action at position " +
                        std::to_string(slot));
    slot = static_cast<std::int64_t>(p);
  }
  const std::string stage = "stage " + std::to_string(k) + ": ";
  for (int g = 0; g < total; ++g) {
    const std::int64_t b = pos.at(ActionKind::Backward, g), i = pos.at(ActionKind::InputGrad, g),
                       w = pos.at(ActionKind::WeightGrad, g);
    const std::string G = std::to_string(g);
    if (pos.at(ActionKind::Forward, g) < 0)
      throw ConfigError(where + stage + "F" + G + " is missing");
    if (b >= 0 && (i >= 0 || w >= 0)) {
      const Action half = i >= 0 ? input_grad(g) : weight_grad(g);
      throw ConfigError(where + at(k, half, static_cast<std::size_t>(i >= 0 ? i : w)) +
                        " splits the backward that B" + G + " (position " + std::to_string(b) +
                        ") already runs whole");
    }
    if (b < 0 && i < 0 && w < 0)
      throw ConfigError(where + stage + "B" + G + " is missing (nor are its halves I" + G +
                        " and W" + G + " there)");
    if (i >= 0 && w < 0)
      throw ConfigError(where + at(k, input_grad(g), static_cast<std::size_t>(i)) + " has no W" +
                        G + " (a split backward needs both halves)");
    if (w >= 0 && i < 0)
      throw ConfigError(where + at(k, weight_grad(g), static_cast<std::size_t>(w)) + " has no I" +
                        G + " (a split backward needs both halves)");
  }
  for (int t = 0; t < N; ++t)
    if (pos.at(ActionKind::Step, t) < 0)
      throw ConfigError(where + stage + "S" + std::to_string(t) + " is missing");
}
}  // namespace detail

//! Throws ConfigError unless the schedule's shape is within bounds (check_schedule_shape), it has
//! one list per stage, each list holds every F of its micro-batches, their B or both halves
//! I and W, and every S of its mini-batches, each exactly once, and, with a worker_order, every
//! stage belongs to exactly one worker, which lists it once per action of the stage. Safe on any
//! Schedule value, however malformed.
inline void check_structure(const Schedule& s) {
  check_schedule_shape("schedule '" + s.name + "'", s.stages, s.micro_batches, s.mini_batches);
  const std::string where = "xpipe: schedule '" + s.name + "': ";
  if (static_cast<int>(s.actions.size()) != s.stages)
    throw ConfigError(where + "has " + std::to_string(s.actions.size()) + " stage lists for " +
                      std::to_string(s.stages) + " stages");
  detail::ActionPositions pos;
  for (int k = 0; k < s.stages; ++k) detail::locate_stage_actions(s, k, pos);
  if (s.worker_order.empty()) return;
  if (s.worker_order.size() > static_cast<std::size_t>(s.stages))
    throw ConfigError(where + "has " + std::to_string(s.worker_order.size()) + " workers for " +
                      std::to_string(s.stages) + " stages (each worker runs at least one stage)");
  std::vector<int> owner(static_cast<std::size_t>(s.stages), -1);
  std::vector<std::size_t> listed(static_cast<std::size_t>(s.stages), 0);
  for (std::size_t w = 0; w < s.worker_order.size(); ++w)
    for (std::size_t i = 0; i < s.worker_order[w].size(); ++i) {
      const int k = s.worker_order[w][i];
      if (k < 0 || k >= s.stages)
        throw ConfigError(where + "worker " + std::to_string(w) + ", action " + std::to_string(i) +
                          ": stage " + std::to_string(k) + " is out of range (stages 0.." +
                          std::to_string(s.stages - 1) + ")");
      int& o = owner[static_cast<std::size_t>(k)];
      if (o >= 0 && o != static_cast<int>(w))
        throw ConfigError(where + "stage " + std::to_string(k) + " is run by workers " +
                          std::to_string(o) + " and " + std::to_string(w) +
                          " (a stage belongs to one worker)");
      o = static_cast<int>(w);
      ++listed[static_cast<std::size_t>(k)];
    }
  for (int k = 0; k < s.stages; ++k) {
    const std::size_t n = s.actions[static_cast<std::size_t>(k)].size();
    if (owner[static_cast<std::size_t>(k)] < 0)
      throw ConfigError(where + "no worker runs stage " + std::to_string(k) +
                        " (the worker lists leave it out)");
    if (listed[static_cast<std::size_t>(k)] != n)
      throw ConfigError(where + "worker " + std::to_string(owner[static_cast<std::size_t>(k)]) +
                        " runs " + std::to_string(listed[static_cast<std::size_t>(k)]) +
                        " actions of stage " + std::to_string(k) + ", which has " +
                        std::to_string(n));
  }
  for (std::size_t w = 0; w < s.worker_order.size(); ++w)
    if (s.worker_order[w].empty())
      throw ConfigError(where + "worker " + std::to_string(w) + " runs no stage");
}

//! One action as a worker runs it: its stage and its position in that stage's list.
struct WorkerStep {
  int stage = 0;
  std::size_t position = 0;
};

//! Each worker's actions in the order it runs them (worker k = stage k without a worker_order).
//! The schedule must have its structure (check_structure).
inline std::vector<std::vector<WorkerStep>> worker_steps(const Schedule& s) {
  std::vector<std::vector<WorkerStep>> out(static_cast<std::size_t>(s.workers()));
  if (s.worker_order.empty()) {
    for (int k = 0; k < s.stages; ++k) {
      auto& mine = out[static_cast<std::size_t>(k)];
      mine.reserve(s.actions[static_cast<std::size_t>(k)].size());  // one allocation per run
      for (std::size_t p = 0; p < s.actions[static_cast<std::size_t>(k)].size(); ++p)
        mine.push_back({k, p});
    }
    return out;
  }
  std::vector<std::size_t> next(static_cast<std::size_t>(s.stages), 0);
  for (std::size_t w = 0; w < s.worker_order.size(); ++w) {
    out[w].reserve(s.worker_order[w].size());
    for (int k : s.worker_order[w]) out[w].push_back({k, next[static_cast<std::size_t>(k)]++});
  }
  return out;
}

//! Each worker's peak of what its stages' slots hold at once, walking its actions in the order it
//! runs them: an action that takes a slot on stage k adds `per_slot(k)`, one that frees it gives
//! that back afterwards. With `per_slot` returning 1 it is the most micro-batches a worker holds;
//! with a stage's bytes per slot, its peak activation memory. Structure checked.
//! Usage: `std::vector<int> most = worker_slot_peaks(s, [](int) { return 1; });`
template <class PerSlot>
auto worker_slot_peaks(const Schedule& s, PerSlot per_slot) {
  using Amount = decltype(per_slot(0));
  std::vector<Amount> out;
  out.reserve(static_cast<std::size_t>(s.workers()));
  for (const auto& steps : worker_steps(s)) {
    Amount live{}, most{};
    for (const WorkerStep& w : steps) {
      const ActionKindInfo& kind =
          info(s.actions[static_cast<std::size_t>(w.stage)][w.position].kind);
      if (kind.takes_slot) most = std::max(most, live += per_slot(w.stage));
      if (kind.frees_slot) live -= per_slot(w.stage);
    }
    out.push_back(most);
  }
  return out;
}

//! The worker that runs each stage (stage k's own without a worker_order). Structure checked.
inline std::vector<int> stage_workers(const Schedule& s) {
  std::vector<int> out(static_cast<std::size_t>(s.stages));
  for (int k = 0; k < s.stages; ++k) out[static_cast<std::size_t>(k)] = k;
  for (std::size_t w = 0; w < s.worker_order.size(); ++w)
    for (int k : s.worker_order[w]) out[static_cast<std::size_t>(k)] = static_cast<int>(w);
  return out;
}

}  // namespace xpipe
