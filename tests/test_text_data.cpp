// Text corpus loader (data/text.hpp): a tiny fortune corpus written here with its rows worked out
// by hand, the real Debian `fortunes` files checked against an independent reading, and errors.
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "support/support.hpp"
#include "xpipe/data/text.hpp"

namespace fs = std::filesystem;
using Catch::Contains;

namespace {

//! A scratch folder removed (with everything in it) when the test case leaves its scope.
struct ScratchDir {
  fs::path path;
  explicit ScratchDir(const std::string& tag) : path(xpipe::test::scratch_dir("text_" + tag)) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::permissions(path, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
};

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("test: cannot write " + p.string());
}

// The tiny corpus. Fortunes are numbered across both files in name order; numbers 9 and 19
// (i % 10 == 9) are validation. a_first holds fortunes 0..10, b_second 11..19:
//   a_first:  a leading separator and a doubled one (empty pieces: no fortunes), single-letter
//             fortunes "a\n" .. "k\n", fortune 9 = "j\n%j\n" (a line "%j" is text, not a separator)
//   b_second: "l\n" .. "s\n", then fortune 19 = "t\nT" with no final newline and no separator.
// Training text:   a\nb\nc\nd\ne\nf\ng\nh\ni\nk\nl\nm\nn\no\np\nq\nr\ns\n  (18 fortunes, 36 bytes)
// Validation text: j\n%j\nt\nT                                             (2 fortunes, 8 bytes)
// Beside them, files the reader must skip: an index a_first.dat (holding NUL bytes: reading it
// would throw), symlinks a_first.u8 and c_link to a_first (reading one would add fortunes) and a
// subdirectory with a fortune file in it.
void write_tiny_corpus(const fs::path& dir) {
  // b_second first, so that the directory's own order is not name order by accident.
  write_file(dir / "b_second", "l\n%\nm\n%\nn\n%\no\n%\np\n%\nq\n%\nr\n%\ns\n%\nt\nT");
  write_file(dir / "a_first",
             "%\na\n%\nb\n%\nc\n%\n%\nd\n%\ne\n%\nf\n%\ng\n%\nh\n%\ni\n%\nj\n%j\n%\nk\n%\n");
  write_file(dir / "a_first.dat", std::string("\0\0\0\2%\n%\nz\n", 10));
  fs::create_symlink("a_first", dir / "a_first.u8");
  fs::create_symlink("a_first", dir / "c_link");
  fs::create_directory(dir / "sub");
  write_file(dir / "sub" / "extra", "x\n%\ny\n");
}

// Byte values of the training text, written out: 'a' = 97 ... 's' = 115, '\n' = 10.
const std::vector<int> tiny_train = {97,  10, 98,  10, 99,  10, 100, 10, 101, 10, 102, 10,
                                     103, 10, 104, 10, 105, 10, 107, 10, 108, 10, 109, 10,
                                     110, 10, 111, 10, 112, 10, 113, 10, 114, 10, 115, 10};
// 'j' = 106, '\n' = 10, '%' = 37, 'j', '\n', 't' = 116, '\n', 'T' = 84.
const std::vector<int> tiny_validation = {106, 10, 37, 106, 10, 116, 10, 84};

std::vector<int> column(const xpipe::Dataset& d, int c) {
  std::vector<int> out;
  for (xpipe::index_t r = 0; r < d.count; ++r)
    out.push_back(static_cast<int>(d.features[r * d.width + c]));
  return out;
}

std::vector<int> labels(const xpipe::Dataset& d) {
  return {d.labels.begin(), d.labels.end()};
}

//! The message of the DataError that loading dir throws ("" if none), loaded as a user whom
//! permission bits bind: root reads every file, so under root a child process drops to `nobody`
//! first. std::nullopt if it cannot.
std::optional<std::string> load_error_unprivileged(const std::string& dir) {
  auto message = [&]() -> std::string {
    try {
      xpipe::load_text_corpus(4, dir);
      return "";
    } catch (const xpipe::DataError& e) {
      return e.what();
    } catch (const std::exception& e) {
      return std::string("not a DataError: ") + e.what();
    }
  };
  if (::geteuid() != 0) return message();
  int fds[2];
  if (::pipe(fds) != 0) return std::nullopt;
  const pid_t pid = ::fork();
  if (pid < 0) return std::nullopt;
  if (pid == 0) {
    ::close(fds[0]);
    const bool dropped = ::setgid(65534) == 0 && ::setuid(65534) == 0;
    const std::string m = dropped ? "=" + message() : "!";
    const bool sent = ::write(fds[1], m.data(), m.size()) == static_cast<ssize_t>(m.size());
    ::_exit(sent ? 0 : 1);
  }
  ::close(fds[1]);
  std::string out;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, buf + n);
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || out.empty() || out[0] != '=')
    return std::nullopt;
  return out.substr(1);
}

// Scoped XPIPE_TEXT_DIR, restored on exit.
struct EnvGuard {
  std::optional<std::string> saved;
  EnvGuard() {
    if (const char* v = std::getenv("XPIPE_TEXT_DIR")) saved = v;
  }
  ~EnvGuard() {
    if (saved)
      ::setenv("XPIPE_TEXT_DIR", saved->c_str(), 1);
    else
      ::unsetenv("XPIPE_TEXT_DIR");
  }
};

}  // namespace

TEST_CASE("text corpus: tiny corpus splits by fortune, rows worked out by hand", "[data][text]") {
  ScratchDir dir("tiny");
  write_tiny_corpus(dir.path);

  const xpipe::TextCorpus c = xpipe::read_text_corpus(dir.str());
  CHECK(c.files == 2);
  CHECK(c.train_fortunes == 18);
  CHECK(c.validation_fortunes == 2);
  CHECK(c.train == "a\nb\nc\nd\ne\nf\ng\nh\ni\nk\nl\nm\nn\no\np\nq\nr\ns\n");
  CHECK(c.validation == "j\n%j\nt\nT");

  SECTION("context 4: 8 training sequences (bytes 32..35 left over), 1 validation sequence") {
    const xpipe::DatasetPair d = xpipe::load_text_corpus(4, dir.str());
    const xpipe::Dataset& tr = d.train;
    CHECK(tr.count == 32);
    CHECK(tr.width == 2);
    CHECK(tr.classes == 256);
    CHECK(tr.group == 4);
    REQUIRE(tr.features.size() == 64);
    REQUIRE(tr.labels.size() == 32u);
    CHECK(column(tr, 0) == std::vector<int>(tiny_train.begin(), tiny_train.begin() + 32));
    CHECK(column(tr, 1) == std::vector<int>{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3,
                                            0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3});
    CHECK(labels(tr) == std::vector<int>(tiny_train.begin() + 1, tiny_train.begin() + 33));
    // Sequence 4 crosses from a_first into b_second and skips validation fortune 9 ("j"):
    // ids "i\nk\n" = 105 10 107 10, labels "\nk\nl" = 10 107 10 108.
    const std::vector<int> ids = column(tr, 0), next = labels(tr);
    CHECK(std::vector<int>(ids.begin() + 16, ids.begin() + 20) ==
          std::vector<int>{105, 10, 107, 10});
    CHECK(std::vector<int>(next.begin() + 16, next.begin() + 20) ==
          std::vector<int>{10, 107, 10, 108});

    const xpipe::Dataset& va = d.test;
    CHECK(va.count == 4);
    CHECK(va.group == 4);
    CHECK(va.classes == 256);
    CHECK(column(va, 0) == std::vector<int>{106, 10, 37, 106});
    CHECK(column(va, 1) == std::vector<int>{0, 1, 2, 3});
    CHECK(labels(va) == std::vector<int>{10, 37, 106, 10});
  }

  SECTION("context 5: 7 training sequences; the validation label crosses into b_second") {
    const xpipe::DatasetPair d = xpipe::load_text_corpus(5, dir.str());
    CHECK(d.train.count == 35);
    CHECK(d.train.group == 5);
    CHECK(column(d.train, 0) == std::vector<int>(tiny_train.begin(), tiny_train.begin() + 35));
    CHECK(labels(d.train) == std::vector<int>(tiny_train.begin() + 1, tiny_train.end()));
    CHECK(column(d.train, 1) == std::vector<int>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1,
                                                 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3,
                                                 4, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4});
    CHECK(d.test.count == 5);
    CHECK(column(d.test, 0) == std::vector<int>{106, 10, 37, 106, 10});
    CHECK(labels(d.test) == std::vector<int>{10, 37, 106, 10, 116});
  }

  SECTION("context 7: the 8-byte validation text is exactly one sequence") {
    const xpipe::DatasetPair d = xpipe::load_text_corpus(7, dir.str());
    CHECK(d.train.count == 35);  // (36 - 1) / 7 = 5 sequences
    CHECK(d.test.count == 7);
    CHECK(column(d.test, 0) ==
          std::vector<int>(tiny_validation.begin(), tiny_validation.end() - 1));
    CHECK(labels(d.test) == std::vector<int>(tiny_validation.begin() + 1, tiny_validation.end()));
  }
}

TEST_CASE("text corpus: files are read in byte order of their names", "[data][text]") {
  ScratchDir dir("order");
  // 'Z' (90) sorts before 'a' (97) by bytes, though after it in a dictionary. "alpha" ends in a
  // separator with no newline; "Zed" in two separators.
  write_file(dir.path / "alpha", "x\n%");
  write_file(dir.path / "Zed", "y\n%\n%\n");
  const xpipe::TextCorpus c = xpipe::read_text_corpus(dir.str());
  CHECK(c.files == 2);
  CHECK(c.train_fortunes == 2);
  CHECK(c.validation_fortunes == 0);
  CHECK(c.train == "y\nx\n");
  CHECK(c.validation.empty());
}

TEST_CASE("text corpus: the real Debian fortunes files", "[data][text]") {
  const fs::path real = "/usr/share/games/fortunes";
  // The corpus is a dependency (scripts/setup.sh installs it): missing, this test fails.
  REQUIRE(fs::is_directory(real));
  // An independent reading: plain files (no symlink, no .dat) in name order, line by line; a line
  // "%" ends a fortune; every fortune numbered i % 10 == 9 is validation.
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(real))
    if (fs::symlink_status(e.path()).type() == fs::file_type::regular &&
        e.path().extension() != ".dat")
      files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::uintmax_t file_bytes = 0, separator_bytes = 0;
  long fortunes = 0;
  std::string train, validation;
  for (const auto& f : files) {
    file_bytes += fs::file_size(f);
    std::ifstream in(f, std::ios::binary);
    REQUIRE(in);
    std::string fortune, line;
    auto finish = [&] {
      if (fortune.empty()) return;
      (fortunes % 10 == 9 ? validation : train) += fortune;
      ++fortunes;
      fortune.clear();
    };
    while (std::getline(in, line)) {
      const bool newline = !in.eof();  // getline hit the end of the file, not a '\n'
      if (line == "%") {
        separator_bytes += newline ? 2 : 1;
        finish();
      } else {
        fortune += line + (newline ? "\n" : "");
      }
    }
    finish();
  }
  INFO(files.size() << " files, " << fortunes << " fortunes, train " << train.size()
                    << " bytes, validation " << validation.size() << " bytes");
  REQUIRE(files.size() > 10);
  // Every byte of every file is fortune text or a separator line.
  CHECK(train.size() + validation.size() + separator_bytes == file_bytes);

  const xpipe::TextCorpus c = xpipe::read_text_corpus(real.string());
  CHECK(c.files == static_cast<xpipe::index_t>(files.size()));
  CHECK(c.train_fortunes + c.validation_fortunes == fortunes);
  CHECK(c.validation_fortunes == fortunes / 10);
  CHECK(c.train.size() == train.size());
  CHECK(c.validation.size() == validation.size());
  CHECK(c.train == train);
  CHECK(c.validation == validation);

  for (int t : {64, 128}) {
    INFO("context " << t);
    const xpipe::DatasetPair d = xpipe::load_text_corpus(t, real.string());
    for (const auto& [ds, text] : {std::pair{&d.train, &train}, std::pair{&d.test, &validation}}) {
      CHECK(ds->group == t);
      CHECK(ds->width == 2);
      CHECK(ds->classes == 256);
      const auto sequences = static_cast<xpipe::index_t>((text->size() - 1) / t);
      REQUIRE(ds->count == sequences * t);
      REQUIRE(ds->labels.size() == static_cast<std::size_t>(ds->count));
      xpipe::index_t bad = 0;
      for (xpipe::index_t r = 0; r < ds->count; ++r) {
        const float id = ds->features[r * 2], pos = ds->features[r * 2 + 1];
        const auto byte = [&](xpipe::index_t i) {
          return static_cast<int>(static_cast<unsigned char>((*text)[static_cast<std::size_t>(i)]));
        };
        bool ok = id == static_cast<float>(byte(r)) && pos == static_cast<float>(r % t) &&
                  ds->labels[static_cast<std::size_t>(r)] == byte(r + 1);
        // Within a sequence, a row's label is the next row's token.
        if (r % t != t - 1)
          ok = ok && static_cast<float>(ds->labels[static_cast<std::size_t>(r)]) ==
                         ds->features[(r + 1) * 2];
        bad += !ok;
      }
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("text corpus: XPIPE_TEXT_DIR chooses the default directory", "[data][text]") {
  EnvGuard guard;
  ScratchDir dir("env");
  write_tiny_corpus(dir.path);
  ::setenv("XPIPE_TEXT_DIR", dir.str().c_str(), 1);
  CHECK(xpipe::default_text_corpus_dir() == dir.str());
  const xpipe::DatasetPair d = xpipe::load_text_corpus(4);  // the default argument
  CHECK(d.train.count == 32);
  CHECK(d.test.count == 4);
  CHECK(xpipe::read_text_corpus().train_fortunes == 18);
  ::setenv("XPIPE_TEXT_DIR", "", 1);
  CHECK(xpipe::default_text_corpus_dir() == "/usr/share/games/fortunes");
  ::unsetenv("XPIPE_TEXT_DIR");
  CHECK(xpipe::default_text_corpus_dir() == "/usr/share/games/fortunes");
}

TEST_CASE("text corpus: errors name the path and what is wrong", "[data][text]") {
  ScratchDir dir("errors");
  const std::string d = dir.str();

  SECTION("context below 1") {
    write_tiny_corpus(dir.path);
    CHECK_THROWS_AS(xpipe::load_text_corpus(0, d), xpipe::ConfigError);
    CHECK_THROWS_WITH(xpipe::load_text_corpus(0, d),
                      Contains("context must be at least 1 token, got 0"));
    CHECK_THROWS_WITH(xpipe::load_text_corpus(-3, d), Contains("got -3"));
    // Before the directory is looked at: a bad context is reported, not a missing directory.
    CHECK_THROWS_AS(xpipe::load_text_corpus(0, d + "/missing"), xpipe::ConfigError);
    CHECK_THROWS_AS(xpipe::text_sequences("abc", 0, "text"), xpipe::ConfigError);
  }

  SECTION("missing directory") {
    const std::string missing = d + "/no_such_dir";
    CHECK_THROWS_AS(xpipe::load_text_corpus(4, missing), xpipe::DataError);
    CHECK_THROWS_WITH(xpipe::load_text_corpus(4, missing), Contains("'" + missing + "'") &&
                                                               Contains("does not exist") &&
                                                               Contains("XPIPE_TEXT_DIR"));
  }

  SECTION("a file where the directory should be") {
    write_file(dir.path / "plain", "a\n");
    CHECK_THROWS_WITH(xpipe::load_text_corpus(4, d + "/plain"),
                      Contains("'" + d + "/plain'") && Contains("is not a directory"));
  }

  SECTION("no corpus files: only an index, a symlink and a subdirectory") {
    CHECK_THROWS_WITH(xpipe::load_text_corpus(4, d),
                      Contains("'" + d + "'") && Contains("holds no corpus files"));
    write_file(dir.path / "x.dat", "a\n%\n");
    fs::create_symlink("x.dat", dir.path / "x");
    fs::create_directory(dir.path / "sub");
    CHECK_THROWS_AS(xpipe::load_text_corpus(4, d), xpipe::DataError);
    CHECK_THROWS_WITH(xpipe::load_text_corpus(4, d), Contains("holds no corpus files"));
  }

  SECTION("a file holding a NUL byte is damaged") {
    write_tiny_corpus(dir.path);
    write_file(dir.path / "bad", std::string("ok\n%\nx\0y\n", 9));
    CHECK_THROWS_AS(xpipe::load_text_corpus(4, d), xpipe::DataError);
    CHECK_THROWS_WITH(
        xpipe::load_text_corpus(4, d),
        Contains("'" + (dir.path / "bad").string() + "'") && Contains("is damaged: byte 6 is NUL"));
  }

  SECTION("a split shorter than one sequence names the split and both lengths") {
    write_tiny_corpus(dir.path);
    // Validation holds 8 bytes; context 8 needs 9.
    CHECK_THROWS_AS(xpipe::load_text_corpus(8, d), xpipe::DataError);
    CHECK_THROWS_WITH(xpipe::load_text_corpus(8, d),
                      Contains("'" + d + "'") && Contains("the validation split holds 8 bytes") &&
                          Contains("context 8 needs (9)"));
    // Training holds 36 bytes; context 40 needs 41.
    CHECK_THROWS_WITH(
        xpipe::load_text_corpus(40, d),
        Contains("the training split holds 36 bytes") && Contains("context 40 needs (41)"));
  }

  SECTION("an unreadable file and an unreadable directory") {
    write_tiny_corpus(dir.path);
    const fs::path locked = dir.path / "b_second";
    fs::permissions(locked, fs::perms::none);
    const auto file_error = load_error_unprivileged(d);
    fs::permissions(locked, fs::perms::owner_read | fs::perms::owner_write);
    const fs::path sub = dir.path / "sub";
    fs::permissions(sub, fs::perms::none);
    const auto dir_error = load_error_unprivileged(sub.string());
    const auto inner_error = load_error_unprivileged((sub / "inner").string());  // unsearchable
    fs::permissions(sub, fs::perms::owner_all);
    if (!file_error || !dir_error || !inner_error) {
      WARN("skipped: running as root and cannot drop to user nobody to test permissions");
      return;
    }
    CHECK_THAT(*file_error, Contains("'" + locked.string() + "'") &&
                                Contains("cannot be read: Permission denied"));
    CHECK_THAT(*dir_error,
               Contains("'" + sub.string() + "'") && Contains("cannot be read: Permission denied"));
    CHECK_THAT(*inner_error, Contains("'" + (sub / "inner").string() + "'") &&
                                 Contains("cannot be read: Permission denied"));
  }
}
