// libFuzzer target: the IDX reader, on the input as a plain file and gzip'd. Any input must give
// an array or an xpipe::DataError, never allocate past the cap (1 MiB here: ASan's allocation
// limit would report more), and an accepted array's size must match its dimensions.
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "xpipe/data/idx.hpp"

namespace {
const std::string folder = "/tmp/xpipe_fuzz_idx_" + std::to_string(::getpid());

void check(const std::string& path) {
  try {
    const xpipe::IdxArray a = xpipe::read_idx(path, std::size_t{1} << 20);
    std::size_t n = a.dims.empty() ? 0 : 1;
    for (std::uint32_t d : a.dims) n *= d;
    if (a.data.size() != n) __builtin_trap();  // the data does not fill the dimensions
  } catch (const xpipe::DataError&) {
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool made = (std::remove(folder.c_str()), ::mkdir(folder.c_str(), 0700), true);
  (void)made;
  const std::string plain = folder + "/input.idx", gz = folder + "/input.idx.gz";
  if (FILE* f = std::fopen(plain.c_str(), "wb")) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  check(plain);
  if (gzFile g = gzopen(gz.c_str(), "wb1")) {
    gzwrite(g, data, static_cast<unsigned>(size));
    gzclose(g);
  }
  check(gz);
  return 0;
}
