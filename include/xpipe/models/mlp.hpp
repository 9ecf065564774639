// The reference model of the foundation and of the studies: the 784-1024-1024-1024-10 ReLU MLP.
#pragma once

#include "xpipe/layers/activation.hpp"
#include "xpipe/layers/dense.hpp"
#include "xpipe/layers/linear.hpp"
#include "xpipe/layers/stage.hpp"

namespace xpipe::models {

//! Fashion-MNIST MLP 784-1024-1024-1024-10 with ReLU, as one stage (sequential training).
using FashionMlp = Stage<Linear<784, 1024>, ReLU, Linear<1024, 1024>, ReLU, Linear<1024, 1024>,
                         ReLU, Linear<1024, 10>>;

//! The same MLP with each ReLU fused into its Linear (Dense): the same flat layout, the same
//! initial weights from a seed and the same bits on the host, with one pass (one cuBLASLt call
//! on CUDA) less per hidden layer and no pre-activations kept.
using FashionMlpFused = Stage<Dense<784, 1024, ReLU>, Dense<1024, 1024, ReLU>,
                              Dense<1024, 1024, ReLU>, Linear<1024, 10>>;

}  // namespace xpipe::models
