// IDX reader and Fashion-MNIST loader on the real files and on corrupted copies made here.
#include <catch2/catch.hpp>
#include <cstdint>
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
