// The CUDA backend: its tag, and the pieces it is made of, one idea each under backend/cuda/:
// check.cuh (the error checks), context.cuh (stream, handles, activate / synchronize /
// connect), lt_plans.cuh (cuBLASLt epilogue plans), memory.cuh (device and pinned buffers,
// events, copies), loops.cuh (the element loops, vectorised where a function object has the
// 128-bit form), gemm.cuh (cuBLAS). Include only from CUDA translation units, through
// xpipe/xpipe_cuda.cuh.
#pragma once

#if !defined(__CUDACC__)
#error "xpipe/backend/cuda.cuh is for CUDA translation units (nvcc); link xpipe::cuda"
#endif

#include "xpipe/backend/cuda/check.cuh"
#include "xpipe/backend/cuda/context.cuh"
#include "xpipe/backend/cuda/gemm.cuh"
#include "xpipe/backend/cuda/loops.cuh"
#include "xpipe/backend/cuda/lt_plans.cuh"
#include "xpipe/backend/cuda/memory.cuh"
#include "xpipe/core/config.hpp"

namespace xpipe {

//! CUDA backend tag: device buffers, one stream per context, cuBLAS GEMM.
struct Cuda {
  using Context = CudaContext;
  using ContextOwner = CudaStreamContext;
  template <class T>
  using Buffer = DeviceBuffer<T>;
  //! Host memory a stream copies from asynchronously (the epoch's upload).
  template <class T>
  using PinnedBuffer = xpipe::PinnedBuffer<T>;
  //! What orders two streams (the queues' filled and drained marks).
  using Event = CudaEvent;
  static constexpr const char* name = "cuda";
  //! Its buffers are CUDA device memory, which a CUDA-aware MPI moves itself (mpi_cuda_aware:
  //! StagedMpiLink then sends the device slots, no pinned copy).
  static constexpr bool cuda_memory = true;
  //! Columns one step of a column reduction (bias_grad) sums: one per thread, the partial sum
  //! in a register, adjacent threads on adjacent columns so each row's loads coalesce.
  static constexpr index_t column_block = 1;
};

}  // namespace xpipe
