// The CUDA backend's GEMM: row-major C = alpha op(A) op(B) + beta C through cuBLAS.
#pragma once

#if !defined(__CUDACC__)
#error "xpipe/backend/cuda/gemm.cuh is for CUDA translation units (nvcc); link xpipe::cuda"
#endif

#include <cublas_v2.h>

#include "xpipe/backend/cuda/check.cuh"
#include "xpipe/backend/cuda/context.cuh"
#include "xpipe/backend/host.hpp"  // Trans

namespace xpipe {

//! C = alpha op(A) op(B) + beta C in row-major terms, through cuBLAS (column-major): the
//! row-major product is the column-major product of the transposes, so operands swap.
inline void gemm(const CudaContext& ctx, Trans ta, Trans tb, index_t m, index_t n, index_t k,
                 float alpha, const float* a, index_t lda, const float* b, index_t ldb, float beta,
                 float* c, index_t ldc) {
  const auto op = [](Trans t) { return t == Trans::No ? CUBLAS_OP_N : CUBLAS_OP_T; };
  XPIPE_CUBLAS_CHECK(cublasSgemm(ctx.blas, op(tb), op(ta), static_cast<int>(n), static_cast<int>(m),
                                 static_cast<int>(k), &alpha, b, static_cast<int>(ldb), a,
                                 static_cast<int>(lda), &beta, c, static_cast<int>(ldc)));
}

}  // namespace xpipe
