// xpipe-train's runs, shared by its translation units: a run's configuration and record, the
// signal and MPI state, and run_pipeline / run_stages, which train one configuration on one
// compiled Pipeline type. The model table's instantiations are spread over runs_*.cpp
// so that they compile in parallel; main() is in xpipe_train.cpp.
// Over 400 lines: run_pipeline is one run's whole life (data, checkpoints, resume, epochs,
// failures), kept in one function template so its order reads top to bottom.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "divergence.hpp"
#include "models.hpp"
#include "output_files.hpp"
#include "run_checkpoints.hpp"
#include "sim_profile.hpp"
#include "xpipe/xpipe.hpp"
#if defined(XPIPE_WITH_MPI)
#include "xpipe/exec/mpi.hpp"
#endif

namespace xpipe::tools::train {

namespace fs = std::filesystem;
using tools::EpochRecord;
using tools::OutputError;

struct RunConfig {
  std::string model = "mlp";
  int stages = 4;
  int micro_batches = 4;
  std::string schedule = "async-1f1b";
  std::string predictor = "xpipe";
  // --predictor-param key=value, each applied to the run's predictor where it has that key
  // (main checks every one against the runs' predictors before any run starts).
  std::vector<std::pair<std::string, double>> predictor_params;
  std::string optimizer = "adam";
  float lr = 1e-3f;
  LearningRateSchedule lr_schedule;  // --lr-schedule: each epoch's rate from lr (constant)
  float clip_norm = 0;               // --clip-norm: global gradient-norm bound (0: off)
  long batch = 128;
  int epochs = 3;
  std::uint64_t seed = 1;
  std::string executor = "threaded";
  std::string device = "host";  // or cuda (runs_cuda.cu)
  int dp = 1;                   // --executor mpi: data-parallel replicas of the pipeline
  double wait_timeout = 60;     // seconds a stage may wait on another before giving up
  std::vector<int> pin_cpus;    // --executor threaded: stage k on CPU pin_cpus[k % size]
  int threads = 1;              // --threads: host threads of each stage (GEMMs, element loops)
  std::string checkpoint_dir;   // empty: no checkpoints
  int checkpoint_every = 1;     // epochs
  bool resume = false;
  bool measure_prediction = false;  // record each predictor's error (pipeline/prediction_probe.hpp)
  Augment augment;                  // --augment-pad, --augment-flip (data/augment.hpp)
  // CRC-32s of the training and test data in use (features and labels), so that a checkpoint
  // resumes only on the data it was trained on; set by main when checkpoints are on.
  std::string train_data_crc32, test_data_crc32;
  std::string label() const { return schedule + "+" + predictor + "(" + optimizer + ")"; }
};

// ok: trained every epoch. diverged: its loss ran away (tools::divergence), so it was stopped.
// failed: it could not run (2BW with M < K) or stopped on another error. interrupted: a signal
// stopped the study during it.
enum class RunStatus { ok, diverged, failed, interrupted };

inline const char* to_string(RunStatus s) {
  switch (s) {
    case RunStatus::ok:
      return "ok";
    case RunStatus::diverged:
      return "diverged";
    case RunStatus::failed:
      return "failed";
    case RunStatus::interrupted:
      return "interrupted";
  }
  return "?";
}

struct RunRecord {
  RunConfig config;
  RunStatus status = RunStatus::ok;
  std::string why;                  // what stopped it, unless ok
  std::vector<EpochRecord> epochs;  // those it finished
  std::vector<int> weight_copies;
  std::vector<double> activation_kib;  // peak per stage
  ExecutionTrace trace;                // of the last epoch
  Schedule schedule;                   // that the trace ran
  bool trace_files = false;            // its timeline and trace are written
  bool ends_job = false;  // under MPI it failed part-way: the ranks cannot go on together
  bool ok() const { return status == RunStatus::ok; }
};

// SIGINT and SIGTERM set this and nothing else; the study checks it at its check points (every
// 100 ms while an epoch trains, after each epoch and each run), so no write is ever cut short.
inline volatile std::sig_atomic_t stop_signal = 0;

// Whether this process was started by mpirun (Open MPI, or a PMI launcher such as MPICH's), and
// as how many ranks (0 when not).
inline int launched_ranks() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"})
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0') return std::atoi(v);
  return 0;
}

// Progress is redrawn in place only on a terminal, and never under mpirun: it gives rank 0 a
// pseudo-terminal even when the job's output goes to a file, which the redraws would fill.
inline bool interactive() {
  static const bool on = isatty(fileno(stdout)) != 0 && launched_ranks() == 0;
  return on;
}

// One line redrawn in place: [#####.....] 45%  loss 0.5312  12034 samples/s  ETA 3 s.
inline void show_progress(const std::string& label, int epoch, int epochs, long done, long total,
                          double loss, double seconds) {
  constexpr int width = 30;
  const double f = total > 0 ? std::min(1.0, static_cast<double>(done) / total) : 0.0;
  const int filled = static_cast<int>(f * width);
  const double rate = seconds > 0 ? done / seconds : 0.0;
  const double eta = rate > 0 ? (total - done) / rate : 0.0;
  std::printf("\r\033[K  %-30s epoch %d/%d [%s%s] %3.0f%%  loss %.4f  %6.0f samples/s  ETA %.0f s",
              label.c_str(), epoch, epochs, std::string(filled, '#').c_str(),
              std::string(width - filled, '.').c_str(), 100 * f, loss, rate, eta);
  std::fflush(stdout);
}

// A file-name form of a run label: async-1f1b+xpipe(adam) -> async-1f1b_xpipe_adam.
inline std::string file_stem(const std::string& label) {
  std::string out;
  for (char ch : label)
    if (std::isalnum(static_cast<unsigned char>(ch)) || ch == '-')
      out += ch;
    else if (!out.empty() && out.back() != '_')
      out += '_';
  while (!out.empty() && out.back() == '_') out.pop_back();
  return out;
}

// Called by a run at its check points with what it has finished: every 100 ms while an epoch
// trains (epoch_running is that epoch, which a stop abandons: a Pipeline cannot stop train()
// part-way) and after each epoch (epoch_running 0). It does not return when a signal arrived.
using CheckPoint = std::function<void(const RunRecord& so_far, int epoch_running)>;

// The run's checkpoint folder under --checkpoint-dir (empty when checkpoints are off).
inline fs::path run_checkpoint_dir(const RunConfig& c) {
  return c.checkpoint_dir.empty() ? fs::path{} : fs::path(c.checkpoint_dir) / file_stem(c.label());
}

// A float's shortest text that reads back to the same float (%.9g always does).
inline std::string float_text(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return buf;
}

// "pad=2,flip=1": the augmentation a run trains with, as checkpoints and runs.json record it.
inline std::string augment_text(const Augment& a) {
  return "pad=" + std::to_string(a.pad) + ",flip=" + (a.flip ? "1" : "0");
}

// The run's predictor: c.predictor with the --predictor-param values it has a key for.
inline AnyPredictor run_predictor(const RunConfig& c) {
  AnyPredictor p = make_predictor(c.predictor);
  for (const auto& [key, value] : c.predictor_params)
    if (p.has_hyper_parameter(key)) p.set(key, value);
  return p;
}

// What a checkpoint records of the run: everything that changes what it computes (not the
// executor, which gives the same bits, nor --epochs, which a resumed run may extend).
inline std::map<std::string, std::string> run_fields(const RunConfig& c, const DatasetPair& data) {
  return {{"run.model", c.model},
          {"run.stages", std::to_string(c.stages)},
          {"run.micro_batches", std::to_string(c.micro_batches)},
          {"run.schedule", c.schedule},
          {"run.predictor", c.predictor},
          {"run.predictor_params", run_predictor(c).hyper_text()},
          {"run.optimizer", c.optimizer},
          {"run.lr", float_text(c.lr)},
          {"run.lr_schedule", c.lr_schedule.text()},
          {"run.clip_norm", float_text(c.clip_norm)},
          {"run.batch", std::to_string(c.batch)},
          {"run.seed", std::to_string(c.seed)},
          {"run.train_samples", std::to_string(data.train.count)},
          {"run.test_samples", std::to_string(data.test.count)},
          {"run.train_data_crc32", c.train_data_crc32},
          {"run.test_data_crc32", c.test_data_crc32},
          {"run.dp", std::to_string(c.dp)},
          {"run.threads", std::to_string(c.threads)},
          {"run.augment", augment_text(c.augment)}};
}

// The CRC-32 of a data set as trained on (its features' bytes, then its labels'), as 8 hex digits.
inline std::string data_crc32(const Dataset& d) {
  const auto bytes = [](const auto* p, std::size_t n) {
    return std::span<const char>(reinterpret_cast<const char*>(p), n * sizeof *p);
  };
  const std::uint32_t a = xpipe::detail::crc32_of(bytes(
      d.features.data(), static_cast<std::size_t>(d.count) * static_cast<std::size_t>(d.width)));
  const std::uint32_t b = xpipe::detail::crc32_of(bytes(d.labels.data(), d.labels.size()));
  char out[24];
  std::snprintf(out, sizeof out, "%08x-%08x", a, b);
  return out;
}

// --executor mpi: this process's rank and the executor every run uses (made once, collectively,
// in main). Only rank 0 prints and writes; a failed run ends the whole job (mpi_fail).
#if defined(XPIPE_WITH_MPI)
inline MpiExecutor* mpi_executor = nullptr;
#endif
inline int mpi_rank = 0;
// This rank's place among the ranks of its machine (MPI_COMM_TYPE_SHARED): with --device cuda
// it trains on GPU mpi_local_rank % (the machine's GPU count).
inline int mpi_local_rank = 0;
#if defined(XPIPE_WITH_CUDA)
// The GPU of the rank `local_rank` of a machine: local_rank % the machine's GPU count
// (runs_cuda.cu).
int rank_device(int local_rank);
#endif

// Under MPI a run that fails cannot go on: every rank prints what it saw (the executor told the
// others first), then the job ends with MPI_Abort. Rank 0 calls it once the run is recorded in
// its files. The others leave rank 0 the time to fail too and record it: it learns of their
// failure at its next wait, and gives up on a stuck rank within the wait timeout; they end the
// job themselves after that much (plus 5 s for its files) only if rank 0 is the stuck rank.
[[noreturn]] inline void mpi_fail(const std::string& why) {
  std::fprintf(stderr, "xpipe-train: rank %d: %s\n", mpi_rank, why.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
#if defined(XPIPE_WITH_MPI)
  using namespace std::chrono;
  const duration<double> grace = mpi_rank == 0 || mpi_executor == nullptr
                                     ? duration<double>(0.2)
                                     : mpi_executor->wait_timeout + seconds(5);
  std::this_thread::sleep_for(grace);
  MPI_Abort(MPI_COMM_WORLD, 1);
#endif
  std::_Exit(1);
}

// Whether --executor mpi can train P: its links are MpiChannel's (which train in one process
// too).
template <class P>
constexpr bool links_over_mpi() {
#if defined(XPIPE_WITH_MPI)
  return std::is_same_v<typename P::queue_policy, MpiChannel>;
#else
  return false;
#endif
}

// Replica r's share of the epoch's rows (replica_rows), copied out, for --dp > 1.
struct ReplicaRows {
  HostBuffer<float> x;
  HostBuffer<std::int32_t> y;
  index_t rows = 0;
};

// Why a run that a signal stopped is incomplete: the epoch it abandoned, or the last it kept.
inline std::string stop_reason(int epoch_running, std::size_t epochs_done) {
  return epoch_running > 0
             ? "stopped in epoch " + std::to_string(epoch_running) + " (that epoch is not kept)"
             : "stopped after epoch " + std::to_string(epochs_done);
}

// Records a stopped run in its files from the signal check; a failed write ends the process at
// once (exit 1, naming the file), as nothing more can be kept.
template <class Files, class Run>
void add_or_exit(Files& files, Run&& run) {
  try {
    files.add(std::forward<Run>(run));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "xpipe-train: %s\n", e.what());
    std::fflush(stdout);
    std::_Exit(1);
  }
}

// Marks `rec` failed in epoch `e` for `why`, keeping the epochs it finished; under MPI the job
// must end once it is recorded (ends_job).
inline RunRecord& failed(RunRecord& rec, int e, const std::string& why, bool on_mpi) {
  rec.status = RunStatus::failed;
  rec.why = "epoch " + std::to_string(e) + ": " + why;
  rec.ends_job = on_mpi;
  return rec;
}

// Runs one configuration on one compiled Pipeline type, with any executor its links allow. A
// run that diverges, or fails in an epoch, comes back marked so, with the epochs it finished.
// The run's schedule over n mini-batches. zb-auto is fitted to the F, I and W seconds this
// machine takes on this model's stages: profiled on a copy of the pipeline over the first three
// mini-batches of the training set, one action at a time on the stages' threads (rank 0 profiles
// and sends the costs to the other ranks, so that all run one order). Whatever order it gets, it
// trains the same bits: it is synchronous and adds gradients in micro-batch order.
template <class P>
Schedule run_schedule(const RunConfig& c, const DatasetPair& data, index_t replica_batch, int n,
                      [[maybe_unused]] bool on_mpi) {
  constexpr int K = P::stage_count;
  if (!fitted_to_costs(c.schedule)) return make_schedule(c.schedule, K, c.micro_batches, n);
  if constexpr (P::on_device) {
    throw ConfigError("xpipe-train: --schedule " + c.schedule +
                      ": the device pipeline does not profile its actions yet");
  } else {
    SplitBackwardCosts costs;
    if (mpi_rank == 0) {
      P probe(make_optimizer(c.optimizer, c.lr),
              PipelineOptions{.batch = replica_batch,
                              .micro_batches = c.micro_batches,
                              .seed = c.seed,
                              .threads_per_stage = c.threads},
              run_predictor(c));
      const Dataset first = head(data.train, std::min(data.train.count, 3 * replica_batch));
      costs = profile_split_backward(probe, EpochData{first.matrix(), first.labels.data()}, 2,
                                     c.pin_cpus);
    }
#if defined(XPIPE_WITH_MPI)
    if (on_mpi)
      for (std::vector<double>* v : {&costs.forward, &costs.input_grad, &costs.weight_grad}) {
        v->resize(K);
        MPI_Bcast(v->data(), K, MPI_DOUBLE, 0, MPI_COMM_WORLD);
      }
#endif
    std::string fitted;
    for (int k = 0; k < K; ++k) {
      char b[64];
      const auto u = static_cast<std::size_t>(k);
      std::snprintf(b, sizeof b, "%s%.3g/%.3g/%.3g", k == 0 ? "" : " | ", costs.forward[u] * 1e3,
                    costs.input_grad[u] * 1e3, costs.weight_grad[u] * 1e3);
      fitted += b;
    }
    // What the fit buys, by dry run under the profile (one core per stage): seconds per
    // mini-batch in the steady state, against ZB-H2's order, the one for equal costs.
    const ActionCost cost = [&costs](int k, const Action& a) { return costs.seconds(k, a); };
    const auto period = [&](const std::string& name) {
      return steady_state_period(
          [&](int N) { return make_schedule(name, K, c.micro_batches, N, costs); }, cost);
    };
    if (mpi_rank == 0)
      std::printf(
          "  %s fitted to F/I/W ms per stage (profiled): %s; dry run %.4g ms per mini-batch, "
          "ZB-H2's order %.4g ms\n",
          c.schedule.c_str(), fitted.c_str(), period(c.schedule) * 1e3, period("zb-h2") * 1e3);
    return make_schedule(c.schedule, K, c.micro_batches, n, costs);
  }
}

template <class P>
RunRecord run_pipeline(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  const bool on_mpi = links_over_mpi<P>() && c.executor == "mpi";
  const bool root = mpi_rank == 0;
  // Each of the dp replicas trains on its share of every mini-batch of c.batch rows.
  const index_t replica_batch = c.batch / c.dp;
  PipelineOptions options{.batch = replica_batch,
                          .micro_batches = c.micro_batches,
                          .seed = c.seed,
                          .threads_per_stage = c.threads,
                          .measure_prediction = c.measure_prediction,
                          .clip_norm = c.clip_norm};
#if defined(XPIPE_WITH_CUDA)
  // A rank per GPU: every stage of this rank on its machine's GPU local rank % count (2 ranks
  // on a machine of one GPU share it).
  if constexpr (P::on_device)
    if (on_mpi) options.devices = {rank_device(mpi_local_rank)};
#endif
  P pipe(make_optimizer(c.optimizer, c.lr), options, run_predictor(c));
  // Augmented training images are drawn afresh each epoch into a copy of the set, which the
  // batcher reads (deterministic from seed, epoch and sample: every executor trains on the same).
  const bool augmenting = !c.augment.identity();
  if (augmenting && data.train.width != 28 * 28)
    throw ConfigError(
        "xpipe-train: --augment-pad/--augment-flip need 1x28x28 images, the "
        "training set has " +
        std::to_string(data.train.width) + " features");
  Dataset augmented = augmenting ? head(data.train, data.train.count) : Dataset{};
  Batcher batcher(augmenting ? augmented : data.train, c.batch, c.seed);
  HostBuffer<float> x(data.train.count * data.train.width);
  HostBuffer<std::int32_t> y(data.train.count);
  const Matrix xm{x.data(), data.train.count, data.train.width};
  ReplicaRows share;
  std::vector<index_t> share_rows;
  if (c.dp > 1) {
#if defined(XPIPE_WITH_MPI)
    share_rows = replica_rows(data.train.count, c.batch, c.micro_batches, c.dp,
                              mpi_executor ? mpi_executor->replica() : 0, data.train.group);
#endif
    share.rows = static_cast<index_t>(share_rows.size());
    share.x = HostBuffer<float>(share.rows * data.train.width);
    share.y = HostBuffer<std::int32_t>(share.rows);
  }
  const index_t n = pipe.mini_batches_for(c.dp > 1 ? share.rows : data.train.count);
  const Schedule schedule = run_schedule<P>(c, data, replica_batch, static_cast<int>(n), on_mpi);
  // warmup-cosine: the rate of each of the run's optimizer steps (the n mini-batches of every
  // epoch), keyed by the step count a checkpoint restores.
  pipe.set_step_rates(c.lr_schedule.step_rates(static_cast<long>(n) * c.epochs));
  RunRecord rec;
  rec.config = c;
  // Checkpoints: one folder per run, a checkpoint every --checkpoint-every epochs and after
  // the last (and at a stop), resumed from the newest that verifies.
  const fs::path ckpt_dir = run_checkpoint_dir(c);
  const auto fields = run_fields(c, data);
  int first_epoch = 1;
  std::vector<int> restored_copies;
  std::vector<double> restored_kib;
  if (!ckpt_dir.empty() && c.resume) {
    if (const auto found = tools::find_resumable_checkpoint(ckpt_dir, c.label(), root)) {
      const std::string where = found->folder.string();
      tools::check_run_fields(found->fields, fields, where,
                              {{"run.predictor_params", make_predictor(c.predictor).hyper_text()}});
      load_checkpoint(pipe, *found);
      const auto& bytes = found->file("records.tsv");
      rec.epochs = tools::parse_records(std::string(bytes.begin(), bytes.end()),
                                        where + "/records.tsv", P::stage_count);
      first_epoch = static_cast<int>(rec.epochs.size()) + 1;
      for (int k = 0; k < P::stage_count; ++k) {
        const std::string at = std::to_string(k);
        restored_copies.push_back(
            static_cast<int>(found->field_integer("result.weight_copies." + at, 0, 1 << 20)));
        restored_kib.push_back(found->field_number("result.activation_kib." + at, 0, 1e15));
      }
      // A checkpoint past --epochs is not trained back to it: its epochs are the run's.
      const std::string past =
          first_epoch - 1 > c.epochs
              ? "; more than --epochs " + std::to_string(c.epochs) + ", so none trains and the " +
                    "run reports the checkpoint's " + std::to_string(first_epoch - 1)
              : "";
      std::printf("  %-34s resumed from %s (%d epochs done%s)\n", c.label().c_str(), where.c_str(),
                  first_epoch - 1, past.c_str());
    }
  }
  auto save = [&](int e) {
    char name[32];
    std::snprintf(name, sizeof name, "ckpt-%06d", e);
    auto with_epoch = fields;
    with_epoch["epoch"] = std::to_string(e);
    for (int k = 0; k < P::stage_count; ++k) {  // what the outputs report of the run
      const std::string at = std::to_string(k);
      with_epoch["result.weight_copies." + at] = std::to_string(pipe.weight_copies(k));
      with_epoch["result.activation_kib." + at] =
          tools::exact(static_cast<double>(pipe.activation_floats(k)) * 4 / 1024);
    }
    save_checkpoint(pipe, ckpt_dir, name, with_epoch,
                    {{"records.tsv", tools::records_text(rec.epochs)}});
  };
  ReferenceExecutor reference;
  ThreadedExecutor threaded;
  threaded.wait_timeout = std::chrono::duration<double>(c.wait_timeout);
  threaded.cpus = c.pin_cpus;
  for (int e = first_epoch; e <= c.epochs; ++e) {
    EpochData epoch{xm, y.data()};
    EpochResult r;
    std::exception_ptr failure;
    // The worker says when the epoch is done; the wait below wakes on it at once, and every
    // 100 ms before to check for a signal and show progress.
    std::mutex done_mutex;
    std::condition_variable done;
    bool finished = false;
    std::thread worker;
    // Whatever fails in an epoch (here its rate, data or thread, below its training, evaluation
    // or checkpoint) fails the run with the epochs it finished.
    try {
      // Set afresh each epoch from (lr, e, epochs) alone: a resumed run trains at the same rate
      // (checkpoints do not store it).
      pipe.set_learning_rate(c.lr_schedule.at(c.lr, e, c.epochs));
      if (augmenting)
        augment_epoch(HostContext{.threads = 2}, data.train, augmented, Dims{1, 28, 28}, c.augment,
                      c.seed, e);
      batcher.gather_epoch(static_cast<std::uint64_t>(e), xm, y.data());
      if (c.dp > 1) {  // this replica's rows of the epoch, in order
        for (std::size_t i = 0; i < share_rows.size(); ++i) {
          const index_t row = share_rows[i];
          std::copy_n(x.data() + row * data.train.width, data.train.width,
                      share.x.data() + static_cast<index_t>(i) * data.train.width);
          share.y.data()[i] = y.data()[row];
        }
        epoch = EpochData{Matrix{share.x.data(), share.rows, data.train.width}, share.y.data()};
      }
    } catch (const std::exception& err) {
      return failed(rec, e, err.what(), on_mpi);
    }
    try {
      worker = std::thread([&] {
        try {
          if (on_mpi) {
#if defined(XPIPE_WITH_MPI)
            if constexpr (links_over_mpi<P>()) {
              r = pipe.train(schedule, epoch, *mpi_executor);
              // Every rank gets every stage's trained state: rank 0 evaluates and checkpoints it.
              mpi_executor->share_stage_states(pipe);
            }
#endif
          } else {
            r = c.executor == "reference" ? pipe.train(schedule, epoch, reference)
                                          : pipe.train(schedule, epoch, threaded);
          }
        } catch (...) {
          failure = std::current_exception();
        }
        {
          const std::lock_guard lock(done_mutex);
          finished = true;
        }
        done.notify_one();
      });
    } catch (const std::exception& err) {  // no thread to train with
      return failed(rec, e, err.what(), on_mpi);
    }
    const auto t0 = std::chrono::steady_clock::now();
    const auto epoch_done = [&] {
      std::unique_lock lock(done_mutex);
      return done.wait_for(lock, std::chrono::milliseconds(100), [&] { return finished; });
    };
    while (!epoch_done()) {
      check(rec, e);
      if (interactive() && root) {
        const auto p = pipe.progress();  // (never under mpirun: see interactive)
        const double loss = p.samples > 0 ? p.loss_sum / p.samples : 0.0;
        show_progress(c.label(), e, c.epochs, p.samples, data.train.count, loss,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    }
    check(rec, e);  // a signal that came while the epoch ran abandons it, however short it was
    worker.join();
    if (interactive() && root) std::printf("\r\033[K");
    if (failure) {
      try {
        std::rethrow_exception(failure);
      } catch (const ConfigError& err) {
        // A configuration a predictor refuses as training starts (2BW + EF with M < K) cannot
        // run, as one refused at construction: the caller says so (a sweep's "not run" cell).
        if (rec.epochs.empty() && !on_mpi) throw;
        return failed(rec, e, err.what(), on_mpi);
      } catch (const Error& err) {
        // The library throws on a NaN or infinite loss; any other error is a failure, and so
        // is a non-finite loss it blames on the data ("bad data"), not on divergence.
        const std::string what = err.what();
        const bool numeric = (what.find("loss is NaN") != std::string::npos ||
                              what.find("loss is infinite") != std::string::npos) &&
                             what.find("bad data") == std::string::npos;
        failed(rec, e, what, on_mpi);
        if (numeric) rec.status = RunStatus::diverged;
        return rec;
      } catch (const std::exception& err) {
        return failed(rec, e, err.what(), on_mpi);
      }
    }
    const ExecutionTrace& tr = c.executor == "reference" ? reference.trace() : threaded.trace();
#if defined(XPIPE_WITH_MPI)
    const ExecutionTrace& trace = on_mpi ? mpi_executor->trace() : tr;
    // GPU replicas: which way the first epoch averaged rank 0's stages' gradients.
    if constexpr (P::on_device)
      if (on_mpi && c.dp > 1 && root && e == first_epoch)
        std::printf("  --dp %d: rank 0's gradients averaged over the replicas %s\n", c.dp,
                    mpi_executor->replica_means_on_device()
                        ? "on their GPUs (NCCL)"
                        : "through pinned host memory and MPI (the replicas share a GPU, or "
                          "this xpipe-train was built without NCCL)");
#else
    const ExecutionTrace& trace = tr;
#endif
    // What fails from here on (evaluation, a checkpoint write: a full disk, a folder in the
    // way) fails the run with the epochs it finished, this one included once measured.
    try {
      EpochRecord er;
      er.epoch = e;
      er.loss = r.loss;
      er.seconds = r.seconds;
      er.samples_per_second = static_cast<double>(r.samples) * c.dp / r.seconds;  // all replicas
      if (root) {  // (only rank 0 reports it)
        const Evaluation test = pipe.evaluation(data.test);
        er.test_accuracy = test.accuracy;
        er.test_loss = test.loss;
      }
      // Idle per stage; where a worker runs several stages, each reports its worker's idle
      // (a stage alone is idle whenever its worker runs another).
      const std::vector<int> worker_of = stage_workers(schedule);
      for (int k = 0; k < P::stage_count; ++k)
        er.bubble.push_back(schedule.has_virtual_stages()
                                ? worker_bubble_fraction(trace, schedule, worker_of[k])
                                : trace.bubble_fraction(k));
      er.prediction_error = pipe.prediction_errors();
      std::printf("  %-34s epoch %d  loss %.4f  test %.2f%% (loss %.4f)  %8.0f samples/s\n",
                  c.label().c_str(), e, er.loss, 100 * er.test_accuracy, er.test_loss,
                  er.samples_per_second);
      std::fflush(stdout);
      rec.epochs.push_back(er);
      std::vector<double> losses;
      for (const EpochRecord& done : rec.epochs) losses.push_back(done.loss);
      if (std::string why = tools::divergence(losses); !why.empty()) {
        rec.status = RunStatus::diverged;
        rec.why = why;
        return rec;
      }
      if (e == c.epochs) {
        rec.trace = trace;
        rec.schedule = schedule;
      }
      if (!ckpt_dir.empty() && root &&
          (e % c.checkpoint_every == 0 || e == c.epochs || stop_signal != 0))
        save(e);
    } catch (const std::exception& err) {
      return failed(rec, e, err.what(), on_mpi);
    }
    if (e < c.epochs) check(rec, 0);  // after the last, the run is done: recorded whole
  }
  if (first_epoch > c.epochs) {  // resumed after its last epoch: what that epoch measured
    rec.weight_copies = restored_copies;
    rec.activation_kib = restored_kib;
    return rec;
  }
  for (int k = 0; k < P::stage_count; ++k) {
    rec.weight_copies.push_back(pipe.weight_copies(k));
    rec.activation_kib.push_back(static_cast<double>(pipe.activation_floats(k)) * 4 / 1024);
  }
  return rec;
}

// One Pipeline type per model split (models.hpp's ModelPipeline): the predictor and the
// optimizer are values chosen at run time, and with MPI its links are MpiChannel's.
template <class... Stages>
RunRecord run_stages(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  return run_pipeline<ModelPipeline<Stages...>>(c, data, check);
}

// The model table's runners, one unit per model (runs_mlp.cpp, runs_deep.cpp, runs_vgg.cpp,
// runs_resnet.cpp, runs_gpt.cpp).
RunRecord run_mlp1(const RunConfig& c, const DatasetPair& data, const CheckPoint& check);
RunRecord run_mlp2(const RunConfig& c, const DatasetPair& data, const CheckPoint& check);
RunRecord run_mlp4(const RunConfig& c, const DatasetPair& data, const CheckPoint& check);
RunRecord run_deep2(const RunConfig& c, const DatasetPair& data, const CheckPoint& check);
RunRecord run_deep4(const RunConfig& c, const DatasetPair& data, const CheckPoint& check);
RunRecord run_deep8(const RunConfig& c, const DatasetPair& data, const CheckPoint& check);
RunRecord run_vgg1(const RunConfig& c, const DatasetPair& data, const CheckPoint& check);
RunRecord run_vgg2(const RunConfig& c, const DatasetPair& data, const CheckPoint& check);
RunRecord run_vgg4(const RunConfig& c, const DatasetPair& data, const CheckPoint& check);
RunRecord run_resnet1(const RunConfig& c, const DatasetPair& data, const CheckPoint& check);
RunRecord run_resnet2(const RunConfig& c, const DatasetPair& data, const CheckPoint& check);
RunRecord run_resnet4(const RunConfig& c, const DatasetPair& data, const CheckPoint& check);
RunRecord run_resnet8(const RunConfig& c, const DatasetPair& data, const CheckPoint& check);
RunRecord run_gpt1(const RunConfig& c, const DatasetPair& data, const CheckPoint& check);
RunRecord run_gpt2(const RunConfig& c, const DatasetPair& data, const CheckPoint& check);
RunRecord run_gpt4(const RunConfig& c, const DatasetPair& data, const CheckPoint& check);
RunRecord run_gpt8(const RunConfig& c, const DatasetPair& data, const CheckPoint& check);
#if defined(XPIPE_WITH_CUDA)
// --device cuda (runs_cuda.cu): the MLP, the CNNs and the GPT over 4 stages on CUDA
// devices, and why no device can run them (empty when one can).
RunRecord run_mlp4_cuda(const RunConfig& c, const DatasetPair& data, const CheckPoint& check);
RunRecord run_vgg4_cuda(const RunConfig& c, const DatasetPair& data, const CheckPoint& check);
RunRecord run_resnet4_cuda(const RunConfig& c, const DatasetPair& data, const CheckPoint& check);
RunRecord run_gpt4_cuda(const RunConfig& c, const DatasetPair& data, const CheckPoint& check);
std::string cuda_device_problem();
#endif

}  // namespace xpipe::tools::train
