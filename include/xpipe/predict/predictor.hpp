// The Predictor concept: which weights each Forward and Backward of a stage reads. Latest,
// stashed, double-buffered or predicted weights are all policies behind this one interface.
#pragma once

#include <concepts>
#include <optional>

#include "xpipe/backend/backend.hpp"
#include "xpipe/optim/adam.hpp"
#include "xpipe/optim/optimizer.hpp"
#include "xpipe/optim/sgd.hpp"
#include "xpipe/schedule/staleness.hpp"

namespace xpipe {

//! What a predictor's per-stage state is built from: its stage, the flat parameter count, and
//! the schedule with its staleness analysis (the s of every action comes from there). The
//! pointers stay valid for the State's whole life (one Pipeline::train call).
struct PredictorSetup {
  int stage = 0;                                // k, the stage this State serves
  index_t params = 0;                           // floats in the stage's flat weight buffer
  const Schedule* schedule = nullptr;           // K, M, mini-batches and every stage's actions
  const StalenessAnalysis* analysis = nullptr;  // version and s of every action, sizes to hold
};

//! The values a predictor's hyper-parameter may take: [low, high], with either end open; integer
//! ones are members of type int. A predictor lists its hyper-parameters with a member
//! `template <class F> void hyper_parameters(F&& f)` calling `f("momentum", momentum, range)`
//! once for each (members that can be set at run time: predict/any.hpp sets them by name).
struct HyperRange {
  double low = 0, high = 0;
  bool low_open = false, high_open = false;
  bool contains(double v) const {
    return (low_open ? v > low : v >= low) && (high_open ? v < high : v <= high);
  }
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
concept HasPredictorName = requires {
  { P::name } -> std::convertible_to<const char*>;
};
// `target` is optional; where present it must say which s the predictor reads.
template <class P>
concept HasValidTarget = !requires {
  P::target;
}
|| requires {
  { P::target } -> std::convertible_to<StalenessTarget>;
};
template <class P, class O, class B>
concept HasPredictorState = requires {
  typename P::template State<O, B>;
};
// A State is built from its setup, and from the predictor's value where it has hyper-parameters.
template <class S, class P>
concept TakesPredictorValue = std::constructible_from<S, const PredictorSetup&, const P&>;
template <class S, class P>
concept FromPredictorSetup =
    std::constructible_from<S, const PredictorSetup&> || TakesPredictorValue<S, P>;
template <class S, class O, class B>
concept HasForwardWeights = requires(S& st, const typename B::Context& ctx,
                                     OptimizerState<O, B>& opt) {
  { st.forward_weights(ctx, opt, 0) } -> std::convertible_to<const float*>;
};
template <class S, class O, class B>
concept HasBackwardWeights = requires(S& st, const typename B::Context& ctx,
                                      OptimizerState<O, B>& opt) {
  { st.backward_weights(ctx, opt, 0) } -> std::convertible_to<const float*>;
};
template <class S>
concept HasBackwardDone = requires(S& st) {
  st.backward_done(0);
};
template <class S, class O, class B>
concept HasBeforeStep = requires(S& st, const typename B::Context& ctx, OptimizerState<O, B>& opt) {
  st.before_step(ctx, opt);
};
template <class S, class O, class B>
concept HasApplyStep = requires(S& st, const typename B::Context& ctx, OptimizerState<O, B>& opt) {
  { st.apply_step(ctx, opt) } -> std::convertible_to<bool>;
};
template <class S>
concept HasWeightCopies = requires(const S& st) {
  { st.weight_copies() } -> std::convertible_to<int>;
};

template <class S, class P, class O, class B>
concept PredictorStateFor =
    FromPredictorSetup<S, P> && HasForwardWeights<S, O, B> && HasBackwardWeights<S, O, B> &&
    HasBackwardDone<S> && HasBeforeStep<S, O, B> && HasWeightCopies<S>;
//! Builds predictor P's State for one stage into `slot` (a std::optional of it), passing the
//! predictor's value where the State takes it.
template <class P, class S>
void emplace_predictor_state(std::optional<S>& slot, const PredictorSetup& setup,
                             const P& predictor) {
  if constexpr (TakesPredictorValue<S, P>)
    slot.emplace(setup, predictor);
  else
    slot.emplace(setup);
}
}  // namespace detail

//! Predictor: a policy choosing the weights each action of a stage reads, for optimizer O on
//! backend B (the State is probed with `const B::Context&` and `OptimizerState<O, B>&`, so a
//! predictor written for one backend's context qualifies for that backend only).
//! Required members:
//!   - `static constexpr const char* name`;
//!   - `template <class O, class B> class State`, constructible from `const PredictorSetup&`,
//!     or from `(const PredictorSetup&, const P&)` to read the predictor's hyper-parameters
//!     (allocate every copy there: nothing may allocate while training), with
//!     - `const float* forward_weights(const Ctx&, OptimizerState<O, B>&, int g)`: the weights
//!       Forward(g) reads (the live ones, a stashed or a predicted copy);
//!     - `const float* backward_weights(const Ctx&, OptimizerState<O, B>&, int g)`;
//!     - `void backward_done(int g)`: Backward(g) finished (release what only it needed);
//!     - `void before_step(const Ctx&, OptimizerState<O, B>&)`: the live weights are about to
//!       change (save a version still needed);
//!     - `int weight_copies() const`: weight buffers held, the live weights included.
//! Optional: `bool apply_step(const Ctx&, OptimizerState<O, B>& opt)`: the remedy takes the
//! step itself (after before_step) instead of `opt.step(ctx)` — another learning rate, another
//! optimizer form, a correction after it, or no step at all (return false: the gradients then
//! keep accumulating into the next mini-batch's). Returns whether the weights were stepped.
//! Optional: `static constexpr StalenessTarget target`, the s an extrapolating predictor reads
//! (`analysis->forward(stage, g).s(target)`). Deriving the State from PredictorHooks supplies
//! no-op backward_done and before_step. Optional: `hyper_parameters(f)` (HyperRange above).
//! docs/contributing.md, "Add a predictor", has the call order.
//! Usage: `static_assert(Predictor<XPipe>); static_assert(Predictor<MyCudaOnly, Adam, Cuda>);`
template <class P, class O = Adam, class B = Host>
concept Predictor = detail::HasPredictorName<P> && detail::HasValidTarget<P> &&
    detail::HasPredictorState<P, O, B> &&
    detail::PredictorStateFor<typename P::template State<O, B>, P, O, B>;

//! Fails to compile with one message per requirement P does not meet for optimizer O on backend
//! B, each naming the member; checks that depend on State are skipped when State is missing, so
//! one fault gives one message. Usage: `static_assert(check_predictor<Mine, SGD, Host>());`
template <class P, class O, class B = Host>
consteval bool check_predictor() {
  static_assert(detail::HasPredictorName<P>,
                "xpipe: Predictor: missing static member name (static constexpr const char*)");
  static_assert(detail::HasValidTarget<P>,
                "xpipe: Predictor: member target must be a static constexpr StalenessTarget");
  static_assert(detail::HasPredictorState<P, O, B>,
                "xpipe: Predictor: missing member template State<Optimizer, Backend>");
  if constexpr (detail::HasPredictorState<P, O, B>) {
    using S = typename P::template State<O, B>;
    static_assert(detail::FromPredictorSetup<S, P>,
                  "xpipe: Predictor: State lacks the constructor State(const PredictorSetup&) "
                  "(or State(const PredictorSetup&, const P&) for a predictor with "
                  "hyper-parameters)");
    static_assert(detail::HasForwardWeights<S, O, B>,
                  "xpipe: Predictor: State lacks forward_weights(ctx, opt, g) returning const "
                  "float* (ctx: const Backend::Context&, opt: OptimizerState<O, B>&)");
    static_assert(detail::HasBackwardWeights<S, O, B>,
                  "xpipe: Predictor: State lacks backward_weights(ctx, opt, g) returning const "
                  "float* (ctx: const Backend::Context&, opt: OptimizerState<O, B>&)");
    static_assert(detail::HasBackwardDone<S>,
                  "xpipe: Predictor: State lacks backward_done(g) (derive from PredictorHooks "
                  "for a no-op)");
    static_assert(detail::HasBeforeStep<S, O, B>,
                  "xpipe: Predictor: State lacks before_step(ctx, opt) (derive from "
                  "PredictorHooks for a no-op)");
    static_assert(detail::HasWeightCopies<S>,
                  "xpipe: Predictor: State lacks weight_copies() const returning int");
  }
  return true;
}

//! check_predictor against more than one optimizer, Adam and SGD, on the host: a predictor that
//! only compiles for one optimizer's OptimizerState is caught here. Reports for SGD only when
//! Adam passes, so one fault gives one set of messages.
//! Usage: `static_assert(check_predictor<Mine>());`
template <class P>
consteval bool check_predictor() {
  if constexpr (Predictor<P, Adam, Host>)
    return check_predictor<P, SGD, Host>();
  else
    return check_predictor<P, Adam, Host>();
}

}  // namespace xpipe
