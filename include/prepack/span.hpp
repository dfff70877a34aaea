// prepack/span.hpp - a minimal C++17 stand-in for std::span, and strided views over caller
// memory (pointer + extents + strides, as std::mdspan with layout_stride). No allocation.
#pragma once

#include <array>
#include <cstddef>
#include <initializer_list>
#include <iterator>
#include <type_traits>

#include "config.hpp"

PREPACK_NAMESPACE_BEGIN

/// A contiguous run of T owned by someone else: pointer + size.
template <class T>
class span {
 public:
  using element_type = T;
  using value_type = std::remove_cv_t<T>;

  constexpr span() noexcept = default;
  constexpr span(T* data, std::size_t size) noexcept : data_(data), size_(size) {}

  /// Any contiguous container with data() and size() (std::vector, std::array, span).
  template <class C,
            class = std::enable_if_t<std::is_convertible_v<
                std::remove_pointer_t<decltype(std::data(std::declval<C&>()))> (*)[], T (*)[]>>>
  constexpr span(C& c) noexcept : data_(std::data(c)), size_(std::size(c)) {}  // NOLINT

  template <
      class C,
      class = std::enable_if_t<
          std::is_const_v<T> &&
          std::is_convertible_v<
              std::remove_pointer_t<decltype(std::data(std::declval<const C&>()))> (*)[], T (*)[]>>>
  constexpr span(const C& c) noexcept : data_(std::data(c)), size_(std::size(c)) {}  // NOLINT

  /// Braced lists, for arguments only (the list dies at the end of the full expression).
  template <class U = T, class = std::enable_if_t<std::is_const_v<U>>>
  constexpr span(std::initializer_list<value_type> list) noexcept  // NOLINT
      : data_(list.begin()), size_(list.size()) {}

  constexpr T* data() const noexcept { return data_; }
  constexpr std::size_t size() const noexcept { return size_; }
  constexpr bool empty() const noexcept { return size_ == 0; }
  constexpr T& operator[](std::size_t i) const noexcept { return data_[i]; }
  constexpr T* begin() const noexcept { return data_; }
  constexpr T* end() const noexcept { return data_ + size_; }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

/// A rank-R strided view over caller memory. Element (i0, .., iR-1) lives at
/// data[i0 * stride[0] + ... + iR-1 * stride[R-1]]; strides count elements, not bytes.
template <class T, std::size_t Rank>
struct tensor_view {
  T* data = nullptr;
  std::array<std::size_t, Rank> extent{};  // [Rank]  size of each dimension
  std::array<std::size_t, Rank> stride{};  // [Rank]  elements between neighbours in each dimension

  template <class... I>
  T& operator()(I... i) const noexcept {
    static_assert(sizeof...(I) == Rank, "one index per dimension");
    const std::size_t idx[] = {static_cast<std::size_t>(i)...};
    std::size_t off = 0;
    for (std::size_t d = 0; d < Rank; ++d) off += idx[d] * stride[d];
    return data[off];
  }

  /// The same view seen as read-only.
  operator tensor_view<const T, Rank>() const noexcept { return {data, extent, stride}; }  // NOLINT
};

/// A row-major (C order) view: the last dimension is contiguous.
template <class T, std::size_t Rank>
tensor_view<T, Rank> contiguous_view(T* data, const std::array<std::size_t, Rank>& extent) {
  tensor_view<T, Rank> v{data, extent, {}};
  std::size_t s = 1;
  for (std::size_t d = Rank; d-- > 0;) {
    v.stride[d] = s;
    s *= extent[d];
  }
  return v;
}

PREPACK_NAMESPACE_END
