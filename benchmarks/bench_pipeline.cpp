// The pipeline engine's costs: a queue hop between two threads, the threaded executor's
// overhead per action on stages that do no math, real overlap of a 2-stage pipeline on this
// machine (against one stage, and async 1F1B against GPipe), the prediction pass, and what
// choosing the predictor at run time (AnyPredictor) costs against the static type.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "baseline.hpp"
#include "xpipe/xpipe.hpp"

namespace {

using xpipe::index_t;

// One hop = hand-off of a pre-allocated buffer to another thread. Measured as a ping-pong
// through two rings (round trip / 2): both threads spin, as stage threads do before yielding.
void BM_QueueHop(benchmark::State& st) {
  xpipe::SpscRing<> there(4, 1, 16), back(4, 1, 16);
  std::atomic<bool> done{false};
  std::thread echo([&] {
    while (!done.load(std::memory_order_relaxed)) {
      if (!there.can_pop()) continue;
      const int g = there.front().micro_batch;
      there.pop();
      while (!back.can_push()) {
      }
      back.back().micro_batch = g;
      back.push();
    }
  });
  int g = 0;
  for (auto _ : st) {
    while (!there.can_push()) {
    }
    there.back().micro_batch = g++;
    there.push();
    while (!back.can_pop()) {
    }
    benchmark::DoNotOptimize(back.front().micro_batch);
    back.pop();
  }
  done = true;
  echo.join();
  // Seconds per hop (printed with an SI prefix: 80n = 80 ns).
  st.counters["s_per_hop"] =
      benchmark::Counter(2.0 * static_cast<double>(st.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// A Program of K stages that only passes micro-batch numbers through the pipeline's own links
// and readiness rule: what is left is the executor (readiness checks, waits, timing records)
// and the queues.
struct NoMathProgram {
  const xpipe::Schedule* s;
  xpipe::Links<xpipe::SpscRing<>> links;
  explicit NoMathProgram(const xpipe::Schedule& sched) : s(&sched) {
    const auto a = xpipe::analyze_staleness(sched);
    links = xpipe::Links<xpipe::SpscRing<>>(
        sched.stages, [&](int b) { return a.max_in_flight[b]; }, 1, [](int) { return 1; });
  }
  const xpipe::Schedule& schedule() const { return *s; }
  bool ready(int k, const xpipe::Action& a) const { return links.ready(s->stages, k, a); }
  void execute(int k, const xpipe::Action& a) {
    const xpipe::ActionChannels io = xpipe::channels_of(s->stages, k, a);
    if (io.in.exists()) links.at(io.in).pop();
    if (io.out.exists()) {
      links.at(io.out).back().micro_batch = a.index;
      links.at(io.out).push();
    }
  }
};

void BM_ExecutorOverhead(benchmark::State& st) {
  const int K = static_cast<int>(st.range(0));
  const auto sched = xpipe::async_1f1b(K, 4, 2000);
  long actions = 0;
  for (const auto& l : sched.actions) actions += static_cast<long>(l.size());
  xpipe::ThreadedExecutor exec;
  for (auto _ : st) {
    NoMathProgram p(sched);
    exec.run(p);
  }
  // Seconds per action of one stage's list (the stages run their lists side by side).
  st.counters["s_per_action"] = benchmark::Counter(
      static_cast<double>(st.iterations()) * static_cast<double>(sched.actions[0].size()),
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  st.counters["threads_per_core"] = K / 2.0;
}

// The prediction pass (Adam direction fused with the extrapolation), against the triad over
// the same footprint: read w m v, write out = 16 bytes per parameter.
void BM_AdamPredict(benchmark::State& st) {
  const int threads = static_cast<int>(st.range(0));
  const index_t n = xpipe::models::FashionMlp::param_count;
  const xpipe::HostContext ctx{.threads = threads};
  xpipe::HostBuffer<float> w(n), m(n), v(n), out(n);
  xpipe::Rng rng{1};
  for (index_t i = 0; i < n; ++i) w[i] = rng.uniform(-1.f, 1.f), m[i] = 1e-3f, v[i] = 1e-6f;
  const auto s = xpipe::math::adam_scalars(1e-3f, 0.9f, 0.999f, 1e-8f, 0.f, false, 100);
  auto kernel = [&] {
    xpipe::adam_predict(ctx, w.data(), m.data(), v.data(), out.data(), n, 3e-3f, s);
  };
  for (auto _ : st) kernel();
  st.SetBytesProcessed(static_cast<int64_t>(16.0 * n * st.iterations()));
  st.counters["vs_triad"] = bench::paired_triad_ratio(kernel, 16.0 * n, 4 * n, threads);
}

// ---- Real overlap: a balanced 1024-wide MLP (6 Linear+ReLU layers), 2 stages of 3 -------------
using L = xpipe::Linear<1024, 1024>;
using Half = xpipe::Stage<L, xpipe::ReLU, L, xpipe::ReLU, L, xpipe::ReLU>;
using Head = xpipe::Stage<L, xpipe::ReLU, L, xpipe::ReLU, L, xpipe::ReLU, xpipe::Linear<1024, 10>>;
using Whole = xpipe::Stage<L, xpipe::ReLU, L, xpipe::ReLU, L, xpipe::ReLU, L, xpipe::ReLU, L,
                           xpipe::ReLU, L, xpipe::ReLU, xpipe::Linear<1024, 10>>;

struct Synthetic {
  index_t rows;
  std::vector<float> x;
  std::vector<std::int32_t> y;
  explicit Synthetic(index_t r) : rows(r), x(r * 1024), y(r) {
    xpipe::Rng rng{3};
    for (float& v : x) v = rng.uniform(-1.f, 1.f);
    for (auto& v : y) v = static_cast<std::int32_t>(rng.below(10));
  }
  xpipe::EpochData epoch() const { return {{x.data(), rows, 1024}, y.data()}; }
};

// Samples/s of one stage (sequential, one GEMM thread) and of the 2-stage pipeline (one GEMM
// thread per stage thread), each timed over `mini_batches` batches of 128, best of 3.
void BM_Overlap(benchmark::State& st) {
  const int M = static_cast<int>(st.range(0));
  const int N = 24;
  Synthetic data(128 * N);
  xpipe::ScopedFlushDenormals ftz;
  double seq = 0, async = 0, gpipe = 0;
  for (auto _ : st) {
    xpipe::SequentialTrainer<Whole, xpipe::Adam> t(xpipe::Adam{}, 128, 1);
    seq = 128.0 * N /
          bench::best_seconds(
              [&] {
                for (int b = 0; b < N; ++b)
                  t.train_step(xpipe::HostContext{}, {data.x.data() + b * 128 * 1024, 128, 1024},
                               data.y.data() + b * 128);
              },
              3, 1);
    xpipe::Pipeline<Half, Head, xpipe::Latest> p(xpipe::Adam{}, {.batch = 128, .micro_batches = M});
    xpipe::ThreadedExecutor exec;
    const auto as = xpipe::async_1f1b(2, M, N), gp = xpipe::gpipe(2, M, N);
    async = 128.0 * N / bench::best_seconds([&] { p.train(as, data.epoch(), exec); }, 3, 1);
    gpipe = 128.0 * N / bench::best_seconds([&] { p.train(gp, data.epoch(), exec); }, 3, 1);
  }
  st.counters["one_stage_samples/s"] = seq;
  st.counters["async_samples/s"] = async;
  st.counters["gpipe_samples/s"] = gpipe;
  st.counters["async_vs_one_stage"] = async / seq;  // aim >= 1.8 at M = 1
  // GPipe pays a bubble of (K-1)/(M+K-1); aim: async/gpipe >= 0.95 (M+K-1)/M.
  st.counters["async_vs_gpipe"] = async / gpipe;
  st.counters["bubble_bound"] = (M + 1.0) / M;
}

// ---- AnyPredictor against the static type -------------------------------------------------------
// Per action: one forward_weights, backward_weights and backward_done of stage 0 (16 weights, so
// the call is all there is) through Latest's State and through AnyPredictor's holding Latest.
template <class State, class Make>
double seconds_per_action(const Make& make, int rounds) {
  const auto sched = xpipe::async_1f1b(4, 4, 64);
  const auto analysis = xpipe::analyze_staleness(sched);
  const xpipe::PredictorSetup setup{0, 16, &sched, &analysis};
  xpipe::OptimizerState<xpipe::Adam, xpipe::Host> opt(xpipe::Adam{}, 16);
  State state = make(setup);
  const xpipe::HostContext ctx{};
  const int G = sched.total_micro_batches();
  return bench::best_seconds(
             [&] {
               for (int g = 0; g < G; ++g) {
                 benchmark::DoNotOptimize(state.forward_weights(ctx, opt, g));
                 benchmark::DoNotOptimize(state.backward_weights(ctx, opt, g));
                 state.backward_done(g);
               }
             },
             rounds, 1) /
         (3.0 * G);
}

// Whole step: the 2-stage 1024-wide MLP above under async 1F1B with XPipe, static and chosen at
// run time, timed in alternation (best of 8 each, each first in every other round), as seconds
// per mini-batch.
void BM_AnyPredictor(benchmark::State& st) {
  using Static = xpipe::Latest::State<xpipe::Adam, xpipe::Host>;
  using Any = xpipe::AnyPredictor::State<xpipe::Adam, xpipe::Host>;
  const int N = 16, M = 4;
  Synthetic data(128 * N);
  xpipe::ScopedFlushDenormals ftz;
  double call_static = 0, call_any = 0, step_static = 0, step_any = 0;
  for (auto _ : st) {
    call_static = seconds_per_action<Static>([](const auto& s) { return Static(s); }, 200);
    call_any =
        seconds_per_action<Any>([](const auto& s) { return Any(s, xpipe::AnyPredictor{}); }, 200);
    xpipe::Pipeline<Half, Head, xpipe::XPipe> fixed(xpipe::Adam{},
                                                    {.batch = 128, .micro_batches = M});
    xpipe::Pipeline<Half, Head, xpipe::AnyPredictor> chosen(
        xpipe::Adam{}, {.batch = 128, .micro_batches = M}, xpipe::make_predictor("xpipe"));
    xpipe::ThreadedExecutor exec;
    const auto sched = xpipe::async_1f1b(2, M, N);
    step_static = step_any = 1e30;
    auto time = [&](auto& pipe) {
      return bench::best_seconds([&] { pipe.train(sched, data.epoch(), exec); }, 1, 1);
    };
    for (int r = 0; r < 8; ++r) {  // alternated, each first in turn: both see the same machine
      if (r % 2 == 0) {
        step_static = std::min(step_static, time(fixed));
        step_any = std::min(step_any, time(chosen));
      } else {
        step_any = std::min(step_any, time(chosen));
        step_static = std::min(step_static, time(fixed));
      }
    }
    step_static /= N;
    step_any /= N;
  }
  st.counters["s_per_action_static"] = call_static;
  st.counters["s_per_action_any"] = call_any;
  // What the dispatch adds to one mini-batch's 3 K M predictor calls, over the step: aim <= 1%.
  st.counters["dispatch_share_of_step"] = (call_any - call_static) * 3 * 2 * M / step_static;
  st.counters["step_any_vs_static"] = step_any / step_static;  // aim <= 1.01
}

}  // namespace

BENCHMARK(BM_QueueHop)->UseRealTime();
BENCHMARK(BM_ExecutorOverhead)
    ->ArgName("stages")
    ->Arg(2)
    ->Arg(4)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_AdamPredict)->ArgName("threads")->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(BM_Overlap)
    ->ArgName("M")
    ->Arg(1)
    ->Arg(4)
    ->Iterations(1)
    ->UseRealTime()
    ->Unit(benchmark::kSecond);
BENCHMARK(BM_AnyPredictor)->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);

BENCHMARK_MAIN();
