// The math of Embedding (layers/embedding.hpp) as function objects, host loop and CUDA kernel
// alike: the lookup y = token table[id] + position table[position], and the tables' gradients by
// column blocks, each summed by one thread in row order.
#pragma once

#include "xpipe/backend/backend.hpp"
#include "xpipe/core/config.hpp"
#include "xpipe/core/tensor.hpp"

namespace xpipe {

namespace ops {

//! y(r, c) = tokens[id_r][c] + positions[pos_r][c], with id_r = x(r, 0) and pos_r = x(r, 1)
//! (floats holding whole numbers, checked by the caller) and both tables dim wide.
struct EmbeddingForward {
  ConstMatrix x;
  Matrix y;
  const float* tokens;
  const float* positions;
  index_t dim;
  XPIPE_HOST_DEVICE void operator()(index_t r, index_t c) const {
    const index_t id = static_cast<index_t>(x(r, 0)), pos = static_cast<index_t>(x(r, 1));
    y(r, c) = tokens[id * dim + c] + positions[pos * dim + c];
  }
};

//! dx(r, c) = 0: token ids and positions are not differentiable.
struct EmbeddingInputGradient {
  Matrix dx;
  XPIPE_HOST_DEVICE void operator()(index_t r, index_t c) const { dx(r, c) = 0.f; }
};

//! Per block b of `block` columns: the tables' gradients in those columns, zeroed first unless
//! accumulating, then dy of every row added to its token's and its position's row, rows in
//! order. One block per index: each gradient element is summed by one thread in row order, so
//! the bits depend on neither the thread count nor the block width.
struct EmbeddingGradColumns {
  ConstMatrix x, dy;
  float* tokens;
  float* positions;
  index_t vocab, context, dim, block;
  bool accumulate;
  XPIPE_HOST_DEVICE void operator()(index_t b) const {
    const index_t first = b * block, last = first + block < dim ? first + block : dim;
    if (!accumulate) {
      for (index_t v = 0; v < vocab; ++v)
        for (index_t c = first; c < last; ++c) tokens[v * dim + c] = 0.f;
      for (index_t p = 0; p < context; ++p)
        for (index_t c = first; c < last; ++c) positions[p * dim + c] = 0.f;
    }
    for (index_t r = 0; r < x.rows; ++r) {
      float* token_row = tokens + static_cast<index_t>(x(r, 0)) * dim;
      float* position_row = positions + static_cast<index_t>(x(r, 1)) * dim;
      for (index_t c = first; c < last; ++c) {
        token_row[c] += dy(r, c);
        position_row[c] += dy(r, c);
      }
    }
  }
};

}  // namespace ops

}  // namespace xpipe
