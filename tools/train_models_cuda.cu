// xpipe-train's GPU runs (--device cuda): the reference MLP over 4 stages on CUDA devices, with
// the predictors of the study, through the same run_pipeline as the host (train_run.hpp). A
// CUDA translation unit (nvcc), built into xpipe-train when the CUDA Toolkit is found.
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>

// The CUDA umbrella first: every CUDA unit sees the same launchers (kernels/cuda/vectorized.cuh).
#include "xpipe/xpipe_cuda.cuh"
#include "xpipe/exec/cuda.cuh"
#include "train_run.hpp"

namespace xpipe::tools::train {

namespace {
// The predictors compiled for the GPU: the study's (xpipe-train --compare). Each is a
// Pipeline instantiation nvcc compiles for every architecture, so the list is kept short.
using CudaPredictors = std::tuple<Latest, Stash, DoubleBuffered, SpecTrain, XPipe, PipeOptim>;

template <class... Stages>
RunRecord run_stages_cuda(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  return [&]<class... P>(std::tuple<P...>*) {
    std::optional<RunRecord> out;
    ((c.predictor == P::name
          ? (out.emplace(run_pipeline<Pipeline<Stages..., P, AnyOptimizer, Cuda>>(c, data, check)),
             true)
          : false) ||
     ...);
    if (out) return std::move(*out);
    std::string names;
    ((names += (names.empty() ? "" : ", ") + std::string(P::name)), ...);
    throw ConfigError("xpipe-train: --device cuda: predictor '" + c.predictor +
                      "' is not compiled for the GPU (compiled: " + names + ")");
  }(static_cast<CudaPredictors*>(nullptr));
}
}  // namespace

RunRecord run_mlp4_cuda(const RunConfig& c, const DatasetPair& data, const CheckPoint& check) {
  return run_stages_cuda<mlp::A, mlp::B, mlp::C, mlp::D>(c, data, check);
}

std::string cuda_device_problem() {
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess)
    return std::string("no CUDA device: cudaGetDeviceCount says ") + cudaGetErrorString(err);
  if (devices == 0) return "no CUDA device: cudaGetDeviceCount found 0 devices";
  return {};
}

}  // namespace xpipe::tools::train
