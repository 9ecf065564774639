// Fashion-MNIST loading (normalised float images, int labels) and seeded shuffled batching.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "xpipe/core/buffer.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/core/random.hpp"
#include "xpipe/core/tensor.hpp"
#include "xpipe/data/idx.hpp"

namespace xpipe {

//! A labelled set of flat float samples on the host. Rows come in groups of `group` that stay
//! together and in order wherever rows are shuffled or split (a text sequence: one row per token,
//! `group` = its length); count is a multiple of group.
struct Dataset {
  HostBuffer<float> features;  // count x width, row-major
  std::vector<std::int32_t> labels;
  index_t count = 0;
  index_t width = 0;
  int classes = 0;
  index_t group = 1;
  ConstMatrix matrix() const { return {features.data(), count, width}; }
};

//! Training and test halves of one dataset.
struct DatasetPair {
  Dataset train;
  Dataset test;
};

//! A copy of the first n rows of d (all of them if n >= d.count), in whole groups: n is
//! rounded down to a multiple of d.group.
inline Dataset head(const Dataset& d, index_t n) {
  if (d.group < 1) throw ConfigError("xpipe: head: the data set's group must be at least 1");
  Dataset out;
  out.count = std::min(n, d.count) / d.group * d.group;
  out.width = d.width;
  out.classes = d.classes;
  out.group = d.group;
  out.features = HostBuffer<float>(out.count * out.width);
  std::copy_n(d.features.data(), out.count * out.width, out.features.data());
  out.labels.assign(d.labels.begin(), d.labels.begin() + out.count);
  return out;
}

//! Where Fashion-MNIST is looked for when no directory is given: $XPIPE_DATA_DIR, else the
//! directory Debian's `dataset-fashion-mnist` package installs.
inline std::string default_fashion_mnist_dir() {
  const char* env = std::getenv("XPIPE_DATA_DIR");
  return env != nullptr && *env != '\0' ? env : "/usr/share/datasets/fashion-mnist";
}

//! How much of Fashion-MNIST load_fashion_mnist keeps: the first `train` training samples and
//! the first `test` test samples (0: all of them). Only the kept samples become floats; the
//! standardisation still comes from every training image, so the kept rows have the bits of the
//! whole set's first rows. Usage: `load_fashion_mnist(dir, {.train = 512, .test = 256});`
struct FirstSamples {
  index_t train = 0;
  index_t test = 0;
};

namespace detail {

//! One half of Fashion-MNIST as read: images (count x 28 x 28 bytes) and their labels, checked.
struct IdxHalf {
  IdxArray images;
  IdxArray labels;
};

inline IdxHalf read_half(const std::string& images_path, const std::string& labels_path) {
  IdxHalf h{read_idx(images_path), read_idx(labels_path)};
  if (h.images.dims.size() != 3 || h.images.dims[1] != 28 || h.images.dims[2] != 28)
    throw DataError("xpipe: IDX file '" + images_path + "' is not a set of 28x28 images (" +
                    std::to_string(h.images.dims.size()) + " dimensions)");
  if (h.labels.dims.size() != 1)
    throw DataError("xpipe: IDX file '" + labels_path + "' is not a label vector (" +
                    std::to_string(h.labels.dims.size()) + " dimensions)");
  if (h.images.count() != h.labels.count())
    throw DataError("xpipe: '" + images_path + "' holds " + std::to_string(h.images.count()) +
                    " images but '" + labels_path + "' holds " + std::to_string(h.labels.count()) +
                    " labels");
  for (std::size_t i = 0; i < h.labels.data.size(); ++i)
    // Unsigned bytes: only the upper bound can fail.
    if (h.labels.data[i] >= 10)
      throw DataError("xpipe: labels file '" + labels_path + "': label " +
                      std::to_string(h.labels.data[i]) + " at index " + std::to_string(i) +
                      " is outside 0..9");
  return h;
}

//! A pixel byte as the loader's float: b / 255 rounded as float(b) * (1.f / 255.f).
inline float unit_pixel(int b) {
  return static_cast<float>(b) * (1.f / 255.f);
}

//! The first `keep` samples of h (all if keep is 0 or more than there are), each pixel byte b
//! becoming value[b].
inline Dataset standardised_head(const IdxHalf& h, index_t keep,
                                 const std::array<float, 256>& value) {
  Dataset d;
  const auto count = static_cast<index_t>(h.images.count());
  d.count = keep > 0 ? std::min(keep, count) : count;
  d.width = 28 * 28;
  d.classes = 10;
  d.features = HostBuffer<float>(d.count * d.width);
  for (index_t i = 0; i < d.count * d.width; ++i)
    d.features[i] = value[h.images.data[static_cast<std::size_t>(i)]];
  d.labels.assign(h.labels.data.begin(), h.labels.data.begin() + d.count);
  return d;
}

}  // namespace detail

//! Loads Fashion-MNIST from `dir` (the four standard .gz IDX files), keeping the samples `keep`
//! names (all by default), and standardises pixels with the mean and standard deviation of all
//! the training images (applied to both halves; a training set of one pixel value is only
//! centred). Throws DataError naming the file when one is missing, truncated or malformed, and
//! ConfigError for a negative count in `keep`.
inline DatasetPair load_fashion_mnist(const std::string& dir = default_fashion_mnist_dir(),
                                      FirstSamples keep = {}) {
  if (keep.train < 0 || keep.test < 0)
    throw ConfigError("xpipe: load_fashion_mnist: FirstSamples{" + std::to_string(keep.train) +
                      ", " + std::to_string(keep.test) + "}: counts must be 0 (all) or more");
  const detail::IdxHalf train =
      detail::read_half(dir + "/train-images-idx3-ubyte.gz", dir + "/train-labels-idx1-ubyte.gz");
  const detail::IdxHalf test =
      detail::read_half(dir + "/t10k-images-idx3-ubyte.gz", dir + "/t10k-labels-idx1-ubyte.gz");
  // The training pixels' statistics from a histogram of their bytes: four histograms, so runs of
  // one byte value (the images' black background) do not wait on one counter.
  std::array<std::array<std::uint64_t, 256>, 4> counts{};
  const std::vector<std::uint8_t>& pixels = train.images.data;
  std::size_t i = 0;
  for (; i + 4 <= pixels.size(); i += 4)
    for (int k = 0; k < 4; ++k) ++counts[k][pixels[i + k]];
  for (; i < pixels.size(); ++i) ++counts[0][pixels[i]];
  double sum = 0, sq = 0;
  int values = 0, only = 0;
  for (int b = 0; b < 256; ++b) {
    const std::uint64_t c = counts[0][b] + counts[1][b] + counts[2][b] + counts[3][b];
    const double v = detail::unit_pixel(b);
    sum += static_cast<double>(c) * v;
    sq += static_cast<double>(c) * (v * v);
    if (c > 0) ++values, only = b;
  }
  const double n = static_cast<double>(pixels.size()), mean_d = sum / n;
  float mean = static_cast<float>(mean_d);
  float inv_std = static_cast<float>(1.0 / std::sqrt(sq / n - mean_d * mean_d));
  // Images of one pixel value are valid data, but their variance is 0 (or, as E[x^2] - mean^2,
  // a rounding error of either sign): 1 / sqrt of it made every pixel 0 * inf or NaN, and
  // training failed with "loss is NaN". They are centred to 0 and left unscaled.
  if (values == 1) {
    mean = detail::unit_pixel(only);
    inv_std = 1.f;
  }
  // Every pixel is one of 256 bytes: its standardised value is looked up, not recomputed. The
  // unit pixels are stored before the subtraction, so that no FMA contracts b / 255 - mean (on a
  // -march with FMA) and the values keep the bits the float pixels had.
  std::array<float, 256> unit{}, value{};
  for (int b = 0; b < 256; ++b) unit[b] = detail::unit_pixel(b);
  for (int b = 0; b < 256; ++b) value[b] = (unit[b] - mean) * inv_std;
  return {detail::standardised_head(train, keep.train, value),
          detail::standardised_head(test, keep.test, value)};
}

//! Seeded shuffled mini-batches of a dataset, gathered into caller-owned buffers: no allocation
//! after construction. The last batch of an epoch may be short (nothing is dropped). A dataset
//! in groups of rows (Dataset::group) is shuffled group by group, each group's rows kept in
//! order, and batched in whole groups.
//! Usage: `Batcher b(ds, 128, seed); b.start_epoch(e); while (index_t n = b.next(x, y)) ...`
class Batcher {
 public:
  Batcher(const Dataset& data, index_t batch, std::uint64_t seed, bool shuffle = true)
      : data_(&data), batch_(batch), seed_(seed), shuffle_(shuffle), order_(data.count) {
    if (batch <= 0) throw ConfigError("xpipe: Batcher: batch size must be positive");
    if (data.group < 1 || data.count % data.group != 0)
      throw ConfigError("xpipe: Batcher: the data set's " + std::to_string(data.count) +
                        " rows are not whole groups of " + std::to_string(data.group));
    if (batch % data.group != 0)
      throw ConfigError("xpipe: Batcher: batch size " + std::to_string(batch) +
                        " is not a whole number of the data set's groups of " +
                        std::to_string(data.group) + " rows (one sequence each)");
    std::iota(order_.begin(), order_.end(), 0);
  }

  index_t batch() const { return batch_; }
  index_t batches_per_epoch() const { return (data_->count + batch_ - 1) / batch_; }

  //! Fisher-Yates shuffle with a stream derived from (seed, epoch): the order of epoch e is the
  //! same in every run and every executor.
  void start_epoch(std::uint64_t epoch) {
    cursor_ = 0;
    std::iota(order_.begin(), order_.end(), 0);
    if (!shuffle_) return;
    Rng rng{derive_seed(seed_, epoch)};
    const index_t g = data_->group, groups = data_->count / g;
    for (index_t i = groups - 1; i > 0; --i) {
      const auto j = static_cast<index_t>(rng.below(static_cast<std::uint64_t>(i) + 1));
      if (j != i)  // (the ranges of a swap must not overlap)
        std::swap_ranges(order_.begin() + i * g, order_.begin() + (i + 1) * g,
                         order_.begin() + j * g);
    }
  }

  //! The whole epoch in its shuffled order, rows into x (count x width) and labels: what a
  //! Pipeline trains on (EpochData), mini-batch t being rows [t * batch, (t + 1) * batch).
  void gather_epoch(std::uint64_t epoch, Matrix x, std::int32_t* labels) {
    if (x.rows != data_->count || x.cols != data_->width)
      throw ShapeError("xpipe: Batcher::gather_epoch: destination is " + std::to_string(x.rows) +
                       "x" + std::to_string(x.cols) + ", the epoch is " +
                       std::to_string(data_->count) + "x" + std::to_string(data_->width));
    start_epoch(epoch);
    for (index_t r = 0; r < data_->count; ++r) {
      std::copy_n(data_->features.data() + order_[r] * data_->width, data_->width, x.row(r));
      labels[r] = data_->labels[order_[r]];
    }
    cursor_ = data_->count;
  }

  //! Copies the next batch into x (rows >= batch, cols = width) and labels; returns its rows,
  //! 0 at the end of the epoch.
  index_t next(Matrix x, std::int32_t* labels) {
    const index_t n = std::min(batch_, data_->count - cursor_);
    if (n <= 0) return 0;
    if (x.rows < n || x.cols != data_->width)
      throw ShapeError("xpipe: Batcher: destination is " + std::to_string(x.rows) + "x" +
                       std::to_string(x.cols) + ", a batch needs " + std::to_string(n) + "x" +
                       std::to_string(data_->width));
    for (index_t r = 0; r < n; ++r) {
      const index_t src = order_[cursor_ + r];
      std::copy_n(data_->features.data() + src * data_->width, data_->width, x.row(r));
      labels[r] = data_->labels[src];
    }
    cursor_ += n;
    return n;
  }

 private:
  const Dataset* data_;
  index_t batch_;
  std::uint64_t seed_;
  bool shuffle_;
  std::vector<index_t> order_;
  index_t cursor_ = 0;
};

}  // namespace xpipe
