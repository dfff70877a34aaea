// prepack/detail/range.hpp - the traits that let every public function taking prompt lengths
// accept a prepack::span, any contiguous container of integers (std::vector, std::array) or,
// through an initializer_list overload, a braced list: one body per function, the length type
// deduced from the argument.
#pragma once

#include <cstddef>
#include <iterator>
#include <type_traits>
#include <utility>

#include "../config.hpp"
#include "../span.hpp"

PREPACK_NAMESPACE_BEGIN
namespace detail {

template <class T>
struct type_identity {
  using type = T;
};
// Keeps a parameter out of template argument deduction (std::type_identity_t in C++20).
template <class T>
using nondeduced = typename type_identity<T>::type;

// The element type of a contiguous range (std::vector, std::array, prepack::span).
template <class R>
using range_value_t =
    std::remove_cv_t<std::remove_pointer_t<decltype(std::data(std::declval<const R&>()))>>;

template <class R, class = void>
struct is_length_range : std::false_type {};
template <class R>
struct is_length_range<R, std::void_t<decltype(std::data(std::declval<const R&>())),
                                      decltype(std::size(std::declval<const R&>()))>>
    : std::bool_constant<std::is_integral_v<range_value_t<R>> &&
                         !std::is_same_v<range_value_t<R>, bool>> {};

// Enables the overloads that take lengths as a range.
template <class R>
using if_length_range = std::enable_if_t<is_length_range<R>::value>;

// A contiguous range of integers as a span (a span as itself).
template <class R>
span<const range_value_t<R>> as_span(const R& r) {
  return {std::data(r), std::size(r)};
}

}  // namespace detail
PREPACK_NAMESPACE_END
