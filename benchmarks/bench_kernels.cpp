// Hot kernels of a training step: GEMM at the MLP's shapes (against raw dnnl_sgemm), the fused
// optimizer and update-direction passes, bias+activation, activation backward, the bias
// gradient and BatchNorm's passes, alone and fused with ReLU (against a triad over the same
// number of elements per array). Arguments: .../threads.
#include <benchmark/benchmark.h>

#include <functional>
#include <type_traits>

#include "baseline.hpp"
#include "xpipe/xpipe.hpp"

namespace {

using xpipe::index_t;
const index_t params = xpipe::models::FashionMlp::param_count;

// bytes/s (bytes actually moved: arrays read + arrays written, 4 bytes per float), and vs_triad:
// that rate over a triad's with the same footprint (`arrays` distinct arrays of n floats) on the
// same threads, the two timed alternately after the benchmark loop (bench::paired_triad_ratio).
template <class Kernel>
void bandwidth_counters(benchmark::State& st, Kernel&& kernel, double bytes_per_iter, index_t n,
                        int arrays, int threads) {
  st.SetBytesProcessed(static_cast<int64_t>(bytes_per_iter * static_cast<double>(st.iterations())));
  st.counters["vs_triad"] = bench::paired_triad_ratio(kernel, bytes_per_iter, n * arrays, threads);
}

struct FlatBuffers {
  xpipe::HostBuffer<float> w, g, m, v, d;
  explicit FlatBuffers(index_t n) : w(n), g(n), m(n), v(n), d(n) {
    xpipe::Rng rng{1};
    for (index_t i = 0; i < n; ++i) {
      w[i] = rng.uniform(-1.f, 1.f);
      g[i] = rng.uniform(-1e-2f, 1e-2f);
      m[i] = g[i];
      v[i] = g[i] * g[i];
    }
  }
};

// Each pass: bytes actually moved = arrays read + arrays written, 4 bytes each.
void BM_AdamStep(benchmark::State& st) {
  const int threads = static_cast<int>(st.range(0));
  const xpipe::HostContext ctx{.threads = threads};
  xpipe::ScopedFlushDenormals ftz;
  FlatBuffers b(params);
  const auto s = xpipe::math::adam_scalars(1e-3f, 0.9f, 0.999f, 1e-8f, 0.f, false, 100);
  auto kernel = [&] {
    xpipe::adam_step(ctx, b.w.data(), b.g.data(), b.m.data(), b.v.data(), params, s);
  };
  for (auto _ : st) kernel();
  bandwidth_counters(st, kernel, 7.0 * 4 * params, params, 4,
                     threads);  // read w g m v, write w m v
}

void BM_SgdStep(benchmark::State& st) {
  const int threads = static_cast<int>(st.range(0));
  const xpipe::HostContext ctx{.threads = threads};
  FlatBuffers b(params);
  const xpipe::math::SgdScalars s{0.1f, 0.9f, 0.f, 0.f, false, false};
  auto kernel = [&] { xpipe::sgd_step(ctx, b.w.data(), b.g.data(), b.m.data(), params, s); };
  for (auto _ : st) kernel();
  bandwidth_counters(st, kernel, 5.0 * 4 * params, params, 3, threads);  // read w g m, write w m
}

void BM_AdamDirection(benchmark::State& st) {
  const int threads = static_cast<int>(st.range(0));
  const xpipe::HostContext ctx{.threads = threads};
  FlatBuffers b(params);
  const auto s = xpipe::math::adam_scalars(1e-3f, 0.9f, 0.999f, 1e-8f, 0.f, false, 100);
  auto kernel = [&] { xpipe::adam_direction(ctx, b.m.data(), b.v.data(), b.d.data(), params, s); };
  for (auto _ : st) kernel();
  bandwidth_counters(st, kernel, 3.0 * 4 * params, params, 3, threads);  // read m v, write d
}

void BM_SgdDirection(benchmark::State& st) {
  const int threads = static_cast<int>(st.range(0));
  const xpipe::HostContext ctx{.threads = threads};
  FlatBuffers b(params);
  auto kernel = [&] { xpipe::sgd_direction(ctx, b.m.data(), b.d.data(), params); };
  for (auto _ : st) kernel();
  bandwidth_counters(st, kernel, 2.0 * 4 * params, params, 2, threads);  // read m, write d
}

// Bias + ReLU in place over a batch x 1024 activation, as Linear's epilogue runs it; rows = 128
// (a training batch, cache-resident) or 4096 (beyond the caches).
void BM_BiasRelu(benchmark::State& st) {
  const index_t rows = st.range(0);
  const int threads = static_cast<int>(st.range(1));
  const index_t n = rows * 1024;
  const xpipe::HostContext ctx{.threads = threads};
  FlatBuffers b(n);
  const xpipe::Matrix z{b.w.data(), rows, 1024}, y = z;
  auto kernel = [&] { xpipe::bias_activation_forward<xpipe::math::Relu>(ctx, z, b.g.data(), y); };
  for (auto _ : st) kernel();
  bandwidth_counters(st, kernel, 2.0 * 4 * n, n, 1, threads);  // read z, write it back
}

void BM_ReluBackward(benchmark::State& st) {
  const index_t rows = st.range(0);
  const int threads = static_cast<int>(st.range(1));
  const index_t n = rows * 1024;
  const xpipe::HostContext ctx{.threads = threads};
  FlatBuffers b(n);
  const xpipe::Matrix x{b.w.data(), rows, 1024}, dy{b.g.data(), rows, 1024},
      dx{b.d.data(), rows, 1024};
  auto kernel = [&] { xpipe::activation_backward<xpipe::math::Relu>(ctx, x, x, dy, dx); };
  for (auto _ : st) kernel();
  bandwidth_counters(st, kernel, 3.0 * 4 * n, n, 3, threads);  // read x dy, write dx
}

// Bias gradient (column sums) of a batch x 1024 output gradient, as Linear's backward runs it.
void BM_BiasGrad(benchmark::State& st) {
  const index_t rows = st.range(0);
  const int threads = static_cast<int>(st.range(1));
  const index_t n = rows * 1024;
  const xpipe::HostContext ctx{.threads = threads};
  FlatBuffers b(n);
  const xpipe::ConstMatrix dy{b.g.data(), rows, 1024};
  auto kernel = [&] { xpipe::bias_grad(ctx, dy, b.d.data(), false); };
  for (auto _ : st) kernel();
  bandwidth_counters(st, kernel, 4.0 * n, n, 1, threads);  // read dy (db is 1024 floats)
}

// BatchNorm2d's passes over a ResNet activation (batch 128, channels-last C x H x H images),
// each against a triad of its footprint: the training statistics (x read twice: the channel
// sums of x, then of the squared deviations), the normalisation (x read, y written), the
// backward's channel sums (x and dy read) and its input gradient (x and dy read, dx written).
struct NormBuffers {
  xpipe::NormGeometry g;
  index_t n;
  xpipe::HostBuffer<float> x, y, dy, dx, params, stats, sums, running;
  xpipe::HostBuffer<double> scratch;
  NormBuffers(int channels, int side)
      : g{128, channels, side * side},
        n(g.rows * channels * side * side),
        x(n),
        y(n),
        dy(n),
        dx(n),
        params(2 * channels),
        stats(2 * channels),
        sums(2 * channels),
        running(2 * channels),
        scratch(xpipe::batch_norm_scratch_doubles(g)) {
    xpipe::Rng rng{3};
    for (index_t i = 0; i < n; ++i) {
      x[i] = rng.uniform(-1.f, 2.f);
      dy[i] = rng.uniform(-1e-2f, 1e-2f);
    }
    for (int c = 0; c < channels; ++c) {
      params[c] = 1.f;
      params[channels + c] = 0.f;
      running[c] = 0.f;
      running[channels + c] = 1.f;
    }
  }
  xpipe::ConstMatrix in(const xpipe::HostBuffer<float>& b) const {
    return {b.data(), g.rows, static_cast<index_t>(g.channels) * g.plane};
  }
  xpipe::Matrix out(xpipe::HostBuffer<float>& b) const {
    return {b.data(), g.rows, static_cast<index_t>(g.channels) * g.plane};
  }
};

enum class NormPass { Statistics, Forward, BackwardSums, BackwardInput };

// Act: math::Identity, or math::Relu fused after the normalisation (BatchNormAct), whose backward
// passes make ReLU's input again from x (the forward's gamma and beta, here the same as the
// backward's): the same arrays read, more arithmetic.
template <class Act>
void norm_pass(benchmark::State& st) {
  const auto pass = static_cast<NormPass>(st.range(0));
  const int channels = static_cast<int>(st.range(1)), side = 448 / channels;
  const int threads = static_cast<int>(st.range(2));
  const xpipe::HostContext ctx{.threads = threads};
  const xpipe::ScopedFlushDenormals flush;  // as each training thread runs
  NormBuffers b(channels, side);
  const auto& g = b.g;
  xpipe::batch_norm_statistics(ctx, g, b.in(b.x), b.stats.data(), nullptr, b.scratch.data());
  const float* gamma = b.params.data();
  xpipe::batch_norm_forward<Act>(ctx, g, b.in(b.x), b.out(b.y), gamma, gamma + channels,
                                 b.stats.data());
  xpipe::batch_norm_backward_sums<Act>(ctx, g, b.in(b.x), b.in(b.dy), b.stats.data(), gamma,
                                       b.sums.data(), nullptr, nullptr, false, b.scratch.data());
  std::function<void()> kernel;
  int arrays = 0;  // floats moved per element: reads + writes, each a distinct array
  switch (pass) {
    case NormPass::Statistics:  // x read twice, one array
      kernel = [&] {
        xpipe::batch_norm_statistics(ctx, g, b.in(b.x), b.stats.data(), b.running.data(),
                                     b.scratch.data());
      };
      arrays = 1;
      break;
    case NormPass::Forward:
      kernel = [&] {
        xpipe::batch_norm_forward<Act>(ctx, g, b.in(b.x), b.out(b.y), gamma, gamma + channels,
                                       b.stats.data());
      };
      arrays = 2;
      break;
    case NormPass::BackwardSums:
      kernel = [&] {
        xpipe::batch_norm_backward_sums<Act>(ctx, g, b.in(b.x), b.in(b.dy), b.stats.data(), gamma,
                                             b.sums.data(), nullptr, nullptr, false,
                                             b.scratch.data());
      };
      arrays = 2;
      break;
    case NormPass::BackwardInput:
      kernel = [&] {
        xpipe::batch_norm_input_grad<Act>(ctx, g, b.in(b.x), b.in(b.dy), b.out(b.dx), gamma,
                                          b.stats.data(), gamma, b.sums.data());
      };
      arrays = 3;
      break;
  }
  for (auto _ : st) kernel();
  const double moved = pass == NormPass::Statistics ? 2 : arrays;
  bandwidth_counters(st, kernel, moved * 4.0 * static_cast<double>(b.n), b.n, arrays, threads);
}

void BM_BatchNorm(benchmark::State& st) {
  norm_pass<xpipe::math::Identity>(st);
}
void BM_BatchNormRelu(benchmark::State& st) {
  norm_pass<xpipe::math::Relu>(st);
}

void norm_passes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"pass", "channels", "threads"});
  for (int t : {1, 2})
    for (int c : {16, 64})
      for (int p = 0; p < 4; ++p) b->Args({p, c, t});
}

void fused_norm_passes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"pass", "channels", "threads"});
  for (int t : {1, 2})
    for (int c : {16, 64})
      for (int p = 1; p < 4; ++p) b->Args({p, c, t});
}

// xpipe::gemm at the MLP's shapes (batch 128) against raw dnnl_sgemm in this binary.
void BM_Gemm(benchmark::State& st) {
  const char ta = static_cast<char>(st.range(0)), tb = static_cast<char>(st.range(1));
  const long m = st.range(2), n = st.range(3), k = st.range(4);
  const int threads = static_cast<int>(st.range(5));
  const xpipe::HostContext ctx{.threads = threads};
  xpipe::HostBuffer<float> a(m * k), b(k * n), c(m * n);
  for (auto& v : a) v = 0.5f;
  for (auto& v : b) v = 0.25f;
  const long lda = ta == 'N' ? k : m, ldb = tb == 'N' ? n : k;
  for (auto _ : st)
    xpipe::gemm(ctx, xpipe::Trans{ta}, xpipe::Trans{tb}, m, n, k, 1.f, a.data(), lda, b.data(), ldb,
                0.f, c.data(), n);
  const double flop = 2.0 * m * n * k;
  st.counters["FLOP/s"] = benchmark::Counter(flop * st.iterations(), benchmark::Counter::kIsRate);
  st.counters["vs_dnnl"] =
      benchmark::Counter(flop * st.iterations() / bench::dnnl_flops(ta, tb, m, n, k, threads),
                         benchmark::Counter::kIsRate);
}

void gemm_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"ta", "tb", "m", "n", "k", "threads"});
  for (int t : {1, 2}) {
    b->Args({'N', 'N', 128, 1024, 784, t});   // layer 1 forward
    b->Args({'N', 'N', 128, 1024, 1024, t});  // layers 2-3 forward
    b->Args({'N', 'N', 128, 10, 1024, t});    // layer 4 forward
    b->Args({'T', 'N', 1024, 1024, 128, t});  // weight gradient x^T dy
    b->Args({'N', 'T', 128, 1024, 1024, t});  // input gradient dy W^T
  }
}

}  // namespace

BENCHMARK(BM_AdamStep)->ArgName("threads")->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(BM_SgdStep)->ArgName("threads")->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(BM_AdamDirection)->ArgName("threads")->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(BM_SgdDirection)->ArgName("threads")->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(BM_BiasRelu)
    ->ArgNames({"rows", "threads"})
    ->ArgsProduct({{128, 4096}, {1, 2}})
    ->UseRealTime();
BENCHMARK(BM_ReluBackward)
    ->ArgNames({"rows", "threads"})
    ->ArgsProduct({{128, 4096}, {1, 2}})
    ->UseRealTime();
BENCHMARK(BM_BiasGrad)
    ->ArgNames({"rows", "threads"})
    ->ArgsProduct({{128, 4096}, {1, 2}})
    ->UseRealTime();
BENCHMARK(BM_BatchNorm)->Apply(norm_passes)->UseRealTime();
BENCHMARK(BM_BatchNormRelu)->Apply(fused_norm_passes)->UseRealTime();
BENCHMARK(BM_Gemm)->Apply(gemm_shapes)->UseRealTime();

BENCHMARK_MAIN();
