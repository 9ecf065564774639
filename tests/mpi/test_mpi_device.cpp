// The MPI executor over device pipelines (Pipeline<..., EmulatedDevice, MpiChannel>: its links
// StagedMpiLink ends, device slots staged through pinned host memory), under mpirun, on the
// emulated device (support/emulated_device.hpp): each rank's stages run on streams that lag the
// host by random delays, or one stream far behind, so a send started before its copy to pinned
// memory has run carries NaN, and a receive posted again under a pending copy faults. The math
// is the host's, so every result must equal the host pipeline's bit for bit: the threaded
// executor's in one process (and the same device pipeline trained in one process), and with
// replicas the host pipeline's over the same ranks; one link without a pipeline around it must
// carry every message whole. Each also runs with MPI moving the device slots themselves (the
// emulated device's mpi_aware, what a CUDA-aware MPI does), no pinned copies; and with events
// reported done too early the bits must not be the host's (selfcheck, a job of its own). Usage:
// mpirun -np N xpipe_test_mpi_device bitwise|dp|link|fault <nan|device>.
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "../support/emulated_device.hpp"
#include "../support/emulated_replica_mean.hpp"
#include "../support/support.hpp"
#include "mpi_support.hpp"
#include "xpipe/exec/mpi.hpp"
#include "xpipe/xpipe.hpp"

using namespace xpipe;
using namespace xpipe::test::mpi;
using test::EmulatedDevice;

namespace {

template <class... S>
using HostPipe = Pipeline<S..., AnyPredictor, AnyOptimizer, MpiChannel>;
template <class... S>
using DevicePipe = Pipeline<S..., AnyPredictor, AnyOptimizer, EmulatedDevice, MpiChannel>;

// A run that failed where it should not have: the ranks may be out of step (one gave up, the
// others wait on it), so the job ends here rather than at every later wait's deadline.
[[noreturn]] void fatal(const std::string& what) {
  std::fprintf(stderr, "FAIL rank %d: %s (ending the job)\n", world_rank(), what.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

// The emulated streams' timing for one pass: every stream jittered 0..jitter_us before each
// task, and stage `slow` (-1: none) slow_us more; seeded by the rank, so ranks differ.
struct Emulation {
  Emulation(int jitter_us, int slow = -1, int slow_us = 0) {
    EmulatedDevice::jitter_us = jitter_us;
    EmulatedDevice::slow_stage = slow;
    EmulatedDevice::slow_us = slow_us;
    EmulatedDevice::seed = 17u + static_cast<unsigned>(world_rank());
  }
  ~Emulation() {
    EmulatedDevice::jitter_us = 0;
    EmulatedDevice::slow_stage = -1;
    EmulatedDevice::slow_us = 0;
    EmulatedDevice::done_early = false;
    EmulatedDevice::mpi_aware = false;
  }
};

struct Outcome {
  std::vector<float> weights;
  std::vector<double> losses;  // per epoch
  std::string error;
};

// Trains `epochs` epochs of `d`; with an MpiExecutor every rank then holds every stage's state.
template <class P, class E>
Outcome train(E& exec, const std::string& sched, const std::string& pred, int M, index_t batch,
              const test::LabelledData& d, int epochs, float clip = 0) {
  Outcome o;
  try {
    P pipe(optimizer_for(pred),
           PipelineOptions{.batch = batch, .micro_batches = M, .seed = 7, .clip_norm = clip},
           make_predictor(pred));
    const Schedule s =
        make_schedule(sched, P::stage_count, M, static_cast<int>(pipe.mini_batches_for(d.rows)),
                      test::uneven_costs(P::stage_count));
    for (int e = 0; e < epochs; ++e) o.losses.push_back(pipe.train(s, d.epoch(), exec).loss);
    if constexpr (std::is_same_v<E, MpiExecutor>) exec.share_stage_states(pipe);
    o.weights = pipe.weights();
  } catch (const std::exception& e) {
    o.error = e.what();
  }
  return o;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Compares a run against the host's; returns whether it was compared (both ran).
bool compare(const std::string& what, const Outcome& host, const Outcome& got) {
  if (!host.error.empty() || !got.error.empty()) {
    if (host.error != got.error)
      fatal(what + ": the host says '" + host.error + "', the device '" + got.error + "'");
    return false;
  }
  if (!same_bits(host.weights, got.weights)) fail(what + ": weights differ from the host's");
  if (host.losses != got.losses) fail(what + ": losses differ from the host's");
  return true;
}

// Every schedule of one stage per rank (virtual = false) or of two (virtual = true) with three
// predictors, and every predictor under async 1F1B, the streams jittered; then each stage's
// stream in turn far behind the others (the staging's host waits are what keeps those bits).
template <class... S>
void bitwise_for(bool virtual_stages) {
  const int K = static_cast<int>(sizeof...(S)), M = K;
  const test::LabelledData d = test::random_classification(88, 12, 4, 11);
  MpiExecutor exec;
  ThreadedExecutor threads;
  int compared = 0, runs = 0;
  const auto run = [&](const std::string& sched, const std::string& pred, int jitter, int slow,
                       int slow_us) {
    if ((stages_per_worker(sched) > 1) != virtual_stages) return;
    const std::string what = sched + " x " + pred + " (jitter " + std::to_string(jitter) +
                             " us, stage " + std::to_string(slow) + " slow)";
    const Outcome host = train<HostPipe<S...>>(threads, sched, pred, M, 16, d, 2);
    Emulation emulation(jitter, slow, slow_us);
    const Outcome ranks = train<DevicePipe<S...>>(exec, sched, pred, M, 16, d, 2);
    ++runs;
    compared += compare(what + " over MPI ranks", host, ranks);
    if (!host.error.empty() && pred == "latest") fail(what + ": refused: " + host.error);
  };
  for (const char* sched : schedule_names)
    for (const char* pred : {"latest", "xpipe", "spectrain"}) run(sched, pred, 20, -1, 0);
  for (const char* pred : predictor_names)
    run(virtual_stages ? "interleaved-1f1b" : "async-1f1b", pred, 20, -1, 0);
  for (int k = 0; k < K; ++k) run(virtual_stages ? "zb-v" : "zb-h1", "latest", 0, k, 300);
  // A CUDA-aware MPI (mpi_aware): the device slots themselves on the wire, no pinned copies;
  // the streams jittered, then each stage's far behind.
  const auto direct = [&](const std::string& sched, int jitter, int slow, int slow_us) {
    if ((stages_per_worker(sched) > 1) != virtual_stages) return;
    const std::string what = sched + " x latest, MPI moving device memory (jitter " +
                             std::to_string(jitter) + " us, stage " + std::to_string(slow) +
                             " slow)";
    const Outcome host = train<HostPipe<S...>>(threads, sched, "latest", M, 16, d, 2);
    Emulation emulation(jitter, slow, slow_us);
    EmulatedDevice::mpi_aware = true;
    const Outcome ranks = train<DevicePipe<S...>>(exec, sched, "latest", M, 16, d, 2);
    ++runs;
    compared += compare(what, host, ranks);
  };
  for (const char* sched : schedule_names) direct(sched, 20, -1, 0);
  for (int k = 0; k < K; ++k) direct(virtual_stages ? "zb-v" : "zb-h1", 0, k, 300);
  // The same device pipeline in one process (its links device rings): the host's bits too.
  {
    Emulation emulation(20);
    const char* sched = virtual_stages ? "interleaved-1f1b" : "async-1f1b";
    const Outcome host = train<HostPipe<S...>>(threads, sched, "xpipe", M, 16, d, 2);
    compared += compare(std::string(sched) + " in one process", host,
                        train<DevicePipe<S...>>(threads, sched, "xpipe", M, 16, d, 2));
  }
  // Global clipping of a device pipeline over ranks is refused, before any action, alike on
  // every rank.
  const Outcome clipped = train<DevicePipe<S...>>(exec, "gpipe", "latest", M, 16, d, 1, 0.05f);
  if (!virtual_stages &&
      clipped.error.find("global gradient-norm clipping of a device pipeline over MPI ranks is "
                         "not built") == std::string::npos)
    fail("clipping: expected the refusal, got '" + clipped.error + "'");
  if (world_rank() == 0)
    std::printf(
        "bitwise: %d device runs of %d stages on %d ranks, %d equal to the host's (the "
        "rest refused alike)\n",
        runs + 1, K, world_size(), compared);
}

void bitwise() {
  if (world_size() == 2) {
    bitwise_for<A, D>(false);
    bitwise_for<A, B, C, D>(true);  // two stages per rank
  } else if (world_size() == 4) {
    bitwise_for<A, B, C, D>(false);
  } else {
    throw ConfigError("bitwise: run on 2 or 4 ranks (got " + std::to_string(world_size()) + ")");
  }
}

// The self-check, a job of its own: with every event reported done at once, the host touches
// a slot before the stream's work on it has run, and the bits must not be the host's. First with
// MPI moving the device slots (sends of slots the slow stream has not written carry stale
// values, receives posted again overwrite what it has not read: finite values, no fault, so the
// ranks stay in step), then staged (a send of NaN makes a NaN loss, a receive posted under a
// pending copy faults, a stale one gives other bits). A run that fails leaves the ranks unable
// to go on together (a collective may stay posted on one of them), so the program ends there:
// each rank says what it saw, and the job is aborted (the test reads rank 0's line).
template <class... S>
[[noreturn]] void self_check(bool virtual_stages) {
  const int M = static_cast<int>(sizeof...(S));
  const test::LabelledData d = test::random_classification(88, 12, 4, 11);
  MpiExecutor exec;
  ThreadedExecutor threads;
  // Stage 0's stream 3 ms behind per task: the host reaches a slot before the stream on almost
  // every message, however loaded the machine.
  Emulation emulation(0, 0, 3000);
  EmulatedDevice::done_early = true;
  const char* sched = virtual_stages ? "zb-v" : "zb-h1";
  const Outcome host = train<HostPipe<S...>>(threads, sched, "latest", M, 16, d, 2);
  EmulatedDevice::mpi_aware = true;
  const Outcome direct = train<DevicePipe<S...>>(exec, sched, "latest", M, 16, d, 2);
  EmulatedDevice::mpi_aware = false;
  if (!direct.error.empty())
    fatal("self-check: with done() true at once and MPI moving device memory: '" + direct.error +
          "'");
  if (same_bits(host.weights, direct.weights))
    fatal(
        "self-check: with done() true at once and MPI moving device memory the ranks still have "
        "the host's bits");
  const Outcome early = train<DevicePipe<S...>>(exec, sched, "latest", M, 16, d, 2);
  const bool caught =
      early.error.empty()
          ? !same_bits(host.weights, early.weights)
          : early.error.find("the host changed pinned memory") != std::string::npos ||
                early.error.find("loss is NaN") != std::string::npos;
  if (!caught)
    fatal(
        "self-check: with done() true at once the ranks still have the host's bits, or failed "
        "otherwise: '" +
        early.error + "'");
  std::printf("self-check rank %d: caught both ways (direct: other bits; staged: %s)\n",
              world_rank(), early.error.empty() ? "other bits" : "failed as expected");
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(1));  // every rank's line first
  MPI_Abort(MPI_COMM_WORLD, 0);
  std::abort();
}

// 2 replicas of a 2-rank pipeline on 4 ranks, of 2 stages (virtual = false) or of 4, two per
// rank (virtual = true: a device ring between each rank's two stages), each device run twice:
// with every rank on a device of its own, each stage's gradient averaged on the devices
// (DeviceReplicaMean, emulated: a blocking all-reduce on the stage's stream); and with the
// ranks naming one shared device, copied to pinned memory, summed by MPI, divided and copied
// back. The host pipeline over the same ranks is the oracle (the same sums in the same order:
// the same bits), and each run must have taken the way its devices call for.
template <class... S>
int data_parallel_for(bool virtual_stages) {
  const int R = 2, M = virtual_stages ? 4 : 2;
  const index_t batch = 16;
  const test::LabelledData d = test::random_classification(96, 12, 4, 5);
  MpiExecutor exec(MPI_COMM_WORLD, R);
  const test::LabelledData mine = replica_data(d, batch, M, R, exec.replica());
  int compared = 0;
  for (const char* sched : schedule_names) {
    if ((stages_per_worker(sched) > 1) != virtual_stages) continue;
    for (const char* pred : {"latest", "xpipe"}) {
      const Outcome host = train<HostPipe<S...>>(exec, sched, pred, M, batch / R, mine, 2);
      if (!host.error.empty() && std::string(sched) != "2bw")
        fail(std::string(sched) + " x " + pred + ": " + host.error);
      for (const bool shared : {false, true}) {
        const std::string what = std::string(sched) + " x " + pred + ", 2 replicas" +
                                 (shared ? " sharing a device" : " on devices of their own");
        test::shared_replica_device = shared;
        Emulation emulation(20, exec.worker(), 100);
        const Outcome device = train<DevicePipe<S...>>(exec, sched, pred, M, batch / R, mine, 2);
        test::shared_replica_device = false;
        compared += compare(what, host, device);
        if (device.error.empty() && exec.replica_means_on_device() == shared)
          fail(what + ": the gradients were averaged " +
               (shared ? "on the devices" : "through pinned memory"));
      }
    }
  }
  return compared;
}

void data_parallel() {
  if (world_size() != 4) throw ConfigError("dp: run on 4 ranks");
  const int two = data_parallel_for<A, D>(false);
  const int four = data_parallel_for<A, B, C, D>(true);
  if (world_rank() == 0)
    std::printf(
        "dp: %d device runs of 2 replicas x 2 ranks of 2 stages, %d of 4 stages (half with "
        "the gradients averaged on the devices, half through pinned memory), equal to the "
        "host's over the same ranks\n",
        two, four);
}

// One StagedMpiLink between 2 ranks, without a pipeline's back-pressure: rank 0's stream
// writes 40 messages of 1..3 rows into its device slots and pushes each as soon as a slot is
// free; rank 1's stream, `slow_us` behind per task, copies each to a device buffer of its own.
// Eager sends land at once, so a receive posted again before its copy to the device has run
// would be overwritten under it (a fault), and with rank 0 slow instead, a send started before
// its copy to pinned memory has run would carry NaN. Every message must arrive whole and in
// order. (A pipeline's own dependencies keep most of these races from arising.)
struct FillMessage {  // element i of message g: g * 100 + i
  float* slot;
  int g;
  XPIPE_HOST_DEVICE void operator()(index_t i) const {
    slot[i] = static_cast<float>(g * 100) + static_cast<float>(i);
  }
};
void link(int slow_rank, bool mpi_aware) {
  if (world_size() != 2) throw ConfigError("link: run on 2 ranks");
  constexpr int capacity = 2, messages = 40;
  constexpr index_t rows = 3, cols = 5;
  Emulation emulation(10, 0, 2000);  // stage 0 is this rank's only stream
  if (world_rank() != slow_rank) EmulatedDevice::slow_stage = -1;
  EmulatedDevice::mpi_aware = mpi_aware;
  const test::EmulatedStreamOwner owner(Placement{.stage = 0});
  const test::EmulatedContext& ctx = owner.ctx();
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  StagedMpiLink<EmulatedDevice> q(capacity, rows, cols, ctx, ctx);
  MpiLinkEnd end;
  end.comm = comm;
  end.peer = 1 - world_rank();
  end.role = world_rank() == 0 ? LinkRole::Producer : LinkRole::Consumer;
  for (int g = 0; g < messages; ++g) end.order.push_back(g);
  q.connect(end);
  if (q.direct() != mpi_aware)
    fail(std::string("link: the end ") + (mpi_aware ? "stages" : "sends device memory") +
         " where MPI " + (mpi_aware ? "moves device memory" : "does not"));
  const auto wait = [](auto ready) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!ready())
      if (std::chrono::steady_clock::now() > until) throw Error("link: a wait timed out");
  };
  const auto rows_of = [](int g) { return index_t{1} + g % rows; };
  if (world_rank() == 0) {
    for (int g = 0; g < messages; ++g) {
      wait([&] { return q.can_push(); });
      MicroBatchMessage& m = q.back();
      m.micro_batch = g;
      m.data.rows = rows_of(g);
      q.acquire_back(ctx);
      for_each_index(ctx, m.data.rows * cols, FillMessage{m.data.data, g});
      q.release_back(ctx);
      q.push();
    }
    wait([&] { return q.sends_done(); });
  } else {
    test::EmulatedBuffer<float> got(messages * rows * cols);
    for (int g = 0; g < messages; ++g) {
      wait([&] { return q.can_pop(); });
      const MicroBatchMessage& m = q.front();
      if (m.micro_batch != g || m.data.rows != rows_of(g))
        fail("link: message " + std::to_string(g) + " came as " + std::to_string(m.micro_batch) +
             " of " + std::to_string(m.data.rows) + " rows");
      q.acquire_front(ctx);
      copy_buffer(ctx, m.data.data, got.data() + g * rows * cols, m.data.rows * cols);
      q.release_front(ctx);
      q.pop();
    }
    std::vector<float> host(static_cast<std::size_t>(messages * rows * cols));
    try {
      copy_to_host(ctx, got.data(), host.data(), messages * rows * cols);
    } catch (const std::exception& e) {
      fail(std::string("link: the consumer's stream faulted: ") + e.what());
    }
    int wrong = 0;
    for (int g = 0; g < messages; ++g)
      for (index_t i = 0; i < rows_of(g) * cols; ++i)
        wrong += host[static_cast<std::size_t>(g * rows * cols + i)] !=
                 static_cast<float>(g * 100) + static_cast<float>(i);
    if (wrong > 0)
      fail("link: " + std::to_string(wrong) + " values arrived wrong (rank " +
           std::to_string(slow_rank) + "'s stream slow" +
           (mpi_aware ? ", MPI moving device memory)" : ")"));
  }
  q = StagedMpiLink<EmulatedDevice>();
  MPI_Comm_free(&comm);
}

// A fault on 2 ranks, after which the job must end (the caller aborts): `nan`, a NaN feature, so
// the last stage's loss (read on its rank at the end of the run) is NaN; `device`, rank 0's
// device faulted before the run, as by a kernel reading an illegal address.
void fault(const std::string& kind) {
  if (world_size() != 2) throw ConfigError("fault: run on 2 ranks");
  test::LabelledData d = test::random_classification(16 * 12, 12, 4, 3);
  if (kind == "nan") d.x[static_cast<std::size_t>((5 * 16 + 3) * 12)] = std::nanf("");
  MpiExecutor exec;
  exec.wait_timeout = std::chrono::seconds(20);
  Emulation emulation(20);
  DevicePipe<A, D> pipe(optimizer_for("latest"),
                        PipelineOptions{.batch = 16, .micro_batches = 2, .seed = 7},
                        make_predictor("latest"));
  const Schedule s = make_schedule("async-1f1b", 2, 2, 12);
  if (kind == "device" && exec.rank() == 0) {
    pipe.for_each_optimizer_state_on([](int k, auto&, const auto& ctx) {
      if (k == 0) test::fail_on_stream(ctx, "illegal address (injected)");
    });
  }
  for (int e = 0; e < 2; ++e) pipe.train(s, d.epoch(), exec);
  throw Error("fault " + kind + ": the run did not fail");
}

}  // namespace

int main(int argc, char** argv) {
  mpi_default_tuning();
  // The emulated replica mean's all-reduce runs on a stream's thread (emulated_replica_mean.hpp).
  int provided = MPI_THREAD_SINGLE;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "bitwise")
      bitwise();
    else if (mode == "dp")
      data_parallel();
    else if (mode == "link") {
      for (const bool mpi_aware : {false, true}) {
        link(0, mpi_aware);
        link(1, mpi_aware);
      }
    } else if (mode == "selfcheck") {
      if (world_size() == 2)
        self_check<A, B, C, D>(true);  // two stages per rank
      else
        self_check<A, B, C, D>(false);
    } else if (mode == "fault" && argc > 2)
      fault(argv[2]);
    else
      throw ConfigError(
          "usage: xpipe_test_mpi_device bitwise|dp|link|selfcheck|fault <nan|device>");
  } catch (const std::exception& e) {
    // A failed run leaves the ranks unable to go on together: end the job, a moment after the
    // other ranks (told by the executor) have printed what they saw.
    std::fprintf(stderr, "xpipe_test_mpi_device: rank %d: %s\n", world_rank(), e.what());
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  return finish(mode);
}
