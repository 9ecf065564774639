// Vectorised CUDA loops for the memory-bound flat-buffer passes (optimizer steps, weight
// prediction): each thread loads and stores 128 bits (4 floats) per array and calls the same
// shared per-element math of kernels/optim.hpp once per lane, so results are bitwise those of the
// one-float-per-thread loop of backend/cuda.cuh. Include through xpipe/xpipe_cuda.cuh.
#pragma once

#if !defined(__CUDACC__)
#error "xpipe/kernels/cuda/vectorized.cuh is for CUDA translation units (nvcc); link xpipe::cuda"
#endif

#include <cstdint>
#include <type_traits>

#include "xpipe/backend/cuda.cuh"
#include "xpipe/core/config.hpp"
#include "xpipe/kernels/ops.hpp"

// Why: a scalar pass issues one 32-bit load per array per thread; 128-bit accesses move the same
// bytes in a quarter of the memory instructions, which is what keeps an H100's HBM busy on the
// MLP's 2.9 M parameters. The choice is made once per launch on the host: when every pointer of
// the pass sits at the same offset within 16 bytes, a scalar head brings them all to a 16-byte
// boundary, quads follow, a scalar tail ends it; otherwise (pointers at different offsets) the
// pass runs the scalar loop. Hooked in by overloads of for_each_index for each function object
// below: the launchers of kernels/ops.hpp find them by argument-dependent lookup (a non-template
// exact match beats backend/cuda.cuh's template), so optimizer and predictor code is unchanged.
// Every CUDA unit must see these overloads (include xpipe/xpipe_cuda.cuh, not backend/cuda.cuh
// alone), or two units would instantiate the same launcher differently.

namespace xpipe {
namespace cuda_vec {

//! Four floats read or written as one 128-bit access.
struct alignas(16) Quad {
  float lane[4];
};

__device__ __forceinline__ Quad load(const float* p, index_t i) {
  return *reinterpret_cast<const Quad*>(p + i);
}
__device__ __forceinline__ void store(float* p, index_t i, const Quad& q) {
  *reinterpret_cast<Quad*>(p + i) = q;
}

//! Per function object: `pointers(f)` (every array the pass touches) and `quad(f, i)` (elements
//! i..i+3, i at a 16-byte boundary of every array). The per-element call stays f(i).
template <class F>
struct Vectorized;

template <>
struct Vectorized<ops::AdamStep> {
  static constexpr int arrays = 4;
  static void pointers(const ops::AdamStep& f, const void* (&p)[arrays]) {
    p[0] = f.w, p[1] = f.g, p[2] = f.m, p[3] = f.v;
  }
  __device__ __forceinline__ static void quad(const ops::AdamStep& f, index_t i) {
    Quad w = load(f.w, i), m = load(f.m, i), v = load(f.v, i);
    const Quad g = load(f.g, i);
#pragma unroll
    for (int k = 0; k < 4; ++k) math::adam_update(w.lane[k], g.lane[k], m.lane[k], v.lane[k], f.s);
    store(f.w, i, w), store(f.m, i, m), store(f.v, i, v);
  }
};

template <>
struct Vectorized<ops::AdamPredict> {
  static constexpr int arrays = 4;
  static void pointers(const ops::AdamPredict& f, const void* (&p)[arrays]) {
    p[0] = f.w, p[1] = f.m, p[2] = f.v, p[3] = f.out;
  }
  __device__ __forceinline__ static void quad(const ops::AdamPredict& f, index_t i) {
    const Quad w = load(f.w, i), m = load(f.m, i), v = load(f.v, i);
    Quad out;
#pragma unroll
    for (int k = 0; k < 4; ++k)
      out.lane[k] = math::adam_predict(w.lane[k], m.lane[k], v.lane[k], f.s_lr, f.s);
    store(f.out, i, out);
  }
};

template <>
struct Vectorized<ops::AdamDirection> {
  static constexpr int arrays = 3;
  static void pointers(const ops::AdamDirection& f, const void* (&p)[arrays]) {
    p[0] = f.m, p[1] = f.v, p[2] = f.d;
  }
  __device__ __forceinline__ static void quad(const ops::AdamDirection& f, index_t i) {
    const Quad m = load(f.m, i), v = load(f.v, i);
    Quad d;
#pragma unroll
    for (int k = 0; k < 4; ++k) d.lane[k] = math::adam_direction(m.lane[k], v.lane[k], f.s);
    store(f.d, i, d);
  }
};

template <>
struct Vectorized<ops::SgdStep> {
  static constexpr int arrays = 3;
  static void pointers(const ops::SgdStep& f, const void* (&p)[arrays]) {
    p[0] = f.w, p[1] = f.g, p[2] = f.m;
  }
  __device__ __forceinline__ static void quad(const ops::SgdStep& f, index_t i) {
    Quad w = load(f.w, i), m = load(f.m, i);
    const Quad g = load(f.g, i);
#pragma unroll
    for (int k = 0; k < 4; ++k) math::sgd_update(w.lane[k], g.lane[k], m.lane[k], f.s);
    store(f.w, i, w), store(f.m, i, m);
  }
};

template <>
struct Vectorized<ops::SgdPredict> {
  static constexpr int arrays = 3;
  static void pointers(const ops::SgdPredict& f, const void* (&p)[arrays]) {
    p[0] = f.w, p[1] = f.m, p[2] = f.out;
  }
  __device__ __forceinline__ static void quad(const ops::SgdPredict& f, index_t i) {
    const Quad w = load(f.w, i), m = load(f.m, i);
    Quad out;
#pragma unroll
    for (int k = 0; k < 4; ++k) out.lane[k] = math::sgd_predict(w.lane[k], m.lane[k], f.s_lr);
    store(f.out, i, out);
  }
};

template <>
struct Vectorized<ops::NadamStep> {
  static constexpr int arrays = 4;
  static void pointers(const ops::NadamStep& f, const void* (&p)[arrays]) {
    p[0] = f.w, p[1] = f.g, p[2] = f.m, p[3] = f.v;
  }
  __device__ __forceinline__ static void quad(const ops::NadamStep& f, index_t i) {
    Quad w = load(f.w, i), m = load(f.m, i), v = load(f.v, i);
    const Quad g = load(f.g, i);
#pragma unroll
    for (int k = 0; k < 4; ++k) math::nadam_update(w.lane[k], g.lane[k], m.lane[k], v.lane[k], f.s);
    store(f.w, i, w), store(f.m, i, m), store(f.v, i, v);
  }
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

inline constexpr int block_threads = 256;

//! Threads [0, quads) take one quad each; the threads after them take the scalar head and tail
//! elements, one each, through the unchanged per-element call.
template <class F>
__global__ void __launch_bounds__(block_threads)
    vectorized_kernel(index_t n, index_t head, index_t quads, F f) {
  const index_t t = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < quads) {
    Vectorized<F>::quad(f, head + 4 * t);
    return;
  }
  const index_t j = t - quads;  // the j-th scalar element: head first, then the tail
  const index_t i = j < head ? j : head + 4 * quads + (j - head);
  if (i < n) f(i);
}

//! The scalar loop of backend/cuda.cuh for the same function object: the reference the
//! vectorised kernel must match bit for bit (tests, benchmarks).
template <class F>
void launch_scalar(const CudaContext& ctx, index_t n, const F& f) {
  if (n <= 0) return;
  cuda_detail::for_each_index_kernel<<<cuda_detail::grid_for(n), cuda_detail::block_threads, 0,
                                       ctx.stream>>>(n, f);
  XPIPE_CUDA_CHECK(cudaGetLastError());
}

//! Runs f over [0, n) on ctx's stream: 128-bit accesses where the pointers allow, else the scalar
//! loop. Returns whether the vectorised kernel ran (tests and benchmarks report it).
template <class F>
bool launch(const CudaContext& ctx, index_t n, const F& f) {
  static_assert(std::is_trivially_copyable_v<F>);
  if (n <= 0) return false;
  const void* p[Vectorized<F>::arrays];
  Vectorized<F>::pointers(f, p);
  const Split s = split_for(p, n);
  if (s.quads == 0) {
    launch_scalar(ctx, n, f);
    return false;
  }
  const index_t threads = s.quads + (n - 4 * s.quads);  // quads + scalar head and tail
  const auto blocks = static_cast<unsigned>((threads + block_threads - 1) / block_threads);
  vectorized_kernel<<<blocks, block_threads, 0, ctx.stream>>>(n, s.head, s.quads, f);
  XPIPE_CUDA_CHECK(cudaGetLastError());
  return true;
}

}  // namespace cuda_vec

// The overloads the launchers of kernels/ops.hpp pick on a CudaContext (non-templates: preferred
// over backend/cuda.cuh's for_each_index template for these function objects).
inline void for_each_index(const CudaContext& ctx, index_t n, const ops::AdamStep& f) {
  cuda_vec::launch(ctx, n, f);
}
inline void for_each_index(const CudaContext& ctx, index_t n, const ops::AdamPredict& f) {
  cuda_vec::launch(ctx, n, f);
}
inline void for_each_index(const CudaContext& ctx, index_t n, const ops::AdamDirection& f) {
  cuda_vec::launch(ctx, n, f);
}
inline void for_each_index(const CudaContext& ctx, index_t n, const ops::SgdStep& f) {
  cuda_vec::launch(ctx, n, f);
}
inline void for_each_index(const CudaContext& ctx, index_t n, const ops::SgdPredict& f) {
  cuda_vec::launch(ctx, n, f);
}
inline void for_each_index(const CudaContext& ctx, index_t n, const ops::NadamStep& f) {
  cuda_vec::launch(ctx, n, f);
}

}  // namespace xpipe
