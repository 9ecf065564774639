// Micro-batch queues between MPI ranks whose stages run on a device (what MpiChannel names on
// CUDA and on the emulated device): the stages' kernels read and write device slots, and MPI
// carries pinned host copies of them, so no CUDA-aware MPI is needed (Open MPI as Debian builds
// it is not); where the MPI library is CUDA-aware, MPI moves the device slots themselves. A
// boundary between two stages of one rank, and every boundary of a pipeline trained in one
// process, is the device ring (SpscRing, its events ordering the two streams).
// Needs <mpi.h>: link xpipe::mpi.
#pragma once

#include <mpi.h>

#include <concepts>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "xpipe/backend/backend.hpp"
#include "xpipe/comm/mpi_link_end.hpp"
#include "xpipe/comm/queue.hpp"
#include "xpipe/comm/spsc_ring.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/core/tensor.hpp"

namespace xpipe {

//! Whether MPI may send and receive backend B's device memory itself: a backend that says so
//! (`static bool mpi_moves_device_memory()`: the emulated device's setting); CUDA memory
//! (B::cuda_memory) where the MPI library is CUDA-aware (mpi_cuda_aware); otherwise false.
template <class B>
bool mpi_moves_device_memory() {
  if constexpr (requires {
                  { B::mpi_moves_device_memory() } -> std::convertible_to<bool>;
                })
    return B::mpi_moves_device_memory();
  else if constexpr (requires { requires B::cuda_memory; })
    return mpi_cuda_aware();
  else
    return false;
}

//! One end of a link between two ranks of a device pipeline: a Queue of `capacity` slots of up
//! to rows x cols floats, each a device slot that the stage's stream writes or reads, and a
//! pinned host slot that MPI sends from or receives into. Constructed (producer and consumer
//! contexts given), it is a device ring between the two streams, so a Pipeline<..., MpiChannel>
//! on a device trains in one process with the same bits; MpiExecutor connects the ends as it
//! does MpiLink's (LinkRole: a ring where the rank holds both, nothing where it holds neither).
//!
//! Where the rank holds one end, every transfer goes through the stage's own stream and one
//! event per slot, and the host never waits for the device:
//!   producer: the stage's stream writes back() (the device slot; its last reader was this
//!             stream's copy out of it, so stream order suffices); release_back enqueues the
//!             copy to the pinned slot and records the slot's event; push() marks the slot
//!             staged. The MPI_Isend starts once the event is done (progress(), called by
//!             can_push, sends_done and the executor's waits), in push order; can_push() is
//!             true once the slot's previous send has completed.
//!   consumer: a receive is posted into each pinned slot for the next micro-batches of its
//!             order; can_pop() tests the oldest; acquire_front enqueues the copy from the
//!             pinned slot to the device slot and records the slot's event, so the stage's
//!             reads follow it on its stream; pop() marks the slot copying, and the slot's next
//!             receive is posted once the event is done (progress(), in slot order), never
//!             while the copy may still read the pinned bytes.
//! Where MPI moves device memory itself (mpi_moves_device_memory<B>: a CUDA-aware MPI), there
//! are no pinned slots and no copies (direct()): release_back records the slot's event after the
//! stage's writes and the send from the device slot starts once it is done; receives land in the
//! device slots, and release_front records the event after the stage's reads, the slot's next
//! receive posted once it is done. Decided at connect(), for the whole run.
//! The emulated device enforces both host-side waits (tests/support/emulated_device.hpp).
//! Usage: `Pipeline<S0, S1, XPipe, Cuda, MpiChannel>` (MpiChannel names it; MpiExecutor wires
//! the ends and calls progress()).
template <class B>
class StagedMpiLink {
 public:
  using Context = typename B::Context;

  StagedMpiLink() = default;
  //! A ring whose two ends are on the current device (Queue's constructor); connect() may make
  //! it an end between ranks only when the contexts were given (the constructor below).
  StagedMpiLink(int capacity, index_t rows, index_t cols)
      : capacity_(checked(capacity)), rows_(rows), cols_(cols) {
    ring_.emplace(capacity, rows, cols);
  }
  StagedMpiLink(int capacity, index_t rows, index_t cols, const Context& producer,
                const Context& consumer)
      : capacity_(checked(capacity)),
        rows_(rows),
        cols_(cols),
        producer_(producer),
        consumer_(consumer),
        has_contexts_(true) {
    ring_.emplace(capacity, rows, cols, producer, consumer);
  }
  StagedMpiLink(StagedMpiLink&& o) noexcept { *this = std::move(o); }
  StagedMpiLink& operator=(StagedMpiLink&& o) noexcept {
    if (this == &o) return *this;
    release();
    capacity_ = o.capacity_;
    rows_ = o.rows_;
    cols_ = o.cols_;
    producer_ = o.producer_;
    consumer_ = o.consumer_;
    has_contexts_ = o.has_contexts_;
    end_ = std::move(o.end_);
    tag_ub_ = o.tag_ub_;
    ring_.reset();
    if (o.ring_) ring_.emplace(std::move(*o.ring_));
    o.ring_.reset();
    device_ = std::move(o.device_);
    pinned_ = std::move(o.pinned_);
    slots_ = std::move(o.slots_);
    copied_ = std::move(o.copied_);
    requests_ = std::move(o.requests_);
    state_ = std::move(o.state_);
    cursor_ = o.cursor_;
    direct_ = o.direct_;
    next_ = o.next_;
    posted_ = o.posted_;
    o.requests_.clear();
    o.state_.clear();
    return *this;
  }
  ~StagedMpiLink() { release(); }

  //! Wires this end (MpiLinkEnd, as MpiLink::connect): a ring for Both, nothing for None, else
  //! the device and pinned slots on this end's device, and for a consumer the first receives.
  void connect(MpiLinkEnd end) {
    release();
    end_ = std::move(end);
    ring_.reset();
    slots_.clear();
    state_.clear();
    if (end_.role == LinkRole::None) return;
    if (!has_contexts_)
      throw ConfigError(
          "xpipe: StagedMpiLink: connect() needs the link made with its producer's and "
          "consumer's contexts (the constructor Pipeline calls)");
    if (end_.role == LinkRole::Both) {
      ring_.emplace(capacity_, rows_, cols_, producer_, consumer_);
      return;
    }
    tag_ub_ = mpi_tag_upper_bound(end_.comm);
    direct_ = mpi_moves_device_memory<B>();
    detail::activate_context(mine());
    const index_t floats = capacity_ * rows_ * cols_;
    device_ = typename B::template Buffer<float>(floats);
    pinned_ = typename B::template PinnedBuffer<float>(direct_ ? 0 : floats);
    copied_ = std::vector<typename B::Event>(static_cast<std::size_t>(capacity_));
    slots_.assign(static_cast<std::size_t>(capacity_), {});
    requests_.assign(static_cast<std::size_t>(capacity_), MPI_REQUEST_NULL);
    state_.assign(static_cast<std::size_t>(capacity_), Slot::Free);
    for (int i = 0; i < capacity_; ++i)
      slots_[static_cast<std::size_t>(i)].data =
          Matrix{device_.data() + i * rows_ * cols_, rows_, cols_};
    cursor_ = next_ = 0;
    posted_ = 0;
    if (end_.role == LinkRole::Consumer)
      for (int i = 0; i < capacity_; ++i) post_receive(i);
  }
  const MpiLinkEnd& end() const { return end_; }
  //! Whether MPI moves this end's device slots itself (a CUDA-aware MPI), not pinned copies.
  bool direct() const { return direct_ && !ring_ && !state_.empty(); }

  // ---- producer side ----
  bool can_push() const {
    if (ring_) return ring_->can_push();
    progress();
    return sent(cursor_);
  }
  MicroBatchMessage& back() {
    return ring_ ? ring_->back() : slots_[static_cast<std::size_t>(cursor_)];
  }
  void acquire_back(const Context& ctx) {
    if (ring_) ring_->acquire_back(ctx);
  }
  void release_back(const Context& ctx) {
    if (ring_) {
      ring_->release_back(ctx);
      return;
    }
    const auto u = static_cast<std::size_t>(cursor_);
    if (!direct_)
      copy_to_pinned_async(ctx, slots_[u].data.data, pinned(cursor_), slots_[u].data.rows * cols_);
    copied_[u].record(ctx);  // after the copy, or (direct) after the stage's writes
    state_[u] = Slot::Enqueued;
  }
  void push() {
    if (ring_) {
      ring_->push();
      return;
    }
    const auto u = static_cast<std::size_t>(cursor_);
    if (state_[u] != Slot::Enqueued)
      throw Error("xpipe: StagedMpiLink: push() of micro-batch " +
                  std::to_string(slots_[u].micro_batch) + " to rank " + std::to_string(end_.peer) +
                  " without release_back(ctx), which copies the slot to its pinned staging");
    state_[u] = Slot::Staged;
    cursor_ = (cursor_ + 1) % capacity_;
    progress();
  }

  // ---- consumer side ----
  bool can_pop() const {
    if (ring_) return ring_->can_pop();
    if (state_.empty()) return false;
    progress();
    return arrived(cursor_);
  }
  const MicroBatchMessage& front() const {
    return ring_ ? ring_->front() : slots_[static_cast<std::size_t>(cursor_)];
  }
  void acquire_front(const Context& ctx) {
    if (ring_) {
      ring_->acquire_front(ctx);
      return;
    }
    const auto u = static_cast<std::size_t>(cursor_);
    if (direct_) {  // the message is in the device slot: the event follows the stage's reads
      state_[u] = Slot::Reading;
      return;
    }
    copy_from_pinned_async(ctx, static_cast<const float*>(pinned(cursor_)), slots_[u].data.data,
                           slots_[u].data.rows * cols_);
    copied_[u].record(ctx);
    state_[u] = Slot::Enqueued;
  }
  void release_front(const Context& ctx) {
    if (ring_) {
      ring_->release_front(ctx);
      return;
    }
    const auto u = static_cast<std::size_t>(cursor_);
    if (direct_ && state_[u] == Slot::Reading) {
      copied_[u].record(ctx);
      state_[u] = Slot::Enqueued;
    }
  }
  void pop() {
    if (ring_) {
      ring_->pop();
      return;
    }
    const auto u = static_cast<std::size_t>(cursor_);
    if (state_[u] != Slot::Enqueued)
      throw Error("xpipe: StagedMpiLink: pop() of micro-batch " +
                  std::to_string(slots_[u].micro_batch) + " from rank " +
                  std::to_string(end_.peer) +
                  (direct_ ? " without acquire_front(ctx) and release_front(ctx), which mark "
                             "the end of the stage's reads of the device slot"
                           : " without acquire_front(ctx), which copies the pinned slot to the "
                             "device"));
    state_[u] = Slot::Copying;
    cursor_ = (cursor_ + 1) % capacity_;
    progress();
  }

  //! Starts the sends whose staging copies are done (producer) or posts the receives whose
  //! slots' copies to the device are done (consumer), in order; nothing for a ring. Never
  //! blocks. The executor calls it while it waits, so transfers move on whatever it waits for.
  void progress() const {
    if (ring_ || state_.empty()) return;
    const Slot ready = end_.role == LinkRole::Producer ? Slot::Staged : Slot::Copying;
    for (int n = 0; n < capacity_; ++n) {
      const auto u = static_cast<std::size_t>(next_);
      if (state_[u] != ready || !copied_[u].done()) return;
      if (end_.role == LinkRole::Producer)
        start_send(next_);
      else
        post_receive(next_);
      next_ = (next_ + 1) % capacity_;
    }
  }

  //! Producer: whether every send has been started and has completed (the buffers may be reused
  //! or freed).
  bool sends_done() const {
    if (end_.role != LinkRole::Producer || state_.empty()) return true;
    progress();
    for (int i = 0; i < capacity_; ++i)
      if (!sent(i)) return false;
    return true;
  }

 private:
  static int checked(int capacity) {
    if (capacity < 1)
      throw ConfigError("xpipe: StagedMpiLink: capacity must be >= 1 (got " +
                        std::to_string(capacity) + ")");
    return capacity;
  }

  // What a slot holds. Producer: Free (may be filled), Enqueued (its copy to pinned memory is
  // enqueued), Staged (pushed; the send starts when the copy is done), Busy (the send is in
  // flight). Consumer: Busy (a receive is posted), Arrived, Enqueued (its copy to the device is
  // enqueued; direct: the stage's reads are, and the event after them), Copying (popped; the next
  // receive is posted when the copy, or the reads, are done), Free (no micro-batch left to
  // receive); direct only: Reading (acquired, the stage's reads being enqueued).
  enum class Slot : unsigned char { Free, Enqueued, Staged, Busy, Arrived, Copying, Reading };

  const Context& mine() const { return end_.role == LinkRole::Producer ? producer_ : consumer_; }
  float* pinned(int i) const { return pinned_.data() + static_cast<index_t>(i) * rows_ * cols_; }
  // What MPI sends from or receives into for slot i: its pinned copy, or (direct) the slot.
  float* wire(int i) const {
    return direct_ ? slots_[static_cast<std::size_t>(i)].data.data : pinned(i);
  }

  // Producer: whether slot i may be filled (its last send, if any, has completed).
  bool sent(int i) const {
    const auto u = static_cast<std::size_t>(i);
    if (state_[u] == Slot::Busy) {
      int done = 0;
      XPIPE_MPI_CHECK(MPI_Test(&requests_[u], &done, MPI_STATUS_IGNORE));
      if (done) state_[u] = Slot::Free;
    }
    return state_[u] == Slot::Free;
  }
  // Consumer: whether slot i's message has landed (its rows read from the message's size).
  bool arrived(int i) const {
    const auto u = static_cast<std::size_t>(i);
    if (state_[u] == Slot::Busy) {
      int done = 0;
      MPI_Status st;
      XPIPE_MPI_CHECK(MPI_Test(&requests_[u], &done, &st));
      if (done) {
        int count = 0;
        XPIPE_MPI_CHECK(MPI_Get_count(&st, MPI_FLOAT, &count));
        slots_[u].data.rows = count / cols_;
        state_[u] = Slot::Arrived;
      }
    }
    return state_[u] == Slot::Arrived;
  }

  void start_send(int i) const {
    const auto u = static_cast<std::size_t>(i);
    const MicroBatchMessage& m = slots_[u];
    XPIPE_MPI_CHECK(MPI_Isend(wire(i), static_cast<int>(m.data.rows * cols_), MPI_FLOAT, end_.peer,
                              end_.tag(m.micro_batch, tag_ub_), end_.comm, &requests_[u]));
    state_[u] = Slot::Busy;
  }
  // Posts slot i's receive for the next micro-batch of the order (none left: the slot is Free).
  void post_receive(int i) const {
    const auto u = static_cast<std::size_t>(i);
    if (posted_ >= end_.order.size()) {
      slots_[u].micro_batch = -1;
      state_[u] = Slot::Free;
      return;
    }
    const int g = end_.order[posted_++];
    slots_[u].micro_batch = g;
    XPIPE_MPI_CHECK(MPI_Irecv(wire(i), static_cast<int>(rows_ * cols_), MPI_FLOAT, end_.peer,
                              end_.tag(g, tag_ub_), end_.comm, &requests_[u]));
    state_[u] = Slot::Busy;
  }

  // Cancels receives still posted (waiting for the cancel, so MPI no longer writes the pinned
  // slots) and lets go of sends still in flight (only after a failed run, which the caller ends
  // with MPI_Abort: MPI may still read a freed slot of such a send), after this end's stream has
  // passed its copies (they read or write the pinned slots).
  void release() noexcept {
    if (!state_.empty()) {
      try {
        detail::activate_context(mine());
        synchronize(mine());
      } catch (...) {  // a faulted device: its copies will never run
      }
    }
    for (MPI_Request& r : requests_) {
      if (r == MPI_REQUEST_NULL) continue;
      if (end_.role == LinkRole::Consumer) {
        MPI_Cancel(&r);
        MPI_Wait(&r, MPI_STATUS_IGNORE);
      } else {
        MPI_Request_free(&r);
      }
    }
    requests_.clear();
    state_.clear();
  }

  int capacity_ = 1;
  index_t rows_ = 0, cols_ = 0;
  Context producer_{}, consumer_{};
  bool has_contexts_ = false;
  MpiLinkEnd end_;
  int tag_ub_ = 32767;
  std::optional<SpscRing<B>> ring_;            // in one process, or both ends on this rank
  typename B::template Buffer<float> device_;  // one end on this rank: the device slots
  mutable typename B::template PinnedBuffer<float> pinned_;  // their copies, which MPI moves
  mutable std::vector<MicroBatchMessage> slots_;
  std::vector<typename B::Event> copied_;  // per slot: after its copy to or from pinned memory
  mutable std::vector<MPI_Request> requests_;
  mutable std::vector<Slot> state_;
  int cursor_ = 0;        // the slot a producer fills next, or a consumer reads
  bool direct_ = false;   // MPI moves the device slots themselves (no pinned copies)
  mutable int next_ = 0;  // the slot whose send starts, or receive is posted, next
  mutable std::size_t posted_ = 0;
};

}  // namespace xpipe
