// Schedule validation: rejects duplicated or missing actions, a backward before its forward, a
// misplaced step, queues that would deliver out of order, and deadlock (through the dry run),
// with messages naming the stage and the action.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "xpipe/schedule/dry_run.hpp"
#include "xpipe/schedule/ir.hpp"
#include "xpipe/schedule/structure.hpp"

namespace xpipe {

//! Checks a schedule; throws ConfigError with a message naming the stage and action at fault:
//! first its structure (check_structure: shape, one list per stage, every action in range, none
//! repeated, none missing, a backward whole or in both halves), then the order within each stage
//! (a B or I before its F, a W before its I, a B or W of mini-batch t before step t-1, steps out
//! of order or before a B or W of their mini-batch), then the order between stages (a forward order
//! differing from the previous stage's, or a backward order from the next stage's: activations and
//! gradients travel through FIFO queues), and last deadlock (the dry run). Returns that unit-cost
//! dry run's trace, so a caller that needs it (the staleness analysis) does not run it again.
inline ExecutionTrace validate(const Schedule& s) {
  check_structure(s);
  const int K = s.stages, M = s.micro_batches, total = s.total_micro_batches();
  const std::string where = "xpipe: schedule '" + s.name + "': ";
  // What each stage sends, in order: its forwards downstream, its input gradients (B or I) up.
  std::vector<std::vector<Action>> forward_order(static_cast<std::size_t>(K)),
      backward_order(static_cast<std::size_t>(K));
  detail::ActionPositions pos;
  for (int k = 0; k < K; ++k) {
    const auto& list = s.actions[static_cast<std::size_t>(k)];
    detail::locate_stage_actions(s, k, pos);  // complete: every position below is known
    forward_order[k].reserve(static_cast<std::size_t>(total));
    backward_order[k].reserve(static_cast<std::size_t>(total));
    for (std::size_t p = 0; p < list.size(); ++p) {
      const Action& a = list[p];
      const ActionKindInfo& kind = info(a.kind);
      const auto here = static_cast<std::int64_t>(p);
      if (has_prerequisite(a.kind) && pos.at(kind.needs, a.index) > here)
        throw ConfigError(where + detail::at(k, a, p) + " comes before its " +
                          info(kind.needs).name + " " + to_string({kind.needs, a.index}));
      if (kind.travel == Travel::Down) forward_order[k].push_back(a);
      if (kind.sends_gradient) backward_order[k].push_back(a);
      if (kind.adds_gradient) {
        const int t = s.mini_batch_of(a.index);
        if (t > 0 && pos.at(ActionKind::Step, t - 1) > here)
          throw ConfigError(where + detail::at(k, a, p) + " of mini-batch " + std::to_string(t) +
                            " comes before S" + std::to_string(t - 1) +
                            " (its gradient would enter the previous mini-batch's step)");
      }
      if (a.kind == ActionKind::Step) {
        if (a.index > 0 && pos.at(ActionKind::Step, a.index - 1) > here)
          throw ConfigError(where + detail::at(k, a, p) + " is out of order (before S" +
                            std::to_string(a.index - 1) + "; steps must run S0, S1, ...)");
        for (int j = 0; j < M; ++j) {
          const int g = a.index * M + j;
          if (pos.gradient_added(g) > here)
            throw ConfigError(where + detail::at(k, a, p) + " comes before " +
                              (pos.at(ActionKind::Backward, g) >= 0 ? "B" : "W") +
                              std::to_string(g) + " of its mini-batch");
        }
      }
    }
  }
  for (int k = 0; k + 1 < K; ++k) {
    for (int i = 0; i < total; ++i) {
      if (forward_order[k][i].index != forward_order[k + 1][i].index)
        throw ConfigError(where + "stage " + std::to_string(k + 1) + " runs " +
                          to_string(forward_order[k + 1][i]) + " as its forward number " +
                          std::to_string(i) + ", but stage " + std::to_string(k) + " sends " +
                          to_string(forward_order[k][i]) + " then (activations travel in order)");
      if (backward_order[k][i].index != backward_order[k + 1][i].index)
        throw ConfigError(where + "stage " + std::to_string(k) + " runs " +
                          to_string(backward_order[k][i]) + " as its backward number " +
                          std::to_string(i) + ", but stage " + std::to_string(k + 1) + " sends " +
                          to_string(backward_order[k + 1][i]) +
                          " then (gradients travel in order)");
    }
  }
  return detail::dry_run_checked(s, unit_cost);  // throws on deadlock; structure checked above
}

}  // namespace xpipe
