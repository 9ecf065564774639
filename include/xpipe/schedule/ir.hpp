// The schedule IR: per stage, an ordered list of actions (Forward, Backward, Step). Every
// executor, the staleness analysis and the simulator consume this one representation.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "xpipe/core/error.hpp"

namespace xpipe {

//! What a stage does: run a micro-batch forward or backward, or step its optimizer.
enum class ActionKind : std::uint8_t { Forward, Backward, Step };

//! One action of one stage. For Forward/Backward `index` is the global micro-batch number
//! g = t * M + j (mini-batch t, micro-batch j of it); for Step it is the mini-batch t.
struct Action {
  ActionKind kind = ActionKind::Forward;
  int index = 0;
  friend bool operator==(const Action&, const Action&) = default;
};

inline Action fwd(int g) { return {ActionKind::Forward, g}; }
inline Action bwd(int g) { return {ActionKind::Backward, g}; }
inline Action step(int t) { return {ActionKind::Step, t}; }

//! "F3", "B3" or "S0".
inline std::string to_string(const Action& a) {
  const char c = a.kind == ActionKind::Forward ? 'F' : a.kind == ActionKind::Backward ? 'B' : 'S';
  return c + std::to_string(a.index);
}

//! A whole schedule: K stages, M micro-batches per mini-batch, N mini-batches, and each stage's
//! ordered actions. Usage: `Schedule s = async_1f1b(4, 2, 8); std::cout << s.to_text();`
struct Schedule {
  std::string name = "custom";
  int stages = 0;
  int micro_batches = 0;  // M, per mini-batch
  int mini_batches = 0;   // N
  std::vector<std::vector<Action>> actions;  // actions[k]: stage k's list, in order

  int total_micro_batches() const { return micro_batches * mini_batches; }
  int mini_batch_of(int g) const { return g / micro_batches; }
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

//! Parses the text form (blank lines and lines starting with '#' are ignored). Throws
//! ConfigError naming the line and token at fault. The result is not validated: call
//! validate() before running it.
inline Schedule parse_schedule(const std::string& text) {
  Schedule s;
  std::istringstream in(text);
  std::string line;
  int line_no = 0;
  bool header = false;
  auto fail = [&](const std::string& what) {
    throw ConfigError("xpipe: schedule text, line " + std::to_string(line_no) + ": " + what);
  };
  auto parse_int = [&](const std::string& tok, const std::string& what) {
    std::size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(tok, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != tok.size() || tok.empty() || v < 0) fail("bad " + what + " '" + tok + "'");
    return v;
  };
  while (std::getline(in, line)) {
    ++line_no;
    std::istringstream ls(line);
    std::string first;
    if (!(ls >> first) || first[0] == '#') continue;
    if (!header) {
      if (first != "xpipe-schedule") fail("expected the header 'xpipe-schedule stages=K ...'");
      std::string kv;
      while (ls >> kv) {
        const auto eq = kv.find('=');
        if (eq == std::string::npos) fail("expected key=value, got '" + kv + "'");
        const std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
        if (key == "name") s.name = value;
        else if (key == "stages") s.stages = parse_int(value, "stages");
        else if (key == "micro_batches") s.micro_batches = parse_int(value, "micro_batches");
        else if (key == "mini_batches") s.mini_batches = parse_int(value, "mini_batches");
        else fail("unknown key '" + key + "'");
      }
      if (s.stages < 1 || s.micro_batches < 1 || s.mini_batches < 1)
        fail("the header needs stages, micro_batches and mini_batches, each >= 1");
      s.actions.assign(static_cast<std::size_t>(s.stages), {});
      header = true;
      continue;
    }
    if (first.back() != ':') fail("expected '<stage>:' at the start, got '" + first + "'");
    const int k = parse_int(first.substr(0, first.size() - 1), "stage number");
    if (k >= s.stages) fail("stage " + std::to_string(k) + " out of range (stages=" +
                            std::to_string(s.stages) + ")");
    auto& list = s.actions[static_cast<std::size_t>(k)];
    if (!list.empty()) fail("stage " + std::to_string(k) + " listed twice");
    std::string tok;
    while (ls >> tok) {
      ActionKind kind = ActionKind::Forward;
      switch (tok[0]) {
        case 'F': kind = ActionKind::Forward; break;
        case 'B': kind = ActionKind::Backward; break;
        case 'S': kind = ActionKind::Step; break;
        default: fail("bad action '" + tok + "' (expected F<mb>, B<mb> or S<mini-batch>)");
      }
      list.push_back({kind, parse_int(tok.substr(1), "action '" + tok + "'")});
    }
  }
  if (!header) throw ConfigError("xpipe: schedule text is empty (no 'xpipe-schedule' header)");
  return s;
}

}  // namespace xpipe
