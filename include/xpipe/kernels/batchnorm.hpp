// Batch normalisation over the channels of channels-last image rows (BatchNorm2d, and fused with
// the activation after it, BatchNormAct): the per-channel statistics, the normalisation and its
// backward as shared per-channel and per-element functions, their function objects and launchers
// (one code path for the host loop and a CUDA kernel).
#pragma once

#include <cmath>
#include <type_traits>
#include <utility>

#include "xpipe/backend/backend.hpp"
#include "xpipe/core/config.hpp"
#include "xpipe/core/tensor.hpp"
#include "xpipe/kernels/activation.hpp"

namespace xpipe {

//! The layout of a batch-normalised activation: `rows` rows of `plane` = H W pixels of `channels`
//! floats each (channels-last: channel c of pixel p at column p channels + c); eps is added to the
//! variance; momentum weights a new statistic into the running one (PyTorch's convention: running =
//! (1 - momentum) running + momentum new).
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
//! the convolution before it. Four: when the first level's lanes were doubles, the four lanes of
//! the backward's two sums over 16 channels filled 16 of AVX-512's 32 registers, where eight
//! lanes spilled them to memory (the fused BatchNorm-ReLU backward's sums ran 1.3x slower). In
//! float lanes (first_level_lane) they take 8; the count stays, as it fixes the summation order
//! and so the bits.
inline constexpr int reduce_lanes = 4;

//! Terms one partial sum of a channel reduction covers, at every level (channel_sum_levels).
inline constexpr index_t reduce_chunk = 128;

//! The first level's lanes (ops::ChannelChunkSums) add their terms in float: a lane takes at most
//! reduce_chunk / reduce_lanes = 32 of them, 31 additions, so its sum lies within about 31 unit
//! roundoffs (2^-24) of its terms' magnitudes of theirs (recursive summation's bound), plus the
//! roundings of each term's own arithmetic (one for dy xhat from a float xhat, up to three for
//! a squared deviation); the lanes are added in double, and every later level sums doubles. A
//! lane overflows where its terms' sum passes FLT_MAX (a spread of about 3e18 for the squared
//! deviations). Lanes of doubles had held the statistics and the backward's sums at a quarter
//! to half of a triad's speed on AVX-512 (every term converted, half as many values an
//! instruction).
using first_level_lane = float;

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

// The terms of the channel reductions: term(r, col, c) gives channel c's term at row r, column
// col in float (math::first_level_lane), reading what it needs of c from per-channel arrays
// (contiguous, so a host call summing several channels at once loads them as one vector).

//! x itself: the channel sums of x (the mean).
struct ValueTerm {
  ConstMatrix x;
  XPIPE_HOST_DEVICE float operator()(index_t r, index_t col, int /*c*/) const { return x(r, col); }
};

//! (x - mean)^2, means[c] the channel's mean (sum / n) rounded to float: the channel sums of the
//! squared deviations (the biased variance times n). About a mean off by delta they exceed the
//! exact ones by n delta^2, relatively (delta / std)^2 <= (2^-24 |mean| / std)^2: below float's
//! own roundoff unless std < |mean| / 4096, and always the square of the relative error x's own
//! rounding puts into a deviation.
struct SquaredDeviationTerm {
  ConstMatrix x;
  const float* means;
  XPIPE_HOST_DEVICE float operator()(index_t r, index_t col, int c) const {
    const float d = x(r, col) - means[c];
    return d * d;
  }
};

//! The gradient at the normalisation's output, from dy at the layer's: dy itself, or Act'(z) dy
//! where an activation Act is fused after the normalisation, z = normalize(x) its input. z is made
//! again from x as the forward made it, with the forward's statistics and the forward's gamma and
//! beta (`stats`, `affine`: 2 C floats each, which the layer keeps per slot; the backward's own
//! weights may be newer), in the same expression: the same float, so the same gradient as
//! Act'(y) dy from the forward's output y (ReLU: z > 0 exactly where y > 0). A fused backward's
//! two passes thus read two arrays where they read three: x, which xhat needs anyway, and dy,
//! not y. Computed where it is read, so a fused backward neither writes it nor reads it back. For
//! the identity only dy is read.
template <class Act = math::Identity>
struct NormGradient {
  ConstMatrix x, dy;
  const float* stats = nullptr;
  const float* affine = nullptr;
  int channels = 0;
  // c an index_t: an int made from for_each_pixel's index_t channel was read as a gather of
  // scalars (a fused input-gradient pass 3x slower).
  XPIPE_HOST_DEVICE float operator()(index_t r, index_t col, index_t c) const {
    if constexpr (std::is_same_v<Act, math::Identity>) {
      return dy(r, col);
    } else {
      const float z = math::normalize(x(r, col), stats[c], stats[channels + c], affine[c],
                                      affine[channels + c]);
      return Act::backward(z, Act::forward(z), dy(r, col));
    }
  }
};

//! The gradient at the normalisation's output itself: the channel sums that are dbeta.
template <class Act = math::Identity>
struct GradientTerm {
  NormGradient<Act> dy;
  XPIPE_HOST_DEVICE float operator()(index_t r, index_t col, int c) const { return dy(r, col, c); }
};

//! dy xhat, dy the gradient at the normalisation's output and xhat = (x - mean) invstd in float
//! with the batch's statistics (stats: mean, invstd): the channel sums that are dgamma.
template <class Act = math::Identity>
struct GradientXhatTerm {
  ConstMatrix x;
  NormGradient<Act> dy;
  const float* stats;
  int channels;
  XPIPE_HOST_DEVICE float operator()(index_t r, index_t col, int c) const {
    return dy(r, col, c) * ((x(r, col) - stats[c]) * stats[channels + c]);
  }
};

//! No second term: a ChannelChunkSums of one reduction.
struct NoTerm {
  XPIPE_HOST_DEVICE float operator()(index_t, index_t, int) const { return 0; }
};

//! Level 1 of the channel reductions of term A (and of B, unless it is NoTerm: the backward's
//! sums of dy and of dy xhat, reading x and dy once) over Block channels at a time: index i =
//! s blocks + b is partial sum s (chunk j of row r's pixels, s = r chunks + j) of channels
//! [b Block, b Block + Block) (fewer in the last block), into out_a[c partials + s] (and
//! out_b). Term k of a chunk of channel c lies at row r, column (first + k) channels + c, and
//! adds into lane k % reduce_lanes; the lanes are added in order at the end: per channel
//! math::lane_sum's order, its lanes in float here (math::first_level_lane), whatever Block is.
//! Block 1 (a CUDA thread per channel, neighbours on neighbouring channels, so their loads
//! coalesce) and Block 16 (a host call, vectorised across the channels that lie side by side) give
//! the same sums.
template <int Block, class A, class B = NoTerm>
struct ChannelChunkSums {
  static_assert(std::is_same_v<decltype(std::declval<const A&>()(index_t{}, index_t{}, 0)),
                               math::first_level_lane> &&
                    std::is_same_v<decltype(std::declval<const B&>()(index_t{}, index_t{}, 0)),
                                   math::first_level_lane>,
                "xpipe: channel_sums: a term must return math::first_level_lane (float), the "
                "type its lanes add in; a term in double would be rounded without a word");
  static constexpr bool pair = !std::is_same_v<B, NoTerm>;
  static constexpr int lanes = math::reduce_lanes;
  NormGeometry g;
  A a;
  B b;
  index_t chunks;    // per row: math::chunks_of(plane)
  index_t partials;  // per channel: rows chunks
  double* out_a;
  double* out_b;
  XPIPE_HOST_DEVICE void operator()(index_t i) const {
    const index_t blocks = (g.channels + Block - 1) / Block, s = i / blocks;
    const int c0 = static_cast<int>(i - s * blocks) * Block;
    const int nc = g.channels - c0 < Block ? g.channels - c0 : Block;
    const index_t r = s / chunks, first = (s - r * chunks) * math::reduce_chunk;
    const index_t n = math::chunk_count(g.plane, first);
    using lane_t = math::first_level_lane;
    lane_t la[lanes][Block] = {}, lb[pair ? lanes : 1][Block] = {};
    // A whole block's channel loop has a constant count, so the host compiler keeps the lanes in
    // registers (a count known only at run time left them in memory, 1.7x slower); the last
    // block of a channel count that is no multiple of Block runs the rest.
    if (nc == Block)
      add_chunk<Block>(la, lb, r, first, n, c0, nc);
    else
      add_chunk<0>(la, lb, r, first, n, c0, nc);
    for (int j = 0; j < nc; ++j) {
      double sa = 0, sb = 0;  // the lanes in double, in order
      for (int l = 0; l < lanes; ++l) {
        sa += static_cast<double>(la[l][j]);
        if constexpr (pair) sb += static_cast<double>(lb[l][j]);
      }
      out_a[(c0 + j) * partials + s] = sa;
      if constexpr (pair) out_b[(c0 + j) * partials + s] = sb;
    }
  }

  // The chunk's n terms of channels c0.. (Fixed of them, or nc where Fixed is 0) into the lanes.
  template <int Fixed>
  XPIPE_HOST_DEVICE void add_chunk(math::first_level_lane (&la)[lanes][Block],
                                   math::first_level_lane (&lb)[pair ? lanes : 1][Block], index_t r,
                                   index_t first, index_t n, int c0, int nc) const {
    const int count = Fixed > 0 ? Fixed : nc;
    const index_t whole = n / lanes * lanes;
    const auto add = [&](int l, index_t k) {
      const index_t col = (first + k) * g.channels + c0;
      // The channels' accumulators are independent. Without `omp simd` GCC 12 unrolls a whole
      // block's 16 channels before it vectorises, then gathers the squared deviations' terms a
      // float at a time: the statistics ran at a quarter of a triad's speed.
      XPIPE_INDEPENDENT_ITERATIONS
      for (int j = 0; j < count; ++j) {
        la[l][j] += a(r, col + j, c0 + j);
        if constexpr (pair) lb[l][j] += b(r, col + j, c0 + j);
      }
    };
    // The lanes' loop unrolled whole (4: reduce_lanes), so each lane's accumulators are named
    // registers. nvcc's front end warns on the pragma (it passes for_each_pixel's ivdep through).
    static_assert(lanes == 4, "xpipe: ChannelChunkSums: the unroll count below is reduce_lanes");
    for (index_t t = 0; t < whole; t += lanes)
#if defined(__GNUC__) && !defined(__clang__) && !defined(__NVCC__)
#pragma GCC unroll 4
#endif
      for (int l = 0; l < lanes; ++l) add(l, t + l);
    for (index_t t = whole; t < n; ++t) add(static_cast<int>(t - whole), t);
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

//! Per channel c: means[c] = sums[c] / n rounded to float, the mean the squared deviations are
//! taken from (and the one BatchNormStatistics stores).
struct ChannelMeans {
  const double* sums;
  double n;
  float* means;
  XPIPE_HOST_DEVICE void operator()(index_t c) const { means[c] = static_cast<float>(sums[c] / n); }
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

// The element passes below run over (row, pixel, channel) through for_each_pixel: element
// (r, p, c) is channel c of pixel p of row r, at column p channels + c. On the host the channel
// loop is innermost, vectorised over the channels' contiguous values and parameters; on a GPU
// consecutive threads take consecutive channels, so their loads coalesce.

//! Element (r, p, c): y = Act(gamma[c] (x - mean[c]) invstd[c] + beta[c]), Act the identity or
//! the activation fused after the normalisation. With Post (not void) the normalisation ends a
//! residual block's path and its sum (and the activation Post after it) comes in the same pass:
//! y = Post(that value + skip), the bits of the normalisation and then ops::AddViews<Post> (the
//! normalised value rounds to float before the sum as it did when stored).
template <class Act = math::Identity, class Post = void>
struct BatchNormForward {
  ConstMatrix x;
  Matrix y;
  const float* gamma;
  const float* beta;
  const float* stats;
  int channels;
  ConstMatrix skip{};  // with Post
  XPIPE_HOST_DEVICE void operator()(index_t r, index_t p, index_t c) const {
    const index_t col = p * channels + c;
    const float normalized =
        Act::forward(math::normalize(x(r, col), stats[c], stats[channels + c], gamma[c], beta[c]));
    if constexpr (std::is_void_v<Post>)
      y(r, col) = normalized;
    else
      y(r, col) = Post::forward(normalized + skip(r, col));
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

//! Element (r, p, c): dx from the channel sums (math::normalize_input_grad), dy the gradient at
//! the normalisation's output; gamma the backward's weights.
template <class Act = math::Identity>
struct BatchNormBackwardInput {
  ConstMatrix x;
  NormGradient<Act> dy;
  Matrix dx;
  const float* gamma;
  const float* stats;
  const float* sums;
  int channels;
  float n;
  XPIPE_HOST_DEVICE void operator()(index_t r, index_t p, index_t c) const {
    const index_t col = p * channels + c;
    dx(r, col) = math::normalize_input_grad(x(r, col), dy(r, col, c), stats[c], stats[channels + c],
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
//! once (the backward sums dy and dy xhat in one pass) and their two results of C doubles each
//! (batch_norm_statistics: the sums of x and of the squared deviations; the backward: of dy and
//! of dy xhat). Usage: `Buffer<double> scratch(batch_norm_scratch_doubles(geometry(max_rows)));`
constexpr index_t batch_norm_scratch_doubles(const NormGeometry& g) {
  return g.channels * (2 * channel_partial_sums(g) + 2);
}

//! Channels one call of a channel reduction's first level sums on context Ctx
//! (ops::ChannelChunkSums): 16 on the host, which vectorises across them, one on a GPU thread.
template <class Ctx>
inline constexpr int norm_channel_block = 1;
template <>
inline constexpr int norm_channel_block<HostContext> = 16;

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

//! out_a[c] (and out_b[c], unless B is ops::NoTerm) = the sum over rows and pixels of channel
//! c's terms a (and b; each a float, math::first_level_lane), in the fixed order of
//! math::channel_sum_levels: a launch per level, every channel's chunks at once, the first level of
//! both reductions in one pass over the rows (their inputs read once). `scratch`: two reductions'
//! partial sums (2 channel_partial_sums(g) per channel; one where B is NoTerm).
template <class Ctx, class A, class B = ops::NoTerm>
void channel_sums(const Ctx& ctx, const NormGeometry& g, const A& a, double* scratch, double* out_a,
                  const B& b = {}, double* out_b = nullptr) {
  constexpr int block = norm_channel_block<Ctx>;
  const int levels = math::channel_sum_levels(g.rows, g.plane);
  const index_t chunks = math::chunks_of(g.plane), partials = g.rows * chunks,
                blocks = (g.channels + block - 1) / block;
  // Level 1 (also when one term or one chunk is all: then its partial sum is the sum). The work
  // hint counts the terms, so the host forks its threads where the pass is large.
  double* level_a = levels <= 1 ? out_a : scratch;
  double* level_b = levels <= 1 ? out_b : scratch + g.channels * channel_partial_sums(g);
  const index_t terms = (ops::ChannelChunkSums<block, A, B>::pair ? 2 : 1) * g.channels * g.rows *
                        static_cast<index_t>(g.plane);
  for_each_index(ctx, partials * blocks, terms,
                 ops::ChannelChunkSums<block, A, B>{g, a, b, chunks, partials, level_a, level_b});
  channel_sum_levels_after_first(ctx, g, level_a, partials, out_a);
  if constexpr (ops::ChannelChunkSums<block, A, B>::pair)
    channel_sum_levels_after_first(ctx, g, level_b, partials, out_b);
}

//! Training statistics of x (mean, invstd into stats: 2 C floats), updating `running` (mean,
//! variance: 2 C floats) unless it is null: the channel sums of x, then of (x - mean)^2 (two
//! passes, not E[x^2] - E[x]^2), the mean taken from stats' first C floats, where it is written
//! first. `scratch`: batch_norm_scratch_doubles(g) doubles.
template <class Ctx>
void batch_norm_statistics(const Ctx& ctx, const NormGeometry& g, ConstMatrix x, float* stats,
                           float* running, double* scratch) {
  double* moments = scratch + batch_norm_scratch_doubles(g) - 2 * g.channels;
  const double n = static_cast<double>(g.rows) * g.plane;
  channel_sums(ctx, g, ops::ValueTerm{x}, scratch, moments);
  for_each_index(ctx, g.channels, ops::ChannelMeans{moments, n, stats});
  channel_sums(ctx, g, ops::SquaredDeviationTerm{x, stats}, scratch, moments + g.channels);
  for_each_index(ctx, g.channels, ops::BatchNormStatistics{moments, g, stats, running});
}

//! Evaluation statistics from the running ones (stats: mean, invstd).
template <class Ctx>
void batch_norm_running_statistics(const Ctx& ctx, const NormGeometry& g, const float* running,
                                   float* stats) {
  for_each_index(ctx, g.channels, ops::BatchNormRunningStatistics{running, g, stats});
}

//! y = Act(gamma xhat + beta) with the given statistics (Act: the identity, or the activation
//! fused after the normalisation). Usage: `batch_norm_forward<math::Relu>(ctx, g, x, y, ...);`
template <class Act = math::Identity, class Ctx>
void batch_norm_forward(const Ctx& ctx, const NormGeometry& g, ConstMatrix x, Matrix y,
                        const float* gamma, const float* beta, const float* stats) {
  for_each_pixel(ctx, x.rows, g.plane, g.channels,
                 ops::BatchNormForward<Act>{x, y, gamma, beta, stats, g.channels});
}

//! y = Post(Act(gamma xhat + beta) + skip) with the given statistics: a normalisation and the
//! residual sum after it (and Post, the activation after the sum) in one pass; skip and y are
//! rows of the same images as x. Usage: `batch_norm_forward_sum<math::Identity, math::Relu>(ctx,
//! g, x, skip, y, gamma, beta, stats);`
template <class Act = math::Identity, class Post = math::Identity, class Ctx>
void batch_norm_forward_sum(const Ctx& ctx, const NormGeometry& g, ConstMatrix x, ConstMatrix skip,
                            Matrix y, const float* gamma, const float* beta, const float* stats) {
  for_each_pixel(ctx, x.rows, g.plane, g.channels,
                 ops::BatchNormForward<Act, Post>{x, y, gamma, beta, stats, g.channels, skip});
}

// In the backward launchers below, dy is the gradient at the layer's output and stats the
// forward's statistics; with an activation Act fused after the normalisation, the gradient at the
// normalisation's output is Act'(z) dy, z = normalize(x) made again from x, stats and `affine`, the
// forward's gamma and beta (ops::NormGradient), where it is read. For the identity affine is not
// read (it may be null).

//! dx through the batch's statistics from the channel sums of dy and dy xhat (`sums`, as
//! BatchNormBackwardSums leaves them), gamma the backward's weights.
//! Usage: `batch_norm_input_grad(ctx, g, x, dy, dx, gamma, stats, affine, sums);`
template <class Act = math::Identity, class Ctx>
void batch_norm_input_grad(const Ctx& ctx, const NormGeometry& g, ConstMatrix x, ConstMatrix dy,
                           Matrix dx, const float* gamma, const float* stats, const float* affine,
                           const float* sums) {
  const float n = static_cast<float>(g.rows) * static_cast<float>(g.plane);
  for_each_pixel(ctx, x.rows, g.plane, g.channels,
                 ops::BatchNormBackwardInput<Act>{
                     x, {x, dy, stats, affine, g.channels}, dx, gamma, stats, sums, g.channels, n});
}

//! The channel sums of dy and of dy xhat into `sums` (2 C floats), and dgamma, dbeta (+)= them
//! unless dgamma is null.
template <class Act = math::Identity, class Ctx>
void batch_norm_backward_sums(const Ctx& ctx, const NormGeometry& g, ConstMatrix x, ConstMatrix dy,
                              const float* stats, const float* affine, float* sums, float* dgamma,
                              float* dbeta, bool accumulate, double* scratch) {
  double* reduced = scratch + batch_norm_scratch_doubles(g) - 2 * g.channels;
  const ops::NormGradient<Act> grad{x, dy, stats, affine, g.channels};
  channel_sums(ctx, g, ops::GradientTerm<Act>{grad}, scratch, reduced,
               ops::GradientXhatTerm<Act>{x, grad, stats, g.channels}, reduced + g.channels);
  for_each_index(ctx, g.channels,
                 ops::BatchNormBackwardSums{reduced, g.channels, sums, dgamma, dbeta, accumulate});
}

//! The backward: channel sums into `sums` (2 C floats), dgamma and dbeta (+)=, then dx unless
//! dx is empty. `scratch`: batch_norm_scratch_doubles(g) doubles.
template <class Act = math::Identity, class Ctx>
void batch_norm_backward(const Ctx& ctx, const NormGeometry& g, ConstMatrix x, ConstMatrix dy,
                         Matrix dx, const float* gamma, const float* stats, const float* affine,
                         float* sums, float* dgamma, float* dbeta, bool accumulate,
                         double* scratch) {
  batch_norm_backward_sums<Act>(ctx, g, x, dy, stats, affine, sums, dgamma, dbeta, accumulate,
                                scratch);
  if (!dx.empty()) batch_norm_input_grad<Act>(ctx, g, x, dy, dx, gamma, stats, affine, sums);
}

//! The input part of a split backward: the channel sums of dy and dy xhat into `sums` (2 C
//! floats, which the weight part reads), then dx unless dx is empty. No parameter gradient.
//! Usage: `batch_norm_backward_input(ctx, g, x, dy, dx, gamma, stats, affine, sums, scratch);`
template <class Act = math::Identity, class Ctx>
void batch_norm_backward_input(const Ctx& ctx, const NormGeometry& g, ConstMatrix x, ConstMatrix dy,
                               Matrix dx, const float* gamma, const float* stats,
                               const float* affine, float* sums, double* scratch) {
  batch_norm_backward_sums<Act>(ctx, g, x, dy, stats, affine, sums, nullptr, nullptr, false,
                                scratch);
  if (!dx.empty()) batch_norm_input_grad<Act>(ctx, g, x, dy, dx, gamma, stats, affine, sums);
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
