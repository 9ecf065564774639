// The Linear and Dense layers' GEMMs on CUDA with cuBLASLt epilogues: the backward's bias
// gradient summed by the weight-gradient GEMM (CUBLASLT_EPILOGUE_BGRADA) when it does not
// accumulate, and, where CudaLtPlans::forward_epilogues is on, the forward's bias (and a Dense
// layer's ReLU) applied by the GEMM itself (CUBLASLT_EPILOGUE_BIAS, _RELU_BIAS). One library call
// instead of a GEMM and a kernel each, taken where measured faster (see forward_epilogues).
// Include through xpipe/xpipe_cuda.cuh.
#pragma once

#if !defined(__CUDACC__)
#error "xpipe/kernels/cuda/linear.cuh is for CUDA translation units (nvcc); link xpipe::cuda"
#endif

#include <type_traits>

#include "xpipe/backend/cuda.cuh"
#include "xpipe/core/tensor.hpp"
#include "xpipe/kernels/ops.hpp"

// Hooked in as overloads of kernels/ops.hpp's linear_forward and linear_param_grads for a
// CudaContext: Linear and Dense find them by argument-dependent lookup (taking a CudaContext,
// they are more specialised than the templates over any context), and fall back to the template
// (GEMM + kernels) where the context has no cuBLASLt plans (CudaContext::lt null) or cuBLASLt
// offers no algorithm for a shape. Every CUDA unit must see these overloads (include
// xpipe/xpipe_cuda.cuh, not backend/cuda.cuh alone), or two units would instantiate Linear
// differently. Results differ from the host's in the last bits (another summation order), as the
// plain cuBLAS GEMM's do; each run of one shape on one GPU takes the same algorithm, so two runs
// agree bitwise.

namespace xpipe {

namespace detail {
// cuBLASLt's FP32 bias epilogue once silently skipped the bias for a one-row D with a larger
// leading dimension (Volta/Turing, CUDA 11); PyTorch still takes it only for sizes above 1 each
// way, and so do these.
inline bool lt_shape_ok(index_t a, index_t b, index_t c) {
  return a > 1 && b > 1 && c > 1;
}

//! The cuBLASLt epilogue that computes Act(z + bias) for a Linear (identity) or Dense (ReLU)
//! layer, or CUBLASLT_EPILOGUE_DEFAULT where there is none that matches our math (GELU: the
//! library's is the tanh approximation, ours the exact erf form).
template <class Act>
constexpr cublasLtEpilogue_t bias_epilogue() {
  if constexpr (std::is_same_v<Act, math::Identity>) return CUBLASLT_EPILOGUE_BIAS;
  if constexpr (std::is_same_v<Act, math::Relu>) return CUBLASLT_EPILOGUE_RELU_BIAS;
  return CUBLASLT_EPILOGUE_DEFAULT;
}
}  // namespace detail

//! y = Act(x W + b) in one cuBLASLt call with the bias (Linear) or bias + ReLU (Dense) epilogue
//! where the plans allow it (CudaLtPlans::forward_epilogues, off by default: slower where
//! measured); else GEMM + one bias-activation kernel.
//! Usage: `linear_forward<math::Relu>(ctx, x, w, b, y);` (Linear and Dense forward; the host's is
//! kernels/ops.hpp's).
template <class Act = math::Identity>
void linear_forward(const CudaContext& ctx, ConstMatrix x, const float* w, const float* b,
                    Matrix y) {
  constexpr cublasLtEpilogue_t epilogue = detail::bias_epilogue<Act>();
  if (epilogue != CUBLASLT_EPILOGUE_DEFAULT && ctx.lt != nullptr && ctx.lt->forward_epilogues &&
      detail::lt_shape_ok(x.rows, x.cols, y.cols)) {
    // Row-major y (rows x Out) = x W is column-major y^T (Out x rows) = W^T x^T: A is W read as
    // column-major Out x In (ld Out), B is x read as column-major In x rows (ld x.ld); the bias
    // runs along D's rows (Out of them).
    CudaLtPlans::Key key;
    key.m = y.cols, key.n = x.rows, key.k = x.cols;
    key.lda = y.cols, key.ldb = x.ld, key.ldd = y.ld;
    key.epilogue = epilogue;
    key.align_a = CudaLtPlans::alignment(w), key.align_b = CudaLtPlans::alignment(x.data);
    key.align_d = CudaLtPlans::alignment(y.data), key.align_bias = CudaLtPlans::alignment(b);
    if (ctx.lt->matmul(key, w, x.data, y.data, b, ctx.stream)) return;
  }
  linear_forward<Act, CudaContext>(ctx, x, w, b, y);
}

//! dW = x^T dy with db = the column sums of dy from the same cuBLASLt call (bias-gradient
//! epilogue) when not accumulating; else (or without an algorithm) GEMM + column-sum kernel.
//! Usage: `linear_param_grads(ctx, x, dy, dw, db, accumulate);` (Linear::backward).
inline void linear_param_grads(const CudaContext& ctx, ConstMatrix x, ConstMatrix dy, float* dw,
                               float* db, bool accumulate) {
  // The epilogue writes db, it cannot add to it: a later micro-batch of the same mini-batch
  // (accumulate) takes the plain path.
  if (ctx.lt != nullptr && !accumulate && detail::lt_shape_ok(x.rows, x.cols, dy.cols)) {
    // Row-major dW (In x Out) = x^T dy is column-major dW^T (Out x In) = dy^T x: A is dy read as
    // column-major Out x rows (ld dy.ld), B is x read as column-major In x rows (ld x.ld) and
    // transposed; k runs over the rows, so BGRADA (A summed over k) is db.
    CudaLtPlans::Key key;
    key.m = dy.cols, key.n = x.cols, key.k = x.rows;
    key.lda = dy.ld, key.ldb = x.ld, key.ldd = dy.cols;
    key.trans_b = true;
    key.epilogue = CUBLASLT_EPILOGUE_BGRADA;
    key.align_a = CudaLtPlans::alignment(dy.data), key.align_b = CudaLtPlans::alignment(x.data);
    key.align_d = CudaLtPlans::alignment(dw), key.align_bias = CudaLtPlans::alignment(db);
    if (ctx.lt->matmul(key, dy.data, x.data, dw, db, ctx.stream)) return;
  }
  linear_param_grads<CudaContext>(ctx, x, dy, dw, db, accumulate);
}

}  // namespace xpipe
