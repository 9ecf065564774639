// BatchNorm2d and residual blocks on the host: against PyTorch (fixtures/block_expected.hpp, made
// by fixtures/make_block_fixtures.py), central finite differences, hand-worked values, bad input.
#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "fixtures/block_expected.hpp"
#include "support/compare.hpp"
#include "support/support.hpp"
#include "xpipe/layers/batchnorm.hpp"
#include "xpipe/layers/residual.hpp"
#include "xpipe/xpipe.hpp"

namespace {

using xpipe::BatchNorm2d;
using xpipe::ConstMatrix;
using xpipe::ConvOptions;
using xpipe::HostContext;
using xpipe::index_t;
using xpipe::Matrix;
using xpipe::Running;
using xpipe::Shape;

// One activation slot of a layer that keeps state (BatchNorm2d, a residual block): its operands,
// its state buffer (initialised by L::init_state) and its Saved.
template <class L>
struct Slot {
  using layer = L;
  index_t rows;
  std::vector<float> p, g, state, x, y, dy, dx;
  typename L::template Saved<xpipe::Host> saved;
  explicit Slot(index_t n)
      : rows(n),
        p(L::param_count, 0.f),
        g(L::param_count, 0.f),
        state(L::state_count),
        x(n * L::in_width),
        y(n * L::out_width),
        dy(n * L::out_width),
        dx(n * L::in_width),
        saved(n) {
    L::init_state(state);
  }
  ConstMatrix input() const { return {x.data(), rows, L::in_width}; }
  void forward(const HostContext& ctx, bool training = true, bool with_state = true) {
    L::forward(ctx, p.data(), input(), Matrix{y.data(), rows, L::out_width}, saved,
               Running{with_state ? state.data() : nullptr, training});
  }
  void backward(const HostContext& ctx, bool accumulate = false) {
    L::backward(
        ctx, p.data(), g.data(), accumulate, input(), ConstMatrix{y.data(), rows, L::out_width},
        ConstMatrix{dy.data(), rows, L::out_width}, Matrix{dx.data(), rows, L::in_width}, saved);
  }
};

// PyTorch's values within 1e-5 + 1e-4 |want| (the fixtures are float64).
void require_close(std::span<const float> got, std::span<const float> want, const char* what) {
  xpipe::test::require_close(got, want, what, 1e-5f, 1e-4f);
}
using xpipe::test::central;
using xpipe::test::copy_into;
using xpipe::test::message_of;

// The backward of L (training mode) at s.p, s.x with upstream gradient s.dy, against central
// differences of sum(y * s.dy) over the whole micro-batch: BatchNorm couples the rows, so each
// input moves every output of its channel. Steps of 3e-3: the small blocks' BatchNorms (12
// values a channel) curve the objective enough that a step of 1e-2 was off by 2e-3 on one
// weight of the projected block (truncation: 1.8e-2 at 3e-2, 2e-3 at 1e-2, 3e-4 at 3e-3, the
// analytic value matching PyTorch's in the fixture cases), while float rounding stays ~1e-4.
template <class L>
void check_finite_differences(Slot<L>& s, const HostContext& ctx) {
  constexpr float h = 3e-3f;
  s.forward(ctx, true, false);
  s.backward(ctx);
  typename L::template Saved<xpipe::Host> other(s.rows);
  const auto objective = [&] {
    std::vector<float> y(s.y.size());
    L::forward(ctx, s.p.data(), s.input(), Matrix{y.data(), s.rows, L::out_width}, other,
               Running{nullptr, true});
    double sum = 0;
    for (std::size_t i = 0; i < y.size(); ++i) sum += static_cast<double>(y[i]) * s.dy[i];
    return sum;
  };
  for (std::size_t i = 0; i < s.x.size(); ++i) {
    INFO("input gradient " << i);
    REQUIRE(s.dx[i] == Approx(central(s.x, i, objective, h)).margin(1e-3).epsilon(1e-3));
  }
  for (std::size_t i = 0; i < s.p.size(); ++i) {
    INFO("parameter gradient " << i);
    REQUIRE(s.g[i] == Approx(central(s.p, i, objective, h)).margin(1e-3).epsilon(1e-3));
  }
}

// Parameters from L's own init, then moved at random so no BatchNorm sits at gamma 1, beta 0
// and no weight at its initial value.
template <class L>
void randomize(Slot<L>& s, std::uint64_t seed) {
  L::init(s.p, seed);
  xpipe::Rng rng{seed + 1};
  for (float& v : s.p) v += rng.uniform(-0.3f, 0.3f);
  xpipe::test::fill_uniform(s.x, rng);
  xpipe::test::fill_uniform(s.dy, rng);
}

using BN3 = BatchNorm2d<Shape<3, 4, 4>, xpipe::NormOptions{.eps = 1e-5f, .momentum = 0.1f}>;

using S8 = Shape<8, 6, 6>;
using Conv8 = xpipe::Conv2d<S8, 8, 3, ConvOptions{.padding = 1, .bias = false}>;
using IdentityBlock = xpipe::Residual<Conv8, BatchNorm2d<S8>, xpipe::ReLU, Conv8, BatchNorm2d<S8>>;

using S16 = Shape<16, 3, 3>;
using Projection = xpipe::Stage<xpipe::Conv2d<S8, 16, 1, ConvOptions{.stride = 2, .bias = false}>,
                                BatchNorm2d<S16>>;
using ProjectedBlock = xpipe::ProjectedResidual<
    Projection, xpipe::Conv2d<S8, 16, 3, ConvOptions{.stride = 2, .padding = 1, .bias = false}>,
    BatchNorm2d<S16>, xpipe::ReLU,
    xpipe::Conv2d<S16, 16, 3, ConvOptions{.padding = 1, .bias = false}>, BatchNorm2d<S16>>;

// Small blocks for finite differences: GELU instead of ReLU (no kink for a step to cross), and
// convolutions with biases (which the BatchNorm after them cancels: a gradient of 0).
using Small = Shape<2, 4, 4>;
using SmallConv = xpipe::Conv2d<Small, 2, 3, ConvOptions{.padding = 1}>;
using SmallResidual =
    xpipe::Residual<SmallConv, BatchNorm2d<Small>, xpipe::GELU, SmallConv, BatchNorm2d<Small>>;
using Half = Shape<3, 2, 2>;
using SmallProjected = xpipe::ProjectedResidual<
    xpipe::Stage<xpipe::Conv2d<Small, 3, 1, ConvOptions{.stride = 2}>, BatchNorm2d<Half>>,
    xpipe::Conv2d<Small, 3, 3, ConvOptions{.stride = 2, .padding = 1}>, BatchNorm2d<Half>,
    xpipe::GELU, xpipe::Conv2d<Half, 3, 3, ConvOptions{.padding = 1}>, BatchNorm2d<Half>>;

// Runs Block on a fixture case in training mode, from init_state's running statistics, and
// compares y, dx, every parameter gradient and the running statistics with PyTorch's.
template <class Block, class Case>
void check_block_against_torch(int threads) {
  const HostContext ctx{.threads = threads};
  const index_t rows = std::size(Case::x) / Block::in_width;
  Slot<Block> s(rows);
  REQUIRE(std::size(Case::params) == s.p.size());
  REQUIRE(std::size(Case::state) == s.state.size());
  copy_into(s.x, Case::x);
  copy_into(s.p, Case::params);
  copy_into(s.dy, Case::dy);
  s.forward(ctx);
  s.backward(ctx);
  require_close(s.y, Case::y, "y");
  require_close(s.dx, Case::dx, "dx");
  require_close(s.g, Case::grads, "parameter gradients");
  require_close(s.state, Case::state, "running statistics");
}

}  // namespace

TEST_CASE("BatchNorm2d's layout and state", "[layers][batchnorm]") {
  STATIC_REQUIRE(BN3::param_count == 6);
  STATIC_REQUIRE(BN3::state_count == 6);
  STATIC_REQUIRE(std::is_same_v<BN3::out_shape, Shape<3, 4, 4>>);
  STATIC_REQUIRE(xpipe::takes_running<BN3>);
  std::vector<float> p(6, -7.f), state(6, -7.f);
  BN3::init(p, 1);
  BN3::init_state(state);
  REQUIRE(p == std::vector<float>{1, 1, 1, 0, 0, 0});
  REQUIRE(state == std::vector<float>{0, 0, 0, 1, 1, 1});
  REQUIRE(BN3::name() == "BatchNorm2d<Shape<3, 4, 4>>");
}

TEST_CASE("BatchNorm2d matches PyTorch in training and evaluation and in its running statistics",
          "[layers][batchnorm][torch]") {
  using Case = block_expected::batch_norm;
  for (int threads : {1, 2}) {
    INFO(threads << " threads");
    const HostContext ctx{.threads = threads};
    Slot<BN3> s(5);
    copy_into(s.x, Case::x);
    copy_into(s.p, Case::gamma);
    copy_into(s.p, Case::beta, 3);
    copy_into(s.dy, Case::dy);
    REQUIRE(s.state == std::vector<float>{0, 0, 0, 1, 1, 1});
    s.forward(ctx);
    s.backward(ctx);
    require_close(s.y, Case::y, "y");
    require_close(s.dx, Case::dx, "dx");
    require_close(std::span(s.g).first(3), Case::dgamma, "dgamma");
    require_close(std::span(s.g).subspan(3), Case::dbeta, "dbeta");
    require_close(std::span(s.state).first(3), Case::mean1, "running mean after one step");
    require_close(std::span(s.state).subspan(3), Case::var1, "running variance after one step");

    copy_into(s.x, Case::x2);
    s.forward(ctx);
    require_close(std::span(s.state).first(3), Case::mean2, "running mean after two steps");
    require_close(std::span(s.state).subspan(3), Case::var2, "running variance after two steps");

    // Evaluation reads the running statistics and leaves them as they are.
    const std::vector<float> kept = s.state;
    copy_into(s.x, Case::x3);
    s.forward(ctx, false);
    require_close(s.y, Case::y_eval, "evaluation y");
    REQUIRE(s.state == kept);
  }
}

TEST_CASE("A residual block with the identity shortcut matches PyTorch",
          "[layers][residual][torch]") {
  using Case = block_expected::identity_block;
  // The fixture lays parameters out by Stage's rule, reproduced in Python: check it is this one.
  for (std::size_t i = 0; i < std::size(Case::param_offsets); ++i)
    REQUIRE(IdentityBlock::inner::param_offsets[i] == Case::param_offsets[i]);
  STATIC_REQUIRE(IdentityBlock::param_count == IdentityBlock::inner::param_count);
  STATIC_REQUIRE(IdentityBlock::state_count == 4 * 8);
  STATIC_REQUIRE(std::is_same_v<IdentityBlock::out_shape, S8>);
  for (int threads : {1, 2}) {
    INFO(threads << " threads");
    check_block_against_torch<IdentityBlock, Case>(threads);
  }
}

TEST_CASE("A residual block with a projected shortcut matches PyTorch",
          "[layers][residual][torch]") {
  using Case = block_expected::projected_block;
  for (std::size_t i = 0; i < std::size(Case::param_offsets); ++i)
    REQUIRE(ProjectedBlock::inner::param_offsets[i] == Case::param_offsets[i]);
  for (std::size_t i = 0; i < std::size(Case::shortcut_param_offsets); ++i)
    REQUIRE(Projection::param_offsets[i] == Case::shortcut_param_offsets[i]);
  STATIC_REQUIRE(ProjectedBlock::shortcut_offset == Case::shortcut_offset);
  STATIC_REQUIRE(ProjectedBlock::shortcut_offset % 16 == 0);
  STATIC_REQUIRE(ProjectedBlock::param_count ==
                 ProjectedBlock::shortcut_offset + Projection::param_count);
  STATIC_REQUIRE(ProjectedBlock::state_count == 6 * 16);
  STATIC_REQUIRE(std::is_same_v<ProjectedBlock::in_shape, S8>);
  STATIC_REQUIRE(std::is_same_v<ProjectedBlock::out_shape, S16>);
  for (int threads : {1, 2}) {
    INFO(threads << " threads");
    check_block_against_torch<ProjectedBlock, Case>(threads);
  }
}

namespace {

// The activation layer Act after an unfused layer: y = Act(t) and dt, the gradient at t of dy at
// y, for `rows` rows of width w.
template <class Act>
struct ActPass {
  std::vector<float> y, dt;
  ActPass(const HostContext& ctx, const std::vector<float>& t, const std::vector<float>& dy,
          index_t rows, int w)
      : y(t.size()), dt(t.size()) {
    Act::forward(ctx, nullptr, ConstMatrix{t.data(), rows, w}, Matrix{y.data(), rows, w});
    Act::backward(ctx, nullptr, nullptr, false, ConstMatrix{t.data(), rows, w},
                  ConstMatrix{y.data(), rows, w}, ConstMatrix{dy.data(), rows, w},
                  Matrix{dt.data(), rows, w});
  }
};

// A layer with an activation Act fused (BatchNormAct, ResidualAct: Fused) against the layer
// without it (Plain) then Act: y, the running state, dx and the parameter gradients bit for bit;
// the split backward on a slot made for it; evaluation.
template <class Fused, class Plain, class Act = xpipe::ReLU>
void check_fused_against_pair(int threads, std::uint64_t seed) {
  const HostContext ctx{.threads = threads};
  constexpr int w = Plain::out_width;
  const index_t rows = 5;
  Slot<Fused> f(rows);
  randomize(f, seed);
  // The pair: Plain into t, Act into y; back through Act into dt, then Plain.
  Slot<Plain> p(rows);
  p.p = f.p, p.x = f.x;
  p.forward(ctx);
  ActPass<Act> act(ctx, p.y, f.dy, rows, w);
  std::vector<float> y = act.y;
  p.dy = act.dt;
  p.backward(ctx);
  // Act is at work: ReLU zeroes a good share of the outputs, GELU changes its inputs.
  if constexpr (std::is_same_v<Act, xpipe::ReLU>)
    REQUIRE(std::count(y.begin(), y.end(), 0.f) > static_cast<std::ptrdiff_t>(y.size() / 4));
  else
    REQUIRE(y != p.y);
  const std::vector<float> state0 = f.state;
  f.forward(ctx);
  f.backward(ctx);
  CHECK(f.y == y);
  CHECK(f.state == p.state);
  CHECK(f.dx == p.dx);
  CHECK(f.g == p.g);
  // The split backward on a slot made for it (keeping gradients where the layer keeps any):
  // the input part (no parameter gradient), then the weight part.
  auto kept = xpipe::detail::make_saved<typename Fused::template Saved<xpipe::Host>>(rows, true);
  std::vector<float> state = state0, y2(f.y.size()), dx(f.dx.size(), -1.f), g(f.g.size(), -1.f),
                     dy = f.dy;
  Fused::forward(ctx, f.p.data(), f.input(), Matrix{y2.data(), rows, w}, kept,
                 Running{state.data(), true});
  CHECK(y2 == y);
  Fused::backward_input(ctx, f.p.data(), f.input(), ConstMatrix{y2.data(), rows, w},
                        Matrix{dy.data(), rows, w}, Matrix{dx.data(), rows, Fused::in_width}, kept);
  Fused::backward_weight(ctx, g.data(), false, f.input(), ConstMatrix{y2.data(), rows, w},
                         ConstMatrix{dy.data(), rows, w}, kept);
  CHECK(dx == f.dx);
  CHECK(g == f.g);
  // Evaluation with the running statistics.
  f.forward(ctx, false);
  p.forward(ctx, false);
  Act::forward(ctx, nullptr, ConstMatrix{p.y.data(), rows, w}, Matrix{y.data(), rows, w});
  CHECK(f.y == y);
}

// A BatchNormAct's backward on newer weights than its forward's, as an asynchronous pipeline
// without stashing runs it, against BatchNorm2d then Act: Act's gradient still follows the
// forward's (the fused layer makes Act's input again from the gamma and beta its forward kept,
// not the backward's, and never reads its output, which is NaN here when the backward runs). The
// newer gamma and beta change that input (for ReLU, the sign of some), so a gradient from them
// would differ.
template <class Fused, class Plain, class Act = xpipe::ReLU>
void check_fused_backward_on_newer_weights(int threads, std::uint64_t seed) {
  const HostContext ctx{.threads = threads};
  constexpr int w = Plain::out_width;
  const index_t rows = 5;
  Slot<Fused> a(rows);
  randomize(a, seed);
  const std::vector<float> state0 = a.state;  // before the forward moves it
  Slot<Plain> b(rows);
  b.p = a.p, b.x = a.x, b.state = a.state;
  a.forward(ctx);
  b.forward(ctx);
  std::vector<float> newer = a.p;
  constexpr int c = Plain::channels;
  for (int i = 0; i < c; ++i) {
    newer[static_cast<std::size_t>(i)] *= 1.5f;
    newer[static_cast<std::size_t>(c + i)] = 0.5f - newer[static_cast<std::size_t>(c + i)];
  }
  a.p = b.p = newer;
  const ActPass<Act> act(ctx, b.y, a.dy, rows, w);
  b.dy = act.dt;
  b.backward(ctx);
  CHECK(a.y == act.y);
  std::fill(a.y.begin(), a.y.end(), std::numeric_limits<float>::quiet_NaN());
  a.backward(ctx);
  CHECK(a.dx == b.dx);
  CHECK(a.g == b.g);
  // What a mask from the backward's weights would give: the newer weights' own forward (the
  // same statistics, which x alone sets) and backward. It differs, so the checks can fail.
  Slot<Fused> n(rows);
  n.p = newer, n.x = a.x, n.dy = a.dy, n.state = state0;
  n.forward(ctx);
  n.backward(ctx);
  CHECK(n.dx != a.dx);
}

// Stage<Conv8, Fused, Conv8> and Stage<Conv8, Plain, Act, Conv8> from one seed: the same
// parameters, so the fused layer takes the layer numbers of Plain and Act.
template <class Fused, class Plain, class Act = xpipe::ReLU>
void require_same_initial_weights() {
  using FusedStage = xpipe::Stage<Conv8, Fused, Conv8>;
  using PlainStage = xpipe::Stage<Conv8, Plain, Act, Conv8>;
  STATIC_REQUIRE(FusedStage::param_count == PlainStage::param_count);
  std::vector<float> fused(FusedStage::param_count), plain(PlainStage::param_count);
  FusedStage::init(fused, 7);
  PlainStage::init(plain, 7);
  REQUIRE(fused == plain);
}

}  // namespace

TEST_CASE("BatchNormAct has the bits of BatchNorm2d then ReLU, whole and split, and PyTorch's",
          "[layers][batchnorm][torch]") {
  using Fused = xpipe::BatchNormAct<S8, xpipe::ReLU>;
  using Plain = BatchNorm2d<S8>;
  STATIC_REQUIRE(Fused::param_count == Plain::param_count);
  STATIC_REQUIRE(Fused::state_count == Plain::state_count);
  STATIC_REQUIRE(xpipe::init_streams<Fused>() == 2);  // BatchNorm2d's and ReLU's layer numbers
  STATIC_REQUIRE(xpipe::splits_backward<Fused>);
  for (int threads : {1, 2}) {
    INFO(threads << " threads");
    // 8 channels: the host's channel sums take them as one short block; 21: a whole block of
    // 16 (the lanes in registers) and a short one of 5.
    check_fused_against_pair<Fused, Plain>(threads, 21);
    check_fused_against_pair<xpipe::BatchNormAct<Shape<21, 5, 5>, xpipe::ReLU>,
                             BatchNorm2d<Shape<21, 5, 5>>>(threads, 21);
    check_fused_backward_on_newer_weights<Fused, Plain>(threads, 22);
    check_fused_backward_on_newer_weights<xpipe::BatchNormAct<Shape<21, 5, 5>, xpipe::ReLU>,
                                          BatchNorm2d<Shape<21, 5, 5>>>(threads, 22);
  }
  // The same initial weights as the unfused stage from the same seed: the convolution after the
  // fused layer draws from the sub-stream it draws from after BatchNorm2d and ReLU.
  require_same_initial_weights<Fused, Plain>();
  // PyTorch's identity block (conv, BatchNorm, ReLU, conv, BatchNorm, plus x) with the first
  // BatchNorm and its ReLU fused: the parameters lie where the unfused block's do.
  using FusedBlock = xpipe::Residual<Conv8, Fused, Conv8, BatchNorm2d<S8>>;
  STATIC_REQUIRE(FusedBlock::param_count == IdentityBlock::param_count);
  check_block_against_torch<FusedBlock, block_expected::identity_block>(2);
  // Errors name the fused layer.
  Slot<Fused> s(2);
  REQUIRE(message_of<xpipe::ConfigError>([&] {
            s.forward(HostContext{}, false, false);
          }).find("BatchNormAct<Shape<8, 6, 6>, ReLU>::forward") != std::string::npos);
}

TEST_CASE("BatchNormAct with GELU has the bits of BatchNorm2d then GELU, whole and split",
          "[layers][batchnorm]") {
  // GELU's gradient needs its input, not its output: the fused backward makes the input again
  // from x, as it does for ReLU, so GELU fuses as ReLU does.
  using Fused = xpipe::BatchNormAct<S8, xpipe::GELU>;
  using Plain = BatchNorm2d<S8>;
  using Fused21 = xpipe::BatchNormAct<Shape<21, 5, 5>, xpipe::GELU>;
  using Plain21 = BatchNorm2d<Shape<21, 5, 5>>;
  STATIC_REQUIRE(Fused::param_count == Plain::param_count);
  STATIC_REQUIRE(xpipe::splits_backward<Fused>);
  for (int threads : {1, 2}) {
    INFO(threads << " threads");
    check_fused_against_pair<Fused, Plain, xpipe::GELU>(threads, 23);
    check_fused_against_pair<Fused21, Plain21, xpipe::GELU>(threads, 23);
    check_fused_backward_on_newer_weights<Fused, Plain, xpipe::GELU>(threads, 24);
    check_fused_backward_on_newer_weights<Fused21, Plain21, xpipe::GELU>(threads, 24);
  }
  require_same_initial_weights<Fused, Plain, xpipe::GELU>();
  Slot<Fused> s(2);
  REQUIRE(message_of<xpipe::ConfigError>([&] {
            s.forward(HostContext{}, false, false);
          }).find("BatchNormAct<Shape<8, 6, 6>, GELU>::forward") != std::string::npos);
}

TEST_CASE("ResidualAct has the bits of the block then ReLU, whole and split, and its weights",
          "[layers][residual]") {
  using BN8 = BatchNorm2d<S8>;
  using Fused = xpipe::ResidualAct<xpipe::ReLU, Conv8, BN8, xpipe::ReLU, Conv8, BN8>;
  using FusedProjected = xpipe::ProjectedResidualAct<
      xpipe::ReLU, Projection,
      xpipe::Conv2d<S8, 16, 3, ConvOptions{.stride = 2, .padding = 1, .bias = false}>,
      BatchNorm2d<S16>, xpipe::ReLU,
      xpipe::Conv2d<S16, 16, 3, ConvOptions{.padding = 1, .bias = false}>, BatchNorm2d<S16>>;
  STATIC_REQUIRE(Fused::param_count == IdentityBlock::param_count);
  STATIC_REQUIRE(Fused::state_count == IdentityBlock::state_count);
  STATIC_REQUIRE(xpipe::init_streams<Fused>() == 2);  // the block's and ReLU's layer numbers
  STATIC_REQUIRE(xpipe::init_streams<IdentityBlock>() == 1);
  STATIC_REQUIRE(xpipe::splits_backward<Fused>);
  for (int threads : {1, 2}) {
    INFO(threads << " threads");
    check_fused_against_pair<Fused, IdentityBlock>(threads, 23);
    check_fused_against_pair<FusedProjected, ProjectedBlock>(threads, 23);
  }
  // The same initial weights as the unfused stage from the same seed: the convolution after
  // the block draws from the sub-stream it draws from after the block and ReLU.
  require_same_initial_weights<Fused, IdentityBlock>();
  using FusedStage = xpipe::Stage<Conv8, Fused, Conv8>;
  using PlainStage = xpipe::Stage<Conv8, IdentityBlock, xpipe::ReLU, Conv8>;
  // A slot keeps one activation fewer, the sum before ReLU: 8 x 6 x 6 floats a row. Its
  // backward takes ReLU's gradient into the stage's arena instead, which the host's
  // convolutions leave empty: one such buffer per stage, what a block made alone allocates.
  STATIC_REQUIRE(PlainStage::activation_floats(4) - FusedStage::activation_floats(4) == 4 * 288);
  STATIC_REQUIRE(Fused::workspace_floats<xpipe::Host>(4) ==
                 IdentityBlock::workspace_floats<xpipe::Host>(4));
  STATIC_REQUIRE(FusedStage::arena_floats<xpipe::Host>(4) == 4 * 288);
  STATIC_REQUIRE(xpipe::Stage<Fused, Fused>::arena_floats<xpipe::Host>(4) == 4 * 288);
  Fused::Workspace<xpipe::Host> alone(4);
  REQUIRE(alone.room.own_floats() == 4 * 288);
  REQUIRE(alone.post_grad() != nullptr);
}

namespace {

// Block's forward (training, or evaluation on the running statistics) against its parts run one
// by one: the inner stage's forward, the shortcut's, then the sum (and Post) as a pass of its
// own, as blocks ran before their last BatchNorm took the sum into its pass. The same output and
// running statistics, bit for bit.
template <class Block>
void check_sum_in_last_layer(int threads, std::uint64_t seed, bool training) {
  const HostContext ctx{.threads = threads};
  const index_t rows = 5;
  Slot<Block> s(rows);
  randomize(s, seed);
  std::vector<float> state = s.state, y(s.y.size());
  s.forward(ctx, training);
  typename Block::inner::template Activations<xpipe::Host> inner(rows);
  const ConstMatrix f =
      Block::inner::forward(ctx, s.p.data(), s.input(), inner, Running{state.data(), training});
  const auto sum = [&](ConstMatrix skip) {
    xpipe::add_views<typename Block::post_function>(ctx, f, skip,
                                                    Matrix{y.data(), rows, Block::out_width});
  };
  if constexpr (Block::projected) {
    typename Block::shortcut::template Activations<xpipe::Host> acts(rows);
    sum(Block::shortcut::forward(ctx, s.p.data() + Block::shortcut_offset, s.input(), acts,
                                 Running{state.data() + Block::inner::state_count, training}));
  } else {
    sum(s.input());
  }
  CHECK(s.y == y);
  CHECK(s.state == state);
}

}  // namespace

TEST_CASE(
    "A block whose path ends in BatchNorm sums in its pass with the bits of a pass of its "
    "own",
    "[layers][residual]") {
  using BN8 = BatchNorm2d<S8>;
  using Fused = xpipe::ResidualAct<xpipe::ReLU, Conv8, BN8, xpipe::ReLU, Conv8, BN8>;
  STATIC_REQUIRE(IdentityBlock::sum_in_last_layer);
  STATIC_REQUIRE(Fused::sum_in_last_layer);
  STATIC_REQUIRE(ProjectedBlock::sum_in_last_layer);
  // A path that ends in a convolution sums in a pass of its own.
  using ConvLast = xpipe::Residual<Conv8, BN8, xpipe::ReLU, Conv8>;
  STATIC_REQUIRE_FALSE(ConvLast::sum_in_last_layer);
  // A slot keeps f's activations but its output, which is never written; the plain forward
  // refuses such a slot.
  STATIC_REQUIRE(IdentityBlock::saved_floats(4) ==
                 IdentityBlock::inner::activation_floats(4) - 4 * S8::size);
  STATIC_REQUIRE(ConvLast::saved_floats(4) == ConvLast::inner::activation_floats(4));
  {
    typename IdentityBlock::inner::template Activations<xpipe::Host> no_output(4,
                                                                               {.output = false});
    REQUIRE_FALSE(no_output.keeps_output());
    Slot<IdentityBlock> s(4);
    randomize(s, 30);
    REQUIRE(message_of<xpipe::ShapeError>([&] {
              IdentityBlock::inner::forward(HostContext{}, s.p.data(), s.input(), no_output,
                                            Running{s.state.data(), true});
            }).find("keeps no output") != std::string::npos);
  }
  for (int threads : {1, 2}) {
    INFO(threads << " threads");
    for (bool training : {true, false}) {  // the batch's statistics, or the running ones
      INFO((training ? "training" : "evaluation"));
      check_sum_in_last_layer<IdentityBlock>(threads, 31, training);
      check_sum_in_last_layer<Fused>(threads, 32, training);
      check_sum_in_last_layer<ProjectedBlock>(threads, 33, training);
    }
  }
}

TEST_CASE("Residual blocks lay out parameters and state as documented", "[layers][residual]") {
  // f's layers each start on a 16-float boundary: convolution 2x2x3x3 + 3 biases = 57 -> 64,
  // BatchNorm 6 -> 16, GELU 0, convolution 3x3x3x3 + 3 = 84 -> 96, BatchNorm 6 -> 16.
  STATIC_REQUIRE(SmallProjected::inner::param_offsets ==
                 std::array<index_t, 6>{0, 64, 80, 80, 176, 192});
  // The shortcut's block follows f's (1x1 convolution 9 -> 16, BatchNorm 6 -> 16).
  STATIC_REQUIRE(SmallProjected::shortcut_offset == 192);
  STATIC_REQUIRE(SmallProjected::param_count == 192 + 32);
  // State: f's two BatchNorms (mean and variance of 3 channels each), then the shortcut's.
  STATIC_REQUIRE(SmallProjected::inner::state_offsets == std::array<index_t, 6>{0, 0, 6, 6, 6, 12});
  STATIC_REQUIRE(SmallProjected::state_count == 18);
  STATIC_REQUIRE(SmallResidual::param_count == 128);
  STATIC_REQUIRE(SmallResidual::state_count == 8);
  std::vector<float> state(18, -7.f);
  SmallProjected::init_state(state);
  for (int bn = 0; bn < 3; ++bn)
    for (int c = 0; c < 3; ++c) {
      REQUIRE(state[6 * bn + c] == 0.f);
      REQUIRE(state[6 * bn + 3 + c] == 1.f);
    }
}

TEST_CASE("BatchNorm2d backward matches central finite differences", "[layers][batchnorm][fd]") {
  using L = BatchNorm2d<Shape<2, 3, 3>>;
  Slot<L> s(3);
  randomize(s, 21);
  check_finite_differences(s, HostContext{.threads = 1});
}

TEST_CASE("Residual blocks' backward matches central finite differences",
          "[layers][residual][fd]") {
  const HostContext ctx{.threads = 1};
  SECTION("identity shortcut") {
    Slot<SmallResidual> s(2);
    randomize(s, 31);
    check_finite_differences(s, ctx);
  }
  SECTION("projected shortcut") {
    Slot<SmallProjected> s(3);
    randomize(s, 41);
    check_finite_differences(s, ctx);
  }
}

TEST_CASE("BatchNorm2d on a hand-worked input", "[layers][batchnorm]") {
  // One channel of 1 x 2 pixels, two rows: 1, 2 | 3, 4. Mean 2.5, biased variance 1.25.
  using L = BatchNorm2d<Shape<1, 1, 2>>;
  const HostContext ctx{.threads = 1};
  Slot<L> s(2);
  s.x = {1, 2, 3, 4};
  s.p = {2.f, -1.f};  // gamma, beta
  s.dy = {1, 0, 0, 0};
  s.forward(ctx);
  s.backward(ctx);
  const double invstd = 1 / std::sqrt(1.25 + 1e-5);
  for (int i = 0; i < 4; ++i) {
    INFO("element " << i);
    REQUIRE(s.y[i] == Approx(2 * (s.x[i] - 2.5) * invstd - 1).epsilon(1e-6));
  }
  // dbeta = sum(dy) = 1; dgamma = sum(dy xhat) = xhat_0; dx_i = gamma invstd / 4
  // (4 dy_i - sum(dy) - xhat_i sum(dy xhat)), worked out per element.
  REQUIRE(s.g[1] == Approx(1.0));
  REQUIRE(s.g[0] == Approx(-1.5 * invstd).epsilon(1e-6));
  const double v = invstd * invstd;
  const std::array<double, 4> dx{0.5 * invstd * (3 - 2.25 * v), 0.5 * invstd * (-1 - 0.75 * v),
                                 0.5 * invstd * (-1 + 0.75 * v), 0.5 * invstd * (-1 + 2.25 * v)};
  for (int i = 0; i < 4; ++i) {
    INFO("input gradient " << i);
    REQUIRE(s.dx[i] == Approx(dx[i]).epsilon(1e-5));
  }
  // Running: 0.9 * 0 + 0.1 * 2.5, and 0.9 * 1 + 0.1 * the unbiased variance 5 / 3.
  REQUIRE(s.state[0] == Approx(0.25).epsilon(1e-6));
  REQUIRE(s.state[1] == Approx(0.9 + 0.1 * 5.0 / 3.0).epsilon(1e-6));
  s.forward(ctx, false);
  const double running_invstd = 1 / std::sqrt(0.9 + 0.1 * 5.0 / 3.0 + 1e-5);
  for (int i = 0; i < 4; ++i) {
    INFO("evaluation element " << i);
    REQUIRE(s.y[i] == Approx(2 * (s.x[i] - 0.25) * running_invstd - 1).epsilon(1e-6));
  }
}

TEST_CASE("BatchNorm2d refuses evaluation without state and names non-finite inputs",
          "[layers][batchnorm]") {
  const HostContext ctx{.threads = 1};
  Slot<BN3> s(5);
  BN3::init(s.p, 1);
  xpipe::Rng rng{3};
  xpipe::test::fill_uniform(s.x, rng);
  SECTION("evaluation needs the running statistics") {
    const std::string m = message_of<xpipe::ConfigError>([&] { s.forward(ctx, false, false); });
    REQUIRE_THAT(m, Catch::Contains("BatchNorm2d<Shape<3, 4, 4>>::forward") &&
                        Catch::Contains("running statistics"));
  }
  SECTION("a NaN names its channel and row") {
    s.x[1 * BN3::in_width + 5 * 3 + 1] = std::numeric_limits<float>::quiet_NaN();  // pixel 5
    const std::string m = message_of<xpipe::NumericError>([&] { s.forward(ctx); });
    REQUIRE_THAT(m, Catch::Contains("BatchNorm2d<Shape<3, 4, 4>>") &&
                        Catch::Contains("channel 1 ") && Catch::Contains("row 1 "));
    // Channel 1's running statistics keep their initial mean 0 and variance 1; the finite
    // channels 0 and 2 moved by momentum 0.1 towards the batch's.
    REQUIRE(s.state[1] == 0.f);
    REQUIRE(s.state[BN3::channels + 1] == 1.f);
    REQUIRE(s.state[0] != 0.f);
    REQUIRE(s.state[BN3::channels + 2] != 1.f);
  }
  SECTION("an infinity names its channel and row") {
    s.x[3 * BN3::in_width + 2] = -std::numeric_limits<float>::infinity();  // pixel 0
    const std::string m = message_of<xpipe::NumericError>([&] { s.forward(ctx); });
    REQUIRE_THAT(m, Catch::Contains("channel 2 ") && Catch::Contains("row 3 "));
  }
  SECTION("inside a residual block too") {
    Slot<SmallResidual> r(2);
    SmallResidual::init(r.p, 1);
    xpipe::test::fill_uniform(r.x, rng);
    r.x[1 * Small::size + 3] = std::numeric_limits<float>::quiet_NaN();
    const std::string m = message_of<xpipe::NumericError>([&] { r.forward(ctx); });
    REQUIRE_THAT(m, Catch::Contains("BatchNorm2d<Shape<2, 4, 4>>") && Catch::Contains("row 1 "));
  }
}

TEST_CASE("BatchNorm2d and residual blocks accumulate parameter gradients",
          "[layers][batchnorm][residual]") {
  const HostContext ctx{.threads = 2};
  // A fresh backward, then the same backward into a buffer holding 0.5 everywhere: each
  // gradient must come out 0.5 larger, the input gradient unchanged.
  const auto check = [&](auto& s) {
    s.forward(ctx);
    s.backward(ctx);
    const std::vector<float> fresh = s.g, dx = s.dx;
    bool any = false;
    for (float v : fresh) any = any || v != 0.f;
    REQUIRE(any);
    std::fill(s.g.begin(), s.g.end(), 0.5f);
    s.backward(ctx, true);
    REQUIRE(s.dx == dx);
    return fresh;
  };
  SECTION("BatchNorm2d") {
    Slot<BN3> s(5);
    randomize(s, 5);
    const std::vector<float> fresh = check(s);
    for (std::size_t i = 0; i < fresh.size(); ++i) REQUIRE(s.g[i] == Approx(fresh[i] + 0.5));
  }
  SECTION("Residual") {
    Slot<SmallResidual> s(2);
    randomize(s, 6);
    const std::vector<float> fresh = check(s);
    for (std::size_t i = 0; i < fresh.size(); ++i) REQUIRE(s.g[i] == Approx(fresh[i] + 0.5));
  }
  SECTION("ProjectedResidual, both paths") {
    Slot<SmallProjected> s(3);
    randomize(s, 7);
    const std::vector<float> fresh = check(s);
    const auto in_use = [](std::size_t i) {
      return i < SmallProjected::inner::param_count || i >= SmallProjected::shortcut_offset;
    };
    for (std::size_t i = 0; i < fresh.size(); ++i)
      if (in_use(i)) REQUIRE(s.g[i] == Approx(fresh[i] + 0.5));
  }
}

TEST_CASE("Residual blocks give the same parameter gradients without an input gradient",
          "[layers][residual]") {
  // The first layer of a model gets an empty dx; both paths must still reach their parameters.
  const HostContext ctx{.threads = 1};
  const auto check = [&](auto& s) {
    using L = typename std::remove_reference_t<decltype(s)>::layer;
    s.forward(ctx);
    s.backward(ctx);
    const std::vector<float> with_dx = s.g;
    std::fill(s.g.begin(), s.g.end(), 0.f);
    L::backward(ctx, s.p.data(), s.g.data(), false, s.input(),
                ConstMatrix{s.y.data(), s.rows, L::out_width},
                ConstMatrix{s.dy.data(), s.rows, L::out_width}, Matrix{}, s.saved);
    REQUIRE(s.g == with_dx);
  };
  SECTION("identity shortcut") {
    Slot<SmallResidual> s(2);
    randomize(s, 13);
    check(s);
  }
  SECTION("projected shortcut") {
    Slot<SmallProjected> s(3);
    randomize(s, 14);
    check(s);
  }
}

TEST_CASE("A stage of convolutions and BatchNorms around a residual block trains and evaluates",
          "[layers][residual][batchnorm]") {
  using S3 = Shape<3, 8, 8>;
  using S = Shape<8, 8, 8>;
  using C = xpipe::Conv2d<S, 8, 3, ConvOptions{.padding = 1, .bias = false}>;
  using Block = xpipe::Residual<C, BatchNorm2d<S>, xpipe::ReLU, C, BatchNorm2d<S>>;
  using Net =
      xpipe::Stage<xpipe::Conv2d<S3, 8, 3, ConvOptions{.padding = 1}>, BatchNorm2d<S>, xpipe::ReLU,
                   Block, xpipe::ReLU, xpipe::GlobalAvgPool<S>, xpipe::Linear<8, 4>>;
  // Three BatchNorms of 8 channels: a running mean and variance each.
  STATIC_REQUIRE(Net::state_count == 3 * 8 * 2);
  STATIC_REQUIRE(Net::state_offsets == std::array<index_t, 8>{0, 0, 16, 16, 48, 48, 48, 48});
  STATIC_REQUIRE(Net::out_width == 4);

  const HostContext ctx{.threads = 2};
  const index_t rows = 4;
  std::vector<float> p(Net::param_count), g(Net::param_count, 0.f), x(rows * Net::in_width),
      dy(rows * 4), dx(rows * Net::in_width), state(Net::state_count, -7.f);
  Net::init(p, 9);
  Net::init_state(state);
  // Every BatchNorm, the block's two included, starts from mean 0 and variance 1.
  for (index_t at : {index_t{0}, index_t{16}, index_t{32}}) {
    INFO("state at " << at);
    for (index_t c = 0; c < 8; ++c) {
      REQUIRE(state[at + c] == 0.f);
      REQUIRE(state[at + 8 + c] == 1.f);
    }
  }
  xpipe::Rng rng{12};
  xpipe::test::fill_uniform(x, rng);
  xpipe::test::fill_uniform(dy, rng);
  const ConstMatrix xv{x.data(), rows, Net::in_width};

  Net::Activations<xpipe::Host> acts(rows), other(rows);
  Net::GradScratch<xpipe::Host> scratch(rows);
  const ConstMatrix out = Net::forward(ctx, p.data(), xv, acts, Running{state.data(), true});
  const std::vector<float> trained(out.data, out.data + rows * 4);

  // The first BatchNorm's running mean moved by 0.1 of its batch mean (the convolution's output
  // per channel), so the stage handed it the front of the state buffer.
  const Matrix conv_out = acts.boundary(1);
  for (index_t c = 0; c < 8; ++c) {
    double mean = 0;
    for (index_t r = 0; r < rows; ++r)
      for (index_t i = 0; i < 64; ++i) mean += conv_out(r, i * 8 + c);  // channels-last
    mean /= rows * 64.0;
    INFO("channel " << c);
    REQUIRE(state[c] == Approx(0.1 * mean).margin(1e-6));
  }
  for (index_t i = 16; i < 48; ++i) {
    INFO("state " << i);
    REQUIRE(state[i] != (i % 16 < 8 ? 0.f : 1.f));  // the block's BatchNorms moved too
  }

  // Training without a state buffer: the same batch statistics, so the same output from a fresh
  // slot; and the state untouched, even through the slot that saw it last (nothing kept it).
  const std::vector<float> after_one = state;
  const ConstMatrix fresh = Net::forward(ctx, p.data(), xv, other);
  for (index_t i = 0; i < rows * 4; ++i) REQUIRE(fresh.data[i] == trained[i]);
  Net::forward(ctx, p.data(), xv, acts);
  REQUIRE(state == after_one);

  Net::backward(ctx, p.data(), g.data(), false, acts, ConstMatrix{dy.data(), rows, 4},
                Matrix{dx.data(), rows, Net::in_width}, scratch);
  for (std::size_t l : {0u, 1u, 3u, 6u}) {
    INFO("layer " << l);
    bool any = false;
    for (index_t i = Net::param_offsets[l]; i < Net::param_offsets[l + 1]; ++i)
      any = any || g[i] != 0.f;
    REQUIRE(any);
  }
  for (float v : dx) REQUIRE(std::isfinite(v));

  // Evaluation normalises with the running statistics: another output, the state untouched.
  const ConstMatrix eval = Net::forward(ctx, p.data(), xv, other, Running{state.data(), false});
  bool differs = false;
  for (index_t i = 0; i < rows * 4; ++i) {
    REQUIRE(std::isfinite(eval.data[i]));
    differs = differs || eval.data[i] != trained[i];
  }
  REQUIRE(differs);
  REQUIRE(state == after_one);
}

namespace {
// How far a channel sum may lie from the exact sum of its exact terms: its first level adds
// each lane's at most reduce_chunk / reduce_lanes = 32 terms in float, 31 additions, and each
// term is rounded `term_roundings` times in its own arithmetic. Recursive summation's bound
// (Higham, Accuracy and Stability of Numerical Algorithms, 4.2 and lemma 3.3) puts the lane
// within gamma_k = k u / (1 - k u), k = 31 + term_roundings and u = 2^-24, of the sum of the
// terms' magnitudes; the later levels, in double, add under 1e-13 of it. `magnitudes`: the sum
// of the terms' absolute values, in long double.
double channel_sum_bound(long double magnitudes, int term_roundings) {
  static_assert(xpipe::math::reduce_chunk / xpipe::math::reduce_lanes == 32);
  const double u = std::ldexp(1.0, -24), k = 31 + term_roundings;
  return (k * u / (1 - k * u) + 1e-13) * static_cast<double>(magnitudes) + 1e-30;
}
}  // namespace

TEST_CASE("BatchNorm2d's channel sums go level by level and equal a plain sum",
          "[layers][batchnorm]") {
  using xpipe::math::channel_sum_levels;
  using xpipe::math::channel_sum_partials;
  // Worked by hand with chunks of 128 terms of a plane: 128 rows of 28 x 28 give 7 chunks a
  // plane (6 of 128, one of 16), 896 sums, then ceil(896 / 128) = 7, then 1.
  STATIC_REQUIRE(xpipe::math::reduce_chunk == 128);
  CHECK(channel_sum_partials(128, 784, 1) == 896);
  CHECK(channel_sum_partials(128, 784, 2) == 7);
  CHECK(channel_sum_levels(128, 784) == 3);
  CHECK(channel_sum_levels(32, 49) == 2);  // 32 chunks of 49, then one
  CHECK(channel_sum_levels(1, 100) == 1);  // one chunk is the sum
  CHECK(channel_sum_levels(1, 1) == 0);    // one term
  CHECK(channel_sum_levels(300, 1) == 3);  // 300 one-term chunks, then 3, then 1
  // Against a sum in long double, term by term, for shapes of 0, 1, 2 and 3 levels, with fewer
  // channels than a host call sums at once (16), more, and not a multiple of it.
  for (const auto& [rows, channels, plane] : std::vector<std::array<int, 3>>{
           {1, 2, 1}, {1, 2, 100}, {3, 2, 49}, {5, 3, 300}, {130, 2, 784}, {3, 37, 49}}) {
    const xpipe::NormGeometry g{rows, channels, plane};
    std::vector<float> x(static_cast<std::size_t>(rows) * channels * plane);
    xpipe::Rng rng{static_cast<std::uint64_t>(rows + plane)};
    for (float& v : x) v = rng.uniform(-1.f, 3.f);
    std::vector<double> scratch(static_cast<std::size_t>(xpipe::batch_norm_scratch_doubles(g)));
    std::vector<double> out(static_cast<std::size_t>(channels));
    const ConstMatrix m{x.data(), rows, static_cast<index_t>(channels) * plane};
    xpipe::channel_sums(HostContext{}, g, xpipe::ops::ValueTerm{m}, scratch.data(), out.data());
    for (int c = 0; c < channels; ++c) {
      long double expected = 0, magnitudes = 0;
      for (int r = 0; r < rows; ++r)
        for (int i = 0; i < plane; ++i) {
          const float v = m(r, static_cast<index_t>(i) * channels + c);
          expected += v;
          magnitudes += std::abs(v);
        }
      INFO("rows " << rows << ", plane " << plane << ", channel " << c);
      CHECK(std::abs(out[static_cast<std::size_t>(c)] - static_cast<double>(expected)) <=
            channel_sum_bound(magnitudes, 0));
    }
    // The squared deviations about float means given here (a rounding for x - mean, one for
    // its square, one more to be safe where the compiler does not fuse the add).
    std::vector<float> means(static_cast<std::size_t>(channels));
    for (int c = 0; c < channels; ++c) means[static_cast<std::size_t>(c)] = 0.75f + 0.125f * c;
    xpipe::channel_sums(HostContext{}, g, xpipe::ops::SquaredDeviationTerm{m, means.data()},
                        scratch.data(), out.data());
    for (int c = 0; c < channels; ++c) {
      long double expected = 0;
      for (int r = 0; r < rows; ++r)
        for (int i = 0; i < plane; ++i) {
          const long double d =
              static_cast<long double>(m(r, static_cast<index_t>(i) * channels + c)) -
              means[static_cast<std::size_t>(c)];
          expected += d * d;
        }
      INFO("squared deviations: rows " << rows << ", plane " << plane << ", channel " << c);
      CHECK(std::abs(out[static_cast<std::size_t>(c)] - static_cast<double>(expected)) <=
            channel_sum_bound(expected, 3));
    }
  }
  // Whole numbers in [0, 2^17): every float lane (32 of them, under 2^22) is exact, and so is
  // every double after it, so the sum equals the exact one bit for bit. A later level in float
  // would round these 130 x 784 terms' sums (near 2^32, past float's 2^24).
  const xpipe::NormGeometry g{130, 2, 784};
  std::vector<float> x(static_cast<std::size_t>(130) * 2 * 784);
  xpipe::Rng rng{11};
  for (float& v : x) v = std::floor(rng.uniform(0.f, 131072.f));
  std::vector<double> scratch(static_cast<std::size_t>(xpipe::batch_norm_scratch_doubles(g)));
  std::vector<double> out(2);
  const ConstMatrix m{x.data(), 130, 2 * 784};
  xpipe::channel_sums(HostContext{.threads = 2}, g, xpipe::ops::ValueTerm{m}, scratch.data(),
                      out.data());
  for (int c = 0; c < 2; ++c) {
    std::int64_t expected = 0;
    for (int r = 0; r < 130; ++r)
      for (int i = 0; i < 784; ++i)
        expected += static_cast<std::int64_t>(m(r, static_cast<index_t>(i) * 2 + c));
    INFO("whole numbers, channel " << c);
    CHECK(std::abs(expected) > (std::int64_t{1} << 24));  // past float's exact integers
    CHECK(out[static_cast<std::size_t>(c)] == static_cast<double>(expected));
  }
}

TEST_CASE("BatchNorm2d's training statistics equal the batch's mean and 1 / sqrt(var + eps)",
          "[layers][batchnorm]") {
  // The mean and the biased variance over rows and pixels of each channel, in long double,
  // against batch_norm_statistics' float mean and invstd, within what the sums' bound allows:
  // the mean within channel_sum_bound / n and its rounding to float; the variance (squared
  // deviations about that mean, three roundings a term) relatively within its bound, plus
  // (mean's error / std)^2, and invstd within half of that and a few roundings (division,
  // square root, float). Channels of mean 1 and 40 (spread 1.15 and 0.58): the second is where
  // a variance taken as E[x^2] - E[x]^2 in float would lose digits.
  const int rows = 33, channels = 2, plane = 49;
  const xpipe::NormGeometry g{rows, channels, plane};
  std::vector<float> x(static_cast<std::size_t>(rows) * channels * plane);
  xpipe::Rng rng{5};
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = i % 2 == 0 ? rng.uniform(-1.f, 3.f) : rng.uniform(39.f, 41.f);
  std::vector<double> scratch(static_cast<std::size_t>(xpipe::batch_norm_scratch_doubles(g)));
  std::vector<float> stats(2 * channels);
  const ConstMatrix m{x.data(), rows, static_cast<index_t>(channels) * plane};
  xpipe::batch_norm_statistics(HostContext{}, g, m, stats.data(), nullptr, scratch.data());
  const long double n = static_cast<long double>(rows) * plane;
  const double u = std::ldexp(1.0, -24);
  for (int c = 0; c < channels; ++c) {
    long double sum = 0, magnitudes = 0, squares = 0;
    for (int r = 0; r < rows; ++r)
      for (int i = 0; i < plane; ++i) {
        sum += m(r, static_cast<index_t>(i) * channels + c);
        magnitudes += std::abs(m(r, static_cast<index_t>(i) * channels + c));
      }
    const long double mean = sum / n;
    for (int r = 0; r < rows; ++r)
      for (int i = 0; i < plane; ++i) {
        const long double d = m(r, static_cast<index_t>(i) * channels + c) - mean;
        squares += d * d;
      }
    const long double var = squares / n,
                      invstd = 1 / std::sqrt(var + static_cast<long double>(g.eps));
    const double mean_error =
        channel_sum_bound(magnitudes, 0) / static_cast<double>(n) + 2 * u * std::abs(mean);
    const double var_error = channel_sum_bound(squares, 3) / static_cast<double>(squares) +
                             mean_error * mean_error / static_cast<double>(var);
    INFO("channel " << c);
    CHECK(std::abs(stats[static_cast<std::size_t>(c)] - static_cast<double>(mean)) <= mean_error);
    CHECK(std::abs(stats[static_cast<std::size_t>(channels + c)] / static_cast<double>(invstd) -
                   1) <= var_error / 2 + 4 * u);
  }
}

TEST_CASE("The backward's two channel sums in one pass have the bits of one pass each",
          "[layers][batchnorm]") {
  // channel_sums of two terms (sum(dy) and sum(dy xhat) from one read of x and dy) against one
  // call per term, bit for bit; the pair against a long-double sum term by term, for shapes of
  // 0, 1, 2 and 3 levels, on one and two threads; and the first level summed one channel per
  // call (as a GPU thread does) against 16 channels per call (the host's), bit for bit.
  for (const int threads : {1, 2})
    for (const auto& [rows, channels, plane] : std::vector<std::array<int, 3>>{
             {1, 2, 1}, {1, 2, 100}, {3, 2, 49}, {5, 3, 300}, {130, 2, 784}, {4, 21, 196}}) {
      const xpipe::NormGeometry g{rows, channels, plane};
      const auto n = static_cast<std::size_t>(rows) * channels * plane;
      std::vector<float> x(n), dy(n), stats(2 * static_cast<std::size_t>(channels));
      xpipe::Rng rng{static_cast<std::uint64_t>(rows * 7 + plane)};
      for (float& v : x) v = rng.uniform(-1.f, 3.f);
      for (float& v : dy) v = rng.uniform(-2.f, 2.f);
      for (int c = 0; c < channels; ++c) {
        stats[static_cast<std::size_t>(c)] = 0.5f + 0.25f * static_cast<float>(c);  // mean
        stats[static_cast<std::size_t>(channels + c)] = 1.5f;                       // invstd
      }
      const index_t width = static_cast<index_t>(channels) * plane;
      const ConstMatrix xm{x.data(), rows, width}, dym{dy.data(), rows, width};
      const xpipe::ops::GradientTerm<> sum_dy{{xm, dym}};
      const xpipe::ops::GradientXhatTerm<> sum_dy_xhat{xm, {xm, dym}, stats.data(), channels};
      const HostContext ctx{.threads = threads};
      std::vector<double> scratch(static_cast<std::size_t>(xpipe::batch_norm_scratch_doubles(g)));
      std::vector<double> one_a(static_cast<std::size_t>(channels)), one_b(one_a.size());
      xpipe::channel_sums(ctx, g, sum_dy, scratch.data(), one_a.data());
      xpipe::channel_sums(ctx, g, sum_dy_xhat, scratch.data(), one_b.data());
      std::vector<double> pair_a(one_a.size(), -1), pair_b(one_a.size(), -1);
      xpipe::channel_sums(ctx, g, sum_dy, scratch.data(), pair_a.data(), sum_dy_xhat,
                          pair_b.data());
      INFO("threads " << threads << ", rows " << rows << ", channels " << channels << ", plane "
                      << plane);
      CHECK(pair_a == one_a);
      CHECK(pair_b == one_b);
      for (int c = 0; c < channels; ++c) {
        long double a = 0, b = 0, a_magnitudes = 0, b_magnitudes = 0;
        const float mean = stats[static_cast<std::size_t>(c)],
                    invstd = stats[static_cast<std::size_t>(channels + c)];
        for (int r = 0; r < rows; ++r)
          for (int i = 0; i < plane; ++i) {
            const index_t col = static_cast<index_t>(i) * channels + c;
            const long double term_b =
                static_cast<long double>(dym(r, col)) * ((xm(r, col) - mean) * invstd);
            a += dym(r, col);
            b += term_b;
            a_magnitudes += std::abs(dym(r, col));
            b_magnitudes += std::abs(term_b);
          }
        // dy exact; dy xhat one rounding (xhat taken in float here as there).
        CHECK(std::abs(pair_a[static_cast<std::size_t>(c)] - static_cast<double>(a)) <=
              channel_sum_bound(a_magnitudes, 0));
        CHECK(std::abs(pair_b[static_cast<std::size_t>(c)] - static_cast<double>(b)) <=
              channel_sum_bound(b_magnitudes, 1));
      }
      // Level 1 alone, by blocks of 16 channels and by single channels.
      const index_t chunks = xpipe::math::chunks_of(plane), partials = rows * chunks;
      const auto level1 = [&]<int Block>() {
        std::vector<double> a(static_cast<std::size_t>(channels * partials)), b(a.size());
        const index_t calls = partials * ((channels + Block - 1) / Block);
        xpipe::for_each_index(ctx, calls,
                              xpipe::ops::ChannelChunkSums<Block, xpipe::ops::GradientTerm<>,
                                                           xpipe::ops::GradientXhatTerm<>>{
                                  g, sum_dy, sum_dy_xhat, chunks, partials, a.data(), b.data()});
        a.insert(a.end(), b.begin(), b.end());
        return a;
      };
      CHECK(level1.operator()<16>() == level1.operator()<1>());
    }
}
