// xpipe-train --sweep: the plan, the summary over seeds, the files and the table (sweep.hpp).
// Kept out of xpipe_train.cpp, which instantiates the pipelines, so the two compile in parallel.
#include "sweep.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <system_error>

namespace xpipe::tools {

namespace fs = std::filesystem;

std::vector<SweepRemedy> sweep_remedies(const SweepPlan& plan) {
  std::vector<SweepRemedy> out;
  for (const std::string& p : plan.predictors) {
    // 2BW's double buffer is the schedule's premise, with or without the error feedback.
    if (p == "2bw" || p == "2bw-ef") {
      out.push_back({"2bw", p});
      continue;
    }
    for (const std::string& s : plan.schedules) out.push_back({s, p});
  }
  return out;
}

std::vector<SweepPoint> sweep_points(const SweepPlan& plan) {
  std::vector<SweepPoint> out;
  for (const std::string& opt : plan.optimizers)
    for (int m : plan.micro_batches)
      for (int k : plan.stages) {
        const float lr = opt == "sgd" ? plan.sgd_lr : plan.lr;
        out.push_back({k, m, "gpipe", "latest", opt, lr});
        for (const SweepRemedy& r : sweep_remedies(plan))
          out.push_back({k, m, r.schedule, r.predictor, opt, lr});
      }
  return out;
}

const char* to_string(SweepStatus s) {
  switch (s) {
    case SweepStatus::ok:
      return "ok";
    case SweepStatus::diverged:
      return "diverged";
    case SweepStatus::not_run:
      return "not-run";
    case SweepStatus::failed:
      return "failed";
    case SweepStatus::interrupted:
      return "interrupted";
  }
  return "?";
}

Stat stat_of(const std::vector<double>& v) {
  Stat s;
  s.n = static_cast<int>(v.size());
  if (v.empty()) return s;
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / s.n;
  if (s.n < 2) return s;
  double sq = 0;
  for (double x : v) sq += (x - s.mean) * (x - s.mean);
  s.sd = std::sqrt(sq / (s.n - 1));
  return s;
}

namespace {

bool same_point(const SweepPoint& a, const SweepPoint& b) {
  return a.stages == b.stages && a.micro_batches == b.micro_batches && a.schedule == b.schedule &&
         a.predictor == b.predictor && a.optimizer == b.optimizer && a.lr == b.lr;
}

// The baseline of `p`: GPipe + Latest at the same K, M, optimizer and learning rate.
bool is_baseline_of(const SweepPoint& base, const SweepPoint& p) {
  return base.baseline() && base.stages == p.stages && base.micro_batches == p.micro_batches &&
         base.optimizer == p.optimizer && base.lr == p.lr;
}

double mean_rate(const SweepRun& r) {
  double sum = 0;
  for (const EpochRecord& e : r.epochs) sum += e.samples_per_second;
  return r.epochs.empty() ? 0 : sum / static_cast<double>(r.epochs.size());
}

std::string num(double v) {
  if (std::isnan(v)) return "";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.8g", v);
  return buf;
}

nlohmann::json json_num(double v) {
  return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v);
}

std::string slashed(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : "/") + std::to_string(x);
  return s;
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::size_t from = 0;
  while (true) {
    const std::size_t comma = text.find(',', from);
    out.push_back(text.substr(from, comma == std::string::npos ? comma : comma - from));
    if (comma == std::string::npos) return out;
    from = comma + 1;
  }
}

template <class T>
std::string listed(const std::vector<T>& v) {
  std::ostringstream s;
  for (std::size_t i = 0; i < v.size(); ++i) s << (i ? ", " : "") << v[i];
  return s.str();
}

// `s` padded with spaces to `width` characters on a terminal (a UTF-8 "±" is one).
std::string pad(std::string s, std::size_t width) {
  std::size_t shown = 0;
  for (unsigned char ch : s) shown += (ch & 0xC0) != 0x80;
  if (shown < width) s.append(width - shown, ' ');
  return s;
}

// "84.12 ± 0.31" (sd left out when undefined).
// "mean ± sd" with `digits` decimals (a sign when `sign` is "+"); the mean alone when n < 2.
std::string mean_sd(const Stat& s, const char* sign = "", int digits = 2) {
  if (s.n == 0) return "-";
  char buf[64];
  if (std::isnan(s.sd))
    std::snprintf(buf, sizeof buf, sign[0] ? "%+.*f" : "%.*f", digits, s.mean);
  else
    std::snprintf(buf, sizeof buf, sign[0] ? "%+.*f ± %.*f" : "%.*f ± %.*f", digits, s.mean, digits,
                  s.sd);
  return buf;
}

}  // namespace

std::vector<SweepCell> summarize(const std::vector<SweepRun>& runs, int epochs) {
  std::vector<SweepCell> cells;
  std::vector<std::vector<const SweepRun*>> members;
  for (const SweepRun& r : runs) {
    std::size_t i = 0;
    while (i < cells.size() && !same_point(cells[i].point, r.point)) ++i;
    if (i == cells.size()) {
      cells.push_back({});
      cells.back().point = r.point;
      members.emplace_back();
    }
    members[i].push_back(&r);
  }
  for (std::size_t i = 0; i < cells.size(); ++i) {
    SweepCell& c = cells[i];
    std::vector<double> rates;
    for (const SweepRun* r : members[i]) {
      ++c.runs;
      switch (r->status) {
        case SweepStatus::ok:
          ++c.ok;
          rates.push_back(mean_rate(*r));
          if (c.weight_copies.empty()) c.weight_copies = r->weight_copies;
          break;
        case SweepStatus::diverged:
          ++c.diverged;
          break;
        case SweepStatus::not_run:
          ++c.not_run;
          break;
        case SweepStatus::failed:
          ++c.failed;
          break;
        case SweepStatus::interrupted:
          ++c.interrupted;
          break;
      }
      if (r->status != SweepStatus::ok && c.why.empty()) c.why = r->why;
    }
    c.samples_per_second = stat_of(rates);
    // The baseline's runs by seed, for the paired differences.
    std::map<std::uint64_t, const SweepRun*> base;
    if (!c.point.baseline())
      for (const SweepRun& r : runs)
        if (is_baseline_of(r.point, c.point) && r.status == SweepStatus::ok) base[r.seed] = &r;
    for (int e = 0; e < epochs; ++e) {
      std::vector<double> acc, gap, loss, loss_gap;
      for (const SweepRun* r : members[i]) {
        if (r->status != SweepStatus::ok || static_cast<int>(r->epochs.size()) <= e) continue;
        const double a = 100 * r->epochs[e].test_accuracy, l = r->epochs[e].test_loss;
        acc.push_back(a);
        if (std::isfinite(l)) loss.push_back(l);
        const auto b = base.find(r->seed);
        if (b != base.end() && static_cast<int>(b->second->epochs.size()) > e) {
          gap.push_back(a - 100 * b->second->epochs[e].test_accuracy);
          const double bl = b->second->epochs[e].test_loss;
          if (std::isfinite(l) && std::isfinite(bl)) loss_gap.push_back(l - bl);
        }
      }
      c.accuracy.push_back(stat_of(acc));
      c.test_loss.push_back(stat_of(loss));
      if (!c.point.baseline()) {
        c.gap.push_back(stat_of(gap));
        c.loss_gap.push_back(stat_of(loss_gap));
      }
    }
  }
  return cells;
}

std::string parse_int_list(const std::string& text, const std::vector<int>& allowed, int lo, int hi,
                           std::vector<int>& out) {
  out.clear();
  for (const std::string& item : split(text)) {
    int v = 0;
    std::size_t used = 0;
    bool number = !item.empty() && item.find_first_not_of("0123456789") == std::string::npos;
    if (number) {
      try {
        v = std::stoi(item, &used);
      } catch (const std::exception&) {
        number = false;
      }
    }
    const bool fits =
        number && (allowed.empty() ? v >= lo && v <= hi
                                   : std::find(allowed.begin(), allowed.end(), v) != allowed.end());
    if (!fits)
      return "'" + item + "' is not " +
             (allowed.empty()
                  ? "a whole number from " + std::to_string(lo) + " to " + std::to_string(hi)
                  : "one of " + listed(allowed));
    if (std::find(out.begin(), out.end(), v) != out.end()) return item + " is listed twice";
    out.push_back(v);
  }
  return "";
}

std::string parse_name_list(const std::string& text, const std::vector<std::string>& allowed,
                            std::vector<std::string>& out) {
  out.clear();
  for (const std::string& item : split(text)) {
    if (std::find(allowed.begin(), allowed.end(), item) == allowed.end())
      return "'" + item + "' is not one of " + listed(allowed);
    if (std::find(out.begin(), out.end(), item) != out.end()) return item + " is listed twice";
    out.push_back(item);
  }
  return "";
}

SweepFiles::SweepFiles(SweepPlan plan, fs::path dir)
    : plan_(std::move(plan)), dir_(std::move(dir)) {
  for (const SweepPoint& p : sweep_points(plan_))
    for (int s = 1; s <= plan_.seeds; ++s) planned_.emplace_back(p, static_cast<std::uint64_t>(s));
  // Found now, before any training: a file that cannot be replaced because a folder is in the way.
  for (const char* name :
       {"sweep-runs.csv", "sweep.csv", "sweep.json", "sweep.md", "sweep-gap.csv", "sweep-gap.gp"}) {
    std::error_code ec;
    if (fs::is_directory(fs::symlink_status(dir_ / name, ec)))
      throw OutputError(dir_ / name, EISDIR);
  }
}

// The first record: an earlier sweep's files in the folder are replaced from here on (until
// now a sweep killed at once leaves them as they were).
void SweepFiles::start() {
  std::string head =
      "model,stages,micro_batches,schedule,predictor,optimizer,lr,batch,seed,status,"
      "epochs_done,final_loss,samples_per_second,weight_copies";
  for (int e = 1; e <= plan_.epochs; ++e) head += ",test_accuracy_pct_e" + std::to_string(e);
  for (int e = 1; e <= plan_.epochs; ++e) head += ",test_loss_e" + std::to_string(e);
  csv_.emplace(dir_ / "sweep-runs.csv");
  csv_->append(head + '\n');
  std::error_code ignored;  // plots of an earlier sweep are redrawn or reported at the end
  fs::remove(dir_ / "sweep-gap.svg", ignored);
  fs::remove(dir_ / "sweep-gap.png", ignored);
  for (const char* name : {"sweep-prediction.csv", "sweep-prediction.gp", "sweep-prediction.svg",
                           "sweep-prediction.png"})
    fs::remove(dir_ / name, ignored);
}

void SweepFiles::announce(std::size_t index) const {
  const auto& [p, seed] = planned_[index];
  std::string eta;
  if (!runs_.empty()) {  // from the mean time of the runs so far
    const double spent =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double left = spent / static_cast<double>(runs_.size()) *
                        static_cast<double>(planned_.size() - runs_.size());
    char buf[64];
    std::snprintf(buf, sizeof buf, "  (%.0f s so far, about %.0f s to go)", spent, left);
    eta = buf;
  }
  std::printf("[%zu/%zu] K %d, M %d, seed %lu: %s%s\n", index + 1, planned_.size(), p.stages,
              p.micro_batches, static_cast<unsigned long>(seed), p.label().c_str(), eta.c_str());
  std::fflush(stdout);
}

void SweepFiles::add(SweepRun run) {
  runs_.push_back(std::move(run));
  // Runs that finished no epoch (not run, failed at once, interrupted) wait for the first that
  // did, or the end of the sweep, before an earlier sweep's files are replaced.
  if (!csv_ && runs_.back().epochs.empty()) return;
  if (!csv_) {
    start();
    for (std::size_t i = 0; i + 1 < runs_.size(); ++i) csv_->append(row(runs_[i]));
  }
  csv_->append(row(runs_.back()));
  write_summaries();
}

std::string SweepFiles::row(const SweepRun& r) const {
  const SweepPoint& p = r.point;
  std::ostringstream line;
  line << plan_.model << ',' << p.stages << ',' << p.micro_batches << ',' << p.schedule << ','
       << p.predictor << ',' << p.optimizer << ',' << num(p.lr) << ',' << plan_.batch << ','
       << r.seed << ',' << to_string(r.status) << ',' << r.epochs.size() << ','
       << (r.epochs.empty() ? "" : num(r.epochs.back().loss)) << ','
       << (r.epochs.empty() ? "" : num(mean_rate(r))) << ',' << slashed(r.weight_copies);
  for (int e = 0; e < plan_.epochs; ++e)
    line << ','
         << (e < static_cast<int>(r.epochs.size()) ? num(100 * r.epochs[e].test_accuracy) : "");
  // The test loss, empty where not measured (NaN) or not reached.
  for (int e = 0; e < plan_.epochs; ++e)
    line << ','
         << (e < static_cast<int>(r.epochs.size()) && std::isfinite(r.epochs[e].test_loss)
                 ? num(r.epochs[e].test_loss)
                 : "");
  return line.str() + '\n';
}

void SweepFiles::write_summaries() const {
  const std::vector<SweepCell> cells = summarize(runs_, plan_.epochs);
  // sweep.csv: a row per configuration.
  std::ostringstream csv;
  csv << "model,stages,micro_batches,schedule,predictor,optimizer,lr,runs,ok,diverged,not_run,"
         "failed,interrupted,samples_per_second_mean,samples_per_second_sd,weight_copies,gap_n";
  for (int e = 1; e <= plan_.epochs; ++e)
    csv << ",acc_mean_e" << e << ",acc_sd_e" << e << ",gap_mean_e" << e << ",gap_sd_e" << e;
  for (int e = 1; e <= plan_.epochs; ++e)
    csv << ",loss_mean_e" << e << ",loss_sd_e" << e << ",loss_gap_mean_e" << e << ",loss_gap_sd_e"
        << e;
  csv << '\n';
  for (const SweepCell& c : cells) {
    const SweepPoint& p = c.point;
    csv << plan_.model << ',' << p.stages << ',' << p.micro_batches << ',' << p.schedule << ','
        << p.predictor << ',' << p.optimizer << ',' << num(p.lr) << ',' << c.runs << ',' << c.ok
        << ',' << c.diverged << ',' << c.not_run << ',' << c.failed << ',' << c.interrupted << ','
        << num(c.samples_per_second.mean) << ',' << num(c.samples_per_second.sd) << ','
        << slashed(c.weight_copies) << ',' << (c.gap.empty() ? "" : std::to_string(c.gap.back().n));
    for (int e = 0; e < plan_.epochs; ++e) {
      csv << ',' << num(c.accuracy[e].mean) << ',' << num(c.accuracy[e].sd);
      if (c.gap.empty())
        csv << ",,";
      else
        csv << ',' << num(c.gap[e].mean) << ',' << num(c.gap[e].sd);
    }
    for (int e = 0; e < plan_.epochs; ++e) {
      csv << ',' << num(c.test_loss[e].mean) << ',' << num(c.test_loss[e].sd);
      if (c.loss_gap.empty())
        csv << ",,";
      else
        csv << ',' << num(c.loss_gap[e].mean) << ',' << num(c.loss_gap[e].sd);
    }
    csv << '\n';
  }
  write_file_atomically(dir_ / "sweep.csv", csv.str());

  // sweep.md: the same summary as a Markdown table, for a results page.
  std::ostringstream md;
  md << "| K | M | optimizer | remedy | test accuracy by epoch, mean ± sd (n) | gap to GPipe, "
        "last epoch (points) | test loss, last epoch | its gap to GPipe | samples/s | weights "
        "per stage |\n|--:|--:|---|---|---|---|--:|--:|--:|---|\n";
  for (const SweepCell& c : cells) {
    const SweepPoint& p = c.point;
    md << "| " << p.stages << " | " << p.micro_batches << " | " << p.optimizer << " | "
       << p.schedule << " + " << p.predictor << " | ";
    if (c.ok == 0) {
      md << (c.not_run == c.runs    ? "not run"
             : c.diverged == c.runs ? "diverged"
                                    : "no run finished")
         << " (" << c.runs << " seeds) | | | | | |\n";
      continue;
    }
    std::string acc;
    for (const Stat& s : c.accuracy) acc += (acc.empty() ? "" : " / ") + mean_sd(s);
    md << acc << " (" << c.accuracy.back().n << ")";
    if (c.ok < c.runs) md << "; " << c.runs - c.ok << " of " << c.runs << " did not finish";
    md << " | " << (c.gap.empty() ? "baseline" : mean_sd(c.gap.back(), "+")) << " | "
       << mean_sd(c.test_loss.back(), "", 4) << " | "
       << (c.loss_gap.empty() ? "baseline" : mean_sd(c.loss_gap.back(), "+", 4)) << " | "
       << num(std::round(c.samples_per_second.mean)) << " | " << slashed(c.weight_copies) << " |\n";
  }
  write_file_atomically(dir_ / "sweep.md", md.str());

  // sweep.json: the plan, then per configuration its summary and its runs.
  nlohmann::json j{{"plan",
                    {{"model", plan_.model},
                     {"stages", plan_.stages},
                     {"micro_batches", plan_.micro_batches},
                     {"predictors", plan_.predictors},
                     {"schedules", plan_.schedules},
                     {"optimizers", plan_.optimizers},
                     {"seeds", plan_.seeds},
                     {"lr", plan_.lr},
                     {"sgd_lr", plan_.sgd_lr},
                     {"lr_schedule", plan_.lr_schedule},
                     {"clip_norm", plan_.clip_norm},
                     {"batch", plan_.batch},
                     {"epochs", plan_.epochs},
                     {"train_samples", plan_.train_samples},
                     {"test_samples", plan_.test_samples},
                     {"runs_planned", planned_.size()},
                     {"runs_done", runs_.size()}}},
                   {"configurations", nlohmann::json::array()}};
  for (const SweepCell& c : cells) {
    const SweepPoint& p = c.point;
    nlohmann::json jc{{"model", plan_.model},
                      {"stages", p.stages},
                      {"micro_batches", p.micro_batches},
                      {"schedule", p.schedule},
                      {"predictor", p.predictor},
                      {"optimizer", p.optimizer},
                      {"lr", p.lr},
                      {"baseline", p.baseline()},
                      {"runs", c.runs},
                      {"ok", c.ok},
                      {"diverged", c.diverged},
                      {"not_run", c.not_run},
                      {"failed", c.failed},
                      {"interrupted", c.interrupted},
                      {"samples_per_second",
                       {{"n", c.samples_per_second.n},
                        {"mean", json_num(c.samples_per_second.mean)},
                        {"sd", json_num(c.samples_per_second.sd)}}},
                      {"weight_copies", c.weight_copies},
                      {"epochs", nlohmann::json::array()},
                      {"seed_runs", nlohmann::json::array()}};
    if (!c.why.empty()) jc["why"] = c.why;
    for (int e = 0; e < plan_.epochs; ++e) {
      nlohmann::json je{{"epoch", e + 1},
                        {"test_accuracy_pct",
                         {{"n", c.accuracy[e].n},
                          {"mean", json_num(c.accuracy[e].mean)},
                          {"sd", json_num(c.accuracy[e].sd)}}}};
      if (!c.gap.empty())
        je["gap_to_gpipe_points"] = {
            {"n", c.gap[e].n}, {"mean", json_num(c.gap[e].mean)}, {"sd", json_num(c.gap[e].sd)}};
      je["test_loss"] = {{"n", c.test_loss[e].n},
                         {"mean", json_num(c.test_loss[e].mean)},
                         {"sd", json_num(c.test_loss[e].sd)}};
      if (!c.loss_gap.empty())
        je["test_loss_gap_to_gpipe"] = {{"n", c.loss_gap[e].n},
                                        {"mean", json_num(c.loss_gap[e].mean)},
                                        {"sd", json_num(c.loss_gap[e].sd)}};
      jc["epochs"].push_back(je);
    }
    for (const SweepRun& r : runs_) {
      if (!same_point(r.point, p)) continue;
      nlohmann::json jr{{"seed", r.seed},
                        {"status", to_string(r.status)},
                        {"weight_copies", r.weight_copies},
                        {"epochs", nlohmann::json::array()}};
      if (r.status != SweepStatus::ok) jr["why"] = r.why;
      for (std::size_t e = 0; e < r.epochs.size(); ++e) {
        const EpochRecord& er = r.epochs[e];
        nlohmann::json je{{"epoch", er.epoch},
                          {"loss", er.loss},
                          {"test_accuracy_pct", 100 * er.test_accuracy},
                          {"test_loss", json_num(er.test_loss)},
                          {"samples_per_second", er.samples_per_second},
                          {"seconds", er.seconds}};
        // With --measure-prediction: per stage and s, the predictions' mean relative error and
        // cosine (pipeline/prediction_probe.hpp), as in runs.json.
        if (!er.prediction_error.empty()) {
          nlohmann::json pe = nlohmann::json::array();
          for (const PredictionError& q : er.prediction_error)
            pe.push_back({{"stage", q.stage},
                          {"s", q.s},
                          {"count", q.count},
                          {"relative_error", q.mean_relative_error},
                          {"cosine", q.mean_cosine}});
          je["prediction_error"] = pe;
        }
        jr["epochs"].push_back(je);
      }
      jc["seed_runs"].push_back(jr);
    }
    j["configurations"].push_back(jc);
  }
  write_file_atomically(dir_ / "sweep.json", j.dump(2) + '\n');

  // sweep-gap.csv and sweep-gap.gp: the last epoch's gap versus K, a data block (gnuplot
  // index) per panel (M, optimizer) and remedy; sd 0 where undefined (n < 2).
  std::ostringstream gap, panels;
  int block = 0;
  const std::vector<SweepRemedy> remedies = sweep_remedies(plan_);
  const std::size_t rows = plan_.micro_batches.size(), cols = plan_.optimizers.size();
  const int last = plan_.epochs - 1;
  for (int m : plan_.micro_batches)
    for (const std::string& opt : plan_.optimizers) {
      panels << "set title 'M = " << m << ", " << opt << " (last epoch, mean ± sd over seeds)'\n"
             << "plot 0 with lines lc rgb 'black' dt 2 title 'GPipe'";
      for (std::size_t i = 0; i < remedies.size(); ++i) {
        std::ostringstream pts;
        for (const SweepCell& c : cells)
          if (c.point.micro_batches == m && c.point.optimizer == opt &&
              c.point.predictor == remedies[i].predictor &&
              c.point.schedule == remedies[i].schedule && !c.point.baseline() && c.gap[last].n > 0)
            pts << c.point.stages << ',' << num(c.gap[last].mean) << ','
                << (std::isnan(c.gap[last].sd) ? "0" : num(c.gap[last].sd)) << ',' << c.gap[last].n
                << '\n';
        if (pts.str().empty()) continue;
        gap << (block ? "\n\n" : "") << "# index " << block << ": M = " << m << ", " << opt << ", "
            << remedies[i].label() << " (K, gap mean, gap sd, pairs)\n"
            << pts.str();
        // Spread the remedies a little along K so their error bars do not hide each other.
        const double shift = (static_cast<double>(i) - (remedies.size() - 1) / 2.0) * 0.025;
        panels << ", \\\n  'sweep-gap.csv' index " << block << " using ($1*2**(" << num(shift)
               << ")):2:3 with yerrorlines lw 2 lc " << i + 1 << " pt " << i + 1 << " title '"
               << remedies[i].label() << "'";
        ++block;
      }
      panels << '\n';
    }
  write_file_atomically(dir_ / "sweep-gap.csv", gap.str());
  std::ostringstream gp;
  std::string xtics;
  for (int k : plan_.stages) xtics += (xtics.empty() ? "" : ", ") + std::to_string(k);
  const std::string setup =
      "set multiplot layout " + std::to_string(rows) + "," + std::to_string(cols) +
      " title 'Test accuracy minus GPipe (same seeds) versus pipeline stages K, model " +
      plan_.model + "'\n";
  gp << "# The staleness sweep's gap to GPipe versus K per remedy, a panel per M and optimizer,\n"
        "# from sweep-gap.csv (error bars: sd of the paired differences over seeds). Restyle\n"
        "# freely; run from this directory with: gnuplot sweep-gap.gp\n"
        "set encoding utf8\n"
        "set datafile separator ','\n"
        "set termoption noenhanced\n"
        "set key outside right top\n"
        "set logscale x 2\n"
        "set offsets 0, 0, graph 0.05, graph 0.05  # the GPipe line stays inside\n"
        "set xrange [1.5:"
     << num(2.0 * *std::max_element(plan_.stages.begin(), plan_.stages.end()) * 0.7)
     << "]\nset xtics (" << xtics
     << ")\n"
        "set xlabel 'pipeline stages K'\nset ylabel 'accuracy gap to GPipe (points)'\nset grid\n"
     << "set terminal svg size " << 620 * cols + 200 << "," << 420 * rows + 60
     << " dynamic background rgb 'white'\nset output 'sweep-gap.svg'\n"
     << setup << panels.str() << "unset multiplot\n"
     << "set terminal pngcairo size " << 620 * cols + 200 << "," << 420 * rows + 60
     << "\nset output 'sweep-gap.png'\n"
     << setup << panels.str() << "unset multiplot\n";
  write_file_atomically(dir_ / "sweep-gap.gp", gp.str());

  // sweep-prediction.csv and .gp, when runs measured their predictions (--measure-prediction):
  // per panel (M, optimizer) and remedy, the last epoch's prediction error versus s, pooled over
  // K, stages and seeds (weighted by the number of predictions).
  std::ostringstream pred, plots;
  int pblock = 0;
  for (int m : plan_.micro_batches)
    for (const std::string& opt : plan_.optimizers) {
      std::vector<std::pair<int, std::size_t>> blocks;  // (gnuplot index, remedy)
      for (std::size_t i = 0; i < remedies.size(); ++i) {
        std::map<int, std::array<double, 3>> by_s;  // s: predictions, sums of error and cosine
        for (const SweepRun& r : runs_)
          if (r.status == SweepStatus::ok && !r.point.baseline() && !r.epochs.empty() &&
              r.point.micro_batches == m && r.point.optimizer == opt &&
              r.point.predictor == remedies[i].predictor &&
              r.point.schedule == remedies[i].schedule)
            for (const PredictionError& q : r.epochs.back().prediction_error) {
              auto& a = by_s[q.s];
              a[0] += static_cast<double>(q.count);
              a[1] += static_cast<double>(q.count) * q.mean_relative_error;
              a[2] += static_cast<double>(q.count) * q.mean_cosine;
            }
        std::ostringstream pts;
        for (const auto& [sv, a] : by_s)
          if (a[0] > 0)
            pts << sv << ',' << num(a[1] / a[0]) << ',' << num(a[2] / a[0]) << ',' << num(a[0])
                << '\n';
        if (pts.str().empty()) continue;
        pred << (pblock ? "\n\n" : "") << "# index " << pblock << ": M = " << m << ", " << opt
             << ", " << remedies[i].label()
             << " (s, mean relative error, mean cosine, predictions)\n"
             << pts.str();
        blocks.emplace_back(pblock++, i);
      }
      for (int col = 2; col <= 3; ++col) {
        if (blocks.empty()) {
          plots << "set multiplot next\n";
          continue;
        }
        plots << "set title 'M = " << m << ", " << opt << ": "
              << (col == 2 ? "relative error |Ŵ − W| / |W − W_now|"
                           : "cosine of predicted and actual change")
              << "'\nset ylabel '" << (col == 2 ? "mean relative error" : "mean cosine")
              << "'\nplot ";
        for (std::size_t b = 0; b < blocks.size(); ++b) {
          const std::size_t i = blocks[b].second;
          plots << (b ? ", \\\n  " : "") << "'sweep-prediction.csv' index " << blocks[b].first
                << " using 1:" << col << " with linespoints lw 2 lc " << i + 1 << " pt " << i + 1
                << " title '" << remedies[i].label() << "'";
        }
        plots << '\n';
      }
    }
  if (pblock == 0) return;  // nothing measured
  write_file_atomically(dir_ / "sweep-prediction.csv", pred.str());
  const std::size_t panels_p = rows * cols;
  std::ostringstream pg;
  const std::string psetup = "set multiplot layout " + std::to_string(panels_p) +
                             ",2 title 'Prediction error versus staleness s (last epoch, pooled "
                             "over K, stages and seeds), model " +
                             plan_.model + "'\n";
  pg << "# The staleness sweep's prediction error versus s per remedy, from sweep-prediction.csv.\n"
        "# Restyle freely; run from this directory with: gnuplot sweep-prediction.gp\n"
        "set encoding utf8\nset datafile separator ','\nset termoption noenhanced\n"
        "set key outside right top\nset xlabel 'staleness s (steps)'\nset grid\n"
        "set offsets graph 0.05, graph 0.05, graph 0.05, graph 0.05\n"
     << "set terminal svg size 1500," << 380 * panels_p + 60
     << " dynamic background rgb 'white'\nset output 'sweep-prediction.svg'\n"
     << psetup << plots.str() << "unset multiplot\n"
     << "set terminal pngcairo size 1500," << 380 * panels_p + 60
     << "\nset output 'sweep-prediction.png'\n"
     << psetup << plots.str() << "unset multiplot\n";
  write_file_atomically(dir_ / "sweep-prediction.gp", pg.str());
}

bool SweepFiles::draw(const std::string& script) const {
  const std::string stem = script.substr(0, script.size() - 3);  // less ".gp"
  const std::string gnuplot = find_program("gnuplot");
  if (gnuplot.empty()) {
    std::fprintf(stderr,
                 "xpipe-train: gnuplot not found (Debian: gnuplot-nox); run 'gnuplot %s' in %s "
                 "to draw the plots\n",
                 script.c_str(), dir_.c_str());
    return false;
  }
  if (const std::string why = run_program(gnuplot, {"gnuplot", script}, dir_); !why.empty()) {
    std::fprintf(stderr, "xpipe-train: gnuplot %s; no plot drawn (%s is in %s)\n", why.c_str(),
                 script.c_str(), dir_.c_str());
    return false;
  }
  for (const std::string& name : {stem + ".svg", stem + ".png"})
    if (!non_empty(name)) {
      std::fprintf(stderr, "xpipe-train: gnuplot left %s empty or missing in %s\n", name.c_str(),
                   dir_.c_str());
      return false;
    }
  return true;
}

std::string SweepFiles::finish_files() {
  if (!csv_ && !runs_.empty()) {  // no run finished an epoch: the sweep's result all the same
    start();
    for (const SweepRun& r : runs_) csv_->append(row(r));
    write_summaries();
  }
  std::vector<std::string> names{"sweep-runs.csv", "sweep.csv",     "sweep.json",
                                 "sweep.md",       "sweep-gap.csv", "sweep-gap.gp"};
  if (plot()) names.insert(names.end(), {"sweep-gap.svg", "sweep-gap.png"});
  if (non_empty("sweep-prediction.gp")) {
    names.insert(names.end(), {"sweep-prediction.csv", "sweep-prediction.gp"});
    if (draw("sweep-prediction.gp"))
      names.insert(names.end(), {"sweep-prediction.svg", "sweep-prediction.png"});
  }
  std::string written;
  for (const std::string& name : names)
    if (non_empty(name)) written += (written.empty() ? "" : ", ") + name;
  return written;
}

bool SweepFiles::plot() const {
  bool any = false;
  for (const SweepCell& c : summarize(runs_, plan_.epochs))
    any = any || (!c.gap.empty() && c.gap.back().n > 0);
  if (!any) {
    std::fprintf(stderr,
                 "xpipe-train: no remedy has a finished run paired with a finished GPipe run, so "
                 "there is no gap plot\n");
    return false;
  }
  return draw("sweep-gap.gp");
}

bool SweepFiles::non_empty(const std::string& name) const {
  std::error_code ec;
  const auto size = fs::file_size(dir_ / name, ec);
  return !ec && size > 0;
}

void SweepFiles::print_table() const {
  const std::vector<SweepCell> cells = summarize(runs_, plan_.epochs);
  std::printf(
      "\nStaleness sweep, model %s, %d epoch(s) of %ld samples, batch %ld, tested on %ld "
      "samples.\nTest accuracy (%%) per epoch, mean over the seeds that finished, ± sd of the "
      "last epoch (n: seeds);\ngap: last epoch minus GPipe with the same seed (points, mean ± sd "
      "over the pairs).\n",
      plan_.model.c_str(), plan_.epochs, plan_.train_samples, plan_.batch, plan_.test_samples);
  std::string opt;
  int m = -1;
  for (const SweepCell& c : cells) {
    const SweepPoint& p = c.point;
    if (p.optimizer != opt || p.micro_batches != m) {
      opt = p.optimizer;
      m = p.micro_batches;
      std::printf("\n%s (lr %g), M = %d\n%3s  %-26s %-28s %-4s %-18s %9s  %s\n", opt.c_str(), p.lr,
                  m, "K", "remedy", "test accuracy", "n", "gap to GPipe", "samples/s",
                  "weights per stage");
    }
    std::string acc;
    for (const Stat& s : c.accuracy) {
      if (s.n == 0) continue;
      char buf[16];
      std::snprintf(buf, sizeof buf, "%.2f", s.mean);
      acc += (acc.empty() ? "" : " / ") + std::string(buf);
    }
    std::string note;
    if (c.ok < c.runs) {
      std::ostringstream n;
      const std::pair<int, const char*> counts[] = {{c.diverged, "diverged"},
                                                    {c.not_run, "not run"},
                                                    {c.failed, "failed"},
                                                    {c.interrupted, "interrupted"}};
      for (const auto& [count, what] : counts)
        if (count > 0) n << (n.str().empty() ? "" : ", ") << count << " " << what;
      note = n.str() + ": " + c.why;
      if (note.size() > 90) note = note.substr(0, 87) + "...";
    }
    if (c.ok == 0) {
      std::printf("%3d  %-26s %s\n", p.stages, p.label().c_str(), note.c_str());
      continue;
    }
    const Stat& last = c.accuracy.back();
    if (!std::isnan(last.sd)) {
      char buf[16];
      std::snprintf(buf, sizeof buf, " ± %.2f", last.sd);
      acc += buf;
    }
    std::printf("%3d  %-26s %s %-4d %s %9.0f  %s%s%s\n", p.stages, p.label().c_str(),
                pad(acc, 28).c_str(), last.n,
                pad(c.gap.empty() ? "(baseline)" : mean_sd(c.gap.back(), "+"), 18).c_str(),
                c.samples_per_second.mean, slashed(c.weight_copies).c_str(),
                note.empty() ? "" : "  ", note.c_str());
  }
  std::fflush(stdout);
}

}  // namespace xpipe::tools
