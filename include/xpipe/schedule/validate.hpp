// Schedule validation: rejects duplicated or missing actions, a backward before its forward, a
// misplaced step, queues that would deliver out of order, and deadlock (through the dry run),
// with messages naming the stage and the action.
#pragma once

#include <string>
#include <vector>

#include "xpipe/schedule/dry_run.hpp"
#include "xpipe/schedule/ir.hpp"

namespace xpipe {

//! Checks a schedule; throws ConfigError with a message naming the stage and action at fault:
//! a wrong number of stage lists, an action out of range, a duplicated or missing action, a
//! backward before its forward, a step before a backward of its mini-batch or out of order,
//! a forward order differing from the previous stage's (or a backward order from the next
//! stage's: activations and gradients travel through FIFO queues), and deadlock.
inline void validate(const Schedule& s) {
  const int K = s.stages, M = s.micro_batches, N = s.mini_batches;
  const std::string where = "xpipe: schedule '" + s.name + "': ";
  if (K < 1 || M < 1 || N < 1)
    throw ConfigError(where + "stages, micro_batches and mini_batches must be >= 1");
  if (static_cast<int>(s.actions.size()) != K)
    throw ConfigError(where + "has " + std::to_string(s.actions.size()) + " stage lists for " +
                      std::to_string(K) + " stages");
  const int total = M * N;
  std::vector<std::vector<int>> forward_order(K), backward_order(K);
  for (int k = 0; k < K; ++k) {
    forward_order[k].reserve(static_cast<std::size_t>(total));
    backward_order[k].reserve(static_cast<std::size_t>(total));
    const auto& list = s.actions[k];
    std::vector<long> f_pos(total, -1), b_pos(total, -1), s_pos(N, -1);
    int last_step = -1;
    for (std::size_t p = 0; p < list.size(); ++p) {
      const Action& a = list[p];
      const bool on_micro = info(a.kind).on_micro_batch;
      const int limit = on_micro ? total : N;
      if (a.index < 0 || a.index >= limit)
        throw ConfigError(where + detail::at(k, a, p) + " is out of range (" +
                          (on_micro ? "micro-batches" : "mini-batches") + " 0.." +
                          std::to_string(limit - 1) + ")");
      auto& pos = a.kind == ActionKind::Forward    ? f_pos
                  : a.kind == ActionKind::Backward ? b_pos
                                                   : s_pos;
      if (pos[a.index] >= 0)
        throw ConfigError(where + detail::at(k, a, p) + " duplicates the same action at position " +
                          std::to_string(pos[a.index]));
      pos[a.index] = static_cast<long>(p);
      if (a.kind == ActionKind::Forward) forward_order[k].push_back(a.index);
      if (a.kind == ActionKind::Backward) {
        if (f_pos[a.index] < 0)
          throw ConfigError(where + detail::at(k, a, p) + " comes before its forward F" +
                            std::to_string(a.index));
        const int t = s.mini_batch_of(a.index);
        if (t > 0 && s_pos[t - 1] < 0)
          throw ConfigError(where + detail::at(k, a, p) + " of mini-batch " + std::to_string(t) +
                            " comes before S" + std::to_string(t - 1) +
                            " (its gradient would enter the previous mini-batch's step)");
        backward_order[k].push_back(a.index);
      }
      if (a.kind == ActionKind::Step) {
        if (a.index != last_step + 1)
          throw ConfigError(where + detail::at(k, a, p) + " is out of order (after S" +
                            std::to_string(last_step) + "; steps must run S0, S1, ...)");
        last_step = a.index;
        for (int j = 0; j < M; ++j)
          if (b_pos[a.index * M + j] < 0)
            throw ConfigError(where + detail::at(k, a, p) + " comes before B" +
                              std::to_string(a.index * M + j) + " of its mini-batch");
      }
    }
    for (int g = 0; g < total; ++g) {
      if (f_pos[g] < 0)
        throw ConfigError(where + "stage " + std::to_string(k) + ": missing F" + std::to_string(g));
      if (b_pos[g] < 0)
        throw ConfigError(where + "stage " + std::to_string(k) + ": missing B" + std::to_string(g));
    }
    for (int t = 0; t < N; ++t)
      if (s_pos[t] < 0)
        throw ConfigError(where + "stage " + std::to_string(k) + ": missing S" + std::to_string(t));
  }
  for (int k = 0; k + 1 < K; ++k) {
    for (int i = 0; i < total; ++i) {
      if (forward_order[k][i] != forward_order[k + 1][i])
        throw ConfigError(where + "stage " + std::to_string(k + 1) + " runs F" +
                          std::to_string(forward_order[k + 1][i]) + " as its forward number " +
                          std::to_string(i) + ", but stage " + std::to_string(k) + " sends F" +
                          std::to_string(forward_order[k][i]) +
                          " then (activations travel in order)");
      if (backward_order[k][i] != backward_order[k + 1][i])
        throw ConfigError(where + "stage " + std::to_string(k) + " runs B" +
                          std::to_string(backward_order[k][i]) + " as its backward number " +
                          std::to_string(i) + ", but stage " + std::to_string(k + 1) + " sends B" +
                          std::to_string(backward_order[k + 1][i]) +
                          " then (gradients travel in order)");
    }
  }
  dry_run(s);  // throws on deadlock
}

}  // namespace xpipe
