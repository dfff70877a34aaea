// Arrays across the boundary: C++ vectors handed to numpy without a copy, and integer arrays
// taken from anything array-like (numpy, torch, DLPack, the buffer protocol, lists) without a
// copy where they already are contiguous and of the type asked for.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "prepack/error.hpp"
#include "prepack/span.hpp"

namespace pp {

namespace nb = nanobind;
using namespace nb::literals;


/// A numpy array that owns `v` (moved onto the heap, freed with the array): no copy.
template <class T>
nb::object to_numpy(std::vector<T>&& v, std::initializer_list<std::size_t> shape) {
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::cast(nb::ndarray<nb::numpy, T>(heap->data(), shape, owner));
}
template <class T>
nb::object to_numpy(std::vector<T>&& v) {
  const std::size_t n = v.size();
  return to_numpy(std::move(v), {n});
}

/// A read-only numpy view of memory that `owner` (a Python object) keeps alive.
template <class T>
nb::object view(const T* data, std::initializer_list<std::size_t> shape, nb::handle owner) {
  return nb::cast(nb::ndarray<nb::numpy, const T>(data, shape, owner));
}
template <class T>
nb::object view(const std::vector<T>& v, nb::handle owner) {
  return view(v.data(), {v.size()}, owner);
}

/// numpy, imported once (the reference is kept for the process: released at exit, after the
/// interpreter, it would crash).
inline nb::handle numpy() {
  static nb::handle np = nb::module_::import_("numpy").release();
  return np;
}

/// `obj` as a numpy array (no copy where numpy can view it: arrays, CPU tensors, buffers).
inline nb::object as_numpy(nb::handle obj) { return numpy().attr("asarray")(obj); }

/// The dtype name numpy gives `obj`, for messages.
inline std::string dtype_name(nb::handle arr) {
  return nb::cast<std::string>(nb::str(arr.attr("dtype")));
}

/// A one-dimensional integer array taken from a Python object: a view of its memory when it is
/// a contiguous array of T, else a converted copy. Throws TypeError naming `what` for values that
/// are not integers, ValueError for a wrong rank or values outside T.
template <class T>
class int_array {
 public:
  int_array(nb::handle obj, const char* what) {
    using nd = nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
    if (nb::try_cast(obj, arr_, false)) return;
    nb::object a;
    try {
      a = as_numpy(obj);
    } catch (nb::python_error&) {
      throw nb::type_error((std::string(what) + ": not an array of integers").c_str());
    }
    const std::string kind = nb::cast<std::string>(a.attr("dtype").attr("kind"));
    const auto ndim = nb::cast<std::size_t>(a.attr("ndim"));
    const bool empty = nb::cast<std::size_t>(a.attr("size")) == 0;  // [] is float64 to numpy
    if (ndim != 1) {
      throw nb::value_error((std::string(what) + ": " + std::to_string(ndim) +
                             "-dimensional, a 1-dimensional array of integers expected")
                                .c_str());
    }
    if (kind != "i" && kind != "u" && !empty) {
      throw nb::type_error(
          (std::string(what) + ": " + dtype_name(a) + " values, integers expected").c_str());
    }
    // Values outside T: numpy's checked cast refuses them rather than wrapping.
    const nb::object t = numpy().attr(std::is_same_v<T, std::int64_t> ? "int64" : "int32");
    if (!empty && !nb::cast<bool>(numpy().attr("can_cast")(a.attr("dtype"), t))) {
      const nb::object info = numpy().attr("iinfo")(t);
      const nb::object bad = numpy().attr("flatnonzero")(
          numpy().attr("logical_or")(a < info.attr("min"), a > info.attr("max")));
      if (nb::cast<std::size_t>(bad.attr("size")) > 0) {
        const auto k = nb::cast<std::size_t>(bad[0]);
        throw nb::value_error((std::string(what) + "[" + std::to_string(k) + "] = " +
                               nb::cast<std::string>(nb::str(a[nb::int_(k)])) + " does not fit " +
                               (std::is_same_v<T, std::int64_t> ? "int64" : "int32"))
                                  .c_str());
      }
    }
    keep_ = numpy().attr("ascontiguousarray")(a, "dtype"_a = t);
    arr_ = nb::cast<nd>(keep_);
  }

  const T* data() const noexcept { return arr_.data(); }
  std::size_t size() const noexcept { return arr_.shape(0); }
  prepack::span<const T> span() const noexcept { return {data(), size()}; }
  std::vector<T> vector() const { return {data(), data() + size()}; }

 private:
  nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu> arr_;
  nb::object keep_;
};

/// An optional integer array argument: empty when None.
template <class T>
std::vector<T> optional_ints(nb::handle obj, const char* what) {
  if (obj.is_none()) return {};
  return int_array<T>(obj, what).vector();
}

}  // namespace pp
