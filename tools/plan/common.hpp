// What several xpipe-plan subcommands share: the usage error (exit 2), JSON input that names the
// field at fault, flag lists, the output folder and its files, and the planner's two-device check.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "../number_flags.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/schedule/generators.hpp"
#include "xpipe/sim/planner.hpp"

namespace xpipe::tools::plan {

using json = nlohmann::json;
namespace fs = std::filesystem;

//! Bad input (a flag, a JSON field): exit 2, the message naming it.
struct UsageError : Error {
  using Error::Error;
};

// ---- JSON in, every field named on error ------------------------------------------------------

//! The JSON file `path`; UsageError naming `what` (the flag) if it cannot be opened or parsed.
json read_json(const std::string& path, const std::string& what);

//! obj[key], `where` naming obj in the message if obj is no object or lacks key.
const json& member(const json& obj, const std::string& where, const char* key);

//! obj[key] as a finite number >= lo; `fallback` if key is missing (else UsageError).
double number(const json& obj, const std::string& where, const char* key,
              std::optional<double> fallback = std::nullopt, double lo = 0);

//! obj[key] as a string; `fallback` if key is missing.
std::string text(const json& obj, const std::string& where, const char* key, std::string fallback);

//! The layers of model JSON `j` read from `file` (xpipe-plan profile writes one).
std::vector<sim::LayerSpec> model_from(const json& j, const std::string& file);

// ---- flags ------------------------------------------------------------------------------------

//! The schedules a subcommand may be given (schedule_names), in the order --help lists them.
inline const std::vector<std::string> schedule_choices(schedule_names.begin(),
                                                       schedule_names.end());

//! The comma-separated whole numbers >= lo in `csv`; UsageError naming `flag` otherwise.
std::vector<int> parse_ints(const std::string& flag, const std::string& csv, int lo);

// ---- output -----------------------------------------------------------------------------------

//! Makes the --out folder `out` ready for writing, if one was given; UsageError if it cannot be.
void prepare_out(const std::string& out);
//! --out naming a file (profile's model JSON, measure-efficiency's E(B) file): its folder made
//! and checked writable, and the file no folder, before any measuring; UsageError naming it.
void prepare_out_file(const fs::path& file);

//! Writes `body` to dir/name atomically and says so on stdout.
void write_out(const fs::path& dir, const std::string& name, const std::string& body);

//! The cores and load average of this machine, for the record of a measurement.
std::string machine_note();

// ---- check-plan and check-mpi -----------------------------------------------------------------

//! The flags check-plan and check-mpi share: the model JSON, the batch per replica, the steps of
//! a run and the runs (medians).
struct StepCheckFlags {
  std::string model;
  int batch = 128, mini_batches = 16, repeats = 3;
};
//! Adds --model, --batch, --mini-batches and --repeats to `cli`, into `f`.
void add_step_check_flags(CLI::App* cli, StepCheckFlags& f);

//! What the checks ask the planner: the plans for up to 2 devices of one core each (as much
//! memory as needed, a flat E(B): step times only) at b rows per replica and M in {1, 2, 4}.
sim::PlanRequest two_device_request(const std::string& model_file, int b);

}  // namespace xpipe::tools::plan
