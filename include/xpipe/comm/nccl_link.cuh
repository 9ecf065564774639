// Micro-batch queues between GPU ranks over NCCL (the NcclChannel QueuePolicy) and the
// data-parallel gradient sum (ncclAllReduce on the stage's stream). The same contract as
// comm/mpi_link.hpp: receives enqueued ahead into the pre-allocated device slots, sends
// enqueued from the slot the producer filled, a ready-check that does not block (an event
// query). Include only from CUDA translation units; link NCCL (/usr/local/cuda/lib/libnccl.so).
#pragma once

#if !defined(__CUDACC__)
#error "xpipe/comm/nccl_link.cuh is for CUDA translation units (nvcc)"
#endif

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "xpipe/backend/cuda.cuh"
#include "xpipe/comm/queue.hpp"
#include "xpipe/core/error.hpp"

//! Checks a NCCL call; throws xpipe::BackendError naming the call, file and line.
#define XPIPE_NCCL_CHECK(call)                                                              \
  do {                                                                                      \
    const ncclResult_t xpipe_nr_ = (call);                                                  \
    if (xpipe_nr_ != ncclSuccess)                                                           \
      ::xpipe::cuda_detail::fail(#call, __FILE__, __LINE__, ncclGetErrorString(xpipe_nr_)); \
  } while (0)

namespace xpipe {

//! How a rank's end of one NCCL link is wired. NCCL matches point-to-point messages in the
//! order they are enqueued per peer (no tags), so each direction of each stage boundary gets a
//! communicator of its own, and the consumer gives the micro-batches it will pop, in order,
//! with their rows (NCCL receives need the exact count). `stream` carries the link's
//! transfers: not the stage's compute stream, which a receive enqueued ahead would block.
struct NcclLinkEnd {
  ncclComm_t comm = nullptr;
  bool producer = false, consumer = false;
  int peer = -1;
  cudaStream_t stream = nullptr;
  std::vector<int> order;     // consumer: micro-batch numbers, in the order popped
  std::vector<index_t> rows;  // consumer: rows of each, aligned with order
};

//! One end of a link between two GPU ranks: a Queue of `capacity` device slots of up to rows x
//! cols floats. The producer fills back() on the device and push() enqueues ncclSend from it;
//! can_push() asks (cudaEventQuery) whether that slot's previous send has finished. The
//! consumer keeps a ncclRecv enqueued per slot for the next micro-batches of its order;
//! can_pop() queries the oldest slot's event. Kernels that read front() must run after it
//! (can_pop() true means the bytes have landed).
template <class B = Cuda>
class NcclLink {
 public:
  NcclLink() = default;
  NcclLink(int capacity, index_t rows, index_t cols)
      : capacity_(capacity), rows_(rows), cols_(cols) {
    if (capacity < 1) throw ConfigError("xpipe: NcclLink: capacity must be >= 1");
  }
  NcclLink(NcclLink&& o) noexcept { *this = std::move(o); }
  NcclLink& operator=(NcclLink&& o) noexcept {
    release();
    capacity_ = o.capacity_;
    rows_ = o.rows_;
    cols_ = o.cols_;
    end_ = std::move(o.end_);
    storage_ = std::move(o.storage_);
    slots_ = std::move(o.slots_);
    events_ = std::move(o.events_);
    pending_ = std::move(o.pending_);
    cursor_ = o.cursor_;
    posted_ = o.posted_;
    o.events_.clear();
    return *this;
  }
  ~NcclLink() { release(); }

  //! Wires this end and, for a consumer, enqueues the first receives.
  void connect(NcclLinkEnd end) {
    release();
    end_ = std::move(end);
    if (!end_.producer && !end_.consumer) return;
    if (end_.consumer && end_.rows.size() != end_.order.size())
      throw ConfigError("xpipe: NcclLink: a consumer needs the rows of every micro-batch");
    storage_ = typename B::template Buffer<float>(capacity_ * rows_ * cols_);
    slots_.assign(static_cast<std::size_t>(capacity_), {});
    pending_.assign(static_cast<std::size_t>(capacity_), 0);
    events_.assign(static_cast<std::size_t>(capacity_), nullptr);
    for (int i = 0; i < capacity_; ++i) {
      slots_[std::size_t(i)].data = Matrix{storage_.data() + i * rows_ * cols_, rows_, cols_};
      XPIPE_CUDA_CHECK(cudaEventCreateWithFlags(&events_[std::size_t(i)], cudaEventDisableTiming));
    }
    cursor_ = 0;
    posted_ = 0;
    if (end_.consumer)
      for (int i = 0; i < capacity_; ++i) post_receive(i);
  }

  // ---- producer side ----
  bool can_push() const { return done(cursor_); }
  MicroBatchMessage& back() { return slots_[static_cast<std::size_t>(cursor_)]; }
  void push() {
    const MicroBatchMessage& m = back();
    XPIPE_NCCL_CHECK(ncclSend(m.data.data, static_cast<std::size_t>(m.data.rows * cols_), ncclFloat,
                              end_.peer, end_.comm, end_.stream));
    record(cursor_);
    cursor_ = (cursor_ + 1) % capacity_;
  }

  // ---- consumer side ----
  bool can_pop() const { return !events_.empty() && done(cursor_); }
  const MicroBatchMessage& front() const { return slots_[static_cast<std::size_t>(cursor_)]; }
  void pop() {
    post_receive(cursor_);
    cursor_ = (cursor_ + 1) % capacity_;
  }

 private:
  bool done(int i) const {
    const auto u = static_cast<std::size_t>(i);
    if (!pending_[u]) return true;
    const cudaError_t e = cudaEventQuery(events_[u]);
    if (e == cudaErrorNotReady) return false;
    XPIPE_CUDA_CHECK(e);
    pending_[u] = 0;
    return true;
  }
  void record(int i) {
    XPIPE_CUDA_CHECK(cudaEventRecord(events_[std::size_t(i)], end_.stream));
    pending_[std::size_t(i)] = 1;
  }
  void post_receive(int i) {
    const auto u = static_cast<std::size_t>(i);
    if (posted_ >= end_.order.size()) {
      slots_[u].micro_batch = -1;
      return;
    }
    slots_[u].micro_batch = end_.order[posted_];
    slots_[u].data.rows = end_.rows[posted_];
    ++posted_;
    XPIPE_NCCL_CHECK(ncclRecv(slots_[u].data.data,
                              static_cast<std::size_t>(slots_[u].data.rows * cols_), ncclFloat,
                              end_.peer, end_.comm, end_.stream));
    record(i);
  }
  void release() noexcept {
    if (!events_.empty() && end_.stream != nullptr) cudaStreamSynchronize(end_.stream);
    for (cudaEvent_t e : events_)
      if (e != nullptr) cudaEventDestroy(e);
    events_.clear();
  }

  int capacity_ = 1;
  index_t rows_ = 0, cols_ = 0;
  NcclLinkEnd end_;
  typename B::template Buffer<float> storage_;
  std::vector<MicroBatchMessage> slots_;
  std::vector<cudaEvent_t> events_;
  mutable std::vector<char> pending_;
  int cursor_ = 0;
  std::size_t posted_ = 0;
};

//! The QueuePolicy of pipelines whose stages run on different GPU ranks over NCCL. Usage:
//! `Pipeline<S0, S1, XPipe, Cuda, NcclChannel>` (the CUDA executor wires the ends).
struct NcclChannel {
  template <class B>
  using queue = NcclLink<B>;
  static constexpr const char* name = "nccl";
};

static_assert(Queue<NcclLink<Cuda>>);

//! Enqueues the sum of a stage's flat gradient `g` (device memory) over the ranks of
//! `replicas` on `stream`, in place: ncclAllReduce on the stage's stream, so it starts when the
//! stage's last backward ends and the step enqueued after it waits for it, while the host goes
//! on. Divide by R afterwards (scale_gradient_sum's rule, on the device).
inline void nccl_gradient_sum(std::span<float> g, ncclComm_t replicas, cudaStream_t stream) {
  XPIPE_NCCL_CHECK(
      ncclAllReduce(g.data(), g.data(), g.size(), ncclFloat, ncclSum, replicas, stream));
}

}  // namespace xpipe
