// Every kernel launcher, written once for all backends: each hands its backend's element loop
// (for_each_index / for_each_element, chosen by the context type; BatchNorm's image passes in
// kernels/batchnorm.hpp run for_each_pixel) a function object that only
// indexes and calls a shared per-element function from kernels/*.hpp. Builds with g++ and nvcc.
// Over 400 lines on purpose: every launcher and its function object (with the quad forms of the
// memory-bound passes) in one list, so a backend author sees all that its loops must run.
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
// backend/cuda.cuh) picks the CUDA kernels'. Each launcher hands the loop a named function object
// (CUB's style), not a lambda: its XPIPE_HOST_DEVICE operator() runs in the host loop and in a
// CUDA kernel alike, and under nvcc the host compiler inlines and vectorises it as g++ does. An
// extended __host__ __device__ lambda would not be: nvcc wraps it in host code in a heap-allocated
// closure called through a function pointer, so every CUDA launch allocated and a host launcher in
// a .cu file ran unvectorised (bias + ReLU 25x slower than from g++).

namespace xpipe {

//! The per-element function objects of the launchers below: each holds its pointers and scalars,
//! indexes, and calls one shared function of kernels/*.hpp, which holds all the math. Trivially
//! copyable, so a CUDA kernel takes one by value.
namespace ops {

//! Four floats read or written as one 128-bit access: the quad form of the memory-bound passes
//! below (backend/cuda/loops.cuh runs it where the pointers allow; elements i..i+3, i at a
//! 16-byte boundary of every array). Each lane goes through the same per-element math.
struct alignas(16) Quad {
  float lane[4];
};
XPIPE_HOST_DEVICE Quad load_quad(const float* p, index_t i) {
  return *reinterpret_cast<const Quad*>(p + i);
}
XPIPE_HOST_DEVICE void store_quad(float* p, index_t i, const Quad& q) {
  *reinterpret_cast<Quad*>(p + i) = q;
}

//! y(r, c) = Act(z(r, c) + bias[c]).
template <class Act>
struct BiasActivationForward {
  ConstMatrix z;
  const float* bias;
  Matrix y;
  XPIPE_HOST_DEVICE void operator()(index_t r, index_t c) const {
    y(r, c) = math::bias_activation<Act>(z(r, c), bias[c]);
  }
};

//! y(r, c) = Act(x(r, c)).
template <class Act>
struct ActivationForward {
  ConstMatrix x;
  Matrix y;
  XPIPE_HOST_DEVICE void operator()(index_t r, index_t c) const { y(r, c) = Act::forward(x(r, c)); }
};

//! dx(r, c) = Act'(x(r, c)) * dy(r, c).
template <class Act>
struct ActivationBackward {
  ConstMatrix x, y, dy;
  Matrix dx;
  XPIPE_HOST_DEVICE void operator()(index_t r, index_t c) const {
    dx(r, c) = Act::backward(x(r, c), y(r, c), dy(r, c));
  }
};

//! dz(r, c) = Act'(y(r, c)) * dy(r, c), the gradient taken from the output y alone.
template <class Act>
struct ActivationBackwardFromOutput {
  ConstMatrix y, dy;
  Matrix dz;
  XPIPE_HOST_DEVICE void operator()(index_t r, index_t c) const {
    dz(r, c) = Act::backward_from_output(y(r, c), dy(r, c));
  }
};

//! db (+)= the column sums of dy over column block b of Width columns.
template <index_t Width>
struct ColumnSums {
  ConstMatrix dy;
  float* db;
  bool accumulate;
  XPIPE_HOST_DEVICE void operator()(index_t b) const {
    math::column_sums<Width>(dy, b, db, accumulate);
  }
};

//! row_loss[r] and grad row r of softmax cross-entropy over logits row r.
struct SoftmaxXentRow {
  ConstMatrix logits;
  const std::int32_t* labels;
  float scale;
  Matrix grad;
  float* row_loss;
  XPIPE_HOST_DEVICE void operator()(index_t r) const {
    row_loss[r] = math::softmax_xent_row(logits.row(r), logits.cols, labels[r], scale, grad.row(r));
  }
};

//! predicted[r] = argmax of logits row r.
struct ArgmaxRow {
  ConstMatrix logits;
  std::int32_t* predicted;
  XPIPE_HOST_DEVICE void operator()(index_t r) const {
    predicted[r] = math::argmax_row(logits.row(r), logits.cols);
  }
};

// XPIPE_RESTRICT members carry the flat-buffer passes' promise that their buffers never overlap.
// g++ 12 does not need it: it vectorises these loops behind one run-time overlap check per range.

//! One SGD update of weight i.
struct SgdStep {
  float* XPIPE_RESTRICT w;
  const float* XPIPE_RESTRICT g;
  float* XPIPE_RESTRICT m;
  math::SgdScalars s;
  XPIPE_HOST_DEVICE void operator()(index_t i) const { math::sgd_update(w[i], g[i], m[i], s); }
  // The quad form (Quad above): the arrays it streams, and four elements at once.
  static constexpr int streams = 3;
  void pointers(const void* (&p)[streams]) const { p[0] = w, p[1] = g, p[2] = m; }
  XPIPE_HOST_DEVICE void quad(index_t i) const {
    Quad w4 = load_quad(w, i), m4 = load_quad(m, i);
    const Quad g4 = load_quad(g, i);
    for (int k = 0; k < 4; ++k) math::sgd_update(w4.lane[k], g4.lane[k], m4.lane[k], s);
    store_quad(w, i, w4), store_quad(m, i, m4);
  }
};

//! One Adam/AdamW update of weight i.
struct AdamStep {
  float* XPIPE_RESTRICT w;
  const float* XPIPE_RESTRICT g;
  float* XPIPE_RESTRICT m;
  float* XPIPE_RESTRICT v;
  math::AdamScalars s;
  XPIPE_HOST_DEVICE void operator()(index_t i) const {
    math::adam_update(w[i], g[i], m[i], v[i], s);
  }
  // The quad form (Quad above).
  static constexpr int streams = 4;
  void pointers(const void* (&p)[streams]) const { p[0] = w, p[1] = g, p[2] = m, p[3] = v; }
  XPIPE_HOST_DEVICE void quad(index_t i) const {
    Quad w4 = load_quad(w, i), m4 = load_quad(m, i), v4 = load_quad(v, i);
    const Quad g4 = load_quad(g, i);
    for (int k = 0; k < 4; ++k)
      math::adam_update(w4.lane[k], g4.lane[k], m4.lane[k], v4.lane[k], s);
    store_quad(w, i, w4), store_quad(m, i, m4), store_quad(v, i, v4);
  }
};

//! d[i] = SGD's update direction.
struct SgdDirection {
  const float* XPIPE_RESTRICT m;
  float* XPIPE_RESTRICT d;
  XPIPE_HOST_DEVICE void operator()(index_t i) const { d[i] = math::sgd_direction(m[i]); }
};

//! d[i] = Adam's update direction.
struct AdamDirection {
  const float* XPIPE_RESTRICT m;
  const float* XPIPE_RESTRICT v;
  float* XPIPE_RESTRICT d;
  math::AdamScalars s;
  XPIPE_HOST_DEVICE void operator()(index_t i) const { d[i] = math::adam_direction(m[i], v[i], s); }
  // The quad form (Quad above).
  static constexpr int streams = 3;
  void pointers(const void* (&p)[streams]) const { p[0] = m, p[1] = v, p[2] = d; }
  XPIPE_HOST_DEVICE void quad(index_t i) const {
    const Quad m4 = load_quad(m, i), v4 = load_quad(v, i);
    Quad d4;
    for (int k = 0; k < 4; ++k) d4.lane[k] = math::adam_direction(m4.lane[k], v4.lane[k], s);
    store_quad(d, i, d4);
  }
};

//! out[i] = SGD's prediction of weight i.
struct SgdPredict {
  const float* XPIPE_RESTRICT w;
  const float* XPIPE_RESTRICT m;
  float* XPIPE_RESTRICT out;
  float s_lr;
  XPIPE_HOST_DEVICE void operator()(index_t i) const {
    out[i] = math::sgd_predict(w[i], m[i], s_lr);
  }
  // The quad form (Quad above).
  static constexpr int streams = 3;
  void pointers(const void* (&p)[streams]) const { p[0] = w, p[1] = m, p[2] = out; }
  XPIPE_HOST_DEVICE void quad(index_t i) const {
    const Quad w4 = load_quad(w, i), m4 = load_quad(m, i);
    Quad o4;
    for (int k = 0; k < 4; ++k) o4.lane[k] = math::sgd_predict(w4.lane[k], m4.lane[k], s_lr);
    store_quad(out, i, o4);
  }
};

//! out[i] = Adam's prediction of weight i.
struct AdamPredict {
  const float* XPIPE_RESTRICT w;
  const float* XPIPE_RESTRICT m;
  const float* XPIPE_RESTRICT v;
  float* XPIPE_RESTRICT out;
  float s_lr;
  math::AdamScalars s;
  XPIPE_HOST_DEVICE void operator()(index_t i) const {
    out[i] = math::adam_predict(w[i], m[i], v[i], s_lr, s);
  }
  // The quad form (Quad above).
  static constexpr int streams = 4;
  void pointers(const void* (&p)[streams]) const { p[0] = w, p[1] = m, p[2] = v, p[3] = out; }
  XPIPE_HOST_DEVICE void quad(index_t i) const {
    const Quad w4 = load_quad(w, i), m4 = load_quad(m, i), v4 = load_quad(v, i);
    Quad o4;
    for (int k = 0; k < 4; ++k)
      o4.lane[k] = math::adam_predict(w4.lane[k], m4.lane[k], v4.lane[k], s_lr, s);
    store_quad(out, i, o4);
  }
};

//! One NAdam/NAdamW update of weight i.
struct NadamStep {
  float* XPIPE_RESTRICT w;
  const float* XPIPE_RESTRICT g;
  float* XPIPE_RESTRICT m;
  float* XPIPE_RESTRICT v;
  math::NadamScalars s;
  XPIPE_HOST_DEVICE void operator()(index_t i) const {
    math::nadam_update(w[i], g[i], m[i], v[i], s);
  }
  // The quad form (Quad above).
  static constexpr int streams = 4;
  void pointers(const void* (&p)[streams]) const { p[0] = w, p[1] = g, p[2] = m, p[3] = v; }
  XPIPE_HOST_DEVICE void quad(index_t i) const {
    Quad w4 = load_quad(w, i), m4 = load_quad(m, i), v4 = load_quad(v, i);
    const Quad g4 = load_quad(g, i);
    for (int k = 0; k < 4; ++k)
      math::nadam_update(w4.lane[k], g4.lane[k], m4.lane[k], v4.lane[k], s);
    store_quad(w, i, w4), store_quad(m, i, m4), store_quad(v, i, v4);
  }
};

//! out[i] = w[i] - s_lr * NAdam's direction (d = direction itself when w is null).
struct NadamPredict {
  const float* XPIPE_RESTRICT w;
  const float* XPIPE_RESTRICT m;
  const float* XPIPE_RESTRICT v;
  float* XPIPE_RESTRICT out;
  float s_lr;
  math::NadamScalars s;
  XPIPE_HOST_DEVICE void operator()(index_t i) const {
    const float d = math::nadam_direction(m[i], v[i], s);
    out[i] = w ? w[i] - s_lr * d : d;
  }
};

//! out[i] = sum over j < terms of c[j] x[j][i] (up to 4 buffers; out may alias none of them).
struct Combine {
  const float* x[4];
  float c[4];
  int terms;
  float* XPIPE_RESTRICT out;
  XPIPE_HOST_DEVICE void operator()(index_t i) const {
    float acc = 0.f;
    for (int j = 0; j < terms; ++j) acc += c[j] * x[j][i];
    out[i] = acc;
  }
};

//! x[i] *= factor.
struct Scale {
  float* XPIPE_RESTRICT x;
  float factor;
  XPIPE_HOST_DEVICE void operator()(index_t i) const { x[i] *= factor; }
};

//! Global clipping on a device, once per step and stage (one index): *factor = math::clip_factor
//! of the stages' squared norms squared[0..stages) (math::stages_squared_norm, as the host's).
struct ClipFactor {
  const double* XPIPE_RESTRICT squared;
  int stages;
  float bound;
  double* XPIPE_RESTRICT factor;
  XPIPE_HOST_DEVICE void operator()(index_t) const {
    *factor = math::clip_factor(math::stages_squared_norm(squared, stages), bound);
  }
};

//! Then per gradient element: g[i] *= *factor where it is below 1 (the host's
//! StageProgram::step, the same bits).
struct ScaleBelowOne {
  float* XPIPE_RESTRICT g;
  const double* XPIPE_RESTRICT factor;
  XPIPE_HOST_DEVICE void operator()(index_t i) const {
    const double f = *factor;
    if (f < 1.0) g[i] *= static_cast<float>(f);
  }
};

//! Error feedback after a delayed step, per weight (math::error_feedback).
struct ErrorFeedback {
  float* XPIPE_RESTRICT w;
  const float* XPIPE_RESTRICT before;
  float* XPIPE_RESTRICT d_prev;
  float gamma;
  XPIPE_HOST_DEVICE void operator()(index_t i) const {
    math::error_feedback(w[i], before[i], d_prev[i], gamma);
  }
};

//! PipeMare's velocity of weight i (math::velocity_update).
struct VelocityUpdate {
  float* XPIPE_RESTRICT delta;
  const float* XPIPE_RESTRICT w;
  const float* XPIPE_RESTRICT before;
  float gamma;
  XPIPE_HOST_DEVICE void operator()(index_t i) const {
    math::velocity_update(delta[i], w[i], before[i], gamma);
  }
};

//! y += a x per element (x and y distinct).
struct AddScaled {
  float* XPIPE_RESTRICT y;
  const float* XPIPE_RESTRICT x;
  float a;
  XPIPE_HOST_DEVICE void operator()(index_t i) const { y[i] += a * x[i]; }
};

//! DC-ASGD's correction of gradient i (math::delay_compensation, or its adaptive form where ms
//! is given).
struct DelayCompensation {
  float* XPIPE_RESTRICT g;
  float* XPIPE_RESTRICT ms;  // nullptr: the constant form
  const float* XPIPE_RESTRICT w;
  const float* XPIPE_RESTRICT w_bak;
  float lambda, m;
  XPIPE_HOST_DEVICE void operator()(index_t i) const {
    if (ms)
      math::delay_compensation_adaptive(g[i], ms[i], w[i], w_bak[i], lambda, m);
    else
      math::delay_compensation(g[i], w[i], w_bak[i], lambda);
  }
};

}  // namespace ops

//! y[r][c] = Act(z[r][c] + bias[c]); y may alias z.
//! Usage: `bias_activation_forward<math::Relu>(ctx, z, bias, y);`
template <class Act, class Ctx>
void bias_activation_forward(const Ctx& ctx, ConstMatrix z, const float* bias, Matrix y) {
  for_each_element(ctx, z.rows, z.cols, ops::BiasActivationForward<Act>{z, bias, y});
}

//! Element-wise activation y = Act(x); y may alias x.
template <class Act, class Ctx>
void activation_forward(const Ctx& ctx, ConstMatrix x, Matrix y) {
  for_each_element(ctx, x.rows, x.cols, ops::ActivationForward<Act>{x, y});
}

//! dx = Act'(x) * dy, given the layer's input x and output y; dx may alias dy.
template <class Act, class Ctx>
void activation_backward(const Ctx& ctx, ConstMatrix x, ConstMatrix y, ConstMatrix dy, Matrix dx) {
  for_each_element(ctx, x.rows, x.cols, ops::ActivationBackward<Act>{x, y, dy, dx});
}

//! dz = Act'(y) * dy from the activation's output y (math::OutputDifferentiable); dz may alias dy.
template <class Act, class Ctx>
void activation_backward_from_output(const Ctx& ctx, ConstMatrix y, ConstMatrix dy, Matrix dz) {
  for_each_element(ctx, y.rows, y.cols, ops::ActivationBackwardFromOutput<Act>{y, dy, dz});
}

//! db[c] (+)= sum over rows of dy[r][c], rows summed in order 0..rows-1 for every column, so the
//! bits do not depend on the thread count. `accumulate` adds to db instead of overwriting it.
//! One index per block of the backend's column_block columns (a wide row segment per CPU
//! iteration, one column per GPU thread); `work` lets the host fork on the matrix's size.
template <class Ctx>
void bias_grad(const Ctx& ctx, ConstMatrix dy, float* db, bool accumulate) {
  constexpr index_t width = Ctx::backend::column_block;
  const index_t blocks = (dy.cols + width - 1) / width;
  for_each_index(ctx, blocks, dy.rows * dy.cols, ops::ColumnSums<width>{dy, db, accumulate});
}

//! y = Act(x W + b), a Linear (Act = identity) or Dense layer's forward: W is x.cols x y.cols
//! row-major (leading dimension y.cols), b has y.cols entries. A GEMM, then one pass adding the
//! bias and applying Act; on CUDA one cuBLASLt call with the bias (+ ReLU) epilogue can do both
//! (kernels/cuda/linear.cuh; off unless CudaLtPlans::forward_epilogues).
//! Usage: `linear_forward(ctx, x, w, b, y);`, `linear_forward<math::Relu>(ctx, x, w, b, y);`
template <class Act = math::Identity, class Ctx>
void linear_forward(const Ctx& ctx, ConstMatrix x, const float* w, const float* b, Matrix y) {
  gemm(ctx, Trans::No, Trans::No, x.rows, y.cols, x.cols, 1.f, x.data, x.ld, w, y.cols, 0.f, y.data,
       y.ld);
  bias_activation_forward<Act>(ctx, y, b, y);
}

//! dW (+)= x^T dy and db (+)= the column sums of dy: a Linear layer's parameter gradients (dW
//! x.cols x dy.cols row-major). A GEMM, then the ordered column sums (bias_grad); on CUDA, when
//! not accumulating, one cuBLASLt call with the bias-gradient epilogue does both.
template <class Ctx>
void linear_param_grads(const Ctx& ctx, ConstMatrix x, ConstMatrix dy, float* dw, float* db,
                        bool accumulate) {
  gemm(ctx, Trans::Yes, Trans::No, x.cols, dy.cols, x.rows, 1.f, x.data, x.ld, dy.data, dy.ld,
       accumulate ? 1.f : 0.f, dw, dy.cols);
  bias_grad(ctx, dy, db, accumulate);
}

//! Softmax cross-entropy over rows: grad = (softmax - onehot) * scale, row_loss[r] = -log p[label].
//! One row per index: rows are short (the classes), so a loop step or a GPU thread takes one.
template <class Ctx>
void softmax_xent(const Ctx& ctx, ConstMatrix logits, const std::int32_t* labels, float scale,
                  Matrix grad, float* row_loss) {
  for_each_index(ctx, logits.rows, ops::SoftmaxXentRow{logits, labels, scale, grad, row_loss});
}

//! predicted[r] = argmax of logits row r.
template <class Ctx>
void argmax_rows(const Ctx& ctx, ConstMatrix logits, std::int32_t* predicted) {
  for_each_index(ctx, logits.rows, ops::ArgmaxRow{logits, predicted});
}

//! One fused SGD pass over a stage's flat buffers.
template <class Ctx>
void sgd_step(const Ctx& ctx, float* XPIPE_RESTRICT w, const float* XPIPE_RESTRICT g,
              float* XPIPE_RESTRICT m, index_t n, const math::SgdScalars& s) {
  for_each_index(ctx, n, ops::SgdStep{w, g, m, s});
}

//! One fused Adam/AdamW pass over a stage's flat buffers.
template <class Ctx>
void adam_step(const Ctx& ctx, float* XPIPE_RESTRICT w, const float* XPIPE_RESTRICT g,
               float* XPIPE_RESTRICT m, float* XPIPE_RESTRICT v, index_t n,
               const math::AdamScalars& s) {
  for_each_index(ctx, n, ops::AdamStep{w, g, m, v, s});
}

//! d = SGD's update direction (the momentum buffer).
template <class Ctx>
void sgd_direction(const Ctx& ctx, const float* XPIPE_RESTRICT m, float* XPIPE_RESTRICT d,
                   index_t n) {
  for_each_index(ctx, n, ops::SgdDirection{m, d});
}

//! d = Adam's update direction m_hat / (sqrt(v_hat) + eps).
template <class Ctx>
void adam_direction(const Ctx& ctx, const float* XPIPE_RESTRICT m, const float* XPIPE_RESTRICT v,
                    float* XPIPE_RESTRICT d, index_t n, const math::AdamScalars& s) {
  for_each_index(ctx, n, ops::AdamDirection{m, v, d, s});
}

//! out = w - s_lr * m: the SGD prediction in one pass.
template <class Ctx>
void sgd_predict(const Ctx& ctx, const float* XPIPE_RESTRICT w, const float* XPIPE_RESTRICT m,
                 float* XPIPE_RESTRICT out, index_t n, float s_lr) {
  for_each_index(ctx, n, ops::SgdPredict{w, m, out, s_lr});
}

//! out = w - s_lr * m_hat / (sqrt(v_hat) + eps): the Adam prediction in one pass.
template <class Ctx>
void adam_predict(const Ctx& ctx, const float* XPIPE_RESTRICT w, const float* XPIPE_RESTRICT m,
                  const float* XPIPE_RESTRICT v, float* XPIPE_RESTRICT out, index_t n, float s_lr,
                  const math::AdamScalars& s) {
  for_each_index(ctx, n, ops::AdamPredict{w, m, v, out, s_lr, s});
}

//! One fused NAdam/NAdamW pass over a stage's flat buffers.
template <class Ctx>
void nadam_step(const Ctx& ctx, float* XPIPE_RESTRICT w, const float* XPIPE_RESTRICT g,
                float* XPIPE_RESTRICT m, float* XPIPE_RESTRICT v, index_t n,
                const math::NadamScalars& s) {
  for_each_index(ctx, n, ops::NadamStep{w, g, m, v, s});
}

//! out = w - s_lr * NAdam's direction; with w null, out = the direction itself.
template <class Ctx>
void nadam_predict(const Ctx& ctx, const float* XPIPE_RESTRICT w, const float* XPIPE_RESTRICT m,
                   const float* XPIPE_RESTRICT v, float* XPIPE_RESTRICT out, index_t n, float s_lr,
                   const math::NadamScalars& s) {
  for_each_index(ctx, n, ops::NadamPredict{w, m, v, out, s_lr, s});
}

//! out = sum of c[j] x[j] over `terms` (1..4) buffers of n floats, one pass.
template <class Ctx>
void combine(const Ctx& ctx, const float* const* x, const float* c, int terms,
             float* XPIPE_RESTRICT out, index_t n) {
  ops::Combine f{{x[0], terms > 1 ? x[1] : x[0], terms > 2 ? x[2] : x[0], terms > 3 ? x[3] : x[0]},
                 {c[0], terms > 1 ? c[1] : 0.f, terms > 2 ? c[2] : 0.f, terms > 3 ? c[3] : 0.f},
                 terms,
                 out};
  for_each_index(ctx, n, f);
}

//! The squared L2 norm of n floats in host memory, in double: four interleaved partial sums
//! (x[i] into partial i mod 4, in index order) added at the end, so the bits depend on x and n
//! alone. One pass, one thread: a stage's gradient, once per step (global clipping).
inline double squared_norm(const float* x, index_t n) {
  double part[4] = {0, 0, 0, 0};
  index_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int j = 0; j < 4; ++j) part[j] += static_cast<double>(x[i + j]) * x[i + j];
  for (int j = 0; i < n; ++i, ++j) part[j] += static_cast<double>(x[i]) * x[i];
  return (part[0] + part[1]) + (part[2] + part[3]);
}

//! How a reduction of n terms splits into contiguous chunks, one per block of a device's first
//! pass (squared_norm_async on CUDA): a block per `least` terms, at most `max_blocks` (one when n
//! is 0), block b summing terms [b chunk, min(n, (b + 1) chunk)). It depends on n alone, so the
//! sum's order is the same on every run. Usage: `const ReduceSplit s = reduce_split(n, 2048, 512);`
struct ReduceSplit {
  int blocks;
  index_t chunk;
};
XPIPE_HOST_DEVICE constexpr ReduceSplit reduce_split(index_t n, index_t least, int max_blocks) {
  const index_t wanted = n > 0 ? (n + least - 1) / least : 1;
  const int blocks = wanted < max_blocks ? static_cast<int>(wanted) : max_blocks;
  return {blocks, (n + blocks - 1) / blocks};
}

//! x *= factor over n floats.
template <class Ctx>
void scale_buffer(const Ctx& ctx, float* XPIPE_RESTRICT x, index_t n, float factor) {
  for_each_index(ctx, n, ops::Scale{x, factor});
}

//! Global clipping's scale of a stage's n-float gradient on a device, enqueued behind the waits
//! for every stage's norm: the factor from the stages' squared norms once, into `factor` (one
//! double of the stage's device: the norms may be another device's), then one pass over g.
//! Usage: `clip_gradient(ctx, grads, n, norms + t * K, K, 1.f, factor);`
template <class Ctx>
void clip_gradient(const Ctx& ctx, float* XPIPE_RESTRICT g, index_t n, const double* squared,
                   int stages, float bound, double* factor) {
  for_each_index(ctx, 1, ops::ClipFactor{squared, stages, bound, factor});
  for_each_index(ctx, n, ops::ScaleBelowOne{g, factor});
}

//! Error feedback after a delayed step over a flat buffer (math::error_feedback).
template <class Ctx>
void error_feedback(const Ctx& ctx, float* XPIPE_RESTRICT w, const float* XPIPE_RESTRICT before,
                    float* XPIPE_RESTRICT d_prev, index_t n, float gamma) {
  for_each_index(ctx, n, ops::ErrorFeedback{w, before, d_prev, gamma});
}

//! PipeMare's velocity over a flat buffer (math::velocity_update).
template <class Ctx>
void velocity_update(const Ctx& ctx, float* XPIPE_RESTRICT delta, const float* XPIPE_RESTRICT w,
                     const float* XPIPE_RESTRICT before, index_t n, float gamma) {
  for_each_index(ctx, n, ops::VelocityUpdate{delta, w, before, gamma});
}

//! y += a x over n floats (x and y distinct buffers).
template <class Ctx>
void add_scaled(const Ctx& ctx, float* XPIPE_RESTRICT y, const float* XPIPE_RESTRICT x, index_t n,
                float a) {
  for_each_index(ctx, n, ops::AddScaled{y, x, a});
}

//! DC-ASGD's delay compensation over a flat gradient g computed on w_bak, applied at w
//! (math::delay_compensation); with ms non-null its adaptive form, ms updated in the same pass.
template <class Ctx>
void delay_compensation(const Ctx& ctx, float* XPIPE_RESTRICT g, float* XPIPE_RESTRICT ms,
                        const float* XPIPE_RESTRICT w, const float* XPIPE_RESTRICT w_bak, index_t n,
                        float lambda, float m) {
  for_each_index(ctx, n, ops::DelayCompensation{g, ms, w, w_bak, lambda, m});
}

// copy_buffer (dst = src) is a backend primitive, next to the element loops in backend/host.hpp
// and backend/cuda.cuh: it has no shared math, and each backend copies best its own way.

}  // namespace xpipe
