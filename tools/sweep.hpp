// xpipe-train --sweep: the staleness sweep (pipeline depth x micro-batches x remedy x optimizer x
// seed), its summary over seeds with the gap to GPipe paired by seed, its files and its table.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "output_files.hpp"
#include "run_checkpoints.hpp"

namespace xpipe::tools {

//! One configuration of the sweep: everything but the seed.
struct SweepPoint {
  int stages = 0, micro_batches = 0;
  std::string schedule, predictor, optimizer;
  float lr = 0;
  //! The synchronous baseline each configuration is compared with (GPipe + Latest).
  bool baseline() const { return schedule == "gpipe"; }
  //! "async-1f1b+xpipe(adam)", as xpipe-train labels a run.
  std::string label() const { return schedule + "+" + predictor + "(" + optimizer + ")"; }
};

//! What --sweep runs: every stage count x micro-batch count x optimizer x (the baseline, then
//! each predictor), each with seeds 1..seeds. The sizes are recorded with the results.
struct SweepPlan {
  std::string model = "deep";
  std::vector<int> stages, micro_batches;
  std::vector<std::string> predictors, optimizers;
  //! The asynchronous schedules the remedies run on (--sweep-schedules; the 2BW remedies run on
  //! 2bw whatever it says).
  std::vector<std::string> schedules{"async-1f1b"};
  int seeds = 3;
  float lr = 1e-3f;                      // every optimizer but sgd
  float sgd_lr = 0.01f;                  // sgd (momentum 0.9)
  std::string lr_schedule = "constant";  // --lr-schedule, for every run (its text)
  float clip_norm = 0;                   // --clip-norm, for every run (0: off)
  // The default sizes, chosen so the default sweep runs in under 30 minutes on the 2-core VM
  // (docs/guide.md, "The staleness sweep", says why these).
  long batch = 64, train_samples = 8000, test_samples = 5000;
  int epochs = 2;
};

//! The asynchronous schedules --sweep-schedules may name.
inline const std::vector<std::string> sweep_schedule_choices{"async-1f1b", "async-zb",
                                                             "async-interleaved"};

//! One remedy of the sweep: a predictor on a schedule.
struct SweepRemedy {
  std::string schedule, predictor;
  std::string label() const { return schedule + "+" + predictor; }
};

//! The remedies of `plan`, in order: each predictor on each of plan.schedules, except the 2BW
//! predictors (2bw and 2bw-ef: their double buffer is the schedule's premise), which run once,
//! on 2bw.
std::vector<SweepRemedy> sweep_remedies(const SweepPlan& plan);

//! The configurations of `plan` in the order they run: per optimizer, M and K, GPipe + Latest
//! first, then each remedy (sweep_remedies).
std::vector<SweepPoint> sweep_points(const SweepPlan& plan);

//! ok: every epoch trained. diverged: stopped by tools::divergence or a NaN loss. not_run: the
//! configuration cannot run (a ConfigError before training: 2BW with M < K, async-interleaved
//! at an odd K or K < 4). failed: another
//! error. interrupted: a signal stopped the sweep during it.
enum class SweepStatus { ok, diverged, not_run, failed, interrupted };
const char* to_string(SweepStatus s);

//! One run (a configuration and a seed) as the sweep records it.
struct SweepRun {
  SweepPoint point;
  std::uint64_t seed = 0;
  SweepStatus status = SweepStatus::ok;
  std::string why;                  // unless ok
  std::vector<EpochRecord> epochs;  // those it finished
  std::vector<int> weight_copies;   // per stage, when ok
};

//! Mean (NaN when n = 0) and sample standard deviation (n - 1 in the denominator; NaN when
//! n < 2) of `v`.
struct Stat {
  int n = 0;
  double mean = std::numeric_limits<double>::quiet_NaN();
  double sd = std::numeric_limits<double>::quiet_NaN();
};
Stat stat_of(const std::vector<double>& v);

//! One configuration summarized over its seeds: run counts by status; per epoch the test
//! accuracy (%) over the ok runs and the gap to GPipe (percentage points: run minus the
//! baseline run of the same K, M, optimizer and seed, over the seeds where both are ok);
//! samples/s (each ok run's mean over its epochs) and weight copies per stage.
struct SweepCell {
  SweepPoint point;
  int runs = 0, ok = 0, diverged = 0, not_run = 0, failed = 0, interrupted = 0;
  std::vector<Stat> accuracy, gap;  // per epoch; gap empty for the baseline
  // Per epoch, the test loss (nats per sample; the gpt's validation loss per token) and its
  // difference to the baseline's, paired by seed (empty for the baseline); runs whose test
  // loss was not measured (NaN) left out.
  std::vector<Stat> test_loss, loss_gap;
  Stat samples_per_second;
  std::vector<int> weight_copies;
  std::string why;  // the first reason a run of it did not finish
};

//! The cells of the configurations in `runs` that have at least one run, in run order.
std::vector<SweepCell> summarize(const std::vector<SweepRun>& runs, int epochs);

//! A comma list flag of whole numbers, each one of `allowed` (any from lo to hi when `allowed`
//! is empty), none twice. Returns "" and fills `out`, or what is wrong, for a usage error.
std::string parse_int_list(const std::string& text, const std::vector<int>& allowed, int lo, int hi,
                           std::vector<int>& out);
//! A comma list flag of names, each one of `allowed`, none twice.
std::string parse_name_list(const std::string& text, const std::vector<std::string>& allowed,
                            std::vector<std::string>& out);

//! The sweep's output folder, current after every run: sweep-runs.csv (a row per run, appended
//! and fsync'ed), sweep.csv and sweep.json (a summary per configuration; the JSON also holds
//! every run with its epochs), sweep-gap.csv with sweep-gap.gp (gnuplot draws sweep-gap.svg and
//! sweep-gap.png: gap to GPipe versus K per remedy, a panel per M and optimizer), sweep.md (the
//! summary as a Markdown table) and, when runs measured their predictions, sweep-prediction.csv
//! with sweep-prediction.gp (prediction error and cosine versus s per remedy), replaced
//! atomically. An earlier sweep's files stay until this one records its first run. Throws
//! OutputError naming a file it cannot write.
class SweepFiles {
 public:
  SweepFiles(SweepPlan plan, std::filesystem::path dir);
  //! The runs planned, in order: each configuration of sweep_points with each seed.
  const std::vector<std::pair<SweepPoint, std::uint64_t>>& planned() const { return planned_; }
  //! Prints which run starts ("[12/468] K 4, M 1, seed 2: async-1f1b+xpipe(adam)").
  void announce(std::size_t index) const;
  //! Records a run that ended and rewrites the summaries. The first run that finished an epoch
  //! replaces an earlier sweep's files in the folder (runs that finished none wait for it, or
  //! for finish_files).
  void add(SweepRun run);
  //! Whether a run was recorded in the files (an earlier sweep's are replaced by then).
  bool started() const { return csv_.has_value(); }
  //! The table of every configuration with a run, on stdout.
  void print_table() const;
  //! Draws sweep-gap.svg and .png with gnuplot; true when both are there and not empty, else
  //! says why on stderr.
  bool plot() const;
  //! At the end: draws the plots (the gap plot, and the prediction-error plot when runs measured
  //! their predictions) and returns the names of the files written and not empty, for a
  //! "wrote to" line.
  std::string finish_files();
  //! Whether `name` in the folder exists and is not empty.
  bool non_empty(const std::string& name) const;
  const std::vector<SweepRun>& runs() const { return runs_; }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  void start();
  std::string row(const SweepRun& r) const;  // its line of sweep-runs.csv
  void write_summaries() const;
  bool draw(const std::string& script) const;  // gnuplot `script`, checking its .svg and .png
  SweepPlan plan_;
  std::filesystem::path dir_;
  std::optional<AppendFile> csv_;  // from the first record on
  std::vector<std::pair<SweepPoint, std::uint64_t>> planned_;
  std::vector<SweepRun> runs_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace xpipe::tools
