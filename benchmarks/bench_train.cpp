// The whole sequential training step of the 784-1024-1024-1024-10 MLP (batch 128, Adam):
// samples/s, and the ratio to the GEMM-only bound (the step's GEMMs timed alone, raw dnnl_sgemm,
// in this binary). Argument: threads. BM_TrainStep<FashionMlp> is Linear then ReLU,
// BM_TrainStep<FashionMlpFused> the same model with Dense layers (bias + ReLU in one pass);
// BM_TrainStep<FashionMlp, AdamAfterBackward> takes Adam's step whole after the backward instead
// of layer by layer inside it (the same bits); BM_TrainStep<FashionMlp, NoStep> is the step
// without its optimizer pass; BM_TrainStep<FashionMlp, Adam, false> runs the backward on both
// threads at once instead of in two lanes (SequentialTrainer::set_lanes).
// BM_GptStep: the sequential step of xpipe-train's GPT (models/gpt.hpp, Gpt<64, 4, 128>) on 16
// random byte sequences of 128 tokens, Adam: tokens/s, to set beside benchmarks/torch_gpt.py
// --mode time on the same threads, and the ratio to its GEMM-only bound (the Linear layers'
// GEMMs at raw dnnl_sgemm speed on the context's threads, the attention's per sequence and head
// single-threaded, spread over the threads, as the layer runs them).
// BM_CnnStep<ResNetLayers> and <VggLayers>: the sequential step of xpipe-train's ResNet and VGG
// (models/resnet.hpp, models/vgg.hpp; batch 128, Adam) against its convolution-primitive bound:
// every convolution at oneDNN's primitives alone (the faster of its direct kernels and its best,
// Winograd where it has it), the linear layers at raw dnnl_sgemm speed, run once after each step.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "baseline.hpp"
#include "xpipe/models/resnet.hpp"
#include "xpipe/models/vgg.hpp"
#include "xpipe/xpipe.hpp"

namespace {

constexpr long batch = 128;

// Seconds of a fully connected layer's GEMMs in one training step on `rows` rows, each at raw
// dnnl_sgemm speed: forward, weight gradient and (with `data`) input gradient.
double linear_gemm_seconds(long in, long out, long rows, int threads, bool data) {
  const auto time = [&](char ta, char tb, long m, long n, long k) {
    return 2.0 * m * n * k / bench::dnnl_flops(ta, tb, m, n, k, threads);
  };
  return time('N', 'N', rows, out, in) + time('T', 'N', in, out, rows) +
         (data ? time('N', 'T', rows, in, out) : 0.0);
}

// Seconds of the GEMMs one training step runs, each at raw dnnl_sgemm speed.
double gemm_bound_seconds(int threads) {
  constexpr std::array<int, 5> w{784, 1024, 1024, 1024, 10};
  double s = 0;
  for (int l = 0; l < 4; ++l)  // no input gradient for the first layer
    s += linear_gemm_seconds(w[l], w[l + 1], batch, threads, l > 0);
  return s;
}

// Adam taking its step over the whole buffer after the backward (it does not declare itself
// elementwise): the baseline of the step SequentialTrainer takes layer by layer in the backward,
// while each layer's weights and gradient are still in cache.
struct AdamAfterBackward : xpipe::Adam {
  static constexpr bool elementwise = false;
};

// Takes no step at all (the weights never change): the rest of the step, alone. The step's
// time less this one's is what the optimizer pass costs.
struct NoStep : xpipe::SGD {
  static constexpr bool elementwise = true;
  template <class Ctx>
  void step(const Ctx&, const xpipe::FlatState&) const {}
};

template <class Model, class O = xpipe::Adam, bool Lanes = true>
void BM_TrainStep(benchmark::State& st) {
  const int threads = static_cast<int>(st.range(0));
  const xpipe::HostContext ctx{.threads = threads};
  xpipe::ScopedFlushDenormals ftz;
  xpipe::SequentialTrainer<Model, O> trainer(O{}, batch, 1);
  trainer.set_lanes(Lanes);
  xpipe::HostBuffer<float> x(batch * 784);
  xpipe::HostBuffer<std::int32_t> y(batch);
  xpipe::Rng rng{2};
  for (float& v : x) v = rng.uniform(-1.f, 1.f);
  for (auto& v : y) v = static_cast<std::int32_t>(rng.below(10));
  for (auto _ : st)
    benchmark::DoNotOptimize(trainer.train_step(ctx, {x.data(), batch, 784}, y.data()));
  const double iters = static_cast<double>(st.iterations());
  st.SetItemsProcessed(static_cast<int64_t>(iters * batch));
  st.counters["samples/s"] = benchmark::Counter(iters * batch, benchmark::Counter::kIsRate);
  // (GEMM-only seconds x steps) / measured seconds: 1.0 would mean nothing but GEMM time.
  st.counters["vs_gemm_bound"] =
      benchmark::Counter(iters * gemm_bound_seconds(threads), benchmark::Counter::kIsRate);
  st.counters["gemm_bound_samples/s"] = batch / gemm_bound_seconds(threads);
}

// Seconds of the GEMMs one GPT training step runs (forward and backward) at raw dnnl_sgemm speed:
// N tokens of width D, T-token sequences, H heads, 8 blocks and a head over 256 bytes.
double gpt_gemm_bound_seconds(int threads, long N, long D, long T, long H) {
  double s = 0;
  const auto linear = [&](long in, long out, bool input_grad) {
    s += 2.0 * N * out * in / bench::dnnl_flops('N', 'N', N, out, in, threads);  // forward
    s += 2.0 * in * out * N / bench::dnnl_flops('T', 'N', in, out, N, threads);  // weights
    if (input_grad) s += 2.0 * N * in * out / bench::dnnl_flops('N', 'T', N, in, out, threads);
  };
  const long dh = D / H, pairs = N / T * H;
  // Per (sequence, head): Q K^T and P V forward, dV, dP, dQ and dK backward, T x T x dh each.
  const double attention = 6 * 2.0 * T * T * dh / bench::dnnl_flops('N', 'T', T, T, dh, 1);
  for (int b = 0; b < 8; ++b) {
    linear(D, 3 * D, true);
    linear(D, D, true);
    linear(D, 4 * D, true);
    linear(4 * D, D, true);
    s += attention * static_cast<double>((pairs + threads - 1) / threads);
  }
  linear(D, 256, true);
  return s;
}

void BM_GptStep(benchmark::State& st) {
  using G = xpipe::models::gpt::Gpt<64, 4, 128>;
  constexpr long context = 128, tokens = 16 * context;
  const int threads = static_cast<int>(st.range(0));
  const xpipe::HostContext ctx{.threads = threads};
  xpipe::ScopedFlushDenormals ftz;
  xpipe::SequentialTrainer<G::K1, xpipe::Adam> trainer(xpipe::Adam{}, tokens, 1);
  xpipe::HostBuffer<float> x(tokens * 2);
  xpipe::HostBuffer<std::int32_t> y(tokens);
  xpipe::Rng rng{2};
  for (long r = 0; r < tokens; ++r) {
    x[2 * r] = static_cast<float>(rng.below(256));
    x[2 * r + 1] = static_cast<float>(r % context);
    y[r] = static_cast<std::int32_t>(rng.below(256));
  }
  for (auto _ : st)
    benchmark::DoNotOptimize(trainer.train_step(ctx, {x.data(), tokens, 2}, y.data()));
  const double iters = static_cast<double>(st.iterations());
  st.counters["tokens/s"] = benchmark::Counter(iters * tokens, benchmark::Counter::kIsRate);
  const double bound = gpt_gemm_bound_seconds(threads, tokens, 64, context, 4);
  st.counters["vs_gemm_bound"] = benchmark::Counter(iters * bound, benchmark::Counter::kIsRate);
  st.counters["gemm_bound_tokens/s"] = tokens / bound;
}

// The convolutions and fully connected layers of a CNN's training step, for its bound: Use<L,
// n> is layer type L run n times a step, with its input gradient (not for the network's first
// layer, whose input needs none). A layer added to the model or dropped from it changes the
// model's multiply-adds, and the static_assert in BM_CnnStep then fails; one moved between two
// shapes of equal multiply-adds (the ResNet's 3x3 layers at 16, 32 and 64 channels) would not.
template <class L, int Count, bool Data = true>
struct Use {
  using layer = L;
  static constexpr int count = Count;
  static constexpr bool data = Data;
};
template <class... Uses>
struct Layers {
  static constexpr double macs = (0.0 + ... + (Uses::count * Uses::layer::macs));
};

namespace rn = xpipe::models::resnet;
struct ResNetLayers {
  using Model = rn::K1;
  using Convs =
      Layers<Use<rn::StemConv, 1, false>, Use<rn::Conv3<16, 28>, 6>, Use<rn::Projection<16, 28>, 1>,
             Use<rn::Halve<16, 28>, 1>, Use<rn::Conv3<32, 14>, 5>, Use<rn::Projection<32, 14>, 1>,
             Use<rn::Halve<32, 14>, 1>, Use<rn::Conv3<64, 7>, 5>>;
  using Linears = Layers<Use<xpipe::Linear<64, 10>, 1>>;
};

namespace vgg = xpipe::models::vgg;
struct VggLayers {
  using Model = vgg::K1;
  using Convs = Layers<Use<vgg::C1, 1, false>, Use<vgg::C2, 1>, Use<vgg::C3, 1>, Use<vgg::C4, 1>>;
  using Linears = Layers<Use<vgg::FC1, 1>, Use<vgg::FC2, 1>>;
};

// The work of a CNN step's convolution-primitive bound, run between the steps it is set
// against: every convolution of the step by oneDNN's primitives alone, per layer the faster of
// its direct kernels on channels-last activations and its best (bench::OneDnnConv, chosen once
// by the best of 5 runs each), and the fully connected layers' GEMMs by raw dnnl_sgemm. BatchNorm,
// pooling, ReLU, the residual sums, the loss and the optimizer lie outside it. Timed once per
// step, right after it, so a neighbour on a shared host or a change of clock slows both alike:
// timed apart (the best of 10 runs a layer, after the steps) the ratio moved by up to 0.15
// between runs of one binary.
class CnnBound {
 public:
  template <class Net>
  static CnnBound of(int threads) {
    CnnBound b(threads);
    b.add_convs(typename Net::Convs{});
    b.add_linears(typename Net::Linears{});
    return b;
  }
  //! Seconds of one run of the bound's work.
  double run() {
    const auto t0 = std::chrono::steady_clock::now();
    for (const Conv& c : convs_)
      for (int i = 0; i < c.count; ++i) c.primitives->step(threads_, c.data);
    omp_set_num_threads(threads_);
    for (Gemm& g : gemms_)
      dnnl_sgemm(g.ta, g.tb, g.m, g.n, g.k, 1.f, g.a.data(), g.ta == 'N' ? g.k : g.m, g.b.data(),
                 g.tb == 'N' ? g.n : g.k, 0.f, g.c.data(), g.n);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

 private:
  struct Conv {
    std::unique_ptr<bench::OneDnnConv> primitives;
    int count;
    bool data;
  };
  struct Gemm {
    char ta, tb;
    long m, n, k;
    xpipe::HostBuffer<float> a, b, c;
  };
  explicit CnnBound(int threads) : threads_(threads) {}
  template <class... U>
  void add_convs(Layers<U...>) {
    (add_conv(U::layer::geometry(batch), U::count, U::data), ...);
  }
  void add_conv(const xpipe::ConvGeometry& g, int count, bool data) {
    omp_set_num_threads(threads_);  // oneDNN fixes a primitive's threads when it is made
    auto direct = std::make_unique<bench::OneDnnConv>(g, false);
    auto best = std::make_unique<bench::OneDnnConv>(g, true);
    const double d = bench::best_seconds([&] { direct->step(threads_, data); }, 5, 1);
    const double b = bench::best_seconds([&] { best->step(threads_, data); }, 5, 1);
    convs_.push_back({d <= b ? std::move(direct) : std::move(best), count, data});
  }
  template <class... U>
  void add_linears(Layers<U...>) {
    (add_linear(U::layer::in_width, U::layer::out_width, U::count, U::data), ...);
  }
  // A fully connected layer's GEMMs, as linear_gemm_seconds counts them.
  void add_linear(long in, long out, int count, bool data) {
    for (int i = 0; i < count; ++i) {
      add_gemm('N', 'N', batch, out, in);
      add_gemm('T', 'N', in, out, batch);
      if (data) add_gemm('N', 'T', batch, in, out);
    }
  }
  void add_gemm(char ta, char tb, long m, long n, long k) {
    Gemm g{ta,
           tb,
           m,
           n,
           k,
           xpipe::HostBuffer<float>(m * k),
           xpipe::HostBuffer<float>(k * n),
           xpipe::HostBuffer<float>(m * n)};
    for (auto& v : g.a) v = 0.5f;
    for (auto& v : g.b) v = 0.25f;
    gemms_.push_back(std::move(g));
  }
  int threads_;
  std::vector<Conv> convs_;
  std::vector<Gemm> gemms_;
};

// The sequential training step of a CNN (batch 128 of random 28x28 images, Adam) against its
// convolution-primitive bound (CnnBound), each step followed by one run of the bound: the
// reported time is the steps' alone, vs_conv_bound the bound's total over the steps'.
template <class Net>
void BM_CnnStep(benchmark::State& st) {
  using Model = typename Net::Model;
  static_assert(Net::Convs::macs + Net::Linears::macs == Model::macs,
                "bench_train: the layers listed for the CNN's bound are not the model's (their "
                "multiply-adds differ): list every convolution and linear layer it runs");
  const int threads = static_cast<int>(st.range(0));
  const xpipe::HostContext ctx{.threads = threads};
  xpipe::ScopedFlushDenormals ftz;
  xpipe::SequentialTrainer<Model, xpipe::Adam> trainer(xpipe::Adam{}, batch, 1);
  xpipe::HostBuffer<float> x(batch * Model::in_width);
  xpipe::HostBuffer<std::int32_t> y(batch);
  xpipe::Rng rng{2};
  for (float& v : x) v = rng.uniform(0.f, 1.f);
  for (auto& v : y) v = static_cast<std::int32_t>(rng.below(10));
  CnnBound bound = CnnBound::of<Net>(threads);
  trainer.train_step(ctx, {x.data(), batch, Model::in_width}, y.data());  // plans made, warm
  double step_seconds = 0, bound_seconds = 0;
  for (auto _ : st) {
    const auto t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(trainer.train_step(ctx, {x.data(), batch, Model::in_width}, y.data()));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    st.SetIterationTime(s);
    step_seconds += s;
    bound_seconds += bound.run();
  }
  const double iters = static_cast<double>(st.iterations());
  st.counters["samples/s"] = iters * batch / step_seconds;
  st.counters["vs_conv_bound"] = bound_seconds / step_seconds;
  st.counters["conv_bound_samples/s"] = iters * batch / bound_seconds;
}

// 1 and 2 threads, wall-clock time, in ms.
void thread_counts(benchmark::internal::Benchmark* b) {
  b->ArgName("threads")->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
}
// The same, the time each iteration reports its own (BM_CnnStep: the step's, not its bound's).
void step_thread_counts(benchmark::internal::Benchmark* b) {
  b->ArgName("threads")->Arg(1)->Arg(2)->UseManualTime()->Unit(benchmark::kMillisecond);
}

}  // namespace

BENCHMARK_TEMPLATE(BM_TrainStep, xpipe::models::FashionMlp)->Apply(thread_counts);
BENCHMARK_TEMPLATE(BM_TrainStep, xpipe::models::FashionMlp, AdamAfterBackward)
    ->Apply(thread_counts);
BENCHMARK_TEMPLATE(BM_TrainStep, xpipe::models::FashionMlp, NoStep)->Apply(thread_counts);
BENCHMARK_TEMPLATE(BM_TrainStep, xpipe::models::FashionMlp, xpipe::Adam, false)
    ->Apply(thread_counts);
BENCHMARK_TEMPLATE(BM_TrainStep, xpipe::models::FashionMlpFused)->Apply(thread_counts);
BENCHMARK(BM_GptStep)->Apply(thread_counts);
BENCHMARK_TEMPLATE(BM_CnnStep, ResNetLayers)->Apply(step_thread_counts);
BENCHMARK_TEMPLATE(BM_CnnStep, VggLayers)->Apply(step_thread_counts);

BENCHMARK_MAIN();
