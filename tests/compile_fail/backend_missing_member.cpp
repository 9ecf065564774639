// Must not compile: a backend without column_block, named by check_backend's message.
#include "xpipe/xpipe.hpp"
using namespace xpipe;
struct NoColumnBlock {
  using Context = HostContext;
  using ContextOwner = HostContextOwner;
  template <class T>
  using Buffer = HostBuffer<T>;
  static constexpr const char* name = "no-column-block";
};
static_assert(check_backend<NoColumnBlock>());
int main() {}
