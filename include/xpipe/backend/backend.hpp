// The Backend concept and the compile-time default backend.
#pragma once

#include <concepts>

#include "xpipe/backend/host.hpp"

namespace xpipe {

//! Backend: a tag type naming where tensors live and kernels run.
//! Required members:
//!   - `Context`: the execution context every compute call takes (threads, stream, handles);
//!     compute functions (kernels, GEMM, layers, optimizers) are overloaded or templated on it,
//!     and it has the element loops the launchers call: for_each_index, for_each_element,
//!     for_each_pixel (channels-last images, kernels/batchnorm.hpp);
//!   - `ContextOwner`: owns one stage's context, constructible from a Placement, with
//!     `ctx()` -> const Context&;
//!   - `template <class T> Buffer`: an owning array of T constructible from a length, with
//!     `data()`;
//!   - `static constexpr const char* name`;
//!   - `static constexpr index_t column_block`: columns one step of a column reduction sums.
namespace detail {
template <class B>
concept HasContext = requires {
  typename B::Context;
};
template <class B>
concept HasContextOwner = requires {
  typename B::ContextOwner;
};
template <class B>
concept HasBackendBuffer = requires {
  typename B::template Buffer<float>;
};
template <class B>
concept HasBackendName = requires {
  { B::name } -> std::convertible_to<const char*>;
};
template <class B>
concept HasColumnBlock = requires {
  { B::column_block } -> std::convertible_to<index_t>;
};
template <class B>
concept OwnsContext = std::constructible_from<typename B::ContextOwner, const Placement&> &&
    requires(const typename B::ContextOwner& owner) {
  { owner.ctx() } -> std::convertible_to<const typename B::Context&>;
};
template <class B>
concept BufferFromLength = std::constructible_from<typename B::template Buffer<float>, index_t> &&
    requires(typename B::template Buffer<float>& buffer) {
  { buffer.data() } -> std::convertible_to<float*>;
};
}  // namespace detail

template <class B>
concept Backend = detail::HasContext<B> && detail::HasContextOwner<B> &&
    detail::HasBackendBuffer<B> && detail::HasBackendName<B> && detail::HasColumnBlock<B> &&
    detail::OwnsContext<B> && detail::BufferFromLength<B>;

//! Fails to compile with one message per member B lacks, each naming it; the checks of a
//! member's own shape are skipped when the member is missing. Usage:
//! `static_assert(check_backend<MyBackend>());`
template <class B>
consteval bool check_backend() {
  static_assert(detail::HasContext<B>, "xpipe: Backend: missing member type Context");
  static_assert(detail::HasContextOwner<B>, "xpipe: Backend: missing member type ContextOwner");
  static_assert(detail::HasBackendBuffer<B>,
                "xpipe: Backend: missing member template Buffer<T> (an owning array of T)");
  static_assert(detail::HasBackendName<B>,
                "xpipe: Backend: missing static member name (static constexpr const char*)");
  static_assert(detail::HasColumnBlock<B>,
                "xpipe: Backend: missing static member column_block (static constexpr index_t)");
  if constexpr (detail::HasContext<B> && detail::HasContextOwner<B>)
    static_assert(detail::OwnsContext<B>,
                  "xpipe: Backend: ContextOwner must be constructible from const Placement& and "
                  "have ctx() returning const Context&");
  if constexpr (detail::HasBackendBuffer<B>)
    static_assert(detail::BufferFromLength<B>,
                  "xpipe: Backend: Buffer<T> must be constructible from a length (index_t) and "
                  "have data() returning T*");
  return true;
}

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

//! Room for one call's scratch on backend B: `floats` floats of a caller's arena (a stage's,
//! shared by its layers' calls in turn) where one is given, else a buffer of its own. The room
//! stays where it is when the ArenaOr moves.
//! Usage: `ArenaOr<B> room(arena, floats); float* p = room.data();`
template <class B>
class ArenaOr {
 public:
  //! `arena`: at least `floats` floats on B that outlive this, or null for a buffer of its own.
  ArenaOr(float* arena, index_t floats)
      : own_(arena != nullptr ? 0 : floats), data_(arena != nullptr ? arena : own_.data()) {}
  float* data() const { return data_; }
  //! Floats of its own buffer: 0 on an arena.
  index_t own_floats() const { return static_cast<index_t>(own_.size()); }

 private:
  typename B::template Buffer<float> own_;
  float* data_;
};

//! The backend used where none is named: the host, unless XPIPE_DEFAULT_BACKEND_CUDA is defined
//! in a CUDA translation unit that has included xpipe/backend/cuda.cuh.
#if defined(XPIPE_DEFAULT_BACKEND_CUDA) && defined(__CUDACC__)
using DefaultBackend = struct Cuda;
#else
using DefaultBackend = Host;
#endif

}  // namespace xpipe
