// The learning rate of each epoch (constant, cosine annealing, or a tenth at each milestone, as
// PyTorch's CosineAnnealingLR and MultiStepLR give it when stepped after every epoch), and of each
// optimizer step (linear warmup, then cosine decay: what language models train with).
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

//! A rate per optimizer step on top of the base rate: the n-th step (1-based) of a stage's
//! optimizer trains at base * factor(n), where factor rises linearly over the first `warmup`
//! steps (n / warmup) and then follows a cosine from 1 down to `floor` at step `total`, held
//! there after:
//!   factor(n) = floor + (1 - floor) (1 + cos(pi (n - warmup) / (total - warmup))) / 2.
//! Inactive (`total` = 0) it is 1 everywhere. Every stage's n-th step takes the same rate, so a
//! pipeline's stages stay on one schedule however far apart they run; a rate depends on n alone,
//! so a resumed run (its step count restored) continues where it stopped. Computed in double.
//! Usage: `pipe.set_step_rates(StepRates{.warmup = 100, .total = 2000});`
struct StepRates {
  long warmup = 0;     // steps of linear warmup (0: none)
  long total = 0;      // the step at which the decay ends (0: no per-step schedule)
  double floor = 0.1;  // the end rate, as a fraction of the base rate

  bool active() const { return total > 0; }

  //! ConfigError unless 0 <= warmup < total (or inactive) and 0 < floor <= 1.
  void check() const {
    if (!active() && warmup == 0) return;
    if (warmup < 0 || total <= warmup)
      throw ConfigError("xpipe: step rates: the warmup (" + std::to_string(warmup) +
                        " steps) must be >= 0 and shorter than the schedule (" +
                        std::to_string(total) + " steps)");
    if (!(floor > 0 && floor <= 1))
      throw ConfigError("xpipe: step rates: the floor must lie in (0, 1]");
  }

  //! The factor of step n (1-based; n < 1 reads as 1).
  double factor(long n) const {
    if (!active()) return 1.0;
    n = std::max(n, 1L);
    if (n <= warmup) return static_cast<double>(n) / static_cast<double>(warmup);
    if (n >= total) return floor;
    const double progress = static_cast<double>(n - warmup) / static_cast<double>(total - warmup);
    return floor + (1.0 - floor) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  }

  //! The rates of the `steps` steps after step n summed, base * (factor(n + 1) + ... ), a
  //! fractional last step counted by its fraction: the distance in learning rate that a weight
  //! prediction over `steps` steps from a state that has taken n steps extrapolates.
  double rate_sum(double base, long n, double steps) const {
    double sum = 0;
    long j = 1;
    for (; j <= static_cast<long>(steps); ++j) sum += factor(n + j);
    const double part = steps - static_cast<double>(j - 1);
    if (part > 0) sum += part * factor(n + j);
    return base * sum;
  }

  friend bool operator==(const StepRates&, const StepRates&) = default;
};

//! A per-epoch learning-rate schedule, written as text for flags and checkpoints. For epoch e
//! (1-based) of E at base rate lr:
//!   - `constant`: lr;
//!   - `cosine`: lr (1 + cos(pi (e - 1) / E)) / 2 (CosineAnnealingLR, T_max = E, eta_min = 0);
//!   - `step:E1,E2,...`: lr 0.1^n, n the milestones below e (MultiStepLR, gamma = 0.1): with
//!     `step:10,15`, epochs 1-10 train at lr, 11-15 at lr / 10, 16 on at lr / 100;
//!   - `warmup-cosine:W`: lr in every epoch, and per optimizer step the StepRates of
//!     step_rates(): a linear warmup over W steps, then a cosine decay to lr / 10 at the run's
//!     last step (W = 0: no warmup).
//! Epoch 1 always trains at lr. Computed in double, rounded once to float: the rate of an epoch
//! depends on (lr, e, E) alone, so a resumed run sets the same rate as an uninterrupted one.
//! Usage: `auto s = LearningRateSchedule::parse("cosine"); pipe.set_learning_rate(s.at(lr, e, E));`
struct LearningRateSchedule {
  enum class Kind { constant, cosine, step, warmup_cosine };
  Kind kind = Kind::constant;
  std::vector<int> milestones;  // step: whole epochs >= 1, strictly increasing
  long warmup = 0;              // warmup_cosine: the warmup's optimizer steps

  //! The schedule `text` names; ConfigError quoting it and saying what is expected otherwise.
  static LearningRateSchedule parse(const std::string& text) {
    const auto refuse = [&](const std::string& why) {
      return ConfigError("xpipe: learning-rate schedule '" + text + "': " + why +
                         "; expected constant, cosine, step:E1,E2,... (whole epochs >= 1, "
                         "each above the one before) or warmup-cosine:W (W whole steps >= 0)");
    };
    if (text == "constant") return {};
    if (text == "cosine") return {Kind::cosine, {}};
    if (text.empty()) throw refuse("is empty");
    if (text.rfind("warmup-cosine", 0) == 0) {
      if (text.size() <= 14 || text[13] != ':') throw refuse("warmup-cosine needs its warmup");
      const std::string item = text.substr(14);
      long w = 0;
      const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), w);
      if (end != item.data() + item.size() || ec != std::errc{} || w < 0)
        throw refuse("warmup '" + item + "' is not a whole number of steps >= 0");
      LearningRateSchedule s{Kind::warmup_cosine, {}};
      s.warmup = w;
      return s;
    }
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
      case Kind::warmup_cosine:
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
        // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) on "," + std::to_string().
        for (std::size_t i = 0; i < milestones.size(); ++i) {
          if (i > 0) out += ',';
          out += std::to_string(milestones[i]);
        }
        return out;
      }
      case Kind::warmup_cosine: {
        std::string out = "warmup-cosine:";
        out += std::to_string(warmup);
        return out;
      }
    }
    return "?";
  }

  //! The per-step rates of a run of `total_steps` optimizer steps: warmup-cosine's, inactive for
  //! the per-epoch schedules. ConfigError when the warmup is not shorter than the run.
  StepRates step_rates(long total_steps) const {
    if (kind != Kind::warmup_cosine) return {};
    const StepRates r{.warmup = warmup, .total = total_steps};
    if (warmup >= total_steps)
      throw ConfigError("xpipe: learning-rate schedule '" + text() + "': the warmup (" +
                        std::to_string(warmup) + " steps) must be shorter than the run (" +
                        std::to_string(total_steps) + " optimizer steps)");
    r.check();
    return r;
  }

  friend bool operator==(const LearningRateSchedule&, const LearningRateSchedule&) = default;
};

}  // namespace xpipe
