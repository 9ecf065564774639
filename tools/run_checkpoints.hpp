// xpipe-train's checkpoints: what a run saves beside the pipeline's state (its configuration as
// checkpoint fields, its finished epochs as records.tsv) and the checks made on --resume.
#pragma once

#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "xpipe/core/error.hpp"
#include "xpipe/pipeline/prediction_probe.hpp"

namespace xpipe::tools {

//! One finished epoch of a run, as the outputs report it.
struct EpochRecord {
  int epoch = 0;
  double loss = 0, test_accuracy = 0, samples_per_second = 0, seconds = 0;
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
//! stage, s, count, relative error and cosine), every number exact, so a resumed run reports its
//! earlier epochs as they were measured.
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
    out += "\n";
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
    std::string extra;
    if (!ls || (ls >> extra) || r.epoch != static_cast<int>(out.size()) + 1)
      throw CheckpointError("xpipe-train: " + where + ", line " + std::to_string(out.size() + 1) +
                            ": not an epoch record");
    out.push_back(r);
  }
  return out;
}

//! Refuses to resume a run whose configuration differs from the checkpoint's, naming the first
//! field that differs (the fields are those that change what the run computes).
inline void check_run_fields(const std::map<std::string, std::string>& saved,
                             const std::map<std::string, std::string>& now,
                             const std::string& where) {
  for (const auto& [key, value] : now) {
    const auto it = saved.find(key);
    if (it == saved.end())
      throw CheckpointError("xpipe-train: " + where + ": field '" + key + "' is missing");
    if (it->second != value)
      throw ConfigError("xpipe-train: cannot resume " + where + ": it was run with " + key + " = " +
                        it->second + ", this run has " + value);
  }
}

}  // namespace xpipe::tools
