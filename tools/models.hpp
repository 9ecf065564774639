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

// A deeper, narrower MLP for deep pipelines: 784-512x7-10 (8 Linear layers), one per stage.
namespace deep {
using In = Stage<Linear<784, 512>, ReLU>;
using Mid = Stage<Linear<512, 512>, ReLU>;
using Out = Stage<Linear<512, 10>>;
}  // namespace deep

}  // namespace xpipe::tools
