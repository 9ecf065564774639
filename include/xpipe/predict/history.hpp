// Weight prediction from the weight history: fit a polynomial in time to each weight's last few
// versions (least squares) and read it s steps ahead. No optimizer state is consulted.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "xpipe/predict/predictor.hpp"

namespace xpipe {

//! Coefficients c of the least-squares polynomial of degree `degree` through the points
//! (x, y_x), x = 0..n-1, read at x = n - 1 + s: the fit's value there is sum c[x] y_x. Degree is
//! lowered to n - 1 when n points cannot carry it (n = 1: c = {1}). At most 4 points, degree 2.
//! Usage: `auto c = history_fit_coefficients(3, 1, 2.0);` (a line through 3 versions, 2 ahead).
inline std::array<double, 4> history_fit_coefficients(int n, int degree, double s) {
  std::array<double, 4> c{};
  const int d = std::min(degree, n - 1), p = d + 1;  // p unknowns: 1, x, x^2
  auto phi = [&](double x, int j) { return std::pow(x, j); };
  // Normal equations A a = b for a basis-free read-out: solve A z = phi(x*), then c_x = phi(x)·z.
  double A[3][4] = {};
  for (int i = 0; i < p; ++i) {
    for (int j = 0; j < p; ++j)
      for (int x = 0; x < n; ++x) A[i][j] += phi(x, i) * phi(x, j);
    A[i][p] = phi(n - 1 + s, i);
  }
  for (int col = 0; col < p; ++col) {  // Gauss-Jordan; A is symmetric positive definite
    const double pivot = A[col][col];
    for (int j = col; j <= p; ++j) A[col][j] /= pivot;
    for (int i = 0; i < p; ++i) {
      if (i == col) continue;
      const double f = A[i][col];
      for (int j = col; j <= p; ++j) A[i][j] -= f * A[col][j];
    }
  }
  for (int x = 0; x < n; ++x)
    for (int i = 0; i < p; ++i) c[static_cast<std::size_t>(x)] += phi(x, i) * A[i][p];
  return c;
}

namespace detail {
//! The state of the history fits: each forward and backward reads the stage's weights
//! predicted over its apply-time s by a least-squares polynomial of degree `degree` (1 or 2)
//! fitted, weight by weight, to the last degree + 2 versions (the live one included; fewer, and
//! a lower degree, early in a train() call). One fused pass sums the versions with the fit's
//! coefficients. Holds degree + 3 buffers: the live weights, degree + 1 older versions and one
//! scratch.
template <class O, class B>
class HistoryFitState : public PredictorHooks {
 public:
  HistoryFitState(const PredictorSetup& setup, int degree)
      : setup_(setup), degree_(degree), window_(degree + 2), scratch_(setup.params) {
    for (int i = 0; i < window_ - 1; ++i) older_.emplace_back(setup.params);
  }

  template <class Ctx>
  const float* forward_weights(const Ctx& ctx, OptimizerState<O, B>& opt, int g) {
    return at(ctx, opt, setup_.analysis->forward(setup_.stage, g).apply_time);
  }
  template <class Ctx>
  const float* backward_weights(const Ctx& ctx, OptimizerState<O, B>& opt, int g) {
    return at(ctx, opt, setup_.analysis->backward(setup_.stage, g).apply_time);
  }
  //! The live version is about to turn old: it replaces the oldest one kept.
  template <class Ctx>
  void before_step(const Ctx& ctx, OptimizerState<O, B>& opt) {
    copy_buffer(ctx, opt.weights(), older_[static_cast<std::size_t>(next_)].data(), setup_.params);
    next_ = (next_ + 1) % (window_ - 1);
    held_ = std::min(held_ + 1, window_ - 1);
  }
  int weight_copies() const { return window_ + 1; }

 private:
  template <class Ctx>
  const float* at(const Ctx& ctx, OptimizerState<O, B>& opt, int s) {
    const int n = held_ + 1;  // versions known, oldest first, the live one last
    if (s == 0 || n == 1) return opt.weights();
    const std::array<double, 4> coef = history_fit_coefficients(n, degree_, s);
    const float* x[4]{};
    float c[4]{};
    for (int i = 0; i < n - 1; ++i) {  // older versions, oldest first
      const int slot = (next_ - held_ + i + 2 * (window_ - 1)) % (window_ - 1);
      x[i] = older_[static_cast<std::size_t>(slot)].data();
      c[i] = static_cast<float>(coef[static_cast<std::size_t>(i)]);
    }
    x[n - 1] = opt.weights();
    c[n - 1] = static_cast<float>(coef[static_cast<std::size_t>(n - 1)]);
    combine(ctx, x, c, n, scratch_.data(), setup_.params);
    return scratch_.data();
  }

  PredictorSetup setup_;
  int degree_, window_;  // window: versions fitted, the live one included
  std::vector<typename B::template Buffer<float>> older_;  // ring of older versions
  typename B::template Buffer<float> scratch_;
  int next_ = 0, held_ = 0;
};
}  // namespace detail

namespace detail {
//! The history fit of degree Degree (1 or 2) as a predictor.
template <int Degree>
struct BasicHistoryFit {
  static_assert(Degree == 1 || Degree == 2, "xpipe: HistoryFit: degree 1 or 2");
  static constexpr const char* name = Degree == 1 ? "fit-linear" : "fit-quadratic";
  static constexpr StalenessTarget target = StalenessTarget::ApplyTime;
  template <class O, class B>
  struct State : HistoryFitState<O, B> {
    explicit State(const PredictorSetup& setup) : HistoryFitState<O, B>(setup, Degree) {}
  };
};
}  // namespace detail

//! A line fitted to the last 3 versions of each weight, read s steps ahead.
using FitLinear = detail::BasicHistoryFit<1>;
//! A parabola fitted to the last 4 versions of each weight, read s steps ahead.
using FitQuadratic = detail::BasicHistoryFit<2>;

static_assert(Predictor<FitLinear>);
static_assert(Predictor<FitQuadratic>);

}  // namespace xpipe
