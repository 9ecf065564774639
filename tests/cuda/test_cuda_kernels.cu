// The launchers of kernels/ops.hpp on a CudaContext against the same launchers on a HostContext:
// each op runs on both backends on the same inputs, and results must agree within
// tol + |ref| * eps (llm.c's rule), printing the first mismatches. Exits 77 (CTest: skipped) when
// no CUDA device is present.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "xpipe/xpipe_cuda.cuh"

namespace {

int failures = 0;

void check(const char* what, const std::vector<float>& ref, const std::vector<float>& got,
           float tol, float eps) {
  int shown = 0, bad = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const float allowed = tol + std::fabs(ref[i]) * eps;
    if (!(std::fabs(ref[i] - got[i]) <= allowed)) {
      if (shown++ < 5) std::printf("  %s[%zu]: host %.9g, cuda %.9g\n", what, i, ref[i], got[i]);
      ++bad;
    }
  }
  std::printf("%-28s %s (%d of %zu outside %g + |ref| * %g)\n", what, bad ? "FAIL" : "ok", bad,
              ref.size(), tol, eps);
  failures += bad != 0;
}

std::vector<float> random_vector(std::size_t n, std::uint64_t seed, float lo = -1.f,
                                 float hi = 1.f) {
  xpipe::Rng rng{seed};
  std::vector<float> v(n);
  for (float& x : v) x = rng.uniform(lo, hi);
  return v;
}

template <class T>
xpipe::DeviceBuffer<T> to_device(const std::vector<T>& v) {
  xpipe::DeviceBuffer<T> d(static_cast<xpipe::index_t>(v.size()));
  d.copy_from_host(v.data(), d.size());
  return d;
}

template <class T>
std::vector<T> to_host(const xpipe::DeviceBuffer<T>& d) {
  std::vector<T> v(static_cast<std::size_t>(d.size()));
  d.copy_to_host(v.data(), d.size());
  return v;
}

using Model = xpipe::Stage<xpipe::Linear<96, 128>, xpipe::ReLU, xpipe::Linear<128, 64>, xpipe::GELU,
                           xpipe::Linear<64, 10>>;

// A whole stage: forward, loss, backward and two Adam steps on both backends.
void stage_and_optimizer(const xpipe::CudaContext& cctx) {
  const xpipe::HostContext hctx{};
  const xpipe::index_t rows = 32;
  const auto x = random_vector(rows * 96, 1);
  std::vector<std::int32_t> labels(rows);
  for (xpipe::index_t r = 0; r < rows; ++r) labels[r] = static_cast<std::int32_t>(r % 10);

  // eps 1e-6, not Adam's 1e-8: near g = 0 a step moves by up to lr * g / eps, so gradients that
  // differ by 1e-9 (another summation order) would move a weight by 1e-3 at lr 1e-2, beyond any
  // tolerance that still catches a wrong kernel; at 1e-6 they move it by 1e-5.
  const xpipe::Adam adam{.lr = 1e-2f, .eps = 1e-6f};
  xpipe::OptimizerState<xpipe::Adam, xpipe::Host> hst(adam, Model::param_count);
  xpipe::OptimizerState<xpipe::Adam, xpipe::Cuda> cst(adam, Model::param_count);
  Model::init({hst.weights(), static_cast<std::size_t>(Model::param_count)}, 5);
  XPIPE_CUDA_CHECK(cudaMemcpy(cst.weights(), hst.weights(), Model::param_count * sizeof(float),
                              cudaMemcpyHostToDevice));
  XPIPE_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // landed before cctx's stream reads it
  Model::Activations<xpipe::Host> ha(rows);
  Model::Activations<xpipe::Cuda> ca(rows);
  Model::GradScratch<xpipe::Host> hs(rows);
  Model::GradScratch<xpipe::Cuda> cs(rows);
  xpipe::HostBuffer<float> hdl(rows * 10), hloss(rows);
  xpipe::DeviceBuffer<float> cdl(rows * 10), closs(rows);
  auto dx = to_device(x);
  auto dlabels = to_device(labels);
  for (int step = 0; step < 2; ++step) {
    const auto hy = Model::forward(hctx, hst.weights(), {x.data(), rows, 96}, ha);
    const auto cy = Model::forward(cctx, cst.weights(), {dx.data(), rows, 96}, ca);
    xpipe::SoftmaxCrossEntropy::forward_backward(hctx, hy, labels.data(), 1.f / rows,
                                                 {hdl.data(), rows, 10}, hloss.data());
    xpipe::SoftmaxCrossEntropy::forward_backward(cctx, cy, dlabels.data(), 1.f / rows,
                                                 {cdl.data(), rows, 10}, closs.data());
    Model::backward(hctx, hst.weights(), hst.grads(), false, ha, {hdl.data(), rows, 10},
                    xpipe::Matrix{}, hs);
    Model::backward(cctx, cst.weights(), cst.grads(), false, ca, {cdl.data(), rows, 10},
                    xpipe::Matrix{}, cs);
    XPIPE_CUDA_CHECK(cudaStreamSynchronize(cctx.stream));
    std::vector<float> hl(hloss.begin(), hloss.end()), cl(rows);
    closs.copy_to_host(cl.data(), rows);
    check(("loss rows, step " + std::to_string(step)).c_str(), hl, cl, 1e-4f, 1e-4f);
    std::vector<float> hg(hst.grads(), hst.grads() + Model::param_count), cg(Model::param_count);
    XPIPE_CUDA_CHECK(cudaMemcpy(cg.data(), cst.grads(), cg.size() * 4, cudaMemcpyDeviceToHost));
    check(("gradients, step " + std::to_string(step)).c_str(), hg, cg, 1e-5f, 1e-3f);
    hst.step(hctx);
    cst.step(cctx);
    XPIPE_CUDA_CHECK(cudaStreamSynchronize(cctx.stream));
    std::vector<float> hw(hst.weights(), hst.weights() + Model::param_count),
        cw(Model::param_count);
    XPIPE_CUDA_CHECK(cudaMemcpy(cw.data(), cst.weights(), cw.size() * 4, cudaMemcpyDeviceToHost));
    check(("weights after step " + std::to_string(step)).c_str(), hw, cw, 1e-5f, 1e-4f);
  }
  std::vector<float> hd(Model::param_count), cdv(Model::param_count);
  xpipe::DeviceBuffer<float> dd(Model::param_count);
  hst.direction(hctx, hd.data());
  cst.direction(cctx, dd.data());
  XPIPE_CUDA_CHECK(cudaStreamSynchronize(cctx.stream));
  dd.copy_to_host(cdv.data(), dd.size());
  check("adam direction", hd, cdv, 1e-3f, 1e-3f);
}

void element_ops(const xpipe::CudaContext& cctx) {
  const xpipe::HostContext hctx{};
  const xpipe::index_t n = 10007;
  const auto w0 = random_vector(n, 2), g = random_vector(n, 3), m0 = random_vector(n, 4);
  const xpipe::math::SgdScalars s{0.1f, 0.9f, 0.1f, 1e-4f, true, false};
  std::vector<float> hw = w0, hm = m0;
  xpipe::sgd_step(hctx, hw.data(), g.data(), hm.data(), n, s);
  auto dw = to_device(w0), dg = to_device(g), dm = to_device(m0);
  xpipe::sgd_step(cctx, dw.data(), dg.data(), dm.data(), n, s);
  XPIPE_CUDA_CHECK(cudaStreamSynchronize(cctx.stream));
  check("sgd weights", hw, to_host(dw), 1e-6f, 1e-6f);
  check("sgd momentum", hm, to_host(dm), 1e-6f, 1e-6f);
  std::vector<float> hd(n);
  xpipe::DeviceBuffer<float> dd(n);
  xpipe::sgd_direction(hctx, hm.data(), hd.data(), n);
  xpipe::sgd_direction(cctx, dm.data(), dd.data(), n);
  XPIPE_CUDA_CHECK(cudaStreamSynchronize(cctx.stream));
  check("sgd direction", hd, to_host(dd), 1e-6f, 1e-6f);

  // Weight prediction passes (SpecTrain's SGD direction, XPipe's Adam direction), s = 3.
  std::vector<float> hp(n);
  xpipe::sgd_predict(hctx, w0.data(), m0.data(), hp.data(), n, 3 * 0.1f);
  auto pw = to_device(w0), pm = to_device(m0);  // named: the kernel runs asynchronously
  xpipe::sgd_predict(cctx, pw.data(), pm.data(), dd.data(), n, 3 * 0.1f);
  XPIPE_CUDA_CHECK(cudaStreamSynchronize(cctx.stream));
  check("sgd predict", hp, to_host(dd), 1e-6f, 1e-6f);
  std::vector<float> v0(n);
  for (xpipe::index_t i = 0; i < n; ++i) v0[i] = g[i] * g[i] + 1e-6f;
  const auto as = xpipe::math::adam_scalars(1e-3f, 0.9f, 0.999f, 1e-8f, 0.f, false, 7);
  xpipe::adam_predict(hctx, w0.data(), m0.data(), v0.data(), hp.data(), n, 3e-3f, as);
  auto dw0 = to_device(w0), dm0 = to_device(m0), dv0 = to_device(v0);
  xpipe::adam_predict(cctx, dw0.data(), dm0.data(), dv0.data(), dd.data(), n, 3e-3f, as);
  XPIPE_CUDA_CHECK(cudaStreamSynchronize(cctx.stream));
  check("adam predict", hp, to_host(dd), 1e-6f, 1e-5f);

  // Softmax cross-entropy with extreme logits.
  auto logits = random_vector(64 * 10, 6, -1e4f, 1e4f);
  std::vector<std::int32_t> labels(64);
  for (int r = 0; r < 64; ++r) labels[r] = r % 10;
  std::vector<float> hgrad(640), hloss(64);
  xpipe::softmax_xent(hctx, {logits.data(), 64, 10}, labels.data(), 1.f / 64,
                      {hgrad.data(), 64, 10}, hloss.data());
  auto dl = to_device(logits);
  auto dlab = to_device(labels);
  xpipe::DeviceBuffer<float> dgrad(640), dloss(64);
  xpipe::softmax_xent(cctx, {dl.data(), 64, 10}, dlab.data(), 1.f / 64, {dgrad.data(), 64, 10},
                      dloss.data());
  XPIPE_CUDA_CHECK(cudaStreamSynchronize(cctx.stream));
  check("softmax xent grad (+-1e4)", hgrad, to_host(dgrad), 1e-6f, 1e-5f);
  check("softmax xent loss (+-1e4)", hloss, to_host(dloss), 1e-2f, 1e-5f);
}

// The vectorised loops of backend/cuda/loops.cuh: each pass runs on a copy of the same inputs
// through the scalar kernel (one float per thread) and through for_each_index on a CudaContext,
// which takes the quad form. The two must agree bit for bit over the whole buffers
// (padding included: no write outside [0, n)), and the vectorised result must match the host
// loop within the tolerances of element_ops. `offset` shifts each array's start by whole floats
// from a 16-byte aligned allocation; `vectorised` says whether 128-bit accesses must run.
template <int Arrays, class Make>
void vectorized_case(const xpipe::CudaContext& cctx, const char* what, xpipe::index_t n,
                     const int (&offset)[Arrays], unsigned positive, Make make, float tol,
                     float eps) {
  constexpr xpipe::index_t pad = 8;
  const std::size_t len = static_cast<std::size_t>(n + pad);
  std::vector<std::vector<float>> host(Arrays);
  std::vector<xpipe::DeviceBuffer<float>> scal, vec;
  float* hp[Arrays];
  float* sp[Arrays];
  float* vp[Arrays];
  for (int a = 0; a < Arrays; ++a) {
    const bool pos = (positive >> a) & 1u;  // second moments: v >= 0
    host[a] =
        random_vector(len, 100 + 7 * a + static_cast<std::uint64_t>(n), pos ? 1e-4f : -1.f, 1.f);
    scal.push_back(to_device(host[a]));
    vec.push_back(to_device(host[a]));
  }
  for (int a = 0; a < Arrays; ++a) {
    hp[a] = host[a].data() + offset[a];
    sp[a] = scal[a].data() + offset[a];
    vp[a] = vec[a].data() + offset[a];
  }
  const void* vpc[Arrays];
  for (int a = 0; a < Arrays; ++a) vpc[a] = vp[a];
  const bool vectorised = xpipe::cuda_vec::split_for(vpc, n).quads > 0;
  xpipe::cuda_vec::launch_scalar(cctx, n, make(sp));
  xpipe::for_each_index(cctx, n, make(vp));  // what the launchers call: the quad form
  xpipe::for_each_index(xpipe::HostContext{}, n, make(hp));
  XPIPE_CUDA_CHECK(cudaStreamSynchronize(cctx.stream));
  std::string label = std::string(what) + " n=" + std::to_string(n) + " offsets";
  for (int a = 0; a < Arrays; ++a) label += " " + std::to_string(offset[a]);
  label += vectorised ? " (128-bit)" : " (scalar)";
  int differ = 0;
  for (int a = 0; a < Arrays; ++a) {
    const auto s = to_host(scal[a]), v = to_host(vec[a]);
    for (std::size_t i = 0; i < len; ++i)
      if (std::memcmp(&s[i], &v[i], sizeof(float)) != 0 && differ++ < 5)
        std::printf("  %s: array %d [%zu]: scalar kernel %.9g, vectorised %.9g\n", label.c_str(), a,
                    i, s[i], v[i]);
    check((label + " array " + std::to_string(a) + " vs host").c_str(), host[a], v, tol, eps);
  }
  std::printf("%-28s %s (%d floats differ from the scalar kernel)\n", label.c_str(),
              differ ? "FAIL" : "ok", differ);
  failures += differ != 0;
}

void vectorized_ops(const xpipe::CudaContext& cctx) {
  using xpipe::ops::AdamDirection, xpipe::ops::AdamPredict, xpipe::ops::AdamStep;
  using xpipe::ops::NadamStep, xpipe::ops::SgdPredict, xpipe::ops::SgdStep;
  const auto as = xpipe::math::adam_scalars(1e-3f, 0.9f, 0.999f, 1e-8f, 1e-2f, true, 7);
  const auto ns = xpipe::math::nadam_scalars(1e-3f, 0.9f, 0.999f, 1e-8f, 1e-2f, false, 7);
  const xpipe::math::SgdScalars ss{0.1f, 0.9f, 0.1f, 1e-4f, true, false};
  // Sizes: not a multiple of 4, one quad plus a tail, below one quad, a multiple of 4.
  for (const xpipe::index_t n : {10007L, 7L, 3L, 4096L}) {
    // All aligned; all one float past a boundary (scalar head of 3); mixed offsets (scalar loop).
    const int a4[3][4] = {{0, 0, 0, 0}, {1, 1, 1, 1}, {1, 0, 0, 0}};
    const int a3[3][3] = {{0, 0, 0}, {1, 1, 1}, {0, 0, 2}};
    for (int k = 0; k < 3; ++k) {
      vectorized_case<4>(
          cctx, "adam step", n, a4[k], 0b1000u,
          [&](float* const* p) {
            return AdamStep{p[0], p[1], p[2], p[3], as};
          },
          1e-6f, 1e-5f);
      vectorized_case<4>(
          cctx, "adam predict", n, a4[k], 0b0100u,
          [&](float* const* p) { return AdamPredict{p[0], p[1], p[2], p[3], 3e-3f, as}; }, 1e-6f,
          1e-5f);
      vectorized_case<4>(
          cctx, "nadam step", n, a4[k], 0b1000u,
          [&](float* const* p) {
            return NadamStep{p[0], p[1], p[2], p[3], ns};
          },
          1e-6f, 1e-5f);
      vectorized_case<3>(
          cctx, "adam direction", n, a3[k], 0b010u,
          [&](float* const* p) {
            return AdamDirection{p[0], p[1], p[2], as};
          },
          1e-6f, 1e-5f);
      vectorized_case<3>(
          cctx, "sgd step", n, a3[k], 0u,
          [&](float* const* p) {
            return SgdStep{p[0], p[1], p[2], ss};
          },
          1e-6f, 1e-6f);
      vectorized_case<3>(
          cctx, "sgd predict", n, a3[k], 0u,
          [&](float* const* p) {
            return SgdPredict{p[0], p[1], p[2], 0.3f};
          },
          1e-6f, 1e-6f);
    }
  }
  // The cases above must have exercised both paths (else the comparison proves nothing).
  const auto at = [](std::uintptr_t a) { return reinterpret_cast<const void*>(a); };
  const void* aligned[2] = {at(0x1000), at(0x2010)};  // 10007 = 2501 quads + 3
  const void* shifted[2] = {at(0x1004), at(0x2034)};  // head 3, then 10004 = 2501 quads
  const void* mixed[2] = {at(0x1000), at(0x2014)};
  const auto sa = xpipe::cuda_vec::split_for(aligned, 10007);
  const auto ss4 = xpipe::cuda_vec::split_for(shifted, 10007);
  const bool ok = sa.head == 0 && sa.quads == 2501 && ss4.head == 3 && ss4.quads == 2501 &&
                  xpipe::cuda_vec::split_for(mixed, 10007).quads == 0;
  std::printf("%-28s %s\n", "vectorised split", ok ? "ok" : "FAIL");
  failures += !ok;
}

// The Linear layers' cuBLASLt epilogues (kernels/cuda/linear.cuh) against the host and against
// the same stage with them off (CudaContext::lt null: GEMM + kernels): forward, a backward that
// writes the gradients and one that accumulates onto them (the epilogue cannot add: the plain
// path takes it). With CudaLtPlans::forward_epilogues on (`cctx` has it on), the forward's bias
// epilogue must run fused, and on sm_90+ the bias-gradient epilogue too; two fused runs agree
// bitwise. With the default plans (`defaults`: forward epilogues off) no forward is fused and
// the weight gradients still are.
void linear_epilogues(const xpipe::CudaContext& cctx, const xpipe::CudaContext& defaults) {
  const xpipe::HostContext hctx{};
  xpipe::CudaContext plain = cctx;
  plain.lt = nullptr;
  const xpipe::index_t rows = 48;
  const auto x = random_vector(rows * 96, 11);
  const auto dy = random_vector(rows * 10, 12, -0.1f, 0.1f);
  std::vector<float> w(Model::param_count);
  Model::init({w.data(), w.size()}, 13);
  auto dw = to_device(w), dxv = to_device(x), ddy = to_device(dy);
  // Forward output and gradients after backward(accumulate = false) then backward(true).
  auto host_run = [&] {
    Model::Activations<xpipe::Host> a(rows);
    Model::GradScratch<xpipe::Host> sc(rows);
    std::vector<float> g(Model::param_count);
    const auto y = Model::forward(hctx, w.data(), {x.data(), rows, 96}, a);
    std::vector<float> out(y.data, y.data + rows * 10);
    for (bool acc : {false, true})
      Model::backward(hctx, w.data(), g.data(), acc, a, {dy.data(), rows, 10}, xpipe::Matrix{}, sc);
    out.insert(out.end(), g.begin(), g.end());
    return out;
  };
  auto cuda_run = [&](const xpipe::CudaContext& ctx, long* forward_fused, long* backward_fused) {
    Model::Activations<xpipe::Cuda> a(rows);
    Model::GradScratch<xpipe::Cuda> sc(rows);
    xpipe::DeviceBuffer<float> g(Model::param_count);
    const long f0 = ctx.lt ? ctx.lt->fused_calls() : 0;
    const auto y = Model::forward(ctx, dw.data(), {dxv.data(), rows, 96}, a);
    const long f1 = ctx.lt ? ctx.lt->fused_calls() : 0;
    Model::backward(ctx, dw.data(), g.data(), false, a, {ddy.data(), rows, 10}, xpipe::Matrix{},
                    sc);
    const long f2 = ctx.lt ? ctx.lt->fused_calls() : 0;
    Model::backward(ctx, dw.data(), g.data(), true, a, {ddy.data(), rows, 10}, xpipe::Matrix{}, sc);
    XPIPE_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
    if (forward_fused) *forward_fused = f1 - f0;
    if (backward_fused) *backward_fused = f2 - f1;
    std::vector<float> out(static_cast<std::size_t>(rows * 10 + Model::param_count));
    XPIPE_CUDA_CHECK(cudaMemcpy(out.data(), y.data, rows * 10 * 4, cudaMemcpyDeviceToHost));
    g.copy_to_host(out.data() + rows * 10, Model::param_count);
    return out;
  };
  const auto host = host_run();
  long forward_fused = 0, backward_fused = 0;
  const auto fused = cuda_run(cctx, &forward_fused, &backward_fused);
  const auto again = cuda_run(cctx, nullptr, nullptr);
  const auto kernels = cuda_run(plain, nullptr, nullptr);
  long default_forward = 0, default_backward = 0;
  const auto by_default = cuda_run(defaults, &default_forward, &default_backward);
  check("linear, cuBLASLt vs host", host, fused, 1e-5f, 1e-3f);
  check("linear, default plans vs host", host, by_default, 1e-5f, 1e-3f);
  check("linear, GEMM+kernels vs host", host, kernels, 1e-5f, 1e-3f);
  const bool same = std::memcmp(fused.data(), again.data(), fused.size() * 4) == 0;
  std::printf("%-28s %s\n", "linear, cuBLASLt twice", same ? "ok (bitwise)" : "FAIL (bits differ)");
  failures += !same;
  // The stage's three Linear layers each take the bias epilogue; on Hopper and later (the GPUs
  // this is checked on) their weight gradients the bias-gradient epilogue too, or the twice-
  // bitwise check above would only have compared the plain path with itself.
  int major = 0;
  XPIPE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, cctx.device));
  const bool forward_ok = forward_fused == 3;
  const bool backward_ok = backward_fused == 3 || major < 9;
  std::printf(
      "%-28s %s (%ld of 3 forward GEMMs with the bias epilogue; %ld of 3 weight-gradient "
      "GEMMs with the bias-gradient epilogue%s; the rest GEMM + kernels)\n",
      "linear, epilogues used", forward_ok && backward_ok ? "ok" : "FAIL", forward_fused,
      backward_fused, major < 9 ? ", not required below sm_90" : ", required on sm_90+");
  failures += !(forward_ok && backward_ok);
  const bool default_ok = default_forward == 0 && (default_backward == 3 || major < 9);
  std::printf(
      "%-28s %s (default plans: %ld of 3 forward GEMMs fused, expected 0; %ld of 3 "
      "weight-gradient GEMMs)\n",
      "linear, default epilogues", default_ok ? "ok" : "FAIL", default_forward, default_backward);
  failures += !default_ok;
}

// Dense layers (the ReLU fused into the GEMM: CUBLASLT_EPILOGUE_RELU_BIAS) against the host's
// Linear-then-ReLU stage on the same weights (the host's Dense gives those bits exactly): forward
// and a writing backward, the epilogue used by both Dense layers (and the bias epilogue by the
// last Linear), two runs bitwise, and a NaN input row that stays NaN through the epilogue's ReLU
// (ours keeps a NaN so that divergence reaches the loss check; the library documents no rule).
// `cctx` takes the forward epilogues; `defaults` (forward epilogues off: GEMM + one bias-ReLU
// kernel) must match the host too and keep the NaN as well.
void dense_epilogues(const xpipe::CudaContext& cctx, const xpipe::CudaContext& defaults) {
  using Split = xpipe::Stage<xpipe::Linear<96, 128>, xpipe::ReLU, xpipe::Linear<128, 64>,
                             xpipe::ReLU, xpipe::Linear<64, 10>>;
  using Fused = xpipe::Stage<xpipe::Dense<96, 128, xpipe::ReLU>, xpipe::Dense<128, 64, xpipe::ReLU>,
                             xpipe::Linear<64, 10>>;
  static_assert(Fused::param_count == Split::param_count);
  const xpipe::HostContext hctx{};
  const xpipe::index_t rows = 48;
  auto x = random_vector(rows * 96, 21);
  const auto dy = random_vector(rows * 10, 22, -0.1f, 0.1f);
  std::vector<float> w(Split::param_count);
  Split::init({w.data(), w.size()}, 23);
  auto dw = to_device(w), ddy = to_device(dy);
  Split::Activations<xpipe::Host> ha(rows);
  Split::GradScratch<xpipe::Host> hs(rows);
  std::vector<float> host(static_cast<std::size_t>(rows * 10 + Split::param_count));
  const auto hy = Split::forward(hctx, w.data(), {x.data(), rows, 96}, ha);
  std::copy(hy.data, hy.data + rows * 10, host.begin());
  Split::backward(hctx, w.data(), host.data() + rows * 10, false, ha, {dy.data(), rows, 10},
                  xpipe::Matrix{}, hs);
  auto dx = to_device(x);
  // Forward GEMMs run with the bias + ReLU and with the bias epilogue.
  // Calls with epilogue e on the plans of the context that ran them.
  auto fused = [](const xpipe::CudaContext& c, cublasLtEpilogue_t e) {
    return c.lt ? c.lt->fused_calls(e) : 0;
  };
  auto cuda_run = [&](long* relu_bias, long* bias, const xpipe::CudaContext& ctx) {
    Fused::Activations<xpipe::Cuda> a(rows);
    Fused::GradScratch<xpipe::Cuda> sc(rows);
    xpipe::DeviceBuffer<float> g(Fused::param_count);
    const long r0 = fused(ctx, CUBLASLT_EPILOGUE_RELU_BIAS),
               b0 = fused(ctx, CUBLASLT_EPILOGUE_BIAS);
    const auto y = Fused::forward(ctx, dw.data(), {dx.data(), rows, 96}, a);
    if (relu_bias) *relu_bias = fused(ctx, CUBLASLT_EPILOGUE_RELU_BIAS) - r0;
    if (bias) *bias = fused(ctx, CUBLASLT_EPILOGUE_BIAS) - b0;
    Fused::backward(ctx, dw.data(), g.data(), false, a, {ddy.data(), rows, 10}, xpipe::Matrix{},
                    sc);
    XPIPE_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
    std::vector<float> out(static_cast<std::size_t>(rows * 10 + Fused::param_count));
    XPIPE_CUDA_CHECK(cudaMemcpy(out.data(), y.data, rows * 10 * 4, cudaMemcpyDeviceToHost));
    g.copy_to_host(out.data() + rows * 10, Fused::param_count);
    return out;
  };
  long relu_bias = 0, bias = 0;
  const auto first = cuda_run(&relu_bias, &bias, cctx);
  const auto again = cuda_run(nullptr, nullptr, cctx);
  long default_relu_bias = 0, default_bias = 0;
  const auto by_default = cuda_run(&default_relu_bias, &default_bias, defaults);
  check("dense, cuBLASLt vs host", host, first, 1e-5f, 1e-3f);
  check("dense, default plans vs host", host, by_default, 1e-5f, 1e-3f);
  const bool default_unfused = default_relu_bias == 0 && default_bias == 0;
  std::printf("%-28s %s (default plans: %ld forward GEMMs with RELU_BIAS, %ld with BIAS)\n",
              "dense, default unfused", default_unfused ? "ok" : "FAIL", default_relu_bias,
              default_bias);
  failures += !default_unfused;
  const bool same = std::memcmp(first.data(), again.data(), first.size() * 4) == 0;
  std::printf("%-28s %s\n", "dense, cuBLASLt twice", same ? "ok (bitwise)" : "FAIL (bits differ)");
  failures += !same;
  const bool used = relu_bias == 2 && bias == 1;
  std::printf(
      "%-28s %s (forward GEMMs with RELU_BIAS: %ld of 2 Dense, with BIAS: %ld of 1 Linear)\n",
      "dense, epilogues used", used ? "ok" : "FAIL", relu_bias, bias);
  failures += !used;
  // Row 5 of the input becomes NaN: every output of that row must be NaN, every other finite,
  // through the epilogue's ReLU and through the bias-ReLU kernel alike.
  x[5 * 96 + 7] = std::nanf("");
  dx.copy_from_host(x.data(), dx.size());
  for (const auto& [label, ctx] : {std::pair{"dense, NaN kept by ReLU", &cctx},
                                   std::pair{"dense, NaN kept, default", &defaults}}) {
    const auto nan_run = cuda_run(nullptr, nullptr, *ctx);
    int kept = 0, finite = 0;
    for (xpipe::index_t r = 0; r < rows; ++r)
      for (int c = 0; c < 10; ++c) {
        const float v = nan_run[static_cast<std::size_t>(r * 10 + c)];
        if (r == 5)
          kept += std::isnan(v) ? 1 : 0;
        else
          finite += std::isfinite(v) ? 1 : 0;
      }
    const bool nan_ok = kept == 10 && finite == (rows - 1) * 10;
    // A FAIL on the first with the checks above ok means cuBLASLt's ReLU epilogue turns NaN into
    // 0 (its documentation says max(x, 0) and no more): Dense must then not take RELU_BIAS.
    std::printf("%-28s %s (%d of 10 outputs of the NaN row NaN, %d of %ld others finite)\n", label,
                nan_ok ? "ok" : "FAIL (the ReLU drops NaN)", kept, finite,
                static_cast<long>((rows - 1) * 10));
    failures += !nan_ok;
  }
}

}  // namespace

int main() {
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    std::printf("SKIP: no CUDA device (%s); the CUDA kernels were built but not run\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 77;
  }
  try {
    xpipe::CudaStreamContext stream;
    element_ops(stream.ctx());
    vectorized_ops(stream.ctx());
    stage_and_optimizer(stream.ctx());
    xpipe::CudaStreamContext fused;  // a stream whose plans take the forward epilogues too
    fused.ctx().lt->forward_epilogues = true;
    linear_epilogues(fused.ctx(), stream.ctx());
    dense_epilogues(fused.ctx(), stream.ctx());
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  std::printf(failures ? "FAILED: %d checks\n" : "all CUDA checks passed\n", failures);
  return failures ? 1 : 0;
}
