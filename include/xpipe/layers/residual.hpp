// Residual blocks as one layer: y = f(x) + x or f(x) + P(x), f and P inner stages whose
// activations the block keeps per slot; the *Act forms fuse the activation after the sum.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "xpipe/backend/backend.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/core/shape.hpp"
#include "xpipe/kernels/residual.hpp"
#include "xpipe/layers/activation.hpp"
#include "xpipe/layers/layer.hpp"
#include "xpipe/layers/stage.hpp"

namespace xpipe {

//! The identity shortcut of a residual block (Residual<...>).
struct IdentityShortcut {};
//! No shortcut at all: y = f(x), the block's layers as one layer (Chain<...>).
struct NoShortcut {};

namespace detail {

// What the shortcut path needs only while a call runs, one per stage: nothing for the identity;
// for a projection its inner stage's workspace, its gradient scratch and its input gradient
// (added to the block's before the call returns).
template <class Shortcut, class B, int InWidth>
struct ShortcutWorkspace {
  ShortcutWorkspace(index_t rows, float* arena)
      : layers(rows, arena), scratch(rows), dx(rows * InWidth) {}
  typename Shortcut::template Workspace<B> layers;
  typename Shortcut::template GradScratch<B> scratch;
  typename B::template Buffer<float> dx;
};
template <class B, int InWidth>
struct ShortcutWorkspace<IdentityShortcut, B, InWidth> {
  ShortcutWorkspace(index_t, float*) {}
};
template <class B, int InWidth>
struct ShortcutWorkspace<NoShortcut, B, InWidth> {
  ShortcutWorkspace(index_t, float*) {}
};
// What the shortcut path keeps per slot: nothing for the identity; for a projection its inner
// stage's activations (with a split backward's kept gradients where asked), on the stage's
// workspace where given one.
template <class Shortcut, class B, int InWidth>
struct ShortcutSlot {
  ShortcutSlot(index_t rows, bool keep_gradients,
               ShortcutWorkspace<Shortcut, B, InWidth>* workspace)
      : acts(rows, {.kept_gradients = keep_gradients},
             workspace == nullptr ? nullptr : &workspace->layers) {}
  typename Shortcut::template Activations<B> acts;
};
template <class B, int InWidth>
struct ShortcutSlot<IdentityShortcut, B, InWidth> {
  ShortcutSlot(index_t, bool, ShortcutWorkspace<IdentityShortcut, B, InWidth>*) {}
};
template <class B, int InWidth>
struct ShortcutSlot<NoShortcut, B, InWidth> {
  ShortcutSlot(index_t, bool, ShortcutWorkspace<NoShortcut, B, InWidth>*) {}
};

// A block's in_shape and out_shape: f's images, or none where f takes or gives flat rows (a
// Transformer block's tokens).
template <Dims In>
struct InShapeOf {};
template <Dims In>
requires(In.known()) struct InShapeOf<In> {
  using in_shape = Shape<In.c, In.h, In.w>;
};
template <Dims Out>
struct OutShapeOf {};
template <Dims Out>
requires(Out.known()) struct OutShapeOf<Out> {
  using out_shape = Shape<Out.c, Out.h, Out.w>;
};

}  // namespace detail

//! A residual block: y = f(x) + shortcut(x), f the stage Stage<Ls...> and shortcut the identity
//! (Shortcut = IdentityShortcut) or a stage of its own (a strided 1x1 convolution and its
//! BatchNorm, where f changes the shape). f takes and gives images (its first and last
//! boundaries name a Shape) or flat rows (a Transformer block: `Residual<LayerNorm<D>, ...>`).
//! Parameters: f's flat block, then the shortcut's (16-float aligned); state (BatchNorm running
//! statistics): f's, then the shortcut's. Per activation slot it keeps f's and the shortcut's
//! activations (its Saved), so a block is one layer to Stage and the pipeline; each slot's inner
//! layers keep their own Saved too (batch statistics). What only a call needs (f's and the
//! shortcut's gradient scratch and layer workspaces: convolution plans) is its Workspace, one per
//! stage. Where f's last layer fuses_residual_sum (BatchNorm2d), that layer writes the sum in
//! its own pass and f's output is neither written nor kept; else the sum is a pass of its own. The
//! activation after the sum (ResNet's ReLU) is the next layer of the stage, or with Post an
//! activation layer, y = Post(f(x) + shortcut(x)) in the sum's one pass: the block then
//! keeps no sum beside its output, takes Post's gradient from y (Post's function must be
//! math::OutputDifferentiable: ReLU, not GELU) into the stage's arena, and takes two
//! layer numbers for its seed (the block's and the activation's), so a model gets the weights and
//! the bits of `Residual<...>, Post`. Its backward also runs split for zero-bubble
//! schedules (backward_input, then backward_weight on the same slot) where every inner layer with
//! parameters has a split (splits_backward); a slot made for it (Saved(rows, true)) then keeps each
//! such layer's output gradient too (kept_gradient_floats).
//! Usage: `ResidualBlock<IdentityShortcut, void, Conv, BatchNorm2d<S>, ReLU, Conv,
//! BatchNorm2d<S>>`; mostly through Residual<...>, ResidualAct<Act, ...>, ProjectedResidual<P,
//! ...>, ProjectedResidualAct<Act, P, ...> and Chain<...>.
template <class Shortcut, class Post, class... Ls>
struct ResidualBlock : detail::InShapeOf<Stage<Ls...>::in_shape>,
                       detail::OutShapeOf<Stage<Ls...>::out_shape> {
  using inner = Stage<Ls...>;
  //! The shortcut: IdentityShortcut, NoShortcut or the stage of its own path.
  using shortcut = Shortcut;
  //! Whether y adds a shortcut to f(x) (every block but a Chain), and whether that shortcut
  //! is a path of its own.
  static constexpr bool summed = !std::is_same_v<Shortcut, NoShortcut>;
  static constexpr bool projected = summed && !std::is_same_v<Shortcut, IdentityShortcut>;
  //! Whether f's last layer adds the sum (and Post) in its own forward pass
  //! (fuses_residual_sum: BatchNorm2d), so the block makes no pass of its own forward
  //! and its slot keeps no f(x).
  static constexpr bool sum_in_last_layer =
      summed && fuses_residual_sum<typename inner::template layer<inner::layer_count - 1>>;

  //! Whether an activation follows the sum inside the block, and its per-element function
  //! (math::Identity where none does).
  static constexpr bool activated = !std::is_void_v<Post>;
  static_assert(!activated || ActivationLayer<Post>,
                "xpipe: ResidualAct<Act, ...> (or ProjectedResidualAct<Act, P, ...>): Act must be "
                "an activation layer such as ReLU");
  static_assert(!activated || summed,
                "xpipe: a Chain has no sum to put an activation after: write the activation as "
                "the chain's last layer");
  using post_function =
      typename std::conditional_t<activated, Post, Activation<math::Identity>>::function;
  static_assert(math::OutputDifferentiable<post_function>,
                "xpipe: ResidualAct<Act, ...> (or ProjectedResidualAct<Act, P, ...>): Act's "
                "gradient must follow from its output (its function needs static "
                "backward_from_output(y, dy), as ReLU's has); for GELU write Residual<...>, GELU");
  //! With Post it stands for the block and Post (Stage::init): two layer numbers.
  static constexpr std::size_t init_streams = activated ? 2 : 1;
  static_assert(!summed || inner::in_shape.known() == inner::out_shape.known(),
                "xpipe: Residual: the block's first layer and its last must both name an image "
                "(a Shape) or both be flat rows: a residual sum adds like to like");
  static_assert(projected || !summed ||
                    (inner::in_shape == inner::out_shape && inner::in_width == inner::out_width),
                "xpipe: Residual: with the identity shortcut the block must give the shape (or "
                "width) it takes; for a change of shape use ProjectedResidual<Stage<...>, ...>");
  static constexpr int in_width = inner::in_width;
  static constexpr int out_width = inner::out_width;
  //! Where the shortcut's parameters start: right after f's block, which Stage already ends on
  //! a 16-float boundary (each layer's block does).
  static constexpr index_t shortcut_offset = inner::param_count;
  static_assert(shortcut_offset % 16 == 0,
                "xpipe: Residual: f's parameter block must end 16-float aligned");
  //! The shortcut's parameter and state counts (0 for the identity).
  static constexpr index_t shortcut_params = [] {
    if constexpr (projected)
      return Shortcut::param_count;
    else
      return index_t{0};
  }();
  static constexpr index_t shortcut_state = [] {
    if constexpr (projected)
      return Shortcut::state_count;
    else
      return index_t{0};
  }();
  static constexpr index_t param_count =
      projected ? shortcut_offset + shortcut_params : inner::param_count;
  static constexpr index_t state_count = inner::state_count + shortcut_state;
  //! Multiply-adds of the forward per image: f's and the shortcut's.
  static constexpr double macs = inner::macs + (projected ? macs_of<Shortcut>() : 0.0);
  //! Rows kept together: those of f's layers (a projection is per row).
  static constexpr index_t row_group = inner::row_group;
  static_assert(
      [] {
        if constexpr (projected)
          return Shortcut::in_shape == inner::in_shape && Shortcut::out_shape == inner::out_shape;
        else
          return true;
      }(),
      "xpipe: ProjectedResidual: the shortcut stage must take the block's input shape and give "
      "its output shape");

  //! f's layers draw from sub-streams 0.. of the block's seed, the shortcut's after them.
  static void init(std::span<float> params, std::uint64_t seed) {
    std::fill(params.begin(), params.end(), 0.f);
    inner::init(params.first(inner::param_count), seed, 0);
    if constexpr (projected)
      Shortcut::init(params.subspan(shortcut_offset, Shortcut::param_count), seed,
                     inner::seed_streams);
  }
  static void init_state(std::span<float> state) {
    inner::init_state(state.first(inner::state_count));
    if constexpr (projected) Shortcut::init_state(state.subspan(inner::state_count));
  }

  //! One per stage, for calls of up to max_rows rows: f's layers' workspace and gradient
  //! scratch, and the shortcut's with its input gradient where it has a path of its own. The
  //! block's calls take from the stage's arena where given one (else from one of the block's
  //! own): with Post the gradient of the sum first (post_grad()), then what its layers' calls
  //! take, after it.
  //! Usage: `Block::Workspace<Host> ws(rows); Block::Saved<Host> slot(rows, false, ws);`
  template <class B>
  struct Workspace {
    //! On `arena` (arena_floats<B>(max_rows) floats), or an arena of its own where it is null.
    explicit Workspace(index_t max_rows, float* arena = nullptr)
        : room(arena, arena_floats<B>(max_rows)),
          layers(max_rows, room.data() + post_grad_floats(max_rows)),
          scratch(max_rows),
          shortcut(max_rows, room.data() + post_grad_floats(max_rows)) {}
    //! Room for the gradient of the sum, Post's input (max_rows x out_width), with Post.
    float* post_grad() const { return room.data(); }
    ArenaOr<B> room;  // first: its layers' calls take their arena from it
    typename inner::template Workspace<B> layers;
    typename inner::template GradScratch<B> scratch;
    detail::ShortcutWorkspace<Shortcut, B, in_width> shortcut;
  };
  //! Per activation slot: f's activations, the shortcut's where it has a path of its own; with
  //! `keep_gradients`, room for a split backward's kept gradients too; and the way to the
  //! stage's workspace (its own when made without one). Floats kept beyond the block's output:
  //! saved_floats(rows), plus kept_gradient_floats(rows) for a split backward.
  template <class B>
  struct Saved {
    explicit Saved(index_t rows, bool keep_gradients = false)
        : workspace(rows),
          acts(rows, {.kept_gradients = keep_gradients, .output = !sum_in_last_layer},
               &workspace->layers),
          shortcut(rows, keep_gradients, &workspace->shortcut) {}
    Saved(index_t rows, bool keep_gradients, Workspace<B>& shared)
        : workspace(shared),
          acts(rows, {.kept_gradients = keep_gradients, .output = !sum_in_last_layer},
               &workspace->layers),
          shortcut(rows, keep_gradients, &workspace->shortcut) {}
    WorkspaceRef<Workspace<B>> workspace;  // first: the activations below point into it
    typename inner::template Activations<B> acts;
    detail::ShortcutSlot<Shortcut, B, in_width> shortcut;
  };
  //! f's activations but its output where its last layer writes the sum (sum_in_last_layer).
  static constexpr index_t saved_floats(index_t rows) {
    index_t n = inner::activation_floats(rows) - (sum_in_last_layer ? rows * out_width : 0);
    if constexpr (projected) n += Shortcut::activation_floats(rows);
    return n;
  }
  //! Floats of the workspace's own buffers on B for calls of up to `rows` rows: f's and the
  //! shortcut's (Stage::own_workspace_floats), their gradient scratch
  //! (Stage::grad_scratch_floats) and the shortcut's input gradient.
  template <class B>
  static constexpr index_t workspace_floats(index_t rows) {
    index_t n = inner::template own_workspace_floats<B>(rows) +
                inner::template grad_scratch_floats<B>(rows);
    if constexpr (projected)
      n += Shortcut::template own_workspace_floats<B>(rows) +
           Shortcut::template grad_scratch_floats<B>(rows) + rows * in_width;
    return n;
  }
  //! Floats of the gradient of the sum a call of `rows` rows keeps on the arena with Post,
  //! rounded up to 16 (64 bytes) so that what its layers take after it stays aligned; 0 without.
  static constexpr index_t post_grad_floats(index_t rows) {
    return activated ? round_up_to_line(rows * out_width) : 0;
  }
  //! Floats a call takes from the stage's arena: the gradient of the sum (post_grad_floats),
  //! then the most any of f's or the shortcut's layers takes (they run one after another).
  template <class B>
  static constexpr index_t arena_floats(index_t rows) {
    index_t n = inner::template arena_floats<B>(rows);
    if constexpr (projected) n = std::max(n, Shortcut::template arena_floats<B>(rows));
    return post_grad_floats(rows) + n;
  }
  //! What a slot keeps between the halves of a split backward: the inner layers' output
  //! gradients (Stage::kept_gradient_floats of f and of the projection).
  static constexpr index_t kept_gradient_floats(index_t rows) {
    index_t n = inner::kept_gradient_floats(rows);
    if constexpr (projected) n += Shortcut::kept_gradient_floats(rows);
    return n;
  }
  //! Whether the block can split its backward on backend B: every inner layer can.
  template <class B>
  static constexpr bool splits_on = [] {
    if constexpr (projected)
      return inner::template splits_backward<B> && Shortcut::template splits_backward<B>;
    else
      return inner::template splits_backward<B>;
  }();

  //! y = f(x) + x, or f(x) + P(x); through Post where it has one. Where f ends in a layer that
  //! fuses the sum (a ResNet block's BatchNorm), it writes y in its pass, and f's own output is
  //! never written (the shortcut runs first then); else the sum is a pass of its own.
  template <class Ctx, class Sv>
  static void forward(const Ctx& ctx, const float* params, ConstMatrix x, Matrix y, Sv& saved,
                      Running run) {
    ConstMatrix s = x;  // the shortcut's output
    if constexpr (projected) {
      const Running r{run.state == nullptr ? nullptr : run.state + inner::state_count,
                      run.training};
      s = Shortcut::forward(ctx, params + shortcut_offset, x, saved.shortcut.acts, r);
    }
    if constexpr (sum_in_last_layer) {
      inner::forward(ctx, params, x, saved.acts, run, SumInto<post_function>{s, y});
    } else {
      const ConstMatrix f = inner::forward(ctx, params, x, saved.acts, run);
      if constexpr (summed)
        add_views<post_function>(ctx, f, s, y);
      else
        copy_view(ctx, f, y);
    }
  }

  //! f's gradients, the shortcut's, and dx = f's input gradient + the shortcut's (dy itself for
  //! the identity); dx skipped when empty (the parameter gradients still run). With Post, dy is
  //! first taken through Post's gradient at y into post_grad() on the arena.
  template <class Ctx, class Sv>
  static void backward(const Ctx& ctx, const float* params, float* grads, bool accumulate,
                       ConstMatrix /*x*/, ConstMatrix y, ConstMatrix dy_out, Matrix dx, Sv& saved) {
    ConstMatrix dy = dy_out;
    if constexpr (activated) {
      const Matrix sum_grad{saved.workspace->post_grad(), dy_out.rows, out_width};
      activation_backward_from_output<post_function>(ctx, y, dy_out, sum_grad);
      dy = sum_grad;
    }
    inner::backward(ctx, params, grads, accumulate, saved.acts, dy, dx, saved.workspace->scratch);
    if constexpr (projected) {
      const Matrix ds =
          dx.empty() ? Matrix{} : Matrix{saved.workspace->shortcut.dx.data(), dy.rows, in_width};
      Shortcut::backward(ctx, params + shortcut_offset, grads + shortcut_offset, accumulate,
                         saved.shortcut.acts, dy, ds, saved.workspace->shortcut.scratch);
      if (!dx.empty()) add_views(ctx, dx, ds, dx);
    } else if constexpr (summed) {
      if (!dx.empty()) add_views(ctx, dx, dy, dx);
    }
  }

  //! The input part of the split backward (zero-bubble schedules): dx as backward computes it
  //! (skipped when empty), each path running Stage::backward_input on the slot, which keeps the
  //! output gradients its weight part needs; no parameter gradient. With Post, dy is taken
  //! through Post's gradient in place first. Declared only where every inner layer splits (a
  //! schedule with I and W is refused otherwise, naming the block).
  template <class Ctx, class Sv>
  requires splits_on<typename Ctx::backend>
  static void backward_input(const Ctx& ctx, const float* params, ConstMatrix /*x*/, ConstMatrix y,
                             Matrix dy, Matrix dx, Sv& saved) {
    if constexpr (activated) activation_backward_from_output<post_function>(ctx, y, dy, dy);
    inner::backward_input(ctx, params, saved.acts, dy, dx, saved.workspace->scratch);
    if constexpr (projected) {
      const Matrix ds =
          dx.empty() ? Matrix{} : Matrix{saved.workspace->shortcut.dx.data(), dy.rows, in_width};
      Shortcut::backward_input(ctx, params + shortcut_offset, saved.shortcut.acts, dy, ds,
                               saved.workspace->shortcut.scratch);
      if (!dx.empty()) add_views(ctx, dx, ds, dx);
    } else if constexpr (summed) {
      if (!dx.empty()) add_views(ctx, dx, dy, dx);
    }
  }

  //! The weight part: f's and the shortcut's parameter gradients, written or added (accumulate),
  //! from what backward_input kept in the slot; with it, the bits of backward.
  template <class Ctx, class Sv>
  requires splits_on<typename Ctx::backend>
  static void backward_weight(const Ctx& ctx, float* grads, bool accumulate, ConstMatrix /*x*/,
                              ConstMatrix /*y*/, ConstMatrix /*dy*/, Sv& saved) {
    inner::backward_weight(ctx, grads, accumulate, saved.acts);
    if constexpr (projected)
      Shortcut::backward_weight(ctx, grads + shortcut_offset, accumulate, saved.shortcut.acts);
  }
};

//! y = f(x) + x, f = Stage<Ls...>: a residual block with the identity shortcut.
//! Usage: `Stage<Residual<Conv, BatchNorm2d<S>, ReLU, Conv, BatchNorm2d<S>>, ReLU>`.
template <class... Ls>
using Residual = ResidualBlock<IdentityShortcut, void, Ls...>;

//! y = Act(f(x) + x), f = Stage<Ls...>: Residual<Ls...> and the activation after it (Act, an
//! activation layer whose gradient follows from its output) in one layer, with the bits and
//! the initial weights of `Residual<Ls...>, Act`; one activation fewer kept per slot, one pass
//! fewer forward.
//! Usage: `Stage<ResidualAct<ReLU, Conv, BatchNormAct<S, ReLU>, Conv, BatchNorm2d<S>>>`.
template <class Act, class... Ls>
using ResidualAct = ResidualBlock<IdentityShortcut, Act, Ls...>;

//! y = f(x), f = Stage<Ls...>: several layers as one (a Transformer block of two residuals), so
//! a model names its blocks as it draws them; its output is copied out of f's last activation.
//! Usage: `using Block = Chain<Residual<LayerNorm<D>, ...>, Residual<LayerNorm<D>, ...>>;`
template <class... Ls>
using Chain = ResidualBlock<NoShortcut, void, Ls...>;

//! y = f(x) + P(x), P a Stage<...> (e.g. a 1x1 stride-2 convolution and its BatchNorm) taking
//! f's input shape to f's output shape.
//! Usage: `ProjectedResidual<Stage<Conv2d<S16, 32, 1, ConvOptions{.stride = 2}>, BN32>, ...>`.
template <class Shortcut, class... Ls>
using ProjectedResidual = ResidualBlock<Shortcut, void, Ls...>;

//! y = Act(f(x) + P(x)): ProjectedResidual<P, Ls...> and the activation after it in one layer,
//! as ResidualAct.
//! Usage: `ProjectedResidualAct<ReLU, Stage<Conv2d<S16, 32, 1, ConvOptions{.stride = 2}>,
//! BN32>, ...>`.
template <class Act, class Shortcut, class... Ls>
using ProjectedResidualAct = ResidualBlock<Shortcut, Act, Ls...>;

}  // namespace xpipe
