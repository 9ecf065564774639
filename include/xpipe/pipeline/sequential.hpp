// Sequential (single-device, unpipelined) training of one Stage: the baseline every pipeline
// schedule is checked against, and the foundation's Fashion-MNIST trainer.
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "xpipe/data/dataset.hpp"
#include "xpipe/layers/loss.hpp"
#include "xpipe/layers/stage.hpp"
#include "xpipe/optim/optimizer.hpp"
#include "xpipe/optim/variants.hpp"
#include "xpipe/pipeline/micro_batches.hpp"

namespace xpipe {

//! Trains the model `Model` (a Stage) with optimizer O on a host backend B (the host, or a test
//! backend built on it), one mini-batch per step. All buffers are allocated in the constructor;
//! train_step allocates nothing. train_epoch and evaluate stage batches and read predictions
//! through host memory. On a device, a one-stage Pipeline<Model, Latest, O, Cuda> trains.
//! Usage: `SequentialTrainer<Mlp, Adam> t(Adam{.lr = 1e-3f}, 128, seed); t.train_step(ctx, x, y);`
template <class Model, class O, class B = Host>
class SequentialTrainer {
  static_assert(check_optimizer<O, B>());
  static_assert(Model::template check_backend<B>());
  using Ctx = typename B::Context;
  // The constructor draws the weights into the state, train_step sums the row losses, and
  // train_epoch and evaluate hand host batches to the model, all on the host: on a device
  // backend each would read or write device memory on the host (a crash at run time).
  static_assert(detail::reads_host_memory<Ctx>,
                "xpipe: SequentialTrainer trains on host backends only (it draws the weights, "
                "sums the loss and stages batches on the host); on a CUDA device train a "
                "one-stage Pipeline<Model, Latest, O, Cuda>");
  template <class T>
  using Buffer = typename B::template Buffer<T>;
  // On two threads the backward of a model whose layers let both halves run at once
  // (Stage::overlaps_halves: Linear layers) runs in two lanes (Stage::backward_in_lanes): input
  // halves on one core, weight halves and the optimizer's steps on the other. (On more threads
  // one backward on all of them: two lanes would leave the others idle.)
  static constexpr bool can_run_lanes = std::is_same_v<Ctx, HostContext> &&
                                        Model::template splits_backward<B> &&
                                        Model::overlaps_halves;

 public:
  SequentialTrainer(O optimizer, index_t max_batch, std::uint64_t seed)
      : state_(optimizer, Model::param_count),
        workspace_(max_batch),
        acts_(max_batch, {.kept_gradients = can_run_lanes}, &workspace_),
        scratch_(max_batch),
        dlogits_(max_batch * Model::out_width),
        row_loss_(max_batch),
        batch_x_(max_batch * Model::in_width),
        batch_y_(max_batch),
        running_(Model::state_count) {
    if (max_batch % Model::row_group != 0)
      throw ConfigError("xpipe: SequentialTrainer: max_batch " + std::to_string(max_batch) +
                        " is not a whole number of the model's row groups of " +
                        std::to_string(Model::row_group) + " (one sequence each)");
    Model::init({state_.weights(), static_cast<std::size_t>(Model::param_count)}, seed);
    Model::init_state({running_.data(), static_cast<std::size_t>(Model::state_count)});
  }
  // Its slot points into its workspace: a trainer stays where it is made.
  SequentialTrainer(const SequentialTrainer&) = delete;
  SequentialTrainer& operator=(const SequentialTrainer&) = delete;

  index_t max_batch() const { return acts_.max_rows(); }
  OptimizerState<O, B>& state() { return state_; }
  const OptimizerState<O, B>& state() const { return state_; }
  //! Sets the learning rate to lr, the other hyper-parameters, moments and step count kept:
  //! between steps (a schedule's rate for the next epoch). ConfigError unless lr is finite and
  //! > 0. Usage: `t.set_learning_rate(schedule.at(lr, e, epochs)); t.train_epoch(ctx, b, e);`
  void set_learning_rate(float lr) {
    check_learning_rate(lr, "SequentialTrainer::set_learning_rate");
    state_.set_optimizer(with_learning_rate(state_.optimizer(), lr));
  }
  //! Sets the per-step rates (warmup, then cosine decay: StepRates) on top of the learning
  //! rate, keyed by the step count (restored with a checkpoint); ConfigError when they do not
  //! check. Usage: `t.set_step_rates(LearningRateSchedule::parse("warmup-cosine:100")
  //! .step_rates(epochs * batches));`
  void set_step_rates(const StepRates& rates) { state_.set_step_rates(rates); }
  //! Whether a backward on two threads runs in two lanes (Stage::backward_in_lanes): on by
  //! default where the model's layers allow it (Stage::overlaps_halves). Turned off, the
  //! backward runs on both threads at once: slower, but the bits of a pipeline stage whose
  //! context has two threads (oneDNN's sums depend on the thread count). Between steps.
  //! Usage: `t.set_lanes(false);` before comparing with a Pipeline on two threads per stage.
  void set_lanes(bool on) { lanes_on_ = on; }
  //! Whether train_step on two threads takes the lanes.
  bool lanes() const { return can_run_lanes && lanes_on_; }
  //! The learning rate its next step takes.
  float learning_rate() const { return state_.optimizer().learning_rate(); }
  //! The model's non-trainable state (BatchNorm running statistics; empty for most models).
  std::span<const float> running_state() const {
    return {running_.data(), static_cast<std::size_t>(Model::state_count)};
  }

  //! Forward, loss, backward and one optimizer step on a batch; returns the batch's mean loss.
  //! With chunks = M > 1 the batch is processed as M consecutive row chunks whose gradients
  //! accumulate in chunk order (split_rows: the rule a Pipeline splits micro-batches by), the
  //! summation order of GPipe and 1F1B-flush with M micro-batches, so those schedules can be
  //! compared bit for bit (at one thread, or with set_lanes(false): on ctx.threads == 2 a model
  //! of Linear layers runs its backward in two lanes, Stage::backward_in_lanes, with one-thread
  //! GEMMs, whose sums oneDNN may order otherwise than a two-thread GEMM's). The optimizer's step
  //! is taken inside the last chunk's backward (an elementwise optimizer): should that backward
  //! throw, which a host model does only on a broken invariant, the layers already stepped stay
  //! stepped and the step is not counted, so the weights are then no longer those of any step.
  //! Throws NumericError if the loss is NaN or infinite (weights are then not updated), naming
  //! the row of x and whether that row (or another of x) holds NaN/inf (bad data) or not
  //! (divergence); and
  //! DataError naming the row, before any math, if a label lies outside [0, Model::out_width).
  double train_step(const Ctx& ctx, ConstMatrix x, const std::int32_t* labels, int chunks = 1) {
    const index_t rows = x.rows;
    constexpr index_t group = Model::row_group;
    if (rows % group != 0)
      throw ShapeError("xpipe: SequentialTrainer::train_step: " + std::to_string(rows) +
                       " rows are not whole groups of " + std::to_string(group) +
                       " (the model keeps a sequence's rows together)");
    if (chunks < 1 || chunks > rows / group)
      throw ConfigError("xpipe: SequentialTrainer::train_step: chunks = " + std::to_string(chunks) +
                        " must lie in [1, " + std::to_string(rows / group) + "] (" +
                        std::to_string(rows) + " rows in groups of " + std::to_string(group) + ")");
    check_labels(labels, rows, Model::out_width, "xpipe: SequentialTrainer::train_step");
    double loss = 0;
    for (int c = 0; c < chunks; ++c) {
      const auto [first, n] = split_rows(rows, chunks, c, group);
      const ConstMatrix logits =
          Model::forward(ctx, state_.weights(), x.slice_rows(first, n), acts_, running(true));
      const Matrix dlogits{dlogits_.data(), n, Model::out_width};
      SoftmaxCrossEntropy::forward_backward_unchecked(
          ctx, logits, labels + first, 1.f / static_cast<float>(rows), dlogits, row_loss_.data());
      // Rows named as rows of x; x is read (host backends only) once a loss is not finite.
      const LossSource src{x, first, 0, rows};
      loss += sum_row_losses(row_loss_.data(), n, src);
      const auto backward = [&](auto&& done) {
        if constexpr (can_run_lanes) {
          if (ctx.threads == 2 && lanes_on_) {
            Model::backward_in_lanes(state_.weights(), state_.grads(), c > 0, acts_, dlogits,
                                     Matrix{}, scratch_, done);
            return;
          }
        }
        Model::backward(ctx, state_.weights(), state_.grads(), c > 0, acts_, dlogits, Matrix{},
                        scratch_, done);
      };
      if constexpr (steps_elementwise<O>) {
        // The last chunk's backward steps each layer as its gradient completes, while the
        // layer's weights and gradient are still in cache (the bits of one whole step).
        if (c == chunks - 1) {
          state_.step_in_parts([&](auto part) { backward(part); });
          continue;
        }
      }
      backward([](const auto&, index_t, index_t) {});
    }
    if constexpr (!steps_elementwise<O>) state_.step(ctx);
    return loss / static_cast<double>(rows);
  }

  //! One epoch over the batches `batcher` yields (its batch size must not exceed max_batch());
  //! returns the mean training loss over the epoch's samples.
  double train_epoch(const Ctx& ctx, Batcher& batcher, std::uint64_t epoch) {
    batcher.start_epoch(epoch);
    const Matrix x{batch_x_.data(), max_batch(), Model::in_width};
    double loss_sum = 0;
    index_t samples = 0;
    while (const index_t rows = batcher.next(x, batch_y_.data())) {
      loss_sum +=
          train_step(ctx, x.slice_rows(0, rows), batch_y_.data()) * static_cast<double>(rows);
      samples += rows;
    }
    return samples > 0 ? loss_sum / static_cast<double>(samples) : 0.0;
  }

  //! Fraction of `data` classified correctly, in batches of max_batch() (evaluation().accuracy).
  double evaluate(const Ctx& ctx, const Dataset& data) { return evaluation(ctx, data).accuracy; }

  //! Accuracy and mean cross-entropy (nats per row) on `data`, in batches of max_batch(). Throws
  //! DataError for a data set without rows, naming the first row of `data` holding NaN or an
  //! infinity, or a bad label. Usage: `const Evaluation v = t.evaluation(ctx, data.test);`
  Evaluation evaluation(const Ctx& ctx, const Dataset& data) {
    check_evaluation_data(data.matrix(), data.labels.data(), Model::out_width,
                          "xpipe: SequentialTrainer::evaluate");
    EvaluationSums sums(max_batch(), Model::out_width, "xpipe: SequentialTrainer::evaluate");
    for (index_t first = 0; first < data.count; first += max_batch()) {
      const index_t rows = std::min(max_batch(), data.count - first);
      const ConstMatrix logits = Model::forward(
          ctx, state_.weights(), data.matrix().slice_rows(first, rows), acts_, running(false));
      sums.add(ctx, logits, data.labels.data() + first, first);
    }
    return sums.result();
  }

 private:
  Running running(bool training) {
    return {Model::state_count > 0 ? running_.data() : nullptr, training};
  }

  OptimizerState<O, B> state_;
  typename Model::template Workspace<B> workspace_;  // the slot points into it: declared first
  typename Model::template Activations<B> acts_;
  typename Model::template GradScratch<B> scratch_;
  Buffer<float> dlogits_;
  Buffer<float> row_loss_;
  HostBuffer<float> batch_x_;
  HostBuffer<std::int32_t> batch_y_;
  Buffer<float> running_;
  bool lanes_on_ = true;
};

}  // namespace xpipe
