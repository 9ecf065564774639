// The CUDA backend's error checks: one helper behind every CUDA, cuBLAS and NCCL check macro
// (comm/nccl_link.cuh has the NCCL one), so every failed call reads the same way.
#pragma once

#if !defined(__CUDACC__)
#error "xpipe/backend/cuda/check.cuh is for CUDA translation units (nvcc); link xpipe::cuda"
#endif

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "xpipe/core/error.hpp"

namespace xpipe::cuda_detail {
//! Throws BackendError "xpipe: <call> failed at <file>:<line>: <what>": what every check macro
//! raises for a failed call.
[[noreturn]] inline void fail(const char* call, const char* file, int line, const char* what) {
  throw BackendError(std::string("xpipe: ") + call + " failed at " + file + ":" +
                     std::to_string(line) + ": " + what);
}
}  // namespace xpipe::cuda_detail

//! Checks a CUDA runtime call; throws xpipe::BackendError naming the call, file and line.
#define XPIPE_CUDA_CHECK(call)                                                               \
  do {                                                                                       \
    const cudaError_t xpipe_err_ = (call);                                                   \
    if (xpipe_err_ != cudaSuccess)                                                           \
      ::xpipe::cuda_detail::fail(#call, __FILE__, __LINE__, cudaGetErrorString(xpipe_err_)); \
  } while (0)

//! Checks a cuBLAS call; throws xpipe::BackendError naming the call, file and line.
#define XPIPE_CUBLAS_CHECK(call)                                                               \
  do {                                                                                         \
    const cublasStatus_t xpipe_st_ = (call);                                                   \
    if (xpipe_st_ != CUBLAS_STATUS_SUCCESS)                                                    \
      ::xpipe::cuda_detail::fail(#call, __FILE__, __LINE__, cublasGetStatusString(xpipe_st_)); \
  } while (0)
