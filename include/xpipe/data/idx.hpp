// Reader of IDX files (the MNIST family's format), gzip'd or plain, validating every field.
#pragma once

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "xpipe/core/error.hpp"

namespace xpipe {

//! An unsigned-byte IDX array: its dimensions and its data, row-major.
struct IdxArray {
  std::vector<std::uint32_t> dims;
  std::vector<std::uint8_t> data;
  std::size_t count() const { return dims.empty() ? 0 : dims[0]; }
};

namespace detail {
struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};

inline std::string gz_error_text(gzFile f) {
  int code = Z_OK;
  const char* msg = gzerror(f, &code);
  return msg != nullptr && *msg != '\0' ? msg : "read error";
}

// Reads up to n bytes; returns how many were read; throws on a corrupt stream.
inline std::size_t gz_read(gzFile f, void* out, std::size_t n, const std::string& path) {
  std::size_t total = 0;
  auto* p = static_cast<unsigned char*>(out);
  while (total < n) {
    const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(n - total, 1u << 30));
    const int got = gzread(f, p + total, chunk);
    if (got < 0) throw DataError("xpipe: IDX file '" + path + "' is corrupt: " + gz_error_text(f));
    if (got == 0) {
      int code = Z_OK;
      gzerror(f, &code);
      // A gzip stream cut short reports Z_BUF_ERROR ("unexpected end of file") here.
      if (code != Z_OK && code != Z_STREAM_END)
        throw DataError("xpipe: IDX file '" + path +
                        "' is corrupt or truncated: " + gz_error_text(f));
      break;
    }
    total += static_cast<std::size_t>(got);
  }
  return total;
}
}  // namespace detail

//! Reads an unsigned-byte IDX file (magic 0x000008NN, NN = number of dimensions), gzip'd or not.
//! Throws DataError naming the file and the fault: missing, unreadable, bad magic, a zero or
//! absurd dimension, truncated data, trailing bytes, or a corrupt gzip stream.
inline IdxArray read_idx(const std::string& path) {
  std::unique_ptr<gzFile_s, detail::GzCloser> file(gzopen(path.c_str(), "rb"));
  if (!file) {
    std::FILE* probe = std::fopen(path.c_str(), "rb");
    if (probe != nullptr) std::fclose(probe);
    throw DataError("xpipe: cannot open IDX file '" + path + "'" +
                    (probe == nullptr ? ": no such file or not readable" : ""));
  }
  gzFile f = file.get();
  unsigned char header[4];
  if (detail::gz_read(f, header, 4, path) != 4)
    throw DataError("xpipe: IDX file '" + path + "' is truncated: shorter than its 4-byte header");
  const std::uint32_t magic = (std::uint32_t{header[0]} << 24) | (std::uint32_t{header[1]} << 16) |
                              (std::uint32_t{header[2]} << 8) | header[3];
  const unsigned ndims = header[3];
  if (header[0] != 0 || header[1] != 0 || header[2] != 0x08 || ndims == 0 || ndims > 4) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%08X", magic);
    throw DataError("xpipe: IDX file '" + path + "' has bad magic number " + buf +
                    " (expected 0x00000801..0x00000804: unsigned bytes, 1 to 4 dimensions)");
  }
  IdxArray out;
  std::size_t total = 1;
  for (unsigned d = 0; d < ndims; ++d) {
    unsigned char b[4];
    if (detail::gz_read(f, b, 4, path) != 4)
      throw DataError("xpipe: IDX file '" + path + "' is truncated inside its dimension list");
    const std::uint32_t dim = (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) |
                              (std::uint32_t{b[2]} << 8) | b[3];
    if (dim == 0)
      throw DataError("xpipe: IDX file '" + path + "' has dimension " + std::to_string(d) + " = 0");
    total *= dim;
    if (total > (std::size_t{1} << 32))
      throw DataError("xpipe: IDX file '" + path + "' declares more than 4 GiB of data");
    out.dims.push_back(dim);
  }
  out.data.resize(total);
  const std::size_t got = detail::gz_read(f, out.data.data(), total, path);
  if (got != total)
    throw DataError("xpipe: IDX file '" + path + "' is truncated: header declares " +
                    std::to_string(total) + " bytes of data, found " + std::to_string(got));
  unsigned char extra;
  if (detail::gz_read(f, &extra, 1, path) != 0)
    throw DataError("xpipe: IDX file '" + path +
                    "' has unexpected bytes after the data its header declares");
  return out;
}

}  // namespace xpipe
