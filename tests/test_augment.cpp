// Image augmentation (data/augment.hpp): crops and flips against images worked out by hand,
// their frequencies, zero fill, and bitwise determinism across threads and row blocks.
#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <map>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "support/support.hpp"
#include "xpipe/data/augment.hpp"

namespace {

using xpipe::Augment;
using xpipe::AugmentDraw;
using xpipe::Dims;
using xpipe::index_t;
using xpipe::test::same_bits;
using Image = std::vector<float>;

// The definition, written the long way round (not the kernel's index arithmetic): build the
// (h + 2p) x (w + 2p) zero-padded image of each channel, cut h x w out at (dy, dx), then mirror
// each row; images channels-last (channel c of pixel (y, x) at (y w + x) c + c).
Image reference(const Image& img, Dims s, int pad, int dy, int dx, bool flip) {
  const int ph = s.h + 2 * pad, pw = s.w + 2 * pad;
  Image out(img.size());
  for (int c = 0; c < s.c; ++c) {
    std::vector<float> padded(static_cast<std::size_t>(ph * pw), 0.f);
    for (int y = 0; y < s.h; ++y)
      for (int x = 0; x < s.w; ++x) padded[(y + pad) * pw + x + pad] = img[(y * s.w + x) * s.c + c];
    for (int y = 0; y < s.h; ++y) {
      std::vector<float> row(padded.begin() + (y + dy) * pw + dx,
                             padded.begin() + (y + dy) * pw + dx + s.w);
      if (flip) std::reverse(row.begin(), row.end());
      for (int x = 0; x < s.w; ++x) out[(y * s.w + x) * s.c + c] = row[x];
    }
  }
  return out;
}

struct Legal {
  int dy, dx;
  bool flip;
  Image image;
};

// Every image the augmentation may legally give for `img`: each offset, and both mirrors when
// flipping is on. Distinct by construction of the test images (nonzero, all values different).
std::vector<Legal> legal_results(const Image& img, Dims s, const Augment& a) {
  std::vector<Legal> all;
  for (int dy = 0; dy <= 2 * a.pad; ++dy)
    for (int dx = 0; dx <= 2 * a.pad; ++dx)
      for (bool f : {false, true})
        if (!f || a.flip) all.push_back({dy, dx, f, reference(img, s, a.pad, dy, dx, f)});
  return all;
}

// n copies of img as rows of one matrix.
std::vector<float> tiled(const Image& img, index_t n) {
  std::vector<float> m;
  for (index_t r = 0; r < n; ++r) m.insert(m.end(), img.begin(), img.end());
  return m;
}

Image iota_image(Dims s, float first) {
  Image img(static_cast<std::size_t>(s.size()));
  std::iota(img.begin(), img.end(), first);
  return img;
}

// Pseudo-random pixels (their own seed, not the augmentation's).
std::vector<float> noise(index_t n, std::uint64_t seed) {
  xpipe::Rng rng{seed};
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = rng.uniform(-1.f, 1.f);
  return v;
}

// A count of n trials at probability p lies within 5 standard deviations of n p unless the
// draws are broken: loose enough never to fail by chance (about 6e-7 per check).
void require_binomial(int count, int n, double p, const std::string& what) {
  const double mean = n * p, sd = std::sqrt(n * p * (1 - p));
  INFO(what << ": " << count << " of " << n << ", expected " << mean << " +- " << 5 * sd);
  REQUIRE(std::abs(count - mean) <= 5 * sd);
}

}  // namespace

TEST_CASE("augment: the reference crops and flips a 1x4x4 image as worked by hand", "[augment]") {
  const Dims s{1, 4, 4};
  const Image img = iota_image(s, 1.f);  // rows 1..4, 5..8, 9..12, 13..16
  // Offset (0, 0) shows the top and left padding; (2, 2) the bottom and right.
  REQUIRE(reference(img, s, 1, 0, 0, false) ==
          Image{0, 0, 0, 0, 0, 1, 2, 3, 0, 5, 6, 7, 0, 9, 10, 11});
  REQUIRE(reference(img, s, 1, 2, 2, false) ==
          Image{6, 7, 8, 0, 10, 11, 12, 0, 14, 15, 16, 0, 0, 0, 0, 0});
  // Crop first at (0, 2), then mirror: the padding column moves to the left.
  REQUIRE(reference(img, s, 1, 0, 2, true) ==
          Image{0, 0, 0, 0, 0, 4, 3, 2, 0, 8, 7, 6, 0, 12, 11, 10});
  // The centre offset is the image itself, mirrored or not.
  REQUIRE(reference(img, s, 1, 1, 1, false) == img);
  REQUIRE(reference(img, s, 1, 1, 1, true) ==
          Image{4, 3, 2, 1, 8, 7, 6, 5, 12, 11, 10, 9, 16, 15, 14, 13});
  // Channels-last, two channels of a 1 x 2 image: a mirror moves whole pixels, both channels.
  const Image two{1, -1, 2, -2};
  REQUIRE(reference(two, Dims{2, 1, 2}, 1, 1, 1, true) == Image{2, -2, 1, -1});
  // Shifted one pixel left (offset 2 along x): the padding pixel comes in, zero in both channels.
  REQUIRE(reference(two, Dims{2, 1, 2}, 1, 1, 2, false) == Image{2, -2, 0, 0});
}

TEST_CASE("augment: each output is a legal crop/flip and every one occurs about equally often",
          "[augment]") {
  const auto [s, a] = GENERATE(table<Dims, Augment>({
      {Dims{1, 4, 4}, Augment{.pad = 1, .flip = true}},
      {Dims{1, 4, 4}, Augment{.pad = 1, .flip = false}},
      {Dims{1, 4, 4}, Augment{.pad = 0, .flip = true}},
      {Dims{1, 4, 4}, Augment{.pad = 3, .flip = true}},  // padding fills most of the view
      {Dims{2, 3, 5}, Augment{.pad = 2, .flip = true}},  // channels, and h != w
  }));
  CAPTURE(s.c, s.h, s.w, a.pad, a.flip);
  Image img = iota_image(s, 1.f);
  // The second channel negative: a value read from the wrong channel cannot pass as legal.
  if (s.c > 1)
    for (std::size_t i = 1; i < img.size(); i += static_cast<std::size_t>(s.c)) img[i] = -img[i];
  const auto legal = legal_results(img, s, a);
  for (std::size_t i = 0; i < legal.size(); ++i)
    for (std::size_t j = 0; j < i; ++j) REQUIRE(legal[i].image != legal[j].image);

  const index_t n = 4000;
  const std::vector<float> src = tiled(img, n);
  std::vector<float> dst(src.size(), 99.f);
  const std::uint64_t seed = 1234;
  const int epoch = 3;
  xpipe::augment_rows(xpipe::HostContext{.threads = 2}, {src.data(), n, s.size()},
                      {dst.data(), n, s.size()}, s, a, seed, epoch, 0);

  std::vector<int> hits(legal.size(), 0);
  std::map<std::pair<int, int>, int> offsets;
  int flips = 0;
  for (index_t r = 0; r < n; ++r) {
    const Image out(dst.begin() + r * s.size(), dst.begin() + (r + 1) * s.size());
    std::size_t k = 0;
    while (k < legal.size() && legal[k].image != out) ++k;
    INFO("row " << r << " is no legal crop/flip of the image");
    REQUIRE(k < legal.size());
    ++hits[k];
    ++offsets[{legal[k].dy, legal[k].dx}];
    flips += legal[k].flip;
    // The public draw names the same crop: another backend can reproduce it.
    const AugmentDraw d = xpipe::augment_draw(a, seed, epoch, r);
    REQUIRE(d == AugmentDraw{legal[k].dy, legal[k].dx, legal[k].flip});
  }
  const double per_offset = 1.0 / ((2 * a.pad + 1) * (2 * a.pad + 1));
  for (int dy = 0; dy <= 2 * a.pad; ++dy)
    for (int dx = 0; dx <= 2 * a.pad; ++dx)
      require_binomial(offsets[{dy, dx}], n, per_offset,
                       "offset (" + std::to_string(dy) + ", " + std::to_string(dx) + ")");
  if (a.flip) {
    require_binomial(flips, n, 0.5, "mirrored");
    for (std::size_t k = 0; k < legal.size(); ++k)
      require_binomial(hits[k], n, per_offset / 2, "one offset and mirror");
  } else {
    REQUIRE(flips == 0);
  }
}

TEST_CASE("augment: padded borders are zero, whatever dst held", "[augment]") {
  const Dims s{1, 6, 6};
  const Augment a{.pad = 3, .flip = true};
  const index_t n = 300;
  const std::vector<float> src(static_cast<std::size_t>(n * s.size()), 1.f);
  std::vector<float> dst(src.size(), 7.f);
  xpipe::augment_rows({}, {src.data(), n, s.size()}, {dst.data(), n, s.size()}, s, a, 5, 0, 0);
  int padded_rows = 0;
  for (index_t r = 0; r < n; ++r) {
    const AugmentDraw d = xpipe::augment_draw(a, 5, 0, r);
    int zeros = 0;
    for (int y = 0; y < s.h; ++y)
      for (int x = 0; x < s.w; ++x) {
        // Source pixel of (y, x) in the unpadded image; outside it the padding shows.
        const int sy = y + d.dy - a.pad, sx = (d.flip ? s.w - 1 - x : x) + d.dx - a.pad;
        const bool inside = sy >= 0 && sy < s.h && sx >= 0 && sx < s.w;
        CAPTURE(r, y, x, d.dy, d.dx, d.flip);
        REQUIRE(dst[r * s.size() + y * s.w + x] == (inside ? 1.f : 0.f));
        zeros += !inside;
      }
    padded_rows += zeros > 0;
  }
  // 1 in 49 draws is the centre, with no padding in view.
  REQUIRE(padded_rows > n / 2);
}

TEST_CASE("augment: pad 0 without flip copies rows exactly, also from strided views", "[augment]") {
  const Dims s{1, 28, 28};
  const index_t n = 64, ld = s.size() + 5;
  std::vector<float> src = noise(n * ld, 11);
  src[3] = -0.f;  // sign of zero kept: a copy, not arithmetic
  std::vector<float> dst(static_cast<std::size_t>(n * s.size()), 3.f);
  xpipe::augment_rows(xpipe::HostContext{.threads = 2}, {src.data(), n, s.size(), ld},
                      {dst.data(), n, s.size()}, s, Augment{}, 9, 4, 17);
  for (index_t r = 0; r < n; ++r)
    REQUIRE(same_bits(dst.data() + r * s.size(), src.data() + r * ld, s.size()));
  REQUIRE(std::signbit(dst[3]));
}

TEST_CASE("augment: turning the flip on keeps each sample's crop", "[augment]") {
  for (index_t i = 0; i < 200; ++i) {
    const AugmentDraw crop = xpipe::augment_draw({.pad = 2}, 77, 1, i);
    const AugmentDraw both = xpipe::augment_draw({.pad = 2, .flip = true}, 77, 1, i);
    REQUIRE(crop.dy == both.dy);
    REQUIRE(crop.dx == both.dx);
  }
}

TEST_CASE("augment: the bits depend on (seed, epoch, index) only", "[augment]") {
  const Dims s{1, 28, 28};
  const Augment a{.pad = 4, .flip = true};
  const index_t n = 100, w = s.size();  // 78400 floats: enough for for_each_index to fork
  const std::vector<float> src = noise(n * w, 21);
  const auto run = [&](int threads, std::uint64_t seed, int epoch) {
    std::vector<float> dst(src.size());
    xpipe::augment_rows(xpipe::HostContext{.threads = threads}, {src.data(), n, w},
                        {dst.data(), n, w}, s, a, seed, epoch, 0);
    return dst;
  };
  const std::vector<float> one = run(1, 42, 2);

  SECTION("one thread or two") {
    REQUIRE(same_bits(run(2, 42, 2), one));
  }

  SECTION("one call or two row blocks, in either order") {
    std::vector<float> split(src.size());
    const xpipe::ConstMatrix in{src.data(), n, w};
    const xpipe::Matrix out{split.data(), n, w};
    xpipe::augment_rows({.threads = 2}, in.slice_rows(37, 63), out.slice_rows(37, 63), s, a, 42, 2,
                        37);
    xpipe::augment_rows({}, in.slice_rows(0, 37), out.slice_rows(0, 37), s, a, 42, 2, 0);
    REQUIRE(same_bits(split, one));
  }

  SECTION("another epoch or seed gives other images") {
    const auto rows_differing = [&](const std::vector<float>& other) {
      int k = 0;
      for (index_t r = 0; r < n; ++r) k += !same_bits(other.data() + r * w, one.data() + r * w, w);
      return k;
    };
    // Two independent draws coincide with probability 1/162 per row.
    REQUIRE(rows_differing(run(1, 42, 3)) > 90);
    REQUIRE(rows_differing(run(1, 43, 2)) > 90);
  }

  SECTION("a row's draw is its index's, not its position's") {
    std::vector<float> shifted(src.size());
    xpipe::augment_rows({}, {src.data(), n, w}, {shifted.data(), n, w}, s, a, 42, 2, 1);
    int k = 0;
    for (index_t r = 0; r < n; ++r) k += !same_bits(shifted.data() + r * w, one.data() + r * w, w);
    REQUIRE(k > 90);
  }
}

TEST_CASE("augment_epoch: the training set in index order, ready for a Batcher", "[augment]") {
  const Dims s{1, 5, 5};
  const Augment a{.pad = 2, .flip = true};
  xpipe::Dataset train;
  train.count = 40;
  train.width = s.size();
  train.classes = 40;
  train.features = xpipe::HostBuffer<float>(train.count * train.width);
  const std::vector<float> pixels = noise(train.count * train.width, 31);
  std::copy(pixels.begin(), pixels.end(), train.features.data());
  train.labels.resize(static_cast<std::size_t>(train.count));
  std::iota(train.labels.begin(), train.labels.end(), 0);  // label = sample index

  std::vector<float> expect(pixels.size());
  xpipe::augment_rows({}, train.matrix(), {expect.data(), train.count, train.width}, s, a, 8, 6, 0);
  std::vector<float> direct(pixels.size());
  xpipe::augment_epoch({}, train, xpipe::Matrix{direct.data(), train.count, train.width}, s, a, 8,
                       6);
  REQUIRE(same_bits(direct, expect));

  xpipe::Dataset view = xpipe::head(train, train.count);
  xpipe::Batcher batcher(view, 8, 8);
  xpipe::augment_epoch({}, train, view, s, a, 8, 6);
  std::vector<float> x(pixels.size());
  std::vector<std::int32_t> labels(static_cast<std::size_t>(train.count));
  batcher.gather_epoch(6, {x.data(), train.count, train.width}, labels.data());
  for (index_t r = 0; r < train.count; ++r)
    REQUIRE(same_bits(x.data() + r * train.width, expect.data() + labels[r] * train.width,
                      train.width));
  // The source set is left as it was.
  REQUIRE(same_bits(train.features.data(), pixels.data(), train.count * train.width));

  xpipe::Dataset small = xpipe::head(train, 10);
  REQUIRE_THROWS_AS(xpipe::augment_epoch({}, train, small, s, a, 8, 6), xpipe::ShapeError);
  REQUIRE_THROWS_WITH(xpipe::augment_epoch({}, train, small, s, a, 8, 6),
                      Catch::Contains("10x25") && Catch::Contains("40x25"));
}

TEST_CASE("augment: bad arguments are refused with the value at fault", "[augment]") {
  const Dims s{1, 4, 4};
  std::vector<float> a(64, 1.f), b(64, 0.f);
  const xpipe::ConstMatrix src{a.data(), 4, 16};
  const xpipe::Matrix dst{b.data(), 4, 16};

  SECTION("pad outside 0..8") {
    for (int pad : {9, -1}) {
      REQUIRE_THROWS_AS(xpipe::augment_rows({}, src, dst, s, {.pad = pad}, 1, 0, 0),
                        xpipe::ConfigError);
      REQUIRE_THROWS_WITH(xpipe::augment_rows({}, src, dst, s, {.pad = pad}, 1, 0, 0),
                          Catch::Contains("pad " + std::to_string(pad)));
    }
    REQUIRE_NOTHROW(xpipe::augment_rows({}, src, dst, s, {.pad = 8}, 1, 0, 0));
  }
  SECTION("src and dst of different shapes") {
    REQUIRE_THROWS_AS(xpipe::augment_rows({}, src, {b.data(), 4, 15}, s, {}, 1, 0, 0),
                      xpipe::ShapeError);
    REQUIRE_THROWS_WITH(xpipe::augment_rows({}, src, {b.data(), 4, 15}, s, {}, 1, 0, 0),
                        Catch::Contains("4x16") && Catch::Contains("4x15"));
    REQUIRE_THROWS_WITH(xpipe::augment_rows({}, src, {b.data(), 3, 16}, s, {}, 1, 0, 0),
                        Catch::Contains("4x16") && Catch::Contains("3x16"));
  }
  SECTION("an image shape that is not the row width") {
    REQUIRE_THROWS_AS(xpipe::augment_rows({}, src, dst, Dims{1, 4, 5}, {}, 1, 0, 0),
                      xpipe::ShapeError);
    REQUIRE_THROWS_WITH(
        xpipe::augment_rows({}, src, dst, Dims{1, 4, 5}, {}, 1, 0, 0),
        Catch::Contains("1x4x5") && Catch::Contains("20") && Catch::Contains("16 floats"));
    // Negative extents can multiply to the width; still not an image.
    REQUIRE_THROWS_AS(xpipe::augment_rows({}, src, dst, Dims{1, -4, -4}, {}, 1, 0, 0),
                      xpipe::ShapeError);
  }
  SECTION("src and dst overlapping") {
    REQUIRE_THROWS_AS(xpipe::augment_rows({}, src, {a.data(), 4, 16}, s, {.pad = 1}, 1, 0, 0),
                      xpipe::ConfigError);
    REQUIRE_THROWS_WITH(xpipe::augment_rows({}, src, {a.data(), 4, 16}, s, {.pad = 1}, 1, 0, 0),
                        Catch::Contains("overlap"));
    // Shifted by one row: still in place for three rows.
    std::vector<float> big(80, 1.f);
    REQUIRE_THROWS_AS(xpipe::augment_rows({}, {big.data(), 4, 16}, {big.data() + 16, 4, 16}, s,
                                          {.pad = 1}, 1, 0, 0),
                      xpipe::ConfigError);
    // Adjacent but disjoint is fine.
    std::vector<float> both(128, 1.f);
    REQUIRE_NOTHROW(xpipe::augment_rows({}, {both.data(), 4, 16}, {both.data() + 64, 4, 16}, s,
                                        {.pad = 1}, 1, 0, 0));
  }
}
