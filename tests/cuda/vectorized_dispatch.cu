// Compiled, never run: the optimizers' steps and predictions on a CudaContext, instantiated
// exactly as a CUDA pipeline instantiates them. check_vectorized_dispatch.cmake then reads this
// object's symbols: the vectorised kernels must be there (the launchers of kernels/ops.hpp picked
// the quad form each pass declares, through backend/cuda/loops.cuh), which needs no GPU.
#include "xpipe/xpipe_cuda.cuh"

namespace xpipe_dispatch_check {

void adam(const xpipe::CudaContext& ctx, xpipe::OptimizerState<xpipe::Adam, xpipe::Cuda>& st,
          float* out) {
  st.step(ctx);
  st.predict(ctx, 2.f, out);
  st.direction(ctx, out);
}

void sgd(const xpipe::CudaContext& ctx, xpipe::OptimizerState<xpipe::SGD, xpipe::Cuda>& st,
         float* out) {
  st.step(ctx);
  st.predict(ctx, 2.f, out);
}

void nadam(const xpipe::CudaContext& ctx, xpipe::OptimizerState<xpipe::NAdam, xpipe::Cuda>& st) {
  st.step(ctx);
}

}  // namespace xpipe_dispatch_check
