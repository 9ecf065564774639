// cuBLASLt plans for one stage's stream: the Linear layer's GEMMs with epilogues (bias, bias +
// ReLU, bias gradient), one plan per shape, made once and reused.
#pragma once

#if !defined(__CUDACC__)
#error "xpipe/backend/cuda/lt_plans.cuh is for CUDA translation units (nvcc); link xpipe::cuda"
#endif

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "xpipe/backend/cuda/check.cuh"

namespace xpipe {

//! cuBLASLt for one stage's stream: its handle, a workspace, and one matmul plan (descriptor,
//! layouts, algorithm) per GEMM shape run with an epilogue, made the first time a shape comes
//! (the first mini-batch) and reused after; nothing is created or allocated on later calls. A
//! shape for which cuBLASLt offers no algorithm is remembered as such and runs as plain GEMM +
//! kernels from then on. Used by one host thread at a time (the stage's), like the stream.
//! Usage: CudaStreamContext makes one per stream (CudaContext::lt); kernels/cuda/linear.cuh calls
//! `ctx.lt->matmul(key, a, b, d, bias, ctx.stream)` and falls back when it returns false.
class CudaLtPlans {
 public:
  static constexpr std::size_t workspace_bytes = std::size_t{4} << 20;

  //! Whether a forward takes the bias (Linear) or bias + ReLU (Dense) epilogue; the weight
  //! gradient's bias-gradient epilogue is taken either way. Off by default, from measurement: on
  //! an H200 at the MLP's batch-128 shapes, every algorithm cuBLASLt offered with the bias
  //! epilogue was slower than cublasSgemm + the bias kernel, while the bias-gradient epilogue
  //! beat GEMM + column sums on the 1024-wide layers (`bench_gpu --gemm-detail`; the numbers are
  //! in docs/results.md, "GPU benchmarks"). Turn on where `--gemm-detail` says the forward
  //! epilogue wins. Usage: `ctx.lt->forward_epilogues = true;` (read at each forward).
  bool forward_epilogues = false;

  //! What a plan is for: a column-major D (m x n) = op(A) op(B) (+ D when accumulating), with
  //! one epilogue, and the alignment of every operand (cuBLASLt picks algorithms by it).
  struct Key {
    std::int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldd = 0;
    bool trans_a = false, trans_b = false, accumulate = false;
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    std::uint32_t align_a = 0, align_b = 0, align_d = 0, align_bias = 0;
    bool operator==(const Key&) const = default;
  };

  CudaLtPlans() {
    XPIPE_CUBLAS_CHECK(cublasLtCreate(&handle_));
    XPIPE_CUDA_CHECK(cudaGetDevice(&device_));
    XPIPE_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes));
  }
  CudaLtPlans(const CudaLtPlans&) = delete;
  CudaLtPlans& operator=(const CudaLtPlans&) = delete;
  ~CudaLtPlans() {
    for (Plan& p : plans_) p.release();
    (void)cudaSetDevice(device_);
    cudaFree(workspace_);
    cublasLtDestroy(handle_);
  }

  //! Runs D = op(A) op(B) + (accumulate ? D : 0) with key.epilogue on `stream`; `vector` is the
  //! epilogue's (read for BIAS and RELU_BIAS, written for BGRADA/BGRADB). False, having run
  //! nothing, when cuBLASLt has no algorithm for the key: the caller then runs its plain path.
  bool matmul(const Key& key, const float* a, const float* b, float* d, const void* vector,
              cudaStream_t stream) {
    Plan* p = find(key, vector);
    if (p == nullptr || !p->usable) return false;
    const void* bias_ptr = vector;
    XPIPE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                      &bias_ptr, sizeof(bias_ptr)));
    const float alpha = 1.f, beta = key.accumulate ? 1.f : 0.f;
    XPIPE_CUBLAS_CHECK(cublasLtMatmul(handle_, p->desc, &alpha, a, p->a, b, p->b, &beta, d, p->d, d,
                                      p->d, &p->algo, workspace_, workspace_bytes, stream));
    for (auto& [epilogue, calls] : fused_by_epilogue_)
      if (epilogue == key.epilogue || calls == 0) {
        epilogue = key.epilogue;
        ++calls;
        break;
      }
    return true;
  }

  //! GEMMs that ran with their epilogue (the others fell back to GEMM + kernels).
  long fused_calls() const {
    long n = 0;
    for (const auto& [epilogue, calls] : fused_by_epilogue_) n += calls;
    return n;
  }
  //! Those that ran with epilogue e. Usage: `lt.fused_calls(CUBLASLT_EPILOGUE_RELU_BIAS)`.
  long fused_calls(cublasLtEpilogue_t e) const {
    for (const auto& [epilogue, calls] : fused_by_epilogue_)
      if (epilogue == e && calls > 0) return calls;
    return 0;
  }

  //! The largest power of two (up to 256) dividing the address: what cuBLASLt may assume of it.
  static std::uint32_t alignment(const void* p) {
    const auto v = reinterpret_cast<std::uintptr_t>(p);
    std::uint32_t a = 256;
    while (a > 1 && v % a != 0) a /= 2;
    return a;
  }

 private:
  struct Plan {
    Key key;
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool usable = false;
    void release() {
      if (d) cublasLtMatrixLayoutDestroy(d);
      if (b) cublasLtMatrixLayoutDestroy(b);
      if (a) cublasLtMatrixLayoutDestroy(a);
      if (desc) cublasLtMatmulDescDestroy(desc);
    }
  };

  // A plan lives as long as the object; the vector grows only when a new shape comes, and the
  // pointer returned is used only within the call that asked for it.
  Plan* find(const Key& key, const void* vector) {
    for (Plan& p : plans_)
      if (p.key == key) return &p;
    Plan& p = plans_.emplace_back();
    p.key = key;
    // FP32 in, FP32 accumulation, no TF32 (that takes CUBLAS_COMPUTE_32F_FAST_TF32): results
    // within the host comparison's tolerance. Not the _PEDANTIC type of the plain path's handle:
    // the epilogues are documented for CUBLAS_COMPUTE_32F; bits are reproducible run to run as
    // long as the heuristic picks the same algorithm (one plan per shape keeps it).
    XPIPE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t tb = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    XPIPE_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    XPIPE_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    XPIPE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                      &key.epilogue, sizeof(key.epilogue)));
    const void* bias_ptr = vector;  // the heuristic reads its alignment
    XPIPE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                      &bias_ptr, sizeof(bias_ptr)));
    // Stored shapes (before op): A is m x k or k x m, B k x n or n x k, column-major.
    XPIPE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_32F, key.trans_a ? key.k : key.m,
                                                  key.trans_a ? key.m : key.k, key.lda));
    XPIPE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_32F, key.trans_b ? key.n : key.k,
                                                  key.trans_b ? key.k : key.n, key.ldb));
    XPIPE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, CUDA_R_32F, key.m, key.n, key.ldd));
    cublasLtMatmulPreference_t pref = nullptr;
    XPIPE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const std::uint64_t ws = workspace_bytes;
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, std::uint32_t> aligns[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_d},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d}};
    for (const auto& [attr, value] : aligns)
      if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.d, p.d, pref, 1, &result,
                                          &found);
    cublasLtMatmulPreferenceDestroy(pref);
    // NOT_SUPPORTED or INVALID_VALUE (an epilogue, type or layout cuBLASLt refuses here) is an
    // answer, not an error: the plain path can always run. A broken library state is an error.
    if (st == CUBLAS_STATUS_NOT_INITIALIZED || st == CUBLAS_STATUS_ALLOC_FAILED)
      XPIPE_CUBLAS_CHECK(st);
    p.usable = st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS &&
               result.workspaceSize <= workspace_bytes;
    if (p.usable) p.algo = result.algo;
    return &p;
  }

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  int device_ = 0;
  std::vector<Plan> plans_;
  // Calls per epilogue, in the order first used (three are used: BIAS, RELU_BIAS, BGRADA).
  std::array<std::pair<cublasLtEpilogue_t, long>, 8> fused_by_epilogue_{};
};

}  // namespace xpipe
