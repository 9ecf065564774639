// What the GPU tests that run under MPI share: started plainly, such a program checks for the
// CUDA devices it needs and for mpirun (on PATH, or $XPIPE_MPIRUN), then runs itself under
// `mpirun -np N <self> ranks`; without either it says which is missing in a SKIP line and exits
// 77 (CTest: skipped). Under mpirun each check is reported by rank 0, or by the rank it failed on.
#pragma once

#include <cuda_runtime.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace xpipe::test {

//! The exit status of this test program run under `mpirun -np ranks` (0 or 1), or 77 after a
//! SKIP line when there are fewer than `devices` CUDA devices or no mpirun. `what` names what
//! was built but not run. Usage: `if (argc < 2) return launch_under_mpirun(argv[0], 2, 1, "...");`
inline int launch_under_mpirun(const char* self, int ranks, int devices, const char* what) {
  int found = 0;
  const cudaError_t err = cudaGetDeviceCount(&found);
  if (err != cudaSuccess || found < devices) {
    const std::string why = err != cudaSuccess ? std::string(": ") + cudaGetErrorString(err) : "";
    std::printf("SKIP: %s needs %d CUDA device%s (found %d%s); built but not run\n", what, devices,
                devices == 1 ? "" : "s", err != cudaSuccess ? 0 : found, why.c_str());
    return 77;
  }
  const char* env = std::getenv("XPIPE_MPIRUN");
  std::string mpirun = env != nullptr && *env != '\0' ? env : "";
  if (mpirun.empty() && std::system("command -v mpirun >/dev/null 2>&1") == 0) mpirun = "mpirun";
  if (mpirun.empty()) {
    std::printf(
        "SKIP: %s: the CUDA devices are here but no mpirun (not on PATH, $XPIPE_MPIRUN "
        "unset); built but not run\n",
        what);
    return 77;
  }
  const std::string cmd = mpirun + " --oversubscribe --allow-run-as-root -np " +
                          std::to_string(ranks) + " '" + self + "' ranks";
  std::printf("%s\n", cmd.c_str());
  std::fflush(stdout);
  return std::system(cmd.c_str()) == 0 ? 0 : 1;
}

//! One check's line, printed by rank 0 or by the rank where it failed; failures counted.
struct RankReport {
  int rank = 0;
  int failures = 0;
  void operator()(const std::string& what, bool ok, const std::string& detail) {
    if (rank == 0 || !ok)
      std::printf("rank %d: %-56s %s (%s)\n", rank, what.c_str(), ok ? "ok" : "FAIL",
                  detail.c_str());
    failures += !ok;
  }
  //! The end of the ranks' run: the failures summed over the ranks, "<name>: ok" or
  //! "<name>: FAILED" from rank 0, MPI finalised; the process's exit status.
  int finish(const char* name) {
    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) std::printf("%s: %s\n", name, total == 0 ? "ok" : "FAILED");
    MPI_Finalize();
    return total == 0 ? 0 : 1;
  }
};

}  // namespace xpipe::test
