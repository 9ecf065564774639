// The staleness remedies of issue 14 against values worked out by hand from each published rule
// (a few steps on a few weights), and against the executors' bitwise oracle.

#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "support/support.hpp"
#include "xpipe/xpipe.hpp"

using namespace xpipe;

namespace {

const HostContext ctx{};

// A predictor state for stage k of `s`, built as Pipeline::train builds it.
struct Setup {
  Schedule schedule;
  StalenessAnalysis analysis;
  explicit Setup(Schedule s) : schedule(std::move(s)), analysis(analyze_staleness(schedule)) {}
  PredictorSetup at(int k, index_t params) const { return {k, params, &schedule, &analysis}; }
};

template <class O>
OptimizerState<O, Host> state(O o, std::vector<float> w) {
  OptimizerState<O, Host> st(o, static_cast<index_t>(w.size()));
  for (std::size_t i = 0; i < w.size(); ++i) st.weights()[i] = w[i];
  return st;
}
template <class O>
void set_grads(OptimizerState<O, Host>& st, std::vector<float> g) {
  for (std::size_t i = 0; i < g.size(); ++i) st.grads()[i] = g[i];
}

}  // namespace

TEST_CASE("NAdam: Dozat's update with constant beta1, worked by hand", "[optim][remedies]") {
  // Step 1: w = 1, g = 0.5, lr = 0.1, beta1 = 0.9, beta2 = 0.999:
  // m = 0.05, v = 0.00025; c_m = 0.9 / (1 - 0.81), c_g = 0.1 / 0.1 = 1;
  // w = 1 - 0.1 (c_m 0.05 + 0.5) / (sqrt(0.00025 / 0.001) + 1e-8) = 0.852631579.
  auto st = state(NAdam{.lr = 0.1f}, {1.f});
  set_grads(st, {0.5f});
  st.step(ctx);
  REQUIRE(st.weights()[0] == Approx(0.852631579).epsilon(1e-6));
  // Step 2: g = -0.2; m = 0.045 - 0.02 = 0.025, v = 0.00024975 + 0.00004 = 0.00028975;
  // c_m = 0.9 / (1 - 0.9^3) = 3.321033, c_g = 0.1 / 0.19 = 0.526316;
  // sqrt(v / (1 - 0.999^2)) = sqrt(0.00028975 / 0.001999) = 0.380719;
  // w -= 0.1 (3.321033 0.025 - 0.526316 0.2) / 0.380719 = 0.1 (-0.022237) / 0.380719.
  set_grads(st, {-0.2f});
  st.step(ctx);
  const double m = 0.025, v = 0.00028975;
  const double upd = 0.1 * (0.9 / (1 - std::pow(0.9, 3)) * m - (0.1 / 0.19) * 0.2) /
                     (std::sqrt(v / (1 - std::pow(0.999, 2))) + 1e-8);
  REQUIRE(st.weights()[0] == Approx(0.852631579 - upd).epsilon(1e-6));
  REQUIRE(upd == Approx(-0.0058408).epsilon(1e-3));  // the hand arithmetic above
}

TEST_CASE("NAdam with PyTorch's momentum schedule (momentum_decay), worked by hand",
          "[optim][remedies]") {
  // torch.optim.NAdam's documented update with psi = 0.004: mu_t = beta1 (1 - 0.5 * 0.96^(t psi)),
  // P_t = mu_1 ... mu_t, w -= lr (1 - mu_t) / (1 - P_t) g / d + lr mu_(t+1) / (1 - P_t mu_(t+1))
  // m / d, d = sqrt(v / (1 - beta2^t)) + eps; m and v averaged with beta1 and beta2.
  // Step 1 (w = 1, g = 0.5, lr = 0.1, beta1 = 0.9): mu_1 = 0.9 (1 - 0.5 * 0.96^0.004) = 0.45007347,
  // mu_2 = 0.9 (1 - 0.5 * 0.96^0.008) = 0.45014694; c_g = (1 - mu_1) / (1 - mu_1) = 1, c_m =
  // mu_2 / (1 - mu_1 mu_2) = 0.45014694 / 0.79740081 = 0.56452538; m = 0.05, d = 0.5:
  // w = 1 - 0.1 (0.5 + 0.56452538 * 0.05) / 0.5 = 0.89435482.
  // Steps 2 and 3 (g = -0.2, then 0.3) the same way, in double: 0.92732557, 0.86939269.
  // (torch 1.13, Debian's, multiplies an extra mu_t into P_(t+1); later releases follow the
  // documented rule above.)
  auto st = state(NAdam{.lr = 0.1f, .momentum_decay = 0.004f}, {1.f});
  const double expected[3] = {0.8943548242773647, 0.9273255700702376, 0.8693926926829394};
  const float grads[3] = {0.5f, -0.2f, 0.3f};
  for (int t = 0; t < 3; ++t) {
    set_grads(st, {grads[t]});
    st.step(ctx);
    INFO("step " << t + 1);
    REQUIRE(st.weights()[0] == Approx(expected[t]).epsilon(2e-6));
  }
  // The momenta are near beta1 / 2 early on: at step 1000, 0.96^4 = 0.84934656, so
  // mu = 0.99 (1 - 0.42467328) = 0.5695734528.
  REQUIRE(math::nadam_mu(0.99, 0.004, 1000) == Approx(0.5695734528).epsilon(1e-9));
  REQUIRE(math::nadam_mu(0.9, 0.0, 7) == 0.9);  // no schedule
  // The product does not depend on the order steps were asked for (the memo restarts and
  // advances): the same bits as multiplying mu_1 ... mu_5 in order.
  double product = 1;
  for (int t = 1; t <= 5; ++t) product *= math::nadam_mu(0.9, 0.004, t);
  const double first = math::nadam_mu_product(0.9, 0.004, 5);
  REQUIRE(math::nadam_mu_product(0.9, 0.004, 4) * math::nadam_mu(0.9, 0.004, 5) == product);
  (void)math::nadam_mu_product(0.9, 0.004, 2);
  (void)math::nadam_mu_product(0.99, 0.004, 9);
  REQUIRE(first == product);
  REQUIRE(math::nadam_mu_product(0.9, 0.004, 5) == product);
  for (int t = 0; t < 12; ++t) (void)math::nadam_mu_product(0.5 + 0.01 * t, 0.004, 3);  // evicts
  REQUIRE(math::nadam_mu_product(0.9, 0.004, 5) == product);
  REQUIRE(math::nadam_mu_product(0.9, 0.004, 0) == 1.0);
  // Bad input.
  REQUIRE_THROWS_WITH(NAdam{.momentum_decay = -1.f}.scalars(1),
                      Catch::Contains("momentum_decay must lie in [0, 1e6)"));
  REQUIRE_THROWS_WITH(with_momentum_decay(SGD{}, 0.004f),
                      Catch::Contains("SGD's Nesterov form has none"));
  REQUIRE(with_momentum_decay(NAdamW{}, 0.004f).momentum_decay == 0.004f);
}

TEST_CASE("Nesterov forms: NAdam for Adam, Nesterov SGD at the same steady-state step",
          "[optim][remedies]") {
  const NAdam n = nesterov_form(Adam{.lr = 2e-3f, .beta2 = 0.99f}, 0.99f);
  REQUIRE(n.beta1 == 0.99f);
  REQUIRE(n.beta2 == 0.99f);
  REQUIRE(n.lr == 2e-3f);
  // lr (1 - beta) / (1 - mu) = 0.1 * 0.01 / 0.1 = 0.01.
  const SGD s = nesterov_form(SGD{.lr = 0.1f, .momentum = 0.9f}, 0.99f);
  REQUIRE(s.nesterov);
  REQUIRE(s.momentum == 0.99f);
  REQUIRE(s.lr == Approx(0.01f));
  // Under a constant gradient both reach the same step: lr g / (1 - mu) = 1 * g.
  auto plain = state(SGD{.lr = 0.1f, .momentum = 0.9f}, {0.f});
  auto nest = state(s, {0.f});
  for (int i = 0; i < 3000; ++i) {
    set_grads(plain, {1.f});
    set_grads(nest, {1.f});
    const float p0 = plain.weights()[0], n0 = nest.weights()[0];
    plain.step(ctx);
    nest.step(ctx);
    if (i == 2999) REQUIRE(nest.weights()[0] - n0 == Approx(plain.weights()[0] - p0).epsilon(1e-3));
  }
  const AnyOptimizer any = nesterov_form(AnyOptimizer{AdamW{}}, 0.95f);
  REQUIRE(std::string(any.chosen_name()) == "nadamw");
  REQUIRE(momentum_of(any) == 0.95f);
  REQUIRE_THROWS_WITH(nesterov_form(SGD{.momentum = 1.f}, 0.9f),
                      Catch::Contains("momentum must lie in [0, 1)"));
}

TEST_CASE("MultiStep: s more optimizer steps with the last gradient held, by hand and bitwise",
          "[predict][remedies]") {
  // K = 3, M = 1 async: stage 0's forwards from F2 on predict over s = 2.
  Setup s(async_1f1b(3, 1, 6));
  REQUIRE(s.analysis.forward(0, 2).apply_time == 2);
  // SGD mu = 0.9, lr = 0.1; a first step with g = 0.5 gives m = 0.5, w = 1.05 - 0.05 = 1. With
  // g = 0.2 saved as the last gradient and held for 2 steps: m1 = 0.45 + 0.2 = 0.65,
  // w1 = 1 - 0.065; m2 = 0.585 + 0.2 = 0.785, w2 = w1 - 0.0785 = 0.8565.
  MultiStep::State<SGD, Host> sgd(s.at(0, 1));
  auto opt = state(SGD{.lr = 0.1f, .momentum = 0.9f}, {1.05f});
  set_grads(opt, {0.5f});
  sgd.before_step(ctx, opt);
  opt.step(ctx);
  set_grads(opt, {0.2f});
  sgd.before_step(ctx, opt);  // saves 0.2 (the step it precedes is not taken here)
  REQUIRE(*sgd.forward_weights(ctx, opt, 2) == Approx(0.8565f).epsilon(1e-6));
  REQUIRE(opt.weights()[0] == Approx(1.f));  // the live state is not touched
  REQUIRE(opt.moment(0)[0] == Approx(0.5f));
  REQUIRE(sgd.weight_copies() == 4);
  // The saved gradient is the last step's, whatever the buffer holds later: take the step with
  // 0.2 (m = 0.65, w = 0.935), then put 5 in the buffer; the prediction still holds 0.2:
  // m1 = 0.585 + 0.2 = 0.785, w1 = 0.935 - 0.0785 = 0.8565; m2 = 0.7065 + 0.2 = 0.9065,
  // w2 = 0.8565 - 0.09065 = 0.76585.
  opt.step(ctx);
  set_grads(opt, {5.f});
  REQUIRE(*sgd.forward_weights(ctx, opt, 2) == Approx(0.76585f).epsilon(1e-6));

  // Adam: the prediction over s is bitwise what s real steps with the held gradient give.
  const std::vector<float> w0{0.3f, -0.7f, 1.1f}, held{0.25f, -0.5f, 0.05f};
  Setup deep(async_1f1b(8, 1, 12));
  for (int k : {0, 4}) {
    const int steps = deep.analysis.forward(k, 9).apply_time;  // 7 and 3
    INFO("s = " << steps);
    MultiStep::State<Adam, Host> ms(deep.at(k, 3));
    auto real = state(Adam{.lr = 0.01f}, w0);
    for (float gi : {0.4f, -0.1f}) {
      set_grads(real, {gi, gi * 2, -gi});
      real.step(ctx);
    }
    set_grads(real, held);
    ms.before_step(ctx, real);  // as if held were the last step's gradient
    const float* p = ms.forward_weights(ctx, real, 9);
    const std::vector<float> predicted(p, p + 3);
    for (int i = 0; i < steps; ++i) real.step(ctx);  // grads stay `held`
    REQUIRE(predicted == std::vector<float>(real.weights(), real.weights() + 3));
  }
}

TEST_CASE("History fit: least-squares coefficients worked by hand", "[predict][remedies]") {
  auto read = [](int n, int degree, double s, std::vector<double> y) {
    const auto c = history_fit_coefficients(n, degree, s);
    double v = 0;
    for (int i = 0; i < n; ++i) v += c[i] * y[i];
    return v;
  };
  // Line through (0,1), (1,2), (2,4): slope 1.5, mean 7/3 at x = 1; at x = 3: 7/3 + 3 = 16/3.
  REQUIRE(read(3, 1, 1, {1, 2, 4}) == Approx(16.0 / 3));
  // A parabola through 4 points of y = x^2 is exact: x = 4 -> 16, x = 5 -> 25.
  REQUIRE(read(4, 2, 1, {0, 1, 4, 9}) == Approx(16));
  REQUIRE(read(4, 2, 2, {0, 1, 4, 9}) == Approx(25));
  // Two versions carry a line only: (0,1), (1,3) read 2 ahead -> 7. One version: itself.
  REQUIRE(read(2, 2, 2, {1, 3}) == Approx(7));
  REQUIRE(read(1, 1, 5, {4}) == Approx(4));
}

TEST_CASE("FitLinear reads the line through the stage's last versions", "[predict][remedies]") {
  // K = 3, M = 1 async: stage 0 forwards at apply-time s = 2. Versions 0.0, 0.1, 0.3 (steps of
  // SGD lr 1, no momentum, gradients -0.1, -0.2): the line fitted to (0, 0), (1, .1), (2, .3)
  // has slope 0.15 and passes 2/15 at x = 1; read at x = 4: 2/15 + 0.45 = 0.583333.
  Setup s(async_1f1b(3, 1, 6));
  auto opt = state(SGD{.lr = 1.f, .momentum = 0.f}, {0.f});
  FitLinear::State<SGD, Host> fit(s.at(0, 1));
  REQUIRE(fit.forward_weights(ctx, opt, 0) == opt.weights());  // one version: nothing to fit
  for (float gi : {-0.1f, -0.2f}) {
    set_grads(opt, {gi});
    fit.before_step(ctx, opt);
    opt.step(ctx);
  }
  REQUIRE(s.analysis.forward(0, 2).apply_time == 2);
  REQUIRE(*fit.forward_weights(ctx, opt, 2) == Approx(0.583333f).epsilon(1e-5));
  REQUIRE(fit.weight_copies() == 4);
}

TEST_CASE("PipeMare: per-stage rate tau^-(1 - t/T) and the backward's discrepancy correction",
          "[predict][remedies]") {
  // K = 4, M = 1, 10 mini-batches: stage 0's delay is 3, T = 10.
  Setup s(async_1f1b(4, 1, 10));
  PipeMare::State<SGD, Host> st(s.at(0, 1));
  REQUIRE(st.rate_scale(0) == Approx(1.0 / 3));
  REQUIRE(st.rate_scale(5) == Approx(1.0 / std::sqrt(3.0)));
  REQUIRE(st.rate_scale(10) == Approx(1.0));
  REQUIRE(st.rate_scale(400) == Approx(1.0));
  REQUIRE(st.gamma() == Approx(2.0 / 3));
  PipeMare::State<SGD, Host> last(s.at(3, 1));  // no delay: full rate, no correction
  REQUIRE(last.rate_scale(0) == 1.f);

  // Two steps of SGD (lr 0.3, no momentum) with g = 1 and 2: rates 0.3 / 3 and 0.3 * 3^-0.9:
  // w1 = 1 - 0.1 = 0.9, delta1 = (1/3)(-0.1); w2 = 0.9 - 0.6 * 3^-0.9, delta2 = (2/3) delta1 +
  // (1/3)(w2 - w1). a backward `lag` versions after its forward reads
  // w2 - lag * delta2.
  auto opt = state(SGD{.lr = 0.3f, .momentum = 0.f}, {1.f});
  for (float gi : {1.f, 2.f}) {
    set_grads(opt, {gi});
    st.before_step(ctx, opt);
    REQUIRE(st.apply_step(ctx, opt));
  }
  const double w1 = 0.9, w2 = w1 - 0.6 * std::pow(3.0, -0.9);
  const double d1 = (1.0 / 3) * (w1 - 1.0), d2 = (2.0 / 3) * d1 + (1.0 / 3) * (w2 - w1);
  REQUIRE(opt.weights()[0] == Approx(w2).epsilon(1e-6));
  // In the steady state F(5) reads version 2 and B(5) version 5 (F0 F1 F2 F3 B0 S0 F4 B1 S1 ..).
  const int g = 5;
  const int lag = s.analysis.backward(0, g).version - s.analysis.forward(0, g).version;
  REQUIRE(lag == 3);
  REQUIRE(*st.backward_weights(ctx, opt, g) == Approx(w2 - lag * d2).epsilon(1e-6));
  REQUIRE(st.forward_weights(ctx, opt, g) == opt.weights());
}

TEST_CASE("PipeNAG: stashing with momentum 0.99, or beta + (versions - 1)(0.99 - beta)/K",
          "[predict][remedies]") {
  Setup s(async_1f1b(4, 1, 8));  // stage k stashes 4 - k versions
  const std::vector<double> staged{0.9 + 3 * 0.09 / 4, 0.9 + 2 * 0.09 / 4, 0.9 + 0.09 / 4, 0.9};
  for (int k = 0; k < 4; ++k) {
    PipeNAGStaged::State<Adam, Host> st(s.at(k, 1));
    REQUIRE(st.momentum(0.9f) == Approx(staged[k]));
    PipeNAG::State<Adam, Host> fixed(s.at(k, 1));
    REQUIRE(fixed.momentum(0.9f) == 0.99f);
  }
  // Its step is NAdam's with that beta1 (the first NAdam step worked above, beta1 = 0.99:
  // c_m = 0.99 / (1 - 0.99^2), c_g = 1).
  PipeNAG::State<Adam, Host> st(s.at(3, 1));
  auto opt = state(Adam{.lr = 0.1f}, {1.f});
  set_grads(opt, {0.5f});
  st.before_step(ctx, opt);
  REQUIRE(st.apply_step(ctx, opt));
  const double m = 0.005, c_m = 0.99 / (1 - 0.99 * 0.99);
  REQUIRE(opt.weights()[0] == Approx(1 - 0.1 * (c_m * m + 0.5) / 0.5).epsilon(1e-6));
  REQUIRE(opt.steps_taken() == 1);
}

TEST_CASE("2BW + error feedback: W -= u_t + (u_t - u_t-1), the first step uncorrected",
          "[predict][remedies]") {
  Setup s(pipedream_2bw(2, 2, 4));
  DoubleBufferedEF::State<SGD, Host> st(s.at(0, 1));
  auto opt = state(SGD{.lr = 0.1f, .momentum = 0.f}, {1.f});
  set_grads(opt, {1.f});
  st.before_step(ctx, opt);
  REQUIRE(st.apply_step(ctx, opt));
  REQUIRE(opt.weights()[0] == Approx(0.9f));  // u_1 = 0.1, nothing to correct with
  set_grads(opt, {3.f});
  st.before_step(ctx, opt);
  REQUIRE(st.apply_step(ctx, opt));
  REQUIRE(opt.weights()[0] == Approx(0.9f - 0.3f - (0.3f - 0.1f)));  // 0.4
  set_grads(opt, {3.f});  // the same update again: no correction
  st.before_step(ctx, opt);
  st.apply_step(ctx, opt);
  REQUIRE(opt.weights()[0] == Approx(0.1f));
}

TEST_CASE("PACI: a stage steps once per delay with the mean gradient, the epoch's end flushes",
          "[predict][remedies]") {
  // K = 4, M = 1, 7 mini-batches: stage 0's delay is 3, so it steps after mini-batches 3, 6 and
  // (the epoch's end) 7.
  Setup s(async_1f1b(4, 1, 7));
  AccumulateToBound::State<SGD, Host> st(s.at(0, 1));
  REQUIRE(st.interval() == 3);
  REQUIRE(AccumulateToBound::State<SGD, Host>(s.at(3, 1)).interval() == 1);
  auto opt = state(SGD{.lr = 0.1f, .momentum = 0.f}, {1.f});
  // The StageProgram keeps adding backward gradients while apply_step returns false: the
  // buffer holds their sum, here 1 + 2 + 3 = 6 after three mini-batches.
  std::vector<bool> stepped;
  float sum = 0;
  for (int t = 1; t <= 7; ++t) {
    sum += static_cast<float>(t);
    set_grads(opt, {sum});
    const bool did = st.apply_step(ctx, opt);
    stepped.push_back(did);
    if (did) sum = 0;
  }
  REQUIRE(stepped == std::vector<bool>{false, false, true, false, false, true, true});
  // w = 1 - 0.1 * mean(1,2,3) - 0.1 * mean(4,5,6) - 0.1 * 7 = 1 - 0.2 - 0.5 - 0.7.
  REQUIRE(opt.weights()[0] == Approx(1 - 0.2 - 0.5 - 0.7));
  REQUIRE(opt.steps_taken() == 3);
}

TEST_CASE("DC-ASGD: g + lambda g^2 (W - W_bak), constant and adaptive, worked by hand",
          "[predict][remedies]") {
  // K = 2, M = 1, 3 mini-batches, stage 0: F0 F1 B0 S0 F2 B1 S1 B2 S2. F0 and F1 read version 0,
  // F2 version 1; micro-batch g's gradient is applied by step g. SGD, lr 0.1, no momentum,
  // w = 1, gradients 1, 2, -1 as each backward leaves them, lambda = 0.5.
  Setup s(async_1f1b(2, 1, 3));
  auto run = [&](DelayCompensated p) {
    DelayCompensated::State<SGD, Host> st(s.at(0, 1), p);
    auto opt = state(SGD{.lr = 0.1f, .momentum = 0.f}, {1.f});
    std::vector<float> read;  // what each backward reads
    REQUIRE(st.forward_weights(ctx, opt, 0) == opt.weights());
    REQUIRE(st.forward_weights(ctx, opt, 1) == opt.weights());
    for (int g = 0; g < 3; ++g) {
      if (g == 2) REQUIRE(st.forward_weights(ctx, opt, 2) == opt.weights());
      read.push_back(*st.backward_weights(ctx, opt, g));
      set_grads(opt, {std::vector<float>{1.f, 2.f, -1.f}[static_cast<std::size_t>(g)]});
      st.before_step(ctx, opt);
      REQUIRE(st.apply_step(ctx, opt));
    }
    return std::pair{read, opt.weights()[0]};
  };
  // Constant (mean_square = 0): step 0 is on the live weights, no correction: w = 0.9. Step 1:
  // B1 read version 0 (w = 1): g = 2 + 0.5 * 4 * (0.9 - 1) = 1.8, w = 0.9 - 0.18 = 0.72. Step 2:
  // B2 read version 1 (0.9): g = -1 + 0.5 * 1 * (0.72 - 0.9) = -1.09, w = 0.72 + 0.109.
  const auto [read_c, w_c] = run({.lambda = 0.5f, .mean_square = 0.f});
  REQUIRE(read_c[0] == 1.f);
  REQUIRE(read_c[1] == 1.f);  // B1 reads the saved version 0, not the live 0.9
  REQUIRE(read_c[2] == Approx(0.9));
  REQUIRE(w_c == Approx(0.829).epsilon(1e-6));
  // Adaptive, m = 0.5: ms = 0.5 after step 0 (no correction); step 1: ms = 0.25 + 2 = 2.25,
  // g = 2 + 0.5 * 4 / 1.5 * (0.9 - 1), w1 = 0.9 - 0.1 g; step 2: ms = 1.125 + 0.5 = 1.625,
  // g = -1 + 0.5 / sqrt(1.625) * (w1 - 0.9).
  const double g1 = 2 - 0.5 * 4 / 1.5 * 0.1, w1 = 0.9 - 0.1 * g1;
  const double g2 = -1 + 0.5 / std::sqrt(1.625) * (w1 - 0.9), w2 = w1 - 0.1 * g2;
  const auto [read_a, w_a] = run({.lambda = 0.5f, .mean_square = 0.5f});
  REQUIRE(read_a[2] == Approx(0.9));
  REQUIRE(w_a == Approx(w2).epsilon(1e-6));
  REQUIRE(w2 == Approx(0.8206552).epsilon(1e-6));  // the same numbers on a calculator

  // M = 2 mixes versions in a step. K = 2, stage 0: F0 F1 B0 F2 B1 S0 F3 B2 F4 B3 S1 F5 B4 B5 S2.
  // Step 1 applies B2 (F2 read version 0) and B3 (version 1), step 2 B4 (version 1) and B5
  // (version 2): W_bak is their mean. Constant form, lambda = 0.5, the same SGD, step gradients
  // 1, 2, -1. Step 0: w = 0.9. Step 1: W_bak = (1 + 0.9) / 2 = 0.95, g = 2 + 0.5 * 4 * (0.9 -
  // 0.95) = 1.9, w = 0.71. Step 2: W_bak = (0.9 + 0.71) / 2 = 0.805, g = -1 + 0.5 * (0.71 -
  // 0.805) = -1.0475, w = 0.71 + 0.10475 = 0.81475.
  Setup mixed(async_1f1b(2, 2, 3));
  DelayCompensated::State<SGD, Host> st(mixed.at(0, 1), {.lambda = 0.5f, .mean_square = 0.f});
  auto opt = state(SGD{.lr = 0.1f, .momentum = 0.f}, {1.f});
  std::vector<float> read;
  int step = 0;
  for (const Action& a : mixed.schedule.actions[0]) {
    if (a.kind == ActionKind::Forward) {
      REQUIRE(st.forward_weights(ctx, opt, a.index) == opt.weights());
    } else if (a.kind == ActionKind::Backward) {
      read.push_back(*st.backward_weights(ctx, opt, a.index));
    } else {
      set_grads(opt, {std::vector<float>{1.f, 2.f, -1.f}[static_cast<std::size_t>(step++)]});
      st.before_step(ctx, opt);
      REQUIRE(st.apply_step(ctx, opt));
    }
  }
  REQUIRE(step == 3);
  REQUIRE(read.size() == 6);
  REQUIRE(read[2] == 1.f);  // B2 on the saved version 0, B4 on the saved version 1
  REQUIRE(read[3] == Approx(0.9));
  REQUIRE(read[4] == Approx(0.9));
  REQUIRE(read[5] == Approx(0.71));
  REQUIRE(opt.weights()[0] == Approx(0.81475).epsilon(1e-6));
  REQUIRE(st.weight_copies() == 3);  // the live weights, one saved version, the mean

  // Versions held: stage 0 of K = 4, M = 1 keeps versions t until step t + 3, one saved after
  // the step frees the oldest: 3 copies and the live weights, as Stash; the adaptive form adds
  // its mean square. The last stage applies each gradient on the weights it was computed on.
  Setup four(async_1f1b(4, 1, 10));
  REQUIRE(DelayCompensated::State<SGD, Host>(four.at(0, 1), {.mean_square = 0.f}).weight_copies() ==
          4);
  REQUIRE(DelayCompensated::State<SGD, Host>(four.at(0, 1), {}).weight_copies() == 5);
  REQUIRE(DelayCompensated::State<SGD, Host>(four.at(3, 1), {.mean_square = 0.f}).weight_copies() ==
          1);
}

TEST_CASE("PACI with prediction: a forward reads the weights one real step ahead, by hand",
          "[predict][remedies]") {
  // K = 4, M = 1, 7 mini-batches, stage 0: F0 F1 F2 F3 B0 S0 F4 B1 S1 F5 B2 S2 F6 B3 S3 B4 S4 B5
  // S5 B6 S6. F(g) reads version max(0, g - 3) and its gradient is added before step g; a = 3,
  // so the real steps are 2, 5 and 6 (the last). F0-F2 are applied by step 2 with no real step
  // between: u = 0. F3-F5 (versions 0-2) are applied by step 5 after real step 2: u = 1. F6
  // (version 3) is applied by step 6 after real step 5: u = 1.
  Setup s(async_1f1b(4, 1, 7));
  AccumulateToBound::State<SGD, Host> st(s.at(0, 1), {.predict = 1});
  REQUIRE(st.interval() == 3);
  std::vector<int> ahead;
  for (int g = 0; g < 7; ++g) ahead.push_back(st.steps_ahead(g));
  REQUIRE(ahead == std::vector<int>{0, 0, 0, 1, 1, 1, 1});
  REQUIRE(st.weight_copies() == 2);
  // SGD, lr 0.1, no momentum, so the direction is the last step's gradient: one step from
  // w = 1.1 with g = 1 first (w = 1, m = 1). Mini-batch t adds gradient t + 1; the real steps
  // take the means 2 (w = 0.8, m = 2) and 5 (w = 0.3), then 7.
  auto opt = state(SGD{.lr = 0.1f, .momentum = 0.f}, {1.1f});
  set_grads(opt, {1.f});
  opt.step(ctx);
  std::vector<float> read;
  float sum = 0;
  int t = 0;
  for (const Action& a : s.schedule.actions[0]) {
    if (a.kind == ActionKind::Forward) {
      const float* w = st.forward_weights(ctx, opt, a.index);
      REQUIRE((w == opt.weights()) == (a.index < 3));  // the live weights, or the scratch
      read.push_back(*w);
    } else if (a.kind == ActionKind::Backward) {
      REQUIRE(st.backward_weights(ctx, opt, a.index) == opt.weights());
      sum += static_cast<float>(++t);
      set_grads(opt, {sum});
    } else if (st.apply_step(ctx, opt)) {
      sum = 0;
    }
  }
  // F0-F2 live (1); F3-F5 before the first real step: 1 - 0.1 * 1; F6 after it: 0.8 - 0.1 * 2.
  REQUIRE(read[0] == Approx(1.0));
  REQUIRE(read[3] == Approx(0.9));
  REQUIRE(read[5] == Approx(0.9));
  REQUIRE(read[6] == Approx(0.6));
  REQUIRE(opt.weights()[0] == Approx(1 - 0.2 - 0.5 - 0.7));  // the steps are PACI's own
  // Without `predict` every forward reads the live weights; at interval 1 (every step real) F6
  // is 3 real steps from its gradient's.
  REQUIRE(AccumulateToBound::State<SGD, Host>(s.at(0, 1)).steps_ahead(6) == 0);
  REQUIRE(AccumulateToBound::State<SGD, Host>(s.at(0, 1), {.interval = 1, .predict = 1})
              .steps_ahead(6) == 3);
}

namespace {
using S0 = Stage<Linear<20, 32>, ReLU>;
using S1 = Stage<Linear<32, 32>, GELU>;
using S2 = Stage<Linear<32, 16>, ReLU>;
using S3 = Stage<Linear<16, 4>>;

template <class P, class O, class E>
std::vector<float> four_stages(const Schedule& s, const test::LabelledData& d, O opt, E&& exec,
                               std::vector<long>* steps = nullptr, P pred = {}) {
  Pipeline<S0, S1, S2, S3, P, O> p(opt, {.batch = 16, .micro_batches = s.micro_batches, .seed = 3},
                                   pred);
  p.train(s, d.epoch(), exec);
  if (steps)
    p.for_each_optimizer_state([&](int, const auto& st) { steps->push_back(st.steps_taken()); });
  return p.weights();
}
}  // namespace

TEST_CASE(
    "Every remedy: threaded = reference bitwise, AnyPredictor = the static type bitwise, "
    "the no-ops on synchronous schedules",
    "[pipeline][oracle][remedies]") {
  const auto d = test::random_classification(166, 20, 4, 1);
  [&]<class... P>(std::tuple<P...>*) {
    auto one = [&]<class Pr>(std::type_identity<Pr>) {
      for (const auto& [name, M] : test::oracle_schedules) {
        INFO(Pr::name << " on " << name << " M=" << M);
        const Schedule s = make_schedule(name, 4, M, 11);
        for (const AnyOptimizer o :
             {AnyOptimizer{Adam{.lr = 1e-2f}}, AnyOptimizer{SGD{.lr = 0.05f, .momentum = 0.9f}}}) {
          std::vector<float> ref;
          try {
            ref = four_stages<Pr>(s, d, o, ReferenceExecutor{});
          } catch (const ConfigError& e) {  // 2BW and 2BW + EF need M >= K
            REQUIRE((std::string(Pr::name).rfind("2bw", 0) == 0 && M < 4));
            continue;
          }
          REQUIRE(four_stages<Pr>(s, d, o, ThreadedExecutor{}) == ref);
          const AnyPredictor any = make_predictor(Pr::name);
          REQUIRE(four_stages(s, d, o, ReferenceExecutor{}, nullptr, any) == ref);
          REQUIRE(four_stages(s, d, o, ThreadedExecutor{}, nullptr, any) == ref);
        }
      }
    };
    (one(std::type_identity<P>{}), ...);
  }(static_cast<BuiltinPredictors*>(nullptr));

  // On GPipe nothing is stale: PipeMare, multi-step, the fits, PACI and DC-ASGD must be Latest
  // exactly.
  // ZB-H1 with M = 2 sums its gradients in GPipe's order: the same bits.
  const Schedule sync = gpipe(4, 2, 11);
  const auto latest = four_stages<Latest>(sync, d, Adam{.lr = 1e-2f}, ReferenceExecutor{});
  REQUIRE(four_stages<Latest>(zb_h1(4, 2, 11), d, Adam{.lr = 1e-2f}, ReferenceExecutor{}) ==
          latest);
  REQUIRE(four_stages<PipeMare>(zb_h1(4, 2, 11), d, Adam{.lr = 1e-2f}, ReferenceExecutor{}) ==
          latest);
  REQUIRE(four_stages<PipeMare>(sync, d, Adam{.lr = 1e-2f}, ReferenceExecutor{}) == latest);
  REQUIRE(four_stages<MultiStep>(sync, d, Adam{.lr = 1e-2f}, ReferenceExecutor{}) == latest);
  REQUIRE(four_stages<FitLinear>(sync, d, Adam{.lr = 1e-2f}, ReferenceExecutor{}) == latest);
  REQUIRE(four_stages<FitQuadratic>(sync, d, Adam{.lr = 1e-2f}, ReferenceExecutor{}) == latest);
  REQUIRE(four_stages<AccumulateToBound>(sync, d, Adam{.lr = 1e-2f}, ReferenceExecutor{}) ==
          latest);
  REQUIRE(four_stages<DelayCompensated>(sync, d, Adam{.lr = 1e-2f}, ReferenceExecutor{}) == latest);
  REQUIRE(four_stages<AccumulateToBound>(sync, d, Adam{.lr = 1e-2f}, ReferenceExecutor{}, nullptr,
                                         AccumulateToBound{.predict = 1}) == latest);
  // And on async 1F1B each of them computes something else than Latest.
  const Schedule async = async_1f1b(4, 1, 11);
  const auto stale = four_stages<Latest>(async, d, Adam{.lr = 1e-2f}, ReferenceExecutor{});
  REQUIRE(four_stages<PipeMare>(async, d, Adam{.lr = 1e-2f}, ReferenceExecutor{}) != stale);
  REQUIRE(four_stages<MultiStep>(async, d, Adam{.lr = 1e-2f}, ReferenceExecutor{}) != stale);
  REQUIRE(four_stages<FitLinear>(async, d, Adam{.lr = 1e-2f}, ReferenceExecutor{}) != stale);
  // DC-ASGD with lambda = 0 is weight stashing, bit for bit, on every schedule of the oracle (a
  // second bookkeeping of which version each backward reads); with lambda > 0 it is not.
  for (const auto& [name, M] : test::oracle_schedules) {
    INFO(name << " M=" << M);
    const Schedule sch = make_schedule(name, 4, M, 11);
    const auto stash = four_stages<Stash>(sch, d, Adam{.lr = 1e-2f}, ReferenceExecutor{});
    REQUIRE(four_stages<DelayCompensated>(sch, d, Adam{.lr = 1e-2f}, ReferenceExecutor{}, nullptr,
                                          DelayCompensated{.lambda = 0.f}) == stash);
  }
  const auto stash = four_stages<Stash>(async, d, Adam{.lr = 1e-2f}, ReferenceExecutor{});
  REQUIRE(four_stages<DelayCompensated>(async, d, Adam{.lr = 1e-2f}, ReferenceExecutor{}) != stash);
  REQUIRE(four_stages<DelayCompensated>(async, d, Adam{.lr = 1e-2f}, ReferenceExecutor{}, nullptr,
                                        DelayCompensated{.mean_square = 0.f}) != stash);
  std::vector<long> steps;
  four_stages<AccumulateToBound>(async, d, Adam{.lr = 1e-2f}, ReferenceExecutor{}, &steps);
  // 11 mini-batches (10 of 16 rows and a tail of 6); delays 3, 2, 1, 0 -> ceil(11 / 3) = 4,
  // ceil(11 / 2) = 6, 11 and 11 steps.
  REQUIRE(steps == std::vector<long>{4, 6, 11, 11});
  // PACI with prediction: its own bits, the same on both executors and the same step count.
  const AccumulateToBound predicting{.predict = 1};
  std::vector<long> predicted_steps;
  const auto paci =
      four_stages<AccumulateToBound>(async, d, Adam{.lr = 1e-2f}, ReferenceExecutor{});
  const auto ahead = four_stages<AccumulateToBound>(
      async, d, Adam{.lr = 1e-2f}, ReferenceExecutor{}, &predicted_steps, predicting);
  REQUIRE(ahead != paci);
  REQUIRE(predicted_steps == steps);
  REQUIRE(four_stages<AccumulateToBound>(async, d, Adam{.lr = 1e-2f}, ThreadedExecutor{}, nullptr,
                                         predicting) == ahead);
}

TEST_CASE("PredictionProbe: relative error and cosine of the predicted change, by hand",
          "[predict][remedies]") {
  PredictionProbe probe(0, 2, 2, 3);
  const float now[2] = {0, 0}, off[2] = {1, 1}, exact[2] = {2, 0}, actual[2] = {2, 0};
  probe.record(5, 2, off, now);    // predicted change (1, 1), actual (2, 0)
  probe.record(6, 2, exact, now);  // predicted exactly
  probe.record(7, 1, now, now);    // no prediction: ignored
  probe.settle(5, actual);
  probe.settle(6, actual);
  probe.settle(7, actual);
  std::vector<PredictionError> out;
  probe.append_to(out);
  REQUIRE(out.size() == 1);
  REQUIRE(out[0].s == 2);
  REQUIRE(out[0].count == 2);
  // |(1,1) - (2,0)| / |(2,0)| = sqrt(2) / 2; cos = 2 / (sqrt(2) * 2). The exact one: 0 and 1.
  REQUIRE(out[0].mean_relative_error == Approx((std::sqrt(2.0) / 2 + 0) / 2));
  REQUIRE(out[0].mean_cosine == Approx((1 / std::sqrt(2.0) + 1) / 2));
  probe.record(8, 1, off, now);
  probe.record(9, 1, off, now);
  REQUIRE_THROWS_WITH(probe.record(10, 1, off, now), Catch::Contains("more predictions in flight"));
}

TEST_CASE("Prediction errors are measured per stage and s, without changing a bit",
          "[pipeline][remedies]") {
  const auto d = test::random_classification(166, 20, 4, 1);
  const Schedule s = async_1f1b(4, 1, 11);
  auto run = [&]<class P>(bool measure, std::vector<PredictionError>* errors) {
    Pipeline<S0, S1, S2, S3, P, Adam> p(
        Adam{.lr = 1e-2f},
        {.batch = 16, .micro_batches = 1, .seed = 3, .measure_prediction = measure});
    ThreadedExecutor e;
    p.train(s, d.epoch(), e);
    if (errors) *errors = p.prediction_errors();
    return p.weights();
  };
  std::vector<PredictionError> errors;
  REQUIRE(run.operator()<XPipe>(true, &errors) == run.operator()<XPipe>(false, nullptr));
  // Stage k forwards mini-batch t at version max(0, t - (3 - k)), so s = min(t, 3 - k): the
  // warm-up's forwards predict over s = 1 .. 2 - k once each, the other 11 - (3 - k) over 3 - k;
  // stage 3 never predicts. Every S(t) runs inside the epoch, so every prediction is scored.
  struct Expect {
    int stage, s;
    long count;
  };
  const std::vector<Expect> expected{{0, 1, 1}, {0, 2, 1}, {0, 3, 8},
                                     {1, 1, 1}, {1, 2, 9}, {2, 1, 10}};
  REQUIRE(errors.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    INFO("entry " << i);
    REQUIRE(errors[i].stage == expected[i].stage);
    REQUIRE(errors[i].s == expected[i].s);
    REQUIRE(errors[i].count == expected[i].count);
    REQUIRE(std::isfinite(errors[i].mean_relative_error));
    REQUIRE(errors[i].mean_cosine >= -1.0);
    REQUIRE(errors[i].mean_cosine <= 1.0 + 1e-9);
  }
  run.operator()<Latest>(true, &errors);
  REQUIRE(errors.empty());
  run.operator()<Stash>(true, &errors);
  REQUIRE(errors.empty());
}

TEST_CASE("Hyper-parameters as values: each one moves its remedy as worked by hand",
          "[predict][remedies][any]") {
  Setup s(async_1f1b(4, 1, 10));  // stage k stashes 4 - k versions; stage 0's delay is 3
  // PipeNAG at momentum 0.95: 0.95 everywhere; per stage 0.9 + (4 - k - 1)(0.95 - 0.9) / 4.
  for (int k = 0; k < 4; ++k) {
    REQUIRE(PipeNAG::State<Adam, Host>(s.at(k, 1), PipeNAG{.momentum = 0.95f}).momentum(0.9f) ==
            0.95f);
    const double staged = 0.9 + (3 - k) * 0.05 / 4;
    REQUIRE(PipeNAGStaged::State<Adam, Host>(s.at(k, 1), PipeNAGStaged{.momentum = 0.95f})
                .momentum(0.9f) == Approx(staged));
  }
  // PipeMare annealed over T = 4 steps instead of the epoch's 10: tau^-(1 - t/4), tau = 3.
  PipeMare::State<SGD, Host> mare(s.at(0, 1), PipeMare{.anneal_steps = 4});
  REQUIRE(mare.rate_scale(0) == Approx(1.0 / 3));
  REQUIRE(mare.rate_scale(2) == Approx(1.0 / std::sqrt(3.0)));
  REQUIRE(mare.rate_scale(4) == Approx(1.0));
  // PACI with one interval for every stage: 2, where the delays would give 3 and 1.
  REQUIRE(AccumulateToBound::State<SGD, Host>(s.at(0, 1), {.interval = 2}).interval() == 2);
  REQUIRE(AccumulateToBound::State<SGD, Host>(s.at(3, 1), {.interval = 2}).interval() == 2);

  // MultiStep capped at 1 step where the schedule says s = 2 (K = 3, M = 1: stage 0's F2).
  // SGD mu = 0.9, lr = 0.1 from w = 1, m = 0.5 with the held gradient 0.2: m1 = 0.45 + 0.2 =
  // 0.65, w1 = 1 - 0.065 = 0.935 (uncapped it reads 0.8565: the test above).
  Setup three(async_1f1b(3, 1, 6));
  MultiStep::State<SGD, Host> capped(three.at(0, 1), MultiStep{.max_steps = 1});
  auto opt = state(SGD{.lr = 0.1f, .momentum = 0.9f}, {1.05f});
  set_grads(opt, {0.5f});
  capped.before_step(ctx, opt);
  opt.step(ctx);
  set_grads(opt, {0.2f});
  capped.before_step(ctx, opt);
  REQUIRE(*capped.forward_weights(ctx, opt, 2) == Approx(0.935f).epsilon(1e-6));

  // 2BW + EF at gamma 0.5: the second step (u = 0.3 after u = 0.1) is pushed on by half the
  // change: 0.9 - 0.3 - 0.5 (0.3 - 0.1) = 0.5.
  Setup two(pipedream_2bw(2, 2, 4));
  DoubleBufferedEF::State<SGD, Host> ef(two.at(0, 1), DoubleBufferedEF{.gamma = 0.5f});
  auto w = state(SGD{.lr = 0.1f, .momentum = 0.f}, {1.f});
  for (float g : {1.f, 3.f}) {
    set_grads(w, {g});
    ef.before_step(ctx, w);
    REQUIRE(ef.apply_step(ctx, w));
  }
  REQUIRE(w.weights()[0] == Approx(0.5f));
}

TEST_CASE("Hyper-parameters by name: set, listed, and refused with what they accept",
          "[predict][any]") {
  AnyPredictor p = make_predictor("pipenag");
  REQUIRE(std::string(p.chosen_name()) == "pipenag");
  REQUIRE(p.hyper_text() == "momentum=0.99,momentum_decay=0");
  p.set("momentum", 0.5);
  REQUIRE(std::get<PipeNAG>(p.impl).momentum == 0.5f);
  REQUIRE(p.hyper_text() == "momentum=0.5,momentum_decay=0");
  REQUIRE_THROWS_WITH(p.set("momentum", 1.0),
                      "xpipe: predictor 'pipenag': momentum must be in [0, 1) (got 1)");
  REQUIRE_THROWS_WITH(p.set("momentum", std::nan("")), Catch::Contains("must be in [0, 1)"));
  REQUIRE_THROWS_WITH(p.set("momentum", -1e300), Catch::Contains("(got -1e+300)"));
  REQUIRE_THROWS_WITH(p.set("gamma", 1.0),
                      "xpipe: predictor 'pipenag' has no hyper-parameter 'gamma' (it has: "
                      "momentum, momentum_decay)");
  REQUIRE_THROWS_WITH(p.set("momentum_decay", -0.004),
                      Catch::Contains("momentum_decay must be in [0, 1e+06)"));
  REQUIRE(std::get<PipeNAG>(p.impl).momentum == 0.5f);  // a refused value changes nothing
  AnyPredictor m = make_predictor("multistep");
  REQUIRE_THROWS_WITH(m.set("max_steps", 1.5), Catch::Contains("an integer"));
  m.set("max_steps", 3);
  REQUIRE(m.hyper_text() == "max_steps=3");
  REQUIRE(make_predictor("pipemare").hyper_names() == std::vector<std::string>{"anneal_steps"});
  REQUIRE(make_predictor("2bw-ef").has_hyper_parameter("gamma"));
  AnyPredictor x = make_predictor("xpipe");
  REQUIRE(x.hyper_text().empty());
  REQUIRE(x.hyper_names().empty());
  REQUIRE_FALSE(x.has_hyper_parameter("momentum"));
  REQUIRE_THROWS_WITH(x.set("momentum", 0.9), Catch::Contains("(it has none)"));
  REQUIRE_THROWS_WITH(make_predictor("lookahead"), Catch::StartsWith("xpipe: unknown predictor "
                                                                     "'lookahead' (available: "
                                                                     "latest, stash, 2bw"));
  // Every built-in name is a choice, in BuiltinPredictors' order; the default is Latest.
  for (std::size_t i = 0; i < predictor_names.size(); ++i) {
    REQUIRE(std::string(make_predictor(predictor_names[i]).chosen_name()) == predictor_names[i]);
    REQUIRE(make_predictor(predictor_names[i]).impl.index() == i);
  }
  REQUIRE(std::string(AnyPredictor{}.chosen_name()) == "latest");
}

TEST_CASE("AnyPredictor carries hyper-parameters into training: the static type's bits",
          "[pipeline][oracle][any]") {
  const auto d = test::random_classification(166, 20, 4, 1);
  const Schedule s = async_1f1b(4, 1, 11);
  const Adam adam{.lr = 1e-2f};
  const auto chosen = four_stages(s, d, adam, ReferenceExecutor{}, nullptr,
                                  AnyPredictor{PipeNAG{.momentum = 0.9f}});
  REQUIRE(chosen ==
          four_stages(s, d, adam, ThreadedExecutor{}, nullptr, PipeNAG{.momentum = 0.9f}));
  REQUIRE(chosen != four_stages<PipeNAG>(s, d, adam, ReferenceExecutor{}));  // the default 0.99
  // MultiStep capped at one step is neither Latest nor uncapped MultiStep (s reaches 3 here).
  const auto capped =
      four_stages(s, d, adam, ThreadedExecutor{}, nullptr, AnyPredictor{MultiStep{.max_steps = 1}});
  REQUIRE(capped != four_stages<MultiStep>(s, d, adam, ReferenceExecutor{}));
  REQUIRE(capped != four_stages<Latest>(s, d, adam, ReferenceExecutor{}));
  REQUIRE(capped ==
          four_stages(s, d, adam, ReferenceExecutor{}, nullptr, MultiStep{.max_steps = 1}));
}

namespace {
// A user's predictor: reads the live weights, like Latest, under another name.
struct Mine {
  static constexpr const char* name = "mine";
  template <class O, class B>
  struct State : Latest::State<O, B> {
    using Latest::State<O, B>::State;
  };
};
using MyAny = AnyPredictorWith<Mine>;  // the one line
}  // namespace

TEST_CASE("A user's predictor joins AnyPredictor in one line", "[predict][any]") {
  static_assert(Predictor<MyAny>);
  const auto d = test::random_classification(166, 20, 4, 1);
  const Schedule s = async_1f1b(4, 2, 11);
  const auto mine = four_stages(s, d, Adam{.lr = 1e-2f}, ThreadedExecutor{}, nullptr,
                                make_predictor<MyAny>("mine"));
  REQUIRE(mine == four_stages<Latest>(s, d, Adam{.lr = 1e-2f}, ReferenceExecutor{}));
  REQUIRE(std::string(make_predictor<MyAny>("xpipe").chosen_name()) == "xpipe");
  REQUIRE_THROWS_WITH(make_predictor<MyAny>("yours"), Catch::EndsWith("paci, dc-asgd, mine)"));
}
