// BatchNorm2d<Shape, Options>: batch normalisation per channel of an image, with each
// micro-batch's own statistics in training (as GPipe normalises) and running statistics, the
// layer's non-trainable state, for evaluation; BatchNormAct<Shape, Act, Options>, the same fused
// with the activation after it (ResNet's BatchNorm and ReLU as one pass each way).
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#include "xpipe/backend/backend.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/core/shape.hpp"
#include "xpipe/kernels/batchnorm.hpp"
#include "xpipe/layers/activation.hpp"
#include "xpipe/layers/layer.hpp"
#include "xpipe/layers/loss.hpp"  // detail::reads_host_memory
#include "xpipe/layers/pool.hpp"  // detail::shape_name, detail::check_image_views

namespace xpipe {

//! A normalisation's eps (added to the variance) and the momentum of its running statistics.
struct NormOptions {
  float eps = 1e-5f;
  float momentum = 0.1f;
};

//! y = gamma (x - mean) / sqrt(var + eps) + beta per channel of an S image, PyTorch's
//! BatchNorm2d. Parameters: gamma (C, initially 1) then beta (C, 0). In training the mean and
//! biased variance are the micro-batch's, over its rows and pixels (so a pipeline normalises
//! each micro-batch on its own, as GPipe does), and the running mean and unbiased variance
//! (the layer's state: 2 C floats, initially 0 and 1) move by `momentum` towards them;
//! evaluation normalises with the running ones. The state is not a parameter: optimizers and
//! predictors never see it, whatever weights a forward uses (stashed, predicted), and every
//! forward of a stage updates the one copy in schedule order. It keeps the micro-batch's mean
//! and 1/std per activation slot (its Saved) for the backward, and the backward's channel sums,
//! which carry a split backward's input part (backward_input) to its weight part
//! (backward_weight): those are dgamma and dbeta. On the host, statistics that are
//! not finite are a NumericError naming the layer, the channel and the first row holding NaN or
//! an infinity in it.
//! With Act an activation layer (`BatchNormAct<S, ReLU>`, which is `BatchNorm2d<S, Options,
//! ReLU>`), y = Act(BatchNorm(x)) in one layer: one pass forward where the pair made two, and a
//! backward that takes Act's gradient where each of its two passes reads dy, so the gradient
//! through Act is never written; Act's input z = BatchNorm(x) is made again from x there (which
//! those passes read anyway; y is never read) with the forward's statistics and the forward's
//! gamma and beta, which the slot keeps (2 C floats more), so they read two arrays, not three. The
//! bits of `BatchNorm2d<S>, Act` on the host, from the same seed (it takes both layer numbers),
//! with one activation fewer kept per slot. Act's gradient is taken at its input, so any
//! activation fuses (ReLU, GELU). Usage:
//! `Stage<Conv2d<Shape<1, 28, 28>, 16, 3, same>, BatchNormAct<Shape<16, 28, 28>, GELU>>`.
template <ImageShape S, NormOptions Options = NormOptions{}, class Act = void>
struct BatchNorm2d {
  //! Whether an activation is fused after the normalisation, and its per-element function
  //! (math::Identity where none is).
  static constexpr bool fused = !std::is_void_v<Act>;
  static_assert(!fused || ActivationLayer<Act>,
                "xpipe: BatchNormAct<S, Act>: Act must be an activation layer such as ReLU");
  using function = typename std::conditional_t<fused && ActivationLayer<Act>, Act,
                                               Activation<math::Identity>>::function;
  static_assert(Options.eps > 0.f, "xpipe: BatchNorm2d: eps must be positive");
  static_assert(Options.momentum >= 0.f && Options.momentum <= 1.f,
                "xpipe: BatchNorm2d: momentum must lie in [0, 1]");
  using in_shape = S;
  using out_shape = S;
  static constexpr int channels = S::channels;
  static constexpr int in_width = S::size;
  static constexpr int out_width = S::size;
  static constexpr index_t param_count = 2 * channels;
  static constexpr index_t state_count = 2 * channels;
  //! It can end a residual block's path with the block's sum in its forward pass (forward_sum):
  //! its backward never reads its output.
  static constexpr bool fuses_residual_sum = true;
  //! Fused, it takes the two layer numbers of the `BatchNorm2d<S>, Act` it stands for
  //! (Stage::init), so the layers after it draw the weights they draw in the unfused model.
  static constexpr std::size_t init_streams = fused ? 2 : 1;

  static constexpr NormGeometry geometry(index_t rows) {
    return {rows, channels, S::height * S::width, Options.eps, Options.momentum};
  }
  //! Doubles of the channel reductions' partial sums for up to `rows` rows.
  static constexpr index_t scratch_doubles(index_t rows) {
    return batch_norm_scratch_doubles(geometry(rows));
  }

  //! One per stage, on backend B: the channel reductions' partial sums
  //! (batch_norm_scratch_doubles), which no call leaves behind.
  //! Usage: `BN::Workspace<Host> ws(rows); BN::Saved<Host> slot(rows, ws);`
  template <class B>
  struct Workspace {
    explicit Workspace(index_t max_rows) : scratch(scratch_doubles(max_rows)) {}
    typename B::template Buffer<double> scratch;
  };
  //! Floats of the forward's gamma and beta a fused layer's slot keeps (2 C), 0 unfused.
  static constexpr index_t affine_floats = fused ? 2 * channels : 0;
  //! Per activation slot: the micro-batch's mean and 1/std (2 C), the backward's channel sums
  //! (2 C) and, fused, the gamma and beta its training forward ran with (affine_floats), on
  //! backend B, and the way to the stage's workspace (its own when made from rows alone).
  template <class B>
  struct Saved {
    explicit Saved(index_t max_rows)
        : stats(2 * channels), sums(2 * channels), affine(affine_floats), workspace(max_rows) {}
    Saved(index_t /*max_rows*/, Workspace<B>& shared)
        : stats(2 * channels), sums(2 * channels), affine(affine_floats), workspace(shared) {}
    typename B::template Buffer<float> stats, sums, affine;
    WorkspaceRef<Workspace<B>> workspace;
  };

  static constexpr index_t saved_floats(index_t /*rows*/) { return 4 * channels + affine_floats; }
  template <class B>
  static constexpr index_t workspace_floats(index_t rows) {
    return 2 * scratch_doubles(rows);
  }

  //! gamma = 1, beta = 0.
  static void init(std::span<float> params, std::uint64_t /*seed*/) {
    std::fill(params.begin(), params.begin() + channels, 1.f);
    std::fill(params.begin() + channels, params.end(), 0.f);
  }
  //! Running mean 0, running variance 1.
  static void init_state(std::span<float> state) {
    std::fill(state.begin(), state.begin() + channels, 0.f);
    std::fill(state.begin() + channels, state.end(), 1.f);
  }

  //! "BatchNorm2d<Shape<16, 28, 28>>" or "BatchNormAct<Shape<16, 28, 28>, ReLU>": how errors
  //! name the layer.
  static std::string name() {
    if constexpr (fused)
      return "BatchNormAct<" + detail::shape_name<S>() + ", " + function::name + ">";
    else
      return "BatchNorm2d<" + detail::shape_name<S>() + ">";
  }

  //! y = gamma xhat + beta (through Act where fused), with the micro-batch's statistics
  //! (training; the running ones move, and a fused layer keeps gamma and beta for its backward)
  //! or the running ones (evaluation, which needs run.state).
  template <class Ctx, class Sv>
  static void forward(const Ctx& ctx, const float* params, ConstMatrix x, Matrix y, Sv& saved,
                      Running run) {
    detail::check_image_views<BatchNorm2d>(x, y, "forward");
    statistics(ctx, params, x, saved, run);
    batch_norm_forward<function>(ctx, geometry(x.rows), x, y, params, params + channels,
                                 saved.stats.data());
  }

  //! The forward as the last layer of a residual block's path, the block's sum in the same pass:
  //! y = Post(this layer's output + skip) (skip: the shortcut's output, an image of S per row),
  //! the bits of forward and then add_views<Post>. The layer's own output is never written; its
  //! backward does not read it.
  template <class Post, class Ctx, class Sv>
  static void forward_sum(const Ctx& ctx, const float* params, ConstMatrix x, ConstMatrix skip,
                          Matrix y, Sv& saved, Running run) {
    detail::check_image_views<BatchNorm2d>(x, y, "forward_sum");
    detail::check_image_views<BatchNorm2d>(skip, y, "forward_sum (skip)");
    statistics(ctx, params, x, saved, run);
    batch_norm_forward_sum<function, Post>(ctx, geometry(x.rows), x, skip, y, params,
                                           params + channels, saved.stats.data());
  }

  //! dgamma (+)= sum(dy xhat), dbeta (+)= sum(dy), dx through the batch's statistics (skipped
  //! when dx is empty), dy taken through Act'(z) first where fused (z = BatchNorm(x)). Follows the
  //! training forward of the same slot; y is not read (a fused layer makes it again from x).
  template <class Ctx, class Sv>
  static void backward(const Ctx& ctx, const float* params, float* grads, bool accumulate,
                       ConstMatrix x, ConstMatrix /*y*/, ConstMatrix dy, Matrix dx, Sv& saved) {
    check_backward_views(x, dy, dx, "backward");
    batch_norm_backward<function>(ctx, geometry(x.rows), x, dy, dx, params, saved.stats.data(),
                                  saved.affine.data(), saved.sums.data(), grads, grads + channels,
                                  accumulate, saved.workspace->scratch.data());
  }

  //! The input part of the split backward (zero-bubble schedules): the channel sums of dy and
  //! dy xhat into the slot's `sums` (they are dbeta's and dgamma's), then dx (skipped when
  //! empty). No parameter gradient; dy is left as it is.
  template <class Ctx, class Sv>
  static void backward_input(const Ctx& ctx, const float* params, ConstMatrix x, ConstMatrix /*y*/,
                             Matrix dy, Matrix dx, Sv& saved) {
    check_backward_views(x, dy, dx, "backward_input");
    batch_norm_backward_input<function>(ctx, geometry(x.rows), x, dy, dx, params,
                                        saved.stats.data(), saved.affine.data(), saved.sums.data(),
                                        saved.workspace->scratch.data());
  }

  //! The weight part: dgamma (+)= sum(dy xhat), dbeta (+)= sum(dy), the sums backward_input
  //! left in the slot (x and dy only checked); with it, the bits of backward.
  template <class Ctx, class Sv>
  static void backward_weight(const Ctx& ctx, float* grads, bool accumulate, ConstMatrix x,
                              ConstMatrix /*y*/, ConstMatrix dy, Sv& saved) {
    detail::check_image_views<BatchNorm2d>(x, dy, "backward_weight");
    batch_norm_param_grads(ctx, geometry(x.rows), saved.sums.data(), grads, grads + channels,
                           accumulate);
  }

 private:
  // The statistics a forward normalises with, into the slot: in training the micro-batch's (the
  // running ones move; a fused layer keeps gamma and beta for its backward), else the running
  // ones (which needs run.state).
  template <class Ctx, class Sv>
  static void statistics(const Ctx& ctx, const float* params, ConstMatrix x, Sv& saved,
                         Running run) {
    const NormGeometry g = geometry(x.rows);
    if (run.training) {
      batch_norm_statistics(ctx, g, x, saved.stats.data(), run.state,
                            saved.workspace->scratch.data());
      if constexpr (detail::reads_host_memory<Ctx>) check_finite(x, saved.stats.data());
      if constexpr (fused) copy_buffer(ctx, params, saved.affine.data(), affine_floats);
    } else {
      if (run.state == nullptr)
        throw ConfigError("xpipe: " + name() +
                          "::forward: evaluation needs the running statistics (pass the stage's "
                          "state buffer in Running)");
      batch_norm_running_statistics(ctx, g, run.state, saved.stats.data());
    }
  }

  // x, dy and dx (unless empty) are images of S (y is never read: a fused backward makes it
  // again from x).
  static void check_backward_views(ConstMatrix x, ConstMatrix dy, ConstMatrix dx,
                                   const char* action) {
    detail::check_image_views<BatchNorm2d>(x, dy, action);
    if (!dx.empty()) detail::check_image_views<BatchNorm2d>(dx, dy, action);
  }

  // Statistics that are not finite come from inputs that are not (or from an overflow): name
  // the channel and the first row with a NaN or an infinity in it.
  static void check_finite(ConstMatrix x, const float* stats) {
    for (int c = 0; c < channels; ++c) {
      if (std::isfinite(stats[c]) && std::isfinite(stats[channels + c])) continue;
      const int plane = S::height * S::width;
      index_t bad = -1;
      for (index_t r = 0; r < x.rows && bad < 0; ++r)
        for (int i = 0; i < plane; ++i)
          if (!std::isfinite(x(r, static_cast<index_t>(i) * channels + c))) {
            bad = r;
            break;
          }
      throw NumericError("xpipe: " + name() + ": the statistics of channel " + std::to_string(c) +
                         " are not finite (mean " + std::to_string(stats[c]) + ")" +
                         (bad >= 0 ? "; row " + std::to_string(bad) +
                                         " of the micro-batch holds NaN or an infinity there"
                                   : "; its inputs are finite (an overflow)"));
    }
  }
};

//! y = Act(BatchNorm2d<S, Options>(x)) as one layer: BatchNorm2d<S, Options, Act> under the name
//! a model writes (a type of its own, not an alias: nvcc 13 cannot compile an alias template
//! with a defaulted class-type argument). Usage:
//! `Stage<Conv2d<Shape<1, 28, 28>, 16, 3, same>, BatchNormAct<Shape<16, 28, 28>, ReLU>, ...>`.
template <ImageShape S, class Act, NormOptions Options = NormOptions{}>
struct BatchNormAct : BatchNorm2d<S, Options, Act> {};

static_assert(Layer<BatchNorm2d<Shape<2, 3, 3>>>);
static_assert(Layer<BatchNormAct<Shape<2, 3, 3>, ReLU>>);
static_assert(Layer<BatchNormAct<Shape<2, 3, 3>, GELU>>);

}  // namespace xpipe
