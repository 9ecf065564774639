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

//! Bounded SPSC ring of `capacity` messages of up to rows x cols floats each, stored on
//! backend B (only the cursors and message headers live on the host). A Queue.
template <class B = DefaultBackend>
class SpscRing {
 public:
  SpscRing() = default;
  SpscRing(int capacity, index_t rows, index_t cols)
      : capacity_(static_cast<std::uint32_t>(capacity)),
        storage_(capacity * rows * cols),
        slots_(static_cast<std::size_t>(capacity)) {
    if (capacity < 1) throw ConfigError("xpipe: SpscRing: capacity must be >= 1");
    for (int i = 0; i < capacity; ++i)
      slots_[static_cast<std::size_t>(i)].data =
          Matrix{storage_.data() + i * rows * cols, rows, cols};
    producer_.capacity = consumer_.capacity = capacity_;
  }
  SpscRing(SpscRing&& o) noexcept
      : capacity_(o.capacity_),
        storage_(std::move(o.storage_)),
        slots_(std::move(o.slots_)),
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

 private:
  std::uint32_t capacity_ = 1;
  typename B::template Buffer<float> storage_;
  std::vector<MicroBatchMessage> slots_;
  // Each side's own cursor, and the published copies the other side reads, on separate lines.
  alignas(64) RingCursor producer_{};
  alignas(64) std::atomic<std::uint32_t> tail_{0};
  alignas(64) RingCursor consumer_{};
  alignas(64) std::atomic<std::uint32_t> head_{0};
};

//! The default QueuePolicy: SPSC rings between stage threads of one process.
struct InProcessRing {
  template <class B>
  using queue = SpscRing<B>;
  static constexpr const char* name = "in-process-ring";
};

static_assert(Queue<SpscRing<Host>>);
static_assert(QueuePolicy<InProcessRing>);

}  // namespace xpipe
