// xpipe-plan's measurements over MPI (check-mpi, two ranks under mpirun): the MPI link's cost
// per message size, the all-reduce of a stage's gradient, and the reference MLP run by the MPI
// executor as pure data parallelism (2 replicas x 1 stage) and as a 2-stage pipeline, so that the
// planner's step times are checked against real runs that include the transfers and the
// all-reduce it models.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "models.hpp"
#include "sim_profile.hpp"
#include "xpipe/exec/mpi.hpp"
#include "xpipe/xpipe.hpp"

namespace xpipe::tools {

//! The MPI link between world ranks 0 and 1: blocking ping-pong (MPI_Send/MPI_Recv) at each of
//! `sizes` bytes, each time the median over `repeats` rounds of half the round trip, and
//! latency + bytes / bandwidth fitted to them (sim::fit_link_cost). Collective over `comm`
//! (ranks past 1 only wait). Usage: `auto p = measure_mpi_link(MPI_COMM_WORLD, {4, 65536}, 7);`
struct MpiLinkProfile {
  std::vector<sim::LinkSample> samples;
  sim::LinkCost link;
};

inline MpiLinkProfile measure_mpi_link(MPI_Comm comm, const std::vector<double>& sizes,
                                       int repeats) {
  int rank = 0;
  XPIPE_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  const double largest = *std::max_element(sizes.begin(), sizes.end());
  std::vector<char> buf(static_cast<std::size_t>(largest), 1);
  MpiLinkProfile p;
  for (double bytes : sizes) {
    const int n = static_cast<int>(bytes);
    // Round trips per timed round: a round of roughly a millisecond or more at the link speeds
    // seen here (0.2-0.5 us + bytes / 3-8 GB/s), so the clock's resolution does not matter.
    const int trips = std::clamp(static_cast<int>(2e7 / (bytes + 2e3)), 2, 1000);
    auto round = [&] {
      for (int i = 0; i < trips; ++i) {
        if (rank == 0) {
          XPIPE_MPI_CHECK(MPI_Send(buf.data(), n, MPI_BYTE, 1, 7, comm));
          XPIPE_MPI_CHECK(MPI_Recv(buf.data(), n, MPI_BYTE, 1, 7, comm, MPI_STATUS_IGNORE));
        } else if (rank == 1) {
          XPIPE_MPI_CHECK(MPI_Recv(buf.data(), n, MPI_BYTE, 0, 7, comm, MPI_STATUS_IGNORE));
          XPIPE_MPI_CHECK(MPI_Send(buf.data(), n, MPI_BYTE, 0, 7, comm));
        }
      }
    };
    XPIPE_MPI_CHECK(MPI_Barrier(comm));
    round();  // warm-up: the connection and its buffers are set up on first use
    std::vector<double> one_way;
    for (int r = 0; r < repeats; ++r) {
      XPIPE_MPI_CHECK(MPI_Barrier(comm));
      const auto t0 = std::chrono::steady_clock::now();
      round();
      one_way.push_back(xpipe::detail::seconds_since(t0) / (2.0 * trips));
    }
    double t = median(one_way);
    XPIPE_MPI_CHECK(MPI_Bcast(&t, 1, MPI_DOUBLE, 0, comm));  // rank 0's clock decides
    p.samples.push_back({bytes, t});
  }
  p.link = sim::fit_link_cost(p.samples);  // the same samples, so the same fit, on every rank
  return p;
}

//! Median seconds over `repeats` (after one warm-up) of averaging a `floats`-float gradient over
//! the ranks of `comm` the way MpiExecutor does between a stage's last backward and its step:
//! start_gradient_sum (MPI_Iallreduce, with mpi_default_tuning's algorithm), wait for it, then
//! scale_gradient_sum (the division by R). The same on every rank (rank 0's).
inline double measure_mpi_gradient_average(MPI_Comm comm, index_t floats, int repeats) {
  int ranks = 1;
  XPIPE_MPI_CHECK(MPI_Comm_size(comm, &ranks));
  std::vector<float> g(static_cast<std::size_t>(floats), 1.f);
  auto once = [&] {
    MPI_Request req = MPI_REQUEST_NULL;
    start_gradient_sum(g, comm, req);
    XPIPE_MPI_CHECK(MPI_Wait(&req, MPI_STATUS_IGNORE));
    scale_gradient_sum(g, ranks);
  };
  once();
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    XPIPE_MPI_CHECK(MPI_Barrier(comm));
    const auto t0 = std::chrono::steady_clock::now();
    once();
    t.push_back(xpipe::detail::seconds_since(t0));
  }
  double s = median(t);
  XPIPE_MPI_CHECK(MPI_Bcast(&s, 1, MPI_DOUBLE, 0, comm));
  return s;
}

//! The share of a core this rank's thread gets now, every rank measuring at once (so each sees
//! the others competing as they do in a run; spin_cpu_share): 1 on a quiet machine with a core
//! per rank, about 0.5 while other processes keep every core busy. The smallest over `comm`.
inline double measure_rank_share(MPI_Comm comm, double seconds = 0.05) {
  XPIPE_MPI_CHECK(MPI_Barrier(comm));
  double mine = std::clamp(spin_cpu_share(seconds), 1e-3, 1.0), least = 0;
  XPIPE_MPI_CHECK(MPI_Allreduce(&mine, &least, 1, MPI_DOUBLE, MPI_MIN, comm));
  return least;
}

//! A timed MPI run: seconds per mini-batch, and the share of a core each rank got around it.
struct MpiRunTime {
  double seconds = 0, share = 1;
};

//! Seconds per mini-batch of Pipeline type P (its links MPI channels) run by `exec` on schedule
//! `name` with M micro-batches of `batch` rows per replica over N mini-batches: the median over
//! `repeats` runs (after one warm-up) of the slowest rank's run time (from the executor's common
//! start to its last message) over N, and the median share of a core the ranks got, measured
//! before and after each run (measure_rank_share). The same on every rank.
template <class P>
MpiRunTime time_mpi_run(MpiExecutor& exec, const std::string& name, int M, index_t batch, int N,
                        int repeats) {
  P pipe(make_optimizer("adam", 1e-4f), PipelineOptions{.batch = batch, .micro_batches = M});
  const SyntheticData data(batch * N, P::in_width);
  const Schedule s = make_schedule(name, P::stage_count, M, N);
  pipe.train(s, data.epoch(), exec);
  std::vector<double> per, shares;
  for (int r = 0; r < repeats; ++r) {
    const double before = measure_rank_share(MPI_COMM_WORLD);
    pipe.train(s, data.epoch(), exec);
    double mine = exec.trace().seconds, slowest = 0;
    XPIPE_MPI_CHECK(MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    per.push_back(slowest / N);
    shares.push_back(0.5 * (before + measure_rank_share(MPI_COMM_WORLD)));
  }
  return {median(per), median(shares)};
}

//! The reference MLP's plan (dp x pp on the world's ranks, dp * pp == ranks) run by the MPI
//! executor: pp = 1 is the whole model on each of dp replicas, pp = 2 the 784-1024-1024 |
//! 1024-1024-10 split. Collective over MPI_COMM_WORLD.
MpiRunTime time_mpi_plan(int dp, int pp, const std::string& schedule, int M, index_t batch, int N,
                         int repeats);  // runs_mlp.cpp, with the MLP's other Pipelines

}  // namespace xpipe::tools
