// xpipe-train --sweep's arithmetic (tools/sweep.hpp) against values worked out by hand: mean and
// sample sd, the gap to GPipe paired by seed (a seed whose remedy or baseline did not finish
// drops out), status counts, the plan's order and schedules, and the list flags' messages.
// Also the reader of records.tsv (tools/run_checkpoints.hpp), today's lines and older ones.
#include "sweep.hpp"

#include <catch2/catch.hpp>
#include <cmath>

using namespace xpipe::tools;

namespace {

SweepRun run_of(const SweepPoint& p, std::uint64_t seed, SweepStatus status,
                std::vector<double> accuracy) {
  SweepRun r;
  r.point = p;
  r.seed = seed;
  r.status = status;
  for (std::size_t e = 0; e < accuracy.size(); ++e) {
    EpochRecord er;
    er.epoch = static_cast<int>(e) + 1;
    er.test_accuracy = accuracy[e];
    er.samples_per_second = 1000.0 * seed;
    r.epochs.push_back(er);
  }
  if (status == SweepStatus::ok) r.weight_copies = {3, 2};
  return r;
}

}  // namespace

TEST_CASE("stat_of: mean and sample standard deviation", "[tool][sweep]") {
  const Stat s = stat_of({1, 2, 3, 4});  // deviations -1.5 -0.5 0.5 1.5: squares sum to 5
  CHECK(s.n == 4);
  CHECK(s.mean == Approx(2.5));
  CHECK(s.sd == Approx(std::sqrt(5.0 / 3.0)));
  const Stat one = stat_of({5});
  CHECK(one.n == 1);
  CHECK(one.mean == 5);
  CHECK(std::isnan(one.sd));
  const Stat none = stat_of({});
  CHECK(none.n == 0);
  CHECK(std::isnan(none.mean));
}

TEST_CASE("summarize pairs each remedy with GPipe of the same seed", "[tool][sweep]") {
  const SweepPoint base{2, 1, "gpipe", "latest", "adam", 1e-3f};
  const SweepPoint xp{2, 1, "async-1f1b", "xpipe", "adam", 1e-3f};
  const SweepPoint other_m{2, 4, "gpipe", "latest", "adam", 1e-3f};  // not xp's baseline
  const SweepPoint bw{2, 1, "2bw", "2bw", "adam", 1e-3f};
  std::vector<SweepRun> runs{
      run_of(base, 1, SweepStatus::ok, {0.70, 0.80}),
      run_of(base, 2, SweepStatus::ok, {0.72, 0.82}),
      run_of(base, 3, SweepStatus::ok, {0.74, 0.84}),
      run_of(other_m, 1, SweepStatus::ok, {0.10, 0.10}),
      run_of(xp, 1, SweepStatus::ok, {0.60, 0.78}),
      run_of(xp, 2, SweepStatus::diverged, {0.30}),
      run_of(xp, 3, SweepStatus::ok, {0.70, 0.83}),
      run_of(bw, 1, SweepStatus::not_run, {}),
  };
  runs.back().why = "2BW needs M >= K";
  const auto cells = summarize(runs, 2);
  REQUIRE(cells.size() == 4);  // in run order: base, other_m, xp, bw
  const SweepCell& b = cells[0];
  CHECK(b.point.baseline());
  CHECK(b.ok == 3);
  CHECK(b.gap.empty());
  CHECK(b.accuracy[1].mean == Approx(82.0));
  CHECK(b.accuracy[1].sd == Approx(2.0));  // 80, 82, 84
  CHECK(b.samples_per_second.mean == Approx(2000.0));
  const SweepCell& x = cells[2];
  CHECK(x.runs == 3);
  CHECK(x.ok == 2);
  CHECK(x.diverged == 1);
  // Seeds 1 and 3 finished: epoch 1 accuracies 60, 70; epoch 2 78, 83.
  CHECK(x.accuracy[0].n == 2);
  CHECK(x.accuracy[0].mean == Approx(65.0));
  CHECK(x.accuracy[0].sd == Approx(std::sqrt(50.0)));
  CHECK(x.accuracy[1].mean == Approx(80.5));
  CHECK(x.accuracy[1].sd == Approx(std::sqrt(12.5)));
  // Gaps by seed: epoch 1: 60 - 70 = -10, 70 - 74 = -4; epoch 2: 78 - 80 = -2, 83 - 84 = -1.
  REQUIRE(x.gap.size() == 2);
  CHECK(x.gap[0].n == 2);
  CHECK(x.gap[0].mean == Approx(-7.0));
  CHECK(x.gap[0].sd == Approx(std::sqrt(18.0)));
  CHECK(x.gap[1].mean == Approx(-1.5));
  CHECK(x.gap[1].sd == Approx(std::sqrt(0.5)));
  CHECK(x.weight_copies == std::vector<int>{3, 2});
  const SweepCell& n = cells[3];
  CHECK(n.not_run == 1);
  CHECK(n.ok == 0);
  CHECK(n.accuracy[1].n == 0);
  CHECK(n.gap[1].n == 0);
  CHECK(n.why == "2BW needs M >= K");
}

TEST_CASE("summarize: a remedy whose baseline did not finish has no gap", "[tool][sweep]") {
  const SweepPoint base{4, 1, "gpipe", "latest", "sgd", 0.01f};
  const SweepPoint st{4, 1, "async-1f1b", "stash", "sgd", 0.01f};
  const auto cells = summarize(
      {run_of(base, 1, SweepStatus::diverged, {0.5}), run_of(st, 1, SweepStatus::ok, {0.6})}, 1);
  REQUIRE(cells.size() == 2);
  CHECK(cells[1].accuracy[0].n == 1);
  CHECK(cells[1].gap[0].n == 0);
  CHECK(std::isnan(cells[1].gap[0].mean));
}

TEST_CASE("sweep_points: per optimizer, M and K the baseline first, 2BW on its schedule",
          "[tool][sweep]") {
  SweepPlan plan;
  plan.stages = {2, 8};
  plan.micro_batches = {1};
  plan.predictors = {"latest", "2bw"};
  plan.optimizers = {"adam", "sgd"};
  plan.lr = 1e-3f;
  plan.sgd_lr = 0.01f;
  const auto p = sweep_points(plan);
  REQUIRE(p.size() == 2 * 2 * 3);
  CHECK(p[0].label() == "gpipe+latest(adam)");
  CHECK(p[0].stages == 2);
  CHECK(p[1].label() == "async-1f1b+latest(adam)");
  CHECK(p[2].label() == "2bw+2bw(adam)");
  CHECK(p[3].stages == 8);
  CHECK(p[6].label() == "gpipe+latest(sgd)");
  CHECK(p[6].lr == 0.01f);
  CHECK(p[0].lr == 1e-3f);
}

TEST_CASE("sweep_points: each remedy on each asynchronous schedule, 2BW once on its own",
          "[tool][sweep]") {
  SweepPlan plan;
  plan.stages = {4};
  plan.micro_batches = {1};
  plan.predictors = {"xpipe", "2bw", "paci"};
  plan.schedules = {"async-1f1b", "async-zb"};
  plan.optimizers = {"adam"};
  const auto p = sweep_points(plan);
  std::vector<std::string> labels;
  for (const SweepPoint& q : p) labels.push_back(q.label());
  CHECK(labels == std::vector<std::string>{"gpipe+latest(adam)", "async-1f1b+xpipe(adam)",
                                           "async-zb+xpipe(adam)", "2bw+2bw(adam)",
                                           "async-1f1b+paci(adam)", "async-zb+paci(adam)"});
  CHECK(sweep_remedies(plan).size() == 5);
  CHECK(sweep_remedies(plan)[2].label() == "2bw+2bw");
}

TEST_CASE("the sweep's list flags name what is wrong", "[tool][sweep]") {
  std::vector<int> ints;
  CHECK(parse_int_list("2,4", {2, 4, 8}, 0, 0, ints).empty());
  CHECK(ints == std::vector<int>{2, 4});
  CHECK(parse_int_list("2,3", {2, 4, 8}, 0, 0, ints) == "'3' is not one of 2, 4, 8");
  CHECK(parse_int_list("1,1", {}, 1, 1024, ints) == "1 is listed twice");
  CHECK(parse_int_list("x", {}, 1, 1024, ints) == "'x' is not a whole number from 1 to 1024");
  CHECK(parse_int_list("-1", {}, 1, 1024, ints) == "'-1' is not a whole number from 1 to 1024");
  CHECK(parse_int_list("99999999999", {}, 1, 1024, ints) ==
        "'99999999999' is not a whole number from 1 to 1024");
  std::vector<std::string> names;
  CHECK(parse_name_list("adam", {"sgd", "adam"}, names).empty());
  CHECK(parse_name_list("adam,", {"sgd", "adam"}, names) == "'' is not one of sgd, adam");
}

TEST_CASE("records.tsv reads the lines of this and older xpipe-trains", "[tool][checkpoint]") {
  // Today's line: epoch, loss, test accuracy, samples/s, seconds, 2 bubbles, 0 prediction-error
  // entries, the test loss.
  const auto now = parse_records("1\t0.5\t0.8\t100\t2\t0.1\t0.2\t0\t1.25\n", "now", 2);
  REQUIRE(now.size() == 1);
  CHECK(now[0].loss == 0.5);
  CHECK(now[0].bubble == std::vector<double>{0.1, 0.2});
  CHECK(now[0].test_loss == 1.25);
  // A test loss not measured is written "nan" and reads back as NaN.
  CHECK(
      std::isnan(parse_records("1\t0.5\t0.8\t100\t2\t0.1\t0.2\t0\tnan\n", "nan", 2)[0].test_loss));
  // Before the test loss, and before the prediction-error entries: read, the test loss NaN.
  const auto older = parse_records("1\t0.5\t0.8\t100\t2\t0.1\t0.2\t0\n", "older", 2);
  CHECK(std::isnan(older[0].test_loss));
  const auto oldest = parse_records("1\t0.5\t0.8\t100\t2\t0.1\t0.2\n", "oldest", 2);
  CHECK(std::isnan(oldest[0].test_loss));
  CHECK(oldest[0].prediction_error.empty());
  // One entry (stage, s, count, error, cosine), then the test loss.
  const auto entry =
      parse_records("1\t0.5\t0.8\t100\t2\t0.1\t0.2\t1\t0\t1\t7\t0.01\t0.99\t2.5\n", "entry", 2);
  REQUIRE(entry[0].prediction_error.size() == 1);
  CHECK(entry[0].prediction_error[0].count == 7);
  CHECK(entry[0].test_loss == 2.5);
  // Anything else after it is not a record.
  CHECK_THROWS_WITH(parse_records("1\t0.5\t0.8\t100\t2\t0.1\t0.2\t0\t1.25\tx\n", "junk", 2),
                    Catch::Contains("junk, line 1: not an epoch record"));
  CHECK_THROWS_WITH(parse_records("1\t0.5\t0.8\t100\t2\t0.1\t0.2\t0\t1.2x\n", "bad", 2),
                    Catch::Contains("bad, line 1: not an epoch record"));
}
