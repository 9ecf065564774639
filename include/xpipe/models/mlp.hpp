// The reference model of the foundation and of the studies: the 784-1024-1024-1024-10 ReLU MLP.
#pragma once

#include "xpipe/layers/activation.hpp"
#include "xpipe/layers/linear.hpp"
#include "xpipe/layers/stage.hpp"

namespace xpipe::models {

//! Fashion-MNIST MLP 784-1024-1024-1024-10 with ReLU, as one stage (sequential training).
using FashionMlp = Stage<Linear<784, 1024>, ReLU, Linear<1024, 1024>, ReLU, Linear<1024, 1024>,
                         ReLU, Linear<1024, 10>>;

}  // namespace xpipe::models
