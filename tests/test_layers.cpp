// Oracle 1: every layer's backward against central finite differences of its forward.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "support/support.hpp"
#include "xpipe/xpipe.hpp"

namespace {

using xpipe::ConstMatrix;
using xpipe::HostContext;
using xpipe::index_t;
using xpipe::Matrix;

// Scalar objective L = sum_ij y_ij * r_ij (r fixed random), accumulated in double; dL/dy = r.
template <class L>
double objective(const HostContext& ctx, const std::vector<float>& p, const std::vector<float>& x,
                 index_t rows, int in, int out, const std::vector<float>& r) {
  std::vector<float> y(static_cast<std::size_t>(rows * out));
  L::forward(ctx, p.data(), ConstMatrix{x.data(), rows, in}, Matrix{y.data(), rows, out});
  double s = 0;
  for (std::size_t i = 0; i < y.size(); ++i) s += static_cast<double>(y[i]) * r[i];
  return s;
}

// Checks analytic dL/dx and dL/dparams of layer L at random inputs against central differences.
// `avoid_kink` keeps inputs away from 0 (ReLU's kink, where the derivative is undefined).
template <class L>
void check_layer_gradients(int in, int out, index_t rows, float h, bool avoid_kink) {
  const HostContext ctx{.threads = 1};
  xpipe::Rng rng{42};
  std::vector<float> p(static_cast<std::size_t>(L::param_count));
  if (!p.empty()) L::init(p, 7);
  for (float& v : p) v += rng.uniform(-0.1f, 0.1f);  // non-zero biases too
  std::vector<float> x(static_cast<std::size_t>(rows * in));
  for (float& v : x) {
    v = rng.uniform(-2.f, 2.f);
    if (avoid_kink && std::fabs(v) < 4 * h) v = v < 0 ? v - 4 * h : v + 4 * h;
  }
  std::vector<float> r(static_cast<std::size_t>(rows * out));
  xpipe::test::fill_uniform(r, rng);

  std::vector<float> y(r.size()), dx(x.size()), g(p.size(), 0.f), scratch(r.size());
  L::forward(ctx, p.data(), ConstMatrix{x.data(), rows, in}, Matrix{y.data(), rows, out});
  if constexpr (xpipe::takes_grad_scratch<L>)
    L::backward(ctx, p.data(), g.data(), false, ConstMatrix{x.data(), rows, in},
                ConstMatrix{y.data(), rows, out}, ConstMatrix{r.data(), rows, out},
                Matrix{dx.data(), rows, in}, Matrix{scratch.data(), rows, out});
  else
    L::backward(ctx, p.data(), g.data(), false, ConstMatrix{x.data(), rows, in},
                ConstMatrix{y.data(), rows, out}, ConstMatrix{r.data(), rows, out},
                Matrix{dx.data(), rows, in});

  auto central = [&](std::vector<float>& v, std::size_t i) {
    const float keep = v[i];
    v[i] = keep + h;
    const double up = objective<L>(ctx, p, x, rows, in, out, r);
    v[i] = keep - h;
    const double down = objective<L>(ctx, p, x, rows, in, out, r);
    v[i] = keep;
    return (up - down) / (2.0 * static_cast<double>(h));
  };
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double fd = central(x, i);
    INFO("input gradient " << i);
    REQUIRE(dx[i] == Approx(fd).margin(2e-3).epsilon(1e-2));
  }
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double fd = central(p, i);
    INFO("parameter gradient " << i);
    REQUIRE(g[i] == Approx(fd).margin(2e-3).epsilon(1e-2));
  }
}

// Activations have any_width: a small wrapper fixes the width so the same checker applies.
template <class Act, int W>
struct Fixed : Act {
  static constexpr int in_width = W;
  static constexpr int out_width = W;
};

}  // namespace

TEST_CASE("Linear backward matches central finite differences", "[layers][fd]") {
  check_layer_gradients<xpipe::Linear<5, 3>>(5, 3, 4, 1e-2f, false);
  check_layer_gradients<xpipe::Linear<7, 1, xpipe::XavierUniform>>(7, 1, 3, 1e-2f, false);
}

TEST_CASE("Dense backward matches central finite differences", "[layers][fd][dense]") {
  // A pre-activation within h of ReLU's kink would fail this (the difference straddles it);
  // at these inputs none is, and a Dense whose gradient ignores the ReLU fails it.
  check_layer_gradients<xpipe::Dense<5, 4, xpipe::ReLU>>(5, 4, 6, 1e-3f, false);
}

TEST_CASE("ReLU backward matches central finite differences away from 0", "[layers][fd]") {
  check_layer_gradients<Fixed<xpipe::ReLU, 6>>(6, 6, 5, 1e-2f, true);
}

TEST_CASE("GELU backward matches central finite differences", "[layers][fd]") {
  check_layer_gradients<Fixed<xpipe::GELU, 6>>(6, 6, 5, 1e-2f, false);
}

TEST_CASE("Linear backward with accumulate adds to the gradient buffer", "[layers]") {
  using L = xpipe::Linear<3, 2>;
  const HostContext ctx{};
  std::vector<float> p(L::param_count);
  L::init(p, 1);
  std::vector<float> x{1, 2, 3, -1, 0, 2}, y(4), dy{1, -1, 0.5f, 2};
  L::forward(ctx, p.data(), ConstMatrix{x.data(), 2, 3}, Matrix{y.data(), 2, 2});
  std::vector<float> once(p.size(), 0.f), twice(p.size(), 0.f);
  L::backward(ctx, p.data(), once.data(), false, ConstMatrix{x.data(), 2, 3},
              ConstMatrix{y.data(), 2, 2}, ConstMatrix{dy.data(), 2, 2}, Matrix{});
  for (int k = 0; k < 2; ++k)
    L::backward(ctx, p.data(), twice.data(), k == 1, ConstMatrix{x.data(), 2, 3},
                ConstMatrix{y.data(), 2, 2}, ConstMatrix{dy.data(), 2, 2}, Matrix{});
  for (std::size_t i = 0; i < p.size(); ++i) REQUIRE(twice[i] == 2 * once[i]);
  // dW = x^T dy written out by hand for element (0, 0) and the bias: column sums of dy.
  REQUIRE(once[0] == Approx(1 * 1 + (-1) * 0.5));
  REQUIRE(once[6] == Approx(1 + 0.5));
  REQUIRE(once[7] == Approx(-1 + 2));
}

TEST_CASE("Linear refuses views of other widths than its own, naming them", "[layers]") {
  using L = xpipe::Linear<3, 2>;
  const HostContext ctx{};
  std::vector<float> p(L::param_count), x(8, 1.f), y(6, 0.f), g(L::param_count, 0.f);
  L::init(p, 1);
  // Four input columns for a Linear<3, 2>: the GEMM would read W as 4 x 2.
  REQUIRE_THROWS_WITH(
      L::forward(ctx, p.data(), ConstMatrix{x.data(), 2, 4}, Matrix{y.data(), 2, 2}),
      Catch::Contains("Linear<3, 2>::forward: got 4 input and 2 output columns"));
  REQUIRE_THROWS_AS(L::forward(ctx, p.data(), ConstMatrix{x.data(), 2, 3}, Matrix{y.data(), 2, 3}),
                    xpipe::ShapeError);
  REQUIRE_THROWS_WITH(
      L::backward(ctx, p.data(), g.data(), false, ConstMatrix{x.data(), 2, 3},
                  ConstMatrix{y.data(), 2, 2}, ConstMatrix{y.data(), 2, 3}, Matrix{}),
      Catch::Contains("Linear<3, 2>::backward: got 3 input and 3 output columns"));
  for (float v : g) REQUIRE(v == 0.f);  // nothing written
}

TEST_CASE("Softmax cross-entropy gradient matches finite differences", "[layers][fd]") {
  std::vector<float> logits{0.3f, -1.2f, 2.0f, 0.1f};
  std::vector<float> grad(4), g2(4);
  const float loss = xpipe::math::softmax_xent_row(logits.data(), 4, 2, 1.f, grad.data());
  for (std::size_t j = 0; j < 4; ++j) {
    std::vector<float> up = logits, down = logits;
    up[j] += 1e-2f;
    down[j] -= 1e-2f;
    const double fd = (xpipe::math::softmax_xent_row(up.data(), 4, 2, 1.f, g2.data()) -
                       xpipe::math::softmax_xent_row(down.data(), 4, 2, 1.f, g2.data())) /
                      2e-2;
    REQUIRE(grad[j] == Approx(fd).margin(1e-3));
  }
  // Independent value: -log(e^2 / sum e^z).
  double s = 0;
  for (float z : logits) s += std::exp(static_cast<double>(z));
  REQUIRE(loss == Approx(-std::log(std::exp(2.0) / s)).epsilon(1e-6));
}
