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

#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

#include "baseline.hpp"
#include "xpipe/xpipe.hpp"

namespace {

using xpipe::ConvGeometry;
using xpipe::index_t;

// oneDNN's three convolution primitives on one geometry, made with its C++ API and run through
// its argument maps: the baseline a user of oneDNN alone would write: direct kernels on
// channels-last activations as the layer's, weights in oneDNN's choice (format_tag::any).
// `best` takes Winograd's kernels in each direction where oneDNN offers them and lets it choose
// the activations' layout too. Operands are made in their layouts once, outside the timing.
class OneDnnConv {
 public:
  OneDnnConv(const ConvGeometry& g, bool best)
      : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {
    using tag = dnnl::memory::format_tag;
    using md = dnnl::memory::desc;
    const auto f32 = dnnl::memory::data_type::f32;
    // Weights always in oneDNN's choice: on fixed OIHW weights it has only its reference kernel
    // (hundreds of times slower), and the layer reorders its few weights per call into that choice.
    const tag act = best ? tag::any : tag::nhwc, wt = tag::any;
    const md src({g.rows, g.c, g.h, g.w}, f32, act), weights({g.oc, g.c, g.k, g.k}, f32, wt),
        bias({g.oc}, f32, tag::x), dst({g.rows, g.oc, g.oh, g.ow}, f32, act);
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
                 {DNNL_ARG_BIAS, mem(fpd.bias_desc())},
                 {DNNL_ARG_DST, mem(fpd.dst_desc())}};
    data_args_ = {{DNNL_ARG_DIFF_SRC, mem(dpd.diff_src_desc())},
                  {DNNL_ARG_WEIGHTS, mem(dpd.weights_desc())},
                  {DNNL_ARG_DIFF_DST, mem(dpd.diff_dst_desc())}};
    weights_args_ = {{DNNL_ARG_SRC, mem(wpd.src_desc())},
                     {DNNL_ARG_DIFF_DST, mem(wpd.diff_dst_desc())},
                     {DNNL_ARG_DIFF_WEIGHTS, mem(wpd.diff_weights_desc())},
                     {DNNL_ARG_DIFF_BIAS, mem(wpd.diff_bias_desc())}};
  }
  void step(int threads) {
    omp_set_num_threads(threads);
    fwd_.execute(stream_, fwd_args_);
    bwd_data_.execute(stream_, data_args_);
    bwd_weights_.execute(stream_, weights_args_);
    stream_.wait();
  }

 private:
  dnnl::engine engine_;
  dnnl::stream stream_;
  dnnl::primitive fwd_, bwd_data_, bwd_weights_;
  std::unordered_map<int, dnnl::memory> fwd_args_, data_args_, weights_args_;
};

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
  OneDnnConv direct(geo, false), best(geo, true);
  const double layer = bench::best_seconds(step);
  const double alone = bench::best_seconds([&] { direct.step(threads); });
  const double fastest = bench::best_seconds([&] { best.step(threads); });
  const double macs = static_cast<double>(rows) * L::macs;
  st.counters["FLOP/s"] = benchmark::Counter(6 * macs * static_cast<double>(st.iterations()),
                                             benchmark::Counter::kIsRate);
  st.counters["vs_onednn"] = alone / layer;
  st.counters["vs_onednn_best"] = fastest / layer;
}

BENCHMARK_TEMPLATE(BM_Conv2dLayer, C2)
    ->ArgNames({"rows", "threads"})
    ->Args({32, 1})
    ->Args({32, 2})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_Conv2dLayer, C4)
    ->ArgNames({"rows", "threads"})
    ->Args({32, 1})
    ->Args({32, 2})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_Conv2dLayer, C64)
    ->ArgNames({"rows", "threads"})
    ->Args({32, 1})
    ->Args({32, 2})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
