// CausalSelfAttention and Embedding on the host: against PyTorch (numbers printed by
// fixtures/attention_reference.py), central finite differences, a hand-worked case, causality,
// the same bits on any thread count, bad input, and both layers inside a Stage.
#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "support/compare.hpp"
#include "support/support.hpp"
#include "xpipe/layers/attention.hpp"
#include "xpipe/layers/embedding.hpp"
#include "xpipe/xpipe.hpp"

namespace {

using namespace xpipe;
using xpipe::test::central;
using xpipe::test::message_of;

// One activation slot of a CausalSelfAttention: its operands and its Saved, for `rows` rows.
template <class L>
struct AttentionSlot {
  index_t rows;
  std::vector<float> x, y, dy, dx;
  typename L::template Saved<Host> saved;
  explicit AttentionSlot(index_t n)
      : rows(n),
        x(n * L::in_width),
        y(n * L::out_width),
        dy(n * L::out_width),
        dx(n * L::in_width),
        saved(n) {}
  ConstMatrix input() const { return {x.data(), rows, L::in_width}; }
  void forward(const HostContext& ctx) {
    L::forward(ctx, nullptr, input(), Matrix{y.data(), rows, L::out_width}, saved);
  }
  void backward(const HostContext& ctx) {
    L::backward(ctx, nullptr, nullptr, false, input(), ConstMatrix{y.data(), rows, L::out_width},
                ConstMatrix{dy.data(), rows, L::out_width}, Matrix{dx.data(), rows, L::in_width},
                saved);
  }
};

// One micro-batch of an Embedding: its tables, their gradients and its operands.
template <class E>
struct EmbeddingSlot {
  index_t rows;
  std::vector<float> p, g, x, y, dy, dx;
  explicit EmbeddingSlot(index_t n)
      : rows(n),
        p(E::param_count),
        g(E::param_count),
        x(n * 2),
        y(n * E::out_width),
        dy(n * E::out_width),
        dx(n * 2) {}
  ConstMatrix input() const { return {x.data(), rows, 2}; }
  void forward(const HostContext& ctx) {
    E::forward(ctx, p.data(), input(), Matrix{y.data(), rows, E::out_width});
  }
  void backward(const HostContext& ctx, bool accumulate = false) {
    E::backward(ctx, p.data(), g.data(), accumulate, input(),
                ConstMatrix{y.data(), rows, E::out_width},
                ConstMatrix{dy.data(), rows, E::out_width}, Matrix{dx.data(), rows, 2});
  }
  // Row r reads token `id` at position `pos`.
  void set_row(index_t r, int id, int pos) {
    x[2 * r] = static_cast<float>(id);
    x[2 * r + 1] = static_cast<float>(pos);
  }
};

// Random tables, ids, positions and upstream gradient, ids drawn from few values so that rows
// share them (the scatter-add then sums several rows into one table row).
template <class E>
void randomize(EmbeddingSlot<E>& s, int vocab, int context, std::uint64_t seed) {
  E::init(s.p, seed);
  Rng rng{seed + 1};
  for (index_t r = 0; r < s.rows; ++r)
    s.set_row(r, static_cast<int>(rng.below(static_cast<std::uint64_t>(vocab))),
              static_cast<int>(r % context));
  xpipe::test::fill_uniform(s.dy, rng);
}

// sum(y * dy) in double: the objective whose gradient a backward with upstream dy computes.
double dot(std::span<const float> y, std::span<const float> dy) {
  double sum = 0;
  for (std::size_t i = 0; i < y.size(); ++i) sum += static_cast<double>(y[i]) * dy[i];
  return sum;
}

// Whether a and b hold the same bits in every layer's block of a stage's flat buffer (the padding
// between blocks is no layer's and no backward writes it).
template <class Net>
bool same_blocks(const std::vector<float>& a, const std::vector<float>& b) {
  bool same = true;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((same = same &&
             std::equal(a.begin() + Net::param_offsets[I],
                        a.begin() + Net::param_offsets[I] + Net::template layer<I>::param_count,
                        b.begin() + Net::param_offsets[I])),
     ...);
  }
  (std::make_index_sequence<Net::layer_count>{});
  return same;
}

using Attention = CausalSelfAttention<8, 2, 4>;

// The fixture's input and upstream gradient (fixtures/attention_reference.py, x_value and
// dy_value): integer formulas whose values are exact in float.
float x_value(index_t r, index_t c) {
  return static_cast<float>((r * 7 + c * 3) % 11 - 5) / 8.f;
}
float dy_value(index_t r, index_t c) {
  return static_cast<float>((r * 5 + c * 2) % 7 - 3) / 4.f;
}

// Printed by `/usr/bin/python3 tests/fixtures/attention_reference.py` (PyTorch's masked softmax
// attention with autograd, in float64) for Attention on 2 sequences, the input and upstream
// gradient above: y (8 x 8) and dx (8 x 24), row-major.
// 2 sequences, Context 4, Dim 8, 2 heads; torch 1.13.0a0, float64.
constexpr float torch_y[] = {
    -1.250000000e-01f, 2.500000000e-01f,  6.250000000e-01f,  -3.750000000e-01f, 0.000000000e+00f,
    3.750000000e-01f,  -6.250000000e-01f, -2.500000000e-01f, -3.808583024e-01f, -5.858302352e-03f,
    3.691416976e-01f,  7.275202912e-02f,  -3.038315849e-01f, 7.116841508e-02f,  -9.329472640e-02f,
    2.817052736e-01f,  -1.459143073e-01f, 2.290856927e-01f,  1.915552058e-01f,  -2.900209701e-02f,
    -2.604022807e-02f, -6.059763875e-02f, -2.722615429e-01f, 1.027384571e-01f,  -2.402821459e-01f,
    1.347178541e-01f,  2.047903944e-01f,  -2.894163240e-02f, -7.420095002e-02f, -1.045334041e-02f,
    9.085272443e-03f,  2.302618296e-02f,  6.250000000e-01f,  -3.750000000e-01f, 0.000000000e+00f,
    3.750000000e-01f,  -6.250000000e-01f, -2.500000000e-01f, 1.250000000e-01f,  5.000000000e-01f,
    3.239692055e-01f,  1.518038903e-01f,  -3.010307945e-01f, 7.396920554e-02f,  -1.618945308e-01f,
    2.131054692e-01f,  -1.396316967e-01f, 2.353683033e-01f,  1.831507664e-01f,  -2.531341432e-02f,
    -1.829966049e-02f, -6.684923358e-02f, -2.686076403e-01f, 1.063923597e-01f,  1.015424479e-01f,
    5.608692327e-02f,  2.548689308e-01f,  -1.346425639e-01f, -7.203966905e-02f, 4.868930797e-03f,
    2.845358024e-02f,  8.574589035e-02f,  1.270623458e-02f,  9.616127013e-02f};
constexpr float torch_dx[] = {
    0.000000000e+00f,  0.000000000e+00f,  0.000000000e+00f,  0.000000000e+00f,  0.000000000e+00f,
    0.000000000e+00f,  0.000000000e+00f,  0.000000000e+00f,  2.310616158e-02f,  -5.801380251e-02f,
    -2.741714854e-03f, 3.993954715e-02f,  -6.453394638e-03f, 5.890124599e-02f,  7.303527996e-02f,
    -6.230605316e-02f, -6.044794285e-01f, -3.996462545e-01f, -9.829916059e-02f, 6.158560137e-01f,
    -1.637105561e-01f, 1.884594212e-01f,  4.805557006e-01f,  -6.830902712e-01f, 5.124137837e-02f,
    -2.928078764e-02f, -2.928078764e-02f, 5.124137837e-02f,  3.259493150e-02f,  -1.862567515e-02f,
    -1.862567515e-02f, 3.259493150e-02f,  -2.320430330e-04f, 4.659808838e-02f,  -4.343342512e-02f,
    6.107521961e-03f,  2.468982186e-02f,  -3.667618588e-02f, -4.682158697e-02f, 2.407697013e-02f,
    8.809811563e-02f,  -2.503648316e-01f, -1.603028974e-01f, -1.904224399e-01f, 4.614840232e-01f,
    -3.409282335e-02f, 5.165891428e-02f,  1.775671729e-01f,  -2.946105201e-03f, 5.610418937e-02f,
    -7.087744555e-02f, -2.946105201e-03f, -7.023653946e-02f, 1.080741873e-02f,  7.923882764e-02f,
    -7.023653946e-02f, -6.167076875e-02f, 3.469370425e-02f,  4.617513997e-02f,  -6.932505923e-02f,
    4.238557729e-02f,  2.023741698e-03f,  -3.833809389e-02f, -1.026852057e-02f, -1.108827126e-01f,
    1.500110861e-01f,  -1.141339166e-01f, -2.413296120e-01f, 1.787364005e-02f,  2.799862950e-01f,
    2.084406360e-02f,  -1.131826874e-01f, -6.676164496e-02f, -1.042216606e-02f, 7.446087121e-02f,
    1.859098548e-02f,  -3.851723108e-02f, -3.114077862e-02f, 4.842120963e-02f,  -3.851723108e-02f,
    3.879665020e-02f,  -2.327799012e-02f, 0.000000000e+00f,  2.327799012e-02f,  -6.062200450e-02f,
    -2.424880180e-02f, 1.212440090e-02f,  4.849760360e-02f,  -1.227359745e-01f, 0.000000000e+00f,
    1.227359745e-01f,  -1.841039618e-01f, -6.564710718e-02f, 6.564710718e-02f,  1.969413215e-01f,
    -1.312942144e-01f, 0.000000000e+00f,  0.000000000e+00f,  0.000000000e+00f,  0.000000000e+00f,
    0.000000000e+00f,  0.000000000e+00f,  0.000000000e+00f,  0.000000000e+00f,  -7.877843931e-03f,
    4.645973756e-02f,  -3.016306820e-02f, 3.468106934e-02f,  -4.572495315e-02f, 3.206774586e-02f,
    9.004151268e-03f,  -3.882085931e-02f, 5.648241943e-01f,  -1.549871325e-01f, 1.788093213e-01f,
    4.664072190e-01f,  -6.301617657e-01f, -3.940726137e-01f, -6.562384456e-02f, 5.898991274e-01f,
    -4.679363908e-02f, 8.188886838e-02f,  8.188886838e-02f,  -4.679363908e-02f, 1.362504357e-02f,
    -2.384382624e-02f, 1.362504357e-02f,  1.362504357e-02f,  -4.756219026e-02f, 1.150344991e-03f,
    5.707299615e-02f,  -5.718111868e-02f, 5.652827541e-02f,  -5.501705346e-02f, 5.315252430e-03f,
    5.103061414e-02f,  -8.678961397e-02f, 4.616533082e-01f,  -4.351155016e-02f, 3.658524056e-02f,
    1.017081855e-01f,  -2.588203044e-01f, -1.765831982e-01f, -1.811330388e-01f, -9.841310743e-02f,
    1.976284397e-02f,  1.976284397e-02f,  5.404698660e-02f,  -2.054758501e-02f, 6.760125477e-02f,
    -5.219056601e-02f, -5.219056601e-02f, 5.544003419e-02f,  -5.226539020e-02f, -1.915108187e-02f,
    2.560358777e-02f,  -3.384048018e-03f, 5.262640456e-02f,  -4.399650065e-02f, -1.962902907e-02f,
    -2.396043225e-01f, 2.281057690e-02f,  2.852254763e-01f,  8.577282597e-03f,  -1.060163507e-01f,
    1.528929180e-01f,  -1.233230263e-01f, -2.354709851e-01f, 5.071334754e-03f,  -7.713101100e-03f,
    -2.478256247e-02f, 1.671169606e-02f,  -6.163343106e-02f, 7.271131727e-03f,  5.935694572e-02f,
    5.935694572e-02f,  0.000000000e+00f,  4.655307646e-03f,  -7.758846077e-03f, -3.103538431e-03f,
    -7.419274237e-03f, -2.967709695e-02f, 2.967709695e-02f,  7.419274237e-03f,  -2.384302579e-01f,
    -7.947675263e-02f, 7.947675263e-02f,  2.384302579e-01f,  -1.155300691e-01f, 0.000000000e+00f,
    1.155300691e-01f,  -1.732951036e-01f};

}  // namespace

TEST_CASE("CausalSelfAttention's layout", "[layers][attention]") {
  STATIC_REQUIRE(Layer<Attention>);
  STATIC_REQUIRE(splits_backward<Attention>);
  STATIC_REQUIRE(keeps_saved<Attention>);
  STATIC_REQUIRE(Attention::in_width == 24);
  STATIC_REQUIRE(Attention::out_width == 8);
  STATIC_REQUIRE(Attention::head_width == 4);
  STATIC_REQUIRE(Attention::param_count == 0);
  STATIC_REQUIRE(row_group_of<Attention>() == 4);
  // Q K^T and P V over the causal triangle: Dim (Context + 1) = 8 x 5 per row.
  STATIC_REQUIRE(macs_of<Attention>() == 40.0);
  // A slot keeps P, Heads x Context floats a row; the stage's workspace holds the backward's
  // dP and dS, as many a row, once for the stage.
  STATIC_REQUIRE(Attention::saved_floats(8) == 8 * 2 * 4);
  STATIC_REQUIRE(keeps_workspace<Attention>);
  STATIC_REQUIRE(arena_floats_of<Attention>(8) == 8 * 2 * 4);
  STATIC_REQUIRE(workspace_floats_of<Attention>(8) == 0);  // all of it on the stage's arena
  REQUIRE(Attention::name() == "CausalSelfAttention<8, 2, 4>");
  Attention::Saved<Host> saved(8);
  REQUIRE(saved.max_rows == 8);
  REQUIRE(saved.probs.size() == 64);
  REQUIRE(saved.workspace->room.own_floats() == 64);  // made alone, it has its own room
  std::vector<float> arena(16 * 2 * 4);
  Attention::Workspace<Host> shared(16, arena.data());
  Attention::Saved<Host> on_shared(8, shared);
  REQUIRE(on_shared.probs.size() == 64);
  REQUIRE(&*on_shared.workspace == &shared);
  REQUIRE(shared.grads() == arena.data());
  REQUIRE(shared.room.own_floats() == 0);

  // A pre-norm attention block's workspace, worked by hand for 8 rows: the inner stage's two
  // ping-pong gradient buffers at its widest boundary (Linear<8, 24>'s output, 24 columns); on
  // the arena, the attention's dP and dS (2 heads x 4 positions a row). Its slot keeps the inner
  // stage's outputs, 8 + 24 + 8 + 8 columns, P, and LayerNorm's mean, 1/std and two backward
  // sums a row.
  using Block = xpipe::Residual<xpipe::LayerNorm<8>, Linear<8, 24>, Attention, Linear<8, 8>>;
  STATIC_REQUIRE(Block::workspace_floats<Host>(8) == 2 * 8 * 24);
  STATIC_REQUIRE(Block::arena_floats<Host>(8) == 8 * 2 * 4);
  STATIC_REQUIRE(Block::saved_floats(8) == 8 * (8 + 24 + 8 + 8) + 8 * 2 * 4 + 4 * 8);
}

TEST_CASE("CausalSelfAttention matches PyTorch", "[layers][attention][torch]") {
  for (int threads : {1, 2}) {
    INFO(threads << " threads");
    AttentionSlot<Attention> s(8);
    for (index_t r = 0; r < 8; ++r) {
      for (index_t c = 0; c < 24; ++c) s.x[r * 24 + c] = x_value(r, c);
      for (index_t c = 0; c < 8; ++c) s.dy[r * 8 + c] = dy_value(r, c);
    }
    const HostContext ctx{.threads = threads};
    s.forward(ctx);
    s.backward(ctx);
    // Float against float64: values below 1, a few roundings each, so 1e-6 + 1e-5 |want|.
    xpipe::test::require_close(s.y, torch_y, "y", 1e-6f, 1e-5f);
    xpipe::test::require_close(s.dx, torch_dx, "dx", 1e-6f, 1e-5f);
  }
}

namespace {

// The fused kernels' row math (kernels/attention.hpp: what kernels/cuda/attention.cuh runs per
// thread), run row by row on the host over every (sequence, head): y, each row's log-sum-exp,
// then dx from x, y and dy.
template <int Dh>
void fused_on_host(const AttentionShape& a, ConstMatrix x, Matrix y, ConstMatrix dy, Matrix dx) {
  const float scale = 1.f / std::sqrt(static_cast<float>(Dh));
  const index_t t = a.context;
  std::vector<float> lse(static_cast<std::size_t>(t)), delta(static_cast<std::size_t>(t));
  for (index_t s = 0; s < a.sequences(); ++s)
    for (index_t h = 0; h < a.heads; ++h) {
      const float* q = x.data + a.qkv_offset(x, s, 0, h);
      const float* k = x.data + a.qkv_offset(x, s, 1, h);
      const float* v = x.data + a.qkv_offset(x, s, 2, h);
      const float* d_out = dy.data + s * t * dy.ld + h * Dh;
      for (index_t i = 0; i < t; ++i) {
        float* o = y.data + (s * t + i) * y.ld + h * Dh;
        lse[static_cast<std::size_t>(i)] =
            math::fused_attention_row<Dh>(q + i * x.ld, k, v, x.ld, i, scale, o);
        float dot = 0.f;
        for (int d = 0; d < Dh; ++d) dot += d_out[i * dy.ld + d] * o[d];
        delta[static_cast<std::size_t>(i)] = dot;
      }
      for (index_t i = 0; i < t; ++i) {
        math::fused_attention_row_dq<Dh>(q + i * x.ld, k, v, x.ld, i, scale, lse[i], delta[i],
                                         d_out + i * dy.ld,
                                         dx.data + a.qkv_offset(dx, s, 0, h) + i * dx.ld);
        math::fused_attention_row_dkv<Dh>(q, x.ld, k + i * x.ld, v + i * x.ld, d_out, dy.ld, i, t,
                                          scale, lse.data(), delta.data(),
                                          dx.data + a.qkv_offset(dx, s, 1, h) + i * dx.ld,
                                          dx.data + a.qkv_offset(dx, s, 2, h) + i * dx.ld);
      }
    }
}

}  // namespace

TEST_CASE("The fused attention's row math matches PyTorch and the GEMM path",
          "[layers][attention][torch]") {
  // PyTorch's values for Attention (the fixture above): the online softmax and the recomputed
  // probabilities reach the same y and dx within float rounding.
  std::vector<float> x(8 * 24), y(8 * 8), dy(8 * 8), dx(8 * 24);
  for (index_t r = 0; r < 8; ++r) {
    for (index_t c = 0; c < 24; ++c) x[r * 24 + c] = x_value(r, c);
    for (index_t c = 0; c < 8; ++c) dy[r * 8 + c] = dy_value(r, c);
  }
  fused_on_host<4>(AttentionShape{8, 2, 4, 4}, {x.data(), 8, 24}, {y.data(), 8, 8},
                   {dy.data(), 8, 8}, {dx.data(), 8, 24});
  xpipe::test::require_close(y, torch_y, "y", 1e-6f, 1e-5f);
  xpipe::test::require_close(dx, torch_dx, "dx", 1e-6f, 1e-5f);
  // xpipe-train's heads (16 wide) over 2 sequences of 128 tokens, random inputs: against the
  // host's GEMM-and-softmax layer.
  using L = CausalSelfAttention<64, 4, 128>;
  AttentionSlot<L> gemm_path(256);
  Rng rng{52};
  xpipe::test::fill_uniform(gemm_path.x, rng, -2.f, 2.f);
  xpipe::test::fill_uniform(gemm_path.dy, rng);
  gemm_path.forward(HostContext{});
  gemm_path.backward(HostContext{});
  std::vector<float> fy(gemm_path.y.size()), fdx(gemm_path.dx.size());
  fused_on_host<16>(AttentionShape{256, 4, 16, 128}, gemm_path.input(), {fy.data(), 256, 64},
                    {gemm_path.dy.data(), 256, 64}, {fdx.data(), 256, 192});
  xpipe::test::require_close(fy, gemm_path.y, "y", 1e-6f, 1e-4f);
  xpipe::test::require_close(fdx, gemm_path.dx, "dx", 1e-5f, 1e-3f);
  // A NaN among a row's scores makes that row's output NaN (and leaves earlier rows alone).
  gemm_path.x[5 * 192 + 0] = std::numeric_limits<float>::quiet_NaN();  // row 5's q, head 0
  fused_on_host<16>(AttentionShape{256, 4, 16, 128}, gemm_path.input(), {fy.data(), 256, 64},
                    {gemm_path.dy.data(), 256, 64}, {fdx.data(), 256, 192});
  REQUIRE(std::isnan(fy[5 * 64 + 0]));
  REQUIRE_FALSE(std::isnan(fy[5 * 64 + 16]));  // head 1 of the same row
  REQUIRE_FALSE(std::isnan(fy[4 * 64 + 0]));
}

TEST_CASE("CausalSelfAttention on a hand-worked sequence", "[layers][attention]") {
  // Context 2, one head of width 1 (scale 1 / sqrt(1) = 1). Rows (q, k, v): token 0 (5, 0, 2),
  // token 1 (1, ln 3, 6).
  //   Token 0 sees only itself: P row 0 = (1, 0), y0 = v0 = 2.
  //   Token 1: scores q1 k0 = 0, q1 k1 = ln 3, so P row 1 = (1, 3) / 4 and y1 = 2/4 + 18/4 = 5.
  // Backward with dy = (1, 2):
  //   dV = P^T dy: dv0 = 1 x 1 + 1/4 x 2 = 1.5, dv1 = 0 x 1 + 3/4 x 2 = 1.5.
  //   dP = dy V^T: row 0 (2, -), row 1 (2 x 2, 2 x 6) = (4, 12).
  //   dS = P o (dP - rowsum(P o dP)): row 0: 1 x (2 - 2) = 0 (the future's entry 0);
  //   row 1: the sum is 1/4 x 4 + 3/4 x 12 = 10, so (1/4 (4 - 10), 3/4 (12 - 10)) = (-1.5, 1.5).
  //   dQ = dS K: dq0 = 0 x k0 = 0, dq1 = -1.5 k0 + 1.5 k1 = 1.5 ln 3.
  //   dK = dS^T Q: dk0 = 0 x q0 - 1.5 q1 = -1.5, dk1 = 1.5 q1 = 1.5.
  using L = CausalSelfAttention<1, 1, 2>;
  const float ln3 = std::log(3.f);
  AttentionSlot<L> s(2);
  s.x = {5.f, 0.f, 2.f, 1.f, ln3, 6.f};
  s.dy = {1.f, 2.f};
  const HostContext ctx{.threads = 1};
  s.forward(ctx);
  s.backward(ctx);
  REQUIRE(s.saved.probs[0] == 1.f);
  REQUIRE(s.saved.probs[1] == 0.f);
  REQUIRE(s.saved.probs[2] == Approx(0.25).epsilon(1e-6));
  REQUIRE(s.saved.probs[3] == Approx(0.75).epsilon(1e-6));
  REQUIRE(s.y[0] == 2.f);
  REQUIRE(s.y[1] == Approx(5.0).epsilon(1e-6));
  const std::array<double, 6> dx{0, -1.5, 1.5, 1.5 * std::log(3.0), 1.5, 1.5};
  for (std::size_t i = 0; i < dx.size(); ++i) {
    INFO("input gradient " << i);
    REQUIRE(s.dx[i] == Approx(dx[i]).margin(1e-6).epsilon(1e-6));
  }
}

TEST_CASE("CausalSelfAttention's input gradient matches central finite differences",
          "[layers][attention][fd]") {
  // Two sequences of 4 tokens, 2 heads of width 3.
  using L = CausalSelfAttention<6, 2, 4>;
  const HostContext ctx{.threads = 1};
  AttentionSlot<L> s(8);
  Rng rng{31};
  xpipe::test::fill_uniform(s.x, rng, -1.5f, 1.5f);
  xpipe::test::fill_uniform(s.dy, rng);
  s.forward(ctx);
  s.backward(ctx);
  L::Saved<Host> other(s.rows);
  const auto objective = [&] {
    std::vector<float> y(s.y.size());
    L::forward(ctx, nullptr, s.input(), Matrix{y.data(), s.rows, L::out_width}, other);
    return dot(y, s.dy);
  };
  for (std::size_t i = 0; i < s.x.size(); ++i) {
    INFO("input gradient " << i << " (row " << i / 18 << ", column " << i % 18 << ")");
    REQUIRE(s.dx[i] == Approx(central(s.x, i, objective)).margin(1e-3).epsilon(1e-3));
  }
}

TEST_CASE("CausalSelfAttention is causal: a later token leaves earlier outputs alone",
          "[layers][attention]") {
  // Changing q, k and v of tokens 3..7 of sequence 0 must leave its rows 0..2, and all of
  // sequence 1, bitwise as they were; rows 3..7 must change.
  using L = CausalSelfAttention<8, 2, 8>;
  const HostContext ctx{.threads = 1};
  AttentionSlot<L> before(16), after(16);
  Rng rng{41};
  xpipe::test::fill_uniform(before.x, rng);
  after.x = before.x;
  for (index_t i = 3 * 24; i < 8 * 24; ++i) after.x[i] = rng.uniform(-3.f, 3.f);
  before.forward(ctx);
  after.forward(ctx);
  for (index_t r = 0; r < 16; ++r) {
    INFO("row " << r);
    const auto row = [r](const std::vector<float>& y) {
      return std::vector<float>(y.begin() + r * 8, y.begin() + (r + 1) * 8);
    };
    if (r >= 3 && r < 8)
      REQUIRE(row(before.y) != row(after.y));
    else
      REQUIRE(row(before.y) == row(after.y));
  }
}

TEST_CASE("CausalSelfAttention gives the same bits run to run and on any thread count",
          "[layers][attention]") {
  // 64 sequences of 16 tokens, 4 heads: enough work for the host loop to fork, so the (sequence,
  // head) pairs are split over the threads.
  using L = CausalSelfAttention<32, 4, 16>;
  const index_t rows = 16 * 64;
  AttentionSlot<L> one(rows);
  Rng rng{51};
  xpipe::test::fill_uniform(one.x, rng, -2.f, 2.f);
  xpipe::test::fill_uniform(one.dy, rng);
  one.forward(HostContext{.threads = 1});
  one.backward(HostContext{.threads = 1});
  for (int threads : {1, 2, 3}) {
    INFO(threads << " threads");
    AttentionSlot<L> again(rows);
    again.x = one.x;
    again.dy = one.dy;
    again.forward(HostContext{.threads = threads});
    again.backward(HostContext{.threads = threads});
    REQUIRE(again.y == one.y);
    REQUIRE(again.dx == one.dx);
  }
}

TEST_CASE("CausalSelfAttention refuses partial sequences and names non-finite scores",
          "[layers][attention]") {
  const HostContext ctx{.threads = 1};
  AttentionSlot<Attention> s(8);
  Rng rng{61};
  xpipe::test::fill_uniform(s.x, rng);
  xpipe::test::fill_uniform(s.dy, rng);
  SECTION("rows that are not whole sequences, before any math") {
    std::fill(s.y.begin(), s.y.end(), -7.f);
    const std::string m = message_of<ConfigError>([&] {
      Attention::forward(ctx, nullptr, ConstMatrix{s.x.data(), 6, 24}, Matrix{s.y.data(), 6, 8},
                         s.saved);
    });
    REQUIRE_THAT(m, Catch::Contains("CausalSelfAttention<8, 2, 4>::forward") &&
                        Catch::Contains("6 rows") && Catch::Contains("Context 4"));
    for (float v : s.y) REQUIRE(v == -7.f);
    const std::string b = message_of<ConfigError>([&] {
      Attention::backward(ctx, nullptr, nullptr, false, ConstMatrix{s.x.data(), 7, 24},
                          ConstMatrix{s.y.data(), 7, 8}, ConstMatrix{s.dy.data(), 7, 8},
                          Matrix{s.dx.data(), 7, 24}, s.saved);
    });
    REQUIRE_THAT(b, Catch::Contains("CausalSelfAttention<8, 2, 4>::backward") &&
                        Catch::Contains("7 rows") && Catch::Contains("Context 4"));
  }
  SECTION("views of the wrong width or more rows than the slot") {
    std::vector<float> big(12 * 24);
    const std::string w = message_of<ShapeError>([&] {
      Attention::forward(ctx, nullptr, ConstMatrix{s.x.data(), 8, 8}, Matrix{s.y.data(), 8, 8},
                         s.saved);
    });
    REQUIRE_THAT(w, Catch::Contains("CausalSelfAttention<8, 2, 4>::forward"));
    const std::string r = message_of<ShapeError>([&] {
      Attention::forward(ctx, nullptr, ConstMatrix{big.data(), 12, 24}, Matrix{big.data(), 12, 8},
                         s.saved);
    });
    REQUIRE_THAT(r, Catch::Contains("at most 8"));
  }
  SECTION("a NaN in a query names its row, head and column") {
    s.x[5 * 24 + 1] = std::numeric_limits<float>::quiet_NaN();  // row 5, q of head 0
    const std::string m = message_of<NumericError>([&] { s.forward(ctx); });
    REQUIRE_THAT(m, Catch::Contains("CausalSelfAttention<8, 2, 4>") &&
                        Catch::Contains("row 5 (head 0)") &&
                        Catch::Contains("input row 5, column 1 (q) holds NaN"));
  }
  SECTION("an infinite key spoils its own row and the later ones: the first is named") {
    s.x[1 * 24 + 8 + 6] = std::numeric_limits<float>::infinity();  // row 1, k of head 1
    const std::string m = message_of<NumericError>([&] { s.forward(ctx); });
    REQUIRE_THAT(m, Catch::Contains("row 1 (head 1)") &&
                        Catch::Contains("input row 1, column 14 (k) holds +inf"));
  }
  SECTION("finite inputs whose scores overflow") {
    for (index_t c = 0; c < 4; ++c) s.x[c] = s.x[8 + c] = 1e30f;  // row 0, q and k of head 0
    const std::string m = message_of<NumericError>([&] { s.forward(ctx); });
    REQUIRE_THAT(m, Catch::Contains("row 0 (head 0)") && Catch::Contains("overflowed"));
  }
}

TEST_CASE("A stage Linear, CausalSelfAttention, Linear trains", "[layers][attention][stage]") {
  using Net = Stage<Linear<8, 24>, Attention, Linear<8, 8>>;
  STATIC_REQUIRE(Net::in_width == 8);
  STATIC_REQUIRE(Net::out_width == 8);
  STATIC_REQUIRE(Net::row_group == 4);
  STATIC_REQUIRE(Net::splits_backward<Host>);
  STATIC_REQUIRE(Net::macs == 8 * 24 + 40 + 8 * 8);
  // A slot: the boundaries (8 rows of 24, 8, 8) and the attention's P (8 rows of 2 x 4); the
  // stage's workspace: its arena for dP and dS (as many).
  STATIC_REQUIRE(Net::activation_floats(8) == 8 * (24 + 8 + 8) + 64);
  STATIC_REQUIRE(Net::workspace_floats<Host>(8) == 64);

  const HostContext ctx{.threads = 2};
  const index_t rows = 8;
  std::vector<float> p(Net::param_count), g(Net::param_count), x(rows * 8), dy(rows * 8),
      dx(rows * 8);
  Net::init(p, 3);
  Rng rng{71};
  xpipe::test::fill_uniform(x, rng);
  xpipe::test::fill_uniform(dy, rng);
  Net::Activations<Host> acts(rows);
  Net::GradScratch<Host> scratch(rows);
  Net::forward(ctx, p.data(), ConstMatrix{x.data(), rows, 8}, acts);
  Net::backward(ctx, p.data(), g.data(), false, acts, ConstMatrix{dy.data(), rows, 8},
                Matrix{dx.data(), rows, 8}, scratch);

  // Every parameter and input gradient against central differences of sum(out * dy).
  Net::Activations<Host> other(rows);
  const auto objective = [&] {
    const ConstMatrix out = Net::forward(ctx, p.data(), ConstMatrix{x.data(), rows, 8}, other);
    return dot(std::span(out.data, static_cast<std::size_t>(out.size())), dy);
  };
  for (std::size_t i = 0; i < p.size(); ++i) {
    INFO("parameter gradient " << i);
    REQUIRE(g[i] == Approx(central(p, i, objective)).margin(2e-3).epsilon(2e-3));
  }
  for (std::size_t i = 0; i < x.size(); ++i) {
    INFO("input gradient " << i);
    REQUIRE(dx[i] == Approx(central(x, i, objective)).margin(2e-3).epsilon(2e-3));
  }

  // The split backward (zero-bubble schedules) gives the same bits.
  Net::Activations<Host> split(rows, {.kept_gradients = true});
  std::vector<float> g_split(Net::param_count, -1.f), dx_split(rows * 8);
  Net::forward(ctx, p.data(), ConstMatrix{x.data(), rows, 8}, split);
  Net::backward_input(ctx, p.data(), split, ConstMatrix{dy.data(), rows, 8},
                      Matrix{dx_split.data(), rows, 8}, scratch);
  Net::backward_weight(ctx, g_split.data(), false, split);
  REQUIRE(dx_split == dx);
  REQUIRE(same_blocks<Net>(g_split, g));
}

TEST_CASE("Two attention layers of a stage share one arena and keep their bits",
          "[layers][attention][stage][workspace]") {
  using Net = Stage<Linear<8, 24>, Attention, Linear<8, 24>, Attention, Linear<8, 8>>;
  using Acts = Net::Activations<Host>;
  // One room for dP and dS, 8 rows of 2 heads x 4 positions, not one per attention layer.
  STATIC_REQUIRE(Net::arena_floats<Host>(8) == 64);
  STATIC_REQUIRE(Net::workspace_floats<Host>(8) == 64);
  const HostContext ctx{.threads = 2};
  const index_t rows = 4, batch = 8;
  std::vector<float> p(Net::param_count), x(batch * 8), dy(batch * 8);
  Net::init(p, 5);
  Rng rng{72};
  xpipe::test::fill_uniform(x, rng);
  xpipe::test::fill_uniform(dy, rng);
  Net::Workspace<Host> ws(batch);
  REQUIRE(ws.get<1>().grads() == ws.arena());
  REQUIRE(ws.get<3>().grads() == ws.arena());

  // Two micro-batches of one sequence each in flight, and an evaluation of both between their
  // backwards: on the shared arena and on slots with room of their own, the same bits.
  const auto run = [&](Acts& a, Acts& b, Acts& e) {
    std::vector<float> g(Net::param_count), dx(batch * 8);
    Net::GradScratch<Host> scratch(batch);
    Net::forward(ctx, p.data(), ConstMatrix{x.data(), rows, 8}, a);
    Net::forward(ctx, p.data(), ConstMatrix{x.data() + rows * 8, rows, 8}, b);
    Net::backward(ctx, p.data(), g.data(), false, a, ConstMatrix{dy.data(), rows, 8},
                  Matrix{dx.data(), rows, 8}, scratch);
    const ConstMatrix out = Net::forward(ctx, p.data(), ConstMatrix{x.data(), batch, 8}, e);
    std::vector<float> all(g);
    all.insert(all.end(), out.data, out.data + batch * 8);
    Net::backward(ctx, p.data(), g.data(), true, b, ConstMatrix{dy.data() + rows * 8, rows, 8},
                  Matrix{dx.data() + rows * 8, rows, 8}, scratch);
    all.insert(all.end(), g.begin(), g.end());
    all.insert(all.end(), dx.begin(), dx.end());
    return all;
  };
  Acts a(rows, {}, &ws), b(rows, {}, &ws), e(batch, {}, &ws);
  Acts a_own(rows), b_own(rows), e_own(batch);
  REQUIRE(&*a.saved<3>().workspace == &ws.get<3>());
  REQUIRE(a_own.saved<1>().workspace->grads() != b_own.saved<1>().workspace->grads());
  const std::vector<float> shared = run(a, b, e);
  REQUIRE(shared == run(a_own, b_own, e_own));
  for (float v : shared) REQUIRE(std::isfinite(v));
}

TEST_CASE("Embedding's layout and seeded init", "[layers][embedding]") {
  using E = Embedding<10, 4, 8>;
  STATIC_REQUIRE(Layer<E>);
  STATIC_REQUIRE(splits_backward<E>);
  STATIC_REQUIRE(!keeps_saved<E>);
  STATIC_REQUIRE(E::in_width == 2);
  STATIC_REQUIRE(E::out_width == 8);
  STATIC_REQUIRE(E::param_count == (10 + 4) * 8);
  STATIC_REQUIRE(macs_of<E>() == 0.0);
  REQUIRE(E::name() == "Embedding<10, 4, 8>");

  // Same seed, same bits; another seed, other values; N(0, 0.02) over a large table.
  using Big = Embedding<1000, 24, 64>;
  std::vector<float> a(Big::param_count), b(Big::param_count), c(Big::param_count);
  Big::init(a, 7);
  Big::init(b, 7);
  Big::init(c, 8);
  REQUIRE(a == b);
  REQUIRE(a != c);
  double sum = 0, squares = 0;
  for (float v : a) {
    sum += v;
    squares += static_cast<double>(v) * v;
  }
  const double n = static_cast<double>(a.size()), mean = sum / n;
  // 65536 draws: the mean's standard error is 0.02 / 256, the spread's about 0.02 / 362.
  REQUIRE(std::fabs(mean) < 0.0005);
  REQUIRE(std::sqrt(squares / n - mean * mean) == Approx(0.02).epsilon(0.02));
}

TEST_CASE("Embedding looks up and adds the two tables", "[layers][embedding]") {
  using E = Embedding<5, 3, 4>;
  const HostContext ctx{.threads = 1};
  EmbeddingSlot<E> s(4);
  for (std::size_t i = 0; i < s.p.size(); ++i) s.p[i] = static_cast<float>(i);
  // Token rows start at 4 id, position rows at 20 + 4 pos: y(r, c) = 4 id + 20 + 4 pos + 2 c.
  const std::array<std::array<int, 2>, 4> rows{{{0, 0}, {4, 2}, {2, 1}, {4, 0}}};
  for (index_t r = 0; r < 4; ++r) s.set_row(r, rows[r][0], rows[r][1]);
  s.forward(ctx);
  for (index_t r = 0; r < 4; ++r)
    for (index_t c = 0; c < 4; ++c) {
      INFO("row " << r << ", column " << c);
      REQUIRE(s.y[r * 4 + c] == static_cast<float>(4 * rows[r][0] + 20 + 4 * rows[r][1] + 2 * c));
    }
}

TEST_CASE("Embedding's table gradients match central finite differences",
          "[layers][embedding][fd]") {
  using E = Embedding<5, 3, 4>;
  const HostContext ctx{.threads = 1};
  EmbeddingSlot<E> s(9);
  randomize(s, 5, 3, 81);
  std::fill(s.g.begin(), s.g.end(), 123.f);  // overwritten, not added to
  std::fill(s.dx.begin(), s.dx.end(), 7.f);
  s.forward(ctx);
  s.backward(ctx);
  for (float v : s.dx) REQUIRE(v == 0.f);
  const auto objective = [&] {
    std::vector<float> y(s.y.size());
    E::forward(ctx, s.p.data(), s.input(), Matrix{y.data(), s.rows, 4});
    return dot(y, s.dy);
  };
  for (std::size_t i = 0; i < s.p.size(); ++i) {
    INFO("parameter gradient " << i << (i < 20 ? " (token table)" : " (position table)"));
    REQUIRE(s.g[i] == Approx(central(s.p, i, objective)).margin(1e-4).epsilon(1e-4));
  }
  // Accumulating adds the same gradient to what the buffer holds (the rows' terms then join
  // 0.5 one by one, so equal up to rounding).
  const std::vector<float> fresh = s.g;
  std::fill(s.g.begin(), s.g.end(), 0.5f);
  s.backward(ctx, true);
  for (std::size_t i = 0; i < fresh.size(); ++i)
    REQUIRE(s.g[i] == Approx(fresh[i] + 0.5).margin(1e-6).epsilon(1e-6));
  // The split backward gives the bits of the whole one; the input part writes only zeros.
  std::vector<float> g_split(E::param_count, -3.f), dx_split(s.dx.size(), 9.f);
  E::backward_input(ctx, s.p.data(), s.input(), ConstMatrix{s.y.data(), s.rows, 4},
                    Matrix{s.dy.data(), s.rows, 4}, Matrix{dx_split.data(), s.rows, 2});
  E::backward_weight(ctx, g_split.data(), false, s.input(), ConstMatrix{s.y.data(), s.rows, 4},
                     ConstMatrix{s.dy.data(), s.rows, 4});
  REQUIRE(g_split == fresh);
  for (float v : dx_split) REQUIRE(v == 0.f);
}

TEST_CASE("Embedding gives the same bits run to run and on any thread count",
          "[layers][embedding]") {
  // Large enough for both loops to fork: 1024 rows of 64 (forward), 4 column blocks over
  // (512 + 64 + 1024) x 64 elements (backward); ids from 50 values, so rows collide.
  using E = Embedding<512, 64, 64>;
  EmbeddingSlot<E> one(1024);
  randomize(one, 50, 64, 91);
  one.forward(HostContext{.threads = 1});
  one.backward(HostContext{.threads = 1});
  for (int threads : {1, 2, 3}) {
    INFO(threads << " threads");
    EmbeddingSlot<E> again(1024);
    again.p = one.p;
    again.x = one.x;
    again.dy = one.dy;
    again.forward(HostContext{.threads = threads});
    again.backward(HostContext{.threads = threads});
    REQUIRE(again.y == one.y);
    REQUIRE(again.g == one.g);
  }
}

TEST_CASE("Embedding refuses bad ids and positions before writing", "[layers][embedding]") {
  using E = Embedding<10, 4, 8>;
  const HostContext ctx{.threads = 1};
  EmbeddingSlot<E> s(6);
  randomize(s, 10, 4, 3);
  std::fill(s.y.begin(), s.y.end(), -7.f);
  const auto refused = [&](index_t r, float id, float pos) {
    s.x[2 * r] = id;
    s.x[2 * r + 1] = pos;
    const std::string m = message_of<DataError>([&] { s.forward(ctx); });
    for (float v : s.y) REQUIRE(v == -7.f);
    return m;
  };
  SECTION("an id past the vocabulary") {
    REQUIRE(refused(4, 10.f, 0.f) ==
            "xpipe: Embedding<10, 4, 8>::forward: row 4, column 0 (token id): 10 is outside 0..9");
  }
  SECTION("a negative id") {
    REQUIRE_THAT(refused(2, -1.f, 0.f),
                 Catch::Contains("row 2, column 0 (token id): -1 is outside 0..9"));
  }
  SECTION("a position past the context") {
    REQUIRE(refused(5, 3.f, 4.f) ==
            "xpipe: Embedding<10, 4, 8>::forward: row 5, column 1 (position): 4 is outside 0..3");
  }
  SECTION("an id that is not a whole number") {
    REQUIRE_THAT(refused(1, 2.5f, 0.f),
                 Catch::Contains("row 1, column 0 (token id): 2.5 is not a whole number"));
  }
  SECTION("a position that is NaN") {
    REQUIRE_THAT(refused(3, 1.f, std::numeric_limits<float>::quiet_NaN()),
                 Catch::Contains("row 3, column 1 (position): nan is not a whole number"));
  }
  SECTION("the weight gradient checks the ids too") {
    s.x[0] = 11.f;
    const std::string m = message_of<DataError>([&] {
      E::backward_weight(ctx, s.g.data(), false, s.input(), ConstMatrix{s.y.data(), 6, 8},
                         ConstMatrix{s.dy.data(), 6, 8});
    });
    REQUIRE_THAT(m, Catch::Contains("Embedding<10, 4, 8>::backward_weight: row 0"));
  }
}

TEST_CASE("A stage Embedding, Linear runs forward and backward", "[layers][embedding][stage]") {
  // Against the same math done here in double: y = (tokens[id] + positions[pos]) W + b; the
  // token table's gradient row v is the sum of dz = dy W^T over the rows with id v (likewise
  // the positions), every other row 0.
  using E = Embedding<6, 4, 8>;
  using Net = Stage<E, Linear<8, 5>>;
  STATIC_REQUIRE(Net::in_width == 2);
  STATIC_REQUIRE(Net::out_width == 5);
  STATIC_REQUIRE(Net::splits_backward<Host>);
  STATIC_REQUIRE(Net::param_offsets == std::array<index_t, 3>{0, 80, 128});
  const HostContext ctx{.threads = 2};
  const index_t rows = 8;
  std::vector<float> p(Net::param_count), g(Net::param_count, 9.f), x(rows * 2), dy(rows * 5);
  Net::init(p, 17);
  Rng rng{101};
  for (index_t r = 0; r < rows; ++r) {
    x[2 * r] = static_cast<float>(rng.below(3));  // ids 0..2: rows 3..5 of the table unused
    x[2 * r + 1] = static_cast<float>(r % 4);
  }
  xpipe::test::fill_uniform(dy, rng);
  Net::Activations<Host> acts(rows);
  Net::GradScratch<Host> scratch(rows);
  const ConstMatrix out = Net::forward(ctx, p.data(), ConstMatrix{x.data(), rows, 2}, acts);
  Net::backward(ctx, p.data(), g.data(), false, acts, ConstMatrix{dy.data(), rows, 5}, Matrix{},
                scratch);
  const float* tokens = p.data();
  const float* positions = p.data() + 48;
  const float* w = p.data() + Net::param_offsets[1];
  const float* bias = w + 40;
  std::vector<double> want_g(80, 0.0);
  for (index_t r = 0; r < rows; ++r) {
    const auto id = static_cast<index_t>(x[2 * r]), pos = static_cast<index_t>(x[2 * r + 1]);
    for (index_t o = 0; o < 5; ++o) {
      double y = bias[o];
      for (index_t i = 0; i < 8; ++i)
        y += (static_cast<double>(tokens[id * 8 + i]) + positions[pos * 8 + i]) * w[i * 5 + o];
      INFO("row " << r << ", output " << o);
      REQUIRE(out(r, o) == Approx(y).margin(1e-6).epsilon(1e-5));
    }
    for (index_t i = 0; i < 8; ++i) {
      double dz = 0;
      for (index_t o = 0; o < 5; ++o) dz += static_cast<double>(dy[r * 5 + o]) * w[i * 5 + o];
      want_g[id * 8 + i] += dz;
      want_g[48 + pos * 8 + i] += dz;
    }
  }
  for (index_t i = 0; i < 80; ++i) {
    INFO("embedding gradient " << i);
    if (i >= 24 && i < 48)
      REQUIRE(g[i] == 0.f);  // ids 3..5 never read
    else
      REQUIRE(g[i] == Approx(want_g[i]).margin(1e-6).epsilon(1e-5));
  }

  // The split backward gives the same bits.
  Net::Activations<Host> split(rows, {.kept_gradients = true});
  std::vector<float> g_split(Net::param_count, -1.f);
  Net::forward(ctx, p.data(), ConstMatrix{x.data(), rows, 2}, split);
  Net::backward_input(ctx, p.data(), split, ConstMatrix{dy.data(), rows, 5}, Matrix{}, scratch);
  Net::backward_weight(ctx, g_split.data(), false, split);
  REQUIRE(same_blocks<Net>(g_split, g));
}
