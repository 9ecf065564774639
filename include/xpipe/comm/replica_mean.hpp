// DeviceReplicaMean<Context>: how a device backend averages a stage's gradient over the stage's
// data-parallel replicas on the devices themselves, when each replica's rank has a device of
// its own (NCCL's all-reduce on CUDA: comm/nccl_replicas.cuh). Without one (the primary
// template below), or where two replicas share a device, MpiExecutor copies the gradient to
// pinned host memory and sums it there by MPI.
#pragma once

#include "xpipe/core/tensor.hpp"

namespace xpipe {

//! The mean of a stage's flat gradient over its replicas on the devices, for stage contexts of
//! type Context: the primary template says there is none. A specialisation (visible wherever
//! MpiExecutor runs a pipeline of that context: include it with the backend) gives:
//!   - `static constexpr bool available = true;`
//!   - `static std::string device_identity(const Context&)`: the device the context runs on,
//!     equal on two ranks exactly when they share one (on CUDA the host name and PCI bus id);
//!   - `DeviceReplicaMean(MPI_Comm replicas, const Context&)`: collective over `replicas` (one
//!     rank per replica of the stage, ranked by replica), each on a device of its own;
//!   - `void mean(const Context&, float* g, index_t n)`: enqueues, on the context's stream after
//!     what is already there, g = (g summed over the replicas) * (1 / R): the host path's
//!     arithmetic (MpiExecutor's scale_gradient_sum), so 2 replicas give its bits;
//!   - `void abort() noexcept`: gives the collective up without waiting for the other replicas
//!     (a failed run, whose peers may never reach it); the destructor may then return at once.
//! Usage: `if constexpr (DeviceReplicaMean<Ctx>::available) ...`
template <class Context>
struct DeviceReplicaMean {
  static constexpr bool available = false;
};

}  // namespace xpipe
