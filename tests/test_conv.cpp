// Conv2d on the host (oneDNN primitives) against PyTorch's F.conv2d (fixtures/conv_expected.hpp,
// made by fixtures/make_conv_fixtures.py), against central finite differences, and in a Stage.
#include <catch2/catch.hpp>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "fixtures/conv_expected.hpp"
#include "support/compare.hpp"
#include "support/support.hpp"
#include "xpipe/models/resnet.hpp"
#include "xpipe/models/vgg.hpp"
#include "xpipe/xpipe.hpp"

namespace {

using xpipe::ConstMatrix;
using xpipe::ConvOptions;
using xpipe::HostContext;
using xpipe::index_t;
using xpipe::Matrix;
using xpipe::Shape;

// One call's operands and results, in the layer's flat-parameter layout.
template <class L>
struct Run {
  index_t rows;
  std::vector<float> p, x, dy, y, dx, g;
  explicit Run(index_t n)
      : rows(n),
        p(L::param_count, 0.f),
        x(n * L::in_width),
        dy(n * L::out_width),
        y(n * L::out_width),
        dx(n * L::in_width),
        g(L::param_count, 0.f) {}
  void go(const HostContext& ctx, typename L::template Saved<xpipe::Host>& saved,
          bool accumulate = false) {
    L::forward(ctx, p.data(), ConstMatrix{x.data(), rows, L::in_width},
               Matrix{y.data(), rows, L::out_width}, saved);
    L::backward(ctx, p.data(), g.data(), accumulate, ConstMatrix{x.data(), rows, L::in_width},
                ConstMatrix{y.data(), rows, L::out_width},
                ConstMatrix{dy.data(), rows, L::out_width}, Matrix{dx.data(), rows, L::in_width},
                saved);
  }
};

// PyTorch's values within 1e-5 + 1e-5 |want| (the fixtures are float64).
void require_close(std::span<const float> got, std::span<const float> want, const char* what) {
  xpipe::test::require_close(got, want, what, 1e-5f, 1e-5f);
}

// Runs layer L on a fixture case (x, w, b, dy) and compares y, dx, dW, db with PyTorch's.
template <class L, class Case>
void check_against_torch(index_t rows, int threads) {
  const HostContext ctx{.threads = threads};
  Run<L> run(rows);
  typename L::template Saved<xpipe::Host> saved(rows);
  REQUIRE(std::size(Case::x) == run.x.size());
  REQUIRE(std::size(Case::dy) == run.dy.size());
  std::copy(std::begin(Case::x), std::end(Case::x), run.x.begin());
  std::copy(std::begin(Case::dy), std::end(Case::dy), run.dy.begin());
  std::copy(std::begin(Case::w), std::end(Case::w), run.p.begin());
  const bool bias = L::param_count > L::weight_count;
  if (bias) std::copy(std::begin(Case::b), std::end(Case::b), run.p.begin() + L::weight_count);
  run.go(ctx, saved);
  require_close(run.y, Case::y, "y");
  require_close(run.dx, Case::dx, "dx");
  require_close(std::span<const float>(run.g).first(L::weight_count), Case::dw, "dW");
  if (bias) require_close(std::span<const float>(run.g).subspan(L::weight_count), Case::db, "db");
}

using Pad1 = xpipe::Conv2d<Shape<1, 6, 6>, 3, 3, ConvOptions{.padding = 1}>;
using Stride2 = xpipe::Conv2d<Shape<2, 7, 7>, 4, 3, ConvOptions{.stride = 2, .padding = 1}>;
using K5NoBias = xpipe::Conv2d<Shape<3, 5, 5>, 2, 5, ConvOptions{.bias = false}>;
using K1 = xpipe::Conv2d<Shape<4, 6, 6>, 5, 1>;

}  // namespace

TEST_CASE("Conv2d's shapes and parameter layout", "[layers][conv]") {
  STATIC_REQUIRE(std::is_same_v<Pad1::out_shape, Shape<3, 6, 6>>);
  STATIC_REQUIRE(std::is_same_v<Stride2::out_shape, Shape<4, 4, 4>>);  // floor((7 + 2 - 3) / 2) + 1
  STATIC_REQUIRE(std::is_same_v<K5NoBias::out_shape, Shape<2, 1, 1>>);
  STATIC_REQUIRE(Pad1::param_count == 3 * 1 * 3 * 3 + 3);
  STATIC_REQUIRE(K5NoBias::param_count == 2 * 3 * 5 * 5);
  STATIC_REQUIRE(Stride2::in_width == 98 && Stride2::out_width == 64);
}

TEST_CASE("Multiply-adds of a convolution, a block and the two CNNs, worked by hand",
          "[layers][conv][models]") {
  // Output pixels x input channels x kernel area: 4 x 4 x 4 outputs, 2 channels, 3 x 3.
  STATIC_REQUIRE(Stride2::macs == 4.0 * 4 * 4 * 2 * 9);
  namespace vgg = xpipe::models::vgg;
  namespace resnet = xpipe::models::resnet;
  // VGG: 784 x 16 x 1 x 9 + 784 x 16 x 16 x 9 + 196 x 32 x 16 x 9 + 196 x 32 x 32 x 9
  //   + 1568 x 128 + 128 x 10 = 112,896 + 1,806,336 + 903,168 + 1,806,336 + 200,704 + 1,280.
  STATIC_REQUIRE(vgg::K1::macs == 4'830'720);
  // A strided block 16 -> 32 at 28 -> 14: 196 x 32 x 16 x 9 + 196 x 32 x 32 x 9 + the 1x1
  // shortcut 196 x 32 x 16 = 903,168 + 1,806,336 + 100,352.
  STATIC_REQUIRE(resnet::D32::macs == 2'809'856);
  // ResNet: the stem 112,896, three 16-channel blocks of 2 x 1,806,336, two 32-channel and two
  // 64-channel blocks of 3,612,672 each, two strided blocks of 2,809,856, the classifier 640.
  STATIC_REQUIRE(resnet::K1::macs == 112'896 + 3 * 3'612'672 + 2 * 2'809'856 + 4 * 3'612'672 + 640);
  // Every split has the whole network's multiply-adds.
  STATIC_REQUIRE(resnet::A::macs + resnet::B::macs + resnet::C::macs + resnet::D::macs ==
                 resnet::K1::macs);
  STATIC_REQUIRE(vgg::K2a::macs + vgg::K2b::macs == vgg::K1::macs);
}

TEST_CASE("Conv2d matches PyTorch's conv2d forward and backward", "[layers][conv][torch]") {
  for (int threads : {1, 2}) {
    INFO(threads << " threads");
    check_against_torch<Pad1, conv_expected::pad1>(2, threads);
    check_against_torch<Stride2, conv_expected::stride2>(3, threads);
    check_against_torch<K5NoBias, conv_expected::k5_nobias>(2, threads);
    check_against_torch<K1, conv_expected::k1>(2, threads);
  }
}

TEST_CASE("A 16-channel convolution runs oneDNN's direct kernel and matches a direct sum",
          "[layers][conv]") {
  // The ResNet's 16-channel 3x3 layer at 28x28, where oneDNN 2.6 offers its brgemm kernel first
  // on AVX-512 and the plans take its direct jit kernel instead (faster there); elsewhere
  // (AVX2) oneDNN offers no brgemm kernel. Its output against a sum in double over the window.
  const auto g = xpipe::make_conv_geometry(2, 16, 28, 28, 16, 3, 1, 1, false);
  const HostContext ctx{.threads = 1};
  xpipe::ConvPlans<xpipe::Host> plans{g};
  const std::string name = plans.forward_implementation(ctx, g);
  INFO("oneDNN's forward: " << name);
  REQUIRE(!name.empty());
  REQUIRE(!name.starts_with("brgconv"));
  std::vector<float> x(static_cast<std::size_t>(g.rows * g.in_floats())),
      w(static_cast<std::size_t>(g.weight_floats())),
      y(static_cast<std::size_t>(g.rows * g.out_floats()));
  xpipe::Rng rng{9};
  xpipe::test::fill_uniform(x, rng);
  xpipe::test::fill_uniform(w, rng);
  plans.forward(ctx, g, x.data(), w.data(), nullptr, y.data());
  // Channels-last x and y (channel fastest), OIHW w.
  for (int r = 0; r < g.rows; ++r)
    for (int oy = 0; oy < g.oh; ++oy)
      for (int ox = 0; ox < g.ow; ++ox)
        for (int o = 0; o < g.oc; ++o) {
          double sum = 0;
          for (int ky = 0; ky < 3; ++ky)
            for (int kx = 0; kx < 3; ++kx) {
              const int iy = oy + ky - 1, ix = ox + kx - 1;
              if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
              for (int c = 0; c < g.c; ++c)
                sum += double(x[((r * g.h + iy) * g.w + ix) * g.c + c]) *
                       w[((o * g.c + c) * 3 + ky) * 3 + kx];
            }
          const float got = y[((r * g.oh + oy) * g.ow + ox) * g.oc + o];
          INFO("image " << r << ", pixel " << oy << "," << ox << ", channel " << o);
          REQUIRE(got == Approx(sum).margin(1e-5).epsilon(1e-5));
        }
}

namespace {

// A strided 1x1 convolution's dw and db on two threads, from 40 plans each running forward and
// the whole backward 4 times on the same x, w and dy (the sequence that showed the fault):
// every dw against sums in double, and all of the same bits.
void check_strided_1x1_weight_gradient(const xpipe::ConvGeometry& g) {
  const HostContext ctx{.threads = 2};
  std::vector<float> x(static_cast<std::size_t>(g.rows * g.in_floats())),
      dy(static_cast<std::size_t>(g.rows * g.out_floats())),
      w(static_cast<std::size_t>(g.weight_floats())), b(static_cast<std::size_t>(g.oc)),
      y(dy.size()), dx(x.size());
  xpipe::Rng rng{12};
  xpipe::test::fill_uniform(x, rng);
  xpipe::test::fill_uniform(dy, rng);
  xpipe::test::fill_uniform(w, rng);
  // Channels-last x and dy; OIHW dw (1x1: o x c). Output pixel (oy, ox) reads (2oy, 2ox).
  std::vector<double> want(w.size()), want_b(b.size());
  for (int o = 0; o < g.oc; ++o) {
    for (index_t r = 0; r < g.rows; ++r)
      for (int p = 0; p < g.oh * g.ow; ++p) want_b[o] += dy[(r * g.oh * g.ow + p) * g.oc + o];
    for (int c = 0; c < g.c; ++c)
      for (index_t r = 0; r < g.rows; ++r)
        for (int oy = 0; oy < g.oh; ++oy)
          for (int ox = 0; ox < g.ow; ++ox)
            want[o * g.c + c] += double(dy[((r * g.oh + oy) * g.ow + ox) * g.oc + o]) *
                                 x[((r * g.h + 2 * oy) * g.w + 2 * ox) * g.c + c];
  }
  std::vector<float> first;
  for (int plan = 0; plan < 40; ++plan) {
    xpipe::ConvPlans<xpipe::Host> plans{g.with_rows(8)};
    const std::string name = plans.backward_weights_implementation(ctx, g);
    INFO("oneDNN's backward weights: " << name);
    REQUIRE(!name.starts_with("jit_1x1"));
    for (int call = 0; call < 4; ++call) {
      INFO("plan " << plan << ", call " << call);
      std::vector<float> dw(w.size(), -1.f), db(b.size(), -1.f);
      plans.forward(ctx, g, x.data(), w.data(), b.data(), y.data());
      plans.backward(ctx, g, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), false);
      for (std::size_t i = 0; i < dw.size(); ++i) {
        INFO("weight " << i);
        REQUIRE(dw[i] == Approx(want[i]).margin(1e-5).epsilon(1e-5));
      }
      for (std::size_t o = 0; o < db.size(); ++o)
        REQUIRE(db[o] == Approx(want_b[o]).margin(1e-5).epsilon(1e-5));
      if (first.empty()) first = dw;
      REQUIRE(xpipe::test::same_bits(dw, first));
    }
  }
}

}  // namespace

TEST_CASE(
    "A strided 1x1 convolution from few channels takes a backward-weights kernel that is "
    "right",
    "[layers][conv]") {
  // oneDNN 2.6's 1x1 backward-weights kernel writes past its workspace on channels-last input
  // with a stride and fewer input channels than its block (uxlfoundation/oneDNN#6035): on an
  // AVX2 EPYC the weight gradient of one image of 4 x 6 x 6 came out wrong in about 1 call in
  // 12. The plans take oneDNN's next kernel there.
  for (index_t rows : {1, 3})
    for (int side : {6, 9})
      for (int channels : {4, 12}) {
        INFO(rows << " images of " << channels << " x " << side << " x " << side);
        check_strided_1x1_weight_gradient(
            xpipe::make_conv_geometry(rows, channels, side, side, 8, 1, 2, 0, true));
      }
}

TEST_CASE("Conv2d backward matches central finite differences", "[layers][conv][fd]") {
  using L = xpipe::Conv2d<Shape<2, 5, 5>, 3, 3, ConvOptions{.stride = 2, .padding = 1}>;
  const HostContext ctx{.threads = 1};
  const index_t rows = 2;
  xpipe::Rng rng{5};
  Run<L> run(rows);
  L::init(run.p, 3);
  for (float& v : std::span(run.p).subspan(L::weight_count)) v = rng.uniform(-0.5f, 0.5f);
  xpipe::test::fill_uniform(run.x, rng);
  xpipe::test::fill_uniform(run.dy, rng);  // the objective is sum(y * dy)
  L::Saved<xpipe::Host> saved(rows);
  run.go(ctx, saved);
  const auto objective = [&] {
    std::vector<float> y(run.y.size());
    L::forward(ctx, run.p.data(), ConstMatrix{run.x.data(), rows, L::in_width},
               Matrix{y.data(), rows, L::out_width}, saved);
    double s = 0;
    for (std::size_t i = 0; i < y.size(); ++i) s += double(y[i]) * run.dy[i];
    return s;
  };
  const float h = 1e-2f;
  const auto central = [&](std::vector<float>& v, std::size_t i) {
    const float keep = v[i];
    v[i] = keep + h;
    const double up = objective();
    v[i] = keep - h;
    const double down = objective();
    v[i] = keep;
    return (up - down) / (2.0 * h);
  };
  for (std::size_t i = 0; i < run.x.size(); ++i) {
    INFO("input gradient " << i);
    REQUIRE(run.dx[i] == Approx(central(run.x, i)).margin(1e-3).epsilon(1e-3));
  }
  for (std::size_t i = 0; i < run.p.size(); ++i) {
    INFO("parameter gradient " << i);
    REQUIRE(run.g[i] == Approx(central(run.p, i)).margin(1e-3).epsilon(1e-3));
  }
}

TEST_CASE("Conv2d accumulates gradients, repeats its bits and takes smaller batches",
          "[layers][conv]") {
  const HostContext ctx{.threads = 2};
  xpipe::Rng rng{8};
  Run<Stride2> a(3);
  Stride2::init(a.p, 1);
  xpipe::test::fill_uniform(a.x, rng);
  xpipe::test::fill_uniform(a.dy, rng);
  Stride2::Saved<xpipe::Host> saved(3);
  a.go(ctx, saved);
  const std::vector<float> once = a.g, y = a.y;

  SECTION("the same call again gives the same bits") {
    Run<Stride2> b = a;
    b.go(ctx, saved);
    REQUIRE(b.y == y);
    REQUIRE(b.g == once);
  }
  SECTION("accumulate adds the new gradient to the buffer") {
    a.go(ctx, saved, true);
    for (std::size_t i = 0; i < once.size(); ++i) REQUIRE(a.g[i] == Approx(2 * once[i]));
  }
  SECTION("a smaller batch gets a plan of its own and the same per-image results") {
    Run<Stride2> small(1);
    small.p = a.p;
    std::copy_n(a.x.begin() + Stride2::in_width, Stride2::in_width, small.x.begin());
    std::copy_n(a.dy.begin() + Stride2::out_width, Stride2::out_width, small.dy.begin());
    small.go(ctx, saved);
    for (int i = 0; i < Stride2::out_width; ++i)
      REQUIRE(small.y[i] == Approx(y[Stride2::out_width + i]).margin(1e-6));
  }
  SECTION("a batch larger than the slot's is a ShapeError naming the convolution") {
    Run<Stride2> big(4);
    Stride2::init(big.p, 1);
    REQUIRE_THROWS_WITH(big.go(ctx, saved),
                        Catch::Contains("convolution 4x2x7x7 -> 4x4x4") &&
                            Catch::Contains("does not fit the plans made for 3x2x7x7"));
  }
}

TEST_CASE("Conv2d refuses views of other widths, naming the layer", "[layers][conv]") {
  const HostContext ctx{.threads = 1};
  std::vector<float> p(Pad1::param_count), x(2 * 30), y(2 * Pad1::out_width);
  Pad1::Saved<xpipe::Host> saved(2);
  REQUIRE_THROWS_WITH(
      Pad1::forward(ctx, p.data(), ConstMatrix{x.data(), 2, 30},
                    Matrix{y.data(), 2, Pad1::out_width}, saved),
      Catch::Contains("Conv2d<1x6x6 -> 3x6x6, kernel 3, stride 1, padding 1>::forward") &&
          Catch::Contains("expected 36 and 108"));
}

TEST_CASE("A stage of convolutions checks shapes and trains like its layers", "[layers][conv]") {
  using S = xpipe::Stage<Pad1, xpipe::ReLU, xpipe::Conv2d<Shape<3, 6, 6>, 2, 3>, xpipe::ReLU,
                         xpipe::Linear<32, 4>>;
  STATIC_REQUIRE(S::in_shape == xpipe::Dims{1, 6, 6});
  STATIC_REQUIRE(S::shapes[2] == xpipe::Dims{3, 6, 6});  // ReLU keeps its input's shape
  STATIC_REQUIRE(S::shapes[4] == xpipe::Dims{2, 4, 4});
  STATIC_REQUIRE(!S::out_shape.known());  // Linear gives a flat width
  const HostContext ctx{.threads = 1};
  std::vector<float> p(S::param_count), g(S::param_count, 0.f), x(3 * 36), dy(3 * 4), dx(3 * 36);
  S::init(p, 11);
  xpipe::Rng rng{2};
  xpipe::test::fill_uniform(x, rng);
  xpipe::test::fill_uniform(dy, rng);
  S::Activations<xpipe::Host> acts(3);
  S::GradScratch<xpipe::Host> scratch(3);
  const ConstMatrix out = S::forward(ctx, p.data(), ConstMatrix{x.data(), 3, 36}, acts);
  REQUIRE(out.cols == 4);
  S::backward(ctx, p.data(), g.data(), false, acts, ConstMatrix{dy.data(), 3, 4},
              Matrix{dx.data(), 3, 36}, scratch);
  // The stage's first convolution, run alone on the same input, gives the stage's first boundary.
  Run<Pad1> alone(3);
  std::copy_n(p.begin(), Pad1::param_count, alone.p.begin());
  alone.x = x;
  Pad1::Saved<xpipe::Host> saved(3);
  Pad1::forward(ctx, alone.p.data(), ConstMatrix{x.data(), 3, 36},
                Matrix{alone.y.data(), 3, Pad1::out_width}, saved);
  const Matrix first = acts.boundary(1);
  for (index_t i = 0; i < 3 * Pad1::out_width; ++i) REQUIRE(first.data[i] == alone.y[i]);
  bool any_grad = false;
  for (float v : std::span(g).first(Pad1::weight_count)) any_grad = any_grad || v != 0.f;
  REQUIRE(any_grad);
}
