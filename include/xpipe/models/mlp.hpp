// The reference model of the foundation and of the studies: the 784-1024-1024-1024-10 ReLU MLP,
// whole and split over 2 and 4 stages exactly as xpipe-train trains it (--model mlp).
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

namespace mlp {
using L1 = Linear<784, 1024>;
using L2 = Linear<1024, 1024>;
using L3 = Linear<1024, 1024>;
using L4 = Linear<1024, 10>;
//! One stage (K = 1): FashionMlp.
using K1 = FashionMlp;
//! Two stages (K = 2): Pipeline<K2a, K2b, ...>.
using K2a = Stage<L1, ReLU, L2, ReLU>;
using K2b = Stage<L3, ReLU, L4>;
//! Four stages (K = 4, the finest split: a stage needs a layer of fixed width, so a ReLU cannot
//! stand alone): Pipeline<A, B, C, D, ...>.
using A = Stage<L1, ReLU>;
using B = Stage<L2, ReLU>;
using C = Stage<L3, ReLU>;
using D = Stage<L4>;
}  // namespace mlp

}  // namespace xpipe::models
