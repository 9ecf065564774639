// Column sums of a matrix (a Linear layer's bias gradient) over one block of columns, written
// once for a CPU core (a wide block walked row by row) and a GPU thread (a block of one column).
#pragma once

#include "xpipe/core/config.hpp"
#include "xpipe/core/tensor.hpp"

namespace xpipe::math {

namespace detail {
// The n <= Width columns from c0. Partial sums live in acc: registers on a GPU thread, one
// L1-resident row segment on a CPU core that adds a vector of each row at a time. A GPU thread
// sums its column alone, so it waits on each load's latency unless many are in flight: it issues
// 16 rows' loads before their adds (in the same order: the bits do not change). With nvcc's
// default unrolling the MLP's 128-row sums were latency-bound on an H200 (docs/results.md, "GPU
// benchmarks").
template <index_t Width>
XPIPE_HOST_DEVICE void column_sums_from(ConstMatrix dy, index_t c0, index_t n, float* db,
                                        bool accumulate) {
  float acc[Width];
  for (index_t j = 0; j < n; ++j) acc[j] = accumulate ? db[c0 + j] : 0.f;
  XPIPE_UNROLL(16)
  for (index_t r = 0; r < dy.rows; ++r) {
    const float* row = dy.row(r) + c0;
    for (index_t j = 0; j < n; ++j) acc[j] += row[j];
  }
  for (index_t j = 0; j < n; ++j) db[c0 + j] = acc[j];
}
}  // namespace detail

//! db[c] (+)= sum over rows of dy[r][c] for the columns of block `block`, [block * Width,
//! block * Width + Width) cut at dy.cols. Rows are added in order 0..rows-1 onto db[c]
//! (`accumulate`) or onto 0: one order whatever Width and however blocks are spread over
//! threads, so the bits are the same on every thread count and both backends.
//! Usage: `math::column_sums<256>(dy, b, db, false);` for b in [0, ceil(cols / 256)).
template <index_t Width>
XPIPE_HOST_DEVICE void column_sums(ConstMatrix dy, index_t block, float* db, bool accumulate) {
  const index_t c0 = block * Width;
  // A full block passes Width itself, so its column loops have a constant trip count: nvcc keeps
  // a one-column sum in a register (the row loop unrolled 16, see column_sums_from), g++ runs
  // whole vectors with no remainder. Only the last, partial block takes a run-time count.
  if (dy.cols - c0 >= Width)
    detail::column_sums_from<Width>(dy, c0, Width, db, accumulate);
  else
    detail::column_sums_from<Width>(dy, c0, dy.cols - c0, db, accumulate);
}

}  // namespace xpipe::math
