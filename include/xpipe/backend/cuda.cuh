// The CUDA backend: its tag, execution context (stream + cuBLAS handle), device buffers, the
// element loops, buffer copy and the cuBLAS GEMM binding. Include only from CUDA translation units.
#pragma once

#if !defined(__CUDACC__)
#error "xpipe/backend/cuda.cuh is for CUDA translation units (nvcc); link xpipe::cuda"
#endif

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>
#include <type_traits>
#include <utility>

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

//! Execution context of the CUDA backend: the stream every kernel and GEMM of a stage runs on,
//! and the cuBLAS handle bound to it. Not owning; see CudaStreamContext for an owner.
struct CudaContext {
  using backend = Cuda;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
};

//! Owns a stream and a cuBLAS handle bound to it. Usage: `CudaStreamContext owner; owner.ctx()`.
class CudaStreamContext {
 public:
  //! The stream of pipeline stage `p.stage`, on the current device (placing stages on several
  //! devices is the CUDA executor's job).
  explicit CudaStreamContext(const Placement&) : CudaStreamContext() {}
  CudaStreamContext() {
    XPIPE_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx_.stream, cudaStreamNonBlocking));
    XPIPE_CUBLAS_CHECK(cublasCreate(&ctx_.blas));
    XPIPE_CUBLAS_CHECK(cublasSetStream(ctx_.blas, ctx_.stream));
    // Plain FP32 math: results comparable with the host backend (no TF32 down-conversion).
    XPIPE_CUBLAS_CHECK(cublasSetMathMode(ctx_.blas, CUBLAS_PEDANTIC_MATH));
  }
  CudaStreamContext(const CudaStreamContext&) = delete;
  CudaStreamContext& operator=(const CudaStreamContext&) = delete;
  ~CudaStreamContext() {
    cublasDestroy(ctx_.blas);
    cudaStreamDestroy(ctx_.stream);
  }
  const CudaContext& ctx() const { return ctx_; }
  void synchronize() const { XPIPE_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream)); }

 private:
  CudaContext ctx_{};
};

//! An owning array of T in device memory, zero-filled on creation.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(index_t size) : size_(size) {
    if (size_ > 0) {
      XPIPE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), bytes()));
      XPIPE_CUDA_CHECK(cudaMemset(data_, 0, bytes()));
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      if (data_ != nullptr) cudaFree(data_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~DeviceBuffer() {
    if (data_ != nullptr) cudaFree(data_);
  }
  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  index_t size() const noexcept { return size_; }
  std::size_t bytes() const noexcept { return static_cast<std::size_t>(size_) * sizeof(T); }

  void copy_from_host(const T* src, index_t n) {
    XPIPE_CUDA_CHECK(
        cudaMemcpy(data_, src, static_cast<std::size_t>(n) * sizeof(T), cudaMemcpyHostToDevice));
  }
  void copy_to_host(T* dst, index_t n) const {
    XPIPE_CUDA_CHECK(
        cudaMemcpy(dst, data_, static_cast<std::size_t>(n) * sizeof(T), cudaMemcpyDeviceToHost));
  }

 private:
  T* data_ = nullptr;
  index_t size_ = 0;
};

//! CUDA backend tag: device buffers, one stream per context, cuBLAS GEMM.
struct Cuda {
  using Context = CudaContext;
  using ContextOwner = CudaStreamContext;
  template <class T>
  using Buffer = DeviceBuffer<T>;
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
inline void copy_buffer(const CudaContext& ctx, const float* src, float* dst, index_t n) {
  if (n <= 0) return;
  XPIPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * sizeof(float),
                                   cudaMemcpyDeviceToDevice, ctx.stream));
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
