// A study's output folder (StudyFiles: runs.csv, runs.json, accuracy.csv and .gp, timelines and
// traces, kept current as runs end) and its table on stdout.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "../output_files.hpp"
#include "../train_run.hpp"

namespace xpipe::tools::train {

// The numbers of `v`, each printed with `fmt`, joined by '/' (a table cell).
inline std::string joined(const std::vector<double>& v, const char* fmt) {
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
inline nlohmann::json prediction_json(const std::vector<PredictionError>& errors) {
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
inline void print_table(const std::vector<RunRecord>& records) {
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
// each run's rows appended, written through; runs.json (everything), accuracy.csv and loss.csv
// (wide: a column per finished run) and accuracy.gp (gnuplot draws accuracy.svg, accuracy.png,
// loss.svg and loss.png from them) are replaced atomically; a finished run's timeline SVG and
// Chrome trace of its last epoch go beside them. Whatever stops the study, the folder holds every
// run done by then. An earlier study's files in the folder stay until this study records its first
// run: a study killed before that (kill -9, an OOM kill) leaves the folder as it found it.
class StudyFiles {
 public:
  // The files of a study in `dir`, or (dir empty: an MPI rank other than 0) records kept in
  // memory only. Checks now, before any training, that the files can be written in place.
  // Throws OutputError naming a file it cannot write.
  // `runs`: the study's runs. The earlier timelines and traces of those that resume wait for
  // their records: a run resumed after its last epoch trains nothing and draws none, and leaves
  // the earlier ones.
  explicit StudyFiles(fs::path dir, const std::vector<RunConfig>& runs = {})
      : dir_(std::move(dir)) {
    if (dir_.empty()) return;
    for (const RunConfig& c : runs)
      if (c.resume) own_.insert(own_.end(), {timeline_name(c), trace_name(c)});
    for (const char* name : {"runs.csv", "runs.json", "accuracy.csv", "loss.csv", "accuracy.gp"}) {
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
    if (dir_.empty() || records_.empty()) return true;
    if (csv_) {
      remove_unclaimed_earlier();
      return true;
    }
    if (earlier_study_) {
      std::fprintf(stderr,
                   "xpipe-train: no run of this study finished an epoch, so %s keeps the earlier "
                   "study's files (what failed is above)\n",
                   dir_.c_str());
      return false;
    }
    write_record(records_.back());
    remove_unclaimed_earlier();
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
          if (&held != &rec) {
            csv_->append(csv_rows(held));
            keep_or_remove_earlier(held);
          }
      }
      csv_->append(csv_rows(rec));
    } catch (const OutputError&) {
      failure = std::current_exception();
    }
    keep_or_remove_earlier(rec);
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

  // Draws accuracy.svg, accuracy.png, loss.svg and loss.png with gnuplot (no shell: the folder's
  // name may hold any character). True when all four were drawn and are not empty; otherwise
  // says why on stderr.
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
    for (const char* name : {"accuracy.svg", "accuracy.png", "loss.svg", "loss.png"})
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
        "test_accuracy,test_loss,samples_per_second,status\n");
    std::error_code ignored;
    fs::remove(dir_ / "accuracy.svg", ignored);
    fs::remove(dir_ / "accuracy.png", ignored);
    fs::remove(dir_ / "loss.svg", ignored);
    fs::remove(dir_ / "loss.png", ignored);
    // The earlier files of this study's resumed runs wait for their records.
    std::erase_if(earlier_, [&](const fs::path& p) {
      if (std::find(own_.begin(), own_.end(), p.filename().string()) != own_.end()) return false;
      fs::remove(p, ignored);
      return true;
    });
  }

  // The earlier timeline and trace of rec's run: kept where the run was resumed after its last
  // epoch, so drew none of its own (not claimed as its own: the folder may hold another study's
  // run of that name), else removed (a finished run writes its own in their place).
  void keep_or_remove_earlier(const RunRecord& rec) {
    const bool drew_none = rec.ok() && rec.trace.stages.empty();
    for (const std::string& name : {timeline_name(rec.config), trace_name(rec.config)}) {
      const auto it = std::find_if(earlier_.begin(), earlier_.end(),
                                   [&](const fs::path& p) { return p.filename() == name; });
      if (it == earlier_.end()) continue;
      std::error_code ignored;
      if (!drew_none) fs::remove(*it, ignored);
      earlier_.erase(it);
    }
  }

  // At the end of a study that wrote its files: the earlier timelines and traces that no record
  // took up go, as every other earlier one went at the start (a safety net: each resumed run
  // records once, and its record takes up its own).
  void remove_unclaimed_earlier() {
    std::error_code ignored;
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
    for (const EpochRecord& e : r.epochs) {
      rows << run.str() << e.epoch << ',' << e.loss << ',' << e.test_accuracy << ',';
      if (!std::isnan(e.test_loss)) rows << e.test_loss;  // (not measured: an empty field)
      rows << ',' << e.samples_per_second << ',' << to_string(r.status) << '\n';
    }
    if (r.epochs.empty()) rows << run.str() << ",,,,," << to_string(r.status) << '\n';
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
                        {"predictor_params", run_predictor(c).hyper_text()},
                        {"optimizer", c.optimizer},
                        {"lr", c.lr},
                        {"lr_schedule", c.lr_schedule.text()},
                        {"clip_norm", c.clip_norm},
                        {"model", c.model},
                        {"stages", c.stages},
                        {"micro_batches", c.micro_batches},
                        {"batch", c.batch},
                        {"seed", c.seed},
                        {"executor", c.executor},
                        {"threads", c.threads},
                        {"device", c.device},
                        {"augment", augment_text(c.augment)},
                        {"epochs", nlohmann::json::array()}};
      if (!r.ok()) jr["failure"] = r.why;
      for (const EpochRecord& e : r.epochs)
        jr["epochs"].push_back({{"epoch", e.epoch},
                                {"loss", e.loss},
                                {"test_accuracy", e.test_accuracy},
                                {"test_loss", e.test_loss},
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
    std::size_t epochs = 0;  // the most any plotted run has
    for (const RunRecord* r : plotted) epochs = std::max(epochs, r->epochs.size());
    // A column per finished run of one number per epoch: test accuracy (%), test loss.
    auto wide = [&](auto value) {
      std::ostringstream out;
      out << "epoch";
      for (const RunRecord* r : plotted) out << ',' << r->config.label();
      out << '\n';
      for (std::size_t e = 0; e < epochs; ++e) {
        out << e + 1;
        for (const RunRecord* r : plotted) {
          out << ',';
          if (e < r->epochs.size() && !std::isnan(value(r->epochs[e]))) out << value(r->epochs[e]);
        }
        out << '\n';
      }
      return out.str();
    };
    tools::write_file_atomically(dir_ / "accuracy.csv",
                                 wide([](const EpochRecord& e) { return 100 * e.test_accuracy; }));
    tools::write_file_atomically(dir_ / "loss.csv",
                                 wide([](const EpochRecord& e) { return e.test_loss; }));
    tools::write_file_atomically(
        dir_ / "accuracy.gp",
        "# Test accuracy per epoch of every run in accuracy.csv. Restyle freely; run from this\n"
        "# directory with: gnuplot accuracy.gp\n"
        "set datafile separator ','\n"
        "set key outside right top noenhanced\n"
        "set xlabel 'epoch'\nset ylabel 'test accuracy (%)'\nset grid\nset xtics 1\n"
        // Half an epoch either side: one epoch is no empty range for gnuplot to warn of.
        "set xrange [0.5:" +
            std::to_string(std::max<std::size_t>(epochs, 1)) +
            ".5]\n"
            "set title 'Test accuracy by schedule and predictor (gpt: next-byte accuracy)' "
            "noenhanced\n"
            "n = " +
            std::to_string(plotted.size()) +
            "\n"
            "set terminal svg size 1000,560 dynamic background rgb 'white'\n"
            "set output 'accuracy.svg'\n"
            "plot for [c=2:n+1] 'accuracy.csv' using 1:c with linespoints lw 2 title "
            "columnheader(c)\n"
            "set terminal pngcairo size 1000,560\nset output 'accuracy.png'\nreplot\n"
            "# The test loss per epoch (loss.csv): mean cross-entropy, nats per sample (gpt: per "
            "token; its perplexity is exp of it).\n"
            "set ylabel 'test loss (nats)'\n"
            "set title 'Test loss by schedule and predictor' noenhanced\n"
            "set terminal svg size 1000,560 dynamic background rgb 'white'\n"
            "set output 'loss.svg'\n"
            "plot for [c=2:n+1] 'loss.csv' using 1:c with linespoints lw 2 title "
            "columnheader(c)\n"
            "set terminal pngcairo size 1000,560\nset output 'loss.png'\nreplot\n");
  }

  fs::path dir_;
  std::optional<tools::AppendFile> csv_;  // from the first record on
  std::vector<fs::path> earlier_;         // an earlier study's timelines and traces
  std::vector<std::string> own_;          // the file names of this study's runs' timelines, traces
  bool earlier_study_ = false;            // runs.csv or runs.json were there at the start
  std::vector<RunRecord> records_;
};

}  // namespace xpipe::tools::train
