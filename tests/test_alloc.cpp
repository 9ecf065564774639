// No allocation inside a training step: global operator new is counted while a flag is set.
// With one GEMM thread (the pipeline's configuration: one per stage thread) the count must be 0.
// oneDNN's multi-threaded dnnl_sgemm allocates one block per call internally; with 2 threads
// that count is printed (one per two-thread GEMM: the forward's 4 per step, the backward's run on
// one thread each in two lanes), and each of them must come from inside oneDNN. Its convolution
// primitives allocate inside every execute call (their arguments' bookkeeping), so a CNN's step
// is checked by who calls operator new: each call's return address is looked up (dladdr), and
// every allocation from outside libdnnl counts as ours, which must be none.
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>

#include "support/support.hpp"
#include "xpipe/models/resnet.hpp"
#include "xpipe/xpipe.hpp"

namespace {
std::atomic<bool> counting{false};
std::atomic<long> allocations{0};
std::atomic<long> by_onednn{0};  // of them, made by code inside libdnnl
void* onednn_base = nullptr;     // where libdnnl is loaded (dladdr of dnnl_sgemm)
// Whether the code at `caller` lies in libdnnl.
bool in_onednn(void* caller) {
  Dl_info info;
  return onednn_base != nullptr && dladdr(caller, &info) != 0 && info.dli_fbase == onednn_base;
}
void* counted(std::size_t n, std::size_t align, void* caller) {
  if (counting.load(std::memory_order_relaxed)) {
    allocations.fetch_add(1);
    if (in_onednn(caller)) by_onednn.fetch_add(1);
  }
  void* p = align > alignof(std::max_align_t)
                ? std::aligned_alloc(align, (n + align - 1) / align * align)
                : std::malloc(n == 0 ? 1 : n);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
}  // namespace

void* operator new(std::size_t n) {
  return counted(n, 0, __builtin_return_address(0));
}
void* operator new[](std::size_t n) {
  return counted(n, 0, __builtin_return_address(0));
}
void* operator new(std::size_t n, std::align_val_t a) {
  return counted(n, std::size_t(a), __builtin_return_address(0));
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return counted(n, std::size_t(a), __builtin_return_address(0));
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}

namespace {
// Allocations in `steps` sequential Adam steps of a batch of `batch` rows (784 features, 10
// classes) of Net on `threads` threads, after three warm-up steps; `onednn` gets how many of
// them were made by code inside oneDNN.
template <class Net>
long allocations_in_steps(int threads, xpipe::index_t batch, int steps, long& onednn) {
  const xpipe::HostContext ctx{.threads = threads};
  xpipe::ScopedFlushDenormals ftz;
  xpipe::SequentialTrainer<Net, xpipe::Adam> trainer(xpipe::Adam{}, batch, 1);
  xpipe::HostBuffer<float> x(batch * 784);
  xpipe::HostBuffer<std::int32_t> y(batch);
  xpipe::Rng rng{2};
  xpipe::test::fill_uniform(x, rng);
  xpipe::test::fill_labels(y, rng, 10);
  const xpipe::ConstMatrix xm{x.data(), batch, 784};
  for (int i = 0; i < 3; ++i) trainer.train_step(ctx, xm, y.data());  // warm-up
  allocations = 0;
  by_onednn = 0;
  counting = true;
  for (int i = 0; i < steps; ++i) trainer.train_step(ctx, xm, y.data());
  counting = false;
  onednn = by_onednn.exchange(0);
  return allocations.exchange(0);
}
// A ResNet of every kind of layer the host's convolutional networks use (convolutions, BatchNorm
// and BatchNormAct, identity and projected residual blocks with their ReLU fused, the pooling
// head), 32 images a step.
namespace rn = xpipe::models::resnet;
using Resnet = xpipe::Stage<xpipe::Conv2d<rn::Image<1, 28>, 16, 3, rn::keep>, rn::BNReLU<16, 28>,
                            rn::B16, rn::D32, rn::B32, rn::D64, rn::B64,
                            xpipe::GlobalAvgPool<rn::Image<64, 7>>, xpipe::Linear<64, 10>>;
// Allocations of a whole Pipeline::train call over n mini-batches: setup (analysis, queues,
// slots, predictor copies, stage threads) allocates a fixed number of blocks whatever n is, so
// equal counts for two n prove that running the actions allocates nothing.
template <class Executor>
long allocations_in_pipeline(int n, bool zero_bubble = false) {
  using namespace xpipe;
  using S0 = Stage<Linear<16, 32>, ReLU>;
  using S1 = Stage<Linear<32, 8>>;
  Pipeline<S0, S1, XPipe> p(Adam{}, {.batch = 8, .micro_batches = 2});
  std::vector<float> x(8 * n * 16, 0.5f);
  std::vector<std::int32_t> y(8 * n, 1);
  // Zero bubble: the split backward's input and weight halves (InputGrad, WeightGrad).
  const Schedule s = zero_bubble ? zb_h1(2, 2, n) : async_1f1b(2, 2, n);
  Executor exec;
  p.train(s, {{x.data(), 8 * n, 16}, y.data()}, exec);  // warm-up: first-time buffers
  allocations = 0;
  counting = true;
  p.train(s, {{x.data(), 8 * n, 16}, y.data()}, exec);
  counting = false;
  return allocations.exchange(0);
}
}  // namespace

int main() {
  // A bare allocation while counting must register, or a zero below proves nothing. The pointer
  // is kept in a volatile, or the compiler may elide the pair (GCC does at -O1).
  counting = true;
  int* volatile probe = new int(1);
  delete probe;
  counting = false;
  if (allocations.exchange(0) != 1 || by_onednn.exchange(0) != 0) {
    std::puts("FAIL: the allocation counter does not see operator new, or takes this for oneDNN");
    return 1;
  }
  Dl_info onednn;
  if (dladdr(reinterpret_cast<void*>(&dnnl_sgemm), &onednn) == 0 || onednn.dli_fbase == nullptr) {
    std::puts("FAIL: dladdr does not find the library dnnl_sgemm lies in");
    return 1;
  }
  onednn_base = onednn.dli_fbase;
  long onednn_one = 0, onednn_two = 0;  // the first must be 0 too, as `one` is
  const long one = allocations_in_steps<xpipe::models::FashionMlp>(1, 128, 10, onednn_one);
  const long two = allocations_in_steps<xpipe::models::FashionMlp>(2, 128, 10, onednn_two);
  std::printf(
      "operator new calls in 10 training steps: %ld with 1 thread (must be 0), %ld with 2 "
      "threads, %ld of them inside oneDNN's threaded sgemm (must be all)\n",
      one, two, onednn_two);
  const long ref10 = allocations_in_pipeline<xpipe::ReferenceExecutor>(10);
  const long ref40 = allocations_in_pipeline<xpipe::ReferenceExecutor>(40);
  const long thr10 = allocations_in_pipeline<xpipe::ThreadedExecutor>(10);
  const long thr40 = allocations_in_pipeline<xpipe::ThreadedExecutor>(40);
  const long zb10 = allocations_in_pipeline<xpipe::ThreadedExecutor>(10, true);
  const long zb40 = allocations_in_pipeline<xpipe::ThreadedExecutor>(40, true);
  std::printf(
      "operator new calls in Pipeline::train over 10 / 40 mini-batches: reference %ld / "
      "%ld, threaded %ld / %ld, threaded ZB-H1 %ld / %ld (must not grow)\n",
      ref10, ref40, thr10, thr40, zb10, zb40);
  // The ResNet on one thread: its convolutions' execute calls allocate inside oneDNN.
  long cnn_onednn = 0;
  const long cnn = allocations_in_steps<Resnet>(1, 32, 10, cnn_onednn) - cnn_onednn;
  std::printf(
      "operator new calls in 10 ResNet training steps on 1 thread: %ld from xpipe (must be 0), "
      "%ld inside oneDNN's convolution calls (not ours; must be some, or the lookup sees "
      "nothing)\n",
      cnn, cnn_onednn);
  return one == 0 && two == onednn_two && ref10 == ref40 && thr10 == thr40 && zb10 == zb40 &&
                 cnn == 0 && cnn_onednn > 0
             ? 0
             : 1;
}
