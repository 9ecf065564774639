// The Layer concept: what Stage<Layers...> requires of each layer, with one readable
// static_assert per missing member.
#pragma once

#include <concepts>
#include <cstdint>
#include <span>

#include "xpipe/backend/host.hpp"
#include "xpipe/core/tensor.hpp"

namespace xpipe {

//! Width of a layer that keeps whatever width it receives (activations).
inline constexpr int any_width = 0;

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
}  // namespace detail

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
//!     where dx may be empty (the first layer of a model needs no input gradient).
template <class L, class B = Host>
concept Layer = detail::HasInWidth<L> && detail::HasOutWidth<L> && detail::HasParamCount<L> &&
    detail::HasInit<L> && detail::HasForward<L, B> && detail::HasBackward<L, B>;

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

//! Fails to compile with a message naming the first member L lacks on backend B.
template <class L, class B = Host>
consteval bool check_layer() {
  static_assert(check_layer_shape<L>());
  static_assert(detail::HasForward<L, B>,
                "xpipe: Layer: missing static forward(ctx, params, ConstMatrix x, Matrix y) for "
                "this backend's context");
  static_assert(detail::HasBackward<L, B>,
                "xpipe: Layer: missing static backward(ctx, params, grads, accumulate, x, y, dy, "
                "dx) for this backend's context");
  return true;
}

}  // namespace xpipe
