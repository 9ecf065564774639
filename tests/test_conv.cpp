// Conv2d on the host (oneDNN primitives) against PyTorch's F.conv2d (fixtures/conv_expected.hpp,
// made by fixtures/make_conv_fixtures.py), against central finite differences, and in a Stage.
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "fixtures/conv_expected.hpp"
#include "support/compare.hpp"
#include "support/conv_reference.hpp"
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

namespace {

// Each got[i] within tolerance x scale[i] of want[i].
void require_within(const std::vector<float>& got, const std::vector<double>& want,
                    const std::vector<double>& scale, double tolerance, const char* what) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(got[i] - want[i]) / std::max(scale[i], 1e-30);
    INFO(what << " " << i << ": " << got[i] << " against " << want[i] << " (scale " << scale[i]
              << ")");
    REQUIRE(err <= tolerance);
  }
}

// One forward and whole backward of a 3x3, padding-1 convolution of 16, 32 or 64 channels on
// `threads`, against test::direct_conv: Winograd's error bound is looser than the direct kernels'.
void check_against_direct_sums(xpipe::ConvAlgorithm algorithm, int channels, int side,
                               int threads) {
  const auto g =
      xpipe::make_conv_geometry(3, channels, side, side, channels, 3, 1, 1, false, algorithm);
  const HostContext ctx{.threads = threads};
  std::vector<float> x(static_cast<std::size_t>(g.rows * g.in_floats())),
      w(static_cast<std::size_t>(g.weight_floats())),
      dy(static_cast<std::size_t>(g.rows * g.out_floats())), y(dy.size(), -1.f), dx(x.size(), -1.f),
      dw(w.size(), -1.f);
  xpipe::Rng rng{9};
  xpipe::test::fill_uniform(x, rng);
  xpipe::test::fill_uniform(w, rng);
  xpipe::test::fill_uniform(dy, rng);
  xpipe::ConvPlans<xpipe::Host> plans{g};
  plans.forward(ctx, g, x.data(), w.data(), nullptr, y.data());
  plans.backward(ctx, g, x.data(), w.data(), dy.data(), dx.data(), dw.data(), nullptr, false);
  const xpipe::test::DirectConv want = xpipe::test::direct_conv(g, x, w, {}, dy);
  // Direct sums in float: at most (terms) x 2^-24 of the scale, far less in practice (measured
  // 0.4e-7 to 3.4e-7 here on an AVX-512 EPYC). Winograd F(4x4, 3x3) also rounds its tile
  // transforms (constants up to 8 in magnitude): 1.0e-7 to 6.1e-7 on the same machine. A wrong
  // layout or tile would be off by the scale itself.
  const double tolerance = algorithm == xpipe::ConvAlgorithm::direct ? 2e-6 : 5e-6;
  require_within(y, want.y, want.y_abs, tolerance, "y");
  require_within(dx, want.dx, want.dx_abs, tolerance, "dx");
  require_within(dw, want.dw, want.dw_abs, tolerance, "dw");
}

}  // namespace

TEST_CASE("Direct convolutions run oneDNN's direct kernels and match direct sums",
          "[layers][conv]") {
  // The ResNet's 16-channel 3x3 layer at 28x28, asked to run direct, where oneDNN 2.6 offers its
  // brgemm kernel first on AVX-512 and the plans take its direct jit kernel instead (faster
  // there); elsewhere (AVX2) oneDNN offers no brgemm kernel.
  const auto g =
      xpipe::make_conv_geometry(2, 16, 28, 28, 16, 3, 1, 1, false, xpipe::ConvAlgorithm::direct);
  const HostContext ctx{.threads = 1};
  xpipe::ConvPlans<xpipe::Host> plans{g};
  const std::string name = plans.forward_implementation(ctx, g);
  INFO("oneDNN's forward: " << name);
  REQUIRE(!name.empty());
  REQUIRE(!name.starts_with("brgconv"));
  REQUIRE(name.find("wino") == std::string::npos);
  for (int channels : {16, 32}) {
    INFO(channels << " channels");
    check_against_direct_sums(xpipe::ConvAlgorithm::direct, channels, channels == 16 ? 28 : 14, 1);
  }
}

TEST_CASE("Winograd convolutions run where oneDNN offers them and match direct sums",
          "[layers][conv]") {
  // The ResNet's three 3x3 shapes: 16 channels (nChw16c is channels-last's own bytes), 32 and 64
  // (reordered to and from nChw16c). oneDNN 2.6 has Winograd kernels for AVX-512 cores only.
  for (int channels : {16, 32, 64})
    for (int threads : {1, 2}) {
      const int side = channels == 16 ? 28 : channels == 32 ? 14 : 7;
      const auto g = xpipe::make_conv_geometry(3, channels, side, side, channels, 3, 1, 1, false);
      const HostContext ctx{.threads = threads};
      xpipe::ConvPlans<xpipe::Host> plans{g};
      const std::string forward = plans.forward_implementation(ctx, g),
                        weights = plans.backward_weights_implementation(ctx, g);
      INFO(channels << " channels on " << threads << " threads; oneDNN's forward " << forward
                    << ", backward weights " << weights);
      // oneDNN's avx512_core (F, VL, BW, DQ) is what host_isa() calls avx512.
      if (xpipe::host_isa() == xpipe::HostIsa::avx512) {
        REQUIRE(forward.starts_with("jit_wino"));
        REQUIRE(weights.starts_with("jit_wino"));
      } else {
        WARN("no AVX-512 here, so no Winograd kernel in oneDNN 2.6: the direct kernels checked");
      }
      check_against_direct_sums(xpipe::ConvAlgorithm::winograd, channels, side, threads);
    }
}

TEST_CASE("A convolution whose channels do not come in 16s runs direct under Winograd",
          "[layers][conv]") {
  // The ResNet's stem, 1 -> 16 channels: oneDNN would pad its one input channel to 16.
  for (const auto& g : {xpipe::make_conv_geometry(2, 1, 28, 28, 16, 3, 1, 1, false),
                        xpipe::make_conv_geometry(2, 16, 14, 14, 24, 3, 1, 1, false)}) {
    const HostContext ctx{.threads = 1};
    xpipe::ConvPlans<xpipe::Host> plans{g};
    const std::string forward = plans.forward_implementation(ctx, g),
                      weights = plans.backward_weights_implementation(ctx, g);
    INFO(xpipe::conv_geometry_text(g)
         << ": oneDNN's forward " << forward << ", backward weights " << weights);
    REQUIRE(forward.find("wino") == std::string::npos);
    REQUIRE(weights.find("wino") == std::string::npos);
  }
}

TEST_CASE("A Winograd convolution's split backward gives the whole backward's bits",
          "[layers][conv]") {
  // 32 channels: dy is reordered to nChw16c for both backward primitives, once in the whole
  // backward and once each in the split one; accumulate adds the same bits again.
  const auto g = xpipe::make_conv_geometry(4, 32, 14, 14, 32, 3, 1, 1, true);
  const HostContext ctx{.threads = 2};
  std::vector<float> x(static_cast<std::size_t>(g.rows * g.in_floats())),
      w(static_cast<std::size_t>(g.weight_floats())), b(32),
      dy(static_cast<std::size_t>(g.rows * g.out_floats())), other(dy.size()), y(dy.size());
  xpipe::Rng rng{21};
  for (auto* v : {&x, &w, &b, &dy, &other}) xpipe::test::fill_uniform(*v, rng);
  xpipe::ConvPlans<xpipe::Host> plans{g};
  std::vector<float> dx(x.size()), dw(w.size()), db(32);
  plans.forward(ctx, g, x.data(), w.data(), b.data(), y.data());
  plans.backward(ctx, g, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), false);
  // Split: backward_data, another micro-batch's backward_data in between (it overwrites the
  // thread's call buffer), then backward_weights of the first.
  std::vector<float> dx2(x.size()), dw2(w.size()), db2(32), scratch(x.size());
  plans.backward_data(ctx, g, w.data(), dy.data(), dx2.data());
  plans.backward_data(ctx, g, w.data(), other.data(), scratch.data());
  plans.backward_weights(ctx, g, x.data(), dy.data(), dw2.data(), db2.data(), false);
  REQUIRE(xpipe::test::same_bits(dx2, dx));
  REQUIRE(xpipe::test::same_bits(dw2, dw));
  REQUIRE(xpipe::test::same_bits(db2, db));
  plans.backward(ctx, g, x.data(), w.data(), dy.data(), dx2.data(), dw2.data(), db2.data(), true);
  for (std::size_t i = 0; i < dw.size(); ++i) REQUIRE(dw2[i] == dw[i] + dw[i]);
  for (std::size_t i = 0; i < db.size(); ++i) REQUIRE(db2[i] == db[i] + db[i]);
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

namespace {

// One convolution's operands and results: forward y, then the whole backward's dx, dw.
struct ConvCall {
  xpipe::ConvGeometry g;
  std::vector<float> x, w, dy, y, dx, dw;
  ConvCall(const xpipe::ConvGeometry& geometry, std::uint64_t seed)
      : g(geometry),
        x(static_cast<std::size_t>(g.rows * g.in_floats())),
        w(static_cast<std::size_t>(g.weight_floats())),
        dy(static_cast<std::size_t>(g.rows * g.out_floats())),
        y(dy.size()),
        dx(x.size()),
        dw(w.size()) {
    xpipe::Rng rng{seed};
    for (auto* v : {&x, &w, &dy}) xpipe::test::fill_uniform(*v, rng);
  }
  void forward(const HostContext& ctx, xpipe::ConvPlans<xpipe::Host>& plans) {
    plans.forward(ctx, g, x.data(), w.data(), nullptr, y.data());
  }
  void backward(const HostContext& ctx, xpipe::ConvPlans<xpipe::Host>& plans) {
    plans.backward(ctx, g, x.data(), w.data(), dy.data(), dx.data(), dw.data(), nullptr, false);
  }
};

}  // namespace

TEST_CASE("Convolutions sharing a thread's call buffer give the bits they give alone",
          "[layers][conv]") {
  // Every convolution a thread runs keeps its scratchpads and Winograd's reordered activations in
  // one buffer of the thread's, grown to the largest call: interleaved calls of three layers of
  // different needs against each layer run on a thread of its own.
  const HostContext ctx{.threads = 1};
  const auto geometry = [](int channels, int side, index_t rows) {
    return xpipe::make_conv_geometry(rows, channels, side, side, channels, 3, 1, 1, false);
  };
  const std::array<xpipe::ConvGeometry, 3> shapes{geometry(32, 14, 2), geometry(64, 7, 8),
                                                  geometry(16, 28, 4)};
  std::vector<ConvCall> alone, together;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    alone.emplace_back(shapes[i], 30 + i);
    together.emplace_back(shapes[i], 30 + i);
  }
  for (auto& call : alone)
    std::thread([&] {
      xpipe::ConvPlans<xpipe::Host> plans{call.g};
      call.forward(ctx, plans);
      call.backward(ctx, plans);
    }).join();
  std::vector<std::unique_ptr<xpipe::ConvPlans<xpipe::Host>>> plans;
  for (auto& call : together)
    plans.push_back(std::make_unique<xpipe::ConvPlans<xpipe::Host>>(call.g));
  // On a new thread too, whose buffer starts empty and grows as the calls need.
  std::thread([&] {
    for (std::size_t i = 0; i < together.size(); ++i) together[i].forward(ctx, *plans[i]);
    for (std::size_t i = together.size(); i-- > 0;) together[i].backward(ctx, *plans[i]);
  }).join();
  for (std::size_t i = 0; i < together.size(); ++i) {
    INFO(xpipe::conv_geometry_text(shapes[i]));
    REQUIRE(xpipe::test::same_bits(together[i].y, alone[i].y));
    REQUIRE(xpipe::test::same_bits(together[i].dx, alone[i].dx));
    REQUIRE(xpipe::test::same_bits(together[i].dw, alone[i].dw));
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

namespace {
// The VGG in its paper's order, ReLU before each pooling (models/vgg.hpp pools first).
namespace vgg = xpipe::models::vgg;
using VggReluFirst =
    xpipe::Stage<vgg::C1, xpipe::ReLU, vgg::C2, xpipe::ReLU, vgg::P1, vgg::C3, xpipe::ReLU, vgg::C4,
                 xpipe::ReLU, vgg::P2, vgg::F, vgg::FC1, xpipe::ReLU, vgg::FC2>;

template <class Net>
std::vector<float> vgg_trained(const xpipe::test::LabelledData& d, int threads) {
  xpipe::SequentialTrainer<Net, xpipe::Adam> t(xpipe::Adam{.lr = 1e-2f}, 16, 7);
  const HostContext ctx{.threads = threads};
  for (index_t first = 0; first + 16 <= d.rows; first += 16)
    t.train_step(ctx, {d.x.data() + first * d.cols, 16, d.cols}, d.y.data() + first);
  const float* w = t.state().weights();
  return {w, w + Net::param_count};
}
}  // namespace

TEST_CASE("The VGG's ReLU after each pooling trains the bits of ReLU before it",
          "[models][conv][oracle]") {
  // max(relu(x)) = relu(max(x)), and the window's winner takes the gradient either way: six
  // steps of Adam (a large rate, so that many units go negative) give the same weights, bit for
  // bit, on 1 and on 2 threads.
  static_assert(vgg::K1::out_shape == VggReluFirst::out_shape);
  static_assert(vgg::K1::param_count == VggReluFirst::param_count);
  const auto d = xpipe::test::random_classification(96, 28 * 28, 10, 11);
  const xpipe::SequentialTrainer<VggReluFirst, xpipe::Adam> untrained(xpipe::Adam{}, 16, 7);
  const std::vector<float> initial(untrained.state().weights(),
                                   untrained.state().weights() + VggReluFirst::param_count);
  for (int threads : {1, 2}) {
    INFO(threads << " threads");
    const std::vector<float> want = vgg_trained<VggReluFirst>(d, threads);
    REQUIRE(want != initial);  // the steps moved the weights
    REQUIRE(vgg_trained<vgg::K1>(d, threads) == want);
  }
}
