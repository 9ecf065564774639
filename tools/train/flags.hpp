// xpipe-train's command line: the flags (CLI11), what each one sets, and the checks of a single
// flag's value. The checks of flags together are in xpipe_train.cpp, beside the model table.
#pragma once

#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <system_error>
#include <vector>

#include "../number_flags.hpp"
#include "../sweep.hpp"
#include "../train_run.hpp"

namespace xpipe::tools::train {

// What the flags set. CLI11 keeps references into it, so it stays where add_flags saw it.
struct Flags {
  Flags() = default;
  Flags(const Flags&) = delete;
  Flags& operator=(const Flags&) = delete;

  RunConfig config;      // the run, or the base of the study's and the sweep's runs
  std::string data_dir;  // empty: the model's data in its default place
  std::string out_dir = "xpipe-out";
  bool compare = false;
  long train_samples = 0, test_samples = 0;
  float sgd_lr = 0.05f;
  std::vector<std::string> predictor_params;  // key=value, checked once the predictors are known
  // --sweep and its flags (docs/guide.md, "The staleness sweep"); a list flag is checked after
  // parsing, when --model (which decides the stage counts there are) is known.
  tools::SweepPlan plan;
  bool sweep = false;
  std::string sweep_stages, sweep_micro_batches = "1,4", sweep_predictors,
                            sweep_schedules = "async-1f1b", sweep_optimizers = "adam,sgd";
};

// A library name list (schedule_names, ...) as strings.
inline std::vector<std::string> name_list(const auto& list) {
  return std::vector<std::string>(list.begin(), list.end());
}

// --lr-schedule: text that LearningRateSchedule::parse takes; "" when it does, else its message
// (which quotes the text and says what is expected).
inline std::string check_lr_schedule(std::string& text) {
  try {
    LearningRateSchedule::parse(text);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// --seed: a whole number from 0 to 2^64 - 1 ("-1" is not quietly taken as 2^64 - 1).
inline std::string check_seed(std::string& text) {
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    return "'" + text + "' is not a whole number from 0 to " +
           std::to_string(std::numeric_limits<std::uint64_t>::max());
  return "";
}

// Defines every flag of xpipe-train on `app`, each setting its field of `f`.
inline void add_flags(CLI::App& app, Flags& f) {
  RunConfig& c = f.config;
  app.option_defaults()->always_capture_default();  // --help shows each flag's default
  // --lr and --sgd-lr: below 1e-8 a step is under half a float32 ulp of any weight above 0.17
  // (ulp(1) = 1.2e-7), so nothing would train; above 10 nothing here trains either (Adam at lr 1
  // already leaves the MLP at chance with a loss of 1e9).
  const CLI::Validator learning_rate =
      decimal_in(1e-8, 10, "[1e-8, 10], the learning rates that can train");
  app.add_option("--model", c.model,
                 "Model: mlp (784-1024-1024-1024-10), deep (784-512x7-10), vgg (a VGG-style "
                 "CNN: 2x(conv, conv, max pool), 128, 10), resnet (ResNet-20-style, BatchNorm) "
                 "or gpt (a byte-level GPT on the fortunes text: 8 blocks, width 64, 4 heads, "
                 "sequences of 128; a row is a token)")
      ->check(CLI::IsMember({"mlp", "deep", "vgg", "resnet", "gpt"}));
  app.add_option(
         "--stages,-K", c.stages,
         "Pipeline stages K (mlp: 1, 2, 4; deep: 2, 4, 8; vgg: 1, 2, 4; resnet, gpt: 1, 2, 4, "
         "8)")
      ->check(CLI::Range(1, 64));
  app.add_option("--micro-batches,-M", c.micro_batches, "Micro-batches per mini-batch M")
      ->check(CLI::Range(1, 1024));
  // The name lists come from the library, so a new schedule or predictor needs no edit here.
  app.add_option("--schedule", c.schedule, "Schedule: " + join_names(schedule_names))
      ->check(CLI::IsMember(name_list(schedule_names)));
  app.add_option("--predictor", c.predictor, "Weight predictor: " + join_names(predictor_names))
      ->check(CLI::IsMember(name_list(predictor_names)));
  app.add_option("--augment-pad", c.augment.pad,
                 "Training augmentation: random crop after padding by this many zero pixels "
                 "(0 = none), drawn per sample from the seed and epoch")
      ->check(CLI::Range(0, Augment::max_pad));
  app.add_flag("--augment-flip", c.augment.flip,
               "Training augmentation: mirror each image left-right with probability 1/2");
  app.add_option("--predictor-param", f.predictor_params,
                 "A predictor's hyper-parameter, key=value (repeatable), e.g. momentum=0.95 "
                 "(pipenag, pipenag-k), gamma (2bw-ef), anneal_steps (pipemare), max_steps "
                 "(multistep), interval and predict (paci), lambda and mean_square (dc-asgd); "
                 "applied to each predictor run that has the key");
  app.add_option("--optimizer", c.optimizer,
                 "Optimizer (sgd has momentum 0.9): " + join_names(optimizer_names))
      ->check(CLI::IsMember(name_list(optimizer_names)));
  app.add_option("--lr", c.lr, "Learning rate")->check(learning_rate);
  app.add_option_function<std::string>(
         "--lr-schedule",
         [&c](const std::string& text) { c.lr_schedule = LearningRateSchedule::parse(text); },
         "Learning rate from --lr (and --sgd-lr): per epoch, constant, cosine (annealed towards "
         "0 over --epochs) or step:E1,E2,... (a tenth after each of these epochs), as "
         "PyTorch's CosineAnnealingLR and MultiStepLR stepped per epoch; or per optimizer step, "
         "warmup-cosine:W (linear warmup over W steps, then a cosine decay to a tenth at the "
         "run's last step; the predictors extrapolate with the rates of the steps they predict)")
      ->check(
          CLI::Validator(check_lr_schedule, "constant, cosine, step:E1,E2,... or warmup-cosine:W"))
      ->default_str("constant");
  app.add_option("--clip-norm", c.clip_norm,
                 "Global gradient-norm clipping: before each step, scale every stage's gradient "
                 "by min(1, C / (|g| + 1e-6)), |g| the norm over all stages (0: off; every "
                 "executor and --device)")
      ->check(decimal_in(0, 1e6, "[0, 1e6] (0: no clipping)"));
  app.add_option("--batch", c.batch,
                 "Mini-batch size in rows (the gpt's rows are tokens: a multiple of its "
                 "128-token sequences; default 2048, 16 sequences)")
      ->check(CLI::Range(1L, 1000000L));
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
      ->check(decimal_in(0.1, 86400, "[0.1, 86400] seconds"));  // NaN: no deadline
  auto* device_opt =
      app.add_option(
             "--device", c.device,
             "host, or cuda: the mlp, vgg, resnet or gpt over 4 stages on CUDA devices (stage k "
             "on device k mod count), with any predictor; needs a build with CUDA and a device")
          ->check(CLI::IsMember({"host", "cuda"}));
  app.add_option("--threads", c.threads,
                 "Host threads of each stage (its GEMMs, convolutions and element loops; 1 by "
                 "default): e.g. -K 1 --threads 2 trains on two cores with one stage")
      ->check(CLI::Range(1, 256));
  app.add_option("--pin-cpus", c.pin_cpus,
                 "Pin stage k's thread to the (k mod n)-th of these CPUs (--executor threaded; "
                 "e.g. 0,1: with more stages than cores, each core then shares its own stages)")
      ->delimiter(',');
  app.add_option("--data-dir", f.data_dir,
                 "Directory of the four Fashion-MNIST .gz files (default: $XPIPE_DATA_DIR or "
                 "Debian's place); for the gpt, of the fortunes text files (default: "
                 "$XPIPE_TEXT_DIR or /usr/share/games/fortunes)");
  app.add_option("--out", f.out_dir,
                 "Output directory (CSV, JSON, plots, timelines), made before training and "
                 "updated as each run finishes");
  app.add_option("--train-samples", f.train_samples,
                 "Train on the first N samples only (0: all; the gpt's samples are tokens, cut "
                 "to whole sequences)")
      ->check(CLI::Range(0L, 100000000L));
  app.add_option("--test-samples", f.test_samples,
                 "Evaluate on the first N test samples (0: all; the gpt: tokens)")
      ->check(CLI::Range(0L, 100000000L));
  app.add_option(
         "--sgd-lr", f.sgd_lr,
         "Learning rate of the SGD runs of --compare (SpecTrain) and of --sweep (there 0.01 "
         "unless given)")
      ->check(learning_rate);
  app.add_flag("--compare", f.compare, "Run the study: every schedule x predictor on this model");
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
  const tools::SweepPlan& plan = f.plan;
  auto* sweep_flag = app.add_flag(
      "--sweep", f.sweep,
      "Run the staleness sweep: K x M x (GPipe and every predictor) x optimizer x seeds, on "
      "the deep model unless --model says otherwise; unless given, " +
          std::to_string(plan.epochs) + " epochs of " + std::to_string(plan.train_samples) +
          " samples, batch " + std::to_string(plan.batch) + " (the gpt: 2048 tokens), tested on " +
          std::to_string(plan.test_samples));
  sweep_flag->excludes("--compare");
  sweep_flag->excludes(device_opt);
  app.add_option("--sweep-stages", f.sweep_stages,
                 "Stage counts K of --sweep, a comma list (default: every split of the model "
                 "into 2 or more stages; deep: 2,4,8)")
      ->needs(sweep_flag);
  app.add_option("--sweep-micro-batches", f.sweep_micro_batches,
                 "Micro-batch counts M of --sweep, a comma list")
      ->needs(sweep_flag)
      ->capture_default_str();
  app.add_option("--sweep-predictors", f.sweep_predictors,
                 "Predictors (remedies) of --sweep, a comma list of " +
                     join_names(predictor_names) + " (default: all)")
      ->needs(sweep_flag);
  app.add_option("--sweep-schedules", f.sweep_schedules,
                 "Asynchronous schedules the remedies of --sweep run on, a comma list of " +
                     join_names(tools::sweep_schedule_choices) +
                     " (the 2bw and 2bw-ef remedies run on 2bw)")
      ->needs(sweep_flag)
      ->capture_default_str();
  app.add_option("--sweep-optimizers", f.sweep_optimizers,
                 "Optimizers of --sweep, a comma list of " + join_names(optimizer_names) +
                     " (sgd: momentum 0.9, at --sgd-lr)")
      ->needs(sweep_flag)
      ->capture_default_str();
  app.add_option("--seeds", f.plan.seeds, "Seeds of each --sweep configuration (1 to N)")
      ->check(CLI::Range(1, 100))
      ->needs(sweep_flag)
      ->capture_default_str();
}

}  // namespace xpipe::tools::train
