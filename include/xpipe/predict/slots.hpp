// WeightSlots: the fixed pool of weight copies behind the predictors that hold versions (Stash,
// DoubleBuffered, XPipe). Every copy is allocated when the pool is built; training only lends.
#pragma once

#include <string>
#include <vector>

#include "xpipe/core/error.hpp"
#include "xpipe/predict/predictor.hpp"

namespace xpipe {

//! `count` weight buffers of `params` floats on backend B, each lent to one or more users.
//! A slot is free when its user count is zero. Construction allocates everything; acquire,
//! share and release never allocate (only a failing acquire builds its error message).
//! Usage: `WeightSlots<B> slots(n, setup.params, "stash", setup.stage);`
//!        `int s = slots.acquire(1, Action{ActionKind::Step, t}); copy into slots.data(s); ...`
//!        `slots.release(s);`
template <class B>
class WeightSlots {
 public:
  //! `owner` (the predictor, for messages; must outlive the pool) and `stage` name the errors.
  WeightSlots(int count, index_t params, const char* owner, int stage)
      : owner_(owner), stage_(stage), users_(static_cast<std::size_t>(count), 0) {
    buffers_.reserve(static_cast<std::size_t>(count));
    for (int i = 0; i < count; ++i) buffers_.emplace_back(params);
  }

  //! Lends the lowest free slot to `users` users (>= 1). Throws an Error naming the owner, the
  //! stage and the action `at` when every slot is in use: the schedule's analysis promised
  //! enough, so running out is a predictor bug, not a user error.
  int acquire(int users, const Action& at) {
    for (std::size_t i = 0; i < users_.size(); ++i)
      if (users_[i] == 0) {
        users_[i] = users;
        return static_cast<int>(i);
      }
    throw Error("xpipe: " + std::string(owner_) + ": stage " + std::to_string(stage_) + ": all " +
                std::to_string(users_.size()) + " weight slots in use at " + to_string(at));
  }
  //! One more user of a lent slot.
  void share(int slot) { ++users_[static_cast<std::size_t>(slot)]; }
  //! One user fewer; returns true when that freed the slot.
  bool release(int slot) { return --users_[static_cast<std::size_t>(slot)] == 0; }

  float* data(int slot) { return buffers_[static_cast<std::size_t>(slot)].data(); }
  int size() const { return static_cast<int>(buffers_.size()); }
  int users(int slot) const { return users_[static_cast<std::size_t>(slot)]; }

 private:
  const char* owner_;
  int stage_;
  std::vector<typename B::template Buffer<float>> buffers_;
  std::vector<int> users_;
};

}  // namespace xpipe
