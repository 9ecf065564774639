// The micro-batch queue: what the pipeline needs of a link that carries activations or
// gradients from one stage to the next (the Queue concept), and the policy that names a queue
// type for a backend (QueuePolicy), so Pipeline<..., MyQueue> swaps the transport.
#pragma once

#include <concepts>

#include "xpipe/backend/host.hpp"
#include "xpipe/core/tensor.hpp"

namespace xpipe {

//! One message: a micro-batch's rows of activations or gradients, and its number.
struct MicroBatchMessage {
  int micro_batch = -1;
  Matrix data;  // points into the queue's storage; rows set by the producer
};

//! Queue: a bounded link between two stages, filled and drained in place.
//! Required: constructible from (capacity, rows, cols) (allocate every slot there),
//! producer side `can_push()`, `back()` -> MicroBatchMessage&, `push()`;
//! consumer side `can_pop()`, `front()` -> const MicroBatchMessage&, `pop()`.
//! Producer: `if (q.can_push()) { auto& m = q.back(); fill m; q.push(); }`;
//! consumer: `if (q.can_pop()) { const auto& m = q.front(); use m; q.pop(); }`.
namespace detail {
template <class Q>
concept QueueFromShape = std::constructible_from<Q, int, index_t, index_t>;
template <class Q>
concept QueueProducer = requires(Q& q, const Q& cq) {
  { cq.can_push() } -> std::convertible_to<bool>;
  { q.back() } -> std::same_as<MicroBatchMessage&>;
  q.push();
};
template <class Q>
concept QueueConsumer = requires(Q& q, const Q& cq) {
  { cq.can_pop() } -> std::convertible_to<bool>;
  { cq.front() } -> std::same_as<const MicroBatchMessage&>;
  q.pop();
};
}  // namespace detail

template <class Q>
concept Queue = detail::QueueFromShape<Q> && detail::QueueProducer<Q> && detail::QueueConsumer<Q>;

//! Fails to compile with one message per side of Queue that Q lacks. Usage:
//! `static_assert(check_queue<MyQueue>());`
template <class Q>
consteval bool check_queue() {
  static_assert(detail::QueueFromShape<Q>,
                "xpipe: Queue: not constructible from (int capacity, index_t rows, index_t cols)");
  static_assert(detail::QueueProducer<Q>,
                "xpipe: Queue: missing a producer member: can_push() const -> bool, back() -> "
                "MicroBatchMessage&, push()");
  static_assert(detail::QueueConsumer<Q>,
                "xpipe: Queue: missing a consumer member: can_pop() const -> bool, front() const "
                "-> const MicroBatchMessage&, pop()");
  return true;
}

//! Optional Queue members, for slots a device writes and reads on its streams, where a host-side
//! push or pop says nothing about when the device is done: producer `acquire_back(ctx)` before
//! its stream writes back() (the stream waits until the consumer's stream has finished reading
//! that slot the last time) and `release_back(ctx)` after enqueueing the last write, before
//! push(); consumer `acquire_front(ctx)` before its stream reads front() (the stream waits for
//! the producer's writes) and `release_front(ctx)` after enqueueing the last read, before pop().
//! The queue_* functions below call them where the queue has them and do nothing otherwise
//! (host queues: push and pop order the host threads, and host writes are done when issued).
template <class Q, class Ctx>
void queue_acquire_back(Q& q, const Ctx& ctx) {
  if constexpr (requires { q.acquire_back(ctx); }) q.acquire_back(ctx);
}
template <class Q, class Ctx>
void queue_release_back(Q& q, const Ctx& ctx) {
  if constexpr (requires { q.release_back(ctx); }) q.release_back(ctx);
}
template <class Q, class Ctx>
void queue_acquire_front(Q& q, const Ctx& ctx) {
  if constexpr (requires { q.acquire_front(ctx); }) q.acquire_front(ctx);
}
template <class Q, class Ctx>
void queue_release_front(Q& q, const Ctx& ctx) {
  if constexpr (requires { q.release_front(ctx); }) q.release_front(ctx);
}

//! QueuePolicy: a tag naming the queue type that links stages on backend B.
//! Required: `template <class B> using queue = ...` (a Queue whose slots live on B),
//! `static constexpr const char* name`. Usage: `Pipeline<S0, S1, XPipe, InProcessRing>`.
namespace detail {
template <class P>
concept HasHostQueue = requires {
  typename P::template queue<Host>;
};
template <class P>
concept HasQueuePolicyName = requires {
  { P::name } -> std::convertible_to<const char*>;
};
}  // namespace detail

template <class P>
concept QueuePolicy = detail::HasHostQueue<P> && detail::HasQueuePolicyName<P> &&
    Queue<typename P::template queue<Host>>;

//! Fails to compile with one message per member P lacks, and Queue's messages for the queue it
//! names on the host. Usage: `static_assert(check_queue_policy<MyTransport>());`
template <class P>
consteval bool check_queue_policy() {
  static_assert(detail::HasHostQueue<P>,
                "xpipe: QueuePolicy: missing member template queue<Backend> (template <class B> "
                "using queue = ...)");
  static_assert(detail::HasQueuePolicyName<P>,
                "xpipe: QueuePolicy: missing static member name (static constexpr const char*)");
  if constexpr (detail::HasHostQueue<P>)
    static_assert(check_queue<typename P::template queue<Host>>());
  return true;
}

}  // namespace xpipe
