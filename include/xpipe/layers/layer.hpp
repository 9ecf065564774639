// The Layer concept: what Stage<Layers...> requires of each layer, with one readable
// static_assert per missing member.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <numeric>
#include <span>

#include "xpipe/backend/host.hpp"
#include "xpipe/core/tensor.hpp"
#include "xpipe/kernels/activation.hpp"

namespace xpipe {

//! Width of a layer that keeps whatever width it receives (activations).
inline constexpr int any_width = 0;

//! What a forward is for, and where its layer's non-trainable state lives (BatchNorm's running
//! statistics: `state_count` floats of the stage's state buffer, checkpointed, never optimised
//! or predicted). Training forwards use and update the batch's statistics; evaluation reads the
//! state. Stage::forward hands each layer that declares state its part of the stage's buffer.
//! Usage: `S::forward(ctx, w, x, acts, Running{state.data(), /*training=*/false});`
struct Running {
  float* state = nullptr;
  bool training = true;
};

namespace detail {
template <class L>
concept HasInWidth = requires {
  { L::in_width } -> std::convertible_to<int>;
};
template <class L>
concept HasOutWidth = requires {
  { L::out_width } -> std::convertible_to<int>;
};
template <class L>
concept HasParamCount = requires {
  { L::param_count } -> std::convertible_to<index_t>;
};
template <class L>
concept HasInit = requires(std::span<float> p, std::uint64_t seed) {
  L::init(p, seed);
};
template <class L, class B>
concept HasForward = requires(const typename B::Context& ctx, const float* p, ConstMatrix x,
                              Matrix y) {
  L::forward(ctx, p, x, y);
};
template <class L, class B>
concept HasBackward = requires(const typename B::Context& ctx, const float* p, float* g, bool acc,
                               ConstMatrix x, ConstMatrix y, ConstMatrix dy, Matrix dx) {
  L::backward(ctx, p, g, acc, x, y, dy, dx);
};
// A backward that also takes a writable buffer of rows x out_width floats, distinct from dy and
// dx, for an intermediate gradient (Dense's dz).
template <class L, class B>
concept HasScratchBackward = requires(const typename B::Context& ctx, const float* p, float* g,
                                      bool acc, ConstMatrix x, ConstMatrix y, ConstMatrix dy,
                                      Matrix dx, Matrix scratch) {
  L::backward(ctx, p, g, acc, x, y, dy, dx, scratch);
};
// What a layer needs only while one of its calls runs (a convolution's primitives and buffers,
// the partial sums of BatchNorm's reductions): L::Workspace<B>, built from the most rows a call
// takes, one per stage. Its Saved<B> is also built from (rows, the stage's Workspace<B>&) and
// keeps a WorkspaceRef to it.
template <class L, class B>
concept HasWorkspace = requires {
  typename L::template Workspace<B>;
  typename L::template Saved<B>;
}
&&std::constructible_from<typename L::template Workspace<B>, index_t> &&
    (std::constructible_from<typename L::template Saved<B>, index_t,
                             typename L::template Workspace<B>&> ||
     std::constructible_from<typename L::template Saved<B>, index_t, bool,
                             typename L::template Workspace<B>&>);
// What a layer keeps per micro-batch beyond its output (BatchNorm's statistics, attention's
// probabilities): L::Saved<B>, built from the slot's row capacity, one per activation slot.
template <class L, class B>
concept HasSaved = requires {
  typename L::template Saved<B>;
}
&&std::constructible_from<typename L::template Saved<B>, index_t>;
template <class L, class B>
concept HasSavedForward = HasSaved<L, B> &&
    requires(const typename B::Context& ctx, const float* p, ConstMatrix x, Matrix y,
             typename L::template Saved<B>& s) {
  L::forward(ctx, p, x, y, s);
};
// A forward that also takes the layer's part of the stage's non-trainable state (Running).
template <class L, class B>
concept HasStateForward = HasSaved<L, B> &&
    requires(const typename B::Context& ctx, const float* p, ConstMatrix x, Matrix y,
             typename L::template Saved<B>& s, Running run) {
  { L::state_count } -> std::convertible_to<index_t>;
  L::init_state(std::span<float>{});
  L::forward(ctx, p, x, y, s, run);
};
// The forward of a layer that ends a residual block's path with the block's sum
// (fuses_residual_sum), probed with the identity after the sum.
template <class L, class B>
concept HasForwardSum = HasSaved<L, B> &&
    requires(const typename B::Context& ctx, const float* p, ConstMatrix x, ConstMatrix skip,
             Matrix y, typename L::template Saved<B>& s, Running run) {
  L::template forward_sum<math::Identity>(ctx, p, x, skip, y, s, run);
};
template <class L, class B>
concept HasSavedBackward = HasSaved<L, B> &&
    requires(const typename B::Context& ctx, const float* p, float* g, bool acc, ConstMatrix x,
             ConstMatrix y, ConstMatrix dy, Matrix dx, typename L::template Saved<B>& s) {
  L::backward(ctx, p, g, acc, x, y, dy, dx, s);
};
// The split backward (zero-bubble schedules): an input-gradient part that may overwrite the
// slot's own dy with what the weight part needs, and a weight-gradient part that reads no
// parameters; with the layer's Saved<B> as last argument where it keeps one.
template <class L, class B>
concept HasPlainSplitBackward = requires(const typename B::Context& ctx, const float* p, float* g,
                                         bool acc, ConstMatrix x, ConstMatrix y, Matrix dy,
                                         ConstMatrix kept, Matrix dx) {
  L::backward_input(ctx, p, x, y, dy, dx);
  L::backward_weight(ctx, g, acc, x, y, kept);
};
template <class L, class B>
concept HasSavedSplitBackward = HasSaved<L, B> &&
    requires(const typename B::Context& ctx, const float* p, float* g, bool acc, ConstMatrix x,
             ConstMatrix y, Matrix dy, ConstMatrix kept, Matrix dx,
             typename L::template Saved<B>& s) {
  L::backward_input(ctx, p, x, y, dy, dx, s);
  L::backward_weight(ctx, g, acc, x, y, kept, s);
};
}  // namespace detail

//! How many of a model's layer numbers (seed sub-streams of Stage::init) layer L takes: 1, or
//! L::init_streams where L declares it (Dense stands for a Linear and its activation: 2, so it
//! draws the weights `Linear, ReLU` draw from the same seed).
//! Usage: `static_assert(init_streams<Dense<4, 3, ReLU>>() == 2);`
template <class L>
consteval std::size_t init_streams() {
  if constexpr (requires { L::init_streams; }) {
    static_assert(L::init_streams >= 1, "xpipe: Layer: init_streams must be at least 1");
    return static_cast<std::size_t>(L::init_streams);
  } else {
    return 1;
  }
}

//! Whether layer L's backward takes a gradient scratch buffer on backend B (Stage provides one).
//! A layer that keeps a Saved takes that instead (a backward templated on its last argument
//! would accept a Matrix too).
//! Usage: `if constexpr (takes_grad_scratch<L, Ctx::backend>) L::backward(..., dx, scratch);`
template <class L, class B = Host>
inline constexpr bool takes_grad_scratch =
    detail::HasScratchBackward<L, B> && !detail::HasSaved<L, B>;

//! What a layer's Saved<B> holds of its Workspace W: the stage's, which every activation slot of
//! the stage shares (a stage runs one call at a time), or one of its own where the slot was made
//! alone (Saved(rows): a test, a layer called outside a Stage).
//! Usage: `WorkspaceRef<Workspace<B>> ws;  ...  ws->plans.forward(...)`.
template <class W>
class WorkspaceRef {
 public:
  //! Its own workspace for calls of up to `max_rows` rows.
  explicit WorkspaceRef(index_t max_rows)
      : own_(std::make_unique<W>(max_rows)), workspace_(own_.get()) {}
  //! The stage's, which outlives the slot.
  explicit WorkspaceRef(W& shared) : workspace_(&shared) {}
  W& operator*() const { return *workspace_; }
  W* operator->() const { return workspace_; }

 private:
  std::unique_ptr<W> own_;
  W* workspace_;
};

//! Whether layer L keeps a workspace on backend B (L::Workspace<B>): what it needs only while one
//! of its calls runs, one per stage, reached through each slot's Saved<B>.
//! Usage: `static_assert(keeps_workspace<Conv2d<Shape<1, 8, 8>, 4, 3>>);`
template <class L, class B = Host>
inline constexpr bool keeps_workspace = detail::HasWorkspace<L, B>;

//! Floats of layer L's own workspace buffers on B for calls of up to `rows` rows
//! (L::workspace_floats<B>, where it says; 0 else), beside what it takes from the stage's arena:
//! counted once per stage in the reported activation memory.
//! Usage: `workspace_floats_of<BatchNorm2d<Shape<16, 28, 28>>>(128)`.
template <class L, class B = Host>
constexpr index_t workspace_floats_of(index_t rows) {
  if constexpr (requires { L::template workspace_floats<B>(rows); })
    return L::template workspace_floats<B>(rows);
  else
    return 0;
}

//! Floats one call of layer L takes from its stage's arena on B, for up to `rows` rows
//! (L::arena_floats<B>, where it says; 0 else): memory only that call uses, which every layer of
//! the stage uses in turn (attention's dP and dS, a convolution's CUDA column buffer). A stage
//! holds the largest, once. Usage: `arena_floats_of<CausalSelfAttention<64, 4, 128>>(2048)`.
template <class L, class B = Host>
constexpr index_t arena_floats_of(index_t rows) {
  if constexpr (requires { L::template arena_floats<B>(rows); })
    return L::template arena_floats<B>(rows);
  else
    return 0;
}

//! Whether layer L keeps state per micro-batch slot on backend B (L::Saved<B>): Stage's
//! Activations then hold one, and L's forward and backward take it as their last argument.
//! Usage: `if constexpr (keeps_saved<L, B>) L::forward(ctx, p, x, y, acts.template saved<I>());`
template <class L, class B = Host>
inline constexpr bool keeps_saved = detail::HasSaved<L, B>;

//! Floats of non-trainable state layer L keeps (L::state_count; 0 for most layers).
template <class L>
consteval index_t state_count_of() {
  if constexpr (requires { L::state_count; })
    return static_cast<index_t>(L::state_count);
  else
    return 0;
}

//! Rows layer L needs kept together, in order, in every micro-batch it runs on (L::row_group:
//! causal attention's sequence length, whose rows are one sequence's tokens; 1 for the others).
//! A micro-batch's rows must be a whole number of groups.
//! Usage: `static_assert(row_group_of<CausalSelfAttention<64, 4, 128>>() == 128);`
template <class L>
consteval index_t row_group_of() {
  if constexpr (requires { L::row_group; }) {
    static_assert(L::row_group >= 1, "xpipe: Layer: row_group must be at least 1");
    return static_cast<index_t>(L::row_group);
  } else {
    return 1;
  }
}

//! The least common multiple of row groups: the group of rows that keeps every one of them
//! whole (Stage over its layers, Pipeline over its stages). Usage: `lcm_of({4, 6}) == 12`.
consteval index_t lcm_of(std::initializer_list<index_t> groups) {
  index_t g = 1;
  for (index_t n : groups) g = std::lcm(g, n);
  return g;
}

//! Multiply-adds of layer L's forward per row (L::macs, declared by the layers that multiply:
//! Linear, Conv2d, blocks and stages summing theirs; 0 for the others). The planner's flops.
template <class L>
consteval double macs_of() {
  if constexpr (requires { L::macs; })
    return static_cast<double>(L::macs);
  else
    return 0;
}

//! Whether layer L can run its backward in two parts on backend B (zero-bubble schedules): a
//! layer without parameters always can (its backward is all input gradient); one with
//! parameters when it declares backward_input and backward_weight (see Layer below).
//! Usage: `static_assert(splits_backward<Linear<4, 3>>);`
template <class L, class B = Host>
inline constexpr bool splits_backward =
    L::param_count == 0 || detail::HasPlainSplitBackward<L, B> ||
    detail::HasSavedSplitBackward<L, B>;

//! Whether layer L's two halves may run at once (L declares
//! `static constexpr bool input_half_keeps_dy = true`): its input half writes nothing its weight
//! half reads (dy, its Saved, any cache), and its weight half nothing its input half reads.
//! Linear declares it; Dense (its input half writes dz over dy) and Conv2d (its halves share a
//! reorder of dy) do not. Stage::backward_in_lanes then starts the weight half with the input half.
//! Usage: `static_assert(input_half_keeps_dy<Linear<4, 3>>);`
template <class L>
inline constexpr bool input_half_keeps_dy = requires {
  requires L::input_half_keeps_dy;
};

//! Whether layer L can end the path of a residual block with the block's sum in its own forward
//! pass (L declares `static constexpr bool fuses_residual_sum = true` and has
//! `forward_sum<Post>(ctx, params, x, skip, y, saved, run)`: y = Post(L's output + skip), the bits
//! of its forward then the block's add_views<Post>). Its own output is then never written, so
//! its backward must not read it. BatchNorm2d declares it; ResidualBlock uses it. A layer that
//! declares it without forward_sum is refused, naming it (check_layer, Stage::forward).
//! Usage: `static_assert(fuses_residual_sum<BatchNorm2d<Shape<16, 28, 28>>>);`
template <class L>
inline constexpr bool fuses_residual_sum = requires {
  requires L::fuses_residual_sum;
};

//! Whether layer L's forward takes a Running (its state, and training or evaluation) on B.
template <class L, class B = Host>
inline constexpr bool takes_running = detail::HasStateForward<L, B>;

//! Layer: a stateless description of one layer; its parameters live in the stage's flat buffer.
//! Its compute functions are probed with backend B's context (a layer written only for CUDA
//! is a Layer<L, Cuda>). Stage<...> checks the backend-free members (check_layer_shape);
//! Pipeline checks forward and backward on its own backend (check_layer<L, B>).
//! Required members:
//!   - `static constexpr int in_width, out_width` (`any_width` for width-preserving layers);
//!   - `static constexpr index_t param_count` (0 for parameter-free layers);
//!   - `static void init(std::span<float> params, std::uint64_t seed)`;
//!   - `static void forward(const Ctx&, const float* params, ConstMatrix x, Matrix y)`;
//!   - `static void backward(const Ctx&, const float* params, float* grads, bool accumulate,
//!                           ConstMatrix x, ConstMatrix y, ConstMatrix dy, Matrix dx)`,
//!     where dx may be empty (the first layer of a model needs no input gradient); or the same
//!     with a last `Matrix scratch` argument: rows x out_width floats of the stage's, distinct
//!     from dy and dx, for the layer to write an intermediate gradient into (Dense).
//! Optional:
//!   - `static constexpr std::size_t init_streams` (default 1), how many of the model's layer
//!     numbers, and so seed sub-streams, the layer takes (Dense: 2, as `Linear, ReLU`);
//!   - `static constexpr index_t row_group` (default 1): rows that must stay together and in
//!     order in every micro-batch (CausalSelfAttention: its sequence length); Stage, Pipeline
//!     and SequentialTrainer split batches in whole groups;
//!   - `using in_shape = Shape<C, H, W>;` and `using out_shape = ...;` (core/shape.hpp): the
//!     image a layer takes or gives, checked against its neighbours' by Stage and Pipeline;
//!   - `template <class B> struct Saved`, constructible from the slot's row capacity: what the
//!     layer keeps per micro-batch slot beyond its output (BatchNorm's statistics). Its
//!     forward and backward then take a `Saved<B>&` as their last argument instead;
//!   - with Saved: `template <class B> struct Workspace`, constructible from the most rows a
//!     call takes: what the layer needs only while one call runs (Conv2d's oneDNN primitives
//!     and reorder buffers, its CUDA column buffer; attention's dP and dS). Stage keeps one per
//!     stage, shared by all its slots (a stage runs one call at a time), and builds each slot's
//!     Saved from (rows, that Workspace<B>&), or (rows, keep_gradients, Workspace<B>&); the
//!     Saved keeps a WorkspaceRef, which makes its own when the Saved is built from rows alone.
//!     Nothing in it may outlive the call: a slot's backward finds it as other slots left it.
//!     `template <class B> static constexpr index_t workspace_floats(index_t rows)` says its
//!     size for the memory report. What only one call uses may come from the stage's arena,
//!     which all its layers use in turn: the Workspace is then also constructible from
//!     (rows, float* arena) and the layer says `template <class B> static constexpr index_t
//!     arena_floats(index_t rows)` (left out of workspace_floats; a Workspace made from rows
//!     alone allocates it);
//!   - with Saved: `static constexpr index_t state_count` and `static void init_state(span)`:
//!     non-trainable state (BatchNorm's running statistics); its forward then takes a last
//!     `Running` argument: its part of the stage's state buffer, and whether it trains;
//!   - the split backward that zero-bubble schedules run (layers with parameters; each with a
//!     last `Saved<B>&` where the layer keeps one):
//!     `static void backward_input(const Ctx&, const float* params, ConstMatrix x, ConstMatrix y,
//!                                 Matrix dy, Matrix dx)`: dx only, no parameter gradient; dy is
//!     the micro-batch's own buffer, which it may overwrite with what the weight part needs;
//!     `static void backward_weight(const Ctx&, float* grads, bool accumulate, ConstMatrix x,
//!                                  ConstMatrix y, ConstMatrix dy)`: the parameter gradient from
//!     what backward_input left, later (other micro-batches may run in between). Together they
//!     give bitwise what backward gives;
//!   - with the split backward: `static constexpr bool input_half_keeps_dy = true` when its two
//!     halves may run at once on two threads (input_half_keeps_dy above; Linear);
//!   - with Running: `static constexpr bool fuses_residual_sum = true` and
//!     `template <class Post> static void forward_sum(const Ctx&, const float* params,
//!     ConstMatrix x, ConstMatrix skip, Matrix y, Saved<B>&, Running)`, y = Post(its output +
//!     skip), when it may end a residual block's path with the block's sum in its own pass
//!     (fuses_residual_sum above; BatchNorm2d). Its backward must then not read its output.
template <class L, class B = Host>
concept Layer = detail::HasInWidth<L> && detail::HasOutWidth<L> && detail::HasParamCount<L> &&
    detail::HasInit<L> &&(detail::HasForward<L, B> || detail::HasSavedForward<L, B> ||
                          detail::HasStateForward<L, B>)&&(detail::HasBackward<L, B> ||
                                                           detail::HasScratchBackward<L, B> ||
                                                           detail::HasSavedBackward<L, B>);

//! Fails to compile with a message naming the first backend-free member L lacks (widths,
//! param_count, init): what Stage<...> needs whatever the backend.
template <class L>
consteval bool check_layer_shape() {
  static_assert(detail::HasInWidth<L>, "xpipe: Layer: missing static member in_width");
  static_assert(detail::HasOutWidth<L>, "xpipe: Layer: missing static member out_width");
  static_assert(detail::HasParamCount<L>, "xpipe: Layer: missing static member param_count");
  static_assert(detail::HasInit<L>, "xpipe: Layer: missing static init(std::span<float>, seed)");
  return true;
}

//! Fails to compile, naming the member, where L (which declares fuses_residual_sum) has no
//! forward_sum on backend B. Called by check_layer and by Stage::forward with a SumInto.
template <class L, class B = Host>
consteval bool check_forward_sum() {
  static_assert(detail::HasForwardSum<L, B>,
                "xpipe: Layer: declares fuses_residual_sum but has no static "
                "forward_sum<Post>(ctx, params, x, skip, y, Saved<B>&, Running) for this "
                "backend's context");
  return true;
}

//! Fails to compile with a message naming the first member L lacks on backend B.
template <class L, class B = Host>
consteval bool check_layer() {
  static_assert(check_layer_shape<L>());
  static_assert(
      detail::HasForward<L, B> || detail::HasSavedForward<L, B> || detail::HasStateForward<L, B>,
      "xpipe: Layer: missing static forward(ctx, params, ConstMatrix x, Matrix y"
      "[, Saved<B>&[, Running]]) for this backend's context");
  static_assert(detail::HasBackward<L, B> || detail::HasScratchBackward<L, B> ||
                    detail::HasSavedBackward<L, B>,
                "xpipe: Layer: missing static backward(ctx, params, grads, accumulate, x, y, dy, "
                "dx[, scratch or Saved<B>&]) for this backend's context");
  if constexpr (fuses_residual_sum<L>) static_assert(check_forward_sum<L, B>());
  return true;
}

}  // namespace xpipe
