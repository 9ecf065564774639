// ConvPlans<Cuda> (im2col + cuBLAS) against the same im2col passes on a HostContext (checked
// against a direct convolution in tests/test_im2col.cpp), within tol + |ref| * eps, and against
// itself bitwise run to run. Then stages of the ResNet (models/resnet.hpp: convolutions,
// BatchNorm with its running statistics, residual blocks, the head) trained one forward and
// backward on the GPU against the host the same way, max pooling bitwise, and the GPT's
// (models/gpt.hpp: the embedding, LayerNorm, causal attention through cuBLAS and the softmax loop,
// GELU, the head). Exits 77 (CTest: skipped) when no CUDA device is present.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "xpipe/backend/cuda.cuh"
#include "xpipe/core/random.hpp"
#include "xpipe/kernels/cuda/attention.cuh"
#include "xpipe/kernels/cuda/conv.cuh"
#include "xpipe/kernels/im2col.hpp"
#include "xpipe/layers/activation.hpp"
#include "xpipe/layers/batchnorm.hpp"
#include "xpipe/layers/conv.hpp"
#include "xpipe/layers/pool.hpp"
#include "xpipe/layers/stage.hpp"
#include "xpipe/models/gpt.hpp"
#include "xpipe/models/resnet.hpp"

namespace {

using xpipe::ConvGeometry;
using xpipe::index_t;

int failures = 0;

void check(const std::string& what, const std::vector<float>& ref, const std::vector<float>& got,
           float tol, float eps) {
  int shown = 0, bad = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const float allowed = tol + std::fabs(ref[i]) * eps;
    if (!(std::fabs(ref[i] - got[i]) <= allowed)) {
      if (shown++ < 5)
        std::printf("  %s[%zu]: host %.9g, cuda %.9g\n", what.c_str(), i, ref[i], got[i]);
      ++bad;
    }
  }
  std::printf("%-48s %s (%d of %zu outside %g + |ref| * %g)\n", what.c_str(), bad ? "FAIL" : "ok",
              bad, ref.size(), tol, eps);
  failures += bad != 0;
}

void check_bitwise(const std::string& what, const std::vector<float>& a,
                   const std::vector<float>& b) {
  const bool same = a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
  std::printf("%-48s %s\n", what.c_str(), same ? "ok (bitwise)" : "FAIL (bits differ)");
  failures += !same;
}

std::vector<float> random_vector(index_t n, std::uint64_t seed) {
  xpipe::Rng rng{seed};
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = rng.uniform(-1.f, 1.f);
  return v;
}

xpipe::DeviceBuffer<float> to_device(const std::vector<float>& v) {
  xpipe::DeviceBuffer<float> d(static_cast<index_t>(v.size()));
  if (!v.empty()) d.copy_from_host(v.data(), d.size());  // (a stage without parameters)
  return d;
}

std::vector<float> to_host(const xpipe::DeviceBuffer<float>& d) {
  std::vector<float> v(static_cast<std::size_t>(d.size()));
  if (!v.empty()) d.copy_to_host(v.data(), d.size());
  return v;
}

// A square geometry from the input side.
ConvGeometry geometry(index_t rows, int c, int hw, int oc, int k, int stride, int pad,
                      bool bias = true) {
  return xpipe::make_conv_geometry(rows, c, hw, hw, oc, k, stride, pad, bias);
}

std::string text(const ConvGeometry& g) {
  return std::to_string(g.rows) + "x" + std::to_string(g.c) + "x" + std::to_string(g.h) + " k" +
         std::to_string(g.k) + " s" + std::to_string(g.stride) + " p" + std::to_string(g.pad) +
         (g.bias ? "" : " nobias");
}

// What one pass of every call gives: y, dx, dw and db, then dw and db after one more
// accumulating backward_weights.
struct Results {
  std::vector<float> y, dx, dw, db, dw2, db2;
};

struct Inputs {
  std::vector<float> x, w, b, dy;
  explicit Inputs(const ConvGeometry& g)
      : x(random_vector(g.rows * g.in_floats(), 11)),
        w(random_vector(g.weight_floats(), 12)),
        b(random_vector(g.oc, 13)),
        dy(random_vector(g.rows * g.out_floats(), 14)) {}
};

Results on_host(const ConvGeometry& g, const Inputs& in) {
  const xpipe::HostContext ctx{};
  const auto n = xpipe::conv_workspace_floats(g, g.rows);
  std::vector<float> cols(n.cols), sums(n.plane_sums);
  const xpipe::ConvWorkspace ws{cols.data(), sums.data(), g.rows};
  Results r{std::vector<float>(static_cast<std::size_t>(g.rows * g.out_floats())),
            std::vector<float>(in.x.size()),
            std::vector<float>(in.w.size()),
            std::vector<float>(in.b.size()),
            {},
            {}};
  xpipe::conv_forward_im2col(ctx, g, ws, in.x.data(), in.w.data(), in.b.data(), r.y.data());
  xpipe::conv_backward_data_im2col(ctx, g, ws, in.w.data(), in.dy.data(), r.dx.data());
  xpipe::conv_backward_weights_im2col(ctx, g, ws, in.x.data(), in.dy.data(), r.dw.data(),
                                      r.db.data(), false);
  r.dw2 = r.dw, r.db2 = r.db;
  xpipe::conv_backward_weights_im2col(ctx, g, ws, in.x.data(), in.dy.data(), r.dw2.data(),
                                      r.db2.data(), true);
  return r;
}

Results on_device(const xpipe::CudaContext& ctx, xpipe::ConvPlans<xpipe::Cuda>& plans,
                  const ConvGeometry& g, const Inputs& in) {
  auto x = to_device(in.x), w = to_device(in.w), b = to_device(in.b), dy = to_device(in.dy);
  xpipe::DeviceBuffer<float> y(g.rows * g.out_floats()), dx(x.size()), dw(w.size()), db(b.size());
  Results r;
  plans.forward(ctx, g, x.data(), w.data(), b.data(), y.data());
  plans.backward_data(ctx, g, w.data(), dy.data(), dx.data());
  plans.backward_weights(ctx, g, x.data(), dy.data(), dw.data(), db.data(), false);
  XPIPE_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  r.y = to_host(y), r.dx = to_host(dx), r.dw = to_host(dw), r.db = to_host(db);
  plans.backward_weights(ctx, g, x.data(), dy.data(), dw.data(), db.data(), true);
  XPIPE_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  r.dw2 = to_host(dw), r.db2 = to_host(db);
  return r;
}

// One geometry: plans for `max_rows` images (at least g.rows) with `workspace` floats, called with
// g.rows; against the host, and twice on the device bitwise.
void compare(const xpipe::CudaContext& ctx, const ConvGeometry& g, index_t max_rows,
             index_t workspace) {
  xpipe::ConvPlans<xpipe::Cuda> plans(g.with_rows(max_rows), workspace);
  const std::string name = text(g) + " chunk " + std::to_string(plans.chunk());
  const Inputs in(g);
  const Results ref = on_host(g, in);
  const Results a = on_device(ctx, plans, g, in), b = on_device(ctx, plans, g, in);
  // Summation orders differ (cuBLAS and oneDNN tile differently): a long inner dimension (dw sums
  // rows oh ow products) earns a larger absolute tolerance near zero.
  check(name + " y", ref.y, a.y, 1e-5f, 1e-4f);
  check(name + " dx", ref.dx, a.dx, 1e-5f, 1e-4f);
  check(name + " dw", ref.dw, a.dw, 1e-4f, 1e-4f);
  check(name + " dw accumulated", ref.dw2, a.dw2, 1e-4f, 1e-4f);
  if (g.bias) {
    check(name + " db", ref.db, a.db, 1e-4f, 1e-4f);
    check(name + " db accumulated", ref.db2, a.db2, 1e-4f, 1e-4f);
  }
  check_bitwise(name + " y run to run", a.y, b.y);
  check_bitwise(name + " dx run to run", a.dx, b.dx);
  check_bitwise(name + " dw run to run", a.dw2, b.dw2);
  check_bitwise(name + " db run to run", a.db2, b.db2);
}

// A call whose geometry the plans were not made for is a ShapeError naming both.
void shape_errors(const xpipe::CudaContext& ctx) {
  const ConvGeometry g = geometry(4, 2, 6, 3, 3, 1, 1);
  xpipe::ConvPlans<xpipe::Cuda> plans(g);
  for (const ConvGeometry& bad : {g.with_rows(5), [&] {
                                    ConvGeometry o = g;
                                    o.c = 3;
                                    return o;
                                  }()}) {
    bool thrown = false;
    try {
      plans.forward(ctx, bad, nullptr, nullptr, nullptr, nullptr);
    } catch (const xpipe::ShapeError& e) {
      thrown = std::strstr(e.what(), "4x2x6x6") != nullptr;
      std::printf("  %s\n", e.what());
    }
    std::printf("%-48s %s\n", "ShapeError for a geometry not planned", thrown ? "ok" : "FAIL");
    failures += !thrown;
  }
}

// One training forward (BatchNorm on the micro-batch's statistics, its running ones updated)
// and backward of stage S over `rows` random rows: y, dx, the parameter gradient and the running
// statistics on the GPU against the host within tolerance, and two GPU runs bitwise. BatchNorm's
// channel sums run in the same order on both backends; the convolutions' GEMMs do not.
struct StageResults {
  std::vector<float> y, dx, grads, state;
};

template <class S>
StageResults host_stage_pass(index_t rows, const std::vector<float>& params,
                             const std::vector<float>& state, const std::vector<float>& x,
                             const std::vector<float>& dy) {
  StageResults r{std::vector<float>(static_cast<std::size_t>(rows * S::out_width)),
                 std::vector<float>(x.size()), std::vector<float>(params.size()), state};
  const xpipe::HostContext host{};
  typename S::template Activations<xpipe::Host> acts(rows);
  typename S::template GradScratch<xpipe::Host> scratch(rows);
  const xpipe::ConstMatrix y = S::forward(host, params.data(), {x.data(), rows, S::in_width}, acts,
                                          xpipe::Running{r.state.data(), true});
  for (index_t i = 0; i < rows; ++i)
    std::memcpy(r.y.data() + i * S::out_width, y.row(i), S::out_width * sizeof(float));
  S::backward(host, params.data(), r.grads.data(), false, acts, {dy.data(), rows, S::out_width},
              {r.dx.data(), rows, S::in_width}, scratch);
  return r;
}

template <class S>
StageResults device_stage_pass(const xpipe::CudaContext& ctx, index_t rows,
                               const std::vector<float>& params, const std::vector<float>& state,
                               const std::vector<float>& x, const std::vector<float>& dy) {
  auto p = to_device(params), st = to_device(state), xs = to_device(x), d = to_device(dy);
  xpipe::DeviceBuffer<float> grads(p.size()), dx(xs.size());
  typename S::template Activations<xpipe::Cuda> acts(rows);
  typename S::template GradScratch<xpipe::Cuda> scratch(rows);
  const xpipe::ConstMatrix y = S::forward(ctx, p.data(), {xs.data(), rows, S::in_width}, acts,
                                          xpipe::Running{st.data(), true});
  S::backward(ctx, p.data(), grads.data(), false, acts, {d.data(), rows, S::out_width},
              {dx.data(), rows, S::in_width}, scratch);
  XPIPE_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  StageResults r{std::vector<float>(static_cast<std::size_t>(rows * S::out_width)), to_host(dx),
                 to_host(grads), to_host(st)};
  XPIPE_CUDA_CHECK(
      cudaMemcpy(r.y.data(), y.data, r.y.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return r;
}

// `inputs`: the stage's input rows (random in [-1, 1) when empty: token ids for an embedding).
template <class S>
void stage_matches_host(const xpipe::CudaContext& ctx, index_t rows, const std::string& name,
                        std::vector<float> inputs = {}) {
  std::vector<float> params(static_cast<std::size_t>(S::param_count)),
      state(static_cast<std::size_t>(S::state_count));
  S::init({params.data(), params.size()}, 3);
  S::init_state({state.data(), state.size()});
  const std::vector<float> x =
      inputs.empty() ? random_vector(rows * S::in_width, 21) : std::move(inputs);
  const std::vector<float> dy = random_vector(rows * S::out_width, 22);
  const StageResults ref = host_stage_pass<S>(rows, params, state, x, dy);
  const StageResults a = device_stage_pass<S>(ctx, rows, params, state, x, dy),
                     b = device_stage_pass<S>(ctx, rows, params, state, x, dy);
  // BatchNorm divides by the batch's standard deviation: the GEMMs' last-bit differences grow
  // through it, hence tolerances above the convolution's own.
  check(name + " y", ref.y, a.y, 1e-4f, 1e-3f);
  check(name + " dx", ref.dx, a.dx, 1e-4f, 1e-3f);
  check(name + " gradients", ref.grads, a.grads, 1e-3f, 1e-3f);
  check(name + " running statistics", ref.state, a.state, 1e-5f, 1e-4f);
  check_bitwise(name + " y run to run", a.y, b.y);
  check_bitwise(name + " dx run to run", a.dx, b.dx);
  check_bitwise(name + " gradients run to run", a.grads, b.grads);
  check_bitwise(name + " running statistics run to run", a.state, b.state);
}

// Max pooling's forward and its backward's gather compare and copy, so the GPU must give the
// host's bits, ties and NaN included (one rule for both: math::max_pool_takes). The inputs take
// six values, so most windows tie (the first in row-major order wins), and every 97th is NaN
// (it wins its windows, as in PyTorch).
template <class S>
void pool_matches_host(const xpipe::CudaContext& ctx, index_t rows, const std::string& name) {
  std::vector<float> x = random_vector(rows * S::in_width, 23);
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = i % 97 == 0 ? std::nanf("") : std::floor(x[i] * 2.5f) / 2.f;  // -1.5, -1, ..., 1
  const std::vector<float> dy = random_vector(rows * S::out_width, 24);
  const StageResults ref = host_stage_pass<S>(rows, {}, {}, x, dy);
  const StageResults gpu = device_stage_pass<S>(ctx, rows, {}, {}, x, dy);
  check_bitwise(name + " y", ref.y, gpu.y);
  check_bitwise(name + " dx", ref.dx, gpu.dx);
}

// Rows (token id, position) of whole sequences of `context` tokens, ids drawn from `vocab`.
std::vector<float> token_rows(index_t rows, int vocab, int context) {
  xpipe::Rng rng{23};
  std::vector<float> x(static_cast<std::size_t>(2 * rows));
  for (index_t r = 0; r < rows; ++r) {
    x[static_cast<std::size_t>(2 * r)] = static_cast<float>(rng.below(vocab));
    x[static_cast<std::size_t>(2 * r + 1)] = static_cast<float>(r % context);
  }
  return x;
}

// Attention on 2 sequences of 128 tokens, 4 heads of 16 (xpipe-train's GPT): the device's
// GEMM-and-softmax path (cuBLAS per sequence and head, the softmax loop) and the fused kernels
// against the host's layer, y and dx, and each run to run.
void attention_matches_host(const xpipe::CudaContext& ctx) {
  using L = xpipe::CausalSelfAttention<64, 4, 128>;
  static_assert(L::fused_kernels_on<xpipe::Cuda> && !L::fused_kernels_on<xpipe::Host>,
                "the layer does not find the fused kernels on CUDA: the GPT stages below would "
                "test the GEMM path");
  const index_t rows = 256;
  const xpipe::AttentionShape a{rows, 4, 16, 128};
  const std::vector<float> x = random_vector(rows * 192, 31), dy = random_vector(rows * 64, 32);
  std::vector<float> ref_y(rows * 64), ref_dx(rows * 192);
  typename L::template Saved<xpipe::Host> saved(rows);
  L::forward(xpipe::HostContext{}, nullptr, {x.data(), rows, 192}, {ref_y.data(), rows, 64}, saved);
  L::backward(xpipe::HostContext{}, nullptr, nullptr, false, {x.data(), rows, 192},
              {ref_y.data(), rows, 64}, {dy.data(), rows, 64}, {ref_dx.data(), rows, 192}, saved);
  auto run = [&](bool fused) {
    auto xs = to_device(x), d = to_device(dy);
    xpipe::DeviceBuffer<float> y(rows * 64), dx(rows * 192), probs(rows * 4 * 128),
        grads(rows * 4 * 128);
    const xpipe::ConstMatrix xm{xs.data(), rows, 192}, ym{y.data(), rows, 64},
        dym{d.data(), rows, 64};
    if (fused) {
      xpipe::fused_attention_forward(ctx, std::integral_constant<int, 16>{}, a, xm,
                                     {y.data(), rows, 64}, probs.data());
      xpipe::fused_attention_backward(ctx, std::integral_constant<int, 16>{}, a, xm, ym, dym,
                                      {dx.data(), rows, 192}, probs.data());
    } else {
      xpipe::causal_attention_forward(ctx, a, xm, {y.data(), rows, 64}, probs.data());
      xpipe::causal_attention_backward(ctx, a, xm, dym, {dx.data(), rows, 192}, probs.data(),
                                       grads.data());
    }
    XPIPE_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
    return std::pair{to_host(y), to_host(dx)};
  };
  for (bool fused : {false, true}) {
    const std::string name = fused ? "attention, fused kernels" : "attention, GEMM + softmax loop";
    const auto first = run(fused), second = run(fused);
    check(name + " y", ref_y, first.first, 1e-5f, 1e-4f);
    check(name + " dx", ref_dx, first.second, 1e-5f, 1e-3f);
    check_bitwise(name + " y run to run", first.first, second.first);
    check_bitwise(name + " dx run to run", first.second, second.second);
  }
}

}  // namespace

int main() {
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    std::printf("SKIP: no CUDA device (%s); the CUDA convolution was built but not run\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 77;
  }
  try {
    xpipe::CudaStreamContext stream;
    const auto& ctx = stream.ctx();
    const index_t whole = xpipe::ConvPlans<xpipe::Cuda>::default_workspace_floats;
    compare(ctx, geometry(8, 16, 16, 32, 3, 1, 1), 8, whole);      // k 3 pad 1, one chunk
    compare(ctx, geometry(8, 16, 16, 32, 3, 1, 1), 8, 40'000);     // chunks of 1 image
    compare(ctx, geometry(7, 3, 15, 8, 5, 2, 2), 7, 12'000);       // stride 2, chunks 2+2+2+1
    compare(ctx, geometry(6, 1, 28, 6, 5, 1, 0), 6, whole);        // c 1, k 5 pad 0
    compare(ctx, geometry(5, 8, 9, 12, 1, 1, 0), 8, whole);        // k 1; fewer rows than planned
    compare(ctx, geometry(4, 4, 8, 4, 3, 2, 0, false), 4, whole);  // no bias, last row unread
    compare(ctx, geometry(3, 64, 4, 64, 3, 1, 1), 3, whole);       // many channels, small image
    shape_errors(ctx);
    namespace resnet = xpipe::models::resnet;
    // 20 rows of 28 x 28: a channel's terms in 140 chunks, then 2 sums, then 1 (three levels);
    // 5 rows of 14 x 14 in 10, then 1.
    stage_matches_host<resnet::E0>(ctx, 20, "resnet stem + 16-channel block, 20 rows");
    stage_matches_host<resnet::E2>(ctx, 5, "resnet strided block 16->32, 5 rows");
    stage_matches_host<resnet::Head>(ctx, 3, "resnet pooling head, 3 rows");
    // BatchNorm with GELU fused: its backward takes GELU's gradient at the input it makes again.
    using GeluStage =
        xpipe::Stage<xpipe::Conv2d<xpipe::Shape<4, 10, 10>, 8, 3, xpipe::ConvOptions{.padding = 1}>,
                     xpipe::BatchNormAct<xpipe::Shape<8, 10, 10>, xpipe::GELU>>;
    stage_matches_host<GeluStage>(ctx, 6, "conv + BatchNormAct<GELU>, 6 rows");
    // The VGG's pooling (2 x 2, stride 2: disjoint windows, the backward a scatter), and 3 x 3
    // windows of stride 2 and padding 1 (overlapping: the backward sums in a fixed order).
    using xpipe::MaxPool2d, xpipe::Shape, xpipe::Stage;
    pool_matches_host<Stage<MaxPool2d<Shape<16, 28, 28>, 2>>>(ctx, 6, "max pool 2x2 (VGG's)");
    pool_matches_host<Stage<MaxPool2d<Shape<5, 13, 11>, 3, 2, 1>>>(ctx, 4,
                                                                   "max pool 3x3 stride 2 pad 1");
    // xpipe-train's GPT: the first stage (embedding, 2 blocks) on 2 sequences of 128 tokens, and
    // the last (2 blocks, the final norm, the head) on 1.
    attention_matches_host(ctx);
    using Gpt = xpipe::models::gpt::Gpt<64, 4, 128>;
    stage_matches_host<Gpt::A>(ctx, 256, "gpt embedding + 2 blocks, 256 tokens",
                               token_rows(256, xpipe::models::gpt::vocab, 128));
    stage_matches_host<Gpt::C>(ctx, 128, "gpt 2 blocks + norm + head, 128 tokens");
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  std::printf(failures ? "FAILED: %d checks\n" : "all CUDA convolution and GPT checks passed\n",
              failures);
  return failures ? 1 : 0;
}
