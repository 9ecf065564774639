// Chrome-trace JSON of a real or simulated run (one track per stage; opens in Perfetto or
// chrome://tracing), from the run's ExecutionTrace (schedule/timing.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>
#include <string>

#include "xpipe/schedule/ir.hpp"
#include "xpipe/schedule/timing.hpp"

namespace xpipe {

namespace detail {
inline std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}
}  // namespace detail

//! Chrome-trace JSON of a run: one complete event ("ph": "X") per action, on one track per
//! stage, timestamps in microseconds, with the micro-batch and mini-batch as arguments.
inline std::string chrome_trace_json(const ExecutionTrace& trace, const Schedule& s,
                                     const std::string& run_name) {
  std::ostringstream os;
  os.precision(3);
  os << std::fixed << "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"run\":\""
     << detail::json_escape(run_name) << "\",\"schedule\":\"" << detail::json_escape(s.name)
     << "\"},\"traceEvents\":[";
  bool first = true;
  auto sep = [&] {
    if (!first) os << ',';
    first = false;
  };
  for (int k = 0; k < static_cast<int>(trace.stages.size()); ++k) {
    sep();
    os << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":" << k
       << ",\"args\":{\"name\":\"stage " << k << "\"}}";
  }
  for (int k = 0; k < static_cast<int>(trace.stages.size()); ++k)
    for (const ActionTiming& t : trace.stages[k]) {
      const Action& a = t.action;
      const int mini = s.mini_batch_of(a);
      sep();
      os << "{\"name\":\"" << to_string(a) << "\",\"cat\":\"" << info(a.kind).name
         << "\",\"ph\":\"X\",\"pid\":0,\"tid\":" << k << ",\"ts\":" << t.start * 1e6
         << ",\"dur\":" << (t.end - t.start) * 1e6 << ",\"args\":{\"mini_batch\":" << mini;
      if (info(a.kind).on_micro_batch) os << ",\"micro_batch\":" << a.index;
      os << "}}";
    }
  os << "]}\n";
  return os.str();
}

}  // namespace xpipe
