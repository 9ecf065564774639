// The threaded executor: one thread per worker (per stage, or the schedule's workers), each
// running its actions in order, waiting on its links by spinning briefly and then yielding. The
// same bits as the reference executor.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "xpipe/backend/host.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/exec/executor.hpp"
#include "xpipe/schedule/dependencies.hpp"
#include "xpipe/schedule/structure.hpp"

namespace xpipe {

//! One thread per worker: per stage, each running its own list, or per worker of a schedule with
//! virtual stages (Schedule::worker_order), each running its stages' actions in its order; the
//! cpus list then pins workers. Waits spin briefly, then yield, and give up
//! when another stage failed or after `wait_timeout` without progress. An exception in any
//! stage stops all of them and is rethrown to the caller as a StageError naming the stage and
//! action (a thrown object that is not a std::exception becomes one saying "non-standard
//! exception").
//!
//! A wait that gives up blames the stage it waits on: the producer of the action's input (for
//! F at stage k, stage k-1; for B, stage k+1), or, when the input is there but not the room for
//! the output, the consumer (the Program's optional `input_ready` tells them apart; without it
//! an action with an input blames its producer). If that stage is itself waiting, the blame
//! follows its wait on to the first stage that is not waiting. The StageError names that late
//! stage and the action it is at: "stage 2, action B12: stage 2 is late: stage 1 waited 60 s
//! for the input of its F17 (stage 2 is running B12, action 40 of 96)".
//!
//! The timeout counts progress, not wall time: every stage publishes its position (a relaxed
//! store as it starts and as it ends each action); a wait's clock restarts whenever any stage
//! moves, and each reading of the clock (one per yield) adds at most `max_clock_step` to
//! it, so a process stopped for minutes (SIGSTOP, a debugger, a suspended laptop) is not
//! failed on resume. Usage: `ThreadedExecutor e; e.wait_timeout = std::chrono::seconds(5);`
class ThreadedExecutor {
 public:
  using clock_type = std::chrono::steady_clock;
  static constexpr const char* name = "threaded";
  //! How long a stage may wait on a neighbour that makes no progress before giving up.
  std::chrono::duration<double> wait_timeout = std::chrono::seconds(60);
  //! The most one reading of the clock adds to a wait: a larger jump is the process stopped.
  std::chrono::duration<double> max_clock_step = std::chrono::milliseconds(100);
  //! CPUs to pin the worker threads to: worker w (stage w, without virtual stages) runs on CPU
  //! `cpus[w % cpus.size()]` (Linux; a CPU this process may not run on is a ConfigError naming
  //! it, before any stage starts). Empty:
  //! wherever the OS puts them. Pinning makes a run with more stages than cores repeatable (each
  //! core time-shares its own stages, which is what the simulator models with
  //! `CostModel::core_of`); left to itself the OS keeps threads where it put them for long
  //! stretches, unevenly.
  std::vector<int> cpus;
  //! The clock waits read; a hook for tests, which jump it as a stopped process would see.
  clock_type::time_point (*clock)() = [] { return clock_type::now(); };

  template <Program P>
  void run(P& program) {
    const Schedule& s = program.schedule();
    check_cpus();  // before any stage starts: a bad CPU fails the run with nothing changed
    trace_ = ExecutionTrace::sized_for(s);
    stop_.store(false);
    error_ = nullptr;
    positions_ = std::make_unique<Position[]>(static_cast<std::size_t>(s.stages));
    check_structure(s);  // any Program may hand one in: worker_steps needs it whole
    const std::vector<std::vector<WorkerStep>> steps = worker_steps(s);
    owner_ = stage_workers(s);
    worker_stage_ = std::make_unique<std::atomic<int>[]>(steps.size());
    for (std::size_t w = 0; w < steps.size(); ++w) worker_stage_[w].store(-1);
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    threads.reserve(steps.size());
    for (std::size_t w = 0; w < steps.size(); ++w)
      threads.emplace_back([this, &program, &s, &steps, w, t0] {
        worker_loop(program, s, steps[w], static_cast<int>(w), t0);
      });
    for (auto& t : threads) t.join();
    trace_.seconds = detail::seconds_since(t0);
    if (error_) std::rethrow_exception(error_);
  }

  const ExecutionTrace& trace() const { return trace_; }

  //! Throws a ConfigError naming the first CPU in `cpus` this process may not run on (run()
  //! calls it before any stage starts; tools call it to check a flag up front).
  void check_cpus() const {
    if (cpus.empty()) return;
#if defined(__linux__)
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    const bool known = sched_getaffinity(0, sizeof(allowed), &allowed) == 0;
    for (std::size_t k = 0; k < cpus.size(); ++k) {
      const int cpu = cpus[k];
      if (cpu >= 0 && cpu < CPU_SETSIZE && (!known || CPU_ISSET(cpu, &allowed))) continue;
      throw ConfigError("xpipe: ThreadedExecutor: cannot pin stage " + std::to_string(k) +
                        " to CPU " + std::to_string(cpu) + " (not a CPU this process may run on)");
    }
#else
    throw ConfigError("xpipe: ThreadedExecutor: pinning stage threads (cpus) needs Linux");
#endif
  }

 private:
  // Where a stage is: 2i while waiting for (or before) its action i, 2i + 1 while running it (2n
  // when its n actions are done). Its own cache line: stages store to theirs on every action.
  struct alignas(64) Position {
    std::atomic<std::uint64_t> at{0};
    std::atomic<int> waits_on{-1};  // the stage its current wait waits on, once it yields
  };

  // Pins the calling stage thread to its CPU, before its first action.
  void pin_self(int k) const {
#if defined(__linux__)
    const int cpu = cpus[static_cast<std::size_t>(k) % cpus.size()];
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (pthread_setaffinity_np(pthread_self(), sizeof(set), &set) != 0)
      throw ConfigError("xpipe: ThreadedExecutor: cannot pin stage " + std::to_string(k) +
                        " to CPU " + std::to_string(cpu));
#else
    (void)k;
#endif
  }

  // Worker w's thread: its actions in its order (a worker per stage: that stage's list). Each
  // action's stage k keeps its position for the diagnostics (late_error) as with one stage per
  // thread.
  template <class P>
  void worker_loop(P& program, const Schedule& s, const std::vector<WorkerStep>& mine, int w,
                   std::chrono::steady_clock::time_point t0) {
    ScopedFlushDenormals ftz;
    std::size_t i = 0;
    try {
      if (!cpus.empty()) pin_self(w);
      for (; i < mine.size(); ++i) {
        const auto [k, p] = mine[i];
        const Action& a = s.actions[static_cast<std::size_t>(k)][p];
        std::atomic<std::uint64_t>& at = positions_[static_cast<std::size_t>(k)].at;
        worker_stage_[static_cast<std::size_t>(w)].store(k, std::memory_order_relaxed);
        if (!wait_ready(program, s, k, a)) return;  // another worker failed
        at.store(2 * p + 1, std::memory_order_relaxed);
        const double start = detail::seconds_since(t0);
        program.execute(k, a);
        trace_.stages[k][p] = {a, start, detail::seconds_since(t0)};
        at.store(2 * p + 2, std::memory_order_relaxed);
      }
    } catch (const StageError&) {
      fail(std::current_exception());
    } catch (const std::exception& e) {
      const auto [k, p] = mine[i];
      fail(std::make_exception_ptr(StageError(k, to_string(s.actions[k][p]), e.what())));
    } catch (...) {
      const auto [k, p] = mine[i];
      fail(std::make_exception_ptr(
          StageError(k, to_string(s.actions[k][p]), "non-standard exception")));
    }
  }

  template <class P>
  bool wait_ready(P& program, const Schedule& s, int k, const Action& a) {
    std::atomic<int>& waits_on = positions_[static_cast<std::size_t>(k)].waits_on;
    clock_type::duration waited{};
    clock_type::time_point last{};
    std::uint64_t progress = 0;
    for (unsigned spins = 0;; ++spins) {
      const bool stop = stop_.load(std::memory_order_relaxed);
      if (stop || program.ready(k, a)) {
        if (spins > 32) waits_on.store(-1, std::memory_order_relaxed);
        return !stop;
      }
      // A short spin (PAUSE is ~60 cycles on recent cores): long spins starve the producer
      // when stage threads outnumber cores.
      if (spins < 32) {
#if defined(__SSE2__)
        _mm_pause();
#endif
        continue;
      }
      // Past the spin budget: give the core away (stages may outnumber cores) and check time
      // on every yield (a clock read is far cheaper than a yield, which can take milliseconds
      // when the core is shared: 1024 of them took 2 s beside a busy thread).
      std::this_thread::yield();
      const auto now = clock();
      waits_on.store(late_stage(program, s.stages, k, a), std::memory_order_relaxed);
      const std::uint64_t p = total_progress(s.stages);
      if (spins == 32 || p != progress) {
        waited = {};  // the first reading, or some stage moved
        progress = p;
      } else {
        const auto step = std::chrono::duration_cast<clock_type::duration>(max_clock_step);
        waited += std::clamp(now - last, clock_type::duration::zero(), step);
      }
      last = now;
      if (waited > wait_timeout) throw late_error(s, k, a);
    }
  }

  // The stage `a` (at stage k) waits on: its producer while its input is missing, else its
  // consumer; -1 when it waits on neither.
  template <class P>
  static int late_stage(P& program, int stages, int k, const Action& a) {
    const int producer = producer_stage(stages, k, a);
    bool input_missing = producer >= 0;
    if constexpr (requires { program.input_ready(k, a); })
      input_missing = input_missing && !program.input_ready(k, a);
    return input_missing ? producer : consumer_stage(stages, k, a);
  }

  // Every stage's position summed: it grows whenever any stage starts or ends an action.
  std::uint64_t total_progress(int stages) const {
    std::uint64_t sum = 0;
    for (int j = 0; j < stages; ++j)
      sum += positions_[static_cast<std::size_t>(j)].at.load(std::memory_order_relaxed);
    return sum;
  }

  // The error of stage k giving up on `a`: follows the stages waiting on each other from the
  // one k waits on to the first that is not waiting (running, or done) and names that one.
  StageError late_error(const Schedule& s, int k, const Action& a) const {
    std::ostringstream secs;
    secs << wait_timeout.count() << " s";
    const int awaited = positions_[static_cast<std::size_t>(k)].waits_on.load();
    if (awaited < 0)
      return StageError(k, to_string(a), "waited " + secs.str() + " for the action to be ready");
    const std::string what = awaited == producer_stage(s.stages, k, a)
                                 ? "the input of its "
                                 : "room to send the output of its ";
    int late = awaited;
    std::string chain;  // "stage 2 waits on stage 1, stage 1 on stage 0; "
    for (int hops = 0;; ++hops) {
      // Virtual stages: a stage whose worker is at another of its stages waits on that one (a
      // worker runs one action at a time), whatever its own position says.
      const int on =
          worker_stage_[static_cast<std::size_t>(owner_[static_cast<std::size_t>(late)])].load(
              std::memory_order_relaxed);
      if (on >= 0 && on != late && on != k && hops < 2 * s.stages) {
        chain += (chain.empty() ? "stage " : ", stage ") + std::to_string(late) +
                 (chain.empty() ? " waits on stage " : " on stage ") + std::to_string(on) +
                 " (its worker's)";
        late = on;
        continue;
      }
      const Position& pos = positions_[static_cast<std::size_t>(late)];
      const std::uint64_t at = pos.at.load(std::memory_order_relaxed);
      const int next = pos.waits_on.load(std::memory_order_relaxed);
      const bool waiting = at % 2 == 0 && at / 2 < s.actions[static_cast<std::size_t>(late)].size();
      // Stop at a stage that is not waiting, or has not said on whom yet, or at a cycle.
      if (!waiting || next < 0 || next == k || hops >= 2 * s.stages) break;
      chain += (chain.empty() ? "stage " : ", stage ") + std::to_string(late) +
               (chain.empty() ? " waits on stage " : " on stage ") + std::to_string(next);
      late = next;
    }
    const auto& list = s.actions[static_cast<std::size_t>(late)];
    const std::uint64_t at = positions_[static_cast<std::size_t>(late)].at.load();
    const std::size_t i = static_cast<std::size_t>(at / 2);
    const std::string stage = "stage " + std::to_string(late);
    const std::string where =
        i < list.size()
            ? stage + (at % 2 ? " is running " : " is waiting to run ") + to_string(list[i]) +
                  ", action " + std::to_string(i + 1) + " of " + std::to_string(list.size())
            : stage + " has run all its " + std::to_string(list.size()) + " actions";
    return StageError(late, i < list.size() ? to_string(list[i]) : "none",
                      stage + " is late: stage " + std::to_string(k) + " waited " + secs.str() +
                          " for " + what + to_string(a) + " (" +
                          (chain.empty() ? "" : chain + "; ") + where + ")");
  }

  void fail(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_) error_ = e;
    stop_.store(true);
  }

  ExecutionTrace trace_;
  std::unique_ptr<Position[]> positions_;
  std::vector<int> owner_;                            // the worker of each stage
  std::unique_ptr<std::atomic<int>[]> worker_stage_;  // the stage each worker is at (-1: none yet)
  std::atomic<bool> stop_{false};
  std::mutex mutex_;  // taken only when a stage fails
  std::exception_ptr error_;
};

static_assert(Executor<ThreadedExecutor>);

}  // namespace xpipe
