// What the MPI test programs share (test_mpi.cpp, test_mpi_device.cpp): the ranks, the model of
// four small stages, the optimizer each predictor is meant for, failures counted per rank, and a
// replica's share of the rows.
#pragma once

#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include "../support/support.hpp"
#include "xpipe/pipeline/replicas.hpp"
#include "xpipe/xpipe.hpp"

namespace xpipe::test::mpi {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

using A = Stage<Linear<12, 16>, ReLU>;
using B = Stage<Linear<16, 16>, GELU>;
using C = Stage<Linear<16, 16>, ReLU>;
using D = Stage<Linear<16, 4>>;

//! The optimizer each predictor is meant for (SpecTrain: SGD momentum; XPipe: AdamW).
inline AnyOptimizer optimizer_for(const std::string& predictor) {
  if (predictor == "spectrain") return make_optimizer("sgd", 0.05f);
  if (predictor == "xpipe") return make_optimizer("adamw", 1e-2f);
  return make_optimizer("adam", 1e-2f);
}

//! Failures on this rank; the test fails when any rank counts one.
inline int failures = 0;
inline void fail(const std::string& what) {
  ++failures;
  std::fprintf(stderr, "FAIL rank %d: %s\n", world_rank(), what.c_str());
}

//! Replica r's rows of d (replica_rows), gathered into a contiguous copy.
inline LabelledData replica_data(const LabelledData& d, index_t batch, int M, int R, int r) {
  const std::vector<index_t> rows = replica_rows(d.rows, batch, M, R, r);
  LabelledData out{{}, {}, static_cast<index_t>(rows.size()), d.cols};
  for (index_t i : rows) {
    out.x.insert(out.x.end(), d.x.begin() + i * d.cols, d.x.begin() + (i + 1) * d.cols);
    out.y.push_back(d.y[static_cast<std::size_t>(i)]);
  }
  return out;
}

//! The end of a test program's mode: the failures of every rank summed, "MODE: ok" (or FAILED)
//! printed by rank 0, MPI finalized; the exit status.
inline int finish(const std::string& mode) {
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (world_rank() == 0) std::printf("%s: %s\n", mode.c_str(), total == 0 ? "ok" : "FAILED");
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}

}  // namespace xpipe::test::mpi
