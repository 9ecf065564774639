// Sorting Pipeline<Ts...>'s template arguments into roles: the Stage<...> types in order, and
// at most one Predictor, Optimizer, Backend and QueuePolicy in any order, each with a default.
// Users write `Pipeline<S0, S1, XPipe, AdamW>` instead of a long positional list; this file is
// the machinery that makes that possible, and the checks that name a misplaced argument.
#pragma once

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include "xpipe/backend/backend.hpp"
#include "xpipe/comm/spsc_ring.hpp"
#include "xpipe/layers/stage.hpp"
#include "xpipe/optim/adam.hpp"
#include "xpipe/predict/latest.hpp"

namespace xpipe::detail {

template <class T>
struct IsStage : std::false_type {};
template <class... Ls>
struct IsStage<Stage<Ls...>> : std::true_type {};

// Roles are told apart by a member only that role has, not by the full concepts: a predictor
// one member short must still be recognised as "meant to be the predictor", so that its own
// check (check_predictor) names the missing member instead of a generic "unknown argument".
template <class T>
concept LooksLikeBackend = requires {
  typename T::Context;
};
template <class T>
concept LooksLikeQueuePolicy = requires {
  typename T::template queue<Host>;
};
template <class T>
concept LooksLikeOptimizer = requires {
  T::moment_count;
};
template <class T>
concept LooksLikePredictor =
    !LooksLikeBackend<T> && !LooksLikeQueuePolicy<T> && !LooksLikeOptimizer<T> &&
    (
        requires { typename T::template State<Adam, Host>; } || requires { T::name; });

enum class Role { Stage, Predictor, Optimizer, Backend, Queue, Unknown };

template <class T>
constexpr Role role_of() {
  if constexpr (IsStage<T>::value)
    return Role::Stage;
  else if constexpr (LooksLikeBackend<T>)
    return Role::Backend;
  else if constexpr (LooksLikeQueuePolicy<T>)
    return Role::Queue;
  else if constexpr (LooksLikeOptimizer<T>)
    return Role::Optimizer;
  else if constexpr (LooksLikePredictor<T>)
    return Role::Predictor;
  else
    return Role::Unknown;
}

// Instantiated per argument; on failure the compiler prints ArgumentCheck<Index, T>, naming it.
template <std::size_t Index, class T>
struct ArgumentCheck {
  static_assert(role_of<T>() != Role::Unknown,
                "xpipe: Pipeline: template argument (ArgumentCheck<Index, T> above) is neither a "
                "Stage<...>, a Predictor, an Optimizer, a Backend nor a QueuePolicy");
  static constexpr bool value = true;
};

template <Role R, class... Ts>
constexpr int count_role() {
  return ((role_of<Ts>() == R ? 1 : 0) + ... + 0);
}

// The first argument of role R, or Default.
template <Role R, class Default, class... Ts>
struct FirstOfRole {
  using type = Default;
};
template <Role R, class Default, class T, class... Ts>
struct FirstOfRole<R, Default, T, Ts...> {
  using type =
      std::conditional_t<role_of<T>() == R, T, typename FirstOfRole<R, Default, Ts...>::type>;
};

// The Stage<...> arguments, in order, as a tuple type.
template <class... Ts>
struct StagesOf {
  using type = decltype(std::tuple_cat(
      std::declval<std::conditional_t<IsStage<Ts>::value, std::tuple<Ts>, std::tuple<>>>()...));
};

template <std::size_t StageIndex, int StageOutWidth, int NextStageInWidth>
struct StageBoundaryCheck {
  static_assert(StageOutWidth == NextStageInWidth,
                "xpipe: Pipeline: a stage's output width differs from the next stage's input "
                "width (StageBoundaryCheck<StageIndex, StageOutWidth, NextStageInWidth> above "
                "names them)");
  static constexpr bool value = true;
};

//! As StageBoundaryCheck, for image shapes: where both stages name one, they must agree.
template <std::size_t StageIndex, Dims StageOutShape, Dims NextStageInShape>
struct StageShapeCheck {
  static_assert(!StageOutShape.known() || !NextStageInShape.known() ||
                    StageOutShape == NextStageInShape,
                "xpipe: Pipeline: a stage's output shape differs from the next stage's input "
                "shape (StageShapeCheck<StageIndex, StageOutShape, NextStageInShape> above names "
                "them as Dims{channels, height, width})");
  static constexpr bool value = true;
};

//! Pipeline<Ts...>'s arguments by role, with defaults: Latest, Adam, DefaultBackend,
//! InProcessRing. Every check fires here, once, with a message naming the fault.
template <class... Ts>
struct PipelineArguments {
 private:
  template <std::size_t... I>
  static consteval bool check_each(std::index_sequence<I...>) {
    return (ArgumentCheck<I, Ts>::value && ...);
  }
  static_assert(check_each(std::index_sequence_for<Ts...>{}));
  static_assert(count_role<Role::Predictor, Ts...>() <= 1,
                "xpipe: Pipeline: more than one Predictor given");
  static_assert(count_role<Role::Optimizer, Ts...>() <= 1,
                "xpipe: Pipeline: more than one Optimizer given");
  static_assert(count_role<Role::Backend, Ts...>() <= 1,
                "xpipe: Pipeline: more than one Backend given");
  static_assert(count_role<Role::Queue, Ts...>() <= 1,
                "xpipe: Pipeline: more than one QueuePolicy given");

 public:
  using stages = typename StagesOf<Ts...>::type;
  using predictor = typename FirstOfRole<Role::Predictor, Latest, Ts...>::type;
  using optimizer = typename FirstOfRole<Role::Optimizer, Adam, Ts...>::type;
  using backend = typename FirstOfRole<Role::Backend, DefaultBackend, Ts...>::type;
  using queue_policy = typename FirstOfRole<Role::Queue, InProcessRing, Ts...>::type;
  static constexpr int stage_count = static_cast<int>(std::tuple_size_v<stages>);
  static_assert(stage_count > 0, "xpipe: Pipeline: needs at least one Stage<...>");

  template <std::size_t K>
  using stage = std::tuple_element_t<K, stages>;

 private:
  static_assert(Backend<backend>,
                "xpipe: Pipeline: the Backend lacks Context, ContextOwner, "
                "Buffer<T>, name or column_block (see backend/backend.hpp)");
  static_assert(QueuePolicy<queue_policy>,
                "xpipe: Pipeline: the QueuePolicy lacks name or a queue<B> that is a Queue "
                "(see comm/queue.hpp)");
  static_assert(Queue<typename queue_policy::template queue<backend>>,
                "xpipe: Pipeline: the QueuePolicy's queue<Backend> is not a Queue");
  static_assert(check_optimizer<optimizer, backend>());
  static_assert(check_predictor<predictor, optimizer, backend>());

  template <std::size_t... I>
  static consteval bool check_stages(std::index_sequence<I...>) {
    return (stage<I>::template check_backend<backend>() && ...);
  }
  static_assert(check_stages(std::make_index_sequence<stage_count>{}));

  template <std::size_t... I>
  static consteval bool check_boundaries(std::index_sequence<I...>) {
    return ((StageBoundaryCheck<I, stage<I>::out_width, stage<I + 1>::in_width>::value &&
             StageShapeCheck<I, stage<I>::out_shape, stage<I + 1>::in_shape>::value) &&
            ...);
  }
  static_assert(check_boundaries(std::make_index_sequence<stage_count - 1>{}));

 public:
  static constexpr bool checked = true;
};

}  // namespace xpipe::detail
