// Softmax cross-entropy loss on the last stage's logits (mean over the whole mini-batch).
#pragma once

#include <cmath>
#include <cstdint>

#include "xpipe/core/error.hpp"
#include "xpipe/kernels/ops.hpp"

namespace xpipe {

//! Softmax cross-entropy. The gradient is scaled by 1 / (rows of the whole mini-batch), so the
//! gradients of M micro-batches sum to the gradient of the mean loss over the mini-batch.
struct SoftmaxCrossEntropy {
  //! Writes dlogits and each row's loss; returns nothing (row losses are summed by the caller,
  //! on the host, in row order).
  template <class Ctx>
  static void forward_backward(const Ctx& ctx, ConstMatrix logits, const std::int32_t* labels,
                               float scale, Matrix dlogits, float* row_loss) {
    softmax_xent(ctx, logits, labels, scale, dlogits, row_loss);
  }
};

//! Sum of host row losses in row order (a fixed order: same bits on every executor); throws
//! NumericError naming the row when a loss is NaN or infinite, so divergence stops training
//! with a message instead of silently producing garbage.
inline double sum_row_losses(const float* row_loss, index_t rows) {
  double total = 0.0;
  for (index_t r = 0; r < rows; ++r) {
    if (!std::isfinite(row_loss[r]))
      throw NumericError("xpipe: loss is " +
                         std::string(std::isnan(row_loss[r]) ? "NaN" : "infinite") + " at row " +
                         std::to_string(r) + " of the batch (diverged: lower the learning rate?)");
    total += row_loss[r];
  }
  return total;
}

}  // namespace xpipe
