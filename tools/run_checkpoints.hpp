// xpipe-train's checkpoints: what a run saves beside the pipeline's state (its configuration as
// checkpoint fields, its finished epochs as records.tsv) and the checks made on --resume.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "xpipe/checkpoint/files.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/pipeline/prediction_probe.hpp"

namespace xpipe::tools {

//! One finished epoch of a run, as the outputs report it.
struct EpochRecord {
  int epoch = 0;
  double loss = 0, test_accuracy = 0, samples_per_second = 0, seconds = 0;
  // Mean cross-entropy on the test (validation) set, nats per row; NaN where not measured (an
  // epoch recorded by an older xpipe-train, a rank other than 0).
  double test_loss = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> bubble;                     // measured per stage
  std::vector<PredictionError> prediction_error;  // with --measure-prediction, per stage and s
};

inline std::string exact(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

//! records.tsv: a line per epoch (epoch, loss, test accuracy, samples/s, seconds, then the
//! bubble fraction of each stage, then the number of prediction-error entries and each entry's
//! stage, s, count, relative error and cosine, then the test loss), every number exact, so a
//! resumed run reports its earlier epochs as they were measured.
inline std::string records_text(const std::vector<EpochRecord>& epochs) {
  std::string out;
  for (const EpochRecord& r : epochs) {
    out += std::to_string(r.epoch) + "\t" + exact(r.loss) + "\t" + exact(r.test_accuracy) + "\t" +
           exact(r.samples_per_second) + "\t" + exact(r.seconds);
    for (double b : r.bubble) out += "\t" + exact(b);
    out += "\t" + std::to_string(r.prediction_error.size());
    for (const PredictionError& p : r.prediction_error)
      out += "\t" + std::to_string(p.stage) + "\t" + std::to_string(p.s) + "\t" +
             std::to_string(p.count) + "\t" + exact(p.mean_relative_error) + "\t" +
             exact(p.mean_cosine);
    out += "\t" + exact(r.test_loss) + "\n";
  }
  return out;
}

//! Reads records_text back; CheckpointError naming `where` and the line when malformed
//! (its checksum verified, so only a different writer could get here).
inline std::vector<EpochRecord> parse_records(const std::string& text, const std::string& where,
                                              int stages) {
  std::vector<EpochRecord> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    EpochRecord r;
    r.bubble.resize(static_cast<std::size_t>(stages));
    ls >> r.epoch >> r.loss >> r.test_accuracy >> r.samples_per_second >> r.seconds;
    for (double& b : r.bubble) ls >> b;
    std::size_t entries = 0;
    if (ls >> entries) {
      r.prediction_error.resize(entries > 4096 ? 0 : entries);
      for (PredictionError& p : r.prediction_error)
        ls >> p.stage >> p.s >> p.count >> p.mean_relative_error >> p.mean_cosine;
      if (entries > 4096) ls.setstate(std::ios::failbit);
    } else if (ls.eof()) {
      ls.clear(std::ios::eofbit);  // a record of an older xpipe-train: no entries
    }
    if (std::string loss; ls && !ls.eof()) {  // (written as %.17g: "nan" reads back too)
      if (ls >> loss) {
        char* end = nullptr;
        r.test_loss = std::strtod(loss.c_str(), &end);
        if (*end != '\0') ls.setstate(std::ios::failbit);
      } else if (ls.eof()) {
        ls.clear(std::ios::eofbit);  // a record of an older xpipe-train: no test loss (NaN)
      }
    }
    std::string extra;
    if (!ls || (ls >> extra) || r.epoch != static_cast<int>(out.size()) + 1)
      throw CheckpointError("xpipe-train: " + where + ", line " + std::to_string(out.size() + 1) +
                            ": not an epoch record");
    out.push_back(r);
  }
  return out;
}

//! "k=v,k=v" (a predictor's hyper_text) as a map; "" is the empty map.
inline std::map<std::string, std::string> key_values(const std::string& text) {
  std::map<std::string, std::string> out;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(at, end - at);
    const std::size_t eq = item.find('=');
    out[item.substr(0, eq)] = eq == std::string::npos ? "" : item.substr(eq + 1);
    at = end + 1;
  }
  return out;
}

//! What differs between a saved "k=v,..." list and this run's, key by key: a key the saved list
//! lacks was added to the predictor later and means its default there (`defaults`, the same
//! form), so an older checkpoint resumes. "" when they agree, else the first key that differs
//! (with why, where one side lacks it).
inline std::string key_value_difference(const std::string& saved, const std::string& now,
                                        const std::string& defaults) {
  const auto was = key_values(saved), is = key_values(now), fallback = key_values(defaults);
  for (const auto& [key, value] : was)
    if (!is.contains(key)) return key + " (which this run's predictor does not have)";
  for (const auto& [key, value] : is) {
    const auto it = was.find(key);
    const auto def = fallback.find(key);
    if (it == was.end() && def == fallback.end()) return key + " (which the checkpoint lacks)";
    if ((it != was.end() ? it->second : def->second) != value) return key;
  }
  return "";
}

//! Refuses to resume a run whose configuration differs from the checkpoint's, naming the first
//! field that differs (run.model and run.stages first, then by name; the fields are those that
//! change what the run computes: run.threads too, as the GEMMs' sums follow the thread count).
//! Fields that xpipe-train added later are missing from older checkpoints: run.dp and run.threads
//! mean 1 there, and the data's CRCs cannot be checked (said on stderr, and resumed). `defaults`
//! adds fields whose value in an older checkpoint depends on the run (run.predictor_params: the
//! predictor's default hyper-parameters); run.predictor_params is compared key by key, so a
//! checkpoint written before its predictor gained a hyper-parameter resumes when this run keeps
//! that parameter's default (which every added parameter's default must mean: the old behaviour).
inline void check_run_fields(const std::map<std::string, std::string>& saved,
                             const std::map<std::string, std::string>& now,
                             const std::string& where,
                             const std::map<std::string, std::string>& defaults = {}) {
  std::map<std::string, std::string> added_later{{"run.dp", "1"},
                                                 {"run.train_data_crc32", ""},
                                                 {"run.test_data_crc32", ""},
                                                 {"run.augment", "pad=0,flip=0"},
                                                 {"run.lr_schedule", "constant"},
                                                 {"run.clip_norm", "0"},
                                                 {"run.threads", "1"}};
  added_later.insert(defaults.begin(), defaults.end());
  // The model and its split first: a checkpoint of another model differs in much else too, and
  // its name is what says so.
  std::vector<std::pair<std::string, std::string>> order;
  for (const char* first : {"run.model", "run.stages"})
    if (const auto it = now.find(first); it != now.end()) order.emplace_back(*it);
  for (const auto& field : now)
    if (field.first != "run.model" && field.first != "run.stages") order.push_back(field);
  for (const auto& [key, value] : order) {
    const auto it = saved.find(key);
    const auto later = added_later.find(key);
    const bool data_crc = key == "run.train_data_crc32" || key == "run.test_data_crc32";
    if (it == saved.end() && data_crc) {
      std::fprintf(stderr,
                   "  %s: an older checkpoint without '%s': the data it was trained on cannot be "
                   "checked against this run's\n",
                   where.c_str(), key.c_str());
      continue;
    }
    if (it == saved.end() && later == added_later.end())
      throw CheckpointError("xpipe-train: " + where + ": field '" + key + "' is missing");
    const std::string& was = it != saved.end() ? it->second : later->second;
    if (key == "run.predictor_params" && was != value && later != added_later.end()) {
      if (const std::string what = key_value_difference(was, value, later->second); !what.empty())
        throw ConfigError("xpipe-train: cannot resume " + where + ": it was run with " + key +
                          " = " + was + ", this run has " + value + " (differs in " + what + ")");
      continue;
    }
    if (was != value)
      throw ConfigError("xpipe-train: cannot resume " + where + ": it was run with " + key + " = " +
                        was + ", this run has " + value);
  }
}

//! Whether `name` is that of a checkpoint folder as xpipe-train writes them: ckpt-<digits> (not
//! a set-aside ckpt-000002.refused).
inline bool is_checkpoint_name(const std::string& name) {
  return name.size() > 5 && name.rfind("ckpt-", 0) == 0 &&
         name.find_first_not_of("0123456789", 5) == std::string::npos;
}

//! For --resume: the newest checkpoint of the run folder `dir` that verifies, saying what it
//! passed over. Checkpoints that were committed but do not verify (a truncated or corrupt file,
//! an edited MANIFEST) are set aside by the process that writes checkpoints (`writer`), renamed
//! and never deleted, so that the epochs trained again can be saved under their names. When
//! none verifies, all are set aside and the run starts afresh: std::nullopt then, and when there
//! is none, said on stdout. CheckpointError when the folder cannot be listed.
inline std::optional<CheckpointContents> find_resumable_checkpoint(const std::filesystem::path& dir,
                                                                   const std::string& label,
                                                                   bool writer) {
  CheckpointScan scan = scan_checkpoints(dir);
  if (!writer) return std::move(scan.newest);  // (under MPI the others read what rank 0 says)
  for (const std::string& why : scan.skipped)
    std::fprintf(stderr, "  %s: passed over %s\n", label.c_str(), why.c_str());
  for (const std::filesystem::path& folder : scan.refused) {
    const std::filesystem::path kept = set_aside_checkpoint(folder);
    std::fprintf(stderr, "  %s: set aside %s as %s (kept; its epochs are trained again)\n",
                 label.c_str(), folder.c_str(), kept.filename().c_str());
  }
  if (!scan.newest)
    std::printf("  %-34s %s in %s; starting afresh\n", label.c_str(),
                scan.refused.empty() ? "no checkpoint to resume" : "no checkpoint verifies",
                dir.c_str());
  return std::move(scan.newest);
}

}  // namespace xpipe::tools
