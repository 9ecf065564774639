// Pooling and flatten layers: hand-worked cases, finite differences, PyTorch's values
// (tests/fixtures/pool_expected.hpp) and composition in a Stage.
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "fixtures/pool_expected.hpp"
#include "support/support.hpp"
#include "xpipe/layers/flatten.hpp"
#include "xpipe/layers/linear.hpp"
#include "xpipe/layers/pool.hpp"
#include "xpipe/layers/stage.hpp"

namespace {

using xpipe::ConstMatrix;
using xpipe::Dims;
using xpipe::HostContext;
using xpipe::index_t;
using xpipe::Matrix;
using xpipe::Shape;

// Runs layer L forward on rows of x and backward with upstream gradient dy; returns {y, dx}.
template <class L>
std::pair<std::vector<float>, std::vector<float>> run_layer(std::span<const float> x,
                                                            std::span<const float> dy, index_t rows,
                                                            int threads = 1) {
  const HostContext ctx{.threads = threads};
  std::vector<float> y(static_cast<std::size_t>(rows * L::out_width));
  std::vector<float> dx(static_cast<std::size_t>(rows * L::in_width), -1.f);
  const ConstMatrix xv{x.data(), rows, L::in_width};
  L::forward(ctx, nullptr, xv, Matrix{y.data(), rows, L::out_width});
  L::backward(ctx, nullptr, nullptr, false, xv, ConstMatrix{y.data(), rows, L::out_width},
              ConstMatrix{dy.data(), rows, L::out_width}, Matrix{dx.data(), rows, L::in_width});
  return {y, dx};
}

// Hand-worked values are sums of a few small binary fractions: exact in float.
void require_equal(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("element " << i);
    REQUIRE(got[i] == want[i]);
  }
}

// Scalar objective sum_ij y_ij r_ij in double, whose gradient with respect to y is r.
template <class L>
double objective(const std::vector<float>& x, const std::vector<float>& r, index_t rows) {
  std::vector<float> y(r.size());
  L::forward(HostContext{}, nullptr, ConstMatrix{x.data(), rows, L::in_width},
             Matrix{y.data(), rows, L::out_width});
  double s = 0;
  for (std::size_t i = 0; i < y.size(); ++i) s += static_cast<double>(y[i]) * r[i];
  return s;
}

// Backward of layer L at x against central differences of its forward. Pooling is piecewise
// linear, so the differences are exact wherever no step of h moves a window's maximum.
template <class L>
void check_finite_differences(std::vector<float> x, index_t rows, float h = 1e-2f) {
  xpipe::Rng rng{11};
  std::vector<float> r(static_cast<std::size_t>(rows * L::out_width));
  xpipe::test::fill_uniform(r, rng);
  const auto [y, dx] = run_layer<L>(x, r, rows);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float keep = x[i];
    x[i] = keep + h;
    const double up = objective<L>(x, r, rows);
    x[i] = keep - h;
    const double down = objective<L>(x, r, rows);
    x[i] = keep;
    INFO("input gradient " << i);
    REQUIRE(dx[i] == Approx((up - down) / (2.0 * h)).margin(1e-3).epsilon(1e-3));
  }
}

// n distinct values 0.05 apart, shuffled: no two cells of a window within 2h (h = 1e-2) of each
// other, so no finite-difference step changes which cell is a window's maximum.
std::vector<float> distinct_inputs(std::size_t n, std::uint64_t seed) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = 0.05f * (static_cast<float>(i) - 0.5f * n);
  xpipe::Rng rng{seed};
  for (std::size_t i = n - 1; i > 0; --i) std::swap(v[i], v[rng.below(i + 1)]);
  return v;
}

std::vector<float> uniform_inputs(std::size_t n, std::uint64_t seed) {
  std::vector<float> v(n);
  xpipe::Rng rng{seed};
  xpipe::test::fill_uniform(v, rng, -2.f, 2.f);
  return v;
}

// Layer L against PyTorch's forward and backward (tests/fixtures/make_pool_fixtures.py), to
// 1e-6 relative (the 1e-7 floor is for the exact zeros of max pooling's gradient).
template <class L>
void check_against_torch(int rows, std::span<const float> x, std::span<const float> dy,
                         std::span<const float> y_torch, std::span<const float> dx_torch) {
  REQUIRE(x.size() == static_cast<std::size_t>(rows * L::in_width));
  REQUIRE(y_torch.size() == static_cast<std::size_t>(rows * L::out_width));
  const auto [y, dx] = run_layer<L>(x, dy, rows);
  for (std::size_t i = 0; i < y.size(); ++i) {
    INFO(L::name() << " output " << i);
    REQUIRE(y[i] == Approx(y_torch[i]).epsilon(1e-6).margin(1e-7));
  }
  for (std::size_t i = 0; i < dx.size(); ++i) {
    INFO(L::name() << " input gradient " << i);
    REQUIRE(dx[i] == Approx(dx_torch[i]).epsilon(1e-6).margin(1e-7));
  }
}

}  // namespace

TEST_CASE("Pooling layers give the shapes PyTorch gives", "[pool]") {
  using xpipe::AvgPool2d;
  using xpipe::GlobalAvgPool;
  using xpipe::MaxPool2d;
  STATIC_REQUIRE(std::is_same_v<MaxPool2d<Shape<3, 6, 6>, 2>::out_shape, Shape<3, 3, 3>>);
  // (7 + 2 - 3) / 2 + 1 = 4.
  STATIC_REQUIRE(std::is_same_v<MaxPool2d<Shape<2, 7, 7>, 3, 2, 1>::out_shape, Shape<2, 4, 4>>);
  STATIC_REQUIRE(std::is_same_v<AvgPool2d<Shape<1, 5, 4>, 3, 1, 1>::out_shape, Shape<1, 5, 4>>);
  // A window that does not fit at the end is dropped (floor): 7 x 5 by 2 gives 3 x 2.
  STATIC_REQUIRE(std::is_same_v<AvgPool2d<Shape<1, 7, 5>, 2>::out_shape, Shape<1, 3, 2>>);
  STATIC_REQUIRE(std::is_same_v<GlobalAvgPool<Shape<4, 5, 3>>::out_shape, Shape<4, 1, 1>>);
  STATIC_REQUIRE(MaxPool2d<Shape<3, 6, 6>, 2>::in_width == 108);
  STATIC_REQUIRE(MaxPool2d<Shape<3, 6, 6>, 2>::out_width == 27);
  STATIC_REQUIRE(GlobalAvgPool<Shape<4, 5, 3>>::out_width == 4);
  STATIC_REQUIRE(xpipe::Flatten<Shape<2, 3, 4>>::out_width == 24);
  STATIC_REQUIRE(xpipe::layer_out_dims<xpipe::Flatten<Shape<2, 3, 4>>>() == Dims{});
  STATIC_REQUIRE(MaxPool2d<Shape<3, 6, 6>, 2>::param_count == 0);
}

TEST_CASE("2x2 max and average pooling of a 4x4 image, by hand", "[pool]") {
  using Max = xpipe::MaxPool2d<Shape<1, 4, 4>, 2>;
  using Avg = xpipe::AvgPool2d<Shape<1, 4, 4>, 2>;
  const std::vector<float> x{1, 5,  2,  0,   //
                             3, 4,  8,  7,   //
                             9, -2, 0,  -1,  //
                             6, 2,  -3, -4};
  const std::vector<float> dy{1, 2, 3, 4};
  const auto [ymax, dxmax] = run_layer<Max>(x, dy, 1);
  require_equal(ymax, {5, 8, 9, 0});
  // Each window's gradient goes to its maximum alone.
  require_equal(dxmax, {0, 1, 0, 0, 0, 0, 2, 0, 3, 0, 4, 0, 0, 0, 0, 0});
  const auto [yavg, dxavg] = run_layer<Avg>(x, dy, 1);
  require_equal(yavg, {13 / 4.f, 17 / 4.f, 15 / 4.f, -8 / 4.f});
  require_equal(dxavg, {.25f, .25f, .5f, .5f, .25f, .25f, .5f, .5f,  //
                        .75f, .75f, 1, 1, .75f, .75f, 1, 1});
}

TEST_CASE("Padding cells never win a max and count as zeros in an average", "[pool]") {
  // 3x3 by 2 with padding 1: the windows take rows (and columns) {0} and {1, 2}.
  using Max = xpipe::MaxPool2d<Shape<1, 3, 3>, 2, 2, 1>;
  using Avg = xpipe::AvgPool2d<Shape<1, 3, 3>, 2, 2, 1>;
  const std::vector<float> x{-1, -2, -3, -4, -5, -6, -7, -8, -9};
  const std::vector<float> dy{1, 2, 3, 4};
  const auto [ymax, dxmax] = run_layer<Max>(x, dy, 1);
  // All inputs are negative: a padding zero taking part would give 0 in every window.
  require_equal(ymax, {-1, -2, -4, -5});
  require_equal(dxmax, {1, 2, 0, 3, 4, 0, 0, 0, 0});
  const auto [yavg, dxavg] = run_layer<Avg>(x, dy, 1);
  // Divided by 4 even where the window holds one or two input cells (count_include_pad).
  require_equal(yavg, {-1 / 4.f, -5 / 4.f, -11 / 4.f, -28 / 4.f});
  require_equal(dxavg, {.25f, .5f, .5f, .75f, 1, 1, .75f, 1, 1});
}

TEST_CASE("Overlapping windows (stride 1) sum the gradient of an input they share", "[pool]") {
  using Max = xpipe::MaxPool2d<Shape<1, 3, 3>, 2, 1>;
  using Avg = xpipe::AvgPool2d<Shape<1, 3, 3>, 2, 1>;
  const std::vector<float> dy{1, 2, 3, 4};
  SECTION("the centre is every window's maximum") {
    const std::vector<float> x{0, 1, 0, 2, 9, 3, 0, 4, 0};
    const auto [y, dx] = run_layer<Max>(x, dy, 1);
    require_equal(y, {9, 9, 9, 9});
    require_equal(dx, {0, 0, 0, 0, 1 + 2 + 3 + 4, 0, 0, 0, 0});
    const auto [yavg, dxavg] = run_layer<Avg>(x, dy, 1);
    require_equal(yavg, {12 / 4.f, 13 / 4.f, 15 / 4.f, 16 / 4.f});
    require_equal(
        dxavg, {1 / 4.f, 3 / 4.f, 2 / 4.f, 4 / 4.f, 10 / 4.f, 6 / 4.f, 3 / 4.f, 7 / 4.f, 4 / 4.f});
  }
  SECTION("an input is the maximum of some of its windows and not of others") {
    const std::vector<float> x{5, 1, 0,  //
                               1, 1, 7,  //
                               0, 1, 0};
    const auto [y, dx] = run_layer<Max>(x, dy, 1);
    require_equal(y, {5, 7, 1, 7});
    // Window (1, 0) holds 1, 1, 0, 1: its first 1 (cell 3) takes dy 3, not the centre, which
    // three windows hold and none picks.
    require_equal(dx, {1, 0, 0, 3, 0, 2 + 4, 0, 0, 0});
  }
}

TEST_CASE("Of equal maxima the first in row-major order wins, as in PyTorch", "[pool]") {
  using Max = xpipe::MaxPool2d<Shape<1, 2, 4>, 2>;
  const std::vector<float> x{3, 0, 2, 5,  //
                             1, 3, 5, 5};
  const auto [y, dx] = run_layer<Max>(x, std::vector<float>{1, 2}, 1);
  require_equal(y, {3, 5});
  require_equal(dx, {1, 0, 0, 2, 0, 0, 0, 0});
  const auto [yc, dxc] = run_layer<xpipe::MaxPool2d<Shape<1, 2, 2>, 2>>(
      std::vector<float>{7, 7, 7, 7}, std::vector<float>{1}, 1);
  require_equal(dxc, {1, 0, 0, 0});
}

TEST_CASE("A NaN in a max-pooling window reaches the output", "[pool]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto [y, dx] = run_layer<xpipe::MaxPool2d<Shape<1, 2, 2>, 2>>(
      std::vector<float>{1, nan, 3, 2}, std::vector<float>{1}, 1);
  REQUIRE(std::isnan(y[0]));
  require_equal(dx, {0, 1, 0, 0});
}

TEST_CASE("Max pooling over 20 channels: each channel keeps its own winner, ties and NaNs",
          "[pool]") {
  // 2x2 windows in scan order a, b, c, d, worked by hand: the pattern, the winning cell and the
  // maximum (the last NaN wins a window that holds one). The host's scatter takes a cell's
  // channels in blocks of 16, so 20 channels take a whole block and a part of one.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Pattern {
    std::array<float, 4> cells;
    int winner;
    float max;
  };
  const std::array<Pattern, 6> patterns{{{{1, 2, 3, 4}, 3, 4},
                                         {{7, 7, 7, 7}, 0, 7},
                                         {{3, 0, 3, -1}, 0, 3},
                                         {{1, nan, 3, nan}, 3, nan},
                                         {{-1, -2, -3, -4}, 0, -1},
                                         {{0, 5, 5, 1}, 1, 5}}};
  constexpr int channels = 20;
  using Max = xpipe::MaxPool2d<Shape<channels, 2, 4>, 2>;  // two windows side by side
  std::vector<float> x(Max::in_width), dy(Max::out_width);
  std::vector<float> want_dx(Max::in_width, 0.f);
  const auto pattern_of = [&](int window, int ch) { return patterns[(ch + 3 * window) % 6]; };
  for (int window = 0; window < 2; ++window)
    for (int ch = 0; ch < channels; ++ch) {
      const Pattern& pat = pattern_of(window, ch);
      const float d = static_cast<float>(1 + ch + 100 * window);
      dy[static_cast<std::size_t>(window * channels + ch)] = d;
      for (int cell = 0; cell < 4; ++cell) {
        const int y = cell / 2, xx = 2 * window + cell % 2;
        const auto at = static_cast<std::size_t>(xpipe::image_index(channels, 4, ch, y, xx));
        x[at] = pat.cells[static_cast<std::size_t>(cell)];
        if (cell == pat.winner) want_dx[at] = d;
      }
    }
  const auto [y, dx] = run_layer<Max>(x, dy, 1);
  for (int window = 0; window < 2; ++window)
    for (int ch = 0; ch < channels; ++ch) {
      INFO("window " << window << ", channel " << ch);
      const float want = pattern_of(window, ch).max,
                  got = y[static_cast<std::size_t>(window * channels + ch)];
      if (std::isnan(want))
        REQUIRE(std::isnan(got));
      else
        REQUIRE(got == want);
    }
  require_equal(dx, want_dx);
}

TEST_CASE("Max pooling's device functors, run by the host's pixel loop, give the host's bits",
          "[pool]") {
  // A device runs ops::MaxPoolForward and ops::MaxPoolBackwardDisjoint, one thread per element
  // and channel; the host runs loops of its own. Here the host's for_each_pixel runs the
  // functors, and both must give the same bits: values from {-1, 0, 1, 2} (ties everywhere) with
  // NaNs here and there, few and many channels, windows cut by padding, stride above the kernel.
  const auto check = [](const xpipe::PoolGeometry& g, index_t rows, std::uint64_t seed) {
    INFO("pooling " << g.c << "x" << g.h << "x" << g.w << ", k " << g.k << ", stride " << g.stride
                    << ", pad " << g.pad);
    const HostContext ctx{};
    xpipe::Rng rng{seed};
    std::vector<float> x(static_cast<std::size_t>(rows * g.in_floats()));
    for (float& v : x)
      v = rng.below(50) == 0 ? std::numeric_limits<float>::quiet_NaN()
                             : static_cast<float>(rng.below(4)) - 1.f;
    std::vector<float> dy(static_cast<std::size_t>(rows * g.out_floats()));
    for (float& v : dy) v = rng.uniform(-1.f, 1.f);
    const ConstMatrix xv{x.data(), rows, g.in_floats()}, dyv{dy.data(), rows, g.out_floats()};
    std::vector<float> y_host(dy.size()), y_device(dy.size());
    xpipe::max_pool_forward(ctx, g, xv, Matrix{y_host.data(), rows, g.out_floats()});
    xpipe::for_each_pixel(
        ctx, rows, static_cast<index_t>(g.oh) * g.ow, g.c,
        xpipe::ops::MaxPoolForward{xv, Matrix{y_device.data(), rows, g.out_floats()}, g});
    REQUIRE(std::memcmp(y_host.data(), y_device.data(), y_host.size() * sizeof(float)) == 0);
    if (g.stride < g.k) return;  // overlapping windows: the gather, the same code on both
    std::vector<float> dx_host(x.size(), -1.f), dx_device(x.size(), 0.f);
    xpipe::max_pool_backward(ctx, g, xv, dyv, Matrix{dx_host.data(), rows, g.in_floats()});
    xpipe::for_each_pixel(ctx, rows, static_cast<index_t>(g.oh) * g.ow, g.c,
                          xpipe::ops::MaxPoolBackwardDisjoint{
                              xv, dyv, Matrix{dx_device.data(), rows, g.in_floats()}, g});
    REQUIRE(std::memcmp(dx_host.data(), dx_device.data(), dx_host.size() * sizeof(float)) == 0);
  };
  check(xpipe::pool_geometry(3, 6, 6, 2, 2, 0), 4, 1);
  check(xpipe::pool_geometry(20, 7, 7, 2, 2, 0), 4, 2);  // the last row and column uncovered
  check(xpipe::pool_geometry(20, 7, 7, 3, 3, 1), 3, 3);  // windows cut by padding
  check(xpipe::pool_geometry(17, 9, 9, 2, 3, 0), 3, 4);  // stride 3 over 2x2 windows
  check(xpipe::pool_geometry(33, 8, 8, 4, 4, 2), 2, 5);  // 2 blocks of 16 and 1 channel
  check(xpipe::pool_geometry(5, 6, 6, 3, 2, 1), 2, 6);   // overlapping: the forward
}

TEST_CASE("GlobalAvgPool averages each channel, by hand", "[pool]") {
  using G = xpipe::GlobalAvgPool<Shape<2, 2, 3>>;
  // Channels-last: channel 0 holds 1..6, channel 1 holds 10..60, pixel by pixel side by side.
  const std::vector<float> x{1, 10, 2, 20, 3, 30, 4, 40, 5, 50, 6, 60};
  const auto [y, dx] = run_layer<G>(x, std::vector<float>{6, 12}, 1);
  require_equal(y, {3.5f, 35});
  require_equal(dx, {1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2});
}

TEST_CASE("image_index and image_place lay images out channels-last, worked by hand",
          "[pool][flatten]") {
  // A 3-channel image 2 pixels high and 4 wide: pixel (y, x) takes floats [3 (4 y + x), +3).
  STATIC_REQUIRE(xpipe::image_index(3, 4, 0, 0, 0) == 0);
  STATIC_REQUIRE(xpipe::image_index(3, 4, 2, 0, 0) == 2);   // the first pixel's last channel
  STATIC_REQUIRE(xpipe::image_index(3, 4, 0, 0, 1) == 3);   // the next pixel of the row
  STATIC_REQUIRE(xpipe::image_index(3, 4, 1, 1, 0) == 13);  // row 1 starts after 4 pixels
  STATIC_REQUIRE(xpipe::image_index(3, 4, 2, 1, 3) == 23);  // the last float of 24
  // And back: image_place decodes the same places.
  constexpr xpipe::ImagePlace at13 = xpipe::image_place(13, 3, 4),
                              at23 = xpipe::image_place(23, 3, 4);
  STATIC_REQUIRE(at13.ch == 1 && at13.y == 1 && at13.x == 0);
  STATIC_REQUIRE(at23.ch == 2 && at23.y == 1 && at23.x == 3);
}

TEST_CASE("Flatten hands features over in PyTorch's order, through views with leading dimensions",
          "[pool][flatten]") {
  using F = xpipe::Flatten<Shape<2, 2, 2>>;
  const HostContext ctx{};
  // Two rows of 8 inside rows of 10 (x) and 12 (y): the gaps must stay as they were.
  std::vector<float> x(20), y(24, -7.f), dx(24, -7.f);
  std::iota(x.begin(), x.end(), 1.f);
  const ConstMatrix xv{x.data(), 2, 8, 10};
  F::forward(ctx, nullptr, xv, Matrix{y.data(), 2, 8, 12});
  // Row 0 channels-last: pixels (1, 2), (3, 4), (5, 6), (7, 8); planar: channel 0's pixels,
  // then channel 1's. Row 1 likewise from 11.
  const std::vector<float> planar{1,  3,  5,  7,  2,  4,  6,  8,  -7, -7, -7, -7,
                                  11, 13, 15, 17, 12, 14, 16, 18, -7, -7, -7, -7};
  require_equal(y, planar);
  // The backward takes a planar gradient back to channels-last: y's values back to x's places.
  F::backward(ctx, nullptr, nullptr, false, ConstMatrix{}, ConstMatrix{},
              ConstMatrix{y.data(), 2, 8, 12}, Matrix{dx.data(), 2, 8, 12});
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 12; ++c) {
      INFO("row " << r << ", column " << c);
      REQUIRE(dx[r * 12 + c] == (c < 8 ? x[r * 10 + c] : -7.f));
    }
}

TEST_CASE("Pooling and flatten backward write nothing without an input gradient", "[pool]") {
  const HostContext ctx{};
  std::vector<float> x(16, 1.f), dy(4, 1.f);
  const ConstMatrix xv{x.data(), 1, 16}, dyv{dy.data(), 1, 4};
  xpipe::MaxPool2d<Shape<1, 4, 4>, 2>::backward(ctx, nullptr, nullptr, false, xv, dyv, dyv,
                                                Matrix{});
  xpipe::AvgPool2d<Shape<1, 4, 4>, 2>::backward(ctx, nullptr, nullptr, false, xv, dyv, dyv,
                                                Matrix{});
  xpipe::GlobalAvgPool<Shape<4, 2, 2>>::backward(ctx, nullptr, nullptr, false, xv, dyv, dyv,
                                                 Matrix{});
  xpipe::Flatten<Shape<1, 4, 4>>::backward(ctx, nullptr, nullptr, false, xv, xv, xv, Matrix{});
  SUCCEED("no layer touched an empty dx");
}

TEST_CASE("Pooling backward matches central finite differences", "[pool][fd]") {
  // Max pooling on distinct inputs (no ties); the others anywhere.
  check_finite_differences<xpipe::MaxPool2d<Shape<2, 5, 5>, 2>>(distinct_inputs(3 * 50, 1), 3);
  check_finite_differences<xpipe::MaxPool2d<Shape<2, 7, 7>, 3, 2, 1>>(distinct_inputs(2 * 98, 2),
                                                                      2);
  check_finite_differences<xpipe::MaxPool2d<Shape<1, 5, 6>, 3, 1, 1>>(distinct_inputs(2 * 30, 3),
                                                                      2);
  check_finite_differences<xpipe::AvgPool2d<Shape<2, 5, 5>, 2>>(uniform_inputs(3 * 50, 4), 3);
  check_finite_differences<xpipe::AvgPool2d<Shape<2, 7, 7>, 3, 2, 1>>(uniform_inputs(2 * 98, 5), 2);
  check_finite_differences<xpipe::AvgPool2d<Shape<1, 5, 6>, 3, 1, 1>>(uniform_inputs(2 * 30, 6), 2);
  check_finite_differences<xpipe::GlobalAvgPool<Shape<3, 4, 5>>>(uniform_inputs(2 * 60, 7), 2);
  check_finite_differences<xpipe::Flatten<Shape<2, 3, 4>>>(uniform_inputs(2 * 24, 8), 2);
}

TEST_CASE("Pooling matches PyTorch's forward and backward", "[pool][torch]") {
  namespace f = xpipe::test::pool_fixtures;
  check_against_torch<xpipe::MaxPool2d<Shape<3, 6, 6>, 2>>(f::max_3x6x6_k2_rows, f::max_3x6x6_k2_x,
                                                           f::max_3x6x6_k2_dy, f::max_3x6x6_k2_y,
                                                           f::max_3x6x6_k2_dx);
  check_against_torch<xpipe::MaxPool2d<Shape<2, 7, 7>, 3, 2, 1>>(
      f::max_2x7x7_k3s2p1_rows, f::max_2x7x7_k3s2p1_x, f::max_2x7x7_k3s2p1_dy,
      f::max_2x7x7_k3s2p1_y, f::max_2x7x7_k3s2p1_dx);
  check_against_torch<xpipe::MaxPool2d<Shape<1, 5, 5>, 3, 1, 1>>(
      f::max_1x5x5_k3s1p1_rows, f::max_1x5x5_k3s1p1_x, f::max_1x5x5_k3s1p1_dy,
      f::max_1x5x5_k3s1p1_y, f::max_1x5x5_k3s1p1_dx);
  check_against_torch<xpipe::AvgPool2d<Shape<3, 6, 6>, 2>>(f::avg_3x6x6_k2_rows, f::avg_3x6x6_k2_x,
                                                           f::avg_3x6x6_k2_dy, f::avg_3x6x6_k2_y,
                                                           f::avg_3x6x6_k2_dx);
  check_against_torch<xpipe::AvgPool2d<Shape<2, 7, 7>, 3, 2, 1>>(
      f::avg_2x7x7_k3s2p1_rows, f::avg_2x7x7_k3s2p1_x, f::avg_2x7x7_k3s2p1_dy,
      f::avg_2x7x7_k3s2p1_y, f::avg_2x7x7_k3s2p1_dx);
  check_against_torch<xpipe::GlobalAvgPool<Shape<4, 5, 5>>>(f::global_4x5x5_rows, f::global_4x5x5_x,
                                                            f::global_4x5x5_dy, f::global_4x5x5_y,
                                                            f::global_4x5x5_dx);
}

TEST_CASE("Pooling gives the same bits on one thread and on two", "[pool]") {
  // 64 rows of 8x16x16: enough work for the host loop to fork.
  using Max = xpipe::MaxPool2d<Shape<8, 16, 16>, 3, 2, 1>;
  using Avg = xpipe::AvgPool2d<Shape<8, 16, 16>, 3, 1, 1>;
  const index_t rows = 64;
  const auto x = uniform_inputs(rows * Max::in_width, 9);
  const auto dmax = uniform_inputs(rows * Max::out_width, 10);
  const auto davg = uniform_inputs(rows * Avg::out_width, 11);
  REQUIRE(run_layer<Max>(x, dmax, rows, 1) == run_layer<Max>(x, dmax, rows, 2));
  REQUIRE(run_layer<Avg>(x, davg, rows, 1) == run_layer<Avg>(x, davg, rows, 2));
}

TEST_CASE("Pooling and flatten refuse views of other widths, naming the layer", "[pool]") {
  using Max = xpipe::MaxPool2d<Shape<3, 6, 6>, 2>;
  using Avg = xpipe::AvgPool2d<Shape<3, 6, 6>, 2>;
  using Global = xpipe::GlobalAvgPool<Shape<3, 6, 6>>;
  using Flat = xpipe::Flatten<Shape<3, 6, 6>>;
  const HostContext ctx{};
  std::vector<float> x(3 * 108), y(3 * 27);
  const ConstMatrix x2{x.data(), 2, 108}, y2{y.data(), 2, 27};
  REQUIRE_THROWS_WITH(
      Max::forward(ctx, nullptr, ConstMatrix{x.data(), 2, 100}, Matrix{y.data(), 2, 27}),
      Catch::Contains("MaxPool2d<Shape<3, 6, 6>, 2, 2, 0>::forward: got views of 2x100 (input "
                      "side) and 2x27 (output side), expected 108 and 27 columns"));
  // Rows differ: dx has 3, dy 2.
  REQUIRE_THROWS_WITH(
      Avg::backward(ctx, nullptr, nullptr, false, x2, y2, y2, Matrix{x.data(), 3, 108}),
      Catch::Contains("AvgPool2d<Shape<3, 6, 6>, 2, 2, 0>::backward: got views of 3x108"));
  REQUIRE_THROWS_AS(Global::forward(ctx, nullptr, x2, Matrix{y.data(), 2, 27}), xpipe::ShapeError);
  REQUIRE_THROWS_WITH(Flat::forward(ctx, nullptr, x2, Matrix{y.data(), 2, 27}),
                      Catch::Contains("Flatten<Shape<3, 6, 6>>::forward"));
}

TEST_CASE("A Stage of pooling, flatten and linear layers runs forward and backward", "[pool]") {
  using Pool = xpipe::MaxPool2d<Shape<1, 4, 4>, 2>;
  using Flat = xpipe::Flatten<Shape<1, 2, 2>>;
  using Fc = xpipe::Linear<4, 3>;
  using S = xpipe::Stage<Pool, Flat, Fc>;
  STATIC_REQUIRE(S::in_width == 16);
  STATIC_REQUIRE(S::out_width == 3);
  STATIC_REQUIRE(S::in_shape == Dims{1, 4, 4});
  STATIC_REQUIRE(S::shapes[1] == Dims{1, 2, 2});
  STATIC_REQUIRE(S::shapes[2] == Dims{});  // flat after Flatten
  // A longer chain of every layer here also composes (a compile-time check of its shapes).
  using Deep =
      xpipe::Stage<xpipe::AvgPool2d<Shape<2, 6, 6>, 2>, xpipe::MaxPool2d<Shape<2, 3, 3>, 3, 1, 1>,
                   xpipe::GlobalAvgPool<Shape<2, 3, 3>>, xpipe::Flatten<Shape<2, 1, 1>>,
                   xpipe::Linear<2, 3>>;
  STATIC_REQUIRE(Deep::widths == std::array<int, 6>{72, 18, 18, 2, 2, 3});
  STATIC_REQUIRE(Deep::check_backend<xpipe::Host>());

  const HostContext ctx{};
  const index_t rows = 3;
  std::vector<float> params(S::param_count), grads(S::param_count);
  S::init(params, 4);
  const auto x = distinct_inputs(rows * 16, 12);
  const auto dy = uniform_inputs(rows * 3, 13);
  S::Activations<xpipe::Host> acts(rows);
  S::GradScratch<xpipe::Host> scratch(rows);
  std::vector<float> dx(rows * 16);
  const ConstMatrix out = S::forward(ctx, params.data(), ConstMatrix{x.data(), rows, 16}, acts);
  S::backward(ctx, params.data(), grads.data(), false, acts, ConstMatrix{dy.data(), rows, 3},
              Matrix{dx.data(), rows, 16}, scratch);

  // The same three layers called one by one.
  const float* w = params.data() + S::param_offsets[2];
  std::vector<float> pooled(rows * 4), flat(rows * 4), y(rows * 3), g(Fc::param_count),
      dflat(rows * 4), dpooled(rows * 4), dx_ref(rows * 16);
  Pool::forward(ctx, nullptr, ConstMatrix{x.data(), rows, 16}, Matrix{pooled.data(), rows, 4});
  Flat::forward(ctx, nullptr, ConstMatrix{pooled.data(), rows, 4}, Matrix{flat.data(), rows, 4});
  Fc::forward(ctx, w, ConstMatrix{flat.data(), rows, 4}, Matrix{y.data(), rows, 3});
  Fc::backward(ctx, w, g.data(), false, ConstMatrix{flat.data(), rows, 4},
               ConstMatrix{y.data(), rows, 3}, ConstMatrix{dy.data(), rows, 3},
               Matrix{dflat.data(), rows, 4});
  Flat::backward(ctx, nullptr, nullptr, false, ConstMatrix{pooled.data(), rows, 4},
                 ConstMatrix{flat.data(), rows, 4}, ConstMatrix{dflat.data(), rows, 4},
                 Matrix{dpooled.data(), rows, 4});
  Pool::backward(ctx, nullptr, nullptr, false, ConstMatrix{x.data(), rows, 16},
                 ConstMatrix{pooled.data(), rows, 4}, ConstMatrix{dpooled.data(), rows, 4},
                 Matrix{dx_ref.data(), rows, 16});
  for (index_t i = 0; i < rows * 3; ++i) REQUIRE(out.data[i] == y[i]);
  require_equal(dx, dx_ref);
  require_equal(std::vector<float>(grads.begin() + S::param_offsets[2],
                                   grads.begin() + S::param_offsets[2] + Fc::param_count),
                g);
  // Each image sends its gradient to 4 of its 16 inputs (one per window), and no more.
  for (index_t r = 0; r < rows; ++r) {
    int routed = 0;
    for (int i = 0; i < 16; ++i) routed += dx[r * 16 + i] != 0.f;
    REQUIRE(routed <= 4);
  }
}
