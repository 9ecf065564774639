// A GPT-style decoder-only language model over bytes (data/text.hpp): a token and position
// embedding, 8 pre-norm Transformer blocks (LayerNorm, causal multi-head self-attention, residual;
// LayerNorm, a 4x-wide GELU MLP, residual), a final LayerNorm and a linear head over the 256 byte
// values; whole and split over 2, 4 and 8 stages, a block per stage at K = 8. One activation row
// per token: a sequence of Context tokens is Context consecutive rows, which every micro-batch
// keeps together (CausalSelfAttention's row_group). Its width, heads and context are template
// arguments: `Gpt<64, 4, 128>` is the size xpipe-train trains on a 2-core machine in minutes,
// `Gpt<128, 4, 256>` the size for a GPU.
#pragma once

#include "xpipe/layers/activation.hpp"
#include "xpipe/layers/attention.hpp"
#include "xpipe/layers/embedding.hpp"
#include "xpipe/layers/layernorm.hpp"
#include "xpipe/layers/linear.hpp"
#include "xpipe/layers/residual.hpp"
#include "xpipe/layers/stage.hpp"

namespace xpipe::models::gpt {

//! Byte-level tokens: the vocabulary is every byte value.
inline constexpr int vocab = 256;

//! x + Attention(LayerNorm(x)): the heads' q, k and v from one Linear<D, 3D>, their outputs
//! mixed by a Linear<D, D>.
template <int D, int Heads, int Context>
using AttentionPart =
    Residual<LayerNorm<D>, Linear<D, 3 * D>, CausalSelfAttention<D, Heads, Context>, Linear<D, D>>;
//! x + MLP(LayerNorm(x)), the MLP 4D wide with GELU.
template <int D>
using MlpPart = Residual<LayerNorm<D>, Linear<D, 4 * D>, GELU, Linear<4 * D, D>>;
//! A pre-norm Transformer block (GPT-2's): the attention part, then the MLP part, as one layer.
//! Usage: `Stage<Embedding<256, 128, 64>, Block<64, 4, 128>, Block<64, 4, 128>>`.
template <int D, int Heads, int Context>
using Block = Chain<AttentionPart<D, Heads, Context>, MlpPart<D>>;

//! The model of width D, Heads heads and Context tokens, whole (K1) and split. The blocks cost
//! the same; the embedding (a table lookup) and the head (LayerNorm and a Linear<D, 256>, about a
//! 2/7 of a block's multiply-adds at D = 64, T = 128) ride with the first and last block.
template <int D, int Heads, int Context>
struct Gpt {
  using Embed = Embedding<vocab, Context, D>;
  using Blk = Block<D, Heads, Context>;
  using Norm = LayerNorm<D>;
  using Head = Linear<D, vocab>;

  //! One stage: token ids and positions -> logits over the next byte.
  using K1 = Stage<Embed, Blk, Blk, Blk, Blk, Blk, Blk, Blk, Blk, Norm, Head>;
  //! Two stages of four blocks.
  using K2a = Stage<Embed, Blk, Blk, Blk, Blk>;
  using K2b = Stage<Blk, Blk, Blk, Blk, Norm, Head>;
  //! Four stages of two blocks, in order A, B, B, C.
  using A = Stage<Embed, Blk, Blk>;
  using B = Stage<Blk, Blk>;
  using C = Stage<Blk, Blk, Norm, Head>;
  //! Eight stages of one block, in order E0, E1 x 6, E2.
  using E0 = Stage<Embed, Blk>;
  using E1 = Stage<Blk>;
  using E2 = Stage<Blk, Norm, Head>;
};

}  // namespace xpipe::models::gpt
