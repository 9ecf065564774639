// The device half of Pipeline (what a CUDA pipeline runs around its kernels: the epoch uploaded,
// queues ordered by events between streams, the loss summed on the device and read once after
// the run, weights, evaluation and checkpoints copied through the host), run here without a GPU
// on an emulated device (support/emulated_device.hpp): streams are worker threads that lag the
// host by random delays, so a missing event wait shows as wrong bits. The math is the host's, so
// every result must equal the host pipeline's bit for bit.

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "support/emulated_device.hpp"
#include "support/support.hpp"
#include "xpipe/pipeline/checkpoint.hpp"
#include "xpipe/xpipe.hpp"

using namespace xpipe;
using Catch::Contains;
using test::EmulatedDevice;

// The emulated device is the device contract's second model (CUDA the first: xpipe_cuda.cuh).
static_assert(check_device_backend<EmulatedDevice>());

namespace {

using S0 = Stage<Linear<20, 32>, ReLU>;
using S1 = Stage<Linear<32, 32>, GELU>;
using S2 = Stage<Linear<32, 16>, ReLU>;
using S3 = Stage<Linear<16, 4>>;

constexpr index_t batch = 16;
constexpr int mini_batches = 11;

// The emulation's settings for one test, reset to the defaults after it. The streams' delays
// are drawn from Catch's seed: `--rng-seed N` replays one interleaving, another N tries another.
struct Emulation {
  Emulation(int devices, int jitter_us, int slow_stage = -1, int slow_us = 0) {
    EmulatedDevice::devices = devices;
    EmulatedDevice::jitter_us = jitter_us;
    EmulatedDevice::slow_stage = slow_stage;
    EmulatedDevice::slow_us = slow_us;
    EmulatedDevice::seed = Catch::rngSeed();
  }
  ~Emulation() {
    EmulatedDevice::devices = 1;
    EmulatedDevice::jitter_us = 0;
    EmulatedDevice::slow_stage = -1;
    EmulatedDevice::slow_us = 0;
    EmulatedDevice::skip_waits = false;
  }
};

struct Outcome {
  std::vector<float> weights;
  double loss = 0;
  Evaluation eval;
};

template <class P, class B, class O, class E>
Outcome train(const Schedule& s, const test::LabelledData& d, O opt, E exec, P pred = {}) {
  Pipeline<S0, S1, S2, S3, P, O, B> p(
      opt, {.batch = batch, .micro_batches = s.micro_batches, .seed = 3}, pred);
  const EpochResult r = p.train(s, d.epoch(), exec);
  Dataset eval;
  eval.count = d.rows;
  eval.width = d.cols;
  eval.classes = 4;
  eval.features = HostBuffer<float>(d.rows * d.cols);
  std::copy(d.x.begin(), d.x.end(), eval.features.begin());
  eval.labels = d.y;
  return {p.weights(), r.loss, p.evaluation(eval)};
}

void require_same(const Outcome& host, const Outcome& device) {
  REQUIRE(device.weights == host.weights);
  REQUIRE(device.loss == host.loss);  // summed on the "device" in the host's order
  REQUIRE(device.eval.accuracy == host.eval.accuracy);
  // The device's logits copied back and scored on the host: the host's bits.
  REQUIRE(device.eval.loss == host.eval.loss);
}

// What several cases share: async 1F1B x XPipe at M = 4 on the same data, and the oracle, the
// host's run of it.
struct AsyncXPipe {
  test::LabelledData d = test::random_classification(batch * mini_batches, 20, 4, 1);
  Schedule s = async_1f1b(4, 4, mini_batches);
  Adam adam{.lr = 1e-2f};
  Outcome host = train<XPipe, Host>(s, d, adam, ReferenceExecutor{});
};

// A layer that makes its stage's stream fail at the first forward, as a faulting kernel does.
struct FaultOnStream {
  static constexpr int in_width = any_width, out_width = any_width;
  static constexpr index_t param_count = 0;
  static void init(std::span<float>, std::uint64_t) {}
  template <class Ctx>
  static void forward(const Ctx& ctx, const float* p, ConstMatrix x, Matrix y) {
    test::fail_on_stream(ctx, "illegal address (injected)");
    Activation<math::Identity>::forward(ctx, p, x, y);
  }
  template <class Ctx>
  static void backward(const Ctx& ctx, const float* p, float* g, bool acc, ConstMatrix x,
                       ConstMatrix y, ConstMatrix dy, Matrix dx) {
    Activation<math::Identity>::backward(ctx, p, g, acc, x, y, dy, dx);
  }
};

// A layer of one weight whose gradient is NaN (written by an element loop, so on the device
// too): the loss stays finite, the global gradient norm does not.
struct SetNan {
  float* g;
  XPIPE_HOST_DEVICE void operator()(index_t) const { *g = std::numeric_limits<float>::quiet_NaN(); }
};
struct NanGradient {
  static constexpr int in_width = any_width, out_width = any_width;
  static constexpr index_t param_count = 1;
  static void init(std::span<float> p, std::uint64_t) { p[0] = 0.f; }
  template <class Ctx>
  static void forward(const Ctx& ctx, const float* p, ConstMatrix x, Matrix y) {
    Activation<math::Identity>::forward(ctx, p, x, y);
  }
  template <class Ctx>
  static void backward(const Ctx& ctx, const float* p, float* g, bool acc, ConstMatrix x,
                       ConstMatrix y, ConstMatrix dy, Matrix dx) {
    Activation<math::Identity>::backward(ctx, p, g, acc, x, y, dy, dx);
    for_each_index(ctx, 1, SetNan{g});
  }
};

}  // namespace

TEST_CASE("The emulated device keeps CUDA's rules on devices, launches and events",
          "[device][emulated]") {
  Emulation two(2, 0);
  test::EmulatedStreamOwner s0(Placement{.stage = 0}), s1(Placement{.stage = 1});
  REQUIRE(s0.ctx().device == 0);
  REQUIRE(s1.ctx().device == 1);     // stage k on device k % 2; device 1 is now current
  test::EmulatedBuffer<float> x(4);  // on device 1
  const auto fill = [p = x.data()](index_t i) { p[i] = static_cast<float>(i); };
  REQUIRE_THROWS_WITH(for_each_index(s0.ctx(), 4, fill),
                      Contains("stream of device 0 while device 1 is current"));
  activate(s0.ctx());
  for_each_index(s0.ctx(), 4, fill);
  synchronize(s0.ctx());
  float back[4] = {};
  copy_to_host(s0.ctx(), x.data(), back, 4);
  REQUIRE(back[3] == 3.f);

  // Operands: host memory, and another device's memory without peer access, are refused.
  test::EmulatedBuffer<float> y(4);  // on device 0
  REQUIRE_THROWS_WITH(
      gemm(s0.ctx(), Trans::No, Trans::No, 2, 2, 2, 1.f, back, 2, y.data(), 2, 0.f, y.data(), 2),
      Contains("operand A is not in any live emulated buffer"));
  REQUIRE_THROWS_WITH(gemm(s0.ctx(), Trans::No, Trans::No, 2, 2, 2, 1.f, x.data(), 2, y.data(), 2,
                           0.f, y.data(), 2),
                      Contains("memory of device 1, which device 0 has no peer access to"));
  connect(s0.ctx(), s1.ctx());
  activate(s0.ctx());
  gemm(s0.ctx(), Trans::No, Trans::No, 2, 2, 2, 1.f, x.data(), 2, y.data(), 2, 0.f, y.data(), 2);
  REQUIRE_THROWS_WITH(copy_from_pinned_async(s0.ctx(), back, y.data(), 4),
                      Contains("upload source is not in any live emulated buffer"));

  test::EmulatedEvent on_device0;  // created while device 0 is current
  REQUIRE_THROWS_WITH(on_device0.record(s1.ctx()),
                      Contains("event of device 0 recorded on a stream of device 1"));

  // A wait orders: stream 1 reads what a slow task of stream 0 wrote before the record.
  std::atomic<int> written{0}, seen{-1};
  s0.ctx().stream->enqueue([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    written = 1;
  });
  on_device0.record(s0.ctx());
  on_device0.wait(s1.ctx());
  s1.ctx().stream->enqueue([&] { seen = written.load(); });
  synchronize(s1.ctx());
  REQUIRE(seen.load() == 1);
  // A wait takes the record current when it is enqueued: recording the event again behind a task
  // that waits for stream 1 must not hold stream 1 (were it held, the task would time out).
  std::atomic<bool> released{false}, timed_out{false};
  on_device0.wait(s1.ctx());
  s0.ctx().stream->enqueue([&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!released && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    timed_out = !released;
  });
  on_device0.record(s0.ctx());
  s1.ctx().stream->enqueue([&] { released = true; });
  synchronize(s1.ctx());
  synchronize(s0.ctx());
  REQUIRE_FALSE(timed_out.load());
  test::EmulatedEvent never;  // never recorded: complete
  never.wait(s1.ctx());
  synchronize(s1.ctx());

  // A fault is its device's: later work on every stream of it is skipped, every synchronisation
  // there throws; device 1 goes on.
  Emulation one_per_stage(2, 0);
  test::EmulatedStreamOwner s2(Placement{.stage = 2});  // device 0 again
  test::fail_on_stream(s0.ctx(), "injected");
  REQUIRE_THROWS_WITH(synchronize(s0.ctx()), Contains("injected"));
  std::atomic<bool> ran{false};
  s2.ctx().stream->enqueue([&] { ran = true; });
  REQUIRE_THROWS_WITH(synchronize(s2.ctx()), Contains("injected"));
  REQUIRE_FALSE(ran.load());
  float z = 0;
  copy_to_host(s1.ctx(), x.data(), &z, 1);
  REQUIRE(z == 0.f);
}

TEST_CASE("A pipeline on an emulated device gives the host's bits for every schedule x predictor",
          "[pipeline][device][emulated][oracle]") {
  Emulation lagging(1, 40);  // every stream sleeps 0..40 us before each task
  const auto d = test::random_classification(batch * mini_batches, 20, 4, 1);
  // Each predictor by its run-time choice (AnyPredictor, what the tools compile) on both sides:
  // one Pipeline type per backend. That AnyPredictor trains each static type's bits on the host
  // is test_remedies.cpp's oracle; the static XPipe and Latest run on the device below.
  for (const char* predictor : predictor_names)
    for (const auto& [name, M] : test::oracle_schedules) {
      const Schedule s = make_schedule(name, 4, M, mini_batches);
      for (const AnyOptimizer o :
           {AnyOptimizer{Adam{.lr = 1e-2f}}, AnyOptimizer{SGD{.lr = 0.05f, .momentum = 0.9f}}}) {
        INFO(predictor << " on " << name << " M=" << M << " with " << o.chosen_name());
        Outcome host;
        try {
          host = train<AnyPredictor, Host>(s, d, o, ReferenceExecutor{}, make_predictor(predictor));
        } catch (const ConfigError&) {  // 2BW and 2BW + EF need M >= K
          REQUIRE((std::string(predictor).rfind("2bw", 0) == 0 && M < 4));
          continue;
        }
        require_same(host, train<AnyPredictor, EmulatedDevice>(s, d, o, ThreadedExecutor{},
                                                               make_predictor(predictor)));
      }
    }
}

TEST_CASE("An emulated stream lagging its neighbours by whole micro-batches changes no bit",
          "[pipeline][device][emulated]") {
  // A stage whose stream is slow lets its neighbours' host threads and streams run ahead: a
  // consumer that read a slot before the slow producer filled it would change the weights.
  const auto d = test::random_classification(batch * mini_batches, 20, 4, 1);
  const Adam adam{.lr = 1e-2f};
  for (const Schedule& s : {async_1f1b(4, 4, mini_batches), gpipe(4, 4, mini_batches)}) {
    const Outcome host = train<XPipe, Host>(s, d, adam, ReferenceExecutor{});
    for (int slow = 0; slow < 4; ++slow) {
      INFO(s.name << ", stage " << slow << " slow");
      Emulation lag(1, 0, slow, 150);
      require_same(host, train<XPipe, EmulatedDevice>(s, d, adam, ThreadedExecutor{}));
    }
  }
}

TEST_CASE("The emulated device sees unordered streams: without event waits the bits differ",
          "[device][emulated][self-check]") {
  // The self-check of the tests above: with every event wait dropped and stage 0's stream slow,
  // stage 1 reads its queue slots before stage 0 fills them. A data race by design, so not
  // tagged [pipeline]: ThreadSanitizer's run (scripts/sanitize.sh tsan) would rightly stop at it.
  const AsyncXPipe c;
  Emulation unordered(1, 0, 0, 150);
  EmulatedDevice::skip_waits = true;
  REQUIRE(train<XPipe, EmulatedDevice>(c.s, c.d, c.adam, ThreadedExecutor{}).weights !=
          c.host.weights);
}

TEST_CASE("An emulated pipeline over two devices, by one thread, or of Dense layers: same bits",
          "[pipeline][device][emulated]") {
  const AsyncXPipe c;
  const auto& [d, s, adam, host] = c;
  {
    Emulation two(2, 40);  // stage k on device k % 2: every activate() must be in place
    require_same(host, train<XPipe, EmulatedDevice>(s, d, adam, ThreadedExecutor{}));
    require_same(host, train<XPipe, EmulatedDevice>(s, d, adam, ReferenceExecutor{}));
    // Dense layers (and the gradient scratch buffer they need, in device memory) give the bits
    // of Linear then ReLU.
    Pipeline<Stage<Dense<20, 32, ReLU>>, S1, Stage<Dense<32, 16, ReLU>>, S3, XPipe, Adam,
             EmulatedDevice>
        dense(adam, {.batch = batch, .micro_batches = 4, .seed = 3});
    ThreadedExecutor e;
    dense.train(s, d.epoch(), e);
    REQUIRE(dense.weights() == host.weights);
  }
  Emulation one(1, 40);
  require_same(train<Stash, Host>(s, d, adam, ReferenceExecutor{}),
               train<Stash, EmulatedDevice>(s, d, adam, ReferenceExecutor{}));
}

TEST_CASE("Global clipping on an emulated device: the host's bits and norms, streams lagging",
          "[pipeline][device][emulated][clipping]") {
  // Each stage's squared norm is written on its own stream (to stage 0's device) and read by
  // every stage's Step on theirs, ordered by events only: a Step that read a norm before it was
  // written would read NaN (DeviceEpoch's fill) and not clip, one that read another mini-batch's
  // would clip by the wrong factor: either changes the weights (dropping the waits, recording the
  // event before the norm, or waiting on the stage's own event only fails this case: checked by
  // hand).
  const auto d = test::random_classification(batch * mini_batches, 20, 4, 1);
  const Adam adam{.lr = 1e-2f};
  auto run = [&]<class B>(const Schedule& s, float clip, auto executor) {
    Pipeline<S0, S1, S2, S3, XPipe, Adam, B> p(
        adam, {.batch = batch, .micro_batches = s.micro_batches, .seed = 3, .clip_norm = clip});
    p.train(s, d.epoch(), executor);
    return std::pair{p.weights(), p.gradient_norms()};
  };
  for (const char* name : {"gpipe", "async-1f1b", "zb-h1"}) {
    INFO(name);
    const Schedule s = make_schedule(name, 4, 4, mini_batches);
    const auto host = run.template operator()<Host>(s, 0.05f, ReferenceExecutor{});
    REQUIRE(host.second.size() == static_cast<std::size_t>(mini_batches));
    // The bound clips every step, so a Step that read a norm too early (NaN: no clipping) shows.
    REQUIRE(*std::min_element(host.second.begin(), host.second.end()) > 0.05);
    REQUIRE(run.template operator()<Host>(s, 0.f, ReferenceExecutor{}).first != host.first);
    {
      Emulation lagging(1, 40);
      REQUIRE(run.template operator()<EmulatedDevice>(s, 0.05f, ThreadedExecutor{}) == host);
    }
    for (int slow = 0; slow < 4; ++slow) {
      INFO("stage " << slow << " slow");
      Emulation lag(1, 0, slow, 150);
      REQUIRE(run.template operator()<EmulatedDevice>(s, 0.05f, ThreadedExecutor{}) == host);
    }
    // Stage k on device k: stages 2 and 3 write their norms to device 0's memory, which they
    // reach only because clipping connects every stage to stage 0.
    Emulation spread(4, 20);
    REQUIRE(run.template operator()<EmulatedDevice>(s, 0.05f, ThreadedExecutor{}) == host);
    REQUIRE(run.template operator()<EmulatedDevice>(s, 0.05f, ReferenceExecutor{}) == host);
  }
  // One pipeline trained twice, the second run longer (the board grows, is filled again, its
  // events recorded again), against a host pipeline trained the same way.
  {
    Emulation lagging(2, 20);
    const auto d2 = test::random_classification(batch * 2 * mini_batches, 20, 4, 5);
    auto twice = [&]<class B>() {
      Pipeline<S0, S1, S2, S3, XPipe, Adam, B> p(
          adam, {.batch = batch, .micro_batches = 4, .seed = 3, .clip_norm = 0.05f});
      ThreadedExecutor e;
      p.train(async_1f1b(4, 4, mini_batches), d.epoch(), e);
      p.train(async_1f1b(4, 4, 2 * mini_batches), d2.epoch(), e);
      return std::pair{p.weights(), p.gradient_norms()};
    };
    const auto host = twice.template operator()<Host>();
    REQUIRE(host.second.size() == static_cast<std::size_t>(2 * mini_batches));
    REQUIRE(twice.template operator()<EmulatedDevice>() == host);
  }
  // Off: no norms, and no board.
  REQUIRE(run.template operator()<EmulatedDevice>(async_1f1b(4, 4, mini_batches), 0.f,
                                                  ThreadedExecutor{})
              .second.empty());
}

TEST_CASE(
    "Global clipping: a NaN gradient is named by its step, on the host before it and on an "
    "emulated device after the run",
    "[pipeline][device][emulated][clipping][errors]") {
  Emulation lagging(1, 20);
  const auto d = test::random_classification(batch * mini_batches, 20, 4, 1);
  auto message = [&]<class B>() -> std::string {
    Pipeline<S0, S1, Stage<Linear<32, 16>, ReLU, NanGradient>, S3, Latest, Adam, B> p(
        Adam{.lr = 1e-3f}, {.batch = batch, .micro_batches = 4, .clip_norm = 1.f});
    ThreadedExecutor e;
    try {
      p.train(async_1f1b(4, 4, mini_batches), d.epoch(), e);
    } catch (const StageError& err) {
      return err.what();
    }
    return "no error";
  };
  const std::string norm =
      "the global gradient norm of mini-batch 0 is nan (a stage's gradient "
      "holds NaN or inf)";
  REQUIRE_THAT(message.template operator()<Host>(), Contains(norm + ": not stepped"));
  const std::string device = message.template operator()<EmulatedDevice>();
  REQUIRE_THAT(device, Contains("stage 2") && Contains("S0") &&
                           Contains(norm + ": the device stepped on with it"));
}

TEST_CASE("An emulated pipeline reports a NaN input after the run as the host does, word for word",
          "[pipeline][device][emulated][errors]") {
  Emulation lagging(1, 20);
  auto d = test::random_classification(batch * mini_batches, 20, 4, 1);
  d.x[(3 * batch + 5) * 20 + 7] = std::nanf("");  // a row of mini-batch 3
  const Schedule s = async_1f1b(4, 4, mini_batches);
  auto message = [&]<class B>() -> std::string {
    Pipeline<S0, S1, S2, S3, XPipe, Adam, B> p(Adam{.lr = 1e-3f},
                                               {.batch = batch, .micro_batches = 4});
    ThreadedExecutor e;
    try {
      p.train(s, d.epoch(), e);
    } catch (const StageError& err) {
      return err.what();
    }
    return "no error";
  };
  const std::string host = message.template operator()<Host>();
  REQUIRE_THAT(host, Contains("loss is NaN") && Contains("input row 53 holds NaN"));
  REQUIRE(message.template operator()<EmulatedDevice>() == host);
}

TEST_CASE("An emulated stream that fails mid-run surfaces after the run as a StageError",
          "[pipeline][device][emulated][errors]") {
  Emulation lagging(1, 20);
  const auto d = test::random_classification(batch * mini_batches, 20, 4, 1);
  Pipeline<S0, S1, Stage<Linear<32, 16>, FaultOnStream, ReLU>, S3, XPipe, Adam, EmulatedDevice> p(
      Adam{}, {.batch = batch, .micro_batches = 4});
  ThreadedExecutor e;
  // The fault is the device's (one device here), so the first stage synchronised reports it,
  // not necessarily the one whose stream faulted.
  REQUIRE_THROWS_WITH(p.train(async_1f1b(4, 4, mini_batches), d.epoch(), e),
                      Contains("action end of run") && Contains("illegal address (injected)"));
}

TEST_CASE(
    "An emulated pipeline's checkpoint resumes bitwise, bad placements and labels are refused",
    "[pipeline][device][emulated][checkpoint]") {
  Emulation lagging(1, 20);
  const auto d = test::random_classification(batch * 10, 20, 4, 1);
  const index_t half = batch * 5;
  const EpochData first{d.features().slice_rows(0, half), d.y.data()};
  const EpochData second{d.features().slice_rows(half, half), d.y.data() + half};
  const Schedule s = async_1f1b(4, 4, 5);
  using P = Pipeline<S0, S1, S2, S3, XPipe, Adam, EmulatedDevice>;
  const PipelineOptions o{.batch = batch, .micro_batches = 4, .seed = 3};
  ThreadedExecutor e;
  P straight(Adam{.lr = 1e-2f}, o);
  straight.train(s, first, e);
  straight.train(s, second, e);
  P before(Adam{.lr = 1e-2f}, o);
  before.train(s, first, e);
  const auto root = test::scratch_dir("emulated_ckpt");
  std::filesystem::remove_all(root);
  const auto folder = save_checkpoint(before, root, "ckpt-000001");
  P resumed(Adam{.lr = 1e-2f}, o);
  load_checkpoint(resumed, read_checkpoint(folder));
  resumed.train(s, second, e);
  std::filesystem::remove_all(root);
  REQUIRE(resumed.weights() == straight.weights());

  REQUIRE_THROWS_WITH((P(Adam{}, {.batch = batch, .devices = {3}})),
                      Contains("stage 0 placed on emulated device 3"));
  auto bad = d;
  bad.y[70] = 4;
  P p(Adam{}, o);
  const std::vector<float> untouched = p.weights();
  REQUIRE_THROWS_WITH(p.train(async_1f1b(4, 4, 10), bad.epoch(), e), Contains("label 4 at row 70"));
  REQUIRE(p.weights() == untouched);
}

namespace {

// A small CNN (convolution, BatchNorm fused with its ReLU, a residual block with the pair
// unfused and its ReLU after it, one with that ReLU fused into its sum, pooling) over 3 stages.
constexpr ConvOptions same{.padding = 1};
using Img4 = Shape<4, 8, 8>;
using Conv4 = Conv2d<Img4, 4, 3, same>;
using C0 = Stage<Conv2d<Shape<1, 8, 8>, 4, 3, same>, BatchNormAct<Img4, ReLU>>;
using C1 = Stage<Residual<Conv4, BatchNorm2d<Img4>, ReLU, Conv4, BatchNorm2d<Img4>>, ReLU,
                 ResidualAct<ReLU, Conv4, BatchNorm2d<Img4>, ReLU, Conv4, BatchNorm2d<Img4>>>;
using C2 = Stage<MaxPool2d<Img4, 2>, Flatten<Shape<4, 4, 4>>, Linear<64, 4>>;

struct CnnOutcome {
  std::vector<float> weights, state;
  double loss = 0;
};

template <class B, class E>
CnnOutcome train_cnn(const Schedule& s, const test::LabelledData& d, E exec, float lr = 1e-2f) {
  Pipeline<C0, C1, C2, XPipe, Adam, B> p(
      Adam{.lr = lr}, {.batch = 16, .micro_batches = s.micro_batches, .seed = 3});
  const EpochResult r = p.train(s, d.epoch(), exec);
  return {p.weights(), p.running_state(), r.loss};
}

}  // namespace

TEST_CASE(
    "A CNN on the emulated device: CUDA's convolution path, its BatchNorm state on the "
    "device, ordered by events whatever the streams' pace",
    "[pipeline][device][emulated][cnn]") {
  // The blocks' four convolutions take their column buffers from the stage's one arena, worked
  // by hand for a batch of 16: 16 images x 64 pixels x (4 channels x 3 x 3), and 16 x 4 bias
  // sums; the fused block's ReLU gradient, 16 x 256, comes before them. The host's oneDNN
  // primitives take none.
  STATIC_REQUIRE(C1::arena_floats<EmulatedDevice>(16) == 16 * 256 + 16 * 64 * 36 + 16 * 4);
  STATIC_REQUIRE(C1::arena_floats<Host>(16) == 16 * 256);
  const auto d = test::random_classification(96, 64, 4, 5);
  for (const Schedule& s : {async_1f1b(3, 2, 6), gpipe(3, 2, 6)}) {
    INFO(s.name);
    CnnOutcome base;
    {
      Emulation none(1, 0);
      base = train_cnn<EmulatedDevice>(s, d, ReferenceExecutor{});
    }
    for (int slow = 0; slow < 3; ++slow) {
      INFO("stage " << slow << " slow");
      Emulation lag(1, 0, slow, 150);
      const CnnOutcome got = train_cnn<EmulatedDevice>(s, d, ThreadedExecutor{});
      REQUIRE(got.weights == base.weights);
      REQUIRE(got.state == base.state);
      REQUIRE(got.loss == base.loss);
    }
    // The host convolves with oneDNN, the device path with im2col and GEMMs: other summation
    // orders, the same function. Adam turns last-bit differences into other trajectories within
    // steps, so the state is compared where the weights hardly move (lr 1e-6): the running
    // statistics then differ by the convolutions' rounding only.
    const CnnOutcome host = train_cnn<Host>(s, d, ReferenceExecutor{});
    REQUIRE(base.loss == Approx(host.loss).epsilon(1e-4));
    const CnnOutcome host_still = train_cnn<Host>(s, d, ReferenceExecutor{}, 1e-6f);
    CnnOutcome device_still;
    {
      Emulation none(1, 0);
      device_still = train_cnn<EmulatedDevice>(s, d, ReferenceExecutor{}, 1e-6f);
    }
    REQUIRE(device_still.state.size() == host_still.state.size());
    for (std::size_t i = 0; i < host_still.state.size(); ++i)
      REQUIRE(device_still.state[i] == Approx(host_still.state[i]).epsilon(1e-3).margin(1e-5));
  }
}
