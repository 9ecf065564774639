// The sum of a residual block's two paths, y = a + b over rows x cols views (or Act(a + b), the
// activation after the sum fused), and the copy of a chain's last output, y = a, as function
// objects and launchers (host loop and CUDA kernel alike); y may be a or b.
#pragma once

#include "xpipe/backend/backend.hpp"
#include "xpipe/core/config.hpp"
#include "xpipe/core/tensor.hpp"
#include "xpipe/kernels/activation.hpp"

namespace xpipe {

namespace ops {

//! y(r, c) = Act(a(r, c) + b(r, c)) (the sum itself for math::Identity).
template <class Act = math::Identity>
struct AddViews {
  ConstMatrix a, b;
  Matrix y;
  XPIPE_HOST_DEVICE void operator()(index_t r, index_t c) const {
    y(r, c) = Act::forward(a(r, c) + b(r, c));
  }
};

//! y(r, c) = a(r, c).
struct CopyView {
  ConstMatrix a;
  Matrix y;
  XPIPE_HOST_DEVICE void operator()(index_t r, index_t c) const { y(r, c) = a(r, c); }
};

}  // namespace ops

//! y = a, element by element (both of one extent, any leading dimensions).
//! Usage: `copy_view(ctx, inner_out, y);`
template <class Ctx>
void copy_view(const Ctx& ctx, ConstMatrix a, Matrix y) {
  for_each_element(ctx, y.rows, y.cols, ops::CopyView{a, y});
}

//! y = Act(a + b), element by element (all three of one extent; y may alias a or b); the sum
//! alone by default.
//! Usage: `add_views(ctx, inner_out, x, y);`, `add_views<math::Relu>(ctx, inner_out, x, y);`
template <class Act = math::Identity, class Ctx>
void add_views(const Ctx& ctx, ConstMatrix a, ConstMatrix b, Matrix y) {
  for_each_element(ctx, y.rows, y.cols, ops::AddViews<Act>{a, b, y});
}

}  // namespace xpipe
