// libFuzzer target: the checkpoint MANIFEST parser. Any input must give a manifest or an
// xpipe::CheckpointError; an accepted manifest holds only safe names and bounded sizes.
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
  } catch (const xpipe::CheckpointError&) {
  }
  return 0;
}
