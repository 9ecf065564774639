// The one timing record of a run: start and end of every action of every stage, in each
// stage's order. Executors fill it with real timestamps, the dry run and the simulator with
// modelled ones; the trace writers draw any of them.
#pragma once

#include <cstddef>
#include <vector>

#include "xpipe/schedule/ir.hpp"

namespace xpipe {

//! Start and end of one action, in seconds since the run began (or model time units).
struct ActionTiming {
  Action action;
  double start = 0, end = 0;
};

//! Per-stage timings of one run, indexed like Schedule::actions. Sized before the run starts
//! (sized_for), so recording never allocates.
struct ExecutionTrace {
  std::vector<std::vector<ActionTiming>> stages;
  double seconds = 0;  // the whole run: wall time, or the makespan of a modelled run

  //! A trace with one record per action of `s`, each naming its action, times zero.
  static ExecutionTrace sized_for(const Schedule& s) {
    ExecutionTrace t;
    t.stages.resize(static_cast<std::size_t>(s.stages));
    for (int k = 0; k < s.stages; ++k) {
      auto& row = t.stages[static_cast<std::size_t>(k)];
      row.resize(s.actions[static_cast<std::size_t>(k)].size());
      for (std::size_t p = 0; p < row.size(); ++p)
        row[p].action = s.actions[static_cast<std::size_t>(k)][p];
    }
    return t;
  }

  const ActionTiming& at(int k, std::size_t position) const {
    return stages[static_cast<std::size_t>(k)][position];
  }

  //! Fraction of the run stage k spent not computing.
  double bubble_fraction(int k) const {
    double busy = 0;
    for (const auto& t : stages[static_cast<std::size_t>(k)]) busy += t.end - t.start;
    return seconds > 0 ? 1.0 - busy / seconds : 0.0;
  }
};

}  // namespace xpipe
