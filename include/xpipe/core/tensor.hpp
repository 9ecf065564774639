// Non-owning row-major matrix views: what kernels and layers take instead of raw pointers.
#pragma once

#include <type_traits>

#include "xpipe/core/config.hpp"

namespace xpipe {

//! A rows x cols row-major view with leading dimension `ld` (>= cols). Trivially copyable,
//! usable on host and device. Usage: `MatrixView<float> y{ptr, batch, 1024};`
template <class T>
struct MatrixView {
  T* data = nullptr;
  index_t rows = 0;
  index_t cols = 0;
  index_t ld = 0;

  constexpr MatrixView() = default;
  constexpr MatrixView(T* d, index_t r, index_t c) : data(d), rows(r), cols(c), ld(c) {}
  constexpr MatrixView(T* d, index_t r, index_t c, index_t l) : data(d), rows(r), cols(c), ld(l) {}
  // A view of T converts to a view of const T.
  template <class U>
  requires(!std::is_same_v<U, T> &&
           std::is_same_v<const U, T>) constexpr MatrixView(const MatrixView<U>& o)
      : data(o.data), rows(o.rows), cols(o.cols), ld(o.ld) {}

  XPIPE_HOST_DEVICE T* row(index_t r) const { return data + r * ld; }
  XPIPE_HOST_DEVICE T& operator()(index_t r, index_t c) const { return data[r * ld + c]; }
  constexpr bool empty() const { return data == nullptr; }
  constexpr index_t size() const { return rows * cols; }
  //! Rows [first, first + count) as a view of the same storage.
  constexpr MatrixView slice_rows(index_t first, index_t count) const {
    return {data + first * ld, count, cols, ld};
  }
};

using Matrix = MatrixView<float>;
using ConstMatrix = MatrixView<const float>;

}  // namespace xpipe
