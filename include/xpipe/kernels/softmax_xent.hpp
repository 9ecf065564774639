// Numerically stable softmax cross-entropy of one row of logits: loss and gradient together.
#pragma once

#include <cmath>

#include "xpipe/core/config.hpp"

namespace xpipe::math {

//! x - max, except 0 for the maximum itself: the same bits for finite logits, and for a +inf
//! maximum 0 rather than inf - inf = NaN, so the +inf logits share the probability and a finite
//! label's loss is +inf (overflow), not NaN. A NaN logit still gives NaN.
XPIPE_HOST_DEVICE float shifted_logit(float x, float max_logit) {
  return x == max_logit ? 0.f : x - max_logit;
}

//! Loss -log softmax(logits)[label] of one row, and grad[j] = (softmax_j - [j == label]) * scale.
//! Shifting by the row maximum keeps exp() in range for logits of any magnitude (±1e4 included).
//! `scale` is 1 / (rows of the whole mini-batch), so micro-batch gradients sum to the mean.
XPIPE_HOST_DEVICE float softmax_xent_row(const float* logits, index_t n, int label, float scale,
                                         float* grad) {
  float max_logit = logits[0];
  for (index_t j = 1; j < n; ++j) max_logit = logits[j] > max_logit ? logits[j] : max_logit;
  // grad temporarily holds exp(x - max); the sum is at least 1 (the max term), so no 0/0.
  float sum = 0.f;
  for (index_t j = 0; j < n; ++j) {
    grad[j] = expf(shifted_logit(logits[j], max_logit));
    sum += grad[j];
  }
  const float inv_sum = 1.f / sum;
  for (index_t j = 0; j < n; ++j) grad[j] = (grad[j] * inv_sum - (j == label ? 1.f : 0.f)) * scale;
  // log-sum-exp minus the label's shifted logit: never exp() of a large positive number. With a
  // +inf logit elsewhere this is +inf (the label's probability is 0), not inf - inf = NaN.
  return logf(sum) - shifted_logit(logits[label], max_logit);
}

//! Index of the largest logit (first on ties): the predicted class.
XPIPE_HOST_DEVICE int argmax_row(const float* logits, index_t n) {
  int best = 0;
  for (index_t j = 1; j < n; ++j)
    if (logits[j] > logits[best]) best = static_cast<int>(j);
  return best;
}

}  // namespace xpipe::math
