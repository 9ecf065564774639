// The MPI executor: one rank per stage, R replicas of a K-stage pipeline over R x K ranks
// (rank = replica * K + stage). Each rank runs its own stage's action list; activations and
// gradients travel on MpiChannel links; each stage's gradient is averaged over its replicas by
// a non-blocking all-reduce that overlaps the stage's remaining forwards. Every wait has a
// deadline. The same bits as the threaded executor at R = 1. Needs xpipe::mpi.
#pragma once

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "xpipe/backend/host.hpp"
#include "xpipe/comm/mpi_link.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/exec/executor.hpp"
#include "xpipe/schedule/dependencies.hpp"

namespace xpipe {

namespace detail {
// What this process's executor is waiting for, kept for a signal handler to print: mpirun ends
// a job whose rank died with SIGTERM to the others, and they should say where they were.
inline char mpi_wait_text[512];
inline std::atomic<int> mpi_wait_length{0};
}  // namespace detail

//! Async-signal-safe: writes to `fd` what this process's MPI executor is waiting for ("rank 0
//! was waiting 3.2 s for the input of F6 from rank 1 (stage 1)" and a newline), or nothing when
//! it is not waiting. For a SIGTERM handler (xpipe-train's, the MPI tests').
inline void mpi_write_wait_state(int fd) noexcept {
  const int n = detail::mpi_wait_length.load(std::memory_order_acquire);
  if (n > 0 && ::write(fd, detail::mpi_wait_text, static_cast<std::size_t>(n)) < 0) return;
}

//! Call before MPI_Init: picks Open MPI's ring algorithm for MPI_Iallreduce (unless the
//! environment already chose one). Its default (recursive doubling for 2 ranks) took 3x as long
//! as a blocking MPI_Allreduce on a 4 MB stage gradient here; the ring matches it (README,
//! bench_mpi). Other MPI libraries ignore the variable.
inline void mpi_default_tuning() {
  setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", 0);
}

//! Starts summing `g` over the ranks of `replicas` in place (MPI_Iallreduce): the first half
//! of averaging a stage's gradient over its replicas; complete `req`, then scale_gradient_sum.
inline void start_gradient_sum(std::span<float> g, MPI_Comm replicas, MPI_Request& req) {
  XPIPE_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, g.data(), static_cast<int>(g.size()), MPI_FLOAT,
                                 MPI_SUM, replicas, &req));
}
//! The second half: the sum over R replicas divided by R. Each replica's loss is scaled by 1 /
//! its own rows, so the result is the gradient of the mean loss over all R shares.
inline void scale_gradient_sum(std::span<float> g, int replicas) {
  const float inv = 1.f / static_cast<float>(replicas);
  for (float& v : g) v *= inv;
}

//! Runs a Program whose links are MpiLink ends (a Pipeline<..., MpiChannel>) on the ranks of a
//! communicator: R replicas (`replicas`) of a K-stage pipeline, K = ranks / R, rank r running
//! stage r % K of replica r / K. Every rank constructs the same Pipeline and calls train() with
//! the same schedule; rank r runs only its stage's list.
//!
//! Data parallelism: each replica trains on its own rows (the caller gives each replica its
//! share, replica_rows in pipeline/replicas.hpp), and after the last backward before each Step the
//! stage's flat gradient is summed over its R replicas by MPI_Iallreduce, completed and divided by
//! R just before the Step, so every replica steps with the same bits.
//!
//! Faults: every wait (an input, room for an output, the all-reduce, the start and end of the
//! run) gives up after `wait_timeout` and throws a StageError naming this rank, the action, and
//! the rank it waited for. A rank whose action throws (a NaN loss, a failed MPI call) tells
//! every other rank before it rethrows, and those throw too, naming it: all ranks stop
//! together. The communicators return MPI errors (MPI_ERRORS_RETURN) as MpiError. After a
//! failure the ranks cannot go on together: call MPI_Abort (xpipe-train does), which ends the
//! job; a killed rank is seen by mpirun, which ends the job itself.
//! Usage: `MpiExecutor e(MPI_COMM_WORLD, 2); pipe.train(schedule, my_rows, e);`
class MpiExecutor {
 public:
  static constexpr const char* name = "mpi";
  //! How long any wait may last before the rank gives up (a stopped or hung peer).
  std::chrono::duration<double> wait_timeout = std::chrono::seconds(60);

  //! Splits `world` (duplicated; errors return) into `replicas` pipelines. Throws ConfigError
  //! when the rank count is not a multiple of `replicas`. Collective over `world`.
  explicit MpiExecutor(MPI_Comm world = MPI_COMM_WORLD, int replicas = 1) {
    int size = 0;
    XPIPE_MPI_CHECK(MPI_Comm_size(world, &size));
    if (replicas < 1 || size % replicas != 0)
      throw ConfigError("xpipe: MpiExecutor: " + std::to_string(size) +
                        " ranks do not split into " + std::to_string(replicas) +
                        " replicas (ranks must be replicas x stages)");
    XPIPE_MPI_CHECK(MPI_Comm_dup(world, &world_));
    XPIPE_MPI_CHECK(MPI_Comm_set_errhandler(world_, MPI_ERRORS_RETURN));
    XPIPE_MPI_CHECK(MPI_Comm_rank(world_, &rank_));
    size_ = size;
    replicas_ = replicas;
    stages_ = size / replicas;
    stage_ = rank_ % stages_;
    replica_ = rank_ / stages_;
    XPIPE_MPI_CHECK(MPI_Comm_split(world_, replica_, stage_, &pipeline_));
    XPIPE_MPI_CHECK(MPI_Comm_split(world_, stage_, replica_, &replicas_of_stage_));
    XPIPE_MPI_CHECK(MPI_Comm_dup(world_, &control_));
    for (MPI_Comm c : {pipeline_, replicas_of_stage_, control_})
      XPIPE_MPI_CHECK(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
  }
  MpiExecutor(const MpiExecutor&) = delete;
  MpiExecutor& operator=(const MpiExecutor&) = delete;
  ~MpiExecutor() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;  // (an executor outliving MPI_Finalize has nothing left to free)
    for (MPI_Comm* c : {&pipeline_, &replicas_of_stage_, &control_, &world_})
      if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  int replicas() const { return replicas_; }
  int stages() const { return stages_; }
  int stage() const { return stage_; }
  int replica() const { return replica_; }
  //! The world rank of stage k of replica r.
  int rank_of(int k, int r) const { return r * stages_ + k; }
  //! The ranks of this rank's pipeline (its stages, in order) and of its stage's replicas.
  MPI_Comm pipeline_comm() const { return pipeline_; }
  MPI_Comm replicas_comm() const { return replicas_of_stage_; }

  template <Program P>
  void run(P& program) {
    static_assert(
        requires { program.links().at(Channel{}).connect(MpiLinkEnd{}); },
        "xpipe: MpiExecutor: the Program's links must be MpiLink ends: use "
        "Pipeline<..., MpiChannel>");
    const Schedule& s = program.schedule();
    if (s.stages != stages_)
      throw ConfigError("xpipe: MpiExecutor: schedule '" + s.name + "' has " +
                        std::to_string(s.stages) + " stages, but " + std::to_string(size_) +
                        " ranks over " + std::to_string(replicas_) + " replica(s) make " +
                        std::to_string(stages_) + " (launch replicas x stages ranks)");
    if (replicas_ > 1 && !has_gradients<P>)
      throw ConfigError("xpipe: MpiExecutor: " + std::to_string(replicas_) +
                        " replicas need the Program's gradients(k) to average them");
    const int k = stage_;
    const auto& list = s.actions[static_cast<std::size_t>(k)];
    trace_ = ExecutionTrace::sized_for(s);
    connect(program, s);
    ScopedFlushDenormals ftz;

    // A common start: t0 is taken as the barrier completes, on every rank alike (one host's
    // clocks agree; across hosts this aligns each rank's zero to the barrier's end).
    MPI_Request barrier = MPI_REQUEST_NULL;
    XPIPE_MPI_CHECK(MPI_Ibarrier(world_, &barrier));
    wait_request(barrier, k, "start", "the other ranks to start the run");
    const auto t0 = std::chrono::steady_clock::now();

    // Where this stage's gradient is complete for a Step: after the last backward before it.
    std::vector<char> reduce_after(list.size(), 0);
    for (std::size_t i = 0; i < list.size(); ++i) {
      if (list[i].kind != ActionKind::Backward) continue;
      for (std::size_t j = i + 1; j < list.size(); ++j)
        if (list[j].kind != ActionKind::Forward) {
          reduce_after[i] = list[j].kind == ActionKind::Step;
          break;
        }
    }
    MPI_Request reduce = MPI_REQUEST_NULL;
    std::size_t i = 0;
    list_size_.store(static_cast<long>(list.size()), std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    try {
      for (; i < list.size(); ++i) {
        const Action& a = list[i];
        wait_ready(program, s, k, a);
        if (a.kind == ActionKind::Step && replicas_ > 1) finish_reduce(program, k, a, reduce);
        const double start = detail::seconds_since(t0);
        program.execute(k, a);
        trace_.stages[static_cast<std::size_t>(k)][i] = {a, start, detail::seconds_since(t0)};
        if (reduce_after[i] && replicas_ > 1) start_reduce(program, k, reduce);
        done_.store(static_cast<long>(i + 1), std::memory_order_relaxed);
      }
      wait_until([&] { return sends_done(program, s, k); }, k, "end",
                 [] { return std::string("its last messages to be received by its neighbours"); });
      trace_.seconds = detail::seconds_since(t0);
      share_losses(program, k);
      gather_trace(s);
    } catch (const MpiAbortNotice&) {
      throw;
    } catch (const StageError& e) {
      notify_others(e.what());
      throw;
    } catch (const std::exception& e) {
      const std::string at = i < list.size() ? to_string(list[i]) : "end";
      StageError err(k, at, on_rank() + ": " + e.what());
      notify_others(err.what());
      throw err;
    } catch (...) {
      const std::string at = i < list.size() ? to_string(list[i]) : "end";
      StageError err(k, at, on_rank() + ": non-standard exception");
      notify_others(err.what());
      throw err;
    }
  }

  //! The fraction of this rank's action list run so far (safe to read from another thread
  //! while run() runs: progress bars of ranks that do not compute the loss).
  double progress() const {
    const long n = list_size_.load(std::memory_order_relaxed);
    return n > 0 ? static_cast<double>(done_.load(std::memory_order_relaxed)) / n : 0.0;
  }

  //! After run(): on world rank 0, the rows of replica 0's stages (one row per rank, times
  //! since the common start); on other ranks, their own stage's row.
  const ExecutionTrace& trace() const { return trace_; }

  //! Broadcasts each stage's optimizer state (weights, moments, step count) from the rank that
  //! trained it to every rank of its pipeline, so that every rank holds the whole trained
  //! model (to evaluate, checkpoint or compare it). Collective over each pipeline; `p` is the
  //! Pipeline that run() trained.
  template <class Pipe>
  void share_stage_states(Pipe& p) {
    p.for_each_optimizer_state([&](int k, auto& opt) {
      using State = std::decay_t<decltype(opt)>;
      const int n = static_cast<int>(opt.size());
      std::vector<MPI_Request> reqs(State::moment_buffers + 2, MPI_REQUEST_NULL);
      long steps = opt.steps_taken();
      XPIPE_MPI_CHECK(MPI_Ibcast(opt.weights(), n, MPI_FLOAT, k, pipeline_, &reqs[0]));
      for (int m = 0; m < State::moment_buffers; ++m)
        XPIPE_MPI_CHECK(
            MPI_Ibcast(opt.moment(m), n, MPI_FLOAT, k, pipeline_, &reqs[std::size_t(m) + 1]));
      XPIPE_MPI_CHECK(MPI_Ibcast(&steps, 1, MPI_LONG, k, pipeline_, &reqs.back()));
      for (MPI_Request& r : reqs)
        wait_request(r, stage_, "share", "stage " + std::to_string(k) + "'s trained state");
      opt.set_steps_taken(steps);
    });
  }

 private:
  //! Thrown on the ranks told of another rank's failure (already told: not passed on).
  class MpiAbortNotice : public StageError {
   public:
    using StageError::StageError;
  };

  std::string on_rank() const {
    return "rank " + std::to_string(rank_) +
           (replicas_ > 1 ? " (replica " + std::to_string(replica_) + ")" : "");
  }
  std::string rank_name(int k) const {
    return "rank " + std::to_string(rank_of(k, replica_)) + " (stage " + std::to_string(k) + ")";
  }

  template <class P>
  void connect(P& program, const Schedule& s) {
    auto& links = program.links();
    const int K = s.stages;
    for (int b = 0; b + 1 < K; ++b)
      for (Flow f : {Flow::Activations, Flow::Gradients}) {
        const int from = f == Flow::Activations ? b : b + 1,
                  to = f == Flow::Activations ? b + 1 : b;
        MpiLinkEnd end;
        end.comm = pipeline_;
        end.direction = f == Flow::Activations ? 0 : 1;
        if (stage_ == from) {
          end.role = LinkRole::Producer;
          end.peer = to;
        } else if (stage_ == to) {
          end.role = LinkRole::Consumer;
          end.peer = from;
          // The consumer pops in the order of its own actions that read this channel.
          for (const Action& a : s.actions[static_cast<std::size_t>(to)])
            if (channels_of(K, to, a).in == Channel{b, f}) end.order.push_back(a.index);
        }
        links.at(Channel{b, f}).connect(std::move(end));
      }
  }

  template <class P>
  bool sends_done(P& program, const Schedule& s, int k) {
    const Channel out[2] = {Channel{k, Flow::Activations}, Channel{k - 1, Flow::Gradients}};
    for (const Channel& c : out)
      if (c.boundary >= 0 && c.boundary + 1 < s.stages && !program.links().at(c).sends_done())
        return false;
    return true;
  }

  template <class P>
  void wait_ready(P& program, const Schedule& s, int k, const Action& a) {
    if (program.ready(k, a)) return;
    wait_until([&] { return program.ready(k, a); }, k, to_string(a),
               [&] {
                 const int producer = producer_stage(s.stages, k, a);
                 bool input_missing = producer >= 0;
                 if constexpr (requires { program.input_ready(k, a); })
                   input_missing = input_missing && !program.input_ready(k, a);
                 if (input_missing)
                   return "the input of " + to_string(a) + " from " + rank_name(producer);
                 const int consumer = consumer_stage(s.stages, k, a);
                 return "room to send the output of " + to_string(a) + " to " + rank_name(consumer);
               });
  }

  template <class P>
  static constexpr bool has_gradients = requires(P& p) {
    p.gradients(0);
  };

  template <class P>
  void start_reduce(P& program, int k, MPI_Request& req) {
    if constexpr (has_gradients<P>)
      start_gradient_sum(program.gradients(k), replicas_of_stage_, req);
  }

  template <class P>
  void finish_reduce(P& program, int k, const Action& a, MPI_Request& req) {
    if (req == MPI_REQUEST_NULL)
      throw Error("no gradient all-reduce was started for " + to_string(a) +
                  " (no backward before it)");
    std::string peers;
    for (int r = 0; r < replicas_; ++r) peers += (r ? ", " : "") + std::to_string(rank_of(k, r));
    wait_request(req, k, to_string(a),
                 "the gradient all-reduce with the replicas of stage " + std::to_string(k) +
                     " (ranks " + peers + ")");
    // The mean over replicas: each replica's loss is already scaled by 1 / its rows.
    if constexpr (has_gradients<P>) scale_gradient_sum(program.gradients(k), replicas_);
  }

  // Every rank gets every micro-batch's loss: the last stages' values summed over the world
  // and divided by R (each replica's mean over its equal share: the mean over the whole batch).
  template <class P>
  void share_losses(P& program, int k) {
    if constexpr (requires { program.micro_losses(); }) {
      std::span<double> loss = program.micro_losses();
      if (k + 1 != stages_)
        for (double& v : loss) v = 0;
      MPI_Request r = MPI_REQUEST_NULL;
      XPIPE_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, loss.data(), static_cast<int>(loss.size()),
                                     MPI_DOUBLE, MPI_SUM, world_, &r));
      wait_request(r, k, "end", "the other ranks' losses");
      for (double& v : loss) v /= replicas_;
    }
  }

  // World rank 0 collects the rows of replica 0's stages: (start, end) of every action.
  void gather_trace(const Schedule& s) {
    if (replica_ != 0) return;
    std::vector<double> mine;
    for (const ActionTiming& t : trace_.stages[static_cast<std::size_t>(stage_)]) {
      mine.push_back(t.start);
      mine.push_back(t.end);
    }
    std::vector<int> counts(static_cast<std::size_t>(stages_)), offsets(counts.size());
    int total = 0;
    for (int j = 0; j < stages_; ++j) {
      counts[static_cast<std::size_t>(j)] = 2 * static_cast<int>(s.actions[std::size_t(j)].size());
      offsets[static_cast<std::size_t>(j)] = total;
      total += counts[static_cast<std::size_t>(j)];
    }
    std::vector<double> all(stage_ == 0 ? static_cast<std::size_t>(total) : 0);
    MPI_Request r = MPI_REQUEST_NULL;
    XPIPE_MPI_CHECK(MPI_Igatherv(mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE, all.data(),
                                 counts.data(), offsets.data(), MPI_DOUBLE, 0, pipeline_, &r));
    wait_request(r, stage_, "end", "the trace of the other stages");
    if (stage_ != 0) return;
    for (int j = 1; j < stages_; ++j) {
      auto& row = trace_.stages[static_cast<std::size_t>(j)];
      for (std::size_t p = 0; p < row.size(); ++p) {
        row[p].start = all[static_cast<std::size_t>(offsets[std::size_t(j)]) + 2 * p];
        row[p].end = all[static_cast<std::size_t>(offsets[std::size_t(j)]) + 2 * p + 1];
      }
    }
  }

  void wait_request(MPI_Request& r, int k, const std::string& action, const std::string& what) {
    wait_until(
        [&] {
          int done = 0;
          XPIPE_MPI_CHECK(MPI_Test(&r, &done, MPI_STATUS_IGNORE));
          return done != 0;
        },
        k, action, [&] { return what; });
  }

  // Polls `done` (spinning briefly, then yielding the core: ranks may outnumber cores) until it
  // holds; throws when another rank reports a failure or after wait_timeout.
  template <class Done, class What>
  void wait_until(Done&& done, int k, const std::string& action, What&& what) {
    const auto start = std::chrono::steady_clock::now();
    struct Clear {  // the wait is over (done, or thrown): nothing to report any more
      ~Clear() { detail::mpi_wait_length.store(0, std::memory_order_release); }
    } clear;
    for (unsigned spins = 0;; ++spins) {
      if (done()) return;
      if (spins < 64) continue;
      if (spins == 64) {  // a real wait: say where, for a signal handler
        detail::mpi_wait_length.store(0, std::memory_order_release);
        const std::string text = on_rank() + " (stage " + std::to_string(k) + ") was waiting at " +
                                 action + " for " + what() + "\n";
        const std::size_t n = std::min(text.size(), sizeof detail::mpi_wait_text);
        std::memcpy(detail::mpi_wait_text, text.data(), n);
        detail::mpi_wait_length.store(static_cast<int>(n), std::memory_order_release);
      }
      std::this_thread::yield();
      const auto waited = std::chrono::steady_clock::now() - start;
      if (spins % 16 == 0)
        check_notices(k, action, [&] {
          char secs[32];
          std::snprintf(secs, sizeof secs, "%.1f", std::chrono::duration<double>(waited).count());
          return std::string(secs) + " s for " + what();
        });
      if (waited > wait_timeout) {
        std::string secs = std::to_string(wait_timeout.count());
        secs.erase(secs.find_last_not_of('0') + 1);
        if (secs.back() == '.') secs.pop_back();
        throw StageError(k, action, on_rank() + " waited " + secs + " s for " + what());
      }
    }
  }

  static constexpr int notice_tag = 1;

  // A failure notice from another rank: throw it here too (not passed on: it told everyone).
  template <class Waiting>
  void check_notices(int k, const std::string& action, Waiting&& waiting) {
    int flag = 0;
    MPI_Status st;
    XPIPE_MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, notice_tag, control_, &flag, &st));
    if (!flag) return;
    int n = 0;
    XPIPE_MPI_CHECK(MPI_Get_count(&st, MPI_CHAR, &n));
    std::string text(static_cast<std::size_t>(n), '\0');
    XPIPE_MPI_CHECK(
        MPI_Recv(text.data(), n, MPI_CHAR, st.MPI_SOURCE, notice_tag, control_, MPI_STATUS_IGNORE));
    throw MpiAbortNotice(k, action,
                         on_rank() + ", waiting " + waiting() + ", stopped because rank " +
                             std::to_string(st.MPI_SOURCE) + " failed: " + text);
  }

  // Tells every other rank that this one failed (sends that complete on their own: the text is
  // kept until the executor goes).
  void notify_others(const std::string& what) noexcept {
    notice_ = what;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      MPI_Request req = MPI_REQUEST_NULL;
      if (MPI_Isend(notice_.data(), static_cast<int>(notice_.size()), MPI_CHAR, r, notice_tag,
                    control_, &req) == MPI_SUCCESS)
        MPI_Request_free(&req);
    }
  }

  MPI_Comm world_ = MPI_COMM_NULL, pipeline_ = MPI_COMM_NULL, replicas_of_stage_ = MPI_COMM_NULL,
           control_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, replicas_ = 1, stages_ = 1, stage_ = 0, replica_ = 0;
  ExecutionTrace trace_;
  std::string notice_;
  std::atomic<long> list_size_{0}, done_{0};
};

static_assert(Executor<MpiExecutor>);

}  // namespace xpipe
