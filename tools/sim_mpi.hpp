// xpipe-plan's measurements over MPI (check-mpi, two ranks under mpirun): the MPI link's cost
// per message size, the all-reduce of a stage's gradient, and the reference MLP run by the MPI
// executor as pure data parallelism (2 replicas x 1 stage) and as a 2-stage pipeline, so that the
// planner's step times are checked against real runs that include the transfers and the
// all-reduce it models.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <string>
#include <vector>

#include "models.hpp"
#include "sim_profile.hpp"
#include "xpipe/exec/mpi.hpp"
#include "xpipe/xpipe.hpp"

namespace xpipe::tools {

//! One message size of the link profile: the median one-way time (half a round trip).
struct LinkSample {
  double bytes = 0, seconds = 0;
};

//! The MPI link between world ranks 0 and 1, measured by blocking ping-pong (MPI_Send/MPI_Recv)
//! at each of `sizes` bytes: the median over `repeats` rounds of half the round trip, and
//! latency + bytes / bandwidth fitted to them. Collective over `comm` (ranks past 1 wait).
struct MpiLinkProfile {
  std::vector<LinkSample> samples;
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
    // Enough round trips that a round lasts about a millisecond or more (timer resolution).
    const int trips = std::clamp(static_cast<int>(2e6 / (bytes + 2e4)), 2, 200);
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
  // latency + bytes / bandwidth fitted by least squares in relative error (each size counts
  // alike, from one float to megabytes): minimise sum_i ((a + c x_i) / t_i - 1)^2 over (a, c).
  double s11 = 0, s12 = 0, s22 = 0, r1 = 0, r2 = 0;
  for (const LinkSample& q : p.samples) {
    const double u = 1 / q.seconds, v = q.bytes / q.seconds;
    s11 += u * u, s12 += u * v, s22 += v * v, r1 += u, r2 += v;
  }
  const double det = s11 * s22 - s12 * s12;
  double a = (r1 * s22 - r2 * s12) / det, c = (s11 * r2 - s12 * r1) / det;
  if (!(a >= 0)) a = 0, c = r2 / s22;  // a negative latency: a line through the origin
  p.link.latency = a;
  p.link.bandwidth = c > 0 ? 1 / c : 0;
  return p;
}

//! Median seconds of an in-place MPI_Allreduce (sum) of `floats` floats over `comm`, after one
//! warm-up; the same on every rank (rank 0's).
inline double measure_mpi_allreduce(MPI_Comm comm, index_t floats, int repeats) {
  std::vector<float> g(static_cast<std::size_t>(floats), 1.f);
  auto once = [&] {
    XPIPE_MPI_CHECK(
        MPI_Allreduce(MPI_IN_PLACE, g.data(), static_cast<int>(floats), MPI_FLOAT, MPI_SUM, comm));
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
//! the others competing as they do in a run): a `seconds` spin's CPU time over its wall time.
//! 1 on a quiet machine with a core per rank; about 0.5 while other processes keep every core
//! busy. Returns the smallest over the ranks of `comm`.
inline double measure_rank_share(MPI_Comm comm, double seconds = 0.05) {
  XPIPE_MPI_CHECK(MPI_Barrier(comm));
  const auto w0 = std::chrono::steady_clock::now();
  const double c0 = thread_cpu_seconds();
  volatile double sink = 0;
  while (xpipe::detail::seconds_since(w0) < seconds)
    for (int j = 0; j < 1000; ++j) sink = sink + 1.0;
  double mine =
             std::clamp((thread_cpu_seconds() - c0) / xpipe::detail::seconds_since(w0), 1e-3, 1.0),
         least = 0;
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
inline MpiRunTime time_mpi_plan(int dp, int pp, const std::string& schedule, int M, index_t batch,
                                int N, int repeats) {
  MpiExecutor exec(MPI_COMM_WORLD, dp);
  if (pp == 1)
    return time_mpi_run<Pipeline<mlp::K1, Latest, AnyOptimizer, MpiChannel>>(exec, schedule, M,
                                                                             batch, N, repeats);
  if (pp == 2)
    return time_mpi_run<Pipeline<mlp::K2a, mlp::K2b, Latest, AnyOptimizer, MpiChannel>>(
        exec, schedule, M, batch, N, repeats);
  throw ConfigError("xpipe-plan: check-mpi runs pp = 1 or 2 (got " + std::to_string(pp) + ")");
}

}  // namespace xpipe::tools
