// The host backend: its tag, execution context, parallel element loops, buffer copy and the oneDNN
// GEMM binding.
#pragma once

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <atomic>
#include <exception>
#include <string>
#include <thread>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "xpipe/backend/placement.hpp"
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

//! The host context of one stage. Owns nothing (a host context is a thread count); a GPU
//! backend's owner holds the stage's stream and library handles instead.
class HostContextOwner {
 public:
  explicit HostContextOwner(const Placement& p) : ctx_{p.threads} {}
  const HostContext& ctx() const { return ctx_; }

 private:
  HostContext ctx_;
};

//! Host backend tag: 64-byte-aligned host buffers, OpenMP element loops, oneDNN GEMM.
struct Host {
  using Context = HostContext;
  using ContextOwner = HostContextOwner;
  template <class T>
  using Buffer = HostBuffer<T>;
  static constexpr const char* name = "host";
  //! Its buffers are host memory: checkpoints read and write them directly.
  static constexpr bool host_memory = true;
  //! Columns one step of a column reduction (bias_grad) sums side by side: a contiguous row
  //! segment that a core walks row after row with vector loads, its partial sums staying in L1.
  static constexpr index_t column_block = 256;
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

// Element loops are compiled three times, for the x86-64 baseline, AVX2+FMA and AVX-512, and
// the widest the CPU supports runs: a user gets wide vectors without building for one CPU. The
// functor (the shared math) is inlined into each variant. Floating-point contraction into FMA
// may differ between the variants, so the bits are per machine, but never per thread.
enum class HostIsa { baseline, avx2, avx512 };

//! The instruction set the host element loops use on this CPU (probed once).
inline HostIsa host_isa() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const HostIsa isa =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
              __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq")
          ? HostIsa::avx512
      : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? HostIsa::avx2
                                                                        : HostIsa::baseline;
  return isa;
#else
  return HostIsa::baseline;
#endif
}

namespace detail {
// `flatten` inlines the whole body (the launcher's lambda and the math it calls) into each
// variant: a call left out of line would be compiled once, for the baseline, and run there.
#if defined(__GNUC__) || defined(__clang__)
#define XPIPE_HOST_LOOP_ __attribute__((flatten))
#else
#define XPIPE_HOST_LOOP_
#endif
// A flat pass over arrays (kernels/ops.hpp: a functor with `streams`, the number of arrays its
// quad form streams, as the optimizer steps and predictions have) touches only element i at
// index i: declaring `streams` promises that. Its loop runs on a copy of it, so that its
// pointers and scalars stay in registers (a store through a float* may otherwise alias the
// functor's float members, which are then read again every iteration), under
// XPIPE_INDEPENDENT_ITERATIONS: at -O2 the Adam step ran 7x slower than at -O3 without both.
template <class F>
concept FlatPass = requires {
  F::streams;
};
template <class F>
inline void run_loop(const F& f, index_t begin, index_t end) {
  if constexpr (FlatPass<F>) {
    const F pass = f;
    XPIPE_INDEPENDENT_ITERATIONS
    for (index_t i = begin; i < end; ++i) pass(i);
  } else {
    for (index_t i = begin; i < end; ++i) f(i);
  }
}
template <class F>
XPIPE_HOST_LOOP_ void run_range_baseline(const F& f, index_t begin, index_t end) {
  run_loop(f, begin, end);
}
#if defined(__x86_64__) && defined(__GNUC__)
template <class F>
__attribute__((target("avx2,fma"))) XPIPE_HOST_LOOP_ void run_range_avx2(const F& f, index_t begin,
                                                                         index_t end) {
  run_loop(f, begin, end);
}
template <class F>
__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma"))) XPIPE_HOST_LOOP_ void
run_range_avx512(const F& f, index_t begin, index_t end) {
  run_loop(f, begin, end);
}
#endif
#undef XPIPE_HOST_LOOP_
template <class F>
void run_range(HostIsa isa, const F& f, index_t begin, index_t end) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (isa == HostIsa::avx512) return run_range_avx512(f, begin, end);
  if (isa == HostIsa::avx2) return run_range_avx2(f, begin, end);
#endif
  (void)isa;
  run_range_baseline(f, begin, end);
}
}  // namespace detail

// The element loops below are the host's half of the launchers' contract (kernels/ops.hpp): the
// CUDA backend (backend/cuda.cuh) has the same functions on a CudaContext.

//! Calls f(i) for i in [0, n), where `work` elements are touched in all (an index may stand for
//! a block of elements, as in a column reduction): on ctx.threads threads when `work` is large
//! enough to pay for the fork. Each thread takes one contiguous range. Helper threads adopt the
//! caller's floating-point mode (flush-to-zero), so the bits never depend on the thread count.
//! Usage: `for_each_index(ctx, blocks, rows * cols, [=](index_t b) { ... });`
template <class F>
void for_each_index(const HostContext& ctx, index_t n, index_t work, const F& f) {
  const HostIsa isa = host_isa();
  if (ctx.threads > 1 && work >= host_parallel_grain && n > 1) {
    const unsigned mode = detail::read_fp_mode();
#pragma omp parallel num_threads(ctx.threads)
    {
      detail::write_fp_mode(mode);
      const index_t team = omp_get_num_threads(), me = omp_get_thread_num();
      const index_t per = (n + team - 1) / team;
      const index_t begin = me * per < n ? me * per : n;
      const index_t end = begin + per < n ? begin + per : n;
      detail::run_range(isa, f, begin, end);
    }
  } else {
    detail::run_range(isa, f, 0, n);
  }
}

//! Calls f(i) for each element index of a flat buffer of n elements.
//! Usage: `for_each_index(ctx, n, [=](index_t i) { d[i] = m[i]; });`
template <class F>
void for_each_index(const HostContext& ctx, index_t n, const F& f) {
  for_each_index(ctx, n, n, f);
}

//! Calls f(r, c) for each element of a rows x cols matrix. Rows are split over the threads; the
//! column loop is inlined into each instruction-set variant of the range loop, where it
//! vectorises. f(r, c) may write only what belongs to element (r, c) (in place is fine): the
//! column loop promises the compiler that no iteration depends on another.
//! Usage: `for_each_element(ctx, y.rows, y.cols, [=](index_t r, index_t c) {...});`
template <class F>
void for_each_element(const HostContext& ctx, index_t rows, index_t cols, const F& f) {
  for_each_index(ctx, rows, rows * cols, [&f, cols](index_t r) {
    XPIPE_INDEPENDENT_ITERATIONS
    for (index_t c = 0; c < cols; ++c) f(r, c);
  });
}

//! Calls f(r, p, c) for channel c of pixel p of each of `rows` channels-last image rows of
//! `plane` pixels: rows split over the threads, the channel loop innermost, where it vectorises
//! over the channels' contiguous values. f may write only element (r, p, c) of its outputs (in
//! place is fine) or places no other call reads or writes (ops::MaxPoolBackwardDisjoint's
//! window cells), and must read its per-channel arrays unchanged: the loop promises the
//! compiler that no iteration depends on another, so a pixel's 16 to 64 channels run without the
//! division and the run-time alias checks that made a BatchNorm pass run at half a triad's
//! speed. Usage: `for_each_pixel(ctx, x.rows, plane, channels, ops::BatchNormForward{...});`
template <class F>
void for_each_pixel(const HostContext& ctx, index_t rows, index_t plane, index_t channels,
                    const F& f) {
  for_each_index(ctx, rows, rows * plane * channels, [&f, plane, channels](index_t r) {
    for (index_t p = 0; p < plane; ++p) {
      XPIPE_INDEPENDENT_ITERATIONS
      for (index_t c = 0; c < channels; ++c) f(r, p, c);
    }
  });
}

//! How far a lane of run_two_lanes has come through work numbered downwards (a backward's layers,
//! last first): `advance(i)` once everything down to i is done, `reached(i)` to ask (acquire:
//! the work's writes are then visible). Usage: `progress.advance(i)`,
//! `sync.wait_until([&] { return progress.reached(i); })`.
class LaneProgress {
 public:
  explicit LaneProgress(int start) : value_(start) {}
  void advance(int value) { value_.store(value, std::memory_order_release); }
  bool reached(int value) const { return value_.load(std::memory_order_acquire) <= value; }

 private:
  std::atomic<int> value_;
};

//! What the two lanes of run_two_lanes share: whether either has failed, so that the other's
//! waits give up instead of spinning for ever, and whether they run one after the other.
//! Usage: `if (!sync.wait_until([&] { return progress.reached(i); })) return;`
class LaneSync {
 public:
  //! Spins (yielding the core now and then) until ready() holds; false once a lane has failed,
  //! before ready() is asked again (it may take work). Lanes that run one after the other cannot
  //! wait: there a ready() that does not hold is a ConfigError (a lane waiting on what only a
  //! later lane does), not a hang.
  template <class Ready>
  bool wait_until(const Ready& ready) const {
    for (unsigned spins = 1;; ++spins) {
      if (failed()) return false;
      if (ready()) return true;
      if (alone_)
        throw ConfigError(
            "xpipe: LaneSync::wait_until: the lanes run one after the other here (no second "
            "thread), and this lane waits on work that only a later lane would do");
#if defined(__SSE__)
      _mm_pause();
#endif
      if (spins % 4096 == 0) std::this_thread::yield();
    }
  }
  bool failed() const {
    return failed_.load(std::memory_order_relaxed);
  }
  void fail() {
    failed_.store(true, std::memory_order_relaxed);
  }
  //! The lanes run one after the other on one thread (lane 0 first): lane 0 must not wait.
  bool alone() const {
    return alone_;
  }

 private:
  template <class F0, class F1>
  friend void run_two_lanes(const F0&, const F1&);
  std::atomic<bool> failed_{false};
  bool alone_ = false;
};

//! Runs lane0(one, sync) and lane1(one, sync) at once, on the calling thread and one helper thread
//! (which adopts the caller's floating-point mode), `one` a one-thread HostContext: two streams
//! of work (a backward's input halves and its weight halves) each on a core of its own, where
//! two GEMMs on one thread each run closer to the cores' peak than one GEMM split over both.
//! The lanes wait on each other through LaneProgress and `sync.wait_until`; lane 0 must never
//! wait on lane 1 for what lane 1 can only do after lane 0 has gone on. Where no second thread is
//! to be had (inside another OpenMP region) the lanes run one after the other, lane 0 first, so
//! lane 0 must not wait on lane 1 at all there (`sync` tells: `alone()`). An exception in either
//! lane ends the other's waits and is rethrown here once both have returned (lane 0's first).
//! Usage: `run_two_lanes([&](auto& one, auto& sync) {...}, [&](auto& one, auto& sync) {...});`
template <class F0, class F1>
void run_two_lanes(const F0& lane0, const F1& lane1) {
  const HostContext one{.threads = 1};
  LaneSync sync;
  std::exception_ptr failure[2];
  const auto run = [&](int lane) {
    try {
      if (lane == 0)
        lane0(one, sync);
      else
        lane1(one, sync);
    } catch (...) {
      failure[lane] = std::current_exception();
      sync.fail();
    }
  };
  const unsigned mode = detail::read_fp_mode();
  int team = 1;
#pragma omp parallel num_threads(2)
  {
#pragma omp single
    team = omp_get_num_threads();
    // (the single's barrier: both threads know the team size)
    if (team == 2) {
      detail::write_fp_mode(mode);
      run(omp_get_thread_num());
    }
  }
  if (team != 2) {
    sync.alone_ = true;
    run(0);
    if (!failure[0]) run(1);
  }
  for (const std::exception_ptr& e : failure)
    if (e) std::rethrow_exception(e);
}

//! dst = src over n floats. A backend primitive rather than a launcher in kernels/ops.hpp: there
//! is no math to share, and each backend has its own best copy (here the threaded element loop,
//! on CUDA the driver's device-to-device copy on the stream).
inline void copy_buffer(const HostContext& ctx, const float* XPIPE_RESTRICT src,
                        float* XPIPE_RESTRICT dst, index_t n) {
  for_each_index(ctx, n, [=](index_t i) { dst[i] = src[i]; });
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
//! without it (docs/design.md); each training thread should hold one.
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
