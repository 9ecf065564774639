// Batch normalisation over the channels of NCHW rows (BatchNorm2d): the per-channel statistics,
// the normalisation and its backward as shared per-channel and per-element functions, their
// function objects and launchers (one code path for the host loop and a CUDA kernel).
#pragma once

#include <cmath>

#include "xpipe/backend/backend.hpp"
#include "xpipe/core/config.hpp"
#include "xpipe/core/tensor.hpp"

namespace xpipe {

//! The layout of a batch-normalised activation: `channels` planes of `plane` = H W floats per
//! row, `rows` rows; eps is added to the variance; momentum weights a new statistic into the
//! running one (PyTorch's convention: running = (1 - momentum) running + momentum new).
struct NormGeometry {
  index_t rows = 0;
  int channels = 0;
  int plane = 0;
  float eps = 1e-5f;
  float momentum = 0.1f;
};

namespace math {

//! Lanes of a channel reduction: pixel i of a plane adds into partial sum i % lanes, and the
//! partial sums are added in lane order at the end. A fixed order (the same bits on every
//! backend and thread count) that is not one chain of dependent additions: the host compiler
//! vectorises the lanes, where a single double accumulator ran at one add per 4 cycles and made
//! BatchNorm slower than the convolution before it.
inline constexpr int reduce_lanes = 8;

//! sum over rows r and pixels i of f(r, at + i), summed in lanes (reduce_lanes) in double.
template <class F>
XPIPE_HOST_DEVICE double channel_sum(const NormGeometry& g, index_t at, const F& f) {
  double lane[reduce_lanes] = {};
  const int whole = g.plane / reduce_lanes * reduce_lanes;
  for (index_t r = 0; r < g.rows; ++r) {
    for (int i = 0; i < whole; i += reduce_lanes)
      for (int j = 0; j < reduce_lanes; ++j) lane[j] += f(r, at + i + j);
    for (int i = whole; i < g.plane; ++i) lane[i - whole] += f(r, at + i);
  }
  double s = 0;
  for (int j = 0; j < reduce_lanes; ++j) s += lane[j];
  return s;
}

//! Mean and biased variance of channel c over every row and pixel (two passes: the variance
//! from the deviations, not E[x^2] - E[x]^2).
XPIPE_HOST_DEVICE void channel_moments(ConstMatrix x, const NormGeometry& g, int c, double& mean,
                                       double& var) {
  const double n = static_cast<double>(g.rows) * g.plane;
  const index_t at = static_cast<index_t>(c) * g.plane;
  mean = channel_sum(g, at, [x](index_t r, index_t i) { return static_cast<double>(x(r, i)); }) / n;
  const double m = mean;
  var = channel_sum(g, at,
                    [x, m](index_t r, index_t i) {
                      const double d = x(r, i) - m;
                      return d * d;
                    }) /
        n;
}

//! y = gamma (x - mean) invstd + beta.
XPIPE_HOST_DEVICE float normalize(float x, float mean, float invstd, float gamma, float beta) {
  return gamma * ((x - mean) * invstd) + beta;
}

//! The input gradient of one element, from its channel's sums of dy and of dy xhat:
//! dx = gamma invstd / n (n dy - sum(dy) - xhat sum(dy xhat)), xhat = (x - mean) invstd.
XPIPE_HOST_DEVICE float normalize_input_grad(float x, float dy, float mean, float invstd,
                                             float gamma, float sum_dy, float sum_dy_xhat,
                                             float n) {
  const float xhat = (x - mean) * invstd;
  return gamma * invstd / n * (n * dy - sum_dy - xhat * sum_dy_xhat);
}

}  // namespace math

namespace ops {

//! Per channel c: the micro-batch's mean and 1 / sqrt(var + eps) into stats[c], stats[C + c];
//! when `running` is set and both are finite, the running mean and unbiased variance updated by
//! momentum.
struct BatchNormStatistics {
  ConstMatrix x;
  NormGeometry g;
  float* stats;
  float* running;
  XPIPE_HOST_DEVICE void operator()(index_t c) const {
    double mean = 0, var = 0;
    math::channel_moments(x, g, static_cast<int>(c), mean, var);
    stats[c] = static_cast<float>(mean);
    stats[g.channels + c] = static_cast<float>(1.0 / sqrt(var + g.eps));
    if (running == nullptr) return;
    const double n = static_cast<double>(g.rows) * g.plane;
    const float m = static_cast<float>(mean),
                u = static_cast<float>(n > 1 ? var * n / (n - 1) : var);
    // Statistics that are not finite as stored (NaN, an infinity, past FLT_MAX) leave the running
    // ones as they were (the host layer then names the row; a device run stops at the loss).
    // x - x is 0 exactly when x is finite, on the host and the device alike.
    if (m - m == 0.f && u - u == 0.f) {
      running[c] = (1.f - g.momentum) * running[c] + g.momentum * m;
      running[g.channels + c] = (1.f - g.momentum) * running[g.channels + c] + g.momentum * u;
    }
  }
};

//! The eval statistics from the running ones: mean as is, invstd = 1 / sqrt(var + eps).
struct BatchNormRunningStatistics {
  const float* running;
  NormGeometry g;
  float* stats;
  XPIPE_HOST_DEVICE void operator()(index_t c) const {
    stats[c] = running[c];
    stats[g.channels + c] = 1.f / sqrtf(running[g.channels + c] + g.eps);
  }
};

// The element passes below take one (row, channel) plane per call and walk its pixels: a
// division per element to find its channel cost more than the normalisation itself (0.7 ms
// against 0.1 for a 32 x 16 x 28 x 28 batch on the host).

//! Plane (r, c): y = gamma[c] (x - mean[c]) invstd[c] + beta[c] over its pixels.
struct BatchNormForward {
  ConstMatrix x;
  Matrix y;
  const float* gamma;
  const float* beta;
  const float* stats;
  int channels, plane;
  XPIPE_HOST_DEVICE void operator()(index_t r, index_t c) const {
    const float mean = stats[c], invstd = stats[channels + c], ga = gamma[c], be = beta[c];
    const float* in = x.row(r) + c * plane;
    float* out = y.row(r) + c * plane;
    for (int i = 0; i < plane; ++i) out[i] = math::normalize(in[i], mean, invstd, ga, be);
  }
};

//! Per channel c: dgamma (+)= sums[C + c], dbeta (+)= sums[c], the channel sums of dy xhat and
//! of dy that BatchNormBackwardSums leaves: the weight part of a split backward, and the last
//! step of the whole one.
struct BatchNormParamGrads {
  const float* sums;
  int channels;
  float* dgamma;
  float* dbeta;
  bool accumulate;
  XPIPE_HOST_DEVICE void operator()(index_t c) const {
    // The sums join the buffer in float: accumulating adds to the earlier micro-batches'.
    dgamma[c] = (accumulate ? dgamma[c] : 0.f) + sums[channels + c];
    dbeta[c] = (accumulate ? dbeta[c] : 0.f) + sums[c];
  }
};

//! Per channel c: sum(dy) and sum(dy xhat) into sums[c], sums[C + c], and dgamma (+)=
//! sum(dy xhat), dbeta (+)= sum(dy) unless dgamma is null (a split backward's input part, whose
//! weight part is BatchNormParamGrads); summed in double in row, then pixel order.
struct BatchNormBackwardSums {
  ConstMatrix x, dy;
  NormGeometry g;
  const float* stats;
  float* sums;
  float* dgamma;
  float* dbeta;
  bool accumulate;
  XPIPE_HOST_DEVICE void operator()(index_t c) const {
    const float mean = stats[c], invstd = stats[g.channels + c];
    const index_t at = c * g.plane;
    const ConstMatrix xs = x, ds = dy;
    const double s = math::channel_sum(
        g, at, [ds](index_t r, index_t i) { return static_cast<double>(ds(r, i)); });
    const double sx = math::channel_sum(g, at, [xs, ds, mean, invstd](index_t r, index_t i) {
      return static_cast<double>(ds(r, i)) * ((xs(r, i) - mean) * invstd);
    });
    sums[c] = static_cast<float>(s);
    sums[g.channels + c] = static_cast<float>(sx);
    if (dgamma != nullptr) BatchNormParamGrads{sums, g.channels, dgamma, dbeta, accumulate}(c);
  }
};

//! Plane (r, c): dx from the channel sums (math::normalize_input_grad) over its pixels.
struct BatchNormBackwardInput {
  ConstMatrix x, dy;
  Matrix dx;
  const float* gamma;
  const float* stats;
  const float* sums;
  int channels, plane;
  float n;
  XPIPE_HOST_DEVICE void operator()(index_t r, index_t c) const {
    const float mean = stats[c], invstd = stats[channels + c], ga = gamma[c];
    const float s = sums[c], sx = sums[channels + c];
    const float* in = x.row(r) + c * plane;
    const float* d = dy.row(r) + c * plane;
    float* out = dx.row(r) + c * plane;
    for (int i = 0; i < plane; ++i)
      out[i] = math::normalize_input_grad(in[i], d[i], mean, invstd, ga, s, sx, n);
  }
};

}  // namespace ops

//! Training statistics of x (mean, invstd into stats: 2 C floats), updating `running` (mean,
//! variance: 2 C floats) unless it is null. One channel per index: the reduction order is fixed.
template <class Ctx>
void batch_norm_statistics(const Ctx& ctx, const NormGeometry& g, ConstMatrix x, float* stats,
                           float* running) {
  for_each_index(ctx, g.channels, x.rows * x.cols, ops::BatchNormStatistics{x, g, stats, running});
}

//! Evaluation statistics from the running ones (stats: mean, invstd).
template <class Ctx>
void batch_norm_running_statistics(const Ctx& ctx, const NormGeometry& g, const float* running,
                                   float* stats) {
  for_each_index(ctx, g.channels, ops::BatchNormRunningStatistics{running, g, stats});
}

//! y = gamma xhat + beta with the given statistics.
template <class Ctx>
void batch_norm_forward(const Ctx& ctx, const NormGeometry& g, ConstMatrix x, Matrix y,
                        const float* gamma, const float* beta, const float* stats) {
  for_each_element(ctx, x.rows, g.channels,
                   ops::BatchNormForward{x, y, gamma, beta, stats, g.channels, g.plane});
}

//! dx through the batch's statistics from the channel sums of dy and dy xhat (`sums`, as
//! BatchNormBackwardSums leaves them). Usage: `batch_norm_input_grad(ctx, g, x, dy, dx, ...);`
template <class Ctx>
void batch_norm_input_grad(const Ctx& ctx, const NormGeometry& g, ConstMatrix x, ConstMatrix dy,
                           Matrix dx, const float* gamma, const float* stats, const float* sums) {
  const float n = static_cast<float>(g.rows) * static_cast<float>(g.plane);
  for_each_element(
      ctx, x.rows, g.channels,
      ops::BatchNormBackwardInput{x, dy, dx, gamma, stats, sums, g.channels, g.plane, n});
}

//! The backward: channel sums into `sums` (2 C floats), dgamma and dbeta (+)=, then dx unless
//! dx is empty.
template <class Ctx>
void batch_norm_backward(const Ctx& ctx, const NormGeometry& g, ConstMatrix x, ConstMatrix dy,
                         Matrix dx, const float* gamma, const float* stats, float* sums,
                         float* dgamma, float* dbeta, bool accumulate) {
  for_each_index(ctx, g.channels, x.rows * x.cols,
                 ops::BatchNormBackwardSums{x, dy, g, stats, sums, dgamma, dbeta, accumulate});
  if (!dx.empty()) batch_norm_input_grad(ctx, g, x, dy, dx, gamma, stats, sums);
}

//! The input part of a split backward: the channel sums of dy and dy xhat into `sums` (2 C
//! floats, which the weight part reads), then dx unless dx is empty. No parameter gradient.
//! Usage: `batch_norm_backward_input(ctx, g, x, dy, dx, gamma, stats, sums);`
template <class Ctx>
void batch_norm_backward_input(const Ctx& ctx, const NormGeometry& g, ConstMatrix x, ConstMatrix dy,
                               Matrix dx, const float* gamma, const float* stats, float* sums) {
  for_each_index(ctx, g.channels, x.rows * x.cols,
                 ops::BatchNormBackwardSums{x, dy, g, stats, sums, nullptr, nullptr, false});
  if (!dx.empty()) batch_norm_input_grad(ctx, g, x, dy, dx, gamma, stats, sums);
}

//! The weight part: dgamma (+)= sum(dy xhat), dbeta (+)= sum(dy) from the `sums` the input part
//! left. Usage: `batch_norm_param_grads(ctx, g, sums, dgamma, dbeta, false);`
template <class Ctx>
void batch_norm_param_grads(const Ctx& ctx, const NormGeometry& g, const float* sums, float* dgamma,
                            float* dbeta, bool accumulate) {
  for_each_index(ctx, g.channels,
                 ops::BatchNormParamGrads{sums, g.channels, dgamma, dbeta, accumulate});
}

}  // namespace xpipe
