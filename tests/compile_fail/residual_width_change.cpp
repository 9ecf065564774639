// Must not compile: a residual block of flat rows (a Transformer's tokens) with the identity
// shortcut whose Linear turns 8 features into 16, so f(x) + x has no meaning.
#include "xpipe/layers/linear.hpp"
#include "xpipe/layers/residual.hpp"
using Bad = xpipe::Residual<xpipe::Linear<8, 16>>;
int main() {
  return static_cast<int>(Bad::param_count);
}
