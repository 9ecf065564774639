// Conv2d<In, OutChannels, Kernel, Options>: a 2-D convolution layer over channels-last image rows,
// weights OIHW then biases in the stage's flat buffer; each backend's ConvPlans does the work.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>

#include "xpipe/backend/host_conv.hpp"
#include "xpipe/core/conv_geometry.hpp"
#include "xpipe/core/error.hpp"
#include "xpipe/core/shape.hpp"
#include "xpipe/layers/init.hpp"
#include "xpipe/layers/layer.hpp"

namespace xpipe {

//! A convolution's stride, zero padding (both axes), whether it has a bias, and how the host
//! computes it (ConvAlgorithm: Winograd where oneDNN offers it, or always direct).
//! Usage: `Conv2d<Shape<1, 28, 28>, 32, 3, ConvOptions{.padding = 1}>`,
//! `ConvOptions{.padding = 1, .algorithm = ConvAlgorithm::direct}`.
struct ConvOptions {
  int stride = 1;
  int padding = 0;
  bool bias = true;
  ConvAlgorithm algorithm = ConvAlgorithm::winograd;
};

//! Square-kernel 2-D convolution from In = Shape<C, H, W> to OutChannels x OH x OW, where
//! OH = floor((H + 2 padding - Kernel) / stride) + 1 (likewise OW). Parameters: the weights,
//! OutChannels x C x Kernel x Kernel (OIHW, PyTorch's layout), then OutChannels biases unless
//! Options.bias is false. Initialised He-uniform over fan_in = C Kernel^2 (biases 0, as Linear).
//! Its backend's ConvPlans (on the host oneDNN's primitives and weight reorder buffers, made once
//! per batch size, their scratch in the thread's call buffer; on CUDA the column buffer) are its
//! Workspace<B>, one per stage, which every slot's Saved<B> reaches: nothing in them outlives a
//! call. Needs contiguous rows (Stage's are). Its
//! backward also runs split for zero-bubble schedules: backward_input (dx) now, backward_weight
//! (dW, db) later on the same slot, with the bits of the whole backward.
//! Usage: `Stage<Conv2d<Shape<1, 28, 28>, 32, 3, ConvOptions{.padding = 1}>, ReLU, ...>`.
template <ImageShape In, int OutChannels, int Kernel, ConvOptions Options = ConvOptions{},
          class Init = HeUniform>
struct Conv2d {
  static_assert(OutChannels > 0, "xpipe: Conv2d: OutChannels must be positive");
  static_assert(Kernel > 0, "xpipe: Conv2d: Kernel must be positive");
  static_assert(Options.stride > 0, "xpipe: Conv2d: stride must be positive");
  static_assert(Options.padding >= 0 && Options.padding < Kernel,
                "xpipe: Conv2d: padding must be in [0, Kernel)");
  static_assert(Kernel <= In::height + 2 * Options.padding &&
                    Kernel <= In::width + 2 * Options.padding,
                "xpipe: Conv2d: the kernel is larger than the padded input image");

  using in_shape = In;
  using out_shape =
      Shape<OutChannels, conv_out_extent(In::height, Kernel, Options.stride, Options.padding),
            conv_out_extent(In::width, Kernel, Options.stride, Options.padding)>;
  static constexpr int in_width = In::size;
  static constexpr int out_width = out_shape::size;
  static constexpr index_t weight_count =
      static_cast<index_t>(OutChannels) * In::channels * Kernel * Kernel;
  static constexpr index_t param_count = weight_count + (Options.bias ? OutChannels : 0);
  //! Multiply-adds of the forward per image (the backward does twice as many).
  static constexpr double macs =
      static_cast<double>(out_shape::size) * In::channels * Kernel * Kernel;

  //! The geometry of a call on `rows` images.
  static constexpr ConvGeometry geometry(index_t rows) {
    return make_conv_geometry(rows, In::channels, In::height, In::width, OutChannels, Kernel,
                              Options.stride, Options.padding, Options.bias, Options.algorithm);
  }

  //! One per stage: the backend's plans for calls of up to max_rows images, their column buffer
  //! (CUDA) on the stage's arena where given one.
  //! Usage: `Conv::Workspace<Host> ws(rows); Conv::Saved<Host> slot(rows, ws);`
  template <class B>
  struct Workspace {
    explicit Workspace(index_t max_rows) : plans(geometry(max_rows)) {}
    Workspace(index_t max_rows, float* arena) : plans(geometry(max_rows), arena) {}
    ConvPlans<B> plans;
  };
  //! Floats a call takes from the stage's arena on B: the column buffer and the per-image bias
  //! sums of an im2col backend (CUDA); none on the host, whose oneDNN primitives size their own.
  template <class B>
  static constexpr index_t arena_floats(index_t rows) {
    return ConvPlans<B>::arena_floats(geometry(rows));
  }
  //! What one activation slot keeps: nothing but its way to the stage's plans (its own plans
  //! when made from rows alone).
  template <class B>
  struct Saved {
    explicit Saved(index_t max_rows) : workspace(max_rows) {}
    Saved(index_t /*max_rows*/, Workspace<B>& shared) : workspace(shared) {}
    WorkspaceRef<Workspace<B>> workspace;
  };

  //! Weights from Init over fan_in = C Kernel^2 and fan_out = OutChannels Kernel^2, biases 0.
  static void init(std::span<float> params, std::uint64_t seed) {
    init_uniform<Init>(params.first(weight_count), In::channels * Kernel * Kernel,
                       OutChannels * Kernel * Kernel, seed);
    std::fill(params.begin() + weight_count, params.end(), 0.f);
  }

  //! "Conv2d<1x28x28 -> 32x28x28, kernel 3, stride 1, padding 1>": how errors name the layer.
  static std::string name() {
    const auto dims = [](int c, int h, int w) {
      return std::to_string(c) + "x" + std::to_string(h) + "x" + std::to_string(w);
    };
    return "Conv2d<" + dims(In::channels, In::height, In::width) + " -> " +
           dims(OutChannels, out_shape::height, out_shape::width) + ", kernel " +
           std::to_string(Kernel) + ", stride " + std::to_string(Options.stride) + ", padding " +
           std::to_string(Options.padding) +
           (Options.algorithm == ConvAlgorithm::direct ? ", direct" : "") + ">";
  }

  //! y = conv(x, W) + b.
  template <class Ctx, class S>
  static void forward(const Ctx& ctx, const float* params, ConstMatrix x, Matrix y, S& saved) {
    check(x, y, "forward");
    saved.workspace->plans.forward(ctx, geometry(x.rows), x.data, params, params + weight_count,
                                   y.data);
  }

  //! dW (+)= the weight gradient, db (+)= dy summed per channel, dx = the input gradient
  //! (skipped when dx is empty: the first layer of a model). x is the input of the forward,
  //! unchanged (as Stage keeps it).
  template <class Ctx, class S>
  static void backward(const Ctx& ctx, const float* params, float* grads, bool accumulate,
                       ConstMatrix x, ConstMatrix /*y*/, ConstMatrix dy, Matrix dx, S& saved) {
    check(x, dy, "backward");
    if (!dx.empty()) check(dx, dy, "backward");
    saved.workspace->plans.backward(ctx, geometry(x.rows), x.data, params, dy.data,
                                    dx.empty() ? nullptr : dx.data, grads, grads + weight_count,
                                    accumulate);
  }

  //! The input part of the split backward (zero-bubble schedules): dx = the input gradient
  //! (nothing when dx is empty); no parameter gradient. dy is left as it is, for backward_weight.
  template <class Ctx, class S>
  static void backward_input(const Ctx& ctx, const float* params, ConstMatrix x, ConstMatrix /*y*/,
                             Matrix dy, Matrix dx, S& saved) {
    check(x, dy, "backward_input");
    if (dx.empty()) return;
    check(dx, dy, "backward_input");
    saved.workspace->plans.backward_data(ctx, geometry(x.rows), params, dy.data, dx.data);
  }

  //! The weight part: dW (+)= the weight gradient, db (+)= dy summed per channel, from x and the
  //! dy backward_input saw, on the same slot; with backward_input, the bits of backward.
  template <class Ctx, class S>
  static void backward_weight(const Ctx& ctx, float* grads, bool accumulate, ConstMatrix x,
                              ConstMatrix /*y*/, ConstMatrix dy, S& saved) {
    check(x, dy, "backward_weight");
    saved.workspace->plans.backward_weights(ctx, geometry(x.rows), x.data, dy.data, grads,
                                            grads + weight_count, accumulate);
  }

 private:
  // The convolution reads whole images: views must have the layer's widths, contiguous rows and
  // as many rows on both sides.
  static void check(ConstMatrix in, ConstMatrix out, const char* where) {
    if (in.cols != in_width || out.cols != out_width || in.ld != in.cols || out.ld != out.cols ||
        in.rows != out.rows)
      throw ShapeError("xpipe: " + name() + "::" + where + ": got " + std::to_string(in.rows) +
                       "x" + std::to_string(in.cols) + " input (ld " + std::to_string(in.ld) +
                       ") and " + std::to_string(out.rows) + "x" + std::to_string(out.cols) +
                       " output (ld " + std::to_string(out.ld) + "), expected " +
                       std::to_string(in_width) + " and " + std::to_string(out_width) +
                       " contiguous columns");
  }
};

static_assert(Layer<Conv2d<Shape<1, 8, 8>, 4, 3, ConvOptions{.padding = 1}>>);

}  // namespace xpipe
