// Bounded single-producer/single-consumer rings of pre-allocated micro-batch buffers: how
// activations and gradients travel between stage threads of one process (the default
// QueuePolicy). No allocation and no locks after construction; the producer fills a slot in
// place, the consumer reads it in place.
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

#include "xpipe/backend/backend.hpp"
#include "xpipe/comm/queue.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/core/tensor.hpp"

namespace xpipe {

//! Position in a ring of `capacity` slots: index, and a phase bit that flips on every wrap, so
//! equal indices tell a full ring from an empty one (after CUTLASS's PipelineState).
struct RingCursor {
  std::uint32_t index = 0;
  std::uint32_t phase = 0;
  std::uint32_t capacity = 1;

  RingCursor& operator++() {
    if (++index == capacity) {
      index = 0;
      phase ^= 1u;
    }
    return *this;
  }
  //! Packed (phase, index), for publishing through one atomic.
  std::uint32_t packed() const { return (phase << 31) | index; }
};

namespace detail {
// Backends whose buffers a stream writes asynchronously name an Event type (Cuda: CudaEvent).
template <class B>
concept HasEvents = requires {
  typename B::Event;
};

// Per slot: `filled`, recorded on the producer's stream after its last write to the slot, and
// `drained`, recorded on the consumer's stream after its last read. Nothing on the host.
template <class B, bool = HasEvents<B>>
struct RingEvents {};
template <class B>
struct RingEvents<B, true> {
  std::vector<typename B::Event> filled, drained;
};
}  // namespace detail

//! Bounded SPSC ring of `capacity` messages of up to rows x cols floats each, stored on
//! backend B (only the cursors and message headers live on the host). A Queue.
//!
//! On a backend with streams (B::Event: CUDA) the host cursors still decide readiness, so
//! back-pressure is the ring's capacity as on the host, and each slot carries two events that
//! order the device work (the optional Queue members of comm/queue.hpp):
//!   producer: acquire_back  = its stream waits on the slot's `drained`;
//!             writes; release_back = records `filled` on its stream; push().
//!   consumer: acquire_front = its stream waits on the slot's `filled`;
//!             reads;  release_front = records `drained` on its stream; pop().
//! Why every read follows its write on the device: the consumer sees the slot (can_pop, an
//! acquire load) only after the producer's push (a release store), which comes after
//! release_back enqueued the `filled` record behind the writes; acquire_front then makes the
//! consumer's stream wait on exactly that record. Symmetrically a producer reuses a slot only
//! after the consumer's pop, which comes after release_front enqueued `drained` behind the
//! reads, so the new writes wait for the old reads. A record made later (the next round of the
//! slot) cannot disturb a wait already enqueued: cudaStreamWaitEvent takes the record current
//! when it is called, and the next record of `filled` happens only after the consumer's pop,
//! itself after its acquire_front. The slots live on the consumer's device; `filled` is created
//! on the producer's device and `drained` on the consumer's, as each is recorded there.
template <class B = DefaultBackend>
class SpscRing {
 public:
  using Context = typename B::Context;

  SpscRing() = default;
  SpscRing(int capacity, index_t rows, index_t cols)
      : capacity_(static_cast<std::uint32_t>(capacity)),
        storage_(capacity * rows * cols),
        slots_(static_cast<std::size_t>(capacity)) {
    if (capacity < 1) throw ConfigError("xpipe: SpscRing: capacity must be >= 1");
    if constexpr (detail::HasEvents<B>) {  // both ends on the current device
      events_.filled = std::vector<typename B::Event>(static_cast<std::size_t>(capacity));
      events_.drained = std::vector<typename B::Event>(static_cast<std::size_t>(capacity));
    }
    set_slots(rows, cols);
  }
  //! For a backend with events: slots and `drained` events on the consumer's device, `filled`
  //! events on the producer's (each context is made current to allocate its part).
  SpscRing(int capacity, index_t rows, index_t cols, const Context& producer,
           const Context& consumer) requires detail::HasEvents<B>
      : capacity_(static_cast<std::uint32_t>(capacity)),
        slots_(static_cast<std::size_t>(capacity > 0 ? capacity : 0)) {
    if (capacity < 1) throw ConfigError("xpipe: SpscRing: capacity must be >= 1");
    activate(consumer);
    storage_ = typename B::template Buffer<float>(capacity * rows * cols);
    events_.drained = std::vector<typename B::Event>(static_cast<std::size_t>(capacity));
    activate(producer);
    events_.filled = std::vector<typename B::Event>(static_cast<std::size_t>(capacity));
    set_slots(rows, cols);
  }
  SpscRing(SpscRing&& o) noexcept
      : capacity_(o.capacity_),
        storage_(std::move(o.storage_)),
        slots_(std::move(o.slots_)),
        events_(std::move(o.events_)),
        producer_(o.producer_),
        consumer_(o.consumer_) {
    tail_.store(o.tail_.load());
    head_.store(o.head_.load());
  }

  int capacity() const { return static_cast<int>(capacity_); }

  //! Producer side: room for one more message?
  bool can_push() const {
    const std::uint32_t head = head_.load(std::memory_order_acquire);
    // Full when the consumer is at the same index one phase behind.
    return head != (producer_.packed() ^ (1u << 31));
  }
  //! Producer side: the slot to fill next (valid while can_push()).
  MicroBatchMessage& back() { return slots_[producer_.index]; }
  //! Producer side: publish the filled slot.
  void push() {
    ++producer_;
    tail_.store(producer_.packed(), std::memory_order_release);
  }

  //! Consumer side: a message waiting?
  bool can_pop() const { return tail_.load(std::memory_order_acquire) != consumer_.packed(); }
  //! Consumer side: the oldest message (valid while can_pop()).
  const MicroBatchMessage& front() const { return slots_[consumer_.index]; }
  //! Consumer side: hand the slot back to the producer.
  void pop() {
    ++consumer_;
    head_.store(consumer_.packed(), std::memory_order_release);
  }

  //! Producer side, before ctx's stream writes back(): the stream waits until the consumer's
  //! stream has finished reading the slot the last time (never read: no wait).
  void acquire_back(const Context& ctx) requires detail::HasEvents<B> {
    events_.drained[producer_.index].wait(ctx);
  }
  //! Producer side, after enqueueing the last write to back() and before push().
  void release_back(const Context& ctx) requires detail::HasEvents<B> {
    events_.filled[producer_.index].record(ctx);
  }
  //! Consumer side, before ctx's stream reads front(): the stream waits for the producer's
  //! writes to it.
  void acquire_front(const Context& ctx) requires detail::HasEvents<B> {
    events_.filled[consumer_.index].wait(ctx);
  }
  //! Consumer side, after enqueueing the last read of front() and before pop().
  void release_front(const Context& ctx) requires detail::HasEvents<B> {
    events_.drained[consumer_.index].record(ctx);
  }

 private:
  void set_slots(index_t rows, index_t cols) {
    for (std::uint32_t i = 0; i < capacity_; ++i)
      slots_[i].data = Matrix{storage_.data() + i * rows * cols, rows, cols};
    producer_.capacity = consumer_.capacity = capacity_;
  }

  std::uint32_t capacity_ = 1;
  typename B::template Buffer<float> storage_;
  std::vector<MicroBatchMessage> slots_;
  [[no_unique_address]] detail::RingEvents<B> events_;
  // Each side's own cursor, and the published copies the other side reads, on separate lines.
  alignas(64) RingCursor producer_{};
  alignas(64) std::atomic<std::uint32_t> tail_{0};
  alignas(64) RingCursor consumer_{};
  alignas(64) std::atomic<std::uint32_t> head_{0};
};

//! The default QueuePolicy: SPSC rings between stage threads of one process; on CUDA, rings of
//! device slots whose events order the stages' streams.
struct InProcessRing {
  template <class B>
  using queue = SpscRing<B>;
  static constexpr const char* name = "in-process-ring";
};

static_assert(Queue<SpscRing<Host>>);
static_assert(QueuePolicy<InProcessRing>);

}  // namespace xpipe
