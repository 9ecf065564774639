// The per-action program of a stage: what Forward, Backward and Step do at stage I of K, given
// the stage's runtime and what all stages share during one train() call (links, the epoch's
// rows, the loss). Which link an action pops and pushes comes from the dependency rule
// (schedule/dependencies.hpp), the same one the readiness check and the dry run use.
#pragma once

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "xpipe/comm/links.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/kernels/ops.hpp"
#include "xpipe/layers/loss.hpp"
#include "xpipe/pipeline/micro_batches.hpp"
#include "xpipe/pipeline/prediction_probe.hpp"
#include "xpipe/predict/predictor.hpp"
#include "xpipe/schedule/dependencies.hpp"
#include "xpipe/schedule/staleness.hpp"

namespace xpipe {

//! Loss computed so far in a running train() call: written by the last stage's thread only,
//! readable from any thread (progress bars).
struct RunProgress {
  std::atomic<long> micro_batches{0}, samples{0};
  std::atomic<double> loss_sum{0};

  void reset() {
    micro_batches = 0;
    samples = 0;
    loss_sum = 0;
  }
  // One writer: load + store instead of a read-modify-write keeps it cheap.
  void add(index_t rows, double loss) {
    loss_sum.store(loss_sum.load(std::memory_order_relaxed) + loss, std::memory_order_relaxed);
    samples.store(samples.load(std::memory_order_relaxed) + rows, std::memory_order_relaxed);
    micro_batches.store(micro_batches.load(std::memory_order_relaxed) + 1,
                        std::memory_order_relaxed);
  }
};

namespace detail {
// What a non-finite global gradient norm of mini-batch t is reported as (`squared`: its square).
inline std::string non_finite_norm_message(int t, double squared) {
  return "xpipe: the global gradient norm of mini-batch " + std::to_string(t) + " is " +
         number_text(std::sqrt(squared)) + " (a stage's gradient holds NaN or inf)";
}
}  // namespace detail

//! Global gradient-norm clipping's one reduction per step (PipelineOptions::clip_norm): stage k
//! posts the squared norm of its gradient for mini-batch t when its last gradient action of t
//! ends; every stage's S(t) is ready only once all K have posted, and each computes the same
//! total, summed in stage order (the same bits on every stage and executor). On a device backend
//! a post only counts (the values are in device memory, DeviceNorms; DeviceEpoch::finish copies
//! them here after the run). Sized before the run; posting and reading allocate nothing.
class GradNormBoard {
 public:
  //! K stages, `mini_batches` steps; every entry unposted. Allocates (before a run only).
  void size_for(int stages, int mini_batches) {
    stages_ = stages;
    mini_batches_ = mini_batches;
    sq_.assign(static_cast<std::size_t>(stages) * mini_batches, 0.0);
    posted_ = std::make_unique<std::atomic<int>[]>(static_cast<std::size_t>(mini_batches));
    for (int t = 0; t < mini_batches; ++t) posted_[t].store(0, std::memory_order_relaxed);
  }
  //! Stage k's squared gradient norm for mini-batch t (from stage k's worker only).
  void post(int t, int k, double squared) {
    sq_[static_cast<std::size_t>(t) * stages_ + k] = squared;
    posted_[t].fetch_add(1, std::memory_order_release);
  }
  //! Replaces stage k's posted value for mini-batch t (its norm after the gradient was
  //! averaged over replicas: MpiExecutor), keeping the count.
  void replace(int t, int k, double squared) {
    sq_[static_cast<std::size_t>(t) * stages_ + k] = squared;
  }
  //! How many stages have posted for mini-batch t (0 <= t < mini_batches()).
  int posts(int t) const { return posted_[t].load(std::memory_order_acquire); }
  //! Stage k's squared norm for mini-batch t, once it has posted.
  double squared(int t, int k) const { return sq_[static_cast<std::size_t>(t) * stages_ + k]; }
  //! Whether every stage has posted for mini-batch t (false for a t outside the run).
  bool complete(int t) const {
    return t >= 0 && t < mini_batches_ && posted_[t].load(std::memory_order_acquire) == stages_;
  }
  //! The global squared norm of mini-batch t: the stages' posts in stage order. After
  //! complete(t).
  double total(int t) const {
    return math::stages_squared_norm(sq_.data() + static_cast<std::size_t>(t) * stages_, stages_);
  }
  int mini_batches() const { return mini_batches_; }

 private:
  int stages_ = 0, mini_batches_ = 0;
  std::vector<double> sq_;                      // [t * K + k]
  std::unique_ptr<std::atomic<int>[]> posted_;  // [t]: stages that posted
};

//! What the stages of one train() call share: the links between them, the epoch's rows and how
//! they split, and each micro-batch's loss.
template <class Q>
struct SharedRun {
  Links<Q> links;
  MicroBatching split;
  EpochData data;  // as the caller passed it (host memory)
  // What the stages read: `data` itself on host backends; on a device its copy there (inputs
  // on stage 0's device, labels on the last stage's).
  EpochData read;
  MicroBatchLoss* losses = nullptr;  // device backends: [g], summed on the last stage's device
  std::vector<double> micro_loss;    // [g]: summed row losses, written by the last stage
  RunProgress* progress = nullptr;
  const StalenessAnalysis* analysis = nullptr;  // s of every action (the prediction probe's)
  float clip_norm = 0;  // global gradient-norm clipping's bound (0: off; `norms` unused)
  GradNormBoard norms;
};

//! Actions of stage I of a K-stage pipeline.
template <std::size_t I, int K>
struct StageProgram {
  template <class RT, class Q>
  static void execute(RT& rt, SharedRun<Q>& run, const Action& a) {
    detail::activate_context(rt.ctx());  // on a GPU: this stage's device, on any host thread
    switch (a.kind) {
      case ActionKind::Forward:
        forward(rt, run, a.index);
        break;
      case ActionKind::Backward:
        backward(rt, run, a.index);
        break;
      case ActionKind::Step:
        step(rt, run, a.index);
        break;
      case ActionKind::InputGrad:
        input_gradient(rt, run, a.index);
        break;
      case ActionKind::WeightGrad:
        weight_gradient(rt, run, a.index);
        break;
    }
  }

  //! F(g): take the input (the epoch's rows at stage 0, else the message from stage I - 1),
  //! run the stage on the weights the predictor chooses, send the output on (or, at the last
  //! stage, compute the loss and its gradient for the backward).
  template <class RT, class Q>
  static void forward(RT& rt, SharedRun<Q>& run, int g) {
    using S = typename RT::Stage;
    const ActionChannels io = channels_of(K, static_cast<int>(I), fwd(g));
    const int slot = rt.free_slots.back();
    rt.free_slots.pop_back();
    rt.slot_of[g] = slot;
    const index_t capacity = run.split.max_micro_rows();
    const auto [first_row, rows] = run.split.micro_batch(g);
    ConstMatrix x;
    if constexpr (I == 0) {
      x = run.read.inputs.slice_rows(first_row, rows);
    } else {
      Q& in = run.links.at(io.in);
      const MicroBatchMessage& m = in.front();
      if (m.micro_batch != g || m.data.rows != rows)
        throw Error("received activations of micro-batch " + std::to_string(m.micro_batch) +
                    " while running F" + std::to_string(g));
      float* dst = rt.inputs.data() + slot * capacity * S::in_width;
      // On a device: this stream waits for the producer's writes to the slot, copies it, and
      // marks the copy as the slot's last read (comm/spsc_ring.hpp). No-ops on the host.
      queue_acquire_front(in, rt.ctx());
      copy_buffer(rt.ctx(), m.data.data, dst, rows * S::in_width);
      queue_release_front(in, rt.ctx());
      in.pop();
      x = ConstMatrix{dst, rows, S::in_width};
    }
    const float* w = rt.pred->forward_weights(rt.ctx(), rt.opt, g);
    if constexpr (detail::reads_host_memory<typename RT::Context>)
      if (rt.probe && g % run.split.micro_batches == 0)
        rt.probe->record(g / run.split.micro_batches, run.analysis->forward(I, g).apply_time, w,
                         rt.opt.weights());
    const ConstMatrix y = rt.train_forward(w, x, slot);
    if constexpr (I + 1 < K) {
      Q& out_q = run.links.at(io.out);
      MicroBatchMessage& out = out_q.back();
      out.micro_batch = g;
      out.data.rows = rows;
      // On a device: the copy waits until the consumer's stream last read the slot, and the
      // consumer's stream will wait for the copy (`filled`). No-ops on the host.
      queue_acquire_back(out_q, rt.ctx());
      copy_buffer(rt.ctx(), y.data, out.data.data, rows * S::out_width);
      queue_release_back(out_q, rt.ctx());
      out_q.push();
    } else {
      const Matrix dl{rt.dlogits.data() + slot * capacity * S::out_width, rows, S::out_width};
      // Labels: checked by Pipeline::train before the run.
      SoftmaxCrossEntropy::forward_backward_unchecked(
          rt.ctx(), y, run.read.labels + first_row,
          1.f / static_cast<float>(run.split.mini_batch_rows(g)), dl, rt.row_loss.data());
      if constexpr (!detail::reads_host_memory<std::decay_t<decltype(rt.ctx())>>) {
        // On a device the rows are summed there, on this stream (after the loss kernel, before
        // the next micro-batch overwrites row_loss), into run.losses[g]; Pipeline::train reads
        // the sums and checks them once, after the run. Progress is not updated during the run.
        sum_row_losses_async(rt.ctx(), rt.row_loss.data(), rows, run.losses + g);
        return;
      }
      // A non-finite loss is reported by its row of the data the caller passed, and blamed on
      // that data only if it is readable here (host memory) and holds a NaN or an infinity.
      LossSource src{{},
                     first_row,
                     g / run.split.micro_batches * run.split.batch,
                     run.split.mini_batch_rows(g),
                     g / run.split.micro_batches};
      if constexpr (detail::reads_host_memory<std::decay_t<decltype(rt.ctx())>>)
        src.inputs = run.data.inputs;
      run.micro_loss[g] = sum_row_losses(rt.row_loss.data(), rows, src);
      run.progress->add(rows, run.micro_loss[g]);
    }
  }

  //! B(g): take the output gradient (the loss gradient at the last stage, else the message
  //! from stage I + 1), back-propagate on the weights the predictor chooses (accumulating into
  //! the flat gradient after the first backward since the last step), send the input gradient
  //! to stage I - 1 and free the micro-batch's activation slot.
  template <class RT, class Q>
  static void backward(RT& rt, SharedRun<Q>& run, int g) {
    backward_part(rt, run, g, /*whole=*/true);
  }

  //! I(g): B(g)'s input half: the input gradient sent to stage I - 1, and what the weight half
  //! needs kept in the slot; the parameter gradient waits for W(g).
  template <class RT, class Q>
  static void input_gradient(RT& rt, SharedRun<Q>& run, int g) {
    if constexpr (RT::Stage::template splits_backward<typename RT::Backend>)
      backward_part(rt, run, g, /*whole=*/false);
    else
      throw ConfigError("xpipe: stage " + std::to_string(I) + ": " +
                        RT::Stage::template no_split_reason<typename RT::Backend>() +
                        ", so the stage cannot run I" + std::to_string(g));
  }

  //! W(g): B(g)'s weight half: the micro-batch's parameter gradient added (written after a
  //! step) from what I(g) kept, then its activation slot freed. Reads no weights.
  template <class RT, class Q>
  static void weight_gradient(RT& rt, SharedRun<Q>& run, int g) {
    using S = typename RT::Stage;
    if constexpr (S::template splits_backward<typename RT::Backend>) {
      const int slot = rt.slot_of[g];
      S::backward_weight(rt.ctx(), rt.opt.grads(), !rt.fresh_grads, rt.acts[slot]);
      rt.fresh_grads = false;
      gradient_added(rt, run, g);
      rt.free_slots.push_back(slot);
      rt.slot_of[g] = -1;
    } else {
      throw ConfigError("xpipe: stage " + std::to_string(I) + ": " +
                        S::template no_split_reason<typename RT::Backend>() +
                        ", so the stage cannot run W" + std::to_string(g));
    }
  }

 private:
  // B(g) (whole) or I(g): the gradient taken in and sent on are the same; the whole backward also
  // adds the parameter gradient and frees the slot.
  template <class RT, class Q>
  static void backward_part(RT& rt, SharedRun<Q>& run, int g, bool whole) {
    using S = typename RT::Stage;
    const ActionChannels io = channels_of(K, static_cast<int>(I), bwd(g));
    const int slot = rt.slot_of[g];
    const index_t rows = run.split.micro_batch(g).rows;
    ConstMatrix dy;
    if constexpr (I + 1 == K) {
      dy = ConstMatrix{rt.dlogits.data() + slot * run.split.max_micro_rows() * S::out_width, rows,
                       S::out_width};
    } else {
      const MicroBatchMessage& m = run.links.at(io.in).front();
      if (m.micro_batch != g)
        throw Error("received gradients of micro-batch " + std::to_string(m.micro_batch) +
                    " while running " + (whole ? "B" : "I") + std::to_string(g));
      dy = ConstMatrix{m.data.data, rows, S::out_width};
    }
    Matrix dx;
    if constexpr (I > 0) {
      MicroBatchMessage& out = run.links.at(io.out).back();
      out.micro_batch = g;
      out.data.rows = rows;
      dx = Matrix{out.data.data, rows, S::in_width};
    }
    const float* w = rt.pred->backward_weights(rt.ctx(), rt.opt, g);
    // The backward reads dy straight from its input slot and writes dx straight into its output
    // slot: on a device this stream first waits for dy's producer and for the last reader of
    // the dx slot, and after the backward marks both slots (the predictor's work above need
    // not wait). No-ops on the host.
    if constexpr (I + 1 < K) queue_acquire_front(run.links.at(io.in), rt.ctx());
    if constexpr (I > 0) queue_acquire_back(run.links.at(io.out), rt.ctx());
    if (whole) {
      S::backward(rt.ctx(), w, rt.opt.grads(), !rt.fresh_grads, rt.acts[slot], dy, dx, rt.scratch);
      rt.fresh_grads = false;
      gradient_added(rt, run, g);
    } else if constexpr (S::template splits_backward<typename RT::Backend>) {
      S::backward_input(rt.ctx(), w, rt.acts[slot], dy, dx, rt.scratch);
    }
    if constexpr (I > 0) {
      queue_release_back(run.links.at(io.out), rt.ctx());
      run.links.at(io.out).push();
    }
    if constexpr (I + 1 < K) {
      queue_release_front(run.links.at(io.in), rt.ctx());
      run.links.at(io.in).pop();
    }
    rt.pred->backward_done(g);  // the weights the backward read are no longer needed
    if (whole) {
      rt.free_slots.push_back(slot);
      rt.slot_of[g] = -1;
    }
  }

  // Global clipping: after the M-th parameter gradient of micro-batch g's mini-batch t, post
  // the stage's squared gradient norm for t. On a device the norm is written to device memory
  // on the stage's stream and marked by an event; the host post then only says that the event
  // is recorded, so a step's waits on it (enqueued once every stage has posted) take that record.
  template <class RT, class Q>
  static void gradient_added(RT& rt, SharedRun<Q>& run, int g) {
    if (run.clip_norm <= 0.f) return;
    const int t = g / run.split.micro_batches;
    if (++rt.gradient_parts[static_cast<std::size_t>(t)] != run.split.micro_batches) return;
    if constexpr (detail::reads_host_memory<typename RT::Context>) {
      run.norms.post(t, static_cast<int>(I), squared_norm(rt.opt.grads(), rt.opt.size()));
    } else {
      const std::size_t at = static_cast<std::size_t>(t) * K + I;
      squared_norm_async(rt.ctx(), rt.opt.grads(), rt.opt.size(), rt.device_norms.squared + at);
      rt.device_norms.written[at].record(rt.ctx());
      // The value is on the device (DeviceEpoch::finish copies it here after the run).
      run.norms.post(t, static_cast<int>(I), std::numeric_limits<double>::quiet_NaN());
    }
  }

 public:
  //! S(t): under global clipping, scale the gradient by min(1, c / (|g| + 1e-6)) with |g| the
  //! norm over every stage's gradient of mini-batch t (torch.nn.utils.clip_grad_norm_'s rule;
  //! ready only once every stage posted); let the predictor save what it still needs, then step
  //! the optimizer (or let the predictor step it: a remedy that changes the step, or defers it
  //! to accumulate gradients).
  template <class RT, class Q>
  static void step(RT& rt, SharedRun<Q>& run, int t) {
    using State = typename decltype(rt.pred)::value_type;
    using O = std::decay_t<decltype(rt.opt.optimizer())>;
    using B = typename RT::Backend;
    if (run.clip_norm > 0.f) {
      if constexpr (detail::reads_host_memory<typename RT::Context>) {
        const double squared = run.norms.total(t);
        if (!std::isfinite(squared))
          throw NumericError(detail::non_finite_norm_message(t, squared) + ": not stepped");
        const double factor = math::clip_factor(squared, run.clip_norm);
        if (factor < 1.0)
          scale_buffer(rt.ctx(), rt.opt.grads(), rt.opt.size(), static_cast<float>(factor));
      } else {
        // Every stage's norm of t is on the device once its event has passed (the post that
        // made this step ready came after the record); the factor is computed there, once.
        for (int k = 0; k < K; ++k)
          rt.device_norms.written[static_cast<std::size_t>(t) * K + k].wait(rt.ctx());
        clip_gradient(rt.ctx(), rt.opt.grads(), rt.opt.size(),
                      rt.device_norms.squared + static_cast<std::size_t>(t) * K, K, run.clip_norm,
                      rt.device_norms.factor);
      }
    }
    if constexpr (detail::reads_host_memory<typename RT::Context>)
      if (rt.probe) rt.probe->settle(t, rt.opt.weights());  // the weights S(t) steps from
    rt.pred->before_step(rt.ctx(), rt.opt);
    if constexpr (detail::HasApplyStep<State, O, B>) {
      if (!rt.pred->apply_step(rt.ctx(), rt.opt)) return;  // accumulating: no step, no reset
    } else {
      rt.opt.step(rt.ctx());
    }
    rt.fresh_grads = true;
  }
};

}  // namespace xpipe
