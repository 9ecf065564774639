// The CUDA backend's element loops, the CUDA half of the launchers' contract (kernels/ops.hpp;
// the host backend has the same functions on a HostContext). A function object that says it has
// a 128-bit form (kernels/ops.hpp: `streams`, `pointers(p)` and `quad(i)`: the memory-bound
// optimizer and prediction passes) runs vectorised where its pointers allow; every other one
// runs one element per thread. The choice is the function object's own trait, so it does not
// depend on what a translation unit included before.
#pragma once

#if !defined(__CUDACC__)
#error "xpipe/backend/cuda/loops.cuh is for CUDA translation units (nvcc); link xpipe::cuda"
#endif

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "xpipe/backend/cuda/check.cuh"
#include "xpipe/backend/cuda/context.cuh"
#include "xpipe/core/config.hpp"

namespace xpipe {

namespace cuda_detail {
inline constexpr int block_threads = 256;

inline unsigned grid_for(index_t n) {
  return static_cast<unsigned>((n + block_threads - 1) / block_threads);
}

// The thin kernels: compute an index, check bounds, call the shared per-element function.
template <class F>
__global__ void for_each_index_kernel(index_t n, F f) {
  const index_t i = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) f(i);
}

// One thread per element, in row-major order: consecutive threads of a warp read consecutive
// columns, so loads coalesce. The row comes from one division per thread; `Index` is 32-bit
// where rows x cols allows, since a 64-bit division costs the GPU several times a 32-bit one and
// the element passes are otherwise bound by memory.
template <class Index, class F>
__global__ void for_each_element_kernel(Index rows, Index cols, F f) {
  const Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < rows * cols) {
    const Index r = i / cols;
    f(static_cast<index_t>(r), static_cast<index_t>(i - r * cols));
  }
}

// One thread per element of channels-last images, channel fastest: consecutive threads of a warp
// take consecutive channels of a pixel (then the next pixel's), so loads coalesce; pixel and row
// from two divisions per thread, 32-bit where the grid allows (as for_each_element_kernel).
template <class Index, class F>
__global__ void for_each_pixel_kernel(Index n, Index plane, Index channels, F f) {
  const Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    const Index rp = i / channels, r = rp / plane;
    f(static_cast<index_t>(r), static_cast<index_t>(rp - r * plane),
      static_cast<index_t>(i - rp * channels));
  }
}
}  // namespace cuda_detail

// Why 128-bit: a scalar pass issues one 32-bit load per array per thread; 128-bit accesses move
// the same bytes in a quarter of the memory instructions, which is what keeps an H100's HBM busy
// on the MLP's 2.9 M parameters. The choice is made once per launch on the host: when every
// pointer of the pass sits at the same offset within 16 bytes, a scalar head brings them all to
// a 16-byte boundary, quads follow, a scalar tail ends it; otherwise (pointers at different
// offsets) the pass runs the scalar loop. Each quad calls the same per-element math once per
// lane, so the bits are those of the scalar loop.
namespace cuda_vec {

//! The trait: F streams `F::streams` arrays, lists them with `pointers(p)`, and runs elements
//! i..i+3 (i at a 16-byte boundary of every array) with `quad(i)`.
template <class F>
concept HasQuads = requires(const F& f, const void* (&p)[F::streams], index_t i) {
  f.pointers(p);
  f.quad(i);
};

//! The split of a pass of n elements: `head` scalar elements up to the common 16-byte boundary,
//! `quads` groups of four, then n - head - 4 quads scalar elements. quads == 0 means scalar.
struct Split {
  index_t head = 0;
  index_t quads = 0;
};

//! Where every pointer has the same offset within 16 bytes (null pointers, which a pass may carry
//! unused, do not count), the head that aligns them and the quads after it; else no quads.
template <int N>
Split split_for(const void* const (&p)[N], index_t n) {
  int offset = -1;
  for (const void* q : p) {
    if (q == nullptr) continue;
    const auto a = reinterpret_cast<std::uintptr_t>(q);
    if (a % sizeof(float) != 0) return {};  // not float-aligned: only the scalar loop is safe
    const int o = static_cast<int>(a % 16);
    if (offset >= 0 && o != offset) return {};
    offset = o;
  }
  if (offset < 0) return {};
  const index_t head = offset == 0 ? 0 : (16 - offset) / static_cast<index_t>(sizeof(float));
  if (n < head + 4) return {};
  return {head, (n - head) / 4};
}

//! Threads [0, quads) take one quad each; the threads after them take the scalar head and tail
//! elements, one each, through the unchanged per-element call.
template <class F>
__global__ void __launch_bounds__(cuda_detail::block_threads)
    vectorized_kernel(index_t n, index_t head, index_t quads, F f) {
  const index_t t = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < quads) {
    f.quad(head + 4 * t);
    return;
  }
  const index_t j = t - quads;  // the j-th scalar element: head first, then the tail
  const index_t i = j < head ? j : head + 4 * quads + (j - head);
  if (i < n) f(i);
}

//! The scalar loop for any function object: the reference the vectorised kernel must match bit
//! for bit (tests, benchmarks).
template <class F>
void launch_scalar(const CudaContext& ctx, index_t n, const F& f) {
  if (n <= 0) return;
  cuda_detail::for_each_index_kernel<<<cuda_detail::grid_for(n), cuda_detail::block_threads, 0,
                                       ctx.stream>>>(n, f);
  XPIPE_CUDA_CHECK(cudaGetLastError());
}

//! Runs f over [0, n) on ctx's stream: 128-bit accesses where the pointers allow, else the scalar
//! loop. Returns whether the vectorised kernel ran (tests and benchmarks report it).
template <HasQuads F>
bool launch(const CudaContext& ctx, index_t n, const F& f) {
  if (n <= 0) return false;
  const void* p[F::streams];
  f.pointers(p);
  const Split s = split_for(p, n);
  if (s.quads == 0) {
    launch_scalar(ctx, n, f);
    return false;
  }
  const index_t threads = s.quads + (n - 4 * s.quads);  // quads + scalar head and tail
  const auto blocks = static_cast<unsigned>((threads + cuda_detail::block_threads - 1) /
                                            cuda_detail::block_threads);
  vectorized_kernel<<<blocks, cuda_detail::block_threads, 0, ctx.stream>>>(n, s.head, s.quads, f);
  XPIPE_CUDA_CHECK(cudaGetLastError());
  return true;
}

}  // namespace cuda_vec

//! Calls f(i) on the device for i in [0, n), on ctx's stream; f is a trivially copyable function
//! object with an XPIPE_HOST_DEVICE operator() (kernels/ops.hpp has one per launcher), run with
//! 128-bit accesses where it has the quad form (cuda_vec::HasQuads).
//! Usage: `for_each_index(ctx, n, ops::SgdDirection{m, d});`
template <class F>
void for_each_index(const CudaContext& ctx, index_t n, const F& f) {
  static_assert(std::is_trivially_copyable_v<F>,
                "xpipe: for_each_index on CUDA needs a trivially copyable function object (the "
                "kernel takes it by value)");
  if constexpr (cuda_vec::HasQuads<F>)
    cuda_vec::launch(ctx, n, f);
  else
    cuda_vec::launch_scalar(ctx, n, f);
}

//! As for_each_index(ctx, n, f). `work` (the elements touched in all) tells the host backend
//! whether forking pays; one GPU thread per index has no such decision, so it is unused here.
template <class F>
void for_each_index(const CudaContext& ctx, index_t n, index_t /*work*/, const F& f) {
  for_each_index(ctx, n, f);
}

//! Calls f(r, c) on the device for each element of a rows x cols matrix, one thread each.
template <class F>
void for_each_element(const CudaContext& ctx, index_t rows, index_t cols, const F& f) {
  static_assert(std::is_trivially_copyable_v<F>,
                "xpipe: for_each_element on CUDA needs a trivially copyable function object (the "
                "kernel takes it by value)");
  if (rows <= 0 || cols <= 0) return;
  const unsigned grid = cuda_detail::grid_for(rows * cols);
  // 32-bit while every thread index of the grid fits (rows x cols plus the last block's spare).
  if (rows * cols <= index_t{0x7fffffff} - cuda_detail::block_threads)
    cuda_detail::for_each_element_kernel<<<grid, cuda_detail::block_threads, 0, ctx.stream>>>(
        static_cast<std::uint32_t>(rows), static_cast<std::uint32_t>(cols), f);
  else
    cuda_detail::for_each_element_kernel<<<grid, cuda_detail::block_threads, 0, ctx.stream>>>(
        rows, cols, f);
  XPIPE_CUDA_CHECK(cudaGetLastError());
}

//! Calls f(r, p, c) on the device for channel c of pixel p of each of `rows` channels-last image
//! rows of `plane` pixels, one thread each (the host backend's for_each_pixel).
template <class F>
void for_each_pixel(const CudaContext& ctx, index_t rows, index_t plane, index_t channels,
                    const F& f) {
  static_assert(std::is_trivially_copyable_v<F>,
                "xpipe: for_each_pixel on CUDA needs a trivially copyable function object (the "
                "kernel takes it by value)");
  const index_t n = rows * plane * channels;
  if (n <= 0) return;
  const unsigned grid = cuda_detail::grid_for(n);
  if (n <= index_t{0x7fffffff} - cuda_detail::block_threads)
    cuda_detail::for_each_pixel_kernel<<<grid, cuda_detail::block_threads, 0, ctx.stream>>>(
        static_cast<std::uint32_t>(n), static_cast<std::uint32_t>(plane),
        static_cast<std::uint32_t>(channels), f);
  else
    cuda_detail::for_each_pixel_kernel<<<grid, cuda_detail::block_threads, 0, ctx.stream>>>(
        n, plane, channels, f);
  XPIPE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace xpipe
