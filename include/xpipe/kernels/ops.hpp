// Every kernel launcher, written once for all backends: each hands its backend's element loop
// (for_each_index / for_each_element, chosen by the context type) a lambda that only indexes and
// calls a shared per-element function from kernels/*.hpp. Builds with g++ and under nvcc.
#pragma once

#include <cstdint>

#include "xpipe/backend/backend.hpp"  // the default (host) backend; CUDA's: backend/cuda.cuh
#include "xpipe/core/config.hpp"
#include "xpipe/core/tensor.hpp"
#include "xpipe/kernels/activation.hpp"
#include "xpipe/kernels/column_sums.hpp"
#include "xpipe/kernels/optim.hpp"
#include "xpipe/kernels/softmax_xent.hpp"

// The element loops are found by argument-dependent lookup when a launcher is instantiated: a
// HostContext picks backend/host.hpp's, a CudaContext (in a CUDA translation unit that includes
// backend/cuda.cuh) picks the CUDA kernels'. XPIPE_LAMBDA makes each lambda callable from both.
// Its cost under nvcc: in host code an extended __host__ __device__ lambda becomes a wrapper
// that heap-allocates the closure and calls it through a function pointer. A CUDA launch pays a
// couple of small allocations; a host launcher instantiated in a .cu file is neither inlined nor
// vectorised (Adam pass 3.5x, bias + ReLU 20x slower than from g++): run host work from .cpp.
// XPIPE_RESTRICT on the flat-buffer passes' pointers tells g++ they never overlap (the caller
// promises it), which their vectorisation relies on.

namespace xpipe {

//! y[r][c] = Act(z[r][c] + bias[c]); y may alias z.
//! Usage: `bias_activation_forward<math::Relu>(ctx, z, bias, y);`
template <class Act, class Ctx>
void bias_activation_forward(const Ctx& ctx, ConstMatrix z, const float* bias, Matrix y) {
  for_each_element(ctx, z.rows, z.cols, [=] XPIPE_LAMBDA(index_t r, index_t c) {
    y(r, c) = math::bias_activation<Act>(z(r, c), bias[c]);
  });
}

//! Element-wise activation y = Act(x); y may alias x.
template <class Act, class Ctx>
void activation_forward(const Ctx& ctx, ConstMatrix x, Matrix y) {
  for_each_element(ctx, x.rows, x.cols,
                   [=] XPIPE_LAMBDA(index_t r, index_t c) { y(r, c) = Act::forward(x(r, c)); });
}

//! dx = Act'(x) * dy, given the layer's input x and output y; dx may alias dy.
template <class Act, class Ctx>
void activation_backward(const Ctx& ctx, ConstMatrix x, ConstMatrix y, ConstMatrix dy, Matrix dx) {
  for_each_element(ctx, x.rows, x.cols, [=] XPIPE_LAMBDA(index_t r, index_t c) {
    dx(r, c) = Act::backward(x(r, c), y(r, c), dy(r, c));
  });
}

//! db[c] (+)= sum over rows of dy[r][c], rows summed in order 0..rows-1 for every column, so the
//! bits do not depend on the thread count. `accumulate` adds to db instead of overwriting it.
//! One index per block of the backend's column_block columns (a wide row segment per CPU
//! iteration, one column per GPU thread); `work` lets the host fork on the matrix's size.
template <class Ctx>
void bias_grad(const Ctx& ctx, ConstMatrix dy, float* db, bool accumulate) {
  constexpr index_t width = Ctx::backend::column_block;
  const index_t blocks = (dy.cols + width - 1) / width;
  for_each_index(ctx, blocks, dy.rows * dy.cols,
                 [=] XPIPE_LAMBDA(index_t b) { math::column_sums<width>(dy, b, db, accumulate); });
}

//! Softmax cross-entropy over rows: grad = (softmax - onehot) * scale, row_loss[r] = -log p[label].
//! One row per index: rows are short (the classes), so a loop step or a GPU thread takes one.
template <class Ctx>
void softmax_xent(const Ctx& ctx, ConstMatrix logits, const std::int32_t* labels, float scale,
                  Matrix grad, float* row_loss) {
  for_each_index(ctx, logits.rows, [=] XPIPE_LAMBDA(index_t r) {
    row_loss[r] = math::softmax_xent_row(logits.row(r), logits.cols, labels[r], scale, grad.row(r));
  });
}

//! predicted[r] = argmax of logits row r.
template <class Ctx>
void argmax_rows(const Ctx& ctx, ConstMatrix logits, std::int32_t* predicted) {
  for_each_index(ctx, logits.rows, [=] XPIPE_LAMBDA(index_t r) {
    predicted[r] = math::argmax_row(logits.row(r), logits.cols);
  });
}

//! One fused SGD pass over a stage's flat buffers.
template <class Ctx>
void sgd_step(const Ctx& ctx, float* XPIPE_RESTRICT w, const float* XPIPE_RESTRICT g,
              float* XPIPE_RESTRICT m, index_t n, const math::SgdScalars& s) {
  for_each_index(ctx, n, [=] XPIPE_LAMBDA(index_t i) { math::sgd_update(w[i], g[i], m[i], s); });
}

//! One fused Adam/AdamW pass over a stage's flat buffers.
template <class Ctx>
void adam_step(const Ctx& ctx, float* XPIPE_RESTRICT w, const float* XPIPE_RESTRICT g,
               float* XPIPE_RESTRICT m, float* XPIPE_RESTRICT v, index_t n,
               const math::AdamScalars& s) {
  for_each_index(ctx, n,
                 [=] XPIPE_LAMBDA(index_t i) { math::adam_update(w[i], g[i], m[i], v[i], s); });
}

//! d = SGD's update direction (the momentum buffer).
template <class Ctx>
void sgd_direction(const Ctx& ctx, const float* XPIPE_RESTRICT m, float* XPIPE_RESTRICT d,
                   index_t n) {
  for_each_index(ctx, n, [=] XPIPE_LAMBDA(index_t i) { d[i] = math::sgd_direction(m[i]); });
}

//! d = Adam's update direction m_hat / (sqrt(v_hat) + eps).
template <class Ctx>
void adam_direction(const Ctx& ctx, const float* XPIPE_RESTRICT m, const float* XPIPE_RESTRICT v,
                    float* XPIPE_RESTRICT d, index_t n, const math::AdamScalars& s) {
  for_each_index(ctx, n,
                 [=] XPIPE_LAMBDA(index_t i) { d[i] = math::adam_direction(m[i], v[i], s); });
}

//! out = w - s_lr * m: the SGD prediction in one pass.
template <class Ctx>
void sgd_predict(const Ctx& ctx, const float* XPIPE_RESTRICT w, const float* XPIPE_RESTRICT m,
                 float* XPIPE_RESTRICT out, index_t n, float s_lr) {
  for_each_index(ctx, n,
                 [=] XPIPE_LAMBDA(index_t i) { out[i] = math::sgd_predict(w[i], m[i], s_lr); });
}

//! out = w - s_lr * m_hat / (sqrt(v_hat) + eps): the Adam prediction in one pass.
template <class Ctx>
void adam_predict(const Ctx& ctx, const float* XPIPE_RESTRICT w, const float* XPIPE_RESTRICT m,
                  const float* XPIPE_RESTRICT v, float* XPIPE_RESTRICT out, index_t n, float s_lr,
                  const math::AdamScalars& s) {
  for_each_index(ctx, n, [=] XPIPE_LAMBDA(index_t i) {
    out[i] = math::adam_predict(w[i], m[i], v[i], s_lr, s);
  });
}

// copy_buffer (dst = src) is a backend primitive, next to the element loops in backend/host.hpp
// and backend/cuda.cuh: it has no shared math, and each backend copies best its own way.

}  // namespace xpipe
