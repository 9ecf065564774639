// Reader of IDX files (the MNIST family's format), gzip'd or plain, validating every field.
#pragma once

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
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

//! The most data bytes read_idx accepts by default: 1 GiB. The largest IDX sets in use (EMNIST
//! ByClass, 698k 28x28 images: 547 MB) fit with room to spare, and the loader turns each byte
//! into a 4-byte float, so more would ask for over 4 GiB of features. A header declaring more
//! is refused before anything is allocated; pass read_idx a larger bound for bigger files.
inline constexpr std::size_t idx_max_data_bytes = std::size_t{1} << 30;

namespace detail {
// "a FIFO", "a directory", ...: what a path is when it exists and is no regular file (which
// read_idx refuses); nullptr for a regular file and for one status cannot see (gzopen reports).
inline const char* irregular_kind(std::filesystem::file_type t) {
  using std::filesystem::file_type;
  switch (t) {
    case file_type::directory:
      return "a directory";
    case file_type::fifo:
      return "a FIFO";
    case file_type::socket:
      return "a socket";
    case file_type::block:
      return "a block device";
    case file_type::character:
      return "a character device";
    default:
      return nullptr;
  }
}
}  // namespace detail

//! Reads an unsigned-byte IDX file (magic 0x000008NN, NN = number of dimensions), gzip'd or not.
//! Throws DataError naming the file and the fault: missing, unreadable, not a regular file (a
//! FIFO would block the reader forever), bad magic, a zero dimension, more than
//! `max_data_bytes` of data declared, truncated data, trailing bytes, or a corrupt gzip stream.
//! The data are read in chunks of at most 16 MiB, so a header that declares more than the file
//! holds fails when the data run out, having allocated at most about twice what was there plus
//! one chunk, never the declared size.
//! Usage: `IdxArray labels = read_idx(dir + "/t10k-labels-idx1-ubyte.gz");`
inline IdxArray read_idx(const std::string& path, std::size_t max_data_bytes = idx_max_data_bytes) {
  std::error_code ec;  // a path status cannot see is left to gzopen's error below
  if (const char* kind = detail::irregular_kind(std::filesystem::status(path, ec).type()))
    throw DataError("xpipe: IDX file '" + path + "' is " + kind +
                    ", not a regular file: refusing to read it");
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
  std::string shape;
  bool too_big = false;
  std::size_t total = 1;
  for (unsigned d = 0; d < ndims; ++d) {
    unsigned char b[4];
    if (detail::gz_read(f, b, 4, path) != 4)
      throw DataError("xpipe: IDX file '" + path + "' is truncated inside its dimension list");
    const std::uint32_t dim = (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) |
                              (std::uint32_t{b[2]} << 8) | b[3];
    if (dim == 0)
      throw DataError("xpipe: IDX file '" + path + "' has dimension " + std::to_string(d) + " = 0");
    // Once past the bound the product stops (no overflow); the message lists every dimension.
    too_big = too_big || dim > max_data_bytes / total;
    if (!too_big) total *= dim;
    shape += (d > 0 ? " x " : "") + std::to_string(dim);
    out.dims.push_back(dim);
  }
  if (too_big)
    throw DataError("xpipe: IDX file '" + path + "' declares " + shape +
                    " bytes of data, more than the limit of " + std::to_string(max_data_bytes) +
                    " (read_idx's max_data_bytes)");
  // Grow the buffer with what actually arrives, never to the declared size up front.
  constexpr std::size_t chunk = std::size_t{16} << 20;
  std::size_t got = 0;
  while (got < total) {
    const std::size_t want = std::min(chunk, total - got);
    if (out.data.capacity() < got + want)
      out.data.reserve(std::min(total, std::max(2 * out.data.capacity(), got + want)));
    out.data.resize(got + want);
    const std::size_t n = detail::gz_read(f, out.data.data() + got, want, path);
    got += n;
    if (n < want) break;
  }
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
