// Compilation-mode macros shared by every xpipe header: host/device qualifiers and hints.
// Without nvcc they reduce to plain C++, so every header builds with an ordinary compiler.
#pragma once

#if defined(__CUDACC__)
#define XPIPE_HOST_DEVICE __host__ __device__ __forceinline__
#define XPIPE_DEVICE __device__ __forceinline__
#define XPIPE_GLOBAL __global__
#else
#define XPIPE_HOST_DEVICE inline
#define XPIPE_DEVICE inline
#define XPIPE_GLOBAL
#endif

#if defined(__CUDA_ARCH__)
#define XPIPE_UNROLL _Pragma("unroll")
#elif defined(__GNUC__) && !defined(__clang__)
#define XPIPE_UNROLL _Pragma("GCC unroll 4")
#else
#define XPIPE_UNROLL
#endif

#if defined(__GNUC__) || defined(__clang__) || defined(__CUDACC__)
#define XPIPE_RESTRICT __restrict__
#else
#define XPIPE_RESTRICT
#endif

namespace xpipe {

//! Index type of every tensor dimension and buffer length.
using index_t = long;

//! `static_assert(dependent_false<T>, "...")` in a primary template: fires only when chosen.
template <class...>
inline constexpr bool dependent_false = false;

}  // namespace xpipe
