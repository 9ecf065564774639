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

//! Lanes of a sum: term t of a run adds into partial sum t % lanes, and the partial sums are
//! added in lane order at the end. A fixed order (the same bits for any thread count) that is
//! not one chain of dependent additions: the host compiler vectorises the lanes,
//! where a single double accumulator ran at one add per 4 cycles and made BatchNorm slower than
//! the convolution before it.
inline constexpr int reduce_lanes = 8;

//! Terms one partial sum of a channel reduction covers, at every level (channel_sum_levels).
inline constexpr index_t reduce_chunk = 128;

//! f(0) + f(1) + ... + f(n - 1) in reduce_lanes lanes, in double.
template <class F>
XPIPE_HOST_DEVICE double lane_sum(index_t n, const F& f) {
  double lane[reduce_lanes] = {};
  const index_t whole = n / reduce_lanes * reduce_lanes;
  for (index_t t = 0; t < whole; t += reduce_lanes)
    for (int j = 0; j < reduce_lanes; ++j) lane[j] += f(t + j);
  for (index_t t = whole; t < n; ++t) lane[t - whole] += f(t);
  double s = 0;
  for (int j = 0; j < reduce_lanes; ++j) s += lane[j];
  return s;
}

//! Two lane_sum's in one loop over the terms: f's into sf and g's into sg, each with the bits
//! lane_sum gives it alone (the same lanes, the same order), reading the terms' inputs once.
template <class F, class G>
XPIPE_HOST_DEVICE void lane_sums(index_t n, const F& f, const G& g, double& sf, double& sg) {
  double lf[reduce_lanes] = {}, lg[reduce_lanes] = {};
  const index_t whole = n / reduce_lanes * reduce_lanes;
  for (index_t t = 0; t < whole; t += reduce_lanes)
    for (int j = 0; j < reduce_lanes; ++j) {
      lf[j] += f(t + j);
      lg[j] += g(t + j);
    }
  for (index_t t = whole; t < n; ++t) {
    lf[t - whole] += f(t);
    lg[t - whole] += g(t);
  }
  sf = 0;
  sg = 0;
  for (int j = 0; j < reduce_lanes; ++j) {
    sf += lf[j];
    sg += lg[j];
  }
}

//! How a channel's terms, `rows` planes of `plane`, are summed: each plane in chunks of
//! reduce_chunk (the last one shorter), each chunk in lanes (level 1: rows ceil(plane /
//! reduce_chunk) partial sums per channel, in row then chunk order), then those partial sums in
//! chunks again, and so on until one is left. Many short independent sums at each level: what a
//! GPU runs in parallel (one thread per channel and chunk) and a CPU vectorises; one fixed order
//! for a shape on every backend (the bits still differ where a compiler fuses a multiply and an
//! add that the other does not).
//! chunks_of(n): ceil(n / reduce_chunk), the chunks of n terms (or partial sums).
XPIPE_HOST_DEVICE constexpr index_t chunks_of(index_t n) {
  return (n + reduce_chunk - 1) / reduce_chunk;
}
//! The terms of the chunk that starts at term `first` of a run of n: reduce_chunk, or the rest.
XPIPE_HOST_DEVICE constexpr index_t chunk_count(index_t n, index_t first) {
  return n - first < reduce_chunk ? n - first : reduce_chunk;
}
//! channel_sum_partials(rows, plane, level): the partial sums per channel after `level` levels.
XPIPE_HOST_DEVICE constexpr index_t channel_sum_partials(index_t rows, index_t plane, int level) {
  if (level == 0) return rows * plane;
  index_t n = rows * chunks_of(plane);
  for (int l = 1; l < level; ++l) n = chunks_of(n);
  return n;
}
//! The levels that bring a channel's terms to one sum (0 when it has one term).
XPIPE_HOST_DEVICE constexpr int channel_sum_levels(index_t rows, index_t plane) {
  int levels = 0;
  while (channel_sum_partials(rows, plane, levels) > 1) ++levels;
  return levels;
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

// The terms of the channel reductions. Each says at(c): the function of (row, column) that
// gives channel c's term there as a double, with what it needs of c loaded once.

//! x itself: the channel sums of x (the mean).
struct ValueTerm {
  ConstMatrix x;
  XPIPE_HOST_DEVICE ValueTerm at(index_t /*c*/) const { return *this; }
  XPIPE_HOST_DEVICE double operator()(index_t r, index_t col) const { return x(r, col); }
};

//! (x - mean)^2, mean = sums[c] / n in double: the channel sums of the squared deviations (the
//! biased variance times n).
struct SquaredDeviationTerm {
  ConstMatrix x;
  const double* sums;
  double n, mean = 0;
  XPIPE_HOST_DEVICE SquaredDeviationTerm at(index_t c) const { return {x, sums, n, sums[c] / n}; }
  XPIPE_HOST_DEVICE double operator()(index_t r, index_t col) const {
    const double d = x(r, col) - mean;
    return d * d;
  }
};

//! dy xhat, xhat = (x - mean) invstd in float with the batch's statistics (stats: mean, invstd):
//! the channel sums that are dgamma.
struct GradientXhatTerm {
  ConstMatrix x, dy;
  const float* stats;
  int channels;
  float mean = 0, invstd = 0;
  XPIPE_HOST_DEVICE GradientXhatTerm at(index_t c) const {
    return {x, dy, stats, channels, stats[c], stats[channels + c]};
  }
  XPIPE_HOST_DEVICE double operator()(index_t r, index_t col) const {
    return static_cast<double>(dy(r, col)) * ((x(r, col) - mean) * invstd);
  }
};

//! Level 1 of a channel reduction (math::channel_sum_levels), index i = c partials + s: partial
//! sum s of channel c, chunk j of row r's plane (s = r chunks + j), its terms in lanes, into
//! out[i]. Term k of row r's plane of channel c lies at row r, column c plane + k.
template <class Term>
struct ChannelChunkSums {
  NormGeometry g;
  Term term;
  index_t chunks;    // per plane: math::chunks_of(plane)
  index_t partials;  // per channel: rows chunks
  double* out;
  XPIPE_HOST_DEVICE void operator()(index_t i) const {
    const index_t c = i / partials, s = i - c * partials, r = s / chunks,
                  first = (s - r * chunks) * math::reduce_chunk;
    const auto f = term.at(c);
    const index_t col = c * g.plane + first;
    out[i] =
        math::lane_sum(math::chunk_count(g.plane, first), [&](index_t t) { return f(r, col + t); });
  }
};

//! Level 1 of two channel reductions at once (the backward's sums of dy and of dy xhat): what
//! ChannelChunkSums<A> and ChannelChunkSums<B> give, into out_a[i] and out_b[i], in one pass.
template <class A, class B>
struct ChannelChunkSumPairs {
  NormGeometry g;
  A a;
  B b;
  index_t chunks, partials;
  double* out_a;
  double* out_b;
  XPIPE_HOST_DEVICE void operator()(index_t i) const {
    const index_t c = i / partials, s = i - c * partials, r = s / chunks,
                  first = (s - r * chunks) * math::reduce_chunk;
    const auto fa = a.at(c);
    const auto fb = b.at(c);
    const index_t col = c * g.plane + first;
    math::lane_sums(
        math::chunk_count(g.plane, first), [&](index_t t) { return fa(r, col + t); },
        [&](index_t t) { return fb(r, col + t); }, out_a[i], out_b[i]);
  }
};

//! A later level: partial sum s of channel c over the previous level's `in_partials` per channel,
//! reduce_chunk of them at a time, in lanes.
struct PartialChunkSums {
  const double* in;
  index_t in_partials, partials;
  double* out;
  XPIPE_HOST_DEVICE void operator()(index_t c, index_t s) const {
    const index_t first = s * math::reduce_chunk;
    const double* p = in + c * in_partials + first;
    out[c * partials + s] =
        math::lane_sum(math::chunk_count(in_partials, first), [p](index_t t) { return p[t]; });
  }
};

//! Per channel c: the micro-batch's mean and 1 / sqrt(var + eps) into stats[c], stats[C + c],
//! from the channel sums of x and of (x - mean)^2 (moments: C each); when `running` is set and
//! both are finite, the running mean and unbiased variance updated by momentum.
struct BatchNormStatistics {
  const double* moments;
  NormGeometry g;
  float* stats;
  float* running;
  XPIPE_HOST_DEVICE void operator()(index_t c) const {
    const double n = static_cast<double>(g.rows) * g.plane;
    const double mean = moments[c] / n, var = moments[g.channels + c] / n;
    stats[c] = static_cast<float>(mean);
    stats[g.channels + c] = static_cast<float>(1.0 / sqrt(var + g.eps));
    if (running == nullptr) return;
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

// The element passes below run over (plane, pixel) pairs: plane rc = r C + c of the rows, pixel i
// of it. Each plane's channel comes from one division, outside the pixel loop on the host (a
// division per element cost more than the normalisation itself: 0.7 ms against 0.1 for a 32 x
// 16 x 28 x 28 batch), and on a GPU consecutive threads take consecutive pixels, so their loads
// coalesce.

//! Element (rc, i): y = gamma[c] (x - mean[c]) invstd[c] + beta[c].
struct BatchNormForward {
  ConstMatrix x;
  Matrix y;
  const float* gamma;
  const float* beta;
  const float* stats;
  int channels, plane;
  XPIPE_HOST_DEVICE void operator()(index_t rc, index_t i) const {
    const index_t r = rc / channels, c = rc - r * channels, col = c * plane + i;
    y(r, col) = math::normalize(x(r, col), stats[c], stats[channels + c], gamma[c], beta[c]);
  }
};

//! Per channel c: dgamma (+)= sums[C + c], dbeta (+)= sums[c], the channel sums of dy xhat and
//! of dy that the backward's sums leave: the weight part of a split backward, and the last step
//! of the whole one.
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

//! Per channel c: sum(dy) and sum(dy xhat) (the reductions' doubles, C each) into sums[c],
//! sums[C + c] as floats, and dgamma (+)= sum(dy xhat), dbeta (+)= sum(dy) unless dgamma is null
//! (a split backward's input part, whose weight part is BatchNormParamGrads).
struct BatchNormBackwardSums {
  const double* reduced;
  int channels;
  float* sums;
  float* dgamma;
  float* dbeta;
  bool accumulate;
  XPIPE_HOST_DEVICE void operator()(index_t c) const {
    sums[c] = static_cast<float>(reduced[c]);
    sums[channels + c] = static_cast<float>(reduced[channels + c]);
    if (dgamma != nullptr) BatchNormParamGrads{sums, channels, dgamma, dbeta, accumulate}(c);
  }
};

//! Element (rc, i): dx from the channel sums (math::normalize_input_grad).
struct BatchNormBackwardInput {
  ConstMatrix x, dy;
  Matrix dx;
  const float* gamma;
  const float* stats;
  const float* sums;
  int channels, plane;
  float n;
  XPIPE_HOST_DEVICE void operator()(index_t rc, index_t i) const {
    const index_t r = rc / channels, c = rc - r * channels, col = c * plane + i;
    dx(r, col) = math::normalize_input_grad(x(r, col), dy(r, col), stats[c], stats[channels + c],
                                            gamma[c], sums[c], sums[channels + c], n);
  }
};

}  // namespace ops

//! Doubles of every level's partial sums but the last, per channel, of one channel reduction.
constexpr index_t channel_partial_sums(const NormGeometry& g) {
  index_t partial_sums = 0;
  for (int l = 1; l < math::channel_sum_levels(g.rows, g.plane); ++l)
    partial_sums += math::channel_sum_partials(g.rows, g.plane, l);
  return partial_sums;
}

//! Doubles of the scratch BatchNorm's reductions of g take: two reductions' partial sums at
//! once (the backward sums dy and dy xhat in one pass) plus their two results of C doubles each
//! (batch_norm_statistics: the sums of x and of the squared deviations; the backward: of dy and
//! of dy xhat). Usage: `Buffer<double> scratch(batch_norm_scratch_doubles(geometry(max_rows)));`
constexpr index_t batch_norm_scratch_doubles(const NormGeometry& g) {
  return g.channels * (2 * channel_partial_sums(g) + 2);
}

// The levels after the first of a channel reduction whose level-1 partial sums (`partials` per
// channel) are in `level` (the scratch, unless one level is all), the later ones after them.
template <class Ctx>
void channel_sum_levels_after_first(const Ctx& ctx, const NormGeometry& g, double* level,
                                    index_t partials, double* out) {
  const int levels = math::channel_sum_levels(g.rows, g.plane);
  for (int l = 2; l <= levels; ++l) {
    const index_t next = l == levels ? 1 : math::channel_sum_partials(g.rows, g.plane, l);
    double* into = l == levels ? out : level + g.channels * partials;
    for_each_element(ctx, g.channels, next, ops::PartialChunkSums{level, partials, next, into});
    level = into;
    partials = next;
  }
}

//! out[c] = the sum over rows and pixels of channel c's terms (ops::ValueTerm and the others),
//! in the fixed order of math::channel_sum_levels: a launch per level, every channel's chunks at
//! once. `scratch`: the levels' partial sums (batch_norm_scratch_doubles less the results).
template <class Ctx, class Term>
void channel_sums(const Ctx& ctx, const NormGeometry& g, const Term& term, double* scratch,
                  double* out) {
  const int levels = math::channel_sum_levels(g.rows, g.plane);
  const index_t chunks = math::chunks_of(g.plane);
  // Level 1 (also when one term or one chunk is all: then its partial sum is the sum). The work
  // hint counts the terms, so the host forks its threads where the pass is large.
  double* level = levels <= 1 ? out : scratch;
  index_t partials = g.rows * chunks;
  for_each_index(ctx, g.channels * partials, g.channels * g.rows * g.plane,
                 ops::ChannelChunkSums<Term>{g, term, chunks, partials, level});
  channel_sum_levels_after_first(ctx, g, level, partials, out);
}

//! out_a[c] and out_b[c]: the channel sums of two terms, each with the bits channel_sums gives
//! it, the first level of both in one pass over the rows (its inputs read once). `scratch`: two
//! reductions' partial sums (2 channel_partial_sums(g) per channel).
template <class Ctx, class A, class B>
void channel_sum_pairs(const Ctx& ctx, const NormGeometry& g, const A& a, const B& b,
                       double* scratch, double* out_a, double* out_b) {
  const int levels = math::channel_sum_levels(g.rows, g.plane);
  const index_t chunks = math::chunks_of(g.plane), partials = g.rows * chunks;
  double* level_a = levels <= 1 ? out_a : scratch;
  double* level_b = levels <= 1 ? out_b : scratch + g.channels * channel_partial_sums(g);
  for_each_index(ctx, g.channels * partials, 2 * g.channels * g.rows * g.plane,
                 ops::ChannelChunkSumPairs<A, B>{g, a, b, chunks, partials, level_a, level_b});
  channel_sum_levels_after_first(ctx, g, level_a, partials, out_a);
  channel_sum_levels_after_first(ctx, g, level_b, partials, out_b);
}

//! Training statistics of x (mean, invstd into stats: 2 C floats), updating `running` (mean,
//! variance: 2 C floats) unless it is null: the channel sums of x, then of (x - mean)^2 (two
//! passes, not E[x^2] - E[x]^2). `scratch`: batch_norm_scratch_doubles(g) doubles.
template <class Ctx>
void batch_norm_statistics(const Ctx& ctx, const NormGeometry& g, ConstMatrix x, float* stats,
                           float* running, double* scratch) {
  double* moments = scratch + batch_norm_scratch_doubles(g) - 2 * g.channels;
  const double n = static_cast<double>(g.rows) * g.plane;
  channel_sums(ctx, g, ops::ValueTerm{x}, scratch, moments);
  channel_sums(ctx, g, ops::SquaredDeviationTerm{x, moments, n}, scratch, moments + g.channels);
  for_each_index(ctx, g.channels, ops::BatchNormStatistics{moments, g, stats, running});
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
  for_each_element(ctx, x.rows * g.channels, g.plane,
                   ops::BatchNormForward{x, y, gamma, beta, stats, g.channels, g.plane});
}

//! dx through the batch's statistics from the channel sums of dy and dy xhat (`sums`, as
//! BatchNormBackwardSums leaves them). Usage: `batch_norm_input_grad(ctx, g, x, dy, dx, ...);`
template <class Ctx>
void batch_norm_input_grad(const Ctx& ctx, const NormGeometry& g, ConstMatrix x, ConstMatrix dy,
                           Matrix dx, const float* gamma, const float* stats, const float* sums) {
  const float n = static_cast<float>(g.rows) * static_cast<float>(g.plane);
  for_each_element(
      ctx, x.rows * g.channels, g.plane,
      ops::BatchNormBackwardInput{x, dy, dx, gamma, stats, sums, g.channels, g.plane, n});
}

//! The channel sums of dy and of dy xhat into `sums` (2 C floats), and dgamma, dbeta (+)= them
//! unless dgamma is null.
template <class Ctx>
void batch_norm_backward_sums(const Ctx& ctx, const NormGeometry& g, ConstMatrix x, ConstMatrix dy,
                              const float* stats, float* sums, float* dgamma, float* dbeta,
                              bool accumulate, double* scratch) {
  double* reduced = scratch + batch_norm_scratch_doubles(g) - 2 * g.channels;
  channel_sum_pairs(ctx, g, ops::ValueTerm{dy}, ops::GradientXhatTerm{x, dy, stats, g.channels},
                    scratch, reduced, reduced + g.channels);
  for_each_index(ctx, g.channels,
                 ops::BatchNormBackwardSums{reduced, g.channels, sums, dgamma, dbeta, accumulate});
}

//! The backward: channel sums into `sums` (2 C floats), dgamma and dbeta (+)=, then dx unless
//! dx is empty. `scratch`: batch_norm_scratch_doubles(g) doubles.
template <class Ctx>
void batch_norm_backward(const Ctx& ctx, const NormGeometry& g, ConstMatrix x, ConstMatrix dy,
                         Matrix dx, const float* gamma, const float* stats, float* sums,
                         float* dgamma, float* dbeta, bool accumulate, double* scratch) {
  batch_norm_backward_sums(ctx, g, x, dy, stats, sums, dgamma, dbeta, accumulate, scratch);
  if (!dx.empty()) batch_norm_input_grad(ctx, g, x, dy, dx, gamma, stats, sums);
}

//! The input part of a split backward: the channel sums of dy and dy xhat into `sums` (2 C
//! floats, which the weight part reads), then dx unless dx is empty. No parameter gradient.
//! Usage: `batch_norm_backward_input(ctx, g, x, dy, dx, gamma, stats, sums, scratch);`
template <class Ctx>
void batch_norm_backward_input(const Ctx& ctx, const NormGeometry& g, ConstMatrix x, ConstMatrix dy,
                               Matrix dx, const float* gamma, const float* stats, float* sums,
                               double* scratch) {
  batch_norm_backward_sums(ctx, g, x, dy, stats, sums, nullptr, nullptr, false, scratch);
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
