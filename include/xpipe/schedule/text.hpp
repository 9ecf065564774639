// The schedule's text form, read back: `Schedule::to_text()` writes it, parse_schedule reads it,
// so users can write schedules by hand.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "xpipe/core/error.hpp"
#include "xpipe/schedule/ir.hpp"

namespace xpipe {

//! Parses the text form (blank lines and lines starting with '#' are ignored): a line per stage,
//! or, with `workers=P` in the header, a line per worker whose actions name their stage (F0@s2).
//! Throws
//! ConfigError naming the line and token at fault: numbers are plain digits (no sign, no
//! trailing characters), header keys and stage lines appear once, and the shape is bounded
//! (check_schedule_shape) before anything is allocated. The result is not validated: call
//! validate() before running it (executors and dry_run check its structure themselves).
inline Schedule parse_schedule(const std::string& text) {
  Schedule s;
  std::istringstream in(text);
  std::string line;
  int line_no = 0;
  bool header = false;
  std::vector<bool> listed;  // stage k's line was seen
  auto fail = [&](const std::string& what) {
    throw ConfigError("xpipe: schedule text, line " + std::to_string(line_no) + ": " + what);
  };
  // A non-negative decimal of at most 10 digits, at most `max`; the token is named otherwise.
  auto parse_count = [&](const std::string& tok, const std::string& what, std::int64_t max) {
    const bool digits = !tok.empty() && tok.size() <= 10 &&
                        tok.find_first_not_of("0123456789") == std::string::npos;
    const std::int64_t v = digits ? std::stoll(tok) : -1;
    if (v < 0 || v > max) fail("bad " + what + " '" + tok + "'");
    return v;
  };
  constexpr std::int64_t int_max = std::numeric_limits<int>::max();
  while (std::getline(in, line)) {
    ++line_no;
    std::istringstream ls(line);
    std::string first;
    if (!(ls >> first) || first[0] == '#') continue;
    if (first == "xpipe-schedule" && header) fail("a second 'xpipe-schedule' header");
    if (!header) {
      if (first != "xpipe-schedule") fail("expected the header 'xpipe-schedule stages=K ...'");
      std::int64_t K = 0, M = 0, N = 0, P = 0;
      std::vector<std::string> seen;
      std::string kv;
      while (ls >> kv) {
        const auto eq = kv.find('=');
        if (eq == std::string::npos) fail("expected key=value, got '" + kv + "'");
        const std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
        if (std::find(seen.begin(), seen.end(), key) != seen.end())
          fail("'" + key + "' given twice in the header");
        seen.push_back(key);
        if (key == "name")
          s.name = value;
        else if (key == "stages")
          K = parse_count(value, "stages", int_max);
        else if (key == "micro_batches")
          M = parse_count(value, "micro_batches", int_max);
        else if (key == "mini_batches")
          N = parse_count(value, "mini_batches", int_max);
        else if (key == "workers")
          P = parse_count(value, "workers", int_max);
        else
          fail("unknown key '" + key + "'");
      }
      if (K < 1 || M < 1 || N < 1)
        fail("the header needs stages, micro_batches and mini_batches, each >= 1");
      try {
        check_schedule_shape("schedule '" + s.name + "'", K, M, N);
      } catch (const ConfigError& e) {
        fail(e.what());
      }
      s.stages = static_cast<int>(K);
      s.micro_batches = static_cast<int>(M);
      s.mini_batches = static_cast<int>(N);
      if (std::find(seen.begin(), seen.end(), "workers") != seen.end() && (P < 1 || P > K))
        fail("workers must be from 1 to stages (" + std::to_string(K) + "), got " +
             std::to_string(P));
      s.actions.assign(static_cast<std::size_t>(K), {});
      if (P > 0) s.worker_order.assign(static_cast<std::size_t>(P), {});
      listed.assign(static_cast<std::size_t>(P > 0 ? P : K), false);
      header = true;
      continue;
    }
    const bool by_worker = !s.worker_order.empty();
    const char* line_kind = by_worker ? "worker" : "stage";
    if (first.back() != ':')
      fail(std::string("expected '<") + line_kind + ">:' at the start, got '" + first + "'");
    const auto k = static_cast<std::size_t>(parse_count(
        first.substr(0, first.size() - 1), std::string(line_kind) + " number", int_max));
    if (k >= listed.size())
      fail(std::string(line_kind) + " " + std::to_string(k) + " out of range (" + line_kind +
           "s=" + std::to_string(listed.size()) + ")");
    if (listed[k]) fail(std::string(line_kind) + " " + std::to_string(k) + " listed twice");
    listed[k] = true;
    std::string tok;
    while (ls >> tok) {
      const ActionKindInfo* kind = nullptr;
      for (const ActionKindInfo& i : action_kinds)
        if (tok[0] == i.letter) kind = &i;
      if (kind == nullptr)
        fail("bad action '" + tok + "' (expected F<mb>, B<mb>, I<mb>, W<mb> or S<mini-batch>" +
             (by_worker ? ", each followed by @s<stage>)" : ")"));
      // A worker's action names its stage: F3@s2.
      const auto at = tok.find("@s");
      if (by_worker && at == std::string::npos)
        fail("action '" + tok + "' of worker " + std::to_string(k) +
             " names no stage (write it as " + tok + "@s<stage>)");
      if (!by_worker && at != std::string::npos)
        fail("action '" + tok + "' names a stage, but the header has no workers=");
      std::size_t stage = k;
      if (by_worker) {
        stage = static_cast<std::size_t>(
            parse_count(tok.substr(at + 2), "stage of '" + tok + "'", int_max));
        if (stage >= s.actions.size())
          fail("action '" + tok + "': stage " + std::to_string(stage) +
               " out of range (stages=" + std::to_string(s.stages) + ")");
        s.worker_order[k].push_back(static_cast<int>(stage));
      }
      const std::string index = tok.substr(1, at == std::string::npos ? std::string::npos : at - 1);
      s.actions[stage].push_back(
          {kind->kind, static_cast<int>(parse_count(index, "action '" + tok + "'", int_max))});
    }
  }
  if (!header) throw ConfigError("xpipe: schedule text is empty (no 'xpipe-schedule' header)");
  return s;
}

}  // namespace xpipe
