// The CUDA executor: one host thread per stage that only enqueues work on the stage's stream;
// the streams, not the host, wait for each other. Include from CUDA translation units only.
#pragma once

#if !defined(__CUDACC__)
#error "xpipe/exec/cuda.cuh is for CUDA translation units (nvcc); link xpipe::cuda"
#endif

#include <chrono>

#include "xpipe/backend/cuda.cuh"
#include "xpipe/exec/executor.hpp"
#include "xpipe/exec/threaded.hpp"

namespace xpipe {

//! Runs a Pipeline<..., Cuda> (or any Program) with one host thread per stage, each walking its
//! stage's action list in order, as ThreadedExecutor does; on CUDA every action only enqueues
//! kernels, GEMMs and copies on the stage's own non-blocking stream, so the threads run ahead
//! of the device by as much as the queues allow.
//!
//! The stream/event model (what Pipeline and its queues do; this executor adds nothing to it):
//!   - stage k has one stream on device k % device count (or Placement::device); every action
//!     of stage k runs on it, so a stage's own reads follow its own writes (activation slots,
//!     weights, predictor copies, optimizer steps) by stream order;
//!   - before each action the stage's device is made current on the calling thread, so any
//!     executor (this one, ThreadedExecutor, ReferenceExecutor) drives the pipeline correctly;
//!   - a queue between stages is a ring of slots on the consumer's device with host cursors:
//!     can_push/can_pop (host, the ring's capacity) is the back-pressure; per slot a `filled`
//!     event (producer's stream, after its write) that the consumer's stream waits on before
//!     reading, and a `drained` event (consumer's stream, after its read) that the producer's
//!     stream waits on before writing the slot again (comm/spsc_ring.hpp);
//!   - the epoch is uploaded before the run on stage 0's stream (inputs) and the last stage's
//!     (labels); each micro-batch's loss is summed on the last stage's device;
//!   - under global clipping each stage's stream writes its squared gradient norm of a
//!     mini-batch to stage 0's device and records an event there; every stage's step waits on
//!     the K events of its mini-batch (enqueued once the host knows all K are recorded);
//!   - the host synchronises once, after the run (Pipeline::train), and reads the loss sums.
//! Errors: a failing CUDA call throws inside the action and reaches the caller as a StageError
//! naming the stage and action; a kernel that fails asynchronously surfaces at the final
//! synchronisation as a StageError ("end of run") naming the first stage whose stream reported
//! it: a sticky fault (an illegal address) is reported by every stream of its device, so that
//! is the first stage on the device, not necessarily the one that faulted.
//! Usage: `Pipeline<S0, S1, S2, S3, XPipe, Adam, Cuda> p; CudaExecutor e; p.train(s, data, e);`
class CudaExecutor {
 public:
  static constexpr const char* name = "cuda";
  //! How long a stage's host thread may wait on a neighbour's host thread that makes no
  //! progress (ThreadedExecutor::wait_timeout): a wait for queue room or a message, never for
  //! the device.
  std::chrono::duration<double> wait_timeout = std::chrono::seconds(60);

  template <Program P>
  void run(P& program) {
    threads_.wait_timeout = wait_timeout;
    threads_.run(program);
  }

  //! When each action was enqueued (host time), not when the device ran it.
  const ExecutionTrace& trace() const { return threads_.trace(); }

 private:
  ThreadedExecutor threads_;
};

static_assert(Executor<CudaExecutor>);

}  // namespace xpipe
