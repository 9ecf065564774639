// Rows kept together in groups (a sequence's tokens) through batching and micro-batching, and
// the GPT model (models/gpt.hpp) through the pipeline: the oracles of the MLP and the CNNs
// (sequential = GPipe, threaded = reference, split backward), on a small configuration.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <utility>
#include <vector>

#include "support/emulated_device.hpp"
#include "support/support.hpp"
#include "xpipe/models/gpt.hpp"
#include "xpipe/pipeline/replicas.hpp"
#include "xpipe/xpipe.hpp"

using namespace xpipe;

TEST_CASE("Batch and micro-batch splits keep groups of rows whole (worked by hand)", "[gpt]") {
  // 12 rows in groups of 4 into 2 parts: 3 groups, the first part one group larger.
  CHECK(split_rows(12, 2, 0, 4) == RowRange{0, 8});
  CHECK(split_rows(12, 2, 1, 4) == RowRange{8, 4});
  // Without groups, the rule every MLP run has used: 10 rows into 3 parts of 4, 3, 3.
  CHECK(split_rows(10, 3, 0) == RowRange{0, 4});
  CHECK(split_rows(10, 3, 2) == RowRange{7, 3});

  // 28 rows, mini-batches of 12 (3 groups of 4), M = 2: two full mini-batches and a tail of one
  // group, too few for 2 micro-batches, dropped.
  MicroBatching m{.batch = 12, .micro_batches = 2, .rows = 28, .group = 4};
  CHECK(m.mini_batches() == 2);
  CHECK(m.micro_batch(0) == RowRange{0, 8});
  CHECK(m.micro_batch(1) == RowRange{8, 4});
  CHECK(m.micro_batch(2) == RowRange{12, 8});
  CHECK(m.micro_batch(3) == RowRange{20, 4});
  CHECK(m.max_micro_rows() == 8);
  // 32 rows: a tail of two groups makes a third, short mini-batch of one group per micro-batch.
  m.rows = 32;
  CHECK(m.mini_batches() == 3);
  CHECK(m.micro_batch(4) == RowRange{24, 4});
  CHECK(m.micro_batch(5) == RowRange{28, 4});

  // Two replicas of a mini-batch of 16 rows in groups of 4, M = 1: two groups each.
  CHECK(replica_rows(16, 16, 1, 2, 0, 4) == std::vector<index_t>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(replica_rows(16, 16, 1, 2, 1, 4) == std::vector<index_t>{8, 9, 10, 11, 12, 13, 14, 15});
}

namespace {
// `groups` groups of `group` rows, feature and label the row's index.
Dataset numbered_rows(index_t groups, index_t group) {
  Dataset d;
  d.count = groups * group;
  d.width = 1;
  d.classes = static_cast<int>(d.count);
  d.group = group;
  d.features = HostBuffer<float>(d.count);
  for (index_t r = 0; r < d.count; ++r) {
    d.features[r] = static_cast<float>(r);
    d.labels.push_back(static_cast<std::int32_t>(r));
  }
  return d;
}
}  // namespace

TEST_CASE("Batcher shuffles whole groups, each kept in order", "[gpt][data]") {
  const Dataset d = numbered_rows(5, 3);
  Batcher b(d, 6, 7);
  std::vector<float> x(6);
  std::vector<std::int32_t> y(6);
  bool moved = false;
  for (std::uint64_t epoch = 0; epoch < 4; ++epoch) {
    b.start_epoch(epoch);
    std::vector<index_t> sizes;
    std::set<int> firsts;
    while (const index_t n = b.next({x.data(), 6, 1}, y.data())) {
      sizes.push_back(n);
      for (index_t r = 0; r < n; r += 3) {
        INFO("epoch " << epoch << ", batch row " << r);
        REQUIRE(y[r] % 3 == 0);  // a group starts at a multiple of 3
        REQUIRE(y[r + 1] == y[r] + 1);
        REQUIRE(y[r + 2] == y[r] + 2);
        REQUIRE(x[r + 2] == static_cast<float>(y[r + 2]));
        firsts.insert(y[r]);
      }
    }
    CHECK(sizes == std::vector<index_t>{6, 6, 3});
    CHECK(firsts == std::set<int>{0, 3, 6, 9, 12});
    b.start_epoch(epoch);
    b.next({x.data(), 6, 1}, y.data());
    moved = moved || y[0] != 0 || y[3] != 3;
  }
  CHECK(moved);  // some epoch's order is not the stored one

  Dataset cut = head(d, 8);  // rounded down to whole groups
  CHECK(cut.count == 6);
  CHECK(cut.group == 3);

  CHECK_THROWS_WITH(Batcher(d, 4, 1), Catch::Contains("batch size 4 is not a whole number of "
                                                      "the data set's groups of 3 rows"));
  Dataset ragged = numbered_rows(2, 3);
  ragged.group = 4;
  CHECK_THROWS_WITH(Batcher(ragged, 4, 1),
                    Catch::Contains("the data set's 6 rows are not whole groups of 4"));
}

namespace {

// A GPT small enough for a unit test: width 16, 2 heads, sequences of 4 tokens, 8 blocks.
using Tiny = models::gpt::Gpt<16, 2, 4>;
constexpr index_t context = 4;
static_assert(Tiny::K1::row_group == context);
static_assert(Tiny::K1::param_count == Tiny::K2a::param_count + Tiny::K2b::param_count);

// `seqs` random byte sequences of `context` tokens: rows (token id, position), each labelled with
// the next token of its sequence.
test::LabelledData random_text(index_t seqs, std::uint64_t seed) {
  test::LabelledData d{std::vector<float>(static_cast<std::size_t>(seqs * context * 2)),
                       std::vector<std::int32_t>(static_cast<std::size_t>(seqs * context)),
                       seqs * context, 2};
  Rng rng{seed};
  for (index_t s = 0; s < seqs; ++s) {
    std::vector<int> bytes(context + 1);
    for (int& b : bytes) b = static_cast<int>(rng.below(models::gpt::vocab));
    for (index_t t = 0; t < context; ++t) {
      const index_t r = s * context + t;
      d.x[static_cast<std::size_t>(2 * r)] = static_cast<float>(bytes[t]);
      d.x[static_cast<std::size_t>(2 * r + 1)] = static_cast<float>(t);
      d.y[static_cast<std::size_t>(r)] = bytes[t + 1];
    }
  }
  return d;
}

constexpr index_t batch = 4 * context;  // 4 sequences

// The rows of `d` as a data set of whole sequences (what an evaluation reads).
Dataset as_dataset(const test::LabelledData& d) {
  Dataset held;
  held.count = d.rows;
  held.width = 2;
  held.classes = models::gpt::vocab;
  held.group = context;
  held.features = HostBuffer<float>(d.rows * 2);
  std::copy(d.x.begin(), d.x.end(), held.features.data());
  held.labels = d.y;
  return held;
}

std::vector<float> sequential(const test::LabelledData& d, int chunks) {
  SequentialTrainer<Tiny::K1, Adam> t(Adam{}, batch, 3);
  for (index_t first = 0; first + batch <= d.rows; first += batch)
    t.train_step(HostContext{}, {d.x.data() + first * 2, batch, 2}, d.y.data() + first, chunks);
  const float* w = t.state().weights();
  return {w, w + Tiny::K1::param_count};
}

template <class P, class E>
std::vector<float> pipelined(const Schedule& s, const test::LabelledData& d, E&& exec,
                             P pred = {}) {
  Pipeline<Tiny::K2a, Tiny::K2b, P, Adam> p(
      Adam{}, {.batch = batch, .micro_batches = s.micro_batches, .seed = 3}, pred);
  p.train(s, d.epoch(), exec);
  return p.weights();
}

}  // namespace

TEST_CASE("A GPT: GPipe, 1F1B-flush and ZB-H1 equal sequential training bitwise",
          "[gpt][pipeline][oracle]") {
  const test::LabelledData d = random_text(12, 5);  // 3 mini-batches of 4 sequences
  const std::vector<float> want = sequential(d, 2);
  ReferenceExecutor ref;
  ThreadedExecutor thr;
  for (const Schedule& s : {gpipe(2, 2, 3), one_f_one_b_flush(2, 2, 3), zb_h1(2, 2, 3)}) {
    INFO(s.name);
    REQUIRE(pipelined<Latest>(s, d, ref) == want);
    REQUIRE(pipelined<Latest>(s, d, thr) == want);
  }
  // Micro-batches of whole sequences are what makes it exact: one chunk differs (other sums).
  REQUIRE(sequential(d, 1) != want);
}

TEST_CASE("A GPT pipeline reports each stage's slots and its one workspace",
          "[gpt][pipeline][workspace]") {
  const test::LabelledData d = random_text(12, 5);
  Pipeline<Tiny::K2a, Tiny::K2b, Latest, Adam> p(Adam{},
                                                 {.batch = batch, .micro_batches = 2, .seed = 3});
  ReferenceExecutor ref;
  p.train(gpipe(2, 2, 3), d.epoch(), ref);
  // GPipe keeps both micro-batches of 8 rows in flight at each stage; the workspace, made for a
  // whole batch, is counted once whatever the slots. Worked by hand for 16 rows: each of the
  // first stage's 4 blocks keeps the gradient scratch of its chain (widest boundary 16), its
  // attention part (48: Linear<16, 48>) and its MLP part (64), two buffers each; the stage's
  // arena holds one attention's dP and dS, 2 heads x 4 positions a row.
  REQUIRE(p.analysis().max_in_flight == std::vector<int>{2, 2});
  STATIC_REQUIRE(Tiny::K2a::workspace_floats<Host>(batch) ==
                 4 * (2 * 16 * 16 + 2 * 16 * 48 + 2 * 16 * 64) + 16 * 2 * 4);
  REQUIRE(p.workspace_floats(0) == Tiny::K2a::workspace_floats<Host>(batch));
  REQUIRE(p.activation_floats(0) ==
          2 * Tiny::K2a::activation_floats(batch / 2) + Tiny::K2a::workspace_floats<Host>(batch));
  REQUIRE(p.activation_floats(1) ==
          2 * Tiny::K2b::activation_floats(batch / 2) + Tiny::K2b::workspace_floats<Host>(batch));
  p.train(async_1f1b(2, 2, 3), d.epoch(), ref);
  REQUIRE(p.activation_floats(0) ==
          p.analysis().max_in_flight[0] * Tiny::K2a::activation_floats(batch / 2) +
              Tiny::K2a::workspace_floats<Host>(batch));
}

TEST_CASE("A GPT: threaded = reference bitwise for async remedies", "[gpt][pipeline][oracle]") {
  const test::LabelledData d = random_text(12, 6);
  const Schedule s = async_1f1b(2, 2, 3);
  ReferenceExecutor ref;
  ThreadedExecutor thr;
  for (const char* name : {"latest", "stash", "xpipe", "pipenag", "paci"}) {
    INFO(name);
    const AnyPredictor pred = make_predictor(name);
    const std::vector<float> a = pipelined<AnyPredictor>(s, d, ref, pred);
    REQUIRE(a == pipelined<AnyPredictor>(s, d, thr, pred));
    REQUIRE(a != sequential(d, 2));  // stale weights: another result
  }
}

TEST_CASE("A GPT pipeline refuses batches that would cut a sequence", "[gpt][pipeline]") {
  using P = Pipeline<Tiny::K2a, Tiny::K2b, Latest, Adam>;
  CHECK_THROWS_WITH(P(Adam{}, {.batch = 6, .micro_batches = 1}),
                    Catch::Contains("groups of 4 (one sequence each): batch 6 must be a multiple"));
  CHECK_THROWS_WITH(P(Adam{}, {.batch = 8, .micro_batches = 4}),
                    Catch::Contains("at least micro_batches = 4 groups"));
  P p(Adam{}, {.batch = 8, .micro_batches = 2});
  const test::LabelledData d = random_text(3, 7);
  const EpochData cut{d.features().slice_rows(0, 10), d.y.data()};
  ReferenceExecutor ref;
  CHECK_THROWS_WITH(p.train(gpipe(2, 2, 1), cut, ref),
                    Catch::Contains("10 rows are not whole groups of 4"));
  using T = SequentialTrainer<Tiny::K1, Adam>;
  CHECK_THROWS_WITH(T(Adam{}, 6, 1), Catch::Contains("max_batch 6 is not a whole number"));
  T t(Adam{}, 8, 1);
  CHECK_THROWS_WITH(t.train_step(HostContext{}, d.features().slice_rows(0, 6), d.y.data()),
                    Catch::Contains("6 rows are not whole groups of 4"));
}

TEST_CASE("Evaluation: accuracy and mean cross-entropy, worked by hand", "[gpt][loss]") {
  // Row 0: logits (0, ln 3), label 1: p = 3/4, loss -ln(3/4) = 0.2876821; argmax 1, right.
  // Row 1: logits (0, 0), label 1: p = 1/2, loss ln 2 = 0.6931472; argmax 0 (first), wrong.
  const std::vector<float> logits{0.f, std::log(3.f), 0.f, 0.f};
  const std::vector<std::int32_t> labels{1, 1};
  EvaluationSums sums(2, 2, "test");
  sums.add(HostContext{}, {logits.data(), 2, 2}, labels.data());
  const Evaluation e = sums.result();
  CHECK(e.accuracy == 0.5);
  CHECK(e.loss == Approx((0.2876821 + 0.6931472) / 2).epsilon(1e-6));
  CHECK(e.perplexity() == Approx(std::sqrt(4.0 / 3.0 * 2.0)).epsilon(1e-6));
  const std::vector<std::int32_t> bad{1, 2};
  CHECK_THROWS_WITH(sums.add(HostContext{}, {logits.data(), 2, 2}, bad.data()),
                    Catch::Contains("label 2 at row 1 is outside 0..1"));
}

TEST_CASE("A GPT's evaluation: the pipeline's equals the sequential trainer's", "[gpt][loss]") {
  const test::LabelledData d = random_text(12, 8);
  Dataset held = as_dataset(d);

  SequentialTrainer<Tiny::K1, Adam> t(Adam{}, batch, 3);
  Pipeline<Tiny::K2a, Tiny::K2b, Latest, Adam> p(Adam{},
                                                 {.batch = batch, .micro_batches = 2, .seed = 3});
  const Evaluation a = t.evaluation(HostContext{}, held);
  const Evaluation b = p.evaluation(held);
  CHECK(a.loss == b.loss);
  CHECK(a.accuracy == b.accuracy);
  // Untrained, the model is close to uniform over 256 bytes: ln 256 = 5.545 nats, give or take
  // what the initial weights say.
  CHECK(a.loss > 4.0);
  CHECK(a.loss < 8.0);
  // A bad label is named by its row of the data set (in the second chunk here), before any
  // forward; a data set without rows is refused.
  held.labels[21] = 300;
  CHECK_THROWS_WITH(p.evaluation(held),
                    Catch::Contains("Pipeline::evaluate: label 300 at row 21 is outside 0..255"));
  CHECK_THROWS_WITH(t.evaluation(HostContext{}, head(held, 0)),
                    Catch::Contains("SequentialTrainer::evaluate: the data set holds no rows"));
}

TEST_CASE("A NaN reaching attention stops the pipeline naming stage, action, head and row",
          "[gpt][pipeline][faults]") {
  // Two sequences of 4 tokens a mini-batch, M = 2: micro-batch 1 is rows 4..7 of the epoch.
  using A = Stage<Linear<4, 24>, CausalSelfAttention<8, 2, 4>, Linear<8, 6>>;
  using B = Stage<Linear<6, 5>>;
  test::LabelledData d = test::random_classification(16, 4, 5, 9);
  d.x[5 * 4 + 1] = std::numeric_limits<float>::quiet_NaN();  // epoch row 5: micro-batch 1, row 1
  Pipeline<A, B, Latest, Adam> p(Adam{}, {.batch = 8, .micro_batches = 2, .seed = 3});
  ThreadedExecutor thr;
  REQUIRE_THROWS_MATCHES(
      p.train(async_1f1b(2, 2, 2), d.epoch(), thr), StageError,
      Catch::Matchers::Predicate<StageError>([](const StageError& e) {
        const std::string w = e.what();
        return e.stage() == 0 && w.find("action F1") != std::string::npos &&
               w.find(
                   "CausalSelfAttention<8, 2, 4>: the attention scores of row 1 (head 0) of "
                   "the micro-batch are not finite; input row 1, column 0 (q) holds NaN") !=
                   std::string::npos;
      }));
}

namespace {

// The tiny GPT over 2 stages on backend B: its weights after `s`, and its evaluation of `d`.
template <class B>
std::pair<std::vector<float>, Evaluation> trained_on(const Schedule& s, const test::LabelledData& d,
                                                     const char* predictor, const Dataset& held) {
  Pipeline<Tiny::K2a, Tiny::K2b, AnyPredictor, Adam, B> p(
      Adam{}, {.batch = batch, .micro_batches = s.micro_batches, .seed = 3},
      make_predictor(predictor));
  ThreadedExecutor thr;
  p.train(s, d.epoch(), thr);
  return {p.weights(), p.evaluation(held)};
}

}  // namespace

// The device path of attention (a GEMM per sequence and head, one loop over the rows' softmax)
// and of the embedding, run on the emulated device (the host's GEMM and row math under CUDA's
// stream rules), against the host's launchers: the same products in the same order, so the same
// bits, training and evaluating.
TEST_CASE("A GPT on a device backend (emulated) trains and evaluates the host's bits",
          "[gpt][pipeline][device]") {
  // The emulated device has no fused kernels: it runs the GEMM-and-softmax path.
  using L = CausalSelfAttention<16, 2, 4>;
  static_assert(!L::fused_kernels_on<test::EmulatedDevice> && !L::fused_kernels_on<Host>);
  REQUIRE(L::Saved<test::EmulatedDevice>(8).probs.size() == 8 * 2 * 4);
  const test::LabelledData d = random_text(12, 11), v = random_text(3, 12);
  const Dataset held = as_dataset(v);
  for (const auto& [s, predictor] :
       {std::pair{gpipe(2, 2, 3), "latest"}, std::pair{async_1f1b(2, 2, 3), "xpipe"},
        std::pair{zb_h1(2, 2, 3), "latest"}}) {
    INFO(s.name << " + " << predictor);
    const auto host = trained_on<Host>(s, d, predictor, held);
    const auto device = trained_on<test::EmulatedDevice>(s, d, predictor, held);
    REQUIRE(device.first == host.first);
    REQUIRE(device.second.loss == host.second.loss);
    REQUIRE(device.second.accuracy == host.second.accuracy);
  }
}

TEST_CASE("A device GPT refuses token ids out of range on the host, before any upload",
          "[gpt][pipeline][device]") {
  test::LabelledData d = random_text(8, 13);
  d.x[2 * 6] = 300.f;     // row 6's token id
  d.x[2 * 9 + 1] = 1.5f;  // row 9's position
  using P = Pipeline<Tiny::K2a, Tiny::K2b, Latest, Adam, test::EmulatedDevice>;
  P p(Adam{}, {.batch = batch, .micro_batches = 2, .seed = 3});
  const std::vector<float> before = p.weights();
  ThreadedExecutor thr;
  REQUIRE_THROWS_WITH(p.train(gpipe(2, 2, 2), d.epoch(), thr),
                      Catch::Contains("xpipe: Pipeline::train: Embedding<256, 4, 16>: row 6, "
                                      "column 0 (token id): 300 is outside 0..255"));
  REQUIRE(p.weights() == before);
  d.x[2 * 6] = 7.f;
  REQUIRE_THROWS_WITH(p.train(gpipe(2, 2, 2), d.epoch(), thr),
                      Catch::Contains("row 9, column 1 (position): 1.5 is not a whole number"));
  Dataset held = as_dataset(d);
  REQUIRE_THROWS_WITH(p.evaluation(held),
                      Catch::Contains("xpipe: Pipeline::evaluate: Embedding<256, 4, 16>: row 9"));
}
