// Pipeline<Stages..., Policies...>: K stages of a model, trained by running a schedule with an
// executor. The public face only; the pieces live beside it: arguments.hpp (sorting the
// template arguments), micro_batches.hpp (the row split), stage_runtime.hpp (what a stage
// owns), stage_program.hpp (what each action does), device_epoch.hpp (the epoch's upload, read-
// back and evaluation on a DeviceBackend).
// Over 400 lines because it is one class template: train, evaluate, the state accessors and
// prepare() share Pipeline's private members; what could stand alone already lives beside it.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "xpipe/data/dataset.hpp"
#include "xpipe/exec/executor.hpp"
#include "xpipe/layers/loss.hpp"
#include "xpipe/optim/variants.hpp"
#include "xpipe/pipeline/arguments.hpp"
#include "xpipe/pipeline/device_epoch.hpp"
#include "xpipe/pipeline/micro_batches.hpp"
#include "xpipe/pipeline/stage_program.hpp"
#include "xpipe/pipeline/stage_runtime.hpp"
#include "xpipe/schedule/staleness.hpp"

namespace xpipe {

//! Runtime choices of a Pipeline, with defaults. Usage: `PipelineOptions{.batch = 128}`.
struct PipelineOptions {
  index_t batch = 128;        // rows of a mini-batch
  int micro_batches = 4;      // M: micro-batches a mini-batch is split into
  std::uint64_t seed = 1;     // initialisation
  int threads_per_stage = 1;  // GEMM and element-loop threads of each stage
  //! Measure every weight prediction against the weights it aimed at (prediction_errors());
  //! costs two weight copies per prediction in flight and a pass per step. Host backends only.
  bool measure_prediction = false;
  //! Global gradient-norm clipping (0: off): before each step every stage scales its gradient
  //! by min(1, clip_norm / (|g| + 1e-6)), |g| the L2 norm of the whole pipeline's gradient of
  //! that mini-batch (torch.nn.utils.clip_grad_norm_). One reduction over the stages per step:
  //! a stage's Step waits until every stage has its gradient of that mini-batch, which an
  //! asynchronous schedule pays for in idle time (docs/guide.md, "Clipping"). On the host with
  //! every executor (MPI ranks exchange the norms); on a device, whose streams wait on each
  //! other's events (the host never waits for the device).
  float clip_norm = 0;
  //! GPU backends: stage k runs on device `devices[k % devices.size()]`; empty: on device
  //! k % (number of devices). `{0}` puts every stage on device 0 (one stream each).
  std::vector<int> devices = {};
};

//! What one train() call measured.
struct EpochResult {
  double loss = 0;  // mean training loss over the samples
  index_t samples = 0;
  double seconds = 0;
};

//! A pipeline of Stage<...> types followed by optional policies in any order: a Predictor
//! (default Latest), an Optimizer (Adam), a Backend (DefaultBackend: the host) and a
//! QueuePolicy (InProcessRing). Adjacent stage widths and every policy are checked at compile
//! time. Every buffer, stage context and link is made through the Backend and QueuePolicy.
//! Usage:
//!   `Pipeline<S0, S1, S2, S3, XPipe, AdamW> p(AdamW{.lr = 1e-3f}, {.batch = 128});`
//!   `p.train(async_1f1b(4, 4, n), epoch_data, executor);`
//! The predictor is a value too (its hyper-parameters; AnyPredictor's choice):
//!   `Pipeline<S0, S1, AnyPredictor, AnyOptimizer> q(opt, {}, make_predictor("pipenag"));`
template <class... Ts>
class Pipeline {
  using Args = detail::PipelineArguments<Ts...>;
  static_assert(Args::checked);

 public:
  using stages = typename Args::stages;
  using predictor = typename Args::predictor;
  using optimizer = typename Args::optimizer;
  using backend = typename Args::backend;
  using queue_policy = typename Args::queue_policy;
  using queue = typename queue_policy::template queue<backend>;
  static constexpr int stage_count = Args::stage_count;
  template <std::size_t K>
  using stage = typename Args::template stage<K>;
  static constexpr int in_width = stage<0>::in_width;
  static constexpr int out_width = stage<stage_count - 1>::out_width;
  //! Rows every micro-batch keeps together (a sequence's tokens, for causal attention): the
  //! least common multiple of the stages' row groups; batches split in whole groups.
  static constexpr index_t row_group = [] {
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return lcm_of({stage<I>::row_group...});
    }
    (std::make_index_sequence<stage_count>{});
  }();

  explicit Pipeline(optimizer opt = {}, PipelineOptions options = {}, predictor pred = {})
      : options_(options),
        predictor_(std::move(pred)),
        runtimes_(make_runtimes(opt, options, std::make_index_sequence<stage_count>{})) {
    if (options.batch < 1 || options.micro_batches < 1 || options.micro_batches > options.batch)
      throw ConfigError("xpipe: Pipeline: need 1 <= micro_batches <= batch (got " +
                        std::to_string(options.micro_batches) + " and " +
                        std::to_string(options.batch) + ")");
    if (options.batch % row_group != 0 || options.batch / row_group < options.micro_batches)
      throw ConfigError("xpipe: Pipeline: the model keeps rows together in groups of " +
                        std::to_string(row_group) + " (one sequence each): batch " +
                        std::to_string(options.batch) + " must be a multiple of it, with at " +
                        "least micro_batches = " + std::to_string(options.micro_batches) +
                        " groups");
    if (!(options.clip_norm >= 0.f) || !std::isfinite(options.clip_norm))
      throw ConfigError(
          "xpipe: Pipeline: clip_norm must be finite and >= 0 (0: no clipping), got " +
          detail::number_text(options.clip_norm));
    // Adjacent stages on different devices read and write each other's queue slots; under
    // global clipping every stage writes its norm to stage 0's device and reads all of them.
    if constexpr (on_device) {
      for (int k = 0; k + 1 < stage_count; ++k) connect(ctx_of(k), ctx_of(k + 1));
      if (options.clip_norm > 0.f)
        for (int k = 2; k < stage_count; ++k) connect(ctx_of(0), ctx_of(k));
    }
  }

  //! Whether the backend's buffers are device memory (a GPU): weights, slots and queues there,
  //! the epoch uploaded by train(), the loss summed there and read once per train() call. Such a
  //! backend must be a DeviceBackend (pipeline/device_backend.hpp names every member it needs).
  static constexpr bool on_device = !detail::reads_host_memory<typename backend::Context>;
  static_assert([] {
    if constexpr (on_device)
      return check_device_backend<backend>();
    else
      return true;
  }());

  const PipelineOptions& options() const { return options_; }
  //! The predictor's value: its hyper-parameters (AnyPredictor: which one was chosen).
  const predictor& predictor_policy() const { return predictor_; }

  //! Sets every stage's learning rate to lr, the other hyper-parameters, moments and step counts
  //! kept: call between train() calls (a schedule's rate for the next epoch). Predictors that read
  //! the optimizer's rate (XPipe, PipeOptim, PipeMare, ...) read the new one from the next step
  //! on. Checkpoints do not store the rate: whoever resumes sets it again (xpipe-train sets it
  //! from the epoch). ConfigError unless lr is finite and > 0.
  //! Usage: `p.set_learning_rate(schedule.at(lr, e, epochs)); p.train(s, data, executor);`
  void set_learning_rate(float lr) {
    check_learning_rate(lr, "Pipeline::set_learning_rate");
    for_each_stage(
        [&](auto& rt) { rt.opt.set_optimizer(with_learning_rate(rt.opt.optimizer(), lr)); });
  }
  //! Sets every stage's per-step rates (StepRates: warmup, then cosine decay) on top of the
  //! learning rate: the n-th step of each stage's optimizer takes lr * factor(n), and the
  //! predictors extrapolate with the rates of the steps they predict (OptimizerState::predict)
  //! and step remedies start from the next step's rate. Keyed by each stage's step count, which
  //! checkpoints restore: set them again before resuming, as the learning rate. A remedy that
  //! steps less often than once per mini-batch (AccumulateToBound) walks the schedule by its own
  //! steps. Between train() calls; ConfigError when they do not check.
  //! Usage: `p.set_step_rates(schedule.step_rates(epochs * p.mini_batches_for(rows)));`
  void set_step_rates(const StepRates& rates) {
    for_each_stage([&](auto& rt) { rt.opt.set_step_rates(rates); });
  }
  //! Stage 0's learning rate for its next step (that of every stage, unless a predictor or
  //! caller set them apart, or their step counts differ under StepRates).
  float learning_rate() const { return std::get<0>(runtimes_)->opt.optimizer().learning_rate(); }

  //! Mini-batches of `rows` rows that train() runs (a tail of fewer than M rows is dropped).
  index_t mini_batches_for(index_t rows) const { return split_for(rows).mini_batches(); }

  //! Trains over `data` following `schedule` (stages = K, micro_batches = options().micro_batches,
  //! mini_batches = mini_batches_for(data rows)), run by `executor`. Validates the schedule and
  //! derives every action's staleness first; allocation happens here, never inside the run.
  //! Throws DataError naming the row and mini-batch, before any action, if a label it would
  //! read lies outside [0, out_width) (on host backends, where `data` is host memory).
  template <Executor E>
  EpochResult train(const Schedule& schedule, EpochData data, E& executor) {
    prepare(schedule, data);
    RunProgram program{this};
    const auto t0 = std::chrono::steady_clock::now();
    if constexpr (on_device) {
      // The executor's host threads only enqueue; the device may still be running when it
      // returns. The one synchronisation of the run is here, after it (DeviceEpoch::finish).
      try {
        executor.run(program);
      } catch (...) {
        // Nothing may still read the staging buffer or the slots.
        DeviceEpoch<backend>::drain(contexts(), stage_count, false);
        throw;
      }
      // (An executor of several processes finished this process's part already: finish_here.)
      if (!finished_here_)
        device_.finish(contexts(), stage_count, schedule.total_micro_batches(), data, run_);
    } else {
      executor.run(program);
    }
    EpochResult r;
    r.seconds = detail::seconds_since(t0);
    double sum = 0;
    for (int g = 0; g < schedule.total_micro_batches(); ++g) sum += run_.micro_loss[g];
    r.samples = sample_count_;
    r.loss = sample_count_ > 0 ? sum / static_cast<double>(sample_count_) : 0.0;
    return r;
  }

  //! Fraction of `data` the live weights classify correctly (evaluation().accuracy).
  double evaluate(const Dataset& data) { return evaluation(data).accuracy; }

  //! The live weights' accuracy and mean cross-entropy (nats per row) on `data`, stages run one
  //! after another in chunks of options().batch rows, the logits read in host memory (copied
  //! back from a device). Throws DataError for a data set without rows, naming the first row of
  //! `data` holding NaN or an infinity (one pass over it first), which would pass for a
  //! prediction, or a label outside [0, out_width).
  //! Usage: `const Evaluation v = pipe.evaluation(data.test); std::printf("%f", v.loss);`
  Evaluation evaluation(const Dataset& data) {
    check_evaluation_data(data.matrix(), data.labels.data(), out_width,
                          "xpipe: Pipeline::evaluate");
    const index_t chunk = options_.batch;
    EvaluationSums sums(chunk, out_width, "xpipe: Pipeline::evaluate");
    if constexpr (on_device) {
      // The device reads the rows unchecked: the first layer's check (Embedding's ids) here.
      stage<0>::check_host_input(data.matrix(), "xpipe: Pipeline::evaluate");
      device_.evaluate(ctx_of(0), ctx_of(stage_count - 1), data, chunk, in_width, sums,
                       [&](ConstMatrix x) {
                         for_each_stage([&](auto& rt) {
                           detail::activate_context(rt.ctx());
                           x = rt.eval_forward(x);
                           synchronize(rt.ctx());  // the next stage's stream reads x
                         });
                         return x;
                       });
    } else {
      for (index_t first = 0; first < data.count; first += chunk) {
        const index_t rows = std::min(chunk, data.count - first);
        ConstMatrix x = data.matrix().slice_rows(first, rows);
        for_each_stage([&](auto& rt) { x = rt.eval_forward(x); });
        sums.add(std::get<stage_count - 1>(runtimes_)->ctx(), x, data.labels.data() + first, first);
      }
    }
    return sums.result();
  }

  //! Live weights of every stage, concatenated (for comparisons and checkpoints). On a device
  //! backend copied to the host after each stage's stream has finished its work.
  std::vector<float> weights() const {
    std::vector<float> out;
    for_each_stage([&](const auto& rt) {
      if constexpr (on_device) {
        const std::size_t at = out.size();
        out.resize(at + static_cast<std::size_t>(rt.opt.size()));
        detail::activate_context(rt.ctx());
        copy_to_host(rt.ctx(), rt.opt.weights(), out.data() + at, rt.opt.size());
      } else {
        out.insert(out.end(), rt.opt.weights(), rt.opt.weights() + rt.opt.size());
      }
    });
    return out;
  }

  //! Every stage's non-trainable state (BatchNorm running statistics), concatenated on the host;
  //! empty for a model without any.
  std::vector<float> running_state() const {
    std::vector<float> out;
    for_each_running_state_on([&](int, const float* state, index_t n, const auto& ctx) {
      const std::size_t at = out.size();
      out.resize(at + static_cast<std::size_t>(n));
      if constexpr (on_device)
        copy_to_host(ctx, state, out.data() + at, n);
      else
        std::copy(state, state + n, out.data() + at);
    });
    return out;
  }

  //! Calls f(k, state, n, ctx) for each stage k with non-trainable state: its n floats (on the
  //! backend) and its context, made current first. Between train() calls (checkpoints).
  template <class F>
  void for_each_running_state_on(F&& f) {
    int k = 0;
    for_each_stage([&](auto& rt) {
      using S = typename std::remove_cvref_t<decltype(rt)>::Stage;
      if constexpr (S::state_count > 0) {
        detail::activate_context(rt.ctx());
        f(k, rt.running.data(), S::state_count, rt.ctx());
      }
      ++k;
    });
  }
  template <class F>
  void for_each_running_state_on(F&& f) const {
    int k = 0;
    for_each_stage([&](const auto& rt) {
      using S = typename std::remove_cvref_t<decltype(rt)>::Stage;
      if constexpr (S::state_count > 0) {
        detail::activate_context(rt.ctx());
        f(k, rt.running.data(), S::state_count, rt.ctx());
      }
      ++k;
    });
  }

  //! Calls f(k, state) with stage k's OptimizerState (weights, moments, step count) for each k:
  //! between train() calls, the whole trained state (pipeline/checkpoint.hpp saves it). On a
  //! device backend its buffers are device memory: use for_each_optimizer_state_on to copy.
  template <class F>
  void for_each_optimizer_state(F&& f) {
    int k = 0;
    for_each_stage([&](auto& rt) { f(k++, rt.opt); });
  }
  template <class F>
  void for_each_optimizer_state(F&& f) const {
    int k = 0;
    for_each_stage([&](const auto& rt) { f(k++, rt.opt); });
  }
  //! As for_each_optimizer_state, with stage k's context as a third argument, made current
  //! first: what reads or writes a device backend's state between runs copies through it
  //! (copy_to_host / copy_from_host on that context; checkpoints do).
  template <class F>
  void for_each_optimizer_state_on(F&& f) {
    int k = 0;
    for_each_stage([&](auto& rt) {
      detail::activate_context(rt.ctx());
      f(k++, rt.opt, rt.ctx());
    });
  }
  template <class F>
  void for_each_optimizer_state_on(F&& f) const {
    int k = 0;
    for_each_stage([&](const auto& rt) {
      detail::activate_context(rt.ctx());
      f(k++, rt.opt, rt.ctx());
    });
  }

  //! Micro-batches whose loss the running (or last) train() call has computed, their samples
  //! and the sum of their losses: safe to read from another thread while train() runs (for
  //! progress bars).
  struct Progress {
    long micro_batches = 0, samples = 0;
    double loss_sum = 0;
  };
  Progress progress() const {
    return {progress_.micro_batches.load(std::memory_order_relaxed),
            progress_.samples.load(std::memory_order_relaxed),
            progress_.loss_sum.load(std::memory_order_relaxed)};
  }

  //! With PipelineOptions::measure_prediction: per stage and per s, how far the predictions of
  //! the last train() call were from the weights they aimed at (mean relative error, mean
  //! cosine of predicted and actual change); one entry per (stage, s) measured, stages in
  //! order. Empty for predictors that predict nothing (Latest, Stash, ...).
  std::vector<PredictionError> prediction_errors() const {
    std::vector<PredictionError> out;
    for_each_stage([&](const auto& rt) {
      if (rt.probe) rt.probe->append_to(out);
    });
    return out;
  }

  //! With PipelineOptions::clip_norm: the global gradient norm (before clipping) of each
  //! mini-batch of the last train() call, in order; empty without clipping. NaN for a mini-batch
  //! whose norm was not complete, and on a device for every one after a run that failed (the
  //! norms are read back only after a run that reached its end).
  std::vector<double> gradient_norms() const {
    std::vector<double> out;
    if (options_.clip_norm > 0.f)
      for (int t = 0; t < run_.norms.mini_batches(); ++t)
        out.push_back(run_.norms.complete(t) ? std::sqrt(run_.norms.total(t))
                                             : std::numeric_limits<double>::quiet_NaN());
    return out;
  }

  //! The staleness analysis of the last schedule trained.
  const StalenessAnalysis& analysis() const { return analysis_; }
  //! Weight buffers stage k's predictor held in the last run (live weights included); 0 before
  //! the first train() call.
  int weight_copies(int k) const { return copies_[k]; }
  //! Peak activation floats stage k held in the last run: its in-flight micro-batches, with what
  //! a split backward keeps between its halves, and once its layers' workspace for a batch
  //! (Stage::workspace_floats); 0 before the first train() call.
  index_t activation_floats(int k) const { return activation_floats_[k]; }
  //! Of those, the floats of stage k's workspace (Stage::workspace_floats for a batch): what its
  //! layers need only during a call, once whatever the slots.
  index_t workspace_floats(int k) const { return workspace_floats_[k]; }

 private:
  template <std::size_t K>
  using Runtime = StageRuntime<stage<K>, optimizer, predictor, backend>;

  struct NoDeviceEpoch {};

  template <std::size_t... I>
  static auto make_runtimes(optimizer opt, const PipelineOptions& o, std::index_sequence<I...>) {
    // Layer i of the model draws from seed sub-stream i whatever stage holds it (a Dense layer
    // counts as the two it stands for: Stage::seed_streams).
    constexpr std::array<std::size_t, stage_count> streams{stage<I>::seed_streams...};
    auto first = [&](std::size_t k) {
      std::size_t n = 0;
      for (std::size_t i = 0; i < k; ++i) n += streams[i];
      return n;
    };
    return std::tuple<std::unique_ptr<Runtime<I>>...>{std::make_unique<Runtime<I>>(
        opt, placement_of(static_cast<int>(I), o), o.batch, o.seed, first(I))...};
  }
  static Placement placement_of(int k, const PipelineOptions& o) {
    const int device =
        o.devices.empty() ? -1 : o.devices[static_cast<std::size_t>(k) % o.devices.size()];
    return Placement{k, o.threads_per_stage, device};
  }

  template <class F>
  void for_each_stage(F&& f) {
    std::apply([&](auto&... rt) { (f(*rt), ...); }, runtimes_);
  }
  template <class F>
  void for_each_stage(F&& f) const {
    std::apply([&](const auto&... rt) { (f(*rt), ...); }, runtimes_);
  }

  MicroBatching split_for(index_t rows) const {
    return {options_.batch, options_.micro_batches, rows, row_group};
  }

  void prepare(const Schedule& schedule, EpochData data) {
    const int K = stage_count;
    if (schedule.stages != K || schedule.micro_batches != options_.micro_batches)
      throw ConfigError("xpipe: Pipeline::train: schedule '" + schedule.name + "' has " +
                        std::to_string(schedule.stages) + " stages and " +
                        std::to_string(schedule.micro_batches) +
                        " micro-batches; the pipeline has " + std::to_string(K) +
                        " stages and micro_batches = " + std::to_string(options_.micro_batches));
    if (data.inputs.cols != in_width)
      throw ShapeError("xpipe: Pipeline::train: inputs have " + std::to_string(data.inputs.cols) +
                       " columns, stage 0 expects " + std::to_string(in_width));
    if (data.inputs.rows % row_group != 0)
      throw ShapeError("xpipe: Pipeline::train: " + std::to_string(data.inputs.rows) +
                       " rows are not whole groups of " + std::to_string(row_group) +
                       " (the model keeps a sequence's rows together)");
    const MicroBatching split = split_for(data.inputs.rows);
    if (schedule.mini_batches != split.mini_batches())
      throw ConfigError("xpipe: Pipeline::train: schedule '" + schedule.name + "' has " +
                        std::to_string(schedule.mini_batches) + " mini-batches; the data holds " +
                        std::to_string(split.mini_batches()) + " of batch " +
                        std::to_string(options_.batch));
    // Every label the run reads, once, before any action: a bad one fails here, weights
    // untouched, instead of reading outside its logits row in the last stage.
    // EpochData is host memory on every backend (a device backend uploads it below).
    const index_t used = std::min(data.inputs.rows, split.mini_batches() * options_.batch);
    if (const index_t r = first_bad_label(data.labels, used, out_width); r >= 0)
      throw DataError("xpipe: Pipeline::train: label " + std::to_string(data.labels[r]) +
                      " at row " + std::to_string(r) + " (mini-batch " +
                      std::to_string(r / options_.batch) + ") is outside 0.." +
                      std::to_string(out_width - 1));
    // A device reads the inputs unchecked: its first layer's check (Embedding's ids) here, on
    // the host, before anything is uploaded (the host's layers check as they read).
    if constexpr (on_device)
      stage<0>::check_host_input(data.inputs.slice_rows(0, used), "xpipe: Pipeline::train");
    analysis_ = analyze_staleness(schedule);  // validates
    // The stages whose list splits a backward into I and W: their layers must split, and their
    // slots keep what W needs (a stage that runs whole backwards needs neither).
    std::vector<bool> splits(static_cast<std::size_t>(K), false);
    for (int k = 0; k < K; ++k) {
      for (const Action& a : schedule.actions[static_cast<std::size_t>(k)])
        if (a.kind == ActionKind::InputGrad) splits[static_cast<std::size_t>(k)] = true;
      if (!splits[static_cast<std::size_t>(k)]) continue;
      detail::visit_stage(runtimes_, k, [&](auto&, auto I) {
        if (const std::string why = stage<I>::template no_split_reason<backend>(); !why.empty())
          throw ConfigError("xpipe: Pipeline::train: schedule '" + schedule.name +
                            "' splits backwards into I and W at stage " + std::to_string(k) +
                            ", but its " + why);
      });
    }
    schedule_ = &schedule;
    finished_here_ = false;
    const index_t rows = split.max_micro_rows();
    run_.split = split;
    run_.data = data;
    run_.read = data;
    run_.micro_loss.assign(static_cast<std::size_t>(schedule.total_micro_batches()), 0.0);
    run_.progress = &progress_;
    run_.analysis = &analysis_;
    run_.clip_norm = options_.clip_norm;
    if (options_.clip_norm > 0.f) {
      if (const std::string why = clipping_problem(schedule); !why.empty())
        throw ConfigError(
            "xpipe: Pipeline::train: global gradient-norm clipping (clip_norm) cannot run schedule "
            "'" +
            schedule.name + "': " + why);
      run_.norms.size_for(K, schedule.mini_batches);
    }
    if (options_.measure_prediction && !detail::reads_host_memory<typename backend::Context>)
      throw ConfigError(
          "xpipe: Pipeline: measure_prediction needs a backend whose weights are in host memory");
    progress_.reset();
    sample_count_ = 0;
    for (int g = 0; g < schedule.total_micro_batches(); ++g)
      sample_count_ += split.micro_batch(g).rows;
    // Boundary b carries what stage b has in flight, at most; its width is stage b's output.
    constexpr std::array<index_t, stage_count> out_widths = out_widths_of();
    if constexpr (std::constructible_from<queue, int, index_t, index_t, const Context&,
                                          const Context&>) {
      // A queue with device ends: its slots on the consumer's device, its events on the
      // device of the stream that records each (comm/spsc_ring.hpp).
      run_.links = Links<queue>(K, [&](int b, Flow f) {
        const Context& up = ctx_of(b);
        const Context& down = ctx_of(b + 1);
        const int capacity = analysis_.max_in_flight[b];
        const index_t width = out_widths[static_cast<std::size_t>(b)];
        return f == Flow::Activations ? queue(capacity, rows, width, up, down)
                                      : queue(capacity, rows, width, down, up);
      });
    } else {
      run_.links = Links<queue>(
          K, [&](int b) { return analysis_.max_in_flight[b]; }, rows,
          [&](int b) { return out_widths[static_cast<std::size_t>(b)]; });
    }
    if constexpr (on_device)
      if (options_.clip_norm > 0.f) device_.size_norms(contexts(), K, schedule.mini_batches);
    copies_.assign(K, 0);
    activation_floats_.assign(K, 0);
    workspace_floats_.assign(K, 0);
    PredictorSetup setup;
    setup.schedule = schedule_;
    setup.analysis = &analysis_;
    for (int k = 0; k < K; ++k)
      detail::visit_stage(runtimes_, k, [&](auto& rt, auto I) {
        using S = stage<I>;
        detail::activate_context(rt.ctx());  // a GPU stage's slots and copies on its device
        const bool split_here = splits[static_cast<std::size_t>(k)];
        rt.ensure_slots(analysis_.max_in_flight[k], rows, k > 0, k == K - 1, split_here);
        rt.slot_of.assign(static_cast<std::size_t>(schedule.total_micro_batches()), -1);
        setup.stage = k;
        setup.params = S::param_count;
        rt.pred.reset();
        detail::emplace_predictor_state(rt.pred, setup, predictor_);
        rt.probe.reset();
        if (options_.measure_prediction)
          rt.probe.emplace(k, S::param_count, analysis_.mini_batches_in_flight[k] + 1,
                           analysis_.max_forward_s(k));
        rt.fresh_grads = true;
        rt.gradient_parts.assign(
            options_.clip_norm > 0.f ? static_cast<std::size_t>(schedule.mini_batches) : 0, 0);
        rt.device_norms = {};
        if constexpr (on_device)
          if (options_.clip_norm > 0.f) rt.device_norms = device_.norms_of(k);
        copies_[k] = rt.pred->weight_copies();
        workspace_floats_[k] = S::template workspace_floats<backend>(options_.batch);
        activation_floats_[k] =
            analysis_.max_in_flight[k] *
                (S::activation_floats(rows) + (split_here ? S::kept_gradient_floats(rows) : 0)) +
            workspace_floats_[k];
      });
    if constexpr (on_device)
      device_.upload(ctx_of(0), ctx_of(stage_count - 1), data, used, in_width,
                     schedule.total_micro_batches(), run_);
  }

  using Context = typename backend::Context;

  // Stage k's context (k a run-time number).
  const Context& ctx_of(int k) const {
    return *detail::visit_stage(runtimes_, k,
                                [](const auto& rt, auto) -> const Context* { return &rt.ctx(); });
  }

  // Stage k's parameter count (k a run-time number).
  index_t param_count_of(int k) const {
    return detail::visit_stage(runtimes_, k, [](const auto& rt, auto) { return rt.opt.size(); });
  }

  // Stage k's context, as DeviceEpoch takes it.
  std::function<const Context&(int)> contexts() const {
    return [this](int k) -> const Context& { return ctx_of(k); };
  }

  template <std::size_t... I>
  static constexpr std::array<index_t, stage_count> out_widths_impl(std::index_sequence<I...>) {
    return {index_t{stage<I>::out_width}...};
  }
  static constexpr std::array<index_t, stage_count> out_widths_of() {
    return out_widths_impl(std::make_index_sequence<stage_count>{});
  }

  // The Program executors drive: readiness from the links (the one dependency rule), actions
  // from each stage's StageProgram.
  struct RunProgram {
    Pipeline* p;
    const Schedule& schedule() const { return *p->schedule_; }
    bool ready(int k, const Action& a) const {
      // Under global clipping a step also waits for every stage's gradient norm.
      return p->run_.links.ready(stage_count, k, a) &&
             (!info(a.kind).applies_gradient || p->run_.clip_norm <= 0.f ||
              p->run_.norms.complete(a.index));
    }
    //! Whether a step needs every stage's gradient first (global clipping): an executor that
    //! cannot share it across processes refuses the run.
    bool reduces_across_stages() const { return p->run_.clip_norm > 0.f; }
    bool input_ready(int k, const Action& a) const {
      return p->run_.links.input_arrived(stage_count, k, a);
    }
    void execute(int k, const Action& a) {
      detail::visit_stage(p->runtimes_, k, [&](auto& rt, auto I) {
        StageProgram<I, stage_count>::execute(rt, p->run_, a);
      });
    }
    // What executors of several processes reach for (exec/mpi.hpp): the links, to wire this
    // process's ends; stage k's flat gradient, to all-reduce it over replicas; each
    // micro-batch's loss, which only the last stage computes, to share it.
    Links<queue>& links() { return p->run_.links; }
    std::span<float> gradients(int k) requires(!on_device) {
      return detail::visit_stage(p->runtimes_, k, [](auto& rt, auto) {
        return std::span<float>(rt.opt.grads(), static_cast<std::size_t>(rt.opt.size()));
      });
    }
    std::span<double> micro_losses() { return p->run_.micro_loss; }
    // Under global clipping, every stage's squared gradient norm per mini-batch: an executor of
    // several processes posts the other processes' stages here as they arrive.
    GradNormBoard& gradient_norm_board() { return p->run_.norms; }

    // A device pipeline run by several processes (exec/mpi.hpp), each holding some stages:
    // this process's end of the run, inside the executor and before it shares the losses. It
    // waits for this process's streams and, where the last stage runs here (`computes_loss`),
    // reads and checks the losses as train() would (DeviceEpoch::finish); train() then skips
    // its own finish.
    void finish_here(bool computes_loss) requires on_device {
      if (computes_loss)
        p->device_.finish(p->contexts(), stage_count, p->schedule_->total_micro_batches(),
                          p->run_.data, p->run_);
      else
        DeviceEpoch<backend>::drain(p->contexts(), stage_count, true);
      p->finished_here_ = true;
    }
    // Its data-parallel replicas: each stage's gradient summed over them by MPI from a pinned
    // copy (DeviceEpoch). prepare_host_gradients before the run; gradients_to_host(k) enqueues
    // the copy after stage k's last backward of a mini-batch; gradients_on_host(k) says when it
    // (or the copy back) is done; host_gradients(k) is the copy; gradients_from_host(k)
    // enqueues the copy back before the step, on the stage's stream.
    void prepare_host_gradients() requires on_device {
      std::vector<index_t> sizes;
      p->for_each_stage([&](auto& rt) { sizes.push_back(rt.opt.size()); });
      p->device_.size_host_gradients(p->contexts(), sizes);
    }
    void gradients_to_host(int k) requires on_device {
      detail::visit_stage(p->runtimes_, k, [&](auto& rt, auto) {
        detail::activate_context(rt.ctx());
        p->device_.gradients_to_host(rt.ctx(), k, rt.opt.grads(), rt.opt.size());
      });
    }
    bool gradients_on_host(int k) const requires on_device {
      return p->device_.gradients_copied(k);
    }
    std::span<float> host_gradients(int k) requires on_device {
      return p->device_.host_gradients(k, p->param_count_of(k));
    }
    void gradients_from_host(int k) requires on_device {
      detail::visit_stage(p->runtimes_, k, [&](auto& rt, auto) {
        detail::activate_context(rt.ctx());
        p->device_.gradients_from_host(rt.ctx(), k, rt.opt.grads(), rt.opt.size());
      });
    }
    // Or averaged over them on the devices (DeviceReplicaMean, comm/replica_mean.hpp), where
    // each replica's rank has a device of its own: stage k's context, and f(ctx, g, n) called
    // with that context made current and the stage's flat gradient in its device memory.
    const Context& stage_context(int k) const requires on_device { return p->ctx_of(k); }
    template <class F>
    void with_device_gradients(int k, F&& f) requires on_device {
      detail::visit_stage(p->runtimes_, k, [&](auto& rt, auto) {
        detail::activate_context(rt.ctx());
        f(rt.ctx(), rt.opt.grads(), rt.opt.size());
      });
    }
  };
  static_assert(Program<RunProgram>);

  PipelineOptions options_;
  predictor predictor_;
  decltype(make_runtimes(std::declval<optimizer>(), std::declval<const PipelineOptions&>(),
                         std::make_index_sequence<stage_count>{})) runtimes_;
  SharedRun<queue> run_;
  RunProgress progress_;
  StalenessAnalysis analysis_;
  const Schedule* schedule_ = nullptr;
  index_t sample_count_ = 0;
  std::vector<int> copies_ = std::vector<int>(stage_count, 0);
  std::vector<index_t> activation_floats_ = std::vector<index_t>(stage_count, 0);
  std::vector<index_t> workspace_floats_ = std::vector<index_t>(stage_count, 0);
  std::conditional_t<on_device, DeviceEpoch<backend>, NoDeviceEpoch> device_;
  bool finished_here_ = false;  // the executor ran finish_here (several processes, a device)
};

}  // namespace xpipe
