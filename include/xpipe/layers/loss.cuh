// The per-micro-batch loss sum on a CUDA device: a micro-batch's row losses reduced on the
// device in a fixed order, so the host reads one value per micro-batch once per train() call
// instead of synchronising on every micro-batch. Include from CUDA translation units only.
#pragma once

#if !defined(__CUDACC__)
#error "xpipe/layers/loss.cuh is for CUDA translation units (nvcc); link xpipe::cuda"
#endif

#include <cub/block/block_reduce.cuh>

#include "xpipe/backend/cuda.cuh"
#include "xpipe/layers/loss.hpp"

namespace xpipe {

namespace cuda_detail {
inline constexpr int loss_threads = 256;

struct MinIndex {
  __device__ index_t operator()(index_t a, index_t b) const { return b < a ? b : a; }
};

// One block. Thread t sums rows t, t + 256, ... in double (its rows in increasing order), then
// CUB's block reduction adds the 256 partial sums in a tree whose shape depends only on the
// block size: the same bits on every run. A thread's first non-finite row is its smallest, so
// the block minimum is the first of the micro-batch.
__global__ void __launch_bounds__(loss_threads)
    sum_row_losses_kernel(const float* row_loss, index_t rows, MicroBatchLoss* out) {
  using SumReduce = cub::BlockReduce<double, loss_threads>;
  using RowReduce = cub::BlockReduce<index_t, loss_threads>;
  __shared__ union {
    typename SumReduce::TempStorage sum;
    typename RowReduce::TempStorage row;
  } temp;
  double partial = 0;
  index_t bad = rows;  // none yet
  for (index_t r = threadIdx.x; r < rows; r += loss_threads) {
    const float v = row_loss[r];
    if (bad == rows && !isfinite(v)) bad = r;
    partial += static_cast<double>(v);
  }
  const double total = SumReduce(temp.sum).Sum(partial);
  __syncthreads();  // temp is reused
  const index_t first_bad = RowReduce(temp.row).Reduce(bad, MinIndex{});
  if (threadIdx.x == 0) {
    out->sum = total;
    out->bad_row = first_bad < rows ? first_bad : -1;
    out->bad_value = first_bad < rows ? row_loss[first_bad] : 0.f;
  }
}
}  // namespace cuda_detail

//! *out = the sum of row_loss[0..rows) and its first non-finite row, computed on ctx's stream
//! (row_loss and out in device memory); the host reads *out after synchronising. The device
//! half of sum_row_losses (layers/loss.hpp), whose checks Pipeline::train applies when it
//! reads the sums. Usage: `sum_row_losses_async(ctx, loss.data(), rows, sums.data() + g);`
inline void sum_row_losses_async(const CudaContext& ctx, const float* row_loss, index_t rows,
                                 MicroBatchLoss* out) {
  cuda_detail::sum_row_losses_kernel<<<1, cuda_detail::loss_threads, 0, ctx.stream>>>(row_loss,
                                                                                      rows, out);
  XPIPE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace xpipe
