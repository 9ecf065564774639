// The CUDA backend: its tag, execution context (stream + cuBLAS handle), device buffers, the
// element loops, buffer copy, the cuBLAS GEMM binding and the Linear layer's GEMMs with
// cuBLASLt epilogues. Include only from CUDA translation units.
#pragma once

#if !defined(__CUDACC__)
#error "xpipe/backend/cuda.cuh is for CUDA translation units (nvcc); link xpipe::cuda"
#endif

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "xpipe/backend/host.hpp"
#include "xpipe/core/config.hpp"
#include "xpipe/core/error.hpp"

//! Checks a CUDA runtime call; throws xpipe::BackendError naming the call, file and line.
#define XPIPE_CUDA_CHECK(call)                                                                \
  do {                                                                                        \
    const cudaError_t xpipe_err_ = (call);                                                    \
    if (xpipe_err_ != cudaSuccess)                                                            \
      throw ::xpipe::BackendError(std::string("xpipe: ") + #call + " failed at " + __FILE__ + \
                                  ":" + std::to_string(__LINE__) + ": " +                     \
                                  cudaGetErrorString(xpipe_err_));                            \
  } while (0)

//! Checks a cuBLAS call; throws xpipe::BackendError naming the call, file and line.
#define XPIPE_CUBLAS_CHECK(call)                                                              \
  do {                                                                                        \
    const cublasStatus_t xpipe_st_ = (call);                                                  \
    if (xpipe_st_ != CUBLAS_STATUS_SUCCESS)                                                   \
      throw ::xpipe::BackendError(std::string("xpipe: ") + #call + " failed at " + __FILE__ + \
                                  ":" + std::to_string(__LINE__) + ": " +                     \
                                  cublasGetStatusString(xpipe_st_));                          \
  } while (0)

namespace xpipe {

struct Cuda;
class CudaLtPlans;

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
};

namespace cuda_detail {
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

//! Lets the devices of two adjacent stages read and write each other's memory (a stage's
//! backward writes its input gradient straight into a queue slot on the previous stage's
//! device). Nothing to do on one device; ConfigError when the pair cannot access each other.
inline void connect(const CudaContext& a, const CudaContext& b) {
  if (a.device == b.device) return;
  for (const auto& [from, to] : {std::pair{a.device, b.device}, std::pair{b.device, a.device}}) {
    int can = 0;
    XPIPE_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, from, to));
    if (!can)
      throw ConfigError("xpipe: devices " + std::to_string(from) + " and " + std::to_string(to) +
                        " of adjacent stages cannot access each other's memory (no peer "
                        "access): place both stages on one device (Placement::device)");
    XPIPE_CUDA_CHECK(cudaSetDevice(from));
    const cudaError_t err = cudaDeviceEnablePeerAccess(to, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled)
      (void)cudaGetLastError();  // enabled by an earlier pipeline: fine, clear it
    else
      XPIPE_CUDA_CHECK(err);
  }
}

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
  //! in the README, "Checking on a GPU"). Turn on where `--gemm-detail` says the forward
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
  ~CudaStreamContext() {
    (void)cudaSetDevice(ctx_.device);
    lt_.reset();  // its workspace and plans before the stream they serve
    if (ctx_.blas != nullptr) cublasDestroy(ctx_.blas);
    if (ctx_.stream != nullptr) cudaStreamDestroy(ctx_.stream);
  }
  const CudaContext& ctx() const { return ctx_; }
  void synchronize() const { XPIPE_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream)); }

 private:
  void create(int device) {
    ctx_.device = device;
    XPIPE_CUDA_CHECK(cudaSetDevice(ctx_.device));
    XPIPE_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx_.stream, cudaStreamNonBlocking));
    XPIPE_CUBLAS_CHECK(cublasCreate(&ctx_.blas));
    XPIPE_CUBLAS_CHECK(cublasSetStream(ctx_.blas, ctx_.stream));
    // Plain FP32 math: results comparable with the host backend (no TF32 down-conversion).
    // One handle per stream and no atomics mode: cuBLAS then gives the same bits on every run
    // on one GPU model (its documented reproducibility conditions).
    XPIPE_CUBLAS_CHECK(cublasSetMathMode(ctx_.blas, CUBLAS_PEDANTIC_MATH));
    lt_ = std::make_unique<CudaLtPlans>();
    ctx_.lt = lt_.get();
    ctx_.stall_ns = cuda_detail::stall_ns_from_environment();
  }

  CudaContext ctx_{};
  std::unique_ptr<CudaLtPlans> lt_;
};

//! An owning array of T in device memory (on the device current at construction), zero-filled
//! on creation. Freed on that device whatever device is current then (and the current device
//! left as it was).
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(index_t size) : size_(size) {
    if (size_ > 0) {
      XPIPE_CUDA_CHECK(cudaGetDevice(&device_));
      XPIPE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), bytes()));
      // cudaMemset runs on the legacy default stream, which the stages' non-blocking streams do
      // not wait for: finish it here, or a stage's first write could land before the zeros.
      XPIPE_CUDA_CHECK(cudaMemset(data_, 0, bytes()));
      XPIPE_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)),
        device_(o.device_) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      device_ = o.device_;
    }
    return *this;
  }
  ~DeviceBuffer() { release(); }
  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  index_t size() const noexcept { return size_; }
  std::size_t bytes() const noexcept { return static_cast<std::size_t>(size_) * sizeof(T); }

  //! Copies n elements from (pageable) host memory and waits until they are on the device: a
  //! cudaMemcpy from pageable memory may return once the data is staged, before it has landed,
  //! and the stages' non-blocking streams do not wait for the legacy stream that carries it.
  void copy_from_host(const T* src, index_t n) {
    XPIPE_CUDA_CHECK(
        cudaMemcpy(data_, src, static_cast<std::size_t>(n) * sizeof(T), cudaMemcpyHostToDevice));
    XPIPE_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }
  void copy_to_host(T* dst, index_t n) const {
    XPIPE_CUDA_CHECK(
        cudaMemcpy(dst, data_, static_cast<std::size_t>(n) * sizeof(T), cudaMemcpyDeviceToHost));
  }

 private:
  void release() noexcept {
    if (data_ == nullptr) return;
    int current = device_;
    (void)cudaGetDevice(&current);
    if (current != device_) (void)cudaSetDevice(device_);
    cudaFree(data_);
    if (current != device_) (void)cudaSetDevice(current);
    data_ = nullptr;
  }

  T* data_ = nullptr;
  index_t size_ = 0;
  int device_ = 0;
};

//! An owning array of T in page-locked host memory (cudaMallocHost): what an asynchronous copy
//! to the device reads from (a copy from pageable memory is staged and synchronous).
template <class T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(index_t size) : size_(size) {
    if (size_ > 0) XPIPE_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&data_), bytes()));
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      if (data_ != nullptr) cudaFreeHost(data_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~PinnedBuffer() {
    if (data_ != nullptr) cudaFreeHost(data_);
  }
  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  index_t size() const noexcept { return size_; }
  std::size_t bytes() const noexcept { return static_cast<std::size_t>(size_) * sizeof(T); }

 private:
  T* data_ = nullptr;
  index_t size_ = 0;
};

//! A CUDA event for ordering two streams (no timing: cheaper to record and wait on), created on
//! the device current at construction; it must be recorded on a stream of that device.
class CudaEvent {
 public:
  CudaEvent() { XPIPE_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  CudaEvent(CudaEvent&& o) noexcept : event_(std::exchange(o.event_, nullptr)) {}
  CudaEvent& operator=(CudaEvent&& o) noexcept {
    if (this != &o) {
      if (event_ != nullptr) cudaEventDestroy(event_);
      event_ = std::exchange(o.event_, nullptr);
    }
    return *this;
  }
  ~CudaEvent() {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }
  //! Marks the point in ctx's stream reached by what is enqueued on it so far.
  void record(const CudaContext& ctx) { XPIPE_CUDA_CHECK(cudaEventRecord(event_, ctx.stream)); }
  //! Makes ctx's stream wait (on the device, not the host) until the last record() completed;
  //! an event never recorded is complete. A later record() does not move what this call waits
  //! for: cudaStreamWaitEvent takes the record current when it is called.
  void wait(const CudaContext& ctx) const {
    XPIPE_CUDA_CHECK(cudaStreamWaitEvent(ctx.stream, event_, 0));
    if (ctx.stall_ns > 0) {  // the ordering check (CudaContext::stall_ns)
      cuda_detail::stall_kernel<><<<1, 1, 0, ctx.stream>>>(ctx.stall_ns);
      XPIPE_CUDA_CHECK(cudaGetLastError());
    }
  }

 private:
  cudaEvent_t event_ = nullptr;
};

//! CUDA backend tag: device buffers, one stream per context, cuBLAS GEMM.
struct Cuda {
  using Context = CudaContext;
  using ContextOwner = CudaStreamContext;
  template <class T>
  using Buffer = DeviceBuffer<T>;
  //! Host memory a stream copies from asynchronously (the epoch's upload).
  template <class T>
  using PinnedBuffer = xpipe::PinnedBuffer<T>;
  //! What orders two streams (the queues' filled and drained marks).
  using Event = CudaEvent;
  static constexpr const char* name = "cuda";
  //! Columns one step of a column reduction (bias_grad) sums: one per thread, the partial sum
  //! in a register, adjacent threads on adjacent columns so each row's loads coalesce.
  static constexpr index_t column_block = 1;
};

// The element loops below are the CUDA half of the launchers' contract (kernels/ops.hpp): the
// host backend (backend/host.hpp) has the same functions on a HostContext.
namespace cuda_detail {
inline constexpr int block_threads = 256;

inline unsigned grid_for(index_t n) {
  return static_cast<unsigned>((n + block_threads - 1) / block_threads);
}

// The thin kernels: compute an index, check bounds, call the shared per-element function.
template <class F>
__global__ void for_each_index_kernel(index_t n, F f) {
  const index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) f(i);
}

// One thread per element, in row-major order: consecutive threads of a warp read consecutive
// columns, so loads coalesce.
template <class F>
__global__ void for_each_element_kernel(index_t rows, index_t cols, F f) {
  const index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < rows * cols) {
    const index_t r = i / cols;
    f(r, i - r * cols);
  }
}
}  // namespace cuda_detail

//! Calls f(i) on the device for i in [0, n), on ctx's stream; f is a trivially copyable function
//! object with an XPIPE_HOST_DEVICE operator() (kernels/ops.hpp has one per launcher).
//! Usage: `for_each_index(ctx, n, ops::SgdDirection{m, d});`
template <class F>
void for_each_index(const CudaContext& ctx, index_t n, const F& f) {
  static_assert(std::is_trivially_copyable_v<F>,
                "xpipe: for_each_index on CUDA needs a trivially copyable function object (the "
                "kernel takes it by value)");
  if (n <= 0) return;
  cuda_detail::for_each_index_kernel<<<cuda_detail::grid_for(n), cuda_detail::block_threads, 0,
                                       ctx.stream>>>(n, f);
  XPIPE_CUDA_CHECK(cudaGetLastError());
}

//! As for_each_index(ctx, n, f). `work` (the elements touched in all) tells the host backend
//! whether forking pays; one GPU thread per index has no such decision, so it is unused here.
template <class F>
void for_each_index(const CudaContext& ctx, index_t n, index_t /*work*/, const F& f) {
  for_each_index(ctx, n, f);
}

//! Calls f(r, c) on the device for each element of a rows x cols matrix, one thread each.
template <class F>
void for_each_element(const CudaContext& ctx, index_t rows, index_t cols, const F& f) {
  static_assert(std::is_trivially_copyable_v<F>,
                "xpipe: for_each_element on CUDA needs a trivially copyable function object (the "
                "kernel takes it by value)");
  if (rows <= 0 || cols <= 0) return;
  cuda_detail::for_each_element_kernel<<<cuda_detail::grid_for(rows * cols),
                                         cuda_detail::block_threads, 0, ctx.stream>>>(rows, cols,
                                                                                      f);
  XPIPE_CUDA_CHECK(cudaGetLastError());
}

//! dst = src over n device floats, on ctx's stream. A backend primitive rather than a launcher
//! in kernels/ops.hpp: there is no math to share, and the driver's device-to-device copy (wide
//! accesses, any alignment) beats a one-float-per-thread element loop.
//! src and dst may lie on different devices (a stage's output copied into a queue slot on the
//! next stage's device): cudaMemcpyDefault lets unified addressing find both.
inline void copy_buffer(const CudaContext& ctx, const float* src, float* dst, index_t n) {
  if (n <= 0) return;
  XPIPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * sizeof(float),
                                   cudaMemcpyDefault, ctx.stream));
}

//! dst (device) = src (host) over n elements, on ctx's stream, and waits for it: for moving
//! state in and out between runs (weights, evaluation), never inside one.
template <class T>
void copy_from_host(const CudaContext& ctx, const T* src, T* dst, index_t n) {
  if (n <= 0) return;
  XPIPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * sizeof(T),
                                   cudaMemcpyHostToDevice, ctx.stream));
  synchronize(ctx);
}

//! dst (host) = src (device) over n elements, after everything enqueued on ctx's stream before.
template <class T>
void copy_to_host(const CudaContext& ctx, const T* src, T* dst, index_t n) {
  if (n <= 0) return;
  XPIPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * sizeof(T),
                                   cudaMemcpyDeviceToHost, ctx.stream));
  synchronize(ctx);
}

//! dst (device) = src (pinned host memory) over n elements, enqueued on ctx's stream; the host
//! must not touch src until the stream has passed the copy.
template <class T>
void copy_from_pinned_async(const CudaContext& ctx, const T* src, T* dst, index_t n) {
  if (n <= 0) return;
  XPIPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * sizeof(T),
                                   cudaMemcpyHostToDevice, ctx.stream));
}

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
