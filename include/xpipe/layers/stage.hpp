// Stage<Layers...>: a compile-time chain of layers with checked widths, one flat parameter layout,
// and forward/backward over caller-owned buffers (so executors can keep several micro-batches).
#pragma once

#include <cxxabi.h>
#include <algorithm>
#include <array>
#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <tuple>
#include <typeinfo>
#include <utility>

#include "xpipe/backend/backend.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/core/random.hpp"
#include "xpipe/core/shape.hpp"
#include "xpipe/layers/layer.hpp"

namespace xpipe {

namespace detail {

// Instantiated once per layer; on a mismatch the compiler prints the template arguments, which
// name the layer (counted from 0 within the stage) and both widths.
template <std::size_t LayerIndex, int PreviousOutWidth, int LayerInWidth>
struct LayerWidthCheck {
  static_assert(
      PreviousOutWidth == LayerInWidth,
      "xpipe: Stage: layer input width does not match the previous layer's output "
      "width (LayerWidthCheck<LayerIndex, PreviousOutWidth, LayerInWidth> above names them)");
  static constexpr bool value = true;
};

// As LayerWidthCheck, for image shapes: where a boundary carries a shape and the layer after it
// declares the shape it takes, the two must agree (a 784-wide 1x28x28 image is not a 4x14x14).
template <std::size_t LayerIndex, Dims PreviousOutShape, Dims LayerInShape>
struct LayerShapeCheck {
  static_assert(!PreviousOutShape.known() || !LayerInShape.known() ||
                    PreviousOutShape == LayerInShape,
                "xpipe: Stage: layer input shape does not match the previous layer's output "
                "shape (LayerShapeCheck<LayerIndex, PreviousOutShape, LayerInShape> above names "
                "them as Dims{channels, height, width})");
  static constexpr bool value = true;
};

// The image shape at each boundary: a layer's out_shape; what a width-preserving layer (ReLU)
// receives; none after a layer that gives a flat width. Boundary 0 is the first layer's in_shape,
// or that of the first shaped layer behind width-preserving ones.
template <class... Ls>
consteval std::array<Dims, sizeof...(Ls) + 1> boundary_dims() {
  constexpr std::array<Dims, sizeof...(Ls)> ins{layer_in_dims<Ls>()...};
  constexpr std::array<Dims, sizeof...(Ls)> outs{layer_out_dims<Ls>()...};
  constexpr std::array<bool, sizeof...(Ls)> keeps{(Ls::out_width == any_width)...};
  std::array<Dims, sizeof...(Ls) + 1> d{};
  for (std::size_t i = 0; i < ins.size(); ++i) {
    if (ins[i].known()) {
      d[0] = ins[i];
      break;
    }
    if (!keeps[i]) break;
  }
  for (std::size_t i = 0; i < ins.size(); ++i) d[i + 1] = keeps[i] ? d[i] : outs[i];
  return d;
}

// Floats a layer keeps per micro-batch beyond its output, where it says (L::saved_floats).
template <class L>
constexpr index_t saved_floats_of(index_t rows) {
  if constexpr (requires { L::saved_floats(rows); })
    return L::saved_floats(rows);
  else
    return 0;
}

// Floats a layer keeps per micro-batch between the halves of a split backward inside its own
// Saved (a residual block's inner gradients), where it says (L::kept_gradient_floats).
template <class L>
constexpr index_t kept_floats_of(index_t rows) {
  if constexpr (requires { L::kept_gradient_floats(rows); })
    return L::kept_gradient_floats(rows);
  else
    return 0;
}

// What stands for a layer's Saved<B> or Workspace<B> where it keeps none.
struct NothingKept {
  explicit NothingKept(index_t) {}
};
// Saved<B> of a layer that keeps one, or nothing; likewise Workspace<B>.
template <class L, class B>
struct SavedOf {
  using type = NothingKept;
};
template <class L, class B>
requires HasSaved<L, B>
struct SavedOf<L, B> {
  using type = typename L::template Saved<B>;
};
template <class L, class B>
struct WorkspaceOf {
  using type = NothingKept;
};
template <class L, class B>
requires HasWorkspace<L, B>
struct WorkspaceOf<L, B> {
  using type = typename L::template Workspace<B>;
};

// Layer I's contract with its stage's workspace on B, checked where Stage::Workspace<B> is made:
// a Workspace<B> it declares must be reachable from its Saved<B>, and an arena share it asks must
// be taken through a Workspace<B> built on the arena.
template <std::size_t I, class L, class B>
struct WorkspaceContract {
  static constexpr bool declares = requires { typename L::template Workspace<B>; };
  static_assert(!declares || HasWorkspace<L, B>,
                "xpipe: Stage::Workspace: layer I (the first template argument) declares "
                "Workspace<B> but its Saved<B> has no constructor from (rows, Workspace<B>&) or "
                "(rows, keep_gradients, Workspace<B>&), so its slots would not share it");
  static constexpr bool asks_arena = requires(index_t rows) { L::template arena_floats<B>(rows); };
  static_assert(!asks_arena ||
                    (declares &&
                     std::constructible_from<typename WorkspaceOf<L, B>::type, index_t, float*>),
                "xpipe: Stage::Workspace: layer I (the first template argument) says "
                "arena_floats<B> but its Workspace<B> has no constructor from (rows, float* "
                "arena), so it would not use the stage's arena");
  static constexpr bool ok = true;
};

// A layer's Saved for one slot: on the stage's workspace where the layer keeps one and the slot
// was given it (else the Saved makes its own), told whether a split backward will run on it
// where its constructor asks (a residual block's), sized from the slot's rows.
template <class T, class W = NothingKept>
T make_saved(index_t rows, bool keep_gradients, W* workspace = nullptr) {
  if constexpr (!std::is_same_v<W, NothingKept>) {
    if (workspace != nullptr) {
      if constexpr (std::constructible_from<T, index_t, bool, W&>)
        return T(rows, keep_gradients, *workspace);
      else
        return T(rows, *workspace);
    }
  }
  if constexpr (std::constructible_from<T, index_t, bool>)
    return T(rows, keep_gradients);
  else
    return T(rows);
}

// How errors name a layer type: its own name() where it has one (Conv2d), else the compiler's.
template <class L>
std::string layer_label() {
  if constexpr (requires { L::name(); }) {
    return std::string(L::name());
  } else {
    int status = 0;
    char* readable = abi::__cxa_demangle(typeid(L).name(), nullptr, nullptr, &status);
    std::string out = status == 0 && readable != nullptr ? readable : typeid(L).name();
    std::free(readable);
    return out;
  }
}

template <class... Ls>
consteval std::array<int, sizeof...(Ls) + 1> boundary_widths() {
  constexpr std::array<int, sizeof...(Ls)> ins{Ls::in_width...};
  constexpr std::array<int, sizeof...(Ls)> outs{Ls::out_width...};
  std::array<int, sizeof...(Ls) + 1> w{};
  // Width-preserving layers before the first fixed one take that layer's input width.
  for (std::size_t i = 0; i < ins.size(); ++i)
    if (ins[i] != any_width) {
      w[0] = ins[i];
      break;
    }
  for (std::size_t i = 0; i < ins.size(); ++i) w[i + 1] = outs[i] != any_width ? outs[i] : w[i];
  return w;
}

}  // namespace detail

//! The sum a residual block adds after its path (the last argument of Stage::forward): y =
//! Post(the stage's output + skip), Post an activation's per-element function (math::Relu) or
//! math::Identity, computed by the stage's last layer in its own pass (fuses_residual_sum).
template <class Post>
struct SumInto {
  ConstMatrix skip;
  Matrix y;
};

//! The options of a stage's activation slot (Stage::Activations): what it has room for beside
//! the inner layers' outputs and what each layer keeps per micro-batch.
//! Usage: `S::Activations<Host> a(32, {.kept_gradients = true}, &ws);`
struct SlotRoom {
  //! What a split backward keeps between its halves: the output gradients of the layers with
  //! parameters (Stage::Activations::kept).
  bool kept_gradients = false;
  //! The stage's own output. False for a residual block's path whose last layer writes the
  //! block's sum instead (forward with a SumInto; the plain forward refuses such a slot).
  bool output = true;
};

//! A pipeline stage: layers run in order on one device. Widths are checked at compile time.
//! Usage: `using S0 = Stage<Linear<784, 1024>, ReLU>;`
template <class... Ls>
struct Stage {
  static_assert(sizeof...(Ls) > 0, "xpipe: Stage: needs at least one layer");
  static_assert((check_layer_shape<Ls>() && ...));
  static_assert(((Ls::in_width != any_width) || ...),
                "xpipe: Stage: needs at least one layer with a fixed width (e.g. a Linear)");

  static constexpr std::size_t layer_count = sizeof...(Ls);
  using layers = std::tuple<Ls...>;
  template <std::size_t I>
  using layer = std::tuple_element_t<I, layers>;

  //! widths[i] is the input width of layer i; widths[layer_count] the stage's output width.
  static constexpr std::array<int, layer_count + 1> widths = detail::boundary_widths<Ls...>();
  static constexpr int in_width = widths[0];
  static constexpr int out_width = widths[layer_count];
  //! shapes[i]: the image shape at boundary i, Dims{} where it is a flat width.
  static constexpr std::array<Dims, layer_count + 1> shapes = detail::boundary_dims<Ls...>();
  //! The image shape the stage takes and gives (Dims{} when flat); Pipeline checks neighbours.
  static constexpr Dims in_shape = shapes[0];
  static constexpr Dims out_shape = shapes[layer_count];

  //! Every layer's forward and backward exist for backend B (Pipeline checks this for its own).
  template <class B>
  static consteval bool check_backend() {
    return (check_layer<Ls, B>() && ...);
  }

 private:
  template <std::size_t... I>
  static consteval bool check_widths(std::index_sequence<I...>) {
    return (
        detail::LayerWidthCheck<I, widths[I],
                                (Ls::in_width == any_width ? widths[I] : Ls::in_width)>::value &&
        ...);
  }
  static_assert(check_widths(std::index_sequence_for<Ls...>{}));
  template <std::size_t... I>
  static consteval bool check_shapes(std::index_sequence<I...>) {
    return (detail::LayerShapeCheck<I, shapes[I], layer_in_dims<Ls>()>::value && ...);
  }
  static_assert(check_shapes(std::index_sequence_for<Ls...>{}));
  static_assert(((!layer_in_dims<Ls>().known() || layer_in_dims<Ls>().size() == Ls::in_width) &&
                 ...),
                "xpipe: Stage: a layer's in_shape does not hold in_width floats");

  static consteval std::array<index_t, layer_count + 1> offsets() {
    constexpr std::array<index_t, layer_count> counts{Ls::param_count...};
    std::array<index_t, layer_count + 1> o{};
    // Each layer's block starts on a 16-float (64-byte) boundary: aligned GEMM operands.
    for (std::size_t i = 0; i < layer_count; ++i) o[i + 1] = o[i] + round_up_to_line(counts[i]);
    return o;
  }

 public:
  //! param_offsets[i] is where layer i's parameters start in the flat buffer.
  static constexpr std::array<index_t, layer_count + 1> param_offsets = offsets();
  //! Length of the stage's flat parameter (and gradient, and moment) buffer.
  static constexpr index_t param_count = param_offsets[layer_count];
  //! Floats of every layer's output for `rows` rows: the Activations' own buffer.
  static constexpr index_t boundary_floats(index_t rows) {
    index_t n = 0;
    for (std::size_t i = 1; i <= layer_count; ++i) n += rows * widths[i];
    return n;
  }
  //! Floats of activations one micro-batch of `rows` rows keeps, as reported: every layer's
  //! output, and what layers keep beyond it in their Saved (L::saved_floats(rows): a residual
  //! block's inner activations, BatchNorm's statistics).
  static constexpr index_t activation_floats(index_t rows) {
    return boundary_floats(rows) + (detail::saved_floats_of<Ls>(rows) + ... + 0);
  }
  //! Floats of the stage's Workspace<B> for calls of up to `rows` rows, as reported once per
  //! stage beside its slots: what layers need only while a call runs (a residual block's inner
  //! gradients, BatchNorm's partial sums; on the arena, attention's dP and dS and the CUDA
  //! convolution's column buffer), where they say (workspace_floats_of, arena_floats_of). A
  //! host convolution's oneDNN primitives and buffers live there too, uncounted: their sizes
  //! are oneDNN's choice.
  //! Usage: `const index_t n = S::workspace_floats<Host>(128);`
  template <class B = DefaultBackend>
  static constexpr index_t workspace_floats(index_t rows) {
    return own_workspace_floats<B>(rows) + arena_floats<B>(rows);
  }
  //! The layers' own workspace buffers, without the arena (workspace_floats_of).
  template <class B = DefaultBackend>
  static constexpr index_t own_workspace_floats(index_t rows) {
    return (xpipe::workspace_floats_of<Ls, B>(rows) + ... + 0);
  }
  //! Floats of the stage's arena: the most one layer's call takes (arena_floats_of), since they
  //! run one after another.
  template <class B = DefaultBackend>
  static constexpr index_t arena_floats(index_t rows) {
    return std::max({index_t{0}, xpipe::arena_floats_of<Ls, B>(rows)...});
  }
  //! kept_offsets[i]: where layer i's kept output gradient starts in a slot's kept buffer, per
  //! row; only layers with parameters keep one (a split backward's W reads it). The offsets are
  //! in floats per row: block i of a slot for `rows` rows starts at rows * kept_offsets[i].
  static constexpr std::array<index_t, layer_count + 1> kept_offsets = [] {
    constexpr std::array<index_t, layer_count> counts{Ls::param_count...};
    std::array<index_t, layer_count + 1> o{};
    for (std::size_t i = 0; i < layer_count; ++i)
      o[i + 1] = o[i] + (counts[i] > 0 ? widths[i + 1] : 0);
    return o;
  }();
  //! Floats a micro-batch of `rows` rows keeps between the halves of a split backward: the
  //! output gradient of every layer with parameters, and what layers keep inside (a residual
  //! block's inner gradients); reported with the activations.
  static constexpr index_t kept_gradient_floats(index_t rows) {
    return rows * kept_offsets[layer_count] + (detail::kept_floats_of<Ls>(rows) + ... + 0);
  }
  //! Whether every layer can split its backward on backend B (xpipe::splits_backward): what a
  //! schedule with InputGrad and WeightGrad actions needs.
  template <class B>
  static constexpr bool splits_backward = (xpipe::splits_backward<Ls, B> && ...);
  //! Whether every layer with parameters lets its weight half run beside its input half
  //! (input_half_keeps_dy: Linear): then backward_in_lanes keeps both lanes busy with GEMMs. Where
  //! a layer's weight half must wait for its input half (Dense, convolutions, LayerNorm), or a
  //! layer's input half does most of the work (attention), the lanes spend more time waiting
  //! than one backward on both threads loses (docs/results.md), and SequentialTrainer does not
  //! use them.
  //! A layer with parameters must also keep no workspace: the lanes' calls run at once, and
  //! only the input lane may touch the stage's workspace.
  static constexpr bool overlaps_halves =
      ((Ls::param_count == 0 || (input_half_keeps_dy<Ls> && !keeps_workspace<Ls, Host>)) && ...);
  //! The first layer that cannot split its backward on B, as "layer i (name)", or "" if none.
  template <class B>
  static std::string unsplit_layer() {
    std::string found;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            if (found.empty() && !xpipe::splits_backward<layer<I>, B>)
              found = "layer " + std::to_string(I) + " (" + detail::layer_label<layer<I>>() + ")";
          }(),
          ...);
    }
    (std::make_index_sequence<layer_count>{});
    return found;
  }
  //! The one text of a refused split: "layer i (name) has no split backward (backward_input and
  //! backward_weight)", or "" when every layer has one.
  template <class B>
  static std::string no_split_reason() {
    const std::string l = unsplit_layer<B>();
    return l.empty() ? l : l + " has no split backward (backward_input and backward_weight)";
  }

  static constexpr int max_width() {
    int m = 0;
    for (int w : widths) m = w > m ? w : m;
    return m;
  }
  //! Floats of one part of a GradScratch for `rows` rows: rows x max_width(), rounded up to 16
  //! (64 bytes), so each part starts aligned. Usage: `S::grad_scratch_part(32)`.
  static constexpr index_t grad_scratch_part(index_t rows) {
    return round_up_to_line(rows * max_width());
  }

  //! state_offsets[i]: where layer i's non-trainable state (BatchNorm's running statistics)
  //! starts in the stage's state buffer; state_count: that buffer's length (0 for most stages).
  static constexpr std::array<index_t, layer_count + 1> state_offsets = [] {
    constexpr std::array<index_t, layer_count> n{state_count_of<Ls>()...};
    std::array<index_t, layer_count + 1> o{};
    for (std::size_t i = 0; i < layer_count; ++i) o[i + 1] = o[i] + n[i];
    return o;
  }();
  static constexpr index_t state_count = state_offsets[layer_count];
  //! Multiply-adds of the forward per row, over the layers that declare theirs (macs_of).
  static constexpr double macs = (0.0 + ... + macs_of<Ls>());
  //! Rows kept together in every micro-batch: the least common multiple of its layers' groups.
  static constexpr index_t row_group = lcm_of({row_group_of<Ls>()...});

  //! Checks input rows in host memory the way the stage's first layer would before reading them,
  //! where it says how (a static `check_input(ConstMatrix, const char* who)`: Embedding's ids
  //! and positions): what a device pipeline runs before uploading its inputs, since the device's
  //! loops check nothing. A no-op for other stages. Usage:
  //! `S0::check_host_input(x, "xpipe: Pipeline::train");`
  static void check_host_input(ConstMatrix x, const char* who) {
    if constexpr (requires { layer<0>::check_input(x, who); }) layer<0>::check_input(x, who);
  }

  //! The initial non-trainable state (BatchNorm: running mean 0, variance 1), on the host.
  static void init_state(std::span<float> state) {
    if (static_cast<index_t>(state.size()) != state_count)
      throw ShapeError("xpipe: Stage::init_state: state buffer has " +
                       std::to_string(state.size()) + " floats, the stage needs " +
                       std::to_string(state_count));
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            if constexpr (state_count_of<layer<I>>() > 0)
              layer<I>::init_state(state.subspan(state_offsets[I], state_count_of<layer<I>>()));
          }(),
          ...);
    }
    (std::make_index_sequence<layer_count>{});
  }

  //! init_stream_offsets[i]: the seed sub-stream of layer i counted from the stage's first;
  //! one per layer, two for a Dense layer (xpipe::init_streams). seed_streams: the stage's total.
  static constexpr std::array<std::size_t, layer_count + 1> init_stream_offsets = [] {
    constexpr std::array<std::size_t, layer_count> n{xpipe::init_streams<Ls>()...};
    std::array<std::size_t, layer_count + 1> o{};
    for (std::size_t i = 0; i < layer_count; ++i) o[i + 1] = o[i] + n[i];
    return o;
  }();
  static constexpr std::size_t seed_streams = init_stream_offsets[layer_count];

  //! Seeded initialisation. Layer i of the stage draws from sub-stream first_layer +
  //! init_stream_offsets[i] of the seed (first_layer + i without Dense layers), so a model split
  //! into stages differently, or with its ReLUs fused into Dense layers, gets the same weights.
  static void init(std::span<float> params, std::uint64_t seed, std::size_t first_layer = 0) {
    if (static_cast<index_t>(params.size()) != param_count)
      throw ShapeError("xpipe: Stage::init: parameter buffer has " + std::to_string(params.size()) +
                       " floats, the stage needs " + std::to_string(param_count));
    std::fill(params.begin(), params.end(), 0.f);
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (layer<I>::init(params.subspan(param_offsets[I], layer<I>::param_count),
                      derive_seed(seed, first_layer + init_stream_offsets[I])),
       ...);
    }
    (std::make_index_sequence<layer_count>{});
  }

  //! What the stage's layers need only while one of their calls runs (their Workspace<B>:
  //! Conv2d's primitives, BatchNorm's partial sums) and the arena their calls use in turn
  //! (attention's dP and dS, the CUDA convolution's column buffer), one per stage for calls of
  //! up to max_rows rows. Every Activations made on it shares it: a stage runs one call at a
  //! time, and nothing in it outlives the call. It must not move once slots are made on it
  //! (they point into it); a layer that declares a Workspace<B> must build its Saved<B> on it,
  //! and one that takes from the arena must build its Workspace<B> on it, else this fails to
  //! compile naming the layer.
  //! Usage: `S::Workspace<Host> ws(128); S::Activations<Host> a(32, {}, &ws), b(32, {}, &ws);`
  template <class B = DefaultBackend>
  class Workspace {
   public:
    //! `arena`: arena_floats<B>(max_rows) floats on B that the layers' calls share (a block's
    //! inner stage takes its stage's); without one it allocates its own.
    explicit Workspace(index_t max_rows, float* arena = nullptr)
        : max_rows_(max_rows),
          arena_(arena, arena_floats<B>(max_rows)),
          layers_(make<typename detail::WorkspaceOf<Ls, B>::type>(max_rows, arena_.data())...) {
      static_assert(check_layers());
    }
    index_t max_rows() const { return max_rows_; }
    //! Layer I's Workspace<B> (detail::NothingKept for a layer that keeps none).
    template <std::size_t I>
    auto& get() {
      return std::get<I>(layers_);
    }
    //! Where the layers' calls take their arena_floats_of from.
    float* arena() const { return arena_.data(); }

   private:
    // Each layer's contract with the workspace: a declared Workspace<B> reached by its Saved<B>,
    // an arena share taken through its Workspace<B>.
    template <std::size_t... I>
    static consteval bool check_each(std::index_sequence<I...>) {
      return (detail::WorkspaceContract<I, Ls, B>::ok && ...);
    }
    static consteval bool check_layers() {
      return check_each(std::make_index_sequence<layer_count>{});
    }
    template <class W>
    static W make(index_t max_rows, float* arena) {
      if constexpr (std::constructible_from<W, index_t, float*>)
        return W(max_rows, arena);
      else
        return W(max_rows);
    }

    index_t max_rows_;
    ArenaOr<B> arena_;
    std::tuple<typename detail::WorkspaceOf<Ls, B>::type...> layers_;
  };

  //! Activations of one micro-batch through the stage, on backend B: the input view, every
  //! layer's output, and what layers keep per micro-batch beyond it (their Saved<B>, e.g.
  //! BatchNorm's statistics). Allocated once for up to max_rows rows; reused for every
  //! micro-batch.
  template <class B = DefaultBackend>
  class Activations {
   public:
    //! `room`: whether the slot also keeps what a split backward needs between its halves, and
    //! whether it has room for the stage's own output (SlotRoom). `workspace`: the stage's, which
    //! the layers' Saved then share (it must outlive the slot and take max_rows rows); without
    //! one each Saved makes its own.
    explicit Activations(index_t max_rows, SlotRoom room = {}, Workspace<B>* workspace = nullptr)
        : max_rows_(max_rows),
          room_(room),
          storage_(boundary_floats(max_rows) - (room.output ? 0 : max_rows * out_width)),
          kept_(room.kept_gradients ? max_rows * kept_offsets[layer_count] : 0),
          saved_(make_saved_all(max_rows, room.kept_gradients, checked(workspace, max_rows),
                                std::make_index_sequence<layer_count>{})) {}
    index_t max_rows() const { return max_rows_; }
    index_t rows() const { return rows_; }
    //! Boundary i: i = 0 is the stage input, i = layer_count its output (an empty view where
    //! the slot keeps none).
    Matrix boundary(std::size_t i) const {
      if (i == 0) return {const_cast<float*>(input_.data), input_.rows, input_.cols, input_.ld};
      if (i == layer_count && !room_.output) return {nullptr, rows_, widths[i]};
      index_t off = 0;
      for (std::size_t j = 1; j < i; ++j) off += max_rows_ * widths[j];
      return {const_cast<float*>(storage_.data()) + off, rows_, widths[i]};
    }
    ConstMatrix output() const { return boundary(layer_count); }
    //! Layer i's output gradient as a split backward keeps it (layers with parameters; the
    //! slot was made with SlotRoom::kept_gradients).
    Matrix kept(std::size_t i) const {
      return {const_cast<float*>(kept_.data()) + max_rows_ * kept_offsets[i], rows_, widths[i + 1]};
    }
    //! Whether the slot was made for a split backward (SlotRoom::kept_gradients).
    bool keeps_gradients() const { return room_.kept_gradients; }
    //! Whether the slot has room for the stage's output (SlotRoom::output).
    bool keeps_output() const { return room_.output; }
    //! Layer I's Saved<B> in this slot (detail::NothingKept for a layer that keeps none). The
    //! backward writes it too (caches), hence a mutable member behind a const slot.
    template <std::size_t I>
    auto& saved() const {
      return std::get<I>(saved_);
    }

    //! Binds the input of the next forward; it must stay valid until that micro-batch's backward.
    void bind_input(ConstMatrix x) {
      if (x.cols != in_width)
        throw ShapeError("xpipe: Stage: input has " + std::to_string(x.cols) +
                         " columns, the stage expects " + std::to_string(in_width));
      if (x.rows > max_rows_ || x.rows <= 0)
        throw ShapeError("xpipe: Stage: batch of " + std::to_string(x.rows) +
                         " rows does not fit activations allocated for " +
                         std::to_string(max_rows_));
      input_ = x;
      rows_ = x.rows;
    }

   private:
    using SavedTuple = std::tuple<typename detail::SavedOf<Ls, B>::type...>;
    static Workspace<B>* checked(Workspace<B>* workspace, index_t max_rows) {
      if (workspace != nullptr && workspace->max_rows() < max_rows)
        throw ShapeError("xpipe: Stage: activations of " + std::to_string(max_rows) +
                         " rows on a workspace made for " + std::to_string(workspace->max_rows()));
      return workspace;
    }
    template <std::size_t... I>
    static SavedTuple make_saved_all(index_t max_rows, bool keep_gradients, Workspace<B>* workspace,
                                     std::index_sequence<I...>) {
      return SavedTuple(detail::make_saved<typename detail::SavedOf<Ls, B>::type>(
          max_rows, keep_gradients,
          workspace == nullptr ? nullptr : &workspace->template get<I>())...);
    }

    index_t max_rows_;
    SlotRoom room_;
    index_t rows_ = 0;
    ConstMatrix input_{};
    typename B::template Buffer<float> storage_, kept_;
    mutable SavedTuple saved_;
  };

  //! Whether some layer's backward takes a gradient scratch buffer (Dense) on backend B.
  template <class B>
  static constexpr bool needs_grad_scratch = (xpipe::takes_grad_scratch<Ls, B> || ...);

  //! Floats of a GradScratch<B> for `rows` rows.
  template <class B = DefaultBackend>
  static constexpr index_t grad_scratch_floats(index_t rows) {
    return (needs_grad_scratch<B> ? 3 : 2) * grad_scratch_part(rows);
  }

  //! Two ping-pong buffers for gradients flowing back between layers (0 and 1), and a third (2)
  //! for the layers whose backward takes one, there only when some layer does: parts of one
  //! allocation of grad_scratch_floats<B>(max_rows), each starting on a 64-byte boundary. One
  //! set per stage suffices, since a stage runs one backward at a time.
  template <class B = DefaultBackend>
  class GradScratch {
   public:
    explicit GradScratch(index_t max_rows)
        : max_rows_(max_rows), buffer_(grad_scratch_floats<B>(max_rows)), base_(buffer_.data()) {}
    //! Part `which` (0, 1 or 2) as rows x width; the rows and width fit max_rows x max_width().
    Matrix get(int which, index_t rows, int width) const {
      return {base_ + which * grad_scratch_part(max_rows_), rows, width};
    }
    index_t max_rows() const { return max_rows_; }

   private:
    index_t max_rows_;
    typename B::template Buffer<float> buffer_;
    float* base_;  // buffer_'s floats, which a const GradScratch hands out to write
  };

  //! Runs every layer on `x` with the given flat parameters (latest, stashed or predicted);
  //! returns the output view (inside acts). `run`: training or evaluation, and the stage's
  //! state buffer (state_count floats on the context's backend) for the layers that keep state;
  //! a training forward without one leaves their running statistics alone.
  template <class Ctx, class Acts>
  static ConstMatrix forward(const Ctx& ctx, const float* params, ConstMatrix x, Acts& acts,
                             Running run = {}) {
    if (!acts.keeps_output())
      throw ShapeError(
          "xpipe: Stage::forward: the activation slot keeps no output (made for a residual "
          "block's path, whose last layer writes the block's sum: forward with a SumInto)");
    acts.bind_input(x);
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (layer_forward<I>(ctx, params, acts, run), ...);
    }
    (std::make_index_sequence<layer_count>{});
    return acts.output();
  }

  //! forward, and the sum of the residual block whose path the stage is: sum.y = Post(the
  //! stage's output + sum.skip), computed by the last layer in its own pass (its forward_sum,
  //! where it fuses_residual_sum), so the stage's own output is never written (the last layer's
  //! backward does not read it). The bits of forward and then add_views<Post>. Returns sum.y.
  template <class Post, class Ctx, class Acts>
  static ConstMatrix forward(const Ctx& ctx, const float* params, ConstMatrix x, Acts& acts,
                             Running run, SumInto<Post> sum) {
    using Last = layer<layer_count - 1>;
    static_assert(fuses_residual_sum<Last> && takes_running<Last, typename Ctx::backend>,
                  "xpipe: Stage::forward with a SumInto: the stage's last layer must compute the "
                  "residual sum in its forward (fuses_residual_sum, as BatchNorm2d does)");
    static_assert(check_forward_sum<Last, typename Ctx::backend>());
    acts.bind_input(x);
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (layer_forward<I>(ctx, params, acts, run), ...);
    }
    (std::make_index_sequence<layer_count - 1>{});
    constexpr std::size_t last = layer_count - 1;
    if constexpr (detail::HasForwardSum<Last, typename Ctx::backend>)  // else refused above
      Last::template forward_sum<Post>(ctx, params + param_offsets[last], acts.boundary(last),
                                       sum.skip, sum.y, acts.template saved<last>(),
                                       layer_running<last>(run));
    return sum.y;
  }

  //! Back-propagates dy (the gradient of the stage output) through every layer, writing
  //! (accumulate = false) or adding to (accumulate = true) the flat gradient buffer, and writing
  //! the input gradient into dx unless dx is empty. `params` must be the weights the matching
  //! forward used when forward and backward are to agree (PipeDream stashing, XPipe).
  template <class Ctx, class Acts, class Scratch>
  static void backward(const Ctx& ctx, const float* params, float* grads, bool accumulate,
                       const Acts& acts, ConstMatrix dy, Matrix dx, const Scratch& scratch) {
    backward(ctx, params, grads, accumulate, acts, dy, dx, scratch,
             [](const Ctx&, index_t, index_t) {});
  }

  //! backward, calling `done(ctx, first, count)` as soon as a parametered layer's gradient (its
  //! block of the flat buffer, [first, first + count), padding included) is complete, last first: a
  //! trainer steps that range then, while it is in cache (OptimizerState::step_in_parts). Layer I's
  //! backward reads the weights of layer I alone, so `done` may change that range's weights.
  template <class Ctx, class Acts, class Scratch, class Done>
  static void backward(const Ctx& ctx, const float* params, float* grads, bool accumulate,
                       const Acts& acts, ConstMatrix dy, Matrix dx, const Scratch& scratch,
                       Done&& done) {
    const index_t rows = acts.rows();
    if (dy.rows != rows || dy.cols != out_width)
      throw ShapeError("xpipe: Stage::backward: gradient is " + std::to_string(dy.rows) + "x" +
                       std::to_string(dy.cols) + ", expected " + std::to_string(rows) + "x" +
                       std::to_string(out_width));
    ConstMatrix upstream = dy;
    [&]<std::size_t... J>(std::index_sequence<J...>) {
      // Layers in reverse: layer I = layer_count - 1 - J.
      (
          [&] {
            constexpr std::size_t I = layer_count - 1 - J;
            Matrix down = I == 0 ? dx : scratch.get(static_cast<int>(J % 2), rows, widths[I]);
            layer_backward<I>(ctx, params, grads + param_offsets[I], accumulate, acts, upstream,
                              down, scratch);
            if constexpr (layer<I>::param_count > 0)  // its block, alignment padding included
              done(ctx, param_offsets[I], param_offsets[I + 1] - param_offsets[I]);
            upstream = down;
          }(),
          ...);
    }
    (std::make_index_sequence<layer_count>{});
  }

  //! The input half of a split backward: back-propagates dy through every layer into dx (unless
  //! empty) without touching the parameter gradient, keeping in the slot (acts, made with
  //! SlotRoom::kept_gradients) what backward_weight needs: each parametered layer's output gradient
  //! (or what the layer wrote over it) and its Saved. Needs splits_backward<B>.
  template <class Ctx, class Acts, class Scratch>
  static void backward_input(const Ctx& ctx, const float* params, const Acts& acts, ConstMatrix dy,
                             Matrix dx, const Scratch& scratch) {
    static_assert(splits_backward<typename Ctx::backend>,
                  "xpipe: Stage::backward_input: a layer of this stage has no split backward "
                  "(Stage::unsplit_layer<B>() names it)");
    Matrix upstream = start_split(ctx, acts, dy, "backward_input");
    [&]<std::size_t... J>(std::index_sequence<J...>) {
      (input_half<layer_count - 1 - J>(ctx, params, acts, upstream, dx, scratch), ...);
    }
    (std::make_index_sequence<layer_count>{});
  }

  //! The weight half: every parametered layer's gradient, written (accumulate = false) or added
  //! to the flat gradient buffer, from what backward_input kept in the slot. Reads no weights.
  //! backward_input then backward_weight give bitwise what backward gives.
  template <class Ctx, class Acts>
  static void backward_weight(const Ctx& ctx, float* grads, bool accumulate, const Acts& acts) {
    using B = typename Ctx::backend;
    static_assert(splits_backward<B>,
                  "xpipe: Stage::backward_weight: a layer of this stage has no split backward "
                  "(Stage::unsplit_layer<B>() names it)");
    [&]<std::size_t... J>(std::index_sequence<J...>) {
      (weight_half<layer_count - 1 - J>(ctx, grads, accumulate, acts), ...);
    }
    (std::make_index_sequence<layer_count>{});
  }

  //! The most floats backward_in_lanes hands to one `done` call: each layer's block goes in
  //! pieces, so that both lanes can share the steps.
  static constexpr index_t lane_piece = index_t{1} << 16;

  //! backward (with its `done` calls) on two host threads (run_two_lanes). Lane 0 runs the input
  //! halves, layer after layer. Lane 1 runs each parametered layer's weight half as soon as its
  //! output gradient is in the slot: while the layer's input half runs when that only reads it
  //! (input_half_keeps_dy: Linear), after it otherwise, so the two GEMMs of a layer run at once,
  //! each on one thread of a core of its own. Once both halves of a layer are done its block
  //! goes to `done(one, first, count)` in pieces of at most lane_piece floats, last layer first,
  //! taken by whichever lane is free (lane 1 while it waits for its next weight half, lane 0 once
  //! its input halves are done), `one` that lane's one-thread context: a trainer steps them there.
  //! Pieces of one block may be handed to both lanes at once: `done` must take disjoint ranges
  //! from two threads. The slot must keep gradients (SlotRoom::kept_gradients); needs
  //! splits_backward on the host. The bits are those of backward_input then backward_weight on a
  //! one-thread context, whatever the caller's thread count.
  //! Usage: `S::backward_in_lanes(w, g, false, slot, dy, Matrix{}, scratch,
  //!                              [&](const HostContext& one, index_t first, index_t n) {...});`
  template <class Acts, class Scratch, class Done>
  static void backward_in_lanes(const float* params, float* grads, bool accumulate,
                                const Acts& acts, ConstMatrix dy, Matrix dx, const Scratch& scratch,
                                Done&& done) {
    static_assert(splits_backward<Host>,
                  "xpipe: Stage::backward_in_lanes: a layer of this stage has no split backward "
                  "(Stage::unsplit_layer<Host>() names it)");
    constexpr int top = static_cast<int>(layer_count);
    // Down to i: the input halves of layers top - 1 .. i are done (top: dy is in the slot).
    LaneProgress inputs(top + 1), weights(top);
    std::atomic<int> taken{0};
    constexpr int pieces = static_cast<int>(lane_pieces.size());
    const auto ready = [&](int j) {
      return inputs.reached(lane_pieces[j].layer) && weights.reached(lane_pieces[j].layer);
    };
    const auto step = [&](const HostContext& one, int j) {
      done(one, lane_pieces[j].first, lane_pieces[j].count);
    };
    // The steps left once a lane has nothing else to do: each piece waited for, then taken.
    const auto drain = [&](const HostContext& one, const LaneSync& sync) {
      for (int j; (j = taken.fetch_add(1)) < pieces;) {
        if (!sync.wait_until([&] { return ready(j); })) return;
        step(one, j);
      }
    };
    run_two_lanes(
        [&](const HostContext& one, const LaneSync& sync) {
          Matrix upstream = start_split(one, acts, dy, "backward_in_lanes");
          inputs.advance(top);
          [&]<std::size_t... J>(std::index_sequence<J...>) {
            ((input_half<layer_count - 1 - J>(one, params, acts, upstream, dx, scratch),
              inputs.advance(top - 1 - static_cast<int>(J))),
             ...);
          }
          (std::make_index_sequence<layer_count>{});
          if (!sync.alone()) drain(one, sync);  // alone, lane 1 runs after: it takes them all
        },
        [&](const HostContext& one, const LaneSync& sync) {
          // While its next output gradient is not yet in the slot, a ready piece is stepped.
          const auto step_while_waiting = [&](int needed) {
            return sync.wait_until([&] {
              if (inputs.reached(needed)) return true;
              int j = taken.load(std::memory_order_relaxed);
              if (j < pieces && ready(j) && taken.compare_exchange_strong(j, j + 1)) step(one, j);
              return false;
            });
          };
          const bool went_through = [&]<std::size_t... J>(std::index_sequence<J...>) {
            return ([&] {
              constexpr std::size_t I = layer_count - 1 - J;
              using L = layer<I>;
              if constexpr (L::param_count == 0) {
                return true;
              } else {
                constexpr int needed = static_cast<int>(I) + (input_half_keeps_dy<L> ? 1 : 0);
                if (!step_while_waiting(needed)) return false;
                weight_half<I>(one, grads, accumulate, acts);
                weights.advance(static_cast<int>(I));
                return true;
              }
            }() && ...);
          }
          (std::make_index_sequence<layer_count>{});
          if (went_through) drain(one, sync);
        });
  }

 public:
  //! A piece of a layer's block that backward_in_lanes hands to `done`.
  struct LanePiece {
    index_t first, count;
    int layer;
  };

 private:
  // The blocks of the layers with parameters, last layer first, cut into pieces of at most
  // lane_piece floats (backward_in_lanes).
  static consteval std::size_t lane_piece_count() {
    std::size_t n = 0;
    for (std::size_t i = 0; i < layer_count; ++i)
      n += static_cast<std::size_t>((param_offsets[i + 1] - param_offsets[i] + lane_piece - 1) /
                                    lane_piece);
    return n;
  }
  static consteval std::array<LanePiece, lane_piece_count()> make_lane_pieces() {
    std::array<LanePiece, lane_piece_count()> pieces{};
    std::size_t n = 0;
    for (std::size_t i = layer_count; i-- > 0;)
      for (index_t first = param_offsets[i]; first < param_offsets[i + 1]; first += lane_piece)
        pieces[n++] = {first, std::min(lane_piece, param_offsets[i + 1] - first),
                       static_cast<int>(i)};
    return pieces;
  }

 public:
  //! The pieces backward_in_lanes hands to `done`, in the order they are taken.
  static constexpr auto lane_pieces = make_lane_pieces();

 private:
  // Layer I's part of the stage's state (none where the stage has none) and the run's mode.
  template <std::size_t I>
  static Running layer_running(Running run) {
    return Running{run.state == nullptr ? nullptr : run.state + state_offsets[I], run.training};
  }

  // Layer I's forward on the slot, with its state, its Saved or neither, whichever it takes.
  template <std::size_t I, class Ctx, class Acts>
  static void layer_forward(const Ctx& ctx, const float* params, Acts& acts, Running run) {
    using L = layer<I>;
    using B = typename Ctx::backend;
    const float* p = params + param_offsets[I];
    if constexpr (takes_running<L, B>)
      L::forward(ctx, p, acts.boundary(I), acts.boundary(I + 1), acts.template saved<I>(),
                 layer_running<I>(run));
    else if constexpr (keeps_saved<L, B>)
      L::forward(ctx, p, acts.boundary(I), acts.boundary(I + 1), acts.template saved<I>());
    else
      L::forward(ctx, p, acts.boundary(I), acts.boundary(I + 1));
  }

  // The checks of a split backward's input half, and its first upstream: dy itself, or its copy
  // in the slot when the last layer has a weight half (dy's buffer is the sender's and is reused
  // once this returns).
  template <class Ctx, class Acts>
  static Matrix start_split(const Ctx& ctx, const Acts& acts, ConstMatrix dy, const char* what) {
    const index_t rows = acts.rows();
    // The function's name for a message, made only when one is thrown (no allocation else).
    const auto name = [what] { return std::string("xpipe: Stage::") + what; };
    if (dy.rows != rows || dy.cols != out_width)
      throw ShapeError(name() + ": gradient is " + std::to_string(dy.rows) + "x" +
                       std::to_string(dy.cols) + ", expected " + std::to_string(rows) + "x" +
                       std::to_string(out_width));
    if (!acts.keeps_gradients())
      throw ShapeError(name() +
                       ": the activation slot keeps no gradients (make it with "
                       "SlotRoom{.kept_gradients = true})");
    Matrix upstream{const_cast<float*>(dy.data), dy.rows, dy.cols, dy.ld};
    if constexpr (layer<layer_count - 1>::param_count > 0) {
      if (dy.ld != dy.cols)
        throw ShapeError(name() + ": the gradient must be contiguous (ld " + std::to_string(dy.ld) +
                         ", " + std::to_string(dy.cols) + " columns)");
      upstream = acts.kept(layer_count - 1);
      copy_buffer(ctx, dy.data, upstream.data, rows * out_width);
    }
    return upstream;
  }

  // Layer I's input half: from `upstream` (its output gradient) into its input gradient (dx for
  // layer 0, the previous layer's kept gradient when it has a weight half, else a scratch
  // buffer), which becomes the next upstream.
  template <std::size_t I, class Ctx, class Acts, class Scratch>
  static void input_half(const Ctx& ctx, const float* params, const Acts& acts, Matrix& upstream,
                         Matrix dx, const Scratch& scratch) {
    using L = layer<I>;
    using B = typename Ctx::backend;
    const index_t rows = acts.rows();
    Matrix down;
    if constexpr (I == 0)
      down = dx;
    else if constexpr (layer<I - 1>::param_count > 0)
      down = acts.kept(I - 1);
    else
      down = scratch.get(static_cast<int>((layer_count - 1 - I) % 2), rows, widths[I]);
    if constexpr (L::param_count == 0) {
      // All of its backward is input gradient (it has no parameter gradient to write).
      layer_backward<I>(ctx, params, nullptr, false, acts, upstream, down, scratch);
    } else if constexpr (detail::HasSavedSplitBackward<L, B>) {
      L::backward_input(ctx, params + param_offsets[I], acts.boundary(I), acts.boundary(I + 1),
                        upstream, down, acts.template saved<I>());
    } else {
      L::backward_input(ctx, params + param_offsets[I], acts.boundary(I), acts.boundary(I + 1),
                        upstream, down);
    }
    upstream = down;
  }

  // Layer I's weight half (nothing for a layer without parameters).
  template <std::size_t I, class Ctx, class Acts>
  static void weight_half(const Ctx& ctx, float* grads, bool accumulate, const Acts& acts) {
    using L = layer<I>;
    using B = typename Ctx::backend;
    if constexpr (L::param_count == 0)
      return;
    else if constexpr (detail::HasSavedSplitBackward<L, B>)
      L::backward_weight(ctx, grads + param_offsets[I], accumulate, acts.boundary(I),
                         acts.boundary(I + 1), acts.kept(I), acts.template saved<I>());
    else
      L::backward_weight(ctx, grads + param_offsets[I], accumulate, acts.boundary(I),
                         acts.boundary(I + 1), acts.kept(I));
  }

  // Layer I's whole backward on the slot: with its Saved, its gradient scratch (Dense) or
  // neither, whichever it takes. `grads` is layer I's block (null for a layer without
  // parameters).
  template <std::size_t I, class Ctx, class Acts, class Scratch>
  static void layer_backward(const Ctx& ctx, const float* params, float* grads, bool accumulate,
                             const Acts& acts, ConstMatrix dy, Matrix dx, const Scratch& scratch) {
    using L = layer<I>;
    using B = typename Ctx::backend;
    const float* p = params + param_offsets[I];
    if constexpr (keeps_saved<L, B>)
      L::backward(ctx, p, grads, accumulate, acts.boundary(I), acts.boundary(I + 1), dy, dx,
                  acts.template saved<I>());
    else if constexpr (xpipe::takes_grad_scratch<L, B>)
      L::backward(ctx, p, grads, accumulate, acts.boundary(I), acts.boundary(I + 1), dy, dx,
                  scratch.get(2, dy.rows, widths[I + 1]));
    else
      L::backward(ctx, p, grads, accumulate, acts.boundary(I), acts.boundary(I + 1), dy, dx);
  }
};

}  // namespace xpipe
