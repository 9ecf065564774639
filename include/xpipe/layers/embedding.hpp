// Embedding<Vocab, Context, Dim>: GPT's token and position embeddings, one row per token: a row
// (token id, position) becomes the sum of the two tables' rows.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string>

#include "xpipe/backend/backend.hpp"
#include "xpipe/core/config.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/core/random.hpp"
#include "xpipe/core/tensor.hpp"
#include "xpipe/kernels/embedding.hpp"
#include "xpipe/layers/layer.hpp"
#include "xpipe/layers/loss.hpp"  // detail::reads_host_memory

namespace xpipe {

//! Token plus position embedding, as GPT-2's wte and wpe: an input row is (token id, position in
//! its sequence), floats holding whole numbers in [0, Vocab) and [0, Context); the output row is
//! token_table[id] + position_table[position], Dim wide. Parameters: the token table (Vocab x
//! Dim, row-major) then the position table (Context x Dim), both initially N(0, 0.02). Ids are
//! not differentiable: the input gradient is 0. The tables' gradients are scatter-adds of dy,
//! threaded over columns, each summed in row order (the same bits on any thread count); the
//! backward also runs split (backward_input: dx = 0; backward_weight: the tables). On the host a
//! row whose id or position is not a whole number in range is a DataError naming the layer, the
//! row, the column and the value, before any output is written.
//! Usage: `Stage<Embedding<50257, 1024, 768>, Linear<768, 2304>, ...>`.
template <int Vocab, int Context, int Dim>
struct Embedding {
  static_assert(Vocab > 0 && Context > 0 && Dim > 0,
                "xpipe: Embedding<Vocab, Context, Dim>: all three must be positive");
  static_assert(Vocab <= (1 << 24) && Context <= (1 << 24),
                "xpipe: Embedding: ids and positions travel as floats, exact only up to 2^24");
  static constexpr int in_width = 2;
  static constexpr int out_width = Dim;
  static constexpr index_t token_count = static_cast<index_t>(Vocab) * Dim;
  static constexpr index_t param_count = token_count + static_cast<index_t>(Context) * Dim;
  //! A lookup: no multiply-adds.
  static constexpr double macs = 0;
  //! The spread of both tables at initialisation (GPT-2's).
  static constexpr float init_std = 0.02f;

  //! Both tables from N(0, init_std), the token table's first, from one Rng seeded with seed.
  //! Usage: `Embedding<10, 4, 8>::init(params, seed);`
  static void init(std::span<float> params, std::uint64_t seed) {
    Rng rng{seed};
    for (float& w : params) w = init_std * rng.normal();
  }

  //! "Embedding<50257, 1024, 768>": how errors name the layer.
  static std::string name() {
    return "Embedding<" + std::to_string(Vocab) + ", " + std::to_string(Context) + ", " +
           std::to_string(Dim) + ">";
  }

  //! y = token_table[id] + position_table[position], row by row (ids checked first on the host).
  //! Usage: `Embedding<10, 4, 8>::forward(ctx, params, x, y);`
  template <class Ctx>
  static void forward(const Ctx& ctx, const float* params, ConstMatrix x, Matrix y) {
    check_views(x, y, "forward");
    if constexpr (detail::reads_host_memory<Ctx>) check_ids(x, "forward");
    for_each_element(ctx, y.rows, y.cols,
                     ops::EmbeddingForward{x, y, params, params + token_count, Dim});
  }

  //! The tables' gradients (+)= scatter-adds of dy, and dx = 0 unless dx is empty.
  //! Usage: `Embedding<10, 4, 8>::backward(ctx, params, grads, false, x, y, dy, dx);`
  template <class Ctx>
  static void backward(const Ctx& ctx, const float* params, float* grads, bool accumulate,
                       ConstMatrix x, ConstMatrix y, ConstMatrix dy, Matrix dx) {
    backward_weight(ctx, grads, accumulate, x, y, dy);
    backward_input(ctx, params, x, y, Matrix{}, dx);
  }

  //! The input part of the split backward: dx = 0 (ids are not differentiable), nothing when dx
  //! is empty; dy is left as it is. Usage:
  //! `Embedding<10, 4, 8>::backward_input(ctx, params, x, y, dy, dx);`
  template <class Ctx>
  static void backward_input(const Ctx& ctx, const float* /*params*/, ConstMatrix x,
                             ConstMatrix /*y*/, Matrix /*dy*/, Matrix dx) {
    if (dx.empty()) return;
    if (dx.cols != in_width || dx.rows != x.rows)
      throw ShapeError("xpipe: " + name() + "::backward_input: the input gradient is " +
                       std::to_string(dx.rows) + "x" + std::to_string(dx.cols) + ", expected " +
                       std::to_string(x.rows) + "x" + std::to_string(in_width));
    for_each_element(ctx, dx.rows, dx.cols, ops::EmbeddingInputGradient{dx});
  }

  //! The weight part: the token table's gradient rows (+)= dy of the rows with that id, the
  //! position table's (+)= dy of the rows at that position; accumulate false overwrites both
  //! tables whole. Usage: `Embedding<10, 4, 8>::backward_weight(ctx, grads, false, x, y, dy);`
  template <class Ctx>
  static void backward_weight(const Ctx& ctx, float* grads, bool accumulate, ConstMatrix x,
                              ConstMatrix /*y*/, ConstMatrix dy) {
    check_views(x, dy, "backward_weight");
    // The ids index the gradient rows written: checked again, not trusted to the forward's.
    if constexpr (detail::reads_host_memory<Ctx>) check_ids(x, "backward_weight");
    const index_t blocks = (Dim + grad_block - 1) / grad_block;
    for_each_index(ctx, blocks, (Vocab + Context + x.rows) * static_cast<index_t>(Dim),
                   ops::EmbeddingGradColumns{x, dy, grads, grads + token_count, Vocab, Context, Dim,
                                             grad_block, accumulate});
  }

  //! Every row's id in [0, Vocab) and position in [0, Context), whole numbers, as forward checks
  //! them on the host: a DataError naming `who`, the layer, the row, the column and the value.
  //! For rows in host memory that a device will read unchecked (Stage::check_host_input).
  //! Usage: `Embedding<10, 4, 8>::check_input(x, "xpipe: Pipeline::train");`
  static void check_input(ConstMatrix x, const char* who) {
    for (index_t r = 0; r < x.rows; ++r) {
      check_id(x, r, 0, Vocab, who, nullptr);
      check_id(x, r, 1, Context, who, nullptr);
    }
  }

 private:
  // Columns of the tables' gradients one index of backward_weight owns: 16 floats, a 64-byte
  // cache line, so threads share no line of a table whose Dim is a multiple of 16.
  static constexpr index_t grad_block = 16;

  // The loops take their sizes from the views: an input of other than 2 columns, an output
  // side of other than Dim or two views of different rows is a ShapeError naming the layer and
  // the call. Builds no string unless it throws.
  static void check_views(ConstMatrix in_side, ConstMatrix out_side, const char* where) {
    if (in_side.cols == in_width && out_side.cols == out_width && in_side.rows == out_side.rows)
      return;
    auto extent = [](ConstMatrix m) {
      return std::to_string(m.rows) + "x" + std::to_string(m.cols);
    };
    throw ShapeError("xpipe: " + name() + "::" + where + ": got views of " + extent(in_side) +
                     " (input side) and " + extent(out_side) + " (output side), expected 2 and " +
                     std::to_string(Dim) + " columns and as many rows");
  }

  // Every row's id in [0, Vocab) and position in [0, Context), both whole numbers: a row read
  // outside a table would be memory past the parameters. One pass over host memory, before any
  // output is written; builds no string unless it throws.
  static void check_ids(ConstMatrix x, const char* where) {
    for (index_t r = 0; r < x.rows; ++r) {
      check_id(x, r, 0, Vocab, nullptr, where);
      check_id(x, r, 1, Context, nullptr, where);
    }
  }
  // The message names `who` and the layer, or else the layer's call `where`.
  static void check_id(ConstMatrix x, index_t r, index_t c, int limit, const char* who,
                       const char* where) {
    const float v = x(r, c);
    // NaN fails both tests; an infinity is whole but out of range.
    const bool whole = std::floor(v) == v, in_range = v >= 0.f && v < static_cast<float>(limit);
    if (whole && in_range) return;
    const std::string column = c == 0 ? "column 0 (token id)" : "column 1 (position)";
    const std::string at =
        who ? std::string(who) + ": " + name() : "xpipe: " + name() + "::" + where;
    throw DataError(at + ": row " + std::to_string(r) + ", " + column + ": " +
                    detail::number_text(v) +
                    (whole ? " is outside 0.." + std::to_string(limit - 1)
                           : std::string(" is not a whole number")));
  }
};

static_assert(Layer<Embedding<10, 4, 8>> && splits_backward<Embedding<10, 4, 8>>);

}  // namespace xpipe
