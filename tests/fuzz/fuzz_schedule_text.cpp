// libFuzzer target: the schedule text parser, and what runs on what it accepts. Any input must
// give a Schedule or an xpipe::Error; an accepted schedule that validates must survive the dry
// run, and its text form must parse back to the same schedule.
#include <cstddef>
#include <cstdint>
#include <string>

#include "xpipe/schedule/dry_run.hpp"
#include "xpipe/schedule/text.hpp"
#include "xpipe/schedule/validate.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  xpipe::Schedule s;
  try {
    s = xpipe::parse_schedule(text);
  } catch (const xpipe::Error&) {
    return 0;
  }
  try {
    xpipe::dry_run(s);  // safe on any parsed value: it checks the structure first
  } catch (const xpipe::Error&) {
  }
  try {
    xpipe::validate(s);
  } catch (const xpipe::Error&) {
    return 0;
  }
  const xpipe::Schedule again = xpipe::parse_schedule(s.to_text());
  if (again.actions != s.actions || again.stages != s.stages ||
      again.micro_batches != s.micro_batches || again.mini_batches != s.mini_batches)
    __builtin_trap();  // the text form lost something
  return 0;
}
