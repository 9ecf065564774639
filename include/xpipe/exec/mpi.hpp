// The MPI executor: one rank per worker of the schedule (a stage, or several: virtual stages),
// R replicas of a P-worker pipeline over R x P ranks (rank = replica * P + worker). Each rank
// runs its worker's actions; activations and gradients travel on MpiChannel links (a ring in
// memory between two stages of one rank); each stage's gradient is averaged over its replicas
// by a non-blocking all-reduce that overlaps the stage's remaining forwards. Every wait has a
// deadline. The same bits as the threaded executor at R = 1. Needs xpipe::mpi.
// Over 400 lines: the executor, its rank layout and its gradient all-reduce share one wait
// discipline (deadlines, who is blamed), kept together (its wait reports: exec/mpi_waits.hpp).
#pragma once

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "xpipe/backend/host.hpp"
#include "xpipe/comm/mpi_link.hpp"
#include "xpipe/comm/replica_mean.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/exec/executor.hpp"
#include "xpipe/exec/mpi_waits.hpp"
#include "xpipe/kernels/ops.hpp"
#include "xpipe/schedule/dependencies.hpp"
#include "xpipe/schedule/structure.hpp"

namespace xpipe {

namespace detail {
// What this process's executor is waiting for, kept for a signal handler to print: mpirun ends
// a job whose rank died with SIGTERM to the others, and they should say where they were.
inline char mpi_wait_text[512];
inline std::atomic<int> mpi_wait_length{0};
// For the handler's word on a clock jump: this process's rank, the executor's max_clock_step,
// and the clock at the wait's last reading (0: not waiting), in ns.
inline std::atomic<int> mpi_report_rank{-1};
inline std::atomic<std::int64_t> mpi_clock_step_ns{100000000}, mpi_wait_last_ns{0};

// Async-signal-safe: appends `v` in decimal to buf[n...], returning the new length.
inline std::size_t append_decimal(char* buf, std::size_t n, std::int64_t v) noexcept {
  char digits[24];
  std::size_t d = 0;
  do {
    digits[d++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v > 0);
  while (d > 0) buf[n++] = digits[--d];
  return n;
}
inline std::size_t append_text(char* buf, std::size_t n, const char* text) noexcept {
  while (*text != '\0') buf[n++] = *text++;
  return n;
}
}  // namespace detail

//! Async-signal-safe: writes to `fd` what this process's MPI executor is waiting for ("rank 0
//! (stage 0) was waiting at B4 for the input of B4 from rank 1 (stage 1)"), then, when this
//! process's own clock jumped further than max_clock_step and 1 s in the run or just now (the
//! process was stopped: mpirun continues a stopped rank to end it), "; rank 0's own clock
//! jumped 12.3 s: this process was stopped or suspended", and a newline; nothing when it has
//! neither to say. For a SIGTERM handler (xpipe-train's, the MPI tests').
inline void mpi_write_wait_state(int fd) noexcept {
  const int n = detail::mpi_wait_length.load(std::memory_order_acquire);
  // A jump: the largest the run saw, or one just now (the signal came as the process was
  // continued, before the wait or the watch read the clock again; the watch reads it every
  // period).
  const std::int64_t now = detail::monotonic_ns();
  std::int64_t jump = detail::clock_jump_ns.load(std::memory_order_relaxed);
  const std::int64_t wait_last = detail::mpi_wait_last_ns.load(std::memory_order_relaxed);
  const std::int64_t watch_last = detail::clock_watch_last_ns.load(std::memory_order_relaxed);
  if (wait_last > 0) jump = std::max(jump, now - wait_last);
  if (watch_last > 0) jump = std::max(jump, now - watch_last - detail::clock_watch_period_ns);
  const int rank = detail::mpi_report_rank.load(std::memory_order_relaxed);
  const bool jumped = jump > std::max(detail::mpi_clock_step_ns.load(std::memory_order_relaxed),
                                      detail::clock_jump_reported_ns) &&
                      rank >= 0;
  if (n == 0 && !jumped) return;
  char line[sizeof detail::mpi_wait_text + 128];  // one write: the line stays whole in a pipe
  std::size_t len = static_cast<std::size_t>(n);
  std::memcpy(line, detail::mpi_wait_text, len);
  if (jumped) {
    len = detail::append_text(line, len, n > 0 ? "; rank " : "rank ");
    len = detail::append_decimal(line, len, rank);
    len = detail::append_text(line, len, "'s own clock jumped ");
    const std::int64_t tenths = (jump + 50000000) / 100000000;
    len = detail::append_decimal(line, len, tenths / 10);
    line[len++] = '.';
    len = detail::append_decimal(line, len, tenths % 10);
    len = detail::append_text(line, len, " s: this process was stopped or suspended");
  }
  line[len++] = '\n';
  if (::write(fd, line, len) < 0) return;
}

//! Call before MPI_Init: picks Open MPI's ring algorithm for MPI_Iallreduce (unless the
//! environment already chose one). Its default (recursive doubling for 2 ranks) took 3x as long
//! as a blocking MPI_Allreduce on a 4 MB stage gradient here; the ring matches it (docs/results.md,
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

//! Runs a Program whose links are MPI link ends (a Pipeline<..., MpiChannel>) on the ranks of a
//! communicator: R replicas (`replicas`) of a pipeline of P = ranks / R ranks, rank r running
//! worker r % P of replica r / P: stage r % P, or, when the schedule has virtual stages
//! (interleaved 1F1B, ZB-V, DualPipeV: schedule.workers() = P < stages), every stage of that
//! worker, in the worker's order. Every rank constructs the same Pipeline and calls train() with
//! the same schedule; rank r runs only its worker's actions.
//!
//! Data parallelism: each replica trains on its own rows (the caller gives each replica its
//! share, replica_rows in pipeline/replicas.hpp), and after the last backward before each Step the
//! stage's flat gradient is summed over its R replicas by MPI_Iallreduce, completed and divided by
//! R just before the Step, so every replica steps with the same bits.
//!
//! Global gradient-norm clipping (PipelineOptions::clip_norm): each stage's squared norm of
//! mini-batch t reaches every rank of its pipeline by one MPI_Iallgather per mini-batch, started
//! when this rank's stages have all added their last gradient of t; a Step waits for it, as it
//! waits for the other stages' norms in one process, and scales by the threaded executor's
//! bits. With replicas the norm is of the averaged gradient: the rank's first Step of t
//! completes all its stages' all-reduces, takes their norms, then starts the gather.
//!
//! Device pipelines (Pipeline<..., Cuda, MpiChannel>; a rank per GPU, or ranks sharing one):
//! the links are StagedMpiLink ends (device slots copied to and from pinned host memory on the
//! stages' streams, MPI moving the pinned copies), so the host never waits for the device inside
//! the run: a send starts, and a receive is posted again, once the copy's event is done, which
//! every wait and every action checks (progress()). With replicas each stage's gradient is
//! averaged on the devices where the backend can (DeviceReplicaMean: NCCL's all-reduce on the
//! stage's stream) and the stage's replicas each have a device of their own, found at the start
//! of each run by gathering their device_identity() (replica_means_on_device() says which way
//! the last run went); otherwise it is copied to pinned memory after its last backward, summed
//! there by MPI_Iallreduce once the copy is done, divided by R and copied back before the step.
//! Both ways give the same bits with 2 replicas. At the end of the run each rank
//! waits for its own streams and the rank of the last stage reads and checks the losses
//! (finish_here), before they are shared. Global clipping of a device pipeline is refused.
//!
//! Faults: every wait (an input, room for an output, the all-reduce, the clipping norms, the
//! start and end of the run) gives up after `wait_timeout` and throws a StageError naming the stuck
//! rank, this rank, the action and what it waited for. The wait's time is the sum of its clock
//! readings, each counted up to `max_clock_step`, so a rank that was itself stopped (SIGSTOP, a
//! debugger, a suspended machine) does not give up on its neighbours once continued; what it
//! reports says "rank 1's own clock jumped 12.3 s: this process was stopped or suspended" (a watch
//! thread sees the jumps that fall inside an action). The stuck rank: a wait that has lasted
//! wait_timeout / 8 tells every other rank what it waits on (non-blocking messages on a control
//! communicator, said again every wait_timeout / 8 while it lasts, withdrawn when it ends), and a
//! rank that gives up follows these from the rank it waits on to the first that is not waiting (or
//! whose word has gone stale: stopped inside its wait): "rank 1 (stage 1) is stuck: rank 3 waited
//! 60 s for the input of F9 from rank 2 (stage 2), which waits at F6 for the input of F6 from rank
//! 1 (stage 1), which is not waiting on any rank (it is stopped, hung, or running a long action)".
//! A rank whose action throws (a NaN loss, a failed MPI call), or that gives up, tells every other
//! rank before it rethrows, and those throw too, quoting it: all ranks stop together, and all name
//! the same stuck rank. The communicators return MPI errors (MPI_ERRORS_RETURN) as MpiError. After
//! a failure the ranks cannot go on together: call MPI_Abort (xpipe-train does), which ends the
//! job; a killed rank is seen by mpirun, which ends the job itself.
//! Usage: `MpiExecutor e(MPI_COMM_WORLD, 2); pipe.train(schedule, my_rows, e);`
class MpiExecutor {
 public:
  static constexpr const char* name = "mpi";
  //! How long any wait may last before the rank gives up (a stopped or hung peer).
  std::chrono::duration<double> wait_timeout = std::chrono::seconds(60);
  //! The most one reading of the clock adds to a wait: a larger jump is this process stopped.
  std::chrono::duration<double> max_clock_step = std::chrono::milliseconds(100);

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
    workers_ = size / replicas;
    worker_ = rank_ % workers_;
    replica_ = rank_ / workers_;
    XPIPE_MPI_CHECK(MPI_Comm_split(world_, replica_, worker_, &pipeline_));
    XPIPE_MPI_CHECK(MPI_Comm_split(world_, worker_, replica_, &replicas_of_worker_));
    XPIPE_MPI_CHECK(MPI_Comm_dup(world_, &control_));
    XPIPE_MPI_CHECK(MPI_Comm_dup(pipeline_, &norms_comm_));
    for (MPI_Comm c : {pipeline_, replicas_of_worker_, control_, norms_comm_})
      XPIPE_MPI_CHECK(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
    board_.connect(control_, report_tag);
    detail::mpi_report_rank.store(rank_, std::memory_order_relaxed);
  }
  MpiExecutor(const MpiExecutor&) = delete;
  MpiExecutor& operator=(const MpiExecutor&) = delete;
  ~MpiExecutor() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;  // (an executor outliving MPI_Finalize has nothing left to free)
    board_.release();
    for (MPI_Comm* c : {&pipeline_, &replicas_of_worker_, &control_, &norms_comm_, &world_})
      if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  int replicas() const { return replicas_; }
  //! The ranks of one pipeline (its workers: its stages, without virtual stages), and this
  //! rank's place among them (its worker: its stage, without virtual stages).
  int workers() const { return workers_; }
  int worker() const { return worker_; }
  int replica() const { return replica_; }
  //! The world rank of worker (stage) w of replica r.
  int rank_of(int w, int r) const { return r * workers_ + w; }
  //! The ranks of this rank's pipeline (its workers, in order) and of its worker's replicas.
  MPI_Comm pipeline_comm() const { return pipeline_; }
  MPI_Comm replicas_comm() const { return replicas_of_worker_; }
  //! Whether the last run averaged this rank's stages' gradients over their replicas on the
  //! devices (DeviceReplicaMean) rather than through pinned host memory and MPI.
  bool replica_means_on_device() const { return means_on_device_; }

  template <Program P>
  void run(P& program) {
    static_assert(
        requires { program.links().at(Channel{}).connect(MpiLinkEnd{}); },
        "xpipe: MpiExecutor: the Program's links must be MPI link ends (MpiLink, StagedMpiLink): "
        "use Pipeline<..., MpiChannel>");
    const Schedule& s = program.schedule();
    check_structure(s);  // any Program may hand one in: worker_steps needs it whole
    bool clipping = false;
    if constexpr (requires { program.reduces_across_stages(); })
      clipping = program.reduces_across_stages();
    if (clipping && !has_norm_board<P>)
      throw ConfigError(
          "xpipe: MpiExecutor: global gradient-norm clipping needs the Program's "
          "gradient_norm_board() to share each stage's norm between the ranks");
    if (!s.has_virtual_stages() && s.stages != workers_)
      throw ConfigError("xpipe: MpiExecutor: schedule '" + s.name + "' has " +
                        std::to_string(s.stages) + " stages, but " + std::to_string(size_) +
                        " ranks over " + std::to_string(replicas_) + " replica(s) make " +
                        std::to_string(workers_) + " (launch replicas x stages ranks)");
    if (s.has_virtual_stages() && s.workers() != workers_)
      throw ConfigError("xpipe: MpiExecutor: schedule '" + s.name + "' runs " +
                        std::to_string(s.stages) + " stages on " + std::to_string(s.workers()) +
                        " workers, but " + std::to_string(size_) + " ranks over " +
                        std::to_string(replicas_) + " replica(s) make " + std::to_string(workers_) +
                        " a pipeline (launch replicas x workers ranks)");
    if (replicas_ > 1 && !has_gradients<P> && !on_device<P>)
      throw ConfigError("xpipe: MpiExecutor: " + std::to_string(replicas_) +
                        " replicas need the Program's gradients(k) to average them");
    if (clipping && on_device<P>)
      throw ConfigError(
          "xpipe: MpiExecutor: global gradient-norm clipping of a device pipeline over MPI ranks "
          "is not built (each stage's norm stays in its device's memory): train it in one "
          "process (CudaExecutor), or over ranks without clip_norm");
    owner_ = stage_workers(s);
    const std::vector<WorkerStep> mine = worker_steps(s)[static_cast<std::size_t>(worker_)];
    const int k0 = mine.empty() ? worker_ : mine.front().stage;  // for the waits of the ends
    first_stage_ = k0;
    means_on_device_ = false;
    if constexpr (on_device<P>)
      if (replicas_ > 1) {
        if constexpr (device_means<P>) means_on_device_ = connect_device_means(program, s, k0);
        if (!means_on_device_) program.prepare_host_gradients();
      }
    std::fill(mean_enqueued_.begin(), mean_enqueued_.end(), 0);
    mean_enqueued_.resize(static_cast<std::size_t>(s.stages), 0);
    const auto action_at = [&](std::size_t i) -> const Action& {
      return s.actions[static_cast<std::size_t>(mine[i].stage)][mine[i].position];
    };
    trace_ = ExecutionTrace::sized_for(s);
    connect(program, s);
    ScopedFlushDenormals ftz;
    gave_up_ = false;
    detail::mpi_clock_step_ns.store(step_ns(), std::memory_order_relaxed);
    const detail::ClockWatch watch{std::chrono::nanoseconds(step_ns())};

    // A common start: t0 is taken as the barrier completes, on every rank alike (one host's
    // clocks agree; across hosts this aligns each rank's zero to the barrier's end).
    MPI_Request barrier = MPI_REQUEST_NULL;
    XPIPE_MPI_CHECK(MPI_Ibarrier(world_, &barrier));
    wait_request(barrier, k0, "start", collective("the other ranks to start the run", 0, 1, size_));
    const auto t0 = std::chrono::steady_clock::now();

    // Where a stage's gradient is complete for a Step: after the last action that adds to it (a
    // B or W) before the step. The all-reduces start in the worker's order, the same on every
    // replica (non-blocking collectives on one communicator must be started in one order).
    std::vector<char> reduce_after(mine.size(), 0);
    for (std::size_t i = 0; i < mine.size(); ++i) {
      const auto& list = s.actions[static_cast<std::size_t>(mine[i].stage)];
      if (!info(list[mine[i].position].kind).adds_gradient) continue;
      for (std::size_t j = mine[i].position + 1; j < list.size(); ++j)
        if (info(list[j].kind).adds_gradient || info(list[j].kind).applies_gradient) {
          reduce_after[i] = info(list[j].kind).applies_gradient;
          break;
        }
    }
    std::vector<MPI_Request> reduce(static_cast<std::size_t>(s.stages), MPI_REQUEST_NULL);
    // What moves on while this rank waits or between its actions: a device pipeline's staged
    // sends and receives, and its gradients' all-reduces once their copies reach the host.
    to_reduce_.clear();
    to_reduce_.reserve(mine.size());
    reduce_head_ = 0;
    pump_ = [&] { pump(program, s, reduce); };
    struct ClearPump {
      std::function<void()>& f;
      ~ClearPump() { f = nullptr; }
    } clear_pump{pump_};
    // With replicas: the mini-batch whose all-reduce each stage has completed (clipping
    // completes every local stage's at the first step of the mini-batch).
    std::vector<int> reduced(static_cast<std::size_t>(s.stages), -1);
    if constexpr (has_norm_board<P>)
      if (clipping)
        norms_.size_for(s.stages, workers_,
                        static_cast<int>(std::count(owner_.begin(), owner_.end(), worker_)),
                        program.gradient_norm_board().mini_batches());
    std::size_t i = 0;
    list_size_.store(static_cast<long>(mine.size()), std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    try {
      for (; i < mine.size(); ++i) {
        const auto [k, p] = mine[i];
        const Action& a = action_at(i);
        if constexpr (has_norm_board<P>)
          if (clipping && info(a.kind).applies_gradient) {
            if (replicas_ > 1) reduce_for_norms(program, a, reduce, reduced);
            wait_for_norms(program, k, a);
          }
        wait_ready(program, s, k, a);
        if (info(a.kind).applies_gradient && replicas_ > 1 &&
            reduced[static_cast<std::size_t>(k)] != a.index) {
          finish_reduce(program, k, a, reduce[static_cast<std::size_t>(k)]);
          reduced[static_cast<std::size_t>(k)] = a.index;
        }
        const double start = detail::seconds_since(t0);
        program.execute(k, a);
        trace_.stages[static_cast<std::size_t>(k)][p] = {a, start, detail::seconds_since(t0)};
        if (reduce_after[i] && replicas_ > 1)
          start_reduce(program, k, reduce[static_cast<std::size_t>(k)]);
        pump_();
        if constexpr (has_norm_board<P>)
          if (clipping && replicas_ == 1) start_norm_gathers(program.gradient_norm_board());
        done_.store(static_cast<long>(i + 1), std::memory_order_relaxed);
      }
      wait_until([&] { return sends_done(program, s); }, k0, "end",
                 [&] { return unfinished_send(program, s); });
      // A device pipeline: this rank's streams waited for, and its losses read and checked
      // where the last stage runs here (a NaN there stops every rank, as any failure does).
      if constexpr (on_device<P>) program.finish_here(owner(s.stages - 1) == worker_);
      trace_.seconds = detail::seconds_since(t0);
      share_losses(program, s, k0);
      gather_trace(s, k0);
    } catch (const MpiAbortNotice&) {
      give_up_device_means();
      throw;
    } catch (const StageError& e) {
      give_up_device_means();
      notify_others(e.what(), gave_up_);
      throw;
    } catch (const std::exception& e) {
      give_up_device_means();
      const std::string at = i < mine.size() ? to_string(action_at(i)) : "end";
      StageError err(i < mine.size() ? mine[i].stage : k0, at, on_rank() + ": " + e.what());
      notify_others(err.what(), false);
      throw err;
    } catch (...) {
      give_up_device_means();
      const std::string at = i < mine.size() ? to_string(action_at(i)) : "end";
      StageError err(i < mine.size() ? mine[i].stage : k0, at,
                     on_rank() + ": non-standard exception");
      notify_others(err.what(), false);
      throw err;
    }
  }

  //! The fraction of this rank's action list run so far (safe to read from another thread
  //! while run() runs: progress bars of ranks that do not compute the loss).
  double progress() const {
    const long n = list_size_.load(std::memory_order_relaxed);
    return n > 0 ? static_cast<double>(done_.load(std::memory_order_relaxed)) / n : 0.0;
  }

  //! After run(): on world rank 0, the rows of replica 0's stages (one row per stage, times
  //! since the common start); on other ranks, the rows of their own stages.
  const ExecutionTrace& trace() const { return trace_; }

  //! Broadcasts each stage's optimizer state (weights, moments, step count) and its layers'
  //! state (BatchNorm running statistics) from the rank that trained it to every rank of its
  //! pipeline, so that every rank holds the whole trained model (to evaluate, checkpoint or
  //! compare it); a device pipeline's through host memory. Collective over each pipeline; `p`
  //! is the Pipeline that run() trained.
  template <class Pipe>
  void share_stage_states(Pipe& p) {
    p.for_each_optimizer_state_on([&](int k, auto& opt, const auto& ctx) {
      using State = std::decay_t<decltype(opt)>;
      const index_t n = opt.size();
      const std::string what = "stage " + std::to_string(k) + "'s trained state";
      const Awaited all = collective(what, rank_of(0, replica_), 1, workers_);
      long steps = opt.steps_taken();
      if constexpr (Pipe::on_device) {  // through host memory, a buffer at a time
        share_staged(opt.weights(), n, owner(k), ctx, all);
        for (int m = 0; m < State::moment_buffers; ++m)
          share_staged(opt.moment(m), n, owner(k), ctx, all);
        MPI_Request req = MPI_REQUEST_NULL;
        XPIPE_MPI_CHECK(MPI_Ibcast(&steps, 1, MPI_LONG, owner(k), pipeline_, &req));
        wait_request(req, first_stage_, "share", all);
      } else {  // straight from and into the buffers, every broadcast started before any wait
        std::vector<MPI_Request> reqs(State::moment_buffers + 2, MPI_REQUEST_NULL);
        const int root = owner(k), count = static_cast<int>(n);
        XPIPE_MPI_CHECK(MPI_Ibcast(opt.weights(), count, MPI_FLOAT, root, pipeline_, &reqs[0]));
        for (int m = 0; m < State::moment_buffers; ++m)
          XPIPE_MPI_CHECK(MPI_Ibcast(opt.moment(m), count, MPI_FLOAT, root, pipeline_,
                                     &reqs[static_cast<std::size_t>(m) + 1]));
        XPIPE_MPI_CHECK(MPI_Ibcast(&steps, 1, MPI_LONG, root, pipeline_, &reqs.back()));
        for (MPI_Request& r : reqs) wait_request(r, first_stage_, "share", all);
      }
      opt.set_steps_taken(steps);
    });
    // The layers' non-trainable state (BatchNorm's running statistics) too: the rank that
    // evaluates or checkpoints needs every stage's, not the initial ones.
    p.for_each_running_state_on([&](int k, float* state, index_t n, const auto& ctx) {
      const Awaited all = collective("stage " + std::to_string(k) + "'s layer state",
                                     rank_of(0, replica_), 1, workers_);
      if constexpr (Pipe::on_device) {
        share_staged(state, n, owner(k), ctx, all);
      } else {
        MPI_Request req = MPI_REQUEST_NULL;
        XPIPE_MPI_CHECK(
            MPI_Ibcast(state, static_cast<int>(n), MPI_FLOAT, owner(k), pipeline_, &req));
        wait_request(req, first_stage_, "share", all);
      }
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
  // The pipeline rank (worker) that runs stage k: its own number, or the schedule's worker of
  // it after a run with virtual stages.
  int owner(int k) const {
    return k < static_cast<int>(owner_.size()) ? owner_[static_cast<std::size_t>(k)] : k;
  }
  // "rank 1 (stage 2)": the rank of this replica that runs stage k.
  std::string rank_name(int k) const {
    return "rank " + std::to_string(rank_of(owner(k), replica_)) + " (stage " + std::to_string(k) +
           ")";
  }
  // "rank 5 (stage 1)", or with virtual stages "rank 1 (stages 1, 2)".
  std::string world_rank_name(int r) const {
    const int w = r % workers_;
    std::string stages;
    int count = 0;
    for (int k = 0; k < static_cast<int>(std::max<std::size_t>(owner_.size(), 1)); ++k)
      if (owner(k) == w) stages += (count++ ? ", " : "") + std::to_string(k);
    if (count == 0) stages = std::to_string(w);
    return "rank " + std::to_string(r) + (count > 1 ? " (stages " : " (stage ") + stages + ")";
  }

  // What a wait waits for: one rank (`rank`), or the ranks of a collective (first, first +
  // stride, ..., `count` of them; rank -1), or, for neither, nobody in particular.
  struct Awaited {
    std::string what;  // "the input of F6 from rank 1 (stage 1)"
    int rank = -1;
    int first = 0, stride = 1, count = 0;
  };
  static Awaited collective(std::string what, int first, int stride, int count) {
    return {std::move(what), -1, first, stride, count};
  }

  // Broadcasts n floats of device memory at `data` from pipeline rank `root`
  // (share_stage_states on a device) through host memory: copied out on the root, in on the
  // others, each copy waited for on ctx's stream (between runs).
  template <class Ctx>
  void share_staged(float* data, index_t n, int root, const Ctx& ctx, const Awaited& all) {
    share_staging_.resize(static_cast<std::size_t>(n));
    float* at = share_staging_.data();
    if (root == worker_) copy_to_host(ctx, static_cast<const float*>(data), at, n);
    MPI_Request req = MPI_REQUEST_NULL;
    XPIPE_MPI_CHECK(MPI_Ibcast(at, static_cast<int>(n), MPI_FLOAT, root, pipeline_, &req));
    wait_request(req, first_stage_, "share", all);
    if (root != worker_) copy_from_host(ctx, static_cast<const float*>(at), data, n);
  }

  // Wires this rank's ends of every boundary: a producer or consumer end towards the rank of
  // the other stage, both ends (a ring in memory) between two stages of its own. Links joining
  // the same two ranks the same way (virtual stages: worker 0 sends stage 0's and stage 2's
  // outputs to worker 1) take lanes of the tag space, so their messages never match each other.
  template <class P>
  void connect(P& program, const Schedule& s) {
    auto& links = program.links();
    const int K = s.stages;
    struct Wire {
      int from, to, lane;
    };
    std::vector<Wire> wires;  // [2 b + direction]
    int lanes = 1;
    for (int b = 0; b + 1 < K; ++b)
      for (Flow f : {Flow::Activations, Flow::Gradients}) {
        const int from = owner(f == Flow::Activations ? b : b + 1),
                  to = owner(f == Flow::Activations ? b + 1 : b);
        int lane = 0;
        for (std::size_t j = static_cast<std::size_t>(f == Flow::Gradients); j < wires.size();
             j += 2)
          lane += wires[j].from == from && wires[j].to == to;
        wires.push_back({from, to, lane});
        lanes = std::max(lanes, lane + 1);
      }
    for (int b = 0; b + 1 < K; ++b)
      for (Flow f : {Flow::Activations, Flow::Gradients}) {
        const int direction = f == Flow::Activations ? 0 : 1;
        const Wire& w = wires[static_cast<std::size_t>(2 * b + direction)];
        MpiLinkEnd end;
        end.comm = pipeline_;
        end.direction = direction;
        end.lane = w.lane;
        end.lanes = lanes;
        if (worker_ == w.from && worker_ == w.to) {
          end.role = LinkRole::Both;
        } else if (worker_ == w.from) {
          end.role = LinkRole::Producer;
          end.peer = w.to;
        } else if (worker_ == w.to) {
          end.role = LinkRole::Consumer;
          end.peer = w.from;
          // The consumer pops in the order of its own actions that read this channel.
          const int to = f == Flow::Activations ? b + 1 : b;
          for (const Action& a : s.actions[static_cast<std::size_t>(to)])
            if (channels_of(K, to, a).in == Channel{b, f}) end.order.push_back(a.index);
        }
        links.at(Channel{b, f}).connect(std::move(end));
      }
  }

  // Whether every message this rank's stages sent has been received (a link whose producer
  // end is not this rank's says so at once).
  template <class P>
  bool sends_done(P& program, const Schedule& s) {
    for (int b = 0; b + 1 < s.stages; ++b)
      for (Flow f : {Flow::Activations, Flow::Gradients})
        if (!program.links().at(Channel{b, f}).sends_done()) return false;
    return true;
  }

  // The first neighbour whose receive of this rank's last messages has not completed.
  template <class P>
  Awaited unfinished_send(P& program, const Schedule& s) {
    for (int b = 0; b + 1 < s.stages; ++b)
      for (Flow f : {Flow::Activations, Flow::Gradients})
        if (!program.links().at(Channel{b, f}).sends_done()) {
          const int to = f == Flow::Activations ? b + 1 : b;
          return {"its last messages to be received by " + rank_name(to),
                  rank_of(owner(to), replica_)};
        }
    return {"its last messages to be received by its neighbours"};
  }

  template <class P>
  void wait_ready(P& program, const Schedule& s, int k, const Action& a) {
    if (program.ready(k, a)) return;
    wait_until([&] { return program.ready(k, a); }, k, to_string(a),
               [&]() -> Awaited {
                 // Its producer while its input is missing, else its consumer. Read after the wait
                 // found the action not ready, the input may have arrived since: with no output to
                 // make room for, the wait was still for that input (never a stage -1).
                 const int producer = producer_stage(s.stages, k, a);
                 const int consumer = consumer_stage(s.stages, k, a);
                 bool input_missing = producer >= 0;
                 if constexpr (requires { program.input_ready(k, a); })
                   input_missing = input_missing && !program.input_ready(k, a);
                 if (producer >= 0 && (input_missing || consumer < 0))
                   return {"the input of " + to_string(a) + " from " + rank_name(producer),
                           rank_of(owner(producer), replica_)};
                 if (consumer >= 0)
                   return {
                       "room to send the output of " + to_string(a) + " to " + rank_name(consumer),
                       rank_of(owner(consumer), replica_)};
                 return {"the action to be ready"};
               });
  }

  template <class P>
  static constexpr bool has_gradients = requires(P& p) {
    p.gradients(0);
  };
  template <class P>
  static constexpr bool has_norm_board = requires(P& p) {
    p.gradient_norm_board();
  };
  // A device pipeline (Pipeline<..., Cuda, MpiChannel>): its streams finish inside the run, and
  // its gradients reach MPI through pinned copies.
  template <class P>
  static constexpr bool on_device = requires(P& p) {
    p.finish_here(true);
  };
  template <class P>
  static constexpr bool has_progress = requires(P& p) {
    p.links().at(Channel{}).progress();
  };
  // A device pipeline whose backend averages gradients over replicas on the devices.
  template <class P>
  struct MeanOf {
    using type =
        DeviceReplicaMean<std::remove_cvref_t<decltype(std::declval<P&>().stage_context(0))>>;
  };
  template <class P>
  static constexpr bool device_means = [] {
    if constexpr (requires(P & p) { p.stage_context(0); })
      return MeanOf<P>::type::available;
    else
      return false;
  }();

  // With replicas on a device: whether every replica of each of this rank's stages has a device
  // of its own (their device_identity()s gathered over the replicas' communicator, with the
  // run's deadline), and then the stages' DeviceReplicaMeans, made once and kept while the
  // replicas' devices and this rank's stages stay the same. Every replica decides alike: all
  // see the same identities. False: the gradients go through pinned memory and MPI.
  template <class P>
  bool connect_device_means(P& program, const Schedule& s, int k0) {
    using Mean = typename MeanOf<P>::type;
    constexpr std::size_t slot = 256;
    std::vector<int> stages;
    for (int k = 0; k < s.stages; ++k)
      if (owner(k) == worker_) stages.push_back(k);
    std::string mine_text, key = typeid(Mean).name();
    for (int k : stages) {
      std::string id = Mean::device_identity(program.stage_context(k));
      id.resize(slot - 1, ' ');
      mine_text += id;
      mine_text.push_back('\0');
    }
    const std::size_t each = mine_text.size();
    std::vector<char> all(each * static_cast<std::size_t>(replicas_));
    MPI_Request req = MPI_REQUEST_NULL;
    XPIPE_MPI_CHECK(MPI_Iallgather(mine_text.data(), static_cast<int>(each), MPI_CHAR, all.data(),
                                   static_cast<int>(each), MPI_CHAR, replicas_of_worker_, &req));
    wait_request(req, k0, "start",
                 collective("the devices of the replicas of stage " + std::to_string(k0), worker_,
                            workers_, replicas_));
    bool distinct = true;
    for (std::size_t j = 0; j < stages.size(); ++j)
      for (int a = 0; a < replicas_; ++a)
        for (int b = a + 1; b < replicas_; ++b) {
          const char* x = all.data() + static_cast<std::size_t>(a) * each + j * slot;
          const char* y = all.data() + static_cast<std::size_t>(b) * each + j * slot;
          if (std::memcmp(x, y, slot) == 0) distinct = false;
        }
    if (!distinct) return false;
    key.append(all.begin(), all.end());
    for (int k : stages) key += "," + std::to_string(k);
    if (means_ == nullptr || means_key_ != key) {
      means_.reset();
      auto made = std::make_unique<DeviceMeans<Mean>>();
      made->of.resize(static_cast<std::size_t>(s.stages));
      for (int k : stages)
        made->of[static_cast<std::size_t>(k)] =
            std::make_unique<Mean>(replicas_of_worker_, program.stage_context(k));
      means_ = std::move(made);
      means_key_ = key;
    }
    return true;
  }

  // A failed run: the device means are given up (their peers may never reach a collective)
  // and made anew by the next run.
  void give_up_device_means() noexcept {
    if (means_ == nullptr) return;
    means_->abort();
    means_.reset();
    means_key_.clear();
  }

  // Moves on what needs no wait: the staged transfers of a device pipeline's links, and the
  // all-reduces of the gradients whose copies to the host are done (started in the order their
  // copies were enqueued: the same worker order on every replica).
  template <class P>
  void pump(P& program, const Schedule& s, std::vector<MPI_Request>& reduce) {
    if constexpr (has_progress<P>)
      for (int b = 0; b + 1 < s.stages; ++b)
        for (Flow f : {Flow::Activations, Flow::Gradients})
          program.links().at(Channel{b, f}).progress();
    if constexpr (on_device<P>)
      while (reduce_head_ < to_reduce_.size() &&
             program.gradients_on_host(to_reduce_[reduce_head_])) {
        const int k = to_reduce_[reduce_head_++];
        start_gradient_sum(program.host_gradients(k), replicas_of_worker_,
                           reduce[static_cast<std::size_t>(k)]);
      }
  }
  // Whether stage k's gradient is still on its way to the host (its all-reduce not started).
  bool reduce_pending(int k) const {
    return std::find(to_reduce_.begin() + static_cast<std::ptrdiff_t>(reduce_head_),
                     to_reduce_.end(), k) != to_reduce_.end();
  }

  // Global clipping over ranks: stage k's squared gradient norm of mini-batch t reaches every
  // rank of the pipeline by one MPI_Iallgather per mini-batch (on a communicator of its own),
  // started once this rank's stages have all posted t, in the order of t on every rank (the
  // order non-blocking collectives must start in). A rank sends K values, its stages' norms and
  // zeros, and posts the others' stages from what it gathers: every rank's board then holds the
  // same values, summed in stage order, so S(t) scales by the bits of the threaded executor.
  struct NormShare {
    int stages = 0, workers = 0, local = 0;  // local: this rank's stages
    int next = 0;                            // the mini-batch whose gather starts next
    std::vector<double> sent, got;           // [t K + k], [t W K + w K + k]
    std::vector<MPI_Request> requests;       // [t]
    std::vector<char> posted;                // [t]: the gathered norms are on the board
    void size_for(int K, int W, int mine, int mini_batches) {
      stages = K;
      workers = W;
      local = mine;
      next = 0;
      const auto T = static_cast<std::size_t>(mini_batches);
      sent.assign(T * static_cast<std::size_t>(K), 0.0);
      got.assign(T * static_cast<std::size_t>(W * K), 0.0);
      requests.assign(T, MPI_REQUEST_NULL);
      posted.assign(T, 0);
    }
  };

  // Starts the gather of every mini-batch whose norms this rank's stages have all posted.
  template <class Board>
  void start_norm_gathers(Board& board) {
    // Before its own gather starts, only this rank's stages can have posted t.
    while (norms_.next < board.mini_batches() && board.posts(norms_.next) == norms_.local)
      start_norm_gather(board);
  }
  // Starts the gather of mini-batch norms_.next: this rank's stages' values, zeros elsewhere.
  template <class Board>
  void start_norm_gather(Board& board) {
    const int t = norms_.next++;
    const int K = norms_.stages;
    double* out = norms_.sent.data() + static_cast<std::size_t>(t) * K;
    for (int k = 0; k < K; ++k) out[k] = owner(k) == worker_ ? board.squared(t, k) : 0.0;
    XPIPE_MPI_CHECK(MPI_Iallgather(
        out, K, MPI_DOUBLE, norms_.got.data() + static_cast<std::size_t>(t) * norms_.workers * K, K,
        MPI_DOUBLE, norms_comm_, &norms_.requests[static_cast<std::size_t>(t)]));
  }

  // With replicas, at the first step of mini-batch t on this rank: completes the all-reduce of
  // every stage of this rank (each started after the stage's last gradient of t, which a
  // schedule that clips runs before any step of t: Pipeline::train checks it), replaces each
  // stage's posted norm by the norm of its averaged gradient, and starts t's gather.
  template <class P>
  void reduce_for_norms(P& program, const Action& a, std::vector<MPI_Request>& reduce,
                        std::vector<int>& reduced) {
    const int t = a.index;
    if (t < norms_.next) return;  // this rank's earlier step of t did it
    auto& board = program.gradient_norm_board();
    if (t != norms_.next || board.posts(t) != norms_.local)
      throw Error("a step of mini-batch " + std::to_string(t) +
                  " came before this rank's stages had all added their gradients of it");
    if constexpr (has_gradients<P>)
      for (int j = 0; j < norms_.stages; ++j) {
        if (owner(j) != worker_) continue;
        const auto u = static_cast<std::size_t>(j);
        if (reduced[u] != t) {
          finish_reduce(program, j, a, reduce[u]);
          reduced[u] = t;
        }
        const std::span<float> g = program.gradients(j);
        board.replace(t, j, squared_norm(g.data(), static_cast<index_t>(g.size())));
      }
    start_norm_gather(board);
  }

  // Whether every stage's norm of mini-batch t is on the board: once t's gather has completed,
  // posts the other ranks' stages.
  template <class Board>
  bool norms_arrived(Board& board, int t) {
    const auto u = static_cast<std::size_t>(t);
    if (t < norms_.next && !norms_.posted[u]) {
      int done = 0;
      XPIPE_MPI_CHECK(MPI_Test(&norms_.requests[u], &done, MPI_STATUS_IGNORE));
      if (done) {
        const int K = norms_.stages;
        for (int k = 0; k < K; ++k)
          if (owner(k) != worker_)
            board.post(t, k, norms_.got[(u * norms_.workers + owner(k)) * K + k]);
        norms_.posted[u] = 1;
      }
    }
    return board.complete(t);
  }

  // A step under global clipping first waits for every stage's norm of its mini-batch.
  template <class P>
  void wait_for_norms(P& program, int k, const Action& a) {
    auto& board = program.gradient_norm_board();
    wait_until([&] { return norms_arrived(board, a.index); }, k, to_string(a),
               [&] {
                 return collective(
                     "every stage's gradient norm of mini-batch " + std::to_string(a.index),
                     rank_of(0, replica_), 1, workers_);
               });
  }

  template <class P>
  void start_reduce(P& program, int k, MPI_Request& req) {
    if constexpr (device_means<P>)
      if (means_on_device_) {  // on the stage's stream, after the backward just enqueued
        using Mean = typename MeanOf<P>::type;
        Mean& mean = *static_cast<DeviceMeans<Mean>&>(*means_).of[static_cast<std::size_t>(k)];
        program.with_device_gradients(
            k, [&](const auto& ctx, float* g, index_t n) { mean.mean(ctx, g, n); });
        mean_enqueued_[static_cast<std::size_t>(k)] = 1;
        return;
      }
    if constexpr (on_device<P>) {  // the all-reduce starts once the copy is done (pump)
      program.gradients_to_host(k);
      to_reduce_.push_back(k);
    } else if constexpr (has_gradients<P>) {
      start_gradient_sum(program.gradients(k), replicas_of_worker_, req);
    }
  }

  template <class P>
  void finish_reduce(P& program, int k, const Action& a, MPI_Request& req) {
    if (means_on_device_) {  // the step follows the mean on the stage's stream: no host wait
      if (!mean_enqueued_[static_cast<std::size_t>(k)])
        throw Error("no gradient mean over the replicas was enqueued for " + to_string(a) +
                    " (no backward before it)");
      mean_enqueued_[static_cast<std::size_t>(k)] = 0;
      return;
    }
    if constexpr (on_device<P>)
      if (reduce_pending(k))
        wait_until([&] { return !reduce_pending(k); }, k, to_string(a),
                   [&] {
                     return Awaited{"stage " + std::to_string(k) + "'s gradient to reach the host"};
                   });
    if (req == MPI_REQUEST_NULL)
      throw Error("no gradient all-reduce was started for " + to_string(a) +
                  " (no backward before it)");
    std::string peers;
    for (int r = 0; r < replicas_; ++r)
      peers += (r ? ", " : "") + std::to_string(rank_of(owner(k), r));
    wait_request(req, k, to_string(a),
                 collective("the gradient all-reduce with the replicas of stage " +
                                std::to_string(k) + " (ranks " + peers + ")",
                            owner(k), workers_, replicas_));
    // The mean over replicas: each replica's loss is already scaled by 1 / its rows. On a
    // device, in the pinned copy, which then goes back before the step (on the stage's stream).
    if constexpr (on_device<P>) {
      scale_gradient_sum(program.host_gradients(k), replicas_);
      program.gradients_from_host(k);
    } else if constexpr (has_gradients<P>) {
      scale_gradient_sum(program.gradients(k), replicas_);
    }
  }

  // Every rank gets every micro-batch's loss: the last stages' values summed over the world
  // and divided by R (each replica's mean over its equal share: the mean over the whole batch).
  // (`k`: this rank's first stage, named by its waits.)
  template <class P>
  void share_losses(P& program, const Schedule& s, int k) {
    if constexpr (requires { program.micro_losses(); }) {
      std::span<double> loss = program.micro_losses();
      const int last = s.stages - 1;
      if (owner(last) != worker_)  // only the rank of the last stage computed them
        for (double& v : loss) v = 0;
      MPI_Request r = MPI_REQUEST_NULL;
      XPIPE_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, loss.data(), static_cast<int>(loss.size()),
                                     MPI_DOUBLE, MPI_SUM, world_, &r));
      wait_request(r, k, "end", collective("the other ranks' losses", 0, 1, size_));
      for (double& v : loss) v /= replicas_;
    }
  }

  // World rank 0 collects the rows of replica 0's stages: (start, end) of every action. Each
  // rank sends the rows of its stages, in stage order.
  void gather_trace(const Schedule& s, int k) {
    if (replica_ != 0) return;
    std::vector<double> mine;
    for (int k = 0; k < s.stages; ++k)
      if (owner(k) == worker_)
        for (const ActionTiming& t : trace_.stages[static_cast<std::size_t>(k)]) {
          mine.push_back(t.start);
          mine.push_back(t.end);
        }
    std::vector<int> counts(static_cast<std::size_t>(workers_), 0), offsets(counts.size());
    for (int k = 0; k < s.stages; ++k)
      counts[static_cast<std::size_t>(owner(k))] +=
          2 * static_cast<int>(s.actions[static_cast<std::size_t>(k)].size());
    int total = 0;
    for (std::size_t w = 0; w < counts.size(); ++w) {
      offsets[w] = total;
      total += counts[w];
    }
    std::vector<double> all(worker_ == 0 ? static_cast<std::size_t>(total) : 0);
    MPI_Request r = MPI_REQUEST_NULL;
    XPIPE_MPI_CHECK(MPI_Igatherv(mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE, all.data(),
                                 counts.data(), offsets.data(), MPI_DOUBLE, 0, pipeline_, &r));
    wait_request(r, k, "end",
                 collective("the trace of the other stages", rank_of(0, replica_), 1, workers_));
    if (worker_ != 0) return;
    std::vector<std::size_t> at(offsets.begin(), offsets.end());  // next value of each rank's
    for (int k = 0; k < s.stages; ++k) {
      std::size_t& next = at[static_cast<std::size_t>(owner(k))];
      for (ActionTiming& t : trace_.stages[static_cast<std::size_t>(k)]) {
        t.start = all[next++];
        t.end = all[next++];
      }
    }
  }

  void wait_request(MPI_Request& r, int k, const std::string& action, const Awaited& awaited) {
    wait_until(
        [&] {
          int done = 0;
          XPIPE_MPI_CHECK(MPI_Test(&r, &done, MPI_STATUS_IGNORE));
          return done != 0;
        },
        k, action, [&] { return awaited; });
  }

  using clock = std::chrono::steady_clock;
  static std::int64_t ns(clock::duration d) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  }
  std::int64_t step_ns() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(max_clock_step).count();
  }

  // Polls `done` (spinning briefly, then yielding the core: ranks may outnumber cores) until it
  // holds; throws when another rank reports a failure or after wait_timeout. The time waited is
  // the sum of the clock's readings, each counted up to max_clock_step: a rank continued after a
  // stop finds its clock far ahead, and that is no neighbour's fault. `what` says what the wait
  // waits for (an Awaited); it is read when the wait is reported and when it gives up.
  template <class Done, class What>
  void wait_until(Done&& done, int k, const std::string& action, What&& what) {
    const auto cap = std::chrono::duration_cast<clock::duration>(max_clock_step);
    // Reported once it has lasted an eighth of the timeout, and as often again while it lasts:
    // the other ranks hear of it long before any of them gives up, and see it go stale when
    // this rank stops.
    const auto period = std::max(std::chrono::duration_cast<clock::duration>(wait_timeout / 8),
                                 clock::duration(std::chrono::milliseconds(1)));
    clock::duration waited{};
    clock::time_point last{}, reported{};
    bool published = false;
    struct Clear {  // the wait is over (done, or thrown): nothing to report any more
      ~Clear() {
        detail::mpi_wait_length.store(0, std::memory_order_release);
        detail::mpi_wait_last_ns.store(0, std::memory_order_relaxed);
      }
    } clear;
    for (unsigned spins = 0;; ++spins) {
      if (pump_) pump_();  // (what it waits for may need it: a staged send, an all-reduce)
      if (done()) {
        if (published) withdraw();
        return;
      }
      if (spins < 64) continue;
      const clock::time_point now = clock::now();
      if (spins == 64) {  // a real wait: say where, for a signal handler
        set_wait_text(k, action, what().what);
      } else {
        const clock::duration step = now - last;
        if (step > cap) detail::note_clock_jump(ns(step));
        waited += std::clamp(step, clock::duration::zero(), cap);
      }
      last = now;
      detail::mpi_wait_last_ns.store(ns(now.time_since_epoch()), std::memory_order_relaxed);
      const auto waiting = [&] { return seconds_text(waited) + " s for " + what().what; };
      if (spins % 16 == 0) {
        check_notices(k, action, waiting);
        board_.drain();
      }
      if (waited > period && (!published || now - reported >= period)) {
        publish(action, what(), period);
        published = true;
        reported = now;
      }
      if (waited > wait_timeout) {
        if (done()) {  // it came as the wait ran out
          if (published) withdraw();
          return;
        }
        check_notices(k, action, waiting);  // a rank that gave up first is quoted, not doubted
        board_.drain();
        const std::string why = give_up_text(what());
        gave_up_ = true;
        throw StageError(k, action, why);
      }
      std::this_thread::yield();
    }
  }

  void set_wait_text(int k, const std::string& action, const std::string& what) {
    detail::mpi_wait_length.store(0, std::memory_order_release);
    const std::string text =
        on_rank() + " (stage " + std::to_string(k) + ") was waiting at " + action + " for " + what;
    const std::size_t n = std::min(text.size(), sizeof detail::mpi_wait_text);
    std::memcpy(detail::mpi_wait_text, text.data(), n);
    detail::mpi_wait_length.store(static_cast<int>(n), std::memory_order_release);
  }

  // Tells the other ranks what this wait waits on (again: it still does).
  void publish(const std::string& action, const Awaited& a, clock::duration period) {
    detail::MpiWaitReport r;
    r.waits_on = a.rank;
    r.first = a.first;
    r.stride = a.stride;
    r.count = a.count;
    r.period_ms = static_cast<int>(std::max<long long>(
        1, std::chrono::duration_cast<std::chrono::milliseconds>(period).count()));
    const std::string text = "at " + action + " for " + a.what;
    std::memcpy(r.text, text.data(), std::min(text.size(), sizeof r.text - 1));
    board_.publish(r);
  }
  // Tells them it no longer waits.
  void withdraw() { board_.publish(detail::MpiWaitReport{}); }

  static std::string seconds_text(std::chrono::nanoseconds d) {
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.1f", std::chrono::duration<double>(d).count());
    return secs;
  }

  // "; rank 1's own clock jumped 12.3 s: this process was stopped or suspended", when a wait of
  // this run read the clock that far apart or the watch thread did; else "".
  std::string jump_note() const {
    const std::chrono::nanoseconds jump(detail::clock_jump_ns.load(std::memory_order_relaxed));
    if (jump.count() <= std::max<std::int64_t>(step_ns(), detail::clock_jump_reported_ns))
      return "";
    return "; rank " + std::to_string(rank_) + "'s own clock jumped " + seconds_text(jump) +
           " s: this process was stopped or suspended";
  }

  // The rank a wait on `waits_on`, or on the collective of `group`, leads to: that rank, or the
  // first rank of the collective not itself waiting on it; -1 when none is left that is not
  // `seen` (on the chain already).
  int next_on_chain(int waits_on, const detail::MpiWaitReport& group, const std::vector<char>& seen,
                    clock::time_point now) const {
    if (waits_on >= 0) return seen[static_cast<std::size_t>(waits_on)] ? -1 : waits_on;
    for (int i = 0; i < group.count; ++i) {
      const int m = group.first + i * group.stride;
      if (m < 0 || m >= size_ || seen[static_cast<std::size_t>(m)]) continue;
      if (board_.waiting(m, now) && board_.at(m).report.same_group(group)) continue;
      return m;
    }
    return -1;
  }

  // What this rank says as it gives up waiting for `a`: the stuck rank first, found by following
  // what the ranks waited on say they wait on, from the one `a` waits on to the first that does
  // not wait (or whose word has gone stale: it stopped inside its wait), then the chain to it.
  std::string give_up_text(const Awaited& a) const {
    std::string secs = std::to_string(wait_timeout.count());
    secs.erase(secs.find_last_not_of('0') + 1);
    if (secs.back() == '.') secs.pop_back();
    const std::string waited = on_rank() + " waited " + secs + " s for " + a.what;
    const clock::time_point now = clock::now();
    std::vector<char> seen(static_cast<std::size_t>(size_), 0);
    seen[static_cast<std::size_t>(rank_)] = 1;
    detail::MpiWaitReport mine;
    mine.first = a.first;
    mine.stride = a.stride;
    mine.count = a.count;
    int at = next_on_chain(a.rank, mine, seen, now);
    if (at < 0) return waited + jump_note();  // nobody in particular to name
    std::string chain =
        a.rank < 0 ? " (" + world_rank_name(at) + " does not say it waits in it)" : "";
    std::vector<int> path;
    int stuck = at;
    for (;;) {
      seen[static_cast<std::size_t>(at)] = 1;
      path.push_back(at);
      const detail::MpiWaitBoard::Entry& e = board_.at(at);
      if (!board_.waiting(at, now)) {
        stuck = at;
        if (e.report.text[0] == '\0')
          chain +=
              ", which is not waiting on any rank (it is stopped, hung, or running a long "
              "action)";
        else
          chain += ", which said " + seconds_text(now - e.heard) + " s ago that it waits " +
                   e.report.text + ", and not since (it is stopped or hung)";
        break;
      }
      chain += ", which waits " + std::string(e.report.text);
      const int next = next_on_chain(e.report.waits_on, e.report, seen, now);
      if (next < 0 && e.report.waits_on < 0 && e.report.count == 0) {  // on nobody in particular
        stuck = at;
        break;
      }
      if (next < 0) {
        // Back on the chain: ranks that all say they wait on each other. One of them stopped
        // just now (its word is not stale yet): the one heard from longest ago.
        stuck = *std::min_element(path.begin(), path.end(), [&](int x, int y) {
          return board_.at(x).heard < board_.at(y).heard;
        });
        chain += ": a cycle of waits, of which " + world_rank_name(stuck) +
                 " was heard from longest ago";
        break;
      }
      if (e.report.waits_on < 0)
        chain += " (" + world_rank_name(next) + " does not say it waits in it)";
      at = next;
    }
    return world_rank_name(stuck) + " is stuck: " + waited + chain + jump_note();
  }

  static constexpr int notice_tag = 1, report_tag = 2;

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
    // The first character says whether that rank gave up waiting or failed.
    const bool gave_up = !text.empty() && text[0] == 'G';
    if (!text.empty()) text.erase(0, 1);
    throw MpiAbortNotice(k, action,
                         on_rank() + ", waiting " + waiting() + ", stopped because rank " +
                             std::to_string(st.MPI_SOURCE) +
                             (gave_up ? " gave up: " : " failed: ") + text + jump_note());
  }

  // Tells every other rank that this one failed or gave up waiting (sends that complete on their
  // own: the text is kept until the executor goes).
  void notify_others(const std::string& what, bool gave_up) noexcept {
    notice_ = (gave_up ? "G" : "F") + what;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      MPI_Request req = MPI_REQUEST_NULL;
      if (MPI_Isend(notice_.data(), static_cast<int>(notice_.size()), MPI_CHAR, r, notice_tag,
                    control_, &req) == MPI_SUCCESS)
        MPI_Request_free(&req);
    }
  }

  MPI_Comm world_ = MPI_COMM_NULL, pipeline_ = MPI_COMM_NULL, replicas_of_worker_ = MPI_COMM_NULL,
           control_ = MPI_COMM_NULL, norms_comm_ = MPI_COMM_NULL;
  NormShare norms_;  // global clipping's norms, per run
  // workers_: ranks per pipeline; worker_: this rank's place in it. Without virtual stages, a
  // worker is a stage.
  int rank_ = 0, size_ = 1, replicas_ = 1, workers_ = 1, worker_ = 0, replica_ = 0;
  std::vector<int> owner_;  // the worker of each stage in the last run (empty: stage k's own)
  int first_stage_ = 0;     // this rank's first stage in the last run, named by its later waits
  ExecutionTrace trace_;
  std::string notice_;
  std::function<void()> pump_;        // during run(): pump() of its program
  std::vector<int> to_reduce_;        // device replicas: stages whose gradient copies are enqueued,
  std::size_t reduce_head_ = 0;       // in order; those before the head have their all-reduce
  std::vector<float> share_staging_;  // share_stage_states on a device: host copies
  // Device replicas averaged on the devices: whether the last run did, which stages have a mean
  // enqueued and not yet followed by their step, and the DeviceReplicaMeans by stage (of the
  // backend the last run's program ran on; kept between runs under means_key_).
  struct AnyDeviceMeans {
    virtual ~AnyDeviceMeans() = default;
    virtual void abort() noexcept = 0;
  };
  template <class Mean>
  struct DeviceMeans final : AnyDeviceMeans {
    std::vector<std::unique_ptr<Mean>> of;  // by stage; null where another rank runs it
    void abort() noexcept override {
      for (auto& m : of)
        if (m) m->abort();
    }
  };
  bool means_on_device_ = false;
  std::vector<char> mean_enqueued_;
  std::unique_ptr<AnyDeviceMeans> means_;
  std::string means_key_;
  std::atomic<long> list_size_{0}, done_{0};
  detail::MpiWaitBoard board_;
  bool gave_up_ = false;  // the StageError in flight is this rank's own timeout
};

static_assert(Executor<MpiExecutor>);

}  // namespace xpipe
