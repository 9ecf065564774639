// xpipe-train: trains a pipeline on Fashion-MNIST with the schedule, predictor, optimizer and
// shape chosen by flags, or (--compare) runs the study of every schedule x predictor.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "sweep.hpp"
#include "train/flags.hpp"
#include "train/study_files.hpp"
#include "train_run.hpp"
#include "xpipe/xpipe.hpp"
#if defined(XPIPE_WITH_MPI)
#include "xpipe/exec/mpi.hpp"
#endif

namespace fs = std::filesystem;
using namespace xpipe;

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
      {{"mlp", 1}, run_mlp1},       {{"mlp", 2}, run_mlp2},       {{"mlp", 4}, run_mlp4},
      {{"deep", 2}, run_deep2},     {{"deep", 4}, run_deep4},     {{"deep", 8}, run_deep8},
      {{"vgg", 1}, run_vgg1},       {{"vgg", 2}, run_vgg2},       {{"vgg", 4}, run_vgg4},
      {{"resnet", 1}, run_resnet1}, {{"resnet", 2}, run_resnet2}, {{"resnet", 4}, run_resnet4},
      {{"resnet", 8}, run_resnet8}, {{"gpt", 1}, run_gpt1},       {{"gpt", 2}, run_gpt2},
      {{"gpt", 4}, run_gpt4},       {{"gpt", 8}, run_gpt8},
  };
  return table;
}

std::string available_models() {
  std::string s;
  for (const auto& [key, fn] : model_table())
    s += (s.empty() ? "" : ", ") + key.first + " with --stages " + std::to_string(key.second);
  return s;
}

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
                  "runs.csv, runs.json, accuracy.csv, loss.csv; 'gnuplot accuracy.gp' there draws "
                  "them");
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
  if (c.device == "cuda")  // main checked the model and stages (cuda_problem)
    return c.model == "vgg"      ? run_vgg4_cuda(c, data, check)
           : c.model == "resnet" ? run_resnet4_cuda(c, data, check)
           : c.model == "gpt"    ? run_gpt4_cuda(c, data, check)
                                 : run_mlp4_cuda(c, data, check);
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
      "xpipe-train: staleness sweep, model %s, %zu runs (K %s x M %s x (%zu remedies and GPipe) x "
      "%zu optimizers x %d seeds), %d epoch(s) of %ld samples, batch %ld; results go to %s as "
      "each run ends\n",
      plan.model.c_str(), planned.size(),
      joined(std::vector<double>(plan.stages.begin(), plan.stages.end()), "%.0f").c_str(),
      joined(std::vector<double>(plan.micro_batches.begin(), plan.micro_batches.end()), "%.0f")
          .c_str(),
      tools::sweep_remedies(plan).size(), plan.optimizers.size(), plan.seeds, plan.epochs,
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

// ---- Flags that cannot run together: usage errors (exit 2), found before any work ----

// --predictor-param key=value (repeatable): each key must be a hyper-parameter of at least one of
// the predictors the command runs, and its value one that every such predictor accepts. Fills
// c.predictor_params; returns what is wrong ("" when nothing is).
std::string check_predictor_params(const std::vector<std::string>& given,
                                   const std::vector<std::string>& predictors, RunConfig& c) {
  for (const std::string& text : given) {
    const auto eq = text.find('=');
    const std::string key = text.substr(0, eq);
    std::string value_text = eq == std::string::npos ? "" : text.substr(eq + 1);
    double value = 0;
    const auto [end, ec] =
        std::from_chars(value_text.data(), value_text.data() + value_text.size(), value);
    if (eq == std::string::npos || key.empty() || value_text.empty() || ec != std::errc() ||
        end != value_text.data() + value_text.size())
      return "'" + text + "' is not key=number (e.g. momentum=0.95)";
    std::vector<std::string> keys;  // of the predictors in use, for the message
    bool used = false;
    for (const std::string& name : predictors) {
      AnyPredictor p = make_predictor(name);
      for (const std::string& k : p.hyper_names())
        if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
      if (!p.has_hyper_parameter(key)) continue;
      used = true;
      try {
        p.set(key, value);
      } catch (const ConfigError& e) {
        return e.what();
      }
    }
    if (!used)
      return "no predictor of this command (" + join_names(predictors) + ") has '" + key + "' (" +
             (keys.empty() ? std::string("they have no hyper-parameters")
                           : "they have: " + join_names(keys)) +
             ")";
    c.predictor_params.emplace_back(key, value);
  }
  return "";
}

// A usage error: said on stderr (unless `said_here` is false: another rank says it), exit 2.
int usage_error(const std::string& why, bool said_here = true) {
  if (said_here) std::fprintf(stderr, "xpipe-train: %s\n", why.c_str());
  return 2;
}

// The gpt's mini-batch counts tokens: 16 sequences of tools::gpt_context unless --batch says
// otherwise (a single run's, a study's and a sweep's alike).
constexpr long gpt_default_batch = 16L * tools::gpt_context;

// --sweep: refuses the single-run flags whose values a sweep sets itself, then fills f.plan from
// the sweep's flags and checks them. Returns what is wrong ("" when nothing is).
std::string check_sweep_flags(const CLI::App& app, Flags& f) {
  RunConfig& c = f.config;
  tools::SweepPlan& plan = f.plan;
  // What a sweep sets itself is not taken from the single-run flags.
  const std::pair<const char*, const char*> sweep_sets[] = {
      {"--stages", "--sweep-stages"},         {"--micro-batches", "--sweep-micro-batches"},
      {"--predictor", "--sweep-predictors"},  {"--schedule", "its remedies' schedules"},
      {"--optimizer", "--sweep-optimizers"},  {"--seed", "--seeds"},
      {"--checkpoint-dir", "no checkpoints"}, {"--checkpoint-every", "no checkpoints"},
      {"--resume", "no checkpoints"}};
  for (const auto& [flag, instead] : sweep_sets)
    if (app.count(flag) > 0)
      return std::string("--sweep does not take ") + flag + " (it uses " + instead + ")";
  if (c.executor != "threaded" && c.executor != "reference")
    return "--sweep runs on the threaded or reference executor";
  if (app.count("--model") == 0) c.model = plan.model;
  plan.model = c.model;
  // The sweep's sizes (SweepPlan's defaults) unless given.
  if (app.count("--train-samples") == 0) f.train_samples = plan.train_samples;
  if (app.count("--test-samples") == 0) f.test_samples = plan.test_samples;
  if (app.count("--epochs") == 0) c.epochs = plan.epochs;
  if (app.count("--batch") == 0 && c.model != "gpt") c.batch = plan.batch;  // (main set the gpt's)
  if (app.count("--sgd-lr") > 0) plan.sgd_lr = f.sgd_lr;
  plan.lr = c.lr;
  plan.lr_schedule = c.lr_schedule.text();
  plan.clip_norm = c.clip_norm;
  plan.epochs = c.epochs;
  plan.batch = c.batch;
  const std::vector<int> choices = sweep_stage_choices(plan.model);
  plan.stages = choices;  // the defaults, unless given
  plan.predictors = name_list(predictor_names);
  const std::pair<const char*, std::string> checks[] = {
      {"--sweep-stages", app.count("--sweep-stages") == 0
                             ? ""
                             : tools::parse_int_list(f.sweep_stages, choices, 0, 0, plan.stages)},
      {"--sweep-micro-batches",
       tools::parse_int_list(f.sweep_micro_batches, {}, 1, 1024, plan.micro_batches)},
      {"--sweep-predictors",
       app.count("--sweep-predictors") == 0
           ? ""
           : tools::parse_name_list(f.sweep_predictors, name_list(predictor_names),
                                    plan.predictors)},
      {"--sweep-schedules",
       tools::parse_name_list(f.sweep_schedules, tools::sweep_schedule_choices, plan.schedules)},
      {"--sweep-optimizers",
       tools::parse_name_list(f.sweep_optimizers, name_list(optimizer_names), plan.optimizers)}};
  for (const auto& [flag, why] : checks)
    if (!why.empty())
      return std::string(flag) + ": " + why +
             (std::string(flag) == "--sweep-stages" ? " (the splits of model " + plan.model + ")"
                                                    : "");
  for (int m : plan.micro_batches)
    if (m > c.batch)
      return "--sweep-micro-batches: " + std::to_string(m) + " exceeds --batch (" +
             std::to_string(c.batch) + ")";
  c.stages = plan.stages.front();  // a split that exists, for the checks below
  c.micro_batches = plan.micro_batches.front();
  return "";
}

// The flags that say nothing to this command: --compare's fixed pairs set their own schedule,
// predictor and optimizer; --sgd-lr is the rate of a study's or a sweep's SGD runs (a single run
// takes --lr). Says which ("" when none), so none is silently ignored.
std::string ignored_flags(const CLI::App& app, const Flags& f) {
  if (f.compare)
    for (const char* flag : {"--schedule", "--predictor", "--optimizer"})
      if (app.count(flag) > 0)
        return std::string("--compare does not take ") + flag +
               " (it runs the study's fixed schedule, predictor and optimizer pairs, "
               "docs/guide.md, \"The study\"; --sweep runs others)";
  if (!f.compare && !f.sweep && app.count("--sgd-lr") > 0)
    return "--sgd-lr sets the SGD runs of --compare and --sweep; a single run takes --lr";
  return "";
}

// The predictors the command runs: --predictor, the sweep's remedies or the study's.
std::vector<std::string> predictors_in_use(const Flags& f) {
  std::vector<std::string> in_use = {f.config.predictor};
  if (f.sweep) in_use = f.plan.predictors;
  if (f.compare) {
    in_use.clear();
    for (const RunConfig& r : study_runs(f.config, true, f.sgd_lr))
      if (std::find(in_use.begin(), in_use.end(), r.predictor) == in_use.end())
        in_use.push_back(r.predictor);
  }
  return in_use;
}

// Why --device cuda cannot run `c` here ("" when it can).
std::string cuda_problem([[maybe_unused]] const RunConfig& c) {
#if defined(XPIPE_WITH_CUDA)
  if ((c.model != "mlp" && c.model != "vgg" && c.model != "resnet" && c.model != "gpt") ||
      c.stages != 4)
    return "runs the mlp, vgg, resnet or gpt over 4 stages only (got " + c.model + " over " +
           std::to_string(c.stages) + ")";
  if (c.executor == "mpi" && c.clip_norm > 0)
    return "cannot clip over MPI ranks yet (each stage's gradient norm stays on its GPU: no "
           "--clip-norm with --executor mpi)";
  if (c.measure_prediction)
    return "cannot measure predictions (weights in device memory: no --measure-prediction)";
  if (!c.pin_cpus.empty()) return "pins no threads (no --pin-cpus)";
  if (c.threads != 1) return "runs no host threads per stage (no --threads)";
  // Under mpirun each rank checks its own machine: the rank and host name the one without a GPU.
  std::string why = cuda_device_problem();
  if (!why.empty() && launched_ranks() > 0) {
    const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
    if (rank == nullptr) rank = std::getenv("PMI_RANK");
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    why = "rank " + std::string(rank != nullptr ? rank : "?") + " on host " + host + ": " + why;
  }
  return why;
#else
  return "this xpipe-train was built without CUDA (configure where nvcc is found, with "
         "-DXPIPE_ENABLE_CUDA=ON)";
#endif
}

// The first usage error of the flags ("" when there is none), and whether this process says it.
struct UsageProblem {
  std::string why;
  bool said_here = true;
};

// Why `c`'s schedule cannot be made for its stages and micro-batches, or cannot clip
// (clipping_problem, Pipeline::train's check); "" when it can. Said before any data is loaded.
std::string schedule_problem(const RunConfig& c) {
  try {
    const Schedule s = make_schedule(c.schedule, c.stages, c.micro_batches, 2);
    if (c.clip_norm > 0)
      if (const std::string why = clipping_problem(s); !why.empty()) return "--clip-norm: " + why;
  } catch (const ConfigError& e) {
    const std::string_view why = e.what(), prefix = "xpipe: ";
    return std::string(why.starts_with(prefix) ? why.substr(prefix.size()) : why);
  }
  return "";
}

// Flag combinations that cannot run are usage errors too (exit 2), found before any work; the
// first found, in this order, is the one named. Fills f.config.predictor_params.
UsageProblem usage_problem(Flags& f) {
  RunConfig& c = f.config;
  if (!model_table().contains({c.model, c.stages}))
    return {"no compiled model '" + c.model + "' over " + std::to_string(c.stages) +
            " stages (available: " + available_models() + ")"};
  if (c.micro_batches > c.batch)
    return {"--micro-batches (" + std::to_string(c.micro_batches) + ") exceeds --batch (" +
            std::to_string(c.batch) + ")"};
  if (c.model == "gpt") {  // rows are tokens; a micro-batch holds whole sequences
    const index_t seqs = c.batch / tools::gpt_context;
    if (c.batch % (static_cast<index_t>(tools::gpt_context) * c.dp) != 0)
      return {"--batch " + std::to_string(c.batch) + ": the gpt trains on whole sequences of " +
              std::to_string(tools::gpt_context) +
              " tokens (a row each), so --batch must be a multiple " + "of " +
              std::to_string(tools::gpt_context * c.dp) + " (e.g. " +
              std::to_string(16 * tools::gpt_context * c.dp) + ")"};
    if (c.micro_batches > seqs / c.dp)
      return {"--micro-batches (" + std::to_string(c.micro_batches) + ") exceeds the " +
              std::to_string(seqs / c.dp) + " sequences of a mini-batch" +
              (c.dp > 1 ? " on each replica" : "")};
    // Each replica's part of each micro-batch in whole sequences, as many for every replica.
    if (c.dp > 1 && seqs % (c.dp * c.micro_batches) != 0)
      return {"--dp " + std::to_string(c.dp) + " with --micro-batches " +
              std::to_string(c.micro_batches) + ": the gpt's " + std::to_string(seqs) +
              " sequences a mini-batch must split evenly into " +
              std::to_string(c.dp * c.micro_batches) + " whole-sequence parts"};
    if (!c.augment.identity()) return {"--augment-pad/--augment-flip: the gpt trains on text"};
  }
  if (const std::string why = check_predictor_params(f.predictor_params, predictors_in_use(f), c);
      !why.empty())
    return {"--predictor-param: " + why};
  // A single run only: a study records a run it cannot start as failed and goes on (2BW with
  // M < K), and a sweep reports such a cell as refused.
  if (!f.sweep && !f.compare)
    if (const std::string why = schedule_problem(c); !why.empty())
      return {"--schedule " + c.schedule + " with -K " + std::to_string(c.stages) + " -M " +
              std::to_string(c.micro_batches) + ": " + why};
  if (!f.data_dir.empty()) {
    std::error_code ec;
    const std::filesystem::file_status st = std::filesystem::status(f.data_dir, ec);
    if (st.type() == std::filesystem::file_type::not_found)
      return {"--data-dir '" + f.data_dir + "': no such folder"};
    if (ec) return {"--data-dir '" + f.data_dir + "': cannot be read: " + ec.message()};
    if (!std::filesystem::is_directory(st))
      return {"--data-dir '" + f.data_dir + "': is not a folder"};
  }
  // Started by mpirun as several ranks without --executor mpi, every rank would run the whole
  // study into the same --out.
  if (const int ranks = launched_ranks(); ranks > 1 && c.executor != "mpi") {
    const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
    if (rank == nullptr) rank = std::getenv("PMI_RANK");
    return {"started by mpirun as " + std::to_string(ranks) + " ranks, but --executor is " +
                c.executor +
                ": each rank would run the whole study into one --out. Pass --executor mpi "
                "(ranks = --dp x --stages), or run xpipe-train without mpirun",
            rank == nullptr || std::string(rank) == "0"};
  }
  if (c.resume && c.checkpoint_dir.empty()) return {"--resume needs --checkpoint-dir"};
  // --executor mpi: the launch must match the flags (usage errors, exit 2, named on rank 0).
  if (c.dp > 1 && c.executor != "mpi")
    return {"--dp " + std::to_string(c.dp) + " needs --executor mpi"};
  if (c.device == "cuda" && fitted_to_costs(c.schedule))
    return {"--schedule " + c.schedule +
            ": it is fitted to F, I and W costs profiled on the host's stages, and --device "
            "cuda does not profile its actions yet (zb-h2 is its order on equal costs)"};
  if (c.device == "cuda")
    if (const std::string why = cuda_problem(c); !why.empty()) return {"--device cuda: " + why};
  if (!c.pin_cpus.empty()) {
    if (c.executor != "threaded") return {"--pin-cpus needs --executor threaded"};
    if (c.threads != 1)
      return {"--pin-cpus with --threads " + std::to_string(c.threads) +
              ": a pinned stage thread's OpenMP threads would share its one CPU (pin with "
              "--threads 1)"};
    try {
      ThreadedExecutor probe;
      probe.cpus = c.pin_cpus;
      probe.check_cpus();
    } catch (const ConfigError& e) {
      return {std::string("--pin-cpus: ") + e.what()};
    }
  }
  return {};
}

// ---- Start-up: MPI, the folders, the data ----

// main's exit status when it must stop now (nullopt: it goes on).
using Exit = std::optional<int>;

// MPI under --executor mpi (start_mpi): finalized on every normal return from main, once the
// executor is gone.
struct MpiSession {
  MpiSession() = default;
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  ~MpiSession() {
#if defined(XPIPE_WITH_MPI)
    exec.reset();
    if (on) MPI_Finalize();
#endif
  }

  bool on = false;
#if defined(XPIPE_WITH_MPI)
  std::optional<MpiExecutor> exec;
#endif
};

#if defined(XPIPE_WITH_MPI)
// Why this MPI launch (`ranks`, the thread level `provided`) cannot run `c` ("" when it can).
std::string mpi_launch_problem(const RunConfig& c, int ranks, int provided) {
  // A rank per worker: a stage, or two under the schedules of two stages per worker.
  const int per_rank = stages_per_worker(c.schedule);
  const int pipeline = c.stages % per_rank == 0 ? c.stages / per_rank : c.stages;
  const std::string two =
      pipeline < c.stages ? " / 2 (--schedule " + c.schedule + ": two stages per rank)" : "";
  if (ranks != c.dp * pipeline)
    return std::to_string(ranks) + " ranks were launched, but --dp " + std::to_string(c.dp) +
           " x --stages " + std::to_string(c.stages) + two + " needs " +
           std::to_string(c.dp * pipeline) + " (mpirun -np " + std::to_string(c.dp * pipeline) +
           ")";
  if (c.batch % c.dp != 0)
    return "--dp " + std::to_string(c.dp) + " does not divide --batch " + std::to_string(c.batch) +
           " (each replica trains on batch / dp rows)";
  if (c.micro_batches > c.batch / c.dp)
    return "--micro-batches (" + std::to_string(c.micro_batches) + ") exceeds a replica's batch (" +
           std::to_string(c.batch / c.dp) + ")";
  if (provided < MPI_THREAD_SERIALIZED)
    return "this MPI library does not support MPI_THREAD_SERIALIZED";
  return "";
}
#endif

// --executor mpi: starts MPI, checks the launch against the flags (a usage error, named on rank
// 0) and makes the executor every run uses. Any other executor: nothing to do.
Exit start_mpi([[maybe_unused]] int& argc, [[maybe_unused]] char**& argv,
               [[maybe_unused]] const RunConfig& c, [[maybe_unused]] MpiSession& session) {
#if defined(XPIPE_WITH_MPI)
  if (c.executor != "mpi") return std::nullopt;
  int provided = 0, ranks = 0;
  mpi_default_tuning();
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);  // a worker thread trains
  session.on = true;
  under_mpi = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  MPI_Comm machine = MPI_COMM_NULL;  // the ranks sharing this machine (and its GPUs)
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, mpi_rank, MPI_INFO_NULL, &machine);
  MPI_Comm_rank(machine, &mpi_local_rank);
  MPI_Comm_free(&machine);
  if (const std::string why = mpi_launch_problem(c, ranks, provided); !why.empty())
    return usage_error("--executor mpi: " + why, mpi_rank == 0);
  session.exec.emplace(MPI_COMM_WORLD, c.dp);
  session.exec->wait_timeout = std::chrono::duration<double>(c.wait_timeout);
  mpi_executor = &*session.exec;
  if (mpi_rank != 0) {  // rank 0 prints and writes; the others stay quiet but for errors
    if (!std::freopen("/dev/null", "w", stdout)) return 1;
  }
#endif
  return std::nullopt;
}

// Rank 0's part of lock_folders: makes --out, --checkpoint-dir and every run's checkpoint folder
// and locks them, stopping at the first that fails (its message; "" when none does).
std::string prepare_and_lock(const Flags& f, tools::FolderLocks& locks) {
  const RunConfig& c = f.config;
  if (const std::string bad = tools::prepare_output_dir(f.out_dir); !bad.empty())
    return "--out '" + f.out_dir + "': " + bad;
  if (const std::string no =
          c.checkpoint_dir.empty() ? "" : tools::prepare_output_dir(c.checkpoint_dir);
      !no.empty())
    return "--checkpoint-dir '" + c.checkpoint_dir + "': " + no;
  if (std::string why = locks.take(f.out_dir, "--out"); !why.empty()) return why;
  for (const RunConfig& r : study_runs(c, f.compare, f.sgd_lr)) {
    const fs::path dir = run_checkpoint_dir(r);
    if (dir.empty()) continue;
    if (const std::string bad = tools::prepare_output_dir(dir); !bad.empty())
      return "--checkpoint-dir: the run folder '" + dir.string() + "' " + bad;
    if (std::string why = locks.take(dir, "the checkpoint folder"); !why.empty()) return why;
  }
  return "";
}

// An --out or --checkpoint-dir that cannot hold what the runs write is a usage error found now,
// not after hours of training. One writer per folder: --out and every run's checkpoint folder
// are locked before any data is read, and stay locked until the process ends. Under MPI rank
// 0 alone does both: it is the one that writes, and the others make no folder.
Exit lock_folders(const Flags& f, tools::FolderLocks& locks) {
  const std::string why = mpi_rank == 0 ? prepare_and_lock(f, locks) : "";
#if defined(XPIPE_WITH_MPI)
  if (f.config.executor == "mpi") {  // every rank stops when rank 0 could not lock
    int refused = why.empty() ? 0 : 1;
    MPI_Bcast(&refused, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (refused != 0 && mpi_rank != 0) return 2;
  }
#endif
  if (!why.empty()) return usage_error(why);
  return std::nullopt;
}

// Fashion-MNIST (the gpt: the fortunes text, data/text.hpp) from --data-dir or its default
// place, cut to --train-samples and --test-samples (rows: the gpt's are tokens, cut to whole
// sequences). Throws DataError naming a file it cannot read.
DatasetPair load_data(const Flags& f) {
  if (f.config.model != "gpt")  // only the kept images become floats
    return load_fashion_mnist(f.data_dir.empty() ? default_fashion_mnist_dir() : f.data_dir,
                              {.train = f.train_samples, .test = f.test_samples});
  DatasetPair data = load_text_corpus(tools::gpt_context,
                                      f.data_dir.empty() ? default_text_corpus_dir() : f.data_dir);
  if (f.train_samples > 0) data.train = head(data.train, f.train_samples);
  if (f.test_samples > 0) data.test = head(data.test, f.test_samples);
  return data;
}

// Too few rows for one mini-batch (a row per micro-batch of every replica), or a mini-batch
// larger than the rows: a usage error. Says why ("" when the rows fit).
std::string too_few_rows(const Flags& f, const DatasetPair& data) {
  const RunConfig& c = f.config;
  const int least_micro_batches =
      f.sweep ? *std::max_element(f.plan.micro_batches.begin(), f.plan.micro_batches.end())
              : c.micro_batches;
  // Rows come in groups (the gpt: sequences of 128 tokens); a micro-batch needs a whole one, and
  // --train-samples and --test-samples were cut to whole groups.
  const index_t group = data.train.group;
  const std::string unit =
      group > 1 ? " sequences of " + std::to_string(group) + " tokens" : " rows";
  if (data.test.count == 0)
    return "--test-samples: " + std::to_string(f.test_samples) +
           (group > 1 ? " tokens hold no whole sequence of " + std::to_string(group)
                      : std::string(" rows: nothing")) +
           " to evaluate on";
  if (data.train.count / group < static_cast<index_t>(least_micro_batches) * c.dp)
    return "--train-samples: " + std::to_string(static_cast<long>(data.train.count / group)) +
           unit + " to train on" + (group > 1 ? " (cut to whole sequences)" : "") +
           ", but one mini-batch of " + std::to_string(least_micro_batches) + " micro-batches" +
           (c.dp > 1 ? " on each of " + std::to_string(c.dp) + " replicas" : std::string()) +
           " needs at least " + std::to_string(static_cast<long>(least_micro_batches) * c.dp);
  // Every buffer is sized for a whole mini-batch: a batch past the data would only take memory
  // (a --batch of a million rows ran the machine out of it).
  if (c.batch > data.train.count)
    return "--batch " + std::to_string(c.batch) + " exceeds the " +
           std::to_string(static_cast<long>(data.train.count)) + (group > 1 ? " tokens" : " rows") +
           " there are to train on (--train-samples): a mini-batch is at most all of them";
  return "";
}

// ---- The study ----

// Checkpoints are never overwritten: a run folder that holds some needs --resume. Says which
// ("" when none does).
std::string checkpoints_in_the_way(const std::vector<RunConfig>& runs) {
  for (const RunConfig& r : runs) {
    const fs::path dir = run_checkpoint_dir(r);
    if (dir.empty() || r.resume) continue;
    std::error_code ec;  // (the folder was made and locked above: it can be listed)
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
      if (tools::is_checkpoint_name(it->path().filename().string()))
        return dir.string() + " already holds checkpoints of " + r.label() +
               "; pass --resume to continue them or choose another --checkpoint-dir";
  }
  return "";
}

// Trains `runs` one after another, recording each in `files` as it ends. A signal stops the
// study at its next check point (stop_for_signal: exit 128 + signal).
void train_runs(const std::vector<RunConfig>& runs, const RunConfig& c, const DatasetPair& data,
                StudyFiles& files) {
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
}

// The files of the study that are there and not empty, for its last line.
std::string written_files(const StudyFiles& files, bool plotted) {
  std::vector<std::string> names{"runs.csv", "runs.json", "accuracy.csv", "loss.csv",
                                 "accuracy.gp"};
  if (plotted) names.insert(names.end(), {"accuracy.svg", "accuracy.png", "loss.svg", "loss.png"});
  std::string written;
  for (const std::string& name : names)
    if (files.non_empty(name)) written += (written.empty() ? "" : ", ") + name;
  if (files.any_trace_files())
    written +=
        ", and per finished run timeline-*.svg and trace-*.json (open in "
        "https://ui.perfetto.dev)";
  return written;
}

// The end of a study: its files finished, its table, the accuracy plot (rank 0) and what was
// written. Returns the exit status: 0, or 1 when the single run or every run of the study failed.
int finish_study(StudyFiles& files, const Flags& f) {
  const bool kept_earlier = !files.finish();
  print_table(files.records());
  const bool plotted = mpi_rank == 0 && !kept_earlier && files.plot();
  if (stop_signal != 0) stop_for_signal(files, "while plotting");
  const std::string written = written_files(files, plotted);
  if (!kept_earlier) std::printf("\nwrote to %s: %s\n", f.out_dir.c_str(), written.c_str());
  std::fflush(stdout);
  // A single run that did not finish is a failed command; a study reports it as a result,
  // unless every run failed (none could run: refused to resume, say).
  if (!f.compare && !files.records().front().ok()) {
    std::fprintf(stderr, "xpipe-train: %s %s: %s\n", f.config.label().c_str(),
                 to_string(files.records().front().status), files.records().front().why.c_str());
    return 1;
  }
  if (std::all_of(files.records().begin(), files.records().end(),
                  [](const RunRecord& r) { return r.status == RunStatus::failed; })) {
    std::fprintf(stderr, "xpipe-train: every run of the study failed (see above)\n");
    return 1;
  }
  return 0;
}

// The study (--compare) or the single run, on `data`, into f.out_dir (empty on MPI ranks other
// than 0). Returns the exit status (finish_study; 2 when a run's checkpoints are in the way,
// 128 + the signal that stopped it).
int run_study(const Flags& f, const DatasetPair& data) {
  const RunConfig& c = f.config;
  const std::vector<RunConfig> runs = study_runs(c, f.compare, f.sgd_lr);
  if (const std::string why = checkpoints_in_the_way(runs); !why.empty()) return usage_error(why);
  if (stop_signal != 0) {  // before the study starts, so a folder's earlier results stay
    std::fprintf(stderr, "xpipe-train: stopped by a signal before training; nothing written\n");
    return 128 + stop_signal;
  }
  StudyFiles files(f.out_dir, runs);
  std::printf(
      "xpipe-train: model %s over %d stages, M = %d, batch %ld, %d epochs, seed %lu; results "
      "go to %s as each run ends\n",
      c.model.c_str(), c.stages, c.micro_batches, c.batch, c.epochs,
      static_cast<unsigned long>(c.seed), f.out_dir.c_str());
  std::fflush(stdout);
  train_runs(runs, c, data, files);
  return finish_study(files, f);
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"xpipe-train: pipeline-parallel training on Fashion-MNIST and text"};
  add_flags(app, f);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return e.get_exit_code() == 0 ? code : 2;
  }
  if (f.config.model == "gpt" && app.count("--batch") == 0) f.config.batch = gpt_default_batch;
  if (f.sweep)
    if (const std::string why = check_sweep_flags(app, f); !why.empty()) return usage_error(why);
  if (const std::string why = ignored_flags(app, f); !why.empty()) return usage_error(why);
  if (const UsageProblem p = usage_problem(f); !p.why.empty())
    return usage_error(p.why, p.said_here);

  MpiSession mpi;  // finalizes MPI on every normal return from main
  if (const Exit e = start_mpi(argc, argv, f.config, mpi)) return *e;
  tools::FolderLocks locks;  // held until the process ends
  if (const Exit e = lock_folders(f, locks)) return *e;
  if (mpi_rank != 0) f.out_dir.clear();  // its study files are kept in memory only
  install_signal_handlers();

  try {
    const DatasetPair data = load_data(f);
    if (const std::string why = too_few_rows(f, data); !why.empty())
      return usage_error(why, mpi_rank == 0);
    // A checkpoint resumes on the data it was trained on only.
    if (!f.config.checkpoint_dir.empty()) {
      f.config.train_data_crc32 = data_crc32(data.train);
      f.config.test_data_crc32 = data_crc32(data.test);
    }
    if (f.sweep) {
      f.plan.train_samples = data.train.count;
      f.plan.test_samples = data.test.count;
      return run_sweep(f.config, f.plan, data, f.out_dir);
    }
    return run_study(f, data);
  } catch (const std::exception& e) {
    if (f.config.executor == "mpi") mpi_fail(e.what());
    std::fprintf(stderr, "xpipe-train: %s\n", e.what());
    return 1;
  }
}
