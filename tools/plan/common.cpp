// The helpers several xpipe-plan subcommands share (common.hpp), compiled once.
#include "plan/common.hpp"

#include <cmath>
#include <cstdio>
#include <exception>
#include <fstream>
#include <sstream>
#include <thread>

#include "output_files.hpp"

namespace xpipe::tools::plan {

json read_json(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  if (!in) throw UsageError(what + ": cannot open '" + path + "'");
  try {
    return json::parse(in);
  } catch (const json::parse_error& e) {
    throw UsageError(what + " '" + path + "': malformed JSON: " + e.what());
  }
}

const json& member(const json& obj, const std::string& where, const char* key) {
  if (!obj.is_object()) throw UsageError(where + ": must be a JSON object");
  if (!obj.contains(key)) throw UsageError(where + "." + key + ": missing");
  return obj.at(key);
}

double number(const json& obj, const std::string& where, const char* key,
              std::optional<double> fallback, double lo) {
  if (!obj.is_object()) throw UsageError(where + ": must be a JSON object");
  if (!obj.contains(key)) {
    if (fallback) return *fallback;
    throw UsageError(where + "." + key + ": missing");
  }
  const json& v = obj.at(key);
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < lo)
    throw UsageError(where + "." + key + ": must be a finite number >= " + json(lo).dump() +
                     " (got " + v.dump() + ")");
  return v.get<double>();
}

std::string text(const json& obj, const std::string& where, const char* key, std::string fallback) {
  if (!obj.contains(key)) return fallback;
  if (!obj.at(key).is_string()) throw UsageError(where + "." + key + ": must be a string");
  return obj.at(key).get<std::string>();
}

std::vector<sim::LayerSpec> model_from(const json& j, const std::string& file) {
  const std::string where = "model '" + file + "'";
  const json& layers = member(j, where, "layers");
  if (!layers.is_array() || layers.empty())
    throw UsageError(where + ".layers: must be a non-empty array");
  std::vector<sim::LayerSpec> out;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const json& l = layers[i];
    const std::string at = where + ".layers[" + std::to_string(i) + "]";
    sim::LayerSpec s;
    s.name = text(l, at, "name", "layer " + std::to_string(i));
    s.params = number(l, at, "params");
    s.in_width = number(l, at, "in_width", std::nullopt, 1);
    s.out_width = number(l, at, "out_width", std::nullopt, 1);
    s.activation_floats = number(l, at, "activation_floats", 0.0);
    s.workspace_floats = number(l, at, "workspace_floats", 0.0);
    s.arena_floats = number(l, at, "arena_floats", 0.0);
    s.forward_flops = number(l, at, "forward_flops", 0.0);
    s.backward_flops = number(l, at, "backward_flops", 0.0);
    s.forward_fixed = number(l, at, "forward_fixed", 0.0);
    s.forward_per_sample = number(l, at, "forward_per_sample", 0.0);
    s.backward_fixed = number(l, at, "backward_fixed", 0.0);
    s.backward_per_sample = number(l, at, "backward_per_sample", 0.0);
    s.step_seconds = number(l, at, "step_seconds", 0.0);
    if (!s.measured() && (s.forward_flops <= 0 || s.backward_flops <= 0))
      throw UsageError(at +
                       ": needs measured times (forward_per_sample, backward_per_sample) or "
                       "forward_flops and backward_flops");
    out.push_back(s);
  }
  return out;
}

std::vector<int> parse_ints(const std::string& flag, const std::string& csv, int lo) {
  std::vector<int> v;
  std::stringstream ss(csv);
  for (std::string item; std::getline(ss, item, ',');) {
    std::size_t used = 0;
    int x = 0;
    try {
      x = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || item.empty() || x < lo)
      throw UsageError(flag + ": '" + item + "' is not a whole number >= " + std::to_string(lo));
    v.push_back(x);
  }
  if (v.empty()) throw UsageError(flag + ": empty list");
  return v;
}

void prepare_out(const std::string& out) {
  if (!out.empty())
    if (const std::string why = prepare_output_dir(out); !why.empty())
      throw UsageError("--out '" + out + "': " + why);
}

void prepare_out_file(const fs::path& file) {
  if (file.filename().empty())
    throw UsageError("--out '" + file.string() + "': names no file (give the file to write)");
  const fs::path dir = file.has_parent_path() ? file.parent_path() : fs::path(".");
  if (const std::string why = prepare_output_dir(dir); !why.empty())
    throw UsageError("--out '" + file.string() + "': its folder '" + dir.string() + "' " + why);
  std::error_code ec;
  if (fs::is_directory(file, ec))
    throw UsageError("--out '" + file.string() + "': is a folder (name the file to write)");
}

void write_out(const fs::path& dir, const std::string& name, const std::string& body) {
  write_file_atomically(dir / name, body);
  std::printf("  wrote %s\n", (dir / name).c_str());
}

std::string machine_note() {
  std::ifstream in("/proc/loadavg");
  std::string load;
  std::getline(in, load);
  return std::to_string(std::thread::hardware_concurrency()) + " cores, load average " + load;
}

sim::PlanRequest two_device_request(const std::string& model_file, int b) {
  sim::PlanRequest req;
  req.layers = model_from(read_json(model_file, "--model"), model_file);
  req.cluster.devices = 2;
  req.cluster.device = {.name = "one core", .memory_bytes = 1e12};
  req.efficiency = {{{1, 1}, {1e9, 1}}, "flat (step times only)"};
  req.dataset_samples = 1;
  req.batch_per_replica = {b};
  req.micro_batches = {1, 2, 4};
  return req;
}

void add_step_check_flags(CLI::App* cli, StepCheckFlags& f) {
  cli->add_option("--model", f.model, "model JSON of the reference MLP (xpipe-plan profile)")
      ->required();
  cli->add_option("--batch", f.batch, "per-replica batch")->check(CLI::Range(4, 1 << 16));
  cli->add_option("--mini-batches", f.mini_batches, "steps per run")->check(CLI::Range(2, 100000));
  cli->add_option("--repeats", f.repeats, "runs (medians)")->check(CLI::Range(1, 100));
}

}  // namespace xpipe::tools::plan
