// Training-time image augmentation (zero-padded random crop, horizontal flip) whose draws depend
// only on (seed, epoch, sample index): every executor, thread count and batch split sees the same.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "xpipe/backend/host.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/core/random.hpp"
#include "xpipe/core/shape.hpp"
#include "xpipe/core/tensor.hpp"
#include "xpipe/data/dataset.hpp"

namespace xpipe {

//! What to do to each training image: pad by `pad` zeros on every side and crop back to h x w at
//! a uniform offset in [0, 2 * pad] per axis (PyTorch's RandomCrop(size, padding=pad)), then
//! mirror x with probability 1/2 when `flip`. The default changes nothing.
//! Usage: `Augment a{.pad = 2, .flip = true}; a.check();`
struct Augment {
  int pad = 0;
  bool flip = false;

  //! Past 8 the crop mostly shows padding on a 28 x 28 image: taken as a typo, not a wish.
  static constexpr int max_pad = 8;

  constexpr bool identity() const { return pad == 0 && !flip; }

  //! Throws ConfigError naming the value when pad is outside [0, max_pad].
  void check() const {
    if (pad < 0 || pad > max_pad)
      throw ConfigError("xpipe: Augment: pad " + std::to_string(pad) + " is outside 0.." +
                        std::to_string(max_pad));
  }
};

//! Domain of the augmentation streams: sub-stream `augment_seed_domain` of the run's seed. Layer
//! initialisation takes sub-streams 0, 1, ... (one per layer) and shuffling one per epoch, all
//! small, so no augmentation draw reuses theirs.
inline constexpr std::uint64_t augment_seed_domain = 0x6175676D656E7431ull;  // "augment1"

//! The random choices for one sample: crop offset (dy, dx) into the padded image, and the mirror.
struct AugmentDraw {
  int dy = 0, dx = 0;
  bool flip = false;
  friend constexpr bool operator==(const AugmentDraw&, const AugmentDraw&) = default;
};

//! The draw of sample `index` of epoch `epoch`: a stream of its own, derived from the seed by
//! domain, then epoch, then index, so a sample's draw never depends on which rows share its call.
//! Draws dy, dx (only when pad > 0), then the flip (only when a.flip): turning the flip on keeps
//! the crops. Public so that another backend can reproduce the host's images bit for bit.
//! Usage: `const AugmentDraw d = augment_draw(a, seed, epoch, i);`
constexpr AugmentDraw augment_draw(const Augment& a, std::uint64_t seed, int epoch, index_t index) {
  const std::uint64_t per_epoch =
      derive_seed(derive_seed(seed, augment_seed_domain), static_cast<std::uint64_t>(epoch));
  Rng rng{derive_seed(per_epoch, static_cast<std::uint64_t>(index))};
  AugmentDraw d;
  if (a.pad > 0) {
    const std::uint64_t span = 2 * static_cast<std::uint64_t>(a.pad) + 1;
    d.dy = static_cast<int>(rng.below(span));
    d.dx = static_cast<int>(rng.below(span));
  }
  if (a.flip) d.flip = (rng.next() >> 63) != 0;  // the top bit: SplitMix64's best mixed
  return d;
}

namespace detail {
// One channels-last image (c x h x w) from src to dst under draw d: pixel (y, x) of out = pixel
// (y + dy - pad, x' + dx - pad) of in, with x' = w - 1 - x when mirrored (crop first, then
// mirror, as torchvision composes them), every channel of it, and zeros where that falls in the
// padding.
inline void augment_image(const float* src, float* dst, const Dims& s, int pad,
                          const AugmentDraw& d) {
  const int oy = d.dy - pad, ox = d.dx - pad;
  for (int y = 0; y < s.h; ++y) {
    const int sy = y + oy;
    for (int x = 0; x < s.w; ++x) {
      const int sx = (d.flip ? s.w - 1 - x : x) + ox;
      float* o = dst + image_index(s.c, s.w, 0, y, x);
      const bool inside = sy >= 0 && sy < s.h && sx >= 0 && sx < s.w;
      const float* i = inside ? src + image_index(s.c, s.w, 0, sy, sx) : nullptr;
      for (int c = 0; c < s.c; ++c) o[c] = inside ? i[c] : 0.f;
    }
  }
}

inline std::string augment_dims_text(index_t rows, index_t cols) {
  return std::to_string(rows) + "x" + std::to_string(cols);
}
}  // namespace detail

//! Row r of dst = row r of src (a channels-last image of `shape`) augmented with the draw of sample
//! first_index + r, on ctx.threads threads. A block of rows [k, k + n) of a set is augmented by
//! passing the block's views and first_index = k: the result is the same bits as in one call.
//! src and dst must not overlap (a crop reads pixels its row has already written).
//! Throws ConfigError for a bad pad or overlapping views, ShapeError when src and dst differ
//! or the shape does not make cols.
//! Usage: `augment_rows(ctx, x, x_aug, Dims{1, 28, 28}, {.pad = 2, .flip = true}, seed, e, 0);`
inline void augment_rows(const HostContext& ctx, ConstMatrix src, Matrix dst, Dims shape,
                         const Augment& a, std::uint64_t seed, int epoch, index_t first_index) {
  a.check();
  if (src.rows != dst.rows || src.cols != dst.cols)
    throw ShapeError("xpipe: augment_rows: src is " +
                     detail::augment_dims_text(src.rows, src.cols) + " but dst is " +
                     detail::augment_dims_text(dst.rows, dst.cols));
  if (shape.c <= 0 || shape.h <= 0 || shape.w <= 0 || shape.size() != src.cols)
    throw ShapeError("xpipe: augment_rows: image shape " + std::to_string(shape.c) + "x" +
                     std::to_string(shape.h) + "x" + std::to_string(shape.w) + " (" +
                     std::to_string(shape.size()) + " floats) does not match rows of " +
                     std::to_string(src.cols) + " floats");
  if (src.rows == 0) return;
  // std::less orders pointers into different arrays too, where `<` is unspecified.
  const std::less<const float*> before;
  const float* src_end = src.row(src.rows - 1) + src.cols;
  const float* dst_end = dst.row(dst.rows - 1) + dst.cols;
  if (before(src.data, dst_end) && before(dst.data, src_end))
    throw ConfigError(
        "xpipe: augment_rows: src and dst overlap: augmentation cannot run in "
        "place, give it a separate destination");
  for_each_index(ctx, src.rows, src.rows * src.cols, [&](index_t r) {
    const float* in = src.row(r);
    float* out = dst.row(r);
    if (a.identity()) {
      for (index_t k = 0; k < src.cols; ++k) out[k] = in[k];
      return;
    }
    detail::augment_image(in, out, shape, a.pad, augment_draw(a, seed, epoch, first_index + r));
  });
}

//! The whole training set augmented for one epoch, sample i with draw i: dst is count x width.
//! Feed the result to Batcher through a Dataset that holds it (labels unchanged, see below).
//! Usage: `augment_epoch(ctx, train, dst, Dims{1, 28, 28}, aug, seed, epoch);`
inline void augment_epoch(const HostContext& ctx, const Dataset& train, Matrix dst, Dims shape,
                          const Augment& a, std::uint64_t seed, int epoch) {
  augment_rows(ctx, train.matrix(), dst, shape, a, seed, epoch, 0);
}

//! As above into `view`, a Dataset of train's count, width and labels (`head(train, train.count)`
//! once): a Batcher built on it gathers the augmented images, in its own shuffled order, every
//! epoch without allocating. Throws ShapeError when view's size differs from train's.
//! Usage: `Dataset view = head(train, train.count); Batcher b(view, 128, seed);`, then each
//! epoch e: `augment_epoch(ctx, train, view, dims, aug, seed, e); b.start_epoch(e);`
inline void augment_epoch(const HostContext& ctx, const Dataset& train, Dataset& view, Dims shape,
                          const Augment& a, std::uint64_t seed, int epoch) {
  if (view.count != train.count || view.width != train.width ||
      view.features.size() != train.count * train.width)
    throw ShapeError("xpipe: augment_epoch: destination dataset is " +
                     detail::augment_dims_text(view.count, view.width) + ", the training set is " +
                     detail::augment_dims_text(train.count, train.width));
  augment_epoch(ctx, train, Matrix{view.features.data(), view.count, view.width}, shape, a, seed,
                epoch);
}

}  // namespace xpipe
