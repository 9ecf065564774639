// An optimizer turned into a close relative for one step: with another learning rate (PipeMare's
// per-stage rate) or in its Nesterov form with a given momentum (PipeNAG). Remedies take their
// steps through these, so they work with every shipped optimizer, AnyOptimizer included.
#pragma once

#include <cmath>
#include <string>
#include <type_traits>
#include <variant>

#include "xpipe/core/config.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/optim/any.hpp"

namespace xpipe {

//! Checks a learning rate set between steps (`who` names the caller): ConfigError unless lr is
//! finite and > 0.
inline void check_learning_rate(float lr, const char* who) {
  if (!(lr > 0.f) || !std::isfinite(lr))
    throw ConfigError(std::string("xpipe: ") + who + ": the rate must be finite and > 0 (got " +
                      detail::number_text(lr) + ")");
}

//! The momentum coefficient of o: SGD's momentum, the Adam family's beta1.
inline float momentum_of(const SGD& o) {
  return o.momentum;
}
template <bool D>
float momentum_of(const BasicAdam<D>& o) {
  return o.beta1;
}
template <bool D>
float momentum_of(const BasicNAdam<D>& o) {
  return o.beta1;
}
inline float momentum_of(const AnyOptimizer& o) {
  return std::visit([](const auto& alt) { return momentum_of(alt); }, o.impl);
}

//! The Nesterov form of o with momentum beta (PipeNAG):
//!   - Adam/AdamW -> NAdam/NAdamW with beta1 = beta (NAdam stays NAdam with the new beta1);
//!   - SGD -> SGD with Nesterov momentum beta and learning rate lr (1 - beta) / (1 - mu), mu
//!     the original momentum, so that the steady-state step under a constant gradient g,
//!     lr g / (1 - mu), is unchanged (Nesterov's d = g + beta m tends to g / (1 - beta)).
inline SGD nesterov_form(const SGD& o, float beta) {
  if (!(o.momentum >= 0.f && o.momentum < 1.f))
    throw ConfigError("xpipe: nesterov_form: SGD momentum must lie in [0, 1)");
  SGD n = o;
  n.lr = o.lr * (1.f - beta) / (1.f - o.momentum);
  n.momentum = beta;
  n.dampening = 0.f;
  n.nesterov = true;
  return n;
}
template <bool D>
BasicNAdam<D> nesterov_form(const BasicAdam<D>& o, float beta) {
  return {o.lr, beta, o.beta2, o.eps, o.weight_decay};
}
template <bool D>
BasicNAdam<D> nesterov_form(const BasicNAdam<D>& o, float beta) {
  BasicNAdam<D> n = o;
  n.beta1 = beta;
  return n;
}
inline AnyOptimizer nesterov_form(const AnyOptimizer& o, float beta) {
  return std::visit([&](const auto& alt) { return AnyOptimizer{nesterov_form(alt, beta)}; },
                    o.impl);
}

//! o with NAdam's momentum decay psi (math::nadam_mu) set: the Adam family's Nesterov form has the
//! schedule; SGD's has none, so psi must be 0 there.
inline SGD with_momentum_decay(const SGD& o, float psi) {
  if (psi != 0.f)
    throw ConfigError("xpipe: momentum_decay " + std::to_string(psi) +
                      " is NAdam's momentum schedule; SGD's Nesterov form has none (use 0, or an "
                      "Adam-family optimizer)");
  return o;
}
template <bool D>
BasicNAdam<D> with_momentum_decay(BasicNAdam<D> o, float psi) {
  o.momentum_decay = psi;
  return o;
}
inline AnyOptimizer with_momentum_decay(const AnyOptimizer& o, float psi) {
  return std::visit(
      [&](const auto& alt) -> AnyOptimizer {
        if constexpr (requires { with_momentum_decay(alt, psi); })
          return AnyOptimizer{with_momentum_decay(alt, psi)};
        else
          throw ConfigError(std::string("xpipe: momentum_decay is NAdam's momentum schedule; ") +
                            alt.name + " has none (the Adam family's Nesterov form is NAdam)");
      },
      o.impl);
}

}  // namespace xpipe
