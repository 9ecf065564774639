// libFuzzer target: the checkpoint MANIFEST parser. Any input must give a manifest or an
// xpipe::CheckpointError; an accepted manifest holds only safe names, bounded sizes and one-line
// field values. The seed corpus holds a version-2 MANIFEST (its checksum line guards the rest,
// so mutations mostly stop there) and a version-1 one (which reaches the line parser).
#include <cstddef>
#include <cstdint>
#include <string>

#include "xpipe/checkpoint/files.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const xpipe::CheckpointManifest m = xpipe::parse_checkpoint_manifest(text, "fuzz");
    for (const auto& f : m.files)
      if (!xpipe::detail::checkpoint_name_ok(f.name) || f.name.find('/') != std::string::npos ||
          f.bytes > xpipe::checkpoint_max_file_bytes)
        __builtin_trap();  // a name that could leave the folder, or an unbounded size
    for (const auto& [key, value] : m.fields)
      if (!xpipe::detail::checkpoint_name_ok(key) ||
          value.find_first_of("\r\n") != std::string::npos)
        __builtin_trap();  // a field the writer could not have written
  } catch (const xpipe::CheckpointError&) {
  }
  return 0;
}
