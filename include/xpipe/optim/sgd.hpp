// SGD with momentum, dampening, weight decay and optional Nesterov (PyTorch semantics).
#pragma once

#include "xpipe/core/error.hpp"
#include "xpipe/kernels/ops.hpp"
#include "xpipe/optim/optimizer.hpp"

namespace xpipe {

//! SGD with momentum. Usage: `SGD{.lr = 0.05f, .momentum = 0.9f}`.
struct SGD {
  static constexpr int moment_count = 1;
  static constexpr const char* name = "sgd";
  // Each weight's update reads that weight, its gradient and moments alone: a step may be
  // taken layer by layer (steps_elementwise).
  static constexpr bool elementwise = true;
  float lr = 0.01f;
  float momentum = 0.9f;
  float dampening = 0.f;
  float weight_decay = 0.f;
  bool nesterov = false;

  float learning_rate() const { return lr; }

  math::SgdScalars scalars(long steps_taken) const {
    if (!(lr > 0.f)) throw ConfigError("xpipe: SGD: learning rate must be > 0");
    return {lr, momentum, dampening, weight_decay, nesterov, steps_taken == 0};
  }

  template <class Ctx>
  void step(const Ctx& ctx, const FlatState& s) const {
    sgd_step(ctx, s.weights, s.grads, s.moments[0], s.size, scalars(s.steps_taken));
  }

  //! ΔW = the momentum buffer (zero before the first step).
  template <class Ctx>
  void direction(const Ctx& ctx, const FlatState& s, float* d) const {
    sgd_direction(ctx, s.moments[0], d, s.size);
  }

  //! out = W - steps * lr * ΔW in one pass (weight prediction over `steps` steps).
  template <class Ctx>
  void predict(const Ctx& ctx, const FlatState& s, float steps, float* out) const {
    sgd_predict(ctx, s.weights, s.moments[0], out, s.size, steps * lr);
  }
};
static_assert(Optimizer<SGD>);

}  // namespace xpipe
