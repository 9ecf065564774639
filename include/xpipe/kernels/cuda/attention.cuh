// CausalSelfAttention's fused kernels on the GPU: one block per (sequence, head), one thread per
// token, the sequence's keys and values staged in shared memory, each thread running the host's
// row math (math::fused_attention_row and its backward halves, kernels/attention.hpp). The
// T x T scores are never written to memory: the forward keeps each row's log-sum-exp, from
// which the backward recomputes them. Found by CausalSelfAttention through argument-dependent
// lookup on the CudaContext; without this header a CUDA stage takes the GEMM-and-softmax path.
#pragma once

#if !defined(__CUDACC__)
#error "xpipe/kernels/cuda/attention.cuh is for CUDA translation units (nvcc); link xpipe::cuda"
#endif

#include <atomic>
#include <cstddef>
#include <string>
#include <type_traits>

#include "xpipe/backend/cuda.cuh"
#include "xpipe/core/config.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/kernels/attention.hpp"

namespace xpipe {

namespace detail {

// Block (s, h), thread i: token i of sequence s, head h. Shared memory: the sequence's k and v
// of head h, context x Dh each.
template <int Dh>
__global__ void fused_attention_forward_kernel(AttentionShape a, ConstMatrix x, Matrix y,
                                               float* lse, float scale) {
  extern __shared__ float shared[];
  const index_t t = a.context, s = blockIdx.x, h = blockIdx.y, i = threadIdx.x;
  float* k = shared;
  float* v = shared + t * Dh;
  for (index_t e = threadIdx.x; e < t * Dh; e += blockDim.x) {
    const index_t row = e / Dh, d = e % Dh;
    k[e] = x.data[a.qkv_offset(x, s, 1, h) + row * x.ld + d];
    v[e] = x.data[a.qkv_offset(x, s, 2, h) + row * x.ld + d];
  }
  __syncthreads();
  float q[Dh], o[Dh];
  for (int d = 0; d < Dh; ++d) q[d] = x.data[a.qkv_offset(x, s, 0, h) + i * x.ld + d];
  const float row_lse = math::fused_attention_row<Dh>(q, k, v, Dh, i, scale, o);
  float* out = y.data + (s * t + i) * y.ld + h * Dh;
  for (int d = 0; d < Dh; ++d) out[d] = o[d];
  lse[(s * t + i) * a.heads + h] = row_lse;
}

// Block (s, h), thread i: first token i's delta = do . o into shared memory beside the
// sequence's q, k, v, do and lse of head h; then token i's dq (as a query) and dk, dv (as a key).
template <int Dh>
__global__ void fused_attention_backward_kernel(AttentionShape a, ConstMatrix x, ConstMatrix y,
                                                ConstMatrix dy, Matrix dx, const float* lse,
                                                float scale) {
  extern __shared__ float shared[];
  const index_t t = a.context, s = blockIdx.x, h = blockIdx.y, i = threadIdx.x;
  float* q = shared;
  float* k = q + t * Dh;
  float* v = k + t * Dh;
  float* d_out = v + t * Dh;
  float* row_lse = d_out + t * Dh;
  float* delta = row_lse + t;
  const index_t r = s * t + i;
  float dot = 0.f;
  for (int d = 0; d < Dh; ++d) {
    q[i * Dh + d] = x.data[a.qkv_offset(x, s, 0, h) + i * x.ld + d];
    k[i * Dh + d] = x.data[a.qkv_offset(x, s, 1, h) + i * x.ld + d];
    v[i * Dh + d] = x.data[a.qkv_offset(x, s, 2, h) + i * x.ld + d];
    const float g = dy.data[r * dy.ld + h * Dh + d];
    d_out[i * Dh + d] = g;
    dot += g * y.data[r * y.ld + h * Dh + d];
  }
  row_lse[i] = lse[r * a.heads + h];
  delta[i] = dot;
  __syncthreads();
  float dq[Dh], dk[Dh], dv[Dh];
  math::fused_attention_row_dq<Dh>(q + i * Dh, k, v, Dh, i, scale, row_lse[i], delta[i],
                                   d_out + i * Dh, dq);
  math::fused_attention_row_dkv<Dh>(q, Dh, k + i * Dh, v + i * Dh, d_out, Dh, i, t, scale, row_lse,
                                    delta, dk, dv);
  // Token i's q | k | v parts of head h in dx (AttentionShape::qkv_offset's layout).
  float* out = dx.data + r * dx.ld + h * Dh;
  for (int d = 0; d < Dh; ++d) {
    out[d] = dq[d];
    out[a.dim() + d] = dk[d];
    out[2 * a.dim() + d] = dv[d];
  }
}

// Shared memory above the default 48 KiB needs the kernel's opt-in: asked once for each larger
// size (`granted`, one per kernel), so a launch inside a CUDA graph capture asks nothing.
template <class Kernel>
void allow_shared_memory(Kernel kernel, std::size_t bytes, std::atomic<std::size_t>& granted) {
  if (bytes <= granted.load(std::memory_order_relaxed)) return;
  XPIPE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bytes)));
  granted.store(bytes, std::memory_order_relaxed);
}

}  // namespace detail

//! Whether the fused kernels take a sequence of `context` tokens (a thread each, at most 1,024
//! a block) with `head_width` wide heads on the CUDA backend.
constexpr bool fused_attention_fits(index_t context, int head_width) {
  return context <= 1024 && head_width <= 64;
}

//! The fused forward on the GPU, enqueued on ctx's stream: y = attention of x, and each (row,
//! head)'s log-sum-exp into lse (rows x heads floats, row-major). Dh is the head width.
//! Usage: `fused_attention_forward(ctx, std::integral_constant<int, 16>{}, a, x, y, lse);`
template <int Dh>
void fused_attention_forward(const CudaContext& ctx, std::integral_constant<int, Dh>,
                             const AttentionShape& a, ConstMatrix x, Matrix y, float* lse) {
  static_assert(fused_attention_fits(1, Dh), "xpipe: fused attention: heads above 64 wide");
  if (!fused_attention_fits(a.context, Dh))
    throw ConfigError("xpipe: fused attention: a sequence of " + std::to_string(a.context) +
                      " tokens exceeds the 1,024 threads of a block");
  const std::size_t bytes = 2 * sizeof(float) * static_cast<std::size_t>(a.context) * Dh;
  static std::atomic<std::size_t> granted{48 * 1024};
  detail::allow_shared_memory(detail::fused_attention_forward_kernel<Dh>, bytes, granted);
  const float scale = 1.f / sqrtf(static_cast<float>(Dh));
  const dim3 grid(static_cast<unsigned>(a.sequences()), static_cast<unsigned>(a.heads));
  detail::fused_attention_forward_kernel<Dh>
      <<<grid, static_cast<unsigned>(a.context), bytes, ctx.stream>>>(a, x, y, lse, scale);
  XPIPE_CUDA_CHECK(cudaGetLastError());
}

//! The fused backward on the GPU: dx (q | k | v parts) from x, the forward's output y, dy and
//! the forward's log-sum-exps. Usage: as the forward, `fused_attention_backward(ctx, dh, a, x,
//! y, dy, dx, lse)`.
template <int Dh>
void fused_attention_backward(const CudaContext& ctx, std::integral_constant<int, Dh>,
                              const AttentionShape& a, ConstMatrix x, ConstMatrix y, ConstMatrix dy,
                              Matrix dx, const float* lse) {
  if (!fused_attention_fits(a.context, Dh))
    throw ConfigError("xpipe: fused attention: a sequence of " + std::to_string(a.context) +
                      " tokens exceeds the 1,024 threads of a block");
  const std::size_t bytes =
      sizeof(float) * (4 * static_cast<std::size_t>(a.context) * Dh + 2 * a.context);
  static std::atomic<std::size_t> granted{48 * 1024};
  detail::allow_shared_memory(detail::fused_attention_backward_kernel<Dh>, bytes, granted);
  const float scale = 1.f / sqrtf(static_cast<float>(Dh));
  const dim3 grid(static_cast<unsigned>(a.sequences()), static_cast<unsigned>(a.heads));
  detail::fused_attention_backward_kernel<Dh>
      <<<grid, static_cast<unsigned>(a.context), bytes, ctx.stream>>>(a, x, y, dy, dx, lse, scale);
  XPIPE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace xpipe
