// The CUDA backend's execution context: a stage's device, stream, cuBLAS handle and cuBLASLt
// plans, the stream that owns them, and what a Pipeline does to contexts: activate (make the
// device current), synchronize, connect (peer access between the devices of stages that share
// memory).
#pragma once

#if !defined(__CUDACC__)
#error "xpipe/backend/cuda/context.cuh is for CUDA translation units (nvcc); link xpipe::cuda"
#endif

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "xpipe/backend/cuda/check.cuh"
#include "xpipe/backend/cuda/lt_plans.cuh"
#include "xpipe/backend/placement.hpp"
#include "xpipe/core/error.hpp"

namespace xpipe {

struct Cuda;

//! Execution context of the CUDA backend: the device and stream every kernel and GEMM of a
//! stage runs on, the cuBLAS handle bound to that stream, and the stage's cuBLASLt plans (null:
//! the Linear layer's GEMMs run without epilogues). Not owning; see CudaStreamContext.
struct CudaContext {
  using backend = Cuda;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  int device = 0;
  CudaLtPlans* lt = nullptr;
  //! A check of the queues' ordering, not for training: after every wait on a queue event the
  //! stream stalls this long (ns) before going on, so a stage that writes or reads a slot
  //! without waiting for the other side is far ahead of it and its data visibly stale. From
  //! $XPIPE_CUDA_STALL_US when CudaStreamContext makes the context; 0 (none) by default.
  unsigned long long stall_ns = 0;
  //! Device memory for the partial sums of a reduction on this stream (squared_norm_async:
  //! cuda_detail::reduce_blocks doubles); only this stream's kernels use it, one after another.
  double* partials = nullptr;
};

namespace cuda_detail {
// The blocks of a reduction's first pass (squared_norm_async), each writing one partial sum.
inline constexpr int reduce_blocks = 512;

// Busy-waits on the device clock (%globaltimer, ns) for `ns`: one thread, sleeping in 1 us steps.
// A template, like the element loops, so every unit including this header may instantiate it.
template <int = 0>
__global__ void stall_kernel(unsigned long long ns) {
  unsigned long long t0 = 0, t = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

// $XPIPE_CUDA_STALL_US in ns (see CudaContext::stall_ns); ConfigError naming a bad value.
inline unsigned long long stall_ns_from_environment() {
  const char* v = std::getenv("XPIPE_CUDA_STALL_US");
  if (v == nullptr || *v == '\0') return 0;
  char* end = nullptr;
  const unsigned long long us = std::strtoull(v, &end, 10);
  if (*end != '\0' || us > 10'000'000)
    throw ConfigError(std::string("xpipe: XPIPE_CUDA_STALL_US='") + v +
                      "': a whole number of microseconds up to 10000000 expected");
  return us * 1000;
}
}  // namespace cuda_detail

//! The number of CUDA devices; BackendError when there is none (or no driver), saying so.
inline int cuda_device_count() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    if (err != cudaSuccess) (void)cudaGetLastError();  // not sticky: clear it
    throw BackendError(std::string("xpipe: no CUDA device (") +
                       (err != cudaSuccess ? cudaGetErrorString(err) : "0 devices") + ")");
  }
  return n;
}

//! Makes ctx's device the calling thread's current device: every CUDA call a stage makes (a
//! kernel launch, an allocation, an event) acts on the current device, and a host thread may
//! drive stages of several devices (the reference executor drives all of them). Pipeline calls
//! it before each action of a stage and before allocating a stage's buffers; a backend without
//! devices has no `activate`.
inline void activate(const CudaContext& ctx) {
  XPIPE_CUDA_CHECK(cudaSetDevice(ctx.device));
}

//! Waits on the host until everything enqueued on ctx's stream has run; a failed kernel's error
//! surfaces here (BackendError).
inline void synchronize(const CudaContext& ctx) {
  XPIPE_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
}

//! Lets the devices of two stages read and write each other's memory: adjacent stages (a stage's
//! backward writes its input gradient straight into a queue slot on the previous stage's
//! device) and, under global clipping, stage 0 and every other stage (each writes its gradient
//! norm to stage 0's device and reads them all there). Nothing to do on one device; ConfigError
//! when the pair cannot access each other.
inline void connect(const CudaContext& a, const CudaContext& b) {
  if (a.device == b.device) return;
  for (const auto& [from, to] : {std::pair{a.device, b.device}, std::pair{b.device, a.device}}) {
    int can = 0;
    XPIPE_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, from, to));
    if (!can)
      throw ConfigError("xpipe: devices " + std::to_string(from) + " and " + std::to_string(to) +
                        " cannot access each other's memory (no peer access), which their "
                        "stages need (adjacent stages share queue slots; under global clipping "
                        "every stage reaches stage 0's device): place both stages on one device "
                        "(Placement::device)");
    XPIPE_CUDA_CHECK(cudaSetDevice(from));
    const cudaError_t err = cudaDeviceEnablePeerAccess(to, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled)
      (void)cudaGetLastError();  // enabled by an earlier pipeline: fine, clear it
    else
      XPIPE_CUDA_CHECK(err);
  }
}

//! Owns a stream and a cuBLAS handle bound to it, on one device. Usage:
//! `CudaStreamContext owner(Placement{.stage = 1}); owner.ctx()`.
class CudaStreamContext {
 public:
  //! The stream of pipeline stage `p.stage`: on device `p.device`, or `p.stage % device count`
  //! when p.device < 0. Leaves that device current (the stage's buffers are allocated next).
  //! A p.device that names no device is a ConfigError naming it.
  explicit CudaStreamContext(const Placement& p) {
    const int count = cuda_device_count();
    if (p.device >= count)
      throw ConfigError("xpipe: stage " + std::to_string(p.stage) + " placed on CUDA device " +
                        std::to_string(p.device) + ", but the machine has " +
                        std::to_string(count) + " (0.." + std::to_string(count - 1) + ")");
    create(p.device >= 0 ? p.device : p.stage % count);
  }
  //! A stream on the current device.
  CudaStreamContext() {
    int device = 0;
    XPIPE_CUDA_CHECK(cudaGetDevice(&device));
    create(device);
  }
  CudaStreamContext(const CudaStreamContext&) = delete;
  CudaStreamContext& operator=(const CudaStreamContext&) = delete;
  ~CudaStreamContext() { release(); }
  const CudaContext& ctx() const { return ctx_; }
  void synchronize() const { XPIPE_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream)); }

 private:
  // What create() made, in reverse order (also when create() fails partway).
  void release() noexcept {
    (void)cudaSetDevice(ctx_.device);
    lt_.reset();  // its workspace and plans before the stream they serve
    if (ctx_.partials != nullptr) cudaFree(ctx_.partials);
    if (ctx_.blas != nullptr) cublasDestroy(ctx_.blas);
    if (ctx_.stream != nullptr) cudaStreamDestroy(ctx_.stream);
    ctx_.partials = nullptr;
    ctx_.blas = nullptr;
    ctx_.stream = nullptr;
  }

  void create(int device) {
    ctx_.device = device;
    ctx_.stall_ns = cuda_detail::stall_ns_from_environment();  // first: it may throw
    try {
      make(device);
    } catch (...) {
      release();  // a constructor that throws runs no destructor
      throw;
    }
  }

  void make(int device) {
    XPIPE_CUDA_CHECK(cudaSetDevice(device));
    XPIPE_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx_.stream, cudaStreamNonBlocking));
    XPIPE_CUBLAS_CHECK(cublasCreate(&ctx_.blas));
    XPIPE_CUBLAS_CHECK(cublasSetStream(ctx_.blas, ctx_.stream));
    // Plain FP32 math: results comparable with the host backend (no TF32 down-conversion).
    // One handle per stream and no atomics mode: cuBLAS then gives the same bits on every run
    // on one GPU model (its documented reproducibility conditions).
    XPIPE_CUBLAS_CHECK(cublasSetMathMode(ctx_.blas, CUBLAS_PEDANTIC_MATH));
    XPIPE_CUDA_CHECK(cudaMalloc(&ctx_.partials, cuda_detail::reduce_blocks * sizeof(double)));
    lt_ = std::make_unique<CudaLtPlans>();
    ctx_.lt = lt_.get();
  }

  CudaContext ctx_{};
  std::unique_ptr<CudaLtPlans> lt_;
};

}  // namespace xpipe
