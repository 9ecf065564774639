// Baselines measured in the same binary as the benchmark that divides by them: a STREAM-style
// triad through the library's own element loop, and raw dnnl_sgemm. Best of several timed runs.
#pragma once

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <tuple>

#include "xpipe/xpipe.hpp"

namespace bench {

//! Best seconds per call of f over `rounds` rounds of `calls` calls each.
template <class F>
double best_seconds(F&& f, int rounds = 15, int calls = 5) {
  f();  // warm caches and thread pools
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int c = 0; c < calls; ++c) f();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s / calls);
  }
  return best;
}

//! Triad a = b + s c over n floats per array on `threads` threads: bytes/s, counting 3 arrays
//! (12 bytes per element) as STREAM does.
inline double triad_bytes_per_second(xpipe::index_t n, int threads) {
  static std::map<std::pair<xpipe::index_t, int>, double> cache;
  const auto key = std::make_pair(n, threads);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  xpipe::HostBuffer<float> a(n), b(n), c(n);
  for (xpipe::index_t i = 0; i < n; ++i) b[i] = 1.f, c[i] = 2.f;
  const xpipe::HostContext ctx{.threads = threads};
  float* pa = a.data();
  const float* pb = b.data();
  const float* pc = c.data();
  const double s = best_seconds([&] {
    xpipe::for_each_index(ctx, n, [=](xpipe::index_t i) { pa[i] = pb[i] + 3.f * pc[i]; });
  });
  return cache[key] = 12.0 * static_cast<double>(n) / s;
}

//! Ratio of a memory-bound kernel's bytes/s to a triad's over the same footprint (`floats`
//! distinct floats), measured alternately, best of `rounds` each: both see the same machine
//! state (frequency, neighbours on the host, cache level), which a separately timed triad
//! on a shared VM does not.
template <class Kernel>
double paired_triad_ratio(Kernel&& kernel, double kernel_bytes, xpipe::index_t floats, int threads,
                          int rounds = 30) {
  const xpipe::index_t n = floats / 3;
  xpipe::HostBuffer<float> a(n), b(n), c(n);
  const xpipe::HostContext ctx{.threads = threads};
  float* pa = a.data();
  const float* pb = b.data();
  const float* pc = c.data();
  auto triad = [&] {
    xpipe::for_each_index(ctx, n, [=](xpipe::index_t i) { pa[i] = pb[i] + 3.f * pc[i]; });
  };
  double best_k = 1e30, best_t = 1e30;
  for (int r = 0; r < rounds; ++r) {
    best_k = std::min(best_k, best_seconds(kernel, 1, 3));
    best_t = std::min(best_t, best_seconds(triad, 1, 3));
  }
  return (kernel_bytes / best_k) / (12.0 * static_cast<double>(n) / best_t);
}

//! FLOP/s of a raw dnnl_sgemm call (row-major) on `threads` threads.
inline double dnnl_flops(char ta, char tb, long m, long n, long k, int threads) {
  static std::map<std::tuple<char, char, long, long, long, int>, double> cache;
  const auto key = std::make_tuple(ta, tb, m, n, k, threads);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  xpipe::HostBuffer<float> a(m * k), b(k * n), c(m * n);
  for (auto& v : a) v = 0.5f;
  for (auto& v : b) v = 0.25f;
  const long lda = ta == 'N' ? k : m, ldb = tb == 'N' ? n : k;
  omp_set_num_threads(threads);
  const double s = best_seconds(
      [&] { dnnl_sgemm(ta, tb, m, n, k, 1.f, a.data(), lda, b.data(), ldb, 0.f, c.data(), n); });
  return cache[key] = 2.0 * m * n * k / s;
}

}  // namespace bench
