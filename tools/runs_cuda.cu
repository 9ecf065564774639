// xpipe-train's GPU runs (--device cuda): the reference MLP, the VGG, the ResNet and the GPT over
// 4 stages on CUDA devices, with every predictor, through the same run_pipeline as the host
// (train_run.hpp). Built with MPI, their links are MpiChannel's: device rings in one process
// (--executor cuda, threaded, reference), and under --executor mpi a rank per GPU (or ranks
// sharing one), the messages staged through pinned host memory (comm/mpi_staged_link.hpp), and
// with --dp the replicas' gradients averaged by NCCL where each rank has a GPU of its own (built
// with NCCL: comm/nccl_replicas.cuh), through pinned memory and MPI otherwise. A CUDA
// translation unit (nvcc), built into xpipe-train when the CUDA Toolkit is found.
#include <string>

// The CUDA umbrella: the backend, its loops and the CUDA layers and executor.
#include "train_run.hpp"
#include "xpipe/exec/cuda.cuh"
#include "xpipe/xpipe_cuda.cuh"
#if defined(XPIPE_WITH_MPI) && defined(XPIPE_WITH_NCCL)
// --dp with each replica's rank on a GPU of its own: the gradients averaged on the GPUs.
#include "xpipe/comm/nccl_replicas.cuh"
#endif

namespace xpipe::tools::train {

RunRecord run_mlp4_cuda(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  // One Pipeline type: every predictor and optimizer, chosen at run time.
  return run_pipeline<
      Pipeline<mlp::A, mlp::B, mlp::C, mlp::D, AnyPredictor, AnyOptimizer, Cuda, ModelLinks>>(
      c, data, check);
}

RunRecord run_vgg4_cuda(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  return run_pipeline<
      Pipeline<vgg::A, vgg::B, vgg::C, vgg::D, AnyPredictor, AnyOptimizer, Cuda, ModelLinks>>(
      c, data, check);
}

RunRecord run_resnet4_cuda(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  return run_pipeline<Pipeline<resnet::A, resnet::B, resnet::C, resnet::D, AnyPredictor,
                               AnyOptimizer, Cuda, ModelLinks>>(c, data, check);
}

RunRecord run_gpt4_cuda(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  return run_pipeline<
      Pipeline<Gpt::A, Gpt::B, Gpt::B, Gpt::C, AnyPredictor, AnyOptimizer, Cuda, ModelLinks>>(
      c, data, check);
}

std::string cuda_device_problem() {
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess)
    return std::string("no CUDA device: cudaGetDeviceCount says ") + cudaGetErrorString(err);
  if (devices == 0) return "no CUDA device: cudaGetDeviceCount found 0 devices";
  return {};
}

int rank_device(int local_rank) {
  int devices = 0;
  XPIPE_CUDA_CHECK(cudaGetDeviceCount(&devices));
  if (devices < 1) throw ConfigError("xpipe-train: no CUDA device (cudaGetDeviceCount found 0)");
  return local_rank % devices;
}

}  // namespace xpipe::tools::train
