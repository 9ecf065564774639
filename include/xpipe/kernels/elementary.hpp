// exp and erf in plain arithmetic, for the element passes that call them per element (GELU, the
// attention softmax): the host compiler vectorises them, where a libm call per element runs
// one element at a time (GELU's erff and expf were half of a Transformer training step on the
// host). Written once for host and device. Accuracy: a few float ulps (tested against libm).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "xpipe/core/config.hpp"

namespace xpipe::math {

//! The float whose bits are `bits`. Usage: `math::float_from_bits(127 << 23) == 1.f`.
XPIPE_HOST_DEVICE float float_from_bits(std::int32_t bits) {
#if defined(__CUDA_ARCH__)
  return __int_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

//! The bits of f (float_from_bits' inverse). Usage: `math::bits_from_float(1.f) == 127 << 23`.
XPIPE_HOST_DEVICE std::int32_t bits_from_float(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_int(f);
#else
  std::int32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
#endif
}

namespace detail {
template <int N, int... I>
XPIPE_HOST_DEVICE float horner_steps(const float (&c)[N], float x,
                                     std::integer_sequence<int, I...>) {
  float p = c[0];
  ((p = p * x + c[I + 1]), ...);  // left to right: c[1], then c[2], ...
  return p;
}
}  // namespace detail

//! c[0] x^(N-1) + c[1] x^(N-2) + ... + c[N-1], by Horner's rule (highest power first), written
//! out step by step: g++ unrolls such a loop whole only at -O3, and at -O2 a loop left inside a
//! caller's element loop (GELU's) keeps that loop from vectorising (half the GPT step's speed).
//! Usage: `constexpr float c[] = {1.f, 0.f, -1.f}; math::horner(c, x)` is x^2 - 1.
template <int N>
XPIPE_HOST_DEVICE float horner(const float (&c)[N], float x) {
  return detail::horner_steps(c, x, std::make_integer_sequence<int, N - 1>{});
}

//! e^x within a few ulps for x in [-87.3, 88.7]; 0 below (though e^x down to -87.34 is a
//! normal float), +inf above (though e^x is finite up to 88.72), NaN for NaN. x = k ln 2 + r
//! with k the nearest integer to x / ln 2 (rounded by adding and taking away 1.5 * 2^23) and
//! |r| <= ln 2 / 2 (ln 2 in two parts, so r is exact to a few ulps), e^r by its Taylor series to
//! r^7 / 7! (the next term is below 6e-9 relative), times 2^k built in the exponent bits.
//! Usage: `math::exp_poly(-0.5f * x * x)`.
XPIPE_HOST_DEVICE float exp_poly(float x) {
  constexpr float log2e = 1.44269504088896341f;
  constexpr float ln2_hi = 0.693145751953125f;  // ln 2's first 16 bits: k * ln2_hi is exact
  constexpr float ln2_lo = 1.42860682030941723e-6f;
  constexpr float round = 12582912.f;  // 1.5 * 2^23: t + round - round is t rounded
  constexpr float taylor[] = {1.f / 5040.f, 1.f / 720.f, 1.f / 120.f, 1.f / 24.f,
                              1.f / 6.f,    0.5f,        1.f,         1.f};
  // Clamped so that NaN lands on a bound too (k must be a number); the result is fixed below.
  const float xc = x > -87.3f ? (x < 88.7f ? x : 88.7f) : -87.3f;
  const float kr = xc * log2e + round;
  const float k = kr - round;
  const float r = (xc - k * ln2_hi) - k * ln2_lo;
  const float p = horner(taylor, r);
  // 2^k as two normal factors 2^k1 2^k2 (k in [-126, 128]: one alone would leave the range).
  const auto ki = static_cast<std::int32_t>(k);
  const std::int32_t k1 = ki / 2, k2 = ki - k1;
  const float y = p * float_from_bits((k1 + 127) << 23) * float_from_bits((k2 + 127) << 23);
  // Outside the clamp: 0 below (e^-87.3 is the smallest normal's order), inf above; NaN stays.
  return x < -87.3f ? 0.f : (x > 88.7f ? HUGE_VALF : (x == x ? y : x));
}

//! erf(z) within 4e-7 absolute. |z| <= 1.5: z P(z^2), P of degree 8; 1.5 < |z| < 4: a degree-12
//! polynomial in (|z| - 2.75) / 1.25; |z| >= 4: 1 (erf(4) = 1 - 1.5e-8 rounds to 1). Each is a
//! least-squares fit to erf over its interval at Chebyshev nodes, made for xpipe; the sign of z
//! is put back. Usage: `0.5f * (1.f + math::erf_poly(x * 0.70710678f))`.
XPIPE_HOST_DEVICE float erf_poly(float z) {
  constexpr float near_fit[] = {6.294536860e-07f,  -1.141085651e-05f, 1.134065549e-04f,
                                -8.460773705e-04f, 5.217603058e-03f,  -2.686356862e-02f,
                                1.128373945e-01f,  -3.761263511e-01f, 1.128379167e+00f};
  constexpr float far_fit[] = {
      -6.175798114e-05f, -3.783299894e-05f, 5.639891259e-04f, -7.065719520e-04f, -5.619935632e-04f,
      3.183555763e-03f,  -6.311991294e-03f, 8.380505579e-03f, -7.955994172e-03f, 5.395035985e-03f,
      -2.519062920e-03f, 7.327172584e-04f,  9.998993771e-01f};
  const float a = z < 0.f ? -z : z;
  const float near = a * horner(near_fit, a * a);
  const float far = a >= 4.f ? 1.f : horner(far_fit, (a - 2.75f) * 0.8f);
  const float e = a <= 1.5f ? near : far;
  return z < 0.f ? -e : (z == z ? e : z);
}

}  // namespace xpipe::math
