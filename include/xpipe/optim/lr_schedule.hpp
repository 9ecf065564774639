// The learning rate of each epoch: constant, cosine annealing, or a tenth at each milestone, as
// PyTorch's CosineAnnealingLR and MultiStepLR give it when stepped after every epoch.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numbers>
#include <string>
#include <system_error>
#include <vector>

#include "xpipe/core/error.hpp"

namespace xpipe {

//! A per-epoch learning-rate schedule, written as text for flags and checkpoints. For epoch e
//! (1-based) of E at base rate lr:
//!   - `constant`: lr;
//!   - `cosine`: lr (1 + cos(pi (e - 1) / E)) / 2 (CosineAnnealingLR, T_max = E, eta_min = 0);
//!   - `step:E1,E2,...`: lr 0.1^n, n the milestones below e (MultiStepLR, gamma = 0.1): with
//!     `step:10,15`, epochs 1-10 train at lr, 11-15 at lr / 10, 16 on at lr / 100.
//! Epoch 1 always trains at lr. Computed in double, rounded once to float: the rate of an epoch
//! depends on (lr, e, E) alone, so a resumed run sets the same rate as an uninterrupted one.
//! Usage: `auto s = LearningRateSchedule::parse("cosine"); pipe.set_learning_rate(s.at(lr, e, E));`
struct LearningRateSchedule {
  enum class Kind { constant, cosine, step };
  Kind kind = Kind::constant;
  std::vector<int> milestones;  // step: whole epochs >= 1, strictly increasing

  //! The schedule `text` names; ConfigError quoting it and saying what is expected otherwise.
  static LearningRateSchedule parse(const std::string& text) {
    const auto refuse = [&](const std::string& why) {
      return ConfigError("xpipe: learning-rate schedule '" + text + "': " + why +
                         "; expected constant, cosine or step:E1,E2,... (whole epochs >= 1, "
                         "each above the one before)");
    };
    if (text == "constant") return {};
    if (text == "cosine") return {Kind::cosine, {}};
    if (text.empty()) throw refuse("is empty");
    if (text.rfind("step:", 0) != 0)
      throw refuse(text == "step" ? "step needs its milestones" : "unknown schedule");
    LearningRateSchedule s{Kind::step, {}};
    const std::string list = text.substr(5);
    if (list.empty()) throw refuse("no milestones");
    std::size_t at = 0;
    while (true) {
      const std::size_t comma = std::min(list.find(',', at), list.size());
      const std::string item = list.substr(at, comma - at);
      int m = 0;
      const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), m);
      const bool whole = !item.empty() && end == item.data() + item.size();
      if (whole && ec == std::errc::result_out_of_range)
        throw refuse("milestone " + item + " is too large");
      if (!whole || ec != std::errc{})
        throw refuse("milestone '" + item + "' is not a whole number");
      if (m < 1) throw refuse("milestone " + item + " is not >= 1");
      if (!s.milestones.empty() && m <= s.milestones.back())
        throw refuse("milestone " + item + " does not follow " +
                     std::to_string(s.milestones.back()));
      s.milestones.push_back(m);
      if (comma == list.size()) break;
      at = comma + 1;
    }
    return s;
  }

  //! The rate of epoch `epoch` (1-based) of `epochs` from the base rate `base`; ConfigError
  //! unless 1 <= epoch <= epochs.
  float at(float base, int epoch, int epochs) const {
    if (epoch < 1 || epoch > epochs)
      throw ConfigError("xpipe: learning-rate schedule '" + text() + "': epoch " +
                        std::to_string(epoch) + " is outside 1.." + std::to_string(epochs));
    const double lr = base;
    switch (kind) {
      case Kind::constant:
        return base;
      case Kind::cosine:
        return static_cast<float>(lr * 0.5 *
                                  (1.0 + std::cos(std::numbers::pi * (epoch - 1) / epochs)));
      case Kind::step: {
        double factor = 1.0;
        for (int m : milestones)
          if (m < epoch) factor *= 0.1;
        return static_cast<float>(lr * factor);
      }
    }
    return base;
  }

  //! The canonical text: parse(text()) == *this. Usage: a checkpoint field, a runs.json value.
  std::string text() const {
    switch (kind) {
      case Kind::constant:
        return "constant";
      case Kind::cosine:
        return "cosine";
      case Kind::step: {
        std::string out = "step:";
        for (std::size_t i = 0; i < milestones.size(); ++i)
          out += (i > 0 ? "," : "") + std::to_string(milestones[i]);
        return out;
      }
    }
    return "?";
  }

  friend bool operator==(const LearningRateSchedule&, const LearningRateSchedule&) = default;
};

}  // namespace xpipe
