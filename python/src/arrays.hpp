// Arrays across the boundary: C++ vectors handed to numpy without a copy, and integer arrays
// taken from anything array-like (numpy, torch, DLPack, the buffer protocol, lists) without a
// copy where they already are contiguous and of the type asked for.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "prepack/error.hpp"
#include "prepack/span.hpp"

namespace pp {

namespace nb = nanobind;
using namespace nb::literals;

/// The element type Python sees for a C++ element type: sizes and indices held as size_t
/// (always below 2^63) are shown as int64, the type torch.from_numpy and every index API take;
/// the signed type of an unsigned one may alias it, so no copy is made.
template <class T>
using exposed_t = std::conditional_t<std::is_same_v<T, std::size_t>, std::int64_t, T>;

/// A numpy array that owns `v` (moved onto the heap, freed with the array): no copy.
template <class T>
nb::ndarray<nb::numpy, exposed_t<T>> to_numpy(std::vector<T>&& v,
                                              std::initializer_list<std::size_t> shape) {
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, exposed_t<T>>(reinterpret_cast<exposed_t<T>*>(heap->data()), shape,
                                              owner);
}
template <class T>
nb::ndarray<nb::numpy, exposed_t<T>> to_numpy(std::vector<T>&& v) {
  const std::size_t n = v.size();
  return to_numpy(std::move(v), {n});
}
/// 0 / 1 bytes as a numpy bool array, no copy.
inline nb::ndarray<nb::numpy, bool> to_numpy_bool(std::vector<std::uint8_t>&& v) {
  auto* heap = new std::vector<std::uint8_t>(std::move(v));
  nb::capsule owner(heap,
                    [](void* p) noexcept { delete static_cast<std::vector<std::uint8_t>*>(p); });
  return nb::ndarray<nb::numpy, bool>(heap->data(), {heap->size()}, owner);
}

/// A read-only numpy view of memory that `owner` (a Python object) keeps alive.
template <class T>
nb::ndarray<nb::numpy, const exposed_t<T>> view(const T* data,
                                                std::initializer_list<std::size_t> shape,
                                                nb::handle owner) {
  return nb::ndarray<nb::numpy, const exposed_t<T>>(reinterpret_cast<const exposed_t<T>*>(data),
                                                    shape, owner);
}
template <class T>
nb::ndarray<nb::numpy, const exposed_t<T>> view(const std::vector<T>& v, nb::handle owner) {
  return view(v.data(), {v.size()}, owner);
}

/// An argument that takes anything array-like (numpy arrays, torch tensors, DLPack, the
/// buffer protocol, __array__, lists), typed as numpy.typing.ArrayLike in the stubs.
struct array_like {
  nb::object obj;
  operator nb::handle() const noexcept { return obj; }  // NOLINT: used where a handle is
  bool is_none() const noexcept { return obj.is_none(); }
  template <class N>
  auto attr(N name) const {
    return obj.attr(name);
  }
};
/// The same, where None is allowed too.
struct optional_array_like : array_like {};
/// Prompts: a Prompts object or a sequence of token-id sequences.
struct prompts_like : array_like {};

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
  return nb::cast<std::string>(arr.attr("dtype").attr("name"));
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
    if (kind != "i" && kind != "u" && !empty) {
      throw nb::type_error(
          (std::string(what) + ": " + dtype_name(a) + " values, integers expected").c_str());
    }
    if (ndim != 1) {
      throw nb::value_error((std::string(what) + ": " + std::to_string(ndim) +
                             "-dimensional, a 1-dimensional array of integers expected")
                                .c_str());
    }
    // Values outside T: numpy's checked cast refuses them rather than wrapping.
    const nb::object t = numpy().attr(std::is_same_v<T, std::int64_t> ? "int64" : "int32");
    if (!empty && !nb::cast<bool>(numpy().attr("can_cast")(a.attr("dtype"), t))) {
      const nb::object info = numpy().attr("iinfo")(t);
      const nb::object bad = numpy().attr("flatnonzero")(numpy().attr("logical_or")(
          numpy().attr("less")(a, info.attr("min")), numpy().attr("greater")(a, info.attr("max"))));
      if (nb::cast<std::size_t>(bad.attr("size")) > 0) {
        const auto k = nb::cast<std::size_t>(bad[0].attr("item")());
        throw nb::value_error(
            (std::string(what) + "[" + std::to_string(k) +
             "] = " + nb::cast<std::string>(nb::repr(a[nb::int_(k)].attr("item")())) +
             " does not fit " + (std::is_same_v<T, std::int64_t> ? "int64" : "int32"))
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

/// A count or size argument: any Python integer (int, or a numpy or torch integer), checked
/// where the binding names it: count("budget") is its value, or ValueError "budget -1 (a
/// count, at least 0)" for a negative one, where nanobind's own size_t argument would give a
/// TypeError that names neither.
struct count {
  long long v = 0;
  std::size_t operator()(const char* name) const {
    if (v < 0) {
      throw nb::value_error(
          (std::string(name) + " " + std::to_string(v) + " (a count, at least 0)").c_str());
    }
    return static_cast<std::size_t>(v);
  }
};

/// An optional integer array argument: empty when None.
template <class T>
std::vector<T> optional_ints(nb::handle obj, const char* what) {
  if (obj.is_none()) return {};
  return int_array<T>(obj, what).vector();
}

}  // namespace pp

namespace nanobind::detail {
template <>
struct type_caster<pp::array_like> {
  NB_TYPE_CASTER(pp::array_like, const_name("numpy.typing.ArrayLike"))
  bool from_python(handle src, uint8_t, cleanup_list*) noexcept {
    value.obj = borrow(src);
    return true;
  }
  static handle from_cpp(const pp::array_like& v, rv_policy, cleanup_list*) noexcept {
    return v.obj.inc_ref();
  }
};
template <>
struct type_caster<pp::optional_array_like> {
  NB_TYPE_CASTER(pp::optional_array_like, const_name("numpy.typing.ArrayLike | None"))
  bool from_python(handle src, uint8_t, cleanup_list*) noexcept {
    value.obj = borrow(src);
    return true;
  }
  static handle from_cpp(const pp::optional_array_like& v, rv_policy, cleanup_list*) noexcept {
    return v.obj.inc_ref();
  }
};
template <>
struct type_caster<pp::count> {
  NB_TYPE_CASTER(pp::count, const_name("int"))
  bool from_python(handle src, uint8_t, cleanup_list*) noexcept {
    if (PyBool_Check(src.ptr()) || PyFloat_Check(src.ptr())) return false;
    PyObject* i = PyNumber_Index(src.ptr());
    if (i == nullptr) {
      PyErr_Clear();
      return false;
    }
    int overflow = 0;
    value.v = PyLong_AsLongLongAndOverflow(i, &overflow);
    Py_DECREF(i);
    if (overflow < 0) value.v = std::numeric_limits<long long>::min();
    return overflow <= 0;
  }
  static handle from_cpp(const pp::count& c, rv_policy, cleanup_list*) noexcept {
    return PyLong_FromLongLong(c.v);
  }
};
template <>
struct type_caster<pp::prompts_like> {
  NB_TYPE_CASTER(
      pp::prompts_like,
      const_name("prepack._prepack.Prompts | collections.abc.Sequence[numpy.typing.ArrayLike]"))
  bool from_python(handle src, uint8_t, cleanup_list*) noexcept {
    value.obj = borrow(src);
    return true;
  }
  static handle from_cpp(const pp::prompts_like& v, rv_policy, cleanup_list*) noexcept {
    return v.obj.inc_ref();
  }
};
}  // namespace nanobind::detail
