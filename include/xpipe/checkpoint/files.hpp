// The checkpoint file protocol: a folder of named binary files plus a MANIFEST holding the
// format version, each file's size and CRC-32, the run's key=value fields and, last, the CRC-32
// of the MANIFEST's own text. Written so that a crash (kill -9, power loss) at any moment leaves
// the previous checkpoint intact and the new one either complete or without a MANIFEST that
// verifies:
//   1. each file is written to a fresh <name>.tmp, fsync'd and renamed to <name>;
//   2. the MANIFEST last, the same way (its rename is the commit point), then the folder fsync'd;
//   3. the parent folder fsync'd (the new folder's entry), then `latest` replaced by rename.
// The reader trusts nothing: the MANIFEST's own checksum, version, every size and checksum, every
// name. A damaged checkpoint is set aside (renamed, never deleted) so its name can be written
// again.
// Over 400 lines on purpose: writer, reader, verification and the scan of a folder are one
// protocol whose invariants read in one place.
#pragma once

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "xpipe/core/error.hpp"

namespace xpipe {

//! The MANIFEST format this library writes: version 2, whose last line is the CRC-32 of the
//! text before it. It reads version 2 and version 1 (no such line: the previous release's
//! checkpoints still resume), and refuses every other version.
inline constexpr int checkpoint_format_version = 2;

//! The largest file a MANIFEST may list (a bound checked before allocating: 64 GiB).
inline constexpr std::uint64_t checkpoint_max_file_bytes = std::uint64_t{1} << 36;

namespace detail {
//! The oldest MANIFEST version read (checkpoint_format_version is the newest).
inline constexpr int checkpoint_oldest_read_version = 1;

//! The first token of a version-2 MANIFEST's last line; the CRC-32 of all before it follows.
inline constexpr std::string_view manifest_crc_tag = "manifest-crc32";

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

inline std::string hex8(std::uint32_t v) {
  char text[16];
  std::snprintf(text, sizeof text, "%08x", v);
  return text;
}

//! The whole of `s` as a number of type T by std::from_chars: decimal (or hex digits with base
//! 16, or a decimal float for a floating T), a '-' only for a signed T; no '+', "0x", spaces or
//! other junk around it. False when it is not such a number or does not fit T.
template <class T, class... Base>
bool parse_whole(std::string_view s, T& out, Base... base) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out, base...);
  return ec == std::errc{} && end == s.data() + s.size();
}

//! fsync of a file or a folder; CheckpointError naming it on failure.
inline void fsync_path(const std::filesystem::path& p, bool folder) {
  const int fd = ::open(p.c_str(), (folder ? (O_RDONLY | O_DIRECTORY) : O_RDONLY) | O_CLOEXEC);
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
  // A <path>.tmp already there is a crashed earlier write's, or planted: a symlink there would
  // be written through (its target truncated) by a plain O_CREAT|O_TRUNC open. unlink removes
  // the entry itself, never a link's target; the exclusive, no-follow create then guarantees we
  // write a new file of our own.
  if (::unlink(tmp.c_str()) != 0 && errno != ENOENT)
    throw CheckpointError("xpipe: checkpoint: cannot remove the stale " + tmp.string() + ": " +
                          errno_text());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
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
  const int synced = ::fsync(fd);
  const std::string why = synced != 0 ? errno_text() : "";
  if (::close(fd) != 0 || synced != 0)  // closed either way: no descriptor leaks on failure
    throw CheckpointError("xpipe: checkpoint: fsync/close of " + tmp.string() + ": " +
                          (synced != 0 ? why : errno_text()));
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
  if (ec)
    throw CheckpointError("xpipe: checkpoint: cannot tell the size of " + p.string() + ": " +
                          ec.message());
  if (size > max)
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
  //! The field `key` as a whole number in [lo, hi]: its whole value in decimal digits, with an
  //! optional leading '-' (no '+', hex, spaces or other junk). CheckpointError naming the
  //! MANIFEST, the field, its value and the range otherwise: a verified MANIFEST says only that
  //! the text is what was written, not that it is a number this run can use.
  //! Usage: `int copies = int(c.field_integer("result.weight_copies.0", 0, 1000));`
  long long field_integer(const std::string& key, long long lo, long long hi) const {
    const std::string& text = field(key);
    long long v = 0;
    if (!detail::parse_whole(text, v) || v < lo || v > hi)
      throw CheckpointError("xpipe: checkpoint " + (folder / "MANIFEST").string() + ": field '" +
                            key + "' is '" + text + "', not a whole number in [" +
                            std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return v;
  }
  //! The field `key` as a finite decimal number in [lo, hi] ("0.25", "-3", "1e3"; no hex, inf,
  //! nan, spaces or other junk, nor a value beyond a double's range such as "1e999").
  //! CheckpointError naming the MANIFEST, the field, its value and the range otherwise.
  //! Usage: `double kib = c.field_number("result.activation_kib.0", 0, 1e12);`
  double field_number(const std::string& key, double lo, double hi) const {
    const std::string& text = field(key);
    double v = 0;
    // from_chars takes "inf" and "nan" too: isfinite refuses them (and NaN fails any range).
    if (!detail::parse_whole(text, v) || !std::isfinite(v) || v < lo || v > hi)
      throw CheckpointError("xpipe: checkpoint " + (folder / "MANIFEST").string() + ": field '" +
                            key + "' is '" + text + "', not a finite decimal number in [" +
                            detail::number_text(lo) + ", " + detail::number_text(hi) + "]");
    return v;
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
    namespace fs = std::filesystem;
    if (!detail::checkpoint_name_ok(name_))
      throw CheckpointError("xpipe: checkpoint: bad name '" + name_ +
                            "' (letters, digits, '.', '_' and '-' only)");
    std::error_code ec;
    fs::create_directories(root_, ec);
    if (ec || !fs::is_directory(root_, ec))
      throw CheckpointError("xpipe: checkpoint: cannot create the folder " + root_.string() +
                            (ec ? ": " + ec.message() : ": a file of that name is in the way"));
    // Anything but a clear "no MANIFEST" keeps the folder: remove_all below must never reach a
    // committed checkpoint because its MANIFEST could not be looked at.
    const fs::file_status manifest = fs::symlink_status(folder_ / "MANIFEST", ec);
    if (manifest.type() != fs::file_type::not_found)
      throw CheckpointError(
          "xpipe: checkpoint: " + folder_.string() +
          (fs::status_known(manifest)
               ? " already holds a checkpoint (a MANIFEST); it is not overwritten (a damaged one "
                 "is moved out of the way by set_aside_checkpoint)"
               : ": cannot tell whether it holds a MANIFEST: " + ec.message()));
    fs::remove_all(folder_, ec);  // an earlier attempt that never committed
    if (!fs::create_directory(folder_, ec) || ec)
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
    for (const auto& [name, f] : files_)
      m << "file " << name << " bytes=" << f.bytes << " crc32=" << detail::hex8(f.crc) << "\n";
    for (const auto& [key, value] : fields_) m << "field " << key << " " << value << "\n";
    std::string text = m.str();
    text +=
        std::string(detail::manifest_crc_tag) + " " + detail::hex8(detail::crc32_of(text)) + "\n";
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

//! Parses MANIFEST text, trusting nothing: the header and version; for version 2 its last line
//! `manifest-crc32 xxxxxxxx`, checked against the CRC-32 of every byte before it before any other
//! line is believed; then every name, size and checksum token, no repeats, no carriage return.
//! CheckpointError naming `where` and the line otherwise.
//! Usage: `CheckpointManifest m = parse_checkpoint_manifest(text, "ckpt-000003/MANIFEST");`
inline CheckpointManifest parse_checkpoint_manifest(const std::string& text,
                                                    const std::string& where) {
  auto fail = [&](std::size_t line, const std::string& what) {
    throw CheckpointError("xpipe: checkpoint " + where + ", line " + std::to_string(line) + ": " +
                          what);
  };
  if (text.empty()) throw CheckpointError("xpipe: checkpoint " + where + " is empty");
  auto line_of = [&](std::size_t offset) {  // the 1-based line holding byte `offset`
    return 1 + static_cast<std::size_t>(std::count(text.data(), text.data() + offset, '\n'));
  };

  // The header first: it says whether a checksum line is due.
  int version = 0;
  {
    std::istringstream hs(text.substr(0, text.find('\n')));
    std::string kind, token;
    hs >> kind >> token;
    if (kind != "xpipe-checkpoint") fail(1, "not an xpipe checkpoint MANIFEST");
    std::vector<std::string> known;
    for (int v = detail::checkpoint_oldest_read_version; v <= checkpoint_format_version; ++v) {
      known.push_back("version=" + std::to_string(v));
      if (token == known.back()) version = v;
    }
    if (version == 0) fail(1, "format '" + token + "', this library reads " + join_names(known));
  }

  // Version 2: the last line vouches for every byte before it. A flipped bit in a value, or an
  // editor's CRLF line ends, would otherwise read as a deliberately changed field.
  std::size_t covered = text.size();  // the bytes whose lines are parsed below
  if (version >= 2) {
    const std::size_t end = text.back() == '\n' ? text.size() - 1 : text.size();
    const std::size_t cut = end == 0 ? std::string::npos : text.rfind('\n', end - 1);
    const std::size_t from = cut == std::string::npos ? 0 : cut + 1;  // the last line's start
    std::string_view last = std::string_view(text).substr(from, end - from);
    const bool cr = last.ends_with('\r');  // CRLF: reported as the mismatch it makes below
    if (cr) last.remove_suffix(1);
    const std::string_view tag = detail::manifest_crc_tag;
    const std::string_view hex = last.substr(std::min(last.size(), tag.size() + 1));
    std::uint32_t want = 0;
    if (from == 0 || last.size() != tag.size() + 1 + 8 || !last.starts_with(tag) ||
        last[tag.size()] != ' ' || hex.find_first_not_of("0123456789abcdef") != hex.npos ||
        !detail::parse_whole(hex, want, 16))
      fail(line_of(from),
           "no 'manifest-crc32 <8 hex digits>' line at its end (version 2 ends "
           "with the checksum of its own text: truncated, or edited?)");
    covered = from;
    if (detail::crc32_of(std::span<const char>(text.data(), covered)) != want)
      throw CheckpointError("xpipe: checkpoint " + where +
                            ": its text does not match its own checksum (manifest-crc32 " +
                            std::string(hex) +
                            "): corrupt, or edited (e.g. saved with CRLF line ends)");
    if (cr || end == text.size())
      fail(line_of(from), "the manifest-crc32 line does not end with one newline (LF)");
  }
  // The writer never writes a carriage return: one is an edit (CRLF line ends) that would
  // otherwise end up inside a field's value. Version 1 has only this check against it.
  if (const std::size_t cr = text.find('\r'); cr < covered)
    fail(line_of(cr), "a carriage return (CRLF line ends?): the text was edited");

  std::istringstream in(text.substr(0, covered));
  CheckpointManifest out;
  std::string line;
  std::size_t n = 0;
  while (std::getline(in, line)) {
    if (++n == 1) continue;  // the header, checked above
    std::istringstream ls(line);
    std::string kind;
    ls >> kind;
    if (kind == "file") {
      std::string name, bytes, crc, extra;
      ls >> name >> bytes >> crc >> extra;
      const bool repeated = std::any_of(out.files.begin(), out.files.end(),
                                        [&](const auto& f) { return f.name == name; });
      if (!detail::checkpoint_name_ok(name) || name == "MANIFEST" || repeated)
        fail(n, "bad or repeated file name '" + name + "'");
      std::uint64_t size = 0;
      if (bytes.size() > 6 + 19 || bytes.rfind("bytes=", 0) != 0 ||
          !detail::parse_whole(std::string_view(bytes).substr(6), size))
        fail(n, "bad size '" + bytes + "' of " + name);
      std::uint32_t sum = 0;
      if (crc.size() != 6 + 8 || crc.rfind("crc32=", 0) != 0 ||
          crc.find_first_not_of("0123456789abcdef", 6) != std::string::npos ||
          !detail::parse_whole(std::string_view(crc).substr(6), sum, 16))
        fail(n, "bad checksum '" + crc + "' of " + name);
      if (!extra.empty()) fail(n, "unexpected '" + extra + "' after the checksum of " + name);
      if (size > checkpoint_max_file_bytes) fail(n, "size of " + name + " out of bounds");
      out.files.push_back({name, size, sum});
    } else if (kind == "field") {
      std::string key;
      ls >> key;
      if (!detail::checkpoint_name_ok(key) || out.fields.count(key))
        fail(n, "bad or repeated field '" + key + "'");
      // The value is the rest of the line after the one space the writer puts there, exactly:
      // skipping more would lose a value's own leading spaces.
      if (ls.peek() == ' ') ls.get();
      std::string value;
      std::getline(ls, value);
      out.fields.emplace(key, value);
    } else if (kind == detail::manifest_crc_tag) {
      fail(n, version == 1 ? "a 'manifest-crc32' line in a version-1 MANIFEST (version 1 has "
                             "none: a version-2 MANIFEST whose version was edited?)"
                           : "a 'manifest-crc32' line before the last");
    } else if (!kind.empty()) {
      fail(n, "unknown entry '" + kind + "'");
    }
  }
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

//! What find_latest_checkpoint chose (verified), and the newer folders it passed over.
struct CheckpointChoice {
  CheckpointContents contents;
  //! Each newer folder passed over, with the reason ("<folder>: uncommitted ...").
  std::vector<std::string> skipped;
  //! The newer committed folders (with a MANIFEST) that failed to verify, newest first. A writer
  //! refuses their names until they are moved away: set_aside_checkpoint each before training
  //! over the epochs they held.
  std::vector<std::filesystem::path> refused;
};

//! What scan_checkpoints saw: the newest checkpoint that verifies, if any, and the newer folders
//! it passed over (CheckpointChoice's `skipped` and `refused`).
struct CheckpointScan {
  std::optional<CheckpointContents> newest;
  std::vector<std::string> skipped;
  std::vector<std::filesystem::path> refused;
};

//! Reads the folders named <prefix><number> under `root`, highest number first (`latest` is only
//! a hint for people; a crash may leave it one behind), up to the first whose MANIFEST verifies.
//! Damage is never an error here: a caller that goes on when every checkpoint is refused (sets
//! them aside and starts afresh) reads `refused`. CheckpointError only when `root` cannot be
//! looked at or listed. Usage: `auto scan = scan_checkpoints("ckpts"); if (scan.newest) ...`
inline CheckpointScan scan_checkpoints(const std::filesystem::path& root,
                                       const std::string& prefix = "ckpt-") {
  namespace fs = std::filesystem;
  struct Found {
    std::uint64_t number;
    fs::path folder;
    std::string unknown;  // why its type could not be told, if it could not
  };
  std::vector<Found> found;
  std::error_code ec;
  const fs::file_status root_status = fs::status(root, ec);
  if (!fs::status_known(root_status))
    throw CheckpointError("xpipe: checkpoint: cannot look at " + root.string() + ": " +
                          ec.message());
  if (!fs::is_directory(root_status)) return {};  // missing: nothing saved yet
  // error_code overloads throughout: an entry that cannot be looked at (a symlink loop, no
  // permission) must be passed over or reported as a CheckpointError, not escape as a
  // std::filesystem_error from the iteration.
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    std::uint64_t number = 0;
    if (digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos ||
        !detail::parse_whole(digits, number))
      continue;
    std::error_code type_ec;  // not_found (a dangling link) is known: not a folder
    const fs::file_status type = it->status(type_ec);
    if (!fs::status_known(type))
      found.push_back({number, it->path(), type_ec.message()});
    else if (fs::is_directory(type))
      found.push_back({number, it->path(), ""});
  }
  if (ec)
    throw CheckpointError("xpipe: checkpoint: cannot list " + root.string() + ": " + ec.message());
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.number > b.number; });
  CheckpointScan scan;
  for (const Found& f : found) {
    if (!f.unknown.empty()) {
      scan.skipped.push_back(f.folder.string() + ": cannot tell whether it is a folder (" +
                             f.unknown + ")");
      continue;
    }
    // A folder without a MANIFEST is a write that never committed (killed part-way): passed
    // over, and no reason to refuse to start afresh when it is all there is. Anything else at
    // that name (even one that cannot be looked at) is a commit, to verify.
    if (fs::symlink_status(f.folder / "MANIFEST", ec).type() == fs::file_type::not_found) {
      scan.skipped.push_back(f.folder.string() + ": uncommitted (no MANIFEST; a write cut short)");
      continue;
    }
    try {
      scan.newest = read_checkpoint(f.folder);
      return scan;
    } catch (const CheckpointError& e) {
      scan.skipped.push_back(f.folder.string() + ": " + e.what());
      scan.refused.push_back(f.folder);
    }
  }
  return scan;
}

//! The newest checkpoint under `root` whose MANIFEST verifies (scan_checkpoints). std::nullopt
//! when there is none (uncommitted folders do not count); CheckpointError when every committed
//! one fails to verify, or `root` cannot be listed; `skipped` says why each newer folder was
//! passed over and `refused` lists the committed ones among them.
//! Usage: `if (auto c = find_latest_checkpoint("ckpts")) load_checkpoint(pipe, c->contents);`
inline std::optional<CheckpointChoice> find_latest_checkpoint(const std::filesystem::path& root,
                                                              const std::string& prefix = "ckpt-") {
  CheckpointScan scan = scan_checkpoints(root, prefix);
  if (scan.newest)
    return CheckpointChoice{std::move(*scan.newest), std::move(scan.skipped),
                            std::move(scan.refused)};
  if (scan.refused.empty()) return std::nullopt;
  throw CheckpointError("xpipe: checkpoint: no checkpoint under " + root.string() + " verifies; " +
                        std::to_string(scan.refused.size()) +
                        " refused: " + join_names(scan.skipped));
}

//! Moves a refused checkpoint folder (CheckpointChoice::refused) out of the way, so that a
//! checkpoint of the same name can be written again: renames `folder` to `<name>.refused`, or
//! `<name>.refused-2`, `-3`, ... when that is taken, and syncs the parent folder. The new name
//! is no `<prefix><number>`, so find_latest_checkpoint never chooses it; nothing is deleted,
//! the damaged bytes stay for a person to inspect. Returns the new path; CheckpointError naming
//! both paths when the rename fails.
//! Usage: `for (const auto& f : choice->refused) set_aside_checkpoint(f);`
inline std::filesystem::path set_aside_checkpoint(const std::filesystem::path& folder) {
  namespace fs = std::filesystem;
  const fs::path from = folder.has_filename() ? folder : folder.parent_path();  // "ckpt-2/"
  const std::string name = from.filename().string();
  if (name.empty() || name == "." || name == "..")
    throw CheckpointError("xpipe: checkpoint: cannot set aside '" + folder.string() +
                          "': not a folder's name");
  std::error_code ec;
  if (fs::symlink_status(from, ec).type() == fs::file_type::not_found)
    throw CheckpointError("xpipe: checkpoint: cannot set aside " + from.string() +
                          ": it does not exist");
  const fs::path parent = from.parent_path();
  constexpr int most = 1000;
  for (int k = 1; k <= most; ++k) {
    fs::path to = parent / (name + ".refused" + (k == 1 ? "" : "-" + std::to_string(k)));
    const fs::file_status there = fs::symlink_status(to, ec);
    if (!fs::status_known(there))
      throw CheckpointError("xpipe: checkpoint: cannot set aside " + from.string() + " as " +
                            to.string() + ": " + ec.message());
    if (there.type() != fs::file_type::not_found) continue;  // an earlier one set aside
    if (std::rename(from.c_str(), to.c_str()) == 0) {
      detail::fsync_path(parent.empty() ? fs::path(".") : parent, true);
      return to;
    }
    // Taken between the look and the rename (rename replaces only an empty folder): next name.
    if (errno == EEXIST || errno == ENOTEMPTY) continue;
    throw CheckpointError("xpipe: checkpoint: cannot set aside " + from.string() + " as " +
                          to.string() + ": " + detail::errno_text());
  }
  throw CheckpointError("xpipe: checkpoint: cannot set aside " + from.string() + ": " + name +
                        ".refused to " + name + ".refused-" + std::to_string(most) +
                        " are all taken");
}

}  // namespace xpipe
