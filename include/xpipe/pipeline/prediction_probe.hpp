// How good a weight prediction was, measured: when a stage's forward reads predicted weights W^
// (at live weights W_now), the probe keeps both until the step that consumes the micro-batch's
// gradient, whose weights W_actual are the ones the prediction aimed at, and then records the
// relative error |W^ - W_actual| / |W_actual - W_now| and the cosine between the predicted change
// W^ - W_now and the actual change W_actual - W_now, per stage and per s (apply-time).
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "xpipe/core/error.hpp"
#include "xpipe/core/tensor.hpp"

namespace xpipe {

//! The prediction errors of one stage at one version difference s, over one train() call.
struct PredictionError {
  int stage = 0;
  int s = 0;                       // apply-time steps between the prediction and its target
  long count = 0;                  // predictions measured (one per mini-batch: its first forward)
  double mean_relative_error = 0;  // mean of |W^ - W_actual| / |W_actual - W_now|
  double mean_cosine = 0;          // mean cosine of (W^ - W_now, W_actual - W_now)
};

//! One stage's probe (host memory only). Every buffer is allocated by the constructor; record()
//! and settle() only copy and sum. Usage: see StageProgram (forward records, step settles).
class PredictionProbe {
 public:
  //! Room for `pending` predictions in flight at once and s up to max_s, params floats each.
  PredictionProbe(int stage, index_t params, int pending, int max_s)
      : stage_(stage),
        params_(params),
        slots_(static_cast<std::size_t>(std::max(pending, 1))),
        sums_(static_cast<std::size_t>(max_s) + 1) {
    for (Slot& s : slots_) {
      s.predicted.resize(static_cast<std::size_t>(params));
      s.now.resize(static_cast<std::size_t>(params));
    }
  }

  //! Forward of mini-batch t read `predicted` while the live weights were `now`, s steps before
  //! S(t). Ignored when it predicted nothing (same pointer) or s is 0.
  void record(int t, int s, const float* predicted, const float* now) {
    if (predicted == now || s <= 0 || s >= static_cast<int>(sums_.size())) return;
    for (Slot& slot : slots_)
      if (slot.target < 0) {
        slot.target = t;
        slot.s = s;
        std::copy(predicted, predicted + params_, slot.predicted.begin());
        std::copy(now, now + params_, slot.now.begin());
        return;
      }
    throw Error("xpipe: PredictionProbe: stage " + std::to_string(stage_) +
                ": more predictions in flight than the schedule's analysis allows");
  }

  //! S(t) is about to step from `actual`: score the predictions that aimed at it.
  void settle(int t, const float* actual) {
    for (Slot& slot : slots_) {
      if (slot.target != t) continue;
      double err = 0, act = 0, pred = 0, dot = 0;
      for (index_t i = 0; i < params_; ++i) {
        const double p = double{slot.predicted[i]} - slot.now[i];
        const double a = double{actual[i]} - slot.now[i];
        err += (p - a) * (p - a);
        act += a * a;
        pred += p * p;
        dot += p * a;
      }
      Sum& sum = sums_[static_cast<std::size_t>(slot.s)];
      if (act > 0) {  // the weights did move: a ratio and an angle exist
        ++sum.count;
        sum.relative += std::sqrt(err / act);
        sum.cosine += pred > 0 ? dot / std::sqrt(pred * act) : 0.0;
      }
      slot.target = -1;
    }
  }

  //! Per s with at least one measurement: the means so far.
  void append_to(std::vector<PredictionError>& out) const {
    for (std::size_t s = 0; s < sums_.size(); ++s)
      if (sums_[s].count > 0)
        out.push_back({stage_, static_cast<int>(s), sums_[s].count,
                       sums_[s].relative / static_cast<double>(sums_[s].count),
                       sums_[s].cosine / static_cast<double>(sums_[s].count)});
  }

 private:
  struct Slot {
    int target = -1;  // the mini-batch whose step scores it; -1: free
    int s = 0;
    std::vector<float> predicted, now;
  };
  struct Sum {
    long count = 0;
    double relative = 0, cosine = 0;
  };
  int stage_;
  index_t params_;
  std::vector<Slot> slots_;
  std::vector<Sum> sums_;  // [s]
};

}  // namespace xpipe
