// A ResNet-20-style network for 28x28 single-channel images (Fashion-MNIST): a 3x3 stem, three
// groups of three basic blocks (16, 32 and 64 channels at 28x28, 14x14 and 7x7; the first block
// of the second and third groups strided, with a projected shortcut), global average pooling and
// a linear classifier; whole and split over 2, 4 and 8 stages, as xpipe-train trains it
// (--model resnet). Block multiply-adds per image, forward: stem 0.11 M, basic 3.6 M, strided 2.8
// M.
#pragma once

#include "xpipe/core/shape.hpp"
#include "xpipe/layers/activation.hpp"
#include "xpipe/layers/batchnorm.hpp"
#include "xpipe/layers/conv.hpp"
#include "xpipe/layers/linear.hpp"
#include "xpipe/layers/pool.hpp"
#include "xpipe/layers/residual.hpp"
#include "xpipe/layers/stage.hpp"

namespace xpipe::models::resnet {

//! 3x3 convolutions without bias (BatchNorm's beta is the bias), size-keeping or halving.
inline constexpr ConvOptions keep{.stride = 1, .padding = 1, .bias = false};
inline constexpr ConvOptions halve{.stride = 2, .padding = 1, .bias = false};

template <int C, int S>
using Image = Shape<C, S, S>;
template <int C, int S>
using Conv3 = Conv2d<Image<C, S>, C, 3, keep>;
template <int C, int S>
using BN = BatchNorm2d<Image<C, S>>;

//! A basic block on C channels of S x S: conv-BN-ReLU-conv-BN plus the input (ReLU follows).
template <int C, int S>
using Basic = Residual<Conv3<C, S>, BN<C, S>, ReLU, Conv3<C, S>, BN<C, S>>;
//! The first block of the next group: C -> 2C channels, S -> S/2, the shortcut a strided 1x1
//! convolution and its BatchNorm.
template <int C, int S>
using Strided = ProjectedResidual<
    Stage<Conv2d<Image<C, S>, 2 * C, 1, ConvOptions{.stride = 2, .bias = false}>, BN<2 * C, S / 2>>,
    Conv2d<Image<C, S>, 2 * C, 3, halve>, BN<2 * C, S / 2>, ReLU, Conv3<2 * C, S / 2>,
    BN<2 * C, S / 2>>;

// The stem, the blocks (each with its ReLU) and the head, in the order of the network.
using Stem = Stage<Conv2d<Image<1, 28>, 16, 3, keep>, BN<16, 28>, ReLU>;
using B16 = Basic<16, 28>;
using D32 = Strided<16, 28>;
using B32 = Basic<32, 14>;
using D64 = Strided<32, 14>;
using B64 = Basic<64, 7>;
using Head = Stage<GlobalAvgPool<Image<64, 7>>, Linear<64, 10>>;

//! One stage (K = 1): 1x28x28 -> 10 logits; 0.27 M parameters, 31 M multiply-adds per image.
using K1 = Stage<Conv2d<Image<1, 28>, 16, 3, keep>, BN<16, 28>, ReLU, B16, ReLU, B16, ReLU, B16,
                 ReLU, D32, ReLU, B32, ReLU, B32, ReLU, D64, ReLU, B64, ReLU, B64, ReLU,
                 GlobalAvgPool<Image<64, 7>>, Linear<64, 10>>;
//! Two stages (K = 2): 14 M and 17 M multiply-adds.
using K2a = Stage<Conv2d<Image<1, 28>, 16, 3, keep>, BN<16, 28>, ReLU, B16, ReLU, B16, ReLU, B16,
                  ReLU, D32, ReLU>;
using K2b = Stage<B32, ReLU, B32, ReLU, D64, ReLU, B64, ReLU, B64, ReLU,
                  GlobalAvgPool<Image<64, 7>>, Linear<64, 10>>;
//! Four stages (K = 4): 7.3 M, 10 M, 6.4 M and 7.2 M multiply-adds.
using A = Stage<Conv2d<Image<1, 28>, 16, 3, keep>, BN<16, 28>, ReLU, B16, ReLU, B16, ReLU>;
using B = Stage<B16, ReLU, D32, ReLU, B32, ReLU>;
using C = Stage<B32, ReLU, D64, ReLU>;
using D = Stage<B64, ReLU, B64, ReLU, GlobalAvgPool<Image<64, 7>>, Linear<64, 10>>;
//! Eight stages (K = 8), in order E0, E1, E1, E2, E3, E4, E5, E6: a block each, the stem with
//! the first and the head with the last
//! (3.7 M, 3.6 M, 3.6 M, 2.8 M, 3.6 M, 6.4 M, 3.6 M and 3.6 M multiply-adds).
using E0 = Stage<Conv2d<Image<1, 28>, 16, 3, keep>, BN<16, 28>, ReLU, B16, ReLU>;
using E1 = Stage<B16, ReLU>;
using E2 = Stage<D32, ReLU>;
using E3 = Stage<B32, ReLU>;
using E4 = Stage<B32, ReLU, D64, ReLU>;
using E5 = Stage<B64, ReLU>;
using E6 = Stage<B64, ReLU, GlobalAvgPool<Image<64, 7>>, Linear<64, 10>>;

}  // namespace xpipe::models::resnet
