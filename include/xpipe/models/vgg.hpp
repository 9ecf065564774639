// A VGG-style convolutional network for 28x28 single-channel images (Fashion-MNIST): two blocks of
// two 3x3 convolutions and a 2x2 max pool, then a two-layer classifier; whole and split over 2
// and 4 stages, as xpipe-train trains it (--model vgg).
#pragma once

#include "xpipe/core/shape.hpp"
#include "xpipe/layers/activation.hpp"
#include "xpipe/layers/conv.hpp"
#include "xpipe/layers/flatten.hpp"
#include "xpipe/layers/linear.hpp"
#include "xpipe/layers/pool.hpp"
#include "xpipe/layers/stage.hpp"

namespace xpipe::models::vgg {

//! 3x3 convolutions keep the image size (padding 1), as VGG's do.
inline constexpr ConvOptions same{.stride = 1, .padding = 1};

using Image = Shape<1, 28, 28>;
using C1 = Conv2d<Image, 16, 3, same>;              // 16x28x28
using C2 = Conv2d<Shape<16, 28, 28>, 16, 3, same>;  // 16x28x28
using P1 = MaxPool2d<Shape<16, 28, 28>, 2>;         // 16x14x14
using C3 = Conv2d<Shape<16, 14, 14>, 32, 3, same>;  // 32x14x14
using C4 = Conv2d<Shape<32, 14, 14>, 32, 3, same>;  // 32x14x14
using P2 = MaxPool2d<Shape<32, 14, 14>, 2>;         // 32x7x7
using F = Flatten<Shape<32, 7, 7>>;                 // 1568
using FC1 = Linear<32 * 7 * 7, 128>;
using FC2 = Linear<128, 10>;

//! At each pooling the ReLU comes after it: max(relu(x)) = relu(max(x)), the same input takes
//! the gradient, and that ReLU runs over a quarter of the floats (ReLU's share of a 1-thread
//! step 5.4% where 8.5%; docs/results.md). The bits are those of VGG's order, ReLU then pool
//! (tests/test_conv.cpp), but for a window whose largest value is a zero: -0 where the first such
//! zero is -0 and the window's first value is negative (+0 in VGG's order).
//!
//! One stage (K = 1): sequential training. 1x28x28 -> 10 logits; 0.22 M parameters and 4.8 M
//! multiply-adds per image forward, 3.6 M of them in C2 and C4.
using K1 = Stage<C1, ReLU, C2, P1, ReLU, C3, ReLU, C4, P2, ReLU, F, FC1, ReLU, FC2>;
//! Two stages (K = 2): the first block, then the second and the classifier (1.9 M and 2.9 M
//! multiply-adds; 19.5 and 24.8 ms measured, the best cut).
using K2a = Stage<C1, ReLU, C2, P1, ReLU>;
using K2b = Stage<C3, ReLU, C4, P2, ReLU, F, FC1, ReLU, FC2>;
//! Four stages (K = 4): a convolution each, the classifier with the last. The 28x28 convolutions
//! cost far more than their multiply-adds say (ReLU and pooling scale with the activations):
//! `xpipe-plan profile --model vgg` measured 3.4, 16.1, 8.1 and 16.7 ms per mini-batch (batch
//! 128, M = 4; 2-core AMD EPYC, 2026-12-07), the slowest 1.51x the mean, the best any cut of the
//! four convolutions allows.
using A = Stage<C1, ReLU>;
using B = Stage<C2, P1, ReLU>;
using C = Stage<C3, ReLU>;
using D = Stage<C4, P2, ReLU, F, FC1, ReLU, FC2>;

//! The network cut at every convolution: the pieces each split above is made of, in order, as
//! xpipe-plan profile times them one by one (the pieces of a split, concatenated, are its stage).
namespace pieces {
using Conv1 = Stage<C1, ReLU>;
using Conv2 = Stage<C2, P1, ReLU>;
using Conv3 = Stage<C3, ReLU>;
using Conv4 = Stage<C4, P2, ReLU>;
using Classifier = Stage<F, FC1, ReLU, FC2>;
}  // namespace pieces

}  // namespace xpipe::models::vgg
