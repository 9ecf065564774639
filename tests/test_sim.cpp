// The simulator and planner: hand-checked makespans and bubbles, queue capacities and shared
// cores on cases worked out on paper, a property test that every dependency of the IR holds in
// the simulated order, bubble filling, and the planner's pieces (partition, Young/Daly, E(B)).
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <string>

#include "xpipe/xpipe.hpp"

using namespace xpipe;
using namespace xpipe::sim;
using Catch::Contains;

namespace {
CostModel uniform(int K, double f, double b, double s = 0) {
  CostModel m;
  m.stages.assign(K, StageCost{.forward = f, .backward = b, .step = s});
  return m;
}
double start_of(const SimResult& r, int k, const Action& a) {
  for (const ActionTiming& t : r.trace.stages[k])
    if (t.action == a) return t.start;
  FAIL("no action " << to_string(a) << " at stage " << k);
  return 0;
}
double end_of(const SimResult& r, int k, const Action& a) {
  for (const ActionTiming& t : r.trace.stages[k])
    if (t.action == a) return t.end;
  FAIL("no action " << to_string(a) << " at stage " << k);
  return 0;
}
}  // namespace

TEST_CASE("A link's latency and bandwidth are fitted back from its messages", "[sim]") {
  // Messages timed exactly as 2 us + bytes / 5 GB/s: the fit recovers both.
  const sim::LinkCost truth{2e-6, 5e9};
  std::vector<sim::LinkSample> exact;
  for (double b : {4.0, 4096.0, 65536.0, 524288.0, 4194304.0})
    exact.push_back({b, truth.seconds(b)});
  const sim::LinkCost fit = sim::fit_link_cost(exact);
  CHECK(fit.latency == Approx(2e-6).epsilon(1e-9));
  CHECK(fit.bandwidth == Approx(5e9).epsilon(1e-9));
  // Relative error: a 10% slower small message moves the latency, not the bandwidth, by ~10%
  // (an absolute least squares would follow the large messages alone and ignore it).
  std::vector<sim::LinkSample> slow_small = exact;
  for (auto& q : slow_small)
    if (q.bytes < 5000) q.seconds *= 1.1;
  const sim::LinkCost f2 = sim::fit_link_cost(slow_small);
  CHECK(f2.latency > 2.1e-6);
  CHECK(f2.bandwidth == Approx(5e9).epsilon(0.02));
  // No latency: the fit stays at zero rather than going negative.
  std::vector<sim::LinkSample> origin{{1000, 1e-6}, {2000, 2e-6}, {4000, 4e-6}};
  CHECK(sim::fit_link_cost(origin).latency == Approx(0).margin(1e-15));
  CHECK(sim::fit_link_cost(origin).bandwidth == Approx(1e9));
  // Bad samples are named.
  CHECK_THROWS_WITH(sim::fit_link_cost({{4, 1e-6}}),
                    Catch::Contains("needs at least two message sizes"));
  CHECK_THROWS_WITH(sim::fit_link_cost({{4, 1e-6}, {8, 0}}), Catch::Contains("seconds <= 0"));
  CHECK_THROWS_WITH(sim::fit_link_cost({{4, 1e-3}, {1e6, 1e-6}}),
                    Catch::Contains("no positive bandwidth"));
}

TEST_CASE("Simulated GPipe on unit costs has the bubble (K-1)/(M+K-1)", "[sim]") {
  for (int K : {1, 2, 3, 4, 8})
    for (int M : {1, 2, 4, 8}) {
      const SimResult r = simulate(gpipe(K, M, 1), uniform(K, 1, 1));
      INFO("K=" << K << " M=" << M);
      // Fill-drain: the last stage starts at K-1, runs 2M actions back to back, and the last
      // backward walks back K-1 stages.
      REQUIRE(r.seconds == Approx(2.0 * (M + K - 1)));
      for (int k = 0; k < K; ++k)
        REQUIRE(r.bubble_fraction(k) == Approx(double(K - 1) / (M + K - 1)));
      // 1F1B-flush has the same bubble.
      REQUIRE(simulate(one_f_one_b_flush(K, M, 1), uniform(K, 1, 1)).seconds ==
              Approx(2.0 * (M + K - 1)));
    }
}

TEST_CASE("Simulated async 1F1B on unit costs has the makespan 2NM + 2(K-1)", "[sim]") {
  for (int K : {2, 3, 4})
    for (int M : {1, 2, 4})
      for (int N : {1, 3, 5}) {
        INFO("K=" << K << " M=" << M << " N=" << N);
        const SimResult r = simulate(async_1f1b(K, M, N), uniform(K, 1, 1));
        REQUIRE(r.seconds == Approx(2.0 * N * M + 2.0 * (K - 1)));
        REQUIRE(r.per_mini_batch == Approx(r.seconds / N));
      }
}

TEST_CASE("Simulation without limits equals the dry run under the same costs", "[sim]") {
  Rng rng{7};
  for (const char* name :
       {"gpipe", "1f1b-flush", "async-1f1b", "2bw", "zb-h1", "async-zb", "zb-h2"})
    for (int K : {2, 3, 4})
      for (int M : {K, K + 1}) {
        const Schedule s = make_schedule(name, K, M, 3);
        CostModel m;
        for (int k = 0; k < K; ++k)
          m.stages.push_back({.forward = rng.uniform(0.5f, 2.f),
                              .backward = rng.uniform(1.f, 3.f),
                              .step = rng.uniform(0.f, 0.5f)});
        const SimResult r = simulate(s, m);
        const ExecutionTrace d =
            dry_run(s, [&](int k, const Action& a) { return m.seconds(k, a); });
        INFO(name << " K=" << K << " M=" << M);
        REQUIRE(r.seconds == Approx(d.seconds));
        for (int k = 0; k < K; ++k)
          for (std::size_t p = 0; p < s.actions[k].size(); ++p) {
            REQUIRE(r.trace.at(k, p).start == Approx(d.at(k, p).start));
            REQUIRE(r.trace.at(k, p).end == Approx(d.at(k, p).end));
          }
      }
}

TEST_CASE("Simulated interleaved 1F1B: a worker runs one action at a time, as the dry run says",
          "[sim][workers]") {
  Rng rng{5};
  for (const auto& [P, v, M] : {std::tuple{2, 2, 4}, std::tuple{4, 2, 8}, std::tuple{2, 3, 2}}) {
    const Schedule s = interleaved_1f1b(P, v, M, 3);
    CostModel m;
    for (int k = 0; k < P * v; ++k)
      m.stages.push_back({.forward = rng.uniform(0.5f, 2.f),
                          .backward = rng.uniform(1.f, 3.f),
                          .step = rng.uniform(0.f, 0.5f)});
    const SimResult r = simulate(s, m);
    const ExecutionTrace d = dry_run(s, [&](int k, const Action& a) { return m.seconds(k, a); });
    INFO("P=" << P << " v=" << v << " M=" << M);
    REQUIRE(r.seconds == Approx(d.seconds));
    const std::vector<int> owner = stage_workers(s);
    for (int k = 0; k < P * v; ++k)
      for (std::size_t p = 0; p < s.actions[k].size(); ++p) {
        REQUIRE(r.trace.at(k, p).start == Approx(d.at(k, p).start));
        // No other action of the same worker overlaps this one.
        for (int j = 0; j < P * v; ++j)
          if (owner[j] == owner[k])
            for (std::size_t q = 0; q < s.actions[j].size(); ++q)
              if (j != k || q != p)
                REQUIRE((r.trace.at(j, q).end <= r.trace.at(k, p).start + 1e-9 ||
                         r.trace.at(j, q).start >= r.trace.at(k, p).end - 1e-9));
      }
  }
}

TEST_CASE("Simulated order respects every dependency of the IR, links and capacities", "[sim]") {
  Rng rng{11};
  for (const char* name :
       {"gpipe", "1f1b-flush", "async-1f1b", "2bw", "zb-h1", "async-zb", "zb-h2"})
    for (int K : {2, 3, 4, 5})
      for (int M : {K, 2 * K})
        for (int cores : {0, 1, 2})
          for (int cap : {0, 1, 2}) {
            const Schedule s = make_schedule(name, K, M, 3);
            CostModel m;
            m.cores = cores;
            m.link = {.latency = rng.uniform(0.f, 0.3f), .bandwidth = 1000};
            for (int k = 0; k < K; ++k)
              m.stages.push_back({.forward = rng.uniform(0.2f, 2.f),
                                  .backward = rng.uniform(0.2f, 3.f),
                                  .step = rng.uniform(0.f, 0.5f),
                                  .out_bytes = rng.uniform(0.f, 200.f),
                                  .in_bytes = rng.uniform(0.f, 200.f)});
            SimOptions opt;
            if (cap > 0) opt.capacity.assign(K - 1, cap);
            const SimResult r = simulate(s, m, opt);
            INFO(name << " K=" << K << " M=" << M << " cores=" << cores << " cap=" << cap);
            const double eps = 1e-9;
            for (int k = 0; k < K; ++k) {
              double t = 0;
              for (std::size_t p = 0; p < s.actions[k].size(); ++p) {
                const ActionTiming& at = r.trace.at(k, p);
                REQUIRE(at.action == s.actions[k][p]);
                REQUIRE(at.start >= t - eps);  // in list order, one at a time
                REQUIRE(at.end >= at.start);
                if (cores == 0)
                  REQUIRE(at.end - at.start == Approx(m.seconds(k, at.action)));
                else
                  REQUIRE(at.end - at.start >= m.seconds(k, at.action) - eps);
                t = at.end;
                const int from = producer_stage(K, k, at.action);
                if (from >= 0) {
                  const double sent = end_of(r, from, at.action);
                  const double delay =
                      m.link_at(std::min(from, k)).seconds(m.message_bytes(from, at.action));
                  REQUIRE(at.start >= sent + delay - eps);
                }
              }
            }
            // Capacities: messages on a channel are pushed at the producer's end and popped at
            // the consumer's start (forward) or end (backward); when a producer starts, fewer
            // than `capacity` may be queued.
            if (cap > 0)
              for (int k = 0; k < K; ++k)
                for (const ActionTiming& at : r.trace.stages[k]) {
                  const ActionChannels io = channels_of(K, k, at.action);
                  if (!io.out.exists()) continue;
                  const int to = consumer_stage(K, k, at.action);
                  int queued = 0;
                  for (const ActionTiming& other : r.trace.stages[k]) {
                    if (other.action.kind != at.action.kind) continue;
                    const double pushed = other.end;
                    const double popped = other.action.kind == ActionKind::Forward
                                              ? start_of(r, to, other.action)
                                              : end_of(r, to, other.action);
                    if (pushed <= at.start + eps && popped > at.start + eps) ++queued;
                  }
                  REQUIRE(queued < cap);
                }
          }
}

TEST_CASE("A queue of capacity 1 holds the producer back, as counted by hand", "[sim]") {
  // GPipe, K = 2, M = 3: stage 1's forward takes 3, everything else 1, steps 0.
  CostModel m = uniform(2, 1, 1);
  m.stages[1].forward = 3;
  const Schedule s = gpipe(2, 3, 1);
  // Default capacity (3, the micro-batches in flight): stage 0 forwards at 0, 1, 2; stage 1 at
  // 1, 4, 7, backward 10..13; stage 0's backwards 11..14.
  const SimResult free_run = simulate(s, m);
  REQUIRE(start_of(free_run, 0, fwd(2)) == Approx(2));
  REQUIRE(free_run.seconds == Approx(14));
  // Capacity 1: F2 at stage 0 waits for stage 1 to pop F1 (at 4); the gradients queue makes
  // stage 1's B1 wait for stage 0's B0 to finish with B0's message (12), B2 for B1's (14).
  const SimResult tight = simulate(s, m, {.capacity = {1}});
  REQUIRE(start_of(tight, 0, fwd(1)) == Approx(1));
  REQUIRE(start_of(tight, 0, fwd(2)) == Approx(4));
  REQUIRE(start_of(tight, 1, bwd(1)) == Approx(12));
  REQUIRE(start_of(tight, 1, bwd(2)) == Approx(14));
  REQUIRE(tight.seconds == Approx(16));
  REQUIRE_THROWS_WITH(simulate(s, m, {.capacity = {0}}), Contains("capacity must be >= 1"));
  REQUIRE_THROWS_WITH(simulate(s, m, {.capacity = {1, 1}}),
                      Contains("one entry per stage boundary"));
}

TEST_CASE("Stage threads sharing cores slow down as counted by hand", "[sim]") {
  // GPipe K = 2, M = 2, unit costs, one core: F0@0 alone [0,1]; F1@0 and F0@1 share [1,3];
  // F1@1 [3,4]; B0@1 [4,5]; B1@1 and B0@0 share [5,7]; B1@0 [7,8].
  CostModel m = uniform(2, 1, 1);
  m.cores = 1;
  const SimResult r = simulate(gpipe(2, 2, 1), m);
  REQUIRE(end_of(r, 0, fwd(1)) == Approx(3));
  REQUIRE(end_of(r, 1, fwd(0)) == Approx(3));
  REQUIRE(end_of(r, 1, bwd(1)) == Approx(7));
  REQUIRE(r.seconds == Approx(8));
  // Never idle with one core: the makespan is all the work, 2 stages x 2 actions x N M.
  const SimResult a = simulate(async_1f1b(2, 2, 4), m);
  REQUIRE(a.seconds == Approx(2 * 2 * 8));
  // Half a core (a shared machine): one stage's F + B take 4 instead of 2; with 1.5 cores a
  // lone action still runs at the speed of one core.
  CostModel shared = uniform(1, 1, 1);
  shared.cores = 0.5;
  REQUIRE(simulate(gpipe(1, 1, 1), shared).seconds == Approx(4));
  shared.cores = 1.5;
  REQUIRE(simulate(gpipe(1, 1, 1), shared).seconds == Approx(2));
  // Measured sharing: one action alone gets 0.5 of a core, two together 0.6 (0.3 each).
  // GPipe K = 2, M = 2, F = B = 1: F0@0 alone at 0.5 [0,2]; F1@0 and F0@1 at 0.3 [2,5.33];
  // F1@1 alone [5.33,7.33]; B0@1 [7.33,9.33]; B1@1 and B0@0 together [9.33,12.67]; B1@0 alone
  // [12.67,14.67].
  CostModel measured = uniform(2, 1, 1);
  measured.cores_with = {0.5, 0.6};
  REQUIRE(simulate(gpipe(2, 2, 1), measured).seconds == Approx(2 + 1 / 0.3 + 2 + 2 + 1 / 0.3 + 2));
  // As many cores as stages: as if unshared.
  m.cores = 2;
  REQUIRE(simulate(async_1f1b(2, 2, 4), m).seconds ==
          Approx(simulate(async_1f1b(2, 2, 4), uniform(2, 1, 1)).seconds));
}

TEST_CASE("Stages pinned to cores share only their own core, as counted by hand", "[sim]") {
  // Both stages on core 0 (GPipe K = 2, M = 2, unit costs): the same as one shared core, 8.
  CostModel one = uniform(2, 1, 1);
  one.core_of = {0, 0};
  REQUIRE(simulate(gpipe(2, 2, 1), one).seconds == Approx(8));
  // One core each: as if unshared, whatever `cores` says (pinning decides).
  CostModel apart = uniform(2, 1, 1);
  apart.core_of = {0, 1};
  apart.cores = 1;
  REQUIRE(simulate(async_1f1b(2, 2, 4), apart).seconds ==
          Approx(simulate(async_1f1b(2, 2, 4), uniform(2, 1, 1)).seconds));
  // Async 1F1B K = 2, M = 1 on one core: never idle, so all the work, 2 x 2 x N.
  REQUIRE(simulate(async_1f1b(2, 1, 5), one).seconds == Approx(2 * 2 * 5));
  // GPipe K = 3, M = 3, unit costs, stages 0 and 2 on core 0, stage 1 on core 1: F0@0 [0,1];
  // F1@0 and F0@1 [1,2] on different cores; from 2, F2@0, F1@1 and F0@2 run together: F1@1
  // alone on core 1 ends at 3, the two on core 0 at half speed end at 4. One pool of 2 cores
  // would instead give each of the three 2/3 and end all three at 3.5.
  CostModel pinned = uniform(3, 1, 1);
  pinned.core_of = {0, 1, 0};
  const SimResult p = simulate(gpipe(3, 3, 1), pinned);
  REQUIRE(end_of(p, 1, fwd(1)) == Approx(3));
  REQUIRE(end_of(p, 0, fwd(2)) == Approx(4));
  REQUIRE(end_of(p, 2, fwd(0)) == Approx(4));
  CostModel pool = uniform(3, 1, 1);
  pool.cores = 2;
  const SimResult q = simulate(gpipe(3, 3, 1), pool);
  REQUIRE(end_of(q, 1, fwd(1)) == Approx(3.5));
  REQUIRE(end_of(q, 0, fwd(2)) == Approx(3.5));
  REQUIRE(end_of(q, 2, fwd(0)) == Approx(3.5));
  // A core this process gets half of (other processes run there) takes twice as long: 16.
  one.core_speed = {0.5};
  REQUIRE(simulate(gpipe(2, 2, 1), one).seconds == Approx(16));
  // Speeds per core, the K = 3 case with core 1 at half speed: F0@0 [0,1]; F1@0 [1,2] on core
  // 0 while F0@1 runs on core 1 at half speed, [1,3]; F2@0 alone on core 0, [2,3]; F1@1 from 3
  // alone on core 1 at half speed ends at 5.
  pinned.core_speed = {1.0, 0.5};
  const SimResult slow = simulate(gpipe(3, 3, 1), pinned);
  REQUIRE(end_of(slow, 1, fwd(0)) == Approx(3));
  REQUIRE(end_of(slow, 1, fwd(1)) == Approx(5));
  REQUIRE(end_of(slow, 0, fwd(2)) == Approx(3));
  CostModel bad = uniform(2, 1, 1);
  bad.core_of = {0, 1};
  bad.core_speed = {1.0};
  REQUIRE_THROWS_WITH(simulate(gpipe(2, 2, 1), bad), Contains("core_of names core 1"));
  bad.core_speed = {1.0, 0.0};
  REQUIRE_THROWS_WITH(simulate(gpipe(2, 2, 1), bad), Contains("core_speed entries must be"));
  bad.core_speed.clear();
  bad.core_of = {0};
  REQUIRE_THROWS_WITH(simulate(gpipe(2, 2, 1), bad), Contains("core_of needs one core per stage"));
  bad.core_of = {0, -1};
  REQUIRE_THROWS_WITH(simulate(gpipe(2, 2, 1), bad), Contains("core_of entries must be >= 0"));
}

TEST_CASE(
    "Run to completion: a core runs one action at a time, first ready first, as counted by "
    "hand",
    "[sim]") {
  // GPipe K = 2, M = 2, unit costs, both stages on core 0. At 1, F1@0 and F0@1 are both ready:
  // a tie, the lower stage first: F1@0 [1,2], F0@1 [2,3]; F1@1 [3,4]; B0@1 [4,5]; at 5 B0@0 and
  // B1@1 tie again: B0@0 [5,6], B1@1 [6,7]; B1@0 [7,8]. Each action at the core's full speed, the
  // same makespan (8) as the shared core's, where F1@0 and F0@1 both ran [1,3].
  CostModel one = uniform(2, 1, 1);
  one.core_of = {0, 0};
  one.sharing = CoreSharing::run_to_completion;
  const SimResult r = simulate(gpipe(2, 2, 1), one);
  REQUIRE(end_of(r, 0, fwd(1)) == Approx(2));
  REQUIRE(start_of(r, 1, fwd(0)) == Approx(2));
  REQUIRE(end_of(r, 1, fwd(0)) == Approx(3));
  REQUIRE(start_of(r, 0, bwd(0)) == Approx(5));
  REQUIRE(start_of(r, 1, bwd(1)) == Approx(6));
  REQUIRE(end_of(r, 0, bwd(1)) == Approx(8));
  REQUIRE(r.seconds == Approx(8));
  // Stage 1 computed 4 of the 8 (idle 1/2); shared, it was busy [1,3] and [5,7] for 4 units of
  // work stretched over 6 (idle 1/4).
  REQUIRE(r.bubble_fraction(1) == Approx(0.5));
  CostModel shared = one;
  shared.sharing = CoreSharing::processor;
  REQUIRE(simulate(gpipe(2, 2, 1), shared).bubble_fraction(1) == Approx(0.25));
  // Never idle on one core either way: async 1F1B K = 2, M = 1 is all the work, 2 x 2 x N.
  REQUIRE(simulate(async_1f1b(2, 1, 5), one).seconds == Approx(2 * 2 * 5));
  // First ready, first run: GPipe K = 3, M = 3, stages 0 and 2 on core 0, stage 1 on core 1,
  // stage 0's forward 2, every other action 1. F0@0 [0,2]; F1@0 [2,4] and F0@1 [2,3]; F0@2 is
  // ready at 3 but core 0 is busy; at 4 F2@0 becomes ready too, after F0@2, so F0@2 [4,5], then
  // F2@0 [5,7] (the lower stage first would have run F2@0 [4,6] and F0@2 [6,7]).
  CostModel pinned = uniform(3, 1, 1);
  pinned.stages[0].forward = 2;
  pinned.core_of = {0, 1, 0};
  pinned.sharing = CoreSharing::run_to_completion;
  const SimResult p = simulate(gpipe(3, 3, 1), pinned);
  REQUIRE(start_of(p, 2, fwd(0)) == Approx(4));
  REQUIRE(end_of(p, 2, fwd(0)) == Approx(5));
  REQUIRE(start_of(p, 0, fwd(2)) == Approx(5));
  REQUIRE(end_of(p, 0, fwd(2)) == Approx(7));
  REQUIRE(start_of(p, 1, fwd(1)) == Approx(4));
  // A core this process gets half of: each action takes twice as long, one at a time (16).
  one.core_speed = {0.5};
  REQUIRE(simulate(gpipe(2, 2, 1), one).seconds == Approx(16));
  CostModel unplaced = uniform(2, 1, 1);
  unplaced.sharing = CoreSharing::newest_first;
  REQUIRE_THROWS_WITH(simulate(gpipe(2, 2, 1), unplaced), Contains("needs core_of"));
}

TEST_CASE(
    "Newest first: an action that becomes ready preempts its core's running one, as counted "
    "by hand",
    "[sim]") {
  // GPipe K = 2, M = 2, unit costs, both stages on core 0. At 1, F1@0 and F0@1 become ready
  // together: the lower stage runs, F1@0 [1,2], while F0@1 (started at 1) waits and ends at 3;
  // F1@1 [3,4]; B0@1 [4,5]; at 5 B0@0 [5,6] runs ahead of B1@1, which started at 5 and ends at
  // 7; at 7 B1@0 [7,8] runs ahead of stage 1's step (no work, but it waits for the core: it
  // spans [7,8]). Stage 0 computes 4 of 8 (idle 1/2); stage 1 spans 7 of 8 (idle 1/8).
  CostModel one = uniform(2, 1, 1);
  one.core_of = {0, 0};
  one.sharing = CoreSharing::newest_first;
  const SimResult r = simulate(gpipe(2, 2, 1), one);
  REQUIRE(end_of(r, 0, fwd(1)) == Approx(2));
  REQUIRE(start_of(r, 1, fwd(0)) == Approx(1));
  REQUIRE(end_of(r, 1, fwd(0)) == Approx(3));
  REQUIRE(start_of(r, 1, bwd(1)) == Approx(5));
  REQUIRE(end_of(r, 1, bwd(1)) == Approx(7));
  REQUIRE(end_of(r, 0, bwd(1)) == Approx(8));
  REQUIRE(r.seconds == Approx(8));
  REQUIRE(r.bubble_fraction(0) == Approx(0.5));
  REQUIRE(r.bubble_fraction(1) == Approx(0.125));
  // Preemption: GPipe K = 3, M = 3, stages 0 and 2 on core 0, stage 1 on core 1, stage 0's
  // forward 2, every other action 1. F0@0 [0,2]; F1@0 from 2 and F0@1 [2,3]; at 3 F0@2 preempts
  // F1@0 (half done): F0@2 [3,4], F1@0 resumes and ends at 5; F2@0 from 5, F1@1 [5,6]; at 6
  // F1@2 preempts F2@0: F1@2 [6,7], F2@0 ends at 8.
  CostModel pinned = uniform(3, 1, 1);
  pinned.stages[0].forward = 2;
  pinned.core_of = {0, 1, 0};
  pinned.sharing = CoreSharing::newest_first;
  const SimResult p = simulate(gpipe(3, 3, 1), pinned);
  REQUIRE(start_of(p, 0, fwd(1)) == Approx(2));
  REQUIRE(end_of(p, 0, fwd(1)) == Approx(5));
  REQUIRE(start_of(p, 2, fwd(0)) == Approx(3));
  REQUIRE(end_of(p, 2, fwd(0)) == Approx(4));
  REQUIRE(start_of(p, 2, fwd(1)) == Approx(6));
  REQUIRE(end_of(p, 2, fwd(1)) == Approx(7));
  REQUIRE(end_of(p, 0, fwd(2)) == Approx(8));
}

TEST_CASE("Simulated peak memory counts weight copies, state, workspace and activations in flight",
          "[sim]") {
  CostModel m = uniform(4, 1, 1);
  for (auto& c : m.stages)
    c = {.forward = 1,
         .backward = 1,
         .weight_bytes = 100,
         .state_bytes = 300,
         .activation_bytes = 10,
         .weight_copies = 2};
  const SimResult g = simulate(gpipe(4, 6, 2), m);
  const SimResult f = simulate(one_f_one_b_flush(4, 6, 2), m);
  for (int k = 0; k < 4; ++k) {
    REQUIRE(g.peak_in_flight[k] == 6);      // GPipe holds all M
    REQUIRE(f.peak_in_flight[k] == 4 - k);  // 1F1B at most K - k
    REQUIRE(f.peak_memory_bytes[k] == Approx(2 * 100 + 300 + 10 * (4 - k)));
  }
  // ZB-H1 holds 4 micro-batches at every stage, each with its kept gradients too; 1F1B keeps
  // none of those (its backward is whole).
  for (auto& c : m.stages) c.kept_gradient_bytes = 5;
  const SimResult z = simulate(zb_h1(4, 6, 2), m);
  const SimResult f2 = simulate(one_f_one_b_flush(4, 6, 2), m);
  for (int k = 0; k < 4; ++k) {
    REQUIRE(z.peak_in_flight[k] == 4);
    REQUIRE(z.peak_memory_bytes[k] == Approx(2 * 100 + 300 + (10 + 5) * 4));
    REQUIRE(f2.peak_memory_bytes[k] == Approx(2 * 100 + 300 + 10 * (4 - k)));
  }
  // ZB-H2 at M = 8 >= 2K - 1 fills every stage to 2K - 1 = 7, as the analysis says.
  const SimResult z2 = simulate(zb_h2(4, 8, 2), m);
  for (int k = 0; k < 4; ++k) {
    REQUIRE(z2.peak_in_flight[k] == 7);
    REQUIRE(z2.peak_memory_bytes[k] == Approx(2 * 100 + 300 + (10 + 5) * 7));
  }
  // A stage's workspace counts once, whatever its slots.
  for (auto& c : m.stages) c.workspace_bytes = 70;
  const SimResult fw = simulate(one_f_one_b_flush(4, 6, 2), m);
  const SimResult zw = simulate(zb_h2(4, 8, 2), m);
  for (int k = 0; k < 4; ++k) {
    REQUIRE(fw.peak_memory_bytes[k] == Approx(2 * 100 + 300 + 70 + 10 * (4 - k)));
    REQUIRE(zw.peak_memory_bytes[k] == Approx(2 * 100 + 300 + 70 + (10 + 5) * 7));
  }
}

TEST_CASE("Simulated ZB-H1 has the published bubble - I and W cost halves unless given",
          "[sim][zb]") {
  // Unit F, I = W = 1/2 of a backward of 2: (K-1)(T_F + T_I - T_W) = K - 1 idle per stage.
  for (int K : {2, 4})
    for (int M : {K, 2 * K}) {
      INFO("K=" << K << " M=" << M);
      const SimResult z = simulate(zb_h1(K, M, 1), uniform(K, 1, 2));
      const SimResult o = simulate(one_f_one_b_flush(K, M, 1), uniform(K, 1, 2));
      REQUIRE(z.seconds == Approx(3.0 * M + (K - 1)));
      REQUIRE(o.seconds == Approx(3.0 * (M + K - 1)));
    }
  // Given halves win over the split of the backward: F = 2, I = 2, W = 1 (the backward, 3, is
  // not split in halves): at K = M = 4, 4 (2 + 2 + 1) + 3 (2 + 2 - 1) = 29.
  CostModel m = uniform(4, 2, 3);
  for (auto& c : m.stages) c.input_grad = 2, c.weight_grad = 1;
  REQUIRE(simulate(zb_h1(4, 4, 1), m).seconds == Approx(4 * 5.0 + 3 * 3.0));
}

TEST_CASE("Simulator errors name what is wrong", "[sim]") {
  REQUIRE_THROWS_WITH(simulate(gpipe(2, 2, 1), uniform(3, 1, 1)),
                      Contains("cost model has 3 stages"));
  CostModel bad = uniform(2, 1, 1);
  bad.stages[1].backward = -1;
  REQUIRE_THROWS_WITH(simulate(gpipe(2, 2, 1), bad), Contains("stage 1: backward"));
  bad = uniform(2, 1, 1);
  bad.stages[0].forward = std::nan("");
  REQUIRE_THROWS_WITH(simulate(gpipe(2, 2, 1), bad), Contains("stage 0: forward"));
}

TEST_CASE("Simulated runs write the same trace formats as measured ones", "[sim]") {
  const Schedule s = async_1f1b(3, 2, 2);
  const SimResult r = simulate(s, uniform(3, 1e-3, 2e-3));
  const std::string json = chrome_trace_json(r.trace, s, "simulated");
  REQUIRE_THAT(json, Contains("\"name\":\"B3\""));
  REQUIRE_THAT(timeline_svg(r.trace, s), Contains("<svg"));
}

TEST_CASE("Bubble filling packs work into idle periods, split along the batch", "[sim]") {
  // GPipe K = 2, M = 1, unit costs: stage 0 idles [1,3]; stage 1 idles [0,1] and [3,4].
  const SimResult r = simulate(gpipe(2, 1, 1), uniform(2, 1, 1));
  const FillResult f = fill_bubbles(r.trace, {{3, 0.5}, {5, 0.5}});
  REQUIRE(f.filled_samples[0] == 3);  // 1.5 s into the 2 s gap
  REQUIRE(f.filled_samples[1] == 4);  // 2 + 2, one sample left over
  REQUIRE(f.outside_seconds == Approx(4 + 2.5));
  REQUIRE(f.filled_seconds == Approx(4.5));
  REQUIRE(f.saved_seconds() == Approx(2));
  REQUIRE_THROWS_WITH(fill_bubbles(r.trace, {{1, 1}}), Contains("one FillWork per stage"));
}

TEST_CASE("Planner pieces: partition, all-reduce, Young/Daly, E(B)", "[sim][plan]") {
  REQUIRE(balanced_partition({1, 2, 3, 4, 5}, 2) == std::vector<std::size_t>{0, 3});
  REQUIRE(balanced_partition({1, 2, 3, 4, 5}, 3) == std::vector<std::size_t>{0, 3, 4});
  REQUIRE(balanced_partition({5, 1, 1, 1}, 2) == std::vector<std::size_t>{0, 1});
  REQUIRE_THROWS_WITH(balanced_partition({1, 2}, 3), Contains("cannot split 2 layers into 3"));
  REQUIRE(ring_allreduce_seconds(1e9, 4, {.latency = 0, .bandwidth = 1e9}) == Approx(1.5));
  REQUIRE(ring_allreduce_seconds(1e9, 1, {.latency = 1, .bandwidth = 1}) == 0);
  REQUIRE(young_daly_interval(60, 3600) == Approx(std::sqrt(2.0 * 60 * 3600)));
  EfficiencyCurve e{{{400, 8}, {100, 2}}, "t"};
  e.check();
  REQUIRE(e.epochs(100) == Approx(2));
  REQUIRE(e.epochs(200) == Approx(4));  // log-log line through (100, 2) and (400, 8)
  REQUIRE_THROWS_WITH(e.epochs(800), Contains("outside the measured range"));
  EfficiencyCurve empty;
  REQUIRE_THROWS_WITH(empty.check(), Contains("points is empty"));
}

TEST_CASE("A stage's cost holds its layers' workspace once for a batch, and the largest arena",
          "[sim][plan]") {
  const DeviceSpec d{.name = "d", .peak_flops = 1e12, .memory_bandwidth = 1e11};
  const auto layer = [](const char* name, double workspace, double arena) {
    return LayerSpec{.name = name,
                     .in_width = 4,
                     .out_width = 4,
                     .activation_floats = 4,
                     .workspace_floats = workspace,
                     .arena_floats = arena,
                     .forward_flops = 1,
                     .backward_flops = 1};
  };
  const std::vector<LayerSpec> layers = {layer("a", 2, 5), layer("b", 3, 7)};
  // Worked by hand, micro-batches of 4 in a batch of 16: the layers' own floats add up (2 + 3
  // a sample), their arenas do not (the larger, 7), all for the 16 samples the workspace is
  // made for; the slots' bytes stay per micro-batch.
  const StageCost both = stage_cost(layers, 0, 2, 4, d, 16);
  REQUIRE(both.workspace_bytes == Approx(4 * 16 * (2 + 3 + 7)));
  REQUIRE(both.activation_bytes == Approx(4 * 4 * (4 + 4)));
  REQUIRE(stage_cost(layers, 0, 1, 4, d, 16).workspace_bytes == Approx(4 * 16 * (2 + 5)));
  // Without a batch, the micro-batch's rows.
  REQUIRE(stage_cost(layers, 0, 2, 4, d).workspace_bytes == Approx(4 * 4 * (2 + 3 + 7)));
}

TEST_CASE("Planner on an analytic one-layer model, checked by hand", "[sim][plan]") {
  PlanRequest r;
  // One layer: 1e9 FLOPs per sample forward, 2e9 backward; 1e6 parameters.
  r.layers = {LayerSpec{.name = "l",
                        .params = 1e6,
                        .in_width = 10,
                        .out_width = 10,
                        .activation_floats = 10,
                        .forward_flops = 1e9,
                        .backward_flops = 2e9}};
  r.cluster.devices = 1;
  r.cluster.device = {
      .name = "d", .peak_flops = 1e12, .memory_bandwidth = 1e11, .memory_bytes = 1e9};
  r.cluster.price_per_hour = 3.6;
  r.efficiency = {{{100, 2}}, "t"};
  r.dataset_samples = 1000;
  r.batch_per_replica = {100};
  r.micro_batches = {1};
  const PlanResult out = make_plans(r);
  REQUIRE(out.plans.size() == 1);
  const Plan& p = out.plans[0];
  // Step: forward 100 x 1e9 / 1e12 = 0.1 s, backward 0.2 s, Adam 28 x 1e6 / 1e11 = 0.28 ms.
  const double step = 0.1 + 0.2 + 28e6 / 1e11;
  REQUIRE(p.step_seconds == Approx(step));
  REQUIRE(p.time_to_accuracy == Approx(2 * (1000 / 100.0) * step));
  REQUIRE(p.cost == Approx(3.6 * p.time_to_accuracy / 3600));
  REQUIRE(p.expected_seconds == p.time_to_accuracy);
  // Transient: one revocation an hour, 10 s checkpoints (fixed), 30 s restart.
  r.cluster.transient = true;
  r.cluster.revocations_per_hour = 1;
  r.cluster.checkpoint_fixed = 10;
  r.cluster.restart_seconds = 30;
  const Plan t = make_plans(r).plans[0];
  const double tau = std::sqrt(2 * 10 * 3600.0);
  REQUIRE(t.checkpoint_interval == Approx(tau));
  REQUIRE(t.expected_seconds ==
          Approx(p.time_to_accuracy * (1 + 10 / tau) / (1 - (tau / 2 + 30) / 3600)));
  // Nothing fits: the error names the field and the smallest need.
  r.cluster.device.memory_bytes = 1e6;
  REQUIRE_THROWS_WITH(
      make_plans(r), Contains("no plan fits in memory") && Contains("cluster.device.memory_bytes"));
  r.cluster.device.memory_bytes = 1e9;
  r.efficiency.points.clear();
  REQUIRE_THROWS_WITH(make_plans(r), Contains("efficiency curve: points is empty"));
}

TEST_CASE("Planner weighs two stages per device: ZB-V wins at 1F1B's memory until it fits no more",
          "[sim][plan]") {
  // Four equal layers on 2 devices, pp = 2, M = 4, 8 rows a micro-batch: a layer's forward F =
  // 8 ms, its backward 2F (I = W = F: the split's halves). One stage per device holds two
  // layers; two per device (interleaved, V) one each. No parameters: the steps take no time
  // and no gradient is kept, so memory is activations alone, a = 4 x 8 x 1000 bytes a layer.
  PlanRequest r;
  for (int i = 0; i < 4; ++i)
    r.layers.push_back(LayerSpec{.name = "l",
                                 .params = 0,
                                 .in_width = 10,
                                 .out_width = 10,
                                 .activation_floats = 1000,
                                 .forward_per_sample = 1e-3,
                                 .backward_per_sample = 2e-3});
  r.cluster.devices = 2;
  r.cluster.device = {
      .name = "d", .peak_flops = 1e12, .memory_bandwidth = 1e11, .memory_bytes = 1e9};
  r.efficiency = {{{32, 1}}, "t"};
  r.dataset_samples = 1000;
  r.batch_per_replica = {32};
  r.micro_batches = {4};
  r.device_counts = {2};
  const double F = 8e-3, a = 4 * 8 * 1000;
  const auto by_schedule = [](const PlanResult& out) {
    std::map<std::string, Plan> m;
    for (const Plan& p : out.plans)
      if (p.pp == 2) m[p.schedule] = p;
    return m;
  };
  const auto plans = by_schedule(make_plans(r));
  REQUIRE(plans.size() == 8);
  // Per mini-batch (steady state), a device's work is 4 (F + 2F) x 2 layers = 24F:
  REQUIRE(plans.at("zb-v").step_seconds == Approx(24 * F));   // no bubble at F = I = W (Qi et al.)
  REQUIRE(plans.at("zb-h1").step_seconds == Approx(26 * F));  // + (P-1)(F + I - W), 2-layer F
  REQUIRE(plans.at("zb-h2").step_seconds == Approx(24 * F));  // max(3M, 2M + 2P - 1) 2-layer F
  REQUIRE(plans.at("zb-auto").step_seconds == Approx(24 * F));  // equal costs: ZB-H2's order
  REQUIRE(plans.at("interleaved-1f1b").step_seconds == Approx(27 * F));  // + (P-1)(F + B)
  REQUIRE(plans.at("1f1b-flush").step_seconds == Approx(30 * F));        // (M + P - 1)(F + B)
  REQUIRE(plans.at("gpipe").step_seconds == Approx(30 * F));
  REQUIRE(plans.at("dualpipev").step_seconds <= 26 * F + 1e-12);  // DeepSeek's bound, + 2F
  // The fullest device: ZB-V's 2P = 4 one-layer micro-batches are 1F1B's 2 two-layer ones.
  REQUIRE(plans.at("zb-v").peak_memory_bytes == Approx(4 * a));
  REQUIRE(plans.at("1f1b-flush").peak_memory_bytes == Approx(4 * a));
  REQUIRE(plans.at("zb-h1").peak_memory_bytes == Approx(4 * a));
  REQUIRE(plans.at("zb-h2").peak_memory_bytes == Approx(6 * a));  // 2P - 1 = 3 two-layer ones
  REQUIRE(plans.at("zb-auto").peak_memory_bytes == Approx(6 * a));
  REQUIRE(plans.at("dualpipev").peak_memory_bytes == Approx(5 * a));         // PP + 1
  REQUIRE(plans.at("interleaved-1f1b").peak_memory_bytes == Approx(5 * a));  // 3 + 2 on worker 0
  REQUIRE(plans.at("gpipe").peak_memory_bytes == Approx(8 * a));
  REQUIRE(plans.at("zb-v").first_layer == std::vector<std::size_t>{0, 1, 2, 3});
  // ZB-H2 ties with ZB-V at 24F; at equal speed the one needing less memory ranks first.
  REQUIRE(make_plans(r).plans[0].schedule == "zb-v");
  REQUIRE(make_plans(r).plans[1].schedule == "zb-h2");
  // Room for 4.5 a: the five that need more are dropped; ZB-V still wins.
  r.cluster.device.memory_bytes = 4.5 * a;
  const PlanResult tight = make_plans(r);
  REQUIRE(tight.dropped_memory == 5);
  const auto fitting = by_schedule(tight);
  REQUIRE(fitting.size() == 3);
  REQUIRE(fitting.count("zb-v") + fitting.count("zb-h1") + fitting.count("1f1b-flush") == 3);
  REQUIRE(tight.plans[0].schedule == "zb-v");
}

TEST_CASE("Planner: zb-auto fitted to uneven stages reaches the busiest stage's bound, ZB-H2 not",
          "[sim][plan]") {
  // Three measured layers, one per device at pp = 3, the middle one twice as slow: forward F,
  // 2F, F on a 16-row micro-batch (b = 32, M = 2), backward twice the forward, so its halves
  // I = W = the forward. The middle stage works 2 x 3 x 2F = 12F per mini-batch: no schedule
  // takes less. Fitted to these costs zb-auto takes 12F at ZB-H2's memory; ZB-H2's unit-step
  // order lets the middle stage wait.
  PlanRequest r;
  for (double f : {1e-3, 2e-3, 1e-3})
    r.layers.push_back(LayerSpec{.name = "l",
                                 .params = 0,
                                 .in_width = 10,
                                 .out_width = 10,
                                 .activation_floats = 1000,
                                 .forward_per_sample = f,
                                 .backward_per_sample = 2 * f});
  r.cluster.devices = 3;
  r.cluster.device = {
      .name = "d", .peak_flops = 1e12, .memory_bandwidth = 1e11, .memory_bytes = 1e9};
  r.efficiency = {{{32, 1}}, "t"};
  r.dataset_samples = 1000;
  r.batch_per_replica = {32};
  r.micro_batches = {2};
  r.device_counts = {3};
  const double F = 16e-3;
  std::map<std::string, Plan> plans;
  for (const Plan& p : make_plans(r).plans)
    if (p.pp == 3) plans[p.schedule] = p;
  REQUIRE(plans.at("zb-auto").step_seconds == Approx(12 * F));
  REQUIRE(plans.at("zb-h2").step_seconds > 12.5 * F);
  REQUIRE(plans.at("zb-auto").peak_memory_bytes <= plans.at("zb-h2").peak_memory_bytes);
  // ZB-H1 reaches it too here, with less memory, and so ranks first; none is faster.
  REQUIRE(make_plans(r).plans[0].step_seconds == Approx(12 * F));
}

TEST_CASE("Planner ranks by time, keeps only fitting plans, and its Pareto front is undominated",
          "[sim][plan]") {
  PlanRequest r;
  // Three analytic layers; a device that holds two of them with Adam state (16 bytes
  // a parameter, plus activations), so pp = 1 cannot fit and is dropped.
  for (int i = 0; i < 3; ++i)
    r.layers.push_back(LayerSpec{.name = "l",
                                 .params = 1e6,
                                 .in_width = 100,
                                 .out_width = 100,
                                 .activation_floats = 100,
                                 .forward_flops = 2e8,
                                 .backward_flops = 4e8});
  r.cluster.devices = 8;
  r.cluster.device = {
      .name = "d", .peak_flops = 1e12, .memory_bandwidth = 1e11, .memory_bytes = 4e7};
  r.cluster.allreduce_link = {.latency = 1e-5, .bandwidth = 1e9};
  r.cluster.price_per_hour = 1;
  r.efficiency = {{{32, 1}, {4096, 8}}, "t"};
  r.dataset_samples = 1e5;
  r.batch_per_replica = {32, 128};
  const PlanResult out = make_plans(r);
  REQUIRE(out.dropped_memory > 0);
  for (std::size_t i = 0; i < out.plans.size(); ++i) {
    const Plan& p = out.plans[i];
    REQUIRE(p.pp >= 2);  // one stage of three layers needs 3 x 16 MB > 40 MB
    REQUIRE(p.peak_memory_bytes <= r.cluster.device.memory_bytes);
    REQUIRE(p.dp * p.pp == p.devices);
    REQUIRE(p.global_batch == p.dp * p.batch_per_replica);
    // Fastest first; times equal in single precision count as a tie (broken by memory).
    if (i > 0)
      REQUIRE(static_cast<float>(out.plans[i - 1].expected_seconds) <=
              static_cast<float>(p.expected_seconds));
  }
  const auto front = pareto_front(out.plans);
  REQUIRE(!front.empty());
  for (const Plan& f : front)
    for (const Plan& p : out.plans) {
      const bool dominates =
          (p.expected_seconds < f.expected_seconds && p.expected_cost <= f.expected_cost) ||
          (p.expected_seconds <= f.expected_seconds && p.expected_cost < f.expected_cost);
      REQUIRE_FALSE(dominates);
    }
}
