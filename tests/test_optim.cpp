// Optimizer passes against reference values written from the published update rules in double
// precision (PyTorch's documented algorithms), independent of xpipe's kernels.
#include <catch2/catch.hpp>
#include <cmath>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "support/support.hpp"
#include "xpipe/xpipe.hpp"

namespace {

const xpipe::HostContext ctx{};

struct Trajectory {
  std::vector<std::vector<double>> grads;  // per step
  std::vector<double> w0;
};

Trajectory make_trajectory(int steps, int n) {
  xpipe::Rng rng{11};
  Trajectory t;
  for (int i = 0; i < n; ++i) t.w0.push_back(rng.uniform(-1.f, 1.f));
  for (int s = 0; s < steps; ++s) {
    std::vector<double> g;
    for (int i = 0; i < n; ++i) g.push_back(rng.uniform(-0.5f, 0.5f));
    t.grads.push_back(g);
  }
  return t;
}

template <class O>
xpipe::OptimizerState<O, xpipe::Host> run(const O& opt, const Trajectory& t) {
  const int n = static_cast<int>(t.w0.size());
  xpipe::OptimizerState<O, xpipe::Host> st(opt, n);
  for (int i = 0; i < n; ++i) st.weights()[i] = static_cast<float>(t.w0[i]);
  for (const auto& g : t.grads) {
    for (int i = 0; i < n; ++i) st.grads()[i] = static_cast<float>(g[i]);
    st.step(ctx);
  }
  return st;
}

}  // namespace

TEST_CASE("Adam matches the textbook update with bias correction", "[optim]") {
  const auto t = make_trajectory(5, 8);
  const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  auto st = run(xpipe::Adam{.lr = 1e-2f}, t);
  for (std::size_t i = 0; i < t.w0.size(); ++i) {
    double w = t.w0[i], m = 0, v = 0;
    for (std::size_t s = 0; s < t.grads.size(); ++s) {
      const double g = t.grads[s][i];
      m = b1 * m + (1 - b1) * g;
      v = b2 * v + (1 - b2) * g * g;
      const double mhat = m / (1 - std::pow(b1, s + 1)), vhat = v / (1 - std::pow(b2, s + 1));
      w -= lr * mhat / (std::sqrt(vhat) + eps);
    }
    REQUIRE(st.weights()[i] == Approx(w).epsilon(1e-5));
    REQUIRE(st.moment(0)[i] == Approx(m).epsilon(1e-5));
    REQUIRE(st.moment(1)[i] == Approx(v).epsilon(1e-4));
  }
  REQUIRE(st.steps_taken() == 5);
}

TEST_CASE("Adam's first step moves each weight by lr in the gradient's sign", "[optim]") {
  // Step 1: m_hat = g, v_hat = g^2, so the update is lr * g / (|g| + eps) = lr * sign(g).
  xpipe::OptimizerState<xpipe::Adam, xpipe::Host> st(xpipe::Adam{.lr = 0.5f}, 3);
  const float w0[] = {1.f, -2.f, 0.25f}, g[] = {0.3f, -4.f, 1e-3f};
  for (int i = 0; i < 3; ++i) st.weights()[i] = w0[i], st.grads()[i] = g[i];
  st.step(ctx);
  REQUIRE(st.weights()[0] == Approx(0.5f).epsilon(1e-6));
  REQUIRE(st.weights()[1] == Approx(-1.5f).epsilon(1e-6));
  REQUIRE(st.weights()[2] == Approx(-0.25f).epsilon(1e-4));
}

TEST_CASE("Adam L2 and AdamW decoupled weight decay", "[optim]") {
  const auto t = make_trajectory(4, 6);
  const double lr = 1e-2, wd = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  auto l2 = run(xpipe::Adam{.lr = 1e-2f, .weight_decay = 0.1f}, t);
  auto dec = run(xpipe::AdamW{.lr = 1e-2f, .weight_decay = 0.1f}, t);
  for (std::size_t i = 0; i < t.w0.size(); ++i) {
    double wa = t.w0[i], ma = 0, va = 0, ww = t.w0[i], mw = 0, vw = 0;
    for (std::size_t s = 0; s < t.grads.size(); ++s) {
      const double bc1 = 1 - std::pow(b1, s + 1), bc2 = 1 - std::pow(b2, s + 1);
      const double ga = t.grads[s][i] + wd * wa;  // L2: decay enters the moments
      ma = b1 * ma + (1 - b1) * ga;
      va = b2 * va + (1 - b2) * ga * ga;
      wa -= lr * (ma / bc1) / (std::sqrt(va / bc2) + eps);
      const double gw = t.grads[s][i];  // AdamW: decay applied to the weight, not the moments
      ww *= 1 - lr * wd;
      mw = b1 * mw + (1 - b1) * gw;
      vw = b2 * vw + (1 - b2) * gw * gw;
      ww -= lr * (mw / bc1) / (std::sqrt(vw / bc2) + eps);
    }
    REQUIRE(l2.weights()[i] == Approx(wa).epsilon(1e-5));
    REQUIRE(dec.weights()[i] == Approx(ww).epsilon(1e-5));
  }
}

TEST_CASE("SGD with momentum - dampening - weight decay and Nesterov", "[optim]") {
  const auto t = make_trajectory(4, 5);
  for (bool nesterov : {false, true}) {
    const double lr = 0.1, mu = 0.9, damp = nesterov ? 0.0 : 0.2, wd = 0.01;
    auto st = run(xpipe::SGD{.lr = 0.1f,
                             .momentum = 0.9f,
                             .dampening = static_cast<float>(damp),
                             .weight_decay = 0.01f,
                             .nesterov = nesterov},
                  t);
    for (std::size_t i = 0; i < t.w0.size(); ++i) {
      double w = t.w0[i], b = 0;
      for (std::size_t s = 0; s < t.grads.size(); ++s) {
        const double g = t.grads[s][i] + wd * w;
        b = s == 0 ? g : mu * b + (1 - damp) * g;  // the buffer starts at the first gradient
        w -= lr * (nesterov ? g + mu * b : b);
      }
      INFO("nesterov " << nesterov << " weight " << i);
      REQUIRE(st.weights()[i] == Approx(w).epsilon(1e-5));
      REQUIRE(st.moment(0)[i] == Approx(b).epsilon(1e-5));
    }
  }
}

TEST_CASE("Update directions: SGD's momentum buffer - Adam's m_hat / (sqrt(v_hat) + eps)",
          "[optim]") {
  const auto t = make_trajectory(3, 7);
  auto adam = run(xpipe::Adam{.lr = 1e-3f}, t);
  std::vector<float> d(7);
  adam.direction(ctx, d.data());
  for (int i = 0; i < 7; ++i) {
    const double mhat = adam.moment(0)[i] / (1 - std::pow(0.9, 3));
    const double vhat = adam.moment(1)[i] / (1 - std::pow(0.999, 3));
    REQUIRE(d[i] == Approx(mhat / (std::sqrt(vhat) + 1e-8)).epsilon(1e-5));
  }
  // The direction is the step Adam takes next when the next gradient repeats the moments' mean:
  // zero direction before any step.
  xpipe::OptimizerState<xpipe::Adam, xpipe::Host> fresh(xpipe::Adam{}, 4);
  std::vector<float> d0(4, 1.f);
  fresh.direction(ctx, d0.data());
  for (float v : d0) REQUIRE(v == 0.f);

  auto sgd = run(xpipe::SGD{.lr = 0.1f, .momentum = 0.9f}, t);
  sgd.direction(ctx, d.data());
  for (int i = 0; i < 7; ++i) REQUIRE(d[i] == sgd.moment(0)[i]);
}

TEST_CASE("Optimizers reject a non-positive learning rate", "[optim]") {
  xpipe::OptimizerState<xpipe::Adam, xpipe::Host> st(xpipe::Adam{.lr = 0.f}, 2);
  REQUIRE_THROWS_WITH(st.step(ctx), Catch::Contains("learning rate"));
  xpipe::OptimizerState<xpipe::SGD, xpipe::Host> sg(xpipe::SGD{.lr = -1.f}, 2);
  REQUIRE_THROWS_AS(sg.step(ctx), xpipe::ConfigError);
}

TEST_CASE("Adam over 2 threads gives the same bits as over 1", "[optim]") {
  const int n = 100000;
  xpipe::OptimizerState<xpipe::Adam, xpipe::Host> a(xpipe::Adam{}, n), b(xpipe::Adam{}, n);
  xpipe::Rng rng{5};
  for (int i = 0; i < n; ++i) {
    a.weights()[i] = b.weights()[i] = rng.uniform(-1.f, 1.f);
    a.grads()[i] = b.grads()[i] = rng.uniform(-1.f, 1.f);
  }
  for (int s = 0; s < 3; ++s) {
    a.step(xpipe::HostContext{.threads = 1});
    b.step(xpipe::HostContext{.threads = 2});
  }
  REQUIRE(std::equal(a.weights(), a.weights() + n, b.weights()));
}

namespace {

// Adam without the elementwise flag: a trainer must take its step whole, after the backward.
struct WholeAdam : xpipe::Adam {
  static constexpr bool elementwise = false;
};
static_assert(xpipe::steps_elementwise<xpipe::Adam> && !xpipe::steps_elementwise<WholeAdam>);

using xpipe::test::same_bits;

}  // namespace

TEMPLATE_TEST_CASE("A step taken in parts gives the bits of the whole step", "[optim]", xpipe::SGD,
                   xpipe::Adam, xpipe::AdamW, xpipe::NAdam, xpipe::AnyOptimizer) {
  const int n = 1000;
  TestType o{};
  if constexpr (std::is_same_v<TestType, xpipe::SGD>)
    o = {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-3f, .nesterov = true};
  if constexpr (std::is_same_v<TestType, xpipe::NAdam>) o.momentum_decay = 0.004f;
  if constexpr (std::is_same_v<TestType, xpipe::AnyOptimizer>) o.impl = xpipe::AdamW{.lr = 1e-2f};
  const xpipe::HostContext two{.threads = 2};
  xpipe::OptimizerState<TestType, xpipe::Host> whole(o, n), parts(o, n);
  const auto t = make_trajectory(4, n);
  for (int i = 0; i < n; ++i) whole.weights()[i] = parts.weights()[i] = static_cast<float>(t.w0[i]);
  for (const auto& g : t.grads) {
    for (int i = 0; i < n; ++i) whole.grads()[i] = parts.grads()[i] = static_cast<float>(g[i]);
    whole.step(two);
    // Uneven ranges, last first, as a backward completes them; one of them empty.
    parts.step_in_parts([&](auto part) {
      part(two, 700, 300);
      part(ctx, 3, 697);  // on one thread: the bits do not depend on it
      part(two, 3, 0);
      part(two, 0, 3);
    });
  }
  CHECK(parts.steps_taken() == 4);
  CHECK(same_bits(whole.weights(), parts.weights(), n));
  for (int m = 0; m < decltype(whole)::moment_buffers; ++m)
    CHECK(same_bits(whole.moment(m), parts.moment(m), n));
  // A step that moved nothing would leave the weights where they started.
  CHECK(whole.weights()[0] != static_cast<float>(t.w0[0]));
}

TEST_CASE("A step in parts that misses a weight, or reaches past the buffer, is refused",
          "[optim]") {
  xpipe::OptimizerState<xpipe::Adam, xpipe::Host> st(xpipe::Adam{}, 10);
  const auto missing = [&] { st.step_in_parts([](auto part) { part(ctx, 0, 9); }); };
  REQUIRE_THROWS_WITH(missing(), Catch::Contains("the parts stepped 9 of 10 weights"));
  const auto outside = [&] { st.step_in_parts([](auto part) { part(ctx, 5, 6); }); };
  REQUIRE_THROWS_WITH(outside(), Catch::Contains("part [5, 11) lies outside the 10 weights"));
  CHECK(st.steps_taken() == 0);
}

TEMPLATE_TEST_CASE(
    "SequentialTrainer steps each layer in its backward: the bits of a step after it", "[optim]",
    // Linear layers: on two threads the backward runs in two lanes, and the steps
    // are taken in pieces on both.
    (xpipe::Stage<xpipe::Linear<12, 32>, xpipe::GELU, xpipe::Linear<32, 16>, xpipe::ReLU,
                  xpipe::Linear<16, 5>>),
    // A Dense layer: one backward on both threads, each layer stepped in it.
    (xpipe::Stage<xpipe::Linear<12, 32>, xpipe::GELU, xpipe::Dense<32, 16, xpipe::ReLU>,
                  xpipe::Linear<16, 5>>)) {
  using Model = TestType;
  STATIC_REQUIRE(
      Model::overlaps_halves ==
      !std::is_same_v<typename Model::template layer<2>, xpipe::Dense<32, 16, xpipe::ReLU>>);
  // 3 steps of 2 chunks (the step in the second), on two threads.
  const auto d = xpipe::test::random_classification(48, 12, 5, 9);
  xpipe::SequentialTrainer<Model, xpipe::Adam> parts(xpipe::Adam{.lr = 1e-2f}, 16, 4);
  xpipe::SequentialTrainer<Model, WholeAdam> whole(WholeAdam{{.lr = 1e-2f}}, 16, 4);
  const xpipe::HostContext two{.threads = 2};
  for (xpipe::index_t first = 0; first < d.rows; first += 16) {
    const xpipe::ConstMatrix x{d.x.data() + first * 12, 16, 12};
    const double a = parts.train_step(two, x, d.y.data() + first, 2);
    const double b = whole.train_step(two, x, d.y.data() + first, 2);
    CHECK(a == b);
  }
  CHECK(parts.state().steps_taken() == 3);
  CHECK(same_bits(parts.state().weights(), whole.state().weights(), Model::param_count));
  CHECK(same_bits(parts.state().moment(1), whole.state().moment(1), Model::param_count));
}

TEST_CASE(
    "SequentialTrainer on two threads: the lanes give the one-thread backward's bits, "
    "set_lanes(false) the two-thread backward's",
    "[optim]") {
  // The reference MLP's shapes: there oneDNN's two-thread GEMMs sum some dot products in
  // another order than its one-thread GEMMs (2 of the step's 7 backward GEMMs on an AVX-512
  // EPYC), so the two paths give different bits.
  using Model = xpipe::models::FashionMlp;
  constexpr xpipe::index_t rows = 128;
  const auto d = xpipe::test::random_classification(rows, 784, 10, 12);
  const xpipe::ConstMatrix x{d.x.data(), rows, 784};
  const xpipe::HostContext one{.threads = 1}, two{.threads = 2};
  // By hand from the trainer's start: the forward on two threads, the loss, the backward on
  // `backward_ctx`, one whole Adam step; twice.
  const auto by_hand = [&](const std::vector<float>& start,
                           const xpipe::HostContext& backward_ctx) {
    xpipe::OptimizerState<xpipe::Adam, xpipe::Host> st(xpipe::Adam{}, Model::param_count);
    std::copy(start.begin(), start.end(), st.weights());
    Model::Activations<xpipe::Host> acts(rows);
    Model::GradScratch<xpipe::Host> scratch(rows);
    std::vector<float> dlogits(rows * 10), row_loss(rows);
    for (int step = 0; step < 2; ++step) {
      const xpipe::ConstMatrix logits = Model::forward(two, st.weights(), x, acts);
      xpipe::SoftmaxCrossEntropy::forward_backward_unchecked(
          two, logits, d.y.data(), 1.f / rows, xpipe::Matrix{dlogits.data(), rows, 10},
          row_loss.data());
      Model::backward(backward_ctx, st.weights(), st.grads(), false, acts,
                      xpipe::ConstMatrix{dlogits.data(), rows, 10}, xpipe::Matrix{}, scratch);
      st.step(two);
    }
    return std::vector<float>(st.weights(), st.weights() + Model::param_count);
  };
  const auto trained = [&](bool lanes) {
    xpipe::SequentialTrainer<Model, xpipe::Adam> t(xpipe::Adam{}, rows, 3);
    CHECK(t.lanes());
    t.set_lanes(lanes);
    CHECK(t.lanes() == lanes);
    const std::vector<float> start(t.state().weights(), t.state().weights() + Model::param_count);
    for (int step = 0; step < 2; ++step) t.train_step(two, x, d.y.data());
    return std::pair{
        start, std::vector<float>(t.state().weights(), t.state().weights() + Model::param_count)};
  };
  const auto [start, in_lanes] = trained(true);
  const auto [same_start, in_one] = trained(false);
  REQUIRE(start == same_start);
  // On a CPU where oneDNN's one- and two-thread GEMMs agree to the bit the paths cannot be told
  // apart by their results (the two checks below then hold either way): say so.
  if (in_lanes == in_one)
    WARN("one- and two-thread GEMMs gave the same bits here: the lanes are not told apart");
  CHECK(same_bits(in_lanes.data(), by_hand(start, one).data(), Model::param_count));
  CHECK(same_bits(in_one.data(), by_hand(start, two).data(), Model::param_count));
}
