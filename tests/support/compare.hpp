// Catch2 helpers the layer tests share: element-wise comparison with a named tolerance against an
// outside oracle (PyTorch fixtures), copying fixture arrays, an exception's message, and central
// differences.
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace xpipe::test {

//! |got - want| <= abs_tol + rel_tol |want| element by element; shows the first few that are not.
//! Usage: `require_close(run.y, Case::y, "y", 1e-5f, 1e-5f);`
inline void require_close(std::span<const float> got, std::span<const float> want, const char* what,
                          float abs_tol, float rel_tol) {
  REQUIRE(got.size() == want.size());
  int shown = 0;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(got[i] - want[i]) <= abs_tol + rel_tol * std::fabs(want[i]))) {
      if (shown++ < 4) WARN(what << "[" << i << "]: got " << got[i] << ", PyTorch " << want[i]);
      ++bad;
    }
  INFO(what << ": " << bad << " of " << got.size() << " differ from PyTorch");
  REQUIRE(bad == 0);
}

//! Copies a fixture array into `to` from index `at`.
template <std::size_t N>
void copy_into(std::vector<float>& to, const float (&from)[N], std::size_t at = 0) {
  REQUIRE(at + N <= to.size());
  std::copy(std::begin(from), std::end(from), to.begin() + static_cast<std::ptrdiff_t>(at));
}

//! The message of the E that f throws (other exceptions propagate and fail the test).
template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  FAIL("nothing was thrown");
  return {};
}

//! The slope of objective() along v[i] by central differences; the step is measured after
//! rounding to float, so the quotient uses the step actually taken.
template <class F>
double central(std::vector<float>& v, std::size_t i, F&& objective, float h = 1e-2f) {
  const float keep = v[i], up_at = keep + h, down_at = keep - h;
  v[i] = up_at;
  const double up = objective();
  v[i] = down_at;
  const double down = objective();
  v[i] = keep;
  return (up - down) / (static_cast<double>(up_at) - down_at);
}

}  // namespace xpipe::test
