// A whole K = 4 Pipeline<..., Cuda> trained on the GPU against the same pipeline on the host
// (tol + |ref| * eps, llm.c's rule), and the GPU runs against each other bit for bit: two runs of
// one seed, the reference executor against the CUDA executor, all stages on one device (four
// streams) and, with two or more GPUs, stage k on device k % count. Also: the device loss sum
// reports a NaN exactly as the host path does, and bad placements and labels fail before any
// action, a checkpoint of a GPU pipeline resumes bitwise, and global gradient-norm clipping
// reduces the stages' norms on the devices as the host does. Exits 77 (CTest: skipped) when no
// CUDA device is present.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "xpipe/xpipe_cuda.cuh"

namespace {

using namespace xpipe;

// The MLP of the brief: 64-96-96-64-10, one Linear per stage.
using S0 = Stage<Linear<64, 96>, ReLU>;
using S1 = Stage<Linear<96, 96>, GELU>;
using S2 = Stage<Linear<96, 64>, ReLU>;
using S3 = Stage<Linear<64, 10>>;

constexpr index_t batch = 32;
constexpr int K = 4, M = 4, mini_batches = 20;
constexpr index_t rows = batch * mini_batches;

// Tolerance of the GPU weights against the host's after 20 steps. The kernel test
// (test_cuda_kernels.cu) holds one stage to 1e-5 + |ref| * 1e-4 after two Adam steps; the only
// differences are the GEMMs' summation orders (cuBLAS vs oneDNN) and FMA contraction, each step
// adds its own and Adam divides early ones by a small sqrt(v), so over 20 steps of four stages
// we allow ten times that: 1e-4 + |ref| * 1e-3 (at lr 1e-3 a weight moves by up to 2e-2 in 20
// steps: a wrong ordering or a lost micro-batch moves it by far more than 1e-4).
constexpr float weight_tol = 1e-4f, weight_eps = 1e-3f;
// The epoch's mean loss: summed in another order on the device (CUB's block tree vs the host's
// row order, both in double) on top of the weights' differences.
constexpr double loss_tol = 1e-4, loss_eps = 1e-3;

int failures = 0;

void report(const std::string& what, bool ok, const std::string& detail) {
  std::printf("%-44s %s (%s)\n", what.c_str(), ok ? "ok" : "FAIL", detail.c_str());
  failures += !ok;
}

// llm.c's comparison: prints the first few mismatches, counts them.
void check_close(const std::string& what, const std::vector<float>& ref,
                 const std::vector<float>& got, float tol, float eps) {
  int bad = 0, shown = 0;
  float worst = 0;
  if (ref.size() != got.size()) {
    report(what, false,
           "sizes " + std::to_string(ref.size()) + " and " + std::to_string(got.size()));
    return;
  }
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const float diff = std::fabs(ref[i] - got[i]);
    worst = std::fmax(worst, diff);
    if (!(diff <= tol + std::fabs(ref[i]) * eps)) {
      if (shown++ < 5)
        std::printf("  %s[%zu]: host %.9g, cuda %.9g\n", what.c_str(), i, ref[i], got[i]);
      ++bad;
    }
  }
  char detail[160];
  std::snprintf(detail, sizeof detail, "%d of %zu outside %g + |ref| * %g; max |diff| %.3g", bad,
                ref.size(), tol, eps, worst);
  report(what, bad == 0, detail);
}

void check_same(const std::string& what, const std::vector<float>& a, const std::vector<float>& b) {
  const bool same =
      a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  std::size_t differ = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    differ += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  report(what, same, std::to_string(differ) + " of " + std::to_string(a.size()) + " differ");
}

// Learnable synthetic data: uniform inputs, each label the argmax of a fixed random projection.
Dataset make_data(std::uint64_t seed) {
  Dataset d;
  d.count = rows;
  d.width = 64;
  d.classes = 10;
  d.features = HostBuffer<float>(rows * 64);
  d.labels.resize(static_cast<std::size_t>(rows));
  Rng rng{seed};
  std::vector<float> proj(64 * 10);
  for (float& p : proj) p = rng.uniform(-1.f, 1.f);
  for (index_t r = 0; r < rows; ++r) {
    for (index_t c = 0; c < 64; ++c) d.features[r * 64 + c] = rng.uniform(-1.f, 1.f);
    int best = 0;
    float best_score = -1e30f;
    for (int j = 0; j < 10; ++j) {
      float score = 0;
      for (index_t c = 0; c < 64; ++c) score += d.features[r * 64 + c] * proj[c * 10 + j];
      if (score > best_score) best_score = score, best = j;
    }
    d.labels[static_cast<std::size_t>(r)] = best;
  }
  return d;
}

EpochData epoch_of(const Dataset& d) {
  return {d.matrix(), d.labels.data()};
}

struct Outcome {
  std::vector<float> weights;
  double loss = 0;
  double accuracy = 0;
};

template <class... Policies, class O, class E>
Outcome train(const Schedule& s, const Dataset& d, O opt, E executor, std::vector<int> devices) {
  Pipeline<S0, S1, S2, S3, Policies...> p(
      opt, {.batch = batch, .micro_batches = M, .seed = 11, .devices = std::move(devices)});
  const EpochResult r = p.train(s, epoch_of(d), executor);
  return {p.weights(), r.loss, p.evaluate(d)};
}

template <class P, class O>
void compare_one(const Schedule& s, const Dataset& d, O opt, const std::vector<int>& spread) {
  const std::string name = s.name + " x " + P::name;
  const Outcome host = train<P, O, Host>(s, d, opt, ReferenceExecutor{}, {});
  const Outcome gpu = train<P, O, Cuda>(s, d, opt, CudaExecutor{}, {0});
  check_close(name + ": GPU vs host weights", host.weights, gpu.weights, weight_tol, weight_eps);
  const double dl = std::fabs(host.loss - gpu.loss);
  char detail[160];
  std::snprintf(detail, sizeof detail, "host %.9g, cuda %.9g, allowed %g + |ref| * %g", host.loss,
                gpu.loss, loss_tol, loss_eps);
  report(name + ": GPU vs host loss", dl <= loss_tol + std::fabs(host.loss) * loss_eps, detail);
  // Accuracy: predictions may flip on rows whose two best logits are within rounding.
  std::snprintf(detail, sizeof detail, "host %.4f, cuda %.4f, allowed 2 rows", host.accuracy,
                gpu.accuracy);
  report(name + ": GPU vs host accuracy",
         std::fabs(host.accuracy - gpu.accuracy) * static_cast<double>(rows) <= 2.5, detail);

  const Outcome again = train<P, O, Cuda>(s, d, opt, CudaExecutor{}, {0});
  check_same(name + ": two GPU runs bitwise", gpu.weights, again.weights);
  const Outcome ref = train<P, O, Cuda>(s, d, opt, ReferenceExecutor{}, {0});
  check_same(name + ": reference vs CUDA executor", ref.weights, gpu.weights);
  if (!spread.empty()) {
    const Outcome across = train<P, O, Cuda>(s, d, opt, CudaExecutor{}, spread);
    check_same(name + ": across devices vs one", gpu.weights, across.weights);
  }
}

// Every predictor chosen at run time (AnyPredictor: what xpipe-train --device cuda runs): the
// CUDA executor against the reference executor on the GPU bitwise, as compare_one checks the
// static types; and for Latest, Stash and XPipe, AnyPredictor against the static type on the
// GPU bitwise (the same kernels in the same order).
template <class E>
Outcome train_any(const Schedule& s, const Dataset& d, const Adam& opt, E executor,
                  const AnyPredictor& pred) {
  Pipeline<S0, S1, S2, S3, AnyPredictor, Adam, Cuda> p(
      opt, {.batch = batch, .micro_batches = M, .seed = 11, .devices = {0}}, pred);
  const EpochResult r = p.train(s, epoch_of(d), executor);
  return {p.weights(), r.loss, p.evaluate(d)};
}

template <class... Static>
void any_predictor(const Schedule& s, const Dataset& d, const Adam& adam) {
  for (const char* name : predictor_names) {
    const AnyPredictor pred = make_predictor(name);
    const std::string what = s.name + " x AnyPredictor(" + name + ")";
    const Outcome gpu = train_any(s, d, adam, CudaExecutor{}, pred);
    check_same(what + ": reference vs CUDA executor",
               train_any(s, d, adam, ReferenceExecutor{}, pred).weights, gpu.weights);
  }
  (check_same(s.name + ": AnyPredictor(" + Static::name + ") vs the static type on the GPU",
              train<Static, Adam, Cuda>(s, d, adam, CudaExecutor{}, {0}).weights,
              train_any(s, d, adam, CudaExecutor{}, make_predictor(Static::name)).weights),
   ...);
}

// Stages 0 and 2 as Dense layers (the ReLU in the forward GEMM's epilogue, the stage's third
// gradient buffer on the device): from the same seed they start from the host's Linear-then-ReLU
// weights, train async 1F1B x XPipe on the GPU to them within the tolerance above, twice bitwise.
void dense_stages(const Dataset& d, const Adam& adam) {
  using D0 = Stage<Dense<64, 96, ReLU>>;
  using D2 = Stage<Dense<96, 64, ReLU>>;
  const Schedule s = async_1f1b(K, M, mini_batches);
  const PipelineOptions options{.batch = batch, .micro_batches = M, .seed = 11, .devices = {0}};
  auto gpu_run = [&] {
    Pipeline<D0, S1, D2, S3, XPipe, Adam, Cuda> p(adam, options);
    CudaExecutor e;
    p.train(s, epoch_of(d), e);
    return p.weights();
  };
  const Outcome host = train<XPipe, Adam, Host>(s, d, adam, ReferenceExecutor{}, {});
  const std::vector<float> gpu = gpu_run();
  check_close("Dense stages, async-1f1b x xpipe: GPU vs host Linear+ReLU", host.weights, gpu,
              weight_tol, weight_eps);
  check_same("Dense stages: two GPU runs bitwise", gpu, gpu_run());
}

// The loss sum on the device reports a NaN input as the host path does, word for word.
void non_finite_loss(const Dataset& clean) {
  Dataset d = head(clean, rows);
  const index_t bad_row = 3 * batch + 5;  // mini-batch 3
  d.features[bad_row * 64 + 7] = std::nanf("");
  const Schedule s = async_1f1b(K, M, mini_batches);
  auto message = [&]<class B>() -> std::string {
    Pipeline<S0, S1, S2, S3, XPipe, Adam, B> p(
        Adam{.lr = 1e-3f}, {.batch = batch, .micro_batches = M, .devices = {0}});
    try {
      if constexpr (std::is_same_v<B, Cuda>) {
        CudaExecutor e;
        p.train(s, epoch_of(d), e);
      } else {
        ReferenceExecutor e;
        p.train(s, epoch_of(d), e);
      }
    } catch (const StageError& e) {
      return e.what();
    }
    return "no error";
  };
  const std::string host = message.template operator()<Host>();
  const std::string gpu = message.template operator()<Cuda>();
  std::printf("  host: %s\n  cuda: %s\n", host.c_str(), gpu.c_str());
  report("NaN input: same StageError as the host", host == gpu && host != "no error",
         "mini-batch 3, row " + std::to_string(bad_row));
}

// A checkpoint of a device pipeline (state copied through the host) resumes bit for bit: ten
// mini-batches, save, load into a fresh pipeline, ten more, against twenty straight.
void resume_from_checkpoint(const Dataset& d) {
  const Schedule half = async_1f1b(K, M, mini_batches / 2);
  const index_t half_rows = rows / 2;
  const EpochData first{d.matrix().slice_rows(0, half_rows), d.labels.data()};
  const EpochData second{d.matrix().slice_rows(half_rows, half_rows), d.labels.data() + half_rows};
  using P = Pipeline<S0, S1, S2, S3, XPipe, Adam, Cuda>;
  const PipelineOptions o{.batch = batch, .micro_batches = M, .seed = 11, .devices = {0}};
  CudaExecutor e;
  P straight(Adam{.lr = 1e-3f}, o);
  straight.train(half, first, e);
  straight.train(half, second, e);
  P before(Adam{.lr = 1e-3f}, o);
  before.train(half, first, e);
  const auto root = std::filesystem::temp_directory_path() /
                    ("xpipe-cuda-ckpt-" + std::to_string(static_cast<long>(::getpid())));
  std::filesystem::remove_all(root);
  const auto folder = save_checkpoint(before, root, "ckpt-000001");
  P resumed(Adam{.lr = 1e-3f}, o);
  load_checkpoint(resumed, read_checkpoint(folder));
  resumed.train(half, second, e);
  std::filesystem::remove_all(root);
  check_same("checkpoint of a GPU pipeline resumes bitwise", straight.weights(), resumed.weights());
}

// The queues' events tested by delay: with XPIPE_CUDA_STALL_US every stream stalls 200 us after
// each wait on a queue event (ten times a stage's action here), so a producer that wrote a slot
// without waiting for its consumer to drain it, or a consumer that read one before it was filled,
// would meet another micro-batch's data and change the weights. The stalled run must equal the
// plain one bit for bit; a bad value is a ConfigError naming the variable.
void stalled_queues(const Dataset& d) {
  const Schedule s = async_1f1b(K, M, mini_batches);
  const Adam adam{.lr = 1e-3f};
  const Outcome plain = train<Latest, Adam, Cuda>(s, d, adam, CudaExecutor{}, {0});
  setenv("XPIPE_CUDA_STALL_US", "200", 1);
  const Outcome stalled = train<Latest, Adam, Cuda>(s, d, adam, CudaExecutor{}, {0});
  check_same("queues stalled 200 us after each wait vs not", plain.weights, stalled.weights);
  setenv("XPIPE_CUDA_STALL_US", "soon", 1);
  std::string what = "no error";
  try {
    Pipeline<S0, S1, S2, S3, Latest, Adam, Cuda> p(Adam{}, {.batch = batch, .devices = {0}});
  } catch (const ConfigError& e) {
    what = e.what();
  }
  unsetenv("XPIPE_CUDA_STALL_US");
  report("XPIPE_CUDA_STALL_US=soon: ConfigError",
         what.find("XPIPE_CUDA_STALL_US='soon'") != std::string::npos, what);
}

// Global clipping's per-stage norm on the device (squared_norm_async) against the host's
// squared_norm, within 2 n 2^-53 relative (both sum n positive terms in double, in different
// orders: each is within n 2^-53 of the exact sum; a term lost or counted twice is off by
// about 1/n), and the same bits twice; sizes around a block's share (2,048) and past the 512
// blocks' cap.
void device_squared_norm() {
  CudaStreamContext owner(Placement{.stage = 0, .device = 0});
  const CudaContext& ctx = owner.ctx();
  Rng rng{21};
  for (const index_t n :
       {index_t{0}, index_t{1}, index_t{2047}, index_t{2049}, index_t{3'000'007}}) {
    std::vector<float> x(static_cast<std::size_t>(n));
    for (float& v : x) v = rng.uniform(-2.f, 2.f);
    DeviceBuffer<float> dx(n > 0 ? n : 1);
    if (n > 0) dx.copy_from_host(x.data(), n);
    DeviceBuffer<double> out(2);
    squared_norm_async(ctx, dx.data(), n, out.data());
    squared_norm_async(ctx, dx.data(), n, out.data() + 1);
    synchronize(ctx);
    double got[2] = {0, 0};
    out.copy_to_host(got, 2);
    const double want = squared_norm(x.data(), n);
    char detail[160];
    std::snprintf(detail, sizeof detail, "host %.17g, cuda %.17g, again %.17g", want, got[0],
                  got[1]);
    report("squared_norm_async, n = " + std::to_string(n),
           std::fabs(got[0] - want) <= 2.0 * static_cast<double>(n) * 0x1p-53 * want &&
               std::memcmp(&got[0], &got[1], 8) == 0,
           detail);
  }
}

// Global clipping on the GPU (each stage's norm reduced on its stream, every Step waiting on the
// four norms' events): async 1F1B x XPipe at a bound below every step's norm, against the host
// within the weights' tolerance above and the norms within 1e-4 relative; twice, by the
// reference executor and across devices, bitwise.
void clipped(const Dataset& d, const Adam& adam, const std::vector<int>& spread) {
  const Schedule s = async_1f1b(K, M, mini_batches);
  auto run = [&]<class B>(auto executor, std::vector<int> devices) {
    Pipeline<S0, S1, S2, S3, XPipe, Adam, B> p(adam, {.batch = batch,
                                                      .micro_batches = M,
                                                      .seed = 11,
                                                      .clip_norm = 0.05f,
                                                      .devices = std::move(devices)});
    p.train(s, epoch_of(d), executor);
    return std::pair{p.weights(), p.gradient_norms()};
  };
  const auto host = run.template operator()<Host>(ReferenceExecutor{}, {});
  const auto gpu = run.template operator()<Cuda>(CudaExecutor{}, {0});
  check_close("clip_norm 0.05, async-1f1b x xpipe: GPU vs host weights", host.first, gpu.first,
              weight_tol, weight_eps);
  bool close = host.second.size() == gpu.second.size() && !host.second.empty();
  double worst = 0, least = 1e300;
  for (std::size_t t = 0; close && t < host.second.size(); ++t) {
    worst = std::fmax(worst, std::fabs(gpu.second[t] - host.second[t]) / host.second[t]);
    least = std::fmin(least, host.second[t]);
  }
  char detail[160];
  std::snprintf(detail, sizeof detail, "%zu norms, max relative diff %.3g, the least %.4g",
                gpu.second.size(), worst, least);
  // Every step's norm above the bound: a Step that read a norm too early (NaN) would not clip.
  report("clip_norm 0.05: GPU vs host gradient norms", close && worst <= 1e-4 && least > 0.05,
         detail);
  check_same("clip_norm 0.05: two GPU runs bitwise", gpu.first,
             run.template operator()<Cuda>(CudaExecutor{}, {0}).first);
  check_same("clip_norm 0.05: reference vs CUDA executor", gpu.first,
             run.template operator()<Cuda>(ReferenceExecutor{}, {0}).first);
  if (!spread.empty())
    check_same("clip_norm 0.05: across devices vs one", gpu.first,
               run.template operator()<Cuda>(CudaExecutor{}, spread).first);
}

void bad_setup(const Dataset& d, int devices) {
  std::string what = "no error";
  try {
    Pipeline<S0, S1, S2, S3, Latest, Adam, Cuda> p(
        Adam{}, {.batch = batch, .micro_batches = M, .devices = {devices}});
  } catch (const ConfigError& e) {
    what = e.what();
  }
  report("a device that does not exist: ConfigError",
         what.find("device " + std::to_string(devices)) != std::string::npos, what);

  Dataset bad = head(d, rows);
  bad.labels[70] = 10;
  what = "no error";
  Pipeline<S0, S1, S2, S3, Latest, Adam, Cuda> p(
      Adam{}, {.batch = batch, .micro_batches = M, .devices = {0}});
  const std::vector<float> before = p.weights();
  try {
    CudaExecutor e;
    p.train(gpipe(K, M, mini_batches), epoch_of(bad), e);
  } catch (const DataError& e) {
    what = e.what();
  }
  report("a bad label: DataError before any action",
         what.find("label 10 at row 70") != std::string::npos && p.weights() == before, what);
}

}  // namespace

int main() {
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    std::printf("SKIP: no CUDA device (%s); the CUDA pipeline was built but not run\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 77;
  }
  std::printf("%d CUDA device(s); K = %d, batch %ld, M = %d, %d mini-batches\n", devices, K,
              static_cast<long>(batch), M, mini_batches);
  // Across devices only where every device is the same model: cuBLAS's bits are per model.
  std::vector<int> spread;
  if (devices >= 2) {
    bool same = true;
    cudaDeviceProp p0{}, pi{};
    cudaGetDeviceProperties(&p0, 0);
    for (int i = 1; i < devices; ++i) {
      cudaGetDeviceProperties(&pi, i);
      same = same && std::strcmp(p0.name, pi.name) == 0;
    }
    // Adjacent stages need peer access, and under global clipping stage 0 and every stage (the
    // pipeline refuses without it, ConfigError).
    bool peers = true;
    for (int k = 0; k + 1 < K; ++k)
      for (const auto& [a, b] :
           {std::pair{k % devices, (k + 1) % devices}, std::pair{0, (k + 1) % devices}}) {
        int ab = 0, ba = 0;
        if (a != b) {
          cudaDeviceCanAccessPeer(&ab, a, b);
          cudaDeviceCanAccessPeer(&ba, b, a);
          peers = peers && ab && ba;
        }
      }
    if (same && peers)
      for (int k = 0; k < K; ++k) spread.push_back(k % devices);
    else
      std::printf("devices differ in model or lack peer access: no check across devices\n");
  } else {
    std::printf("one device: the across-devices check needs two\n");
  }
  try {
    const Dataset d = make_data(5);
    const Schedule gp = gpipe(K, M, mini_batches);
    const Schedule async = async_1f1b(K, M, mini_batches);
    // eps 1e-6, not Adam's 1e-8, for the comparisons with the host: near g = 0 an Adam step
    // moves by up to lr * g / eps, and the GPU's gradients differ from the host's in the last
    // bits (summation order): at eps 1e-8 a 1e-9 difference moves a weight by 1e-4, the whole
    // tolerance; at 1e-6 by 1e-6. The GPU-vs-GPU checks below are bitwise either way.
    const Adam adam{.lr = 1e-3f, .eps = 1e-6f};
    compare_one<Latest>(gp, d, adam, spread);
    compare_one<Latest>(async, d, adam, spread);
    compare_one<Stash>(async, d, adam, spread);
    compare_one<XPipe>(async, d, adam, spread);
    compare_one<SpecTrain>(async, d, SGD{.lr = 0.05f, .momentum = 0.9f}, spread);
    any_predictor<Latest, Stash, XPipe>(async, d, adam);  // M = K: 2BW and 2BW + EF can run
    non_finite_loss(d);
    resume_from_checkpoint(d);
    stalled_queues(d);
    dense_stages(d, adam);
    device_squared_norm();
    clipped(d, adam, spread);
    bad_setup(d, devices);
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  std::printf(failures ? "FAILED: %d checks\n" : "all CUDA pipeline checks passed\n", failures);
  return failures ? 1 : 0;
}
