// The structural check of a schedule: its shape within bounds, one list per stage, and in each
// list every action in range, none repeated and none missing. The dry run needs exactly this
// before it indexes anything; validate() adds the ordering rules on top.
#pragma once

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

//! Where each action sits in one stage's list (-1: absent). Reused across stages, so checking a
//! schedule allocates for one stage at a time.
struct ActionPositions {
  std::vector<std::int64_t> forward, backward, step;
  std::vector<std::int64_t>& of(ActionKind kind) {
    return kind == ActionKind::Forward ? forward : kind == ActionKind::Backward ? backward : step;
  }
};

//! Records stage k's positions; throws ConfigError on an action out of range, a repeated one or
//! a missing one (named as missing, before any ordering rule could blame a later action).
inline void locate_stage_actions(const Schedule& s, int k, ActionPositions& pos) {
  const int total = s.total_micro_batches(), N = s.mini_batches;
  const std::string where = "xpipe: schedule '" + s.name + "': ";
  const auto& list = s.actions[static_cast<std::size_t>(k)];
  pos.forward.assign(static_cast<std::size_t>(total), -1);
  pos.backward.assign(static_cast<std::size_t>(total), -1);
  pos.step.assign(static_cast<std::size_t>(N), -1);
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
  for (const ActionKindInfo& i : action_kinds) {
    const auto& found = pos.of(i.kind);
    for (std::size_t g = 0; g < found.size(); ++g)
      if (found[g] < 0)
        throw ConfigError(where + "stage " + std::to_string(k) + ": " +
                          to_string({i.kind, static_cast<int>(g)}) + " is missing");
  }
}
}  // namespace detail

//! Throws ConfigError unless the schedule's shape is within bounds (check_schedule_shape), it has
//! one list per stage, and each list holds every F and B of its micro-batches and every S of its
//! mini-batches exactly once. Safe on any Schedule value, however malformed.
inline void check_structure(const Schedule& s) {
  check_schedule_shape("schedule '" + s.name + "'", s.stages, s.micro_batches, s.mini_batches);
  if (static_cast<int>(s.actions.size()) != s.stages)
    throw ConfigError("xpipe: schedule '" + s.name + "': has " + std::to_string(s.actions.size()) +
                      " stage lists for " + std::to_string(s.stages) + " stages");
  detail::ActionPositions pos;
  for (int k = 0; k < s.stages; ++k) detail::locate_stage_actions(s, k, pos);
}

}  // namespace xpipe
