// Helpers the test programs share: random inputs drawn in a fixed order from one seed, synthetic
// labelled data for pipelines, gzip'd IDX files, and reading outputs back. Free of Catch, so the
// plain test programs (test_alloc) use them too; failures throw, which Catch reports as the test
// failing.
#pragma once

#include <dirent.h>
#include <unistd.h>
#include <zlib.h>

#include <array>
#include <bit>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "xpipe/core/random.hpp"
#include "xpipe/core/tensor.hpp"
#include "xpipe/layers/activation.hpp"
#include "xpipe/pipeline/micro_batches.hpp"
#include "xpipe/schedule/generators.hpp"

namespace xpipe::test {

//! Uneven per-stage costs for make_schedule's costs argument: a slow stage 1, a cheap input
//! gradient on stage 0, weight gradients of four sizes. Fitted to them, zb-auto runs an order
//! of its own (neither ZB-H2's nor ZB-H1's at K = 4, M = 2 or 4), so the tests that loop over
//! schedule_names run it too; the other schedules ignore costs.
inline SplitBackwardCosts uneven_costs(int K) {
  SplitBackwardCosts c;
  for (int k = 0; k < K; ++k) {
    c.forward.push_back(k == 1 ? 2 : 1);
    c.input_grad.push_back(k == 0 ? .5 : k == 1 ? 2 : 1);
    c.weight_grad.push_back(std::array<double, 4>{.5, .5, 1, .25}[static_cast<std::size_t>(k % 4)]);
  }
  return c;
}

//! Bit for bit, the bitwise oracles' comparison: a NaN equals itself, -0 differs from 0, and
//! spans of different lengths differ. Usage: `REQUIRE(test::same_bits(split, fused));`,
//! `test::same_bits({a, n}, {b, n})`.
inline bool same_bits(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) return false;
  return true;
}
//! The first n floats of a and b, bit for bit.
inline bool same_bits(const float* a, const float* b, index_t n) {
  const auto size = static_cast<std::size_t>(n);
  return same_bits(std::span<const float>{a, size}, std::span<const float>{b, size});
}

//! Each v[i] = rng.uniform(lo, hi), in order: two fills from one Rng continue one sequence.
inline void fill_uniform(std::span<float> v, Rng& rng, float lo = -1.f, float hi = 1.f) {
  for (float& x : v) x = rng.uniform(lo, hi);
}

//! Each y[i] uniform in [0, classes), in order.
inline void fill_labels(std::span<std::int32_t> y, Rng& rng, int classes) {
  for (auto& v : y) v = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(classes)));
}

//! rows random samples of cols features in [-1, 1) and labels in [0, classes).
struct LabelledData {
  std::vector<float> x;
  std::vector<std::int32_t> y;
  index_t rows = 0, cols = 0;
  ConstMatrix features() const { return {x.data(), rows, cols}; }
  EpochData epoch() const { return {features(), y.data()}; }
};

//! The features first, then the labels, from one Rng seeded with seed.
inline LabelledData random_classification(index_t rows, index_t cols, int classes,
                                          std::uint64_t seed) {
  LabelledData d{std::vector<float>(static_cast<std::size_t>(rows * cols)),
                 std::vector<std::int32_t>(static_cast<std::size_t>(rows)), rows, cols};
  Rng rng{seed};
  fill_uniform(d.x, rng);
  fill_labels(d.y, rng, classes);
  return d;
}

//! How many times the regular expression `pattern` matches in text.
inline std::size_t count_matches(const std::string& text, const std::string& pattern) {
  const std::regex re(pattern);
  return static_cast<std::size_t>(
      std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}

//! The whole file; std::runtime_error naming it when it cannot be read.
inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  if (!in) throw std::runtime_error("test: cannot read " + p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

//! A fresh folder under the system's temporary directory, private to this process and tag.
inline std::filesystem::path scratch_dir(const std::string& tag) {
  const auto p = std::filesystem::temp_directory_path() /
                 ("xpipe_test_" + tag + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(p);
  return p;
}

//! Writes `bytes` gzip-compressed to `path`; std::runtime_error naming it on failure.
inline void write_gz(const std::filesystem::path& path, const std::vector<std::uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  if (f == nullptr) throw std::runtime_error("test: cannot write " + path.string());
  const bool ok = gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) ==
                  static_cast<int>(bytes.size());
  if (gzclose(f) != Z_OK || !ok) throw std::runtime_error("test: cannot write " + path.string());
}

//! An IDX file's bytes: magic 0x0000<type><dims>, the dimensions big-endian, then `data_bytes`
//! bytes of data 0, 1, ..., 9, 0, 1, ... (a header may declare more or less than follows).
inline std::vector<std::uint8_t> idx_bytes(std::uint8_t type, std::vector<std::uint32_t> dims,
                                           std::size_t data_bytes) {
  std::vector<std::uint8_t> b{0, 0, type, static_cast<std::uint8_t>(dims.size())};
  for (std::uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<std::uint8_t>(d >> s));
  for (std::size_t i = 0; i < data_bytes; ++i) b.push_back(static_cast<std::uint8_t>(i % 10));
  return b;
}

//! Threads of this process now (Linux: /proc/self/task), to check that a run joined its own.
inline int thread_count() {
  int n = 0;
  if (DIR* dir = opendir("/proc/self/task")) {
    while (const dirent* e = readdir(dir)) n += e->d_name[0] != '.';
    closedir(dir);
  }
  return n;
}

//! A width-preserving, parameter-free identity layer that first runs `Hook::on_forward()`: where
//! fault tests put what a stage does wrong (throw, stall, move a clock) inside a real pipeline.
template <class Hook>
struct HookedIdentity {
  static constexpr int in_width = any_width, out_width = any_width;
  static constexpr index_t param_count = 0;
  static void init(std::span<float>, std::uint64_t) {}
  static void forward(const HostContext& ctx, const float* p, ConstMatrix x, Matrix y) {
    Hook::on_forward();
    Activation<math::Identity>::forward(ctx, p, x, y);
  }
  static void backward(const HostContext& ctx, const float* p, float* g, bool acc, ConstMatrix x,
                       ConstMatrix y, ConstMatrix dy, Matrix dx) {
    Activation<math::Identity>::backward(ctx, p, g, acc, x, y, dy, dx);
  }
};

//! The (schedule, M) pairs the every-predictor oracles run over 4 stages: async 1F1B at M = 1
//! and 4, 2BW, the synchronous ones, the split backward and virtual stages.
inline const std::vector<std::pair<const char*, int>> oracle_schedules{
    {"async-1f1b", 1}, {"async-1f1b", 4},
    {"2bw", 4},        {"gpipe", 2},
    {"1f1b-flush", 4}, {"zb-h1", 4},
    {"async-zb", 2},   {"interleaved-1f1b", 4},
    {"dualpipev", 4},  {"async-interleaved", 1}};

}  // namespace xpipe::test
