// The schedule IR: per stage, an ordered list of actions (Forward, Backward or its two halves
// InputGrad and WeightGrad, Step). Every executor, the staleness analysis and the simulator
// consume this one representation.
#pragma once

#include <array>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "xpipe/core/error.hpp"

namespace xpipe {

//! What a stage does: run a micro-batch forward or backward, or step its optimizer. A backward
//! may be split in two (zero-bubble schedules): InputGrad computes and sends the gradient of the
//! stage's input, WeightGrad later adds the micro-batch's parameter gradient.
enum class ActionKind : std::uint8_t { Forward, Backward, Step, InputGrad, WeightGrad };

//! Which way an action's message travels between neighbouring stages: none, activations
//! downstream (it pops from stage k-1 and pushes to k+1) or gradients upstream.
enum class Travel : std::uint8_t { None, Down, Up };

//! Everything the library says about one kind of action, in one table: its letter in the text
//! form, its name in traces, whether its index is a micro-batch (or a mini-batch), which way its
//! message travels, what it needs done before it on its own stage, and what it finishes. The
//! dependency rule, the structural check, the validator, the dry run, the staleness analysis,
//! the simulator and the MPI executor read these columns. A new kind is one row here, plus what
//! only a kind can say: its work (pipeline/stage_program.hpp), its cost (sim::CostModel::seconds,
//! SplitBackwardCosts::seconds and unit_cost), its shade in timelines (trace/svg_timeline.hpp)
//! and its profile bin (tools/sim_profile.hpp); those arrays are indexed by kind and assert the
//! table's size.
struct ActionKindInfo {
  ActionKind kind;
  char letter;
  const char* name;
  bool on_micro_batch;  // index is a micro-batch g (else a mini-batch t)
  Travel travel;
  bool reads_weights;     // runs on the weights the predictor chooses (counts in staleness)
  bool sends_gradient;    // computes the input gradient: ends what the forward's weights serve
  bool adds_gradient;     // adds the micro-batch's parameter gradient (a step must follow it)
  bool takes_slot;        // the micro-batch takes an activation slot on its stage
  bool frees_slot;        // the micro-batch's activation slot is free after it
  bool applies_gradient;  // steps the optimizer with the gradient added since the last one
                          // (under global clipping it waits for every stage's norm)
  ActionKind needs;       // the action of the same micro-batch that must come first on its stage
                          // (itself for Forward and Step: none)
};

inline constexpr std::array<ActionKindInfo, 5> action_kinds{{
    {ActionKind::Forward, 'F', "forward", true, Travel::Down, true, false, false, true, false,
     false, ActionKind::Forward},
    {ActionKind::Backward, 'B', "backward", true, Travel::Up, true, true, true, false, true, false,
     ActionKind::Forward},
    {ActionKind::Step, 'S', "step", false, Travel::None, false, false, false, false, false, true,
     ActionKind::Step},
    {ActionKind::InputGrad, 'I', "input-grad", true, Travel::Up, true, true, false, false, false,
     false, ActionKind::Forward},
    {ActionKind::WeightGrad, 'W', "weight-grad", true, Travel::None, false, false, true, false,
     true, false, ActionKind::InputGrad},
}};

//! The table row of `kind`.
constexpr const ActionKindInfo& info(ActionKind kind) {
  return action_kinds[static_cast<std::size_t>(kind)];
}
static_assert(
    [] {
      for (std::size_t i = 0; i < action_kinds.size(); ++i)
        if (static_cast<std::size_t>(action_kinds[i].kind) != i) return false;
      return true;
    }(),
    "xpipe: action_kinds must be listed in ActionKind order");

//! Whether the action of `kind` on a micro-batch needs another of the same micro-batch before it.
constexpr bool has_prerequisite(ActionKind kind) {
  return info(kind).needs != kind;
}

//! One action of one stage. For Forward/Backward `index` is the global micro-batch number
//! g = t * M + j (mini-batch t, micro-batch j of it); for Step it is the mini-batch t.
struct Action {
  ActionKind kind = ActionKind::Forward;
  int index = 0;
  friend bool operator==(const Action&, const Action&) = default;
};

inline Action fwd(int g) {
  return {ActionKind::Forward, g};
}
inline Action bwd(int g) {
  return {ActionKind::Backward, g};
}
inline Action step(int t) {
  return {ActionKind::Step, t};
}
inline Action input_grad(int g) {
  return {ActionKind::InputGrad, g};
}
inline Action weight_grad(int g) {
  return {ActionKind::WeightGrad, g};
}

//! "F3", "B3", "I3", "W3" or "S0".
inline std::string to_string(const Action& a) {
  return info(a.kind).letter + std::to_string(a.index);
}

//! A whole schedule: K stages, M micro-batches per mini-batch, N mini-batches, and each stage's
//! ordered actions. Usage: `Schedule s = async_1f1b(4, 2, 8); std::cout << s.to_text();`
struct Schedule {
  std::string name = "custom";
  int stages = 0;
  int micro_batches = 0;                     // M, per mini-batch
  int mini_batches = 0;                      // N
  std::vector<std::vector<Action>> actions;  // actions[k]: stage k's list, in order
  //! Who runs the stages (threads, ranks, streams): worker w runs, in this order, the next
  //! action of stage worker_order[w][i] for i = 0, 1, ...; each stage belongs to one worker and
  //! appears there once per action of its list. Empty: one worker per stage, worker k running
  //! stage k's list (every schedule of one stage per worker). Interleaved schedules give a
  //! worker several stages (virtual stages).
  std::vector<std::vector<int>> worker_order;

  int total_micro_batches() const { return micro_batches * mini_batches; }
  //! How many workers run the stages (stages, without a worker_order).
  int workers() const {
    return worker_order.empty() ? stages : static_cast<int>(worker_order.size());
  }
  //! Whether some worker runs more than one stage.
  bool has_virtual_stages() const { return workers() < stages; }
  int mini_batch_of(int g) const { return g / micro_batches; }
  //! The mini-batch an action belongs to (a step's index is its mini-batch).
  int mini_batch_of(const Action& a) const {
    return info(a.kind).on_micro_batch ? mini_batch_of(a.index) : a.index;
  }
  bool is_last_of_mini_batch(int g) const { return g % micro_batches == micro_batches - 1; }
  //! Whether some stage splits a backward into InputGrad and WeightGrad (the model's layers
  //! must then provide the split: Stage::splits_backward).
  bool splits_backward() const {
    for (const auto& list : actions)
      for (const Action& a : list)
        if (a.kind == ActionKind::InputGrad || a.kind == ActionKind::WeightGrad) return true;
    return false;
  }

  //! Text form: a header line, then one line per stage, e.g.
  //!   xpipe-schedule name=gpipe stages=2 micro_batches=2 mini_batches=1
  //!   0: F0 F1 B0 B1 S0
  //!   1: F0 F1 B0 B1 S0
  //! With a worker_order, `workers=P` in the header and one line per worker, each action naming
  //! its stage: `0: F0@s0 F0@s2 ...`. The schedule must have its structure (check_structure).
  std::string to_text() const {
    std::ostringstream os;
    os << "xpipe-schedule name=" << name << " stages=" << stages;
    if (!worker_order.empty()) os << " workers=" << worker_order.size();
    os << " micro_batches=" << micro_batches << " mini_batches=" << mini_batches << "\n";
    if (worker_order.empty()) {
      for (int k = 0; k < stages; ++k) {
        os << k << ":";
        for (const Action& a : actions[static_cast<std::size_t>(k)]) os << ' ' << to_string(a);
        os << "\n";
      }
      return os.str();
    }
    std::vector<std::size_t> next(static_cast<std::size_t>(stages), 0);
    for (std::size_t w = 0; w < worker_order.size(); ++w) {
      os << w << ":";
      for (int k : worker_order[w])
        os << ' ' << to_string(actions[static_cast<std::size_t>(k)][next[k]++]) << "@s" << k;
      os << "\n";
    }
    return os.str();
  }
};

//! The largest schedule the library accepts: far more stages than a pipeline has, and more
//! micro-batches than an epoch of ImageNet at one sample each. The bounds keep a malformed header
//! (`stages=2147483647`) from allocating, or M * N from overflowing, before the actions are read.
inline constexpr int max_schedule_stages = 4096;
inline constexpr std::int64_t max_schedule_micro_batches = std::int64_t{1} << 22;

//! Throws ConfigError, naming `what`, unless 1 <= K <= max_schedule_stages, M >= 1, N >= 1 and
//! M * N <= max_schedule_micro_batches (computed without overflow).
inline void check_schedule_shape(const std::string& what, std::int64_t K, std::int64_t M,
                                 std::int64_t N) {
  const auto got = " (got stages=" + std::to_string(K) + ", micro_batches=" + std::to_string(M) +
                   ", mini_batches=" + std::to_string(N) + ")";
  if (K < 1 || M < 1 || N < 1)
    throw ConfigError("xpipe: " + what + ": stages, micro_batches and mini_batches must be >= 1" +
                      got);
  if (K > max_schedule_stages)
    throw ConfigError("xpipe: " + what + ": more than " + std::to_string(max_schedule_stages) +
                      " stages" + got);
  if (M > max_schedule_micro_batches || N > max_schedule_micro_batches ||
      M * N > max_schedule_micro_batches)
    throw ConfigError("xpipe: " + what + ": micro_batches x mini_batches exceeds " +
                      std::to_string(max_schedule_micro_batches) + " micro-batches" + got);
}

}  // namespace xpipe
