// The device half of a Pipeline's epoch (a DeviceBackend: CUDA, the emulated device): the
// epoch's upload before the run, the one synchronisation and the loss read-back after it, the
// drain after a failure, and evaluation on the devices. Pipeline holds one DeviceEpoch and calls
// it where its backend is a device; nothing here runs on a host backend.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "xpipe/data/dataset.hpp"
#include "xpipe/layers/loss.hpp"
#include "xpipe/pipeline/device_backend.hpp"
#include "xpipe/pipeline/stage_program.hpp"
#include "xpipe/pipeline/stage_runtime.hpp"

namespace xpipe {

//! What a pipeline on device backend B keeps between train() calls (grown, never shrunk): the
//! epoch's copies on the devices, the pinned staging buffer they came through, the loss sums.
template <class B>
class DeviceEpoch {
  static_assert(check_device_backend<B>());
  using Context = typename B::Context;
  template <class T>
  using Buffer = typename B::template Buffer<T>;

 public:
  //! The epoch's first `used` rows to the devices that read them, once per train() call: inputs
  //! (`in_width` wide) to stage 0's device (`first`), labels to the last stage's (`last`), each
  //! through the pinned staging buffer and an asynchronous copy on that stage's stream, so the
  //! stage's first read follows the copy on its own stream. The staging buffer is free to
  //! overwrite: the previous train() call synchronised every stream before returning. Sizes the
  //! loss array too, and points `run` at the device copies.
  template <class Q>
  void upload(const Context& first, const Context& last, EpochData data, index_t used,
              index_t in_width, int micro_batches, SharedRun<Q>& run) {
    const index_t in_floats = used * in_width;
    const index_t staged_floats = in_floats + used;  // inputs, then labels (both 4 bytes)
    static_assert(sizeof(std::int32_t) == sizeof(float));
    if (staging_.size() < staged_floats)
      staging_ = typename B::template PinnedBuffer<float>(staged_floats);
    float* staged_inputs = staging_.data();
    auto* staged_labels = reinterpret_cast<std::int32_t*>(staging_.data() + in_floats);
    if (data.inputs.ld == in_width) {
      std::memcpy(staged_inputs, data.inputs.data, static_cast<std::size_t>(in_floats) * 4);
    } else {
      for (index_t r = 0; r < used; ++r)
        std::memcpy(staged_inputs + r * in_width, data.inputs.data + r * data.inputs.ld,
                    static_cast<std::size_t>(in_width) * 4);
    }
    std::memcpy(staged_labels, data.labels, static_cast<std::size_t>(used) * 4);

    detail::activate_context(first);
    if (inputs_.size() < in_floats) inputs_ = Buffer<float>(in_floats);
    copy_from_pinned_async(first, staged_inputs, inputs_.data(), in_floats);

    detail::activate_context(last);
    if (labels_.size() < used) labels_ = Buffer<std::int32_t>(used);
    copy_from_pinned_async(last, staged_labels, labels_.data(), used);
    if (losses_.size() < micro_batches) losses_ = Buffer<MicroBatchLoss>(micro_batches);

    run.read = EpochData{ConstMatrix{inputs_.data(), used, in_width}, labels_.data()};
    run.losses = losses_.data();
  }

  //! Global clipping's board for a run of `mini_batches` steps over `stages` stages (stage k's
  //! view of it: norms_of(k)): the squared
  //! norms on stage 0's device (entry t K + k), filled with NaN so that a step that read an entry
  //! before its stage wrote it would never clip (not a stale value that might: the same wrong bits
  //! on every run), and an event per entry on stage k's device. Kept between runs, grown when a run
  //! has more steps.
  void size_norms(const std::function<const Context&(int)>& ctx_of, int stages, int mini_batches) {
    const std::size_t entries = static_cast<std::size_t>(stages) * mini_batches;
    detail::activate_context(ctx_of(0));
    if (static_cast<std::size_t>(squared_norms_.size()) < entries)
      squared_norms_ = Buffer<double>(static_cast<index_t>(entries));
    const std::vector<double> unwritten(entries, std::numeric_limits<double>::quiet_NaN());
    copy_from_host(ctx_of(0), unwritten.data(), squared_norms_.data(),
                   static_cast<index_t>(entries));
    norms_written_.reserve(entries);
    while (norms_written_.size() < entries) {
      detail::activate_context(ctx_of(static_cast<int>(norms_written_.size() % stages)));
      norms_written_.emplace_back();
    }
    while (static_cast<int>(clip_factors_.size()) < stages) {
      detail::activate_context(ctx_of(static_cast<int>(clip_factors_.size())));
      clip_factors_.emplace_back(1);
    }
  }

  //! What stage k's program reads and writes of the board (after size_norms): the norms, their
  //! events and its own clipping factor, which each step computes once from the norms.
  detail::DeviceNorms<B> norms_of(int k) {
    return {squared_norms_.data(), norms_written_.data(),
            clip_factors_[static_cast<std::size_t>(k)].data()};
  }

  //! Data-parallel replicas over MPI ranks (exec/mpi.hpp), before the run: a pinned copy of
  //! each stage's flat gradient (`sizes[k]` floats; MPI sums it over the replicas) and an event
  //! on stage k's device marking the copy to or from it. Kept between runs, grown.
  void size_host_gradients(const std::function<const Context&(int)>& ctx_of,
                           const std::vector<index_t>& sizes) {
    host_gradients_.resize(sizes.size());
    for (std::size_t k = 0; k < sizes.size(); ++k)
      if (host_gradients_[k].size() < sizes[k])
        host_gradients_[k] = typename B::template PinnedBuffer<float>(sizes[k]);
    while (gradients_copied_.size() < sizes.size()) {
      detail::activate_context(ctx_of(static_cast<int>(gradients_copied_.size())));
      gradients_copied_.emplace_back();
    }
  }
  //! Enqueues the copy of stage k's gradient `g` (n floats) to its pinned copy on the stage's
  //! stream (`ctx`, current), after the backward that completed it, and marks it.
  void gradients_to_host(const Context& ctx, int k, const float* g, index_t n) {
    const auto u = static_cast<std::size_t>(k);
    copy_to_pinned_async(ctx, g, host_gradients_[u].data(), n);
    gradients_copied_[u].record(ctx);
  }
  //! Whether stage k's last copy to or from its pinned copy is done: the host may read or
  //! write the pinned copy.
  bool gradients_copied(int k) const {
    return gradients_copied_[static_cast<std::size_t>(k)].done();
  }
  //! Stage k's pinned copy (n floats).
  std::span<float> host_gradients(int k, index_t n) {
    return {host_gradients_[static_cast<std::size_t>(k)].data(), static_cast<std::size_t>(n)};
  }
  //! Enqueues the copy of stage k's pinned copy back into `g` on the stage's stream (the step
  //! enqueued next reads it), and marks it.
  void gradients_from_host(const Context& ctx, int k, float* g, index_t n) {
    const auto u = static_cast<std::size_t>(k);
    copy_from_pinned_async(ctx, static_cast<const float*>(host_gradients_[u].data()), g, n);
    gradients_copied_[u].record(ctx);
  }

  //! After the executor returned: waits for every stage's stream (the run's one
  //! synchronisation), then reads each micro-batch's loss sum and checks them in micro-batch
  //! order, throwing what the host path throws at the first non-finite one (the loss message,
  //! naming the row and mini-batch, blamed on the inputs if they hold NaN or an infinity, in a
  //! StageError naming the last stage and the forward that computed it). Under global clipping
  //! it first copies the squared norms into run.norms (Pipeline::gradient_norms), and checks them
  //! in step order after the losses: a non-finite one is the host's NumericError message in a
  //! StageError naming that step and the first stage whose norm is not finite (the device stepped
  //! on with it: its weights hold NaN or inf). `ctx_of(k)` is stage k's context, of `stages`.
  template <class Q>
  void finish(const std::function<const Context&(int)>& ctx_of, int stages, int micro_batches,
              EpochData data, SharedRun<Q>& run) {
    drain(ctx_of, stages, true);
    if (run.clip_norm > 0.f) {  // first, so gradient_norms() has them whatever is thrown below
      const int T = run.norms.mini_batches();
      host_norms_.resize(static_cast<std::size_t>(T) * stages);
      detail::activate_context(ctx_of(0));
      copy_to_host(ctx_of(0), squared_norms_.data(), host_norms_.data(),
                   static_cast<index_t>(host_norms_.size()));
      for (int t = 0; t < T; ++t)
        for (int k = 0; k < stages; ++k)
          run.norms.replace(t, k, host_norms_[static_cast<std::size_t>(t) * stages + k]);
    }
    const int G = micro_batches;
    host_losses_.resize(static_cast<std::size_t>(G));
    const Context& last = ctx_of(stages - 1);
    detail::activate_context(last);
    copy_to_host(last, run.losses, host_losses_.data(), G);
    for (int g = 0; g < G; ++g) {
      const MicroBatchLoss& l = host_losses_[static_cast<std::size_t>(g)];
      const auto [first_row, rows] = run.split.micro_batch(g);
      if (l.bad_row >= 0) {
        const LossSource src{data.inputs, first_row, g / run.split.micro_batches * run.split.batch,
                             run.split.mini_batch_rows(g), g / run.split.micro_batches};
        try {
          detail::throw_non_finite_loss(l.bad_value, l.bad_row, src);
        } catch (const std::exception& e) {
          throw StageError(stages - 1, to_string(fwd(g)), e.what());
        }
      }
      run.micro_loss[static_cast<std::size_t>(g)] = l.sum;
      run.progress->add(rows, l.sum);
    }
    if (run.clip_norm <= 0.f) return;
    for (int t = 0; t < run.norms.mini_batches(); ++t)
      if (const double squared = run.norms.total(t); !std::isfinite(squared)) {
        int k = 0;  // the first stage whose norm is not finite
        while (k + 1 < stages && std::isfinite(run.norms.squared(t, k))) ++k;
        throw StageError(k, to_string(step(t)),
                         detail::non_finite_norm_message(t, squared) +
                             ": the device stepped on with it, so the weights hold NaN or inf");
      }
  }

  //! Waits for every stage's stream. With `report`, the first failure (a kernel's error surfaces
  //! at the synchronisation) is a StageError naming that stage, after all streams were waited
  //! for; without, nothing is thrown (after a failure, so nothing still reads the staging buffer
  //! or the slots).
  static void drain(const std::function<const Context&(int)>& ctx_of, int stages, bool report) {
    std::exception_ptr first;
    int failed = -1;
    for (int k = 0; k < stages; ++k) {
      try {
        detail::activate_context(ctx_of(k));
        synchronize(ctx_of(k));
      } catch (...) {
        if (!first) {
          first = std::current_exception();
          failed = k;
        }
      }
    }
    if (!report || !first) return;
    try {
      std::rethrow_exception(first);
    } catch (const std::exception& e) {
      throw StageError(
          failed, "end of run",
          std::string("the device failed while running this stage's actions: ") + e.what());
    }
  }

  //! Pipeline::evaluation on the devices: each chunk of `chunk` rows uploaded to stage 0's
  //! device, `forward_stages(x)` runs every stage's forward (each on its own stream, waited for
  //! before the next stage reads its output: evaluation is not the hot path) and returns the
  //! logits, which are copied to the host and added to `sums`.
  template <class ForwardStages>
  void evaluate(const Context& first, const Context& last, const Dataset& data, index_t chunk,
                index_t in_width, EvaluationSums& sums, ForwardStages&& forward_stages) {
    detail::activate_context(first);
    if (eval_inputs_.size() < chunk * in_width) eval_inputs_ = Buffer<float>(chunk * in_width);
    std::vector<float> rows_in(static_cast<std::size_t>(chunk * in_width));
    std::vector<float> logits;
    for (index_t first_row = 0; first_row < data.count; first_row += chunk) {
      const index_t rows = std::min(chunk, data.count - first_row);
      const ConstMatrix host = data.matrix().slice_rows(first_row, rows);
      for (index_t r = 0; r < rows; ++r)
        std::memcpy(rows_in.data() + r * in_width, host.data + r * host.ld,
                    static_cast<std::size_t>(in_width) * 4);
      detail::activate_context(first);
      copy_from_host(first, rows_in.data(), eval_inputs_.data(), rows * in_width);
      const ConstMatrix x = forward_stages(ConstMatrix{eval_inputs_.data(), rows, in_width});
      detail::activate_context(last);
      logits.resize(static_cast<std::size_t>(rows * x.cols));
      if (x.ld == x.cols)
        copy_to_host(last, x.data, logits.data(), rows * x.cols);
      else
        for (index_t r = 0; r < rows; ++r)
          copy_to_host(last, x.row(r), logits.data() + r * x.cols, x.cols);
      sums.add(HostContext{}, ConstMatrix{logits.data(), rows, x.cols},
               data.labels.data() + first_row, first_row);
    }
  }

 private:
  typename B::template PinnedBuffer<float> staging_;
  Buffer<float> inputs_, eval_inputs_;
  Buffer<std::int32_t> labels_;
  Buffer<MicroBatchLoss> losses_;
  std::vector<MicroBatchLoss> host_losses_;
  Buffer<double> squared_norms_;                  // global clipping: [t K + k]
  std::vector<typename B::Event> norms_written_;  // [t K + k], on stage k's device
  std::vector<Buffer<double>> clip_factors_;      // [k]: one double on stage k's device
  std::vector<double> host_norms_;
  std::vector<typename B::template PinnedBuffer<float>> host_gradients_;  // [k], replicas
  std::vector<typename B::Event> gradients_copied_;  // [k], on stage k's device
};

}  // namespace xpipe
