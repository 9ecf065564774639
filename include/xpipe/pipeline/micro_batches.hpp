// How an epoch's rows split into mini-batches and micro-batches: one rule, used by Pipeline
// and by SequentialTrainer's accumulation chunks (so the two sum gradients in the same order).
#pragma once

#include <algorithm>
#include <cstdint>

#include "xpipe/core/config.hpp"
#include "xpipe/core/tensor.hpp"

namespace xpipe {

//! Rows and labels of one epoch, already in training order: mini-batch t is rows
//! [t * batch, (t + 1) * batch). A last mini-batch of fewer than M rows is left out.
struct EpochData {
  ConstMatrix inputs;
  const std::int32_t* labels = nullptr;
};

//! Rows [first, first + rows) of a larger range.
struct RowRange {
  index_t first = 0, rows = 0;
  friend constexpr bool operator==(const RowRange&, const RowRange&) = default;
};

//! Part j of `total` rows split into `parts` parts as evenly as possible in whole groups of
//! `group` rows (total a multiple of it), the first (total / group) % parts parts one group
//! larger. Usage: `split_rows(10, 3, 0)` is rows [0, 4); `split_rows(12, 2, 1, 4)` is [8, 12).
constexpr RowRange split_rows(index_t total, int parts, int j, index_t group = 1) {
  const index_t units = total / group, base = units / parts, extra = units % parts;
  return {(j * base + std::min<index_t>(j, extra)) * group, (base + (j < extra ? 1 : 0)) * group};
}

//! An epoch of `rows` rows in mini-batches of `batch` rows, each split into M micro-batches;
//! micro-batch g = t * M + j is part j of mini-batch t. Rows come in groups of `group` that a
//! split never cuts (a sequence's tokens: batch and rows are multiples of it). A last mini-batch
//! of fewer than M groups is dropped (it cannot be split into M non-empty parts).
struct MicroBatching {
  index_t batch = 1;
  int micro_batches = 1;
  index_t rows = 0;
  index_t group = 1;

  index_t mini_batches() const {
    const index_t full = rows / batch, tail = rows % batch;
    return full + (tail / group >= micro_batches ? 1 : 0);
  }
  //! Rows of the mini-batch micro-batch g belongs to (the last one may be short).
  index_t mini_batch_rows(int g) const {
    const index_t first = (g / micro_batches) * batch;
    return std::min(batch, rows - first);
  }
  //! The epoch's rows micro-batch g covers.
  RowRange micro_batch(int g) const {
    const index_t first = (g / micro_batches) * batch;
    const RowRange part = split_rows(mini_batch_rows(g), micro_batches, g % micro_batches, group);
    return {first + part.first, part.rows};
  }
  //! The most rows any micro-batch has: what every activation slot and queue slot holds.
  index_t max_micro_rows() const {
    return (batch / group + micro_batches - 1) / micro_batches * group;
  }
};

}  // namespace xpipe
