// What one stage of a Pipeline owns while it lives: its context, flat weights and optimizer
// state, predictor state, activation slots for the micro-batches in flight, and the buffers of
// its loss. All of it lives on the pipeline's backend B; nothing here knows the schedule's
// actions (stage_program.hpp runs those).
#pragma once

#include <cstddef>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "xpipe/backend/backend.hpp"
#include "xpipe/comm/spsc_ring.hpp"  // detail::HasEvents
#include "xpipe/layers/layer.hpp"
#include "xpipe/layers/loss.hpp"
#include "xpipe/layers/stage.hpp"  // SlotRoom
#include "xpipe/optim/optimizer.hpp"
#include "xpipe/pipeline/prediction_probe.hpp"
#include "xpipe/predict/predictor.hpp"

namespace xpipe {

namespace detail {
// Global clipping on a backend with streams (B::Event: a device): where the run's squared
// gradient norms live ([t K + k], device memory on stage 0's device, DeviceEpoch's), the event
// stage k's stream records after writing entry t K + k, which every stage's S(t) waits on, and
// the stage's own clipping factor (one double on its device). Nothing on a host backend, whose
// norms are GradNormBoard's.
template <class B, bool = HasEvents<B>>
struct DeviceNorms {};
template <class B>
struct DeviceNorms<B, true> {
  double* squared = nullptr;
  typename B::Event* written = nullptr;
  double* factor = nullptr;
};
}  // namespace detail

//! Stage S's state under optimizer O, predictor P, on backend B.
template <class S, class O, class P, class B>
struct StageRuntime {
  using Stage = S;
  using Backend = B;
  using Context = typename B::Context;
  template <class T>
  using Buffer = typename B::template Buffer<T>;

  typename B::ContextOwner context;
  OptimizerState<O, B> opt;
  // Rebuilt for each schedule (its copies are sized by the schedule's analysis); optional
  // because a State need not be assignable.
  std::optional<typename P::template State<O, B>> pred;
  std::optional<PredictionProbe> probe;  // PipelineOptions::measure_prediction only
  // What the layers need only while a call runs, shared by every slot below (declared first:
  // the slots point into it).
  typename S::template Workspace<B> workspace;
  std::vector<typename S::template Activations<B>> acts;  // one per micro-batch in flight
  Buffer<float> inputs;  // received activations, one block per activation slot
  typename S::template GradScratch<B> scratch;
  Buffer<float> dlogits;   // last stage: one block per activation slot
  Buffer<float> row_loss;  // last stage: per-row loss of the current micro-batch
  std::vector<int> slot_of, free_slots;
  typename S::template Activations<B> eval_acts;
  Buffer<float> running;    // the layers' non-trainable state (BatchNorm running statistics)
  bool fresh_grads = true;  // the next backward overwrites the gradient instead of adding
  std::vector<int> gradient_parts;  // global clipping: per mini-batch, gradients added so far
  [[no_unique_address]] detail::DeviceNorms<B> device_norms;  // global clipping on a device

  StageRuntime(O o, const Placement& where, index_t batch, std::uint64_t seed,
               std::size_t first_layer)
      : context(where),
        opt(o, S::param_count),
        workspace(batch),
        scratch(batch),
        row_loss(batch),
        eval_acts(batch, {}, &workspace),
        running(S::state_count) {
    // The context came first: on a GPU it made the stage's device current, so every buffer
    // above lives there. Initial weights are drawn on the host (the same bits on any backend).
    if constexpr (detail::reads_host_memory<Context>) {
      S::init({opt.weights(), static_cast<std::size_t>(S::param_count)}, seed, first_layer);
      S::init_state({running.data(), static_cast<std::size_t>(S::state_count)});
    } else {
      std::vector<float> w(static_cast<std::size_t>(S::param_count));
      S::init({w.data(), w.size()}, seed, first_layer);
      copy_from_host(ctx(), w.data(), opt.weights(), S::param_count);
      if constexpr (S::state_count > 0) {
        std::vector<float> st(static_cast<std::size_t>(S::state_count));
        S::init_state({st.data(), st.size()});
        copy_from_host(ctx(), st.data(), running.data(), S::state_count);
      }
    }
  }

  // Its slots point into `workspace`: a runtime stays where it is made.
  StageRuntime(const StageRuntime&) = delete;
  StageRuntime& operator=(const StageRuntime&) = delete;

  const Context& ctx() const { return context.ctx(); }

  //! The state buffer layers read and update (null for a stage without state).
  float* running_state() { return S::state_count > 0 ? running.data() : nullptr; }

  //! A training forward: the micro-batch's statistics, the running ones updated.
  ConstMatrix train_forward(const float* w, ConstMatrix x, int slot) {
    return S::forward(ctx(), w, x, acts[static_cast<std::size_t>(slot)],
                      Running{running_state(), true});
  }
  //! An evaluation forward on the live weights: the running statistics, nothing updated.
  ConstMatrix eval_forward(ConstMatrix x) {
    return S::forward(ctx(), opt.weights(), x, eval_acts, Running{running_state(), false});
  }

  //! Sizes the activation slots (kept when large enough, and keeping gradients for a split
  //! backward where `split` asks) and frees every slot.
  void ensure_slots(int slots, index_t rows, bool receives, bool last, bool split = false) {
    const bool keeps = acts.empty() || acts.front().keeps_gradients();
    if (static_cast<int>(acts.size()) < slots || (split && !keeps)) {
      acts.clear();
      for (int i = 0; i < slots; ++i)
        acts.emplace_back(rows, SlotRoom{.kept_gradients = split}, &workspace);
      if (receives) inputs = Buffer<float>(slots * rows * S::in_width);
      if (last) dlogits = Buffer<float>(slots * rows * S::out_width);
    }
    free_slots.clear();
    for (int i = slots - 1; i >= 0; --i) free_slots.push_back(i);
  }
};

namespace detail {
// Calls f(runtime, std::integral_constant<std::size_t, k>) for the runtime stage number k.
// Executors name stages by int; the stage's types (widths, layers) are compile-time, so this
// turns one into the other with a fold over the stage indices.
template <class Tuple, class F, std::size_t... I>
decltype(auto) visit_stage_impl(Tuple& runtimes, int k, F& f, std::index_sequence<I...>) {
  using R = decltype(f(*std::get<0>(runtimes), std::integral_constant<std::size_t, 0>{}));
  if constexpr (std::is_void_v<R>) {
    ((k == static_cast<int>(I)
          ? (f(*std::get<I>(runtimes), std::integral_constant<std::size_t, I>{}), 0)
          : 0),
     ...);
  } else {
    R r{};
    ((k == static_cast<int>(I)
          ? (r = f(*std::get<I>(runtimes), std::integral_constant<std::size_t, I>{}), 0)
          : 0),
     ...);
    return r;
  }
}
template <class Tuple, class F>
decltype(auto) visit_stage(Tuple& runtimes, int k, F&& f) {
  return visit_stage_impl(
      runtimes, k, f, std::make_index_sequence<std::tuple_size_v<std::remove_const_t<Tuple>>>{});
}
}  // namespace detail

}  // namespace xpipe
