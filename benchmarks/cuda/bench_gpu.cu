// GPU benchmarks of issue 10, each a ratio to a baseline measured in the same run (cudaEvent
// timing, median of repeats): the Adam step and the Adam prediction pass against a
// device-to-device copy moving the same bytes; the MLP's Linear forward + backward through our
// layer code against its cuBLAS SGEMMs alone; and the whole K = 1 training step of the
// 784-1024-1024-1024-10 MLP at batch 128 (samples/s, eager and replayed from a CUDA graph), with
// Linear then ReLU and with Dense layers (bias and ReLU in one pass); and the Pipeline
// (async 1F1B x XPipe) with K = 2 and K = 4 stages on streams of one GPU against K = 1. For the
// CNNs: each convolution of the ResNet (models/resnet.hpp) at batch 128, forward + both
// gradients through ConvPlans<Cuda>, against its im2col GEMMs alone (aim >= 0.8), and the
// ResNet's whole K = 1 training step (samples/s, eager and from a CUDA graph).
// A program of its own (the lent GPU machine has no Google Benchmark). Exits 77 without a device.
//   bench_gpu [--short] [--gemm-detail] [--json PATH]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "xpipe/models/mlp.hpp"
#include "xpipe/models/resnet.hpp"
#include "xpipe/xpipe_cuda.cuh"

namespace {

using xpipe::index_t;
using Mlp = xpipe::models::FashionMlp;

struct Options {
  bool quick = false;        // --short: fewer repeats, no 64 M pass (the CTest smoke run)
  bool gemm_detail = false;  // --gemm-detail: each GEMM alone, with cuBLASLt's algorithms
  std::string json;
};

//! Median milliseconds per call of `op`: `reps` timings of `iters` back-to-back calls on stream.
double median_ms(cudaStream_t stream, int reps, int iters, const std::function<void()>& op) {
  cudaEvent_t start, stop;
  XPIPE_CUDA_CHECK(cudaEventCreate(&start));
  XPIPE_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < std::max(2, iters / 4); ++i) op();  // warm-up: clocks, caches, lazy loading
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    XPIPE_CUDA_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < iters; ++i) op();
    XPIPE_CUDA_CHECK(cudaEventRecord(stop, stream));
    XPIPE_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    XPIPE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    t.push_back(static_cast<double>(ms) / iters);
  }
  XPIPE_CUDA_CHECK(cudaEventDestroy(start));
  XPIPE_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

//! Median milliseconds per call of `op` with the host out of the way: `per_graph` back-to-back
//! calls captured once in a CUDA graph, the graph replayed (`reps` timings of `replays`
//! replays), the time divided by the calls. What the device spends on the calls' kernels, where the
//! eager timing of median_ms is bound by the host's launches at these sizes (and moves with the
//! host's speed). One eager call first (plans made, kernels loaded); 0, with the reason printed,
//! where the capture fails (a call the capture does not allow).
double graph_median_ms(cudaStream_t stream, int reps, int per_graph, int replays,
                       const std::function<void()>& op) {
  op();
  XPIPE_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  XPIPE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  std::string why;
  try {
    for (int i = 0; i < per_graph; ++i) op();
  } catch (const std::exception& e) {
    why = e.what();
  }
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (why.empty() && end != cudaSuccess) why = cudaGetErrorString(end);
  if (why.empty() && cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess)
    why = "cudaGraphInstantiate failed";
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (!why.empty()) {
    (void)cudaGetLastError();
    std::printf("not captured in a CUDA graph: %s\n", why.c_str());
    return 0.0;
  }
  const std::unique_ptr<CUgraphExec_st, cudaError_t (*)(cudaGraphExec_t)> owner(
      exec, cudaGraphExecDestroy);
  return median_ms(stream, reps, replays,
                   [&] { XPIPE_CUDA_CHECK(cudaGraphLaunch(exec, stream)); }) /
         per_graph;
}

//! A call's milliseconds eager (median_ms: host launches included) and replayed from a graph
//! (graph_median_ms: the device's work alone; 0 where it could not be captured).
struct Timing {
  double eager = 0, graph = 0;
};

Timing eager_and_graph_ms(cudaStream_t stream, int reps, int iters,
                          const std::function<void()>& op) {
  return {median_ms(stream, reps, iters, op), graph_median_ms(stream, reps, 20, 5, op)};
}

struct Row {
  std::string name;
  double value;  // the measured rate (GB/s, samples/s) or time
  std::string unit;
  double baseline;  // the baseline's value in the same unit
  std::string against;
  double aim;  // 0: report only
};

std::vector<Row> rows;

void add(Row r) {
  std::printf("%-44s %12.1f %-10s %12.1f  ratio %6.3f%s  (vs %s)\n", r.name.c_str(), r.value,
              r.unit.c_str(), r.baseline, r.value / r.baseline,
              r.aim > 0 ? (r.value / r.baseline >= r.aim ? "  aim met" : "  below aim") : "",
              r.against.c_str());
  rows.push_back(std::move(r));
}

void fill(float* d, index_t n, float lo, float hi, std::uint64_t seed) {
  xpipe::Rng rng{seed};
  std::vector<float> h(static_cast<std::size_t>(n));
  for (float& x : h) x = rng.uniform(lo, hi);
  XPIPE_CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
  XPIPE_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // landed before a stage stream reads it
}

// ---- 1. the flat optimizer passes against a device-to-device copy of the same bytes ----------
void optimizer_passes(const xpipe::CudaContext& ctx, index_t n, const char* label,
                      const Options& o) {
  xpipe::DeviceBuffer<float> w(n), g(n), m(n), v(n), out(n), copy_src(4 * n), copy_dst(4 * n);
  fill(w.data(), n, -1.f, 1.f, 1), fill(g.data(), n, -1e-2f, 1e-2f, 2);
  fill(m.data(), n, -1e-3f, 1e-3f, 3), fill(v.data(), n, 1e-8f, 1e-4f, 4);
  // Step 7's scalars throughout: the timing does not depend on t, and repeated steps on the same
  // buffers keep the values in range (lr 1e-6).
  const auto s = xpipe::math::adam_scalars(1e-6f, 0.9f, 0.999f, 1e-8f, 0.f, false, 7);
  const int reps = o.quick ? 5 : 21;
  const int iters = o.quick ? 5 : (n > 10'000'000 ? 20 : 200);
  const double f = sizeof(float);
  // A copy of c floats reads c and writes c: 2 c floats moved, counted like the kernels' bytes.
  const auto copy_ms = [&](index_t floats_moved) {
    const std::size_t bytes = static_cast<std::size_t>(floats_moved / 2) * sizeof(float);
    return median_ms(ctx.stream, reps, iters, [&] {
      XPIPE_CUDA_CHECK(cudaMemcpyAsync(copy_dst.data(), copy_src.data(), bytes,
                                       cudaMemcpyDeviceToDevice, ctx.stream));
    });
  };
  const auto gbs = [&](index_t floats_moved, double ms) {
    return static_cast<double>(floats_moved) * f / (ms * 1e-3) / 1e9;
  };
  {  // cudaMalloc'd buffers start 256-byte aligned: the 128-bit path must be the one timed
    const void* p[5] = {w.data(), g.data(), m.data(), v.data(), out.data()};
    if (xpipe::cuda_vec::split_for(p, n).quads != n / 4)
      throw xpipe::Error("bench_gpu: the optimizer buffers would not take the 128-bit path");
  }
  // Adam step: reads w, g, m, v; writes w, m, v.
  const index_t step_moved = 7 * n;
  const double step_copy = gbs(step_moved, copy_ms(step_moved));
  const double step_vec = gbs(step_moved, median_ms(ctx.stream, reps, iters, [&] {
                                xpipe::adam_step(ctx, w.data(), g.data(), m.data(), v.data(), n, s);
                              }));
  const double step_scalar =
      gbs(step_moved, median_ms(ctx.stream, reps, iters, [&] {
            xpipe::cuda_vec::launch_scalar(
                ctx, n, xpipe::ops::AdamStep{w.data(), g.data(), m.data(), v.data(), s});
          }));
  add({std::string("adam step, ") + label + " (vectorised)", step_vec, "GB/s", step_copy,
       "D2D copy, same bytes", 0.8});
  add({std::string("adam step, ") + label + " (scalar kernel)", step_scalar, "GB/s", step_copy,
       "D2D copy, same bytes", 0});
  // Adam prediction (XPipe's W - s lr Adam direction): reads w, m, v; writes out.
  const index_t pred_moved = 4 * n;
  const double pred_copy = gbs(pred_moved, copy_ms(pred_moved));
  const double pred_vec =
      gbs(pred_moved, median_ms(ctx.stream, reps, iters, [&] {
            xpipe::adam_predict(ctx, w.data(), m.data(), v.data(), out.data(), n, 3e-3f, s);
          }));
  const double pred_scalar = gbs(
      pred_moved, median_ms(ctx.stream, reps, iters, [&] {
        xpipe::cuda_vec::launch_scalar(
            ctx, n, xpipe::ops::AdamPredict{w.data(), m.data(), v.data(), out.data(), 3e-3f, s});
      }));
  add({std::string("adam predict, ") + label + " (vectorised)", pred_vec, "GB/s", pred_copy,
       "D2D copy, same bytes", 0.8});
  add({std::string("adam predict, ") + label + " (scalar kernel)", pred_scalar, "GB/s", pred_copy,
       "D2D copy, same bytes", 0});
}

// ---- 2. Linear forward + backward of the MLP against its SGEMMs alone ------------------------
// The MLP's four Linear layers (784-1024-1024-1024-10) through our layer code (Stage::forward,
// Stage::backward: per layer forward GEMM + bias kernel, or one cuBLASLt call with the bias
// epilogue where CudaLtPlans::forward_epilogues is on; backward the dW GEMM with the
// bias-gradient epilogue, dX GEMM; no dX for the stage input) against the same 11 cuBLAS SGEMMs
// called directly with the same operands (aim >= 0.9); the same with the forward epilogues on
// and with no epilogue at all (CudaContext::lt null), against the default; and the whole MLP
// with its ReLUs, as Linear then ReLU (a kernel each way per hidden layer) and as Dense layers.
using LinearLayers = xpipe::Stage<xpipe::Linear<784, 1024>, xpipe::Linear<1024, 1024>,
                                  xpipe::Linear<1024, 1024>, xpipe::Linear<1024, 10>>;
static_assert(LinearLayers::param_count == Mlp::param_count);

//! One forward + backward of a stage at batch `batch` over fixed operands; ms<Model>(c) is its
//! time per call on c, eager and from a graph.
struct LayerCode {
  index_t batch;
  const float* params;
  float* grads;
  const float* x;
  const float* dy;
  int reps, iters;

  template <class Model>
  Timing ms(const xpipe::CudaContext& c) const {
    typename Model::template Activations<xpipe::Cuda> acts(batch);
    typename Model::template GradScratch<xpipe::Cuda> scratch(batch);
    return eager_and_graph_ms(c.stream, reps, iters, [&] {
      Model::forward(c, params, {x, batch, 784}, acts);
      Model::backward(c, params, grads, false, acts, {dy, batch, 10}, xpipe::Matrix{}, scratch);
    });
  }
};

void linear_layers(const xpipe::CudaContext& ctx, const Options& o) {
  constexpr index_t batch = 128;
  xpipe::DeviceBuffer<float> params(Mlp::param_count), grads(Mlp::param_count), x(batch * 784),
      dy(batch * 10);
  fill(params.data(), Mlp::param_count, -0.05f, 0.05f, 5);
  fill(x.data(), batch * 784, 0.f, 1.f, 6), fill(dy.data(), batch * 10, -0.1f, 0.1f, 7);
  const int reps = o.quick ? 5 : 21, iters = o.quick ? 5 : 200;
  const LayerCode code{batch, params.data(), grads.data(), x.data(), dy.data(), reps, iters};
  xpipe::CudaContext no_epilogues = ctx;
  no_epilogues.lt = nullptr;
  const Timing linear = code.ms<LinearLayers>(ctx), plain = code.ms<LinearLayers>(no_epilogues);
  const bool forward_epilogues = ctx.lt->forward_epilogues;
  ctx.lt->forward_epilogues = true;
  const Timing fused_forward = code.ms<LinearLayers>(ctx);
  ctx.lt->forward_epilogues = forward_epilogues;
  const Timing with_relu = code.ms<Mlp>(ctx);
  const Timing dense = code.ms<xpipe::models::FashionMlpFused>(ctx);
  // The GEMMs alone, row-major C = A B as column-major C^T = B^T A^T (as backend/cuda.cuh does).
  constexpr index_t widths[5] = {784, 1024, 1024, 1024, 10};
  xpipe::DeviceBuffer<float> act(batch * 1024 * 4), dact(batch * 1024 * 2);
  const auto sgemm = [&](bool ta, bool tb, index_t m, index_t n, index_t k, const float* a,
                         index_t lda, const float* b, index_t ldb, float* c, index_t ldc) {
    const float one = 1.f, zero = 0.f;
    XPIPE_CUBLAS_CHECK(cublasSgemm(ctx.blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   ta ? CUBLAS_OP_T : CUBLAS_OP_N, int(n), int(m), int(k), &one, b,
                                   int(ldb), a, int(lda), &zero, c, int(ldc)));
  };
  const Timing gemms = eager_and_graph_ms(ctx.stream, reps, iters, [&] {
    index_t off = 0;
    const float* in = x.data();
    for (int l = 0; l < 4; ++l) {  // forward: y = x W
      const index_t i = widths[l], j = widths[l + 1];
      sgemm(false, false, batch, j, i, in, i, params.data() + off, j, act.data() + l * batch * 1024,
            j);
      in = act.data() + l * batch * 1024;
      off += i * j + j;
    }
    for (int l = 3; l >= 0; --l) {  // backward: dW = x^T dy, dX = dy W^T (not for layer 0)
      const index_t i = widths[l], j = widths[l + 1];
      off -= i * j + j;
      const float* xin = l == 0 ? x.data() : act.data() + (l - 1) * batch * 1024;
      const float* up = l == 3 ? dy.data() : dact.data() + (l % 2) * batch * 1024;
      sgemm(true, false, i, j, batch, xin, i, up, j, grads.data() + off, j);
      if (l > 0)
        sgemm(false, true, batch, i, j, up, j, params.data() + off, j,
              dact.data() + ((l + 1) % 2) * batch * 1024, i);
    }
  });
  // The aim is judged from graphs; where they could not be captured, on the eager ratio.
  const bool graphs = linear.graph > 0 && gemms.graph > 0;
  if (graphs)
    add({"MLP Linear layers fwd+bwd, batch 128, graph", 1.0 / linear.graph, "calls/ms",
         1.0 / gemms.graph, "its 11 cuBLAS SGEMMs alone, graph", 0.9});
  add({"MLP Linear layers fwd+bwd, batch 128, eager", 1.0 / linear.eager, "calls/ms",
       1.0 / gemms.eager, "its 11 cuBLAS SGEMMs alone, eager", graphs ? 0 : 0.9});
  if (graphs && fused_forward.graph > 0 && plain.graph > 0 && with_relu.graph > 0 &&
      dense.graph > 0) {
    add({"Linear layers, graph: forward epilogues on", 1.0 / fused_forward.graph, "calls/ms",
         1.0 / linear.graph, "default: GEMM + bias kernel forward", 0});
    add({"Linear layers, graph: no epilogues", 1.0 / plain.graph, "calls/ms", 1.0 / linear.graph,
         "default: bias-gradient epilogue", 0});
    add({"MLP Linear, ReLU fwd+bwd, graph", 1.0 / with_relu.graph, "calls/ms", 1.0 / gemms.graph,
         "its 11 cuBLAS SGEMMs alone, graph", 0});
    add({"MLP Dense fwd+bwd (ReLU fused), graph", 1.0 / dense.graph, "calls/ms", 1.0 / gemms.graph,
         "its 11 cuBLAS SGEMMs alone, graph", 0});
  }
}

// ---- 2b. --gemm-detail: each of those 11 GEMMs alone, three ways ----------------------------
// Per GEMM of the MLP at batch 128: cublasSgemm on the stage's handle (what the plain path and
// the baseline above call); cuBLASLt with the layer's epilogue (BIAS forward, BGRADA for dW, none
// for dX) for each algorithm the heuristic offers (up to 8; the first is what CudaLtPlans takes
// for these operands, all 256-byte aligned), with its tile, split-K and waves; and the layer call
// (linear_forward / linear_param_grads) with the stage's default plans and with none (GEMM +
// kernel). Microseconds per call from CUDA graphs of 20 calls (the device's time, not the host's
// launches). A diagnosis, not a ratio row: where the time of the layer code above goes, and the
// evidence for CudaLtPlans::forward_epilogues' default.
namespace detail_gemm {
int config(const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t attr) {
  std::uint32_t v = 0;
  std::size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&a, attr, &v, sizeof(v), &written) !=
      CUBLAS_STATUS_SUCCESS)
    return -1;
  return static_cast<int>(v);
}

void one(const xpipe::CudaContext& ctx, cublasLtHandle_t lt, void* ws, std::size_t ws_bytes,
         const char* name, const xpipe::CudaLtPlans::Key& key, const float* a, const float* b,
         float* d, const float* bias, const std::function<void()>& sgemm,
         const std::function<void()>& layer_lt, const std::function<void()>& layer_plain,
         int reps) {
  const auto us = [&](const std::function<void()>& op) {
    const double ms = graph_median_ms(ctx.stream, reps, 20, 5, op);
    char text[32];
    std::snprintf(text, sizeof(text), ms > 0 ? "%6.1f us" : "   n/a   ", 1e3 * ms);
    return std::string(text);
  };
  if (layer_lt) {
    std::printf("%-26s sgemm %s | layer call: default plans %s, no plans %s\n", name,
                us(sgemm).c_str(), us(layer_lt).c_str(), us(layer_plain).c_str());
  } else {
    std::printf("%-26s sgemm %s | layer call: this GEMM (no epilogue)\n", name, us(sgemm).c_str());
  }
  cublasLtMatmulDesc_t desc = nullptr;
  XPIPE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  XPIPE_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  XPIPE_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  XPIPE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                    &key.epilogue, sizeof(key.epilogue)));
  if (bias != nullptr)
    XPIPE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                      &bias, sizeof(bias)));
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  XPIPE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, key.trans_a ? key.k : key.m,
                                                key.trans_a ? key.m : key.k, key.lda));
  XPIPE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, key.trans_b ? key.n : key.k,
                                                key.trans_b ? key.k : key.n, key.ldb));
  XPIPE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, key.m, key.n, key.ldd));
  cublasLtMatmulPreference_t pref = nullptr;
  XPIPE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const std::uint64_t wsb = ws_bytes;
  XPIPE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb)));
  cublasLtMatmulHeuristicResult_t res[8] = {};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 8, res, &found);
  if (st != CUBLAS_STATUS_SUCCESS) found = 0;
  for (int i = 0; i < found; ++i) {
    if (res[i].state != CUBLAS_STATUS_SUCCESS || res[i].workspaceSize > ws_bytes) continue;
    const float alpha = 1.f, beta = 0.f;
    const double us =
        1e3 * graph_median_ms(ctx.stream, reps, 20, 5, [&] {
          XPIPE_CUBLAS_CHECK(cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld,
                                            &res[i].algo, ws, ws_bytes, ctx.stream));
        });
    std::printf(
        "    heuristic #%d: %6.1f us  algo %d tile %d split-k %d reduction %d stages %d "
        "waves %.2f workspace %zu\n",
        i, us, config(res[i].algo, CUBLASLT_ALGO_CONFIG_ID),
        config(res[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
        config(res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
        config(res[i].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
        config(res[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID), res[i].wavesCount,
        res[i].workspaceSize);
  }
  if (found == 0) std::printf("    cuBLASLt offers no algorithm (status %d)\n", int(st));
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(ld), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(la);
  cublasLtMatmulDescDestroy(desc);
}
}  // namespace detail_gemm

void gemm_detail(const xpipe::CudaContext& ctx, const Options& o) {
  using detail_gemm::one;
  constexpr index_t batch = 128;
  constexpr index_t widths[5] = {784, 1024, 1024, 1024, 10};
  const int reps = o.quick ? 5 : 21;
  xpipe::DeviceBuffer<float> params(Mlp::param_count), grads(Mlp::param_count), x(batch * 1024),
      y(batch * 1024), dy(batch * 1024), dx(batch * 1024);
  fill(params.data(), Mlp::param_count, -0.05f, 0.05f, 5);
  fill(x.data(), batch * 1024, 0.f, 1.f, 6), fill(dy.data(), batch * 1024, -0.1f, 0.1f, 7);
  cublasLtHandle_t lt = nullptr;
  XPIPE_CUBLAS_CHECK(cublasLtCreate(&lt));
  xpipe::DeviceBuffer<std::uint8_t> ws(xpipe::CudaLtPlans::workspace_bytes);
  xpipe::CudaContext plain = ctx;
  plain.lt = nullptr;
  std::printf(
      "-- --gemm-detail: the MLP's GEMMs at batch %ld, microseconds per call (CUDA graphs)\n",
      static_cast<long>(batch));
  index_t off = 0;
  for (int l = 0; l < 4; ++l) {
    const index_t in = widths[l], out = widths[l + 1];
    const float* w = params.data() + off;
    const float* b = w + in * out;
    float* dw = grads.data() + off;
    float* db = dw + in * out;
    off += in * out + out;
    char name[64];
    const xpipe::ConstMatrix xm{x.data(), batch, in};
    const xpipe::Matrix ym{y.data(), batch, out};
    const xpipe::ConstMatrix dym{dy.data(), batch, out};
    xpipe::CudaLtPlans::Key fwd;
    fwd.m = out, fwd.n = batch, fwd.k = in, fwd.lda = out, fwd.ldb = in, fwd.ldd = out;
    fwd.epilogue = CUBLASLT_EPILOGUE_BIAS;
    std::snprintf(name, sizeof(name), "forward %ld-%ld", long(in), long(out));
    one(
        ctx, lt, ws.data(), xpipe::CudaLtPlans::workspace_bytes, name, fwd, w, x.data(), y.data(),
        b,
        [&] {
          xpipe::gemm(ctx, xpipe::Trans::No, xpipe::Trans::No, batch, out, in, 1.f, x.data(), in, w,
                      out, 0.f, y.data(), out);
        },
        [&] { xpipe::linear_forward(ctx, xm, w, b, ym); },
        [&] { xpipe::linear_forward(plain, xm, w, b, ym); }, reps);
    xpipe::CudaLtPlans::Key bwd;
    bwd.m = out, bwd.n = in, bwd.k = batch, bwd.lda = out, bwd.ldb = in, bwd.ldd = out;
    bwd.trans_b = true;
    bwd.epilogue = CUBLASLT_EPILOGUE_BGRADA;
    std::snprintf(name, sizeof(name), "dW %ld-%ld", long(in), long(out));
    one(
        ctx, lt, ws.data(), xpipe::CudaLtPlans::workspace_bytes, name, bwd, dy.data(), x.data(), dw,
        db,
        [&] {
          xpipe::gemm(ctx, xpipe::Trans::Yes, xpipe::Trans::No, in, out, batch, 1.f, x.data(), in,
                      dy.data(), out, 0.f, dw, out);
        },
        [&] { xpipe::linear_param_grads(ctx, xm, dym, dw, db, false); },
        [&] { xpipe::linear_param_grads(plain, xm, dym, dw, db, false); }, reps);
    if (l == 0) continue;
    // dX = dY W^T: column-major dX^T (in x batch) = W_cm^T dY^T, W_cm the out x in view of W.
    xpipe::CudaLtPlans::Key dxk;
    dxk.m = in, dxk.n = batch, dxk.k = out, dxk.lda = out, dxk.ldb = out, dxk.ldd = in;
    dxk.trans_a = true;
    std::snprintf(name, sizeof(name), "dX %ld-%ld", long(in), long(out));
    const auto dx_gemm = [&] {
      xpipe::gemm(ctx, xpipe::Trans::No, xpipe::Trans::Yes, batch, in, out, 1.f, dy.data(), out, w,
                  out, 0.f, dx.data(), in);
    };
    one(ctx, lt, ws.data(), xpipe::CudaLtPlans::workspace_bytes, name, dxk, w, dy.data(), dx.data(),
        nullptr, dx_gemm, {}, {}, reps);
  }
  cublasLtDestroy(lt);
}

// ---- 3. the whole training step, K = 1 -------------------------------------------------------
// SequentialTrainer's step composed from the same calls (Stage::forward, softmax cross-entropy,
// Stage::backward, the optimizer step) with device inputs; the per-row losses stay on the device
// (SequentialTrainer::train_step sums them on the host, which would synchronise every step).
// Model: FashionMlp (Linear then ReLU), FashionMlpFused (Dense: bias and ReLU in one pass) or
// the ResNet (its BatchNorm layers in training mode, updating their running statistics).
template <class Model>
struct Step {
  static constexpr index_t batch = 128;
  xpipe::OptimizerState<xpipe::Adam, xpipe::Cuda> state{xpipe::Adam{.lr = 1e-3f},
                                                        Model::param_count};
  typename Model::template Activations<xpipe::Cuda> acts{batch};
  typename Model::template GradScratch<xpipe::Cuda> scratch{batch};
  xpipe::DeviceBuffer<float> x{batch * Model::in_width}, dlogits{batch * 10}, row_loss{batch},
      running{Model::state_count};
  xpipe::DeviceBuffer<std::int32_t> labels{batch};

  Step() {
    std::vector<float> w(static_cast<std::size_t>(Model::param_count));
    Model::init({w.data(), w.size()}, 1);
    XPIPE_CUDA_CHECK(
        cudaMemcpy(state.weights(), w.data(), w.size() * sizeof(float), cudaMemcpyHostToDevice));
    if constexpr (Model::state_count > 0) {
      std::vector<float> r(static_cast<std::size_t>(Model::state_count));
      Model::init_state({r.data(), r.size()});
      XPIPE_CUDA_CHECK(
          cudaMemcpy(running.data(), r.data(), r.size() * sizeof(float), cudaMemcpyHostToDevice));
    }
    XPIPE_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    fill(x.data(), batch * Model::in_width, 0.f, 1.f, 8);
    std::vector<std::int32_t> y(batch);
    for (index_t r = 0; r < batch; ++r) y[r] = static_cast<std::int32_t>((r * 7) % 10);
    labels.copy_from_host(y.data(), batch);
  }
  void run(const xpipe::CudaContext& ctx) {
    const auto logits = Model::forward(ctx, state.weights(), {x.data(), batch, Model::in_width},
                                       acts, xpipe::Running{running.data(), true});
    xpipe::SoftmaxCrossEntropy::forward_backward_unchecked(
        ctx, logits, labels.data(), 1.f / batch, {dlogits.data(), batch, 10}, row_loss.data());
    Model::backward(ctx, state.weights(), state.grads(), false, acts, {dlogits.data(), batch, 10},
                    xpipe::Matrix{}, scratch);
    state.step(ctx);
  }
};

//! Samples/s of the step eager and replayed from a CUDA graph (0 where it could not be
//! captured); rows named train_step_<tag>eager/graph_samples_per_s.
template <class Model>
std::pair<double, double> training_step(const xpipe::CudaContext& ctx, const Options& o,
                                        const std::string& label, const std::string& tag) {
  Step<Model> step;
  // Steps per timing: about 50 ms of them, from 2 to 100 (5 with --short), so that a model whose
  // step takes hundreds of milliseconds does not hold the check for minutes.
  const double probe = median_ms(ctx.stream, 1, 2, [&] { step.run(ctx); });
  const int reps = o.quick ? 5 : 21,
            iters =
                std::clamp(static_cast<int>(50.0 / std::max(probe, 1e-3)), 2, o.quick ? 5 : 100);
  const double eager = median_ms(ctx.stream, reps, iters, [&] { step.run(ctx); });
  const double b = Step<Model>::batch;
  std::printf("%-44s %12.1f samples/s (%.1f us/step)\n", (label + ": eager").c_str(),
              b / (eager * 1e-3), eager * 1e3);
  rows.push_back(
      {"train_step_" + tag + "eager_samples_per_s", b / (eager * 1e-3), "samples/s", 0, "", 0});
  // The same step captured once and replayed. Caveat: Adam's bias corrections are kernel
  // arguments computed on the host from the step count, so a replay repeats the captured step's
  // scalars; the work per replay is the same, the arithmetic of later steps is not.
  const double replay = graph_median_ms(ctx.stream, reps, 1, iters, [&] { step.run(ctx); });
  if (replay == 0) {  // graph_median_ms said why; the graph row left out
    std::printf("%s: no graph row\n", label.c_str());
    return {b / (eager * 1e-3), 0.0};
  }
  add({label + ": graph", b / (replay * 1e-3), "samples/s", b / (eager * 1e-3),
       "the same step eager", 0});
  rows.push_back(
      {"train_step_" + tag + "graph_samples_per_s", b / (replay * 1e-3), "samples/s", 0, "", 0});
  return {b / (eager * 1e-3), b / (replay * 1e-3)};
}

//! The step with Linear then ReLU, then with Dense layers (a ReLU kernel less per hidden layer's
//! forward), and the fused one's ratio to the other.
void training_steps(const xpipe::CudaContext& ctx, const Options& o) {
  const auto [eager, graph] = training_step<Mlp>(ctx, o, "MLP train step K=1, batch 128", "");
  const auto [fused_eager, fused_graph] = training_step<xpipe::models::FashionMlpFused>(
      ctx, o, "MLP train step K=1, batch 128, Dense", "dense_");
  add({"MLP train step K=1: Dense, eager", fused_eager, "samples/s", eager,
       "Linear then ReLU, eager", 0});
  if (graph > 0 && fused_graph > 0)
    add({"MLP train step K=1: Dense, graph", fused_graph, "samples/s", graph,
         "Linear then ReLU, graph", 0});
  // The ResNet's step; gpu-check.sh sets it beside PyTorch's (torch_step.py, cuDNN).
  training_step<xpipe::models::resnet::K1>(ctx, o, "ResNet train step K=1, batch 128", "resnet_");
}

// ---- 3b. the ResNet's convolutions against their im2col GEMMs ---------------------------------
// Each distinct convolution of models/resnet.hpp at batch 128 (no bias; `count` of them in the
// network): ConvPlans<Cuda> forward, backward_data and backward_weights (im2col, the GEMMs,
// col2im) against the same three GEMMs per chunk of images alone, called on buffers of the same
// sizes (what an im2col convolution cannot go below). From CUDA graphs (the device's work),
// aim >= 0.8 each; then the network's convolutions together, each geometry weighted by its count.
struct ConvCase {
  const char* name;
  xpipe::ConvGeometry g;
  int count;
};

void convolutions(const xpipe::CudaContext& ctx, const Options& o) {
  constexpr index_t batch = 128;
  using xpipe::make_conv_geometry;
  const ConvCase cases[] = {
      {"stem 1->16 28x28 3x3", make_conv_geometry(batch, 1, 28, 28, 16, 3, 1, 1, false), 1},
      {"16->16 28x28 3x3", make_conv_geometry(batch, 16, 28, 28, 16, 3, 1, 1, false), 6},
      {"16->32 28x28 3x3 stride 2", make_conv_geometry(batch, 16, 28, 28, 32, 3, 2, 1, false), 1},
      {"16->32 28x28 1x1 stride 2", make_conv_geometry(batch, 16, 28, 28, 32, 1, 2, 0, false), 1},
      {"32->32 14x14 3x3", make_conv_geometry(batch, 32, 14, 14, 32, 3, 1, 1, false), 5},
      {"32->64 14x14 3x3 stride 2", make_conv_geometry(batch, 32, 14, 14, 64, 3, 2, 1, false), 1},
      {"32->64 14x14 1x1 stride 2", make_conv_geometry(batch, 32, 14, 14, 64, 1, 2, 0, false), 1},
      {"64->64 7x7 3x3", make_conv_geometry(batch, 64, 7, 7, 64, 3, 1, 1, false), 5},
  };
  const int reps = o.quick ? 5 : 21;
  double conv_total = 0, gemm_total = 0;
  bool all = true;
  for (const ConvCase& c : cases) {
    const xpipe::ConvGeometry& g = c.g;
    xpipe::ConvPlans<xpipe::Cuda> plans(g);
    xpipe::DeviceBuffer<float> x(g.rows * g.in_floats()), w(g.weight_floats()),
        y(g.rows * g.out_floats()), dy(g.rows * g.out_floats()), dx(g.rows * g.in_floats()),
        dw(g.weight_floats());
    fill(x.data(), g.rows * g.in_floats(), -1.f, 1.f, 11);
    fill(w.data(), g.weight_floats(), -0.1f, 0.1f, 12);
    fill(dy.data(), g.rows * g.out_floats(), -0.1f, 0.1f, 13);
    const double conv = graph_median_ms(ctx.stream, reps, 5, 5, [&] {
      plans.forward(ctx, g, x.data(), w.data(), nullptr, y.data());
      plans.backward_data(ctx, g, w.data(), dy.data(), dx.data());
      plans.backward_weights(ctx, g, x.data(), dy.data(), dw.data(), nullptr, false);
    });
    // The GEMMs alone, chunk by chunk as the plans call them: on a column buffer of the
    // workspace's size, and on y and dy themselves, which the plans' GEMMs read and write in place
    // (channels-last, a chunk's images are one (n P) x oc matrix).
    const index_t chunk = plans.chunk(), kk = static_cast<index_t>(g.c) * g.k * g.k,
                  pixels = static_cast<index_t>(g.oh) * g.ow;
    const xpipe::ConvWorkspaceFloats sizes = xpipe::conv_workspace_floats(g, chunk);
    xpipe::DeviceBuffer<float> cols(sizes.cols);
    fill(cols.data(), sizes.cols, -1.f, 1.f, 14);
    const double gemms = graph_median_ms(ctx.stream, reps, 5, 5, [&] {
      using xpipe::Trans;
      for (index_t first = 0; first < g.rows; first += chunk) {
        const index_t n = std::min(chunk, g.rows - first), np = n * pixels,
                      out = first * g.out_floats();
        xpipe::gemm(ctx, Trans::No, Trans::Yes, np, g.oc, kk, 1.f, cols.data(), kk, w.data(), kk,
                    0.f, y.data() + out, g.oc);
        xpipe::gemm(ctx, Trans::No, Trans::No, np, kk, g.oc, 1.f, dy.data() + out, g.oc, w.data(),
                    kk, 0.f, cols.data(), kk);
        xpipe::gemm(ctx, Trans::Yes, Trans::No, g.oc, kk, np, 1.f, dy.data() + out, g.oc,
                    cols.data(), kk, first == 0 ? 0.f : 1.f, dw.data(), kk);
      }
    });
    if (conv == 0 || gemms == 0) {  // graph_median_ms said why
      all = false;
      continue;
    }
    add({std::string("conv ") + c.name + " fwd+bwd, graph", 1.0 / conv, "calls/ms", 1.0 / gemms,
         "its im2col GEMMs alone, graph", 0.8});
    conv_total += c.count * conv;
    gemm_total += c.count * gemms;
  }
  if (all)
    add({"ResNet's 21 convolutions fwd+bwd, graph", 1.0 / conv_total, "steps/ms", 1.0 / gemm_total,
         "their im2col GEMMs alone, graph", 0});
}

// ---- 4. the pipeline on one GPU's streams (and on two GPUs) ----------------------------------
// Pipeline<..., Cuda> trained with CudaExecutor, async 1F1B x XPipe, M = 1, batch 128, over an
// epoch of synthetic rows: K = 1, K = 2 and K = 4 stages on streams of device 0 (one host thread
// and stream per stage), and K = 2 on devices 0 and 1 where there are two of one model with peer
// access. Timed on the host around train(), which returns after every stream has finished (the
// epoch's upload included); median of repeats after a warm-up epoch.
namespace pipe {
using L1 = xpipe::Linear<784, 1024>;
using L2 = xpipe::Linear<1024, 1024>;
using L4 = xpipe::Linear<1024, 10>;
using xpipe::ReLU;
using K1 = xpipe::models::FashionMlp;
using K2a = xpipe::Stage<L1, ReLU, L2, ReLU>;
using K2b = xpipe::Stage<L2, ReLU, L4>;
using A = xpipe::Stage<L1, ReLU>;
using B = xpipe::Stage<L2, ReLU>;
using D = xpipe::Stage<L4>;

template <class... Stages>
double samples_per_s(const Options& o, const xpipe::EpochData& epoch, int k,
                     std::vector<int> devices) {
  constexpr index_t batch = 128;
  const index_t count = epoch.inputs.rows;
  const int mini_batches = static_cast<int>(count / batch);
  xpipe::Pipeline<Stages..., xpipe::XPipe, xpipe::Adam, xpipe::Cuda> p(
      xpipe::Adam{.lr = 1e-3f},
      {.batch = batch, .micro_batches = 1, .seed = 1, .devices = std::move(devices)});
  const xpipe::Schedule s = xpipe::async_1f1b(k, 1, mini_batches);
  xpipe::CudaExecutor exec;
  p.train(s, epoch, exec);  // warm-up: plans, lazy loading, clocks
  std::vector<double> t;
  for (int r = 0; r < (o.quick ? 2 : 7); ++r) {
    const auto start = std::chrono::steady_clock::now();
    p.train(s, epoch, exec);
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return static_cast<double>(count) / t[t.size() / 2];
}
}  // namespace pipe

//! Whether devices 0 and 1 are of one model and can access each other's memory (what the
//! pipeline needs to put adjacent stages on them).
bool two_gpus_with_peer_access(int devices) {
  if (devices < 2) return false;
  cudaDeviceProp a{}, b{};
  XPIPE_CUDA_CHECK(cudaGetDeviceProperties(&a, 0));
  XPIPE_CUDA_CHECK(cudaGetDeviceProperties(&b, 1));
  int ab = 0, ba = 0;
  XPIPE_CUDA_CHECK(cudaDeviceCanAccessPeer(&ab, 0, 1));
  XPIPE_CUDA_CHECK(cudaDeviceCanAccessPeer(&ba, 1, 0));
  return std::strcmp(a.name, b.name) == 0 && ab && ba;
}

void pipelines(const Options& o, int devices, bool two_gpus) {
  const index_t count = 128 * (o.quick ? 8 : 64);
  xpipe::HostBuffer<float> x(count * 784);
  std::vector<std::int32_t> y(static_cast<std::size_t>(count));
  xpipe::Rng rng{3};
  for (float& v : x) v = rng.uniform(0.f, 1.f);
  for (auto& v : y) v = static_cast<std::int32_t>(rng.below(10));
  const xpipe::EpochData epoch{{x.data(), count, 784}, y.data()};
  using namespace pipe;
  const double k1 = samples_per_s<K1>(o, epoch, 1, {0});
  const double k2 = samples_per_s<K2a, K2b>(o, epoch, 2, {0});
  const double k4 = samples_per_s<A, B, B, D>(o, epoch, 4, {0});
  std::printf("%-44s %12.1f samples/s\n", "pipeline K=1, async 1F1B x XPipe, M=1", k1);
  rows.push_back({"pipeline_k1_samples_per_s", k1, "samples/s", 0, "", 0});
  add({"pipeline K=2 on 2 streams of one GPU", k2, "samples/s", k1, "K=1 (one stream)", 0});
  add({"pipeline K=4 on 4 streams of one GPU", k4, "samples/s", k1, "K=1 (one stream)", 1.0});
  if (two_gpus) {
    const double across = samples_per_s<K2a, K2b>(o, epoch, 2, {0, 1});
    add({"pipeline K=2 on 2 GPUs", across, "samples/s", k1, "K=1 on one GPU", 1.8});
  } else {
    std::printf(
        "pipeline K=2 on 2 GPUs: not measured (%d device(s) of one model with peer "
        "access needed: 2)\n",
        devices);
  }
}

std::string escape(const std::string& s) {
  std::string r;
  for (char c : s) r += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  return r;
}

void write_json(const std::string& path, const cudaDeviceProp& p) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) throw xpipe::Error("bench_gpu: cannot write --json file '" + path + "'");
  std::fprintf(f, "{\n  \"device\": \"%s\",\n  \"rows\": [\n", escape(p.name).c_str());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::fprintf(f,
                 "    {\"name\": \"%s\", \"value\": %.6g, \"unit\": \"%s\", \"baseline\": %.6g, "
                 "\"ratio\": %.6g, \"against\": \"%s\", \"aim\": %.3g}%s\n",
                 escape(r.name).c_str(), r.value, r.unit.c_str(), r.baseline,
                 r.baseline > 0 ? r.value / r.baseline : 0.0, escape(r.against).c_str(), r.aim,
                 i + 1 < rows.size() ? "," : "");
  }
  std::fprintf(f, "  ]\n}\n");
  std::fclose(f);
}

}  // namespace

// ---- attention: the fused kernels against the GEMM-and-softmax path ---------------------------
// CausalSelfAttention's forward and backward over 16 sequences of T tokens, 4 heads of 16
// (xpipe-train's GPT heads), both paths replayed from a CUDA graph: tokens/s of the fused kernels
// (kernels/cuda/attention.cuh) against cuBLAS per (sequence, head) and the softmax loop
// (kernels/attention.hpp's device launchers). The issue's aim: 1.5x at T = 256.
template <int T>
void attention_paths(const xpipe::CudaContext& ctx, const Options& o) {
  const index_t rows = 16 * T;
  const xpipe::AttentionShape a{rows, 4, 16, T};
  xpipe::DeviceBuffer<float> x(rows * 192), y(rows * 64), dy(rows * 64), dx(rows * 192),
      probs(rows * 4 * T), grads(rows * 4 * T);
  fill(x.data(), rows * 192, -1.f, 1.f, 41);
  fill(dy.data(), rows * 64, -0.1f, 0.1f, 42);
  const xpipe::ConstMatrix xm{x.data(), rows, 192}, ym{y.data(), rows, 64},
      dym{dy.data(), rows, 64};
  const int reps = o.quick ? 5 : 21;
  const double fused = graph_median_ms(ctx.stream, reps, 5, 5, [&] {
    xpipe::fused_attention_forward(ctx, std::integral_constant<int, 16>{}, a, xm,
                                   {y.data(), rows, 64}, probs.data());
    xpipe::fused_attention_backward(ctx, std::integral_constant<int, 16>{}, a, xm, ym, dym,
                                    {dx.data(), rows, 192}, probs.data());
  });
  const double gemm = graph_median_ms(ctx.stream, reps, 5, 5, [&] {
    xpipe::causal_attention_forward(ctx, a, xm, {y.data(), rows, 64}, probs.data());
    xpipe::causal_attention_backward(ctx, a, xm, dym, {dx.data(), rows, 192}, probs.data(),
                                     grads.data());
  });
  if (fused > 0 && gemm > 0)
    add({"attention fwd+bwd fused, T " + std::to_string(T), rows / (fused * 1e-3), "tokens/s",
         rows / (gemm * 1e-3), "GEMM per (sequence, head) + softmax loop", T == 256 ? 1.5 : 0});
}

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--short") {
      o.quick = true;
    } else if (a == "--gemm-detail") {
      o.gemm_detail = true;
    } else if (a == "--json" && i + 1 < argc) {
      o.json = argv[++i];
    } else {
      std::fprintf(stderr,
                   "bench_gpu: unknown or incomplete argument '%s'\n"
                   "usage: bench_gpu [--short] [--gemm-detail] [--json PATH]\n",
                   a.c_str());
      return 2;
    }
  }
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    std::printf("SKIP: no CUDA device (%s); bench_gpu measured nothing\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 77;
  }
  try {
    cudaDeviceProp prop{};
    XPIPE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("bench_gpu on %s (sm_%d%d)%s\n", prop.name, prop.major, prop.minor,
                o.quick ? ", --short" : "");
    xpipe::CudaStreamContext stream;
    const auto& ctx = stream.ctx();
    optimizer_passes(ctx, Mlp::param_count, "MLP 2.9 M", o);
    if (!o.quick) optimizer_passes(ctx, 64L << 20, "64 M", o);
    linear_layers(ctx, o);
    if (o.gemm_detail) gemm_detail(ctx, o);
    training_steps(ctx, o);
    convolutions(ctx, o);
    attention_paths<128>(ctx, o);
    attention_paths<256>(ctx, o);
    stream.synchronize();
    pipelines(o, devices, two_gpus_with_peer_access(devices));
    if (!o.json.empty()) write_json(o.json, prop);
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  return 0;
}
