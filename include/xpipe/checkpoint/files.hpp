// The checkpoint file protocol: a folder of named binary files plus a MANIFEST holding the
// format version, each file's size and CRC-32, and the run's key=value fields. Written so that a
// crash (kill -9, power loss) at any moment leaves the previous checkpoint intact and the new one
// either complete or without a MANIFEST that verifies:
//   1. each file is written to <name>.tmp, fsync'd and renamed to <name>;
//   2. the MANIFEST last, the same way (its rename is the commit point), then the folder fsync'd;
//   3. the parent folder fsync'd (the new folder's entry), then `latest` replaced by rename.
// The reader trusts nothing: version, every size and checksum, every name.
#pragma once

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "xpipe/core/error.hpp"

namespace xpipe {

//! The MANIFEST format this library writes and the only one it reads.
inline constexpr int checkpoint_format_version = 1;

//! The largest file a MANIFEST may list (a bound checked before allocating: 64 GiB).
inline constexpr std::uint64_t checkpoint_max_file_bytes = std::uint64_t{1} << 36;

namespace detail {
inline std::string errno_text() {
  return std::strerror(errno);
}

//! A name that is safe as a file name and as a MANIFEST token.
inline bool checkpoint_name_ok(const std::string& s) {
  return !s.empty() && s.size() <= 200 && s != "." && s != ".." &&
         s.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") ==
             std::string::npos;
}

inline std::uint32_t crc32_of(std::span<const char> bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  std::size_t done = 0;
  while (done < bytes.size()) {
    const auto n = static_cast<uInt>(std::min<std::size_t>(bytes.size() - done, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data() + done), n);
    done += n;
  }
  return static_cast<std::uint32_t>(crc);
}

//! fsync of a file or a folder; CheckpointError naming it on failure.
inline void fsync_path(const std::filesystem::path& p, bool folder) {
  const int fd = ::open(p.c_str(), folder ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0)
    throw CheckpointError("xpipe: checkpoint: cannot open " + p.string() +
                          " to sync: " + errno_text());
  const int rc = ::fsync(fd);
  const std::string why = rc != 0 ? errno_text() : "";
  ::close(fd);
  if (rc != 0) throw CheckpointError("xpipe: checkpoint: fsync of " + p.string() + ": " + why);
}

//! Writes bytes to `path` durably: to path.tmp, fsync, rename over path. Every step checked.
inline void write_durably(const std::filesystem::path& path, std::span<const char> bytes) {
  const std::filesystem::path tmp = path.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw CheckpointError("xpipe: checkpoint: cannot create " + tmp.string() + ": " + errno_text());
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = errno_text();
      ::close(fd);
      throw CheckpointError("xpipe: checkpoint: writing " + tmp.string() + " failed: " + why);
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0)
    throw CheckpointError("xpipe: checkpoint: fsync/close of " + tmp.string() + ": " +
                          errno_text());
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw CheckpointError("xpipe: checkpoint: rename " + tmp.string() + " -> " + path.string() +
                          ": " + errno_text());
}

//! The whole of a regular file, at most `max` bytes; CheckpointError naming it otherwise.
inline std::vector<char> read_file_bytes(const std::filesystem::path& p, std::uint64_t max) {
  std::error_code ec;
  const auto st = std::filesystem::status(p, ec);
  if (ec || !std::filesystem::is_regular_file(st))
    throw CheckpointError("xpipe: checkpoint: " + p.string() + " is missing or not a file");
  const auto size = std::filesystem::file_size(p, ec);
  if (ec || size > max)
    throw CheckpointError("xpipe: checkpoint: " + p.string() + " is larger than expected (" +
                          std::to_string(size) + " bytes)");
  std::vector<char> out(static_cast<std::size_t>(size));
  std::ifstream in(p, std::ios::binary);
  if (!in.read(out.data(), static_cast<std::streamsize>(out.size())))
    throw CheckpointError("xpipe: checkpoint: cannot read " + p.string());
  return out;
}
}  // namespace detail

//! A verified checkpoint: its folder, the run's fields and every file's bytes.
struct CheckpointContents {
  std::filesystem::path folder;
  std::map<std::string, std::string> fields;
  std::map<std::string, std::vector<char>> files;

  //! The field `key`; CheckpointError naming it and the MANIFEST when absent.
  const std::string& field(const std::string& key) const {
    const auto it = fields.find(key);
    if (it == fields.end())
      throw CheckpointError("xpipe: checkpoint " + (folder / "MANIFEST").string() + ": field '" +
                            key + "' is missing");
    return it->second;
  }
  //! The file `name`'s bytes; CheckpointError naming it when the MANIFEST does not list it.
  const std::vector<char>& file(const std::string& name) const {
    const auto it = files.find(name);
    if (it == files.end())
      throw CheckpointError("xpipe: checkpoint " + folder.string() + ": file '" + name +
                            "' is not in its MANIFEST");
    return it->second;
  }
};

//! Writes one checkpoint folder by the protocol above. Usage:
//!   `CheckpointWriter w(root, "ckpt-000003"); w.add_file("stage-0.bin", bytes);`
//!   `w.set_field("epoch", "3"); w.commit();`
//! Until commit() the folder has no MANIFEST and no reader accepts it.
class CheckpointWriter {
 public:
  CheckpointWriter(std::filesystem::path root, std::string name)
      : root_(std::move(root)), name_(std::move(name)), folder_(root_ / name_) {
    if (!detail::checkpoint_name_ok(name_))
      throw CheckpointError("xpipe: checkpoint: bad name '" + name_ +
                            "' (letters, digits, '.', '_' and '-' only)");
    std::error_code ec;
    std::filesystem::create_directories(root_, ec);
    if (ec || !std::filesystem::is_directory(root_))
      throw CheckpointError("xpipe: checkpoint: cannot create the folder " + root_.string() +
                            (ec ? ": " + ec.message() : ": a file of that name is in the way"));
    if (std::filesystem::exists(folder_ / "MANIFEST"))
      throw CheckpointError("xpipe: checkpoint: " + folder_.string() +
                            " already holds a checkpoint (a MANIFEST); it is not overwritten");
    std::filesystem::remove_all(folder_, ec);  // an earlier attempt that never committed
    if (!std::filesystem::create_directory(folder_, ec) || ec)
      throw CheckpointError("xpipe: checkpoint: cannot create " + folder_.string() +
                            (ec ? ": " + ec.message() : ""));
  }

  //! Writes file `name` (durably) and records its size and checksum for the MANIFEST.
  void add_file(const std::string& name, std::span<const char> bytes) {
    if (!detail::checkpoint_name_ok(name) || name == "MANIFEST" || files_.count(name))
      throw CheckpointError("xpipe: checkpoint: bad or repeated file name '" + name + "'");
    detail::write_durably(folder_ / name, bytes);
    files_[name] = {bytes.size(), detail::crc32_of(bytes)};
  }

  //! A field of the run (configuration, position); values are one line of text.
  void set_field(const std::string& key, const std::string& value) {
    if (!detail::checkpoint_name_ok(key) || value.find_first_of("\n\r") != std::string::npos)
      throw CheckpointError("xpipe: checkpoint: bad field '" + key + "' (a name of letters, " +
                            "digits, '.', '_', '-' and a one-line value)");
    fields_[key] = value;
  }

  //! Writes the MANIFEST (the commit point), syncs the folders and points `latest` at this
  //! checkpoint. Returns the checkpoint's folder.
  std::filesystem::path commit() {
    std::ostringstream m;
    m << "xpipe-checkpoint version=" << checkpoint_format_version << "\n";
    for (const auto& [name, f] : files_) {
      char crc[16];
      std::snprintf(crc, sizeof crc, "%08x", f.crc);
      m << "file " << name << " bytes=" << f.bytes << " crc32=" << crc << "\n";
    }
    for (const auto& [key, value] : fields_) m << "field " << key << " " << value << "\n";
    const std::string text = m.str();
    detail::write_durably(folder_ / "MANIFEST", text);
    detail::fsync_path(folder_, true);
    detail::fsync_path(root_, true);
    detail::write_durably(root_ / "latest", name_ + "\n");
    detail::fsync_path(root_, true);
    return folder_;
  }

 private:
  struct FileRecord {
    std::uint64_t bytes;
    std::uint32_t crc;
  };
  std::filesystem::path root_;
  std::string name_;
  std::filesystem::path folder_;
  std::map<std::string, FileRecord> files_;
  std::map<std::string, std::string> fields_;
};

//! What a MANIFEST says: the files it vouches for and the run's fields.
struct CheckpointManifest {
  struct File {
    std::string name;
    std::uint64_t bytes = 0;
    std::uint32_t crc32 = 0;
  };
  std::vector<File> files;
  std::map<std::string, std::string> fields;
};

//! Parses MANIFEST text, trusting nothing: the header and version, every name, size and
//! checksum token, no repeats. CheckpointError naming `where` and the line otherwise.
inline CheckpointManifest parse_checkpoint_manifest(const std::string& text,
                                                    const std::string& where) {
  std::istringstream in(text);
  auto fail = [&](int line, const std::string& what) {
    throw CheckpointError("xpipe: checkpoint " + where + ", line " + std::to_string(line) + ": " +
                          what);
  };
  CheckpointManifest out;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    std::istringstream ls(line);
    std::string kind;
    ls >> kind;
    if (n == 1) {
      if (kind != "xpipe-checkpoint") fail(n, "not an xpipe checkpoint MANIFEST");
      std::string version;
      ls >> version;
      if (version != "version=" + std::to_string(checkpoint_format_version))
        fail(n, "format '" + version +
                    "', this library reads version=" + std::to_string(checkpoint_format_version));
    } else if (kind == "file") {
      std::string name, bytes, crc;
      ls >> name >> bytes >> crc;
      const bool repeated = std::any_of(out.files.begin(), out.files.end(),
                                        [&](const auto& f) { return f.name == name; });
      if (!detail::checkpoint_name_ok(name) || name == "MANIFEST" || repeated)
        fail(n, "bad or repeated file name '" + name + "'");
      if (bytes.size() <= 6 || bytes.size() > 6 + 19 || bytes.rfind("bytes=", 0) != 0 ||
          bytes.find_first_not_of("0123456789", 6) != std::string::npos)
        fail(n, "bad size '" + bytes + "' of " + name);
      if (crc.size() != 6 + 8 || crc.rfind("crc32=", 0) != 0 ||
          crc.find_first_not_of("0123456789abcdef", 6) != std::string::npos)
        fail(n, "bad checksum '" + crc + "' of " + name);
      const std::uint64_t size = std::stoull(bytes.substr(6));
      if (size > checkpoint_max_file_bytes) fail(n, "size of " + name + " out of bounds");
      out.files.push_back(
          {name, size, static_cast<std::uint32_t>(std::stoul(crc.substr(6), nullptr, 16))});
    } else if (kind == "field") {
      std::string key;
      ls >> key;
      if (!detail::checkpoint_name_ok(key) || out.fields.count(key))
        fail(n, "bad or repeated field '" + key + "'");
      std::string value;
      std::getline(ls >> std::ws, value);
      out.fields.emplace(key, value);
    } else if (!kind.empty()) {
      fail(n, "unknown entry '" + kind + "'");
    }
  }
  if (n == 0) throw CheckpointError("xpipe: checkpoint " + where + " is empty");
  return out;
}

//! Reads checkpoint folder `folder` and verifies it: the MANIFEST (parse_checkpoint_manifest),
//! then every listed file's size and CRC-32. CheckpointError naming the file and field otherwise.
inline CheckpointContents read_checkpoint(const std::filesystem::path& folder) {
  const std::filesystem::path manifest_path = folder / "MANIFEST";
  const std::vector<char> raw = detail::read_file_bytes(manifest_path, 1 << 20);
  CheckpointManifest manifest =
      parse_checkpoint_manifest(std::string(raw.begin(), raw.end()), manifest_path.string());
  CheckpointContents out;
  out.folder = folder;
  out.fields = std::move(manifest.fields);
  for (const CheckpointManifest::File& f : manifest.files) {
    const std::filesystem::path path = folder / f.name;
    std::vector<char> data = detail::read_file_bytes(path, f.bytes);
    if (data.size() != f.bytes)
      throw CheckpointError("xpipe: checkpoint: " + path.string() + " has " +
                            std::to_string(data.size()) + " bytes, its MANIFEST says " +
                            std::to_string(f.bytes) + " (truncated)");
    if (detail::crc32_of(data) != f.crc32)
      throw CheckpointError("xpipe: checkpoint: " + path.string() +
                            " does not match its MANIFEST checksum (corrupt)");
    out.files.emplace(f.name, std::move(data));
  }
  return out;
}

//! What find_latest_checkpoint chose (verified), and the newer folders it passed over with the
//! reason for each.
struct CheckpointChoice {
  CheckpointContents contents;
  std::vector<std::string> skipped;
};

//! The newest checkpoint under `root` whose MANIFEST verifies: folders named <prefix><number>,
//! highest number first (`latest` is only a hint for people; a crash may leave it one behind).
//! std::nullopt when there is none (uncommitted folders do not count); CheckpointError when
//! every committed one fails to verify; `skipped` says why each newer folder was passed over.
inline std::optional<CheckpointChoice> find_latest_checkpoint(const std::filesystem::path& root,
                                                              const std::string& prefix = "ckpt-") {
  std::vector<std::pair<std::uint64_t, std::filesystem::path>> found;
  std::error_code ec;
  if (!std::filesystem::is_directory(root, ec)) return std::nullopt;
  for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || !e.is_directory()) continue;
    const std::string number = name.substr(prefix.size());
    if (number.empty() || number.size() > 18 ||
        number.find_first_not_of("0123456789") != std::string::npos)
      continue;
    found.emplace_back(std::stoull(number), e.path());
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  CheckpointChoice choice;
  int refused = 0;  // folders with a MANIFEST that does not verify
  for (const auto& [number, folder] : found) {
    // A folder without a MANIFEST is a write that never committed (killed part-way): passed
    // over, and no reason to refuse to start afresh when it is all there is.
    if (!std::filesystem::exists(folder / "MANIFEST", ec)) {
      choice.skipped.push_back(folder.string() + ": uncommitted (no MANIFEST; a write cut short)");
      continue;
    }
    try {
      choice.contents = read_checkpoint(folder);
      return choice;
    } catch (const CheckpointError& e) {
      choice.skipped.push_back(folder.string() + ": " + e.what());
      ++refused;
    }
  }
  if (refused == 0) return std::nullopt;
  throw CheckpointError("xpipe: checkpoint: no checkpoint under " + root.string() + " verifies; " +
                        std::to_string(refused) + " refused: " + join_names(choice.skipped));
}

}  // namespace xpipe
