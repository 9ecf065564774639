// Must not compile: a layer that declares fuses_residual_sum (as BatchNorm2d does) but has no
// forward_sum, at the end of a residual block's path; the message names the missing member.
#include "xpipe/xpipe.hpp"
using S = xpipe::Shape<4, 6, 6>;
struct NoSum : xpipe::BatchNorm2d<S> {
  template <class Post, class... A>
  static void forward_sum(A&&...) = delete;
};
using Bad = xpipe::Residual<xpipe::Conv2d<S, 4, 3, xpipe::ConvOptions{.padding = 1}>, NoSum>;
int main() {
  Bad::Saved<xpipe::Host> saved(1);
  Bad::forward(xpipe::HostContext{}, nullptr, xpipe::ConstMatrix{}, xpipe::Matrix{}, saved,
               xpipe::Running{});
}
