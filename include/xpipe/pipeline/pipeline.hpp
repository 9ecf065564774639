// Pipeline<Stages..., Policies...>: K stages of a model, each with its flat weights, optimizer
// state, predictor state, activation slots and queues, trained by running a schedule with an
// executor. The per-action compute calls all take the stage's backend context.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "xpipe/data/dataset.hpp"
#include "xpipe/layers/loss.hpp"
#include "xpipe/optim/adam.hpp"
#include "xpipe/pipeline/executor.hpp"
#include "xpipe/pipeline/queue.hpp"
#include "xpipe/pipeline/stage.hpp"
#include "xpipe/predict/latest.hpp"
#include "xpipe/schedule/staleness.hpp"

namespace xpipe {

//! Runtime choices of a Pipeline, with defaults. Usage: `PipelineOptions{.batch = 128}`.
struct PipelineOptions {
  index_t batch = 128;          // rows of a mini-batch
  int micro_batches = 4;        // M: micro-batches a mini-batch is split into
  std::uint64_t seed = 1;       // initialisation
  int threads_per_stage = 1;    // GEMM and element-loop threads of each stage
};

//! Rows and labels of one epoch, already in training order: mini-batch t is rows
//! [t * batch, (t + 1) * batch). A last mini-batch of fewer than M rows is left out.
struct EpochData {
  ConstMatrix inputs;
  const std::int32_t* labels = nullptr;
};

//! What one train() call measured.
struct EpochResult {
  double loss = 0;        // mean training loss over the samples
  index_t samples = 0;
  double seconds = 0;
};

namespace detail {
template <class T>
struct IsStage : std::false_type {};
template <class... Ls>
struct IsStage<Stage<Ls...>> : std::true_type {};

template <std::size_t StageIndex, int StageOutWidth, int NextStageInWidth>
struct StageBoundaryCheck {
  static_assert(StageOutWidth == NextStageInWidth,
                "xpipe: Pipeline: a stage's output width differs from the next stage's input "
                "width (StageBoundaryCheck<StageIndex, StageOutWidth, NextStageInWidth> above "
                "names them)");
  static constexpr bool value = true;
};

template <class T>
constexpr bool is_policy = Predictor<T> || Optimizer<T>;

template <class Default, template <class> class Pred, class... Ts>
struct FirstOr {
  using type = Default;
};
template <class Default, template <class> class Pred, class T, class... Ts>
struct FirstOr<Default, Pred, T, Ts...> {
  using type = std::conditional_t<Pred<T>::value, T, typename FirstOr<Default, Pred, Ts...>::type>;
};
template <class T>
struct IsPredictorT : std::bool_constant<Predictor<T>> {};
template <class T>
struct IsOptimizerT : std::bool_constant<Optimizer<T>> {};

template <class... Ts>
struct StagesOf;
template <>
struct StagesOf<> {
  using type = std::tuple<>;
};
template <class T, class... Ts>
struct StagesOf<T, Ts...> {
  using rest = typename StagesOf<Ts...>::type;
  using type = std::conditional_t<
      IsStage<T>::value,
      decltype(std::tuple_cat(std::declval<std::tuple<T>>(), std::declval<rest>())), rest>;
};

template <std::size_t Index, class T>
struct ArgumentCheck {
  static_assert(IsStage<T>::value || is_policy<T>,
                "xpipe: Pipeline: template argument (ArgumentCheck<Index, T> above) is neither a "
                "Stage<...>, a Predictor nor an Optimizer");
  static constexpr bool value = true;
};
}  // namespace detail

//! A pipeline of Stage<...> types followed by optional policies, in any order: a Predictor
//! (default Latest) and an Optimizer type (default Adam). Adjacent stage widths are checked at
//! compile time. Usage:
//!   `Pipeline<S0, S1, S2, S3, XPipe, AdamW> p(AdamW{.lr = 1e-3f}, {.batch = 128});`
//!   `p.train(async_1f1b(4, 4, n), epoch_data, executor);`
template <class... Ts>
class Pipeline {
  template <std::size_t... I>
  static consteval bool check_arguments(std::index_sequence<I...>) {
    return (detail::ArgumentCheck<I, Ts>::value && ...);
  }
  static_assert(check_arguments(std::index_sequence_for<Ts...>{}));

 public:
  using stages = typename detail::StagesOf<Ts...>::type;
  using predictor = typename detail::FirstOr<Latest, detail::IsPredictorT, Ts...>::type;
  using optimizer = typename detail::FirstOr<Adam, detail::IsOptimizerT, Ts...>::type;
  static constexpr int stage_count = static_cast<int>(std::tuple_size_v<stages>);
  template <std::size_t K>
  using stage = std::tuple_element_t<K, stages>;
  static_assert(stage_count > 0, "xpipe: Pipeline: needs at least one Stage<...>");
  static_assert(check_predictor<predictor>());
  static_assert(check_optimizer<optimizer>());

 private:
  template <std::size_t... I>
  static consteval bool check_boundaries(std::index_sequence<I...>) {
    return (detail::StageBoundaryCheck<I, stage<I>::out_width, stage<I + 1>::in_width>::value &&
            ...);
  }
  static_assert(check_boundaries(std::make_index_sequence<stage_count - 1>{}));

 public:
  static constexpr int in_width = stage<0>::in_width;
  static constexpr int out_width = stage<stage_count - 1>::out_width;

  explicit Pipeline(optimizer opt = {}, PipelineOptions options = {})
      : options_(options),
        runtimes_(make_runtimes(opt, options, std::make_index_sequence<stage_count>{})) {
    if (options.batch < 1 || options.micro_batches < 1 || options.micro_batches > options.batch)
      throw ConfigError("xpipe: Pipeline: need 1 <= micro_batches <= batch (got " +
                        std::to_string(options.micro_batches) + " and " +
                        std::to_string(options.batch) + ")");
  }

  const PipelineOptions& options() const { return options_; }

  //! Mini-batches of `rows` rows that train() runs (a tail of fewer than M rows is dropped).
  index_t mini_batches_for(index_t rows) const {
    const index_t full = rows / options_.batch, tail = rows % options_.batch;
    return full + (tail >= options_.micro_batches ? 1 : 0);
  }

  //! Trains over `data` following `schedule` (stages = K, micro_batches = options().micro_batches,
  //! mini_batches = mini_batches_for(data rows)), run by `executor`. Validates the schedule and
  //! derives every action's staleness first; allocation happens here, never inside the run.
  template <class Executor>
  EpochResult train(const Schedule& schedule, EpochData data, Executor& executor) {
    prepare(schedule, data);
    RunProgram program{this};
    const auto t0 = std::chrono::steady_clock::now();
    executor.run(program);
    EpochResult r;
    r.seconds = detail::seconds_since(t0);
    double sum = 0;
    for (int g = 0; g < schedule.total_micro_batches(); ++g) sum += micro_loss_[g];
    r.samples = sample_count_;
    r.loss = sample_count_ > 0 ? sum / static_cast<double>(sample_count_) : 0.0;
    return r;
  }

  //! Fraction of `data` the live weights classify correctly (stages run one after another).
  double evaluate(const Dataset& data) {
    index_t correct = 0;
    const index_t chunk = options_.batch;
    eval_predicted_.resize(static_cast<std::size_t>(chunk));
    for (index_t first = 0; first < data.count; first += chunk) {
      const index_t rows = std::min(chunk, data.count - first);
      ConstMatrix x = data.matrix().slice_rows(first, rows);
      for_each_stage([&](auto& rt) { x = rt.eval_forward(x); });
      argmax_rows(HostContext{options_.threads_per_stage}, x, eval_predicted_.data());
      for (index_t r = 0; r < rows; ++r) correct += eval_predicted_[r] == data.labels[first + r];
    }
    return static_cast<double>(correct) / static_cast<double>(data.count);
  }

  //! Live weights of every stage, concatenated (for comparisons and checkpoints).
  std::vector<float> weights() const {
    std::vector<float> out;
    for_each_stage([&](const auto& rt) {
      out.insert(out.end(), rt.opt.weights(), rt.opt.weights() + rt.opt.size());
    });
    return out;
  }

  //! Micro-batches whose loss the running (or last) train() call has computed, their samples
  //! and the sum of their losses: safe to read from another thread while train() runs (for
  //! progress bars).
  struct Progress {
    long micro_batches = 0, samples = 0;
    double loss_sum = 0;
  };
  Progress progress() const {
    return {done_micro_.load(std::memory_order_relaxed), done_samples_.load(std::memory_order_relaxed),
            done_loss_.load(std::memory_order_relaxed)};
  }

  //! The staleness analysis of the last schedule trained.
  const StalenessAnalysis& analysis() const { return analysis_; }
  //! Weight buffers stage k's predictor held in the last run (live weights included).
  int weight_copies(int k) const { return copies_[k]; }
  //! Peak activation floats stage k held in the last run (its in-flight micro-batches).
  index_t activation_floats(int k) const { return activation_floats_[k]; }

 private:
  template <class S>
  struct StageRuntime {
    OptimizerState<optimizer, Host> opt;
    std::optional<typename predictor::template State<optimizer, Host>> pred;
    std::vector<typename S::template Activations<Host>> acts;
    HostBuffer<float> inputs;  // received activations, one block per slot
    typename S::template GradScratch<Host> scratch;
    HostBuffer<float> dlogits;  // last stage: one block per slot
    HostBuffer<float> row_loss;
    std::vector<int> slot_of, free_slots;
    typename S::template Activations<Host> eval_acts;
    HostContext ctx;
    bool fresh_grads = true;

    StageRuntime(optimizer o, const PipelineOptions& opts, std::size_t first_layer)
        : opt(o, S::param_count), scratch(opts.batch), row_loss(opts.batch),
          eval_acts(opts.batch), ctx{opts.threads_per_stage} {
      S::init({opt.weights(), static_cast<std::size_t>(S::param_count)}, opts.seed, first_layer);
    }

    ConstMatrix eval_forward(ConstMatrix x) { return S::forward(ctx, opt.weights(), x, eval_acts); }

    void ensure_slots(int slots, index_t rows, bool receives, bool last) {
      if (static_cast<int>(acts.size()) < slots) {
        acts.clear();
        for (int i = 0; i < slots; ++i) acts.emplace_back(rows);
        if (receives) inputs = HostBuffer<float>(slots * rows * S::in_width);
        if (last) dlogits = HostBuffer<float>(slots * rows * S::out_width);
      }
      free_slots.clear();
      for (int i = slots - 1; i >= 0; --i) free_slots.push_back(i);
    }
  };

  template <std::size_t... I>
  static auto make_runtimes(optimizer opt, const PipelineOptions& options,
                            std::index_sequence<I...>) {
    constexpr std::array<std::size_t, stage_count> layers{stage<I>::layer_count...};
    auto first = [&](std::size_t k) {
      std::size_t n = 0;
      for (std::size_t i = 0; i < k; ++i) n += layers[i];
      return n;
    };
    return std::tuple<std::unique_ptr<StageRuntime<stage<I>>>...>{
        std::make_unique<StageRuntime<stage<I>>>(opt, options, first(I))...};
  }

  template <class F>
  void for_each_stage(F&& f) {
    std::apply([&](auto&... rt) { (f(*rt), ...); }, runtimes_);
  }
  template <class F>
  void for_each_stage(F&& f) const {
    std::apply([&](const auto&... rt) { (f(*rt), ...); }, runtimes_);
  }
  //! Calls f(runtime, integral_constant<k>) for the runtime stage number k.
  template <class F>
  decltype(auto) with_stage(int k, F&& f) {
    return with_stage_impl(k, f, std::make_index_sequence<stage_count>{});
  }
  template <class F, std::size_t... I>
  decltype(auto) with_stage_impl(int k, F& f, std::index_sequence<I...>) {
    using R = decltype(f(*std::get<0>(runtimes_), std::integral_constant<std::size_t, 0>{}));
    if constexpr (std::is_void_v<R>) {
      ((k == static_cast<int>(I) ? (f(*std::get<I>(runtimes_), std::integral_constant<std::size_t, I>{}), 0) : 0), ...);
    } else {
      R r{};
      ((k == static_cast<int>(I) ? (r = f(*std::get<I>(runtimes_), std::integral_constant<std::size_t, I>{}), 0) : 0), ...);
      return r;
    }
  }

  // Rows of micro-batch g: mini-batch t's rows split as evenly as possible, first ones larger.
  std::pair<index_t, index_t> micro_rows(int g) const {
    const int M = options_.micro_batches;
    const index_t t = g / M, j = g % M;
    const index_t first = t * options_.batch;
    const index_t rows_t = std::min(options_.batch, data_rows_ - first);
    const index_t base = rows_t / M, extra = rows_t % M;
    const index_t offset = j * base + std::min<index_t>(j, extra);
    return {first + offset, base + (j < extra ? 1 : 0)};
  }
  index_t mini_batch_rows(int g) const {
    const index_t first = (g / options_.micro_batches) * options_.batch;
    return std::min(options_.batch, data_rows_ - first);
  }

  void prepare(const Schedule& schedule, EpochData data) {
    const int K = stage_count;
    if (schedule.stages != K || schedule.micro_batches != options_.micro_batches)
      throw ConfigError("xpipe: Pipeline::train: schedule '" + schedule.name + "' has " +
                        std::to_string(schedule.stages) + " stages and " +
                        std::to_string(schedule.micro_batches) + " micro-batches; the pipeline has " +
                        std::to_string(K) + " stages and micro_batches = " +
                        std::to_string(options_.micro_batches));
    if (data.inputs.cols != in_width)
      throw ShapeError("xpipe: Pipeline::train: inputs have " + std::to_string(data.inputs.cols) +
                       " columns, stage 0 expects " + std::to_string(in_width));
    data_ = data;
    data_rows_ = data.inputs.rows;
    const index_t n = mini_batches_for(data_rows_);
    if (schedule.mini_batches != n)
      throw ConfigError("xpipe: Pipeline::train: schedule '" + schedule.name + "' has " +
                        std::to_string(schedule.mini_batches) + " mini-batches; the data holds " +
                        std::to_string(n) + " of batch " + std::to_string(options_.batch));
    analysis_ = analyze_staleness(schedule);  // validates
    schedule_ = &schedule;
    const index_t rows = (options_.batch + options_.micro_batches - 1) / options_.micro_batches;
    micro_capacity_ = rows;
    micro_loss_.assign(static_cast<std::size_t>(schedule.total_micro_batches()), 0.0);
    sample_count_ = 0;
    done_micro_ = 0;
    done_samples_ = 0;
    done_loss_ = 0;
    for (int g = 0; g < schedule.total_micro_batches(); ++g) sample_count_ += micro_rows(g).second;
    copies_.assign(K, 0);
    activation_floats_.assign(K, 0);
    act_queues_.clear();
    grad_queues_.clear();
    for (int k = 0; k + 1 < K; ++k) {
      const int cap = analysis_.max_in_flight[k];
      const index_t width = with_stage(k, [](auto&, auto I) { return index_t{stage<I>::out_width}; });
      act_queues_.emplace_back(cap, rows, width);
      grad_queues_.emplace_back(cap, rows, width);
    }
    PredictorSetup setup;
    setup.schedule = schedule_;
    setup.analysis = &analysis_;
    for (int k = 0; k < K; ++k)
      with_stage(k, [&](auto& rt, auto I) {
        using S = stage<I>;
        rt.ensure_slots(analysis_.max_in_flight[k], rows, k > 0, k == K - 1);
        rt.slot_of.assign(static_cast<std::size_t>(schedule.total_micro_batches()), -1);
        setup.stage = k;
        setup.params = S::param_count;
        rt.pred.reset();
        rt.pred.emplace(setup);
        rt.fresh_grads = true;
        copies_[k] = rt.pred->weight_copies();
        activation_floats_[k] = analysis_.max_in_flight[k] * S::activation_floats(rows);
      });
  }

  // The Program the executors drive.
  struct RunProgram {
    Pipeline* p;
    const Schedule& schedule() const { return *p->schedule_; }
    bool ready(int k, const Action& a) { return p->ready(k, a); }
    void execute(int k, const Action& a) { p->execute(k, a); }
  };

  bool ready(int k, const Action& a) const {
    const int K = stage_count;
    switch (a.kind) {
      case ActionKind::Forward:
        return (k == 0 || act_queues_[k - 1].can_pop()) && (k == K - 1 || act_queues_[k].can_push());
      case ActionKind::Backward:
        return (k == K - 1 || grad_queues_[k].can_pop()) && (k == 0 || grad_queues_[k - 1].can_push());
      case ActionKind::Step:
        return true;
    }
    return false;
  }

  void execute(int k, const Action& a) {
    with_stage(k, [&](auto& rt, auto I) {
      if (a.kind == ActionKind::Forward) forward<I>(rt, a.index);
      else if (a.kind == ActionKind::Backward) backward<I>(rt, a.index);
      else {
        rt.pred->before_step(rt.ctx, rt.opt);
        rt.opt.step(rt.ctx);
        rt.fresh_grads = true;
      }
    });
  }

  template <std::size_t I, class RT>
  void forward(RT& rt, int g) {
    using S = stage<I>;
    constexpr int K = stage_count;
    const int slot = rt.free_slots.back();
    rt.free_slots.pop_back();
    rt.slot_of[g] = slot;
    const auto [first_row, rows] = micro_rows(g);
    ConstMatrix x;
    if constexpr (I == 0) {
      x = data_.inputs.slice_rows(first_row, rows);
    } else {
      const MicroBatchMessage& m = act_queues_[I - 1].front();
      if (m.micro_batch != g || m.data.rows != rows)
        throw Error("received activations of micro-batch " + std::to_string(m.micro_batch) +
                    " while running F" + std::to_string(g));
      float* dst = rt.inputs.data() + slot * micro_capacity_ * S::in_width;
      copy_buffer(rt.ctx, m.data.data, dst, rows * S::in_width);
      act_queues_[I - 1].pop();
      x = ConstMatrix{dst, rows, S::in_width};
    }
    const float* w = rt.pred->forward_weights(rt.ctx, rt.opt, g);
    const ConstMatrix y = S::forward(rt.ctx, w, x, rt.acts[slot]);
    if constexpr (I + 1 < K) {
      MicroBatchMessage& out = act_queues_[I].back();
      out.micro_batch = g;
      out.data.rows = rows;
      copy_buffer(rt.ctx, y.data, out.data.data, rows * S::out_width);
      act_queues_[I].push();
    } else {
      const Matrix dl{rt.dlogits.data() + slot * micro_capacity_ * S::out_width, rows, S::out_width};
      const std::int32_t* labels = data_.labels + first_row;
      SoftmaxCrossEntropy::forward_backward(rt.ctx, y, labels,
                                            1.f / static_cast<float>(mini_batch_rows(g)), dl,
                                            rt.row_loss.data());
      micro_loss_[g] = sum_row_losses(rt.row_loss.data(), rows);
      // Progress for observers on other threads; this thread is the only writer.
      done_loss_.store(done_loss_.load(std::memory_order_relaxed) + micro_loss_[g],
                       std::memory_order_relaxed);
      done_samples_.store(done_samples_.load(std::memory_order_relaxed) + rows,
                          std::memory_order_relaxed);
      done_micro_.store(done_micro_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    }
  }

  template <std::size_t I, class RT>
  void backward(RT& rt, int g) {
    using S = stage<I>;
    constexpr int K = stage_count;
    const int slot = rt.slot_of[g];
    const index_t rows = micro_rows(g).second;
    ConstMatrix dy;
    if constexpr (I + 1 == K) {
      dy = ConstMatrix{rt.dlogits.data() + slot * micro_capacity_ * S::out_width, rows, S::out_width};
    } else {
      const MicroBatchMessage& m = grad_queues_[I].front();
      if (m.micro_batch != g)
        throw Error("received gradients of micro-batch " + std::to_string(m.micro_batch) +
                    " while running B" + std::to_string(g));
      dy = ConstMatrix{m.data.data, rows, S::out_width};
    }
    Matrix dx;
    if constexpr (I > 0) {
      MicroBatchMessage& out = grad_queues_[I - 1].back();
      out.micro_batch = g;
      out.data.rows = rows;
      dx = Matrix{out.data.data, rows, S::in_width};
    }
    const float* w = rt.pred->backward_weights(rt.ctx, rt.opt, g);
    S::backward(rt.ctx, w, rt.opt.grads(), !rt.fresh_grads, rt.acts[slot], dy, dx, rt.scratch);
    rt.fresh_grads = false;
    if constexpr (I > 0) grad_queues_[I - 1].push();
    if constexpr (I + 1 < K) grad_queues_[I].pop();
    rt.pred->backward_done(g);
    rt.free_slots.push_back(slot);
    rt.slot_of[g] = -1;
  }

  PipelineOptions options_;
  decltype(make_runtimes(std::declval<optimizer>(), std::declval<const PipelineOptions&>(),
                         std::make_index_sequence<stage_count>{})) runtimes_;
  std::vector<SpscRing> act_queues_, grad_queues_;
  StalenessAnalysis analysis_;
  const Schedule* schedule_ = nullptr;
  EpochData data_{};
  index_t data_rows_ = 0, micro_capacity_ = 0, sample_count_ = 0;
  std::vector<double> micro_loss_;
  std::atomic<long> done_micro_{0}, done_samples_{0};
  std::atomic<double> done_loss_{0};
  std::vector<int> copies_;
  std::vector<index_t> activation_floats_;
  std::vector<std::int32_t> eval_predicted_;
};

}  // namespace xpipe
