// Weight prediction: SpecTrain, PipeOptim and XPipe. Each extrapolates the live weights s steps
// along the optimizer's own update direction, W_hat = W - s * lr * dW, in one fused pass
// (Optimizer::predict), with s read off the schedule's staleness analysis.
#pragma once

#include <vector>

#include "xpipe/predict/predictor.hpp"

namespace xpipe {

namespace detail {
//! One prediction buffer: W_hat = W - s lr dW computed on demand, or the live weights at s = 0.
template <class O, class B>
class PredictionScratch {
 public:
  explicit PredictionScratch(index_t params) : buffer_(params) {}
  template <class Ctx>
  const float* at(const Ctx& ctx, OptimizerState<O, B>& opt, int s) {
    if (s == 0) return opt.weights();
    opt.predict(ctx, static_cast<float>(s), buffer_.data());
    return buffer_.data();
  }

 private:
  typename B::template Buffer<float> buffer_;
};
}  // namespace detail

//! SpecTrain: round-trip target, predicted separately for the forward and for the backward
//! (each action gets its own s). Meant for SGD with momentum (dW = momentum buffer), works with
//! any Optimizer. Holds 2 buffers: the live weights and one prediction scratch.
struct SpecTrain {
  static constexpr const char* name = "spectrain";
  static constexpr StalenessTarget target = StalenessTarget::RoundTrip;

  template <class O, class B>
  class State : public PredictorHooks {
   public:
    explicit State(const PredictorSetup& setup) : setup_(setup), scratch_(setup.params) {}
    template <class Ctx>
    const float* forward_weights(const Ctx& ctx, OptimizerState<O, B>& opt, int g) {
      return scratch_.at(ctx, opt, setup_.analysis->forward(setup_.stage, g).s(target));
    }
    template <class Ctx>
    const float* backward_weights(const Ctx& ctx, OptimizerState<O, B>& opt, int g) {
      return scratch_.at(ctx, opt, setup_.analysis->backward(setup_.stage, g).s(target));
    }
    int weight_copies() const { return 2; }

   private:
    PredictorSetup setup_;
    detail::PredictionScratch<O, B> scratch_;
  };
};

//! PipeOptim: the forward reads weights predicted over its apply-time s; the backward reads the
//! live weights. Holds 2 buffers.
struct PipeOptim {
  static constexpr const char* name = "pipeoptim";
  static constexpr StalenessTarget target = StalenessTarget::ApplyTime;

  template <class O, class B>
  class State : public PredictorHooks {
   public:
    explicit State(const PredictorSetup& setup) : setup_(setup), scratch_(setup.params) {}
    template <class Ctx>
    const float* forward_weights(const Ctx& ctx, OptimizerState<O, B>& opt, int g) {
      return scratch_.at(ctx, opt, setup_.analysis->forward(setup_.stage, g).s(target));
    }
    template <class Ctx>
    const float* backward_weights(const Ctx&, OptimizerState<O, B>& opt, int) {
      return opt.weights();
    }
    int weight_copies() const { return 2; }

   private:
    PredictorSetup setup_;
    detail::PredictionScratch<O, B> scratch_;
  };
};

//! XPipe: at the forward of a mini-batch's first micro-batch (the "bellwether") the stage
//! predicts the weights over that forward's apply-time s; every forward and backward of the
//! mini-batch then reads this one copy. Meant for Adam/AdamW. Holds 1 + (mini-batches in flight
//! at the stage) buffers. A mini-batch whose bellwether s is 0 and whose actions all read the
//! same version (synchronous schedules) uses the live weights, without a copy.
struct XPipe {
  static constexpr const char* name = "xpipe";
  static constexpr StalenessTarget target = StalenessTarget::ApplyTime;

  template <class O, class B>
  class State : public PredictorHooks {
   public:
    explicit State(const PredictorSetup& setup)
        : setup_(setup), slot_of_(setup.schedule->mini_batches, -1),
          done_(setup.schedule->mini_batches, 0) {
      for (int i = 0; i < setup.analysis->mini_batches_in_flight[setup.stage]; ++i) {
        slots_.emplace_back(setup.params);
        slot_free_.push_back(1);
      }
    }

    template <class Ctx>
    const float* forward_weights(const Ctx& ctx, OptimizerState<O, B>& opt, int g) {
      const int t = setup_.schedule->mini_batch_of(g);
      if (g % setup_.schedule->micro_batches == 0) begin_mini_batch(ctx, opt, g, t);
      return weights_of(opt, t);
    }
    template <class Ctx>
    const float* backward_weights(const Ctx&, OptimizerState<O, B>& opt, int g) {
      return weights_of(opt, setup_.schedule->mini_batch_of(g));
    }
    void backward_done(int g) {  // hides PredictorHooks': frees the slot after the last B
      const int t = setup_.schedule->mini_batch_of(g);
      if (++done_[t] == setup_.schedule->micro_batches && slot_of_[t] >= 0) {
        slot_free_[slot_of_[t]] = 1;
        slot_of_[t] = -1;
      }
    }
    int weight_copies() const { return 1 + static_cast<int>(slots_.size()); }

   private:
    template <class Ctx>
    void begin_mini_batch(const Ctx& ctx, OptimizerState<O, B>& opt, int g, int t) {
      const auto& a = *setup_.analysis;
      const int k = setup_.stage, M = setup_.schedule->micro_batches;
      const int s = a.forward(k, g).s(target);
      bool same_version = true;
      for (int j = 0; j < M; ++j)
        same_version = same_version && a.forward(k, t * M + j).version == a.forward(k, g).version &&
                       a.backward(k, t * M + j).version == a.forward(k, g).version;
      if (s == 0 && same_version) return;  // live weights serve the whole mini-batch
      int slot = -1;
      for (std::size_t i = 0; i < slots_.size() && slot < 0; ++i)
        if (slot_free_[i]) slot = static_cast<int>(i);
      if (slot < 0)
        throw Error("xpipe: XPipe: stage " + std::to_string(k) + ": all " +
                    std::to_string(slots_.size()) + " prediction slots in use at F" +
                    std::to_string(g));
      slot_free_[slot] = 0;
      slot_of_[t] = slot;
      opt.predict(ctx, static_cast<float>(s), slots_[slot].data());
    }
    const float* weights_of(OptimizerState<O, B>& opt, int t) {
      return slot_of_[t] >= 0 ? slots_[slot_of_[t]].data() : opt.weights();
    }

    PredictorSetup setup_;
    std::vector<int> slot_of_, done_;
    std::vector<typename B::template Buffer<float>> slots_;
    std::vector<char> slot_free_;
  };
};

static_assert(Predictor<SpecTrain>);
static_assert(Predictor<PipeOptim>);
static_assert(Predictor<XPipe>);

}  // namespace xpipe
