// DeviceReplicaMean for the emulated device (support/emulated_device.hpp): what NCCL's
// all-reduce is to a CUDA pipeline's replicas, emulated with the rule that matters to the
// executor: the mean is a task of the stage's stream, after the backward enqueued before it,
// and it completes only once every replica's stream has reached its own (a blocking
// MPI_Allreduce run by the stream's thread, so MPI must be initialised with
// MPI_THREAD_MULTIPLE). Each process is a machine of its own emulated devices, so the
// replicas' devices are distinct unless shared_device is set (every rank then names the same
// device, as ranks sharing one GPU would, and the executor must take the pinned path).
// Include it before the MpiExecutor runs a pipeline on the emulated device.
#pragma once

#include <mpi.h>
#include <unistd.h>

#include <atomic>
#include <string>

#include "emulated_device.hpp"
#include "xpipe/comm/replica_mean.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/kernels/ops.hpp"

namespace xpipe::test {
//! Every rank's emulated device named alike (ranks sharing one device).
inline std::atomic<bool> shared_replica_device{false};
}  // namespace xpipe::test

namespace xpipe {

template <>
class DeviceReplicaMean<test::EmulatedContext> {
 public:
  static constexpr bool available = true;

  //! "emulated device 0 of process 1234 on host vm", without the process when shared.
  static std::string device_identity(const test::EmulatedContext& ctx) {
    char host[128] = "?";
    gethostname(host, sizeof host - 1);
    return "emulated device " + std::to_string(ctx.device) +
           (test::shared_replica_device ? "" : " of process " + std::to_string(getpid())) + " on " +
           host;
  }

  DeviceReplicaMean(MPI_Comm replicas, const test::EmulatedContext& /*ctx*/) {
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_MULTIPLE)
      throw ConfigError(
          "xpipe: emulated DeviceReplicaMean: a stream's thread calls MPI: initialise MPI with "
          "MPI_THREAD_MULTIPLE");
    if (MPI_Comm_dup(replicas, &comm_) != MPI_SUCCESS)
      throw BackendError("xpipe: emulated DeviceReplicaMean: MPI_Comm_dup failed");
    MPI_Comm_size(comm_, &replicas_);
  }
  DeviceReplicaMean(const DeviceReplicaMean&) = delete;
  DeviceReplicaMean& operator=(const DeviceReplicaMean&) = delete;
  ~DeviceReplicaMean() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    // An aborted mean may still have a stream blocked in its collective: its communicator stays.
    if (!finalized && !aborted_ && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  //! On ctx's stream: g summed over the replicas (MPI_Allreduce, as NCCL sums), then the pass
  //! times 1 / R that CUDA's mean runs (scale_buffer).
  void mean(const test::EmulatedContext& ctx, float* g, index_t n) {
    test::emu::check_launch(ctx, "the replicas' gradient mean");
    test::emu::check_memory(g, ctx.device, false, "the gradient averaged over replicas");
    const MPI_Comm comm = comm_;
    ctx.stream->enqueue([comm, g, n] {
      if (MPI_Allreduce(MPI_IN_PLACE, g, static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm) !=
          MPI_SUCCESS)
        throw BackendError("xpipe: emulated DeviceReplicaMean: MPI_Allreduce failed");
    });
    scale_buffer(ctx, g, n, 1.f / static_cast<float>(replicas_));
  }

  void abort() noexcept { aborted_ = true; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int replicas_ = 1;
  bool aborted_ = false;
};

}  // namespace xpipe
