// xpipe-train: trains a pipeline on Fashion-MNIST with the schedule, predictor, optimizer and
// shape chosen by flags, or (--compare) runs the study of every schedule x predictor.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "sweep.hpp"
#include "train_run.hpp"
#include "xpipe/xpipe.hpp"
#if defined(XPIPE_WITH_MPI)
#include "xpipe/exec/mpi.hpp"
#endif

namespace fs = std::filesystem;
using namespace xpipe;
using tools::EpochRecord;
using tools::OutputError;
namespace fs = std::filesystem;

namespace {

using namespace xpipe::tools::train;

// Set under --executor mpi: a SIGTERM is then most likely mpirun ending the job because a rank
// died, and this rank says what it was waiting for (exec/mpi.hpp keeps it for this).
volatile std::sig_atomic_t under_mpi = 0;

extern "C" void on_stop_signal(int sig) {
#if defined(XPIPE_WITH_MPI)
  if (under_mpi != 0 && sig == SIGTERM) {
    static const char prefix[] = "xpipe-train: SIGTERM; ";
    if (::write(2, prefix, sizeof prefix - 1) >= 0) mpi_write_wait_state(2);
  }
#endif
  if (stop_signal != 0) {  // a second signal: stop at once, as if there were no handler
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  stop_signal = sig;
}

// SIGHUP (the terminal closed) stops the study as SIGINT does, keeping what is done (unless
// nohup or the like ignores it). SIGPIPE is ignored: when stdout is a closed pipe (`| head -1`)
// printing fails quietly and the study goes on writing its files.
void install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  struct sigaction hup {};  // under nohup SIGHUP is ignored, and stays so
  if (sigaction(SIGHUP, nullptr, &hup) == 0 && hup.sa_handler != SIG_IGN)
    sigaction(SIGHUP, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
}

using Runner = std::function<RunRecord(const RunConfig&, const DatasetPair&, const CheckPoint&)>;
const std::map<std::pair<std::string, int>, Runner>& model_table() {
  using namespace tools;
  static const std::map<std::pair<std::string, int>, Runner> table{
      {{"mlp", 1}, run_mlp1},   {{"mlp", 2}, run_mlp2},   {{"mlp", 4}, run_mlp4},
      {{"deep", 2}, run_deep2}, {{"deep", 4}, run_deep4}, {{"deep", 8}, run_deep8},
  };
  return table;
}

std::string available_models() {
  std::string s;
  for (const auto& [key, fn] : model_table())
    s += (s.empty() ? "" : ", ") + key.first + " with --stages " + std::to_string(key.second);
  return s;
}

std::string joined(const std::vector<double>& v, const char* fmt) {
  std::string out;
  char buf[32];
  for (double x : v) {
    std::snprintf(buf, sizeof buf, fmt, x);
    out += (out.empty() ? "" : "/") + std::string(buf);
  }
  return out;
}

// The prediction errors of one epoch for runs.json: per stage and s, the count, the mean
// relative error and the mean cosine (empty unless --measure-prediction and a predicting remedy).
nlohmann::json prediction_json(const std::vector<PredictionError>& errors) {
  nlohmann::json out = nlohmann::json::array();
  for (const PredictionError& p : errors)
    out.push_back({{"stage", p.stage},
                   {"s", p.s},
                   {"count", p.count},
                   {"relative_error", p.mean_relative_error},
                   {"cosine", p.mean_cosine}});
  return out;
}

// The study's table: accuracy per epoch, final loss, throughput, and per stage the measured
// bubble (idle) fraction, weight copies held and peak activation memory. A run that did not
// finish says why.
void print_table(const std::vector<RunRecord>& records) {
  std::printf("\n%-30s %-22s %8s %9s  %-26s %-12s %s\n", "run", "test accuracy by epoch", "loss",
              "samples/s", "bubble per stage", "weights", "peak activations KiB");
  for (const RunRecord& r : records) {
    if (!r.ok()) {
      std::printf("%-30s %s: %s\n", r.config.label().c_str(), to_string(r.status), r.why.c_str());
      continue;
    }
    std::vector<double> acc, copies;
    for (const EpochRecord& e : r.epochs) acc.push_back(100 * e.test_accuracy);
    for (int w : r.weight_copies) copies.push_back(w);
    const EpochRecord& last = r.epochs.back();
    std::printf("%-30s %-22s %8.4f %9.0f  %-26s %-12s %s\n", r.config.label().c_str(),
                joined(acc, "%.2f").c_str(), last.loss, last.samples_per_second,
                joined(last.bubble, "%.2f").c_str(), joined(copies, "%.0f").c_str(),
                joined(r.activation_kib, "%.0f").c_str());
  }
  std::fflush(stdout);
}

// The output folder, kept current as runs finish: runs.csv (long: a row per run and epoch) gets
// each run's rows appended, written through; runs.json (everything), accuracy.csv (wide: a
// column per finished run) and accuracy.gp (gnuplot draws accuracy.svg and accuracy.png from
// it) are replaced atomically; a finished run's timeline SVG and Chrome trace of its last epoch
// go beside them. Whatever stops the study, the folder holds every run done by then.
// An earlier study's files in the folder stay until this study records its first run: a study
// killed before that (kill -9, an OOM kill) leaves the folder as it found it.
class StudyFiles {
 public:
  // The files of a study in `dir`, or (dir empty: an MPI rank other than 0) records kept in
  // memory only. Checks now, before any training, that the files can be written in place.
  // Throws OutputError naming a file it cannot write.
  explicit StudyFiles(fs::path dir) : dir_(std::move(dir)) {
    if (dir_.empty()) return;
    for (const char* name : {"runs.csv", "runs.json", "accuracy.csv", "accuracy.gp"}) {
      std::error_code ec;
      if (fs::is_directory(fs::symlink_status(dir_ / name, ec)))
        throw OutputError(dir_ / name, EISDIR);
    }
    std::error_code ec;
    earlier_study_ = fs::exists(fs::symlink_status(dir_ / "runs.csv", ec)) ||
                     fs::exists(fs::symlink_status(dir_ / "runs.json", ec));
    // The earlier study's timelines and traces: replaced with the rest at the first record.
    for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      std::error_code type_ec;
      if (((name.starts_with("timeline-") && name.ends_with(".svg")) ||
           (name.starts_with("trace-") && name.ends_with(".json"))) &&
          fs::is_regular_file(it->symlink_status(type_ec)))
        earlier_.push_back(it->path());
    }
    if (ec) throw OutputError(dir_, ec.value());
  }

  // Records a run that ended (finished, diverged, failed or interrupted). Every file is
  // attempted; the first that cannot be written is then thrown (OutputError). The first run that
  // finished an epoch replaces an earlier study's files; runs that finished none wait for it, or
  // for the end of the study (finish), so that a study which trains nothing (refused to resume,
  // stopped at once) does not wipe out the earlier one.
  void add(RunRecord r) {
    records_.push_back(std::move(r));
    RunRecord& rec = records_.back();
    if (dir_.empty() || (!csv_ && rec.epochs.empty())) return;
    write_record(rec);
  }

  // At the end of a study whose runs all finished no epoch: writes them, unless the folder holds
  // an earlier study, which is then kept (false; said on stderr).
  bool finish() {
    if (dir_.empty() || csv_ || records_.empty()) return true;
    if (earlier_study_) {
      std::fprintf(stderr,
                   "xpipe-train: no run of this study finished an epoch, so %s keeps the earlier "
                   "study's files (what failed is above)\n",
                   dir_.c_str());
      return false;
    }
    write_record(records_.back());
    return true;
  }

 private:
  // Writes `rec` (the newest record) and, when it starts the files, every record before it.
  void write_record(RunRecord& rec) {
    std::exception_ptr failure;
    try {
      if (!csv_) {
        start();
        for (const RunRecord& held : records_)
          if (&held != &rec) csv_->append(csv_rows(held));
      }
      csv_->append(csv_rows(rec));
    } catch (const OutputError&) {
      failure = std::current_exception();
    }
    if (rec.ok() && !rec.trace.stages.empty()) {  // (a run resumed after its last epoch has none)
      const RunConfig& c = rec.config;
      TimelineOptions to;
      to.title =
          c.label() + ": first mini-batches of the last epoch (" + c.executor + " run, real times)";
      try {
        tools::write_file_atomically(dir_ / timeline_name(c),
                                     timeline_svg(rec.trace, rec.schedule, to));
        tools::write_file_atomically(dir_ / trace_name(c),
                                     chrome_trace_json(rec.trace, rec.schedule, c.label()));
        rec.trace_files = true;
      } catch (const OutputError&) {
        if (!failure) failure = std::current_exception();
      }
    }
    try {
      write_summaries();
    } catch (const OutputError&) {
      if (!failure) failure = std::current_exception();
    }
    if (failure) std::rethrow_exception(failure);
  }

 public:
  // Whether this study has replaced the folder's files with its own (its first record).
  bool started() const { return csv_.has_value(); }

  // Draws accuracy.svg and accuracy.png with gnuplot (no shell: the folder's name may hold any
  // character). True when both were drawn and are not empty; otherwise says why on stderr.
  bool plot() const {
    if (finished() == 0) {
      std::fprintf(stderr,
                   "xpipe-train: no run trained to the end, so there is no accuracy plot\n");
      return false;
    }
    const std::string gnuplot = tools::find_program("gnuplot");
    if (gnuplot.empty()) {
      std::fprintf(stderr,
                   "xpipe-train: gnuplot not found (Debian: gnuplot-nox); run 'gnuplot "
                   "accuracy.gp' in %s to draw the plots\n",
                   dir_.c_str());
      return false;
    }
    if (const std::string why = tools::run_program(gnuplot, {"gnuplot", "accuracy.gp"}, dir_);
        !why.empty()) {
      std::fprintf(stderr, "xpipe-train: gnuplot %s; no plot drawn (accuracy.gp is in %s)\n",
                   why.c_str(), dir_.c_str());
      return false;
    }
    for (const char* name : {"accuracy.svg", "accuracy.png"})
      if (!non_empty(name)) {
        std::fprintf(stderr, "xpipe-train: gnuplot left %s empty or missing in %s\n", name,
                     dir_.c_str());
        return false;
      }
    return true;
  }

  // Whether the folder holds `name` and it is not empty (before saying it was written).
  bool non_empty(const std::string& name) const {
    std::error_code ec;
    const auto size = fs::file_size(dir_ / name, ec);
    return !ec && size > 0;
  }
  const std::vector<RunRecord>& records() const { return records_; }
  bool any_trace_files() const {
    return std::any_of(records_.begin(), records_.end(),
                       [](const RunRecord& r) { return r.trace_files; });
  }
  std::size_t finished() const {
    std::size_t n = 0;
    for (const RunRecord& r : records_) n += r.ok();
    return n;
  }
  const fs::path& dir() const { return dir_; }

 private:
  // The study's first record: runs.csv begun afresh (its header), the earlier study's plots,
  // timelines and traces removed (this study's are drawn and written as its runs end).
  void start() {
    csv_.emplace(dir_ / "runs.csv");
    csv_->append(
        "run,schedule,predictor,optimizer,lr,model,stages,micro_batches,epoch,loss,"
        "test_accuracy,samples_per_second,status\n");
    std::error_code ignored;
    fs::remove(dir_ / "accuracy.svg", ignored);
    fs::remove(dir_ / "accuracy.png", ignored);
    for (const fs::path& p : earlier_) fs::remove(p, ignored);
    earlier_.clear();
  }

  static std::string timeline_name(const RunConfig& c) {
    return "timeline-" + file_stem(c.label()) + ".svg";
  }
  static std::string trace_name(const RunConfig& c) {
    return "trace-" + file_stem(c.label()) + ".json";
  }

  // A row per finished epoch; a run that finished none gets one row with the epoch fields empty.
  static std::string csv_rows(const RunRecord& r) {
    const RunConfig& c = r.config;
    std::ostringstream run;
    run << c.label() << ',' << c.schedule << ',' << c.predictor << ',' << c.optimizer << ',' << c.lr
        << ',' << c.model << ',' << c.stages << ',' << c.micro_batches << ',';
    std::ostringstream rows;
    for (const EpochRecord& e : r.epochs)
      rows << run.str() << e.epoch << ',' << e.loss << ',' << e.test_accuracy << ','
           << e.samples_per_second << ',' << to_string(r.status) << '\n';
    if (r.epochs.empty()) rows << run.str() << ",,,," << to_string(r.status) << '\n';
    return rows.str();
  }

  void write_summaries() const {
    nlohmann::json j = nlohmann::json::array();
    for (const RunRecord& r : records_) {
      const RunConfig& c = r.config;
      nlohmann::json jr{{"run", c.label()},
                        {"status", to_string(r.status)},
                        {"schedule", c.schedule},
                        {"predictor", c.predictor},
                        {"optimizer", c.optimizer},
                        {"lr", c.lr},
                        {"model", c.model},
                        {"stages", c.stages},
                        {"micro_batches", c.micro_batches},
                        {"batch", c.batch},
                        {"seed", c.seed},
                        {"executor", c.executor},
                        {"device", c.device},
                        {"epochs", nlohmann::json::array()}};
      if (!r.ok()) jr["failure"] = r.why;
      for (const EpochRecord& e : r.epochs)
        jr["epochs"].push_back({{"epoch", e.epoch},
                                {"loss", e.loss},
                                {"test_accuracy", e.test_accuracy},
                                {"samples_per_second", e.samples_per_second},
                                {"seconds", e.seconds},
                                {"bubble_fraction", e.bubble},
                                {"prediction_error", prediction_json(e.prediction_error)}});
      if (r.ok()) {
        jr["weight_copies"] = r.weight_copies;
        jr["peak_activation_kib"] = r.activation_kib;
      }
      if (r.trace_files) {
        jr["timeline_svg"] = timeline_name(c);
        jr["chrome_trace"] = trace_name(c);
      }
      j.push_back(jr);
    }
    tools::write_file_atomically(dir_ / "runs.json", j.dump(2) + '\n');

    std::vector<const RunRecord*> plotted;  // only runs that trained to the end have a curve
    for (const RunRecord& r : records_)
      if (r.ok()) plotted.push_back(&r);
    std::ostringstream acc;
    acc << "epoch";
    for (const RunRecord* r : plotted) acc << ',' << r->config.label();
    acc << '\n';
    std::size_t epochs = 0;
    for (const RunRecord* r : plotted) epochs = std::max(epochs, r->epochs.size());
    for (std::size_t e = 0; e < epochs; ++e) {
      acc << e + 1;
      for (const RunRecord* r : plotted) {
        acc << ',';
        if (e < r->epochs.size()) acc << 100 * r->epochs[e].test_accuracy;
      }
      acc << '\n';
    }
    tools::write_file_atomically(dir_ / "accuracy.csv", acc.str());
    tools::write_file_atomically(
        dir_ / "accuracy.gp",
        "# Test accuracy per epoch of every run in accuracy.csv. Restyle freely; run from this\n"
        "# directory with: gnuplot accuracy.gp\n"
        "set datafile separator ','\n"
        "set key outside right top noenhanced\n"
        "set xlabel 'epoch'\nset ylabel 'test accuracy (%)'\nset grid\nset xtics 1\n"
        "set title 'Fashion-MNIST test accuracy by schedule and predictor' noenhanced\n"
        "n = " +
            std::to_string(plotted.size()) +
            "\n"
            "set terminal svg size 1000,560 dynamic background rgb 'white'\n"
            "set output 'accuracy.svg'\n"
            "plot for [c=2:n+1] 'accuracy.csv' using 1:c with linespoints lw 2 title "
            "columnheader(c)\n"
            "set terminal pngcairo size 1000,560\nset output 'accuracy.png'\nreplot\n");
  }

  fs::path dir_;
  std::optional<tools::AppendFile> csv_;  // from the first record on
  std::vector<fs::path> earlier_;         // an earlier study's timelines and traces
  bool earlier_study_ = false;            // runs.csv or runs.json were there at the start
  std::vector<RunRecord> records_;
};

const char* signal_name(int sig) {
  return sig == SIGINT    ? "SIGINT"
         : sig == SIGTERM ? "SIGTERM"
         : sig == SIGHUP  ? "SIGHUP"
                          : "a signal";
}

// After SIGINT, SIGTERM or SIGHUP: the runs done are on disk already. Says so, naming `files`
// (or that `dir` holds what it held before, when this `study` recorded no run yet), and exits
// with 128 + the signal (130, 143, 129). _Exit: a stage thread may still be training the
// abandoned epoch, and nothing of it is to be kept.
[[noreturn]] void exit_for_signal(const char* study, const std::string& when, bool recorded,
                                  std::size_t done, const fs::path& dir, const char* files) {
  const int sig = stop_signal;
  if (!recorded)
    std::fprintf(stderr,
                 "xpipe-train: stopped by %s %s, before any run of this %s was recorded; %s "
                 "holds what it held before\n",
                 signal_name(sig), when.c_str(), study, dir.c_str());
  else
    std::fprintf(stderr, "xpipe-train: stopped by %s %s; the %zu run(s) done are in %s (%s)\n",
                 signal_name(sig), when.c_str(), done, dir.c_str(), files);
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(128 + sig);
}

// A study stopped by a signal: its table, then exit_for_signal (under mpirun rank 0 reports).
[[noreturn]] void stop_for_signal(const StudyFiles& files, const std::string& when) {
  if (mpi_rank != 0) std::_Exit(128 + stop_signal);
  print_table(files.records());
  std::size_t done = 0;
  for (const RunRecord& r : files.records()) done += r.status != RunStatus::interrupted;
  exit_for_signal("study", when, files.started(), done, files.dir(),
                  "runs.csv, runs.json, accuracy.csv; 'gnuplot accuracy.gp' there draws them");
}

// The runs of the command: `c` alone, or (--compare) the study of every schedule x predictor.
std::vector<RunConfig> study_runs(const RunConfig& c, bool compare, float sgd_lr) {
  if (!compare) return {c};
  auto with = [&](const char* sched, const char* pred, const char* opt, float lr) {
    RunConfig r = c;
    r.schedule = sched;
    r.predictor = pred;
    r.optimizer = opt;
    r.lr = lr;
    return r;
  };
  return {
      with("gpipe", "latest", "adam", c.lr),      with("1f1b-flush", "latest", "adam", c.lr),
      with("async-1f1b", "latest", "adam", c.lr), with("async-1f1b", "stash", "adam", c.lr),
      with("2bw", "2bw", "adam", c.lr),           with("async-1f1b", "spectrain", "sgd", sgd_lr),
      with("async-1f1b", "xpipe", "adam", c.lr),  with("async-1f1b", "pipeoptim", "adam", c.lr)};
}

RunRecord run(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
#if defined(XPIPE_WITH_CUDA)
  if (c.device == "cuda") return run_mlp4_cuda(c, data, check);  // main checked model, stages
#endif
  const auto it = model_table().find({c.model, c.stages});
  if (it == model_table().end())
    throw ConfigError("no compiled model '" + c.model + "' over " + std::to_string(c.stages) +
                      " stages (available: " + available_models() + ")");
  return it->second(c, data, check);
}

// ---- --sweep (tools/sweep.hpp plans it, summarizes it and writes its files) ----

// The stage counts of `model` that a sweep can use: its compiled splits into 2 or more stages.
std::vector<int> sweep_stage_choices(const std::string& model) {
  std::vector<int> out;
  for (const auto& [key, fn] : model_table())
    if (key.first == model && key.second >= 2) out.push_back(key.second);
  return out;
}

tools::SweepRun to_sweep_run(const RunRecord& r, const tools::SweepPoint& point,
                             std::uint64_t seed) {
  tools::SweepRun out;
  out.point = point;
  out.seed = seed;
  out.status = r.status == RunStatus::ok         ? tools::SweepStatus::ok
               : r.status == RunStatus::diverged ? tools::SweepStatus::diverged
               : r.status == RunStatus::failed   ? tools::SweepStatus::failed
                                                 : tools::SweepStatus::interrupted;
  out.why = r.why;
  out.epochs = r.epochs;
  out.weight_copies = r.weight_copies;
  return out;
}

// Runs every planned configuration and seed through run(), as the study runs its list (stage
// threads, divergence rule and signals alike), recording each in the sweep's files as it ends.
int run_sweep(const RunConfig& base, const tools::SweepPlan& plan, const DatasetPair& data,
              const fs::path& out) {
  if (stop_signal != 0) {
    std::fprintf(stderr, "xpipe-train: stopped by a signal before training; nothing written\n");
    return 128 + stop_signal;
  }
  tools::SweepFiles files(plan, out);
  const auto& planned = files.planned();
  std::printf(
      "xpipe-train: staleness sweep, model %s, %zu runs (K %s x M %s x %zu remedies and GPipe x "
      "%zu optimizers x %d seeds), %d epoch(s) of %ld samples, batch %ld; results go to %s as "
      "each run ends\n",
      plan.model.c_str(), planned.size(),
      joined(std::vector<double>(plan.stages.begin(), plan.stages.end()), "%.0f").c_str(),
      joined(std::vector<double>(plan.micro_batches.begin(), plan.micro_batches.end()), "%.0f")
          .c_str(),
      plan.predictors.size(), plan.optimizers.size(), plan.seeds, plan.epochs,
      static_cast<long>(data.train.count), plan.batch, out.c_str());
  std::fflush(stdout);
  const auto stop = [&](const std::string& when) {
    files.print_table();
    std::size_t done = 0;  // the run a signal cut is recorded, but not done
    for (const tools::SweepRun& r : files.runs())
      done += r.status != tools::SweepStatus::interrupted;
    exit_for_signal("sweep", when, files.started(), done, files.dir(),
                    "sweep-runs.csv, sweep.csv, sweep.json; 'gnuplot sweep-gap.gp' there draws "
                    "the gap plot");
  };
  for (std::size_t i = 0; i < planned.size(); ++i) {
    const auto& [point, seed] = planned[i];
    const std::string which =
        "run " + std::to_string(i + 1) + " of " + std::to_string(planned.size());
    if (stop_signal != 0) stop("before " + which);
    RunConfig c = base;
    c.model = plan.model;
    c.stages = point.stages;
    c.micro_batches = point.micro_batches;
    c.schedule = point.schedule;
    c.predictor = point.predictor;
    c.optimizer = point.optimizer;
    c.lr = point.lr;
    c.seed = seed;
    files.announce(i);
    const CheckPoint check = [&](const RunRecord& so_far, int epoch_running) {
      if (stop_signal == 0) return;
      tools::SweepRun partial = to_sweep_run(so_far, point, seed);
      partial.status = tools::SweepStatus::interrupted;
      partial.why = stop_reason(epoch_running, so_far.epochs.size());
      add_or_exit(files, std::move(partial));
      stop("during " + which);
    };
    tools::SweepRun r;
    try {
      r = to_sweep_run(run(c, data, check), point, seed);
    } catch (const ConfigError& e) {  // it cannot run (2BW with M < K): a "not run" cell
      r = to_sweep_run(RunRecord{}, point, seed);
      r.status = tools::SweepStatus::not_run;
      r.why = e.what();
    } catch (const std::exception& e) {
      r = to_sweep_run(RunRecord{}, point, seed);
      r.status = tools::SweepStatus::failed;
      r.why = e.what();
    }
    if (r.status != tools::SweepStatus::ok)
      std::fprintf(stderr, "  %s %s: %s\n", c.label().c_str(), tools::to_string(r.status),
                   r.why.c_str());
    files.add(std::move(r));
  }
  if (stop_signal != 0) stop("after the last run");
  files.print_table();
  const std::string written = files.finish_files();
  if (stop_signal != 0) stop("while plotting");
  std::printf("\nwrote to %s: %s\n", out.c_str(), written.c_str());
  std::fflush(stdout);
  return 0;
}

// A floating flag's text: a decimal number (std::from_chars: no hex such as 0x3, no leading
// space or '+', no junk after it) that is finite and in [lo, hi]; "" when it is, else why not
// (`range_what` says what the range is).
std::string check_number(const std::string& text, double lo, double hi,
                         const std::string& range_what) {
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || end != text.data() + text.size() || ec == std::errc::invalid_argument)
    return "'" + text + "' is not a decimal number";
  if (ec == std::errc::result_out_of_range || !std::isfinite(v) || v < lo || v > hi)
    return text + " is outside " + range_what;
  return "";
}

// --lr and --sgd-lr: a finite number in [1e-8, 10]. Below 1e-8 a step is under half a float32
// ulp of any weight above 0.17 (ulp(1) = 1.2e-7), so nothing would train; above 10 nothing here
// trains either (Adam at lr 1 already leaves the MLP at chance with a loss of 1e9).
std::string check_learning_rate(std::string& text) {
  return check_number(text, 1e-8, 10, "[1e-8, 10], the learning rates that can train");
}

// --wait-timeout: seconds in [0.1, 86400] (NaN would turn the deadline off).
std::string check_wait_timeout(std::string& text) {
  return check_number(text, 0.1, 86400, "[0.1, 86400] seconds");
}

// --seed: a whole number from 0 to 2^64 - 1 ("-1" is not quietly taken as 2^64 - 1).
std::string check_seed(std::string& text) {
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    return "'" + text + "' is not a whole number from 0 to " +
           std::to_string(std::numeric_limits<std::uint64_t>::max());
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"xpipe-train: pipeline-parallel training on Fashion-MNIST"};
  RunConfig c;
  std::string data_dir = default_fashion_mnist_dir();
  std::string out_dir = "xpipe-out";
  bool compare = false;
  long train_samples = 0, test_samples = 0;
  float sgd_lr_flag = 0.05f;
  const CLI::Validator learning_rate(check_learning_rate, "in [1e-8, 10]");
  app.add_option("--model", c.model, "Model: mlp (784-1024-1024-1024-10) or deep (784-512x7-10)")
      ->check(CLI::IsMember({"mlp", "deep"}));
  app.add_option("--stages,-K", c.stages, "Pipeline stages K (mlp: 1, 2, 4; deep: 8)")
      ->check(CLI::Range(1, 64));
  app.add_option("--micro-batches,-M", c.micro_batches, "Micro-batches per mini-batch M")
      ->check(CLI::Range(1, 1024));
  // The name lists come from the library, so a new schedule or predictor needs no edit here.
  const auto names = [](const auto& list) {
    return std::vector<std::string>(list.begin(), list.end());
  };
  app.add_option("--schedule", c.schedule, "Schedule: " + join_names(schedule_names))
      ->check(CLI::IsMember(names(schedule_names)));
  app.add_option("--predictor", c.predictor, "Weight predictor: " + join_names(predictor_names))
      ->check(CLI::IsMember(names(predictor_names)));
  app.add_option("--optimizer", c.optimizer,
                 "Optimizer (sgd has momentum 0.9): " + join_names(optimizer_names))
      ->check(CLI::IsMember(names(optimizer_names)));
  app.add_option("--lr", c.lr, "Learning rate")->check(learning_rate);
  app.add_option("--batch", c.batch, "Mini-batch size")->check(CLI::Range(1L, 60000L));
  app.add_option("--epochs", c.epochs, "Epochs")->check(CLI::Range(1, 1000));
  app.add_option("--seed", c.seed, "Seed of initialisation and shuffling")
      ->check(CLI::Validator(check_seed, "0 to 2^64-1"));
#if defined(XPIPE_WITH_MPI)
  app.add_option("--executor", c.executor,
                 "threaded (a thread per stage), reference, or mpi (a rank per stage, under "
                 "mpirun -np dp x K)")
      ->check(CLI::IsMember({"threaded", "reference", "mpi"}));
#else
  app.add_option("--executor", c.executor,
                 "threaded (a thread per stage) or reference (built without MPI: no mpi)")
      ->check(CLI::IsMember({"threaded", "reference"}));
#endif
  app.add_option("--dp", c.dp,
                 "Data-parallel replicas of the pipeline (--executor mpi; ranks = dp x K)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--wait-timeout", c.wait_timeout,
                 "Seconds a stage may wait on another (a stopped or hung one) before the run "
                 "fails")
      ->check(CLI::Validator(check_wait_timeout, "in [0.1, 86400]"));
  auto* device_opt =
      app.add_option(
             "--device", c.device,
             "host, or cuda: the mlp over 4 stages on CUDA devices (stage k on device k mod "
             "count), with the study's predictors; needs a build with CUDA and a device")
          ->check(CLI::IsMember({"host", "cuda"}));
  app.add_option("--pin-cpus", c.pin_cpus,
                 "Pin stage k's thread to the (k mod n)-th of these CPUs (--executor threaded; "
                 "e.g. 0,1: with more stages than cores, each core then shares its own stages)")
      ->delimiter(',');
  app.add_option("--data-dir", data_dir, "Directory of the four Fashion-MNIST .gz files");
  app.add_option("--out", out_dir,
                 "Output directory (CSV, JSON, plots, timelines), made before training and "
                 "updated as each run finishes");
  app.add_option("--train-samples", train_samples, "Train on the first N samples only (0: all)")
      ->check(CLI::Range(0L, 60000L));
  app.add_option("--test-samples", test_samples, "Evaluate on the first N test samples (0: all)")
      ->check(CLI::Range(0L, 10000L));
  app.add_option(
         "--sgd-lr", sgd_lr_flag,
         "Learning rate of the SGD runs of --compare (SpecTrain) and of --sweep (there 0.01 "
         "unless given)")
      ->check(learning_rate);
  app.add_flag("--compare", compare, "Run the study: every schedule x predictor on this model");
  auto* checkpoint_dir_opt =
      app.add_option("--checkpoint-dir", c.checkpoint_dir,
                     "Save checkpoints here, a folder per run (off when not given)")
          ->check(CLI::Validator(
              [](std::string& text) {
                return text.empty()
                           ? std::string("is empty (leave the flag out for no checkpoints)")
                           : std::string();
              },
              "a folder"));
  app.add_option("--checkpoint-every", c.checkpoint_every,
                 "Epochs between checkpoints (the last epoch is always saved)")
      ->check(CLI::Range(1, 1000))
      ->needs(checkpoint_dir_opt);
  app.add_flag("--measure-prediction", c.measure_prediction,
               "Measure each weight prediction against the weights it aimed at (relative error, "
               "cosine; per stage and s, per epoch in runs.json)");
  app.add_flag("--resume", c.resume,
               "Continue each run from its newest checkpoint that verifies (needs "
               "--checkpoint-dir; a run with none starts afresh)");
  // --sweep and its flags (README: The staleness sweep); a list flag is checked after parsing,
  // when --model (which decides the stage counts there are) is known.
  tools::SweepPlan plan;
  bool sweep = false;
  std::string sweep_stages, sweep_micro_batches = "1,4", sweep_predictors,
                            sweep_optimizers = "adam,sgd";
  auto* sweep_flag = app.add_flag(
      "--sweep", sweep,
      "Run the staleness sweep: K x M x (GPipe and every predictor) x optimizer x seeds, on "
      "the deep model unless --model says otherwise; unless given, " +
          std::to_string(plan.epochs) + " epochs of " + std::to_string(plan.train_samples) +
          " samples, batch " + std::to_string(plan.batch) + ", tested on " +
          std::to_string(plan.test_samples));
  sweep_flag->excludes("--compare");
  sweep_flag->excludes(device_opt);
  app.add_option("--sweep-stages", sweep_stages,
                 "Stage counts K of --sweep, a comma list (default: every split of the model "
                 "into 2 or more stages; deep: 2,4,8)")
      ->needs(sweep_flag);
  app.add_option("--sweep-micro-batches", sweep_micro_batches,
                 "Micro-batch counts M of --sweep, a comma list")
      ->needs(sweep_flag)
      ->capture_default_str();
  app.add_option("--sweep-predictors", sweep_predictors,
                 "Predictors (remedies) of --sweep, a comma list of " +
                     join_names(predictor_names) + " (default: all)")
      ->needs(sweep_flag);
  app.add_option("--sweep-optimizers", sweep_optimizers,
                 "Optimizers of --sweep, a comma list of " + join_names(optimizer_names) +
                     " (sgd: momentum 0.9, at --sgd-lr)")
      ->needs(sweep_flag)
      ->capture_default_str();
  app.add_option("--seeds", plan.seeds, "Seeds of each --sweep configuration (1 to N)")
      ->check(CLI::Range(1, 100))
      ->needs(sweep_flag)
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return e.get_exit_code() == 0 ? code : 2;
  }
  if (sweep) {
    // What a sweep sets itself is not taken from the single-run flags.
    const std::pair<const char*, const char*> sweep_sets[] = {
        {"--stages", "--sweep-stages"},         {"--micro-batches", "--sweep-micro-batches"},
        {"--predictor", "--sweep-predictors"},  {"--schedule", "its remedies' schedules"},
        {"--optimizer", "--sweep-optimizers"},  {"--seed", "--seeds"},
        {"--checkpoint-dir", "no checkpoints"}, {"--checkpoint-every", "no checkpoints"},
        {"--resume", "no checkpoints"}};
    for (const auto& [flag, instead] : sweep_sets)
      if (app.count(flag) > 0) {
        std::fprintf(stderr, "xpipe-train: --sweep does not take %s (it uses %s)\n", flag, instead);
        return 2;
      }
    if (c.executor != "threaded" && c.executor != "reference") {
      std::fprintf(stderr, "xpipe-train: --sweep runs on the threaded or reference executor\n");
      return 2;
    }
    if (app.count("--model") == 0) c.model = plan.model;
    plan.model = c.model;
    // The sweep's sizes (SweepPlan's defaults) unless given.
    if (app.count("--train-samples") == 0) train_samples = plan.train_samples;
    if (app.count("--test-samples") == 0) test_samples = plan.test_samples;
    if (app.count("--epochs") == 0) c.epochs = plan.epochs;
    if (app.count("--batch") == 0) c.batch = plan.batch;
    if (app.count("--sgd-lr") > 0) plan.sgd_lr = sgd_lr_flag;
    plan.lr = c.lr;
    plan.epochs = c.epochs;
    plan.batch = c.batch;
    const auto names = [](const auto& list) {
      return std::vector<std::string>(list.begin(), list.end());
    };
    const std::vector<int> choices = sweep_stage_choices(plan.model);
    plan.stages = choices;  // the defaults, unless given
    plan.predictors = names(predictor_names);
    const std::pair<const char*, std::string> checks[] = {
        {"--sweep-stages", app.count("--sweep-stages") == 0
                               ? ""
                               : tools::parse_int_list(sweep_stages, choices, 0, 0, plan.stages)},
        {"--sweep-micro-batches",
         tools::parse_int_list(sweep_micro_batches, {}, 1, 1024, plan.micro_batches)},
        {"--sweep-predictors",
         app.count("--sweep-predictors") == 0
             ? ""
             : tools::parse_name_list(sweep_predictors, names(predictor_names), plan.predictors)},
        {"--sweep-optimizers",
         tools::parse_name_list(sweep_optimizers, names(optimizer_names), plan.optimizers)}};
    for (const auto& [flag, why] : checks)
      if (!why.empty()) {
        std::fprintf(stderr, "xpipe-train: %s: %s%s\n", flag, why.c_str(),
                     std::string(flag) == "--sweep-stages"
                         ? (" (the splits of model " + plan.model + ")").c_str()
                         : "");
        return 2;
      }
    for (int m : plan.micro_batches)
      if (m > c.batch) {
        std::fprintf(stderr, "xpipe-train: --sweep-micro-batches: %d exceeds --batch (%ld)\n", m,
                     c.batch);
        return 2;
      }
    c.stages = plan.stages.front();  // a split that exists, for the checks below
    c.micro_batches = plan.micro_batches.front();
  }
  // Flag combinations that cannot run are usage errors too (exit 2), found before any work.
  if (!model_table().contains({c.model, c.stages})) {
    std::fprintf(stderr, "xpipe-train: no compiled model '%s' over %d stages (available: %s)\n",
                 c.model.c_str(), c.stages, available_models().c_str());
    return 2;
  }
  if (c.micro_batches > c.batch) {
    std::fprintf(stderr, "xpipe-train: --micro-batches (%d) exceeds --batch (%ld)\n",
                 c.micro_batches, c.batch);
    return 2;
  }
  // Started by mpirun as several ranks without --executor mpi, every rank would run the whole
  // study into the same --out.
  if (const int ranks = launched_ranks(); ranks > 1 && c.executor != "mpi") {
    const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
    if (rank == nullptr) rank = std::getenv("PMI_RANK");
    if (rank == nullptr || std::string(rank) == "0")
      std::fprintf(stderr,
                   "xpipe-train: started by mpirun as %d ranks, but --executor is %s: each rank "
                   "would run the whole study into one --out. Pass --executor mpi (ranks = --dp x "
                   "--stages), or run xpipe-train without mpirun\n",
                   ranks, c.executor.c_str());
    return 2;
  }
  if (c.resume && c.checkpoint_dir.empty()) {
    std::fprintf(stderr, "xpipe-train: --resume needs --checkpoint-dir\n");
    return 2;
  }
  // --executor mpi: the launch must match the flags (usage errors, exit 2, named on rank 0).
  if (c.dp > 1 && c.executor != "mpi") {
    std::fprintf(stderr, "xpipe-train: --dp %d needs --executor mpi\n", c.dp);
    return 2;
  }
  if (c.device == "cuda") {
    std::string why;
#if defined(XPIPE_WITH_CUDA)
    if (c.model != "mlp" || c.stages != 4)
      why = "runs the mlp over 4 stages only (got " + c.model + " over " +
            std::to_string(c.stages) + ")";
    else if (c.executor == "mpi" || c.dp > 1)
      why = "runs in one process (no --executor mpi, no --dp)";
    else if (c.measure_prediction)
      why = "cannot measure predictions (weights in device memory: no --measure-prediction)";
    else if (!c.pin_cpus.empty())
      why = "pins no threads (no --pin-cpus)";
    else
      why = cuda_device_problem();
#else
    why =
        "this xpipe-train was built without CUDA (configure where nvcc is found, with "
        "-DXPIPE_ENABLE_CUDA=ON)";
#endif
    if (!why.empty()) {
      std::fprintf(stderr, "xpipe-train: --device cuda: %s\n", why.c_str());
      return 2;
    }
  }
  if (!c.pin_cpus.empty()) {
    if (c.executor != "threaded") {
      std::fprintf(stderr, "xpipe-train: --pin-cpus needs --executor threaded\n");
      return 2;
    }
    try {
      ThreadedExecutor probe;
      probe.cpus = c.pin_cpus;
      probe.check_cpus();
    } catch (const ConfigError& e) {
      std::fprintf(stderr, "xpipe-train: --pin-cpus: %s\n", e.what());
      return 2;
    }
  }
  struct MpiSession {  // finalizes MPI on every normal return from main
    bool on = false;
    ~MpiSession() {
#if defined(XPIPE_WITH_MPI)
      if (on) MPI_Finalize();
#endif
    }
  } mpi_session;
#if defined(XPIPE_WITH_MPI)
  std::optional<MpiExecutor> mpi_exec;
  if (c.executor == "mpi") {
    int provided = 0, ranks = 0;
    mpi_default_tuning();
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);  // a worker thread trains
    mpi_session.on = true;
    under_mpi = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    std::string why;
    if (ranks != c.dp * c.stages)
      why = std::to_string(ranks) + " ranks were launched, but --dp " + std::to_string(c.dp) +
            " x --stages " + std::to_string(c.stages) + " needs " +
            std::to_string(c.dp * c.stages) + " (mpirun -np " + std::to_string(c.dp * c.stages) +
            ")";
    else if (c.batch % c.dp != 0)
      why = "--dp " + std::to_string(c.dp) + " does not divide --batch " + std::to_string(c.batch) +
            " (each replica trains on batch / dp rows)";
    else if (c.micro_batches > c.batch / c.dp)
      why = "--micro-batches (" + std::to_string(c.micro_batches) +
            ") exceeds a replica's batch (" + std::to_string(c.batch / c.dp) + ")";
    else if (provided < MPI_THREAD_SERIALIZED)
      why = "this MPI library does not support MPI_THREAD_SERIALIZED";
    if (!why.empty()) {
      if (mpi_rank == 0) std::fprintf(stderr, "xpipe-train: --executor mpi: %s\n", why.c_str());
      return 2;
    }
    mpi_exec.emplace(MPI_COMM_WORLD, c.dp);
    mpi_exec->wait_timeout = std::chrono::duration<double>(c.wait_timeout);
    mpi_executor = &*mpi_exec;
    if (mpi_rank != 0) {  // rank 0 prints and writes; the others stay quiet but for errors
      if (!std::freopen("/dev/null", "w", stdout)) return 1;
    }
  }
#endif
  // An --out or --checkpoint-dir that cannot hold what the runs write is a usage error found now,
  // not after hours of training. One writer per folder: --out and every run's checkpoint folder
  // are locked before any data is read, and stay locked until the process ends. Under MPI rank
  // 0 alone does both: it is the one that writes, and the others make no folder.
  tools::FolderLocks locks;
  {
    std::string why;
    if (mpi_rank == 0) {
      if (const std::string bad = tools::prepare_output_dir(out_dir); !bad.empty())
        why = "--out '" + out_dir + "': " + bad;
      else if (const std::string no =
                   c.checkpoint_dir.empty() ? "" : tools::prepare_output_dir(c.checkpoint_dir);
               !no.empty())
        why = "--checkpoint-dir '" + c.checkpoint_dir + "': " + no;
      else
        why = locks.take(out_dir, "--out");
      for (const RunConfig& r : study_runs(c, compare, sgd_lr_flag)) {
        const fs::path dir = run_checkpoint_dir(r);
        if (!why.empty() || dir.empty()) continue;
        if (const std::string bad = tools::prepare_output_dir(dir); !bad.empty())
          why = "--checkpoint-dir: the run folder '" + dir.string() + "' " + bad;
        else
          why = locks.take(dir, "the checkpoint folder");
      }
    }
#if defined(XPIPE_WITH_MPI)
    if (c.executor == "mpi") {  // every rank stops when rank 0 could not lock
      int refused = why.empty() ? 0 : 1;
      MPI_Bcast(&refused, 1, MPI_INT, 0, MPI_COMM_WORLD);
      if (refused != 0 && mpi_rank != 0) return 2;
    }
#endif
    if (!why.empty()) {
      std::fprintf(stderr, "xpipe-train: %s\n", why.c_str());
      return 2;
    }
  }
  if (mpi_rank != 0) out_dir.clear();  // its study files are kept in memory only
  install_signal_handlers();
  try {
    DatasetPair data = load_fashion_mnist(data_dir);
    if (train_samples > 0) data.train = head(data.train, train_samples);
    if (test_samples > 0) data.test = head(data.test, test_samples);
    // Too few rows for one mini-batch (a row per micro-batch of every replica): a usage error.
    const int least_micro_batches =
        sweep ? *std::max_element(plan.micro_batches.begin(), plan.micro_batches.end())
              : c.micro_batches;
    if (data.train.count < static_cast<index_t>(least_micro_batches) * c.dp) {
      if (mpi_rank == 0)
        std::fprintf(stderr,
                     "xpipe-train: --train-samples: %ld rows to train on, but one mini-batch of %d "
                     "micro-batches%s needs at least %ld\n",
                     static_cast<long>(data.train.count), least_micro_batches,
                     c.dp > 1 ? (" on each of " + std::to_string(c.dp) + " replicas").c_str() : "",
                     static_cast<long>(least_micro_batches) * c.dp);
      return 2;
    }
    if (!c.checkpoint_dir.empty()) {  // a checkpoint resumes on the data it was trained on only
      c.train_data_crc32 = data_crc32(data.train);
      c.test_data_crc32 = data_crc32(data.test);
    }
    if (sweep) {
      plan.train_samples = data.train.count;
      plan.test_samples = data.test.count;
      return run_sweep(c, plan, data, out_dir);
    }
    const std::vector<RunConfig> runs = study_runs(c, compare, sgd_lr_flag);
    // Checkpoints are never overwritten: a run folder that holds some needs --resume.
    for (const RunConfig& r : runs) {
      const fs::path dir = run_checkpoint_dir(r);
      if (dir.empty() || r.resume) continue;
      std::error_code ec;  // (the folder was made and locked above: it can be listed)
      for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
        if (tools::is_checkpoint_name(it->path().filename().string())) {
          std::fprintf(stderr,
                       "xpipe-train: %s already holds checkpoints of %s; pass --resume to "
                       "continue them or choose another --checkpoint-dir\n",
                       dir.c_str(), r.label().c_str());
          return 2;
        }
    }
    if (stop_signal != 0) {  // before the study starts, so a folder's earlier results stay
      std::fprintf(stderr, "xpipe-train: stopped by a signal before training; nothing written\n");
      return 128 + stop_signal;
    }
    StudyFiles files(out_dir);
    std::printf(
        "xpipe-train: model %s over %d stages, M = %d, batch %ld, %d epochs, seed %lu; results "
        "go to %s as each run ends\n",
        c.model.c_str(), c.stages, c.micro_batches, c.batch, c.epochs,
        static_cast<unsigned long>(c.seed), out_dir.c_str());
    std::fflush(stdout);
    std::size_t current = 0;  // index of the run in progress
    const CheckPoint check = [&](const RunRecord& so_far, int epoch_running) {
      if (stop_signal == 0) return;
      RunRecord partial = so_far;
      partial.status = RunStatus::interrupted;
      partial.why = stop_reason(epoch_running, so_far.epochs.size());
      add_or_exit(files, std::move(partial));
      stop_for_signal(files, "during run " + std::to_string(current + 1) + " of " +
                                 std::to_string(runs.size()) + " (" + so_far.config.label() + ")");
    };
    for (; current < runs.size(); ++current) {
      const RunConfig& r = runs[current];
      if (stop_signal != 0)
        stop_for_signal(files, "before run " + std::to_string(current + 1) + " of " +
                                   std::to_string(runs.size()));
      // In a study one diverging or failing configuration is a result, not a reason to stop.
      // Under MPI a failed run ends the job once recorded: the ranks may have failed apart (a
      // checkpoint only rank 0 sets aside), and could not start the next run together.
      RunRecord rec;
      try {
        rec = run(r, data, check);
      } catch (const std::exception& e) {  // it could not start: 2BW with M < K, a checkpoint of
        rec.config = r;                    // another run or of other data to resume
        rec.status = RunStatus::failed;
        rec.why = e.what();
        rec.ends_job = c.executor == "mpi";
      }
      if (!rec.ok())
        std::fprintf(stderr, "  %s %s: %s\n", r.label().c_str(), to_string(rec.status),
                     rec.why.c_str());
      const bool ends_job = rec.ends_job;
      const std::string why = rec.why;
      files.add(std::move(rec));
      if (ends_job) mpi_fail(why);
    }
    if (stop_signal != 0) stop_for_signal(files, "after the last run");
    const bool kept_earlier = !files.finish();
    print_table(files.records());
    const bool plotted = mpi_rank == 0 && !kept_earlier && files.plot();
    if (stop_signal != 0) stop_for_signal(files, "while plotting");
    std::vector<std::string> names{"runs.csv", "runs.json", "accuracy.csv", "accuracy.gp"};
    if (plotted) names.insert(names.end(), {"accuracy.svg", "accuracy.png"});
    std::string written;
    for (const std::string& name : names)
      if (files.non_empty(name)) written += (written.empty() ? "" : ", ") + name;
    if (files.any_trace_files())
      written +=
          ", and per finished run timeline-*.svg and trace-*.json (open in "
          "https://ui.perfetto.dev)";
    if (!kept_earlier) std::printf("\nwrote to %s: %s\n", out_dir.c_str(), written.c_str());
    std::fflush(stdout);
    // A single run that did not finish is a failed command; a study reports it as a result,
    // unless every run failed (none could run: refused to resume, say).
    if (!compare && !files.records().front().ok()) {
      std::fprintf(stderr, "xpipe-train: %s %s: %s\n", c.label().c_str(),
                   to_string(files.records().front().status), files.records().front().why.c_str());
      return 1;
    }
    if (std::all_of(files.records().begin(), files.records().end(),
                    [](const RunRecord& r) { return r.status == RunStatus::failed; })) {
      std::fprintf(stderr, "xpipe-train: every run of the study failed (see above)\n");
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    if (c.executor == "mpi") mpi_fail(e.what());
    std::fprintf(stderr, "xpipe-train: %s\n", e.what());
    return 1;
  }
}
