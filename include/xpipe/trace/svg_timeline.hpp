// SVG timeline of a real or simulated run: stages as rows, F/B/Step boxes coloured by
// micro-batch and mini-batch, in the manner of the GPipe and XPipe papers; drawn from the run's
// ExecutionTrace (schedule/timing.hpp).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "xpipe/schedule/ir.hpp"
#include "xpipe/schedule/structure.hpp"
#include "xpipe/schedule/timing.hpp"

namespace xpipe {

namespace detail {
inline std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}
}  // namespace detail

//! What part of a run the SVG timeline shows, and how.
struct TimelineOptions {
  std::string title;
  int mini_batches = 6;  // show the actions of the first few mini-batches (fill and steady state)
  double width_px = 1200;
  double row_px = 30;
};

//! SVG timeline: a row per stage (per worker for a schedule with virtual stages, each box then
//! labelled with its stage, F3@s2), a box per action of the first `mini_batches` mini-batches at
//! its real start and duration. Box hue follows the micro-batch's position in its mini-batch,
//! lightness alternates with the mini-batch; backward boxes are darker than forward ones;
//! steps are thin black bars. Each box carries class (F, B or S), data-stage and data-index,
//! so tests and scripts can read the figure back.
inline std::string timeline_svg(const ExecutionTrace& trace, const Schedule& s,
                                const TimelineOptions& o = {}) {
  const int K = static_cast<int>(trace.stages.size()), M = s.micro_batches;
  // A row per worker: stage k's own without virtual stages, else its worker's (labelled so).
  const bool by_worker = s.has_virtual_stages();
  const int rows = by_worker ? s.workers() : K;
  check_structure(s);
  const std::vector<int> row_of = stage_workers(s);
  auto shown = [&](const Action& a) { return s.mini_batch_of(a) < o.mini_batches; };
  double t0 = std::numeric_limits<double>::max(), t1 = 0;
  for (const auto& stage : trace.stages)
    for (const ActionTiming& t : stage)
      if (shown(t.action)) {
        t0 = std::min(t0, t.start);
        t1 = std::max(t1, t.end);
      }
  if (t1 <= t0) t0 = 0, t1 = 1;
  const double left = 70, top = o.title.empty() ? 10 : 34, plot_w = o.width_px - left - 20;
  const double height = top + rows * o.row_px + 40;
  const double scale = plot_w / (t1 - t0);
  std::ostringstream os;
  os.precision(2);
  os << std::fixed;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << o.width_px << "\" height=\""
     << height << "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  os << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  if (!o.title.empty())
    os << "<text x=\"" << left << "\" y=\"20\" font-size=\"14\">" << detail::xml_escape(o.title)
       << "</text>\n";
  for (int r = 0; r < rows; ++r)
    os << "<text x=\"8\" y=\"" << top + r * o.row_px + o.row_px * 0.62 << "\">"
       << (by_worker ? "worker " : "stage ") << r << "</text>\n";
  for (int k = 0; k < K; ++k)
    for (const ActionTiming& t : trace.stages[k]) {
      const Action& a = t.action;
      if (!shown(a)) continue;
      const double x = left + (t.start - t0) * scale,
                   y = top + row_of[static_cast<std::size_t>(k)] * o.row_px + 2;
      const double w = std::max(1.0, (t.end - t.start) * scale);
      if (a.kind == ActionKind::Step) {
        os << "<rect class=\"S\" data-stage=\"" << k << "\" data-index=\"" << a.index << "\" x=\""
           << x << "\" y=\"" << y << "\" width=\"" << std::max(2.0, w) << "\" height=\""
           << o.row_px - 4 << "\" fill=\"black\"><title>stage " << k << " " << to_string(a)
           << "</title></rect>\n";
        continue;
      }
      const int j = a.index % M, mini = s.mini_batch_of(a.index);
      const int hue = static_cast<int>(360.0 * j / std::max(M, 1)) % 360;
      // Lightness by kind, in the kind table's order: F light, B dark, I between, W darkest.
      static_assert(action_kinds.size() == 5, "xpipe: timeline_svg: give the new kind a shade");
      constexpr std::array<int, action_kinds.size()> lightness{72, 48, 0, 58, 36};
      const int light = lightness[static_cast<std::size_t>(a.kind)] - (mini % 2) * 10;
      os << "<rect class=\"" << info(a.kind).letter << "\" data-stage=\"" << k << "\" data-index=\""
         << a.index << "\" x=\"" << x << "\" y=\"" << y << "\" width=\"" << w << "\" height=\""
         << o.row_px - 4 << "\" fill=\"hsl(" << hue << ",65%," << light
         << "%)\" stroke=\"white\" stroke-width=\"0.5\"><title>stage " << k << " " << to_string(a)
         << " (mini-batch " << mini << ")</title></rect>\n";
      if (w > 18)
        os << "<text x=\"" << x + 2 << "\" y=\"" << y + o.row_px * 0.55 << "\" font-size=\"9\">"
           << to_string(a) << (by_worker ? "@s" + std::to_string(k) : "") << "</text>\n";
    }
  const double axis_y = top + rows * o.row_px + 14;
  os << "<text x=\"" << left << "\" y=\"" << axis_y << "\">0 ms</text>\n";
  os << "<text x=\"" << left + plot_w - 60 << "\" y=\"" << axis_y << "\">" << (t1 - t0) * 1e3
     << " ms</text>\n";
  os << "<text x=\"" << left << "\" y=\"" << axis_y + 16
     << "\">F light, B dark (a split backward: I mid, W darker), S black; hue = micro-batch "
        "within its mini-batch, shade alternates with the mini-batch</text>\n";
  os << "</svg>\n";
  return os.str();
}

}  // namespace xpipe
