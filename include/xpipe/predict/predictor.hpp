// The Predictor concept: which weights each Forward and Backward of a stage reads. Latest,
// stashed, double-buffered or predicted weights are all policies behind this one interface.
#pragma once

#include <concepts>

#include "xpipe/backend/backend.hpp"
#include "xpipe/optim/adam.hpp"
#include "xpipe/optim/optimizer.hpp"
#include "xpipe/schedule/staleness.hpp"

namespace xpipe {

//! What a predictor's per-stage state is built from: its stage, the flat parameter count, and
//! the schedule with its staleness analysis (the s of every action comes from there).
struct PredictorSetup {
  int stage = 0;
  index_t params = 0;
  const Schedule* schedule = nullptr;
  const StalenessAnalysis* analysis = nullptr;
};

//! No-op hooks for predictor states that keep nothing per micro-batch and save nothing before a
//! step; derive from it and define only what differs.
struct PredictorHooks {
  void backward_done(int) {}
  template <class Ctx, class Opt>
  void before_step(const Ctx&, Opt&) {}
};

namespace detail {
template <class P>
concept HasPredictorName = requires { { P::name } -> std::convertible_to<const char*>; };
template <class P>
concept HasPredictorState = requires { typename P::template State<Adam, Host>; };
template <class P>
concept HasStateMembers = requires(typename P::template State<Adam, Host>& st,
                                   OptimizerState<Adam, Host>& opt, const HostContext& ctx) {
  { st.forward_weights(ctx, opt, 0) } -> std::convertible_to<const float*>;
  { st.backward_weights(ctx, opt, 0) } -> std::convertible_to<const float*>;
  st.backward_done(0);
  st.before_step(ctx, opt);
  { st.weight_copies() } -> std::convertible_to<int>;
};
}  // namespace detail

//! Predictor: a policy choosing the weights of each action of a stage.
//! Required members:
//!   - `static constexpr const char* name`;
//!   - `template <class O, class B> class State`, constructible from `const PredictorSetup&`
//!     (allocate every copy there: nothing may allocate while training), with
//!     - `const float* forward_weights(const Ctx&, OptimizerState<O, B>&, int g)`: the weights
//!       Forward(g) reads (the live ones, a stashed or a predicted copy);
//!     - `const float* backward_weights(const Ctx&, OptimizerState<O, B>&, int g)`;
//!     - `void backward_done(int g)`: Backward(g) finished (release what only it needed);
//!     - `void before_step(const Ctx&, OptimizerState<O, B>&)`: the live weights are about to
//!       change (save a version still needed);
//!     - `int weight_copies() const`: weight buffers held, the live weights included.
//! Predictors that extrapolate also name their `static constexpr StalenessTarget target` and
//! read s as `analysis->forward(stage, g).s(target)`. Deriving the State from PredictorHooks
//! supplies no-op backward_done and before_step.
template <class P>
concept Predictor =
    detail::HasPredictorName<P> && detail::HasPredictorState<P> && detail::HasStateMembers<P>;

//! Fails to compile with a message naming the first member P lacks.
template <class P>
consteval bool check_predictor() {
  static_assert(detail::HasPredictorName<P>, "xpipe: Predictor: missing static member name");
  static_assert(detail::HasPredictorState<P>,
                "xpipe: Predictor: missing member template State<Optimizer, Backend>");
  if constexpr (detail::HasPredictorState<P>)
    static_assert(detail::HasStateMembers<P>,
                  "xpipe: Predictor: State lacks forward_weights(ctx, opt, g), backward_weights(ctx, "
                  "opt, g), backward_done(g), before_step(ctx, opt) or weight_copies()");
  return true;
}

}  // namespace xpipe
