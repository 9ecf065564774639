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
template <class Q>
concept Queue = std::constructible_from<Q, int, index_t, index_t> && requires(Q& q, const Q& cq) {
  { cq.can_push() } -> std::convertible_to<bool>;
  { q.back() } -> std::same_as<MicroBatchMessage&>;
  q.push();
  { cq.can_pop() } -> std::convertible_to<bool>;
  { cq.front() } -> std::same_as<const MicroBatchMessage&>;
  q.pop();
};

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
template <class P>
concept QueuePolicy = requires {
  typename P::template queue<Host>;
  { P::name } -> std::convertible_to<const char*>;
}
&&Queue<typename P::template queue<Host>>;

}  // namespace xpipe
