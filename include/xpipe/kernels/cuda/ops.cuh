// CUDA launchers of the shared per-element math (the same functions the host launchers in
// kernels/host_ops.hpp loop over). Each is a lambda that indexes and calls; no math here.
#pragma once

#include <cstdint>

#include "xpipe/backend/cuda.cuh"
#include "xpipe/core/tensor.hpp"
#include "xpipe/kernels/activation.hpp"
#include "xpipe/kernels/optim.hpp"
#include "xpipe/kernels/softmax_xent.hpp"

namespace xpipe {

template <class Act>
void bias_activation_forward(const CudaContext& ctx, ConstMatrix z, const float* bias, Matrix y) {
  const index_t cols = z.cols;
  for_each_index(ctx, z.rows * cols, [=] __device__(index_t i) {
    const index_t r = i / cols, c = i - r * cols;
    y(r, c) = math::bias_activation<Act>(z(r, c), bias[c]);
  });
}

template <class Act>
void activation_forward(const CudaContext& ctx, ConstMatrix x, Matrix y) {
  const index_t cols = x.cols;
  for_each_index(ctx, x.rows * cols, [=] __device__(index_t i) {
    const index_t r = i / cols, c = i - r * cols;
    y(r, c) = Act::forward(x(r, c));
  });
}

template <class Act>
void activation_backward(const CudaContext& ctx, ConstMatrix x, ConstMatrix y, ConstMatrix dy,
                         Matrix dx) {
  const index_t cols = x.cols;
  for_each_index(ctx, x.rows * cols, [=] __device__(index_t i) {
    const index_t r = i / cols, c = i - r * cols;
    dx(r, c) = Act::backward(x(r, c), y(r, c), dy(r, c));
  });
}

//! One thread per column, rows summed in order 0..rows-1 as on the host: same summation order.
inline void bias_grad(const CudaContext& ctx, ConstMatrix dy, float* db, bool accumulate) {
  for_each_index(ctx, dy.cols, [=] __device__(index_t c) {
    float s = accumulate ? db[c] : 0.f;
    for (index_t r = 0; r < dy.rows; ++r) s += dy(r, c);
    db[c] = s;
  });
}

//! One thread per row (rows are short: the classes).
inline void softmax_xent(const CudaContext& ctx, ConstMatrix logits, const std::int32_t* labels,
                         float scale, Matrix grad, float* row_loss) {
  for_each_index(ctx, logits.rows, [=] __device__(index_t r) {
    row_loss[r] = math::softmax_xent_row(logits.row(r), logits.cols, labels[r], scale, grad.row(r));
  });
}

inline void argmax_rows(const CudaContext& ctx, ConstMatrix logits, std::int32_t* predicted) {
  for_each_index(ctx, logits.rows, [=] __device__(index_t r) {
    predicted[r] = math::argmax_row(logits.row(r), logits.cols);
  });
}

inline void sgd_step(const CudaContext& ctx, float* w, const float* g, float* m, index_t n,
                     const math::SgdScalars& s) {
  for_each_index(ctx, n, [=] __device__(index_t i) { math::sgd_update(w[i], g[i], m[i], s); });
}

inline void adam_step(const CudaContext& ctx, float* w, const float* g, float* m, float* v,
                      index_t n, const math::AdamScalars& s) {
  for_each_index(ctx, n,
                 [=] __device__(index_t i) { math::adam_update(w[i], g[i], m[i], v[i], s); });
}

inline void sgd_direction(const CudaContext& ctx, const float* m, float* d, index_t n) {
  for_each_index(ctx, n, [=] __device__(index_t i) { d[i] = math::sgd_direction(m[i]); });
}

inline void adam_direction(const CudaContext& ctx, const float* m, const float* v, float* d,
                           index_t n, const math::AdamScalars& s) {
  for_each_index(ctx, n,
                 [=] __device__(index_t i) { d[i] = math::adam_direction(m[i], v[i], s); });
}

inline void sgd_predict(const CudaContext& ctx, const float* w, const float* m, float* out,
                        index_t n, float s_lr) {
  for_each_index(ctx, n,
                 [=] __device__(index_t i) { out[i] = math::sgd_predict(w[i], m[i], s_lr); });
}

inline void adam_predict(const CudaContext& ctx, const float* w, const float* m, const float* v,
                         float* out, index_t n, float s_lr, const math::AdamScalars& s) {
  for_each_index(ctx, n, [=] __device__(index_t i) {
    out[i] = math::adam_predict(w[i], m[i], v[i], s_lr, s);
  });
}

inline void copy_buffer(const CudaContext& ctx, const float* src, float* dst, index_t n) {
  XPIPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * sizeof(float),
                                   cudaMemcpyDeviceToDevice, ctx.stream));
}

}  // namespace xpipe
