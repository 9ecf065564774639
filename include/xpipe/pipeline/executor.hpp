// Executors: run a schedule's per-stage action lists over a Program that knows how to execute
// one action. The reference executor runs everything on the calling thread in a topological
// order; the threaded executor runs one thread per stage. Both run each stage's list in its
// order, so they compute the same bits.
#pragma once

#include <atomic>
#include <chrono>
#include <concepts>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "xpipe/backend/host.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/schedule/ir.hpp"

namespace xpipe {

//! Program: what an executor drives. `ready(k, a)` says whether stage k can run action a now
//! without waiting (inputs arrived, room for its outputs); `execute(k, a)` runs it. Both are
//! called only from the thread that runs stage k.
template <class P>
concept Program = requires(P& p, int k, const Action& a) {
  { p.schedule() } -> std::convertible_to<const Schedule&>;
  { p.ready(k, a) } -> std::convertible_to<bool>;
  p.execute(k, a);
};

//! Start and end of one executed action, in seconds since the run began.
struct ActionTiming {
  Action action;
  double start = 0, end = 0;
};

//! Per-stage timings of one run, in each stage's order (pre-sized: recording never allocates).
struct ExecutionTrace {
  std::vector<std::vector<ActionTiming>> stages;
  double seconds = 0;

  //! Fraction of the run stage k spent not computing.
  double bubble_fraction(int k) const {
    double busy = 0;
    for (const auto& t : stages[k]) busy += t.end - t.start;
    return seconds > 0 ? 1.0 - busy / seconds : 0.0;
  }
};

namespace detail {
inline ExecutionTrace sized_trace(const Schedule& s) {
  ExecutionTrace t;
  t.stages.resize(static_cast<std::size_t>(s.stages));
  for (int k = 0; k < s.stages; ++k) t.stages[k].resize(s.actions[k].size());
  return t;
}
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace detail

//! Runs every action on the calling thread: repeatedly, the next action of the lowest-numbered
//! stage that is ready. Usage: `ReferenceExecutor{}.run(program)`.
class ReferenceExecutor {
 public:
  static constexpr const char* name = "reference";

  template <Program P>
  void run(P& program) {
    const Schedule& s = program.schedule();
    ScopedFlushDenormals ftz;
    trace_ = detail::sized_trace(s);
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

//! One thread per stage, each running its own list; waits spin briefly, then yield, and give up
//! when another stage failed or after `wait_timeout`. An exception in any stage stops all of
//! them and is rethrown to the caller as a StageError naming the stage and action.
class ThreadedExecutor {
 public:
  static constexpr const char* name = "threaded";
  std::chrono::duration<double> wait_timeout = std::chrono::seconds(60);

  template <Program P>
  void run(P& program) {
    const Schedule& s = program.schedule();
    trace_ = detail::sized_trace(s);
    stop_.store(false);
    error_ = nullptr;
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    threads.reserve(static_cast<std::size_t>(s.stages));
    for (int k = 0; k < s.stages; ++k)
      threads.emplace_back([this, &program, &s, k, t0] { stage_loop(program, s, k, t0); });
    for (auto& t : threads) t.join();
    trace_.seconds = detail::seconds_since(t0);
    if (error_) std::rethrow_exception(error_);
  }

  const ExecutionTrace& trace() const { return trace_; }

 private:
  template <class P>
  void stage_loop(P& program, const Schedule& s, int k,
                  std::chrono::steady_clock::time_point t0) {
    ScopedFlushDenormals ftz;
    const auto& list = s.actions[k];
    std::size_t i = 0;
    try {
      for (; i < list.size(); ++i) {
        const Action& a = list[i];
        if (!wait_ready(program, k, a)) return;  // another stage failed
        const double start = detail::seconds_since(t0);
        program.execute(k, a);
        trace_.stages[k][i] = {a, start, detail::seconds_since(t0)};
      }
    } catch (const StageError&) {
      fail(std::current_exception());
    } catch (const std::exception& e) {
      fail(std::make_exception_ptr(StageError(k, to_string(list[i]), e.what())));
    }
  }

  template <class P>
  bool wait_ready(P& program, int k, const Action& a) {
    for (unsigned spins = 0;; ++spins) {
      if (stop_.load(std::memory_order_relaxed)) return false;
      if (program.ready(k, a)) return true;
      // A short spin (PAUSE is ~60 cycles on recent cores): long spins starve the producer
      // when stage threads outnumber cores.
      if (spins < 32) {
#if defined(__SSE2__)
        _mm_pause();
#endif
        continue;
      }
      // Past the spin budget: give the core away (stages may outnumber cores) and check time.
      std::this_thread::yield();
      if ((spins & 1023u) == 0) {
        const auto now = std::chrono::steady_clock::now();
        if (spins == 1024) wait_start_ = now;
        if (now - wait_start_ > wait_timeout)
          throw StageError(k, to_string(a),
                           "waited more than " + std::to_string(wait_timeout.count()) +
                               " s for its input or for room to send its output");
      }
    }
  }

  void fail(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_) error_ = e;
    stop_.store(true);
  }

  ExecutionTrace trace_;
  std::atomic<bool> stop_{false};
  std::mutex mutex_;  // taken only when a stage fails
  std::exception_ptr error_;
  static thread_local inline std::chrono::steady_clock::time_point wait_start_{};
};

}  // namespace xpipe
