// Compilation-mode macros shared by every xpipe header: host/device qualifiers and hints.
// Without nvcc they reduce to plain C++, so every header builds with an ordinary compiler.
#pragma once

// XPIPE_HOST_DEVICE marks the shared math functions (kernels/*.hpp) and the call operators of
// the function objects the launchers (kernels/ops.hpp) hand to a backend's element loop, so one
// function runs in the host loop and in a CUDA kernel.
#if defined(__CUDACC__)
#define XPIPE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define XPIPE_HOST_DEVICE inline
#endif

// XPIPE_UNROLL(n) before a loop asks nvcc's device pass to unroll it n times, so that a GPU
// thread has n iterations' loads in flight together; nothing for host compilers, which choose
// their own unrolling and vectorisation.
#define XPIPE_PRAGMA(text) _Pragma(#text)
#if defined(__CUDA_ARCH__)
#define XPIPE_UNROLL(n) XPIPE_PRAGMA(unroll n)
#else
#define XPIPE_UNROLL(n)
#endif

// XPIPE_INDEPENDENT_ITERATIONS before a host loop promises that no iteration depends on another:
// `omp simd` where OpenMP is on, which also vectorises the loop at -O2 (whose cheap cost model
// takes no loop that needs a scalar epilogue: the GELU passes ran unvectorised, the GPT step at
// half its -O3 speed), else g++'s ivdep (under nvcc's host pass too, whose front end would warn
// on the omp pragma); nothing in device code.
#if defined(__CUDA_ARCH__)
#define XPIPE_INDEPENDENT_ITERATIONS
#elif defined(_OPENMP) && !defined(__NVCC__)
#define XPIPE_INDEPENDENT_ITERATIONS XPIPE_PRAGMA(omp simd)
#elif defined(__GNUC__) && !defined(__clang__)
#define XPIPE_INDEPENDENT_ITERATIONS XPIPE_PRAGMA(GCC ivdep)
#else
#define XPIPE_INDEPENDENT_ITERATIONS
#endif

#if defined(__GNUC__) || defined(__clang__) || defined(__CUDACC__)
#define XPIPE_RESTRICT __restrict__
#else
#define XPIPE_RESTRICT
#endif

namespace xpipe {

//! Index type of every tensor dimension and buffer length.
using index_t = long;

//! Floats per cache line (64 bytes): where each part of a carved buffer starts, so GEMM operands
//! stay aligned.
inline constexpr index_t line_floats = 16;

//! `floats` rounded up to whole cache lines (host sizes; constant-evaluated where a layer's
//! sizes are). Usage: `o[i + 1] = o[i] + round_up_to_line(n);`
constexpr index_t round_up_to_line(index_t floats) {
  return (floats + line_floats - 1) / line_floats * line_floats;
}

//! `static_assert(dependent_false<T>, "...")` in a primary template: fires only when chosen.
template <class...>
inline constexpr bool dependent_false = false;

}  // namespace xpipe
