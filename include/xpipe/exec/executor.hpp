// What executors drive and what they are: the Program concept (a schedule plus "is this
// action ready" and "run it") and the Executor concept (runs a Program, keeps its timings).
// Executors live beside this file: reference.hpp, threaded.hpp; CUDA and MPI ones to come.
#pragma once

#include <chrono>
#include <concepts>
#include <utility>

#include "xpipe/schedule/ir.hpp"
#include "xpipe/schedule/timing.hpp"

namespace xpipe {

//! Program: what an executor drives. `ready(k, a)` says whether stage k can run action a now
//! without waiting (inputs arrived, room for its outputs); `execute(k, a)` runs it. Both are
//! called only from the thread that runs stage k, one action at a time per stage. Optional:
//! `input_ready(k, a)`, whether a's input has arrived (room for its output aside), so that an
//! executor giving up on a wait can blame the producer or the consumer rightly.
template <class P>
concept Program = requires(P& p, int k, const Action& a) {
  { p.schedule() } -> std::convertible_to<const Schedule&>;
  { p.ready(k, a) } -> std::convertible_to<bool>;
  p.execute(k, a);
};

namespace detail {
//! The least Program: used to check that an executor accepts any Program.
struct ProgramArchetype {
  const Schedule& schedule() const;
  bool ready(int, const Action&);
  void execute(int, const Action&);
};
static_assert(Program<ProgramArchetype>);

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace detail

//! Executor: runs every stage's action list of a Program, each list in its order, and records
//! when each action ran. Required: `static constexpr const char* name`, `run(program)` for any
//! Program (throws StageError naming the stage and action when one fails), `trace()` ->
//! const ExecutionTrace& of the last run. Executors that follow each list in order compute
//! the same bits (the main oracle). Usage: `ThreadedExecutor e; pipeline.train(s, data, e);`
namespace detail {
template <class E>
concept HasExecutorName = requires {
  { E::name } -> std::convertible_to<const char*>;
};
template <class E>
concept RunsPrograms = requires(E& e, ProgramArchetype& p) {
  e.run(p);
};
template <class E>
concept HasTrace = requires(const E& e) {
  { e.trace() } -> std::convertible_to<const ExecutionTrace&>;
};
}  // namespace detail

template <class E>
concept Executor = detail::HasExecutorName<E> && detail::RunsPrograms<E> && detail::HasTrace<E>;

//! Fails to compile with one message per member E lacks. Usage:
//! `static_assert(check_executor<MyExecutor>());`
template <class E>
consteval bool check_executor() {
  static_assert(detail::HasExecutorName<E>,
                "xpipe: Executor: missing static member name (static constexpr const char*)");
  static_assert(detail::RunsPrograms<E>,
                "xpipe: Executor: missing run(program) accepting any Program (a template over "
                "the program type)");
  static_assert(detail::HasTrace<E>,
                "xpipe: Executor: missing trace() const returning const ExecutionTrace&");
  return true;
}

}  // namespace xpipe
