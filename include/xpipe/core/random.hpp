// A small, portable, seeded random generator: identical streams on every platform and compiler,
// which std:: distributions do not promise. Used for initialisation, shuffling, synthetic data.
#pragma once

#include <cmath>
#include <cstdint>

namespace xpipe {

//! SplitMix64 generator. Usage: `Rng rng{seed}; float u = rng.uniform();`
class Rng {
 public:
  explicit constexpr Rng(std::uint64_t seed) : state_(seed) {}

  constexpr std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  //! Uniform in [0, 1) with 24 random bits: every value is exactly representable as float.
  constexpr float uniform() { return static_cast<float>(next() >> 40) * 0x1.0p-24f; }
  //! Uniform in [lo, hi).
  constexpr float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
  //! Uniform integer in [0, n), n > 0 (Lemire's multiply-shift; bias below 2^-32 for n < 2^32).
  constexpr std::uint64_t below(std::uint64_t n) {
    return static_cast<std::uint64_t>((static_cast<unsigned __int128>(next() >> 32) * n) >> 32);
  }
  //! Standard normal (Box-Muller; one value per call, the second discarded for simplicity).
  float normal() {
    const float u1 = 1.f - uniform();  // in (0, 1]: log() stays finite
    const float u2 = uniform();
    return std::sqrt(-2.f * std::log(u1)) * std::cos(6.28318530717958647692f * u2);
  }

 private:
  std::uint64_t state_;
};

//! A seed for sub-stream `index` of `seed` (one per layer, per epoch, ...), decorrelated.
constexpr std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t index) {
  Rng r{seed ^ (0xD1B54A32D192ED03ull * (index + 1))};
  return r.next();
}

}  // namespace xpipe
