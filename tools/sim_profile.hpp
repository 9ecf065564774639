// xpipe-plan's measurements on the host backend: each stage's forward, backward and step timed
// one action at a time on the stage threads (for the validation), or in the reference
// executor's order by the CPU time its thread spends (for the layer profile: what else the
// machine runs does not inflate it), the cores the process gets measured, a model's pieces (the
// MLP's layers, a CNN's blocks) fitted as fixed + rows x per-sample, and the validation of the
// simulator against the threaded executor's measured run of the same Pipeline and schedule.
// Over 400 lines: the profile, the serial executor it needs and the validation share their
// timing helpers; xpipe-plan's subcommands (tools/plan/) call into it.
#pragma once

#include <pthread.h>
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "models.hpp"
#include "xpipe/xpipe.hpp"

namespace xpipe::tools {

//! Random inputs in [-1, 1) and labels in [0, 10): timing does not depend on the values. A model
//! that reads tokens (`tokens` > 0: the vocabulary of a first-layer Embedding, rows in sequences
//! of `context`) gets rows (a random id, the row's position in its sequence) instead.
struct SyntheticData {
  index_t rows, width;
  HostBuffer<float> x;
  HostBuffer<std::int32_t> y;
  SyntheticData(index_t r, index_t w, int tokens = 0, int context = 1)
      : rows(r), width(w), x(r * w), y(r) {
    Rng rng{12345};
    if (tokens > 0) {
      for (index_t i = 0; i < r; ++i) {
        x[2 * i] = static_cast<float>(rng.below(static_cast<std::uint64_t>(tokens)));
        x[2 * i + 1] = static_cast<float>(i % context);
      }
    } else {
      for (index_t i = 0; i < r * w; ++i) x[i] = rng.uniform(-1.f, 1.f);
    }
    for (index_t i = 0; i < r; ++i) y[i] = static_cast<std::int32_t>(rng.below(10));
  }
  EpochData epoch() const { return {ConstMatrix{x.data(), rows, width}, y.data()}; }
};

namespace detail {
// The vocabulary of an Embedding (0 for any other layer).
template <class L>
inline constexpr int vocabulary_of = 0;
template <int V, int T, int D>
inline constexpr int vocabulary_of<Embedding<V, T, D>> = V;
}  // namespace detail

//! Synthetic data for Pipeline P: tokens when its first layer is an Embedding (in sequences of
//! P's row group), random features otherwise.
template <class P>
SyntheticData synthetic_for(index_t rows) {
  using First = std::tuple_element_t<0, typename P::template stage<0>::layers>;
  return SyntheticData(rows, P::in_width, detail::vocabulary_of<First>,
                       static_cast<int>(P::row_group));
}

//! Seconds of CPU the calling thread has used.
inline double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

//! The reference executor's order (one action at a time, on the calling thread), timing each
//! action by the CPU time the thread spent in it rather than wall time: what an action costs,
//! whatever else the machine runs meanwhile. Trace times are cumulative CPU seconds.
class CpuTimeExecutor {
 public:
  static constexpr const char* name = "cpu-time";
  template <Program P>
  void run(P& program) {
    const Schedule& s = program.schedule();
    ScopedFlushDenormals ftz;
    trace_ = ExecutionTrace::sized_for(s);
    std::vector<std::size_t> next(static_cast<std::size_t>(s.stages), 0);
    const double t0 = thread_cpu_seconds();
    for (bool progress = true; progress;) {
      progress = false;
      for (int k = 0; k < s.stages; ++k)
        while (next[k] < s.actions[k].size() && program.ready(k, s.actions[k][next[k]])) {
          const Action& a = s.actions[k][next[k]];
          const double start = thread_cpu_seconds() - t0;
          program.execute(k, a);
          trace_.stages[k][next[k]] = {a, start, thread_cpu_seconds() - t0};
          ++next[k];
          progress = true;
        }
    }
    trace_.seconds = thread_cpu_seconds() - t0;
    for (int k = 0; k < s.stages; ++k)
      if (next[k] < s.actions[k].size())
        throw StageError(k, to_string(s.actions[k][next[k]]), "no stage can make progress");
  }
  const ExecutionTrace& trace() const { return trace_; }

 private:
  ExecutionTrace trace_;
};
static_assert(Executor<CpuTimeExecutor>);

//! One action at a time, each on its own stage's thread (pinned to `cpus` as the threaded
//! executor's are): what an action costs where the threaded executor runs it (its thread, its
//! core, its input written by another core) but without sharing a core. Each action holds one
//! lock while it runs; the trace keeps each action's wall time inside the lock, so the
//! waiting is not counted. Trace times are wall seconds from the run's start.
class SerialThreadedExecutor {
 public:
  static constexpr const char* name = "serial-threaded";
  std::vector<int> cpus;
  template <Program P>
  void run(P& program) {
    Serialized<P> one{program, ExecutionTrace::sized_for(program.schedule()),
                      std::vector<std::size_t>(program.schedule().actions.size(), 0),
                      std::chrono::steady_clock::now()};
    ThreadedExecutor inner;
    inner.cpus = cpus;
    inner.run(one);
    trace_ = std::move(one.trace);
    trace_.seconds = inner.trace().seconds;
  }
  const ExecutionTrace& trace() const { return trace_; }

 private:
  template <class P>
  struct Serialized {
    P& program;
    ExecutionTrace trace;
    std::vector<std::size_t> done;  // per stage: actions run (its list runs in order)
    std::chrono::steady_clock::time_point t0;
    std::mutex one_at_a_time;
    const Schedule& schedule() const { return program.schedule(); }
    bool ready(int k, const Action& a) { return program.ready(k, a); }
    bool input_ready(int k, const Action& a) requires requires { program.input_ready(k, a); }
    { return program.input_ready(k, a); }
    void execute(int k, const Action& a) {
      std::lock_guard<std::mutex> lock(one_at_a_time);
      const double start = xpipe::detail::seconds_since(t0);
      program.execute(k, a);
      trace.stages[static_cast<std::size_t>(k)][done[static_cast<std::size_t>(k)]++] = {
          a, start, xpipe::detail::seconds_since(t0)};
    }
  };
  ExecutionTrace trace_;
};
static_assert(Executor<SerialThreadedExecutor>);

//! The share of a core the calling thread gets now: it spins for `seconds`, and its CPU time is
//! divided by the wall time (1 alone on a core; less while other threads compete for it).
inline double spin_cpu_share(double seconds) {
  const auto w0 = std::chrono::steady_clock::now();
  const double c0 = thread_cpu_seconds();
  volatile double sink = 0;
  while (xpipe::detail::seconds_since(w0) < seconds)
    for (int j = 0; j < 1000; ++j) sink = sink + 1.0;
  return (thread_cpu_seconds() - c0) / xpipe::detail::seconds_since(w0);
}

//! Cores this process's threads get now, measured: `cores` threads spin for `seconds` and the
//! CPU time they got is summed over the wall time (on a quiet machine about `cores`; less while
//! other processes compete, as the scheduler shares the machine between process groups).
inline double measure_available_cores(int cores, double seconds = 0.1) {
  std::vector<double> share(static_cast<std::size_t>(cores));
  std::vector<std::thread> spin;
  for (int i = 0; i < cores; ++i)
    spin.emplace_back(
        [&share, i, seconds] { share[static_cast<std::size_t>(i)] = spin_cpu_share(seconds); });
  for (auto& t : spin) t.join();
  double sum = 0;
  for (double s : share) sum += std::min(1.0, s);
  return std::max(sum, 1e-3);
}

//! The CPUs this process may run on (its affinity mask), in order.
inline std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

//! The share of each CPU in `cpus` a thread of this process pinned there gets now (1: all of it;
//! less while other processes run there): a thread spins on each for `seconds`, all at once
//! (`together`: as the stage threads of a run on every core) or one after another (as the
//! one-action-at-a-time profile runs), and its CPU time is divided by the wall time.
inline std::vector<double> measure_core_shares(const std::vector<int>& cpus, bool together,
                                               double seconds = 0.05) {
  std::vector<double> share(cpus.size());
  auto spin = [&](std::size_t i) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpus[i], &set);
    pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
    share[i] = std::clamp(spin_cpu_share(seconds), 1e-3, 1.0);
  };
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < cpus.size(); ++i) {
    threads.emplace_back(spin, i);
    if (!together) threads.back().join();
  }
  for (auto& t : threads)
    if (t.joinable()) t.join();
  return share;
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

//! One cell of the validation: the cost model profiled for it, the measured and the simulated
//! run, and their traces (to draw side by side).
struct Cell {
  std::string schedule, predictor;
  int stages = 0, micro_batches = 0, mini_batches = 0;
  sim::CostModel model;
  double measured = 0, simulated = 0;  // seconds per mini-batch
  double simulated_quiet = 0;          // the same, given all `cores` (a quiet machine)
  double available_cores = 0;          // what `cores` busy threads got around each run (median)
  Schedule plan;
  ExecutionTrace measured_trace, simulated_trace;
  // Pinned cells: the same costs under newest-first cores (CoreSharing::newest_first), which
  // differ from processor sharing where workers share a core.
  double simulated_newest_first = 0;
  ExecutionTrace newest_first_trace;
  double error() const { return measured > 0 ? (simulated - measured) / measured : 0; }
};

//! Per-stage samples of F, B, S and a split backward's I and W from a trace set.
struct StageSamples {
  std::vector<std::vector<double>> f, b, s, i, w;
  explicit StageSamples(int K) : f(K), b(K), s(K), i(K), w(K) {}
  void add(const ExecutionTrace& t) {
    for (std::size_t k = 0; k < t.stages.size(); ++k)
      for (const ActionTiming& a : t.stages[k]) {
        // Indexed by ActionKind, in the kind table's order.
        static_assert(action_kinds.size() == 5, "StageSamples: give the new kind its samples");
        const std::array<std::vector<double>*, action_kinds.size()> into{&f[k], &b[k], &s[k], &i[k],
                                                                         &w[k]};
        into[static_cast<std::size_t>(a.action.kind)]->push_back(a.end - a.start);
      }
  }
  //! The medians of each stage's F, I and W samples: what zb-auto is fitted to.
  SplitBackwardCosts split_backward_costs() const {
    SplitBackwardCosts c;
    for (std::size_t k = 0; k < f.size(); ++k) {
      c.forward.push_back(median(f[k]));
      c.input_grad.push_back(median(i[k]));
      c.weight_grad.push_back(median(w[k]));
    }
    return c;
  }
};

//! The F, I and W seconds of each stage of `pipe` on M micro-batches of `data`'s mini-batches:
//! medians over `repeats` runs of ZB-H1 (which runs the same actions as any split-backward
//! schedule), one action at a time on the stages' own threads (SerialThreadedExecutor, pinned to
//! `cpus` where given), after one warm-up run. What xpipe-plan validate and xpipe-train fit
//! zb-auto to. It trains `pipe`: profile a copy of the pipeline that is to be trained.
template <class P>
SplitBackwardCosts profile_split_backward(P& pipe, const EpochData& data, int repeats,
                                          const std::vector<int>& cpus = {}) {
  const int M = pipe.options().micro_batches;
  const Schedule probe =
      zb_h1(P::stage_count, M, static_cast<int>(pipe.mini_batches_for(data.inputs.rows)));
  SerialThreadedExecutor one_at_a_time;
  one_at_a_time.cpus = cpus;
  pipe.train(probe, data, one_at_a_time);
  StageSamples samples(P::stage_count);
  for (int r = 0; r < repeats; ++r) {
    pipe.train(probe, data, one_at_a_time);
    samples.add(one_at_a_time.trace());
  }
  return samples.split_backward_costs();
}

//! Profiles and measures Pipeline type P on schedule `name` with M micro-batches of a `batch`
//! row mini-batch over N mini-batches: `repeats` rounds of (serial profile, threaded run), after
//! one warm-up of each, on the same Pipeline. The profile runs the schedule one action at a time
//! on the stages' own threads (SerialThreadedExecutor): an action costs more on its own thread
//! than in one thread that runs everything (its input comes from another core's cache, its core
//! may have idled): 5-25% on the 2-core VM we measured. The cost model takes the medians of every
//! action's time per stage and kind; the measurement is the median of the threaded runs' seconds
//! per mini-batch. `pin`: stage k on the (k mod cores)-th CPU this process may use in both runs,
//! and the simulator shares each core between its own stages; otherwise one pool of measured cores.
//! Pinned, the cell is also simulated with newest-first cores (Cell::newest_first_trace).
template <class P>
Cell run_cell(const std::string& name, const std::string& predictor, int M, index_t batch, int N,
              int repeats, int cores, double hop = 0, bool pin = false) {
  constexpr int K = P::stage_count;
  P pipe(make_optimizer("adam", 1e-4f), PipelineOptions{.batch = batch, .micro_batches = M},
         make_predictor<typename P::predictor>(predictor));
  const SyntheticData data = synthetic_for<P>(batch * N);
  Cell c;
  c.schedule = name, c.predictor = predictor;
  c.stages = K, c.micro_batches = M, c.mini_batches = N;
  c.plan = make_schedule(name, K, M, N);
  SerialThreadedExecutor ref;
  ThreadedExecutor thr;
  // Pinned: worker w (stage w, unless the schedule gives a worker several stages) on the
  // (w mod cores)-th CPU this process may use, and the simulator told where each stage runs.
  const std::vector<int> allowed = allowed_cpus();
  std::vector<int> used;  // the CPUs the workers are pinned to, core c = used[c]
  if (pin && !allowed.empty()) {
    const int workers = c.plan.workers();
    const int n = std::max(1, std::min({cores, workers, static_cast<int>(allowed.size())}));
    used.assign(allowed.begin(), allowed.begin() + n);
    for (int w = 0; w < workers; ++w) thr.cpus.push_back(used[static_cast<std::size_t>(w % n)]);
    for (int owner : stage_workers(c.plan)) c.model.core_of.push_back(owner % n);
  }
  // [c]: core c's share during a run (all cores busy) over its share during the profile (one
  // at a time): 1 on a quiet machine; what other processes take from a run, relative to what
  // they took from the profile, elsewhere.
  std::vector<std::vector<double>> core_ratio(used.size());
  auto sample_core_ratio = [&] {
    const std::vector<double> alone = measure_core_shares(used, false);
    const std::vector<double> together = measure_core_shares(used, true);
    std::vector<double> r(used.size());
    for (std::size_t i = 0; i < used.size(); ++i) r[i] = std::min(1.0, together[i] / alone[i]);
    return r;
  };
  ref.cpus = thr.cpus;
  // zb-auto: the order fitted to this pipeline's F, I and W, profiled on the same threads.
  if (fitted_to_costs(name))
    c.plan =
        make_schedule(name, K, M, N, profile_split_backward(pipe, data.epoch(), repeats, thr.cpus));
  pipe.train(c.plan, data.epoch(), ref);
  pipe.train(c.plan, data.epoch(), thr);
  StageSamples samples(K);
  std::vector<double> measured;
  std::vector<std::vector<double>> with(static_cast<std::size_t>(K));  // [n - 1]: samples
  std::vector<ExecutionTrace> traces;
  auto sample_cores = [&] {
    std::vector<double> v;
    for (int n = 1; n <= K; ++n) v.push_back(measure_available_cores(n, 0.05));
    return v;
  };
  for (int r = 0; r < repeats; ++r) {
    pipe.train(c.plan, data.epoch(), ref);
    samples.add(ref.trace());
    if (!used.empty()) {
      const std::vector<double> before = sample_core_ratio();
      pipe.train(c.plan, data.epoch(), thr);
      const std::vector<double> after = sample_core_ratio();
      for (std::size_t i = 0; i < used.size(); ++i)
        core_ratio[i].push_back(0.5 * (before[i] + after[i]));
    } else {
      const std::vector<double> before = sample_cores();
      pipe.train(c.plan, data.epoch(), thr);
      const std::vector<double> after = sample_cores();
      for (int n = 0; n < K; ++n)
        with[static_cast<std::size_t>(n)].push_back(0.5 * (before[n] + after[n]));
    }
    measured.push_back(thr.trace().seconds / N);
    traces.push_back(thr.trace());
  }
  c.measured = median(measured);
  for (const ExecutionTrace& t : traces)
    if (t.seconds / N == c.measured) c.measured_trace = t;
  if (c.measured_trace.stages.empty()) c.measured_trace = traces.front();
  const StalenessAnalysis a = analyze_staleness(c.plan);
  std::array<index_t, K> params{}, in_w{}, out_w{};
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((params[I] = P::template stage<I>::param_count, in_w[I] = P::template stage<I>::in_width,
      out_w[I] = P::template stage<I>::out_width),
     ...);
  }
  (std::make_index_sequence<K>{});
  const double rows = static_cast<double>(batch) / M;
  for (int k = 0; k < K; ++k) {
    sim::StageCost s;
    s.forward = median(samples.f[k]);
    s.backward = median(samples.b[k]);
    s.input_grad = median(samples.i[k]);
    s.weight_grad = median(samples.w[k]);
    if (samples.b[k].empty()) s.backward = s.input_grad + s.weight_grad;
    s.step = median(samples.s[k]);
    s.out_bytes = 4 * rows * out_w[k];
    s.in_bytes = 4 * rows * in_w[k];
    s.weight_bytes = 4.0 * params[k];
    s.state_bytes = 4.0 * sim::adam_state_floats_per_param * params[k];
    s.workspace_bytes = 4.0 * pipe.workspace_floats(k);
    s.activation_bytes = 4.0 * (pipe.activation_floats(k) - pipe.workspace_floats(k)) /
                         std::max(1, a.max_in_flight[k]);
    s.weight_copies = pipe.weight_copies(k);
    c.model.stages.push_back(s);
  }
  c.model.cores = cores;
  c.model.link.latency = hop;  // the copies into and out of the ring are inside F and B
  c.model.source = "per-action thread CPU time, medians, host backend";
  c.simulated_quiet = sim::simulate(c.plan, c.model).per_mini_batch;
  if (!used.empty()) {
    for (const auto& r : core_ratio) c.model.core_speed.push_back(median(r));
    c.available_cores = 0;
    for (double v : c.model.core_speed) c.available_cores += v;
  } else {
    for (const auto& w : with) c.model.cores_with.push_back(median(w));
    c.available_cores = c.model.cores_with[std::min(K, cores) - 1];
  }
  const sim::SimResult sr = sim::simulate(c.plan, c.model);
  c.simulated = sr.per_mini_batch;
  c.simulated_trace = sr.trace;
  if (!c.model.core_of.empty()) {
    sim::CostModel newest_first = c.model;
    newest_first.sharing = sim::CoreSharing::newest_first;
    const sim::SimResult rr = sim::simulate(c.plan, newest_first);
    c.simulated_newest_first = rr.per_mini_batch;
    c.newest_first_trace = rr.trace;
  }
  return c;
}

//! The predictor a validation cell runs each schedule with: 2BW needs its two weight versions;
//! the others run with the live weights (no prediction pass to time).
inline std::string validation_predictor(const std::string& schedule) {
  return schedule == "2bw" ? "2bw" : "latest";
}

//! Runs one validation cell of a model split over K = 2 (Pipeline type P2) or 4 stages (P4).
template <class P2, class P4>
Cell validation_cell_of(int K, const std::string& schedule, int M, index_t batch, int N,
                        int repeats, int cores, double hop = 0, bool pin = false) {
  const std::string predictor = validation_predictor(schedule);
  if (K == 2) return run_cell<P2>(schedule, predictor, M, batch, N, repeats, cores, hop, pin);
  if (K == 4) return run_cell<P4>(schedule, predictor, M, batch, N, repeats, cores, hop, pin);
  throw ConfigError("xpipe-plan: validation runs K = 2 or 4 (got " + std::to_string(K) + ")");
}

//! The stages of Pipeline type P as the layers of a model, measured: P runs GPipe on the CPU-time
//! executor at micro-batches of `small` and `large` rows, and each stage's median forward and
//! backward are fitted as fixed + rows x per-sample; `names[k]` names stage k. For a model cut
//! into its smallest pieces (the reference MLP's four layers, a CNN's blocks), the planner
//! partitions these into any number of stages.
template <class P>
std::vector<sim::LayerSpec> profile_stages(const std::array<std::string, P::stage_count>& names,
                                           index_t small, index_t large, int N, int repeats) {
  constexpr int K = P::stage_count;
  std::array<StageSamples, 2> at{StageSamples(K), StageSamples(K)};
  const std::array<index_t, 2> rows{small, large};
  for (int i = 0; i < 2; ++i) {
    P pipe(make_optimizer("adam", 1e-4f), PipelineOptions{.batch = rows[i], .micro_batches = 1});
    const SyntheticData data = synthetic_for<P>(rows[i] * N);
    const Schedule s = gpipe(K, 1, N);
    CpuTimeExecutor ref;
    pipe.train(s, data.epoch(), ref);
    for (int r = 0; r < repeats; ++r) {
      pipe.train(s, data.epoch(), ref);
      at[i].add(ref.trace());
    }
  }
  std::vector<sim::LayerSpec> layers;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (layers.push_back([&] {
      using S = typename P::template stage<I>;
      constexpr int k = static_cast<int>(I);
      sim::LayerSpec l;
      l.name = names[k];
      l.params = S::param_count;
      l.in_width = S::in_width;
      l.out_width = S::out_width;
      l.activation_floats = static_cast<double>(S::activation_floats(large)) / large;
      l.workspace_floats =
          static_cast<double>(S::template own_workspace_floats<typename P::backend>(large)) / large;
      l.arena_floats =
          static_cast<double>(S::template arena_floats<typename P::backend>(large)) / large;
      l.forward_flops = 2.0 * S::macs;
      l.backward_flops = 4.0 * S::macs;
      const double span = static_cast<double>(large - small);
      const double f0 = median(at[0].f[k]), f1 = median(at[1].f[k]);
      const double b0 = median(at[0].b[k]), b1 = median(at[1].b[k]);
      l.forward_per_sample = std::max(0.0, (f1 - f0) / span);
      l.forward_fixed = std::max(0.0, f0 - small * l.forward_per_sample);
      l.backward_per_sample = std::max(0.0, (b1 - b0) / span);
      l.backward_fixed = std::max(0.0, b0 - small * l.backward_per_sample);
      l.step_seconds = 0.5 * (median(at[0].s[k]) + median(at[1].s[k]));
      return l;
    }()),
     ...);
  }
  (std::make_index_sequence<K>{});
  return layers;
}

namespace detail {
template <class... Ss>
struct concat_stages;
template <class... As>
struct concat_stages<Stage<As...>> {
  using type = Stage<As...>;
};
template <class... As, class... Bs, class... Rest>
struct concat_stages<Stage<As...>, Stage<Bs...>, Rest...>
    : concat_stages<Stage<As..., Bs...>, Rest...> {};
}  // namespace detail

//! Whether stage S is the pieces Ps concatenated: the same layers in the same order. For the
//! splits profile_stages' pieces stand for.
//! Usage: `static_assert(made_of<vgg::K2a, pieces::Conv1, pieces::Conv2>);`
template <class S, class... Ps>
inline constexpr bool made_of = std::is_same_v<S, typename detail::concat_stages<Ps...>::type>;

//! Seconds per training step of the reference MLP trained sequentially at batch b (one thread),
//! with `replicas` such trainers running side by side on their own threads (what data
//! parallelism's compute looks like on this machine; the gradient all-reduce is not run here).
//! The median over replicas of each one's mean step time, after `warmup` steps.
inline double measure_sequential_step(index_t b, int steps, int replicas, int warmup = 3) {
  using Model = models::FashionMlp;
  std::vector<double> per_step(static_cast<std::size_t>(replicas));
  std::vector<std::thread> threads;
  for (int r = 0; r < replicas; ++r)
    threads.emplace_back([&, r] {
      ScopedFlushDenormals ftz;
      SequentialTrainer<Model, Adam> t(Adam{.lr = 1e-4f}, b, 1 + r);
      const SyntheticData data(b, Model::in_width);
      const HostContext ctx{.threads = 1};
      const ConstMatrix x{data.x.data(), b, Model::in_width};
      for (int i = 0; i < warmup; ++i) t.train_step(ctx, x, data.y.data());
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < steps; ++i) t.train_step(ctx, x, data.y.data());
      per_step[static_cast<std::size_t>(r)] = xpipe::detail::seconds_since(t0) / steps;
    });
  for (auto& t : threads) t.join();
  return median(per_step);
}

//! The in-process ring (SpscRing, the default link) per message: `latency` is half the round
//! trip of a one-float message between two threads (the waits yield, as the executor's do, so
//! on a shared core this is a reschedule); `bandwidth` is what a message of `floats` floats
//! costs to copy into a slot and out of it again (as the stage programs do). Medians of
//! `repeats` rounds.
inline sim::LinkCost measure_ring(int repeats, index_t floats = 1 << 16, int messages = 200) {
  auto wait = [](auto ready) {
    for (int spins = 0; !ready(); ++spins)
      if (spins > 64) std::this_thread::yield();
  };
  std::vector<double> hop, per_message;
  for (int r = 0; r < repeats; ++r) {
    {  // ping-pong of one float
      SpscRing<> there(1, 1, 1), back(1, 1, 1);
      std::thread echo([&] {
        for (int i = 0; i < messages; ++i) {
          wait([&] { return there.can_pop(); });
          there.pop();
          wait([&] { return back.can_push(); });
          back.push();
        }
      });
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < messages; ++i) {
        wait([&] { return there.can_push(); });
        there.push();
        wait([&] { return back.can_pop(); });
        back.pop();
      }
      hop.push_back(xpipe::detail::seconds_since(t0) / (2.0 * messages));
      echo.join();
    }
    {  // a large message copied into a slot and out of it again (one thread: no waiting)
      SpscRing<> ring(1, 1, floats);
      std::vector<float> src(static_cast<std::size_t>(floats), 1.f),
          dst(static_cast<std::size_t>(floats));
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < messages; ++i) {
        std::copy_n(src.data(), floats, ring.back().data.data);
        ring.push();
        std::copy_n(ring.front().data.data, floats, dst.data());
        ring.pop();
      }
      per_message.push_back(xpipe::detail::seconds_since(t0) / messages);
    }
  }
  sim::LinkCost l;
  l.latency = median(hop);
  l.bandwidth = 4.0 * floats / std::max(median(per_message), 1e-12);
  return l;
}

}  // namespace xpipe::tools
