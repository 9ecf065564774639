// Trace writers: the Chrome trace and the SVG timeline of a real run, parsed back and checked
// against the schedule that ran.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "support/support.hpp"
#include "xpipe/xpipe.hpp"

using namespace xpipe;

namespace {
using S0 = Stage<Linear<8, 16>, ReLU>;
using S1 = Stage<Linear<16, 16>, ReLU>;
using S2 = Stage<Linear<16, 4>>;

struct Run {
  Schedule schedule = async_1f1b(3, 2, 10);
  ExecutionTrace trace;
};

Run run_small() {
  Run r;
  const auto data = test::random_classification(8 * 10, 8, 4, 2);
  Pipeline<S0, S1, S2, XPipe> p(Adam{}, {.batch = 8, .micro_batches = 2});
  ThreadedExecutor exec;
  p.train(r.schedule, data.epoch(), exec);
  r.trace = exec.trace();
  return r;
}

using test::count_matches;
}  // namespace

TEST_CASE("Chrome trace: one event per action on one track per stage", "[trace]") {
  const Run r = run_small();
  const auto j = nlohmann::json::parse(chrome_trace_json(r.trace, r.schedule, "test run"));
  REQUIRE(j["otherData"]["run"] == "test run");
  std::size_t complete = 0, names = 0;
  std::vector<double> last_end(3, -1);
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M") {
      ++names;
      REQUIRE(e["args"]["name"] == "stage " + std::to_string(e["tid"].get<int>()));
      continue;
    }
    REQUIRE(e["ph"] == "X");
    ++complete;
    const int k = e["tid"];
    const double ts = e["ts"], dur = e["dur"];
    REQUIRE(dur >= 0);
    REQUIRE(ts >= last_end[k] - 1e-3);  // a stage runs one action at a time, in order
    last_end[k] = ts + dur;
    const std::string name = e["name"];
    if (name[0] != 'S') REQUIRE(e["args"]["micro_batch"].get<int>() == std::stoi(name.substr(1)));
  }
  std::size_t actions = 0;
  for (const auto& l : r.schedule.actions) actions += l.size();
  REQUIRE(names == 3);
  REQUIRE(complete == actions);
}

TEST_CASE("SVG timeline: a box per action of the shown mini-batches", "[trace]") {
  const Run r = run_small();
  TimelineOptions o;
  o.mini_batches = 4;
  o.title = "a <test> & title";
  const std::string svg = timeline_svg(r.trace, r.schedule, o);
  REQUIRE(svg.rfind("<svg ", 0) == 0);
  REQUIRE(svg.find("</svg>") != std::string::npos);
  REQUIRE(svg.find("a &lt;test&gt; &amp; title") != std::string::npos);
  // 3 stages x 4 mini-batches x 2 micro-batches: 24 forwards, 24 backwards; 3 x 4 steps.
  REQUIRE(count_matches(svg, "<rect class=\"F\"") == 24);
  REQUIRE(count_matches(svg, "<rect class=\"B\"") == 24);
  REQUIRE(count_matches(svg, "<rect class=\"S\"") == 12);
  REQUIRE(count_matches(svg, "data-stage=\"2\"") == 20);
  // Every box lies inside the drawing.
  const std::regex box("<rect class=\"[FBS]\"[^>]* x=\"([0-9.]+)\"[^>]* width=\"([0-9.]+)\"");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), box); it != std::sregex_iterator();
       ++it)
    REQUIRE(std::stod((*it)[1]) + std::stod((*it)[2]) <= o.width_px + 2);
}
