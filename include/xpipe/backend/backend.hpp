// The Backend concept and the compile-time default backend.
#pragma once

#include <concepts>

#include "xpipe/backend/host.hpp"

namespace xpipe {

//! Backend: a tag type naming where tensors live and kernels run.
//! Required members:
//!   - `Context`: the execution context every compute call takes (threads, stream, handles);
//!     compute functions (kernels, GEMM, layers, optimizers) are overloaded or templated on it,
//!     and it has the element loops kernels/ops.hpp calls: for_each_index, for_each_element;
//!   - `ContextOwner`: owns one stage's context, constructible from a Placement, with
//!     `ctx()` -> const Context&;
//!   - `template <class T> Buffer`: an owning array of T constructible from a length, with
//!     `data()`;
//!   - `static constexpr const char* name`;
//!   - `static constexpr index_t column_block`: columns one step of a column reduction sums.
template <class B>
concept Backend = requires {
  typename B::Context;
  typename B::ContextOwner;
  typename B::template Buffer<float>;
  { B::name } -> std::convertible_to<const char*>;
  { B::column_block } -> std::convertible_to<index_t>;
}
&&std::constructible_from<typename B::ContextOwner, const Placement&>&& requires(
    const typename B::ContextOwner& owner, typename B::template Buffer<float>& buffer) {
  { owner.ctx() } -> std::convertible_to<const typename B::Context&>;
  { buffer.data() } -> std::convertible_to<float*>;
}
&&std::constructible_from<typename B::template Buffer<float>, index_t>;

static_assert(Backend<Host>);

namespace detail {
//! Makes ctx's device current on the calling thread where its backend has devices (an
//! `activate(ctx)` found by argument-dependent lookup: backend/cuda.cuh); nothing elsewhere.
//! Pipeline calls it before every action of a stage, so any executor drives any backend.
template <class Ctx>
void activate_context(const Ctx& ctx) {
  if constexpr (requires { activate(ctx); }) activate(ctx);
}
}  // namespace detail

//! The backend used where none is named: the host, unless XPIPE_DEFAULT_BACKEND_CUDA is defined
//! in a CUDA translation unit that has included xpipe/backend/cuda.cuh.
#if defined(XPIPE_DEFAULT_BACKEND_CUDA) && defined(__CUDACC__)
using DefaultBackend = struct Cuda;
#else
using DefaultBackend = Host;
#endif

}  // namespace xpipe
