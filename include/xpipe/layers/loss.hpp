// Softmax cross-entropy loss on the last stage's logits (mean over the whole mini-batch).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "xpipe/backend/host.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/kernels/ops.hpp"

namespace xpipe {

namespace detail {
// Contexts whose kernels read host memory (the host backend's, and test backends built on it):
// labels handed to them can be checked on the host before the math.
template <class Ctx>
inline constexpr bool reads_host_memory = std::is_base_of_v<HostContext, Ctx>;
}  // namespace detail

//! The first row r < rows whose label lies outside [0, classes), or -1 if none: one pass over
//! host memory. Usage: `if (index_t r = first_bad_label(y, n, 10); r >= 0) ...`
inline index_t first_bad_label(const std::int32_t* labels, index_t rows, int classes) {
  for (index_t r = 0; r < rows; ++r)
    if (labels[r] < 0 || labels[r] >= classes) return r;
  return -1;
}

//! Throws DataError "<where>: label L at row R is outside 0..classes-1" for the first bad label.
//! A label indexes its row of logits, so one outside [0, classes) would read outside the row.
//! Allocates nothing unless it throws (`where` is a C string for that). Usage:
//! `check_labels(y, rows, 10, "xpipe: my_trainer");`
inline void check_labels(const std::int32_t* labels, index_t rows, int classes, const char* where) {
  if (const index_t r = first_bad_label(labels, rows, classes); r >= 0)
    throw DataError(std::string(where) + ": label " + std::to_string(labels[r]) + " at row " +
                    std::to_string(r) + " is outside 0.." + std::to_string(classes - 1));
}

//! Softmax cross-entropy. The gradient is scaled by 1 / (rows of the whole mini-batch), so the
//! gradients of M micro-batches sum to the gradient of the mean loss over the mini-batch.
struct SoftmaxCrossEntropy {
  //! Writes dlogits and each row's loss; returns nothing (row losses are summed by the caller,
  //! on the host, in row order). Labels must lie in [0, logits.cols): on a host context they
  //! are checked first (DataError naming the row); on a GPU they are device memory, unchecked.
  template <class Ctx>
  static void forward_backward(const Ctx& ctx, ConstMatrix logits, const std::int32_t* labels,
                               float scale, Matrix dlogits, float* row_loss) {
    if constexpr (detail::reads_host_memory<Ctx>)
      check_labels(labels, logits.rows, static_cast<int>(logits.cols),
                   "xpipe: SoftmaxCrossEntropy");
    forward_backward_unchecked(ctx, logits, labels, scale, dlogits, row_loss);
  }

  //! The same for labels the caller has checked already (SequentialTrainer::train_step checks
  //! its batch's, Pipeline::train its epoch's, each once, before any math).
  template <class Ctx>
  static void forward_backward_unchecked(const Ctx& ctx, ConstMatrix logits,
                                         const std::int32_t* labels, float scale, Matrix dlogits,
                                         float* row_loss) {
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
