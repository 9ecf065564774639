// The split backward (zero-bubble schedules: backward_input now, backward_weight later) of
// Conv2d, BatchNorm2d, LayerNorm and residual blocks, on the host and on the emulated device
// (support/emulated_device.hpp, CUDA's convolution code): bitwise the whole backward's dx and
// gradients, and per slot, so other micro-batches may run between a micro-batch's two parts.
#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "support/emulated_device.hpp"
#include "support/support.hpp"
#include "xpipe/xpipe.hpp"

namespace {

using xpipe::ConstMatrix;
using xpipe::ConvOptions;
using xpipe::index_t;
using xpipe::Matrix;
using xpipe::Running;
using xpipe::Shape;
namespace test = xpipe::test;

// Where a check runs: the host, on two threads (oneDNN's bits depend on the count; the split
// must not change them), or a stream of the emulated device with its memory.
struct OnHost {
  using backend = xpipe::Host;
  xpipe::HostContext ctx{.threads = 2};
  void upload(const std::vector<float>& from, float* to) const {
    std::copy(from.begin(), from.end(), to);
  }
  std::vector<float> download(const float* from, index_t n) const { return {from, from + n}; }
};
struct OnDevice {
  using backend = test::EmulatedDevice;
  test::EmulatedStreamOwner owner{xpipe::Placement{.stage = 0}};
  const test::EmulatedContext& ctx = owner.ctx();
  void upload(const std::vector<float>& from, float* to) const {
    copy_from_host(ctx, from.data(), to, static_cast<index_t>(from.size()));
  }
  std::vector<float> download(const float* from, index_t n) const {
    std::vector<float> v(static_cast<std::size_t>(n));
    copy_to_host(ctx, from, v.data(), n);
    return v;
  }
};

std::vector<float> random_vector(index_t n, xpipe::Rng& rng) {
  std::vector<float> v(static_cast<std::size_t>(n));
  test::fill_uniform(v, rng);
  return v;
}

void require_bitwise(const std::vector<float>& split, const std::vector<float>& whole,
                     const char* what) {
  REQUIRE(split.size() == whole.size());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < split.size(); ++i)
    if (std::bit_cast<std::uint32_t>(split[i]) != std::bit_cast<std::uint32_t>(whole[i]))
      first = bad++ == 0 ? i : first;
  INFO(what << ": " << bad << " of " << split.size() << " differ, the first at " << first
            << ": split " << split[first] << ", whole " << whole[first]);
  CHECK(bad == 0);
}

// The parameters and gradients of one layer on a side, the gradients starting from `start`.
template <class L, class Side>
struct Params {
  using Buf = typename Side::backend::template Buffer<float>;
  Buf p{L::param_count}, g{L::param_count};
  Params(const Side& side, const std::vector<float>& params, const std::vector<float>& start) {
    side.upload(params, p.data());
    side.upload(start, g.data());
  }
  void reset(const Side& side, const std::vector<float>& start) { side.upload(start, g.data()); }
  std::vector<float> grads(const Side& side) const { return side.download(g.data(), g.size()); }
};

// One activation slot of layer L on a side: its input, output, the slot's own dy and dx, its
// state (running statistics, where L keeps any) and its Saved.
template <class L, class Side>
struct Slot {
  using B = typename Side::backend;
  using Buf = typename B::template Buffer<float>;
  const Side& side;
  index_t rows;
  Buf x, y, dy, dx, state;
  typename L::template Saved<B> saved;
  Slot(const Side& s, index_t capacity, index_t n, const std::vector<float>& input,
       const std::vector<float>& gradient)
      : side(s),
        rows(n),
        x(capacity * L::in_width),
        y(capacity * L::out_width),
        dy(capacity * L::out_width),
        dx(capacity * L::in_width),
        state(xpipe::state_count_of<L>()),
        saved(xpipe::detail::make_saved<typename L::template Saved<B>>(capacity, true)) {
    s.upload(input, x.data());
    s.upload(gradient, dy.data());
    if constexpr (xpipe::state_count_of<L>() > 0) {
      std::vector<float> init(static_cast<std::size_t>(xpipe::state_count_of<L>()));
      L::init_state(init);
      s.upload(init, state.data());
    }
  }
  ConstMatrix in() const { return {x.data(), rows, L::in_width}; }
  ConstMatrix out() const { return {y.data(), rows, L::out_width}; }
  Matrix grad_out() { return {dy.data(), rows, L::out_width}; }
  Matrix grad_in(bool with_dx) { return with_dx ? Matrix{dx.data(), rows, L::in_width} : Matrix{}; }

  void forward(const float* p) {
    const Matrix to{y.data(), rows, L::out_width};
    if constexpr (xpipe::takes_running<L, B>)
      L::forward(side.ctx, p, in(), to, saved, Running{state.data(), true});
    else
      L::forward(side.ctx, p, in(), to, saved);
  }
  void whole(const float* p, float* g, bool accumulate, bool with_dx) {
    L::backward(side.ctx, p, g, accumulate, in(), out(), grad_out(), grad_in(with_dx), saved);
  }
  void input(const float* p, bool with_dx) {
    L::backward_input(side.ctx, p, in(), out(), grad_out(), grad_in(with_dx), saved);
  }
  // The weight part with this slot's x, y and dy, and `from`'s Saved (this slot's own, unless
  // a self-check hands another's).
  void weight(float* g, bool accumulate, typename L::template Saved<B>& from) {
    L::backward_weight(side.ctx, g, accumulate, in(), out(), grad_out(), from);
  }
  void weight(float* g, bool accumulate) { weight(g, accumulate, saved); }
  std::vector<float> input_grad() const { return side.download(dx.data(), rows * L::in_width); }
};

// (a) For batches of 1, 3 and 8 rows in slots of 8, with and without dx, accumulating or not:
// forward then backward_input then backward_weight gives the whole backward's dx and gradients
// bit for bit. Self-check: the weight part with the other accumulate flag must differ.
template <class L, class Side>
void check_split_matches_whole(std::uint64_t seed) {
  const Side side;
  constexpr index_t capacity = 8;
  for (index_t rows : {index_t{1}, index_t{3}, capacity})
    for (bool with_dx : {true, false})
      for (bool accumulate : {false, true}) {
        INFO(rows << " rows, " << (with_dx ? "with" : "without") << " dx, accumulate "
                  << accumulate);
        xpipe::Rng rng{seed + static_cast<std::uint64_t>(rows)};
        const auto params = random_vector(L::param_count, rng);
        const auto start = random_vector(L::param_count, rng);
        const auto x = random_vector(rows * L::in_width, rng);
        const auto dy = random_vector(rows * L::out_width, rng);
        Params<L, Side> whole_p(side, params, start), split_p(side, params, start);
        Slot<L, Side> whole(side, capacity, rows, x, dy), split(side, capacity, rows, x, dy);

        whole.forward(whole_p.p.data());
        whole.whole(whole_p.p.data(), whole_p.g.data(), accumulate, with_dx);
        split.forward(split_p.p.data());
        split.input(split_p.p.data(), with_dx);
        split.weight(split_p.g.data(), accumulate);

        const auto want = whole_p.grads(side);
        require_bitwise(split_p.grads(side), want, "gradients");
        if (with_dx) {
          const auto dx = whole.input_grad();
          require_bitwise(split.input_grad(), dx, "dx");
          REQUIRE_FALSE(test::same_bits(dx, std::vector<float>(dx.size(), 0.f)));
        }
        // The weight part again (it reads only the slot) with the wrong flag: caught.
        split_p.reset(side, start);
        split.weight(split_p.g.data(), !accumulate);
        REQUIRE_FALSE(test::same_bits(split_p.grads(side), want));
      }
}

// (b) Two micro-batches a and b in slots of their own, interleaved as a zero-bubble schedule
// may run them: F a, F b, I a, I b, W b (writes), W a (adds); the same gradients and input
// gradients as whole backwards of b then a. Self-check, where the weight part reads what the
// input part left in Saved (`saved_carries`): W a run on b's Saved must give other gradients.
template <class L, class Side>
void check_interleaved_slots(std::uint64_t seed, bool saved_carries) {
  const Side side;
  constexpr index_t rows = 4;
  xpipe::Rng rng{seed};
  const auto params = random_vector(L::param_count, rng);
  const auto start = random_vector(L::param_count, rng);
  const auto xa = random_vector(rows * L::in_width, rng);
  const auto dya = random_vector(rows * L::out_width, rng);
  const auto xb = random_vector(rows * L::in_width, rng);
  const auto dyb = random_vector(rows * L::out_width, rng);

  Params<L, Side> ref(side, params, start);
  Slot<L, Side> wa(side, rows, rows, xa, dya), wb(side, rows, rows, xb, dyb);
  wa.forward(ref.p.data());
  wb.forward(ref.p.data());
  wb.whole(ref.p.data(), ref.g.data(), false, true);
  wa.whole(ref.p.data(), ref.g.data(), true, true);
  const auto want = ref.grads(side);

  Params<L, Side> got(side, params, start);
  Slot<L, Side> a(side, rows, rows, xa, dya), b(side, rows, rows, xb, dyb);
  a.forward(got.p.data());
  b.forward(got.p.data());
  a.input(got.p.data(), true);
  b.input(got.p.data(), true);
  b.weight(got.g.data(), false);
  a.weight(got.g.data(), true);
  require_bitwise(got.grads(side), want, "gradients");
  require_bitwise(a.input_grad(), wa.input_grad(), "dx of a");
  require_bitwise(b.input_grad(), wb.input_grad(), "dx of b");

  if (saved_carries) {
    got.reset(side, start);
    b.weight(got.g.data(), false);
    a.weight(got.g.data(), true, b.saved);
    REQUIRE_FALSE(test::same_bits(got.grads(side), want));
  }
}

// A test layer whose input part overwrites dy, as Dense's writes dz there: y = x + b[c] per
// channel c of an S image. The input part writes dx = dy, then dy = -dy; the weight part sums
// the negation back (exactly): db[c] (+)= sum over rows and pixels of dy, the whole backward's
// bits. A residual block that handed such a layer the dy it still needs would go wrong.
template <xpipe::ImageShape S>
struct NegatingBias {
  using in_shape = S;
  using out_shape = S;
  static constexpr int in_width = S::size, out_width = S::size;
  static constexpr index_t param_count = S::channels;
  static constexpr index_t plane = S::height * S::width;
  static void init(std::span<float> p, std::uint64_t) { std::fill(p.begin(), p.end(), 0.f); }

  struct AddBias {
    ConstMatrix x;
    Matrix y;
    const float* b;
    XPIPE_HOST_DEVICE void operator()(index_t r, index_t i) const {
      y(r, i) = x(r, i) + b[i / plane];
    }
  };
  struct Copy {  // to = sign * from
    ConstMatrix from;
    Matrix to;
    float sign;
    XPIPE_HOST_DEVICE void operator()(index_t r, index_t i) const { to(r, i) = sign * from(r, i); }
  };
  struct Sums {  // db[c] (+)= sign * (sum over rows, then pixels, of dy)
    ConstMatrix dy;
    float* db;
    float sign;
    bool accumulate;
    XPIPE_HOST_DEVICE void operator()(index_t c) const {
      float s = 0.f;
      for (index_t r = 0; r < dy.rows; ++r)
        for (index_t i = 0; i < plane; ++i) s += sign * dy(r, c * plane + i);
      db[c] = (accumulate ? db[c] : 0.f) + s;
    }
  };

  template <class Ctx>
  static void forward(const Ctx& ctx, const float* p, ConstMatrix x, Matrix y) {
    for_each_element(ctx, x.rows, x.cols, AddBias{x, y, p});
  }
  template <class Ctx>
  static void backward(const Ctx& ctx, const float*, float* g, bool accumulate, ConstMatrix,
                       ConstMatrix, ConstMatrix dy, Matrix dx) {
    for_each_index(ctx, S::channels, Sums{dy, g, 1.f, accumulate});
    if (!dx.empty()) for_each_element(ctx, dy.rows, dy.cols, Copy{dy, dx, 1.f});
  }
  template <class Ctx>
  static void backward_input(const Ctx& ctx, const float*, ConstMatrix, ConstMatrix, Matrix dy,
                             Matrix dx) {
    if (!dx.empty()) for_each_element(ctx, dy.rows, dy.cols, Copy{dy, dx, 1.f});
    for_each_element(ctx, dy.rows, dy.cols, Copy{dy, dy, -1.f});
  }
  template <class Ctx>
  static void backward_weight(const Ctx& ctx, float* g, bool accumulate, ConstMatrix, ConstMatrix,
                              ConstMatrix negated) {
    for_each_index(ctx, S::channels, Sums{negated, g, -1.f, accumulate});
  }
};

using S4 = Shape<4, 6, 6>;
using S8 = Shape<8, 3, 3>;
using Conv4 = xpipe::Conv2d<S4, 4, 3, ConvOptions{.padding = 1}>;

// Small channel counts: oneDNN keeps plain layouts. 16 channels: blocked ones, so the host's
// input part reorders dy, and its weight part reuses that reorder where the primitives share it.
using ConvPlain = xpipe::Conv2d<Shape<3, 7, 7>, 4, 3, ConvOptions{.padding = 1}>;
using ConvStridedNoBias =
    xpipe::Conv2d<Shape<2, 9, 9>, 5, 3, ConvOptions{.stride = 2, .padding = 1, .bias = false}>;
using ConvBlocked = xpipe::Conv2d<Shape<16, 6, 6>, 16, 3, ConvOptions{.padding = 1}>;
using BatchNorm = xpipe::BatchNorm2d<Shape<3, 5, 5>>;  // 25-pixel planes: a partial reduce lane
using LayerNorm = xpipe::LayerNorm<12>;
using IdentityBlock =
    xpipe::Residual<Conv4, xpipe::BatchNorm2d<S4>, xpipe::ReLU, Conv4, xpipe::BatchNorm2d<S4>>;
// Its last inner layer has no parameters: f's input part reads the block's dy in place.
using OpenEndedBlock = xpipe::Residual<Conv4, xpipe::BatchNorm2d<S4>, xpipe::ReLU>;
using Projection =
    xpipe::Stage<xpipe::Conv2d<S4, 8, 1, ConvOptions{.stride = 2}>, xpipe::BatchNorm2d<S8>>;
using ProjectedBlock = xpipe::ProjectedResidual<
    Projection, xpipe::Conv2d<S4, 8, 3, ConvOptions{.stride = 2, .padding = 1}>,
    xpipe::BatchNorm2d<S8>, xpipe::ReLU, xpipe::Conv2d<S8, 8, 3, ConvOptions{.padding = 1}>,
    xpipe::BatchNorm2d<S8>>;
using BlockedBlock = xpipe::Residual<ConvBlocked, xpipe::BatchNorm2d<Shape<16, 6, 6>>>;
// Both paths end in a layer that overwrites its dy: f's must get a copy of the block's dy (the
// sum and the projection still need it), and so must the projection's.
using OverwritingBlock = xpipe::Residual<Conv4, xpipe::ReLU, NegatingBias<S4>>;
using OverwritingProjected = xpipe::ProjectedResidual<
    xpipe::Stage<xpipe::Conv2d<S4, 8, 1, ConvOptions{.stride = 2}>, NegatingBias<S8>>,
    xpipe::Conv2d<S4, 8, 3, ConvOptions{.stride = 2, .padding = 1}>, NegatingBias<S8>>;
// The ReLU after the sum fused: its input part takes dy through ReLU in place, then as above.
using ActBlock = xpipe::ResidualAct<xpipe::ReLU, Conv4, xpipe::BatchNorm2d<S4>, xpipe::ReLU, Conv4,
                                    xpipe::BatchNorm2d<S4>>;
using ActProjected = xpipe::ProjectedResidualAct<
    xpipe::ReLU, Projection, xpipe::Conv2d<S4, 8, 3, ConvOptions{.stride = 2, .padding = 1}>,
    xpipe::BatchNorm2d<S8>, xpipe::ReLU, xpipe::Conv2d<S8, 8, 3, ConvOptions{.padding = 1}>,
    xpipe::BatchNorm2d<S8>>;

// A convolution's weight part reads only x, dy and caches it rebuilds when they are another
// slot's, so handing it another slot's Saved gives the right gradients: no self-check there.
template <class L>
constexpr bool saved_carries = true;
template <>
constexpr bool saved_carries<ConvPlain> = false;
template <>
constexpr bool saved_carries<ConvStridedNoBias> = false;
template <>
constexpr bool saved_carries<ConvBlocked> = false;

}  // namespace

TEMPLATE_TEST_CASE("A split backward gives the whole backward's bits, host and emulated device",
                   "[layers][split][device][emulated]", ConvPlain, ConvStridedNoBias, ConvBlocked,
                   BatchNorm, LayerNorm, IdentityBlock, OpenEndedBlock, ProjectedBlock,
                   BlockedBlock, OverwritingBlock, OverwritingProjected, ActBlock, ActProjected) {
  SECTION("host") {
    check_split_matches_whole<TestType, OnHost>(11);
  }
  SECTION("emulated device") {
    check_split_matches_whole<TestType, OnDevice>(11);
  }
}

TEMPLATE_TEST_CASE(
    "A split backward keeps its micro-batch's state per slot: F a, F b, I a, I b, W b, W a",
    "[layers][split][device][emulated]", ConvPlain, ConvStridedNoBias, ConvBlocked, BatchNorm,
    LayerNorm, IdentityBlock, OpenEndedBlock, ProjectedBlock, BlockedBlock, OverwritingBlock,
    OverwritingProjected, ActBlock, ActProjected) {
  SECTION("host") {
    check_interleaved_slots<TestType, OnHost>(23, saved_carries<TestType>);
  }
  SECTION("emulated device") {
    check_interleaved_slots<TestType, OnDevice>(23, saved_carries<TestType>);
  }
}

namespace {

// A stage of convolutions, BatchNorms (fused with ReLU and not) and both kinds of residual block,
// whose slots share the stage's workspace and arena (the emulated device's convolutions take
// their column buffers from it).
using WsImg = Shape<8, 8, 8>;
using WsHalf = Shape<16, 4, 4>;
using WsConv = xpipe::Conv2d<WsImg, 8, 3, ConvOptions{.padding = 1, .bias = false}>;
using WsConv16 = xpipe::Conv2d<WsHalf, 16, 3, ConvOptions{.padding = 1, .bias = false}>;
using WsDown = xpipe::Conv2d<WsImg, 16, 3, ConvOptions{.stride = 2, .padding = 1, .bias = false}>;
using WsProj = xpipe::Stage<xpipe::Conv2d<WsImg, 16, 1, ConvOptions{.stride = 2, .bias = false}>,
                            xpipe::BatchNorm2d<WsHalf>>;
using WsNet =
    xpipe::Stage<xpipe::Conv2d<Shape<3, 8, 8>, 8, 3, ConvOptions{.padding = 1}>,
                 xpipe::BatchNormAct<WsImg, xpipe::ReLU>,
                 xpipe::Residual<WsConv, xpipe::BatchNormAct<WsImg, xpipe::ReLU>, WsConv,
                                 xpipe::BatchNorm2d<WsImg>>,
                 xpipe::ReLU,
                 xpipe::ProjectedResidual<WsProj, WsDown, xpipe::BatchNormAct<WsHalf, xpipe::ReLU>,
                                          WsConv16, xpipe::BatchNorm2d<WsHalf>>,
                 xpipe::ReLU, xpipe::GlobalAvgPool<WsHalf>, xpipe::Linear<16, 4>>;

// Two micro-batches of `rows` in flight on slots a and b and an evaluation of both on e, as a
// pipeline stage interleaves them: whole (F a, F b, B a, eval, B b) or split (F a, I a, F b,
// I b, eval, W a, W b). Returns the gradients, input gradients, evaluation output and state.
template <class Side, class Acts>
std::vector<float> interleave(const Side& side, bool split, Acts& a, Acts& b, Acts& e,
                              const std::vector<float>& params, const std::vector<float>& input,
                              const std::vector<float>& grad, index_t rows) {
  using B = typename Side::backend;
  using Buf = typename B::template Buffer<float>;
  using Net = WsNet;
  const index_t batch = 2 * rows;
  constexpr int in = Net::in_width;
  Buf p(Net::param_count), g(Net::param_count), x(batch * in), dy(batch * 4), dx(batch * in),
      state(Net::state_count);
  side.upload(params, p.data());
  side.upload(input, x.data());
  side.upload(grad, dy.data());
  std::vector<float> init(static_cast<std::size_t>(Net::state_count));
  Net::init_state(init);
  side.upload(init, state.data());
  typename Net::template GradScratch<B> scratch(batch);
  const auto x_of = [&](index_t i) { return ConstMatrix{x.data() + i * rows * in, rows, in}; };
  const auto dy_of = [&](index_t i) { return ConstMatrix{dy.data() + i * rows * 4, rows, 4}; };
  const auto dx_of = [&](index_t i) { return Matrix{dx.data() + i * rows * in, rows, in}; };
  const Running train{state.data(), true};
  std::vector<float> eval;
  const auto evaluate = [&] {
    const ConstMatrix out = Net::forward(side.ctx, p.data(), ConstMatrix{x.data(), batch, in}, e,
                                         Running{state.data(), false});
    eval = side.download(out.data, batch * 4);
  };
  Net::forward(side.ctx, p.data(), x_of(0), a, train);
  if (split) {
    Net::backward_input(side.ctx, p.data(), a, dy_of(0), dx_of(0), scratch);
    Net::forward(side.ctx, p.data(), x_of(1), b, train);
    Net::backward_input(side.ctx, p.data(), b, dy_of(1), dx_of(1), scratch);
    evaluate();
    Net::backward_weight(side.ctx, g.data(), false, a);
    Net::backward_weight(side.ctx, g.data(), true, b);
  } else {
    Net::forward(side.ctx, p.data(), x_of(1), b, train);
    Net::backward(side.ctx, p.data(), g.data(), false, a, dy_of(0), dx_of(0), scratch);
    evaluate();
    Net::backward(side.ctx, p.data(), g.data(), true, b, dy_of(1), dx_of(1), scratch);
  }
  std::vector<float> all = side.download(g.data(), Net::param_count);
  for (const std::vector<float>& v :
       {side.download(dx.data(), batch * in), eval, side.download(state.data(), Net::state_count)})
    all.insert(all.end(), v.begin(), v.end());
  return all;
}

template <class Side>
void check_shared_workspace() {
  using B = typename Side::backend;
  using Net = WsNet;
  using Acts = typename Net::template Activations<B>;
  const Side side;
  const index_t rows = 4, batch = 8;
  xpipe::Rng rng{22};
  std::vector<float> params(Net::param_count);
  Net::init(params, 21);
  const std::vector<float> x = random_vector(batch * Net::in_width, rng),
                           dy = random_vector(batch * 4, rng);
  typename Net::template Workspace<B> ws(batch);
  for (bool split : {false, true}) {
    INFO((split ? "split" : "whole") << " backward");
    Acts a(rows, {.kept_gradients = split}, &ws), b(rows, {.kept_gradients = split}, &ws),
        e(batch, {}, &ws);
    // Every slot reaches the stage's one workspace: the layers', and inside the blocks their
    // inner layers' and their shortcut's.
    REQUIRE(&*a.template saved<0>().workspace == &ws.template get<0>());
    REQUIRE(&*e.template saved<1>().workspace == &ws.template get<1>());
    REQUIRE(&*b.template saved<2>().workspace == &ws.template get<2>());
    REQUIRE(&*a.template saved<2>().acts.template saved<0>().workspace ==
            &ws.template get<2>().layers.template get<0>());
    REQUIRE(&*b.template saved<4>().shortcut.acts.template saved<0>().workspace ==
            &ws.template get<4>().shortcut.layers.template get<0>());
    // Slots made alone keep their own, as before the stage's workspace.
    Acts a_own(rows, {.kept_gradients = split}), b_own(rows, {.kept_gradients = split}),
        e_own(batch);
    REQUIRE(&*a_own.template saved<0>().workspace != &*b_own.template saved<0>().workspace);
    const std::vector<float> shared = interleave(side, split, a, b, e, params, x, dy, rows);
    require_bitwise(shared, interleave(side, split, a_own, b_own, e_own, params, x, dy, rows),
                    "shared workspace against slots' own");
    for (float v : shared) REQUIRE(std::isfinite(v));
  }
  // A slot larger than the workspace is refused, naming both.
  CHECK_THROWS_WITH(Acts(batch + 1, {}, &ws),
                    Catch::Contains("activations of 9 rows on a workspace made for 8"));
}

}  // namespace

TEST_CASE(
    "A stage's slots share one workspace and arena and keep their bits when micro-batches "
    "interleave, whole and split",
    "[layers][split][workspace][device][emulated]") {
  // The arena worked by hand for 8 images: on the device the largest call is the block's 8 -> 8
  // convolution's columns, 8 images x 64 pixels x (8 x 3 x 3), and its 8 x 8 bias sums; the
  // host's oneDNN primitives take none.
  STATIC_REQUIRE(WsNet::arena_floats<test::EmulatedDevice>(8) == 8 * 64 * 72 + 8 * 8);
  STATIC_REQUIRE(WsNet::arena_floats<xpipe::Host>(8) == 0);
  SECTION("host") {
    check_shared_workspace<OnHost>();
  }
  SECTION("emulated device") {
    check_shared_workspace<OnDevice>();
  }
}

TEST_CASE("A residual block's slot counts what its split backward keeps", "[layers][split]") {
  // Without a split the slot keeps f's activations (and the projection's with its input
  // gradient); a split backward adds the output gradient of each inner layer with
  // parameters: f's Conv, BN, Conv, BN (rows x 144 each), the projection's Conv and BN.
  // f's output is not kept: its last BatchNorm writes the block's sum instead.
  STATIC_REQUIRE(IdentityBlock::saved_floats(2) ==
                 IdentityBlock::inner::activation_floats(2) - 2 * S4::size);
  STATIC_REQUIRE(IdentityBlock::kept_gradient_floats(2) == 4 * 2 * S4::size);
  STATIC_REQUIRE(ProjectedBlock::kept_gradient_floats(2) == 4 * 2 * S8::size + 2 * 2 * S8::size);
  STATIC_REQUIRE(xpipe::Stage<IdentityBlock, xpipe::ReLU>::kept_gradient_floats(2) ==
                 2 * S4::size + 4 * 2 * S4::size);  // the block's own output gradient too
}

namespace {
// NegatingBias without its split: a block holding it cannot split, and says which layer.
template <class S>
struct WholeOnlyBias : NegatingBias<S> {
  static void backward_input() = delete;
  static void backward_weight() = delete;
};
}  // namespace

TEST_CASE("A residual block splits only where every inner layer does - the stage names it",
          "[layers][split]") {
  using Whole = xpipe::Residual<Conv4, xpipe::ReLU, WholeOnlyBias<S4>>;
  using Split = xpipe::Residual<Conv4, xpipe::ReLU, NegatingBias<S4>>;
  STATIC_REQUIRE(xpipe::splits_backward<Split>);
  STATIC_REQUIRE_FALSE(xpipe::splits_backward<WholeOnlyBias<S4>>);
  STATIC_REQUIRE_FALSE(xpipe::splits_backward<Whole>);
  REQUIRE(xpipe::Stage<Whole>::unsplit_layer<xpipe::Host>().find("layer 0") == 0);
  REQUIRE(Whole::inner::unsplit_layer<xpipe::Host>().find("layer 2 (") == 0);
  REQUIRE(xpipe::Stage<Split>::unsplit_layer<xpipe::Host>().empty());
}

TEST_CASE("run_two_lanes: two threads at once, a failing lane ending the other's waits",
          "[layers][lanes]") {
  using xpipe::HostContext;
  using xpipe::LaneSync;
  SECTION("lane 1 sees what lane 0 wrote before advancing, on another thread") {
    xpipe::LaneProgress progress(3);
    int written[3] = {0, 0, 0}, seen[3] = {-1, -1, -1};
    std::thread::id ids[2];
    int threads = 0;
    bool alone = true;
    xpipe::run_two_lanes(
        [&](const HostContext& one, const LaneSync& sync) {
          ids[0] = std::this_thread::get_id();
          threads = one.threads;
          alone = sync.alone();
          for (int i = 2; i >= 0; --i) {
            written[i] = 10 + i;
            progress.advance(i);
          }
        },
        [&](const HostContext&, const LaneSync& sync) {
          ids[1] = std::this_thread::get_id();
          for (int i = 2; i >= 0; --i)
            if (sync.wait_until([&] { return progress.reached(i); })) seen[i] = written[i];
        });
    CHECK(threads == 1);
    CHECK_FALSE(alone);
    CHECK(ids[0] != ids[1]);
    CHECK(ids[0] == std::this_thread::get_id());
    CHECK(seen[0] == 10);
    CHECK(seen[1] == 11);
    CHECK(seen[2] == 12);
  }
  SECTION("lane 0 throws before it advances: lane 1 stops waiting, lane 0's error is rethrown") {
    xpipe::LaneProgress progress(1);
    bool gave_up = false;
    const auto run = [&] {
      xpipe::run_two_lanes(
          [](const HostContext&, const LaneSync&) { throw xpipe::ShapeError("lane 0 failed"); },
          [&](const HostContext&, const LaneSync& sync) {
            gave_up = !sync.wait_until([&] { return progress.reached(0); });
          });
    };
    REQUIRE_THROWS_WITH(run(), "lane 0 failed");
    CHECK(gave_up);
  }
  SECTION("lane 1 throws: lane 0's wait on it ends, lane 1's error is rethrown") {
    xpipe::LaneProgress progress(1);
    bool gave_up = false;
    const auto run = [&] {
      xpipe::run_two_lanes(
          [&](const HostContext&, const LaneSync& sync) {
            gave_up = !sync.wait_until([&] { return progress.reached(0); });
          },
          [](const HostContext&, const LaneSync&) { throw xpipe::ShapeError("lane 1 failed"); });
    };
    REQUIRE_THROWS_WITH(run(), "lane 1 failed");
    CHECK(gave_up);
  }
  SECTION("inside another OpenMP region: one after the other, lane 0 first, and it knows") {
    std::vector<int> order;
    bool alone = false;
#pragma omp parallel num_threads(2)
#pragma omp single
    xpipe::run_two_lanes(
        [&](const HostContext&, const LaneSync& sync) {
          alone = sync.alone();
          order.push_back(0);
        },
        [&](const HostContext&, const LaneSync&) { order.push_back(1); });
    CHECK(alone);
    CHECK(order == std::vector<int>{0, 1});
  }
  SECTION("inside another OpenMP region, a lane 0 that waits on lane 1 is an error, not a hang") {
    xpipe::LaneProgress progress(1);
    std::string message;
#pragma omp parallel num_threads(2)
#pragma omp single
    try {
      xpipe::run_two_lanes(
          [&](const HostContext&, const LaneSync& sync) {
            sync.wait_until([&] { return progress.reached(0); });
          },
          [&](const HostContext&, const LaneSync&) { progress.advance(0); });
    } catch (const xpipe::ConfigError& e) {
      message = e.what();
    }
    CHECK_THAT(message, Catch::Contains("this lane waits on work that only a later lane would do"));
  }
}

// NegatingBias whose input part sleeps first: a weight lane that did not wait for it would sum
// dy before the negation (and the step after it would spoil weights still to be read).
template <xpipe::ImageShape S>
struct SlowNegatingBias : NegatingBias<S> {
  template <class Ctx>
  static void backward_input(const Ctx& ctx, const float* p, ConstMatrix x, ConstMatrix y,
                             Matrix dy, Matrix dx) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    NegatingBias<S>::backward_input(ctx, p, x, y, dy, dx);
  }
};

// Net::backward_in_lanes against Net::backward on one thread, writing or adding to the gradient
// (accumulate): the same bits of dx and of every gradient; `done` hands over every block (padding
// included) once, in pieces of at most lane_piece floats, each only once both halves of its layer
// are done (its gradient has its final bits, and nothing reads its weights any more: they are
// spoilt with NaN there), on a one-thread context.
template <class Net>
void check_lanes(index_t rows, std::uint64_t seed, bool accumulate) {
  constexpr index_t out = Net::out_width;
  const xpipe::HostContext one{.threads = 1};
  std::vector<float> p(Net::param_count), x(rows * Net::in_width), dy(rows * out);
  Net::init(p, seed);
  xpipe::Rng rng{seed};
  test::fill_uniform(x, rng);
  test::fill_uniform(dy, rng);
  const ConstMatrix in{x.data(), rows, Net::in_width}, grad{dy.data(), rows, out};
  typename Net::template GradScratch<xpipe::Host> scratch(rows);

  typename Net::template Activations<xpipe::Host> acts(rows);
  // Accumulating: both start from the same earlier gradient.
  std::vector<float> g(Net::param_count), dx(x.size());
  if (accumulate) test::fill_uniform(g, rng);
  const std::vector<float> start = g;
  Net::forward(one, p.data(), in, acts);
  Net::backward(one, p.data(), g.data(), accumulate, acts, grad,
                Matrix{dx.data(), rows, Net::in_width}, scratch);

  typename Net::template Activations<xpipe::Host> lanes(rows, {.kept_gradients = true});
  std::vector<float> lane_p = p, lane_g = start, lane_dx(x.size());
  Net::forward(one, lane_p.data(), in, lanes);
  struct Call {
    index_t first, count;
    int threads;
    bool gradient_complete;
  };
  std::vector<Call> calls;
  calls.reserve(Net::lane_pieces.size());
  std::mutex calls_mutex;
  Net::backward_in_lanes(lane_p.data(), lane_g.data(), accumulate, lanes, grad,
                         Matrix{lane_dx.data(), rows, Net::in_width}, scratch,
                         [&](const xpipe::HostContext& ctx, index_t first, index_t count) {
                           // On either lane: no Catch2 here (it is not thread-safe).
                           const bool complete =
                               std::equal(lane_g.begin() + first, lane_g.begin() + first + count,
                                          g.begin() + first);
                           std::fill(lane_p.begin() + first, lane_p.begin() + first + count,
                                     std::numeric_limits<float>::quiet_NaN());
                           const std::lock_guard lock(calls_mutex);
                           calls.push_back({first, count, ctx.threads, complete});
                         });
  // The pieces tile the parameters, each within one layer's block.
  std::sort(calls.begin(), calls.end(),
            [](const Call& a, const Call& b) { return a.first < b.first; });
  index_t next = 0;
  for (const Call& c : calls) {
    INFO("piece at " << c.first << " of " << c.count);
    CHECK(c.first == next);
    CHECK(c.count > 0);
    CHECK(c.count <= Net::lane_piece);
    const auto block =
        std::upper_bound(Net::param_offsets.begin(), Net::param_offsets.end(), c.first);
    CHECK(c.first + c.count <= *block);
    CHECK(c.threads == 1);
    CHECK(c.gradient_complete);
    next = c.first + c.count;
  }
  CHECK(next == Net::param_count);
  require_bitwise(lane_g, g, "gradients");
  require_bitwise(lane_dx, dx, "dx");
  CHECK(std::all_of(lane_p.begin(), lane_p.end(), [](float v) { return std::isnan(v); }));
}

TEST_CASE(
    "Stage::backward_in_lanes: the one-thread backward's bits, each layer handed over after "
    "both its halves",
    "[layers][lanes]") {
  // Convolutions, BatchNorm, blocks that overwrite their dy, a projection, a slow layer, a Dense
  // layer (its input half writes over the kept gradient its weight half reads) and a Linear.
  using Cnn = xpipe::Stage<Conv4, xpipe::BatchNorm2d<S4>, xpipe::ReLU, OverwritingBlock,
                           SlowNegatingBias<S4>, ProjectedBlock, xpipe::GlobalAvgPool<S8>,
                           xpipe::Dense<8, 16, xpipe::ReLU>, xpipe::Linear<16, 5>>;
  STATIC_REQUIRE(Cnn::lane_pieces.size() == 7);  // one piece a block
  check_lanes<Cnn>(4, 5, false);
  check_lanes<Cnn>(4, 7, true);
  // Linear layers, whose two halves run at once; blocks of several pieces.
  using Mlp = xpipe::Stage<xpipe::Linear<300, 400>, xpipe::ReLU, xpipe::Linear<400, 200>,
                           xpipe::GELU, xpipe::Linear<200, 10>>;
  STATIC_REQUIRE(xpipe::input_half_keeps_dy<xpipe::Linear<300, 400>>);
  STATIC_REQUIRE(!xpipe::input_half_keeps_dy<xpipe::Dense<8, 16, xpipe::ReLU>>);
  // SequentialTrainer runs the lanes where both halves overlap: Linear layers, not Dense.
  STATIC_REQUIRE(Mlp::overlaps_halves && !Cnn::overlaps_halves);
  STATIC_REQUIRE(xpipe::models::FashionMlp::overlaps_halves);
  STATIC_REQUIRE(!xpipe::models::FashionMlpFused::overlaps_halves);
  STATIC_REQUIRE(Mlp::lane_pieces.size() == 2 + 2 + 1);  // 120,400, 80,200 and 2,010 floats
  check_lanes<Mlp>(32, 6, false);
  check_lanes<Mlp>(32, 8, true);
}
