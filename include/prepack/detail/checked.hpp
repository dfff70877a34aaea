// prepack/detail/checked.hpp - overflow-checked size arithmetic and range checks between integer
// types. Every size the library allocates or indexes with goes through these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "../error.hpp"

PREPACK_NAMESPACE_BEGIN
namespace detail {

// True when the integer v is representable in To.
template <class To, class From>
constexpr bool fits(From v) noexcept {
  static_assert(std::is_integral_v<To> && std::is_integral_v<From>);
  if constexpr (std::is_signed_v<From>) {
    if (v < 0) {
      if constexpr (std::is_unsigned_v<To>) {
        return false;
      } else {
        return static_cast<long long>(v) >= static_cast<long long>(std::numeric_limits<To>::min());
      }
    }
  }
  return static_cast<unsigned long long>(v) <=
         static_cast<unsigned long long>(std::numeric_limits<To>::max());
}

template <class T>
constexpr bool is_negative(T v) noexcept {
  if constexpr (std::is_signed_v<T>) {
    return v < 0;
  } else {
    (void)v;
    return false;
  }
}

// a * b, or an error naming what was being sized.
inline std::size_t mul(std::size_t a, std::size_t b, const char* what) {
  if (a != 0 && b > std::numeric_limits<std::size_t>::max() / a) {
    fail(what, ": ", a, " x ", b, " overflows size_t");
  }
  return a * b;
}

inline std::size_t add(std::size_t a, std::size_t b, const char* what) {
  if (b > std::numeric_limits<std::size_t>::max() - a) {
    fail(what, ": ", a, " + ", b, " overflows size_t");
  }
  return a + b;
}

// Converts v to To, or fails with "<what> <v> does not fit the <type of To> <kind> type" (kind:
// "index" for the layout's index type, "token" for token ids).
template <class To, class From>
To narrow(From v, const char* what, const char* kind = "index") {
  if (!fits<To>(v)) fail(what, " ", v, " does not fit the ", type_name<To>(), " ", kind, " type");
  return static_cast<To>(v);
}

}  // namespace detail
PREPACK_NAMESPACE_END
