// The schedule's text form, read back: `Schedule::to_text()` writes it, parse_schedule reads it,
// so users can write schedules by hand.
#pragma once

#include <sstream>
#include <string>

#include "xpipe/core/error.hpp"
#include "xpipe/schedule/ir.hpp"

namespace xpipe {

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
        if (key == "name")
          s.name = value;
        else if (key == "stages")
          s.stages = parse_int(value, "stages");
        else if (key == "micro_batches")
          s.micro_batches = parse_int(value, "micro_batches");
        else if (key == "mini_batches")
          s.mini_batches = parse_int(value, "mini_batches");
        else
          fail("unknown key '" + key + "'");
      }
      if (s.stages < 1 || s.micro_batches < 1 || s.mini_batches < 1)
        fail("the header needs stages, micro_batches and mini_batches, each >= 1");
      s.actions.assign(static_cast<std::size_t>(s.stages), {});
      header = true;
      continue;
    }
    if (first.back() != ':') fail("expected '<stage>:' at the start, got '" + first + "'");
    const int k = parse_int(first.substr(0, first.size() - 1), "stage number");
    if (k >= s.stages)
      fail("stage " + std::to_string(k) + " out of range (stages=" + std::to_string(s.stages) +
           ")");
    auto& list = s.actions[static_cast<std::size_t>(k)];
    if (!list.empty()) fail("stage " + std::to_string(k) + " listed twice");
    std::string tok;
    while (ls >> tok) {
      const ActionKindInfo* kind = nullptr;
      for (const ActionKindInfo& i : action_kinds)
        if (tok[0] == i.letter) kind = &i;
      if (kind == nullptr)
        fail("bad action '" + tok + "' (expected F<mb>, B<mb> or S<mini-batch>)");
      list.push_back({kind->kind, parse_int(tok.substr(1), "action '" + tok + "'")});
    }
  }
  if (!header) throw ConfigError("xpipe: schedule text is empty (no 'xpipe-schedule' header)");
  return s;
}

}  // namespace xpipe
