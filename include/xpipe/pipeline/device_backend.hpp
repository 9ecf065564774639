// The DeviceBackend concept: everything a Pipeline uses of a backend whose buffers are device
// memory (CUDA; the emulated device of the tests), beyond what the Backend concept names. Most
// of it is free functions on the backend's Context, found by argument-dependent lookup: this is
// the one list of them, with one readable message per missing member.
#pragma once

#include <concepts>
#include <cstdint>

#include "xpipe/backend/backend.hpp"
#include "xpipe/core/config.hpp"
#include "xpipe/layers/loss.hpp"

namespace xpipe {

namespace detail {
// What the element loops are given: a trivially copyable function object (the CUDA kernels take
// it by value), called per index or per (row, column).
struct IndexFunctor {
  XPIPE_HOST_DEVICE void operator()(index_t) const {}
};
struct ElementFunctor {
  XPIPE_HOST_DEVICE void operator()(index_t, index_t) const {}
};
struct PixelFunctor {
  XPIPE_HOST_DEVICE void operator()(index_t, index_t, index_t) const {}
};

template <class B>
using DeviceContext = typename B::Context;

template <class B>
concept HasPinnedBuffer = requires(typename B::template PinnedBuffer<float>& p) {
  { p.data() } -> std::convertible_to<float*>;
}
&&std::constructible_from<typename B::template PinnedBuffer<float>, index_t>;
template <class B>
concept HasDeviceEvent = requires(typename B::Event& e, const typename B::Event& ce,
                                  const DeviceContext<B>& ctx) {
  e.record(ctx);
  ce.wait(ctx);
  { ce.done() } -> std::convertible_to<bool>;
}
&&std::default_initializable<typename B::Event>;
template <class B>
concept HasActivate = requires(const DeviceContext<B>& ctx) {
  activate(ctx);
};
template <class B>
concept HasSynchronize = requires(const DeviceContext<B>& ctx) {
  synchronize(ctx);
};
template <class B>
concept HasConnect = requires(const DeviceContext<B>& a, const DeviceContext<B>& b) {
  connect(a, b);
};
template <class B>
concept HasElementLoops = requires(const DeviceContext<B>& ctx, index_t n, IndexFunctor fi,
                                   ElementFunctor fe, PixelFunctor fp) {
  for_each_index(ctx, n, fi);
  for_each_index(ctx, n, n, fi);
  for_each_element(ctx, n, n, fe);
  for_each_pixel(ctx, n, n, n, fp);
};
template <class B>
concept HasCopyBuffer = requires(const DeviceContext<B>& ctx, const float* src, float* dst) {
  copy_buffer(ctx, src, dst, index_t{1});
};
template <class B>
concept HasHostCopies = requires(const DeviceContext<B>& ctx, const float* cf, float* f,
                                 const std::int32_t* ci, std::int32_t* i, const MicroBatchLoss* cl,
                                 MicroBatchLoss* l, const double* cd, double* d) {
  copy_from_host(ctx, cf, f, index_t{1});
  copy_from_host(ctx, cd, d, index_t{1});
  copy_to_host(ctx, cd, d, index_t{1});
  copy_to_host(ctx, cf, f, index_t{1});
  copy_to_host(ctx, ci, i, index_t{1});
  copy_to_host(ctx, cl, l, index_t{1});
};
template <class B>
concept HasPinnedUpload = requires(const DeviceContext<B>& ctx, const float* cf, float* f,
                                   const std::int32_t* ci, std::int32_t* i) {
  copy_from_pinned_async(ctx, cf, f, index_t{1});
  copy_from_pinned_async(ctx, ci, i, index_t{1});
  copy_to_pinned_async(ctx, cf, f, index_t{1});
};
template <class B>
concept HasGemm = requires(const DeviceContext<B>& ctx, const float* a, float* c) {
  gemm(ctx, Trans::No, Trans::Yes, index_t{1}, index_t{1}, index_t{1}, 1.f, a, index_t{1}, a,
       index_t{1}, 0.f, c, index_t{1});
};
template <class B>
concept HasLossSum = requires(const DeviceContext<B>& ctx, const float* row_loss,
                              MicroBatchLoss* out) {
  sum_row_losses_async(ctx, row_loss, index_t{1}, out);
};
template <class B>
concept HasSquaredNorm = requires(const DeviceContext<B>& ctx, const float* x, double* out) {
  squared_norm_async(ctx, x, index_t{1}, out);
};
template <class B>
concept HasDeviceMemory = !reads_host_memory<DeviceContext<B>>;
}  // namespace detail

//! DeviceBackend: a Backend whose buffers are device memory and whose work runs asynchronously on
//! each stage's stream (CUDA; tests/support/emulated_device.hpp). Beyond Backend's members:
//!   - `template <class T> PinnedBuffer` (host memory a stream copies to or from asynchronously:
//!     the epoch's upload, the staging of messages between MPI ranks) and `Event` (`record(ctx)`,
//!     `wait(ctx) const`: the queues' filled and drained marks, global clipping's marks of each
//!     stage's norm; `done() const`: whether the device has passed the record, which the host
//!     asks before it touches pinned memory a copy reads or writes);
//!   - on its `Context`, found by argument-dependent lookup: `activate(ctx)` (make its device
//!     current), `synchronize(ctx)` (wait on the host for its stream), `connect(a, b)` (the
//!     devices of adjacent stages, and under global clipping of stage 0 and every stage, reach
//!     each other's memory), the element loops `for_each_index(ctx, n, f)`,
//!     `for_each_index(ctx, n, work, f)`, `for_each_element(ctx, rows, cols, f)` and
//!     `for_each_pixel(ctx, rows, plane, channels, f)`,
//!     `copy_buffer` (device to device, enqueued), `copy_from_host` / `copy_to_host` (waited
//!     for: between runs; of float, int32, double and MicroBatchLoss), `copy_from_pinned_async`
//!     and `copy_to_pinned_async` (enqueued), `gemm` (row-major, as the host's),
//!     `sum_row_losses_async(ctx, row_loss, rows, MicroBatchLoss*)` (the last stage's loss,
//!     read once per train() call) and `squared_norm_async(ctx, x, n, double* out)` (a stage's
//!     squared gradient norm under global clipping, written to device memory that may be
//!     stage 0's device's; the same bits on every run);
//!   - a Context that does not derive from HostContext (its memory is not the host's).
//! Usage: `static_assert(check_device_backend<MyGpu>());`
template <class B>
concept DeviceBackend = Backend<B> && detail::HasDeviceMemory<B> && detail::HasPinnedBuffer<B> &&
    detail::HasDeviceEvent<B> && detail::HasActivate<B> && detail::HasSynchronize<B> &&
    detail::HasConnect<B> && detail::HasElementLoops<B> && detail::HasCopyBuffer<B> &&
    detail::HasHostCopies<B> && detail::HasPinnedUpload<B> && detail::HasGemm<B> &&
    detail::HasLossSum<B> && detail::HasSquaredNorm<B>;

//! Fails to compile with one message per member B lacks, each naming it. Checks that depend on
//! the Context are skipped when Backend's own members are missing (check_backend says which).
//! Usage: `static_assert(check_device_backend<MyGpu>());`
template <class B>
consteval bool check_device_backend() {
  static_assert(check_backend<B>());
  if constexpr (Backend<B>) {
    static_assert(detail::HasDeviceMemory<B>,
                  "xpipe: DeviceBackend: Context derives from HostContext (a device backend's "
                  "memory is not the host's)");
    static_assert(detail::HasPinnedBuffer<B>,
                  "xpipe: DeviceBackend: missing template <class T> PinnedBuffer (constructible "
                  "from a length, with data())");
    static_assert(detail::HasDeviceEvent<B>,
                  "xpipe: DeviceBackend: missing Event (default-constructible, with "
                  "record(const Context&), wait(const Context&) const and done() const)");
    static_assert(detail::HasActivate<B>,
                  "xpipe: DeviceBackend: missing activate(const Context&) (makes its device "
                  "current)");
    static_assert(detail::HasSynchronize<B>,
                  "xpipe: DeviceBackend: missing synchronize(const Context&) (waits for its "
                  "stream)");
    static_assert(detail::HasConnect<B>,
                  "xpipe: DeviceBackend: missing connect(const Context&, const Context&) "
                  "(the devices of stages that share memory reach each other's)");
    static_assert(detail::HasElementLoops<B>,
                  "xpipe: DeviceBackend: missing an element loop: for_each_index(ctx, n, f), "
                  "for_each_index(ctx, n, work, f), for_each_element(ctx, rows, cols, f) and "
                  "for_each_pixel(ctx, rows, plane, channels, f)");
    static_assert(detail::HasCopyBuffer<B>,
                  "xpipe: DeviceBackend: missing copy_buffer(ctx, const float* src, float* dst, "
                  "n)");
    static_assert(detail::HasHostCopies<B>,
                  "xpipe: DeviceBackend: missing copy_from_host(ctx, src, dst, n) or "
                  "copy_to_host(ctx, src, dst, n) (templates over the element type)");
    static_assert(detail::HasPinnedUpload<B>,
                  "xpipe: DeviceBackend: missing copy_from_pinned_async(ctx, src, dst, n) or "
                  "copy_to_pinned_async(ctx, src, dst, n) (templates over the element type)");
    static_assert(detail::HasGemm<B>,
                  "xpipe: DeviceBackend: missing gemm(ctx, ta, tb, m, n, k, alpha, a, lda, b, "
                  "ldb, beta, c, ldc)");
    static_assert(detail::HasLossSum<B>,
                  "xpipe: DeviceBackend: missing sum_row_losses_async(ctx, const float* "
                  "row_loss, rows, MicroBatchLoss* out)");
    static_assert(detail::HasSquaredNorm<B>,
                  "xpipe: DeviceBackend: missing squared_norm_async(ctx, const float* x, n, "
                  "double* out)");
  }
  return true;
}

}  // namespace xpipe
