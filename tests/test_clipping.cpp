// Global gradient-norm clipping across stages (PipelineOptions::clip_norm): the norm against
// one computed here from the definition, the step against torch.nn.utils.clip_grad_norm_'s
// rule, K stages against one, threaded = reference, and what is refused (the device pipeline's
// clipping: test_emulated_device.cpp and, on a GPU, test_cuda_pipeline.cu).
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "support/compare.hpp"
#include "support/support.hpp"
#include "xpipe/xpipe.hpp"

using namespace xpipe;
using Catch::Contains;

TEST_CASE("squared_norm: sums of squares worked by hand, in double", "[clipping]") {
  const std::vector<float> five{1, 2, 3, 4, 5};
  REQUIRE(squared_norm(five.data(), 5) == 55.0);
  REQUIRE(squared_norm(five.data(), 0) == 0.0);
  REQUIRE(squared_norm(five.data(), 3) == 14.0);
  // 2^-12 squared is 2^-24: in float 1 + 2^-24 rounds to 1, in double it stays.
  const std::vector<float> small{1.f, std::ldexp(1.f, -12)};
  REQUIRE(squared_norm(small.data(), 2) == 1.0 + std::ldexp(1.0, -24));
}

TEST_CASE("reduce_split: a device reduction's chunks, worked by hand, cover every term once",
          "[clipping]") {
  auto same = [](ReduceSplit s, int blocks, index_t chunk) {
    return s.blocks == blocks && s.chunk == chunk;
  };
  REQUIRE(same(reduce_split(0, 2048, 512), 1, 0));  // one block writes 0
  REQUIRE(same(reduce_split(1, 2048, 512), 1, 1));
  REQUIRE(same(reduce_split(2048, 2048, 512), 1, 2048));
  REQUIRE(same(reduce_split(2049, 2048, 512), 2, 1025));  // 1025 + 1024
  // 10^7 terms: 4,883 blocks wanted, 512 allowed, of ceil(10^7 / 512) = 19,532 terms.
  REQUIRE(same(reduce_split(10'000'000, 2048, 512), 512, 19'532));
  for (index_t n = 1; n < 40'000; n += 97) {
    const ReduceSplit s = reduce_split(n, 64, 16);
    INFO(n);
    REQUIRE(s.blocks >= 1);
    REQUIRE(s.blocks <= 16);
    REQUIRE(static_cast<index_t>(s.blocks) * s.chunk >= n);     // the last term is summed
    REQUIRE(static_cast<index_t>(s.blocks - 1) * s.chunk < n);  // and no block is empty
  }
}

namespace {

using S0 = Stage<Linear<12, 16>, ReLU>;
using S1 = Stage<Linear<16, 8>, ReLU>;
using S2 = Stage<Linear<8, 4>>;
using Whole = Stage<Linear<12, 16>, ReLU, Linear<16, 8>, ReLU, Linear<8, 4>>;

PipelineOptions options(float clip, int micro_batches = 2) {
  return {.batch = 16, .micro_batches = micro_batches, .seed = 9, .clip_norm = clip};
}

template <class P>
void train(P& pipe, const std::string& schedule, int mini_batches, int seed, auto& executor) {
  const auto d = test::random_classification(16 * mini_batches, 12, 4, seed);
  pipe.train(make_schedule(schedule, P::stage_count, pipe.options().micro_batches, mini_batches),
             d.epoch(), executor);
}

// The L2 norm of a - b, in double.
double distance(const std::vector<float>& a, const std::vector<float>& b) {
  double sq = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    sq += d * d;
  }
  return std::sqrt(sq);
}

}  // namespace

// SGD without momentum at lr 1 steps W1 = W0 - g, so the unclipped step gives g (to float
// rounding) and its norm |g|; clip_grad_norm_ scales g by c / (|g| + 1e-6) when that is below 1.
TEST_CASE("clip_norm: one step scales every stage's gradient by c / (|g| + 1e-6)",
          "[clipping][pipeline]") {
  using P = Pipeline<S0, S1, S2, Latest, SGD>;
  const SGD sgd{.lr = 1.f, .momentum = 0.f};
  ReferenceExecutor exec;
  P unclipped(sgd, options(0));
  const std::vector<float> w0 = unclipped.weights();
  train(unclipped, "gpipe", 1, 41, exec);
  const std::vector<float> w1 = unclipped.weights();
  REQUIRE(unclipped.gradient_norms().empty());
  const double norm = distance(w0, w1);  // |g|
  REQUIRE(norm > 0.01);

  SECTION("a bound below |g|: the step shrinks to c") {
    const float c = static_cast<float>(norm / 2);
    P clipped(sgd, options(c));
    train(clipped, "gpipe", 1, 41, exec);
    const std::vector<float> w = clipped.weights();
    REQUIRE(clipped.gradient_norms().size() == 1);
    REQUIRE(clipped.gradient_norms()[0] == Approx(norm).epsilon(1e-5));
    const double coef = c / (norm + 1e-6);
    for (std::size_t i = 0; i < w.size(); ++i) {
      INFO("weight " << i);
      REQUIRE(w[i] == Approx(w0[i] - coef * (w0[i] - w1[i])).margin(1e-6));
    }
    REQUIRE(distance(w0, w) == Approx(c).epsilon(1e-4));
  }
  SECTION("a bound above |g|: nothing scaled, the unclipped bits") {
    P loose(sgd, options(static_cast<float>(norm * 2)));
    train(loose, "gpipe", 1, 41, exec);
    REQUIRE(loose.weights() == w1);
  }
}

TEST_CASE("clip_norm: K stages clip as one stage does (GPipe, several steps)",
          "[clipping][pipeline]") {
  // The norm is summed per stage, then over stages, so it may differ from one stage's sum in
  // its last bits: the same training within float tolerance, not bit for bit.
  ReferenceExecutor exec;
  Pipeline<S0, S1, S2, Latest, Adam> three(Adam{.lr = 1e-2f}, options(0.05f));
  Pipeline<Whole, Latest, Adam> one(Adam{.lr = 1e-2f}, options(0.05f));
  Pipeline<Whole, Latest, Adam> free_run(Adam{.lr = 1e-2f}, options(0));
  REQUIRE(three.weights() == one.weights());
  train(three, "gpipe", 6, 52, exec);
  train(one, "gpipe", 6, 52, exec);
  train(free_run, "gpipe", 6, 52, exec);
  const std::vector<double> n3 = three.gradient_norms(), n1 = one.gradient_norms();
  REQUIRE(n3.size() == 6);
  for (int t = 0; t < 6; ++t) {
    INFO("mini-batch " << t);
    REQUIRE(n3[t] == Approx(n1[t]).epsilon(1e-6));
    REQUIRE(n3[t] > 0.05);  // every step clipped
  }
  const std::vector<float> w3 = three.weights(), w1 = one.weights();
  for (std::size_t i = 0; i < w3.size(); ++i) REQUIRE(w3[i] == Approx(w1[i]).margin(1e-6));
  REQUIRE(distance(free_run.weights(), w1) > 1e-3);  // clipping changed the training
}

TEST_CASE("clip_norm: the threaded executor trains the reference's bits", "[clipping][pipeline]") {
  for (const std::string predictor : {"latest", "xpipe", "pipenag", "paci"}) {
    INFO(predictor);
    using P = Pipeline<S0, S1, S2, AnyPredictor, AnyOptimizer>;
    P ref(make_optimizer("adam", 1e-2f), options(0.05f), make_predictor(predictor));
    P thr(make_optimizer("adam", 1e-2f), options(0.05f), make_predictor(predictor));
    P free_run(make_optimizer("adam", 1e-2f), options(0), make_predictor(predictor));
    ReferenceExecutor reference;
    ThreadedExecutor threaded;
    for (int e = 0; e < 2; ++e) {
      train(ref, "async-1f1b", 6, 60 + e, reference);
      train(thr, "async-1f1b", 6, 60 + e, threaded);
      train(free_run, "async-1f1b", 6, 60 + e, reference);
      REQUIRE(thr.weights() == ref.weights());
      REQUIRE(thr.gradient_norms() == ref.gradient_norms());
    }
    REQUIRE(free_run.weights() != ref.weights());
  }
}

TEST_CASE(
    "clip_norm: zero-bubble and flushed schedules wait for the norm too, threaded = reference",
    "[clipping][pipeline]") {
  using P = Pipeline<S0, S1, S2, Latest, Adam>;
  for (const std::string schedule : {"zb-h1", "1f1b-flush", "async-zb"}) {
    INFO(schedule);
    P ref(Adam{.lr = 1e-2f}, options(0.05f)), thr(Adam{.lr = 1e-2f}, options(0.05f));
    ReferenceExecutor reference;
    ThreadedExecutor threaded;
    train(ref, schedule, 6, 70, reference);
    train(thr, schedule, 6, 70, threaded);
    REQUIRE(thr.weights() == ref.weights());
    REQUIRE(ref.gradient_norms().size() == 6);
  }
}

TEST_CASE(
    "clip_norm: a schedule whose worker steps a stage before its other stage's gradient "
    "is refused before any action, naming the step",
    "[clipping][pipeline]") {
  // async-interleaved, 4 stages on 2 workers, M = 4: worker 0 runs S0@s2 (position 8 of stage
  // 2's list) before B2@s0 and B3@s0, the rest of stage 0's gradient of mini-batch 0, so under
  // global clipping the step would wait for its own worker forever (worker 1 likewise, S0@s3).
  using P = Pipeline<S0, S1, S2, Stage<Linear<4, 4>>, Latest, Adam>;
  P pipe(Adam{.lr = 1e-2f}, options(0.5f, 4));
  const auto d = test::random_classification(48, 12, 4, 3);
  for (const bool threaded : {false, true}) {
    ReferenceExecutor reference;
    ThreadedExecutor threads;
    const std::string why = test::message_of<ConfigError>([&] {
      const Schedule s = make_schedule("async-interleaved", 4, 4, 3);
      threaded ? pipe.train(s, d.epoch(), threads) : pipe.train(s, d.epoch(), reference);
    });
    REQUIRE_THAT(why, Contains("clipping (clip_norm) cannot run schedule 'async-interleaved'"));
    REQUIRE_THAT(why, Contains("worker 0, stage 2: S0 (position 8) waits for every stage's "
                               "gradient of mini-batch 0"));
  }
  // Without clipping it trains; the flushed interleaved schedule clips (its steps follow every
  // gradient of their mini-batch).
  P free_run(Adam{.lr = 1e-2f}, options(0, 4)), flushed(Adam{.lr = 1e-2f}, options(0.5f, 4));
  ReferenceExecutor reference;
  free_run.train(make_schedule("async-interleaved", 4, 4, 3), d.epoch(), reference);
  flushed.train(make_schedule("interleaved-1f1b", 4, 4, 3), d.epoch(), reference);
  REQUIRE(flushed.gradient_norms().size() == 3);
}

TEST_CASE("clip_norm: a bound that is not finite and >= 0 is refused", "[clipping][pipeline]") {
  using P = Pipeline<S0, S1, S2, Latest, Adam>;
  for (const float bad :
       {-1.f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    INFO(bad);
    REQUIRE_THAT(test::message_of<ConfigError>([&] { P p(Adam{}, options(bad)); }),
                 Contains("clip_norm must be finite and >= 0"));
  }
  P unclipped(Adam{}, options(0));  // off
  REQUIRE(unclipped.gradient_norms().empty());
}
