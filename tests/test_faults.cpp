// Every input checked (issue 13): bad labels, lying or odd data files, short epochs under
// weight stashing, and layers that throw what is not a std::exception.
#include <dirent.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "support/support.hpp"
#include "xpipe/xpipe.hpp"

using namespace xpipe;
using Catch::Contains;

namespace {

int thread_count() {
  int n = 0;
  if (DIR* dir = opendir("/proc/self/task")) {
    while (const dirent* e = readdir(dir)) n += e->d_name[0] != '.';
    closedir(dir);
  }
  return n;
}

// A width-preserving layer that throws an int (not a std::exception) on its n-th forward call.
inline std::atomic<int> int_forward_calls{0};
inline int int_throw_at = -1;
struct ThrowsInt {
  static constexpr int in_width = any_width, out_width = any_width;
  static constexpr index_t param_count = 0;
  static void init(std::span<float>, std::uint64_t) {}
  static void forward(const HostContext& ctx, const float* p, ConstMatrix x, Matrix y) {
    if (int_forward_calls.fetch_add(1) == int_throw_at) throw 42;
    Activation<math::Identity>::forward(ctx, p, x, y);
  }
  static void backward(const HostContext& ctx, const float* p, float* g, bool acc, ConstMatrix x,
                       ConstMatrix y, ConstMatrix dy, Matrix dx) {
    Activation<math::Identity>::backward(ctx, p, g, acc, x, y, dy, dx);
  }
};

}  // namespace

TEST_CASE("A layer throwing a non-std::exception becomes a StageError - no thread left",
          "[faults][executor]") {
  using A = Stage<Linear<8, 8>, ReLU>;
  using B = Stage<Linear<8, 8>, ThrowsInt>;
  using C = Stage<Linear<8, 4>>;
  const auto d = test::random_classification(8 * 40, 8, 4, 5);
  Pipeline<A, B, C, Latest> p(Adam{}, {.batch = 8, .micro_batches = 2});
  const Schedule s = async_1f1b(3, 2, 40);
  auto expect_stage_error = [&](auto& exec) {
    int_forward_calls = 0;
    int_throw_at = 17;  // stage 1's 18th forward: F17, mid-run
    try {
      p.train(s, d.epoch(), exec);
      FAIL("no exception");
    } catch (const StageError& e) {
      REQUIRE(e.stage() == 1);
      REQUIRE_THAT(e.what(), Contains("stage 1, action F17") && Contains("non-standard exception"));
    }
    int_throw_at = -1;
  };
  SECTION("threaded") {
    const int threads_before = thread_count();
    ThreadedExecutor exec;
    exec.wait_timeout = std::chrono::hours(1);  // the others must stop because of the failure
    expect_stage_error(exec);
    REQUIRE(thread_count() == threads_before);  // every stage thread joined
    // The pipeline is still usable: the next run trains to the end.
    REQUIRE_NOTHROW(p.train(s, d.epoch(), exec));
  }
  SECTION("reference") {
    ReferenceExecutor exec;
    expect_stage_error(exec);
    REQUIRE_NOTHROW(p.train(s, d.epoch(), exec));
  }
}
