// Pipeline oracles: 1 stage = sequential (bitwise); GPipe and 1F1B-flush = sequential with the
// mini-batch (bitwise with equal summation order, within a tolerance without); threaded =
// reference (bitwise) for every schedule x predictor; a failing stage stops the run promptly.

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "support/support.hpp"
#include "xpipe/xpipe.hpp"

using namespace xpipe;
using Catch::Contains;

namespace {

using S0 = Stage<Linear<20, 32>, ReLU>;
using S1 = Stage<Linear<32, 32>, GELU>;
using S2 = Stage<Linear<32, 16>, ReLU>;
using S3 = Stage<Linear<16, 4>>;
using Whole =
    Stage<Linear<20, 32>, ReLU, Linear<32, 32>, GELU, Linear<32, 16>, ReLU, Linear<16, 4>>;

using Data = test::LabelledData;

// rows = 10 mini-batches of 16 plus a tail of 6 rows (kept: 6 >= M for M <= 4).
Data make_data(index_t rows = 166) {
  return test::random_classification(rows, 20, 4, 1);
}

template <class O>
std::vector<float> sequential(const Data& d, O opt, int chunks) {
  SequentialTrainer<Whole, O> t(opt, 16, 3);
  for (index_t first = 0; first < d.rows; first += 16) {
    const index_t n = std::min<index_t>(16, d.rows - first);
    t.train_step(HostContext{}, {d.x.data() + first * 20, n, 20}, d.y.data() + first, chunks);
  }
  return {t.state().weights(), t.state().weights() + Whole::param_count};
}

// The sequential model's flat buffer laid out as the 4 stages' buffers, for comparison.
std::vector<float> as_stages(const std::vector<float>& whole) {
  std::vector<float> out;
  auto take = [&](index_t offset, index_t count, index_t padded) {
    out.insert(out.end(), whole.begin() + offset, whole.begin() + offset + count);
    out.insert(out.end(), padded - count, 0.f);
  };
  take(Whole::param_offsets[0], 20 * 32 + 32, S0::param_count);
  take(Whole::param_offsets[2], 32 * 32 + 32, S1::param_count);
  take(Whole::param_offsets[4], 32 * 16 + 16, S2::param_count);
  take(Whole::param_offsets[6], 16 * 4 + 4, S3::param_count);
  return out;
}

template <class P, class O, class E>
std::vector<float> four_stages(const Schedule& s, const Data& d, O opt, E&& exec) {
  Pipeline<S0, S1, S2, S3, P, O> p(opt, {.batch = 16, .micro_batches = s.micro_batches, .seed = 3});
  p.train(s, d.epoch(), exec);
  return p.weights();
}

using test::thread_count;

}  // namespace

TEST_CASE("A 1-stage pipeline equals sequential training bitwise", "[pipeline][oracle]") {
  const Data d = make_data();
  for (const char* name : {"gpipe", "1f1b-flush", "async-1f1b"}) {
    INFO(name);
    Pipeline<Whole, Latest, Adam> p(Adam{.lr = 1e-2f},
                                    {.batch = 16, .micro_batches = 1, .seed = 3});
    ReferenceExecutor exec;
    p.train(make_schedule(name, 1, 1, 11), d.epoch(), exec);
    REQUIRE(p.weights() == sequential(d, Adam{.lr = 1e-2f}, 1));
  }
}

TEST_CASE("GPipe and 1F1B-flush equal sequential training on the mini-batch",
          "[pipeline][oracle]") {
  const Data d = make_data();
  // zb-auto fitted to uneven costs: an order of its own; the others ignore the costs.
  const SplitBackwardCosts uneven = test::uneven_costs(4);
  for (int M : {2, 4}) {
    REQUIRE(make_schedule("zb-auto", 4, M, 11, uneven).actions != zb_h2(4, M, 11).actions);
    for (const char* name : {"gpipe", "1f1b-flush", "zb-h1", "zb-h2", "zb-auto", "interleaved-1f1b",
                             "looped-bfs", "zb-v", "dualpipev"}) {
      if (M < 4 && (std::string(name) == "zb-v" || std::string(name) == "dualpipev"))
        continue;  // the V schedules need M >= 2P = 4
      INFO(name << " M=" << M);
      const Schedule s = make_schedule(name, 4, M, 11, uneven);
      // Bitwise against sequential training that sums the gradient in the same M chunks.
      const auto piped = four_stages<Latest>(s, d, Adam{.lr = 1e-2f}, ThreadedExecutor{});
      REQUIRE(piped == as_stages(sequential(d, Adam{.lr = 1e-2f}, M)));
      // Against one GEMM over the whole mini-batch the summation order differs; SGD keeps the
      // rounding differences at their size (Adam would divide them by tiny sqrt(v) early on):
      // 11 steps agree to 2e-6 relative + 1e-7 absolute.
      const auto piped_sgd = four_stages<Latest>(s, d, SGD{.lr = 0.1f}, ReferenceExecutor{});
      const auto whole_sgd = as_stages(sequential(d, SGD{.lr = 0.1f}, 1));
      REQUIRE(piped_sgd.size() == whole_sgd.size());
      for (std::size_t i = 0; i < piped_sgd.size(); ++i)
        REQUIRE(piped_sgd[i] == Approx(whole_sgd[i]).epsilon(2e-6).margin(1e-7));
    }
  }
}

TEST_CASE("Threaded and reference executors agree bitwise for every schedule x predictor",
          "[pipeline][oracle]") {
  const Data d = make_data();
  auto check = [&]<class P, class O>(const Schedule& s, O opt) {
    INFO(s.name << " x " << P::name);
    const auto ref = four_stages<P>(s, d, opt, ReferenceExecutor{});
    const auto thr = four_stages<P>(s, d, opt, ThreadedExecutor{});
    const auto again = four_stages<P>(s, d, opt, ThreadedExecutor{});
    REQUIRE(ref == thr);
    REQUIRE(thr == again);
  };
  for (const char* name : schedule_names) {
    const Schedule s = make_schedule(name, 4, 4, 11, test::uneven_costs(4));
    check.operator()<Latest>(s, Adam{.lr = 1e-2f});
    check.operator()<Stash>(s, Adam{.lr = 1e-2f});
    check.operator()<DoubleBuffered>(s, Adam{.lr = 1e-2f});
    check.operator()<XPipe>(s, AdamW{.lr = 1e-2f});
    check.operator()<SpecTrain>(s, SGD{.lr = 0.05f, .momentum = 0.9f});
    check.operator()<PipeOptim>(s, Adam{.lr = 1e-2f});
  }
}

TEST_CASE("Stages of Dense layers train bitwise as Linear then ReLU, reference and threaded",
          "[pipeline][dense]") {
  // S0 and S2 with their ReLU fused into the Linear: the same flat layouts and, from the same
  // seed, the same initial weights (a Dense layer takes two layer numbers, so S1's and S3's
  // draws do not move either).
  using F0 = Stage<Dense<20, 32, ReLU>>;
  using F2 = Stage<Dense<32, 16, ReLU>>;
  const Data d = make_data();
  const std::string name = GENERATE("async-1f1b", "zb-h1");
  INFO(name);
  const Schedule s = make_schedule(name, 4, 4, 11);
  const PipelineOptions options{.batch = 16, .micro_batches = 4, .seed = 3};
  Pipeline<S0, S1, S2, S3, XPipe, AdamW> split(AdamW{.lr = 1e-2f}, options);
  auto fused_run = [&](auto&& exec) {
    Pipeline<F0, S1, F2, S3, XPipe, AdamW> fused(AdamW{.lr = 1e-2f}, options);
    REQUIRE(fused.weights() == split.weights());
    fused.train(s, d.epoch(), exec);
    return fused.weights();
  };
  const auto reference = fused_run(ReferenceExecutor{});
  const auto threaded = fused_run(ThreadedExecutor{});
  ThreadedExecutor exec;
  split.train(s, d.epoch(), exec);
  REQUIRE(split.weights() == reference);
  REQUIRE(threaded == reference);
}

TEST_CASE("Remedies change what async training computes - and only there", "[pipeline]") {
  const Data d = make_data();
  const Schedule async = async_1f1b(4, 4, 11), sync = gpipe(4, 4, 11);
  const auto latest = four_stages<Latest>(async, d, Adam{.lr = 1e-2f}, ReferenceExecutor{});
  // Under a synchronous schedule every predictor reads the live weights: identical results.
  const auto sync_latest = four_stages<Latest>(sync, d, Adam{.lr = 1e-2f}, ReferenceExecutor{});
  REQUIRE(four_stages<Stash>(sync, d, Adam{.lr = 1e-2f}, ReferenceExecutor{}) == sync_latest);
  REQUIRE(four_stages<XPipe>(sync, d, Adam{.lr = 1e-2f}, ReferenceExecutor{}) == sync_latest);
  REQUIRE(four_stages<PipeOptim>(sync, d, Adam{.lr = 1e-2f}, ReferenceExecutor{}) == sync_latest);
  // Under async 1F1B they differ from Latest and from each other.
  const auto stash = four_stages<Stash>(async, d, Adam{.lr = 1e-2f}, ReferenceExecutor{});
  const auto xpipe_w = four_stages<XPipe>(async, d, Adam{.lr = 1e-2f}, ReferenceExecutor{});
  REQUIRE(stash != latest);
  REQUIRE(xpipe_w != latest);
  REQUIRE(xpipe_w != stash);
  // With M = 4 = K, 2BW's two versions are exactly what stashing needs.
  REQUIRE(four_stages<DoubleBuffered>(async, d, Adam{.lr = 1e-2f}, ReferenceExecutor{}) == stash);
}

TEST_CASE("Predictors report the weight copies the schedule makes them hold", "[pipeline]") {
  const Data d = make_data();
  auto copies = [&]<class P>(const Schedule& s) {
    Pipeline<S0, S1, S2, S3, P> p(Adam{}, {.batch = 16, .micro_batches = s.micro_batches});
    ReferenceExecutor exec;
    p.train(s, d.epoch(), exec);
    std::vector<int> c;
    for (int k = 0; k < 4; ++k) c.push_back(p.weight_copies(k));
    return c;
  };
  const Data d1 = make_data(160);
  {
    Pipeline<S0, S1, S2, S3, Stash> p(Adam{}, {.batch = 16, .micro_batches = 1});
    ReferenceExecutor exec;
    p.train(async_1f1b(4, 1, 10), d1.epoch(), exec);
    for (int k = 0; k < 4; ++k) REQUIRE(p.weight_copies(k) == 4 - k);  // K - k versions
  }
  REQUIRE(copies.operator()<Latest>(async_1f1b(4, 4, 11)) == std::vector<int>{1, 1, 1, 1});
  REQUIRE(copies.operator()<SpecTrain>(async_1f1b(4, 4, 11)) == std::vector<int>{2, 2, 2, 2});
  REQUIRE(copies.operator()<DoubleBuffered>(async_1f1b(4, 4, 11)) == std::vector<int>{2, 2, 2, 1});
  REQUIRE(copies.operator()<PipeOptim>(async_1f1b(4, 4, 11)) == std::vector<int>{2, 2, 2, 2});
  REQUIRE(copies.operator()<XPipe>(async_1f1b(4, 4, 11)) == std::vector<int>{3, 3, 3, 2});
  REQUIRE(copies.operator()<XPipe>(gpipe(4, 4, 11)) == std::vector<int>{2, 2, 2, 2});
}

TEST_CASE("WeightSlots lends its fixed copies by use count and names the fault when full",
          "[pipeline][predict]") {
  WeightSlots<Host> slots(2, 5, "stash", 3);
  REQUIRE(slots.size() == 2);
  REQUIRE(slots.data(0) != slots.data(1));
  const float* first = slots.data(0);
  REQUIRE(slots.acquire(2, Action{ActionKind::Step, 0}) == 0);  // the lowest free slot
  REQUIRE(slots.acquire(1, Action{ActionKind::Step, 1}) == 1);
  REQUIRE_THROWS_WITH(slots.acquire(1, Action{ActionKind::Forward, 7}),
                      Contains("xpipe: stash: stage 3: all 2 weight slots in use at F7"));
  slots.share(1);
  REQUIRE(slots.users(1) == 2);
  REQUIRE_FALSE(slots.release(0));
  REQUIRE(slots.release(0));  // the second user frees it
  REQUIRE(slots.acquire(1, Action{ActionKind::Backward, 2}) == 0);
  REQUIRE(slots.data(0) == first);  // the same buffer, never reallocated
  WeightSlots<Host> none(0, 5, "xpipe", 0);
  REQUIRE_THROWS_WITH(none.acquire(1, Action{ActionKind::Forward, 0}),
                      Contains("all 0 weight slots"));
}

TEST_CASE("DoubleBuffered refuses a schedule that needs more than two versions", "[pipeline]") {
  const Data d = make_data(160);
  Pipeline<S0, S1, S2, S3, DoubleBuffered> p(Adam{}, {.batch = 16, .micro_batches = 2});
  ReferenceExecutor exec;
  REQUIRE_THROWS_WITH(p.train(async_1f1b(4, 2, 10), d.epoch(), exec),
                      Contains("2bw: stage 0 needs 3 weight versions"));
}

namespace {
// A width-preserving layer that throws on its n-th forward call (counted globally).
inline std::atomic<int> forward_calls{0};
inline int throw_at = -1;
struct FuseHook {
  static void on_forward() {
    if (forward_calls.fetch_add(1) == throw_at) throw std::runtime_error("fuse blown");
  }
};
using Fuse = test::HookedIdentity<FuseHook>;
}  // namespace

TEST_CASE("A stage that throws stops every stage at once - naming the stage",
          "[pipeline][errors]") {
  const Data d = make_data(16 * 200);
  const int threads_before = thread_count();
  forward_calls = 0;
  throw_at = 300;  // mid-run: the 300th forward of stage 2 (of 800)
  Pipeline<S0, S1, Stage<Linear<32, 16>, Fuse>, S3, XPipe> p(Adam{},
                                                             {.batch = 16, .micro_batches = 4});
  ThreadedExecutor exec;
  // No wall-clock assertion: the other stages' waits would give up only after an hour, so
  // unless the failure stops them, the test hangs until CTest's timeout fails it.
  exec.wait_timeout = std::chrono::hours(1);
  try {
    p.train(async_1f1b(4, 4, 200), d.epoch(), exec);
    FAIL("no exception");
  } catch (const StageError& e) {
    REQUIRE(e.stage() == 2);
    REQUIRE_THAT(e.what(), Contains("stage 2, action F300") && Contains("fuse blown"));
  }
  REQUIRE(thread_count() == threads_before);  // every stage thread joined
  throw_at = -1;
  // The reference executor reports the same failure the same way.
  forward_calls = 0;
  throw_at = 300;
  ReferenceExecutor ref;
  REQUIRE_THROWS_WITH(p.train(async_1f1b(4, 4, 200), d.epoch(), ref),
                      Contains("stage 2, action F300"));
  throw_at = -1;
}

TEST_CASE("A NaN in the loss stops the pipeline with the stage and micro-batch named",
          "[pipeline][errors]") {
  Data d = make_data(160);
  d.x[5 * 16 * 20 + 3] = std::nanf("");  // a row of mini-batch 5
  Pipeline<S0, S1, S2, S3, Latest> p(Adam{}, {.batch = 16, .micro_batches = 4});
  ThreadedExecutor exec;
  REQUIRE_THROWS_WITH(p.train(async_1f1b(4, 4, 10), d.epoch(), exec),
                      Contains("stage 3, action F20") && Contains("loss is NaN"));
}

TEST_CASE("Pipeline::train rejects a schedule that does not fit it", "[pipeline][errors]") {
  const Data d = make_data(160);
  Pipeline<S0, S1, S2, S3> p(Adam{}, {.batch = 16, .micro_batches = 4});
  ReferenceExecutor exec;
  REQUIRE_THROWS_WITH(p.train(async_1f1b(3, 4, 10), d.epoch(), exec), Contains("3 stages"));
  REQUIRE_THROWS_WITH(p.train(async_1f1b(4, 4, 9), d.epoch(), exec), Contains("holds 10"));
  Schedule broken = async_1f1b(4, 4, 10);
  std::swap(broken.actions[1][0], broken.actions[1][1]);
  REQUIRE_THROWS_AS(p.train(broken, d.epoch(), exec), ConfigError);
}

namespace {
// A layer with parameters and no split backward (y = x * w, one weight): a zero-bubble schedule
// must be refused, naming it, before any action runs.
struct ScaleNoSplit {
  static constexpr int in_width = 4, out_width = 4;
  static constexpr index_t param_count = 1;
  static std::string name() { return "ScaleNoSplit"; }
  static void init(std::span<float> p, std::uint64_t) { p[0] = 1.f; }
  static void forward(const HostContext&, const float* p, ConstMatrix x, Matrix y) {
    for (index_t r = 0; r < x.rows; ++r)
      for (index_t c = 0; c < x.cols; ++c) y(r, c) = p[0] * x(r, c);
  }
  static void backward(const HostContext&, const float* p, float* g, bool acc, ConstMatrix x,
                       ConstMatrix, ConstMatrix dy, Matrix dx) {
    float sum = 0;
    for (index_t r = 0; r < x.rows; ++r)
      for (index_t c = 0; c < x.cols; ++c) {
        sum += dy(r, c) * x(r, c);
        if (!dx.empty()) dx(r, c) = p[0] * dy(r, c);
      }
    g[0] = acc ? g[0] + sum : sum;
  }
};
}  // namespace

TEST_CASE("Zero-bubble schedules report the gradients kept between I and W as activations",
          "[pipeline][zb]") {
  const Data d = make_data(160);
  Pipeline<S0, S1, S2, S3> p(Adam{}, {.batch = 16, .micro_batches = 4});
  ReferenceExecutor exec;
  // Worked by hand, rows = 16 / 4 = 4. S0 = Linear<20, 32>, ReLU keeps 4 x (32 + 32) floats of
  // outputs; a split backward also keeps the Linear's output gradient, 4 x 32 (ReLU has no
  // parameters). S3 = Linear<16, 4>: 4 x 4 outputs, 4 x 4 kept.
  p.train(one_f_one_b_flush(4, 4, 10), d.epoch(), exec);
  REQUIRE(p.activation_floats(0) == 4 * (4 * 64));  // 1F1B: 4 in flight at stage 0
  REQUIRE(p.activation_floats(3) == 1 * (4 * 4));   // and 1 at the last
  p.train(zb_h1(4, 4, 10), d.epoch(), exec);
  REQUIRE(p.activation_floats(0) == 4 * (4 * 64 + 4 * 32));
  REQUIRE(p.activation_floats(3) == 4 * (4 * 4 + 4 * 4));  // ZB-H1: 4 at every stage
  // The schedule's own trace peak matches: no stage ran more micro-batches at once.
  REQUIRE(p.analysis().max_in_flight == std::vector<int>{4, 4, 4, 4});
}

TEST_CASE("A zero-bubble schedule on a layer without a split backward is refused, naming it",
          "[pipeline][zb][errors]") {
  const Data d = make_data(160);
  using Odd = Stage<ScaleNoSplit, Linear<4, 16>>;
  using First = Stage<Linear<20, 4>>;
  Pipeline<First, Odd, S3> p(Adam{}, {.batch = 16, .micro_batches = 2});
  static_assert(!Odd::splits_backward<Host> && First::splits_backward<Host>);
  const std::vector<float> before = p.weights();
  ReferenceExecutor exec;
  REQUIRE_THROWS_WITH(p.train(zb_h1(3, 2, 10), d.epoch(), exec),
                      Contains("schedule 'zb-h1'") &&
                          Contains("at stage 1, but its layer 0 (ScaleNoSplit)") &&
                          Contains("no split backward"));
  REQUIRE(p.weights() == before);  // refused before any action
  REQUIRE_NOTHROW(p.train(one_f_one_b_flush(3, 2, 10), d.epoch(), exec));
  // Splitting only where the layers can: stage 1 runs whole backwards between two stages that
  // split theirs, and trains bitwise as 1F1B-flush.
  Schedule mixed = zb_h1(3, 2, 10);
  mixed.actions[1] = one_f_one_b_flush(3, 2, 10).actions[1];
  Pipeline<First, Odd, S3> a(Adam{}, {.batch = 16, .micro_batches = 2}),
      b(Adam{}, {.batch = 16, .micro_batches = 2});
  a.train(mixed, d.epoch(), exec);
  b.train(one_f_one_b_flush(3, 2, 10), d.epoch(), exec);
  REQUIRE(a.weights() == b.weights());
  REQUIRE(a.activation_floats(1) == b.activation_floats(1));  // stage 1 keeps no gradients
  REQUIRE(a.activation_floats(0) > b.activation_floats(0));
}

namespace {
// A second queue policy: the in-process ring, counting every message pushed through it.
std::atomic<long> counted_pushes{0};
template <class B>
struct CountingRing : SpscRing<B> {
  using SpscRing<B>::SpscRing;
  void push() {
    counted_pushes.fetch_add(1, std::memory_order_relaxed);
    SpscRing<B>::push();
  }
};
struct CountingQueue {
  template <class B>
  using queue = CountingRing<B>;
  static constexpr const char* name = "counting";
};
static_assert(QueuePolicy<CountingQueue>);

// A test backend: host memory and kernels, but its own Context type and a buffer type that
// counts the floats allocated through it, so the pipeline is seen to use B for its buffers.
std::atomic<long> counted_floats{0};
template <class T>
struct CountedBuffer : HostBuffer<T> {
  CountedBuffer() = default;
  explicit CountedBuffer(index_t n) : HostBuffer<T>(n) { counted_floats += n; }
};
struct TestContext : HostContext {};
struct TestBackend {
  using Context = TestContext;
  struct ContextOwner {
    explicit ContextOwner(const Placement& p) { ctx_.threads = p.threads; }
    const TestContext& ctx() const { return ctx_; }
    TestContext ctx_;
  };
  template <class T>
  using Buffer = CountedBuffer<T>;
  static constexpr const char* name = "test";
  static constexpr index_t column_block = Host::column_block;
};
static_assert(Backend<TestBackend>);
}  // namespace

TEST_CASE("Backend and queue are real policies of Pipeline - same bits, their own buffers",
          "[pipeline][policies]") {
  const Data d = make_data();
  const Schedule s = async_1f1b(4, 2, 11);
  const auto reference = four_stages<XPipe>(s, d, Adam{.lr = 1e-2f}, ReferenceExecutor{});

  counted_pushes = 0;
  Pipeline<S0, S1, S2, S3, XPipe, Adam, CountingQueue> counted(
      Adam{.lr = 1e-2f}, {.batch = 16, .micro_batches = 2, .seed = 3});
  ThreadedExecutor exec;
  counted.train(s, d.epoch(), exec);
  REQUIRE(counted.weights() == reference);
  // Every micro-batch crosses K - 1 = 3 boundaries forward and 3 backward.
  REQUIRE(counted_pushes.load() == 2L * 3 * s.total_micro_batches());

  counted_floats = 0;
  Pipeline<S0, S1, S2, S3, XPipe, Adam, TestBackend> on_test(
      Adam{.lr = 1e-2f}, {.batch = 16, .micro_batches = 2, .seed = 3});
  const long at_construction = counted_floats.load();
  // At least weights, gradients and Adam's two moments of every stage.
  REQUIRE(at_construction >=
          4 * (S0::param_count + S1::param_count + S2::param_count + S3::param_count));
  on_test.train(s, d.epoch(), exec);
  REQUIRE(counted_floats.load() > at_construction);  // slots, queues and predictor copies too
  REQUIRE(on_test.weights() == reference);
}
