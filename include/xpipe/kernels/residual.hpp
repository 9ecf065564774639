// The sum of a residual block's two paths, y = a + b over rows x cols views, and the copy of a
// chain's last output, y = a, as function objects and launchers (host loop and CUDA kernel
// alike); y may be a or b.
#pragma once

#include "xpipe/backend/backend.hpp"
#include "xpipe/core/config.hpp"
#include "xpipe/core/tensor.hpp"

namespace xpipe {

namespace ops {

//! y(r, c) = a(r, c) + b(r, c).
struct AddViews {
  ConstMatrix a, b;
  Matrix y;
  XPIPE_HOST_DEVICE void operator()(index_t r, index_t c) const { y(r, c) = a(r, c) + b(r, c); }
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

//! y = a + b, element by element (all three of one extent; y may alias a or b).
//! Usage: `add_views(ctx, inner_out, x, y);`
template <class Ctx>
void add_views(const Ctx& ctx, ConstMatrix a, ConstMatrix b, Matrix y) {
  for_each_element(ctx, y.rows, y.cols, ops::AddViews{a, b, y});
}

}  // namespace xpipe
