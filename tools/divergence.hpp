// When xpipe-train calls a run diverged, judged from its epoch losses, and why the rule is so.
#pragma once

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace xpipe::tools {

//! Why a run whose epoch losses these are (epoch 1 first) has diverged at its last epoch, or ""
//! if it has not. Diverged is:
//!  - a NaN or infinite epoch loss (the library throws on the first such micro-batch already);
//!  - an epoch loss above 10x the lowest epoch loss before it: the run had learned and ran away
//!    (from 0.3 to 3 is past chance, ln 10 = 2.3);
//!  - an epoch loss above 1e6, for runs that never learn. Not lower, and not judged against the
//!    first epoch: at a high learning rate the first epoch swings far and comes back. Adam on
//!    the MLP (2048 samples) averages 122, 3.4e3 and 3.0e5 over epoch 1 at lr 0.01, 0.03 and 0.1
//!    and is back to 1.8, 3.9 and 154 by epoch 3; at lr 1 it averages 2.7e9 and stays at
//!    chance accuracy.
//! Usage: `if (auto why = divergence(losses); !why.empty()) stop(why);`
inline std::string divergence(const std::vector<double>& losses) {
  constexpr double bound = 1e6, growth = 10;
  if (losses.empty()) return "";
  const std::size_t last = losses.size() - 1;
  const double loss = losses[last];
  char why[160];
  if (!std::isfinite(loss)) {
    std::snprintf(why, sizeof why, "epoch %zu: loss is %g", last + 1, loss);
    return why;
  }
  if (loss > bound) {
    std::snprintf(why, sizeof why, "epoch %zu: loss %.3g is above %.0e", last + 1, loss, bound);
    return why;
  }
  std::size_t lowest = last;
  for (std::size_t i = 0; i < last; ++i)
    if (lowest == last || losses[i] < losses[lowest]) lowest = i;
  if (lowest != last && loss > growth * losses[lowest]) {
    std::snprintf(why, sizeof why, "epoch %zu: loss %.3g is above %.0fx epoch %zu's %.3g", last + 1,
                  loss, growth, lowest + 1, losses[lowest]);
    return why;
  }
  return "";
}

}  // namespace xpipe::tools
