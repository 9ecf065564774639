// Every input checked (issue 13): bad labels, lying or odd data files, short epochs under
// weight stashing, and layers that throw what is not a std::exception.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "support/support.hpp"
#include "xpipe/xpipe.hpp"

using namespace xpipe;
using Catch::Contains;
using Catch::Equals;
namespace fs = std::filesystem;

namespace {

using test::thread_count;

// A width-preserving layer that throws an int (not a std::exception) on its n-th forward call.
inline std::atomic<int> int_forward_calls{0};
inline int int_throw_at = -1;
struct ThrowIntHook {
  static void on_forward() {
    if (int_forward_calls.fetch_add(1) == int_throw_at) throw 42;
  }
};
using ThrowsInt = test::HookedIdentity<ThrowIntHook>;

}  // namespace

TEST_CASE("A layer throwing a non-std::exception becomes a StageError - no thread left",
          "[faults][executor]") {
  using A = Stage<Linear<8, 8>, ReLU>;
  using B = Stage<Linear<8, 8>, ThrowsInt>;
  using C = Stage<Linear<8, 4>>;
  const auto d = test::random_classification(8 * 40, 8, 4, 5);
  Pipeline<A, B, C, Latest> p(Adam{}, {.batch = 8, .micro_batches = 2});
  const Schedule s = async_1f1b(3, 2, 40);
  auto expect_stage_error = [&](auto& exec) {
    int_forward_calls = 0;
    int_throw_at = 17;  // stage 1's 18th forward: F17, mid-run
    try {
      p.train(s, d.epoch(), exec);
      FAIL("no exception");
    } catch (const StageError& e) {
      REQUIRE(e.stage() == 1);
      REQUIRE_THAT(e.what(), Contains("stage 1, action F17") && Contains("non-standard exception"));
    }
    int_throw_at = -1;
  };
  SECTION("threaded") {
    const int threads_before = thread_count();
    ThreadedExecutor exec;
    exec.wait_timeout = std::chrono::hours(1);  // the others must stop because of the failure
    expect_stage_error(exec);
    REQUIRE(thread_count() == threads_before);  // every stage thread joined
    // The pipeline is still usable: the next run trains to the end.
    REQUIRE_NOTHROW(p.train(s, d.epoch(), exec));
  }
  SECTION("reference") {
    ReferenceExecutor exec;
    expect_stage_error(exec);
    REQUIRE_NOTHROW(p.train(s, d.epoch(), exec));
  }
}

namespace {

// The oracle of weight stashing: a predictor that keeps every version ever stepped past (and
// allocates as it goes), so Backward(g) reads exactly the weights Forward(g) read, by
// construction. Stash, and DoubleBuffered where it applies, must compute the same bits.
struct AllVersions {
  static constexpr const char* name = "all-versions";
  template <class O, class B>
  class State {
   public:
    explicit State(const PredictorSetup& s)
        : fwd_version_(static_cast<std::size_t>(s.schedule->total_micro_batches()), -1) {}
    template <class Ctx>
    const float* forward_weights(const Ctx&, OptimizerState<O, B>& opt, int g) {
      fwd_version_[g] = static_cast<int>(opt.steps_taken());
      return opt.weights();
    }
    template <class Ctx>
    const float* backward_weights(const Ctx&, OptimizerState<O, B>& opt, int g) {
      const int v = fwd_version_[g];
      return v == opt.steps_taken() ? opt.weights() : history_[v].data();
    }
    void backward_done(int) {}
    template <class Ctx>
    void before_step(const Ctx&, OptimizerState<O, B>& opt) {
      history_.emplace_back(opt.weights(), opt.weights() + opt.size());  // version v at [v]
    }
    int weight_copies() const { return 1 + static_cast<int>(history_.size()); }

   private:
    std::vector<int> fwd_version_;
    std::vector<std::vector<float>> history_;
  };
};
static_assert(Predictor<AllVersions>);

// K stages of 4 -> 4 (4 classes): tiny, so a sweep over K, M and N runs in moments.
using Tiny = Stage<Linear<4, 4>>;
template <class P, class Seq>
struct UniformPipeline;
template <class P, std::size_t... I>
struct UniformPipeline<P, std::index_sequence<I...>> {
  template <std::size_t>
  using S = Tiny;
  using type = Pipeline<S<I>..., P, Adam>;
};
template <int K, class P>
using TinyPipeline = typename UniformPipeline<P, std::make_index_sequence<K>>::type;

// Weights after one epoch of N mini-batches of M rows (one row per micro-batch) under `s`.
template <int K, class P, class E = ReferenceExecutor>
std::vector<float> tiny_run(const Schedule& s, const test::LabelledData& d) {
  const int M = s.micro_batches;
  TinyPipeline<K, P> p(Adam{.lr = 1e-2f}, {.batch = M, .micro_batches = M, .seed = 7});
  const EpochData epoch{d.features().slice_rows(0, s.mini_batches * M), d.y.data()};
  E exec;
  p.train(s, epoch, exec);
  return p.weights();
}

}  // namespace

TEST_CASE("Stash and 2BW train every short epoch of async 1F1B - K and M up to 8",
          "[faults][stash]") {
  // Every mini-batch count 1 .. 3K: the schedule's start and end (fill and drain) overlap
  // when N is small, which is where a slot count read off the forwards alone fell short.
  [&]<int... Ks>(std::integer_sequence<int, Ks...>) {
    (
        [&] {
          constexpr int K = Ks + 1;
          for (int M = 1; M <= 8; ++M) {
            const auto d = test::random_classification(3 * K * M, 4, 4, 11);
            for (int N = 1; N <= 3 * K; ++N) {
              INFO("K=" << K << " M=" << M << " N=" << N);
              const Schedule s = async_1f1b(K, M, N);
              const auto oracle = tiny_run<K, AllVersions>(s, d);
              REQUIRE(tiny_run<K, Stash>(s, d) == oracle);
              if (M >= K) REQUIRE(tiny_run<K, DoubleBuffered>(pipedream_2bw(K, M, N), d) == oracle);
            }
          }
        }(),
        ...);
  }
  (std::make_integer_sequence<int, 8>{});
}

TEST_CASE("Short epochs under Stash and 2BW: threaded = reference bitwise - the oracle bites",
          "[faults][stash]") {
  const auto d = test::random_classification(4 * 4 * 3, 4, 4, 13);
  for (int N = 1; N <= 6; ++N) {
    INFO("N=" << N);
    const Schedule s1 = async_1f1b(4, 1, N);
    REQUIRE(tiny_run<4, Stash, ThreadedExecutor>(s1, d) == tiny_run<4, Stash>(s1, d));
    const Schedule s4 = pipedream_2bw(4, 4, N);
    REQUIRE(tiny_run<4, DoubleBuffered, ThreadedExecutor>(s4, d) ==
            tiny_run<4, DoubleBuffered>(s4, d));
  }
  // The sweep's oracle is not vacuous: with stale micro-batches in flight, backwards on the
  // stashed version compute other bits than backwards on the live weights.
  const Schedule s = async_1f1b(4, 1, 6);
  REQUIRE(tiny_run<4, AllVersions>(s, d) != tiny_run<4, Latest>(s, d));
}

TEST_CASE("Stash versions count the drain's steps - K = 4 - M = 1 - two mini-batches",
          "[faults][stash][staleness]") {
  // Stages 0-2 run F0 F1 B0 S0 B1 S1: at S0 micro-batch 1 is still in flight on version 0,
  // which S0 replaces, so two versions are alive, and no forward follows S0 to see them.
  // Stage 3 runs F0 B0 S0 F1 B1 S1: one version at a time.
  const Schedule s = async_1f1b(4, 1, 2);
  REQUIRE(analyze_staleness(s).stash_versions == std::vector<int>{2, 2, 2, 1});
  const auto d = test::random_classification(2, 4, 4, 17);
  TinyPipeline<4, Stash> p(Adam{}, {.batch = 1, .micro_batches = 1});
  ReferenceExecutor exec;
  p.train(s, d.epoch(), exec);
  for (int k = 0; k < 4; ++k) REQUIRE(p.weight_copies(k) == (k < 3 ? 2 : 1));
}

namespace {

// The four Fashion-MNIST files in `dir`, n = train_labels.size() images each of 28 x 28 bytes
// 0..9 repeating; the test labels are 0, 1, ..., 9, 0, ... (valid).
void write_small_fashion_mnist(const fs::path& dir, const std::vector<std::uint8_t>& train_labels) {
  const auto n = static_cast<std::uint32_t>(train_labels.size());
  auto labels_file = [&](const std::vector<std::uint8_t>& labels) {
    auto b = test::idx_bytes(0x08, {n}, 0);
    b.insert(b.end(), labels.begin(), labels.end());
    return b;
  };
  std::vector<std::uint8_t> test_labels(n);
  for (std::uint32_t i = 0; i < n; ++i) test_labels[i] = static_cast<std::uint8_t>(i % 10);
  for (const char* set : {"train", "t10k"}) {
    test::write_gz(dir / (std::string(set) + "-images-idx3-ubyte.gz"),
                   test::idx_bytes(0x08, {n, 28, 28}, std::size_t{n} * 28 * 28));
    test::write_gz(dir / (std::string(set) + "-labels-idx1-ubyte.gz"),
                   labels_file(set == std::string("train") ? train_labels : test_labels));
  }
}

// A DataError's message; "" when `f` throws nothing, "not a DataError" for anything else.
template <class F>
std::string data_error_of(F&& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  } catch (...) {
    return "not a DataError";
  }
  return "";
}

}  // namespace

TEST_CASE("Fashion-MNIST loader refuses labels outside 0..9 - naming file and index",
          "[faults][labels][data]") {
  const fs::path dir = test::scratch_dir("faults_labels");
  const std::string train_labels = (dir / "train-labels-idx1-ubyte.gz").string();
  write_small_fashion_mnist(dir, {0, 9, 3, 10});
  REQUIRE_THAT(
      data_error_of([&] { load_fashion_mnist(dir.string()); }),
      Equals("xpipe: labels file '" + train_labels + "': label 10 at index 3 is outside 0..9"));
  write_small_fashion_mnist(dir, {255, 1, 2, 3});
  REQUIRE_THAT(
      data_error_of([&] { load_fashion_mnist(dir.string()); }),
      Equals("xpipe: labels file '" + train_labels + "': label 255 at index 0 is outside 0..9"));
  // The bounds themselves are labels.
  write_small_fashion_mnist(dir, {0, 9, 9, 0});
  const DatasetPair d = load_fashion_mnist(dir.string());
  REQUIRE(d.train.labels == std::vector<std::int32_t>{0, 9, 9, 0});
  REQUIRE(d.test.labels == std::vector<std::int32_t>{0, 1, 2, 3});
  fs::remove_all(dir);
}

TEST_CASE("Pipeline::train refuses a label outside the classes before any action",
          "[faults][labels][pipeline]") {
  // 4 classes; batch 4 in M = 2 micro-batches; 41 rows = 10 mini-batches and a 1-row tail,
  // which is dropped (fewer rows than M) and so never read.
  const auto clean = test::random_classification(41, 4, 4, 19);
  const Schedule s = async_1f1b(2, 2, 10);
  for (std::int32_t bad : {4, -1, 1 << 28, -(1 << 28)}) {
    INFO("label " << bad);
    auto d = clean;
    d.y[13] = bad;
    for (bool threaded : {false, true}) {
      TinyPipeline<2, Latest> p(Adam{}, {.batch = 4, .micro_batches = 2});
      const auto before = p.weights();
      const int threads_before = thread_count();
      ThreadedExecutor thr;
      ReferenceExecutor ref;
      const std::string msg = data_error_of([&] {
        if (threaded)
          p.train(s, d.epoch(), thr);
        else
          p.train(s, d.epoch(), ref);
      });
      REQUIRE_THAT(msg, Equals("xpipe: Pipeline::train: label " + std::to_string(bad) +
                               " at row 13 (mini-batch 3) is outside 0..3"));
      REQUIRE(p.weights() == before);  // nothing ran
      REQUIRE(thread_count() == threads_before);
    }
  }
  // A bad label in the dropped tail is not read, so not refused; the edge classes train.
  auto d = clean;
  d.y[40] = 99;
  d.y[0] = 0;
  d.y[1] = 3;
  TinyPipeline<2, Latest> p(Adam{}, {.batch = 4, .micro_batches = 2});
  ReferenceExecutor exec;
  REQUIRE(p.train(s, d.epoch(), exec).samples == 40);
}

TEST_CASE("SequentialTrainer::train_step and the loss refuse labels outside the classes",
          "[faults][labels]") {
  const auto clean = test::random_classification(8, 4, 4, 23);
  for (std::int32_t bad : {4, -1, 1 << 28}) {
    INFO("label " << bad);
    auto d = clean;
    d.y[5] = bad;
    SequentialTrainer<Tiny, Adam> t(Adam{}, 8, 1);
    const std::vector<float> before(t.state().weights(), t.state().weights() + t.state().size());
    for (int chunks : {1, 2}) {
      REQUIRE_THAT(
          data_error_of([&] { t.train_step(HostContext{}, d.features(), d.y.data(), chunks); }),
          Equals("xpipe: SequentialTrainer::train_step: label " + std::to_string(bad) +
                 " at row 5 is outside 0..3"));
      // Refused before any math: no step taken, weights as they were.
      REQUIRE(t.state().steps_taken() == 0);
      REQUIRE(std::vector<float>(t.state().weights(), t.state().weights() + t.state().size()) ==
              before);
    }
    // The loss called directly checks its own rows.
    std::vector<float> logits(8 * 4, 0.5f), grad(8 * 4), row_loss(8);
    REQUIRE_THAT(data_error_of([&] {
                   SoftmaxCrossEntropy::forward_backward(HostContext{}, {logits.data(), 8, 4},
                                                         d.y.data(), 1.f / 8, {grad.data(), 8, 4},
                                                         row_loss.data());
                 }),
                 Equals("xpipe: SoftmaxCrossEntropy: label " + std::to_string(bad) +
                        " at row 5 is outside 0..3"));
  }
  SequentialTrainer<Tiny, Adam> t(Adam{}, 8, 1);
  REQUIRE_NOTHROW(t.train_step(HostContext{}, clean.features(), clean.y.data(), 2));
  REQUIRE(t.state().steps_taken() == 1);
}

namespace {

// Caps this process's address space at its present size plus `headroom` while it lives: an
// allocation of more than that fails (std::bad_alloc) instead of succeeding, so a test sees
// whether code under it tried to allocate a declared size rather than what it read.
class AddressSpaceCap {
 public:
  explicit AddressSpaceCap(std::size_t headroom) {
    REQUIRE(getrlimit(RLIMIT_AS, &old_) == 0);
    std::size_t vm_kib = 0;
    std::ifstream status("/proc/self/status");
    for (std::string key; status >> key;)
      if (key == "VmSize:") {
        status >> vm_kib;
        break;
      }
    REQUIRE(vm_kib > 0);
    const rlimit capped{vm_kib * 1024 + headroom, old_.rlim_max};
    REQUIRE(setrlimit(RLIMIT_AS, &capped) == 0);
  }
  ~AddressSpaceCap() { setrlimit(RLIMIT_AS, &old_); }
  AddressSpaceCap(const AddressSpaceCap&) = delete;
  AddressSpaceCap& operator=(const AddressSpaceCap&) = delete;

 private:
  rlimit old_{};
};

constexpr std::size_t mib = std::size_t{1} << 20;

}  // namespace

TEST_CASE("IDX reader bounds a lying header before allocating what it declares",
          "[faults][data][idx]") {
  const fs::path dir = test::scratch_dir("faults_idx");
  // Each file here is a few dozen bytes; reading one may take a 16 MiB chunk, never 1 GiB.
  SECTION("4 GiB declared: over the 1 GiB bound, refused from the header alone") {
    const fs::path p = dir / "huge-idx2-ubyte.gz";
    test::write_gz(p, test::idx_bytes(0x08, {65536, 65536}, 0));
    REQUIRE(fs::file_size(p) < 64);
    const AddressSpaceCap cap(256 * mib);
    REQUIRE_THAT(data_error_of([&] { read_idx(p.string()); }),
                 Equals("xpipe: IDX file '" + p.string() +
                        "' declares 65536 x 65536 bytes of data, more than the limit of "
                        "1073741824 (read_idx's max_data_bytes)"));
  }
  SECTION("1023 MiB declared, 10 bytes there: gzip'd and plain") {
    const auto bytes = test::idx_bytes(0x08, {1023, 1024, 1024}, 10);
    const fs::path gz = dir / "lying-idx3-ubyte.gz", plain = dir / "lying-idx3-ubyte";
    test::write_gz(gz, bytes);
    std::ofstream(plain, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    const AddressSpaceCap cap(256 * mib);
    for (const fs::path& p : {gz, plain})
      REQUIRE_THAT(data_error_of([&] { read_idx(p.string()); }),
                   Equals("xpipe: IDX file '" + p.string() +
                          "' is truncated: header declares 1072693248 bytes of data, found 10"));
  }
  SECTION("the bound is the caller's to set") {
    const fs::path p = dir / "small-idx1-ubyte.gz";
    test::write_gz(p, test::idx_bytes(0x08, {101}, 101));
    REQUIRE_THAT(data_error_of([&] { read_idx(p.string(), 100); }),
                 Contains("declares 101 bytes of data, more than the limit of 100"));
    const IdxArray a = read_idx(p.string(), 101);
    REQUIRE(a.dims == std::vector<std::uint32_t>{101});
    REQUIRE(a.data.size() == 101);
  }
  SECTION("a file over several chunks reads back whole") {
    const fs::path p = dir / "chunks-idx3-ubyte.gz";
    test::write_gz(p, test::idx_bytes(0x08, {33, 1024, 1024}, 33 * mib));  // 16 + 16 + 1 MiB
    const IdxArray a = read_idx(p.string());
    REQUIRE(a.dims == std::vector<std::uint32_t>{33, 1024, 1024});
    REQUIRE(a.data.size() == 33 * mib);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < a.data.size(); ++i) wrong += a.data[i] != i % 10;
    REQUIRE(wrong == 0);
  }
  fs::remove_all(dir);
}

TEST_CASE("IDX reader and loader refuse a FIFO or directory named like a data file",
          "[faults][data][idx]") {
  const fs::path dir = test::scratch_dir("faults_fifo");
  write_small_fashion_mnist(dir, {0, 1, 2, 3});
  const fs::path fifo = dir / "train-images-idx3-ubyte.gz";
  const fs::path folder = dir / "t10k-labels-idx1-ubyte.gz";
  fs::remove(fifo);
  fs::remove(folder);
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  fs::create_directory(folder);
  // Opening a FIFO for reading blocks until a writer comes: should the reader try, this thread
  // comes as that writer after a few seconds and leaves at once, so the test fails on the
  // message instead of hanging.
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (int tick = 0; !done; ++tick) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (tick < 60) continue;
      const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // fails unless a reader waits
      if (fd >= 0) ::close(fd);
    }
  });
  const std::string fifo_msg = data_error_of([&] { read_idx(fifo.string()); });
  const std::string load_msg = data_error_of([&] { load_fashion_mnist(dir.string()); });
  const std::string folder_msg = data_error_of([&] { read_idx(folder.string()); });
  done = true;
  writer.join();
  const std::string expect =
      "xpipe: IDX file '" + fifo.string() + "' is a FIFO, not a regular file: refusing to read it";
  REQUIRE_THAT(fifo_msg, Equals(expect));
  REQUIRE_THAT(load_msg, Equals(expect));
  REQUIRE_THAT(folder_msg, Equals("xpipe: IDX file '" + folder.string() +
                                  "' is a directory, not a regular file: refusing to read it"));
  fs::remove_all(dir);
}

// ---- Non-finite losses and inputs: named NaN or infinite, by the caller's row, and blamed on
// the data only when the data holds a NaN or an infinity.

namespace {

using NumA = Stage<Linear<8, 16>, ReLU>;
using NumB = Stage<Linear<16, 16>, ReLU>;
using NumC = Stage<Linear<16, 4>>;

// What `train` throws, as a NumericError (wrapped in a StageError by a pipeline); "" if nothing.
template <class F>
std::string numeric_error_of(F&& train) {
  try {
    train();
  } catch (const StageError& e) {
    return e.what();
  } catch (const NumericError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("A NaN input is reported by its data-set row as bad data - both executors",
          "[faults][numeric][pipeline]") {
  // Batch 16 in M = 4 micro-batches of 4 rows; row 89 = mini-batch 5, row 9 of it, so
  // micro-batch 5 * 4 + 2 = 22, its row 1. The message names row 89, not row 1.
  auto d = test::random_classification(160, 8, 4, 3);
  const Schedule s = async_1f1b(3, 4, 10);
  const std::string expected_start =
      "xpipe: stage 2, action F22: xpipe: loss is NaN at row 89 "
      "(mini-batch 5): input row 89 holds NaN (column 3): bad data, "
      "not divergence";
  d.x[89 * 8 + 3] = std::nanf("");
  auto run = [&](auto& exec) {
    Pipeline<NumA, NumB, NumC, Latest> p(Adam{}, {.batch = 16, .micro_batches = 4});
    return numeric_error_of([&] { p.train(s, d.epoch(), exec); });
  };
  ReferenceExecutor ref;
  REQUIRE_THAT(run(ref), Equals(expected_start));
  ThreadedExecutor threaded;
  REQUIRE_THAT(run(threaded), Equals(expected_start));
  // An infinity is bad data too, named by its sign.
  d.x[89 * 8 + 3] = -std::numeric_limits<float>::infinity();
  const std::string inf = run(ref);
  REQUIRE_THAT(inf, Contains("at row 89 (mini-batch 5)") && Contains("holds -inf (column 3)") &&
                        Contains("bad data, not divergence"));

  // SequentialTrainer names the row of the batch it was given (chunk 2 of 2: rows 8..15).
  using Model = Stage<Linear<8, 4>>;
  SequentialTrainer<Model, SGD> t(SGD{.lr = 0.1f}, 16, 1);
  d.x[89 * 8 + 3] = 0.f;
  d.x[12 * 8 + 5] = std::nanf("");
  REQUIRE_THAT(
      numeric_error_of([&] { t.train_step({}, d.features().slice_rows(0, 16), d.y.data(), 2); }),
      Equals("xpipe: loss is NaN at row 12: input row 12 holds NaN (column 5): bad data, "
             "not divergence"));
}

TEST_CASE("A diverging run (huge learning rate) is named divergence, not bad data",
          "[faults][numeric][pipeline]") {
  const auto d = test::random_classification(160, 8, 4, 3);
  Pipeline<NumA, NumB, NumC, Latest, SGD> p(SGD{.lr = 1e12f}, {.batch = 16, .micro_batches = 4});
  const Schedule s = async_1f1b(3, 4, 10);
  ReferenceExecutor exec;
  std::string what;
  for (int epoch = 0; epoch < 20 && what.empty(); ++epoch)
    what = numeric_error_of([&] { p.train(s, d.epoch(), exec); });
  REQUIRE_THAT(what, Contains("loss is") && Contains("the inputs are finite, so training diverged "
                                                     "(lower the learning rate?)"));
  REQUIRE_THAT(what, !Contains("bad data"));
}

TEST_CASE("A +inf logit makes the loss infinite, not NaN, and it is named infinite",
          "[faults][numeric]") {
  // Kernel: the label's probability under a +inf logit elsewhere is 0, so its loss is +inf;
  // inf - inf once made it NaN. A NaN logit still gives NaN.
  const HostContext ctx{};
  std::vector<float> logits{std::numeric_limits<float>::infinity(), 0.f, 1.f}, grad(3);
  const std::int32_t label = 1;
  float loss = 0;
  SoftmaxCrossEntropy::forward_backward(ctx, {logits.data(), 1, 3}, &label, 1.f,
                                        {grad.data(), 1, 3}, &loss);
  REQUIRE(std::isinf(loss));
  REQUIRE(loss > 0);
  REQUIRE_THROWS_WITH(sum_row_losses(&loss, 1), Contains("loss is infinite at row 0"));
  logits[2] = std::nanf("");
  SoftmaxCrossEntropy::forward_backward(ctx, {logits.data(), 1, 3}, &label, 1.f,
                                        {grad.data(), 1, 3}, &loss);
  REQUIRE(std::isnan(loss));

  // Training: finite inputs whose logit overflows float (1e10 * 1e30): infinite, and the
  // inputs are finite, so it is divergence.
  using Model = Stage<Linear<2, 2>>;
  SequentialTrainer<Model, SGD> t(SGD{.lr = 0.1f}, 2, 1);
  std::fill_n(t.state().weights(), Model::param_count, 0.f);
  t.state().weights()[0] = 1e30f;  // input 0 -> class 0
  std::vector<float> x{0.f, 1.f, 1e10f, 0.f};
  std::vector<std::int32_t> y{0, 1};
  try {
    t.train_step(ctx, {x.data(), 2, 2}, y.data());
    FAIL("no exception");
  } catch (const NumericError& e) {
    REQUIRE_THAT(e.what(), Contains("loss is infinite at row 1") && Contains("inputs are finite") &&
                               Contains("diverged"));
  }
  REQUIRE(t.state().steps_taken() == 0);
}

TEST_CASE("Constant images are valid data: loaded finite and trained without a NaN",
          "[faults][numeric][data]") {
  // Every pixel of every image 77: the variance is 0, and 1 / sqrt(0) made every pixel NaN.
  const fs::path dir = test::scratch_dir("faults_constant");
  const std::uint32_t n = 64;
  for (const char* set : {"train", "t10k"}) {
    auto images = test::idx_bytes(0x08, {n, 28, 28}, 0);
    images.insert(images.end(), std::size_t{n} * 28 * 28, 77);
    test::write_gz(dir / (std::string(set) + "-images-idx3-ubyte.gz"), images);
    test::write_gz(dir / (std::string(set) + "-labels-idx1-ubyte.gz"),
                   test::idx_bytes(0x08, {n}, n));
  }
  const DatasetPair data = load_fashion_mnist(dir.string());
  fs::remove_all(dir);
  REQUIRE(std::all_of(data.train.features.begin(), data.train.features.end(),
                      [](float v) { return v == 0.f; }));
  using Model = Stage<Linear<784, 10>>;
  const HostContext ctx{};
  SequentialTrainer<Model, Adam> t(Adam{}, 16, 1);
  Batcher b(data.train, 16, 1);
  REQUIRE(std::isfinite(t.train_epoch(ctx, b, 0)));
  REQUIRE(t.evaluate(ctx, data.test) >= 0);

  // Constant rows handed to a pipeline directly train to a finite loss too.
  auto d = test::random_classification(160, 8, 4, 3);
  std::fill(d.x.begin(), d.x.end(), 0.5f);
  Pipeline<NumA, NumB, NumC, Latest> p(Adam{}, {.batch = 16, .micro_batches = 4});
  ThreadedExecutor exec;
  REQUIRE(std::isfinite(p.train(async_1f1b(3, 4, 10), d.epoch(), exec).loss));
}

TEST_CASE("evaluate refuses a NaN or infinite input, naming its row",
          "[faults][numeric][pipeline]") {
  Dataset data;
  data.count = 40;
  data.width = 8;
  data.classes = 4;
  data.features = HostBuffer<float>(40 * 8);
  std::fill(data.features.begin(), data.features.end(), 0.25f);
  data.labels.assign(40, 1);
  Pipeline<NumA, NumB, NumC, Latest> p(Adam{}, {.batch = 16, .micro_batches = 4});
  REQUIRE(p.evaluate(data) >= 0);
  data.features[33 * 8 + 2] = std::nanf("");
  data.features[35 * 8] = std::numeric_limits<float>::infinity();
  REQUIRE_THAT(data_error_of([&] { p.evaluate(data); }),
               Equals("xpipe: Pipeline::evaluate: input row 33 holds NaN (column 2): bad data"));
  using Model = Stage<Linear<8, 4>>;
  SequentialTrainer<Model, SGD> t(SGD{}, 16, 1);
  data.features[33 * 8 + 2] = 0.f;
  REQUIRE_THAT(
      data_error_of([&] { t.evaluate({}, data); }),
      Equals("xpipe: SequentialTrainer::evaluate: input row 35 holds +inf (column 0): bad data"));
}

namespace {

// The layer of every stage of the wait tests; only stage `slow_stage` is slow: each of its
// forwards sleeps `slow_each`; its forward number `stuck_at` sleeps 2 s (far past the tests'
// 0.3 s timeout, bounded so the run ends); its forward number `jump_at` moves `test_clock` on
// by ten minutes halfway through a 0.1 s sleep, as a process stopped that long would see it;
// its forward number `signal_at` writes a byte to `signal_fd` (a child that stops this process
// waits on it) and then burns `signal_busy` of CPU time, inside which the stop lands.
inline int slow_stage = 2;
inline std::atomic<int> slow_calls{0};
inline std::chrono::duration<double> slow_each{0}, busy_each{0};
inline int stuck_at = -1, jump_at = -1, signal_at = -1, signal_fd = -1;
inline std::chrono::duration<double> signal_busy{0};
inline std::atomic<std::int64_t> clock_offset_ns{0};
inline std::atomic<long> clock_reads{0};

// Keeps this thread busy for `d` of its own CPU time: unlike a sleep, it is not over when a
// stopped process resumes.
void burn_cpu(std::chrono::duration<double> d) {
  const auto cpu = [] {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  };
  for (const double end = cpu() + d.count(); cpu() < end;) {
  }
}

std::chrono::steady_clock::time_point test_clock() {
  clock_reads.fetch_add(1, std::memory_order_relaxed);
  return std::chrono::steady_clock::now() + std::chrono::nanoseconds(clock_offset_ns.load());
}

template <int K>
struct SlowHook {
  static void on_forward() {
    if (K != slow_stage) return;
    const int n = slow_calls.fetch_add(1);
    std::this_thread::sleep_for(slow_each);
    burn_cpu(busy_each);
    if (n == stuck_at) std::this_thread::sleep_for(std::chrono::seconds(2));
    if (n == jump_at) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      clock_offset_ns += std::chrono::nanoseconds(std::chrono::minutes(10)).count();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (n == signal_at) {
      const char byte = 1;
      // No REQUIRE off the main thread: a failed write leaves the child waiting for the
      // pipe's close, the stop never comes, and the control below fails.
      [[maybe_unused]] const bool written = write(signal_fd, &byte, 1) == 1;
      burn_cpu(signal_busy);
    }
  }
};
template <int K>
using SlowAt = test::HookedIdentity<SlowHook<K>>;

using WaitPipeline =
    Pipeline<Stage<Linear<8, 8>, SlowAt<0>>, Stage<Linear<8, 8>, SlowAt<1>>,
             Stage<Linear<8, 8>, SlowAt<2>>, Stage<Linear<8, 4>, SlowAt<3>>, Latest>;

void reset_slow() {
  slow_stage = 2;
  slow_calls = 0;
  slow_each = busy_each = std::chrono::duration<double>(0);
  stuck_at = jump_at = signal_at = signal_fd = -1;
  signal_busy = std::chrono::duration<double>(0);
}

}  // namespace

TEST_CASE("consumer_stage mirrors producer_stage: F downstream, B upstream, ends have none",
          "[faults][executor]") {
  STATIC_REQUIRE(consumer_stage(4, 1, Action{ActionKind::Forward, 0}) == 2);
  STATIC_REQUIRE(consumer_stage(4, 1, Action{ActionKind::Backward, 0}) == 0);
  STATIC_REQUIRE(consumer_stage(4, 3, Action{ActionKind::Forward, 0}) == -1);
  STATIC_REQUIRE(consumer_stage(4, 0, Action{ActionKind::Backward, 0}) == -1);
  STATIC_REQUIRE(producer_stage(4, 2, Action{ActionKind::Forward, 0}) == 1);
  STATIC_REQUIRE(producer_stage(4, 2, Action{ActionKind::Backward, 0}) == 3);
}

TEST_CASE("A stuck stage's neighbours time out naming the stuck stage, not themselves",
          "[faults][executor]") {
  const auto d = test::random_classification(8 * 40, 8, 4, 5);
  WaitPipeline p(Adam{}, {.batch = 8, .micro_batches = 2});
  const int threads_before = thread_count();
  ThreadedExecutor exec;
  exec.wait_timeout = std::chrono::milliseconds(300);
  // Each stage stuck in its F10, mid-run: its neighbours wait on it directly, the stages past
  // them through the neighbours; whichever gives up first must name the stuck stage.
  for (int k = 0; k < 4; ++k) {
    INFO("stage " << k << " stuck");
    reset_slow();
    slow_stage = k;
    stuck_at = 10;
    try {
      p.train(async_1f1b(4, 2, 40), d.epoch(), exec);
      FAIL("no exception");
    } catch (const StageError& e) {
      INFO(e.what());
      const std::string stage = "stage " + std::to_string(k);
      REQUIRE(e.stage() == k);
      REQUIRE_THAT(e.what(),
                   Contains("xpipe: " + stage + ", action F10: " + stage + " is late: stage ") &&
                       Contains("waited 0.3 s for ") &&
                       Contains(stage + " is running F10, action "));
    }
    REQUIRE(thread_count() == threads_before);
  }
  reset_slow();
  REQUIRE_NOTHROW(p.train(async_1f1b(4, 2, 40), d.epoch(), exec));  // still usable
}

TEST_CASE("Under virtual stages the late stage is found through the worker that runs it",
          "[faults][executor][workers]") {
  // Worker 1 runs stages 1, 2 and 3 and sticks in stage 2's F0 (2 s). Stage 0 waits for its
  // B0's input from stage 1, which shows as waiting (its F0 is done) but cannot move: its worker
  // is inside stage 2's forward. The error must name stage 2, not stage 1.
  const auto d = test::random_classification(8, 8, 4, 5);
  WaitPipeline p(Adam{}, {.batch = 8, .micro_batches = 1});
  const Schedule s = parse_schedule(
      "xpipe-schedule stages=4 workers=2 micro_batches=1 mini_batches=1\n"
      "0: F0@s0 B0@s0 S0@s0\n"
      "1: F0@s1 F0@s2 F0@s3 B0@s3 B0@s2 B0@s1 S0@s1 S0@s2 S0@s3\n");
  reset_slow();
  slow_stage = 2;
  stuck_at = 0;
  ThreadedExecutor exec;
  exec.wait_timeout = std::chrono::milliseconds(300);
  try {
    p.train(s, d.epoch(), exec);
    FAIL("no exception");
  } catch (const StageError& e) {
    INFO(e.what());
    REQUIRE(e.stage() == 2);
    REQUIRE_THAT(e.what(), Contains("stage 2 is late: stage 0 waited 0.3 s for the input of its "
                                    "B0 (stage 1 waits on stage 2 (its worker's); stage 2 is "
                                    "running F0, action 1 of 3)"));
  }
  reset_slow();
}

TEST_CASE("A slow stage that keeps making progress never times out its neighbours",
          "[faults][executor]") {
  const auto d = test::random_classification(8 * 30, 8, 4, 5);
  WaitPipeline p(Adam{}, {.batch = 8, .micro_batches = 2});
  reset_slow();
  slow_each = std::chrono::milliseconds(50);  // 60 forwards: 3 s, ten times the timeout
  ThreadedExecutor exec;
  exec.wait_timeout = std::chrono::milliseconds(300);
  REQUIRE_NOTHROW(p.train(async_1f1b(4, 2, 30), d.epoch(), exec));
  REQUIRE(slow_calls == 60);
  reset_slow();
}

TEST_CASE("A clock jump of minutes (a stopped process) counts as at most max_clock_step",
          "[faults][executor]") {
  const auto d = test::random_classification(8 * 20, 8, 4, 5);
  WaitPipeline p(Adam{}, {.batch = 8, .micro_batches = 2});
  reset_slow();
  jump_at = 7;  // mid-run, while the other stages wait on stage 2
  clock_offset_ns = 0;
  clock_reads = 0;
  ThreadedExecutor exec;
  exec.wait_timeout = std::chrono::milliseconds(300);
  exec.clock = &test_clock;
  REQUIRE_NOTHROW(p.train(async_1f1b(4, 2, 20), d.epoch(), exec));
  REQUIRE(clock_offset_ns > 0);  // the jump happened ...
  REQUIRE(clock_reads > 0);      // ... and the waits read the clock that jumped
  // The control: counting wall time (a clock step of an hour), the same jump fails the run.
  reset_slow();
  jump_at = 7;
  exec.max_clock_step = std::chrono::hours(1);
  REQUIRE_THROWS_WITH(p.train(async_1f1b(4, 2, 20), d.epoch(), exec), Contains("is late"));
  reset_slow();
}

TEST_CASE("A process stopped by SIGSTOP for longer than the timeout goes on after SIGCONT",
          "[faults][executor]") {
  const auto d = test::random_classification(8 * 12, 8, 4, 5);
  WaitPipeline p(Adam{}, {.batch = 8, .micro_batches = 2});
  reset_slow();
  // 24 forwards of 50 ms CPU time each: over a second, the others waiting on stage 2.
  busy_each = std::chrono::milliseconds(50);
  ThreadedExecutor exec;
  // 1 s: a stage starved of the CPU by a loaded machine (CI runs tests in parallel) must not
  // pass for late; 0.5 s failed once under a load of 9 on 2 cores.
  exec.wait_timeout = std::chrono::milliseconds(1000);
  // A child that stops this process for 2.5 s (2.5 times the timeout) and then continues it; it
  // only reads, sleeps and signals (async-signal-safe after fork). With `signal_at` unset it
  // stops the run 0.5 s in; else when stage 2 writes to the pipe at its forward `signal_at`,
  // 0.2 s into that forward's burn. A run that never writes (or ends first) closes the pipe,
  // and the child leaves without stopping anything.
  const auto stopped_run = [&] {
    int pipe_fds[2];
    REQUIRE(pipe(pipe_fds) == 0);
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      close(pipe_fds[1]);
      char byte = 0;
      const bool signalled = signal_at >= 0;
      if (!signalled || read(pipe_fds[0], &byte, 1) == 1) {
        const timespec before{0, signalled ? 200'000'000 : 500'000'000}, stopped{2, 500'000'000};
        nanosleep(&before, nullptr);
        kill(getppid(), SIGSTOP);
        nanosleep(&stopped, nullptr);
        kill(getppid(), SIGCONT);
      }
      _exit(0);
    }
    close(pipe_fds[0]);
    signal_fd = pipe_fds[1];
    std::string error;
    try {
      p.train(async_1f1b(4, 2, 12), d.epoch(), exec);
    } catch (const StageError& e) {
      error = e.what();
    }
    close(pipe_fds[1]);
    signal_fd = -1;
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    REQUIRE(WIFEXITED(status));
    return error;
  };
  REQUIRE(stopped_run() == "");
  // The control: counting wall time (a clock step of an hour), a stop fails the run. A stop
  // counts only while no stage moves (any action begun or ended restarts a wait), so this one
  // lands where none can: 0.2 s into a forward of stage 2 that burns 0.4 s of CPU, when every
  // other stage has long been waiting on it. (A stop at a fixed time can catch a stage inside
  // a short action that ends after SIGCONT, before the waiting stages read the clock.)
  exec.max_clock_step = std::chrono::hours(1);
  slow_calls = 0;
  signal_at = 6;
  signal_busy = std::chrono::milliseconds(400);
  REQUIRE_THAT(stopped_run(), Contains("is late"));
  reset_slow();
}

namespace {

// The CPU each stage's last forward ran on (pinning moves a thread just after it starts).
inline std::atomic<int> last_cpu[4] = {-1, -1, -1, -1};
template <int K>
struct CpuHook {
  static void on_forward() { last_cpu[K].store(sched_getcpu()); }
};
template <int K>
using CpuAt = test::HookedIdentity<CpuHook<K>>;
using CpuPipeline = Pipeline<Stage<Linear<8, 8>, CpuAt<0>>, Stage<Linear<8, 8>, CpuAt<1>>,
                             Stage<Linear<8, 8>, CpuAt<2>>, Stage<Linear<8, 4>, CpuAt<3>>, Latest>;

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof(set), &set) == 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

}  // namespace

TEST_CASE("Pinned stage threads run on their CPUs with the same bits, a bad CPU is named",
          "[faults][executor]") {
  const auto d = test::random_classification(8 * 20, 8, 4, 5);
  std::vector<int> cpus = allowed_cpus();
  REQUIRE(!cpus.empty());
  if (cpus.size() > 2) cpus.resize(2);
  CpuPipeline ref(Adam{}, {.batch = 8, .micro_batches = 2});
  ReferenceExecutor reference;
  ref.train(async_1f1b(4, 2, 20), d.epoch(), reference);
  CpuPipeline pinned(Adam{}, {.batch = 8, .micro_batches = 2});
  ThreadedExecutor exec;
  exec.cpus = cpus;
  pinned.train(async_1f1b(4, 2, 20), d.epoch(), exec);
  REQUIRE(pinned.weights() == ref.weights());
  for (int k = 0; k < 4; ++k) {
    INFO("stage " << k);
    REQUIRE(last_cpu[k].load() == cpus[static_cast<std::size_t>(k) % cpus.size()]);
  }
  const int threads_before = thread_count();
  for (int bad : {-1, CPU_SETSIZE + 5}) {
    exec.cpus = {cpus[0], bad};
    const auto before = pinned.weights();
    REQUIRE_THROWS_MATCHES(
        pinned.train(async_1f1b(4, 2, 20), d.epoch(), exec), ConfigError,
        Catch::Matchers::Message("xpipe: ThreadedExecutor: cannot pin stage 1 to CPU " +
                                 std::to_string(bad) + " (not a CPU this process may run on)"));
    REQUIRE(pinned.weights() == before);  // refused before any stage started
  }
  REQUIRE(thread_count() == threads_before);
}
