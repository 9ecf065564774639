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
#include <benchmark/benchmark.h>

#include "baseline.hpp"
#include "xpipe/xpipe.hpp"

namespace {

constexpr long batch = 128;

// Seconds of the GEMMs one training step runs, each at raw dnnl_sgemm speed.
double gemm_bound_seconds(int threads) {
  double s = 0;
  const auto add = [&](char ta, char tb, long m, long n, long k) {
    s += 2.0 * m * n * k / bench::dnnl_flops(ta, tb, m, n, k, threads);
  };
  constexpr std::array<int, 5> w{784, 1024, 1024, 1024, 10};
  for (int l = 0; l < 4; ++l) {
    add('N', 'N', batch, w[l + 1], w[l]);             // forward
    add('T', 'N', w[l], w[l + 1], batch);             // weight gradient
    if (l > 0) add('N', 'T', batch, w[l], w[l + 1]);  // input gradient (none for layer 0)
  }
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

// 1 and 2 threads, wall-clock time, in ms.
void thread_counts(benchmark::internal::Benchmark* b) {
  b->ArgName("threads")->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
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

BENCHMARK_MAIN();
