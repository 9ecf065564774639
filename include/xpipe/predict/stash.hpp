// Weight stashing (PipeDream) and its two-version form (PipeDream-2BW): the backward of a
// micro-batch reads the very weights its forward read.
#pragma once

#include <string>
#include <vector>

#include "xpipe/predict/predictor.hpp"
#include "xpipe/predict/slots.hpp"

namespace xpipe {

namespace detail {
//! The state of every stashing predictor. Forward reads the live weights; a version still
//! needed by a pending backward is copied into a stash slot just before the optimizer step
//! overwrites it (so a version costs one copy, and only when it is really needed).
//! `max_versions` (0: unbounded) caps the versions held; `owner` (a predictor's static name)
//! names the errors.
template <class O, class B>
class StashState {
 public:
  StashState(const PredictorSetup& setup, int max_versions, const char* owner)
      : setup_(setup),
        owner_(owner),
        fwd_version_(setup.schedule->total_micro_batches(), -1),
        slot_of_(setup.schedule->total_micro_batches(), -1),
        slots_(checked_versions(setup, max_versions, owner) - 1, setup.params, owner, setup.stage) {
    // pending_ never outgrows the micro-batches in flight: no allocation while training.
    pending_.reserve(static_cast<std::size_t>(setup.analysis->max_in_flight[setup.stage]) + 1);
  }

  template <class Ctx>
  const float* forward_weights(const Ctx&, OptimizerState<O, B>& opt, int g) {
    fwd_version_[g] = static_cast<int>(opt.steps_taken());
    pending_.push_back(g);
    return opt.weights();
  }

  template <class Ctx>
  const float* backward_weights(const Ctx&, OptimizerState<O, B>& opt, int g) {
    if (fwd_version_[g] == opt.steps_taken()) return opt.weights();
    const int slot = slot_of_[g];
    if (slot < 0)
      throw Error("xpipe: " + std::string(owner_) + ": stage " + std::to_string(setup_.stage) +
                  ": no stashed version " + std::to_string(fwd_version_[g]) + " for B" +
                  std::to_string(g));
    return slots_.data(slot);
  }

  void backward_done(int g) {
    for (std::size_t i = 0; i < pending_.size(); ++i)
      if (pending_[i] == g) {
        pending_[i] = pending_.back();
        pending_.pop_back();
        break;
      }
    if (slot_of_[g] >= 0) slots_.release(slot_of_[g]);
    slot_of_[g] = -1;
  }

  //! Saves the live version if a pending backward still needs it: one slot, shared by every
  //! micro-batch forwarded at this version.
  template <class Ctx>
  void before_step(const Ctx& ctx, OptimizerState<O, B>& opt) {
    const int live = static_cast<int>(opt.steps_taken());
    int slot = -1;
    for (int g : pending_) {
      if (fwd_version_[g] != live) continue;
      if (slot < 0) {
        slot = slots_.acquire(1, Action{ActionKind::Step, live});
        copy_buffer(ctx, opt.weights(), slots_.data(slot), setup_.params);
      } else {
        slots_.share(slot);
      }
      slot_of_[g] = slot;
    }
  }

  int weight_copies() const { return 1 + slots_.size(); }

 protected:
  const PredictorSetup& setup() const { return setup_; }

 private:
  static int checked_versions(const PredictorSetup& setup, int max_versions, const char* owner) {
    const int versions = setup.analysis->stash_versions[setup.stage];
    if (max_versions > 0 && versions > max_versions)
      throw ConfigError(std::string("xpipe: ") + owner + ": stage " + std::to_string(setup.stage) +
                        " needs " + std::to_string(versions) + " weight versions under schedule '" +
                        setup.schedule->name + "', but " + owner + " holds " +
                        std::to_string(max_versions) + " (use micro_batches >= stages)");
    return versions;
  }

  PredictorSetup setup_;
  const char* owner_;
  std::vector<int> fwd_version_, slot_of_;
  std::vector<int> pending_;  // micro-batches forwarded, not yet backwarded (capacity reserved)
  WeightSlots<B> slots_;      // versions older than the live one
};
}  // namespace detail

//! PipeDream weight stashing: forward on the latest weights, backward on the same version.
//! Holds the K - k versions the schedule's analysis says stage k needs.
struct Stash {
  static constexpr const char* name = "stash";
  template <class O, class B>
  struct State : detail::StashState<O, B> {
    explicit State(const PredictorSetup& setup) : detail::StashState<O, B>(setup, 0, name) {}
  };
};

//! PipeDream-2BW: stashing limited to two versions (the live weights and one shadow), so the
//! gradients are applied with delay 1. Construction fails if the schedule needs more.
struct DoubleBuffered {
  static constexpr const char* name = "2bw";
  template <class O, class B>
  struct State : detail::StashState<O, B> {
    explicit State(const PredictorSetup& setup) : detail::StashState<O, B>(setup, 2, name) {}
  };
};

static_assert(Predictor<Stash>);
static_assert(Predictor<DoubleBuffered>);

}  // namespace xpipe
