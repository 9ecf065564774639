// CausalSelfAttention<Dim, Heads, Context>: GPT's masked multi-head attention over rows that are
// tokens, Context consecutive rows one sequence. The math is kernels/attention.hpp's.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#include "xpipe/backend/backend.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/kernels/attention.hpp"
#include "xpipe/layers/layer.hpp"
#include "xpipe/layers/loss.hpp"  // detail::reads_host_memory, detail::non_finite_name

namespace xpipe {

//! Causal multi-head self-attention without parameters: PyTorch's
//! scaled_dot_product_attention(q, k, v, is_causal=True) per head. A row is one token; a
//! micro-batch holds whole sequences of Context tokens (rows [s Context, (s + 1) Context) are
//! sequence s), so its rows are a multiple of Context (row_group; otherwise a ConfigError). An
//! input row is the token's q | k | v, Dim each (as Linear<Dim, 3 Dim> gives them), head h in
//! columns [h dh, (h + 1) dh) of each part, dh = Dim / Heads; the output row is the heads'
//! outputs side by side. Per sequence and head: S = Q K^T / sqrt(dh), token t attends to tokens
//! 0..t of its own sequence, P = softmax(S) row-wise, O = P V. It keeps P per activation slot
//! (its Saved) for the backward; the backward's dP and dS live in its Workspace, one per stage.
//! On the host, scores that are
//! not finite are a NumericError naming the layer, the row and the head. On a device backend the
//! products are its GEMMs per (sequence, head) and the softmax one element loop over the rows
//! (the host's row math), or, on CUDA with kernels/cuda/attention.cuh included, fused kernels
//! that never store the scores (one block per sequence and head, the host's row math per token);
//! scores that are not finite go unchecked there until the loss shows them, after the run.
//! Usage: `Stage<Linear<64, 192>, CausalSelfAttention<64, 4, 16>, Linear<64, 64>>`.
template <int Dim, int Heads, int Context>
struct CausalSelfAttention {
  static_assert(Dim > 0 && Heads > 0 && Context > 0,
                "xpipe: CausalSelfAttention<Dim, Heads, Context>: all three must be positive");
  static_assert(Dim % Heads == 0,
                "xpipe: CausalSelfAttention<Dim, Heads, Context>: Heads must divide Dim");
  static constexpr int head_width = Dim / Heads;
  static constexpr int in_width = 3 * Dim;
  static constexpr int out_width = Dim;
  static constexpr index_t param_count = 0;

 private:
  using head_width_c = std::integral_constant<int, head_width>;
  // Whether a device backend offers fused kernels for these heads (kernels/cuda/attention.cuh on
  // CUDA, found by argument-dependent lookup): they never store the scores; otherwise a device
  // takes the GEMM-and-softmax path.
  template <class Ctx>
  static constexpr bool fused_on =
      !detail::reads_host_memory<Ctx> && Context <= 1024 && head_width <= 64 &&
      requires(const Ctx& ctx, AttentionShape a, ConstMatrix x, Matrix y, float* lse) {
    fused_attention_forward(ctx, head_width_c{}, a, x, y, lse);
  };

 public:
  //! A micro-batch's rows come in whole sequences.
  static constexpr index_t row_group = Context;
  //! Multiply-adds of the forward per row, counting only what causality needs: token t's row of
  //! Q K^T and of P V each take (t + 1) dh per head, (Context + 1) / 2 on average over a
  //! sequence, so 2 Dim (Context + 1) / 2 for both products and all heads. (The host's GEMMs
  //! compute the whole Context x Context squares, twice that; the backward does twice the
  //! forward.)
  static constexpr double macs = static_cast<double>(Dim) * (Context + 1);

  //! One per stage, for calls of up to max_rows rows on backend B: room for the backward's dP
  //! and dS (grads(), Heads x Context a row; nothing where B takes the fused kernels), on the
  //! stage's arena where given one, which the stage's other attention layers use too.
  //! Usage: `CausalSelfAttention<8, 2, 4>::Workspace<Host> ws(rows, arena.data());`
  template <class B>
  struct Workspace {
    //! On `arena` (arena_floats<B>(max_rows) floats), or its own room where it is null.
    explicit Workspace(index_t max_rows, float* arena = nullptr)
        : room(arena, arena_floats<B>(max_rows)) {}
    float* grads() const { return room.data(); }
    ArenaOr<B> room;
  };

  //! Per activation slot of up to max_rows rows, on backend B: the probabilities P (`probs`,
  //! Heads x Context a row, the future's entries 0), or where B takes the fused kernels only
  //! each (row, head)'s log-sum-exp (`probs`, Heads a row); and the way to the stage's
  //! workspace (its own when made from rows alone).
  //! Usage: `CausalSelfAttention<8, 2, 4>::Saved<Host> saved(rows);`
  template <class B>
  struct Saved {
    explicit Saved(index_t rows) : max_rows(rows), probs(probs_floats(rows)), workspace(rows) {}
    Saved(index_t rows, Workspace<B>& shared)
        : max_rows(rows), probs(probs_floats(rows)), workspace(shared) {}
    index_t max_rows;
    typename B::template Buffer<float> probs;
    WorkspaceRef<Workspace<B>> workspace;

   private:
    static constexpr index_t probs_floats(index_t rows) {
      return rows * Heads * (fused_on<typename B::Context> ? 1 : Context);
    }
  };

  //! Whether backend B runs the fused kernels (CUDA with kernels/cuda/attention.cuh included).
  //! Usage: `static_assert(CausalSelfAttention<64, 4, 128>::fused_kernels_on<Cuda>);`
  template <class B>
  static constexpr bool fused_kernels_on = fused_on<typename B::Context>;

  //! Floats a slot of `rows` rows keeps beyond its output (Stage::activation_floats), on the
  //! host and the GEMM-and-softmax path (the fused kernels keep Heads a row).
  static constexpr index_t saved_floats(index_t rows) {
    return rows * static_cast<index_t>(Heads) * Context;
  }
  //! Floats a backward takes from the stage's arena for up to `rows` rows on backend B
  //! (Stage::arena_floats): dP and dS, none with the fused kernels.
  template <class B>
  static constexpr index_t arena_floats(index_t rows) {
    return fused_kernels_on<B> ? 0 : rows * static_cast<index_t>(Heads) * Context;
  }

  //! Nothing to initialise.
  static void init(std::span<float> /*params*/, std::uint64_t /*seed*/) {}

  //! "CausalSelfAttention<8, 2, 4>": how errors name the layer.
  static std::string name() {
    return "CausalSelfAttention<" + std::to_string(Dim) + ", " + std::to_string(Heads) + ", " +
           std::to_string(Context) + ">";
  }

  //! y = each head's softmax(Q K^T / sqrt(dh), causal) V, side by side; P kept in saved.
  //! Usage: `CausalSelfAttention<8, 2, 4>::forward(ctx, nullptr, x, y, saved);`
  template <class Ctx, class Sv>
  static void forward(const Ctx& ctx, const float* /*params*/, ConstMatrix x, Matrix y, Sv& saved) {
    check_views(x, y, saved, "forward");
    const AttentionShape a = shape(x.rows);
    if constexpr (detail::reads_host_memory<Ctx>) {
      causal_attention_forward(ctx, a, x, y, saved.probs.data());
      if (const index_t bad = first_non_finite_scores(a, saved.probs.data()); bad >= 0)
        throw_non_finite(x, bad / Heads, bad % Heads);
    } else if constexpr (fused_on<Ctx>) {
      // Each (row, head)'s log-sum-exp in the first rows x Heads floats of the slot's `probs`.
      fused_attention_forward(ctx, head_width_c{}, a, x, y, saved.probs.data());
    } else {
      causal_attention_forward(ctx, a, x, y, saved.probs.data());
    }
  }

  //! dx = the gradient through P V, the softmax and Q K^T (nothing when dx is empty: there are
  //! no parameters, so nothing else to do). Follows the forward of the same slot.
  //! Usage: `CausalSelfAttention<8, 2, 4>::backward(ctx, nullptr, nullptr, false, x, y, dy, dx,
  //! saved);`
  template <class Ctx, class Sv>
  static void backward(const Ctx& ctx, const float* /*params*/, float* /*grads*/,
                       bool /*accumulate*/, ConstMatrix x, ConstMatrix y, ConstMatrix dy, Matrix dx,
                       Sv& saved) {
    check_views(x, dy, saved, "backward");
    if (dx.empty()) return;
    check_views(dx, dy, saved, "backward");
    if constexpr (fused_on<Ctx>)
      fused_attention_backward(ctx, head_width_c{}, shape(x.rows), x, y, dy, dx,
                               saved.probs.data());
    else
      causal_attention_backward(ctx, shape(x.rows), x, dy, dx, saved.probs.data(),
                                saved.workspace->grads());
  }

 private:
  static constexpr AttentionShape shape(index_t rows) {
    return AttentionShape{rows, Heads, head_width, Context};
  }

  // The GEMMs take their strides from the views and P lives in the slot: an input side of other
  // than 3 Dim columns, an output side of other than Dim, two views of different rows or more
  // rows than the slot holds is a ShapeError; rows that are not whole sequences a ConfigError.
  // Both name the layer and the call, before any math. Builds no string unless it throws.
  template <class Sv>
  static void check_views(ConstMatrix in_side, ConstMatrix out_side, const Sv& saved,
                          const char* where) {
    if (in_side.cols != in_width || out_side.cols != out_width || in_side.rows != out_side.rows ||
        in_side.rows > saved.max_rows) {
      auto extent = [](ConstMatrix m) {
        return std::to_string(m.rows) + "x" + std::to_string(m.cols);
      };
      throw ShapeError("xpipe: " + name() + "::" + where + ": got views of " + extent(in_side) +
                       " (input side) and " + extent(out_side) + " (output side), expected " +
                       std::to_string(in_width) + " and " + std::to_string(out_width) +
                       " columns and as many rows, at most " + std::to_string(saved.max_rows) +
                       " (the slot's capacity)");
    }
    if (in_side.rows % Context != 0)
      throw ConfigError("xpipe: " + name() + "::" + where + ": " + std::to_string(in_side.rows) +
                        " rows are not whole sequences of Context " + std::to_string(Context) +
                        " tokens (a micro-batch's rows must be a multiple of " +
                        std::to_string(Context) + ")");
  }

  // Row r's scores for head h were not finite: they come from head h's columns of row r's q and
  // of the k of rows first..r of its sequence. Names the last of those rows holding NaN or an
  // infinity there, and its first such column; or else says the products overflowed.
  [[noreturn]] static void throw_non_finite(ConstMatrix x, index_t r, index_t h) {
    const std::string what = "xpipe: " + name() + ": the attention scores of row " +
                             std::to_string(r) + " (head " + std::to_string(h) +
                             ") of the micro-batch are not finite";
    for (index_t row = r; row >= r / Context * Context; --row)
      for (index_t part = row == r ? 0 : 1; part < 2; ++part)
        for (index_t c = part * Dim + h * head_width; c < part * Dim + (h + 1) * head_width; ++c)
          if (!std::isfinite(x(row, c)))
            throw NumericError(what + "; input row " + std::to_string(row) + ", column " +
                               std::to_string(c) + (part == 0 ? " (q)" : " (k)") + " holds " +
                               detail::non_finite_name(x(row, c)));
    throw NumericError(what + "; its q and k are finite, so q.k overflowed");
  }
};

static_assert(Layer<CausalSelfAttention<8, 2, 4>> && splits_backward<CausalSelfAttention<8, 2, 4>>);

}  // namespace xpipe
