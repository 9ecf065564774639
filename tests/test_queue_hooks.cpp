// The ordering hooks a device queue relies on (comm/queue.hpp's optional Queue members, what
// orders the CUDA streams in comm/spsc_ring.hpp), called by every stage program where they
// belong: checked on the host, with no GPU, by a ring that records them.

#include <atomic>
#include <catch2/catch.hpp>
#include <vector>

#include "support/support.hpp"
#include "xpipe/xpipe.hpp"

using namespace xpipe;

namespace {

using S0 = Stage<Linear<20, 32>, ReLU>;
using S1 = Stage<Linear<32, 32>, GELU>;
using S2 = Stage<Linear<32, 16>, ReLU>;
using S3 = Stage<Linear<16, 4>>;

std::atomic<long> violations{0}, back_hooks{0}, front_hooks{0}, pushes{0}, pops{0};

// The in-process ring with the four hooks. Per side a little state machine: a producer must
// acquire the slot, then release it, then push (in that order, once each); a consumer must see
// a message, acquire it, release it, then pop. Each side's state is touched by its own thread.
template <class B>
struct HookedRing : SpscRing<B> {
  using SpscRing<B>::SpscRing;
  HookedRing(HookedRing&&) noexcept = default;
  int producer_step = 0, consumer_step = 0;

  template <class Ctx>
  void acquire_back(const Ctx&) {
    expect(producer_step == 0 && this->can_push());
    producer_step = 1;
  }
  template <class Ctx>
  void release_back(const Ctx&) {
    expect(producer_step == 1);
    producer_step = 2;
    back_hooks.fetch_add(1);
  }
  void push() {
    expect(producer_step == 2);
    producer_step = 0;
    pushes.fetch_add(1);
    SpscRing<B>::push();
  }
  template <class Ctx>
  void acquire_front(const Ctx&) {
    expect(consumer_step == 0 && this->can_pop());
    consumer_step = 1;
  }
  template <class Ctx>
  void release_front(const Ctx&) {
    expect(consumer_step == 1);
    consumer_step = 2;
    front_hooks.fetch_add(1);
  }
  void pop() {
    expect(consumer_step == 2);
    consumer_step = 0;
    pops.fetch_add(1);
    SpscRing<B>::pop();
  }

 private:
  static void expect(bool ok) {
    if (!ok) violations.fetch_add(1);
  }
};
struct HookedQueue {
  template <class B>
  using queue = HookedRing<B>;
  static constexpr const char* name = "hooked";
};
static_assert(QueuePolicy<HookedQueue>);

template <class P, class Q, class E>
std::vector<float> run(const Schedule& s, const test::LabelledData& d) {
  Pipeline<S0, S1, S2, S3, P, Adam, Q> p(Adam{.lr = 1e-2f},
                                         {.batch = 16, .micro_batches = 4, .seed = 3});
  E exec;
  p.train(s, d.epoch(), exec);
  return p.weights();
}

}  // namespace

TEST_CASE("Every push and pop of a stage program is ordered by the queue's device hooks",
          "[pipeline][queue]") {
  const test::LabelledData d = test::random_classification(160, 20, 4, 1);
  for (const Schedule& s : {gpipe(4, 4, 10), async_1f1b(4, 4, 10)}) {
    INFO(s.name);
    violations = back_hooks = front_hooks = pushes = pops = 0;
    const auto hooked = run<XPipe, HookedQueue, ThreadedExecutor>(s, d);
    const auto hooked_ref = run<Stash, HookedQueue, ReferenceExecutor>(s, d);
    REQUIRE(violations.load() == 0);
    // 3 boundaries, each micro-batch crosses each twice (activations, gradients), 2 runs.
    const long messages = 2L * 2 * 3 * s.total_micro_batches();
    REQUIRE(pushes.load() == messages);
    REQUIRE(pops.load() == messages);
    REQUIRE(back_hooks.load() == messages);
    REQUIRE(front_hooks.load() == messages);
    // The hooks order device work; on the host they change nothing.
    REQUIRE(hooked == run<XPipe, InProcessRing, ReferenceExecutor>(s, d));
    REQUIRE(hooked_ref == run<Stash, InProcessRing, ThreadedExecutor>(s, d));
  }
}
