// The host backend: its tag, execution context, parallel element loop and the oneDNN GEMM binding.
#pragma once

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <string>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "xpipe/core/buffer.hpp"
#include "xpipe/core/config.hpp"
#include "xpipe/core/error.hpp"

namespace xpipe {

struct Host;

//! Execution context of the host backend: how many threads one compute call may use.
//! Every compute call takes its backend's context, so executors decide placement, not kernels.
//! Usage: `HostContext ctx{.threads = 2};`
struct HostContext {
  using backend = Host;
  int threads = 1;
};

//! Host backend tag: 64-byte-aligned host buffers, OpenMP element loops, oneDNN GEMM.
struct Host {
  using Context = HostContext;
  template <class T>
  using Buffer = HostBuffer<T>;
  static constexpr const char* name = "host";
};

//! Below this many elements a pass stays on the calling thread: forking costs more than it saves.
inline constexpr index_t host_parallel_grain = 1 << 15;

namespace detail {
inline unsigned read_fp_mode() {
#if defined(__SSE__)
  return _mm_getcsr();
#else
  return 0;
#endif
}
inline void write_fp_mode(unsigned mode) {
#if defined(__SSE__)
  _mm_setcsr(mode);
#else
  (void)mode;
#endif
}
}  // namespace detail

//! Calls f(i) for i in [0, n), on ctx.threads threads when `work` (elements touched) is large
//! enough to pay for the fork. Helper threads adopt the caller's floating-point mode (flush-to-
//! zero), so the bits never depend on which thread computed an element.
template <class F>
void parallel_for(const HostContext& ctx, index_t n, index_t work, F f) {
  if (ctx.threads > 1 && work >= host_parallel_grain && n > 1) {
    const unsigned mode = detail::read_fp_mode();
#pragma omp parallel num_threads(ctx.threads)
    {
      detail::write_fp_mode(mode);
#pragma omp for schedule(static)
      for (index_t i = 0; i < n; ++i) f(i);
    }
  } else {
    for (index_t i = 0; i < n; ++i) f(i);
  }
}

//! Calls f(i) for each element index of a flat buffer of n elements (see parallel_for).
template <class F>
void for_each_index(const HostContext& ctx, index_t n, F f) {
  // Contiguous chunks of 4096 keep each thread's inner loop vectorised.
  constexpr index_t chunk = 4096;
  parallel_for(ctx, (n + chunk - 1) / chunk, n, [=](index_t b) {
    const index_t end = (b + 1) * chunk < n ? (b + 1) * chunk : n;
    for (index_t i = b * chunk; i < end; ++i) f(i);
  });
}

//! Calls f(r) for each row r of a rows x cols matrix; f walks the row's columns itself.
template <class F>
void for_each_row(const HostContext& ctx, index_t rows, index_t cols, F f) {
  parallel_for(ctx, rows, rows * cols, f);
}

//! Whether a GEMM operand is used as stored or transposed.
enum class Trans : char { No = 'N', Yes = 'T' };

//! C = alpha op(A) op(B) + beta C, row-major, through oneDNN's dnnl_sgemm on ctx.threads threads.
//! oneDNN's OpenMP runtime sizes its team from the calling thread's max-threads setting, which
//! is per thread: each stage thread thus gets its own GEMM thread count.
inline void gemm(const HostContext& ctx, Trans ta, Trans tb, index_t m, index_t n, index_t k,
                 float alpha, const float* a, index_t lda, const float* b, index_t ldb, float beta,
                 float* c, index_t ldc) {
  if (omp_get_max_threads() != ctx.threads) omp_set_num_threads(ctx.threads);
  const dnnl_status_t status = dnnl_sgemm(static_cast<char>(ta), static_cast<char>(tb), m, n, k,
                                          alpha, a, lda, b, ldb, beta, c, ldc);
  if (status != dnnl_success)
    throw BackendError("xpipe: dnnl_sgemm failed with status " + std::to_string(status) +
                       " (m=" + std::to_string(m) + ", n=" + std::to_string(n) +
                       ", k=" + std::to_string(k) + ")");
}

//! Sets flush-to-zero and denormals-are-zero on the calling thread for its lifetime. Adam's
//! second moments decay into denormals after a few epochs and slow every step by about a third
//! without it (DESIGN.md); each training thread should hold one.
class ScopedFlushDenormals {
 public:
  ScopedFlushDenormals() {
#if defined(__SSE__)
    saved_ = _mm_getcsr();
    _mm_setcsr(saved_ | 0x8040u);  // FTZ (bit 15) | DAZ (bit 6)
#endif
  }
  ~ScopedFlushDenormals() {
#if defined(__SSE__)
    _mm_setcsr(saved_);
#endif
  }
  ScopedFlushDenormals(const ScopedFlushDenormals&) = delete;
  ScopedFlushDenormals& operator=(const ScopedFlushDenormals&) = delete;

 private:
  unsigned saved_ = 0;
};

}  // namespace xpipe
