// Baselines measured in the same binary as the benchmark that divides by them: a STREAM-style
// triad through the library's own element loop, raw dnnl_sgemm, and oneDNN's convolution
// primitives alone. Best of several timed runs.
#pragma once

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <unordered_map>
#include <vector>

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

// oneDNN's three convolution primitives on one geometry, made with its C++ API and run through
// its argument maps: the baseline a user of oneDNN alone would write: direct kernels on
// channels-last activations as the layer's, weights in oneDNN's choice (format_tag::any).
// `best` takes Winograd's kernels in each direction where oneDNN offers them and lets it choose
// the activations' layout too. Operands are made in their layouts once, outside the timing.
class OneDnnConv {
 public:
  OneDnnConv(const xpipe::ConvGeometry& g, bool best)
      : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {
    using tag = dnnl::memory::format_tag;
    using md = dnnl::memory::desc;
    const auto f32 = dnnl::memory::data_type::f32;
    // Weights always in oneDNN's choice: on fixed OIHW weights it has only its reference kernel
    // (hundreds of times slower), and the layer reorders its few weights per call into that choice.
    const tag act = best ? tag::any : tag::nhwc, wt = tag::any;
    // A zero descriptor where the layer has no bias (oneDNN's way of saying none).
    const md src({g.rows, g.c, g.h, g.w}, f32, act), weights({g.oc, g.c, g.k, g.k}, f32, wt),
        bias = g.bias ? md({g.oc}, f32, tag::x) : md(), dst({g.rows, g.oc, g.oh, g.ow}, f32, act);
    const dnnl::memory::dims s{g.stride, g.stride}, p{g.pad, g.pad};
    // Winograd where oneDNN makes the primitive (it throws where it has none), else direct.
    const auto first_of = [&](auto make) {
      if (best) try {
          return make(dnnl::algorithm::convolution_winograd);
        } catch (const dnnl::error&) {
        }
      return make(dnnl::algorithm::convolution_direct);
    };
    const auto fpd = first_of([&](dnnl::algorithm a) {
      return dnnl::convolution_forward::primitive_desc(
          {dnnl::prop_kind::forward_training, a, src, weights, bias, dst, s, p, p}, engine_);
    });
    const auto dpd = first_of([&](dnnl::algorithm a) {
      return dnnl::convolution_backward_data::primitive_desc({a, src, weights, dst, s, p, p},
                                                             engine_, fpd);
    });
    const auto wpd = first_of([&](dnnl::algorithm a) {
      return dnnl::convolution_backward_weights::primitive_desc(
          {a, src, weights, bias, dst, s, p, p}, engine_, fpd);
    });
    const auto mem = [&](const md& d) {
      auto m = dnnl::memory(d, engine_);
      std::vector<float> ones(d.get_size() / sizeof(float), 0.01f);
      std::memcpy(m.get_data_handle(), ones.data(), d.get_size());
      return m;
    };
    fwd_ = dnnl::convolution_forward(fpd);
    bwd_data_ = dnnl::convolution_backward_data(dpd);
    bwd_weights_ = dnnl::convolution_backward_weights(wpd);
    fwd_args_ = {{DNNL_ARG_SRC, mem(fpd.src_desc())},
                 {DNNL_ARG_WEIGHTS, mem(fpd.weights_desc())},
                 {DNNL_ARG_DST, mem(fpd.dst_desc())}};
    data_args_ = {{DNNL_ARG_DIFF_SRC, mem(dpd.diff_src_desc())},
                  {DNNL_ARG_WEIGHTS, mem(dpd.weights_desc())},
                  {DNNL_ARG_DIFF_DST, mem(dpd.diff_dst_desc())}};
    weights_args_ = {{DNNL_ARG_SRC, mem(wpd.src_desc())},
                     {DNNL_ARG_DIFF_DST, mem(wpd.diff_dst_desc())},
                     {DNNL_ARG_DIFF_WEIGHTS, mem(wpd.diff_weights_desc())}};
    if (g.bias) {
      fwd_args_.insert({DNNL_ARG_BIAS, mem(fpd.bias_desc())});
      weights_args_.insert({DNNL_ARG_DIFF_BIAS, mem(wpd.diff_bias_desc())});
    }
  }
  //! Forward, backward data (unless `data` is false: a network's first layer needs none) and
  //! backward weights, once each.
  void step(int threads, bool data = true) {
    omp_set_num_threads(threads);
    fwd_.execute(stream_, fwd_args_);
    if (data) bwd_data_.execute(stream_, data_args_);
    bwd_weights_.execute(stream_, weights_args_);
    stream_.wait();
  }

 private:
  dnnl::engine engine_;
  dnnl::stream stream_;
  dnnl::primitive fwd_, bwd_data_, bwd_weights_;
  std::unordered_map<int, dnnl::memory> fwd_args_, data_args_, weights_args_;
};

}  // namespace bench
