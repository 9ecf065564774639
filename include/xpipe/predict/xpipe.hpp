// XPipe: one weight prediction per mini-batch, made at its first micro-batch's forward (the
// "bellwether") and read by every forward and backward of that mini-batch.
#pragma once

#include <vector>

#include "xpipe/predict/predictor.hpp"
#include "xpipe/predict/slots.hpp"

namespace xpipe {

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
        : setup_(setup),
          slot_of_(setup.schedule->mini_batches, -1),
          slots_(setup.analysis->mini_batches_in_flight[setup.stage], setup.params, "XPipe",
                 setup.stage) {}

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
    //! Hides PredictorHooks': the mini-batch's slot is free after its last backward.
    void backward_done(int g) {
      const int t = setup_.schedule->mini_batch_of(g);
      if (slot_of_[t] >= 0 && slots_.release(slot_of_[t])) slot_of_[t] = -1;
    }
    int weight_copies() const { return 1 + slots_.size(); }

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
      // One user per micro-batch: the slot frees itself after the M-th backward.
      slot_of_[t] = slots_.acquire(M, Action{ActionKind::Forward, g});
      opt.predict(ctx, static_cast<float>(s), slots_.data(slot_of_[t]));
    }
    const float* weights_of(OptimizerState<O, B>& opt, int t) {
      return slot_of_[t] >= 0 ? slots_.data(slot_of_[t]) : opt.weights();
    }

    PredictorSetup setup_;
    std::vector<int> slot_of_;  // per mini-batch: its prediction's slot, -1 for the live weights
    WeightSlots<B> slots_;
  };
};
static_assert(Predictor<XPipe>);

}  // namespace xpipe
