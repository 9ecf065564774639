// Delay-compensated gradients (DC-ASGD, Zheng et al., ICML 2017): a gradient computed on weights
// W_bak and applied at W is moved along the first-order Taylor term, with g g^T's diagonal in
// place of the Hessian: g + lambda g ⊙ g ⊙ (W - W_bak).
#pragma once

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "xpipe/kernels/ops.hpp"
#include "xpipe/predict/predictor.hpp"
#include "xpipe/predict/slots.hpp"

namespace xpipe {

//! DelayCompensated ("dc-asgd"). Forward reads the live weights and the backward the very
//! version its forward read (as Stash), so a micro-batch's gradient is the gradient at W_bak, the
//! weights it was computed on; before each step the stage's gradient g is corrected toward the
//! live weights W:
//!   g <- g + lambda_t ⊙ g ⊙ g ⊙ (W - W_bak),
//! per weight, with lambda_t = `lambda` / sqrt(ms), ms <- m ms + (1 - m) g ⊙ g updated first
//! (DC-ASGD-a, m = `mean_square`, 0.95 by default), or lambda_t = `lambda` with mean_square = 0
//! (DC-ASGD-c). ms starts at zero with each train() call, so a resumed run computes the same
//! bits. Where the step's micro-batches read different versions (M > 1), W_bak is their mean
//! (exact at M = 1, the paper's one gradient per update). The correction acts on the gradient as
//! the step receives it (after global clipping); a version is held until the step that applies
//! the last gradient computed on it, all from the staleness analysis.
//! Holds the live weights, the versions still to be applied (the analysis says how many), ms in
//! the adaptive form, and one scratch for the mean where a step mixes versions.
struct DelayCompensated {
  static constexpr const char* name = "dc-asgd";
  float lambda = 2.f;
  float mean_square = 0.95f;

  template <class F>
  void hyper_parameters(F&& f) {
    f("lambda", lambda, HyperRange{0, 1e6});
    f("mean_square", mean_square, HyperRange{0, 1, false, true});
  }

  template <class O, class B>
  class State : public PredictorHooks {
   public:
    explicit State(const PredictorSetup& setup, const DelayCompensated& p = {})
        : setup_(setup),
          lambda_(p.lambda),
          mean_square_(p.mean_square),
          plan_(plan(setup)),
          slots_(plan_.slots, setup.params, name, setup.stage),
          slot_of_version_(static_cast<std::size_t>(setup.schedule->mini_batches), -1),
          ms_(p.mean_square > 0.f ? setup.params : 0),
          mean_(plan_.mixes_versions ? setup.params : 0) {}  // buffers start zero-filled

    template <class Ctx>
    const float* forward_weights(const Ctx&, OptimizerState<O, B>& opt, int) {
      return opt.weights();
    }
    template <class Ctx>
    const float* backward_weights(const Ctx&, OptimizerState<O, B>& opt, int g) {
      return version(opt, setup_.analysis->forward(setup_.stage, g).version);
    }
    //! Corrects the gradient of step t toward the live weights, frees the versions no later
    //! gradient needs, keeps the live one if a later gradient is computed on it, and steps.
    template <class Ctx>
    bool apply_step(const Ctx& ctx, OptimizerState<O, B>& opt) {
      const int t = steps_;
      const auto& mix = plan_.mix[static_cast<std::size_t>(t)];  // (version, micro-batches)
      const bool stale = std::any_of(mix.begin(), mix.end(), [&](auto vc) { return vc.first < t; });
      if (stale || adaptive()) {  // on the live weights alone, the constant form is a no-op
        const float* bak = opt.weights();
        if (mix.size() == 1) {
          bak = version(opt, mix[0].first);
        } else if (mix.size() > 1) {
          int total = 0;
          for (auto [v, count] : mix) total += count;
          const float* first = version(opt, mix[0].first);
          const float c = static_cast<float>(mix[0].second) / static_cast<float>(total);
          combine(ctx, &first, &c, 1, mean_.data(), setup_.params);
          for (std::size_t i = 1; i < mix.size(); ++i)
            add_scaled(ctx, mean_.data(), version(opt, mix[i].first), setup_.params,
                       static_cast<float>(mix[i].second) / static_cast<float>(total));
          bak = mean_.data();
        }
        delay_compensation(ctx, opt.grads(), adaptive() ? ms_.data() : nullptr, opt.weights(), bak,
                           setup_.params, lambda_, mean_square_);
      }
      for (int v : plan_.last_use[static_cast<std::size_t>(t)]) {
        slots_.release(slot_of_version_[static_cast<std::size_t>(v)]);
        slot_of_version_[static_cast<std::size_t>(v)] = -1;
      }
      if (plan_.keep[static_cast<std::size_t>(t)]) {  // saved after the release: one slot fewer
        const int slot = slots_.acquire(1, Action{ActionKind::Step, t});
        copy_buffer(ctx, opt.weights(), slots_.data(slot), setup_.params);
        slot_of_version_[static_cast<std::size_t>(t)] = slot;
      }
      opt.step(ctx);
      ++steps_;
      return true;
    }

    int weight_copies() const {
      return 1 + slots_.size() + (adaptive() ? 1 : 0) + (plan_.mixes_versions ? 1 : 0);
    }

   private:
    // What each step of the stage applies and keeps, derived once from the analysis: micro-batch
    // g is forwarded on version v(g) and its gradient applied by step v(g) + s (s its apply-time
    // staleness), so version v is kept from step v until the last step applying a gradient
    // computed on it.
    struct Plan {
      std::vector<std::vector<std::pair<int, int>>> mix;  // [step]: (version, micro-batches)
      std::vector<char> keep;                             // [step]: save the live version
      std::vector<std::vector<int>> last_use;             // [step]: versions freed after it
      int slots = 0;                                      // most versions saved at once
      bool mixes_versions = false;
    };
    static Plan plan(const PredictorSetup& setup) {
      const int N = setup.schedule->mini_batches, total = setup.schedule->total_micro_batches();
      Plan p;
      p.mix.resize(static_cast<std::size_t>(N));
      p.keep.assign(static_cast<std::size_t>(N), 0);
      p.last_use.resize(static_cast<std::size_t>(N));
      std::vector<int> last(static_cast<std::size_t>(N), -1);  // [version]: its last step
      for (int g = 0; g < total; ++g) {
        const ActionVersion& f = setup.analysis->forward(setup.stage, g);
        const int v = f.version, at = f.version + f.apply_time;
        if (v < 0 || at >= N)  // the analysis applies every gradient within the call
          throw Error("xpipe: dc-asgd: stage " + std::to_string(setup.stage) + ": F" +
                      std::to_string(g) + " reads version " + std::to_string(v) +
                      " and is applied by step " + std::to_string(at) + " of " + std::to_string(N));
        auto& mix = p.mix[static_cast<std::size_t>(at)];
        auto it = std::find_if(mix.begin(), mix.end(), [&](auto vc) { return vc.first == v; });
        if (it == mix.end())
          mix.emplace_back(v, 1);
        else
          ++it->second;
        last[static_cast<std::size_t>(v)] = std::max(last[static_cast<std::size_t>(v)], at);
      }
      int held = 0;
      for (int t = 0; t < N; ++t) {
        p.mixes_versions = p.mixes_versions || p.mix[static_cast<std::size_t>(t)].size() > 1;
        held -= static_cast<int>(p.last_use[static_cast<std::size_t>(t)].size());
        if (last[static_cast<std::size_t>(t)] > t) {  // a later step applies a gradient on it
          p.keep[static_cast<std::size_t>(t)] = 1;
          p.last_use[static_cast<std::size_t>(last[static_cast<std::size_t>(t)])].push_back(t);
          p.slots = std::max(p.slots, ++held);
        }
      }
      return p;
    }

    const float* version(OptimizerState<O, B>& opt, int v) {
      if (v == steps_) return opt.weights();
      return slots_.data(slot_of_version_[static_cast<std::size_t>(v)]);
    }
    bool adaptive() const { return mean_square_ > 0.f; }

    PredictorSetup setup_;
    float lambda_, mean_square_;
    Plan plan_;
    WeightSlots<B> slots_;
    std::vector<int> slot_of_version_;  // [version]: its slot while kept, else -1
    typename B::template Buffer<float> ms_, mean_;
    int steps_ = 0;  // steps of this train() call: the live version
  };
};
static_assert(Predictor<DelayCompensated>);

}  // namespace xpipe
