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

//! One stage (K = 1): sequential training. 1x28x28 -> 10 logits; 0.22 M parameters and 4.8 M
//! multiply-adds per image forward, 3.6 M of them in C2 and C4.
using K1 = Stage<C1, ReLU, C2, ReLU, P1, C3, ReLU, C4, ReLU, P2, F, FC1, ReLU, FC2>;
//! Two stages (K = 2): the first block, then the second and the classifier (1.9 M and 2.9 M
//! multiply-adds).
using K2a = Stage<C1, ReLU, C2, ReLU, P1>;
using K2b = Stage<C3, ReLU, C4, ReLU, P2, F, FC1, ReLU, FC2>;
//! Four stages (K = 4): a stage per convolution pair or single, the classifier last
//! (1.9 M, 0.9 M, 1.8 M and 0.2 M multiply-adds: the balance four convolutions allow).
using A = Stage<C1, ReLU, C2, ReLU, P1>;
using B = Stage<C3, ReLU>;
using C = Stage<C4, ReLU, P2>;
using D = Stage<F, FC1, ReLU, FC2>;

}  // namespace xpipe::models::vgg
