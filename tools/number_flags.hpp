// The tools' floating flags: decimal text, finite and in range. CLI11's Range lets NaN through
// (every comparison with it is false) and its conversion takes hex (0x10) and leading junk.
#pragma once

#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <string>
#include <system_error>

namespace xpipe::tools {

// A floating flag's text: a decimal number (std::from_chars: no hex such as 0x3, no leading
// space or '+', no junk after it) that is finite (not nan or inf) and in [lo, hi]; "" when it
// is, else why not (`range_what` says what the range is).
inline std::string check_number(const std::string& text, double lo, double hi,
                                const std::string& range_what) {
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || end != text.data() + text.size() || ec == std::errc::invalid_argument)
    return "'" + text + "' is not a decimal number";
  if (!std::isfinite(v)) return "'" + text + "' is not a finite number";
  if (ec == std::errc::result_out_of_range || v < lo || v > hi)
    return text + " is outside " + range_what;
  return "";
}

//! A CLI11 validator of a floating flag: check_number over [lo, hi], the range written
//! `range_what` in its messages. Usage: `->check(decimal_in(0, 100, "[0, 100]"))`.
inline CLI::Validator decimal_in(double lo, double hi, const std::string& range_what) {
  return CLI::Validator(
      [lo, hi, range_what](std::string& text) { return check_number(text, lo, hi, range_what); },
      "in " + range_what);
}

}  // namespace xpipe::tools
