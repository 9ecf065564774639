// The links of a K-stage pipeline: for each boundary between stage b and b + 1 one queue of
// activations (downstream) and one of gradients (upstream), addressed by the Channel the
// dependency rule (schedule/dependencies.hpp) gives each action.
#pragma once

#include <concepts>
#include <cstddef>
#include <vector>

#include "xpipe/comm/queue.hpp"
#include "xpipe/schedule/dependencies.hpp"

namespace xpipe {

//! Both queues of every stage boundary. Usage:
//! `Links<SpscRing<>> links(K, [&](int b) { return capacity_of(b); }, rows, width_of);`
//! then `links.ready(K, k, action)` and `links.at(channels_of(K, k, a).in).front()`.
template <Queue Q>
class Links {
 public:
  Links() = default;
  //! K - 1 boundaries; boundary b holds `capacity(b)` messages of up to rows x width(b) floats
  //! in each direction.
  template <class Capacity, class Width>
  Links(int stages, Capacity capacity, index_t rows, Width width) {
    for (int b = 0; b + 1 < stages; ++b) {
      activations_.emplace_back(capacity(b), rows, width(b));
      gradients_.emplace_back(capacity(b), rows, width(b));
    }
  }

  //! K - 1 boundaries, each queue made by `make(boundary, flow)` (returning a Q): for queues
  //! that need more than a size, such as the devices of their two ends.
  template <class Make>
  requires std::invocable<Make&, int, Flow> Links(int stages, Make make) {
    for (int b = 0; b + 1 < stages; ++b) {
      activations_.push_back(make(b, Flow::Activations));
      gradients_.push_back(make(b, Flow::Gradients));
    }
  }

  Q& at(Channel c) { return channel(*this, c); }
  const Q& at(Channel c) const { return channel(*this, c); }

  //! Input arrived and room for the output: stage k can run `a` now without waiting.
  bool ready(int stages, int k, const Action& a) const {
    return channels_ready(*this, stages, k, a);
  }
  //! Input arrived (room for the output aside): whom a wait for `a` waits on.
  bool input_arrived(int stages, int k, const Action& a) const {
    return xpipe::input_arrived(*this, stages, k, a);
  }

 private:
  template <class Self>
  static auto& channel(Self& self, Channel c) {
    auto& side = c.flow == Flow::Activations ? self.activations_ : self.gradients_;
    return side[static_cast<std::size_t>(c.boundary)];
  }

  std::vector<Q> activations_, gradients_;
};

}  // namespace xpipe
