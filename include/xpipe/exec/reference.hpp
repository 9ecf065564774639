// The reference executor: every stage's list on the calling thread, in a topological order.
// The oracle the other executors are checked against, bit for bit.
#pragma once

#include <exception>
#include <string>
#include <vector>

#include "xpipe/backend/host.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/exec/executor.hpp"
#include "xpipe/schedule/structure.hpp"

namespace xpipe {

//! Runs every action on the calling thread: repeatedly, the next action of the lowest-numbered
//! worker that is ready (a worker per stage, or the schedule's workers, each in its order).
//! Whatever an action throws reaches the caller as a StageError naming the stage and action. Usage:
//! `ReferenceExecutor{}.run(program)`.
class ReferenceExecutor {
 public:
  static constexpr const char* name = "reference";

  template <Program P>
  void run(P& program) {
    const Schedule& s = program.schedule();
    ScopedFlushDenormals ftz;
    trace_ = ExecutionTrace::sized_for(s);
    const auto t0 = std::chrono::steady_clock::now();
    // Each worker's actions in its order (one worker per stage, or the schedule's workers), from a
    // schedule whose structure holds (any Program may hand one in).
    check_structure(s);
    const std::vector<std::vector<WorkerStep>> steps = worker_steps(s);
    std::vector<std::size_t> next(steps.size(), 0);
    for (bool progress = true; progress;) {
      progress = false;
      for (std::size_t w = 0; w < steps.size(); ++w) {
        while (next[w] < steps[w].size()) {
          const auto [k, p] = steps[w][next[w]];
          const Action& a = s.actions[static_cast<std::size_t>(k)][p];
          if (!program.ready(k, a)) break;
          const double start = detail::seconds_since(t0);
          try {
            program.execute(k, a);
          } catch (const StageError&) {
            throw;
          } catch (const std::exception& e) {
            throw StageError(k, to_string(a), e.what());
          } catch (...) {
            throw StageError(k, to_string(a), "non-standard exception");
          }
          trace_.stages[k][p] = {a, start, detail::seconds_since(t0)};
          ++next[w];
          progress = true;
        }
      }
    }
    trace_.seconds = detail::seconds_since(t0);
    for (std::size_t w = 0; w < steps.size(); ++w)
      if (next[w] < steps[w].size()) {
        const auto [k, p] = steps[w][next[w]];
        throw StageError(k, to_string(s.actions[static_cast<std::size_t>(k)][p]),
                         "no stage can make progress (the schedule deadlocks with these queue "
                         "capacities)");
      }
  }

  const ExecutionTrace& trace() const { return trace_; }

 private:
  ExecutionTrace trace_;
};

static_assert(Executor<ReferenceExecutor>);

}  // namespace xpipe
