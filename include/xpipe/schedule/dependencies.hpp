// The one dependency rule of the IR: which link between neighbouring stages an action receives
// from and sends to, and so which action of which stage it waits for. The pipeline's readiness
// check, the dry run, the simulator and the benchmarks all read it from here.
#pragma once

#include "xpipe/schedule/ir.hpp"

namespace xpipe {

//! What travels on a link: activations downstream (stage b to b + 1), gradients upstream.
enum class Flow : unsigned char { Activations, Gradients };

//! One direction of the link between stage `boundary` and stage `boundary + 1`; boundary -1
//! means none (the action receives or sends nothing).
struct Channel {
  int boundary = -1;
  Flow flow = Flow::Activations;
  constexpr bool exists() const { return boundary >= 0; }
  friend constexpr bool operator==(const Channel&, const Channel&) = default;
};

//! The channel an action pops its input from and the one it pushes its output to.
struct ActionChannels {
  Channel in, out;
};

//! From the kind table's `travel`: an action travelling down (Forward) pops the activations of
//! stage k-1 and pushes its own to stage k+1; one travelling up (Backward, InputGrad) pops the
//! gradient of stage k+1 and pushes the gradient of its input to stage k-1; the others (Step,
//! WeightGrad) touch no link. The first and last stages have no link on their outer side.
constexpr ActionChannels channels_of(int stages, int k, const Action& a) {
  ActionChannels c;
  const Travel t = info(a.kind).travel;
  if (t == Travel::Down) {
    if (k > 0) c.in = {k - 1, Flow::Activations};
    if (k + 1 < stages) c.out = {k, Flow::Activations};
  } else if (t == Travel::Up) {
    if (k + 1 < stages) c.in = {k, Flow::Gradients};
    if (k > 0) c.out = {k - 1, Flow::Gradients};
  }
  return c;
}

//! The stage whose action produces what `a` (at stage k) pops: the same action on the
//! neighbouring stage on the far side of its input channel, or -1 if it pops nothing.
constexpr int producer_stage(int stages, int k, const Action& a) {
  const Channel in = channels_of(stages, k, a).in;
  if (!in.exists()) return -1;
  return in.flow == Flow::Activations ? in.boundary : in.boundary + 1;
}

//! The stage whose action pops what `a` (at stage k) pushes: the neighbouring stage on the far
//! side of its output channel, or -1 if it pushes nothing.
constexpr int consumer_stage(int stages, int k, const Action& a) {
  const Channel out = channels_of(stages, k, a).out;
  if (!out.exists()) return -1;
  return out.flow == Flow::Activations ? out.boundary + 1 : out.boundary;
}

//! Whether the input `a` (at stage k) pops has arrived, room for its output aside: what tells
//! a wait for the producer from one for the consumer.
template <class Links>
bool input_arrived(const Links& links, int stages, int k, const Action& a) {
  const Channel in = channels_of(stages, k, a).in;
  return !in.exists() || links.at(in).can_pop();
}

//! Whether stage k can run `a` now without waiting, given its links: `links.at(channel)` must
//! return a queue with `can_pop()` and `can_push()` (see comm/queue.hpp). Input arrived, room
//! for the output.
template <class Links>
bool channels_ready(const Links& links, int stages, int k, const Action& a) {
  const Channel out = channels_of(stages, k, a).out;
  return input_arrived(links, stages, k, a) && (!out.exists() || links.at(out).can_push());
}

}  // namespace xpipe
