// Conv2d's forward + backward (data and weights) on the host against oneDNN's primitives alone on
// the same shapes, in one binary, each best of several timed runs. `vs_onednn`: the time of
// oneDNN's direct primitives on channels-last activations (what a user of oneDNN would write,
// and what PyTorch's CPU convolution runs on channels-last tensors) over the layer's; above 1
// where the layer's kernels are faster (Winograd on AVX-512; the direct jit forward on at most
// 16 output channels: backend/host_conv.hpp). `vs_onednn_best`: the same against oneDNN's best
// alone, Winograd where it offers it and activations in the layouts it picks, made so once
// outside the timing: the layer's overhead (its reorders to and from those layouts, its
// weights' reorder, the plumbing of memory handles); 1 = none.
#include <benchmark/benchmark.h>

#include <vector>

#include "baseline.hpp"
#include "xpipe/xpipe.hpp"

namespace {

using xpipe::ConvGeometry;
using xpipe::index_t;

// The VGG model's convolutions (include/xpipe/models/vgg.hpp) and the ResNet's 64-channel one
// (models/resnet.hpp), on a micro-batch of 32 images.
using C2 = xpipe::Conv2d<xpipe::Shape<16, 28, 28>, 16, 3, xpipe::ConvOptions{.padding = 1}>;
using C4 = xpipe::Conv2d<xpipe::Shape<32, 14, 14>, 32, 3, xpipe::ConvOptions{.padding = 1}>;
using C64 = xpipe::Conv2d<xpipe::Shape<64, 7, 7>, 64, 3, xpipe::ConvOptions{.padding = 1}>;

template <class L>
void BM_Conv2dLayer(benchmark::State& st) {
  const index_t rows = st.range(0);
  const int threads = static_cast<int>(st.range(1));
  const xpipe::HostContext ctx{.threads = threads};
  std::vector<float> p(L::param_count, 0.01f), g(L::param_count), x(rows * L::in_width, 0.01f),
      y(rows * L::out_width), dy(rows * L::out_width, 0.01f), dx(rows * L::in_width);
  typename L::template Saved<xpipe::Host> saved(rows);
  const auto step = [&] {
    L::forward(ctx, p.data(), {x.data(), rows, L::in_width}, {y.data(), rows, L::out_width}, saved);
    L::backward(ctx, p.data(), g.data(), false, {x.data(), rows, L::in_width},
                {y.data(), rows, L::out_width}, {dy.data(), rows, L::out_width},
                {dx.data(), rows, L::in_width}, saved);
  };
  for (auto _ : st) step();
  const ConvGeometry geo = L::geometry(rows);
  omp_set_num_threads(threads);  // oneDNN fixes a primitive's threads when it is made
  bench::OneDnnConv direct(geo, false), best(geo, true);
  const double layer = bench::best_seconds(step);
  const double alone = bench::best_seconds([&] { direct.step(threads); });
  const double fastest = bench::best_seconds([&] { best.step(threads); });
  const double macs = static_cast<double>(rows) * L::macs;
  st.counters["FLOP/s"] = benchmark::Counter(6 * macs * static_cast<double>(st.iterations()),
                                             benchmark::Counter::kIsRate);
  st.counters["vs_onednn"] = alone / layer;
  st.counters["vs_onednn_best"] = fastest / layer;
}

// 32 images on 1 and 2 threads, wall-clock time, in ms.
void layer_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rows", "threads"})
      ->Args({32, 1})
      ->Args({32, 2})
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
}

BENCHMARK_TEMPLATE(BM_Conv2dLayer, C2)->Apply(layer_args);
BENCHMARK_TEMPLATE(BM_Conv2dLayer, C4)->Apply(layer_args);
BENCHMARK_TEMPLATE(BM_Conv2dLayer, C64)->Apply(layer_args);

}  // namespace

BENCHMARK_MAIN();
