// The Optimizer concept, and the flat per-stage state every optimizer steps in one fused pass.
#pragma once

#include <array>
#include <atomic>
#include <concepts>
#include <cstdint>
#include <string>

#include "xpipe/backend/backend.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/optim/lr_schedule.hpp"

namespace xpipe {

//! The flat buffers one optimizer pass reads and writes: weights, gradients and up to two moment
//! buffers, all `size` floats long, plus the number of steps already taken.
struct FlatState {
  float* weights = nullptr;
  const float* grads = nullptr;
  std::array<float*, 2> moments{};
  index_t size = 0;
  long steps_taken = 0;
};

namespace detail {
template <class O>
concept HasMomentCount = requires {
  { O::moment_count } -> std::convertible_to<int>;
};
template <class O>
concept HasName = requires {
  { O::name } -> std::convertible_to<const char*>;
};
template <class O, class B>
concept HasStep = requires(const O& o, const typename B::Context& ctx, const FlatState& s) {
  o.step(ctx, s);
};
template <class O, class B>
concept HasDirection = requires(const O& o, const typename B::Context& ctx, const FlatState& s,
                                float* d) {
  o.direction(ctx, s, d);
};
template <class O, class B>
concept HasPredict = requires(const O& o, const typename B::Context& ctx, const FlatState& s,
                              float* d) {
  o.predict(ctx, s, 1.f, d);
};
template <class O>
concept HasLearningRate = requires(const O& o) {
  { o.learning_rate() } -> std::convertible_to<float>;
};
}  // namespace detail

//! True when O declares `static constexpr bool elementwise = true`: its step reads and writes
//! each element of the flat buffers alone (no norm or sum over the buffer), with scalars that
//! depend on the step count only, so a step taken over the parts of the buffer, each once, gives
//! the bits of one step over the whole (OptimizerState::step_in_parts).
//! Usage: `if constexpr (steps_elementwise<O>) state.step_in_parts(...); else state.step(ctx);`
template <class O>
inline constexpr bool steps_elementwise = requires {
  requires O::elementwise;
};

//! Optimizer: a value holding hyper-parameters; the moments live in the stage's flat buffers.
//! Probed on backend B: `Ctx` below is `const B::Context&`, so an optimizer written for one
//! backend's context qualifies for that backend only.
//! Required members:
//!   - `static constexpr int moment_count` (0, 1 or 2 flat moment buffers);
//!   - `static constexpr const char* name`;
//!   - `void step(const Ctx&, const FlatState&) const`: step number steps_taken + 1, one pass;
//!   - `void direction(const Ctx&, const FlatState&, float* d) const`: ΔW, the update direction
//!     of the next step from the current state (what weight prediction extrapolates along);
//!   - `void predict(const Ctx&, const FlatState&, float steps, float* out) const`:
//!     out = W - steps * lr * ΔW, fused in one pass (weight prediction);
//!   - `float learning_rate() const`.
//! Optional: `static constexpr bool elementwise = true` (steps_elementwise) when each element's
//! step stands alone; a trainer may then step each layer's weights as soon as its gradient is
//! complete, while they are still in cache.
//! Usage: `static_assert(Optimizer<Adam>); static_assert(Optimizer<Adam, Cuda>);`
template <class O, class B = Host>
concept Optimizer = detail::HasMomentCount<O> && detail::HasName<O> && detail::HasStep<O, B> &&
    detail::HasDirection<O, B> && detail::HasPredict<O, B> && detail::HasLearningRate<O>;

//! Fails to compile with a message naming each member O lacks on backend B.
//! Usage: `static_assert(check_optimizer<MyOptimizer>());`
template <class O, class B = Host>
consteval bool check_optimizer() {
  static_assert(detail::HasMomentCount<O>, "xpipe: Optimizer: missing static member moment_count");
  static_assert(detail::HasName<O>, "xpipe: Optimizer: missing static member name");
  static_assert(detail::HasStep<O, B>,
                "xpipe: Optimizer: missing step(ctx, const FlatState&) const");
  static_assert(detail::HasDirection<O, B>,
                "xpipe: Optimizer: missing direction(ctx, const FlatState&, float* d) const");
  static_assert(detail::HasPredict<O, B>,
                "xpipe: Optimizer: missing predict(ctx, const FlatState&, float steps, float* out) "
                "const");
  static_assert(detail::HasLearningRate<O>, "xpipe: Optimizer: missing learning_rate() const");
  return true;
}

//! The optimizer o with learning rate lr, for optimizers with a member `lr` (AnyOptimizer has its
//! own overload; another optimizer may overload it too). Usage:
//! `opt.step_with(ctx, with_learning_rate(o, lr))`.
template <class O>
requires requires(O& o) {
  o.lr = 1.f;
}
O with_learning_rate(O o, float lr) {
  o.lr = lr;
  return o;
}

namespace detail {
template <class O>
concept HasSettableRate = requires(const O& o) {
  { with_learning_rate(o, 1.f) } -> std::same_as<O>;
};
}  // namespace detail

//! Owns a stage's flat weights, gradients and optimizer moments on backend B, and the step count.
//! With StepRates set, the held optimizer's rate is always the one of the next step (base rate
//! times factor(steps + 1)): what step() takes, what a remedy deriving its step from optimizer()
//! takes, and predict() extrapolates with the rates of the steps it predicts.
//! Usage: `OptimizerState<Adam> st(Adam{}, n); ...; st.step(ctx);`
template <class O, class B = DefaultBackend>
class OptimizerState {
  static_assert(check_optimizer<O, B>());

 public:
  //! Moment buffers it holds, each as long as the weights.
  static constexpr int moment_buffers = O::moment_count > 2 ? 2 : O::moment_count;

  OptimizerState(O optimizer, index_t size)
      : base_(optimizer),
        optimizer_(optimizer),
        weights_(size),
        grads_(size),
        m0_(O::moment_count > 0 ? size : 0),
        m1_(O::moment_count > 1 ? size : 0) {}

  float* weights() { return weights_.data(); }
  const float* weights() const { return weights_.data(); }
  float* grads() { return grads_.data(); }
  const float* grads() const { return grads_.data(); }
  index_t size() const { return weights_.size(); }
  long steps_taken() const { return steps_; }
  //! The optimizer the next step takes: the one set, at the next step's rate under StepRates.
  const O& optimizer() const { return optimizer_; }
  //! The optimizer step n (1-based) takes: the one set, at step n's rate under StepRates
  //! (a remedy that runs steps ahead takes each at its own rate).
  O optimizer_at(long n) const {
    if constexpr (detail::HasSettableRate<O>)
      if (rates_.active())
        return with_learning_rate(base_,
                                  static_cast<float>(base_.learning_rate() * rates_.factor(n)));
    return base_;
  }
  //! Replaces the held optimizer (its hyper-parameters: another base rate). Between steps
  //! only: nothing may be stepping or predicting with this state meanwhile. The weights, the
  //! moments, the step count and the step rates stay as they are.
  void set_optimizer(O optimizer) {
    base_ = optimizer;
    refresh();
  }
  //! Sets the per-step rates (inactive StepRates: the base rate at every step); ConfigError
  //! when they do not check, or when O's rate cannot be set (no member lr and no
  //! with_learning_rate overload). Between steps only.
  void set_step_rates(const StepRates& rates) {
    rates.check();
    if constexpr (!detail::HasSettableRate<O>)
      if (rates.active())
        throw ConfigError(std::string("xpipe: OptimizerState: optimizer ") + O::name +
                          " has no learning rate to schedule (no member lr, no "
                          "with_learning_rate overload)");
    rates_ = rates;
    refresh();
  }
  const StepRates& step_rates() const { return rates_; }
  const float* moment(int i) const { return i == 0 ? m0_.data() : m1_.data(); }
  float* moment(int i) { return i == 0 ? m0_.data() : m1_.data(); }
  //! Sets the step count (a restored checkpoint's; Adam's bias correction reads it).
  void set_steps_taken(long steps) {
    steps_ = steps;
    refresh();
  }

  FlatState flat() {
    return {weights_.data(), grads_.data(), {m0_.data(), m1_.data()}, weights_.size(), steps_};
  }

  //! One optimizer step over the whole flat buffer with the current gradients.
  template <class Ctx>
  void step(const Ctx& ctx) {
    optimizer_.step(ctx, flat());
    ++steps_;
    refresh();
  }
  //! One optimizer step taken in parts, for an elementwise optimizer: `run(part)` calls
  //! `part(ctx, first, count)` for ranges of the flat buffer that cover it once, in any order,
  //! each on the context given (a backward steps each layer's range once its gradient is
  //! complete; two lanes of one may step disjoint ranges at once). The bits are those of step().
  //! A range outside the buffer is a ConfigError before it is stepped; ranges whose lengths do
  //! not add up to the buffer's are a ConfigError after the others were stepped (the check is
  //! on the total: ranges that overlap and miss as much pass it). On either error, and on an
  //! exception from `run`, the ranges already stepped stay stepped and the step is not counted:
  //! the state is then no step's.
  //! Usage: `st.step_in_parts([&](auto part) { Model::backward(..., part); });`
  template <class Run>
  void step_in_parts(Run&& run) {
    static_assert(steps_elementwise<O>,
                  "xpipe: OptimizerState::step_in_parts: the optimizer does not declare "
                  "`static constexpr bool elementwise = true` (its step may read the whole "
                  "buffer); take step() instead");
    const FlatState whole = flat();
    std::atomic<index_t> covered{0};
    run([&](const auto& ctx, index_t first, index_t count) {
      if (first < 0 || count < 0 || first + count > whole.size)
        throw ConfigError("xpipe: OptimizerState::step_in_parts: part [" + std::to_string(first) +
                          ", " + std::to_string(first + count) + ") lies outside the " +
                          std::to_string(whole.size) + " weights");
      FlatState part = whole;
      part.weights += first;
      part.grads += first;
      for (float*& m : part.moments)
        if (m != nullptr) m += first;
      part.size = count;
      optimizer_.step(ctx, part);
      covered.fetch_add(count, std::memory_order_relaxed);
    });
    if (covered.load() != whole.size)
      throw ConfigError("xpipe: OptimizerState::step_in_parts: the parts stepped " +
                        std::to_string(covered.load()) + " of " + std::to_string(whole.size) +
                        " weights");
    ++steps_;
    refresh();
  }
  //! One step taken by `o` in place of the held optimizer (a remedy's variant of it: another
  //! learning rate, its Nesterov form), over the same buffers, counted like step().
  template <class Ctx, class O2>
  void step_with(const Ctx& ctx, const O2& o) {
    static_assert(O2::moment_count <= O::moment_count,
                  "xpipe: OptimizerState::step_with: the optimizer needs more moment buffers "
                  "than the state holds");
    o.step(ctx, flat());
    ++steps_;
    refresh();
  }
  //! d = ΔW from the current state.
  template <class Ctx>
  void direction(const Ctx& ctx, float* d) {
    optimizer_.direction(ctx, flat(), d);
  }
  //! out = W - steps * lr * ΔW; under StepRates, out = W - (lr_{n+1} + ... + lr_{n+steps}) ΔW
  //! with the rates of the steps predicted (n the steps taken).
  template <class Ctx>
  void predict(const Ctx& ctx, float steps, float* out) {
    if constexpr (detail::HasSettableRate<O>) {
      if (rates_.active() && steps > 0.f) {
        const double sum = rates_.rate_sum(base_.learning_rate(), steps_, steps);
        with_learning_rate(base_, static_cast<float>(sum)).predict(ctx, flat(), 1.f, out);
        return;
      }
    }
    optimizer_.predict(ctx, flat(), steps, out);
  }

 private:
  // The held optimizer at the next step's rate.
  void refresh() { optimizer_ = optimizer_at(steps_ + 1); }

  O base_;       // as set: the base rate
  O optimizer_;  // at the rate of step steps_ + 1
  typename B::template Buffer<float> weights_, grads_, m0_, m1_;
  long steps_ = 0;
  StepRates rates_;
};

}  // namespace xpipe
