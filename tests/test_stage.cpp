// Stage<Layers...>: widths, flat layout, seeded split-invariant init, chaining, and training.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "support/support.hpp"
#include "xpipe/xpipe.hpp"

using namespace xpipe;

using Whole = Stage<Linear<6, 8>, ReLU, Linear<8, 5>, GELU, Linear<5, 3>>;
using Front = Stage<Linear<6, 8>, ReLU>;
using Back = Stage<Linear<8, 5>, GELU, Linear<5, 3>>;

TEST_CASE("Stage resolves boundary widths and a 64-byte-aligned flat layout", "[stage]") {
  STATIC_REQUIRE(Whole::in_width == 6);
  STATIC_REQUIRE(Whole::out_width == 3);
  STATIC_REQUIRE(Whole::widths == std::array<int, 6>{6, 8, 8, 5, 5, 3});
  STATIC_REQUIRE(Stage<ReLU, Linear<4, 2>>::in_width == 4);  // leading activation takes 4
  // Linear<6,8>: 56 floats -> padded to 64; ReLU 0; Linear<8,5>: 45 -> 48; Linear<5,3>: 18 -> 32.
  STATIC_REQUIRE(Whole::param_offsets == std::array<index_t, 6>{0, 64, 64, 112, 112, 144});
  STATIC_REQUIRE(Whole::param_count == 144);
  STATIC_REQUIRE(models::FashionMlp::in_width == 784);
  STATIC_REQUIRE(models::FashionMlp::out_width == 10);
}

TEST_CASE("Seeded init is reproducible and the same however the model is split", "[stage]") {
  std::vector<float> whole(Whole::param_count), again(Whole::param_count),
      other(Whole::param_count);
  Whole::init(whole, 5);
  Whole::init(again, 5);
  Whole::init(other, 6);
  REQUIRE(whole == again);
  REQUIRE(whole != other);
  std::vector<float> front(Front::param_count), back(Back::param_count);
  Front::init(front, 5, 0);
  Back::init(back, 5, Front::layer_count);
  // Layer blocks of the whole model equal those of the two stages.
  REQUIRE(std::equal(front.begin(), front.begin() + 56, whole.begin()));
  REQUIRE(std::equal(back.begin(), back.begin() + 45, whole.begin() + 64));
  REQUIRE(std::equal(back.begin() + 48, back.begin() + 66, whole.begin() + 112));
  // He-uniform bound for fan-in 6: |w| < sqrt(6/6) = 1; biases start at zero.
  for (int i = 0; i < 48; ++i) REQUIRE(std::fabs(whole[i]) < 1.f);
  for (int i = 48; i < 56; ++i) REQUIRE(whole[i] == 0.f);
  REQUIRE_THROWS_AS(Whole::init(std::span<float>(front), 5), ShapeError);
}

TEST_CASE("Two stages chained give the bits of the whole model - forward and backward", "[stage]") {
  const HostContext ctx{};
  const index_t rows = 4;
  std::vector<float> w(Whole::param_count), wf(Front::param_count), wb(Back::param_count);
  Whole::init(w, 9);
  Front::init(wf, 9, 0);
  Back::init(wb, 9, 2);
  Rng rng{1};
  std::vector<float> x(rows * 6), dy(rows * 3);
  xpipe::test::fill_uniform(x, rng);
  xpipe::test::fill_uniform(dy, rng);

  Whole::Activations<Host> aw(rows);
  Whole::GradScratch<Host> sw(rows);
  const ConstMatrix yw = Whole::forward(ctx, w.data(), {x.data(), rows, 6}, aw);
  std::vector<float> gw(Whole::param_count), dxw(rows * 6);
  Whole::backward(ctx, w.data(), gw.data(), false, aw, {dy.data(), rows, 3}, {dxw.data(), rows, 6},
                  sw);

  Front::Activations<Host> af(rows);
  Back::Activations<Host> ab(rows);
  Front::GradScratch<Host> sf(rows);
  Back::GradScratch<Host> sb(rows);
  const ConstMatrix h = Front::forward(ctx, wf.data(), {x.data(), rows, 6}, af);
  const ConstMatrix yb = Back::forward(ctx, wb.data(), h, ab);
  REQUIRE(std::memcmp(yw.data, yb.data, rows * 3 * sizeof(float)) == 0);
  std::vector<float> gf(Front::param_count), gb(Back::param_count), dh(rows * 8), dxf(rows * 6);
  Back::backward(ctx, wb.data(), gb.data(), false, ab, {dy.data(), rows, 3}, {dh.data(), rows, 8},
                 sb);
  Front::backward(ctx, wf.data(), gf.data(), false, af, {dh.data(), rows, 8}, {dxf.data(), rows, 6},
                  sf);
  REQUIRE(dxw == dxf);
  REQUIRE(std::equal(gf.begin(), gf.begin() + 56, gw.begin()));
  REQUIRE(std::equal(gb.begin(), gb.begin() + 66, gw.begin() + 64));
}

TEST_CASE("Stage rejects inputs that do not fit its buffers", "[stage]") {
  const HostContext ctx{};
  std::vector<float> w(Whole::param_count), x(10 * 7);
  Whole::Activations<Host> a(4);
  REQUIRE_THROWS_WITH(Whole::forward(ctx, w.data(), {x.data(), 4, 7}, a),
                      Catch::Contains("7 columns") && Catch::Contains("expects 6"));
  REQUIRE_THROWS_WITH(Whole::forward(ctx, w.data(), {x.data(), 10, 6}, a),
                      Catch::Contains("10 rows"));
}

TEST_CASE("Sequential training fits a separable synthetic problem", "[stage][train]") {
  // Three Gaussian blobs in 6-D: the loss must fall well below log(3) and accuracy rise.
  using Model = Stage<Linear<6, 16>, ReLU, Linear<16, 3>>;
  const HostContext ctx{};
  Dataset d;
  d.count = 300;
  d.width = 6;
  d.classes = 3;
  d.features = HostBuffer<float>(300 * 6);
  Rng rng{4};
  for (int i = 0; i < 300; ++i) {
    d.labels.push_back(i % 3);
    for (int j = 0; j < 6; ++j)
      d.features[i * 6 + j] = rng.normal() * 0.5f + (j % 3 == i % 3 ? 2.f : 0.f);
  }
  SequentialTrainer<Model, Adam> t(Adam{.lr = 1e-2f}, 32, 3);
  Batcher b(d, 32, 3);
  HostBuffer<float> x(32 * 6);
  HostBuffer<std::int32_t> y(32);
  double first = 0, last = 0;
  for (int epoch = 0; epoch < 20; ++epoch) {
    b.start_epoch(epoch);
    double sum = 0;
    while (index_t n = b.next({x.data(), 32, 6}, y.data()))
      sum += t.train_step(ctx, {x.data(), n, 6}, y.data()) * n;
    (epoch == 0 ? first : last) = sum / 300;
  }
  REQUIRE(first > 0.5);
  REQUIRE(last < 0.1);
  REQUIRE(t.evaluate(ctx, d) > 0.97);
}

TEST_CASE("A NaN loss stops training with a clear error", "[stage][train]") {
  using Model = Stage<Linear<2, 2>>;
  const HostContext ctx{};
  SequentialTrainer<Model, SGD> t(SGD{.lr = 0.1f}, 2, 1);
  std::vector<float> x{1.f, std::nanf(""), 0.f, 1.f};
  std::vector<std::int32_t> y{0, 1};
  REQUIRE_THROWS_WITH(t.train_step(ctx, {x.data(), 2, 2}, y.data()),
                      Catch::Contains("loss is NaN") && Catch::Contains("row 0"));
  REQUIRE(t.state().steps_taken() == 0);  // the bad batch did not update the weights
}

namespace {
// Stage S's output, then its parameter gradients, then its input gradient, after
// `micro_batches` forward + backward passes over the same rows: the first writes the
// gradients, the later ones add to them.
template <class S>
std::vector<float> forward_backward(const std::vector<float>& w, const std::vector<float>& x,
                                    const std::vector<float>& dy, index_t rows, int micro_batches) {
  const HostContext ctx{};
  typename S::template Activations<Host> acts(rows);
  typename S::template GradScratch<Host> scratch(rows);
  std::vector<float> g(S::param_count), dx(x.size());
  ConstMatrix y;
  for (int micro = 0; micro < micro_batches; ++micro) {
    y = S::forward(ctx, w.data(), {x.data(), rows, S::in_width}, acts);
    S::backward(ctx, w.data(), g.data(), micro > 0, acts, {dy.data(), rows, S::out_width},
                {dx.data(), rows, S::in_width}, scratch);
  }
  std::vector<float> out(y.data, y.data + rows * S::out_width);
  out.insert(out.end(), g.begin(), g.end());
  out.insert(out.end(), dx.begin(), dx.end());
  return out;
}

// Random inputs (rows x in) and output gradients (rows x out) in [-1, 1) from `seed`.
std::pair<std::vector<float>, std::vector<float>> random_rows(index_t rows, int in, int out,
                                                              std::uint64_t seed) {
  Rng rng{seed};
  std::vector<float> x(rows * in), dy(rows * out);
  xpipe::test::fill_uniform(x, rng);
  xpipe::test::fill_uniform(dy, rng);
  return {x, dy};
}

using test::same_bits;
}  // namespace

TEST_CASE("Dense layers give the bits of Linear then ReLU, keeping fewer activations",
          "[stage][dense]") {
  using Split = Stage<Linear<6, 8>, ReLU, Linear<8, 5>, ReLU, Linear<5, 3>>;
  using Fused = Stage<Dense<6, 8, ReLU>, Dense<8, 5, ReLU>, Linear<5, 3>>;
  // One flat layout (ReLU has no parameters), so one weight buffer serves both.
  STATIC_REQUIRE(Fused::param_count == Split::param_count);
  STATIC_REQUIRE(Fused::param_offsets[1] == Split::param_offsets[2]);
  STATIC_REQUIRE(Fused::param_offsets[2] == Split::param_offsets[4]);
  // The pre-activations are not kept: 8 + 5 + 3 floats a row instead of 8 + 8 + 5 + 5 + 3.
  STATIC_REQUIRE(Fused::activation_floats(4) == 4 * 16);
  STATIC_REQUIRE(Split::activation_floats(4) == 4 * 29);
  STATIC_REQUIRE(Fused::needs_grad_scratch<Host>);
  STATIC_REQUIRE_FALSE(Split::needs_grad_scratch<Host>);

  const HostContext ctx{};
  const index_t rows = 5;
  std::vector<float> w(Split::param_count);
  Split::init(w, 11);
  auto [x, dy] = random_rows(rows, 6, 3, 2);
  x[6] = std::nanf("");  // row 1 holds a NaN: it must reach the output, not vanish in a ReLU
  for (int micro_batches : {1, 2}) {  // gradients written, then also accumulated
    INFO(micro_batches << " micro-batch(es)");
    const auto split = forward_backward<Split>(w, x, dy, rows, micro_batches);
    const auto fused = forward_backward<Fused>(w, x, dy, rows, micro_batches);
    REQUIRE(same_bits(split, fused));
    for (int c = 0; c < 3; ++c) REQUIRE(std::isnan(fused[3 + c]));  // output row 1
    REQUIRE(std::isfinite(fused[0]));
  }
  // The same seed draws the same weights: a Dense layer takes the two layer numbers of the
  // Linear and ReLU it stands for, so the last Linear is layer 4 in both.
  STATIC_REQUIRE(Fused::seed_streams == Split::layer_count);
  STATIC_REQUIRE(Fused::init_stream_offsets == std::array<std::size_t, 4>{0, 2, 4, 5});
  std::vector<float> wf(Fused::param_count), wf_later(Fused::param_count);
  Fused::init(wf, 11);
  REQUIRE(wf == w);
  Fused::init(wf_later, 11, 3);  // as the second stage of a model: other sub-streams
  REQUIRE(wf_later != w);
  // A width mismatch in a view, or a scratch buffer too small, is a ShapeError naming the layer.
  std::vector<float> y(rows * 7);
  using D = Dense<6, 8, ReLU>;
  std::vector<float> small(rows * 4), g(D::param_count);
  REQUIRE_THROWS_WITH(D::backward(ctx, w.data(), g.data(), false, ConstMatrix{x.data(), rows, 6},
                                  ConstMatrix{y.data(), rows, 8}, ConstMatrix{y.data(), rows, 8},
                                  Matrix{}, Matrix{small.data(), rows, 4}),
                      Catch::Contains("Dense<6, 8>::backward") && Catch::Contains("5x8"));
  REQUIRE_THROWS_WITH(D::backward(ctx, w.data(), g.data(), false, ConstMatrix{x.data(), rows, 6},
                                  ConstMatrix{y.data(), rows, 8}, ConstMatrix{y.data(), rows, 8},
                                  Matrix{}, Matrix{}),
                      Catch::Contains("needs a scratch buffer"));
  REQUIRE_THROWS_WITH(
      D::forward(ctx, w.data(), ConstMatrix{x.data(), rows, 6}, Matrix{y.data(), rows, 7}),
      Catch::Contains("Dense<6, 8>::forward") && Catch::Contains("7 output"));
}

TEST_CASE("A Dense layer last in its stage reads the stage's incoming gradient, never writes it",
          "[stage][dense]") {
  // The last layer's dy is the caller's buffer (a queue slot, the loss gradient): dz must go to
  // the stage's third scratch buffer, not into dy.
  using Split = Stage<Linear<6, 8>, Linear<8, 5>, ReLU>;
  using Fused = Stage<Linear<6, 8>, Dense<8, 5, ReLU>>;
  const index_t rows = 4;
  std::vector<float> w(Split::param_count);
  Split::init(w, 5);
  const auto [x, dy] = random_rows(rows, 6, 5, 6);
  const std::vector<float> dy_given = dy;
  const auto split = forward_backward<Split>(w, x, dy, rows, 1);
  const auto fused = forward_backward<Fused>(w, x, dy, rows, 1);
  REQUIRE(dy == dy_given);
  REQUIRE(same_bits(split, fused));
}

TEST_CASE("A split backward (I then W) gives the bits of the whole one - slots interleaved",
          "[stage][zb]") {
  // Linear (kept dy copied from the incoming gradient), ReLU (no parameters: all I), Dense (dz
  // written over its kept dy), Linear first (with and without dx: the model's input needs none).
  using S = Stage<Linear<6, 8>, ReLU, Dense<8, 5, ReLU>, Linear<5, 3>>;
  STATIC_REQUIRE(S::splits_backward<Host>);
  STATIC_REQUIRE(S::kept_gradient_floats(4) == 4 * (8 + 5 + 3));  // ReLU keeps none
  const HostContext ctx{};
  const index_t rows = 4;
  std::vector<float> w(S::param_count);
  S::init(w, 3);
  Rng rng{2};
  std::vector<float> xa(rows * 6), xb(rows * 6), dya(rows * 3), dyb(rows * 3);
  for (auto* v : {&xa, &xb, &dya, &dyb}) xpipe::test::fill_uniform(*v, rng);
  S::GradScratch<Host> scratch(rows);

  // Whole: B(a) then B(b), accumulating.
  S::Activations<Host> wa(rows), wb(rows);
  // Both gradient buffers start at 7: accumulate = false must overwrite (padding stays 7).
  std::vector<float> g_whole(S::param_count, 7.f), dxa_whole(rows * 6), dxb_whole(rows * 6);
  S::forward(ctx, w.data(), {xa.data(), rows, 6}, wa);
  S::forward(ctx, w.data(), {xb.data(), rows, 6}, wb);
  S::backward(ctx, w.data(), g_whole.data(), false, wa, {dya.data(), rows, 3},
              {dxa_whole.data(), rows, 6}, scratch);
  S::backward(ctx, w.data(), g_whole.data(), true, wb, {dyb.data(), rows, 3},
              {dxb_whole.data(), rows, 6}, scratch);

  // Split: F(a) F(b) I(a) I(b) W(a) W(b), the incoming gradients overwritten after each I (the
  // queue slot is reused): the slot must have kept its own copy.
  S::Activations<Host> sa(rows, {.kept_gradients = true}), sb(rows, {.kept_gradients = true});
  std::vector<float> g_split(S::param_count, 7.f), dxa(rows * 6), dxb(rows * 6);
  S::forward(ctx, w.data(), {xa.data(), rows, 6}, sa);
  S::forward(ctx, w.data(), {xb.data(), rows, 6}, sb);
  std::vector<float> in = dya;
  S::backward_input(ctx, w.data(), sa, {in.data(), rows, 3}, {dxa.data(), rows, 6}, scratch);
  in = dyb;
  S::backward_input(ctx, w.data(), sb, {in.data(), rows, 3}, {dxb.data(), rows, 6}, scratch);
  std::fill(in.begin(), in.end(), 99.f);
  REQUIRE(g_split == std::vector<float>(S::param_count, 7.f));  // I adds no parameter gradient
  S::backward_weight(ctx, g_split.data(), false, sa);
  S::backward_weight(ctx, g_split.data(), true, sb);
  REQUIRE(dxa == dxa_whole);
  REQUIRE(dxb == dxb_whole);
  REQUIRE(g_split == g_whole);

  // The model's first stage needs no input gradient: an empty dx, the same parameter gradient.
  std::vector<float> g_nodx(S::param_count, 7.f);
  S::Activations<Host> sc(rows, {.kept_gradients = true});
  S::forward(ctx, w.data(), {xa.data(), rows, 6}, sc);
  S::backward_input(ctx, w.data(), sc, {dya.data(), rows, 3}, Matrix{}, scratch);
  S::backward_weight(ctx, g_nodx.data(), false, sc);
  std::vector<float> g_once(S::param_count, 7.f);
  S::backward(ctx, w.data(), g_once.data(), false, wa, {dya.data(), rows, 3}, Matrix{}, scratch);
  REQUIRE(g_nodx == g_once);

  // A slot made without room for the kept gradients is refused, not written past.
  S::Activations<Host> plain(rows);
  S::forward(ctx, w.data(), {xa.data(), rows, 6}, plain);
  REQUIRE_THROWS_AS(S::backward_input(ctx, w.data(), plain, {dya.data(), rows, 3},
                                      {dxa.data(), rows, 6}, scratch),
                    ShapeError);
}
