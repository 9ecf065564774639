// The models xpipe-train can run, each split over several stage counts: the table that maps
// run-time flags onto compile-time Pipeline types.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>

#include "xpipe/xpipe.hpp"

namespace xpipe::tools {

// Reference MLP 784-1024-1024-1024-10 (ReLU), as one stage and split over 2 and 4 stages
// (4 is its finest split: a stage needs a layer of fixed width, so ReLU cannot stand alone).
using L1 = Linear<784, 1024>;
using L2 = Linear<1024, 1024>;
using L3 = Linear<1024, 1024>;
using L4 = Linear<1024, 10>;
namespace mlp {
using K1 = models::FashionMlp;
using K2a = Stage<L1, ReLU, L2, ReLU>;
using K2b = Stage<L3, ReLU, L4>;
using A = Stage<L1, ReLU>;
using B = Stage<L2, ReLU>;
using C = Stage<L3, ReLU>;
using D = Stage<L4>;
}  // namespace mlp

// A deeper, narrower MLP for deep pipelines: 784-512x7-10 (8 Linear layers), one per stage at
// K = 8, two per stage at K = 4 and four at K = 2, so the staleness sweep compares one network
// across pipeline depths (the layers and their initialisation are the same at every split).
namespace deep {
using In = Stage<Linear<784, 512>, ReLU>;
using Mid = Stage<Linear<512, 512>, ReLU>;
using Out = Stage<Linear<512, 10>>;
using H = Linear<512, 512>;
using In2 = Stage<Linear<784, 512>, ReLU, H, ReLU>;  // K = 4
using Mid2 = Stage<H, ReLU, H, ReLU>;
using Out2 = Stage<H, ReLU, Linear<512, 10>>;
using In4 = Stage<Linear<784, 512>, ReLU, H, ReLU, H, ReLU, H, ReLU>;  // K = 2
using Out4 = Stage<H, ReLU, H, ReLU, H, ReLU, Linear<512, 10>>;
}  // namespace deep

}  // namespace xpipe::tools
