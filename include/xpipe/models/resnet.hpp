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
//! BatchNorm and the ReLU after it as one layer: one pass each way where the pair made two, the
//! same bits and the same initial weights as `BN<C, S>, ReLU`.
template <int C, int S>
using BNReLU = BatchNormAct<Image<C, S>, ReLU>;

//! A basic block on C channels of S x S: conv-BN-ReLU-conv-BN plus the input, then ReLU, fused
//! into the sum (the bits and initial weights of `Residual<...>, ReLU`).
template <int C, int S>
using Basic = ResidualAct<ReLU, Conv3<C, S>, BNReLU<C, S>, Conv3<C, S>, BN<C, S>>;
//! The strided block's two convolutions on C channels of S x S, to 2C of S/2: the shortcut's 1x1
//! projection and the main path's first 3x3.
template <int C, int S>
using Projection = Conv2d<Image<C, S>, 2 * C, 1, ConvOptions{.stride = 2, .bias = false}>;
template <int C, int S>
using Halve = Conv2d<Image<C, S>, 2 * C, 3, halve>;
//! The first block of the next group: C -> 2C channels, S -> S/2, the shortcut a strided 1x1
//! convolution and its BatchNorm; the ReLU after the sum fused, as in Basic.
template <int C, int S>
using Strided = ProjectedResidualAct<ReLU, Stage<Projection<C, S>, BN<2 * C, S / 2>>, Halve<C, S>,
                                     BNReLU<2 * C, S / 2>, Conv3<2 * C, S / 2>, BN<2 * C, S / 2>>;

//! The network's first convolution, 1 -> 16 channels.
using StemConv = Conv2d<Image<1, 28>, 16, 3, keep>;

// The stem, the blocks (each ending in its ReLU) and the head, in the order of the network.
using Stem = Stage<StemConv, BNReLU<16, 28>>;
using B16 = Basic<16, 28>;
using D32 = Strided<16, 28>;
using B32 = Basic<32, 14>;
using D64 = Strided<32, 14>;
using B64 = Basic<64, 7>;
using Head = Stage<GlobalAvgPool<Image<64, 7>>, Linear<64, 10>>;

//! One stage (K = 1): 1x28x28 -> 10 logits; 0.27 M parameters, 31 M multiply-adds per image.
using K1 = Stage<StemConv, BNReLU<16, 28>, B16, B16, B16, D32, B32, B32, D64, B64, B64,
                 GlobalAvgPool<Image<64, 7>>, Linear<64, 10>>;

// The splits below cut the network at the block boundaries that balance the measured busy time
// per stage (`xpipe-plan profile --model resnet`: batch 128, M = 4, thread CPU time on a 2-core
// AMD EPYC; docs/results.md): a 16-channel block at 28x28 costs 1.8x a 64-channel one at 7x7
// for the same multiply-adds (BatchNorm, ReLU and the sums scale with the activations, and
// Winograd's kernels gain most on the 64-channel layers). Slowest stage over the mean: 1.06
// (K = 2), 1.14 (K = 4), 1.32 (K = 8); no other cut at the block boundaries does better.

//! Two stages (K = 2): the stem, the 16-channel blocks and the first strided block, then the
//! rest.
using K2a = Stage<StemConv, BNReLU<16, 28>, B16, B16, B16, D32>;
using K2b = Stage<B32, B32, D64, B64, B64, GlobalAvgPool<Image<64, 7>>, Linear<64, 10>>;
//! Four stages (K = 4).
using A = Stage<StemConv, BNReLU<16, 28>, B16, B16>;
using B = Stage<B16, D32>;
using C = Stage<B32, B32>;
using D = Stage<D64, B64, B64, GlobalAvgPool<Image<64, 7>>, Linear<64, 10>>;
//! Eight stages (K = 8), in order E0, E1, E1, E2, E3, E3, E4, E5: a block each, the stem with
//! the first block, the second strided block with the first 7x7 block, the head with the last.
using E0 = Stage<StemConv, BNReLU<16, 28>, B16>;
using E1 = Stage<B16>;
using E2 = Stage<D32>;
using E3 = Stage<B32>;
using E4 = Stage<D64, B64>;
using E5 = Stage<B64, GlobalAvgPool<Image<64, 7>>, Linear<64, 10>>;

//! The network cut after every block: the pieces each split above is made of, in order Stem,
//! Block16 x 3, Down32, Block32 x 2, Down64, Block64 x 2, Head, as xpipe-plan profile times them
//! one by one (the pieces of a split, concatenated, are its stage).
namespace pieces {
using resnet::Head;
using resnet::Stem;
using Block16 = Stage<B16>;
using Down32 = Stage<D32>;
using Block32 = Stage<B32>;
using Down64 = Stage<D64>;
using Block64 = Stage<B64>;
}  // namespace pieces

}  // namespace xpipe::models::resnet
