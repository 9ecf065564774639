// The im2col convolution's shared math (kernels/im2col.hpp) on the host: its forward and backward
// passes against a direct 7-loop convolution in double, and col2im as the adjoint of im2col.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <vector>

#include "support/conv_reference.hpp"
#include "xpipe/core/random.hpp"
#include "xpipe/kernels/im2col.hpp"

namespace {

using xpipe::ConvGeometry;
using xpipe::HostContext;
using xpipe::index_t;

// A square geometry from the input side.
ConvGeometry geometry(index_t rows, int c, int hw, int oc, int k, int stride, int pad,
                      bool bias = true) {
  return xpipe::make_conv_geometry(rows, c, hw, hw, oc, k, stride, pad, bias);
}

std::vector<float> random_vector(index_t n, std::uint64_t seed) {
  xpipe::Rng rng{seed};
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = rng.uniform(-1.f, 1.f);
  return v;
}

// Every got[i] within 1e-5 of ref[i], relative to max(|ref[i]|, 1), plus 4 float epsilons'
// worth (2.4e-7) of the sum of its terms' magnitudes `terms[i]`: a float sum in another order
// (the GEMM's blocking, which differs between AVX2 and AVX-512) is off by a few roundings of
// its terms, which can exceed 1e-5 of a result that cancels (one dw of 576 did so on an AVX2
// EPYC: -0.379549623 for -0.379539045, its terms' magnitudes summing to 517). A wrong index is off
// by a whole term. The first mismatches shown.
void require_close(const char* what, const std::vector<double>& ref,
                   const std::vector<double>& terms, const float* got) {
  int bad = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double err = std::fabs(got[i] - ref[i]),
                 allowed = 1e-5 * std::fmax(std::fabs(ref[i]), 1.0) + 2.4e-7 * terms[i];
    if (!(err <= allowed) && bad++ < 5)
      std::printf("  %s[%zu]: direct %.9g, im2col %.9g\n", what, i, ref[i], double{got[i]});
  }
  INFO(what << ": " << bad << " of " << ref.size() << " outside the tolerance");
  CHECK(bad == 0);
}

// The im2col passes on a host context with a workspace of `chunk` images, against the direct
// convolution: y, dx, dw and db; then dw and db accumulated once more (twice the sums).
void check_against_direct(const ConvGeometry& g, index_t chunk, int threads) {
  INFO("geometry " << g.rows << "x" << g.c << "x" << g.h << "x" << g.w << " -> " << g.oc << "x"
                   << g.oh << "x" << g.ow << ", k " << g.k << ", stride " << g.stride << ", pad "
                   << g.pad << (g.bias ? ", bias" : ", no bias") << "; chunk " << chunk
                   << ", threads " << threads);
  const HostContext ctx{.threads = threads};
  const auto x = random_vector(g.rows * g.in_floats(), 1), w = random_vector(g.weight_floats(), 2),
             b = random_vector(g.oc, 3), dy = random_vector(g.rows * g.out_floats(), 4);
  const xpipe::test::DirectConv ref = xpipe::test::direct_conv(g, x, w, b, dy);

  const xpipe::ConvWorkspaceFloats n = xpipe::conv_workspace_floats(g, chunk);
  std::vector<float> cols(n.cols), sums(n.plane_sums);
  const xpipe::ConvWorkspace ws{cols.data(), sums.data(), chunk};
  std::vector<float> y(ref.y.size(), 7.f), dx(x.size(), 7.f), dw(w.size(), 7.f), db(b.size(), 7.f);
  xpipe::conv_forward_im2col(ctx, g, ws, x.data(), w.data(), b.data(), y.data());
  xpipe::conv_backward_data_im2col(ctx, g, ws, w.data(), dy.data(), dx.data());
  xpipe::conv_backward_weights_im2col(ctx, g, ws, x.data(), dy.data(), dw.data(), db.data(), false);
  require_close("y", ref.y, ref.y_abs, y.data());
  require_close("dx", ref.dx, ref.dx_abs, dx.data());
  require_close("dw", ref.dw, ref.dw_abs, dw.data());
  if (g.bias)
    require_close("db", ref.db, ref.db_abs, db.data());
  else
    CHECK(db == std::vector<float>(b.size(), 7.f));  // untouched without bias

  xpipe::conv_backward_weights_im2col(ctx, g, ws, x.data(), dy.data(), dw.data(), db.data(), true);
  std::vector<double> dw2 = ref.dw, db2 = ref.db, dw2_abs = ref.dw_abs, db2_abs = ref.db_abs;
  for (auto* v : {&dw2, &db2, &dw2_abs, &db2_abs})
    for (double& e : *v) e *= 2;
  require_close("dw accumulated", dw2, dw2_abs, dw.data());
  if (g.bias) require_close("db accumulated", db2, db2_abs, db.data());
}

}  // namespace

TEST_CASE("im2col convolution matches a direct convolution", "[im2col]") {
  // rows, c, h = w, oc, k, stride, pad (, bias)
  const ConvGeometry shapes[] = {
      geometry(2, 1, 5, 3, 3, 1, 1),          // k 3 pad 1 stride 1 ("same"), one input channel
      geometry(3, 3, 7, 4, 3, 1, 1),          // the same with c > 1, odd size
      geometry(3, 3, 7, 4, 3, 2, 1),          // stride 2 pad 1: 7 -> 4
      geometry(2, 2, 9, 3, 5, 1, 0),          // k 5, no padding: 9 -> 5
      geometry(3, 4, 6, 5, 1, 1, 0),          // k 1: a per-pixel matrix product
      geometry(2, 3, 8, 2, 3, 2, 0),          // stride 2 leaves the last row and column unread
      geometry(2, 2, 11, 3, 5, 3, 2, false),  // stride 3, pad 2, no bias
      geometry(5, 2, 4, 6, 3, 1, 1),          // more images than the small chunks hold
  };
  for (const ConvGeometry& g : shapes)
    for (const index_t chunk : {index_t{1}, index_t{2}, g.rows}) check_against_direct(g, chunk, 1);
  // Large enough for the element loops to fork: the bits must not depend on it, the values agree.
  check_against_direct(geometry(4, 8, 17, 8, 3, 1, 1), 3, 2);
}

TEST_CASE("col2im is the adjoint of im2col", "[im2col]") {
  const HostContext ctx{};
  const ConvGeometry shapes[] = {geometry(3, 2, 6, 1, 3, 1, 1),  geometry(3, 3, 7, 1, 3, 2, 1),
                                 geometry(3, 1, 9, 1, 5, 1, 0),  geometry(3, 2, 8, 1, 3, 2, 0),
                                 geometry(3, 2, 11, 1, 5, 3, 2), geometry(3, 4, 5, 1, 1, 1, 0)};
  for (const ConvGeometry& g : shapes) {
    // Images 1 and 2 of 3: first_image offsets both the input and the gradient images.
    const index_t first = 1, count = 2;
    const index_t kk = index_t{g.c} * g.k * g.k, pixels = index_t{g.oh} * g.ow;
    const auto x = random_vector(g.rows * g.in_floats(), 5),
               c = random_vector(kk * count * pixels, 6);
    std::vector<float> cols(c.size()), back(x.size(), 0.f);
    xpipe::im2col(ctx, g, x.data(), first, count, cols.data());
    xpipe::col2im(ctx, g, c.data(), first, count, back.data());
    // <im2col(x), C> and <x, col2im(C)>, summed in double.
    double lhs = 0, rhs = 0, scale = 0;
    for (std::size_t i = 0; i < c.size(); ++i) {
      lhs += double{cols[i]} * c[i];
      scale += std::fabs(double{cols[i]} * c[i]);
    }
    for (std::size_t i = 0; i < x.size(); ++i) rhs += double{x[i]} * back[i];
    INFO("k " << g.k << ", stride " << g.stride << ", pad " << g.pad << ": " << lhs << " vs "
              << rhs);
    CHECK(std::fabs(lhs - rhs) <= 1e-5 * std::fmax(scale, 1.0));
    // Image 0 lies outside the range: col2im leaves it alone.
    for (index_t i = 0; i < g.in_floats(); ++i) REQUIRE(back[static_cast<std::size_t>(i)] == 0.f);
  }
}

TEST_CASE("im2col's column matrix holds the input pixels and zero padding", "[im2col]") {
  // One 2-channel 3 x 3 image, k 3 pad 1, channels-last: pixel q (row-major, 0 to 8) holds q + 1
  // in channel 0 and 10 (q + 1) in channel 1. Row p of the column matrix is the patch under
  // output pixel p, 18 columns: channel 0's 3 x 3 window row by row, then channel 1's.
  const ConvGeometry g = geometry(1, 2, 3, 1, 3, 1, 1);
  const std::vector<float> x = {1, 10, 2, 20, 3, 30, 4, 40, 5, 50, 6, 60, 7, 70, 8, 80, 9, 90};
  std::vector<float> cols(9 * 18, -1.f);
  xpipe::im2col(HostContext{}, g, x.data(), 0, 1, cols.data());
  auto check_row = [&](int p, const float(&window)[9]) {
    INFO("output pixel " << p);
    for (int r = 0; r < 9; ++r) {
      CHECK(cols[static_cast<std::size_t>(p * 18 + r)] == window[r]);
      CHECK(cols[static_cast<std::size_t>(p * 18 + 9 + r)] == 10 * window[r]);
    }
  };
  // The centre (p 4): the whole image. The top-left corner (p 0): the window's top row and left
  // column over the padding. Row 1, column 2 (p 5): the window's right column over the padding.
  check_row(4, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  check_row(0, {0, 0, 0, 0, 1, 2, 0, 4, 5});
  check_row(5, {2, 3, 0, 5, 6, 0, 8, 9, 0});
}
