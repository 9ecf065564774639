// Learning-rate schedules: each epoch's rate against values worked by hand, every malformed text
// refused by name; and a rate set between epochs trains exactly as a pipeline built with it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "support/compare.hpp"
#include "support/emulated_device.hpp"
#include "support/support.hpp"
#include "xpipe/xpipe.hpp"

using namespace xpipe;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

// The rates of epochs 1..epochs.
std::vector<float> rates(const std::string& text, float base, int epochs) {
  const LearningRateSchedule s = LearningRateSchedule::parse(text);
  std::vector<float> out;
  for (int e = 1; e <= epochs; ++e) out.push_back(s.at(base, e, epochs));
  return out;
}

}  // namespace

TEST_CASE("LearningRateSchedule: constant is the base rate every epoch", "[lr_schedule]") {
  REQUIRE(rates("constant", 3e-4f, 3) == std::vector<float>{3e-4f, 3e-4f, 3e-4f});
  REQUIRE(LearningRateSchedule{}.at(0.05f, 7, 9) == 0.05f);  // the default
}

TEST_CASE("LearningRateSchedule: cosine against values worked by hand", "[lr_schedule]") {
  // lr (1 + cos(pi (e - 1) / 4)) / 2: 1, (1 + sqrt(2)/2) / 2, 1/2, (1 - sqrt(2)/2) / 2.
  REQUIRE(rates("cosine", 1.f, 4) ==
          std::vector<float>{1.f, static_cast<float>(0.85355339059327376220), 0.5f,
                             static_cast<float>(0.14644660940672623780)});
  // A power of two scales every rate exactly.
  REQUIRE(rates("cosine", 2.f, 4) ==
          std::vector<float>{2.f, static_cast<float>(1.7071067811865475244), 1.f,
                             static_cast<float>(0.29289321881345247560)});
  // Epoch 1 trains at the base rate itself (CosineAnnealingLR before its first step).
  REQUIRE(rates("cosine", 3e-4f, 10).front() == 3e-4f);
  REQUIRE(rates("cosine", 3e-4f, 1) == std::vector<float>{3e-4f});
  // E = 3 at lr 1e-3: 1e-3, 1e-3 (1 + 1/2) / 2 = 7.5e-4, 1e-3 (1 - 1/2) / 2 = 2.5e-4.
  const std::vector<float> three = rates("cosine", 1e-3f, 3);
  REQUIRE(three[1] == Approx(7.5e-4).epsilon(1e-6));
  REQUIRE(three[2] == Approx(2.5e-4).epsilon(1e-6));
}

TEST_CASE("LearningRateSchedule: step divides by 10 after each milestone", "[lr_schedule]") {
  REQUIRE(rates("step:2,3", 1.f, 4) == std::vector<float>{1.f, 1.f, 0.1f, 0.01f});
  // step:10,15: epochs 1-10 at lr, 11-15 at lr/10, 16 on at lr/100.
  const std::vector<float> r = rates("step:10,15", 1.f, 20);
  for (int e = 1; e <= 20; ++e) {
    INFO("epoch " << e);
    REQUIRE(r[static_cast<std::size_t>(e - 1)] == (e <= 10 ? 1.f : e <= 15 ? 0.1f : 0.01f));
  }
  // Milestones at or past the last epoch change nothing.
  REQUIRE(rates("step:3,8", 0.5f, 3) == std::vector<float>{0.5f, 0.5f, 0.5f});
  REQUIRE(rates("step:1", 2e-3f, 2)[1] == Approx(2e-4).epsilon(1e-6));
}

TEST_CASE("LearningRateSchedule: an epoch outside 1..epochs is refused", "[lr_schedule]") {
  const LearningRateSchedule s = LearningRateSchedule::parse("cosine");
  REQUIRE_THAT(test::message_of<ConfigError>([&] { s.at(1.f, 0, 4); }),
               Contains("'cosine': epoch 0 is outside 1..4"));
  REQUIRE_THAT(test::message_of<ConfigError>([&] { s.at(1.f, 5, 4); }),
               Contains("'cosine': epoch 5 is outside 1..4"));
}

TEST_CASE("LearningRateSchedule: every malformed text is refused, quoted", "[lr_schedule]") {
  const std::pair<std::string, std::string> cases[] = {
      {"", "is empty"},
      {"step:", "no milestones"},
      {"step", "step needs its milestones"},
      {"step:0", "milestone 0 is not >= 1"},
      {"step:-1", "milestone -1 is not >= 1"},
      {"step:5,3", "milestone 3 does not follow 5"},
      {"step:5,5", "milestone 5 does not follow 5"},
      {"step:a", "milestone 'a' is not a whole number"},
      {"step:5,", "milestone '' is not a whole number"},
      {"step:,5", "milestone '' is not a whole number"},
      {"step:+5", "milestone '+5' is not a whole number"},
      {"step: 5", "milestone ' 5' is not a whole number"},
      {"step:2.5", "milestone '2.5' is not a whole number"},
      {"step:99999999999", "milestone 99999999999 is too large"},
      {"linear", "unknown schedule"},
      {"Cosine", "unknown schedule"},
      {"cosine ", "unknown schedule"},
      {"constant:1", "unknown schedule"},
      {"warmup-cosine", "warmup-cosine needs its warmup"},
      {"warmup-cosine:", "warmup-cosine needs its warmup"},
      {"warmup-cosine10", "warmup-cosine needs its warmup"},
      {"warmup-cosine:-1", "warmup '-1' is not a whole number of steps >= 0"},
      {"warmup-cosine:1.5", "warmup '1.5' is not a whole number of steps >= 0"},
      {"warmup-cosine:x", "warmup 'x' is not a whole number of steps >= 0"},
      {"warmup-cosine:99999999999999999999", "warmup '99999999999999999999' is not a whole"}};
  for (const auto& [text, why] : cases) {
    INFO("text '" << text << "'");
    const std::string m = test::message_of<ConfigError>([&] { LearningRateSchedule::parse(text); });
    REQUIRE_THAT(m, Contains("'" + text + "': " + why));
    REQUIRE_THAT(m, Contains("expected constant, cosine, step:E1,E2,... (whole epochs >= 1, each "
                             "above the one before) or warmup-cosine:W"));
  }
}

TEST_CASE("LearningRateSchedule: text() gives back the canonical text", "[lr_schedule]") {
  for (const std::string text : {"constant", "cosine", "step:1", "step:10,15", "step:2,3,40",
                                 "warmup-cosine:0", "warmup-cosine:200"}) {
    INFO(text);
    const LearningRateSchedule s = LearningRateSchedule::parse(text);
    REQUIRE(s.text() == text);
    REQUIRE(LearningRateSchedule::parse(s.text()) == s);
  }
  REQUIRE(LearningRateSchedule::parse("step:010,15").text() == "step:10,15");
  REQUIRE(LearningRateSchedule{}.text() == "constant");
  REQUIRE(LearningRateSchedule::parse("step:10,15").milestones == std::vector<int>{10, 15});
  REQUIRE(LearningRateSchedule::parse("warmup-cosine:007").text() == "warmup-cosine:7");
}

// StepRates{.warmup = 4, .total = 12} (floor 0.1), worked by hand: steps 1-4 rise n / 4; then
// 0.1 + 0.9 (1 + cos(pi (n - 4) / 8)) / 2: step 5 0.1 + 0.45 (1 + cos(pi/8)) = 0.965745790,
// step 6 0.1 + 0.45 (1 + sqrt(2)/2) = 0.868198052, step 8 0.1 + 0.45 = 0.55, step 12 on 0.1.
TEST_CASE("StepRates: warmup, then cosine decay to the floor, against values worked by hand",
          "[lr_schedule]") {
  const StepRates r{.warmup = 4, .total = 12};
  REQUIRE(r.factor(1) == 0.25);
  REQUIRE(r.factor(2) == 0.5);
  REQUIRE(r.factor(4) == 1.0);
  REQUIRE(r.factor(5) == Approx(0.965745790).epsilon(1e-9));
  REQUIRE(r.factor(6) == Approx(0.868198052).epsilon(1e-9));
  REQUIRE(r.factor(8) == Approx(0.55).epsilon(1e-12));
  REQUIRE(r.factor(11) == Approx(0.1 + 0.45 * (1 - 0.9238795325)).epsilon(1e-9));
  REQUIRE(r.factor(12) == 0.1);
  REQUIRE(r.factor(40) == 0.1);  // held after the run's end
  REQUIRE(r.factor(0) == 0.25);  // before the first step: read as step 1
  // No warmup: the cosine from step 1 (progress (n - 0) / 12 already at step 1).
  const StepRates cos_only{.warmup = 0, .total = 12};
  REQUIRE(cos_only.factor(6) == Approx(0.55).epsilon(1e-12));
  REQUIRE(cos_only.factor(12) == 0.1);
  // Inactive: 1 everywhere.
  REQUIRE(StepRates{}.factor(3) == 1.0);
  REQUIRE_FALSE(StepRates{}.active());
}

TEST_CASE("StepRates: the rates a prediction over s steps extrapolates with", "[lr_schedule]") {
  const StepRates r{.warmup = 4, .total = 12};
  // From 3 steps taken, 2.5 steps ahead at base 2: 2 (f(4) + f(5) + f(6) / 2).
  REQUIRE(r.rate_sum(2.0, 3, 2.5) == Approx(2 * (1 + 0.965745790 + 0.868198052 / 2)).epsilon(1e-9));
  REQUIRE(r.rate_sum(2.0, 0, 3) == Approx(2 * (0.25 + 0.5 + 0.75)).epsilon(1e-12));
  REQUIRE(r.rate_sum(2.0, 0, 0) == 0);
  // Inactive: steps * base, today's extrapolation.
  REQUIRE(StepRates{}.rate_sum(1e-3, 7, 3) == Approx(3e-3).epsilon(1e-12));
}

TEST_CASE("StepRates: warmup-cosine's per-step rates, and the runs they cannot fit refused",
          "[lr_schedule]") {
  const LearningRateSchedule s = LearningRateSchedule::parse("warmup-cosine:4");
  REQUIRE(s.step_rates(12) == StepRates{.warmup = 4, .total = 12});
  REQUIRE(s.at(3e-4f, 2, 5) == 3e-4f);  // the epoch's rate is the base rate
  REQUIRE_FALSE(LearningRateSchedule::parse("cosine").step_rates(12).active());
  REQUIRE_THAT(test::message_of<ConfigError>([&] { s.step_rates(4); }),
               Contains("'warmup-cosine:4': the warmup (4 steps) must be shorter than the run "
                        "(4 optimizer steps)"));
  REQUIRE_THAT(test::message_of<ConfigError>([] { StepRates{.warmup = 5, .total = 3}.check(); }),
               Contains("the warmup (5 steps) must be >= 0 and shorter than the schedule (3"));
  REQUIRE_THAT(
      test::message_of<ConfigError>([] { StepRates{.warmup = 1, .total = 3, .floor = 0}.check(); }),
      Contains("the floor must lie in (0, 1]"));
}

// SGD with momentum: predict(s) = W - s lr m; under StepRates the s rates of the steps ahead,
// summed: from 3 steps taken, 2.5 ahead at lr 0.1, 0.1 (1 + 0.965745790 + 0.868198052 / 2) =
// 0.239984482; W = 1, m = 2: 1 - 0.479968963 = 0.520031037.
TEST_CASE("OptimizerState: under StepRates the optimizer and its predictions take each step's rate",
          "[lr_schedule]") {
  OptimizerState<SGD, Host> st(SGD{.lr = 0.1f, .momentum = 0.9f}, 3);
  for (index_t i = 0; i < 3; ++i) {
    st.weights()[i] = 1.f;
    st.moment(0)[i] = 2.f;
  }
  st.set_steps_taken(3);
  std::vector<float> out(3);
  st.predict(HostContext{}, 2.5f, out.data());
  REQUIRE(out[0] == Approx(1 - 2 * 0.25f).epsilon(1e-6));  // inactive: 2.5 * 0.1 * 2
  st.set_step_rates({.warmup = 4, .total = 12});
  st.predict(HostContext{}, 2.5f, out.data());
  for (const float v : out) REQUIRE(v == Approx(0.520031037).epsilon(1e-6));
  REQUIRE(st.optimizer().lr == 0.1f);  // the next step is step 4: factor 1
  REQUIRE(st.optimizer_at(2).lr == 0.05f);
  REQUIRE(st.optimizer_at(8).lr == Approx(0.055).epsilon(1e-6));
  st.set_steps_taken(7);
  REQUIRE(st.optimizer().lr == Approx(0.055).epsilon(1e-6));  // step 8's
  st.set_optimizer(SGD{.lr = 1.f, .momentum = 0.9f});         // another base rate, same schedule
  REQUIRE(st.optimizer().lr == Approx(0.55).epsilon(1e-6));
  st.set_step_rates({});
  REQUIRE(st.optimizer().lr == 1.f);
  REQUIRE_THROWS_AS(st.set_step_rates({.warmup = 12, .total = 12}), ConfigError);
}

namespace {

using S0 = Stage<Linear<12, 16>, ReLU>;
using S1 = Stage<Linear<16, 4>>;
constexpr PipelineOptions options{.batch = 16, .micro_batches = 2, .seed = 5};

// Epoch e's data: 6 mini-batches of 16 rows, different each epoch.
test::LabelledData epoch_data(int e) {
  return test::random_classification(96, 12, 4, 200 + e);
}

template <class P>
void train_epoch(P& pipe, const std::string& schedule, int e) {
  ReferenceExecutor exec;
  const auto d = epoch_data(e);
  pipe.train(make_schedule(schedule, 2, options.micro_batches, 6), d.epoch(), exec);
}

// A rate set before any training trains as a pipeline built with it, over two epochs; and the
// rate it replaced would have trained otherwise (so the comparison can fail).
template <class P, class O>
void check_set_before_training(const std::string& schedule, O with_a, O with_b, float a) {
  P built_a(with_a, options), built_b(with_b, options), set_a(with_b, options);
  set_a.set_learning_rate(a);
  REQUIRE(set_a.learning_rate() == a);
  for (int e = 1; e <= 2; ++e) {
    train_epoch(built_a, schedule, e);
    train_epoch(built_b, schedule, e);
    train_epoch(set_a, schedule, e);
  }
  REQUIRE(set_a.weights() == built_a.weights());
  REQUIRE(built_b.weights() != built_a.weights());
}

// Epoch 1 at rate a, then set_learning_rate(b) and epoch 2, against epoch 1's checkpoint
// restored into a pipeline built with b and trained one epoch: bitwise the same weights. And
// epoch 2 at a differs (so the comparison can fail).
template <class P, class O>
void check_set_between_epochs(const std::string& schedule, O with_a, O with_b, float b,
                              const std::string& tag) {
  const fs::path root = test::scratch_dir("lr_schedule") / tag;
  fs::remove_all(root);
  P changed(with_a, options), kept(with_a, options);
  train_epoch(changed, schedule, 1);
  train_epoch(kept, schedule, 1);
  save_checkpoint(changed, root, "ckpt-1");
  changed.set_learning_rate(b);
  REQUIRE(changed.learning_rate() == b);
  train_epoch(changed, schedule, 2);
  train_epoch(kept, schedule, 2);
  P restored(with_b, options);
  load_checkpoint(restored, read_checkpoint(root / "ckpt-1"));
  train_epoch(restored, schedule, 2);
  REQUIRE(changed.weights() == restored.weights());
  REQUIRE(kept.weights() != restored.weights());
  fs::remove_all(root);
}

}  // namespace

TEST_CASE("Pipeline::set_learning_rate before training = a pipeline built with that rate",
          "[lr_schedule][pipeline]") {
  SECTION("GPipe, Latest, SGD with momentum") {
    check_set_before_training<Pipeline<S0, S1, Latest, SGD>>(
        "gpipe", SGD{.lr = 0.05f, .momentum = 0.9f}, SGD{.lr = 0.2f, .momentum = 0.9f}, 0.05f);
  }
  SECTION("async 1F1B, XPipe (predicts with the rate), Adam") {
    check_set_before_training<Pipeline<S0, S1, XPipe, Adam>>("async-1f1b", Adam{.lr = 1e-3f},
                                                             Adam{.lr = 4e-3f}, 1e-3f);
  }
  SECTION("async 1F1B, PipeMare (scales the rate per stage), AnyOptimizer") {
    check_set_before_training<Pipeline<S0, S1, PipeMare, AnyOptimizer>>(
        "async-1f1b", make_optimizer("adamw", 2e-3f), make_optimizer("adamw", 5e-4f), 2e-3f);
  }
}

TEST_CASE("Pipeline::set_learning_rate between epochs = the checkpoint resumed at that rate",
          "[lr_schedule][pipeline]") {
  SECTION("async 1F1B, PipeOptim, Adam") {
    check_set_between_epochs<Pipeline<S0, S1, PipeOptim, Adam>>(
        "async-1f1b", Adam{.lr = 1e-3f}, Adam{.lr = 1e-4f}, 1e-4f, "pipeoptim");
  }
  SECTION("1F1B-flush, Latest, SGD with momentum") {
    check_set_between_epochs<Pipeline<S0, S1, Latest, SGD>>(
        "1f1b-flush", SGD{.lr = 0.05f, .momentum = 0.9f}, SGD{.lr = 0.005f, .momentum = 0.9f},
        0.005f, "sgd");
  }
  SECTION("async 1F1B, XPipe, Adam on a device backend (emulated: the rate is a host value)") {
    check_set_between_epochs<Pipeline<S0, S1, XPipe, Adam, test::EmulatedDevice>>(
        "async-1f1b", Adam{.lr = 1e-3f}, Adam{.lr = 3e-4f}, 3e-4f, "device");
  }
  SECTION("async 1F1B, AnyPredictor (xpipe), AnyOptimizer: the tool's pipeline type") {
    using P = Pipeline<S0, S1, AnyPredictor, AnyOptimizer>;
    const fs::path root = test::scratch_dir("lr_schedule") / "any";
    fs::remove_all(root);
    P changed(make_optimizer("adam", 1e-3f), options, make_predictor("xpipe"));
    train_epoch(changed, "async-1f1b", 1);
    save_checkpoint(changed, root, "ckpt-1");
    changed.set_learning_rate(2.5e-4f);
    train_epoch(changed, "async-1f1b", 2);
    P restored(make_optimizer("adam", 2.5e-4f), options, make_predictor("xpipe"));
    load_checkpoint(restored, read_checkpoint(root / "ckpt-1"));
    train_epoch(restored, "async-1f1b", 2);
    REQUIRE(changed.weights() == restored.weights());
    fs::remove_all(root);
  }
}

TEST_CASE("Pipeline::set_learning_rate refuses a rate that is not finite and > 0",
          "[lr_schedule][pipeline]") {
  Pipeline<S0, S1, Latest, Adam> p(Adam{.lr = 1e-3f}, options);
  for (const float bad : {0.f, -1e-3f, std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::infinity()}) {
    INFO(bad);
    REQUIRE_THAT(test::message_of<ConfigError>([&] { p.set_learning_rate(bad); }),
                 Contains("Pipeline::set_learning_rate: the rate must be finite and > 0"));
  }
  REQUIRE(p.learning_rate() == 1e-3f);  // unchanged
}

TEST_CASE("SequentialTrainer::set_learning_rate = a trainer built with that rate",
          "[lr_schedule]") {
  using Whole = Stage<Linear<12, 16>, ReLU, Linear<16, 4>>;
  const auto d = epoch_data(1);
  auto trained = [&](SequentialTrainer<Whole, Adam>& t) {
    for (index_t first = 0; first < d.rows; first += 16)
      t.train_step(HostContext{}, {d.x.data() + first * 12, 16, 12}, d.y.data() + first);
    return std::vector<float>(t.state().weights(), t.state().weights() + Whole::param_count);
  };
  SequentialTrainer<Whole, Adam> built_a(Adam{.lr = 1e-3f}, 16, 5),
      built_b(Adam{.lr = 3e-3f}, 16, 5), set_a(Adam{.lr = 3e-3f}, 16, 5);
  set_a.set_learning_rate(1e-3f);
  REQUIRE(set_a.learning_rate() == 1e-3f);
  const std::vector<float> want = trained(built_a);
  REQUIRE(trained(set_a) == want);
  REQUIRE(trained(built_b) != want);
  REQUIRE_THROWS_AS(set_a.set_learning_rate(0.f), ConfigError);
}

namespace {

// The rate of step n under StepRates{warmup, total} at base lr, written from the definition
// (independently of StepRates::factor).
float warmup_cosine_rate(float lr, long n, long warmup, long total) {
  const double pi = 3.14159265358979323846;
  if (n <= warmup) return static_cast<float>(lr * static_cast<double>(n) / warmup);
  const double p =
      std::min(1.0, static_cast<double>(n - warmup) / static_cast<double>(total - warmup));
  return static_cast<float>(lr * (0.1 + 0.9 * 0.5 * (1.0 + std::cos(pi * p))));
}

// One mini-batch per train() call, so a rate can be set before each step.
template <class P>
void train_one(P& pipe, const std::string& schedule, int step) {
  ReferenceExecutor exec;
  const auto d = test::random_classification(16, 12, 4, 300 + step);
  pipe.train(make_schedule(schedule, 2, options.micro_batches, 1), d.epoch(), exec);
}

}  // namespace

TEST_CASE("Pipeline::set_step_rates = the rate of each step set by hand before it",
          "[lr_schedule][pipeline]") {
  // GPipe, one mini-batch a call: step n of each stage happens in call n.
  auto check = [](auto with_rates, auto by_hand, auto constant, float lr) {
    with_rates.set_step_rates({.warmup = 3, .total = 8});
    for (int n = 1; n <= 10; ++n) {
      INFO("step " << n);
      by_hand.set_learning_rate(warmup_cosine_rate(lr, n, 3, 8));
      REQUIRE(with_rates.learning_rate() == by_hand.learning_rate());
      train_one(with_rates, "gpipe", n);
      train_one(by_hand, "gpipe", n);
      train_one(constant, "gpipe", n);
      REQUIRE(with_rates.weights() == by_hand.weights());
    }
    REQUIRE(constant.weights() != by_hand.weights());
  };
  SECTION("Adam") {
    using P = Pipeline<S0, S1, Latest, Adam>;
    check(P(Adam{.lr = 2e-3f}, options), P(Adam{.lr = 2e-3f}, options),
          P(Adam{.lr = 2e-3f}, options), 2e-3f);
  }
  SECTION("AnyOptimizer (sgd), the tool's optimizer type") {
    using P = Pipeline<S0, S1, Latest, AnyOptimizer>;
    check(P(make_optimizer("sgd", 0.05f), options), P(make_optimizer("sgd", 0.05f), options),
          P(make_optimizer("sgd", 0.05f), options), 0.05f);
  }
}

TEST_CASE("Pipeline::set_step_rates: threaded = reference, and a checkpoint resumes the schedule",
          "[lr_schedule][pipeline]") {
  const StepRates rates{.warmup = 4, .total = 12};
  auto run = [&](auto& pipe, int e, auto& exec) {
    const auto d = epoch_data(e);
    pipe.train(make_schedule("async-1f1b", 2, options.micro_batches, 6), d.epoch(), exec);
  };
  ReferenceExecutor reference;
  ThreadedExecutor threaded;
  // a and b under the rates, on the reference and the threaded executor, give the same bits;
  // flat, at the constant rate, other ones.
  auto agree_under_rates = [&](auto& a, auto& b, auto& flat) {
    a.set_step_rates(rates);
    b.set_step_rates(rates);
    run(a, 1, reference);
    run(b, 1, threaded);
    run(flat, 1, reference);
    REQUIRE(a.weights() == b.weights());
    REQUIRE(a.weights() != flat.weights());
  };
  SECTION("XPipe (predicts over the rates ahead), Adam") {
    using P = Pipeline<S0, S1, XPipe, Adam>;
    const fs::path root = test::scratch_dir("lr_schedule") / "step_rates";
    fs::remove_all(root);
    P a(Adam{.lr = 2e-3f}, options), b(Adam{.lr = 2e-3f}, options),
        flat(Adam{.lr = 2e-3f}, options);
    agree_under_rates(a, b, flat);
    save_checkpoint(a, root, "ckpt-1");
    run(a, 2, reference);
    run(b, 2, threaded);
    REQUIRE(a.weights() == b.weights());
    P resumed(Adam{.lr = 2e-3f}, options);
    load_checkpoint(resumed, read_checkpoint(root / "ckpt-1"));
    resumed.set_step_rates(rates);
    run(resumed, 2, reference);
    REQUIRE(resumed.weights() == a.weights());
    fs::remove_all(root);
  }
  SECTION("MultiStep (runs the steps ahead, each at its rate), PipeMare, AnyOptimizer") {
    for (const std::string name : {"multistep", "pipemare", "pipeoptim"}) {
      INFO(name);
      using P = Pipeline<S0, S1, AnyPredictor, AnyOptimizer>;
      P a(make_optimizer("adam", 2e-3f), options, make_predictor(name)),
          b(make_optimizer("adam", 2e-3f), options, make_predictor(name)),
          flat(make_optimizer("adam", 2e-3f), options, make_predictor(name));
      agree_under_rates(a, b, flat);
    }
  }
}
