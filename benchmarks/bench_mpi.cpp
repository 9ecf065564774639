// The MPI transport and executor against plain MPI, each ratio measured in one run on 2 ranks:
// an activation through MpiLink vs a raw MPI_Send/MPI_Recv ping-pong of the same size; the MPI
// executor's per-action overhead vs the threaded executor's at K = 2; a stage gradient's
// average (the executor's MPI_Iallreduce, polled, then / R) vs MPI_Allreduce alone.
// Usage: mpirun -np 2 bench_mpi (rank 0 reports). Iteration counts are fixed: both ranks must
// run the same number of exchanges.
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <span>
#include <thread>
#include <vector>

#include "baseline.hpp"
#include "xpipe/exec/mpi.hpp"
#include "xpipe/xpipe.hpp"

namespace {

using xpipe::index_t;

int rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// Waits for the other rank without holding a core (a spinning barrier would take the core a
// measured run on the other rank needs).
void sleepy_barrier() {
  MPI_Request r;
  MPI_Ibarrier(MPI_COMM_WORLD, &r);
  for (int done = 0; !done;) {
    MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// ---- point to point: rows x 1024 floats, there and back ----------------------------------------
constexpr int kRoundTrips = 400;

// `n` round trips through a pair of MpiLinks (rank 0 sends on one, rank 1 echoes on the other).
double link_round_trips(index_t rows, int n) {
  constexpr index_t width = 1024;
  const int me = rank(), peer = 1 - me;
  xpipe::MpiLink<> there(2, rows, width), back(2, rows, width);
  std::vector<int> order(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
  xpipe::MpiLinkEnd send{MPI_COMM_WORLD, xpipe::LinkRole::Producer, peer, 0, {}};
  xpipe::MpiLinkEnd recv{MPI_COMM_WORLD, xpipe::LinkRole::Consumer, peer, 1, order};
  if (me == 0) {
    there.connect(send);
    back.connect(recv);
  } else {
    send.direction = 1;
    recv.direction = 0;
    back.connect(send);
    there.connect(recv);
  }
  xpipe::MpiLink<>& out = me == 0 ? there : back;
  xpipe::MpiLink<>& in = me == 0 ? back : there;
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    if (me == 1) {
      while (!in.can_pop()) {
      }
      in.pop();
    }
    while (!out.can_push()) {
    }
    xpipe::MicroBatchMessage& m = out.back();
    m.micro_batch = i;
    m.data.rows = rows;
    out.push();
    if (me == 0) {
      while (!in.can_pop()) {
      }
      benchmark::DoNotOptimize(in.front().data.data[0]);
      in.pop();
    }
  }
  while (!out.sends_done()) {
  }
  return seconds_since(t0) / n;
}

double raw_round_trips(index_t rows, int n) {
  std::vector<float> buf(static_cast<std::size_t>(rows * 1024));
  const int me = rank(), peer = 1 - me, count = static_cast<int>(buf.size());
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    if (me == 0) {
      MPI_Send(buf.data(), count, MPI_FLOAT, peer, 0, MPI_COMM_WORLD);
      MPI_Recv(buf.data(), count, MPI_FLOAT, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
      MPI_Recv(buf.data(), count, MPI_FLOAT, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(buf.data(), count, MPI_FLOAT, peer, 1, MPI_COMM_WORLD);
    }
  }
  return seconds_since(t0) / n;
}

// Best of 5 of each, interleaved; vs_raw = raw time / link time (1: the link adds nothing).
void BM_ActivationPingPong(benchmark::State& st) {
  const index_t rows = st.range(0);
  double link = 1e30, raw = 1e30;
  for (auto _ : st)
    for (int r = 0; r < 5; ++r) {
      link = std::min(link, link_round_trips(rows, kRoundTrips));
      raw = std::min(raw, raw_round_trips(rows, kRoundTrips));
    }
  st.counters["link_us_per_round_trip"] = link * 1e6;
  st.counters["raw_us_per_round_trip"] = raw * 1e6;
  st.counters["vs_raw"] = raw / link;
  st.counters["MB"] = static_cast<double>(rows) * 1024 * 4 / 1e6;
}

// ---- executor overhead: no math, only links, readiness and waits ------------------------------
template <class Q>
struct NoMathProgram {
  const xpipe::Schedule* s;
  xpipe::Links<Q> links_;
  explicit NoMathProgram(const xpipe::Schedule& sched) : s(&sched) {
    const auto a = xpipe::analyze_staleness(sched);
    links_ = xpipe::Links<Q>(
        sched.stages, [&](int b) { return a.max_in_flight[b]; }, 1, [](int) { return 1; });
  }
  const xpipe::Schedule& schedule() const { return *s; }
  bool ready(int k, const xpipe::Action& a) const { return links_.ready(s->stages, k, a); }
  void execute(int k, const xpipe::Action& a) {
    const xpipe::ActionChannels io = xpipe::channels_of(s->stages, k, a);
    if (io.in.exists()) links_.at(io.in).pop();
    if (io.out.exists()) {
      links_.at(io.out).back().micro_batch = a.index;
      links_.at(io.out).back().data.rows = 1;
      links_.at(io.out).push();
    }
  }
  xpipe::Links<Q>& links() { return links_; }
};

// Seconds per action of stage 0's list: the MPI executor on 2 ranks, and (rank 0 alone, rank 1
// asleep) the threaded executor with its 2 threads; vs_threaded = MPI / threaded.
void BM_ExecutorOverhead(benchmark::State& st) {
  const auto sched = xpipe::async_1f1b(2, 4, 500);
  const double actions = static_cast<double>(sched.actions[0].size());
  xpipe::MpiExecutor mpi;
  xpipe::ThreadedExecutor threaded;
  double t_mpi = 1e30, t_thr = 1e30;
  for (auto _ : st)
    for (int r = 0; r < 5; ++r) {
      {
        NoMathProgram<xpipe::MpiLink<>> p(sched);
        MPI_Barrier(MPI_COMM_WORLD);
        const auto t0 = std::chrono::steady_clock::now();
        mpi.run(p);
        t_mpi = std::min(t_mpi, seconds_since(t0) / actions);
      }
      if (rank() == 0) {
        NoMathProgram<xpipe::SpscRing<>> p(sched);
        const auto t0 = std::chrono::steady_clock::now();
        threaded.run(p);
        t_thr = std::min(t_thr, seconds_since(t0) / actions);
      }
      sleepy_barrier();
    }
  st.counters["mpi_us_per_action"] = t_mpi * 1e6;
  st.counters["threaded_us_per_action"] = t_thr * 1e6;
  st.counters["vs_threaded"] = t_mpi / t_thr;
}

// ---- gradient average over 2 replicas: a 1024 x 1024 stage's flat gradient --------------------
void BM_GradientAverage(benchmark::State& st) {
  const index_t n = st.range(0);
  std::vector<float> g(static_cast<std::size_t>(n), 1.f);
  double path = 1e30, sum_only = 1e30, plain = 1e30;
  for (auto _ : st)
    for (int r = 0; r < 5; ++r) {
      MPI_Barrier(MPI_COMM_WORLD);
      auto t0 = std::chrono::steady_clock::now();
      MPI_Request req;
      xpipe::start_gradient_sum(g, MPI_COMM_WORLD, req);
      for (int done = 0; !done;) MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      sum_only = std::min(sum_only, seconds_since(t0));
      xpipe::scale_gradient_sum(g, 2);
      path = std::min(path, seconds_since(t0));
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = std::chrono::steady_clock::now();
      MPI_Allreduce(MPI_IN_PLACE, g.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
      plain = std::min(plain, seconds_since(t0));
    }
  st.counters["average_ms"] = path * 1e3;
  st.counters["allreduce_ms"] = plain * 1e3;
  st.counters["vs_allreduce"] = plain / path;          // the whole average (sum, then / R)
  st.counters["sum_vs_allreduce"] = plain / sum_only;  // the non-blocking sum alone
}

}  // namespace

BENCHMARK(BM_ActivationPingPong)->ArgName("rows")->Arg(32)->Arg(128)->Iterations(1);
BENCHMARK(BM_ExecutorOverhead)->Iterations(1);
BENCHMARK(BM_GradientAverage)->ArgName("floats")->Arg(1024 * 1025)->Iterations(1);

int main(int argc, char** argv) {
  xpipe::mpi_default_tuning();
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2) {
    if (rank() == 0) std::fprintf(stderr, "bench_mpi: run on 2 ranks (mpirun -np 2)\n");
    MPI_Finalize();
    return 2;
  }
  if (rank() != 0 && !std::freopen("/dev/null", "w", stdout)) return 1;
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  MPI_Finalize();
  return 0;
}
