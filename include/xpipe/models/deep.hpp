// A deeper, narrower MLP for deep pipelines: 784-512x7-10 (8 Linear layers, ReLU), one layer per
// stage at K = 8, two at K = 4 and four at K = 2, so that a study compares one network across
// pipeline depths (the layers and their initialisation are the same at every split). What
// xpipe-train trains with --model deep.
#pragma once

#include "xpipe/layers/activation.hpp"
#include "xpipe/layers/linear.hpp"
#include "xpipe/layers/stage.hpp"

namespace xpipe::models::deep {

using H = Linear<512, 512>;
//! Eight stages (K = 8): Pipeline<In, Mid x 6, Out, ...>.
using In = Stage<Linear<784, 512>, ReLU>;
using Mid = Stage<H, ReLU>;
using Out = Stage<Linear<512, 10>>;
//! Four stages (K = 4): Pipeline<In2, Mid2, Mid2, Out2, ...>.
using In2 = Stage<Linear<784, 512>, ReLU, H, ReLU>;
using Mid2 = Stage<H, ReLU, H, ReLU>;
using Out2 = Stage<H, ReLU, Linear<512, 10>>;
//! Two stages (K = 2): Pipeline<In4, Out4, ...>.
using In4 = Stage<Linear<784, 512>, ReLU, H, ReLU, H, ReLU, H, ReLU>;
using Out4 = Stage<H, ReLU, H, ReLU, H, ReLU, Linear<512, 10>>;

}  // namespace xpipe::models::deep
