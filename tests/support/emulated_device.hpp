// A device backend emulated on the host, for testing the device half of Pipeline (what runs on
// CUDA) on machines without a GPU: the same host math, but run the way a GPU runs it. Each stage
// context is a stream, a worker thread that runs what the stage enqueues, later and in order;
// the host thread that enqueued it goes on at once. Streams order each other only through
// events. Buffers are host memory that the pipeline must treat as device memory (the context
// is not a HostContext, so Pipeline::on_device holds and every device path is taken: the epoch
// upload, the loss summed "on the device" and read after the run, copies for weights(),
// evaluate() and checkpoints).
//
// The CUDA rules that the emulation enforces (each a BackendError naming what broke it):
//   - a kernel or GEMM may be enqueued only on a stream of the current device (cudaSetDevice:
//     `activate`); copies may go to any stream (CUDA allows both);
//   - an event is recorded only on a stream of the device it was created on; a stream may wait
//     on an event of any device;
//   - a wait takes the event's record current when the wait is enqueued (cudaStreamWaitEvent);
//     an event never recorded is complete;
//   - a buffer is freed only once every stream is idle (cudaFree synchronises the device).
// A task that throws makes its stream fail: what follows on that stream is skipped and the
// next synchronize() throws the error, as a failed kernel's error surfaces in CUDA.
//
// With EmulatedDevice::jitter_us > 0 every stream sleeps a random 0..jitter_us microseconds
// before each task, so streams run at varying speeds and a missing wait lets a stream read a
// slot before it is written; with slow_stage = k, stage k's stream also sleeps slow_us before
// each task, so it lags its neighbours by whole micro-batches and a producer that does not wait
// overwrites a slot before it is read. Either way the weights then differ from the host's. Bits:
// element loops and GEMMs run as on the host with one thread, so a pipeline on this backend gives
// the host backend's bits.
#pragma once

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "xpipe/backend/host.hpp"
#include "xpipe/core/buffer.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/layers/loss.hpp"

namespace xpipe::test {

struct EmulatedDevice;

namespace emu {

// The device the calling host thread has made current (cudaSetDevice is per thread).
inline int& current_device() {
  thread_local int device = 0;
  return device;
}

class Stream;

// Every live stream, so that freeing a buffer can wait for all of them (as cudaFree does).
struct Registry {
  std::mutex m;
  std::vector<Stream*> streams;
  static Registry& get() {
    static Registry r;
    return r;
  }
};

//! One emulated stream: a worker thread running enqueued tasks in order.
class Stream {
 public:
  Stream(int device, int stage, int jitter_us, int slow_us)
      : device_(device),
        jitter_us_(jitter_us),
        slow_us_(slow_us),
        rng_(0x9e3779b9u * (stage + 1) + device) {
    worker_ = std::thread([this] { work(); });
    std::lock_guard lock(Registry::get().m);
    Registry::get().streams.push_back(this);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() {
    {
      std::lock_guard lock(Registry::get().m);
      auto& all = Registry::get().streams;
      std::erase(all, this);
    }
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  int device() const { return device_; }

  //! Appends a task; returns the stream position after it (the count of tasks enqueued).
  std::uint64_t enqueue(std::function<void()> task) {
    std::lock_guard lock(m_);
    tasks_.push_back(std::move(task));
    ++enqueued_;
    cv_.notify_all();
    return enqueued_;
  }
  //! Position of everything enqueued so far (what an event record captures).
  std::uint64_t position() {
    std::lock_guard lock(m_);
    return enqueued_;
  }
  //! Blocks the caller until the first `pos` tasks have run.
  void wait_for(std::uint64_t pos) {
    std::unique_lock lock(m_);
    cv_.wait(lock, [&] { return completed_ >= pos; });
  }
  //! Waits for everything enqueued so far; rethrows the stream's failure if a task failed.
  void synchronize() {
    wait_for(position());
    std::lock_guard lock(m_);
    if (failure_) std::rethrow_exception(failure_);
  }

 private:
  void work() {
    ScopedFlushDenormals ftz;  // as the host executors' stage threads: the same bits
    std::uniform_int_distribution<int> pause(0, jitter_us_ > 0 ? jitter_us_ : 0);
    for (;;) {
      std::function<void()> task;
      bool skip = false;
      {
        std::unique_lock lock(m_);
        cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
        if (tasks_.empty()) return;  // stopping, nothing left
        task = std::move(tasks_.front());
        tasks_.pop_front();
        skip = failure_ != nullptr;
      }
      const int us = slow_us_ + (jitter_us_ > 0 ? pause(rng_) : 0);
      if (us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
      std::exception_ptr failed;
      if (!skip) {
        try {
          task();
        } catch (...) {
          failed = std::current_exception();
        }
      }
      {
        std::lock_guard lock(m_);
        if (failed && !failure_) failure_ = failed;
        ++completed_;
      }
      cv_.notify_all();
    }
  }

  const int device_;
  const int jitter_us_, slow_us_;
  std::minstd_rand rng_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::uint64_t enqueued_ = 0, completed_ = 0;
  std::exception_ptr failure_;
  bool stop_ = false;
  std::thread worker_;
};

// Waits until every live stream has run what was enqueued on it (cudaFree's implicit sync).
inline void wait_all_streams() {
  std::vector<std::pair<Stream*, std::uint64_t>> marks;
  {
    std::lock_guard lock(Registry::get().m);
    for (Stream* s : Registry::get().streams) marks.emplace_back(s, s->position());
  }
  for (auto [s, pos] : marks) s->wait_for(pos);
}

}  // namespace emu

//! The emulated backend's context: a stream on one emulated device. Not a HostContext: the
//! pipeline must not read its buffers on the host.
struct EmulatedContext {
  using backend = EmulatedDevice;
  emu::Stream* stream = nullptr;
  int device = 0;
};

namespace emu {
// Throws unless ctx's device is current: CUDA refuses a launch on another device's stream.
inline void check_launch(const EmulatedContext& ctx, const char* what) {
  if (current_device() != ctx.device)
    throw BackendError(std::string("xpipe: emulated device: ") + what +
                       " enqueued on a stream of device " + std::to_string(ctx.device) +
                       " while device " + std::to_string(current_device()) +
                       " is current (CUDA refuses the launch; activate the context first)");
}
}  // namespace emu

//! Owns one stage's stream. Placement as on CUDA: device p.device, or p.stage % devices; leaves
//! that device current (the stage's buffers are allocated next).
class EmulatedStreamOwner {
 public:
  explicit EmulatedStreamOwner(const Placement& p);
  const EmulatedContext& ctx() const { return ctx_; }

 private:
  std::unique_ptr<emu::Stream> stream_;
  EmulatedContext ctx_;
};

//! An owning array of T in emulated device memory: host memory, zero-filled, remembered with
//! the device current at its creation. Freeing it waits for every stream first.
template <class T>
class EmulatedBuffer {
 public:
  EmulatedBuffer() = default;
  explicit EmulatedBuffer(index_t size) : data_(size), device_(emu::current_device()) {}
  EmulatedBuffer(EmulatedBuffer&& o) noexcept = default;
  EmulatedBuffer& operator=(EmulatedBuffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::move(o.data_);
      device_ = o.device_;
    }
    return *this;
  }
  ~EmulatedBuffer() { release(); }
  T* data() noexcept { return data_.data(); }
  const T* data() const noexcept { return data_.data(); }
  index_t size() const noexcept { return data_.size(); }
  int device() const noexcept { return device_; }

 private:
  void release() noexcept {
    if (data_.data() != nullptr) emu::wait_all_streams();
    data_ = HostBuffer<T>();
  }
  HostBuffer<T> data_;
  int device_ = 0;
};

//! An event: a mark in one stream (cudaEventRecord) that other streams wait on.
class EmulatedEvent {
 public:
  EmulatedEvent() : state_(std::make_unique<State>()) { state_->device = emu::current_device(); }
  //! Marks the point ctx's stream has reached in what is enqueued on it so far.
  void record(const EmulatedContext& ctx) {
    if (ctx.device != state_->device)
      throw BackendError("xpipe: emulated device: an event of device " +
                         std::to_string(state_->device) + " recorded on a stream of device " +
                         std::to_string(ctx.device) + " (CUDA: cudaErrorInvalidResourceHandle)");
    std::lock_guard lock(state_->m);
    state_->stream = ctx.stream;
    state_->position = ctx.stream->position();
  }
  //! Makes ctx's stream wait for the record current now (later records do not move it).
  void wait(const EmulatedContext& ctx) const {
    emu::Stream* on = nullptr;
    std::uint64_t pos = 0;
    {
      std::lock_guard lock(state_->m);
      on = state_->stream;
      pos = state_->position;
    }
    if (on == nullptr) return;  // never recorded: complete
    ctx.stream->enqueue([on, pos] { on->wait_for(pos); });
  }

 private:
  struct State {
    std::mutex m;
    int device = 0;
    emu::Stream* stream = nullptr;
    std::uint64_t position = 0;
  };
  std::unique_ptr<State> state_;
};

//! The backend tag. `devices`, `jitter_us`, `slow_stage` and `slow_us` apply to contexts made
//! after they are set.
struct EmulatedDevice {
  using Context = EmulatedContext;
  using ContextOwner = EmulatedStreamOwner;
  template <class T>
  using Buffer = EmulatedBuffer<T>;
  template <class T>
  using PinnedBuffer = HostBuffer<T>;
  using Event = EmulatedEvent;
  static constexpr const char* name = "emulated-device";
  static constexpr index_t column_block = Host::column_block;  // the host's bits
  static inline std::atomic<int> devices{1};
  static inline std::atomic<int> jitter_us{0};
  static inline std::atomic<int> slow_stage{-1}, slow_us{0};
};

inline EmulatedStreamOwner::EmulatedStreamOwner(const Placement& p) {
  const int count = EmulatedDevice::devices.load();
  if (p.device >= count)
    throw ConfigError("xpipe: stage " + std::to_string(p.stage) + " placed on emulated device " +
                      std::to_string(p.device) + ", but there are " + std::to_string(count));
  const int device = p.device >= 0 ? p.device : p.stage % count;
  stream_ = std::make_unique<emu::Stream>(
      device, p.stage, EmulatedDevice::jitter_us.load(),
      p.stage == EmulatedDevice::slow_stage.load() ? EmulatedDevice::slow_us.load() : 0);
  ctx_ = {stream_.get(), device};
  emu::current_device() = device;
}

// ---- what kernels/ops.hpp and Pipeline call on a device context (found by ADL) ---------------

inline void activate(const EmulatedContext& ctx) {
  emu::current_device() = ctx.device;
}
inline void synchronize(const EmulatedContext& ctx) {
  ctx.stream->synchronize();
}
//! Every emulated device reaches every other (peer access everywhere).
inline void connect(const EmulatedContext&, const EmulatedContext&) {}

template <class F>
void for_each_index(const EmulatedContext& ctx, index_t n, index_t work, const F& f) {
  static_assert(std::is_trivially_copyable_v<F>,
                "xpipe: a device element loop needs a trivially copyable function object");
  emu::check_launch(ctx, "a kernel");
  if (n <= 0) return;
  ctx.stream->enqueue([n, work, f] { for_each_index(HostContext{}, n, work, f); });
}
template <class F>
void for_each_index(const EmulatedContext& ctx, index_t n, const F& f) {
  for_each_index(ctx, n, n, f);
}
template <class F>
void for_each_element(const EmulatedContext& ctx, index_t rows, index_t cols, const F& f) {
  static_assert(std::is_trivially_copyable_v<F>,
                "xpipe: a device element loop needs a trivially copyable function object");
  emu::check_launch(ctx, "a kernel");
  if (rows <= 0 || cols <= 0) return;
  ctx.stream->enqueue([rows, cols, f] { for_each_element(HostContext{}, rows, cols, f); });
}

inline void gemm(const EmulatedContext& ctx, Trans ta, Trans tb, index_t m, index_t n, index_t k,
                 float alpha, const float* a, index_t lda, const float* b, index_t ldb, float beta,
                 float* c, index_t ldc) {
  emu::check_launch(ctx, "a GEMM");
  ctx.stream->enqueue(
      [=] { gemm(HostContext{}, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); });
}

namespace emu {
template <class T>
void copy_async(const EmulatedContext& ctx, const T* src, T* dst, index_t n) {
  static_assert(std::is_trivially_copyable_v<T>);
  if (n <= 0) return;
  const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(T);
  ctx.stream->enqueue([src, dst, bytes] { std::memcpy(dst, src, bytes); });
}
}  // namespace emu

inline void copy_buffer(const EmulatedContext& ctx, const float* src, float* dst, index_t n) {
  emu::copy_async(ctx, src, dst, n);
}
template <class T>
void copy_from_host(const EmulatedContext& ctx, const T* src, T* dst, index_t n) {
  emu::copy_async(ctx, src, dst, n);
  synchronize(ctx);
}
template <class T>
void copy_to_host(const EmulatedContext& ctx, const T* src, T* dst, index_t n) {
  emu::copy_async(ctx, src, dst, n);
  synchronize(ctx);
}
template <class T>
void copy_from_pinned_async(const EmulatedContext& ctx, const T* src, T* dst, index_t n) {
  emu::copy_async(ctx, src, dst, n);
}

//! The device loss sum (layers/loss.cuh on CUDA), here in row order in double: the host's order,
//! so the epoch's loss has the host's bits.
inline void sum_row_losses_async(const EmulatedContext& ctx, const float* row_loss, index_t rows,
                                 MicroBatchLoss* out) {
  emu::check_launch(ctx, "the loss sum");
  ctx.stream->enqueue([row_loss, rows, out] {
    MicroBatchLoss l;
    for (index_t r = 0; r < rows; ++r) {
      if (l.bad_row < 0 && !std::isfinite(row_loss[r])) {
        l.bad_row = r;
        l.bad_value = row_loss[r];
      }
      l.sum += row_loss[r];
    }
    *out = l;
  });
}

//! Enqueues a task that fails on ctx's stream, as a kernel that faults: the error surfaces at
//! the stream's next synchronisation. For tests of that path.
inline void fail_on_stream(const EmulatedContext& ctx, std::string why) {
  ctx.stream->enqueue([why] { throw BackendError("xpipe: emulated device: " + why); });
}

}  // namespace xpipe::test
