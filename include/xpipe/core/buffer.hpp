// Owning, 64-byte-aligned host buffer: the storage behind every flat parameter, gradient,
// optimizer-moment and activation array on the host backend.
#pragma once

#include <cstddef>
#include <cstring>
#include <new>
#include <span>
#include <utility>

#include "xpipe/core/config.hpp"

namespace xpipe {

//! A fixed-size array of T on the host, aligned to a cache line, zero-filled on creation.
//! Usage: `HostBuffer<float> w(n); w[0] = 1.f;`
template <class T>
class HostBuffer {
 public:
  static constexpr std::size_t alignment = 64;

  HostBuffer() = default;
  explicit HostBuffer(index_t size) : size_(size) {
    if (size_ > 0) {
      // operator new (not aligned_alloc) so allocation-counting tests see every buffer.
      data_ = static_cast<T*>(::operator new (bytes(), std::align_val_t{alignment}));
      std::memset(static_cast<void*>(data_), 0, bytes());
    }
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  HostBuffer(HostBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  HostBuffer& operator=(HostBuffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  ~HostBuffer() { release(); }

  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  index_t size() const noexcept { return size_; }
  std::size_t bytes() const noexcept { return static_cast<std::size_t>(size_) * sizeof(T); }
  T& operator[](index_t i) noexcept { return data_[i]; }
  const T& operator[](index_t i) const noexcept { return data_[i]; }
  std::span<T> span() noexcept { return {data_, static_cast<std::size_t>(size_)}; }
  std::span<const T> span() const noexcept { return {data_, static_cast<std::size_t>(size_)}; }
  T* begin() noexcept { return data_; }
  T* end() noexcept { return data_ + size_; }
  const T* begin() const noexcept { return data_; }
  const T* end() const noexcept { return data_ + size_; }

 private:
  void release() noexcept {
    if (data_ != nullptr) ::operator delete (data_, std::align_val_t{alignment});
    data_ = nullptr;
  }
  T* data_ = nullptr;
  index_t size_ = 0;
};

}  // namespace xpipe
