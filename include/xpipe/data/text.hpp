// Byte-level text corpus for a small GPT: the fortunes of Debian's `fortunes` package, split by
// fortune into training and validation text and cut into sequences of one row per token.
//
// Why this corpus: it is real English prose (quotations, jokes, poems) shipped as a Debian
// package, in plain text files of a few MB (43 files, about 2.5 MB), so it installs with apt, needs
// no decompressor or parser, and a small model trains on it in minutes on 2 cores. The
// alternatives looked at: `dict-gcide` is dictionary entries in dictzip files of tens of MB, and
// `bible-kjv-text` keeps its text in its own compressed format.
//
// Rows: a sequence of T tokens is T consecutive rows, kept together by Dataset::group = T. Row
// width 2: column 0 the token id (a byte, 0..255), column 1 its position in the sequence
// (0..T-1), both as floats; the label is the id of the next byte of the text.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "xpipe/core/buffer.hpp"
#include "xpipe/core/config.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/data/dataset.hpp"

namespace xpipe {

//! The tokenizer's vocabulary: a token is one byte of the text, so a UTF-8 character outside
//! ASCII becomes two to four tokens.
inline constexpr int text_vocabulary = 256;

//! Where the text corpus is looked for when no directory is given: $XPIPE_TEXT_DIR if set and not
//! empty, else the directory Debian's `fortunes` package installs.
//! Usage: `const TextCorpus c = read_text_corpus(default_text_corpus_dir());`
inline std::string default_text_corpus_dir() {
  const char* env = std::getenv("XPIPE_TEXT_DIR");
  return env != nullptr && *env != '\0' ? env : "/usr/share/games/fortunes";
}

//! The corpus as training and validation text, with what it was made of (for logs and docs).
struct TextCorpus {
  std::string train;       // the training fortunes, concatenated in corpus order
  std::string validation;  // every tenth fortune (numbers 9, 19, 29, ...), likewise
  index_t files = 0;
  index_t train_fortunes = 0;
  index_t validation_fortunes = 0;
};

namespace detail {

//! The corpus files of dir in name order: regular files that are not symlinks (Debian's `*.u8`
//! links point at the plain files) and not `*.dat` (strfile's binary indexes).
inline std::vector<std::filesystem::path> text_corpus_files(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (st.type() == fs::file_type::not_found)
    throw DataError("xpipe: text corpus directory '" + dir +
                    "' does not exist (install Debian's `fortunes` package or set XPIPE_TEXT_DIR)");
  if (ec)  // a folder above it may not be searchable
    throw DataError("xpipe: text corpus directory '" + dir + "' cannot be read: " + ec.message());
  if (!fs::is_directory(st))
    throw DataError("xpipe: text corpus directory '" + dir + "' is not a directory");
  std::vector<fs::path> files;
  try {
    for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
      if (!e.is_regular_file() || e.is_symlink() || e.path().extension() == ".dat") continue;
      files.push_back(e.path());
    }
  } catch (const fs::filesystem_error& err) {
    throw DataError("xpipe: text corpus directory '" + dir +
                    "' cannot be read: " + err.code().message());
  }
  if (files.empty())
    throw DataError("xpipe: text corpus directory '" + dir +
                    "' holds no corpus files (regular files other than symlinks and *.dat)");
  // By the bytes of the name, not the locale: every machine reads the files in the same order.
  std::sort(files.begin(), files.end(), [](const fs::path& a, const fs::path& b) {
    return a.filename().string() < b.filename().string();
  });
  return files;
}

//! The bytes of one corpus file; DataError naming it if it cannot be read or is not text.
inline std::string read_text_file(const std::filesystem::path& path) {
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    throw DataError("xpipe: text corpus file '" + path.string() + "' cannot be read" +
                    (err != 0 ? ": " + std::generic_category().message(err) : std::string()));
  }
  std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad())
    throw DataError("xpipe: text corpus file '" + path.string() + "' cannot be read to its end");
  // Text has no NUL byte; a file with one is binary (a stray index, an archive, a damaged copy),
  // and its bytes would train the model on noise. A file with no `%` line is not rejected: it
  // is one fortune, which strfile accepts too.
  if (const std::size_t nul = bytes.find('\0'); nul != std::string::npos)
    throw DataError("xpipe: text corpus file '" + path.string() + "' is damaged: byte " +
                    std::to_string(nul) + " is NUL, so it is binary, not text");
  return bytes;
}

//! Calls f(fortune) for each fortune of a fortune file's text, in order: the text between lines
//! that are exactly "%", separators dropped, newlines kept. An empty piece (a leading separator,
//! two separators in a row, the separator that ends the file) holds no text and is no fortune.
template <class F>
void for_each_fortune(std::string_view text, F&& f) {
  std::size_t start = 0;  // where the current fortune begins
  std::size_t line = 0;   // where the line being looked at begins
  while (line < text.size()) {
    const std::size_t nl = text.find('\n', line);
    const std::size_t end = nl == std::string_view::npos ? text.size() : nl;
    const std::size_t next = nl == std::string_view::npos ? text.size() : nl + 1;
    if (text.substr(line, end - line) == "%") {
      if (line > start) f(text.substr(start, line - start));
      start = next;
    }
    line = next;
  }
  if (text.size() > start) f(text.substr(start));
}

}  // namespace detail

//! Reads the fortune files of dir (regular files that are not symlinks or `*.dat`, in file-name
//! order) and splits them by fortune: fortune i, counted over all files in that order, goes to
//! validation when i % 10 == 9, else to training. Whole fortunes, so no text is half in each
//! split; every tenth one, so validation draws from every file (the files are topics: art,
//! computers, food, ...) in the training set's proportions; fixed, with no seed, so every run on
//! every machine is validated on the same text.
//! Throws DataError naming the directory or file when the directory is missing, unreadable or
//! holds no corpus file, or a file cannot be read or holds a NUL byte.
//! Usage: `const TextCorpus c = read_text_corpus(); std::cout << c.train.size() << " bytes\n";`
inline TextCorpus read_text_corpus(const std::string& dir = default_text_corpus_dir()) {
  TextCorpus c;
  index_t fortune = 0;
  for (const auto& path : detail::text_corpus_files(dir)) {
    const std::string bytes = detail::read_text_file(path);
    detail::for_each_fortune(bytes, [&](std::string_view text) {
      const bool validation = fortune % 10 == 9;
      (validation ? c.validation : c.train).append(text);
      ++(validation ? c.validation_fortunes : c.train_fortunes);
      ++fortune;
    });
    ++c.files;
  }
  return c;
}

//! The non-overlapping sequences of `context` tokens in text: sequence s reads bytes
//! [s * T, s * T + T) and predicts bytes [s * T + 1, s * T + T], one row (id, position) per token,
//! as many whole sequences as fit ((size - 1) / T). `what` names the text in errors.
//! Throws ConfigError if context < 1, DataError if text is shorter than one sequence (T + 1).
//! Usage: `Dataset d = text_sequences(corpus.train, 64, "the training split");`
inline Dataset text_sequences(std::string_view text, int context, const std::string& what) {
  if (context < 1)
    throw ConfigError("xpipe: text sequences: context must be at least 1 token, got " +
                      std::to_string(context));
  const index_t t = context;
  const index_t size = static_cast<index_t>(text.size());
  if (size < t + 1)
    throw DataError("xpipe: " + what + " holds " + std::to_string(size) +
                    " bytes, fewer than one sequence of context " + std::to_string(t) + " needs (" +
                    std::to_string(t + 1) + ")");
  Dataset d;
  d.count = (size - 1) / t * t;
  d.width = 2;
  d.classes = text_vocabulary;
  d.group = t;
  d.features = HostBuffer<float>(d.count * d.width);
  d.labels.resize(static_cast<std::size_t>(d.count));
  // Row r of the dataset is byte r of the text: the windows do not overlap, so the sequences
  // tile the first count bytes.
  for (index_t r = 0; r < d.count; ++r) {
    d.features[r * 2] = static_cast<float>(static_cast<unsigned char>(text[r]));
    d.features[r * 2 + 1] = static_cast<float>(r % t);
    d.labels[static_cast<std::size_t>(r)] = static_cast<unsigned char>(text[r + 1]);
  }
  return d;
}

//! The text corpus of dir as sequences of `context` tokens: train from the training fortunes,
//! test from the validation ones (see read_text_corpus and text_sequences). classes = 256,
//! width = 2 (token id, position), group = context, count = sequences * context.
//! Throws ConfigError if context < 1; DataError as read_text_corpus does, and when a split is
//! shorter than one sequence, naming the split and both lengths.
//! Usage: `const DatasetPair d = load_text_corpus(64); index_t sequences = d.train.count / 64;`
inline DatasetPair load_text_corpus(int context,
                                    const std::string& dir = default_text_corpus_dir()) {
  if (context < 1)
    throw ConfigError("xpipe: load_text_corpus: context must be at least 1 token, got " +
                      std::to_string(context));
  const TextCorpus c = read_text_corpus(dir);
  DatasetPair p;
  p.train = text_sequences(c.train, context, "text corpus '" + dir + "': the training split");
  p.test = text_sequences(c.validation, context, "text corpus '" + dir + "': the validation split");
  return p;
}

}  // namespace xpipe
