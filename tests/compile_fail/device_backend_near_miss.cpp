// Must not compile: a device backend one member short of DeviceBackend (it has every member the
// emulated device has but connect), named by check_device_backend's message. With
// -DXPIPE_NEAR_MISS_WITHOUT_EVENT_QUERY it has connect but its Event lacks done() (what MPI
// staging asks from the host).
#include <cstdint>

#include "xpipe/xpipe.hpp"
using namespace xpipe;
struct NearMiss;
struct NearContext {
  using backend = NearMiss;
};
struct NearOwner {
  explicit NearOwner(const Placement&) {}
  const NearContext& ctx() const { return c; }
  NearContext c;
};
template <class T>
struct NearBuffer {
  explicit NearBuffer(index_t) {}
  T* data() { return nullptr; }
};
struct NearEvent {
  void record(const NearContext&) {}
  void wait(const NearContext&) const {}
#if !defined(XPIPE_NEAR_MISS_WITHOUT_EVENT_QUERY)
  bool done() const {
    return true;
  }
#endif
};
struct NearMiss {
  using Context = NearContext;
  using ContextOwner = NearOwner;
  template <class T>
  using Buffer = NearBuffer<T>;
  template <class T>
  using PinnedBuffer = NearBuffer<T>;
  using Event = NearEvent;
  static constexpr const char* name = "near-miss";
  static constexpr index_t column_block = 1;
};
void activate(const NearContext&) {}
void synchronize(const NearContext&) {}
#if defined(XPIPE_NEAR_MISS_WITHOUT_EVENT_QUERY)
void connect(const NearContext&, const NearContext&) {}
#endif
template <class F>
void for_each_index(const NearContext&, index_t, const F&) {}
template <class F>
void for_each_index(const NearContext&, index_t, index_t, const F&) {}
template <class F>
void for_each_element(const NearContext&, index_t, index_t, const F&) {}
template <class F>
void for_each_pixel(const NearContext&, index_t, index_t, index_t, const F&) {}
void copy_buffer(const NearContext&, const float*, float*, index_t) {}
template <class T>
void copy_from_host(const NearContext&, const T*, T*, index_t) {}
template <class T>
void copy_to_host(const NearContext&, const T*, T*, index_t) {}
template <class T>
void copy_from_pinned_async(const NearContext&, const T*, T*, index_t) {}
template <class T>
void copy_to_pinned_async(const NearContext&, const T*, T*, index_t) {}
void gemm(const NearContext&, Trans, Trans, index_t, index_t, index_t, float, const float*, index_t,
          const float*, index_t, float, float*, index_t) {}
void sum_row_losses_async(const NearContext&, const float*, index_t, MicroBatchLoss*) {}
void squared_norm_async(const NearContext&, const float*, index_t, double*) {}
static_assert(check_device_backend<NearMiss>());
int main() {}
