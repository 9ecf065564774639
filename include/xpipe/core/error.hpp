// The one exception hierarchy of xpipe: every host-side failure derives from xpipe::Error.
#pragma once

#include <charconv>
#include <stdexcept>
#include <string>

namespace xpipe {

//! Base of every exception xpipe throws. Messages name the file, stage, action or argument.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

//! A data file is missing, truncated or malformed, or a label lies outside the classes; the
//! message names the file, or the row of the batch or epoch.
class DataError : public Error {
 public:
  using Error::Error;
};

//! A runtime shape or size does not fit what the caller allocated.
class ShapeError : public Error {
 public:
  using Error::Error;
};

//! A bad argument or configuration value (learning rate, batch size, flag).
class ConfigError : public Error {
 public:
  using Error::Error;
};

//! Training diverged: a NaN or infinity reached the loss.
class NumericError : public Error {
 public:
  using Error::Error;
};

//! A checkpoint is missing, corrupt, truncated, of another format version or of another run;
//! or writing one failed. The message names the file and the field.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

//! A backend call (oneDNN, CUDA, cuBLAS) reported failure.
class BackendError : public Error {
 public:
  using Error::Error;
};

//! A stage of a pipeline failed; the message names the stage and the action it was running.
class StageError : public Error {
 public:
  StageError(int stage, const std::string& action, const std::string& what)
      : Error("xpipe: stage " + std::to_string(stage) + ", action " + action + ": " + what),
        stage_(stage) {}
  int stage() const { return stage_; }

 private:
  int stage_;
};

//! "a, b, c": the valid names an error message offers. Usage: `join_names(schedule_names)`.
template <class Names>
std::string join_names(const Names& names) {
  std::string out;
  for (const auto& n : names) {
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

namespace detail {
//! The shortest text that reads back as `v` (for error messages: "1e+06", not "1000000.000000").
inline std::string number_text(double v) {
  char text[64];
  const auto [end, ec] = std::to_chars(text, text + sizeof text, v);
  return ec == std::errc{} ? std::string(text, end) : std::string("?");
}
}  // namespace detail

}  // namespace xpipe
