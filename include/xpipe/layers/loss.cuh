// The device reductions of a CUDA pipeline, each in a fixed order (the same bits on every run):
// the per-micro-batch loss sum, so the host reads one value per micro-batch once per train()
// call instead of synchronising on every micro-batch, and a stage's squared gradient norm under
// global clipping, which the other stages' steps read on the device. Include from CUDA
// translation units only.
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
// A squared norm's first pass: block b sums the squares of x[b chunk, min(n, (b + 1) chunk)) in
// double, thread t its elements t, t + 256, ... in order, then CUB's block reduction (a fixed
// tree); partials[b] = that sum. Templates, as the element loops, so units may share them.
template <int = 0>
__global__ void __launch_bounds__(loss_threads)
    squared_norm_partials_kernel(const float* x, index_t n, index_t chunk, double* partials) {
  using Reduce = cub::BlockReduce<double, loss_threads>;
  __shared__ typename Reduce::TempStorage temp;
  const index_t begin = static_cast<index_t>(blockIdx.x) * chunk;
  const index_t end = begin + chunk < n ? begin + chunk : n;
  double partial = 0;
  for (index_t i = begin + threadIdx.x; i < end; i += loss_threads) {
    const double v = x[i];
    partial += v * v;
  }
  const double total = Reduce(temp).Sum(partial);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// The second pass: one block adds the `blocks` partial sums in a fixed tree into *out.
template <int = 0>
__global__ void __launch_bounds__(reduce_blocks)
    sum_partials_kernel(const double* partials, int blocks, double* out) {
  using Reduce = cub::BlockReduce<double, reduce_blocks>;
  __shared__ typename Reduce::TempStorage temp;
  const double v = static_cast<int>(threadIdx.x) < blocks ? partials[threadIdx.x] : 0.0;
  const double total = Reduce(temp).Sum(v);
  if (threadIdx.x == 0) *out = total;
}
}  // namespace cuda_detail

//! *out = the squared L2 norm of x[0..n) in double (global clipping's per-stage norm), computed
//! on ctx's stream in two passes: a block per 2,048 elements (rounded up, at most 512 blocks,
//! the elements split evenly: reduce_split) writes a partial sum to ctx.partials, then one
//! block adds them. The split depends on n alone, so the
//! bits are the same on every run (not the host's squared_norm: its order differs). `out` is
//! device memory this device reaches (stage 0's, under peer access). Usage:
//! `squared_norm_async(ctx, grads, n, norms + t * K + k);`
inline void squared_norm_async(const CudaContext& ctx, const float* x, index_t n, double* out) {
  const ReduceSplit split =
      reduce_split(n, 8 * cuda_detail::loss_threads, cuda_detail::reduce_blocks);
  const int blocks = split.blocks;
  cuda_detail::squared_norm_partials_kernel<<<blocks, cuda_detail::loss_threads, 0, ctx.stream>>>(
      x, n, split.chunk, ctx.partials);
  XPIPE_CUDA_CHECK(cudaGetLastError());
  cuda_detail::sum_partials_kernel<<<1, cuda_detail::reduce_blocks, 0, ctx.stream>>>(ctx.partials,
                                                                                     blocks, out);
  XPIPE_CUDA_CHECK(cudaGetLastError());
}

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
