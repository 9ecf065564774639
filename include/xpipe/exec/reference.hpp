// The reference executor: every stage's list on the calling thread, in a topological order.
// The oracle the other executors are checked against, bit for bit.
#pragma once

#include <exception>
#include <string>
#include <vector>

#include "xpipe/backend/host.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/exec/executor.hpp"

namespace xpipe {

//! Runs every action on the calling thread: repeatedly, the next action of the lowest-numbered
//! stage that is ready. Whatever an action throws reaches the caller as a StageError naming the
//! stage and action. Usage: `ReferenceExecutor{}.run(program)`.
class ReferenceExecutor {
 public:
  static constexpr const char* name = "reference";

  template <Program P>
  void run(P& program) {
    const Schedule& s = program.schedule();
    ScopedFlushDenormals ftz;
    trace_ = ExecutionTrace::sized_for(s);
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::size_t> next(static_cast<std::size_t>(s.stages), 0);
    for (bool progress = true; progress;) {
      progress = false;
      for (int k = 0; k < s.stages; ++k) {
        const auto& list = s.actions[k];
        while (next[k] < list.size() && program.ready(k, list[next[k]])) {
          const Action& a = list[next[k]];
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
          trace_.stages[k][next[k]] = {a, start, detail::seconds_since(t0)};
          ++next[k];
          progress = true;
        }
      }
    }
    trace_.seconds = detail::seconds_since(t0);
    for (int k = 0; k < s.stages; ++k)
      if (next[k] < s.actions[k].size())
        throw StageError(k, to_string(s.actions[k][next[k]]),
                         "no stage can make progress (the schedule deadlocks with these queue "
                         "capacities)");
  }

  const ExecutionTrace& trace() const { return trace_; }

 private:
  ExecutionTrace trace_;
};

static_assert(Executor<ReferenceExecutor>);

}  // namespace xpipe
