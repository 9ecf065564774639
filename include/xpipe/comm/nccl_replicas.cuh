// DeviceReplicaMean<CudaContext>: a CUDA pipeline's data-parallel replicas, each rank on a GPU
// of its own, average each stage's gradient on the GPUs: ncclAllReduce on the stage's stream,
// then one pass times 1 / R, with no copy to the host and no host wait (MpiExecutor takes it
// where the replicas' GPUs are distinct: comm/replica_mean.hpp). Include from CUDA translation
// units that run MpiExecutor (with <mpi.h>) and link NCCL; xpipe-train does where NCCL was found
// (XPIPE_WITH_NCCL).
#pragma once

#if !defined(__CUDACC__)
#error "xpipe/comm/nccl_replicas.cuh is for CUDA translation units (nvcc)"
#endif

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "xpipe/backend/cuda.cuh"
#include "xpipe/comm/mpi_link_end.hpp"
#include "xpipe/comm/nccl_link.cuh"
#include "xpipe/comm/replica_mean.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/kernels/ops.hpp"

namespace xpipe {

//! One NCCL communicator over a stage's replicas (one rank each, on distinct GPUs). Made
//! collectively: replica 0 draws the NCCL id and broadcasts it by MPI (waited for with a
//! deadline: a replica that never comes is an error naming the broadcast, not a hang), then
//! ncclCommInitRank on the stage's GPU. mean() enqueues ncclAllReduce(sum) and the scale on the
//! stage's stream; the bits are the pinned path's where the sums are (2 replicas: a + b).
//! Usage (MpiExecutor does it): `DeviceReplicaMean<CudaContext> m(replicas_comm, ctx);
//! m.mean(ctx, grads, n);`
template <>
class DeviceReplicaMean<CudaContext> {
 public:
  static constexpr bool available = true;

  //! "host gpu7 PCI 0000:41:00.0": equal on two ranks exactly when they use one GPU.
  static std::string device_identity(const CudaContext& ctx) {
    char bus[64] = "?";
    XPIPE_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, ctx.device));
    char host[128] = "?";
    gethostname(host, sizeof host - 1);
    return std::string("host ") + host + " PCI " + bus;
  }

  //! Collective over `replicas` (every replica's rank calls it, in the same stage order).
  //! `deadline`: how long the NCCL id's broadcast may wait for the other replicas.
  DeviceReplicaMean(MPI_Comm replicas, const CudaContext& ctx,
                    std::chrono::duration<double> deadline = std::chrono::seconds(60)) {
    int rank = 0;
    XPIPE_MPI_CHECK(MPI_Comm_rank(replicas, &rank));
    XPIPE_MPI_CHECK(MPI_Comm_size(replicas, &replicas_));
    ncclUniqueId id{};
    if (rank == 0) XPIPE_NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_Request req = MPI_REQUEST_NULL;
    XPIPE_MPI_CHECK(MPI_Ibcast(&id, static_cast<int>(sizeof id), MPI_BYTE, 0, replicas, &req));
    const auto until = std::chrono::steady_clock::now() + deadline;
    for (int done = 0; !done;) {
      XPIPE_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
      if (!done && std::chrono::steady_clock::now() > until)
        throw BackendError(
            "xpipe: DeviceReplicaMean: the NCCL id of the replicas' communicator "
            "did not arrive from replica 0 within the deadline");
      if (!done) std::this_thread::yield();
    }
    XPIPE_CUDA_CHECK(cudaSetDevice(ctx.device));
    XPIPE_NCCL_CHECK(ncclCommInitRank(&comm_, replicas_, id, rank));
  }
  DeviceReplicaMean(const DeviceReplicaMean&) = delete;
  DeviceReplicaMean& operator=(const DeviceReplicaMean&) = delete;
  ~DeviceReplicaMean() {
    if (comm_ == nullptr) return;
    if (aborted_)
      ncclCommAbort(comm_);  // peers may never reach the pending collective
    else
      ncclCommDestroy(comm_);
  }

  //! On ctx's stream (ctx's device current): g = (sum of g over the replicas) * (1 / R).
  void mean(const CudaContext& ctx, float* g, index_t n) {
    nccl_gradient_sum({g, static_cast<std::size_t>(n)}, comm_, ctx.stream);
    scale_buffer(ctx, g, n, 1.f / static_cast<float>(replicas_));
  }

  void abort() noexcept { aborted_ = true; }

 private:
  ncclComm_t comm_ = nullptr;
  int replicas_ = 1;
  bool aborted_ = false;
};

}  // namespace xpipe
