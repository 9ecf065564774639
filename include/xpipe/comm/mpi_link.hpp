// Micro-batch queues between MPI ranks (the MpiChannel QueuePolicy): one end of a stage
// boundary per rank, receives posted ahead into the pre-allocated slots, sends non-blocking, a
// tag per (micro-batch, direction, lane); a boundary between two stages of one rank, and every
// boundary of a pipeline trained in one process (threaded or reference executor), is the
// in-process ring (SpscRing). Needs <mpi.h>: link xpipe::mpi (Debian: libopenmpi-dev).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "xpipe/backend/host.hpp"
#include "xpipe/comm/mpi_link_end.hpp"
#include "xpipe/comm/mpi_staged_link.hpp"
#include "xpipe/comm/queue.hpp"
#include "xpipe/comm/spsc_ring.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/core/tensor.hpp"

namespace xpipe {

//! One end of a link between two ranks: a Queue of `capacity` pre-allocated slots of up to
//! rows x cols floats in host memory. Constructed, it is an in-process ring (SpscRing: one
//! producer thread, one consumer thread), so a Pipeline<..., MpiChannel> trains in one process
//! with the threaded or reference executor, with the same bits. MpiExecutor connects the ends
//! (connect): a rank keeps the ring where it holds both ends (LinkRole::Both), frees it where it
//! holds neither, and where it holds one it trades it for MPI slots: a consumer keeps one
//! receive posted per slot for the next micro-batches of its order, so `can_pop()` is an
//! MPI_Test of the oldest and `front()` reads the slot the message landed in; a producer fills
//! `back()` in place and `push()` starts an MPI_Isend from it, and `can_push()` tests whether
//! that slot's previous send has completed.
template <class B = Host>
class MpiLink {
  // MPI_Isend/MPI_Irecv take the slots' addresses and the host threads test the requests: the
  // slots must be host memory (Open MPI as Debian builds it is not CUDA-aware).
  static_assert(
      requires { requires B::host_memory; },
      "xpipe: MpiLink carries host memory between ranks: a device backend's links are "
      "StagedMpiLink (comm/mpi_staged_link.hpp), which MpiChannel names for it");

 public:
  MpiLink() = default;
  MpiLink(int capacity, index_t rows, index_t cols)
      : capacity_(capacity), rows_(rows), cols_(cols) {
    if (capacity < 1) throw ConfigError("xpipe: MpiLink: capacity must be >= 1");
    ring_.emplace(capacity, rows, cols);
  }
  MpiLink(MpiLink&& o) noexcept { *this = std::move(o); }
  MpiLink& operator=(MpiLink&& o) noexcept {
    release();
    capacity_ = o.capacity_;
    rows_ = o.rows_;
    cols_ = o.cols_;
    end_ = std::move(o.end_);
    tag_ub_ = o.tag_ub_;
    ring_.reset();
    if (o.ring_) ring_.emplace(std::move(*o.ring_));
    o.ring_.reset();
    storage_ = std::move(o.storage_);
    slots_ = std::move(o.slots_);
    requests_ = std::move(o.requests_);
    arrived_ = std::move(o.arrived_);
    cursor_ = o.cursor_;
    posted_ = o.posted_;
    o.requests_.clear();
    return *this;
  }
  ~MpiLink() { release(); }

  //! Wires this end (see MpiLinkEnd) and, for a consumer, posts the first receives. MPI reads
  //! and writes the slots directly (host memory).
  void connect(MpiLinkEnd end) {
    release();
    end_ = std::move(end);
    ring_.reset();
    storage_ = {};
    slots_.clear();
    if (end_.role == LinkRole::None) return;
    if (end_.role == LinkRole::Both) {  // both stages on this rank: a ring, no MPI
      ring_.emplace(capacity_, rows_, cols_);
      return;
    }
    tag_ub_ = mpi_tag_upper_bound(end_.comm);
    storage_ = typename B::template Buffer<float>(capacity_ * rows_ * cols_);
    slots_.assign(static_cast<std::size_t>(capacity_), {});
    requests_.assign(static_cast<std::size_t>(capacity_), MPI_REQUEST_NULL);
    arrived_.assign(static_cast<std::size_t>(capacity_), 0);
    for (int i = 0; i < capacity_; ++i)
      slots_[static_cast<std::size_t>(i)].data =
          Matrix{storage_.data() + i * rows_ * cols_, rows_, cols_};
    cursor_ = 0;
    posted_ = 0;
    if (end_.role == LinkRole::Consumer)
      for (int i = 0; i < capacity_; ++i) post_receive(i);
  }
  const MpiLinkEnd& end() const { return end_; }

  // ---- producer side ----
  bool can_push() const { return ring_ ? ring_->can_push() : test(cursor_); }
  MicroBatchMessage& back() {
    return ring_ ? ring_->back() : slots_[static_cast<std::size_t>(cursor_)];
  }
  void push() {
    if (ring_) {
      ring_->push();
      return;
    }
    MicroBatchMessage& m = back();
    XPIPE_MPI_CHECK(MPI_Isend(m.data.data, static_cast<int>(m.data.rows * cols_), MPI_FLOAT,
                              end_.peer, end_.tag(m.micro_batch, tag_ub_), end_.comm,
                              &requests_[static_cast<std::size_t>(cursor_)]));
    arrived_[static_cast<std::size_t>(cursor_)] = 0;
    cursor_ = (cursor_ + 1) % capacity_;
  }

  // ---- consumer side ----
  bool can_pop() const {
    if (ring_) return ring_->can_pop();
    return requests_.empty() ? false : test(cursor_);
  }
  const MicroBatchMessage& front() const {
    return ring_ ? ring_->front() : slots_[static_cast<std::size_t>(cursor_)];
  }
  void pop() {
    if (ring_) {
      ring_->pop();
      return;
    }
    post_receive(cursor_);
    cursor_ = (cursor_ + 1) % capacity_;
  }

  //! Producer: whether every send has completed (the buffers may be reused or freed).
  bool sends_done() const {
    if (end_.role != LinkRole::Producer) return true;
    for (int i = 0; i < capacity_; ++i)
      if (!test(i)) return false;
    return true;
  }

 private:
  // Whether slot i's request has completed (a slot with none counts as done). For a receive,
  // records the message's rows (from its size) and micro-batch (from the order).
  bool test(int i) const {
    const auto u = static_cast<std::size_t>(i);
    if (arrived_[u]) return true;
    if (requests_[u] == MPI_REQUEST_NULL) return (arrived_[u] = 1) != 0;
    int done = 0;
    MPI_Status st;
    XPIPE_MPI_CHECK(MPI_Test(&requests_[u], &done, &st));
    if (!done) return false;
    if (end_.role == LinkRole::Consumer) {
      int count = 0;
      XPIPE_MPI_CHECK(MPI_Get_count(&st, MPI_FLOAT, &count));
      slots_[u].data.rows = count / cols_;
    }
    return (arrived_[u] = 1) != 0;
  }

  // Posts slot i's receive for the next micro-batch of the order (none when all are posted: the
  // slot then stays empty and can_pop() would report its old message, but no action asks).
  void post_receive(int i) {
    const auto u = static_cast<std::size_t>(i);
    arrived_[u] = 0;
    if (posted_ >= end_.order.size()) {
      slots_[u].micro_batch = -1;
      return;
    }
    const int g = end_.order[posted_++];
    slots_[u].micro_batch = g;
    XPIPE_MPI_CHECK(MPI_Irecv(slots_[u].data.data, static_cast<int>(rows_ * cols_), MPI_FLOAT,
                              end_.peer, end_.tag(g, tag_ub_), end_.comm, &requests_[u]));
  }

  // Cancels receives still posted and lets go of sends still in flight (only after a failed
  // run: a complete run consumes every receive and drains every send first).
  void release() noexcept {
    for (MPI_Request& r : requests_) {
      if (r == MPI_REQUEST_NULL) continue;
      if (end_.role == LinkRole::Consumer) MPI_Cancel(&r);
      MPI_Request_free(&r);
    }
    requests_.clear();
  }

  int capacity_ = 1;
  index_t rows_ = 0, cols_ = 0;
  MpiLinkEnd end_;
  int tag_ub_ = 32767;
  std::optional<SpscRing<B>> ring_;             // in one process, or both ends on this rank
  typename B::template Buffer<float> storage_;  // one end on this rank: the MPI slots
  mutable std::vector<MicroBatchMessage> slots_;
  mutable std::vector<MPI_Request> requests_;
  mutable std::vector<char> arrived_;
  int cursor_ = 0;  // the slot a producer fills next, or a consumer reads
  std::size_t posted_ = 0;
};

namespace detail {
template <class B>
concept HostMemoryBackend = requires {
  requires B::host_memory;
};
}  // namespace detail

//! The QueuePolicy of pipelines whose stages run on different MPI ranks (MpiExecutor), which
//! train in one process too (threaded, reference, CUDA executor: the links stay in-process
//! rings), so one Pipeline type serves both. On the host the links are MpiLink (MPI moves the
//! slots themselves); on a device backend StagedMpiLink (device slots, staged through pinned
//! host memory). Usage:
//! `Pipeline<S0, S1, XPipe, MpiChannel> p; MpiExecutor e; p.train(schedule, data, e);`
//! `Pipeline<S0, S1, XPipe, Cuda, MpiChannel> g; ...` (a rank per GPU, or ranks sharing one).
struct MpiChannel {
  template <class B>
  using queue = std::conditional_t<detail::HostMemoryBackend<B>, MpiLink<B>, StagedMpiLink<B>>;
  static constexpr const char* name = "mpi";
};

static_assert(Queue<MpiLink<Host>>);
static_assert(QueuePolicy<MpiChannel>);

}  // namespace xpipe
