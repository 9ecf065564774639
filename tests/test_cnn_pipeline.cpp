// A small CNN (convolution, BatchNorm, a residual block, pooling) through the pipeline: GPipe and
// 1F1B-flush = sequential training bitwise, weights and running statistics; threaded = reference
// for async remedies; checkpoints keep the BatchNorm state; a NaN reaches BatchNorm named.
#include <catch2/catch.hpp>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "support/support.hpp"
#include "xpipe/xpipe.hpp"

using namespace xpipe;
using Catch::Contains;

namespace {

constexpr ConvOptions same{.padding = 1};
using Img4 = Shape<4, 8, 8>;
using Conv4 = Conv2d<Img4, 4, 3, same>;
using Block = Residual<Conv4, BatchNorm2d<Img4>, ReLU, Conv4, BatchNorm2d<Img4>>;
using S0 = Stage<Conv2d<Shape<1, 8, 8>, 4, 3, same>, BatchNorm2d<Img4>, ReLU>;
using S1 = Stage<Block, ReLU>;
using S2 = Stage<MaxPool2d<Img4, 2>, Flatten<Shape<4, 4, 4>>, Linear<64, 4>>;
// The three stages as one: its flat parameters and state are theirs end to end (every layer's
// block starts on a 16-float boundary in both).
using Whole = Stage<Conv2d<Shape<1, 8, 8>, 4, 3, same>, BatchNorm2d<Img4>, ReLU, Block, ReLU,
                    MaxPool2d<Img4, 2>, Flatten<Shape<4, 4, 4>>, Linear<64, 4>>;
static_assert(Whole::param_count == S0::param_count + S1::param_count + S2::param_count);
static_assert(Whole::state_count == S0::state_count + S1::state_count + S2::state_count);

using Data = test::LabelledData;
Data make_data() {
  return test::random_classification(96, 64, 4, 5);
}

struct Trained {
  std::vector<float> weights, state;
};

Trained sequential(const Data& d, int chunks) {
  SequentialTrainer<Whole, Adam> t(Adam{}, 16, 3);
  for (index_t first = 0; first + 16 <= d.rows; first += 16)
    t.train_step(HostContext{}, {d.x.data() + first * 64, 16, 64}, d.y.data() + first, chunks);
  const auto w = t.state().weights();
  const auto s = t.running_state();
  return {{w, w + Whole::param_count}, {s.begin(), s.end()}};
}

template <class P, class E>
Trained pipelined(const Schedule& s, const Data& d, E&& exec, P pred = {}) {
  Pipeline<S0, S1, S2, P, Adam> p(Adam{},
                                  {.batch = 16, .micro_batches = s.micro_batches, .seed = 3}, pred);
  p.train(s, d.epoch(), exec);
  return {p.weights(), p.running_state()};
}

}  // namespace

TEST_CASE("A CNN with BatchNorm: GPipe and 1F1B-flush equal sequential training bitwise",
          "[pipeline][oracle][cnn]") {
  const Data d = make_data();
  const Trained want = sequential(d, 2);
  REQUIRE(want.state.size() == static_cast<std::size_t>(Whole::state_count));
  ReferenceExecutor ref;
  for (const Schedule& s : {gpipe(3, 2, 6), one_f_one_b_flush(3, 2, 6)}) {
    INFO(s.name);
    const Trained got = pipelined<Latest>(s, d, ref);
    REQUIRE(got.weights == want.weights);
    // The running statistics move in the same order (each micro-batch's forward, in turn).
    REQUIRE(got.state == want.state);
  }
  // One chunk (BatchNorm over all 16 rows) normalises differently: the oracle can fail.
  REQUIRE(sequential(d, 1).state != want.state);
}

TEST_CASE("A CNN with BatchNorm: threaded = reference bitwise for async remedies",
          "[pipeline][oracle][cnn]") {
  const Data d = make_data();
  const Schedule s = async_1f1b(3, 2, 6);
  ReferenceExecutor ref;
  ThreadedExecutor thr;
  for (const char* name : {"latest", "stash", "xpipe", "pipenag"}) {
    INFO(name);
    const AnyPredictor pred = make_predictor(name);
    const Trained a = pipelined<AnyPredictor>(s, d, ref, pred);
    const Trained b = pipelined<AnyPredictor>(s, d, thr, pred);
    REQUIRE(a.weights == b.weights);
    REQUIRE(a.state == b.state);
    REQUIRE(a.state != std::vector<float>(a.state.size(), 0.f));
  }
}

TEST_CASE("A CNN's checkpoint keeps its BatchNorm state and refuses another model",
          "[pipeline][checkpoint][cnn]") {
  const Data d = make_data();
  const Schedule s = async_1f1b(3, 2, 6);
  ReferenceExecutor ref;
  const std::filesystem::path root = test::scratch_dir("cnn-checkpoint");
  std::filesystem::remove_all(root);
  Pipeline<S0, S1, S2, XPipe, Adam> a(Adam{}, {.batch = 16, .micro_batches = 2, .seed = 3});
  a.train(s, d.epoch(), ref);
  save_checkpoint(a, root, "ckpt-1");
  const CheckpointContents c = read_checkpoint(root / "ckpt-1");
  Pipeline<S0, S1, S2, XPipe, Adam> b(Adam{}, {.batch = 16, .micro_batches = 2, .seed = 3});
  REQUIRE(b.running_state() != a.running_state());
  load_checkpoint(b, c);
  REQUIRE(b.weights() == a.weights());
  REQUIRE(b.running_state() == a.running_state());
  // Both go on alike: the state, not just the weights, came back.
  a.train(s, d.epoch(), ref);
  b.train(s, d.epoch(), ref);
  REQUIRE(b.weights() == a.weights());
  // Evaluation reads the running statistics: the same on both.
  Dataset test_set;
  test_set.count = d.rows;
  test_set.width = 64;
  test_set.classes = 4;
  test_set.features = HostBuffer<float>(d.rows * 64);
  std::copy(d.x.begin(), d.x.end(), test_set.features.data());
  test_set.labels = d.y;
  REQUIRE(b.evaluate(test_set) == a.evaluate(test_set));

  using M0 = Stage<Linear<64, 16>, ReLU>;
  using M1 = Stage<Linear<16, 16>, ReLU>;
  using M2 = Stage<Linear<16, 4>>;
  Pipeline<M0, M1, M2, XPipe, Adam> mlp(Adam{}, {.batch = 16, .micro_batches = 2, .seed = 3});
  REQUIRE_THROWS_WITH(load_checkpoint(mlp, c), Contains("field 'pipeline.stage-0.params'"));
}

TEST_CASE("A NaN reaching BatchNorm stops the pipeline naming stage, action, channel and row",
          "[pipeline][cnn][faults]") {
  Data d = make_data();
  d.x[5 * 64 + 10] = std::numeric_limits<float>::quiet_NaN();  // row 5, pixel 10
  Pipeline<S0, S1, S2, XPipe, Adam> p(Adam{}, {.batch = 16, .micro_batches = 2, .seed = 3});
  ThreadedExecutor thr;
  REQUIRE_THROWS_MATCHES(p.train(async_1f1b(3, 2, 6), d.epoch(), thr), StageError,
                         Catch::Matchers::Predicate<StageError>([](const StageError& e) {
                           const std::string w = e.what();
                           return e.stage() == 0 && w.find("action F0") != std::string::npos &&
                                  w.find("BatchNorm2d<Shape<4, 8, 8>>") != std::string::npos &&
                                  w.find("row 5 of the micro-batch") != std::string::npos;
                         }));
}
