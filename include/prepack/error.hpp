// prepack/error.hpp - the one exception type callers catch, and the helpers that build its
// messages. Messages name the offending item and value: "prompt 7: length 0".
#pragma once

#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "config.hpp"

PREPACK_NAMESPACE_BEGIN

/// Thrown for every caller mistake (bad lengths, capacities, shapes, buffers). Derives from
/// std::invalid_argument; when it is thrown, no destination has been written.
class error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

namespace detail {

// Integers print as numbers even when they are (un)signed char.
template <class T>
auto printable(const T& v) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if constexpr (std::is_signed_v<T>) {
      return static_cast<long long>(v);
    } else {
      return static_cast<unsigned long long>(v);
    }
  } else {
    return v;
  }
}

template <class... Args>
[[noreturn]] void fail(const Args&... args) {
  std::ostringstream s;
  (s << ... << printable(args));
  throw error(s.str());
}

template <class... Args>
void require(bool ok, const Args&... args) {
  if (!ok) fail(args...);
}

template <class T>
const char* type_name() {
  if constexpr (std::is_same_v<T, signed char>)
    return "int8";
  else if constexpr (std::is_same_v<T, unsigned char>)
    return "uint8";
  else if constexpr (std::is_same_v<T, short>)
    return "int16";
  else if constexpr (std::is_same_v<T, unsigned short>)
    return "uint16";
  else if constexpr (std::is_same_v<T, int>)
    return "int32";
  else if constexpr (std::is_same_v<T, unsigned>)
    return "uint32";
  else if constexpr (std::is_integral_v<T> && std::is_signed_v<T>)
    return "int64";
  else if constexpr (std::is_integral_v<T>)
    return "uint64";
  else
    return "value";
}

}  // namespace detail

PREPACK_NAMESPACE_END
