// Host launchers of the shared per-element math: each loops over a function from kernels/*.hpp.
// The CUDA launchers in kernels/cuda/ops.cuh call exactly the same functions.
#pragma once

#include <cstdint>

#include "xpipe/backend/host.hpp"
#include "xpipe/core/tensor.hpp"
#include "xpipe/kernels/activation.hpp"
#include "xpipe/kernels/optim.hpp"
#include "xpipe/kernels/softmax_xent.hpp"

namespace xpipe {

//! y[r][c] = Act(z[r][c] + bias[c]); y may alias z.
template <class Act>
void bias_activation_forward(const HostContext& ctx, ConstMatrix z, const float* bias, Matrix y) {
  for_each_row(ctx, z.rows, z.cols, [=](index_t r) {
    const float* zr = z.row(r);
    float* yr = y.row(r);
    for (index_t c = 0; c < z.cols; ++c) yr[c] = math::bias_activation<Act>(zr[c], bias[c]);
  });
}

//! Element-wise activation y = Act(x); y may alias x.
template <class Act>
void activation_forward(const HostContext& ctx, ConstMatrix x, Matrix y) {
  for_each_row(ctx, x.rows, x.cols, [=](index_t r) {
    const float* xr = x.row(r);
    float* yr = y.row(r);
    for (index_t c = 0; c < x.cols; ++c) yr[c] = Act::forward(xr[c]);
  });
}

//! dx = Act'(x) * dy, given the layer's input x and output y; dx may alias dy.
template <class Act>
void activation_backward(const HostContext& ctx, ConstMatrix x, ConstMatrix y, ConstMatrix dy,
                         Matrix dx) {
  for_each_row(ctx, x.rows, x.cols, [=](index_t r) {
    const float *xr = x.row(r), *yr = y.row(r), *dyr = dy.row(r);
    float* dxr = dx.row(r);
    for (index_t c = 0; c < x.cols; ++c) dxr[c] = Act::backward(xr[c], yr[c], dyr[c]);
  });
}

//! db[c] (+)= sum over rows of dy[r][c], rows summed in order 0..rows-1 for every column, so the
//! bits do not depend on the thread count. `accumulate` adds to db instead of overwriting it.
inline void bias_grad(const HostContext& ctx, ConstMatrix dy, float* db, bool accumulate) {
  const index_t cols = dy.cols;
  // Blocks of columns keep the row walk contiguous and vectorisable within each block.
  constexpr index_t block = 256;
  const index_t blocks = (cols + block - 1) / block;
  auto body = [=](index_t blk) {
    const index_t c0 = blk * block;
    const index_t c1 = c0 + block < cols ? c0 + block : cols;
    if (!accumulate)
      for (index_t c = c0; c < c1; ++c) db[c] = 0.f;
    for (index_t r = 0; r < dy.rows; ++r) {
      const float* row = dy.row(r);
      for (index_t c = c0; c < c1; ++c) db[c] += row[c];
    }
  };
  parallel_for(ctx, blocks, dy.rows * cols, body);
}

//! Softmax cross-entropy over rows: grad = (softmax - onehot) * scale, row_loss[r] = -log p[label].
inline void softmax_xent(const HostContext& ctx, ConstMatrix logits, const std::int32_t* labels,
                         float scale, Matrix grad, float* row_loss) {
  (void)ctx;  // rows are short (classes); one thread is faster than forking here
  for (index_t r = 0; r < logits.rows; ++r)
    row_loss[r] = math::softmax_xent_row(logits.row(r), logits.cols, labels[r], scale, grad.row(r));
}

//! predicted[r] = argmax of logits row r.
inline void argmax_rows(const HostContext& ctx, ConstMatrix logits, std::int32_t* predicted) {
  (void)ctx;
  for (index_t r = 0; r < logits.rows; ++r)
    predicted[r] = math::argmax_row(logits.row(r), logits.cols);
}

//! One fused SGD pass over a stage's flat buffers.
inline void sgd_step(const HostContext& ctx, float* XPIPE_RESTRICT w, const float* XPIPE_RESTRICT g,
                     float* XPIPE_RESTRICT m, index_t n, const math::SgdScalars& s) {
  for_each_index(ctx, n, [=](index_t i) { math::sgd_update(w[i], g[i], m[i], s); });
}

//! One fused Adam/AdamW pass over a stage's flat buffers.
inline void adam_step(const HostContext& ctx, float* XPIPE_RESTRICT w, const float* XPIPE_RESTRICT g,
                      float* XPIPE_RESTRICT m, float* XPIPE_RESTRICT v, index_t n,
                      const math::AdamScalars& s) {
  for_each_index(ctx, n, [=](index_t i) { math::adam_update(w[i], g[i], m[i], v[i], s); });
}

//! d = SGD's update direction (the momentum buffer).
inline void sgd_direction(const HostContext& ctx, const float* XPIPE_RESTRICT m,
                          float* XPIPE_RESTRICT d, index_t n) {
  for_each_index(ctx, n, [=](index_t i) { d[i] = math::sgd_direction(m[i]); });
}

//! d = Adam's update direction m_hat / (sqrt(v_hat) + eps).
inline void adam_direction(const HostContext& ctx, const float* XPIPE_RESTRICT m,
                           const float* XPIPE_RESTRICT v, float* XPIPE_RESTRICT d, index_t n,
                           const math::AdamScalars& s) {
  for_each_index(ctx, n, [=](index_t i) { d[i] = math::adam_direction(m[i], v[i], s); });
}

//! out = w - s_lr * m: the SGD prediction in one pass.
inline void sgd_predict(const HostContext& ctx, const float* XPIPE_RESTRICT w,
                        const float* XPIPE_RESTRICT m, float* XPIPE_RESTRICT out, index_t n,
                        float s_lr) {
  for_each_index(ctx, n, [=](index_t i) { out[i] = math::sgd_predict(w[i], m[i], s_lr); });
}

//! out = w - s_lr * m_hat / (sqrt(v_hat) + eps): the Adam prediction in one pass.
inline void adam_predict(const HostContext& ctx, const float* XPIPE_RESTRICT w,
                         const float* XPIPE_RESTRICT m, const float* XPIPE_RESTRICT v,
                         float* XPIPE_RESTRICT out, index_t n, float s_lr,
                         const math::AdamScalars& s) {
  for_each_index(ctx, n,
                 [=](index_t i) { out[i] = math::adam_predict(w[i], m[i], v[i], s_lr, s); });
}

//! dst = src over n floats (a weight version saved for stashing).
inline void copy_buffer(const HostContext& ctx, const float* XPIPE_RESTRICT src,
                        float* XPIPE_RESTRICT dst, index_t n) {
  for_each_index(ctx, n, [=](index_t i) { dst[i] = src[i]; });
}

}  // namespace xpipe
