// ConvPlans<Host>: 2-D convolution on the host through oneDNN's convolution primitives (forward,
// backward data, backward weights), made once per batch size and reused: a step makes no
// primitive and no buffer (oneDNN's execute may keep small bookkeeping of its own per call, as
// its sgemm does). oneDNN's C API only: nvcc 13 cannot parse its C++ header in C++20 mode, and
// this header reaches CUDA translation units through xpipe.hpp.
#pragma once

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <array>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "xpipe/backend/host.hpp"
#include "xpipe/core/buffer.hpp"
#include "xpipe/core/conv_geometry.hpp"
#include "xpipe/core/error.hpp"

namespace xpipe {

//! A backend's convolution: forward, backward data and backward weights of a ConvGeometry, with
//! whatever it prepares once (oneDNN primitives on the host, column buffers on CUDA).
template <class B>
class ConvPlans;

namespace detail {

// An owned oneDNN C handle, destroyed with its destroy function.
template <class T, dnnl_status_t (*Destroy)(T)>
class DnnlHandle {
 public:
  DnnlHandle() = default;
  DnnlHandle(const DnnlHandle&) = delete;
  DnnlHandle& operator=(const DnnlHandle&) = delete;
  DnnlHandle(DnnlHandle&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  DnnlHandle& operator=(DnnlHandle&& o) noexcept {
    std::swap(h_, o.h_);
    return *this;
  }
  ~DnnlHandle() {
    if (h_ != nullptr) Destroy(h_);
  }
  T get() const { return h_; }
  //! For a create function's output argument.
  T* out() { return &h_; }

 private:
  T h_ = nullptr;
};
using DnnlPrimitive = DnnlHandle<dnnl_primitive_t, dnnl_primitive_destroy>;
using DnnlPrimitiveDesc = DnnlHandle<dnnl_primitive_desc_t, dnnl_primitive_desc_destroy>;
using DnnlMemory = DnnlHandle<dnnl_memory_t, dnnl_memory_destroy>;
using DnnlStream = DnnlHandle<dnnl_stream_t, dnnl_stream_destroy>;
using DnnlAttr = DnnlHandle<dnnl_primitive_attr_t, dnnl_primitive_attr_destroy>;

// A failed oneDNN call is a BackendError naming the step and the convolution.
inline void dnnl_check(dnnl_status_t s, const char* what, const ConvGeometry& g) {
  if (s != dnnl_success)
    throw BackendError(std::string("xpipe: oneDNN ") + what + " failed with status " +
                       std::to_string(s) + " for the convolution " + conv_geometry_text(g));
}

// oneDNN's name of a primitive descriptor's implementation ("brgconv:avx512_core"); empty where
// it gives none.
inline std::string dnnl_implementation(const_dnnl_primitive_desc_t pd) {
  const char* name = nullptr;
  if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name) != dnnl_success ||
      name == nullptr)
    return {};
  return name;
}

// The first implementation an iterator offers, from where it stands, whose name `accept` takes
// (`accept(const std::string&)`); none (get() == nullptr) where it offers no more. The iterator
// is left on the one returned, so a second call with another rule goes on from there.
template <class Accept>
DnnlPrimitiveDesc dnnl_first_implementation(dnnl_primitive_desc_iterator_t it, Accept accept) {
  do {
    DnnlPrimitiveDesc pd;
    *pd.out() = dnnl_primitive_desc_iterator_fetch(it);
    if (pd.get() == nullptr) break;
    if (accept(dnnl_implementation(pd.get()))) return pd;
  } while (dnnl_primitive_desc_iterator_next(it) == dnnl_success);
  return {};
}

// Whether the layout a primitive wants puts every float where channels-last `plain` has it: the
// same descriptor, or a blocked one whose only block is all the channels (oneDNN's nChw16c of 16
// channels is nhwc), which then needs no reorder.
inline bool same_layout(const dnnl_memory_desc_t& plain, const dnnl_memory_desc_t& wanted) {
  if (dnnl_memory_desc_equal(&plain, &wanted) != 0) return true;
  if (plain.data_type != wanted.data_type || plain.format_kind != dnnl_blocked ||
      wanted.format_kind != dnnl_blocked || plain.ndims != wanted.ndims || wanted.ndims < 2 ||
      wanted.offset0 != 0 || wanted.extra.flags != 0 || plain.format_desc.blocking.inner_nblks != 0)
    return false;
  const dnnl_blocking_desc_t& b = wanted.format_desc.blocking;
  const bool one_channel_block =
      b.inner_nblks == 1 && b.inner_idxs[0] == 1 && b.inner_blks[0] == wanted.dims[1];
  if (b.inner_nblks != 0 && !one_channel_block) return false;
  for (int d = 0; d < wanted.ndims; ++d) {
    if (wanted.dims[d] != plain.dims[d] || wanted.padded_dims[d] != plain.dims[d]) return false;
    // With one block of all the channels, the channel dimension's outer stride never counts.
    if ((d != 1 || !one_channel_block) && b.strides[d] != plain.format_desc.blocking.strides[d])
      return false;
  }
  return true;
}

// What one convolution call uses and leaves nothing in: oneDNN's scratchpads and the activations
// reordered to and from a Winograd kernel's layout. One buffer per thread, shared by every
// convolution the thread runs (a stage's calls run one after another on its thread), grown to
// the largest call's need when a plan first runs, so a step that follows a first one allocates
// nothing. Winograd's scratchpads are 7-9 MB a primitive whatever the batch: held per primitive
// and plan, they took ~0.5 GB on the ResNet.
inline float* conv_call_buffer(index_t floats) {
  thread_local HostBuffer<float> buffer;
  if (buffer.size() < floats) buffer = HostBuffer<float>(floats);
  return buffer.data();
}

// Floats for `bytes`, rounded up to a cache line, so that what follows in a call buffer stays
// 64-byte aligned.
inline index_t conv_call_floats(std::size_t bytes) {
  return (static_cast<index_t>(bytes) + 63) / 64 * 16;
}

// The CPU engine, made once for the process.
inline dnnl_engine_t host_engine() {
  static const DnnlHandle<dnnl_engine_t, dnnl_engine_destroy> engine = [] {
    DnnlHandle<dnnl_engine_t, dnnl_engine_destroy> e;
    if (dnnl_engine_create(e.out(), dnnl_cpu, 0) != dnnl_success)
      throw BackendError("xpipe: oneDNN could not make its CPU engine");
    return e;
  }();
  return engine.get();
}

}  // namespace detail

//! The host's convolution: oneDNN's convolution primitives on xpipe's channels-last rows, the
//! weights in the layout the primitive chooses, reordered from and to OIHW around each call (a
//! few KiB). The direct kernels (jit and brgemm) run on channels-last memory (oneDNN's nhwc) as
//! it lies. Winograd's (g.algorithm, where oneDNN offers one) want the blocked nChw16c, which for
//! 16 channels is the same bytes and for more costs a reorder of each activation into and out of
//! the call buffer: ~0.1-0.2 ms against the 1.5-3.5 ms a call of 128 images saves. Keeping every
//! activation blocked would cost such reorders around every direct call instead: a ResNet spent 13%
//! of its epoch in them, which the faster blocked kernels did not win back (docs/results.md). A
//! plan per batch size (a few: the training micro-batch, a smaller last one, the evaluation chunk),
//! each made on its first use; after that a call sets memory handles and executes. Scratchpads are
//! ours (oneDNN's user scratchpad mode): they and the reordered activations lie in the calling
//! thread's call buffer (detail::conv_call_buffer), shared by all its convolutions, so oneDNN
//! makes no scratch buffer per call and a plan holds none of its own. The bits depend on
//! ctx.threads (oneDNN splits the weight gradient's sums by thread), as dnnl_sgemm's do: each
//! stage keeps one thread count, so every executor agrees. oneDNN fixes a primitive's thread
//! count when it is made (from the calling thread's OpenMP setting), so the plans are made, as
//! they run, on ctx.threads (a plan made on the machine's default ran every convolution of a
//! one-thread stage on all cores). The backward-weights primitive overwrites; `accumulate` adds
//! from a buffer of the plan. The backward runs whole (backward) or split for zero-bubble
//! schedules (backward_data, then later backward_weights), with the same bits. A call's memory
//! handles point into the buffer of the thread that placed them last, so one ConvPlans takes one
//! call at a time (a stage's calls run one after another; the split's halves are calls too).
//! Usage: `ConvPlans<Host> plans{g}; plans.forward(ctx, g, x, w, b, y);`
template <>
class ConvPlans<Host> {
 public:
  //! g.rows: the most images one call may take.
  explicit ConvPlans(const ConvGeometry& g) : max_(g) {}
  //! The same: oneDNN's primitives choose their buffers' sizes as they are made, so the plans
  //! take nothing from a stage's arena (arena_floats is 0).
  ConvPlans(const ConvGeometry& g, float* /*arena*/) : max_(g) {}
  static constexpr index_t arena_floats(const ConvGeometry& /*g*/) { return 0; }

  //! y = conv(x, w) + b (b unused without bias).
  void forward(const HostContext& ctx, const ConvGeometry& g, const float* x, const float* w,
               const float* b, float* y) {
    threads(ctx);  // before a plan is made: oneDNN fixes a primitive's threads when it makes it
    Plan& p = plan(g);
    if (!p.forward) p.make_forward();
    Forward& f = *p.forward;
    f.place(p);
    f.src.take(p, x);
    f.weights.take(p, w);
    f.dst.bind(p, y);
    set(p, f.bias.get(), g.bias ? b : nullptr);
    execute(p, f.primitive.get(),
            {{{DNNL_ARG_SRC, f.src.arg()},
              {DNNL_ARG_WEIGHTS, f.weights.arg()},
              {DNNL_ARG_DST, f.dst.arg()},
              {DNNL_ARG_SCRATCHPAD, f.scratch.memory.get()},
              {DNNL_ARG_BIAS, f.bias.get()}}},
            g.bias ? 5 : 4);
    f.dst.give(p);
  }

  //! oneDNN's name of the forward implementation that runs g ("jit:avx512_core"), making g's
  //! plan on ctx's threads if it has none yet.
  std::string forward_implementation(const HostContext& ctx, const ConvGeometry& g) {
    threads(ctx);
    return detail::dnnl_implementation(plan(g).forward_pd.get());
  }

  //! oneDNN's name of the backward-weights implementation that runs g ("jit:avx2"), making g's
  //! plan and its backward on ctx's threads if it has none yet.
  std::string backward_weights_implementation(const HostContext& ctx, const ConvGeometry& g) {
    threads(ctx);
    Plan& p = plan(g);
    if (!p.backward) p.make_backward();
    return p.backward->weights_implementation;
  }

  //! The backward of one call: dx = the input gradient of dy through w (skipped when dx is null),
  //! dw (+)= the weight gradient over every image, db (+)= dy summed per channel (unused without
  //! bias): backward_data, then backward_weights.
  void backward(const HostContext& ctx, const ConvGeometry& g, const float* x, const float* w,
                const float* dy, float* dx, float* dw, float* db, bool accumulate) {
    if (dx != nullptr) backward_data(ctx, g, w, dy, dx);
    weights_gradient(ctx, g, x, dy, dw, db, accumulate, /*dy_taken=*/dx != nullptr);
  }

  //! dx = the input gradient of dy through w (dx not null), the input part of a split backward.
  //! Nothing passes from it to backward_weights but dy itself, read where it lies.
  void backward_data(const HostContext& ctx, const ConvGeometry& g, const float* w, const float* dy,
                     float* dx) {
    threads(ctx);
    Plan& p = plan(g);
    if (!p.backward) p.make_backward();
    Backward& b = *p.backward;
    b.place(p);
    b.weights.take(p, w);
    b.diff_src.bind(p, dx);
    b.diff_dst.take(p, dy);
    execute(p, b.data.get(),
            {{{DNNL_ARG_DIFF_SRC, b.diff_src.arg()},
              {DNNL_ARG_WEIGHTS, b.weights.arg()},
              {DNNL_ARG_DIFF_DST, b.diff_dst.arg()},
              {DNNL_ARG_SCRATCHPAD, b.data_scratch.memory.get()}}},
            4);
    b.diff_src.give(p);
  }

  //! dw (+)= the weight gradient over every image, db (+)= dy summed per channel (unused without
  //! bias), the weight part of a split backward, from x and dy where they lie.
  void backward_weights(const HostContext& ctx, const ConvGeometry& g, const float* x,
                        const float* dy, float* dw, float* db, bool accumulate) {
    weights_gradient(ctx, g, x, dy, dw, db, accumulate, /*dy_taken=*/false);
  }

 private:
  using Desc = dnnl_memory_desc_t;
  struct Plan;

  // backward_weights; dy_taken: backward_data has just taken this dy (in the same call), so a
  // reorder of it that both primitives want is not done twice.
  void weights_gradient(const HostContext& ctx, const ConvGeometry& g, const float* x,
                        const float* dy, float* dw, float* db, bool accumulate, bool dy_taken) {
    threads(ctx);
    Plan& p = plan(g);
    if (!p.backward) p.make_backward();
    Backward& b = *p.backward;
    // The same places backward_data used: in a whole backward its reordered dy is still there.
    b.place(p);
    const dnnl_memory_t diff_dst = b.weights_dy(p, dy, dy_taken);
    b.src.take(p, x);
    const index_t nw = g.weight_floats(), nb = g.bias ? g.oc : 0;
    // Accumulating: the gradient goes to the plan's buffer first, then one pass adds it.
    float* to_w = accumulate ? b.grad_sum.data() : dw;
    float* to_b = accumulate ? b.grad_sum.data() + nw : db;
    b.diff_weights.bind(p, to_w);
    set(p, b.diff_bias.get(), g.bias ? to_b : nullptr);
    execute(p, b.weights_primitive.get(),
            {{{DNNL_ARG_SRC, b.src.arg()},
              {DNNL_ARG_DIFF_DST, diff_dst},
              {DNNL_ARG_DIFF_WEIGHTS, b.diff_weights.arg()},
              {DNNL_ARG_SCRATCHPAD, b.weights_scratch.memory.get()},
              {DNNL_ARG_DIFF_BIAS, b.diff_bias.get()}}},
            g.bias ? 5 : 4);
    b.diff_weights.give(p);
    if (accumulate) {
      const float* sum = b.grad_sum.data();
      for_each_index(ctx, nw, [=](index_t i) { dw[i] += sum[i]; });
      if (nb > 0) for_each_index(ctx, nb, [=](index_t i) { db[i] += sum[nw + i]; });
    }
  }

  // A primitive's scratchpad, sized by its primitive descriptor, in the call buffer.
  struct Scratch {
    detail::DnnlMemory memory;
    index_t floats = 0;
    void make(const Plan& p, dnnl_primitive_desc_t pd) {
      const Desc* d = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
      floats = detail::conv_call_floats(dnnl_memory_desc_get_size(d));
      detail::dnnl_check(
          dnnl_memory_create(memory.out(), d, detail::host_engine(), DNNL_MEMORY_NONE),
          "scratchpad", p.g);
    }
    void place(const Plan& p, float* at) const { set(p, memory.get(), at); }
  };

  // One operand of a primitive: the caller's memory (its handle set per call) and, where the
  // primitive wants another layout (the weights always; the activations for Winograd's kernels),
  // room in that layout in the call buffer (`floats` of it, placed per call) and the reorder
  // between them (into it for an input, out of it for an output).
  struct Operand {
    Desc wanted{};
    detail::DnnlMemory user, inner;
    detail::DnnlPrimitive reorder;
    index_t floats = 0;
    bool direct = true;
    void make(const Plan& p, const Desc& plain, dnnl_primitive_desc_t pd, dnnl_query_t what,
              bool input) {
      const dnnl_engine_t e = detail::host_engine();
      wanted = *dnnl_primitive_desc_query_md(pd, what, 0);
      direct = detail::same_layout(plain, wanted);
      // A layout of the same bytes is described as the primitive wants it.
      detail::dnnl_check(
          dnnl_memory_create(user.out(), direct ? &wanted : &plain, e, DNNL_MEMORY_NONE), "memory",
          p.g);
      if (direct) return;
      floats = detail::conv_call_floats(dnnl_memory_desc_get_size(&wanted));
      detail::dnnl_check(dnnl_memory_create(inner.out(), &wanted, e, DNNL_MEMORY_NONE), "memory",
                         p.g);
      detail::DnnlPrimitiveDesc rpd;
      detail::dnnl_check(dnnl_reorder_primitive_desc_create(rpd.out(), input ? &plain : &wanted, e,
                                                            input ? &wanted : &plain, e, nullptr),
                         "reorder", p.g);
      detail::dnnl_check(dnnl_primitive_create(reorder.out(), rpd.get()), "reorder", p.g);
    }
    dnnl_memory_t arg() const { return direct ? user.get() : inner.get(); }
    void bind(const Plan& p, const float* data) { set(p, user.get(), data); }
    // Its room at `at` in the call buffer (where it needs one).
    void place(const Plan& p, float* at) const {
      if (floats > 0) set(p, inner.get(), at);
    }
    // An input: binds data and reorders it into the primitive's layout.
    void take(const Plan& p, const float* data) {
      bind(p, data);
      if (!direct)
        execute(p, reorder.get(), {{{DNNL_ARG_FROM, user.get()}, {DNNL_ARG_TO, inner.get()}}}, 2);
    }
    // An output: reorders the primitive's result into the bound plain memory.
    void give(const Plan& p) {
      if (!direct)
        execute(p, reorder.get(), {{{DNNL_ARG_FROM, inner.get()}, {DNNL_ARG_TO, user.get()}}}, 2);
    }
  };

  // Lays the operands' rooms out one after another in the calling thread's call buffer, grown
  // to hold them and `scratch_floats` more; returns where that scratchpad room begins.
  template <std::size_t N>
  static float* lay_out(const Plan& p, const std::array<const Operand*, N>& operands,
                        index_t scratch_floats) {
    index_t floats = scratch_floats;
    for (const Operand* o : operands) floats += o->floats;
    float* at = detail::conv_call_buffer(floats);
    for (const Operand* o : operands) {
      o->place(p, at);
      at += o->floats;
    }
    return at;
  }
  struct Forward {
    detail::DnnlPrimitive primitive;
    Operand src, weights, dst;
    detail::DnnlMemory bias;
    Scratch scratch;
    // The call buffer, laid out (lay_out): the reordered operands, then the scratchpad.
    void place(const Plan& p) {
      const std::array<const Operand*, 3> operands{&src, &weights, &dst};
      scratch.place(p, lay_out(p, operands, scratch.floats));
    }
  };
  struct Backward {
    detail::DnnlPrimitive data, weights_primitive;
    // dy as the data primitive takes it, and as the weights primitive does (Winograd in one
    // direction and direct in the other want it in two layouts).
    Operand diff_dst, weights_diff_dst, weights, diff_src, src, diff_weights;
    detail::DnnlMemory diff_bias;
    Scratch data_scratch, weights_scratch;
    HostBuffer<float> grad_sum{0};
    std::string weights_implementation;
    // The call buffer, laid out the same for both halves, so that a whole backward's dy,
    // reordered for the data primitive, is still there for the weights one: every operand's
    // room, then one scratchpad room for whichever primitive runs.
    void place(const Plan& p) {
      const std::array<const Operand*, 6> operands{
          &diff_dst, &weights_diff_dst, &weights, &diff_src, &src, &diff_weights};
      float* scratch = lay_out(p, operands, std::max(data_scratch.floats, weights_scratch.floats));
      data_scratch.place(p, scratch);
      weights_scratch.place(p, scratch);
    }
    // The weights primitive's dy: the data primitive's reorder of it where both want one layout
    // and the data primitive has just taken this dy, else its own (reordered if need be).
    dnnl_memory_t weights_dy(const Plan& p, const float* dy, bool dy_taken) {
      if (dy_taken && !diff_dst.direct && !weights_diff_dst.direct &&
          dnnl_memory_desc_equal(&diff_dst.wanted, &weights_diff_dst.wanted) != 0)
        return diff_dst.inner.get();
      weights_diff_dst.take(p, dy);
      return weights_diff_dst.arg();
    }
  };

  // The primitives of one batch size: activations channels-last as the caller's, the weights in
  // oneDNN's choice of layout (format_tag::any).
  struct Plan {
    ConvGeometry g;
    Desc src, weights, bias, dst;  // the caller's: NHWC, OIHW, x
    Desc any_weights;              // the primitive's choice
    Desc any_src, any_dst;         // the same, for Winograd's kernels (nChw16c on AVX-512)
    dnnl_dims_t strides{}, padding{};
    detail::DnnlStream stream;
    detail::DnnlAttr attr;
    detail::DnnlPrimitiveDesc forward_pd;
    std::unique_ptr<Forward> forward;
    std::unique_ptr<Backward> backward;

    explicit Plan(const ConvGeometry& geometry) : g(geometry) {
      const dnnl_dims_t x{g.rows, g.c, g.h, g.w}, w{g.oc, g.c, g.k, g.k}, b{g.oc},
          y{g.rows, g.oc, g.oh, g.ow};
      desc(src, 4, x, dnnl_nhwc);
      desc(weights, 4, w, dnnl_oihw);
      desc(bias, 1, b, dnnl_x);
      desc(dst, 4, y, dnnl_nhwc);
      desc(any_weights, 4, w, dnnl_format_tag_any);
      desc(any_src, 4, x, dnnl_format_tag_any);
      desc(any_dst, 4, y, dnnl_format_tag_any);
      strides[0] = strides[1] = g.stride;
      padding[0] = padding[1] = g.pad;
      const dnnl_engine_t e = detail::host_engine();
      detail::dnnl_check(dnnl_stream_create(stream.out(), e, dnnl_stream_default_flags), "stream",
                         g);
      detail::dnnl_check(dnnl_primitive_attr_create(attr.out()), "attributes", g);
      detail::dnnl_check(
          dnnl_primitive_attr_set_scratchpad_mode(attr.get(), dnnl_scratchpad_mode_user),
          "attributes", g);
      forward_pd = winograd([&](dnnl_convolution_desc_t& d) {
        return dnnl_convolution_forward_desc_init(
            &d, dnnl_forward_training, dnnl_convolution_winograd, &any_src, &any_weights,
            g.bias ? &bias : nullptr, &any_dst, strides, padding, padding);
      });
      if (forward_pd.get() != nullptr) return;
      dnnl_convolution_desc_t d;
      detail::dnnl_check(dnnl_convolution_forward_desc_init(
                             &d, dnnl_forward_training, dnnl_convolution_direct, &src, &any_weights,
                             g.bias ? &bias : nullptr, &dst, strides, padding, padding),
                         "convolution forward descriptor", g);
      forward_pd = forward_desc(d, e);
    }
    // oneDNN's Winograd primitive of the descriptor `init(d)` makes (the backward ones hinted by
    // the forward), its activations in the layout it picks; none (get() == nullptr) where the
    // geometry asks for direct, where its channels do not come in 16s, or where oneDNN offers no
    // Winograd kernel for the shape and machine. Its kernels transform 16 channels at a time and
    // pad a layer of fewer with zeros: the 1-to-16-channel stem ran 10x slower than direct. Which
    // kernel runs depends on the shape and the instruction set alone, so every plan of a shape on
    // a machine runs the same one. On a 2-core AVX-512 EPYC (oneDNN 2.6, 128 images, forward and
    // both backwards against the direct kernels on channels-last activations) the ResNet's 3x3
    // layers ran 1.1x (16 channels at 28x28), 1.3x (32 at 14x14) and 1.5x (64 at 7x7) faster on
    // one thread, 1.6x, 1.4x and 1.5x on two (docs/results.md).
    template <class Init>
    detail::DnnlPrimitiveDesc winograd(Init init) const {
      if (g.algorithm != ConvAlgorithm::winograd || g.c % 16 != 0 || g.oc % 16 != 0) return {};
      dnnl_convolution_desc_t d;
      if (init(d) != dnnl_success) return {};
      detail::DnnlPrimitiveDesc pd;
      if (dnnl_primitive_desc_create(pd.out(), &d, attr.get(), detail::host_engine(),
                                     forward_pd.get()) != dnnl_success)
        return {};
      return pd;
    }
    // The forward's implementation: oneDNN's first choice, except that on a layer that gives at
    // most 16 channels its direct jit kernel is taken over its brgemm one of the same instruction
    // set where it offers both. On a 2-core AVX-512 EPYC (oneDNN 2.6, 128 28x28 images) the
    // direct kernel ran the 16-to-16-channel 3x3 convolution 1.26-1.41x faster on one thread and
    // 1.1x on two, the 1-to-16-channel stem 2.1x; where a layer gives 32 channels or more brgemm
    // tied or won (1.07x from 16 to 32 at 14x14, 1.2x at 64). A fixed rule, not a timing: every
    // plan of a shape on a machine runs the same kernel, so executors and resumed runs keep
    // their bits.
    detail::DnnlPrimitiveDesc forward_desc(const dnnl_convolution_desc_t& d,
                                           dnnl_engine_t e) const {
      detail::DnnlHandle<dnnl_primitive_desc_iterator_t, dnnl_primitive_desc_iterator_destroy> it;
      detail::dnnl_check(dnnl_primitive_desc_iterator_create(it.out(), &d, attr.get(), e, nullptr),
                         "convolution forward", g);
      const auto any = [](const std::string&) { return true; };
      detail::DnnlPrimitiveDesc first = detail::dnnl_first_implementation(it.get(), any);
      if (first.get() == nullptr)
        throw BackendError("xpipe: oneDNN gave no convolution forward for " +
                           conv_geometry_text(g));
      const std::string name = detail::dnnl_implementation(first.get());
      const auto isa = name.find(':');
      if (g.oc > 16 || !name.starts_with("brgconv") || isa == std::string::npos) return first;
      const std::string direct = "jit" + name.substr(isa);
      detail::DnnlPrimitiveDesc preferred;
      if (dnnl_primitive_desc_iterator_next(it.get()) == dnnl_success)
        preferred = detail::dnnl_first_implementation(
            it.get(), [&](const std::string& next) { return next == direct; });
      return preferred.get() != nullptr ? std::move(preferred) : std::move(first);
    }
    // The backward weights' implementation: oneDNN's first choice, except its 1x1 kernels
    // (jit_1x1) on a strided 1x1 layer whose input channels are not a multiple of 16. There
    // oneDNN 2.6 steps through its strided-input copy by the channel block (8 on AVX2, 16 on
    // AVX-512) where a channels-last copy holds only the layer's channels, and writes past its
    // workspace (uxlfoundation/oneDNN#6035): a projection from 4 channels gave other weight
    // gradients from run to run on an AVX2 EPYC, and the issue reports hangs and crashes. The
    // next implementation oneDNN offers runs such a layer instead; it is small wherever it
    // occurs (a shortcut from few channels). A fixed rule, so every plan of a shape on a machine
    // runs the same kernel.
    detail::DnnlPrimitiveDesc backward_weights_desc(const dnnl_convolution_desc_t& d,
                                                    dnnl_engine_t e) const {
      detail::DnnlHandle<dnnl_primitive_desc_iterator_t, dnnl_primitive_desc_iterator_destroy> it;
      detail::dnnl_check(
          dnnl_primitive_desc_iterator_create(it.out(), &d, attr.get(), e, forward_pd.get()),
          "convolution backward weights", g);
      const bool avoid_1x1 = g.k == 1 && g.stride > 1 && g.c % 16 != 0;
      detail::DnnlPrimitiveDesc pd = detail::dnnl_first_implementation(
          it.get(),
          [&](const std::string& name) { return !avoid_1x1 || !name.starts_with("jit_1x1"); });
      if (pd.get() != nullptr) return pd;
      throw BackendError("xpipe: oneDNN gave no convolution backward weights for " +
                         conv_geometry_text(g) +
                         (avoid_1x1 ? " but its 1x1 kernel, which is wrong for this shape" : ""));
    }
    void desc(Desc& d, int n, const dnnl_dims_t dims, dnnl_format_tag_t tag) const {
      detail::dnnl_check(dnnl_memory_desc_init_by_tag(&d, n, dims, dnnl_f32, tag),
                         "memory descriptor", g);
    }
    void make_forward() {
      auto f = std::make_unique<Forward>();
      const dnnl_primitive_desc_t pd = forward_pd.get();
      f->src.make(*this, src, pd, dnnl_query_src_md, true);
      f->weights.make(*this, weights, pd, dnnl_query_weights_md, true);
      f->dst.make(*this, dst, pd, dnnl_query_dst_md, false);
      detail::dnnl_check(
          dnnl_memory_create(f->bias.out(), &bias, detail::host_engine(), DNNL_MEMORY_NONE),
          "memory", g);
      f->scratch.make(*this, pd);
      detail::dnnl_check(dnnl_primitive_create(f->primitive.out(), pd), "convolution forward", g);
      forward = std::move(f);
    }
    void make_backward() {
      const dnnl_engine_t e = detail::host_engine();
      detail::DnnlPrimitiveDesc data_pd = winograd([&](dnnl_convolution_desc_t& d) {
        return dnnl_convolution_backward_data_desc_init(&d, dnnl_convolution_winograd, &any_src,
                                                        &any_weights, &any_dst, strides, padding,
                                                        padding);
      });
      if (data_pd.get() == nullptr) {
        dnnl_convolution_desc_t dd;
        detail::dnnl_check(
            dnnl_convolution_backward_data_desc_init(&dd, dnnl_convolution_direct, &src,
                                                     &any_weights, &dst, strides, padding, padding),
            "convolution backward-data descriptor", g);
        detail::dnnl_check(
            dnnl_primitive_desc_create(data_pd.out(), &dd, attr.get(), e, forward_pd.get()),
            "convolution backward data", g);
      }
      detail::DnnlPrimitiveDesc weights_pd = winograd([&](dnnl_convolution_desc_t& d) {
        return dnnl_convolution_backward_weights_desc_init(&d, dnnl_convolution_winograd, &any_src,
                                                           &any_weights, g.bias ? &bias : nullptr,
                                                           &any_dst, strides, padding, padding);
      });
      if (weights_pd.get() == nullptr) {
        dnnl_convolution_desc_t wd;
        detail::dnnl_check(dnnl_convolution_backward_weights_desc_init(
                               &wd, dnnl_convolution_direct, &src, &any_weights,
                               g.bias ? &bias : nullptr, &dst, strides, padding, padding),
                           "convolution backward-weights descriptor", g);
        weights_pd = backward_weights_desc(wd, e);
      }
      auto b = std::make_unique<Backward>();
      b->weights_implementation = detail::dnnl_implementation(weights_pd.get());
      b->diff_dst.make(*this, dst, data_pd.get(), dnnl_query_diff_dst_md, true);
      b->weights_diff_dst.make(*this, dst, weights_pd.get(), dnnl_query_diff_dst_md, true);
      b->weights.make(*this, weights, data_pd.get(), dnnl_query_weights_md, true);
      b->diff_src.make(*this, src, data_pd.get(), dnnl_query_diff_src_md, false);
      b->src.make(*this, src, weights_pd.get(), dnnl_query_src_md, true);
      b->diff_weights.make(*this, weights, weights_pd.get(), dnnl_query_diff_weights_md, false);
      detail::dnnl_check(dnnl_memory_create(b->diff_bias.out(), &bias, e, DNNL_MEMORY_NONE),
                         "memory", g);
      b->data_scratch.make(*this, data_pd.get());
      b->weights_scratch.make(*this, weights_pd.get());
      b->grad_sum = HostBuffer<float>(g.weight_floats() + g.oc);
      detail::dnnl_check(dnnl_primitive_create(b->data.out(), data_pd.get()),
                         "convolution backward data", g);
      detail::dnnl_check(dnnl_primitive_create(b->weights_primitive.out(), weights_pd.get()),
                         "convolution backward weights", g);
      backward = std::move(b);
    }
  };

  Plan& plan(const ConvGeometry& g) {
    if (g.rows <= 0 || g.rows > max_.rows || !(g.with_rows(max_.rows) == max_))
      throw ShapeError("xpipe: convolution " + conv_geometry_text(g) +
                       " does not fit the plans made for " + conv_geometry_text(max_));
    for (auto& p : plans_)
      if (p->g.rows == g.rows) return *p;
    plans_.push_back(std::make_unique<Plan>(g));
    return *plans_.back();
  }

  // oneDNN takes handles as void*; it writes only through the destination arguments.
  static void set(const Plan& p, dnnl_memory_t m, const float* data) {
    detail::dnnl_check(dnnl_memory_set_data_handle(m, const_cast<float*>(data)), "set handle", p.g);
  }

  // oneDNN's OpenMP runtime sizes its team from the calling thread's max-threads setting, as
  // dnnl_sgemm does: each stage thread gets its own count.
  static void threads(const HostContext& ctx) {
    if (omp_get_max_threads() != ctx.threads) omp_set_num_threads(ctx.threads);
  }

  static void execute(const Plan& p, dnnl_primitive_t prim,
                      const std::array<dnnl_exec_arg_t, 5>& args, int count) {
    detail::dnnl_check(dnnl_primitive_execute(prim, p.stream.get(), count, args.data()), "execute",
                       p.g);
    detail::dnnl_check(dnnl_stream_wait(p.stream.get()), "stream wait", p.g);
  }

  ConvGeometry max_;
  std::vector<std::unique_ptr<Plan>> plans_;
};

}  // namespace xpipe
