// Weight initialisation policies for Linear layers: seeded and platform-independent.
#pragma once

#include <cmath>
#include <span>

#include "xpipe/core/random.hpp"

namespace xpipe {

//! He (Kaiming) uniform: U(-sqrt(6 / fan_in), sqrt(6 / fan_in)); the default before ReLU/GELU.
struct HeUniform {
  static float bound(int fan_in, int /*fan_out*/) {
    return std::sqrt(6.f / static_cast<float>(fan_in));
  }
};

//! Xavier (Glorot) uniform: U(-sqrt(6 / (fan_in + fan_out)), ...); for tanh-like or linear maps.
struct XavierUniform {
  static float bound(int fan_in, int fan_out) {
    return std::sqrt(6.f / static_cast<float>(fan_in + fan_out));
  }
};

//! Fills `weights` from U(-b, b) with b from Init, seeded: same seed, same bits everywhere.
template <class Init>
void init_uniform(std::span<float> weights, int fan_in, int fan_out, std::uint64_t seed) {
  const float b = Init::bound(fan_in, fan_out);
  Rng rng{seed};
  for (float& w : weights) w = rng.uniform(-b, b);
}

}  // namespace xpipe
