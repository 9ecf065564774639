// Fashion-MNIST loading (normalised float images, int labels) and seeded shuffled batching.
#pragma once

#include <algorithm>
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

namespace detail {
inline Dataset images_and_labels(const std::string& images_path, const std::string& labels_path) {
  const IdxArray images = read_idx(images_path);
  const IdxArray labels = read_idx(labels_path);
  if (images.dims.size() != 3 || images.dims[1] != 28 || images.dims[2] != 28)
    throw DataError("xpipe: IDX file '" + images_path + "' is not a set of 28x28 images (" +
                    std::to_string(images.dims.size()) + " dimensions)");
  if (labels.dims.size() != 1)
    throw DataError("xpipe: IDX file '" + labels_path + "' is not a label vector (" +
                    std::to_string(labels.dims.size()) + " dimensions)");
  if (images.count() != labels.count())
    throw DataError("xpipe: '" + images_path + "' holds " + std::to_string(images.count()) +
                    " images but '" + labels_path + "' holds " + std::to_string(labels.count()) +
                    " labels");
  Dataset d;
  d.count = static_cast<index_t>(images.count());
  d.width = 28 * 28;
  d.classes = 10;
  d.features = HostBuffer<float>(d.count * d.width);
  for (std::size_t i = 0; i < images.data.size(); ++i)
    d.features[static_cast<index_t>(i)] = static_cast<float>(images.data[i]) * (1.f / 255.f);
  d.labels.resize(labels.data.size());
  for (std::size_t i = 0; i < labels.data.size(); ++i) {
    // Unsigned bytes: only the upper bound can fail.
    if (labels.data[i] >= d.classes)
      throw DataError("xpipe: labels file '" + labels_path + "': label " +
                      std::to_string(labels.data[i]) + " at index " + std::to_string(i) +
                      " is outside 0.." + std::to_string(d.classes - 1));
    d.labels[i] = labels.data[i];
  }
  return d;
}
}  // namespace detail

//! Loads Fashion-MNIST from `dir` (the four standard .gz IDX files) and standardises pixels with
//! the training set's mean and standard deviation (applied to both halves; a training set of
//! one pixel value is only centred).
//! Throws DataError naming the file when one is missing, truncated or malformed.
inline DatasetPair load_fashion_mnist(const std::string& dir = default_fashion_mnist_dir()) {
  DatasetPair p;
  p.train = detail::images_and_labels(dir + "/train-images-idx3-ubyte.gz",
                                      dir + "/train-labels-idx1-ubyte.gz");
  p.test = detail::images_and_labels(dir + "/t10k-images-idx3-ubyte.gz",
                                     dir + "/t10k-labels-idx1-ubyte.gz");
  double sum = 0, sq = 0;
  for (float v : p.train.features) {
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  const double n = static_cast<double>(p.train.features.size());
  double mean = sum / n;
  float inv_std = static_cast<float>(1.0 / std::sqrt(sq / n - mean * mean));
  // Images of one pixel value are valid data, but their variance is 0 (or, as E[x^2] - mean^2,
  // a rounding error of either sign): 1 / sqrt of it made every pixel 0 * inf or NaN, and
  // training failed with "loss is NaN". They are centred to 0 and left unscaled.
  const float first = p.train.features.size() > 0 ? p.train.features[0] : 0.f;
  if (std::all_of(p.train.features.begin(), p.train.features.end(),
                  [&](float v) { return v == first; })) {
    mean = first;
    inv_std = 1.f;
  }
  for (Dataset* d : {&p.train, &p.test})
    for (float& v : d->features) v = (v - static_cast<float>(mean)) * inv_std;
  return p;
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
