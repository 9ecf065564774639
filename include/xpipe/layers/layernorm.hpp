// LayerNorm<Width, Options>: normalisation of each row over its Width features, PyTorch's
// nn.LayerNorm(Width), as Transformer blocks use it. The math is kernels/layernorm.hpp's.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>

#include "xpipe/backend/backend.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/kernels/layernorm.hpp"
#include "xpipe/layers/batchnorm.hpp"  // NormOptions
#include "xpipe/layers/layer.hpp"
#include "xpipe/layers/loss.hpp"  // detail::reads_host_memory, detail::first_non_finite_column

namespace xpipe {

//! y = gamma (x - mean) / sqrt(var + eps) + beta per row, with the row's own mean and biased
//! variance over its Width features: PyTorch's nn.LayerNorm(Width, eps). Parameters: gamma
//! (Width, initially 1) then beta (Width, 0). Rows are normalised apart, so training and
//! evaluation agree and there is no running state (Options.momentum is not used). It keeps each
//! row's mean and 1/std per activation slot (its Saved) for the backward, whole or split
//! (backward_input: dx; backward_weight later: dgamma and dbeta from x, dy and those). On the host,
//! statistics that are not finite are a NumericError naming the layer, the row and the first
//! column holding NaN or an infinity.
//! Usage: `Stage<Linear<64, 128>, LayerNorm<128>, GELU, Linear<128, 64>>`.
template <int Width, NormOptions Options = NormOptions{}>
struct LayerNorm {
  static_assert(Width > 0, "xpipe: LayerNorm<Width>: Width must be positive");
  static_assert(Options.eps > 0.f, "xpipe: LayerNorm: eps must be positive");
  static constexpr int in_width = Width;
  static constexpr int out_width = Width;
  static constexpr index_t param_count = 2 * static_cast<index_t>(Width);

  //! Per activation slot of up to max_rows rows, on backend B: each row's mean and 1/std
  //! (`stats`, 2 a row) and the backward's row sums (`sums`, 2 a row).
  //! Usage: `LayerNorm<8>::Saved<Host> saved(rows);`
  template <class B>
  struct Saved {
    explicit Saved(index_t rows) : max_rows(rows), stats(2 * rows), sums(2 * rows) {}
    index_t max_rows;
    typename B::template Buffer<float> stats, sums;
  };

  //! Floats a slot of `rows` rows keeps beyond its output (Stage::activation_floats).
  static constexpr index_t saved_floats(index_t rows) { return 4 * rows; }

  //! gamma = 1, beta = 0 (PyTorch's init).
  //! Usage: `LayerNorm<8>::init(params, seed);`
  static void init(std::span<float> params, std::uint64_t /*seed*/) {
    std::fill(params.begin(), params.begin() + Width, 1.f);
    std::fill(params.begin() + Width, params.end(), 0.f);
  }

  //! "LayerNorm<8>": how errors name the layer.
  static std::string name() { return "LayerNorm<" + std::to_string(Width) + ">"; }

  //! y = gamma xhat + beta, each row with its own statistics (kept in saved for the backward).
  //! Usage: `LayerNorm<8>::forward(ctx, params, x, y, saved);`
  template <class Ctx, class Sv>
  static void forward(const Ctx& ctx, const float* params, ConstMatrix x, Matrix y, Sv& saved) {
    check_views(x, y, saved, "forward");
    layer_norm_statistics(ctx, x, Options.eps, saved.stats.data());
    if constexpr (detail::reads_host_memory<Ctx>) check_finite(x, saved.stats.data());
    layer_norm_forward(ctx, x, y, params, params + Width, saved.stats.data());
  }

  //! dgamma (+)= sum over rows of dy xhat, dbeta (+)= sum over rows of dy, and dx through the
  //! row statistics (skipped when dx is empty). Follows the forward of the same slot.
  //! Usage: `LayerNorm<8>::backward(ctx, params, grads, false, x, y, dy, dx, saved);`
  template <class Ctx, class Sv>
  static void backward(const Ctx& ctx, const float* params, float* grads, bool accumulate,
                       ConstMatrix x, ConstMatrix /*y*/, ConstMatrix dy, Matrix dx, Sv& saved) {
    check_views(x, dy, saved, "backward");
    if (!dx.empty()) check_views(dx, dy, saved, "backward");
    layer_norm_backward(ctx, x, dy, dx, params, saved.stats.data(), saved.sums.data(), grads,
                        grads + Width, accumulate);
  }

  //! The input part of the split backward (zero-bubble schedules): dx through the row statistics
  //! (nothing when dx is empty; it needs gamma, not dgamma). No parameter gradient; dy is left
  //! as it is. Usage: `LayerNorm<8>::backward_input(ctx, params, x, y, dy, dx, saved);`
  template <class Ctx, class Sv>
  static void backward_input(const Ctx& ctx, const float* params, ConstMatrix x, ConstMatrix /*y*/,
                             Matrix dy, Matrix dx, Sv& saved) {
    check_views(x, dy, saved, "backward_input");
    if (dx.empty()) return;
    check_views(dx, dy, saved, "backward_input");
    layer_norm_backward_input(ctx, x, dy, dx, params, saved.stats.data(), saved.sums.data());
  }

  //! The weight part: dgamma (+)= sum over rows of dy xhat, dbeta (+)= sum over rows of dy, from
  //! x, dy and the slot's row statistics; with backward_input, the bits of backward.
  //! Usage: `LayerNorm<8>::backward_weight(ctx, grads, false, x, y, dy, saved);`
  template <class Ctx, class Sv>
  static void backward_weight(const Ctx& ctx, float* grads, bool accumulate, ConstMatrix x,
                              ConstMatrix /*y*/, ConstMatrix dy, Sv& saved) {
    check_views(x, dy, saved, "backward_weight");
    layer_norm_param_grads(ctx, x, dy, saved.stats.data(), grads, grads + Width, accumulate);
  }

 private:
  // The loops take their sizes from the views, and the statistics live in the slot: a view of
  // other than Width columns, two views of different rows, or more rows than the slot holds is
  // a ShapeError naming the layer and the call, not a read past a row or past the slot. Called
  // every forward and backward: it builds no string unless it throws.
  template <class Sv>
  static void check_views(ConstMatrix in_side, ConstMatrix out_side, const Sv& saved,
                          const char* where) {
    if (in_side.cols == Width && out_side.cols == Width && in_side.rows == out_side.rows &&
        in_side.rows <= saved.max_rows)
      return;
    auto extent = [](ConstMatrix m) {
      return std::to_string(m.rows) + "x" + std::to_string(m.cols);
    };
    throw ShapeError("xpipe: " + name() + "::" + where + ": got views of " + extent(in_side) +
                     " (input side) and " + extent(out_side) + " (output side), expected " +
                     std::to_string(Width) + " columns and as many rows, at most " +
                     std::to_string(saved.max_rows) + " (the slot's capacity)");
  }

  // Statistics that are not finite come from a row holding NaN or an infinity (finite floats
  // cannot overflow the double sums): name the row and its first such column.
  static void check_finite(ConstMatrix x, const float* stats) {
    for (index_t r = 0; r < x.rows; ++r) {
      if (std::isfinite(stats[2 * r]) && std::isfinite(stats[2 * r + 1])) continue;
      const index_t c = detail::first_non_finite_column(x, r);
      throw NumericError(
          "xpipe: " + name() + ": the statistics of row " + std::to_string(r) +
          " of the micro-batch are not finite (mean " + std::to_string(stats[2 * r]) + ")" +
          (c >= 0 ? "; column " + std::to_string(c) + " holds " + std::to_string(x(r, c))
                  : "; its inputs are finite"));
    }
  }
};

static_assert(Layer<LayerNorm<8>>);

}  // namespace xpipe
