// Per-element optimizer math: one SGD-momentum or Adam/AdamW update, and the update direction
// ΔW that weight prediction extrapolates along. Written once for the host loop and CUDA.
#pragma once

#include <cmath>

#include "xpipe/core/config.hpp"

namespace xpipe::math {

//! Scalars of one SGD step, PyTorch semantics. `first_step` starts the momentum buffer at g.
struct SgdScalars {
  float lr;
  float momentum;
  float dampening;
  float weight_decay;
  bool nesterov;
  bool first_step;
};

//! One SGD step on a single weight: g' = g + wd w; m = mu m + (1 - dampening) g' (m = g' on the
//! first step); d = nesterov ? g' + mu m : m; w -= lr d.
XPIPE_HOST_DEVICE void sgd_update(float& w, float g, float& m, const SgdScalars& s) {
  const float gd = g + s.weight_decay * w;
  const float mn = s.first_step ? gd : s.momentum * m + (1.f - s.dampening) * gd;
  const float d = s.nesterov ? gd + s.momentum * mn : mn;
  m = mn;
  w -= s.lr * d;
}

//! SGD's next-step direction for prediction: the momentum buffer itself (docs/design.md).
XPIPE_HOST_DEVICE float sgd_direction(float m) {
  return m;
}

//! Weight prediction along SGD's direction: w_hat = w - s_lr * m, with s_lr = s * lr.
XPIPE_HOST_DEVICE float sgd_predict(float w, float m, float s_lr) {
  return w - s_lr * sgd_direction(m);
}

//! Scalars of one Adam/AdamW step, bias corrections precomputed for step t (1-based):
//! step_size = lr / (1 - beta1^t), inv_bc1 = 1 / (1 - beta1^t), inv_sqrt_bc2 = 1 / sqrt(1 -
//! beta2^t).
struct AdamScalars {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;
  float step_size;
  float inv_bc1;
  float inv_sqrt_bc2;
  bool decoupled;  // AdamW: decay the weight directly instead of adding wd w to the gradient
};

//! Bias-corrected scalars for step t (t >= 1), computed in double so that t in the tens of
//! thousands does not lose the correction to rounding.
inline AdamScalars adam_scalars(float lr, float beta1, float beta2, float eps, float weight_decay,
                                bool decoupled, long t) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(t));
  return {lr,
          beta1,
          beta2,
          eps,
          weight_decay,
          static_cast<float>(lr / bc1),
          static_cast<float>(1.0 / bc1),
          static_cast<float>(1.0 / std::sqrt(bc2)),
          decoupled};
}

//! One Adam (L2) or AdamW (decoupled) step on a single weight, in PyTorch's arithmetic order:
//! m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; w -= (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps).
XPIPE_HOST_DEVICE void adam_update(float& w, float g, float& m, float& v, const AdamScalars& s) {
  const float wd_grad = s.decoupled ? 0.f : s.weight_decay;
  const float wd_decay = s.decoupled ? s.lr * s.weight_decay : 0.f;
  const float gd = g + wd_grad * w;
  const float mn = s.beta1 * m + (1.f - s.beta1) * gd;
  const float vn = s.beta2 * v + (1.f - s.beta2) * gd * gd;
  m = mn;
  v = vn;
  const float wn = w * (1.f - wd_decay);
  w = wn - s.step_size * mn / (sqrtf(vn) * s.inv_sqrt_bc2 + s.eps);
}

//! Adam's next-step direction from its current state: m_hat / (sqrt(v_hat) + eps), with the bias
//! corrections of the step already taken (`s` from adam_scalars(..., t)). Multiplying by lr gives
//! the step the optimizer would take if the next gradient were zero-mean noise.
XPIPE_HOST_DEVICE float adam_direction(float m, float v, const AdamScalars& s) {
  return s.inv_bc1 * m / (sqrtf(v) * s.inv_sqrt_bc2 + s.eps);
}

//! Weight prediction along Adam's direction: w_hat = w - s_lr * m_hat / (sqrt(v_hat) + eps),
//! with s_lr = s * lr (XPipe's extrapolation of s steps at the current step size).
XPIPE_HOST_DEVICE float adam_predict(float w, float m, float v, float s_lr, const AdamScalars& s) {
  return w - s_lr * adam_direction(m, v, s);
}

//! NAdam's momentum at step t (1-based) under the momentum-decay schedule of Dozat (2016) as
//! torch.optim.NAdam defines it: mu_t = beta1 (1 - 0.5 * 0.96^(t psi)), psi the momentum decay
//! (PyTorch's default 0.004). psi = 0 means no schedule here: mu_t = beta1 at every step (where
//! PyTorch's formula would give beta1 / 2).
inline double nadam_mu(double beta1, double psi, long t) {
  return psi > 0 ? beta1 * (1.0 - 0.5 * std::pow(0.96, static_cast<double>(t) * psi)) : beta1;
}

//! mu_1 mu_2 ... mu_t (nadam_mu, t >= 0), multiplied in that order in double, so the bits do not
//! depend on how a run got to step t (a resume included). Memos per thread, one per (beta1, psi)
//! for up to 8 of them (a thread may run stages of several momenta: PipeNAG-k), each holding
//! the products at its last t and t - 1 (a step asks for t + 1 where a prediction asks for t):
//! a run's steps then cost a multiplication each, not t.
inline double nadam_mu_product(double beta1, double psi, long t) {
  struct Memo {
    double beta1 = -1, psi = -1;
    long t = 0;
    double product = 1, previous = 1;  // at t and at t - 1
  };
  thread_local Memo memos[8];
  thread_local int next = 0;
  Memo* m = nullptr;
  for (Memo& candidate : memos)
    if (candidate.beta1 == beta1 && candidate.psi == psi) m = &candidate;
  if (m == nullptr) {
    m = &memos[next];
    next = (next + 1) % 8;
    *m = {beta1, psi, 0, 1.0, 1.0};
  }
  if (t == m->t - 1) return m->previous;
  if (t < m->t) *m = {beta1, psi, 0, 1.0, 1.0};
  for (; m->t < t; ++m->t) {
    m->previous = m->product;
    m->product *= nadam_mu(beta1, psi, m->t + 1);
  }
  return m->product;
}

//! Scalars of one NAdam step (Dozat 2016), the bias corrections precomputed for step t (1-based),
//! with the momenta mu_t of nadam_mu and their running product P_t = mu_1 ... mu_t:
//! c_m = mu_(t+1) / (1 - P_t mu_(t+1)) weighs the new momentum, c_g = (1 - mu_t) / (1 - P_t) the
//! current gradient (Nesterov's look-ahead), inv_sqrt_bc2 = 1 / sqrt(1 - beta2^t). The momentum
//! itself averages with beta1 (m = beta1 m + (1 - beta1) g), as PyTorch's does. With psi = 0
//! (mu_t = beta1, P_t = beta1^t): c_m = beta1 / (1 - beta1^(t+1)), c_g = (1 - beta1) /
//! (1 - beta1^t), the constant-momentum rule.
struct NadamScalars {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;
  float c_m;
  float c_g;
  float inv_sqrt_bc2;
  bool decoupled;  // NAdamW: decay the weight directly
};

//! NAdam's scalars for step t >= 1 with momentum decay psi (nadam_mu), in double like
//! adam_scalars.
inline NadamScalars nadam_scalars(float lr, float beta1, float beta2, float eps, float weight_decay,
                                  bool decoupled, long t, float psi = 0.f) {
  const double b1 = beta1, b2 = beta2, td = static_cast<double>(t);
  const double bc2 = 1.0 - std::pow(b2, td);
  double c_m = 0, c_g = 0;
  if (psi > 0.f) {
    const double mu = nadam_mu(b1, psi, t), mu_next = nadam_mu(b1, psi, t + 1),
                 product = nadam_mu_product(b1, psi, t);
    c_m = mu_next / (1.0 - product * mu_next);
    c_g = (1.0 - mu) / (1.0 - product);
  } else {  // mu_t = beta1: the powers directly
    c_m = b1 / (1.0 - std::pow(b1, td + 1.0));
    c_g = (1.0 - b1) / (1.0 - std::pow(b1, td));
  }
  return {lr,
          beta1,
          beta2,
          eps,
          weight_decay,
          static_cast<float>(c_m),
          static_cast<float>(c_g),
          static_cast<float>(1.0 / std::sqrt(bc2)),
          decoupled};
}

//! One NAdam (L2) or NAdamW (decoupled) step on a single weight: m = b1 m + (1 - b1) g;
//! v = b2 v + (1 - b2) g^2; w -= lr (c_m m + c_g g) / (sqrt(v) / sqrt(bc2) + eps).
XPIPE_HOST_DEVICE void nadam_update(float& w, float g, float& m, float& v, const NadamScalars& s) {
  const float wd_grad = s.decoupled ? 0.f : s.weight_decay;
  const float wd_decay = s.decoupled ? s.lr * s.weight_decay : 0.f;
  const float gd = g + wd_grad * w;
  const float mn = s.beta1 * m + (1.f - s.beta1) * gd;
  const float vn = s.beta2 * v + (1.f - s.beta2) * gd * gd;
  m = mn;
  v = vn;
  const float wn = w * (1.f - wd_decay);
  w = wn - s.lr * (s.c_m * mn + s.c_g * gd) / (sqrtf(vn) * s.inv_sqrt_bc2 + s.eps);
}

//! NAdam's next-step direction with a zero next gradient: c_m m / (sqrt(v_hat) + eps).
XPIPE_HOST_DEVICE float nadam_direction(float m, float v, const NadamScalars& s) {
  return s.c_m * m / (sqrtf(v) * s.inv_sqrt_bc2 + s.eps);
}

//! Error feedback after a delayed step (2BW + EF): d = before - w is the update just applied; the
//! weight moves on by gamma (d - d_prev), the change of the update since the previous step, and
//! d_prev keeps d.
XPIPE_HOST_DEVICE void error_feedback(float& w, float before, float& d_prev, float gamma) {
  const float d = before - w;
  w -= gamma * (d - d_prev);
  d_prev = d;
}

//! PipeMare's weight velocity: an exponential average of the per-step change of a weight,
//! delta = gamma delta + (1 - gamma) (w - before).
XPIPE_HOST_DEVICE void velocity_update(float& delta, float w, float before, float gamma) {
  delta = gamma * delta + (1.f - gamma) * (w - before);
}

//! DC-ASGD's delay compensation of one weight's gradient g, computed on w_bak and applied at w:
//! g + lambda g^2 (w - w_bak), g g^T's diagonal standing in for the Hessian's (the constant form).
XPIPE_HOST_DEVICE void delay_compensation(float& g, float w, float w_bak, float lambda) {
  g += lambda * g * g * (w - w_bak);
}

//! The adaptive form: ms = m ms + (1 - m) g^2 first, then g + (lambda / sqrt(ms)) g^2 (w - w_bak),
//! so the correction scales with |g| (ms is zero only where g and every earlier g were).
XPIPE_HOST_DEVICE void delay_compensation_adaptive(float& g, float& ms, float w, float w_bak,
                                                   float lambda, float m) {
  ms = m * ms + (1.f - m) * g * g;
  if (ms > 0.f) g += lambda * g * g / sqrtf(ms) * (w - w_bak);
}

//! The whole pipeline's squared gradient norm from the stages' squared norms, added in stage
//! order: the same bits wherever it runs (a host Step, GradNormBoard, a device's ClipFactor).
//! Usage: `const double squared = stages_squared_norm(norms + t * K, K);`
XPIPE_HOST_DEVICE double stages_squared_norm(const double* squared, int stages) {
  double total = 0;
  for (int k = 0; k < stages; ++k) total += squared[k];
  return total;
}

//! Global gradient-norm clipping's factor (torch.nn.utils.clip_grad_norm_): bound / (|g| + 1e-6),
//! |g| = sqrt(squared) the norm of the whole pipeline's gradient of one mini-batch. The gradient
//! is scaled by it only where it is below 1; a norm that is not finite gives NaN or 0.
//! Usage: `if (const double f = clip_factor(squared, 1.f); f < 1.0) scale_buffer(ctx, g, n, f);`
XPIPE_HOST_DEVICE double clip_factor(double squared, float bound) {
  return static_cast<double>(bound) / (sqrt(squared) + 1e-6);
}

}  // namespace xpipe::math
