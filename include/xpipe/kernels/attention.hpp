// Causal self-attention (CausalSelfAttention): the masked softmax of one row of scores and its
// backward as shared per-row functions (a host loop and a CUDA kernel run the same math), the
// host launchers, which run each (sequence, head)'s products through oneDNN's GEMM, and the
// device launchers (any DeviceBackend: its gemm per (sequence, head), one element loop over every
// row's softmax): the GEMM-and-softmax path, with the scores in memory.
#pragma once

#include <cmath>
#include <type_traits>

#include "xpipe/backend/backend.hpp"
#include "xpipe/backend/host.hpp"
#include "xpipe/core/config.hpp"
#include "xpipe/core/tensor.hpp"
#include "xpipe/kernels/elementary.hpp"

namespace xpipe {

namespace math {

//! Whether v is neither NaN nor an infinity, alike on host and device: v - v is 0 only then.
//! Usage: `if (!math::finite_value(s[j])) ...`
XPIPE_HOST_DEVICE bool finite_value(float v) {
  return v - v == 0.f;
}

//! Row t of one sequence's scores, n = Context wide, in place: s[0..valid) (valid = t + 1, the
//! tokens up to t) become their softmax, s[valid..n) become 0 (the future, which row t may not
//! see), so a product with the whole row reads nothing of the future. The row maximum is
//! subtracted first, so exp() never overflows. A NaN or infinite score among s[0..valid) sets
//! the whole row to NaN and returns false: the caller reports it, since the host launcher's
//! threads cannot throw. Usage: `if (!math::causal_softmax_row(s, t + 1, context)) ...`
XPIPE_HOST_DEVICE bool causal_softmax_row(float* s, index_t valid, index_t n) {
  float max_score = s[0];
  bool finite = true;
  for (index_t j = 0; j < valid; ++j) {
    finite = finite && finite_value(s[j]);
    max_score = s[j] > max_score ? s[j] : max_score;
  }
  if (!finite) {
    for (index_t j = 0; j < n; ++j) s[j] = nanf("");
    return false;
  }
  // The maximum's term is exp(0) = 1, so the sum is at least 1: no division by 0. The exps in
  // a loop of their own, which the host vectorises (at -O2 too); the sum in index order.
  XPIPE_INDEPENDENT_ITERATIONS
  for (index_t j = 0; j < valid; ++j) s[j] = exp_poly(s[j] - max_score);
  float sum = 0.f;
  for (index_t j = 0; j < valid; ++j) sum += s[j];
  XPIPE_INDEPENDENT_ITERATIONS
  for (index_t j = 0; j < valid; ++j) s[j] /= sum;
  for (index_t j = valid; j < n; ++j) s[j] = 0.f;
  return true;
}

//! The softmax's backward for one row, in place on the row's dP: ds_j = p_j (dp_j - sum_k p_k
//! dp_k) for j < valid, and 0 for the future entries (whatever dP holds there), so dQ = dS K
//! and dK = dS^T Q read nothing of the future. The dot product is summed in index order.
//! Usage: `math::causal_softmax_row_backward(p, dp, t + 1, context);`
XPIPE_HOST_DEVICE void causal_softmax_row_backward(const float* p, float* dp, index_t valid,
                                                   index_t n) {
  float dot = 0.f;
  for (index_t j = 0; j < valid; ++j) dot += p[j] * dp[j];
  XPIPE_INDEPENDENT_ITERATIONS
  for (index_t j = 0; j < valid; ++j) dp[j] = p[j] * (dp[j] - dot);
  for (index_t j = valid; j < n; ++j) dp[j] = 0.f;
}

//! The fused ("flash") forward of one query row of one (sequence, head): o = sum over keys j <=
//! i of softmax_j(q . k_j * scale) v_j, by an online softmax over the keys in order, so the row
//! of scores is never stored. Key j's k and v are Dh floats at k + j ld and v + j ld. Returns
//! the row's log-sum-exp (max + log of the sum of exps), what the fused backward recomputes the
//! probabilities from. A score that is not finite makes o and the result NaN. Usage:
//! `float lse = math::fused_attention_row<16>(q, k, v, 16, i, 0.25f, o);`
template <int Dh>
XPIPE_HOST_DEVICE float fused_attention_row(const float* q, const float* k, const float* v,
                                            index_t ld, index_t i, float scale, float* o) {
  float acc[Dh];
  for (int d = 0; d < Dh; ++d) acc[d] = 0.f;
  float m = 0.f, l = 0.f;
  bool finite = true;
  for (index_t j = 0; j <= i; ++j) {
    float s = 0.f;
    for (int d = 0; d < Dh; ++d) s += q[d] * k[j * ld + d];
    s *= scale;
    finite = finite && finite_value(s);
    if (j == 0 || s > m) {  // a new maximum: rescale what was summed under the old one
      const float c = j == 0 ? 0.f : exp_poly(m - s);
      l *= c;
      for (int d = 0; d < Dh; ++d) acc[d] *= c;
      m = s;
    }
    const float p = exp_poly(s - m);
    l += p;
    for (int d = 0; d < Dh; ++d) acc[d] += p * v[j * ld + d];
  }
  if (!finite) {
    for (int d = 0; d < Dh; ++d) o[d] = nanf("");
    return nanf("");
  }
  for (int d = 0; d < Dh; ++d) o[d] = acc[d] / l;
  return m + logf(l);
}

//! The fused backward's query side for row i: dq = scale * sum over j <= i of ds_ij k_j, with
//! p_ij = exp(q . k_j * scale - lse_i) recomputed, dp_ij = do . v_j and ds_ij = p_ij (dp_ij -
//! delta_i), delta_i = do . o_i (= sum_j p_ij dp_ij). Keys as in fused_attention_row.
template <int Dh>
XPIPE_HOST_DEVICE void fused_attention_row_dq(const float* q, const float* k, const float* v,
                                              index_t ld, index_t i, float scale, float lse,
                                              float delta, const float* d_out, float* dq) {
  float acc[Dh];
  for (int d = 0; d < Dh; ++d) acc[d] = 0.f;
  for (index_t j = 0; j <= i; ++j) {
    float s = 0.f, dp = 0.f;
    for (int d = 0; d < Dh; ++d) {
      s += q[d] * k[j * ld + d];
      dp += d_out[d] * v[j * ld + d];
    }
    const float ds = exp_poly(s * scale - lse) * (dp - delta);
    for (int d = 0; d < Dh; ++d) acc[d] += ds * k[j * ld + d];
  }
  for (int d = 0; d < Dh; ++d) dq[d] = acc[d] * scale;
}

//! The fused backward's key side for key row j of a sequence of n rows: dv = sum over queries i
//! >= j of p_ij do_i, dk = scale * sum of ds_ij q_i (p, ds as in fused_attention_row_dq). Query
//! i's q and do are Dh floats at q + i ld_q and d_out + i ld_do, its lse and delta at lse[i] and
//! delta[i]; k and v are key j's.
template <int Dh>
XPIPE_HOST_DEVICE void fused_attention_row_dkv(const float* q, index_t ld_q, const float* k,
                                               const float* v, const float* d_out, index_t ld_do,
                                               index_t j, index_t n, float scale, const float* lse,
                                               const float* delta, float* dk, float* dv) {
  float acc_k[Dh], acc_v[Dh];
  for (int d = 0; d < Dh; ++d) acc_k[d] = acc_v[d] = 0.f;
  for (index_t i = j; i < n; ++i) {
    float s = 0.f, dp = 0.f;
    for (int d = 0; d < Dh; ++d) {
      s += q[i * ld_q + d] * k[d];
      dp += d_out[i * ld_do + d] * v[d];
    }
    const float p = exp_poly(s * scale - lse[i]);
    const float ds = p * (dp - delta[i]);
    for (int d = 0; d < Dh; ++d) {
      acc_v[d] += p * d_out[i * ld_do + d];
      acc_k[d] += ds * q[i * ld_q + d];
    }
  }
  for (int d = 0; d < Dh; ++d) {
    dk[d] = acc_k[d] * scale;
    dv[d] = acc_v[d];
  }
}

}  // namespace math

//! Where causal self-attention's operands lie. Rows are tokens, `context` consecutive rows one
//! sequence; an input row is q | k | v, each heads x head_width wide, head h in columns
//! [h head_width, (h + 1) head_width) of each part; an output row is the heads side by side. The
//! probabilities (and the backward's dP, then dS) hold, for row r and head h, `context` floats at
//! (r heads + h) context: a (sequence, head)'s block is then a context x context matrix with
//! leading dimension heads x context. Usage: `AttentionShape a{rows, 2, 4, 4};`
struct AttentionShape {
  index_t rows, heads, head_width, context;
  XPIPE_HOST_DEVICE constexpr index_t sequences() const { return rows / context; }
  XPIPE_HOST_DEVICE constexpr index_t dim() const { return heads * head_width; }
  //! Leading dimension of a (sequence, head)'s block of probabilities.
  XPIPE_HOST_DEVICE constexpr index_t prob_ld() const { return heads * context; }
  //! Offset of the block of sequence s, head h in the probabilities.
  XPIPE_HOST_DEVICE constexpr index_t prob_offset(index_t s, index_t h) const {
    return (s * context * heads + h) * context;
  }
  //! Offset of part `part` (0 q, 1 k, 2 v) of head h in row 0 of sequence s of a q | k | v view.
  XPIPE_HOST_DEVICE constexpr index_t qkv_offset(ConstMatrix x, index_t s, index_t part,
                                                 index_t h) const {
    return s * context * x.ld + part * dim() + h * head_width;
  }
};

namespace ops {

//! Row r, head h of the scores (index r * heads + h): its causal softmax in place
//! (math::causal_softmax_row), the row's position in its sequence giving how much it sees. A row
//! whose scores are not finite is left NaN.
struct CausalSoftmaxRows {
  AttentionShape a;
  float* probs;
  XPIPE_HOST_DEVICE void operator()(index_t i) const {
    const index_t r = i / a.heads, h = i % a.heads, t = r % a.context;
    float* row = probs + a.prob_offset(r / a.context, h) + t * a.prob_ld();
    math::causal_softmax_row(row, t + 1, a.context);
  }
};

//! Row r, head h of dP (index r * heads + h): the softmax's backward in place into dS
//! (math::causal_softmax_row_backward) from the forward's probabilities.
struct CausalSoftmaxBackwardRows {
  AttentionShape a;
  const float* probs;
  float* grads;
  XPIPE_HOST_DEVICE void operator()(index_t i) const {
    const index_t r = i / a.heads, h = i % a.heads, t = r % a.context;
    const index_t at = a.prob_offset(r / a.context, h) + t * a.prob_ld();
    math::causal_softmax_row_backward(probs + at, grads + at, t + 1, a.context);
  }
};

}  // namespace ops

namespace detail {
// The products of one (sequence, head) run on the thread that owns it, one thread each: their
// bits then depend on neither the thread count nor which thread runs them. (dnnl_sgemm runs on
// one thread inside a parallel region anyway; outside one, this pins it.)
inline constexpr HostContext attention_gemm_ctx{.threads = 1};
}  // namespace detail

//! The forward on the host: per (sequence, head), S = Q K^T / sqrt(head_width) into `probs`, the
//! causal softmax of each row in place (math::causal_softmax_row), then O = P V into y's head
//! columns. (Sequence, head) pairs are spread over ctx.threads, each computed by one thread in a
//! fixed order, so the bits do not depend on the thread count. A row whose scores are not
//! finite is left NaN in `probs` (first_non_finite_scores finds it). Usage:
//! `causal_attention_forward(ctx, AttentionShape{x.rows, 2, 4, 4}, x, y, probs);`
inline void causal_attention_forward(const HostContext& ctx, const AttentionShape& a, ConstMatrix x,
                                     Matrix y, float* probs) {
  const float scale = 1.f / std::sqrt(static_cast<float>(a.head_width));
  const index_t t = a.context, dh = a.head_width, ldp = a.prob_ld();
  for_each_index(ctx, a.sequences() * a.heads, a.rows * a.context * a.dim(), [=](index_t i) {
    const index_t s = i / a.heads, h = i % a.heads;
    const float* q = x.data + a.qkv_offset(x, s, 0, h);
    const float* k = x.data + a.qkv_offset(x, s, 1, h);
    const float* v = x.data + a.qkv_offset(x, s, 2, h);
    float* p = probs + a.prob_offset(s, h);
    // S = Q K^T scaled: all t x t scores, the future's too (the softmax zeroes those).
    gemm(detail::attention_gemm_ctx, Trans::No, Trans::Yes, t, t, dh, scale, q, x.ld, k, x.ld, 0.f,
         p, ldp);
    for (index_t row = 0; row < t; ++row) math::causal_softmax_row(p + row * ldp, row + 1, t);
    // O = P V, into head h's columns of the sequence's output rows.
    gemm(detail::attention_gemm_ctx, Trans::No, Trans::No, t, dh, t, 1.f, p, ldp, v, x.ld, 0.f,
         y.data + s * t * y.ld + h * dh, y.ld);
  });
}

//! The first (row, head) whose scores the forward found not finite, as row * heads + head, or
//! -1: a look at the first probability of each row and head, which the softmax left NaN.
//! Usage: `if (index_t bad = first_non_finite_scores(a, probs); bad >= 0) ...`
inline index_t first_non_finite_scores(const AttentionShape& a, const float* probs) {
  for (index_t i = 0; i < a.rows * a.heads; ++i)
    if (std::isnan(probs[i * a.context])) return i;
  return -1;
}

//! The backward on the host, from the forward's probabilities: per (sequence, head), dV = P^T
//! dO, dP = dO V^T into `grads` (as large as probs), dS = P o (dP - rowsum(dP o P)) in place
//! (math::causal_softmax_row_backward), dQ = dS K / sqrt(head_width), dK = dS^T Q / sqrt(
//! head_width), each into its part of dx. Threads as in the forward. Usage:
//! `causal_attention_backward(ctx, a, x, dy, dx, probs, grads);`
inline void causal_attention_backward(const HostContext& ctx, const AttentionShape& a,
                                      ConstMatrix x, ConstMatrix dy, Matrix dx, const float* probs,
                                      float* grads) {
  const float scale = 1.f / std::sqrt(static_cast<float>(a.head_width));
  const index_t t = a.context, dh = a.head_width, ldp = a.prob_ld();
  for_each_index(ctx, a.sequences() * a.heads, 2 * a.rows * a.context * a.dim(), [=](index_t i) {
    const index_t s = i / a.heads, h = i % a.heads;
    const float* q = x.data + a.qkv_offset(x, s, 0, h);
    const float* k = x.data + a.qkv_offset(x, s, 1, h);
    const float* v = x.data + a.qkv_offset(x, s, 2, h);
    const float* d_out = dy.data + s * t * dy.ld + h * dh;
    float* dq = dx.data + a.qkv_offset(dx, s, 0, h);
    float* dk = dx.data + a.qkv_offset(dx, s, 1, h);
    float* dv = dx.data + a.qkv_offset(dx, s, 2, h);
    const float* p = probs + a.prob_offset(s, h);
    float* ds = grads + a.prob_offset(s, h);
    const HostContext& one = detail::attention_gemm_ctx;
    // dV = P^T dO: the future's probabilities are 0, so each key collects only later queries.
    gemm(one, Trans::Yes, Trans::No, t, dh, t, 1.f, p, ldp, d_out, dy.ld, 0.f, dv, dx.ld);
    // dP = dO V^T, then dS row by row in place.
    gemm(one, Trans::No, Trans::Yes, t, t, dh, 1.f, d_out, dy.ld, v, x.ld, 0.f, ds, ldp);
    for (index_t row = 0; row < t; ++row)
      math::causal_softmax_row_backward(p + row * ldp, ds + row * ldp, row + 1, t);
    // S = Q K^T scale, so dQ = dS K scale and dK = dS^T Q scale.
    gemm(one, Trans::No, Trans::No, t, dh, t, scale, ds, ldp, k, x.ld, 0.f, dq, dx.ld);
    gemm(one, Trans::Yes, Trans::No, t, dh, t, scale, ds, ldp, q, x.ld, 0.f, dk, dx.ld);
  });
}

//! The forward on a device backend (its gemm and element loop, enqueued on ctx's stream): per
//! (sequence, head) S = Q K^T / sqrt(head_width) into `probs`, then every row's causal softmax in
//! one loop (ops::CausalSoftmaxRows, the host's row math), then per (sequence, head) O = P V into
//! y's head columns. The same products and row math as the host's, in the same order within each
//! row: the bits follow the device's GEMM. A row whose scores are not finite is left NaN (no
//! check on the device: the loss, read after the run, shows it).
//! Usage: `causal_attention_forward(cuda_ctx, AttentionShape{x.rows, 2, 4, 4}, x, y, probs);`
template <class Ctx>
requires(!std::is_base_of_v<HostContext, Ctx>) void causal_attention_forward(
    const Ctx& ctx, const AttentionShape& a, ConstMatrix x, Matrix y, float* probs) {
  const float scale = 1.f / std::sqrt(static_cast<float>(a.head_width));
  const index_t t = a.context, dh = a.head_width, ldp = a.prob_ld();
  for (index_t s = 0; s < a.sequences(); ++s)
    for (index_t h = 0; h < a.heads; ++h)
      gemm(ctx, Trans::No, Trans::Yes, t, t, dh, scale, x.data + a.qkv_offset(x, s, 0, h), x.ld,
           x.data + a.qkv_offset(x, s, 1, h), x.ld, 0.f, probs + a.prob_offset(s, h), ldp);
  for_each_index(ctx, a.rows * a.heads, ops::CausalSoftmaxRows{a, probs});
  for (index_t s = 0; s < a.sequences(); ++s)
    for (index_t h = 0; h < a.heads; ++h)
      gemm(ctx, Trans::No, Trans::No, t, dh, t, 1.f, probs + a.prob_offset(s, h), ldp,
           x.data + a.qkv_offset(x, s, 2, h), x.ld, 0.f, y.data + s * t * y.ld + h * dh, y.ld);
}

//! The backward on a device backend, from the forward's probabilities: per (sequence, head) dV =
//! P^T dO and dP = dO V^T into `grads`, then every row's softmax backward in one loop
//! (ops::CausalSoftmaxBackwardRows), then per (sequence, head) dQ = dS K / sqrt(head_width) and
//! dK = dS^T Q / sqrt(head_width). Usage: as the host's.
template <class Ctx>
requires(!std::is_base_of_v<HostContext, Ctx>) void causal_attention_backward(
    const Ctx& ctx, const AttentionShape& a, ConstMatrix x, ConstMatrix dy, Matrix dx,
    const float* probs, float* grads) {
  const float scale = 1.f / std::sqrt(static_cast<float>(a.head_width));
  const index_t t = a.context, dh = a.head_width, ldp = a.prob_ld();
  for (index_t s = 0; s < a.sequences(); ++s)
    for (index_t h = 0; h < a.heads; ++h) {
      const float* d_out = dy.data + s * t * dy.ld + h * dh;
      gemm(ctx, Trans::Yes, Trans::No, t, dh, t, 1.f, probs + a.prob_offset(s, h), ldp, d_out,
           dy.ld, 0.f, dx.data + a.qkv_offset(dx, s, 2, h), dx.ld);
      gemm(ctx, Trans::No, Trans::Yes, t, t, dh, 1.f, d_out, dy.ld,
           x.data + a.qkv_offset(x, s, 2, h), x.ld, 0.f, grads + a.prob_offset(s, h), ldp);
    }
  for_each_index(ctx, a.rows * a.heads, ops::CausalSoftmaxBackwardRows{a, probs, grads});
  for (index_t s = 0; s < a.sequences(); ++s)
    for (index_t h = 0; h < a.heads; ++h) {
      const float* ds = grads + a.prob_offset(s, h);
      gemm(ctx, Trans::No, Trans::No, t, dh, t, scale, ds, ldp, x.data + a.qkv_offset(x, s, 1, h),
           x.ld, 0.f, dx.data + a.qkv_offset(dx, s, 0, h), dx.ld);
      gemm(ctx, Trans::Yes, Trans::No, t, dh, t, scale, ds, ldp, x.data + a.qkv_offset(x, s, 0, h),
           x.ld, 0.f, dx.data + a.qkv_offset(dx, s, 1, h), dx.ld);
    }
}

}  // namespace xpipe
