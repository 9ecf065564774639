// The MPI executor under mpirun: bitwise equality with the threaded executor for every schedule
// x predictor (dp = 1; a stage per rank, and 4 stages on 2 ranks for the schedules of two stages
// per worker; and the same MpiChannel pipeline trained in one process) and for every schedule
// under global gradient-norm clipping; data parallelism (replicas bitwise equal; dp = 2 x 2
// ranks, of 2 stages and of 4, against one process at the same global batch, clipped too); and
// the faults (a killed, a stopped, a NaN rank; a rank stopped in a wait and continued after the
// others gave up), which fault_case.sh times. Usage: mpirun -np N xpipe_test_mpi
// bitwise|dp|fault <kind> [timeout s].
#include <mpi.h>
#include <signal.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "../support/support.hpp"
#include "mpi_support.hpp"
#include "xpipe/exec/mpi.hpp"
#include "xpipe/xpipe.hpp"

using namespace xpipe;
using namespace xpipe::test::mpi;

namespace {

// A 64-bit FNV-1a hash of the bytes of `w`: replicas compare it instead of whole buffers.
std::uint64_t hash_of(const std::vector<float>& w) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* b = reinterpret_cast<const unsigned char*>(w.data());
  for (std::size_t i = 0; i < w.size() * sizeof(float); ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

struct Outcome {
  std::vector<float> weights;
  std::vector<double> losses;  // per epoch
  std::vector<double> norms;   // with clipping: the last epoch's global gradient norms
  std::string error;           // what train() threw, if it threw
};

// Trains `epochs` epochs of `d` with the threaded executor in this process.
template <class P>
Outcome train_threaded(const std::string& sched, const std::string& pred, int M, index_t batch,
                       const test::LabelledData& d, int epochs, float clip = 0) {
  Outcome o;
  try {
    P pipe(optimizer_for(pred),
           PipelineOptions{.batch = batch, .micro_batches = M, .seed = 7, .clip_norm = clip},
           make_predictor(pred));
    const Schedule s =
        make_schedule(sched, P::stage_count, M, static_cast<int>(pipe.mini_batches_for(d.rows)),
                      test::uneven_costs(P::stage_count));
    ThreadedExecutor exec;
    for (int e = 0; e < epochs; ++e) o.losses.push_back(pipe.train(s, d.epoch(), exec).loss);
    o.weights = pipe.weights();
    o.norms = pipe.gradient_norms();
  } catch (const std::exception& e) {
    o.error = e.what();
  }
  return o;
}

// The same on the ranks: each runs its stage; afterwards every rank holds every stage's state.
template <class P>
Outcome train_mpi(MpiExecutor& exec, const std::string& sched, const std::string& pred, int M,
                  index_t batch, const test::LabelledData& d, int epochs, float clip = 0) {
  Outcome o;
  try {
    P pipe(optimizer_for(pred),
           PipelineOptions{.batch = batch, .micro_batches = M, .seed = 7, .clip_norm = clip},
           make_predictor(pred));
    const Schedule s =
        make_schedule(sched, P::stage_count, M, static_cast<int>(pipe.mini_batches_for(d.rows)),
                      test::uneven_costs(P::stage_count));
    for (int e = 0; e < epochs; ++e) o.losses.push_back(pipe.train(s, d.epoch(), exec).loss);
    exec.share_stage_states(pipe);
    o.weights = pipe.weights();
    o.norms = pipe.gradient_norms();
    // World rank 0 holds a row per stage, every action timed after the common start.
    if (exec.rank() == 0)
      for (const auto& row : exec.trace().stages)
        for (const ActionTiming& t : row)
          if (!(t.end >= t.start && t.start >= 0 && t.end > 0))
            fail(sched + " x " + pred + ": rank 0's gathered trace has an untimed action");
  } catch (const std::exception& e) {
    o.error = e.what();
  }
  return o;
}

// Every schedule x predictor of one stage per rank (virtual = false: K ranks), or of two stages
// per rank (virtual = true: interleaved, looped, ZB-V, DualPipeV; K / 2 ranks).
template <class... S>
void bitwise_for_model(bool virtual_stages) {
  const int K = static_cast<int>(sizeof...(S));
  const int M = K;  // 2bw needs M >= K; the V schedules M >= 2 x ranks
  // 5 full mini-batches of 16 rows and a tail of 8; two epochs (the links are wired again).
  const test::LabelledData d = test::random_classification(88, 12, 4, 11);
  MpiExecutor exec;
  int combos = 0, compared = 0;
  for (const char* sched : schedule_names)
    for (const char* pred : predictor_names)
      [&] {  // the predictor chosen at run time: one Pipeline type per executor
        if ((stages_per_worker(sched) > 1) != virtual_stages) return;
        const std::string what = std::string(sched) + " x " + pred;
        const Outcome thr =
            train_threaded<Pipeline<S..., AnyPredictor, AnyOptimizer>>(sched, pred, M, 16, d, 2);
        const Outcome mpi = train_mpi<Pipeline<S..., AnyPredictor, AnyOptimizer, MpiChannel>>(
            exec, sched, pred, M, 16, d, 2);
        // The MpiChannel pipeline in one process (its links in-process rings, as xpipe-train
        // runs it without mpirun): the threaded executor's bits.
        const Outcome rings =
            train_threaded<Pipeline<S..., AnyPredictor, AnyOptimizer, MpiChannel>>(sched, pred, M,
                                                                                   16, d, 2);
        if (rings.error != thr.error || rings.losses != thr.losses ||
            rings.weights.size() != thr.weights.size() ||
            std::memcmp(rings.weights.data(), thr.weights.data(), thr.weights.size() * 4) != 0)
          fail(what + ": Pipeline<..., MpiChannel> in one process differs from InProcessRing's");
        ++combos;
        if (!thr.error.empty() || !mpi.error.empty()) {
          if (thr.error != mpi.error)
            fail(what + ": threaded says '" + thr.error + "', mpi says '" + mpi.error + "'");
          // Refused alike is fine (2BW's predictors need M >= K), but every schedule must run
          // with the latest weights.
          if (std::string(pred) == "latest") fail(what + ": refused: " + thr.error);
          return;
        }
        ++compared;
        if (thr.weights.size() != mpi.weights.size() ||
            std::memcmp(thr.weights.data(), mpi.weights.data(), thr.weights.size() * 4) != 0)
          fail(what + ": weights differ from the threaded executor's");
        if (thr.losses != mpi.losses) fail(what + ": losses differ from the threaded executor's");
      }();
  if (world_rank() == 0)
    std::printf(
        "bitwise: %d schedule x predictor runs of %d stages on %d ranks, %d compared (the rest "
        "refused alike)\n",
        combos, K, world_size(), compared);
  // Global gradient-norm clipping: the ranks share each stage's norm per mini-batch, and every
  // schedule clips with the threaded executor's bits (the norms too, on every rank). The bound
  // is below the norms of these gradients, so the steps are scaled.
  const float clip = 0.05f;
  int clipped_runs = 0, scaled_steps = 0;
  for (const char* sched : schedule_names)
    for (const char* pred : {"latest", "xpipe"}) {
      if ((stages_per_worker(sched) > 1) != virtual_stages) continue;
      const std::string what = std::string(sched) + " x " + pred + " clipped at 0.05";
      const Outcome thr = train_threaded<Pipeline<S..., AnyPredictor, AnyOptimizer>>(
          sched, pred, M, 16, d, 2, clip);
      const Outcome mpi = train_mpi<Pipeline<S..., AnyPredictor, AnyOptimizer, MpiChannel>>(
          exec, sched, pred, M, 16, d, 2, clip);
      if (!thr.error.empty() || !mpi.error.empty()) {
        // A schedule that steps a stage before another of its worker's stages has added its
        // gradient (async-interleaved) cannot clip globally: refused alike, before any action.
        if (thr.error != mpi.error || thr.error.find("cannot run schedule") == std::string::npos)
          fail(what + ": threaded says '" + thr.error + "', mpi says '" + mpi.error + "'");
        continue;
      }
      ++clipped_runs;
      if (thr.weights.size() != mpi.weights.size() ||
          std::memcmp(thr.weights.data(), mpi.weights.data(), thr.weights.size() * 4) != 0)
        fail(what + ": weights differ from the threaded executor's");
      if (thr.losses != mpi.losses) fail(what + ": losses differ from the threaded executor's");
      if (thr.norms.empty() || thr.norms != mpi.norms)
        fail(what + ": gradient norms differ from the threaded executor's (" +
             std::to_string(mpi.norms.size()) + " against " + std::to_string(thr.norms.size()) +
             ")");
      for (double n : mpi.norms) scaled_steps += n > clip;
    }
  if (scaled_steps == 0) fail("clipping: no step had a norm above 0.05 (nothing was clipped)");
  if (world_rank() == 0)
    std::printf("bitwise: %d clipped runs equal to threaded, %d steps scaled\n", clipped_runs,
                scaled_steps);
  if (virtual_stages) return;
  // A schedule of two stages per worker on as many ranks as stages is refused, with the
  // reason, before any action (2 ranks: no 2-stage interleaved schedule exists; 4: 4 stages
  // make 2 workers, not 4).
  const Outcome refused = train_mpi<Pipeline<S..., AnyPredictor, AnyOptimizer, MpiChannel>>(
      exec, "interleaved-1f1b", "latest", M, 16, d, 1);
  const char* why = K >= 4 ? "runs 4 stages on 2 workers, but 4 ranks over 1 replica(s) make 4 "
                             "a pipeline (launch replicas x workers ranks)"
                           : "needs an even number of stages, at least 4";
  if (refused.error.find(why) == std::string::npos)
    fail("interleaved-1f1b: expected '" + std::string(why) + "', got '" + refused.error + "'");
}

void bitwise() {
  const int n = world_size();
  if (n == 2) {
    bitwise_for_model<A, D>(false);
    bitwise_for_model<A, B, C, D>(true);  // two stages per rank
  } else if (n == 4) {
    bitwise_for_model<A, B, C, D>(false);
  } else {
    throw ConfigError("bitwise: run on 2 or 4 ranks (got " + std::to_string(n) + ")");
  }
}

// dp = 2 replicas of a pipeline of 2 ranks on 4 ranks: 2 stages (virtual = false), or 4 stages,
// two per rank (virtual = true: the schedules of two stages per worker).
template <class... S>
void data_parallel_for(bool virtual_stages) {
  const int R = 2, M = virtual_stages ? 4 : 2;
  const index_t B = 16;
  const test::LabelledData d = test::random_classification(96, 12, 4, 5);  // 6 mini-batches
  MpiExecutor exec(MPI_COMM_WORLD, R);
  const test::LabelledData mine = replica_data(d, B, M, R, exec.replica());
  double worst = 0, worst_abs = 0;
  for (const char* sched : schedule_names)
    for (const char* pred : predictor_names)
      [&] {
        if ((stages_per_worker(sched) > 1) != virtual_stages) return;
        const std::string what = std::string(sched) + " x " + pred;
        const Outcome mpi = train_mpi<Pipeline<S..., AnyPredictor, AnyOptimizer, MpiChannel>>(
            exec, sched, pred, M, B / R, mine, 2);
        if (!mpi.error.empty()) {
          if (std::string(sched) == "2bw" || std::string(pred) == "2bw") return;  // M < K etc.
          fail(what + ": " + mpi.error);
          return;
        }
        // Replicas: bitwise the same weights (hashes gathered over each stage's replicas).
        std::uint64_t h = hash_of(mpi.weights), other = 0;  // (2 replicas: XOR 0 iff equal)
        MPI_Allreduce(&h, &other, 1, MPI_UINT64_T, MPI_BXOR, exec.replicas_comm());
        if (other != 0) fail(what + ": replicas hold different weights");
        // One process at the global batch with the same M runs the same schedule (the same
        // weight versions for every micro-batch, async ones included); only the rows of each
        // micro-batch's gradient are summed in another grouping (each replica's half, then the
        // two halves). Float32 sums of 8 rows regrouped differ by a few ulps (~1e-7 relative);
        // 12 steps at lr 1e-2 (Adam's step is bounded by lr; SGD's by lr x gradient) carry
        // that to ~1e-8 in a weight. tol = 1e-6 + 1e-5 |ref| leaves 10x to 100x room and would
        // still catch a missing 1 / R or a replica's rows counted twice (~1e-2).
        const Outcome one =
            train_threaded<Pipeline<S..., AnyPredictor, AnyOptimizer>>(sched, pred, M, B, d, 2);
        for (std::size_t i = 0; i < one.weights.size(); ++i) {
          const double ref = one.weights[i], got = mpi.weights[i];
          const double tol = 1e-6 + 1e-5 * std::fabs(ref);
          worst = std::max(worst, std::fabs(got - ref) / tol);
          worst_abs = std::max(worst_abs, std::fabs(got - ref));
          if (!(std::fabs(got - ref) <= tol)) {
            fail(what + ": weight " + std::to_string(i) + " is " + std::to_string(got) +
                 ", one process has " + std::to_string(ref));
            break;
          }
        }
        for (std::size_t e = 0; e < one.losses.size(); ++e)
          if (!(std::fabs(one.losses[e] - mpi.losses[e]) <= 1e-6 + 1e-5 * one.losses[e]))
            fail(what + ": epoch loss " + std::to_string(mpi.losses[e]) + ", one process " +
                 std::to_string(one.losses[e]));
      }();
  // Global clipping with replicas: the norm is of the gradient averaged over the replicas, so
  // it is one process's norm at the global batch (to the regrouped sums' rounding), and the
  // clipped weights follow one process's within the tolerance above.
  const float clip = 0.05f;
  int clipped_runs = 0, scaled_steps = 0;
  double worst_norm = 0;
  for (const char* sched : schedule_names) {
    if ((stages_per_worker(sched) > 1) != virtual_stages) continue;
    const std::string what = std::string(sched) + " clipped at 0.05, 2 replicas";
    const Outcome mpi = train_mpi<Pipeline<S..., AnyPredictor, AnyOptimizer, MpiChannel>>(
        exec, sched, "latest", M, B / R, mine, 2, clip);
    const Outcome one = train_threaded<Pipeline<S..., AnyPredictor, AnyOptimizer>>(
        sched, "latest", M, B, d, 2, clip);
    if (!mpi.error.empty() || !one.error.empty()) {
      // async-interleaved cannot clip (its worker steps a stage before its other stage's
      // gradient): refused alike.
      if (mpi.error != one.error || one.error.find("cannot run schedule") == std::string::npos)
        fail(what + ": mpi says '" + mpi.error + "', one process says '" + one.error + "'");
      continue;
    }
    ++clipped_runs;
    std::uint64_t h = hash_of(mpi.weights), other = 0;
    MPI_Allreduce(&h, &other, 1, MPI_UINT64_T, MPI_BXOR, exec.replicas_comm());
    if (other != 0) fail(what + ": replicas hold different weights");
    if (mpi.norms.size() != one.norms.size() || one.norms.empty()) {
      fail(what + ": " + std::to_string(mpi.norms.size()) + " norms, one process has " +
           std::to_string(one.norms.size()));
      continue;
    }
    for (std::size_t t = 0; t < one.norms.size(); ++t) {
      const double rel = std::fabs(mpi.norms[t] - one.norms[t]) / one.norms[t];
      worst_norm = std::max(worst_norm, rel);
      if (!(rel <= 1e-5))
        fail(what + ": norm of mini-batch " + std::to_string(t) + " is " +
             std::to_string(mpi.norms[t]) + ", one process has " + std::to_string(one.norms[t]));
      scaled_steps += one.norms[t] > clip;
    }
    for (std::size_t i = 0; i < one.weights.size(); ++i)
      if (!(std::fabs(mpi.weights[i] - one.weights[i]) <=
            1e-6 + 1e-5 * std::fabs(one.weights[i]))) {
        fail(what + ": weight " + std::to_string(i) + " is " + std::to_string(mpi.weights[i]) +
             ", one process has " + std::to_string(one.weights[i]));
        break;
      }
  }
  if (scaled_steps == 0) fail("dp clipping: no step had a norm above 0.05 (nothing was clipped)");
  if (world_rank() == 0)
    std::printf(
        "dp: %d clipped runs follow one process (norms within %.2g relative), %d steps "
        "scaled\n",
        clipped_runs, worst_norm, scaled_steps);
  if (world_rank() == 0)
    std::printf(
        "dp: 2 replicas x 2 ranks of %d stages: replicas bitwise equal; worst |dp - one| = %.3g "
        "(%.3f of tol)\n",
        static_cast<int>(sizeof...(S)), worst_abs, worst);
}

void data_parallel() {
  if (world_size() != 4) throw ConfigError("dp: run on 4 ranks");
  data_parallel_for<A, D>(false);
  data_parallel_for<A, B, C, D>(true);
}

// ---- faults ----

// Every rank's process id (fault mode): rank 0 continues the stopped rank 1 with it.
std::vector<int> pids;

// A Program that runs another and does `kind` to itself at stage 1's F of micro-batch 6: kill,
// stop or nan as it runs it; stop_continue in the wait before it. That wait never ends (the input
// is held back): it has lasted 1 s, long enough to be reported to the other ranks (who must see
// the report go stale), when the rank stops itself, and once continued it is still in it, with
// its clock 5 s or so further on; only the other ranks' word that they gave up ends it.
template <class Inner>
struct Faulty {
  Inner inner;
  std::string kind;
  std::chrono::steady_clock::time_point wait_start{};
  bool stopped = false;  // (stop_continue)
  const Schedule& schedule() const { return inner.schedule(); }
  bool ready(int k, const Action& a) { return !holding_back(k, a) && inner.ready(k, a); }
  bool input_ready(int k, const Action& a) {
    return !holding_back(k, a) && inner.input_ready(k, a);
  }
  void execute(int k, const Action& a) {
    if (at_fault(k, a) && kind != "stop_continue") {
      say("at " + to_string(a));
      if (kind == "kill") raise(SIGKILL);
      if (kind == "stop") raise(SIGSTOP);
    }
    inner.execute(k, a);
  }
  static bool at_fault(int k, const Action& a) {
    return k == 1 && a.kind == ActionKind::Forward && a.index == 6;
  }
  void say(const std::string& where) const {
    std::fprintf(stderr, "rank %d: %s %s\n", world_rank(), kind.c_str(), where.c_str());
    std::fflush(stderr);
  }
  // stop_continue: F6 is never ready; a second into its wait, a SIGSTOP.
  bool holding_back(int k, const Action& a) {
    if (kind != "stop_continue" || !at_fault(k, a)) return false;
    const auto now = std::chrono::steady_clock::now();
    if (wait_start == std::chrono::steady_clock::time_point{}) wait_start = now;
    if (!stopped && now - wait_start >= std::chrono::seconds(1)) {
      stopped = true;
      say("in the wait for " + to_string(a));
      raise(SIGSTOP);
    }
    return true;
  }
  auto& links() { return inner.links(); }
  std::span<double> micro_losses() { return inner.micro_losses(); }
};

// An executor that hands the pipeline's Program to the MPI executor wrapped in Faulty.
struct FaultyExecutor {
  static constexpr const char* name = "faulty-mpi";
  MpiExecutor* mpi;
  std::string kind;
  template <Program P>
  void run(P& program) {
    Faulty<P&> f{program, kind};
    mpi->run(f);
  }
  const ExecutionTrace& trace() const { return mpi->trace(); }
};

// mpirun ends the job when a rank dies: SIGTERM to the others, which say what they waited for.
extern "C" void on_sigterm(int) {
  static const char prefix[] = "xpipe_test_mpi: terminated by SIGTERM; ";
  if (::write(2, prefix, sizeof prefix - 1) < 0) _exit(143);
  mpi_write_wait_state(2);
  _exit(143);
}

void fault(const std::string& kind, double timeout) {
  std::signal(SIGTERM, on_sigterm);
  using P = Pipeline<A, B, C, D, Latest, AnyOptimizer, MpiChannel>;
  if (world_size() != 4) throw ConfigError("fault: run on 4 ranks");
  pids.assign(4, 0);
  const int pid = static_cast<int>(getpid());
  MPI_Allgather(&pid, 1, MPI_INT, pids.data(), 1, MPI_INT, MPI_COMM_WORLD);
  test::LabelledData d = test::random_classification(16 * 40, 12, 4, 3);
  // NaN: one feature of a row in mini-batch 3 (micro-batch 13): the last stage's loss is NaN.
  if (kind == "nan") d.x[static_cast<std::size_t>((3 * 16 + 5) * 12)] = std::nanf("");
  MpiExecutor exec;
  // Stopped at stage 1, rank 3 waits on rank 2, which waits on rank 1: rank 3 gives up first
  // (1 s sooner), so that it is the one that follows that chain to the stuck rank.
  if (kind == "stop" && world_rank() == 3) timeout -= 1;
  exec.wait_timeout = std::chrono::duration<double>(timeout);
  FaultyExecutor f{&exec, kind};
  P pipe(optimizer_for("latest"), PipelineOptions{.batch = 16, .micro_batches = 4, .seed = 7});
  const Schedule s = make_schedule("async-1f1b", 4, 4, 40);
  for (int e = 0; e < 3; ++e) pipe.train(s, d.epoch(), f);
}

}  // namespace

int main(int argc, char** argv) {
  mpi_default_tuning();
  MPI_Init(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "bitwise")
      bitwise();
    else if (mode == "dp")
      data_parallel();
    else if (mode == "fault" && argc > 2)
      fault(argv[2], argc > 3 ? std::stod(argv[3]) : 60);
    else
      throw ConfigError(
          "usage: xpipe_test_mpi bitwise|dp|fault <kill|stop|stop_continue|nan> [timeout s]");
  } catch (const std::exception& e) {
    // A failed run leaves the ranks unable to go on together: end the job, a moment after the
    // other ranks (told by the executor) have printed where they were.
    std::fprintf(stderr, "xpipe_test_mpi: rank %d: %s\n", world_rank(), e.what());
    std::fflush(stderr);
    if (mode == "fault" && argc > 2 && std::string(argv[2]) == "stop_continue" &&
        world_rank() != 1) {
      // The stopped rank is continued once the others have given up: rank 0 waits a second
      // for them (they are told at once), continues it, and all leave it time to say what it
      // saw before the job ends (it ends the job itself once it has).
      std::this_thread::sleep_for(std::chrono::seconds(world_rank() == 0 ? 1 : 6));
      if (world_rank() == 0) {
        std::fprintf(stderr, "xpipe_test_mpi: rank 0: continuing rank 1 (kill -CONT %d)\n",
                     pids[1]);
        std::fflush(stderr);
        kill(pids[1], SIGCONT);
        std::this_thread::sleep_for(std::chrono::seconds(5));
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  return finish(mode);
}
