// A device backend emulated on the host, for testing the device half of Pipeline (what a CUDA
// pipeline runs outside its kernels) on machines without a GPU.
//
// The math is the host's; what is emulated is how a GPU runs it. Each stage context is a
// stream, a worker thread that runs what the stage enqueues later and in order, while the host
// thread that enqueued it goes on. Streams order each other only through events. Buffers are
// host memory that the pipeline must treat as device memory: the context is not a HostContext,
// so Pipeline::on_device holds and its device paths run (the epoch upload, the loss summed "on
// the device" and read after the run, copies for weights(), evaluate() and checkpoints). Not
// run: the CUDA kernels themselves (cuBLASLt, the vectorised passes, the CUB loss sum).
//
// The CUDA rules the emulation enforces, each a BackendError naming what broke it:
//   - a kernel or GEMM may be enqueued only on a stream of the current device (`activate`);
//     copies may go to any stream;
//   - what a GEMM, a copy or the loss sum reads or writes must be emulated device memory (an
//     EmulatedBuffer), on the stream's device or on one `connect`ed to it (peer access); an
//     asynchronous upload must come from pinned memory (an EmulatedPinnedBuffer). Element loops
//     take their pointers inside function objects and are not checked;
//   - an event is recorded only on a stream of the device it was created on; a stream may wait
//     on an event of any device; a wait takes the record current when the wait is enqueued, and
//     an event never recorded is complete; the host asks done() (cudaEventQuery), which throws
//     the device's fault if it has one;
//   - the host may read pinned memory a stream copies into (copy_to_pinned_async) only once an
//     event recorded after the copy is done: the destination holds NaN while the copy runs (its
//     content is undefined on CUDA; here a task of its own, the stream's delay after it), so a
//     message sent early carries NaN or stale values;
//   - the host may write pinned memory a stream copies from (copy_from_pinned_async) only once
//     an event recorded after the copy is done: a copy whose source changed between its enqueue
//     and its run faults its device ("the host changed pinned memory ...");
//   - freeing a buffer first waits for every stream of its device (cudaFree synchronises);
//   - with mpi_aware (a CUDA-aware MPI), MPI reads and writes the device slots themselves: a
//     send started before the stage's writes have run carries the slot's stale values, and a
//     receive posted again before the stage's reads have run overwrites what they read;
//   - a data-parallel gradient mean on the device (emulated_replica_mean.hpp, what NCCL's
//     all-reduce is on CUDA) is a task of the stage's stream that completes only once every
//     replica's stream has reached its own, so one enqueued before the backward it averages, or
//     summed on the host at enqueue time, averages stale gradients;
//   - a task that throws is a fault of its device, sticky as an illegal address is in CUDA:
//     every later task on every stream of that device is skipped and every synchronisation
//     there throws it, until the device's last stream is gone.
//
// Timing: with EmulatedDevice::jitter_us > 0 every stream sleeps a random 0..jitter_us
// microseconds before each task, so streams run at varying speeds and a consumer that does not
// wait for a slot to be filled reads it early; with slow_stage = k, stage k's stream also sleeps
// slow_us before each task, so it lags its neighbours by whole micro-batches. Either way the
// weights then differ from the host's. The element loops and GEMMs run as on the host with one
// thread, so a pipeline on this backend gives the host backend's bits.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "xpipe/backend/host.hpp"
#include "xpipe/core/buffer.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/kernels/im2col.hpp"
#include "xpipe/layers/loss.hpp"

namespace xpipe::test {

struct EmulatedDevice;

namespace emu {

// The device the calling host thread has made current (cudaSetDevice is per thread).
inline int& current_device() {
  thread_local int device = 0;
  return device;
}

// A stream's queue and counters: shared with the tasks of other streams that wait on it, so a
// wait never outlives what it waits on.
struct StreamCore {
  std::mutex m;
  std::condition_variable cv;
  std::deque<std::function<void()>> tasks;
  std::uint64_t enqueued = 0, completed = 0;
  bool stop = false;

  //! Blocks the caller until the first `pos` tasks have run (or been skipped).
  void wait_for(std::uint64_t pos) {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return completed >= pos; });
  }
  std::uint64_t position() {
    std::lock_guard lock(m);
    return enqueued;
  }
};

// What the emulated devices share: the live streams, each device's sticky fault, the device
// pairs connected for peer access, and every live buffer's address range.
struct Machine {
  struct Range {
    std::uintptr_t end;
    int device;
    bool pinned;
  };
  std::mutex m;
  std::vector<std::pair<int, std::shared_ptr<StreamCore>>> streams;  // (device, stream)
  std::map<int, std::exception_ptr> fault;
  std::set<std::pair<int, int>> peers;
  std::map<std::uintptr_t, Range> memory;  // by first address

  static Machine& get() {
    static Machine machine;
    return machine;
  }
  std::exception_ptr fault_of(int device) {
    std::lock_guard lock(m);
    const auto it = fault.find(device);
    return it == fault.end() ? nullptr : it->second;
  }
};

// The worker threads' marker: a stream's task must not wait for its own device to go idle.
inline bool& on_worker() {
  thread_local bool worker = false;
  return worker;
}

// Waits until every stream of `device` has run what was enqueued on it (cudaFree's implicit
// synchronisation).
inline void wait_for_device(int device) {
  if (on_worker())
    throw BackendError("xpipe: emulated device: a stream's task freed device memory");
  std::vector<std::pair<std::shared_ptr<StreamCore>, std::uint64_t>> marks;
  {
    Machine& mc = Machine::get();
    std::lock_guard lock(mc.m);
    for (const auto& [d, core] : mc.streams)
      if (d == device) marks.emplace_back(core, core->position());
  }
  for (auto& [core, pos] : marks) core->wait_for(pos);
}

//! One emulated stream: a worker thread running enqueued tasks in order.
class Stream {
 public:
  Stream(int device, unsigned seed, int jitter_us, int slow_us)
      : device_(device),
        jitter_us_(jitter_us),
        slow_us_(slow_us),
        core_(std::make_shared<StreamCore>()),
        rng_(seed) {
    Machine& mc = Machine::get();
    {
      std::lock_guard lock(mc.m);
      mc.streams.emplace_back(device_, core_);
    }
    worker_ = std::thread([this] { work(); });
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  //! Runs what is still enqueued, then ends; the device's fault is forgotten with its last
  //! stream (as a reset device starts clean).
  ~Stream() {
    {
      std::lock_guard lock(core_->m);
      core_->stop = true;
    }
    core_->cv.notify_all();
    worker_.join();
    Machine& mc = Machine::get();
    std::lock_guard lock(mc.m);
    std::erase_if(mc.streams, [&](const auto& s) { return s.second == core_; });
    if (std::none_of(mc.streams.begin(), mc.streams.end(),
                     [&](const auto& s) { return s.first == device_; }))
      mc.fault.erase(device_);
  }

  int device() const { return device_; }
  const std::shared_ptr<StreamCore>& core() const { return core_; }

  //! Appends a task.
  void enqueue(std::function<void()> task) {
    {
      std::lock_guard lock(core_->m);
      core_->tasks.push_back(std::move(task));
      ++core_->enqueued;
    }
    core_->cv.notify_all();
  }
  //! Waits for everything enqueued so far; throws the device's fault if it has one.
  void synchronize() {
    core_->wait_for(core_->position());
    if (const std::exception_ptr f = Machine::get().fault_of(device_)) std::rethrow_exception(f);
  }

 private:
  void work() {
    on_worker() = true;
    ScopedFlushDenormals ftz;  // as the host executors' stage threads: the same bits
    std::uniform_int_distribution<int> pause(0, jitter_us_ > 0 ? jitter_us_ : 0);
    StreamCore& c = *core_;
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock lock(c.m);
        c.cv.wait(lock, [&] { return c.stop || !c.tasks.empty(); });
        if (c.tasks.empty()) return;  // stopping, nothing left
        task = std::move(c.tasks.front());
        c.tasks.pop_front();
      }
      const int us = slow_us_ + (jitter_us_ > 0 ? pause(rng_) : 0);
      if (us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
      if (!Machine::get().fault_of(device_)) {
        try {
          task();
        } catch (...) {
          Machine& mc = Machine::get();
          std::lock_guard lock(mc.m);
          mc.fault.emplace(device_, std::current_exception());  // the first fault stays
        }
      }
      {
        std::lock_guard lock(c.m);
        ++c.completed;
      }
      c.cv.notify_all();
    }
  }

  const int device_;
  const int jitter_us_, slow_us_;
  std::shared_ptr<StreamCore> core_;
  std::minstd_rand rng_;
  std::thread worker_;
};

// Records [p, p + bytes) as memory of `device` (pinned host memory when `pinned`).
inline void add_memory(const void* p, std::size_t bytes, int device, bool pinned) {
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  Machine& mc = Machine::get();
  std::lock_guard lock(mc.m);
  mc.memory[at] = {at + bytes, device, pinned};
}
inline void remove_memory(const void* p) {
  Machine& mc = Machine::get();
  std::lock_guard lock(mc.m);
  mc.memory.erase(reinterpret_cast<std::uintptr_t>(p));
}

// Throws unless p lies in a live buffer: device memory that a stream of `device` may touch
// (its own, or a connected peer's; any device when device < 0, as a copy may), or pinned host
// memory when `pinned`. `what` names the operand in the message.
inline void check_memory(const void* p, int device, bool pinned, const char* what) {
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  Machine& mc = Machine::get();
  std::lock_guard lock(mc.m);
  auto it = mc.memory.upper_bound(at);
  const bool inside = it != mc.memory.begin() && at < (--it)->second.end;
  std::string fault;
  if (!inside)
    fault = "is not in any live emulated buffer (host memory handed to the device?)";
  else if (it->second.pinned != pinned)
    fault = pinned ? "is device memory, not pinned host memory" : "is pinned host memory";
  else if (!pinned && device >= 0 && it->second.device != device &&
           !mc.peers.contains({device, it->second.device}))
    fault = "is memory of device " + std::to_string(it->second.device) + ", which device " +
            std::to_string(device) + " has no peer access to";
  if (!fault.empty())
    throw BackendError(std::string("xpipe: emulated device: ") + what + " " + fault);
}

}  // namespace emu

//! The emulated backend's context: a stream on one emulated device. Not a HostContext: the
//! pipeline must not read its buffers on the host.
struct EmulatedContext {
  using backend = EmulatedDevice;
  emu::Stream* stream = nullptr;
  int device = 0;
};

class EmulatedStreamOwner;
template <class T, bool Pinned>
class EmulatedMemory;
//! Emulated device memory.
template <class T>
using EmulatedBuffer = EmulatedMemory<T, false>;
//! Emulated pinned host memory.
template <class T>
using EmulatedPinnedBuffer = EmulatedMemory<T, true>;
class EmulatedEvent;

//! The backend tag. The settings apply to contexts (streams) made after they are set.
struct EmulatedDevice {
  using Context = EmulatedContext;
  using ContextOwner = EmulatedStreamOwner;
  template <class T>
  using Buffer = EmulatedBuffer<T>;
  template <class T>
  using PinnedBuffer = EmulatedPinnedBuffer<T>;
  using Event = EmulatedEvent;
  static constexpr const char* name = "emulated-device";
  static constexpr index_t column_block = Host::column_block;  // the host's bits
  //! Emulated devices; stage k goes to device k % devices unless placed.
  static inline std::atomic<int> devices{1};
  //! Each stream sleeps a random 0..jitter_us microseconds before each task (seeded by `seed`
  //! and the stage), and stage slow_stage's stream slow_us more.
  static inline std::atomic<int> jitter_us{0};
  static inline std::atomic<int> slow_stage{-1}, slow_us{0};
  static inline std::atomic<unsigned> seed{1};
  //! A self-check of the tests, never for use: event waits do nothing, so streams run
  //! unordered and a pipeline's bits must come out wrong.
  static inline std::atomic<bool> skip_waits{false};
  //! A self-check of the tests, never for use: an event's done() is true at once, so the host
  //! touches pinned memory before the copies reach it (MPI staging sends NaN, or re-posts a
  //! receive under a pending copy, which faults).
  static inline std::atomic<bool> done_early{false};
  //! MPI moves emulated device memory itself, as a CUDA-aware MPI moves CUDA's: StagedMpiLink
  //! then sends and receives the device slots, with no pinned copies (off: it stages them).
  static inline std::atomic<bool> mpi_aware{false};
  static bool mpi_moves_device_memory() { return mpi_aware; }
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
//! Usage: `EmulatedStreamOwner owner(Placement{.stage = 1}); owner.ctx()`.
class EmulatedStreamOwner {
 public:
  explicit EmulatedStreamOwner(const Placement& p);
  const EmulatedContext& ctx() const { return ctx_; }

 private:
  std::unique_ptr<emu::Stream> stream_;
  EmulatedContext ctx_;
};

//! An owning array of T in emulated memory: host memory, zero-filled, registered as memory of
//! the device current at its creation or, when Pinned, as pinned host memory (what an
//! asynchronous upload may read). Freeing device memory first waits for that device's streams.
template <class T, bool Pinned>
class EmulatedMemory {
 public:
  EmulatedMemory() = default;
  explicit EmulatedMemory(index_t size)
      : data_(size), device_(Pinned ? -1 : emu::current_device()) {
    if (data_.data() != nullptr) emu::add_memory(data_.data(), data_.bytes(), device_, Pinned);
  }
  EmulatedMemory(EmulatedMemory&& o) noexcept = default;
  EmulatedMemory& operator=(EmulatedMemory&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::move(o.data_);
      device_ = o.device_;
    }
    return *this;
  }
  ~EmulatedMemory() { release(); }
  T* data() noexcept { return data_.data(); }
  const T* data() const noexcept { return data_.data(); }
  index_t size() const noexcept { return data_.size(); }

 private:
  void release() noexcept {
    if (data_.data() == nullptr) return;
    if (!Pinned) emu::wait_for_device(device_);
    emu::remove_memory(data_.data());
    data_ = HostBuffer<T>();
  }
  HostBuffer<T> data_;
  int device_ = -1;
};

//! An event: a mark in one stream (cudaEventRecord) that other streams wait on.
class EmulatedEvent {
 public:
  EmulatedEvent() : state_(std::make_unique<State>()) { state_->device = emu::current_device(); }
  //! Marks the point ctx's stream has reached in what is enqueued on it so far.
  void record(const EmulatedContext& ctx) {
    check_live();
    if (ctx.device != state_->device)
      throw BackendError("xpipe: emulated device: an event of device " +
                         std::to_string(state_->device) + " recorded on a stream of device " +
                         std::to_string(ctx.device) + " (CUDA: cudaErrorInvalidResourceHandle)");
    std::lock_guard lock(state_->m);
    state_->stream = ctx.stream->core();
    state_->position = state_->stream->position();
  }
  //! Whether the stream of the record current now has run what was enqueued before it (never
  //! recorded: true); throws the device's fault, as cudaEventQuery returns a sticky error.
  bool done() const {
    const auto [on, pos] = current_record();
    if (on == nullptr || EmulatedDevice::done_early) return true;
    bool passed = false;
    {
      std::lock_guard lock(on->m);
      passed = on->completed >= pos;
    }
    if (const std::exception_ptr f = emu::Machine::get().fault_of(state_->device))
      std::rethrow_exception(f);
    return passed;
  }
  //! Makes ctx's stream wait for the record current now (later records do not move it).
  void wait(const EmulatedContext& ctx) const {
    const auto [on, pos] = current_record();
    if (on == nullptr || EmulatedDevice::skip_waits) return;  // never recorded: complete
    ctx.stream->enqueue([on, pos] { on->wait_for(pos); });
  }

 private:
  void check_live() const {
    if (!state_) throw BackendError("xpipe: emulated device: use of a moved-from event");
  }
  // The stream and position of the record current now (none: never recorded).
  std::pair<std::shared_ptr<emu::StreamCore>, std::uint64_t> current_record() const {
    check_live();
    std::lock_guard lock(state_->m);
    return {state_->stream, state_->position};
  }
  struct State {
    std::mutex m;
    int device = 0;
    std::shared_ptr<emu::StreamCore> stream;
    std::uint64_t position = 0;
  };
  std::unique_ptr<State> state_;
};

inline EmulatedStreamOwner::EmulatedStreamOwner(const Placement& p) {
  const int count = EmulatedDevice::devices.load();
  if (p.device >= count)
    throw ConfigError("xpipe: stage " + std::to_string(p.stage) + " placed on emulated device " +
                      std::to_string(p.device) + ", but there are " + std::to_string(count));
  const int device = p.device >= 0 ? p.device : p.stage % count;
  stream_ = std::make_unique<emu::Stream>(
      device, EmulatedDevice::seed.load() * 7919u + static_cast<unsigned>(p.stage),
      EmulatedDevice::jitter_us.load(),
      p.stage == EmulatedDevice::slow_stage.load() ? EmulatedDevice::slow_us.load() : 0);
  ctx_ = {stream_.get(), device};
  emu::current_device() = device;
}

// ---- what kernels/ops.hpp and Pipeline call on a device context (found by ADL) ---------------

//! Makes ctx's device current on the calling thread (cudaSetDevice).
inline void activate(const EmulatedContext& ctx) {
  emu::current_device() = ctx.device;
}
//! Waits for ctx's stream; throws its device's fault, if any.
inline void synchronize(const EmulatedContext& ctx) {
  ctx.stream->synchronize();
}
//! Peer access between the two contexts' devices, both ways; leaves b's device current, as
//! the CUDA backend's connect does when the devices differ.
inline void connect(const EmulatedContext& a, const EmulatedContext& b) {
  if (a.device == b.device) return;
  emu::Machine& mc = emu::Machine::get();
  {
    std::lock_guard lock(mc.m);
    mc.peers.insert({a.device, b.device});
    mc.peers.insert({b.device, a.device});
  }
  emu::current_device() = b.device;
}

//! The host element loop, enqueued on ctx's stream (one thread: the host's bits).
template <class F>
void for_each_index(const EmulatedContext& ctx, index_t n, index_t work, const F& f) {
  static_assert(std::is_trivially_copyable_v<F>,
                "xpipe: a device element loop needs a trivially copyable function object");
  if (n <= 0) return;
  emu::check_launch(ctx, "a kernel");
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
  if (rows <= 0 || cols <= 0) return;
  emu::check_launch(ctx, "a kernel");
  ctx.stream->enqueue([rows, cols, f] { for_each_element(HostContext{}, rows, cols, f); });
}

template <class F>
void for_each_pixel(const EmulatedContext& ctx, index_t rows, index_t plane, index_t channels,
                    const F& f) {
  static_assert(std::is_trivially_copyable_v<F>,
                "xpipe: a device element loop needs a trivially copyable function object");
  if (rows <= 0 || plane <= 0 || channels <= 0) return;
  emu::check_launch(ctx, "a kernel");
  ctx.stream->enqueue(
      [rows, plane, channels, f] { for_each_pixel(HostContext{}, rows, plane, channels, f); });
}

//! The host GEMM, enqueued on ctx's stream; its operands must be device memory it may reach.
inline void gemm(const EmulatedContext& ctx, Trans ta, Trans tb, index_t m, index_t n, index_t k,
                 float alpha, const float* a, index_t lda, const float* b, index_t ldb, float beta,
                 float* c, index_t ldc) {
  emu::check_launch(ctx, "a GEMM");
  emu::check_memory(a, ctx.device, false, "GEMM operand A");
  emu::check_memory(b, ctx.device, false, "GEMM operand B");
  emu::check_memory(c, ctx.device, false, "GEMM result C");
  ctx.stream->enqueue(
      [=] { gemm(HostContext{}, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); });
}

namespace emu {
template <class T>
void copy_async(const EmulatedContext& ctx, const T* src, T* dst, index_t n) {
  static_assert(std::is_trivially_copyable_v<T>);
  const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(T);
  ctx.stream->enqueue([src, dst, bytes] { std::memcpy(dst, src, bytes); });
}
// A copy between the host and the device that the host waits for; `device_side` (src or dst)
// must be device memory, `what` names it.
template <class T>
void copy_waited(const EmulatedContext& ctx, const T* src, T* dst, index_t n,
                 const void* device_side, const char* what) {
  if (n <= 0) return;
  check_memory(device_side, -1, false, what);
  copy_async(ctx, src, dst, n);
  ctx.stream->synchronize();
}
}  // namespace emu

//! dst = src between device buffers (of any devices), on ctx's stream.
inline void copy_buffer(const EmulatedContext& ctx, const float* src, float* dst, index_t n) {
  if (n <= 0) return;
  emu::check_memory(src, -1, false, "copy source");
  emu::check_memory(dst, -1, false, "copy destination");
  emu::copy_async(ctx, src, dst, n);
}
//! Host to device, waited for.
template <class T>
void copy_from_host(const EmulatedContext& ctx, const T* src, T* dst, index_t n) {
  emu::copy_waited(ctx, src, dst, n, dst, "upload destination");
}
//! Device to host, after what ctx's stream has before it, waited for.
template <class T>
void copy_to_host(const EmulatedContext& ctx, const T* src, T* dst, index_t n) {
  emu::copy_waited(ctx, src, dst, n, src, "download source");
}
namespace emu {
// FNV-1a over the bytes of [p, p + bytes).
inline std::uint64_t bytes_hash(const void* p, std::size_t bytes) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}
}  // namespace emu

//! Pinned host memory to the device, enqueued on ctx's stream. The source's bytes as enqueued
//! are what the copy must find when it runs: a host that wrote them in between (before an event
//! after the copy was done) faults the device.
template <class T>
void copy_from_pinned_async(const EmulatedContext& ctx, const T* src, T* dst, index_t n) {
  static_assert(std::is_trivially_copyable_v<T>);
  if (n <= 0) return;
  emu::check_memory(src, -1, true, "asynchronous upload source");
  emu::check_memory(dst, -1, false, "asynchronous upload destination");
  const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(T);
  const std::uint64_t as_enqueued = emu::bytes_hash(src, bytes);
  ctx.stream->enqueue([src, dst, bytes, as_enqueued] {
    if (emu::bytes_hash(src, bytes) != as_enqueued)
      throw BackendError(
          "xpipe: emulated device: the host changed pinned memory while an asynchronous copy "
          "from it was pending (wait for an event recorded after the copy first)");
    std::memcpy(dst, src, bytes);
  });
}

//! Device memory to pinned host memory, enqueued on ctx's stream after what it has before it.
//! The copy runs as two tasks, the stream's delay between them: the destination first filled
//! with NaN (a copy in progress: undefined on CUDA), then written, so a host that reads it
//! before an event after the copy is done may read NaN.
template <class T>
void copy_to_pinned_async(const EmulatedContext& ctx, const T* src, T* dst, index_t n) {
  static_assert(std::is_trivially_copyable_v<T>);
  if (n <= 0) return;
  emu::check_memory(src, -1, false, "asynchronous download source");
  emu::check_memory(dst, -1, true, "asynchronous download destination");
  if constexpr (std::is_floating_point_v<T>)
    ctx.stream->enqueue([dst, n] { std::fill(dst, dst + n, std::numeric_limits<T>::quiet_NaN()); });
  emu::copy_async(ctx, src, dst, n);
}

//! The device loss sum (layers/loss.cuh on CUDA), here in row order in double: the host's order,
//! so the epoch's loss has the host's bits.
inline void sum_row_losses_async(const EmulatedContext& ctx, const float* row_loss, index_t rows,
                                 MicroBatchLoss* out) {
  emu::check_launch(ctx, "the loss sum");
  emu::check_memory(row_loss, ctx.device, false, "the row losses");
  emu::check_memory(out, ctx.device, false, "the loss sum's output");
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

//! A stage's squared gradient norm under global clipping (layers/loss.cuh on CUDA), here the
//! host's squared_norm, so a clipped pipeline has the host's bits. `out` may be on a connected
//! device (the norms live on stage 0's); a stage that read it before this task ran would see
//! what was there before (DeviceEpoch fills it with NaN).
inline void squared_norm_async(const EmulatedContext& ctx, const float* x, index_t n, double* out) {
  emu::check_launch(ctx, "the squared norm");
  if (n > 0) emu::check_memory(x, ctx.device, false, "the squared norm's input");
  emu::check_memory(out, ctx.device, false, "the squared norm's output");
  ctx.stream->enqueue([x, n, out] { *out = squared_norm(x, n); });
}

//! Enqueues a task that faults on ctx's stream, as a kernel reading an illegal address does:
//! the fault is its device's from then on. Usage: `fail_on_stream(ctx, "illegal address");`
inline void fail_on_stream(const EmulatedContext& ctx, std::string why) {
  ctx.stream->enqueue([why] { throw BackendError("xpipe: emulated device: " + why); });
}

}  // namespace xpipe::test

namespace xpipe {

//! The emulated device's convolution is CUDA's (Im2colConvPlans): im2col, the GEMMs, col2im and
//! the bias passes enqueued on the stage's stream, its workspace in the device's memory. A CNN on
//! the emulated device thus runs the GPU's convolution code under CUDA's ordering rules.
template <>
class ConvPlans<test::EmulatedDevice> : public Im2colConvPlans<test::EmulatedDevice> {
 public:
  using Im2colConvPlans<test::EmulatedDevice>::Im2colConvPlans;
};

}  // namespace xpipe
