// AnyOptimizer: SGD, Adam or AdamW chosen at run time, for tools that map flags onto one
// compiled Pipeline type instead of one instantiation per optimizer.
#pragma once

#include <array>
#include <string>
#include <variant>

#include "xpipe/optim/adam.hpp"
#include "xpipe/optim/nadam.hpp"
#include "xpipe/optim/sgd.hpp"

namespace xpipe {

//! One of SGD, Adam, AdamW, NAdam, NAdamW, dispatched per call (once per flat pass: no per-element
//! cost). Usage: `AnyOptimizer opt{Adam{.lr = 1e-3f}};`
struct AnyOptimizer {
  static constexpr int moment_count = 2;
  static constexpr const char* name = "any";
  // Each weight's update reads that weight, its gradient and moments alone: a step may be
  // taken layer by layer (steps_elementwise).
  static constexpr bool elementwise = true;
  std::variant<SGD, Adam, AdamW, NAdam, NAdamW> impl = Adam{};

  float learning_rate() const {
    return std::visit([](const auto& o) { return o.learning_rate(); }, impl);
  }
  const char* chosen_name() const {
    return std::visit([](const auto& o) { return o.name; }, impl);
  }
  template <class Ctx>
  void step(const Ctx& ctx, const FlatState& s) const {
    std::visit([&](const auto& o) { o.step(ctx, s); }, impl);
  }
  template <class Ctx>
  void direction(const Ctx& ctx, const FlatState& s, float* d) const {
    std::visit([&](const auto& o) { o.direction(ctx, s, d); }, impl);
  }
  template <class Ctx>
  void predict(const Ctx& ctx, const FlatState& s, float steps, float* out) const {
    std::visit([&](const auto& o) { o.predict(ctx, s, steps, out); }, impl);
  }
};
static_assert(Optimizer<AnyOptimizer>);

//! The chosen optimizer with learning rate lr.
inline AnyOptimizer with_learning_rate(AnyOptimizer o, float lr) {
  std::visit([&](auto& alt) { alt.lr = lr; }, o.impl);
  return o;
}

//! The names make_optimizer knows.
inline constexpr std::array<const char*, 5> optimizer_names{SGD::name, Adam::name, AdamW::name,
                                                            NAdam::name, NAdamW::name};

//! "sgd" (momentum 0.9), "adam", "adamw", "nadam" or "nadamw" with learning rate lr and the other
//! hyper-parameters at their defaults; ConfigError otherwise.
inline AnyOptimizer make_optimizer(const std::string& name, float lr) {
  if (!(lr > 0.f)) throw ConfigError("xpipe: learning rate must be > 0");
  if (name == SGD::name) return {SGD{.lr = lr, .momentum = 0.9f}};
  if (name == Adam::name) return {Adam{.lr = lr}};
  if (name == AdamW::name) return {AdamW{.lr = lr}};
  if (name == NAdam::name) return {NAdam{.lr = lr}};
  if (name == NAdamW::name) return {NAdamW{.lr = lr}};
  throw ConfigError("xpipe: unknown optimizer '" + name +
                    "' (available: " + join_names(optimizer_names) + ")");
}

}  // namespace xpipe
