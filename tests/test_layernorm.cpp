// LayerNorm on the host: against PyTorch (fixtures/layernorm_expected.hpp, made by
// fixtures/make_layernorm_fixtures.py), central finite differences, a hand-worked row, bad input.
#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "fixtures/layernorm_expected.hpp"
#include "support/compare.hpp"
#include "support/support.hpp"
#include "xpipe/layers/layernorm.hpp"
#include "xpipe/xpipe.hpp"

namespace {

using xpipe::ConstMatrix;
using xpipe::HostContext;
using xpipe::index_t;
using xpipe::LayerNorm;
using xpipe::Matrix;

// One activation slot of a LayerNorm: its operands and its Saved, for `rows` rows.
template <class L>
struct Slot {
  index_t rows;
  std::vector<float> p, g, x, y, dy, dx;
  typename L::template Saved<xpipe::Host> saved;
  explicit Slot(index_t n)
      : rows(n),
        p(L::param_count, 0.f),
        g(L::param_count, 0.f),
        x(n * L::in_width),
        y(n * L::out_width),
        dy(n * L::out_width),
        dx(n * L::in_width),
        saved(n) {}
  ConstMatrix input() const { return {x.data(), rows, L::in_width}; }
  void forward(const HostContext& ctx) {
    L::forward(ctx, p.data(), input(), Matrix{y.data(), rows, L::out_width}, saved);
  }
  void backward(const HostContext& ctx, bool accumulate = false) {
    L::backward(
        ctx, p.data(), g.data(), accumulate, input(), ConstMatrix{y.data(), rows, L::out_width},
        ConstMatrix{dy.data(), rows, L::out_width}, Matrix{dx.data(), rows, L::in_width}, saved);
  }
};

// PyTorch's values within 1e-6 + 1e-5 |want| (the fixtures are float64).
void require_close(std::span<const float> got, std::span<const float> want, const char* what) {
  xpipe::test::require_close(got, want, what, 1e-6f, 1e-5f);
}
using xpipe::test::central;
using xpipe::test::copy_into;
using xpipe::test::message_of;

// Runs a fixture case on `threads` threads and compares y, dx, dgamma and dbeta with PyTorch's.
template <class Case>
void check_against_torch(int threads) {
  using L = LayerNorm<Case::width>;
  const HostContext ctx{.threads = threads};
  Slot<L> s(Case::rows);
  copy_into(s.x, Case::x);
  copy_into(s.p, Case::gamma);
  copy_into(s.p, Case::beta, Case::width);
  copy_into(s.dy, Case::dy);
  s.forward(ctx);
  s.backward(ctx);
  require_close(s.y, Case::y, "y");
  require_close(s.dx, Case::dx, "dx");
  require_close(std::span(s.g).first(Case::width), Case::dgamma, "dgamma");
  require_close(std::span(s.g).subspan(Case::width), Case::dbeta, "dbeta");
}

// Parameters moved away from gamma 1, beta 0, and random inputs and upstream gradient.
template <class L>
void randomize(Slot<L>& s, std::uint64_t seed) {
  L::init(s.p, seed);
  xpipe::Rng rng{seed};
  for (float& v : s.p) v += rng.uniform(-0.3f, 0.3f);
  xpipe::test::fill_uniform(s.x, rng, -2.f, 2.f);
  xpipe::test::fill_uniform(s.dy, rng);
}

using L8 = LayerNorm<8>;

}  // namespace

TEST_CASE("LayerNorm's layout", "[layers][layernorm]") {
  STATIC_REQUIRE(xpipe::Layer<L8>);
  STATIC_REQUIRE(L8::in_width == 8);
  STATIC_REQUIRE(L8::out_width == 8);
  STATIC_REQUIRE(L8::param_count == 16);
  STATIC_REQUIRE(xpipe::keeps_saved<L8>);
  STATIC_REQUIRE(!xpipe::takes_running<L8>);
  STATIC_REQUIRE(xpipe::state_count_of<L8>() == 0);
  STATIC_REQUIRE(L8::saved_floats(5) == 20);
  std::vector<float> p(16, -7.f);
  L8::init(p, 1);
  REQUIRE(p == std::vector<float>{1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0});
  REQUIRE(L8::name() == "LayerNorm<8>");
  L8::Saved<xpipe::Host> saved(5);
  REQUIRE(saved.max_rows == 5);
  REQUIRE(saved.stats.size() == 10);
  REQUIRE(saved.sums.size() == 10);
}

TEST_CASE("LayerNorm matches PyTorch", "[layers][layernorm][torch]") {
  for (int threads : {1, 2}) {
    INFO(threads << " threads");
    check_against_torch<layernorm_expected::width10>(threads);
    check_against_torch<layernorm_expected::width33>(threads);
  }
}

TEST_CASE("LayerNorm backward matches central finite differences", "[layers][layernorm][fd]") {
  using L = LayerNorm<7>;
  const HostContext ctx{.threads = 1};
  Slot<L> s(3);
  randomize(s, 21);
  s.forward(ctx);
  s.backward(ctx);
  // sum(y * dy) in double, from a fresh slot (the gradients in s stay as the backward left them).
  L::Saved<xpipe::Host> other(s.rows);
  const auto objective = [&] {
    std::vector<float> y(s.y.size());
    L::forward(ctx, s.p.data(), s.input(), Matrix{y.data(), s.rows, L::out_width}, other);
    double sum = 0;
    for (std::size_t i = 0; i < y.size(); ++i) sum += static_cast<double>(y[i]) * s.dy[i];
    return sum;
  };
  for (std::size_t i = 0; i < s.x.size(); ++i) {
    INFO("input gradient " << i);
    REQUIRE(s.dx[i] == Approx(central(s.x, i, objective)).margin(1e-3).epsilon(1e-3));
  }
  for (std::size_t i = 0; i < s.p.size(); ++i) {
    INFO("parameter gradient " << i << (i < 7 ? " (gamma)" : " (beta)"));
    REQUIRE(s.g[i] == Approx(central(s.p, i, objective)).margin(1e-3).epsilon(1e-3));
  }
}

TEST_CASE("LayerNorm on hand-worked rows", "[layers][layernorm]") {
  // Row 0: 1, 2, 3, 4: mean 2.5, biased variance 1.25. Row 1: constant, variance 0, so xhat is
  // 0 and y is beta (eps keeps 1/std finite).
  using L = LayerNorm<4>;
  const HostContext ctx{.threads = 1};
  Slot<L> s(2);
  s.x = {1, 2, 3, 4, 5, 5, 5, 5};
  s.p = {2.f, 1.f, 0.5f, -1.f, -1.f, 0.f, 1.f, 0.5f};  // gamma, beta
  s.dy = {1, 0, 0, 0, 0, 0, 0, 0};
  s.forward(ctx);
  s.backward(ctx);
  const double invstd = 1 / std::sqrt(1.25 + 1e-5);
  REQUIRE(s.saved.stats[0] == Approx(2.5).epsilon(1e-7));
  REQUIRE(s.saved.stats[1] == Approx(invstd).epsilon(1e-7));
  REQUIRE(s.saved.stats[2] == 5.f);
  REQUIRE(s.saved.stats[3] == Approx(1 / std::sqrt(1e-5)).epsilon(1e-6));
  const std::array<double, 4> d{-1.5, -0.5, 0.5, 1.5};  // x - mean
  for (int i = 0; i < 4; ++i) {
    INFO("element " << i);
    REQUIRE(s.y[i] == Approx(s.p[i] * d[i] * invstd + s.p[4 + i]).epsilon(1e-6));
    REQUIRE(s.y[4 + i] == s.p[4 + i]);
  }
  // dbeta = sum over rows of dy = (1, 0, 0, 0); dgamma = sum of dy xhat = (xhat_0, 0, 0, 0).
  REQUIRE(s.g[4] == 1.f);
  REQUIRE(s.g[0] == Approx(-1.5 * invstd).epsilon(1e-6));
  for (int i : {1, 2, 3, 5, 6, 7}) REQUIRE(s.g[i] == 0.f);
  // g = dy gamma = (2, 0, 0, 0): sum(g) = 2, sum(g xhat) = -3 invstd, so dx_i = invstd / 4
  // (4 g_i - 2 + 3 d_i invstd^2), worked out per element; they sum to 0, as they must.
  const double v = invstd * invstd;
  const std::array<double, 4> dx{invstd * (1.5 - 1.125 * v), invstd * (-0.5 - 0.375 * v),
                                 invstd * (-0.5 + 0.375 * v), invstd * (-0.5 + 1.125 * v)};
  for (int i = 0; i < 4; ++i) {
    INFO("input gradient " << i);
    REQUIRE(s.dx[i] == Approx(dx[i]).epsilon(1e-5));
    REQUIRE(s.dx[4 + i] == 0.f);  // row 1's upstream gradient is 0
  }
}

TEST_CASE("LayerNorm accumulates parameter gradients", "[layers][layernorm]") {
  // A fresh backward, then the same backward into a buffer holding 0.5 everywhere: each
  // gradient must come out 0.5 larger, the input gradient unchanged.
  const HostContext ctx{.threads = 2};
  Slot<L8> s(5);
  randomize(s, 5);
  s.forward(ctx);
  s.backward(ctx);
  const std::vector<float> fresh = s.g, dx = s.dx;
  for (float v : fresh) REQUIRE(v != 0.f);
  std::fill(s.g.begin(), s.g.end(), 0.5f);
  s.backward(ctx, true);
  REQUIRE(s.dx == dx);
  for (std::size_t i = 0; i < fresh.size(); ++i) REQUIRE(s.g[i] == Approx(fresh[i] + 0.5));
}

TEST_CASE("LayerNorm gives the same parameter gradients without an input gradient",
          "[layers][layernorm]") {
  // The first layer of a model gets an empty dx; its parameters still need their gradients.
  const HostContext ctx{.threads = 1};
  Slot<L8> s(4);
  randomize(s, 13);
  s.forward(ctx);
  s.backward(ctx);
  const std::vector<float> with_dx = s.g;
  std::fill(s.g.begin(), s.g.end(), -7.f);
  L8::backward(ctx, s.p.data(), s.g.data(), false, s.input(), ConstMatrix{s.y.data(), 4, 8},
               ConstMatrix{s.dy.data(), 4, 8}, Matrix{}, s.saved);
  REQUIRE(s.g == with_dx);
}

TEST_CASE("LayerNorm gives the same bits on one thread and two", "[layers][layernorm]") {
  // 1024 rows of 33: enough elements for the host loops to fork, so the rows and columns are
  // split over two threads; each reduction still runs in one fixed order.
  using L = LayerNorm<33>;
  Slot<L> one(1024), two(1024);
  randomize(one, 17);
  two.p = one.p;
  two.x = one.x;
  two.dy = one.dy;
  one.forward(HostContext{.threads = 1});
  one.backward(HostContext{.threads = 1});
  two.forward(HostContext{.threads = 2});
  two.backward(HostContext{.threads = 2});
  REQUIRE(one.y == two.y);
  REQUIRE(one.dx == two.dx);
  REQUIRE(one.g == two.g);
}

TEST_CASE("LayerNorm refuses views of the wrong shape and names non-finite rows",
          "[layers][layernorm]") {
  const HostContext ctx{.threads = 1};
  Slot<L8> s(5);
  randomize(s, 3);
  std::vector<float> wide(5 * 9);
  const auto requires_shape_error = [](auto&& f, const char* where) {
    const std::string m = message_of<xpipe::ShapeError>(f);
    REQUIRE_THAT(m, Catch::Contains(std::string("LayerNorm<8>::") + where));
  };
  SECTION("an input of the wrong width") {
    requires_shape_error(
        [&] {
          L8::forward(ctx, s.p.data(), ConstMatrix{wide.data(), 5, 9}, Matrix{s.y.data(), 5, 8},
                      s.saved);
        },
        "forward");
  }
  SECTION("an output of the wrong width") {
    requires_shape_error(
        [&] {
          L8::forward(ctx, s.p.data(), s.input(), Matrix{wide.data(), 5, 9}, s.saved);
        },
        "forward");
  }
  SECTION("an output of other rows") {
    requires_shape_error(
        [&] {
          L8::forward(ctx, s.p.data(), s.input(), Matrix{s.y.data(), 4, 8}, s.saved);
        },
        "forward");
  }
  SECTION("more rows than the slot holds") {
    std::vector<float> x(6 * 8), y(6 * 8);
    const std::string m = message_of<xpipe::ShapeError>([&] {
      L8::forward(ctx, s.p.data(), ConstMatrix{x.data(), 6, 8}, Matrix{y.data(), 6, 8}, s.saved);
    });
    REQUIRE_THAT(m, Catch::Contains("LayerNorm<8>::forward") && Catch::Contains("at most 5"));
  }
  SECTION("an upstream gradient or input gradient of the wrong width") {
    s.forward(ctx);
    requires_shape_error(
        [&] {
          L8::backward(ctx, s.p.data(), s.g.data(), false, s.input(), ConstMatrix{s.y.data(), 5, 8},
                       ConstMatrix{wide.data(), 5, 9}, Matrix{s.dx.data(), 5, 8}, s.saved);
        },
        "backward");
    requires_shape_error(
        [&] {
          L8::backward(ctx, s.p.data(), s.g.data(), false, s.input(), ConstMatrix{s.y.data(), 5, 8},
                       ConstMatrix{s.dy.data(), 5, 8}, Matrix{wide.data(), 5, 9}, s.saved);
        },
        "backward");
  }
  SECTION("a NaN names its row and column") {
    s.x[3 * 8 + 6] = std::numeric_limits<float>::quiet_NaN();
    const std::string m = message_of<xpipe::NumericError>([&] { s.forward(ctx); });
    REQUIRE_THAT(m, Catch::Contains("LayerNorm<8>") && Catch::Contains("row 3 ") &&
                        Catch::Contains("column 6 "));
  }
  SECTION("an infinity names its row") {
    s.x[1 * 8] = -std::numeric_limits<float>::infinity();
    const std::string m = message_of<xpipe::NumericError>([&] { s.forward(ctx); });
    REQUIRE_THAT(m, Catch::Contains("row 1 ") && Catch::Contains("column 0 "));
  }
}

TEST_CASE("A stage with a LayerNorm between Linears trains", "[layers][layernorm][stage]") {
  using Net = xpipe::Stage<xpipe::Linear<6, 8>, L8, xpipe::GELU, xpipe::Linear<8, 3>>;
  STATIC_REQUIRE(Net::in_width == 6);
  STATIC_REQUIRE(Net::out_width == 3);
  STATIC_REQUIRE(Net::state_count == 0);
  // Linear 6x8 + 8 = 56 -> 64; LayerNorm 16; GELU 0; Linear 8x3 + 3 = 27 -> 32.
  STATIC_REQUIRE(Net::param_offsets == std::array<index_t, 5>{0, 64, 80, 80, 112});
  // Every boundary's output (4 rows of 8, 8, 8, 3) and the LayerNorm's 4 floats a row.
  STATIC_REQUIRE(Net::activation_floats(4) == 4 * (8 + 8 + 8 + 3) + 4 * 4);

  const HostContext ctx{.threads = 2};
  const index_t rows = 4;
  std::vector<float> p(Net::param_count), g(Net::param_count, 0.f), x(rows * 6), dy(rows * 3),
      dx(rows * 6);
  Net::init(p, 9);
  xpipe::Rng rng{12};
  xpipe::test::fill_uniform(x, rng);
  xpipe::test::fill_uniform(dy, rng);
  Net::Activations<xpipe::Host> acts(rows);
  Net::GradScratch<xpipe::Host> scratch(rows);
  const ConstMatrix out = Net::forward(ctx, p.data(), ConstMatrix{x.data(), rows, 6}, acts);
  for (index_t i = 0; i < rows * 3; ++i) REQUIRE(std::isfinite(out.data[i]));
  // With gamma 1 and beta 0 the LayerNorm's output rows have mean 0 and variance near 1.
  const Matrix normed = acts.boundary(2);
  for (index_t r = 0; r < rows; ++r) {
    INFO("row " << r);
    double mean = 0, var = 0;
    for (index_t i = 0; i < 8; ++i) mean += normed(r, i) / 8.0;
    for (index_t i = 0; i < 8; ++i) var += (normed(r, i) - mean) * (normed(r, i) - mean) / 8.0;
    REQUIRE(mean == Approx(0).margin(1e-6));
    REQUIRE(var == Approx(1).epsilon(1e-3));
  }
  Net::backward(ctx, p.data(), g.data(), false, acts, ConstMatrix{dy.data(), rows, 3},
                Matrix{dx.data(), rows, 6}, scratch);
  for (std::size_t l : {0u, 1u, 3u}) {
    INFO("layer " << l);
    bool any = false;
    for (index_t i = Net::param_offsets[l]; i < Net::param_offsets[l + 1]; ++i)
      any = any || g[i] != 0.f;
    REQUIRE(any);
  }
  bool any_dx = false;
  for (float v : dx) {
    REQUIRE(std::isfinite(v));
    any_dx = any_dx || v != 0.f;
  }
  REQUIRE(any_dx);
}
