// Data parallelism's split of an epoch: which rows each of R replicas of a pipeline trains on,
// so that R replicas compute what one process computes at the global batch (exec/mpi.hpp runs
// them). Plain C++: no MPI needed to plan or test the split.
#pragma once

#include <string>
#include <vector>

#include "xpipe/core/error.hpp"
#include "xpipe/core/tensor.hpp"
#include "xpipe/pipeline/micro_batches.hpp"

namespace xpipe {

//! Replica r's rows of an epoch for R replicas at global mini-batch `batch` split into `micro`
//! micro-batches: from each global micro-batch (split_rows(batch, micro, j) of each mini-batch
//! [t * batch, (t + 1) * batch)) the r-th of R near-equal parts, in order. When R x micro divides
//! `batch`, replica r's micro-batch j is then exactly its part of the global micro-batch j, so the
//! R replicas (each with batch / R rows and `micro` micro-batches) compute what one process
//! computes at the global batch, async schedules included, up to the order of the gradient sums.
//! A tail of fewer than `batch` rows is left out (every replica runs the same mini-batches).
//! Rows in groups of `group` (a sequence's tokens) are split in whole groups.
//! Throws ConfigError when R does not divide `batch`. Returns the indices of the rows.
inline std::vector<index_t> replica_rows(index_t rows, index_t batch, int micro, int replicas,
                                         int r, index_t group = 1) {
  if (replicas < 1 || batch % replicas != 0)
    throw ConfigError("xpipe: data parallelism: " + std::to_string(replicas) +
                      " replicas do not divide the batch of " + std::to_string(batch) + " rows");
  std::vector<index_t> out;
  for (index_t t = 0; (t + 1) * batch <= rows; ++t)
    for (int j = 0; j < micro; ++j) {
      const RowRange m = split_rows(batch, micro, j, group);
      const RowRange part = split_rows(m.rows, replicas, r, group);
      for (index_t i = 0; i < part.rows; ++i) out.push_back(t * batch + m.first + part.first + i);
    }
  return out;
}

}  // namespace xpipe
