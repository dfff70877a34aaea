// prepack/detail/views.hpp - the checks every function that reads or writes a tensor_view makes
// first: the view is addressable (no size_t overflow in its reach, data where it has elements)
// and, for a destination, no two indices share an element.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <numeric>

#include "../error.hpp"
#include "../span.hpp"
#include "checked.hpp"

PREPACK_NAMESPACE_BEGIN
namespace detail {

template <class T, std::size_t R>
bool empty_view(const tensor_view<T, R>& v) {
  for (std::size_t e : v.extent) {
    if (e == 0) return true;
  }
  return false;
}

// Offset of the last element a view can reach, checked against size_t overflow.
template <class T, std::size_t R>
std::size_t reach(const tensor_view<T, R>& v, const char* what) {
  std::size_t off = 0;
  for (std::size_t d = 0; d < R; ++d) {
    if (v.extent[d] == 0) return 0;
    off = add(off, mul(v.extent[d] - 1, v.stride[d], what), what);
  }
  return off;
}

// Checks a view is addressable, and for a destination that no two indices share an element
// (sorted by stride, each stride exceeds the reach of all smaller ones).
template <class T, std::size_t R>
void check_view(const tensor_view<T, R>& v, const char* what, bool destination) {
  if (empty_view(v)) return;
  require(v.data != nullptr, what, ": null data for a non-empty view");
  reach(v, what);
  if (!destination) return;
  std::array<std::size_t, R> dims;
  std::iota(dims.begin(), dims.end(), std::size_t{0});
  std::sort(dims.begin(), dims.end(),
            [&](std::size_t a, std::size_t b) { return v.stride[a] < v.stride[b]; });
  std::size_t covered = 0;  // largest offset reachable with the dimensions seen so far
  for (std::size_t d : dims) {
    if (v.extent[d] <= 1) continue;
    require(v.stride[d] > covered, what, ": overlapping strides (dimension ", d, " has stride ",
            v.stride[d], " within the reach ", covered, " of the smaller ones)");
    covered += (v.extent[d] - 1) * v.stride[d];
  }
}

}  // namespace detail
PREPACK_NAMESPACE_END
