// Must not compile: a queue policy whose queue has no consumer side, named by the messages of
// check_queue_policy (the policy's name) and check_queue (front/pop).
#include "xpipe/xpipe.hpp"
using namespace xpipe;
struct ProducerOnly {
  ProducerOnly(int, index_t, index_t) {}
  bool can_push() const { return true; }
  MicroBatchMessage& back() { return m; }
  void push() {}
  MicroBatchMessage m;
};
struct Policy {
  template <class B>
  using queue = ProducerOnly;
};
static_assert(check_queue_policy<Policy>());
int main() {}
