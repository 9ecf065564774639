// The threaded executor: one thread per stage, each running its own list, waiting on its links
// by spinning briefly and then yielding. The same bits as the reference executor.
#pragma once

#include <atomic>
#include <chrono>
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
#include "xpipe/exec/executor.hpp"

namespace xpipe {

//! One thread per stage, each running its own list; waits spin briefly, then yield, and give up
//! when another stage failed or after `wait_timeout`. An exception in any stage stops all of
//! them and is rethrown to the caller as a StageError naming the stage and action (a thrown
//! object that is not a std::exception becomes one saying "non-standard exception").
class ThreadedExecutor {
 public:
  static constexpr const char* name = "threaded";
  std::chrono::duration<double> wait_timeout = std::chrono::seconds(60);

  template <Program P>
  void run(P& program) {
    const Schedule& s = program.schedule();
    trace_ = ExecutionTrace::sized_for(s);
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
  void stage_loop(P& program, const Schedule& s, int k, std::chrono::steady_clock::time_point t0) {
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
    } catch (...) {
      // Anything else thrown (an int, a user type) must not escape the thread: that would
      // call std::terminate and take the whole process down.
      fail(std::make_exception_ptr(StageError(k, to_string(list[i]), "non-standard exception")));
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

static_assert(Executor<ThreadedExecutor>);

}  // namespace xpipe
