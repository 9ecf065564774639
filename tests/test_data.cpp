// IDX reader and Fashion-MNIST loader on the real files and on corrupted copies made here.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "support/support.hpp"
#include "xpipe/xpipe.hpp"

namespace fs = std::filesystem;

namespace {

const std::string real_dir = xpipe::default_fashion_mnist_dir();

fs::path scratch_dir() {
  return xpipe::test::scratch_dir("data");
}

using xpipe::test::idx_bytes;
using xpipe::test::write_gz;

}  // namespace

TEST_CASE("IDX reader loads the real Fashion-MNIST files", "[data]") {
  const auto images = xpipe::read_idx(real_dir + "/train-images-idx3-ubyte.gz");
  REQUIRE(images.dims == std::vector<std::uint32_t>{60000, 28, 28});
  REQUIRE(images.data.size() == 60000u * 28 * 28);
  const auto labels = xpipe::read_idx(real_dir + "/t10k-labels-idx1-ubyte.gz");
  REQUIRE(labels.dims == std::vector<std::uint32_t>{10000});
  const std::set<std::uint8_t> distinct(labels.data.begin(), labels.data.end());
  REQUIRE(distinct == std::set<std::uint8_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
}

TEST_CASE("Fashion-MNIST loader: counts - standardised pixels - balanced labels", "[data]") {
  const auto d = xpipe::load_fashion_mnist(real_dir);
  REQUIRE(d.train.count == 60000);
  REQUIRE(d.test.count == 10000);
  REQUIRE(d.train.width == 784);
  double sum = 0, sq = 0;
  for (float v : d.train.features) sum += v, sq += double(v) * v;
  const double n = double(d.train.features.size());
  REQUIRE(sum / n == Approx(0).margin(1e-4));
  REQUIRE(sq / n == Approx(1).epsilon(1e-3));
  std::vector<int> per_class(10, 0);
  for (int l : d.test.labels) per_class[l]++;
  for (int c : per_class) REQUIRE(c == 1000);  // the test set has 1000 per class
}

TEST_CASE("Fashion-MNIST's standardised pixels against the raw bytes' mean and deviation",
          "[data]") {
  // The oracle: the training bytes' mean and standard deviation of b / 255 summed in long
  // double, byte by byte, and each pixel standardised in long double.
  const auto raw = xpipe::read_idx(real_dir + "/train-images-idx3-ubyte.gz");
  long double sum = 0, sq = 0;
  for (std::uint8_t b : raw.data) sum += b / 255.0L, sq += (b / 255.0L) * (b / 255.0L);
  const long double n = static_cast<long double>(raw.data.size());
  const long double mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
  const auto d = xpipe::load_fashion_mnist(real_dir);
  const auto test_raw = xpipe::read_idx(real_dir + "/t10k-images-idx3-ubyte.gz");
  // Every pixel of both halves within a few float roundings of values up to 2.7 (ulp 2.4e-7).
  long double worst = 0;
  for (std::size_t i = 0; i < raw.data.size(); ++i)
    worst = std::max(
        worst, std::abs(d.train.features[xpipe::index_t(i)] - (raw.data[i] / 255.0L - mean) / sd));
  for (std::size_t i = 0; i < test_raw.data.size(); ++i)
    worst = std::max(worst, std::abs(d.test.features[xpipe::index_t(i)] -
                                     (test_raw.data[i] / 255.0L - mean) / sd));
  INFO("worst difference " << static_cast<double>(worst));
  REQUIRE(worst < 1e-6L);
}

TEST_CASE("Fashion-MNIST's FirstSamples keeps the first rows with the whole set's bits", "[data]") {
  const auto all = xpipe::load_fashion_mnist(real_dir);
  const auto some = xpipe::load_fashion_mnist(real_dir, {.train = 300, .test = 7});
  REQUIRE(some.train.count == 300);
  REQUIRE(some.test.count == 7);
  REQUIRE(some.train.features.size() == 300 * 784);
  REQUIRE(some.test.features.size() == 7 * 784);
  // Standardised with all 60,000 images' statistics, not the kept ones'.
  REQUIRE(std::memcmp(some.train.features.data(), all.train.features.data(), 300 * 784 * 4) == 0);
  REQUIRE(std::memcmp(some.test.features.data(), all.test.features.data(), 7 * 784 * 4) == 0);
  REQUIRE(some.train.labels ==
          std::vector<std::int32_t>(all.train.labels.begin(), all.train.labels.begin() + 300));
  REQUIRE(some.test.labels ==
          std::vector<std::int32_t>(all.test.labels.begin(), all.test.labels.begin() + 7));
  // 0 keeps a half whole; more than there are keeps all of it.
  const auto whole_test = xpipe::load_fashion_mnist(real_dir, {.train = 1, .test = 0});
  REQUIRE(whole_test.test.count == 10000);
  REQUIRE(xpipe::load_fashion_mnist(real_dir, {.train = 70000, .test = 1}).train.count == 60000);
  REQUIRE_THROWS_WITH(xpipe::load_fashion_mnist(real_dir, {.train = -5, .test = 0}),
                      Catch::Contains("FirstSamples{-5, 0}") && Catch::Contains("0 (all) or more"));
}

TEST_CASE("IDX reader rejects missing and corrupted files with the file's name", "[data]") {
  const fs::path dir = scratch_dir();
  SECTION("missing file") {
    const std::string p = (dir / "absent.gz").string();
    REQUIRE_THROWS_WITH(xpipe::read_idx(p), Catch::Contains(p) && Catch::Contains("cannot open"));
  }
  SECTION("bad magic") {
    const fs::path p = dir / "bad_magic.gz";
    auto b = idx_bytes(0x08, {3}, 3);
    b[0] = 0x12;
    write_gz(p, b);
    REQUIRE_THROWS_WITH(
        xpipe::read_idx(p.string()),
        Catch::Contains(p.string()) && Catch::Contains("bad magic number 0x12000801"));
  }
  SECTION("wrong element type") {
    const fs::path p = dir / "floats.gz";
    write_gz(p, idx_bytes(0x0D, {3}, 12));
    REQUIRE_THROWS_WITH(xpipe::read_idx(p.string()), Catch::Contains("bad magic"));
  }
  SECTION("truncated data") {
    const fs::path p = dir / "short.gz";
    write_gz(p, idx_bytes(0x08, {5, 28, 28}, 4 * 28 * 28));
    REQUIRE_THROWS_WITH(xpipe::read_idx(p.string()),
                        Catch::Contains(p.string()) && Catch::Contains("truncated") &&
                            Catch::Contains("3920") && Catch::Contains("3136"));
  }
  SECTION("trailing bytes") {
    const fs::path p = dir / "long.gz";
    write_gz(p, idx_bytes(0x08, {4}, 6));
    REQUIRE_THROWS_WITH(xpipe::read_idx(p.string()), Catch::Contains("unexpected bytes"));
  }
  SECTION("zero dimension") {
    const fs::path p = dir / "zero.gz";
    write_gz(p, idx_bytes(0x08, {0}, 0));
    REQUIRE_THROWS_WITH(xpipe::read_idx(p.string()), Catch::Contains("dimension 0 = 0"));
  }
  SECTION("gzip stream cut in half") {
    const fs::path p = dir / "cut.gz";
    std::ifstream in(real_dir + "/t10k-labels-idx1-ubyte.gz", std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream(p, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size() / 2));
    REQUIRE_THROWS_WITH(xpipe::read_idx(p.string()), Catch::Contains(p.string()));
  }
  fs::remove_all(dir);
}

TEST_CASE("Fashion-MNIST loader rejects inconsistent files", "[data]") {
  const fs::path dir = scratch_dir();
  const auto copy = [&](const char* name) {
    fs::copy_file(real_dir + "/" + name, dir / name, fs::copy_options::overwrite_existing);
  };
  copy("train-images-idx3-ubyte.gz");
  copy("train-labels-idx1-ubyte.gz");
  copy("t10k-images-idx3-ubyte.gz");
  SECTION("wrong label count") {
    write_gz(dir / "t10k-labels-idx1-ubyte.gz", idx_bytes(0x08, {9999}, 9999));
    REQUIRE_THROWS_WITH(xpipe::load_fashion_mnist(dir.string()),
                        Catch::Contains("10000 images") && Catch::Contains("9999 labels"));
  }
  SECTION("label out of range") {
    auto b = idx_bytes(0x08, {10000}, 10000);
    b[8 + 17] = 12;
    write_gz(dir / "t10k-labels-idx1-ubyte.gz", b);
    REQUIRE_THROWS_WITH(xpipe::load_fashion_mnist(dir.string()),
                        Catch::Contains("label 12 at index 17"));
  }
  SECTION("missing directory") {
    REQUIRE_THROWS_AS(xpipe::load_fashion_mnist((dir / "nowhere").string()), xpipe::DataError);
  }
  fs::remove_all(dir);
}

TEST_CASE("Batcher: seeded - complete - reproducible epochs", "[data]") {
  xpipe::Dataset d;
  d.count = 10;
  d.width = 2;
  d.features = xpipe::HostBuffer<float>(20);
  for (int i = 0; i < 10; ++i) d.features[2 * i] = float(i), d.labels.push_back(i);
  xpipe::Batcher a(d, 4, 99), b(d, 4, 99), c(d, 4, 100);
  std::vector<float> xa(8), xb(8), xc(8);
  std::vector<std::int32_t> ya(4), yb(4), yc(4);
  std::multiset<int> seen;
  std::vector<int> order_a, order_c;
  a.start_epoch(1), b.start_epoch(1), c.start_epoch(1);
  std::vector<xpipe::index_t> sizes;
  while (auto n = a.next({xa.data(), 4, 2}, ya.data())) {
    REQUIRE(b.next({xb.data(), 4, 2}, yb.data()) == n);
    c.next({xc.data(), 4, 2}, yc.data());
    sizes.push_back(n);
    for (xpipe::index_t r = 0; r < n; ++r) {
      REQUIRE(ya[r] == yb[r]);
      REQUIRE(xa[2 * r] == float(ya[r]));  // features travel with their label
      seen.insert(ya[r]);
      order_a.push_back(ya[r]);
      order_c.push_back(yc[r]);
    }
  }
  REQUIRE(sizes == std::vector<xpipe::index_t>{4, 4, 2});  // the short last batch is kept
  REQUIRE(seen == std::multiset<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  REQUIRE(order_a != order_c);  // another seed, another order
}
