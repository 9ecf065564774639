// What `xpipe-train --compare` leaves in its output directory, parsed back: runs.json,
// runs.csv, accuracy.csv, the gnuplot SVG (one series per run), per-run timelines and traces.
// The directory comes from $XPIPE_TOOL_OUT (set by CTest after tool.end_to_end ran). And the
// rule by which the tool calls a run diverged.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "divergence.hpp"
#include "support/support.hpp"

namespace fs = std::filesystem;

namespace {
fs::path out_dir() {
  const char* d = std::getenv("XPIPE_TOOL_OUT");
  REQUIRE(d != nullptr);
  return d;
}
using xpipe::test::count_matches;
using xpipe::test::read_text;
}  // namespace

TEST_CASE("runs.json and runs.csv describe every run of the study", "[tool]") {
  const auto j = nlohmann::json::parse(read_text(out_dir() / "runs.json"));
  REQUIRE(j.size() == 8);
  std::set<std::string> predictors;
  for (const auto& r : j) {
    predictors.insert(r["predictor"]);
    REQUIRE(r["status"] == "ok");
    REQUIRE(r["epochs"].size() == 1);
    const auto& e = r["epochs"][0];
    REQUIRE(e["test_accuracy"].get<double>() > 0.3);  // far above chance after one epoch
    REQUIRE(e["test_accuracy"].get<double>() <= 1.0);
    // Mean cross-entropy over the test set: below chance, ln 10 = 2.3026 nats, after one epoch.
    REQUIRE(e["test_loss"].get<double>() > 0.0);
    REQUIRE(e["test_loss"].get<double>() < 2.3026);
    REQUIRE(e["samples_per_second"].get<double>() > 0);
    REQUIRE(e["bubble_fraction"].size() == 4);
    REQUIRE(r["weight_copies"].size() == 4);
    REQUIRE(fs::exists(out_dir() / r["timeline_svg"].get<std::string>()));
    REQUIRE(fs::exists(out_dir() / r["chrome_trace"].get<std::string>()));
  }
  REQUIRE(predictors ==
          std::set<std::string>{"latest", "stash", "2bw", "spectrain", "xpipe", "pipeoptim"});
  const std::string csv = read_text(out_dir() / "runs.csv");
  REQUIRE(count_matches(csv, "\n") == 1 + 8);  // header + a row per run and epoch
  REQUIRE(csv.rfind("run,schedule,predictor,optimizer,lr,model,stages,micro_batches,epoch,", 0) ==
          0);
  REQUIRE(count_matches(csv, ",ok\n") == 8);  // the status column
  const std::string acc = read_text(out_dir() / "accuracy.csv");
  REQUIRE(count_matches(acc, ",") == 2 * 8);  // header and one epoch row, 8 run columns each
  const std::string loss = read_text(out_dir() / "loss.csv");
  REQUIRE(count_matches(loss, ",") == 2 * 8);
  REQUIRE(loss.rfind("epoch,", 0) == 0);
}

TEST_CASE("gnuplot drew one series per run, and left its script", "[tool]") {
  REQUIRE(fs::exists(out_dir() / "accuracy.gp"));
  REQUIRE(fs::file_size(out_dir() / "accuracy.png") > 1000);
  const std::string svg = read_text(out_dir() / "accuracy.svg");
  REQUIRE(count_matches(svg, "<g id=\"gnuplot_plot_[0-9]+[a-z]*\"") >= 8);
  REQUIRE(count_matches(svg, "<g id=\"gnuplot_plot_9") == 0);
  REQUIRE(svg.find("async-1f1b+xpipe(adam)") != std::string::npos);
  const std::string loss = read_text(out_dir() / "loss.svg");
  REQUIRE(count_matches(loss, "<g id=\"gnuplot_plot_[0-9]+[a-z]*\"") >= 8);
  REQUIRE(fs::file_size(out_dir() / "loss.png") > 1000);
}

TEST_CASE("Timelines and Chrome traces of the runs parse back", "[tool]") {
  const std::string svg = read_text(out_dir() / "timeline-async-1f1b_xpipe_adam.svg");
  // The timeline shows 6 mini-batches of M = 4 over 4 stages: 96 forwards, 96 backwards.
  REQUIRE(count_matches(svg, "<rect class=\"F\"") == 96);
  REQUIRE(count_matches(svg, "<rect class=\"B\"") == 96);
  const auto trace =
      nlohmann::json::parse(read_text(out_dir() / "trace-async-1f1b_xpipe_adam.json"));
  std::size_t forwards = 0;
  for (const auto& e : trace["traceEvents"]) forwards += e["ph"] == "X" && e["cat"] == "forward";
  REQUIRE(forwards == 4 * 16 * 4);  // 2048 samples = 16 mini-batches of 128, M = 4, 4 stages
}

TEST_CASE("A run has diverged when its loss is not finite, above 1e6, or 10x its lowest",
          "[tool]") {
  using xpipe::tools::divergence;
  REQUIRE(divergence({}).empty());
  REQUIRE(divergence({2.3}).empty());
  // A high learning rate's first epoch swings far and comes back (Adam, lr 0.03): not diverged.
  REQUIRE(divergence({3368}).empty());
  REQUIRE(divergence({3368, 13.9}).empty());
  REQUIRE(divergence({3368, 13.9, 3.9}).empty());
  REQUIRE(divergence({std::nan("")}) == "epoch 1: loss is nan");
  REQUIRE(divergence({0.5, INFINITY}) == "epoch 2: loss is inf");
  REQUIRE(divergence({3.1e33}) == "epoch 1: loss 3.1e+33 is above 1e+06");
  // It had learned and ran away: judged against the lowest epoch before, not the first.
  REQUIRE(divergence({0.5, 0.3, 2.9}).empty());
  REQUIRE(divergence({0.5, 0.3, 3.1}) == "epoch 3: loss 3.1 is above 10x epoch 2's 0.3");
}
