// The schedule IR: per stage, an ordered list of actions (Forward, Backward, Step). Every
// executor, the staleness analysis and the simulator consume this one representation.
#pragma once

#include <array>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "xpipe/core/error.hpp"

namespace xpipe {

//! What a stage does: run a micro-batch forward or backward, or step its optimizer.
enum class ActionKind : std::uint8_t { Forward, Backward, Step };

//! Everything the library says about one kind of action, in one table: its letter in the text
//! form, its name in traces, and whether its index is a micro-batch (or a mini-batch). A new
//! kind (e.g. the weight-gradient half of a split backward) is one row here plus its rules in
//! schedule/dependencies.hpp.
struct ActionKindInfo {
  ActionKind kind;
  char letter;
  const char* name;
  bool on_micro_batch;  // index is a micro-batch g (else a mini-batch t)
};

inline constexpr std::array<ActionKindInfo, 3> action_kinds{{
    {ActionKind::Forward, 'F', "forward", true},
    {ActionKind::Backward, 'B', "backward", true},
    {ActionKind::Step, 'S', "step", false},
}};

//! The table row of `kind`.
constexpr const ActionKindInfo& info(ActionKind kind) {
  return action_kinds[static_cast<std::size_t>(kind)];
}
static_assert(info(ActionKind::Forward).kind == ActionKind::Forward &&
                  info(ActionKind::Backward).kind == ActionKind::Backward &&
                  info(ActionKind::Step).kind == ActionKind::Step,
              "xpipe: action_kinds must be listed in ActionKind order");

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

//! "F3", "B3" or "S0".
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

  int total_micro_batches() const { return micro_batches * mini_batches; }
  int mini_batch_of(int g) const { return g / micro_batches; }
  //! The mini-batch an action belongs to (a step's index is its mini-batch).
  int mini_batch_of(const Action& a) const {
    return info(a.kind).on_micro_batch ? mini_batch_of(a.index) : a.index;
  }
  bool is_last_of_mini_batch(int g) const { return g % micro_batches == micro_batches - 1; }

  //! Text form: a header line, then one line per stage, e.g.
  //!   xpipe-schedule name=gpipe stages=2 micro_batches=2 mini_batches=1
  //!   0: F0 F1 B0 B1 S0
  //!   1: F0 F1 B0 B1 S0
  std::string to_text() const {
    std::ostringstream os;
    os << "xpipe-schedule name=" << name << " stages=" << stages
       << " micro_batches=" << micro_batches << " mini_batches=" << mini_batches << "\n";
    for (int k = 0; k < stages; ++k) {
      os << k << ":";
      for (const Action& a : actions[static_cast<std::size_t>(k)]) os << ' ' << to_string(a);
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
