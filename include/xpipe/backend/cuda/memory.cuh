// The CUDA backend's memory: device buffers, pinned host buffers, the events that order two
// streams, and the copies (device to device on a stream; to and from the host).
#pragma once

#if !defined(__CUDACC__)
#error "xpipe/backend/cuda/memory.cuh is for CUDA translation units (nvcc); link xpipe::cuda"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "xpipe/backend/cuda/check.cuh"
#include "xpipe/backend/cuda/context.cuh"
#include "xpipe/core/config.hpp"

namespace xpipe {

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
  //! Whether the device has passed the last record() (cudaEventQuery; never recorded: true),
  //! asked by the host before it touches pinned memory a copy on the stream reads or writes
  //! (comm/mpi_staged_link.hpp). Throws the device's error when it has one (a sticky fault).
  bool done() const {
    const cudaError_t e = cudaEventQuery(event_);
    if (e == cudaErrorNotReady) return false;
    XPIPE_CUDA_CHECK(e);
    return true;
  }

 private:
  cudaEvent_t event_ = nullptr;
};

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

//! dst (pinned host memory) = src (device) over n elements, enqueued on ctx's stream after what
//! it has before it; the host must not read dst until the stream has passed the copy (an event
//! recorded after it is done()).
template <class T>
void copy_to_pinned_async(const CudaContext& ctx, const T* src, T* dst, index_t n) {
  if (n <= 0) return;
  XPIPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * sizeof(T),
                                   cudaMemcpyDeviceToHost, ctx.stream));
}

//! dst (device) = src (pinned host memory) over n elements, enqueued on ctx's stream; the host
//! must not touch src until the stream has passed the copy.
template <class T>
void copy_from_pinned_async(const CudaContext& ctx, const T* src, T* dst, index_t n) {
  if (n <= 0) return;
  XPIPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * sizeof(T),
                                   cudaMemcpyHostToDevice, ctx.stream));
}

}  // namespace xpipe
