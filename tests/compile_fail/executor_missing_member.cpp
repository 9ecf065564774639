// Must not compile: an executor without trace(), named by check_executor's message.
#include "xpipe/xpipe.hpp"
using namespace xpipe;
struct NoTrace {
  static constexpr const char* name = "no-trace";
  template <class P>
  void run(P&) {}
};
static_assert(check_executor<NoTrace>());
int main() {}
