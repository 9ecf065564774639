// Layer normalisation over each row of a matrix (LayerNorm): the per-row statistics, the
// normalisation, its backward and the per-column parameter gradients as shared per-row,
// per-column and per-element functions, their function objects and launchers (one code path for
// the host loop and a CUDA kernel).
#pragma once

#include <cmath>

#include "xpipe/backend/backend.hpp"
#include "xpipe/core/config.hpp"
#include "xpipe/core/tensor.hpp"
#include "xpipe/kernels/batchnorm.hpp"  // math::normalize, math::normalize_input_grad

namespace xpipe {

namespace math {

//! Mean and biased variance of the n floats at x, summed in double in index order (two passes:
//! the variance from the deviations, not E[x^2] - E[x]^2, which cancels for rows far from 0).
//! Usage: `double mean, var; math::row_moments(x.row(r), x.cols, mean, var);`
XPIPE_HOST_DEVICE void row_moments(const float* x, index_t n, double& mean, double& var) {
  double s = 0;
  for (index_t i = 0; i < n; ++i) s += x[i];
  mean = s / static_cast<double>(n);
  double q = 0;
  for (index_t i = 0; i < n; ++i) {
    const double d = x[i] - mean;
    q += d * d;
  }
  var = q / static_cast<double>(n);
}

}  // namespace math

namespace ops {

// Every per-row buffer below holds two floats per row, side by side (row r at 2 r, 2 r + 1): its
// layout then does not depend on how many rows a micro-batch has, only on its capacity.

//! Per row r: its mean and 1 / sqrt(var + eps) into stats[2 r], stats[2 r + 1].
struct LayerNormStatistics {
  ConstMatrix x;
  float eps;
  float* stats;
  XPIPE_HOST_DEVICE void operator()(index_t r) const {
    double mean = 0, var = 0;
    math::row_moments(x.row(r), x.cols, mean, var);
    stats[2 * r] = static_cast<float>(mean);
    // eps joins the variance in double, as PyTorch adds it before the square root.
    stats[2 * r + 1] = static_cast<float>(1.0 / sqrt(var + eps));
  }
};

//! y(r, i) = gamma[i] (x - mean[r]) invstd[r] + beta[i]: the statistics are the row's, the
//! affine parameters the column's.
struct LayerNormForward {
  ConstMatrix x;
  Matrix y;
  const float* gamma;
  const float* beta;
  const float* stats;
  XPIPE_HOST_DEVICE void operator()(index_t r, index_t i) const {
    y(r, i) = math::normalize(x(r, i), stats[2 * r], stats[2 * r + 1], gamma[i], beta[i]);
  }
};

//! Per row r: sum(g) and sum(g xhat) with g = dy gamma (the gradient reaching xhat) into
//! sums[2 r], sums[2 r + 1]; summed in double in column order.
struct LayerNormRowSums {
  ConstMatrix x, dy;
  const float* gamma;
  const float* stats;
  float* sums;
  XPIPE_HOST_DEVICE void operator()(index_t r) const {
    const float mean = stats[2 * r], invstd = stats[2 * r + 1];
    double s = 0, sx = 0;
    for (index_t i = 0; i < x.cols; ++i) {
      // The gradient of y with respect to xhat is gamma, per column.
      const float g = dy(r, i) * gamma[i];
      s += g;
      sx += static_cast<double>(g) * ((x(r, i) - mean) * invstd);
    }
    sums[2 * r] = static_cast<float>(s);
    sums[2 * r + 1] = static_cast<float>(sx);
  }
};

//! dx(r, i) = invstd / W (W g - sum(g) - xhat sum(g xhat)), g = dy gamma: BatchNorm's input
//! gradient with the row for the channel and g for dy (so gamma 1 there: it is inside g).
struct LayerNormInputGrad {
  ConstMatrix x, dy;
  Matrix dx;
  const float* gamma;
  const float* stats;
  const float* sums;
  float width;
  XPIPE_HOST_DEVICE void operator()(index_t r, index_t i) const {
    dx(r, i) =
        math::normalize_input_grad(x(r, i), dy(r, i) * gamma[i], stats[2 * r], stats[2 * r + 1],
                                   1.f, sums[2 * r], sums[2 * r + 1], width);
  }
};

//! Per column c: dgamma[c] (+)= sum over rows of dy xhat, dbeta[c] (+)= sum over rows of dy;
//! summed in double in row order, so the bits do not depend on threads or backend.
struct LayerNormParamGrads {
  ConstMatrix x, dy;
  const float* stats;
  float* dgamma;
  float* dbeta;
  bool accumulate;
  XPIPE_HOST_DEVICE void operator()(index_t c) const {
    double s = 0, sx = 0;
    for (index_t r = 0; r < x.rows; ++r) {
      const float d = dy(r, c);
      s += d;
      // xhat recomputed from the row's statistics, as the forward made it.
      sx += static_cast<double>(d) * ((x(r, c) - stats[2 * r]) * stats[2 * r + 1]);
    }
    // The sums join the buffer once, in float: accumulating adds to the earlier micro-batches'.
    dgamma[c] = (accumulate ? dgamma[c] : 0.f) + static_cast<float>(sx);
    dbeta[c] = (accumulate ? dbeta[c] : 0.f) + static_cast<float>(s);
  }
};

}  // namespace ops

//! Each row's mean and 1/std into stats (2 floats a row: mean, invstd). One row per index: the
//! reduction order is fixed. Usage: `layer_norm_statistics(ctx, x, 1e-5f, stats);`
template <class Ctx>
void layer_norm_statistics(const Ctx& ctx, ConstMatrix x, float eps, float* stats) {
  for_each_index(ctx, x.rows, x.rows * x.cols, ops::LayerNormStatistics{x, eps, stats});
}

//! y = gamma xhat + beta with the rows' statistics.
//! Usage: `layer_norm_forward(ctx, x, y, gamma, beta, stats);`
template <class Ctx>
void layer_norm_forward(const Ctx& ctx, ConstMatrix x, Matrix y, const float* gamma,
                        const float* beta, const float* stats) {
  for_each_element(ctx, x.rows, x.cols, ops::LayerNormForward{x, y, gamma, beta, stats});
}

//! The weight part of a split backward (and the first step of the whole one): dgamma (+)=
//! sum over rows of dy xhat, dbeta (+)= sum over rows of dy, per column.
//! Usage: `layer_norm_param_grads(ctx, x, dy, stats, dgamma, dbeta, false);`
template <class Ctx>
void layer_norm_param_grads(const Ctx& ctx, ConstMatrix x, ConstMatrix dy, const float* stats,
                            float* dgamma, float* dbeta, bool accumulate) {
  for_each_index(ctx, x.cols, x.rows * x.cols,
                 ops::LayerNormParamGrads{x, dy, stats, dgamma, dbeta, accumulate});
}

//! The input part of a split backward: the rows' sums into `sums` (2 floats a row) and dx;
//! nothing when dx is empty (the row sums serve only the input gradient). No parameter gradient.
//! Usage: `layer_norm_backward_input(ctx, x, dy, dx, gamma, stats, sums);`
template <class Ctx>
void layer_norm_backward_input(const Ctx& ctx, ConstMatrix x, ConstMatrix dy, Matrix dx,
                               const float* gamma, const float* stats, float* sums) {
  if (dx.empty()) return;
  for_each_index(ctx, x.rows, x.rows * x.cols, ops::LayerNormRowSums{x, dy, gamma, stats, sums});
  const float width = static_cast<float>(x.cols);
  for_each_element(ctx, x.rows, x.cols,
                   ops::LayerNormInputGrad{x, dy, dx, gamma, stats, sums, width});
}

//! The backward: dgamma and dbeta (+)= their column sums; then, unless dx is empty, the rows'
//! sums into `sums` (2 floats a row) and dx. Usage:
//! `layer_norm_backward(ctx, x, dy, dx, gamma, stats, sums, dgamma, dbeta, false);`
template <class Ctx>
void layer_norm_backward(const Ctx& ctx, ConstMatrix x, ConstMatrix dy, Matrix dx,
                         const float* gamma, const float* stats, float* sums, float* dgamma,
                         float* dbeta, bool accumulate) {
  layer_norm_param_grads(ctx, x, dy, stats, dgamma, dbeta, accumulate);
  layer_norm_backward_input(ctx, x, dy, dx, gamma, stats, sums);
}

}  // namespace xpipe
