// Softmax cross-entropy loss on the last stage's logits (mean over the whole mini-batch).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "xpipe/backend/host.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/core/tensor.hpp"
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

//! Where a batch's row losses came from, for the message when one is not finite: the inputs as
//! the caller passed them (the data set, or the batch), in host memory, or empty where they are
//! not (device memory: not read); which of their rows loss row 0 is; and the rows of the
//! mini-batch (mini_batch >= 0: its index, named in the message).
struct LossSource {
  ConstMatrix inputs{};
  index_t first = 0;
  index_t batch_first = 0, batch_rows = 0;
  index_t mini_batch = -1;
};

namespace detail {

// The first column of row r of x holding NaN or an infinity, or -1.
inline index_t first_non_finite_column(ConstMatrix x, index_t r) {
  for (index_t c = 0; c < x.cols; ++c)
    if (!std::isfinite(x(r, c))) return c;
  return -1;
}

// "NaN", "+inf" or "-inf".
inline std::string non_finite_name(float v) {
  return std::isnan(v) ? "NaN" : (v > 0 ? "+inf" : "-inf");
}

// "input row R holds NaN (column C)".
inline std::string bad_input(ConstMatrix x, index_t r, index_t c) {
  return "input row " + std::to_string(r) + " holds " + non_finite_name(x(r, c)) + " (column " +
         std::to_string(c) + ")";
}

// Off the hot path: runs once, when a loss is found not finite. Blames the input when the row,
// or else another row of its mini-batch, holds NaN or an infinity; divergence otherwise.
[[noreturn]] inline void throw_non_finite_loss(float loss, index_t r, const LossSource& src) {
  const index_t row = src.first + r;
  std::string what = "xpipe: loss is " + std::string(std::isnan(loss) ? "NaN" : "infinite") +
                     " at row " + std::to_string(row);
  if (src.mini_batch >= 0) what += " (mini-batch " + std::to_string(src.mini_batch) + ")";
  if (src.inputs.empty())
    throw NumericError(what + ": diverged, or bad input (inputs in device memory are not " +
                       "checked): lower the learning rate?");
  if (const index_t c = first_non_finite_column(src.inputs, row); c >= 0)
    throw NumericError(what + ": " + bad_input(src.inputs, row, c) + ": bad data, not divergence");
  for (index_t b = src.batch_first; b < src.batch_first + src.batch_rows; ++b)
    if (const index_t c = first_non_finite_column(src.inputs, b); c >= 0)
      throw NumericError(what + ": " + bad_input(src.inputs, b, c) +
                         " in the same mini-batch: bad data, not divergence");
  throw NumericError(what + ": the inputs are finite, so training diverged (lower the " +
                     "learning rate?)");
}

}  // namespace detail

//! Throws DataError "<where>: input row R holds NaN (column C): bad data" for the first row of
//! x (host memory) holding NaN or an infinity: one pass, for evaluation, where a NaN would
//! otherwise pass for a prediction. Usage: `check_finite_inputs(d.matrix(), "xpipe: evaluate");`
inline void check_finite_inputs(ConstMatrix x, const char* where) {
  for (index_t r = 0; r < x.rows; ++r)
    if (const index_t c = detail::first_non_finite_column(x, r); c >= 0)
      throw DataError(std::string(where) + ": " + detail::bad_input(x, r, c) + ": bad data");
}

//! One micro-batch's row losses, summed where they were computed (on a GPU: layers/loss.cuh, in
//! a fixed order), and the first row whose loss is not finite (-1 if none) with that loss.
//! Pipeline reads them once per train() call.
struct MicroBatchLoss {
  double sum = 0;
  index_t bad_row = -1;
  float bad_value = 0;
};

//! Sum of host row losses in row order (a fixed order: same bits on every executor); throws
//! NumericError when a loss is NaN or infinite ("loss is NaN" / "loss is infinite"), so a bad
//! run stops with a message instead of silently producing garbage. The message names the row
//! of `src.inputs` and, only then reading the inputs, says whether they hold a NaN or an
//! infinity (bad data) or are finite (divergence). Usage: `sum_row_losses(loss, n, {x, 0, 0, n})`
inline double sum_row_losses(const float* row_loss, index_t rows, const LossSource& src = {}) {
  double total = 0.0;
  for (index_t r = 0; r < rows; ++r) {
    if (!std::isfinite(row_loss[r])) detail::throw_non_finite_loss(row_loss[r], r, src);
    total += row_loss[r];
  }
  return total;
}

//! What an evaluation checks before any forward: the data set has rows, every input is finite
//! (check_finite_inputs) and every label lies in [0, classes). DataError naming `where` and the
//! row otherwise. Usage: `check_evaluation_data(d.matrix(), d.labels.data(), 10, "xpipe: eval");`
inline void check_evaluation_data(ConstMatrix x, const std::int32_t* labels, int classes,
                                  const char* where) {
  if (x.rows == 0) throw DataError(std::string(where) + ": the data set holds no rows");
  check_finite_inputs(x, where);
  check_labels(labels, x.rows, classes, where);
}

//! What an evaluation measured over a data set: the fraction of rows whose largest logit is their
//! label's, and the mean cross-entropy -log softmax(logits)[label] (nats per row: for a language
//! model, whose rows are tokens, nats per token; exp(loss) is its perplexity).
struct Evaluation {
  double accuracy = 0;
  double loss = 0;
  double perplexity() const { return std::exp(loss); }
};

//! Running sums of an evaluation over chunks of host logits, in row order: rows classified
//! correctly and their cross-entropies (in double; a loss that is not finite is summed as it is,
//! so the mean says so). Buffers sized once for `max_rows` x `classes`. Labels are checked
//! first: a bad one is a DataError naming `where` and its row of the data set (the chunk's first
//! row is `first`). Usage: `EvaluationSums s(chunk, 10, "xpipe: evaluate"); s.add(ctx, logits,
//! y + first, first); ... s.result()`.
class EvaluationSums {
 public:
  EvaluationSums(index_t max_rows, int classes, const char* where)
      : classes_(classes),
        where_(where),
        predicted_(static_cast<std::size_t>(max_rows)),
        grad_(static_cast<std::size_t>(max_rows * classes)),
        row_loss_(static_cast<std::size_t>(max_rows)) {}

  //! Adds `logits` (host memory, rows <= max_rows), rows first.. of the data set, labelled
  //! `labels`.
  void add(const HostContext& ctx, ConstMatrix logits, const std::int32_t* labels,
           index_t first = 0) {
    if (const index_t r = first_bad_label(labels, logits.rows, classes_); r >= 0)
      throw DataError(std::string(where_) + ": label " + std::to_string(labels[r]) + " at row " +
                      std::to_string(first + r) + " is outside 0.." + std::to_string(classes_ - 1));
    argmax_rows(ctx, logits, predicted_.data());
    softmax_xent(ctx, logits, labels, 0.f, Matrix{grad_.data(), logits.rows, logits.cols},
                 row_loss_.data());
    for (index_t r = 0; r < logits.rows; ++r) {
      correct_ += predicted_[static_cast<std::size_t>(r)] == labels[r];
      loss_ += row_loss_[static_cast<std::size_t>(r)];
    }
    rows_ += logits.rows;
  }
  //! The evaluation of the rows added so far (zeros before any).
  Evaluation result() const {
    if (rows_ == 0) return {};
    const double n = static_cast<double>(rows_);
    return {static_cast<double>(correct_) / n, loss_ / n};
  }

 private:
  int classes_;
  const char* where_;
  std::vector<std::int32_t> predicted_;
  std::vector<float> grad_, row_loss_;
  index_t correct_ = 0, rows_ = 0;
  double loss_ = 0;
};

}  // namespace xpipe
