// Host launchers of the shared math: values, numerical stability, and thread-count independence.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "support/support.hpp"
#include "xpipe/xpipe.hpp"

using xpipe::ConstMatrix;
using xpipe::HostContext;
using xpipe::Matrix;

TEST_CASE("Softmax cross-entropy is stable for logits of +-1e4", "[kernels]") {
  std::vector<float> logits{1e4f, -1e4f, 0.f, 1e4f - 2.f};
  std::vector<float> grad(4);
  const float loss_top = xpipe::math::softmax_xent_row(logits.data(), 4, 0, 1.f, grad.data());
  for (float g : grad) REQUIRE(std::isfinite(g));
  // p0 = 1 / (1 + e^-2) (the other terms are below float precision); loss = log(1 + e^-2).
  REQUIRE(loss_top == Approx(std::log1p(std::exp(-2.0))).epsilon(1e-5));
  REQUIRE(grad[0] == Approx(1.0 / (1.0 + std::exp(-2.0)) - 1.0).epsilon(1e-5));
  REQUIRE(grad[1] == 0.f);
  // Label on the -1e4 logit: loss ~ 2e4, finite, gradient -1 on that class.
  const float loss_low = xpipe::math::softmax_xent_row(logits.data(), 4, 1, 1.f, grad.data());
  REQUIRE(std::isfinite(loss_low));
  REQUIRE(loss_low == Approx(2e4).epsilon(1e-4));
  REQUIRE(grad[1] == Approx(-1.f));
  std::vector<float> neg{-1e4f, -1e4f, -1e4f};
  REQUIRE(xpipe::math::softmax_xent_row(neg.data(), 3, 1, 1.f, grad.data()) ==
          Approx(std::log(3.0)));
}

TEST_CASE("Activation values against closed forms", "[kernels]") {
  using xpipe::math::Gelu;
  using xpipe::math::Relu;
  REQUIRE(Relu::forward(-3.f) == 0.f);
  REQUIRE(Relu::forward(2.5f) == 2.5f);
  REQUIRE(Relu::backward(-1.f, 0.f, 5.f) == 0.f);
  REQUIRE(Relu::backward(1.f, 1.f, 5.f) == 5.f);
  // GELU(1) = 1 * Phi(1) = 0.841344746...; GELU(-1) = -0.158655253...
  REQUIRE(Gelu::forward(1.f) == Approx(0.8413447460685429).epsilon(1e-6));
  REQUIRE(Gelu::forward(-1.f) == Approx(-0.15865525393145707).epsilon(1e-5));
  // d/dx GELU at 0 is Phi(0) = 0.5.
  REQUIRE(Gelu::backward(0.f, 0.f, 2.f) == Approx(1.f));
}

TEST_CASE("ReLU's gradient from its output has the bits of the select on special values",
          "[kernels]") {
  // backward_from_output(y, dy) masks dy's bits by y > 0: it must equal `y > 0 ? dy : 0`
  // (+0 where masked) bit for bit, and Relu::backward at the input that gave y.
  using xpipe::math::Relu;
  const float inf = std::numeric_limits<float>::infinity(),
              nan = std::numeric_limits<float>::quiet_NaN(),
              tiny = std::numeric_limits<float>::denorm_min();
  const std::vector<float> values{0.f, -0.f, 1.f, -1.f, tiny, -tiny, 3e38f, -3e38f, inf, -inf, nan};
  const auto bits = [](float v) {
    std::uint32_t b;
    std::memcpy(&b, &v, sizeof b);
    return b;
  };
  for (float x : values)
    for (float dy : values) {
      const float y = Relu::forward(x);
      const float want = y > 0.f ? dy : 0.f;
      INFO("x " << x << ", dy " << dy);
      REQUIRE(bits(Relu::backward_from_output(y, dy)) == bits(want));
      REQUIRE(bits(Relu::backward_from_output(y, dy)) == bits(Relu::backward(x, y, dy)));
    }
  REQUIRE(bits(Relu::backward_from_output(-1.f, -2.f)) == bits(0.f));  // +0, not -0
}

TEST_CASE("Element passes give the same bits on 1 and 2 threads", "[kernels]") {
  const xpipe::index_t rows = 256, cols = 1024;  // above the parallel grain
  xpipe::Rng rng{3};
  std::vector<float> z(rows * cols), bias(cols), dy(rows * cols);
  xpipe::test::fill_uniform(z, rng);
  xpipe::test::fill_uniform(bias, rng);
  xpipe::test::fill_uniform(dy, rng);
  auto run = [&](int threads) {
    const HostContext ctx{.threads = threads};
    std::vector<float> y(rows * cols), dx(rows * cols), db(cols);
    xpipe::bias_activation_forward<xpipe::math::Gelu>(ctx, ConstMatrix{z.data(), rows, cols},
                                                      bias.data(), Matrix{y.data(), rows, cols});
    xpipe::activation_backward<xpipe::math::Gelu>(
        ctx, ConstMatrix{z.data(), rows, cols}, ConstMatrix{y.data(), rows, cols},
        ConstMatrix{dy.data(), rows, cols}, Matrix{dx.data(), rows, cols});
    xpipe::bias_grad(ctx, ConstMatrix{dy.data(), rows, cols}, db.data(), false);
    y.insert(y.end(), dx.begin(), dx.end());
    y.insert(y.end(), db.begin(), db.end());
    return y;
  };
  const auto a = run(1), b = run(2);
  REQUIRE(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  // bias_grad is the column sum; check one column against a double sum.
  double col = 0;
  for (xpipe::index_t r = 0; r < rows; ++r) col += dy[r * cols + 5];
  REQUIRE(a[2 * rows * cols + 5] == Approx(col).margin(1e-4));
}

TEST_CASE("ScopedFlushDenormals flushes denormal results to zero", "[kernels]") {
  volatile float tiny = std::numeric_limits<float>::min();  // smallest normal
  {
    xpipe::ScopedFlushDenormals ftz;
    volatile float half = tiny * 0.5f;
    REQUIRE(half == 0.f);
  }
  volatile float half = tiny * 0.5f;
  REQUIRE(half > 0.f);  // restored on scope exit
}

TEST_CASE("gemm computes row-major products with transposes", "[kernels]") {
  const HostContext ctx{};
  // A 2x3, B 3x2: C = A B by hand.
  const float a[] = {1, 2, 3, 4, 5, 6};
  const float b[] = {7, 8, 9, 10, 11, 12};
  float c[4] = {};
  xpipe::gemm(ctx, xpipe::Trans::No, xpipe::Trans::No, 2, 2, 3, 1.f, a, 3, b, 2, 0.f, c, 2);
  REQUIRE(c[0] == 58.f);
  REQUIRE(c[1] == 64.f);
  REQUIRE(c[2] == 139.f);
  REQUIRE(c[3] == 154.f);
  // A^T A (3x3), element (0, 2) = 1*3 + 4*6 = 27.
  float ata[9] = {};
  xpipe::gemm(ctx, xpipe::Trans::Yes, xpipe::Trans::No, 3, 3, 2, 1.f, a, 3, a, 3, 0.f, ata, 3);
  REQUIRE(ata[2] == 27.f);
  REQUIRE_THROWS_AS(
      xpipe::gemm(ctx, xpipe::Trans::No, xpipe::Trans::No, 2, 2, 3, 1.f, a, 1, b, 2, 0.f, c, 2),
      xpipe::BackendError);
}

namespace {
// Runs a pass's quad form over n (a multiple of 4) elements of 16-byte aligned arrays and its
// per-element call over a copy of them; every array must end with the same bits.
template <int Arrays, class Make>
void quad_matches_scalar(const char* what, Make make) {
  constexpr xpipe::index_t n = 64;
  std::vector<xpipe::HostBuffer<float>> quad, scalar;
  xpipe::Rng rng{7};
  for (int a = 0; a < Arrays; ++a) {
    quad.emplace_back(n);
    scalar.emplace_back(n);
    for (xpipe::index_t i = 0; i < n; ++i) {
      const float v = rng.uniform(1e-4f, 1.f);  // positive: valid second moments too
      quad[a][i] = scalar[a][i] = v;
    }
  }
  float* qp[Arrays];
  float* sp[Arrays];
  for (int a = 0; a < Arrays; ++a) {
    qp[a] = quad[a].data();
    sp[a] = scalar[a].data();
    REQUIRE(reinterpret_cast<std::uintptr_t>(qp[a]) % 16 == 0);
  }
  const auto fq = make(qp), fs = make(sp);
  const void* listed[decltype(fq)::streams];
  fq.pointers(listed);
  for (int a = 0; a < Arrays; ++a) REQUIRE(listed[a] == qp[a]);  // every array it streams
  for (xpipe::index_t i = 0; i < n; i += 4) fq.quad(i);
  for (xpipe::index_t i = 0; i < n; ++i) fs(i);
  INFO(what);
  for (int a = 0; a < Arrays; ++a)
    REQUIRE(std::memcmp(quad[a].data(), scalar[a].data(), n * sizeof(float)) == 0);
}
}  // namespace

TEST_CASE("The quad form of every vectorised pass gives the per-element call's bits",
          "[kernels][cuda-math]") {
  namespace ops = xpipe::ops;
  namespace math = xpipe::math;
  const auto adam = math::adam_scalars(1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, true, 3);
  const auto nadam = math::nadam_scalars(1e-2f, 0.9f, 0.999f, 1e-8f, 0.f, false, 3);
  const math::SgdScalars sgd{0.1f, 0.9f, 0.f, 1e-4f, true, false};
  quad_matches_scalar<4>("adam step", [&](float* const* p) {
    return ops::AdamStep{p[0], p[1], p[2], p[3], adam};
  });
  quad_matches_scalar<4>("adam predict", [&](float* const* p) {
    return ops::AdamPredict{p[0], p[1], p[2], p[3], 3e-2f, adam};
  });
  quad_matches_scalar<3>("adam direction", [&](float* const* p) {
    return ops::AdamDirection{p[0], p[1], p[2], adam};
  });
  quad_matches_scalar<3>("sgd step", [&](float* const* p) {
    return ops::SgdStep{p[0], p[1], p[2], sgd};
  });
  quad_matches_scalar<3>("sgd predict", [&](float* const* p) {
    return ops::SgdPredict{p[0], p[1], p[2], 0.3f};
  });
  quad_matches_scalar<4>("nadam step", [&](float* const* p) {
    return ops::NadamStep{p[0], p[1], p[2], p[3], nadam};
  });
}

TEST_CASE("exp_poly and erf_poly against libm in double", "[kernels][elementary]") {
  // e^x within 2 float ulps (2^-22 relative) over its range, every 1e-3 or so.
  double worst_exp = 0;
  for (float x = -87.f; x <= 88.5f; x += 0.00097f) {
    const double want = std::exp(static_cast<double>(x));
    worst_exp = std::max(worst_exp, std::fabs(xpipe::math::exp_poly(x) - want) / want);
  }
  CHECK(worst_exp < std::ldexp(1.0, -22));
  CHECK(xpipe::math::exp_poly(0.f) == 1.f);
  // The clamp's ends: e^-87.3 and e^88.7 to the same 2 ulps, just outside them 0 and inf.
  CHECK(std::fabs(xpipe::math::exp_poly(-87.3f) / std::exp(double{-87.3f}) - 1) <
        std::ldexp(1.0, -22));
  CHECK(std::fabs(xpipe::math::exp_poly(88.7f) / std::exp(double{88.7f}) - 1) <
        std::ldexp(1.0, -22));
  CHECK(xpipe::math::exp_poly(-87.31f) == 0.f);
  CHECK(xpipe::math::exp_poly(88.71f) == std::numeric_limits<float>::infinity());
  CHECK(xpipe::math::exp_poly(-100.f) == 0.f);
  CHECK(xpipe::math::exp_poly(100.f) == std::numeric_limits<float>::infinity());
  CHECK(xpipe::math::exp_poly(-std::numeric_limits<float>::infinity()) == 0.f);
  CHECK(std::isnan(xpipe::math::exp_poly(std::nanf(""))));
  // erf within 4e-7 absolute, odd, 1 from 4 on.
  double worst_erf = 0;
  for (float z = -6.f; z <= 6.f; z += 0.00013f)
    worst_erf =
        std::max(worst_erf, std::fabs(xpipe::math::erf_poly(z) - std::erf(static_cast<double>(z))));
  CHECK(worst_erf < 4e-7);
  CHECK(xpipe::math::erf_poly(0.f) == 0.f);
  CHECK(xpipe::math::erf_poly(7.f) == 1.f);
  CHECK(xpipe::math::erf_poly(-std::numeric_limits<float>::infinity()) == -1.f);
  CHECK(std::isnan(xpipe::math::erf_poly(std::nanf(""))));
}
