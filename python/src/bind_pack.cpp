// Plans, prompts, packed batches, masks and unpacking (prepack/plan.hpp, layout.hpp, mask.hpp,
// engine.hpp, unpack.hpp).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "bindings.hpp"

namespace pp {
namespace {

using plan64 = prepack::pack_plan<std::int64_t>;

// One Python sequence of token ids into `out`. Lists and tuples of ints are read with the C API
// (no per-token Python call); anything else as an integer array.
void read_prompt(nb::handle seq, std::size_t i, std::vector<std::int32_t>& out) {
  PyObject* o = seq.ptr();
  if (PyList_Check(o) || PyTuple_Check(o)) {
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
    PyObject** items = PySequence_Fast_ITEMS(o);
    out.resize(static_cast<std::size_t>(n));
    for (Py_ssize_t k = 0; k < n; ++k) {
      // Python ints directly; integer scalars of numpy and torch (np.int64(5), tensor(5))
      // through their __index__; bool, float and the rest refused.
      nb::object index;
      PyObject* item = items[k];
      if (!PyLong_Check(item) || PyBool_Check(item)) {
        if (!PyBool_Check(item) && !PyFloat_Check(item) && Py_TYPE(item)->tp_as_number != nullptr &&
            Py_TYPE(item)->tp_as_number->nb_index) {
          index = nb::steal(PyNumber_Index(item));
        }
        if (!index.is_valid()) {
          PyErr_Clear();
          throw nb::type_error(("prompt " + std::to_string(i) + ": token " + std::to_string(k) +
                                " = " + nb::cast<std::string>(nb::repr(item)) +
                                " is not an integer")
                                   .c_str());
        }
        item = index.ptr();
      }
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(item, &overflow);
      if (overflow != 0 || v < std::numeric_limits<std::int32_t>::min() ||
          v > std::numeric_limits<std::int32_t>::max()) {
        throw nb::value_error(("prompt " + std::to_string(i) + ": token " + std::to_string(k) +
                               " = " + nb::cast<std::string>(nb::repr(items[k])) +
                               " does not fit the int32 token type")
                                  .c_str());
      }
      out[static_cast<std::size_t>(k)] = static_cast<std::int32_t>(v);
    }
    return;
  }
  nb::ndarray<const std::int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> a32;
  if (nb::try_cast(seq, a32, false)) {
    out.assign(a32.data(), a32.data() + a32.shape(0));
    return;
  }
  const std::string what = "prompt " + std::to_string(i);
  const int_array<std::int64_t> a(seq, what.c_str());
  out.resize(a.size());
  for (std::size_t k = 0; k < a.size(); ++k) {
    const std::int64_t v = a.data()[k];
    if (v < std::numeric_limits<std::int32_t>::min() ||
        v > std::numeric_limits<std::int32_t>::max()) {
      throw nb::value_error((what + ": token " + std::to_string(k) + " = " + std::to_string(v) +
                             " does not fit the int32 token type")
                                .c_str());
    }
    out[k] = static_cast<std::int32_t>(v);
  }
}

prompts read_prompts(nb::handle obj) {
  if (nb::isinstance<nb::str>(obj) || nb::isinstance<nb::bytes>(obj)) {
    throw nb::type_error("prompts: a string, a sequence of token-id sequences expected");
  }
  prompts p;
  std::size_t i = 0;
  nb::iterator it;
  try {
    it = nb::iter(obj);
  } catch (nb::python_error&) {
    throw nb::type_error("prompts: not a sequence of token-id sequences");
  }
  for (nb::handle seq : it) {
    p.tokens.emplace_back();
    read_prompt(seq, i++, p.tokens.back());
  }
  return p;
}

plan64 plan_lengths(prepack::span<const std::int64_t> len, std::optional<std::int64_t> cap,
                    const std::string& method, const std::string& padding_side) {
  enum class kind { ffd, bfd, padded };
  const kind k = choose<kind>("method", method,
                              {{"ffd", kind::ffd},
                               {"first_fit_decreasing", kind::ffd},
                               {"bfd", kind::bfd},
                               {"best_fit_decreasing", kind::bfd},
                               {"padded", kind::padded}});
  if (k == kind::padded) {
    const auto side = choose<prepack::padding_side>(
        "padding_side", padding_side,
        {{"left", prepack::padding_side::left}, {"right", prepack::padding_side::right}});
    return prepack::padded(len, side, cap);
  }
  return prepack::make_plan(
      k == kind::bfd ? prepack::packer::best_fit_decreasing : prepack::packer::first_fit_decreasing,
      len, cap);
}

plan64 make_plan(array_like lengths, std::optional<std::int64_t> capacity,
                 const std::string& method, const std::string& padding_side) {
  const int_array<std::int64_t> len(lengths, "lengths");
  return plan_lengths(len.span(), capacity, method, padding_side);
}

// Fills `out` with the mask of kind `kind` ("additive": transformers' float convention; "bool":
// may attend, pad queries open to themselves), dispatching on its dtype.
void fill_mask(const layout64& l, nb::handle out_obj, const std::string& kind) {
  nb::ndarray<nb::c_contig, nb::device::cpu> out;
  if (!nb::try_cast(out_obj, out, false)) {
    throw nb::type_error(
        "mask: out must be a writable C-contiguous CPU array (numpy array, torch tensor)");
  }
  const std::size_t w = l.width(), rows = l.n_rows();
  const bool shape_ok =
      (out.ndim() == 4 && out.shape(0) == rows && out.shape(1) == 1 && out.shape(2) == w &&
       out.shape(3) == w) ||
      (out.ndim() == 3 && out.shape(0) == rows && out.shape(1) == w && out.shape(2) == w);
  if (!shape_ok) {
    std::string got;
    for (std::size_t d = 0; d < out.ndim(); ++d)
      got += (d ? ", " : "") + std::to_string(out.shape(d));
    throw nb::value_error(("mask: out has shape (" + got + "), the batch needs (" +
                           std::to_string(rows) + ", 1, " + std::to_string(w) + ", " +
                           std::to_string(w) + ")")
                              .c_str());
  }
  const auto dt = out.dtype();
  const std::size_t n = out.size();
  const bool additive = choose<bool>("kind", kind, {{"additive", true}, {"bool", false}});
  if (!additive) {
    if (dt != nb::dtype<bool>()) throw nb::type_error("mask: kind 'bool' needs a bool array");
    prepack::fill_dense_mask(l, prepack::span<bool>(static_cast<bool*>(out.data()), n), true, false,
                             prepack::pad_query::self);
    return;
  }
  if (dt == nb::dtype<float>()) {
    prepack::fill_transformers_mask(l, prepack::span<float>(static_cast<float*>(out.data()), n));
  } else if (dt == nb::dtype<double>()) {
    prepack::fill_transformers_mask(l, prepack::span<double>(static_cast<double*>(out.data()), n));
  } else if (dt.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float) && dt.bits == 16) {
    prepack::fill_transformers_mask(
        l, prepack::span<prepack::half>(static_cast<prepack::half*>(out.data()), n));
  } else if (dt.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat) &&
             dt.bits == 16) {
    prepack::fill_transformers_mask(
        l, prepack::span<prepack::bfloat16>(static_cast<prepack::bfloat16*>(out.data()), n));
  } else {
    throw nb::type_error(
        "mask: kind 'additive' needs a float32, float64, float16 or bfloat16 array");
  }
}

// The per-prompt copies of a per-slot array, bit for bit (same dtype: the copy moves elements
// of `U`'s size). src is (row, slot, head, dim) as `src_view` maps it.
template <class U>
void unpack_raw(const layout64& l, const nb::ndarray<nb::ro, nb::device::cpu>& src,
                std::vector<nb::ndarray<nb::device::cpu>>& dst, std::size_t axis) {
  const std::size_t r = src.ndim();
  prepack::tensor_view<const U, 4> s{static_cast<const U*>(src.data()), {}, {}};
  const auto st = [&](std::size_t d) { return static_cast<std::size_t>(src.stride(d)); };
  if (r == 2) {
    s.extent = {src.shape(0), src.shape(1), 1, 1};
    s.stride = {st(0), st(1), 0, 0};
  } else if (r == 3) {
    s.extent = {src.shape(0), src.shape(1), 1, src.shape(2)};
    s.stride = {st(0), st(1), 0, st(2)};
  } else if (axis == 1) {
    s.extent = {src.shape(0), src.shape(1), src.shape(2), src.shape(3)};
    s.stride = {st(0), st(1), st(2), st(3)};
  } else {
    s.extent = {src.shape(0), src.shape(2), src.shape(1), src.shape(3)};
    s.stride = {st(0), st(2), st(1), st(3)};
  }
  std::vector<prepack::tensor_view<U, 3>> views;
  views.reserve(dst.size());
  for (auto& d : dst) {
    prepack::tensor_view<U, 3> v{static_cast<U*>(d.data()), {}, {}};
    const auto ds = [&](std::size_t k) { return static_cast<std::size_t>(d.stride(k)); };
    if (r == 2) {
      v.extent = {d.shape(0), 1, 1};
      v.stride = {ds(0), 0, 0};
    } else if (r == 3) {
      v.extent = {d.shape(0), 1, d.shape(1)};
      v.stride = {ds(0), 0, ds(1)};
    } else if (axis == 1) {
      v.extent = {d.shape(0), d.shape(1), d.shape(2)};
      v.stride = {ds(0), ds(1), ds(2)};
    } else {
      v.extent = {d.shape(1), d.shape(0), d.shape(2)};
      v.stride = {ds(1), ds(0), ds(2)};
    }
    views.push_back(v);
  }
  prepack::unpack_prompts(l, s, prepack::span<const prepack::tensor_view<U, 3>>(views));
}

nb::list unpack(const layout64& l, nb::handle values, std::size_t axis) {
  nb::ndarray<nb::ro, nb::device::cpu> src;
  nb::object keep;  // a converted copy, when `values` is not an array already
  if (!nb::try_cast(values, src, false)) {
    keep = as_numpy(values);
    src = nb::cast<nb::ndarray<nb::ro, nb::device::cpu>>(keep);
  }
  const std::size_t r = src.ndim();
  if (r < 2 || r > 4) {
    throw nb::value_error(("unpack: a " + std::to_string(r) +
                           "-dimensional array; (rows, width), (rows, width, features), (rows, "
                           "width, heads, dim) or (rows, heads, width, dim) expected")
                              .c_str());
  }
  if (axis != 1 && !(axis == 2 && r == 4)) {
    throw nb::value_error(("unpack: axis " + std::to_string(axis) +
                           " (the slot axis is 1, or 2 for (rows, heads, width, dim))")
                              .c_str());
  }
  if (src.shape(0) != l.n_rows() || src.shape(axis) != l.width()) {
    throw nb::value_error(("unpack: " + std::to_string(src.shape(0)) + " rows x " +
                           std::to_string(src.shape(axis)) + " slots, the batch has " +
                           std::to_string(l.n_rows()) + " x " + std::to_string(l.width()))
                              .c_str());
  }
  // Destinations in the source's own framework: torch tensors for a tensor, else numpy.
  nb::object alloc;
  const bool torch_like = nb::hasattr(values, "new_empty");
  if (!torch_like) alloc = numpy().attr("empty");
  nb::list out;
  std::vector<nb::ndarray<nb::device::cpu>> dst;
  for (std::size_t i = 0; i < l.n_prompts(); ++i) {
    const auto len = static_cast<std::size_t>(l.prompt_length()[i]);
    nb::list shape;
    for (std::size_t d = 1; d < r; ++d) shape.append(d == axis ? len : src.shape(d));
    nb::object a = torch_like ? values.attr("new_empty")(nb::tuple(shape))
                              : alloc(nb::tuple(shape), "dtype"_a = as_numpy(values).attr("dtype"));
    dst.push_back(nb::cast<nb::ndarray<nb::device::cpu>>(a));
    out.append(a);
  }
  // A shifted view: unpack_prompts writes token t of a chunk at position context + t.
  const layout64* lp = &l;
  layout64 shifted;
  bool chunks = false;
  for (std::size_t i = 0; i < l.n_prompts(); ++i) chunks = chunks || l.prompt_context()[i] != 0;
  if (chunks) {
    auto parts = l.parts();
    for (auto& c : parts.prompt_context) c = 0;
    for (std::size_t i = 0; i < l.n_prompts(); ++i) {
      const std::size_t first = l.first_slot(i);
      for (std::int64_t t = 0; t < l.prompt_length()[i]; ++t) {
        parts.positions[first + static_cast<std::size_t>(t)] = t;
      }
    }
    shifted = layout64::from_parts(std::move(parts));
    lp = &shifted;
  }
  switch (src.itemsize()) {
    case 1:
      unpack_raw<std::uint8_t>(*lp, src, dst, axis);
      break;
    case 2:
      unpack_raw<std::uint16_t>(*lp, src, dst, axis);
      break;
    case 4:
      unpack_raw<std::uint32_t>(*lp, src, dst, axis);
      break;
    case 8:
      unpack_raw<std::uint64_t>(*lp, src, dst, axis);
      break;
    default:
      throw nb::type_error("unpack: elements of 1, 2, 4 or 8 bytes expected");
  }
  return out;
}

nb::dict varlen_dict(const layout64& l) {
  auto v = prepack::make_varlen(l);
  std::vector<std::int32_t> cu;
  cu.reserve(v.cu_seqlens.size());
  for (std::int64_t c : v.cu_seqlens) {
    cu.push_back(prepack::detail::narrow<std::int32_t>(c, "cu_seqlens entry"));
  }
  nb::dict d;
  d["cu_seqlens"] = to_numpy(std::move(cu));
  d["max_seqlen"] = v.max_seqlen;
  d["seq_prompt"] = to_numpy(std::move(v.seq_prompt));
  d["slot"] = to_numpy(std::move(v.slot));
  d["input_ids"] = to_numpy(std::move(v.tokens));
  d["position_ids"] = to_numpy(std::move(v.positions));
  return d;
}

}  // namespace

const prompts& as_prompts(nb::handle obj, prompts& storage) {
  if (nb::isinstance<prompts>(obj)) return nb::cast<const prompts&>(obj);
  storage = read_prompts(obj);
  return storage;
}

void bind_pack(nb::module_& m) {
  nb::class_<prompts>(m, "Prompts",
                      "Prompts held as prepack's C++ takes them (int32 token ids, one array per "
                      "prompt): convert a list once, then pass it to pack, step_inputs and the "
                      "engine forms without converting again.")
      .def(
          "__init__",
          [](prompts* self, prompts_like seqs) { new (self) prompts(read_prompts(seqs)); },
          "prompts"_a,
          "prompts: a sequence of token-id sequences (lists, tuples, numpy arrays, torch "
          "tensors). TypeError for a token that is not an integer, ValueError for one outside "
          "int32, both naming the prompt and token.")
      .def_static(
          "from_flat",
          [](array_like tokens, array_like lengths) {
            const int_array<std::int64_t> t(tokens, "tokens");
            const int_array<std::int64_t> len(lengths, "lengths");
            prompts p;
            std::size_t at = 0;
            for (std::size_t i = 0; i < len.size(); ++i) {
              const std::int64_t n = len.data()[i];
              if (n < 0 || static_cast<std::size_t>(n) > t.size() - at) {
                throw nb::value_error(("prompt " + std::to_string(i) + ": length " +
                                       std::to_string(n) + " runs past the " +
                                       std::to_string(t.size()) + " tokens")
                                          .c_str());
              }
              auto& out = p.tokens.emplace_back();
              for (std::int64_t k = 0; k < n; ++k) {
                out.push_back(
                    prepack::detail::narrow<std::int32_t>(t.data()[at++], "token", "token"));
              }
            }
            if (at != t.size()) {
              throw nb::value_error(("lengths: they sum to " + std::to_string(at) + ", " +
                                     std::to_string(t.size()) + " tokens given")
                                        .c_str());
            }
            return p;
          },
          "tokens"_a, "lengths"_a,
          "Prompts from every prompt's tokens concatenated ([sum(lengths)] integers) and the "
          "lengths ([n_prompts]).")
      .def("__len__", [](const prompts& p) { return p.tokens.size(); })
      .def(
          "__getitem__",
          [](const prompts& p, std::int64_t i) {
            const auto n = static_cast<std::int64_t>(p.tokens.size());
            if (i < 0) i += n;
            if (i < 0 || i >= n) throw nb::index_error("prompt index out of range");
            return to_numpy(std::vector<std::int32_t>(p.tokens[static_cast<std::size_t>(i)]));
          },
          "Prompt i's tokens: [length] int32 (a copy).")
      .def_prop_ro(
          "lengths",
          [](const prompts& p) {
            std::vector<std::int64_t> len;
            for (const auto& t : p.tokens) len.push_back(static_cast<std::int64_t>(t.size()));
            return to_numpy(std::move(len));
          },
          nb::rv_policy::automatic, "[n_prompts] int64: each prompt's tokens.")
      .def_prop_ro("total_tokens", &prompts::total)
      .def(
          "flat",
          [](const prompts& p) {
            std::vector<std::int32_t> tokens;
            tokens.reserve(p.total());
            std::vector<std::int64_t> len;
            len.reserve(p.tokens.size());
            for (const auto& t : p.tokens) {
              tokens.insert(tokens.end(), t.begin(), t.end());
              len.push_back(static_cast<std::int64_t>(t.size()));
            }
            return nb::make_tuple(to_numpy(std::move(tokens)), to_numpy(std::move(len)));
          },
          "(tokens [total_tokens] int32, lengths [n_prompts] int64): every prompt's tokens "
          "concatenated and the lengths, what from_flat takes back. O(tokens).")
      .def(
          "check_vocabulary",
          [](const prompts& p, long long vocab_size) {
            if (vocab_size <= 0) {
              throw nb::value_error(
                  ("vocab_size " + std::to_string(vocab_size) + " (at least 1)").c_str());
            }
            for (std::size_t i = 0; i < p.tokens.size(); ++i) {
              const auto& t = p.tokens[i];
              for (std::size_t k = 0; k < t.size(); ++k) {
                if (t[k] < 0 || t[k] >= vocab_size) {
                  throw nb::value_error(("prompt " + std::to_string(i) + ": token " +
                                         std::to_string(t[k]) + " at position " +
                                         std::to_string(k) + " is outside the vocabulary (" +
                                         std::to_string(vocab_size) + ")")
                                            .c_str());
                }
              }
            }
          },
          "vocab_size"_a,
          "Checks every token id against a vocabulary of vocab_size ids, 0 .. vocab_size - 1: "
          "ValueError naming the first token outside it (\"prompt 3: token 51234 at position "
          "17 is outside the vocabulary (32000)\"), or for vocab_size < 1. O(tokens).")
      .def("__repr__", [](const prompts& p) {
        return "Prompts(" + std::to_string(p.tokens.size()) + " prompts, " +
               std::to_string(p.total()) + " tokens)";
      });

  nb::class_<plan64>(m, "Plan",
                     "Where each prompt goes: a row and an offset in it (prepack::pack_plan). "
                     "Arrays are read-only views.")
      .def_ro("capacity", &plan64::capacity, "Slots per row (the width of every row).")
      .def_prop_ro("n_prompts", &plan64::n_prompts)
      .def_prop_ro("n_rows", &plan64::n_rows)
      .def_prop_ro("useful_tokens", &plan64::useful_tokens, "The sum of the lengths.")
      .def_prop_ro("slots", &plan64::slots, "n_rows * capacity: the slots a prefill computes.")
      .def_prop_ro(
          "length", [](nb::handle s) { return view(nb::cast<const plan64&>(s).length, s); },
          "[n_prompts] int64: tokens of prompt i.")
      .def_prop_ro(
          "row", [](nb::handle s) { return view(nb::cast<const plan64&>(s).row, s); },
          "[n_prompts] int64: the row holding prompt i.")
      .def_prop_ro(
          "offset", [](nb::handle s) { return view(nb::cast<const plan64&>(s).offset, s); },
          "[n_prompts] int64: prompt i's first slot in its row.")
      .def_prop_ro(
          "fill", [](nb::handle s) { return view(nb::cast<const plan64&>(s).fill, s); },
          "[n_rows] int64: tokens used in row r.")
      .def_prop_ro(
          "row_begin", [](nb::handle s) { return view(nb::cast<const plan64&>(s).row_begin, s); },
          "[n_rows + 1] int64: row r holds row_prompts[row_begin[r]:row_begin[r + 1]].")
      .def_prop_ro(
          "row_prompts",
          [](nb::handle s) { return view(nb::cast<const plan64&>(s).row_prompts, s); },
          "[n_prompts] int64: prompt ids row by row, in slot order.")
      .def("__repr__", [](const plan64& p) {
        return "Plan(" + std::to_string(p.n_prompts()) + " prompts in " +
               std::to_string(p.n_rows()) + " rows of " + std::to_string(p.capacity) + ")";
      });

  m.def("plan", &make_plan, "lengths"_a, "capacity"_a = nb::none(), "method"_a = "ffd",
        "padding_side"_a = "left",
        "Packs prompts of the given lengths ([n_prompts] integers) into rows of `capacity` "
        "slots (default: the longest prompt). method: 'ffd' (first-fit-decreasing, the "
        "paper's), 'bfd' (best-fit-decreasing) or 'padded' (one prompt a row, pads on "
        "padding_side 'left' as Hugging Face pads for generation, or 'right'). O(n log n). "
        "ValueError for no prompts, a length <= 0, a capacity <= 0 or below a prompt "
        "(\"prompt 7: length 0\").");

  m.def(
      "fitted_plan",
      [](array_like lengths, double max_pad, std::optional<unsigned long long> max_capacity,
         const std::string& method, std::optional<std::size_t> max_packings) {
        const int_array<std::int64_t> len(lengths, "lengths");
        prepack::fit_options opt;
        opt.max_pad = max_pad;
        opt.max_capacity = max_capacity;
        const auto kind = choose<prepack::packer>(
            "method", method,
            {{"ffd", prepack::packer::first_fit_decreasing},
             {"first_fit_decreasing", prepack::packer::first_fit_decreasing},
             {"bfd", prepack::packer::best_fit_decreasing},
             {"best_fit_decreasing", prepack::packer::best_fit_decreasing}});
        return prepack::fitted_plan(kind, len.span(), opt, max_packings);
      },
      "lengths"_a, "max_pad"_a = 0.05, "max_capacity"_a = nb::none(), "method"_a = "ffd",
      "max_packings"_a = nb::none(),
      "Rows as narrow as possible while pad slots stay at most max_pad * useful tokens "
      "(prepack::fitted_plan): the paper's rows when they meet it, else the narrowest wider "
      "rows that do (at most max_capacity). ValueError as plan(), and past max_packings.");

  nb::class_<packed_batch>(
      m, "PackedBatch",
      "Prompts packed into rows (prepack::packed_layout): token, position and segment ids as "
      "[n_rows, width] int64 arrays (read-only views), each prompt's row, offset and last "
      "token, varlen metadata and masks. Pad slots hold pad_id, segment -1.")
      .def_prop_ro("n_rows", [](const packed_batch& b) { return b.layout.n_rows(); })
      .def_prop_ro("width", [](const packed_batch& b) { return b.layout.width(); })
      .def_prop_ro("n_prompts", [](const packed_batch& b) { return b.layout.n_prompts(); })
      .def_prop_ro("n_slots", [](const packed_batch& b) { return b.layout.n_slots(); })
      .def_prop_ro("useful_tokens", [](const packed_batch& b) { return b.layout.useful_tokens(); })
      .def_prop_ro(
          "input_ids",
          [](nb::handle s) {
            const auto& l = nb::cast<const packed_batch&>(s).layout;
            return view(l.tokens().data(), {l.n_rows(), l.width()}, s);
          },
          "[n_rows, width] int64: token ids, pad_id on pad slots.")
      .def_prop_ro(
          "position_ids",
          [](nb::handle s) {
            const auto& l = nb::cast<const packed_batch&>(s).layout;
            return view(l.positions().data(), {l.n_rows(), l.width()}, s);
          },
          "[n_rows, width] int64: positions, restarting at 0 for each prompt (at its context "
          "for a chunk); pad_position on pad slots.")
      .def_prop_ro(
          "segment_ids",
          [](nb::handle s) {
            const auto& l = nb::cast<const packed_batch&>(s).layout;
            return view(l.segments().data(), {l.n_rows(), l.width()}, s);
          },
          "[n_rows, width] int64: the prompt of each slot, -1 on pad slots.")
      .def_prop_ro(
          "prompt_row",
          [](nb::handle s) {
            const auto& l = nb::cast<const packed_batch&>(s).layout;
            return view(l.prompt_row().data(), {l.n_prompts()}, s);
          },
          "[n_prompts] int64: the row of prompt i.")
      .def_prop_ro(
          "prompt_offset",
          [](nb::handle s) {
            const auto& l = nb::cast<const packed_batch&>(s).layout;
            return view(l.prompt_offset().data(), {l.n_prompts()}, s);
          },
          "[n_prompts] int64: prompt i's first slot in its row.")
      .def_prop_ro(
          "prompt_length",
          [](nb::handle s) {
            const auto& l = nb::cast<const packed_batch&>(s).layout;
            return view(l.prompt_length().data(), {l.n_prompts()}, s);
          },
          "[n_prompts] int64: prompt i's tokens in this batch.")
      .def_prop_ro(
          "prompt_context",
          [](nb::handle s) {
            const auto& l = nb::cast<const packed_batch&>(s).layout;
            return view(l.prompt_context().data(), {l.n_prompts()}, s);
          },
          "[n_prompts] int64: tokens of prompt i already cached (0 for a whole prompt).")
      .def_prop_ro(
          "last_token",
          [](nb::handle s) {
            const auto& l = nb::cast<const packed_batch&>(s).layout;
            return view(l.last_token().data(), {l.n_prompts()}, s);
          },
          "[n_prompts] int64: the flat slot (row * width + offset) of prompt i's last token: "
          "hidden.reshape(n_rows * width, -1)[last_token] is each prompt's last row.")
      .def_prop_ro(
          "row_prompts",
          [](nb::handle s) {
            const auto& l = nb::cast<const packed_batch&>(s).layout;
            return view(l.row_prompts().data(), {l.n_prompts()}, s);
          },
          "[n_prompts] int64: prompt ids row by row, in slot order.")
      .def_prop_ro(
          "row_begin",
          [](nb::handle s) {
            const auto& l = nb::cast<const packed_batch&>(s).layout;
            return view(l.row_begin().data(), {l.n_rows() + 1}, s);
          },
          "[n_rows + 1] int64: row r holds row_prompts[row_begin[r]:row_begin[r + 1]].")
      .def(
          "row_cu_seqlens",
          [](nb::handle s, count r_in) {
            const std::size_t r = r_in("row");
            const auto& l = nb::cast<const packed_batch&>(s).layout;
            if (r >= l.n_rows()) throw nb::index_error("row out of range");
            const auto cu = l.row_cu(r);
            return view(cu.data(), {cu.size()}, s);
          },
          "row"_a,
          "[prompts in the row + 1] int64: the row's cu_seqlens in its own slots: where its "
          "first prompt starts, then where each ends (FlashAttention's varlen form of one row).")
      .def(
          "varlen", [](const packed_batch& b) { return varlen_dict(b.layout); },
          "The real tokens of every row as one flat variable-length batch "
          "(flash_attn_varlen_func): cu_seqlens [n_prompts + 1] int32, max_seqlen int, "
          "seq_prompt [n_prompts] int64 (prompt of sequence s, in row-major slot order), slot "
          "[n_tokens] int64 (each token's flat slot: a gather index), input_ids and "
          "position_ids [n_tokens] int64. O(slots).")
      .def(
          "token_batch",
          [](const packed_batch& b, optional_array_like seq_ids) {
            auto t = seq_ids.is_none()
                         ? prepack::make_token_batch(b.layout)
                         : prepack::make_token_batch(
                               b.layout, int_array<std::int64_t>(seq_ids, "seq_ids").vector());
            nb::dict d;
            d["token"] = to_numpy(std::move(t.token));
            d["pos"] = to_numpy(std::move(t.pos));
            d["seq_id"] = to_numpy(std::move(t.seq_id));
            d["logits"] = to_numpy(std::move(t.logits));
            return d;
          },
          "seq_ids"_a = nb::none(),
          "Per-token arrays as llama.cpp's llama_batch takes them: token, pos, seq_id "
          "[n_tokens] int64 (seq_id: the prompt's index, or seq_ids[prompt]) and logits "
          "[n_tokens] int8 (1 on each prompt's last token). ValueError for a seq_ids count "
          "other than n_prompts.")
      .def(
          "fill_mask",
          [](const packed_batch& b, array_like out, const std::string& kind) {
            fill_mask(b.layout, out, kind);
          },
          "out"_a, "kind"_a = "additive",
          "Writes the block-diagonal causal mask into `out`, a C-contiguous CPU array or "
          "tensor of shape [n_rows, 1, width, width] (or [n_rows, width, width]), as "
          "transformers reads a 4D attention_mask: kind 'additive' (float32, float64, float16 "
          "or bfloat16: 0 where a query may attend, the dtype's lowest finite value elsewhere) "
          "or 'bool' (True where it may attend). Every pad query attends to its own slot, so "
          "no softmax row is empty (eager attention would give NaN there); real queries never "
          "attend a pad slot. O(n_rows width^2).")
      .def(
          "mask",
          [](const packed_batch& b, nb::handle dtype, const std::string& kind) {
            const auto& l = b.layout;
            nb::object out = numpy().attr("empty")(
                nb::make_tuple(l.n_rows(), 1, l.width(), l.width()),
                "dtype"_a = kind == "bool" && dtype.is_none() ? numpy().attr("bool_")
                            : dtype.is_none()                 ? numpy().attr("float32")
                                                              : nb::borrow(dtype));
            fill_mask(l, out, kind);
            return out;
          },
          "dtype"_a = nb::none(), "kind"_a = "additive",
          "The mask fill_mask writes, as a new numpy array [n_rows, 1, width, width] "
          "(float32 by default, bool for kind 'bool'). For bfloat16 (no numpy dtype) fill a "
          "torch tensor with fill_mask.")
      .def(
          "unpack",
          [](const packed_batch& b, array_like values, count axis_in) {
            const std::size_t axis = axis_in("axis");
            return unpack(b.layout, values, axis);
          },
          "values"_a, "axis"_a = 1,
          "Scatters a per-slot array back to the prompts: `values` is (n_rows, width), "
          "(n_rows, width, features), (n_rows, width, heads, dim), or with axis=2 (n_rows, "
          "heads, width, dim) (transformers' past_key_values); any dtype and strides. Returns "
          "one new array per prompt, in the same framework (torch tensors for a tensor), its "
          "slot axis as long as the prompt: (length,), (length, features), (length, heads, "
          "dim) or (heads, length, dim). O(tokens x features).")
      .def(
          "left_padded_slots",
          [](const packed_batch& b, std::optional<std::int64_t> columns) {
            const auto& l = b.layout;
            std::int64_t longest = 0;
            for (std::int64_t len : l.prompt_length()) longest = std::max(longest, len);
            const std::int64_t c = columns.value_or(longest);
            if (c < 0) {
              throw nb::value_error(("columns " + std::to_string(c) + " (at least 0)").c_str());
            }
            return to_numpy(prepack::left_padded_slots(l, static_cast<std::size_t>(c)),
                            {l.n_prompts(), static_cast<std::size_t>(c)});
          },
          "columns"_a = nb::none(),
          "[n_prompts, columns] int64: where each column of a left-padded decode batch comes "
          "from, as a flat slot (row * width + offset + t) of the packed rows: prompt i's token "
          "t at column columns - length_i + t, -1 on the pad columns before it (columns: default "
          "the longest prompt). With the rows' K of one layer viewed as [n_rows * width, ...], "
          "one index_select on the model's device builds the batch's cache of that layer. "
          "ValueError for a prompt longer than columns. O(n_prompts * columns).")
      .def(
          "prompt_slots",
          [](const packed_batch& b, std::optional<std::int64_t> last) {
            if (last && *last < 0) {
              throw nb::value_error(("last " + std::to_string(*last) + " (at least 0)").c_str());
            }
            return to_numpy(last ? prepack::prompt_slots(b.layout, static_cast<std::size_t>(*last))
                                 : prepack::prompt_slots(b.layout));
          },
          "last"_a = nb::none(),
          "[sum_i min(length_i, last)] int64: the flat slots of every prompt's last `last` "
          "tokens (default: all), prompt after prompt, each in token order: the gather index of "
          "per-prompt caches (a sliding-window layer keeps last = window - 1). O(tokens).")
      .def(
          "block_mask",
          [](const packed_batch& b, std::int64_t block_size, std::int64_t window) {
            if (block_size < 1) {
              throw nb::value_error(
                  ("block_size " + std::to_string(block_size) + " (at least 1)").c_str());
            }
            if (window < 0) {
              throw nb::value_error(
                  ("window " + std::to_string(window) + " (0 for none, or at least 1)").c_str());
            }
            auto bm = prepack::make_block_sparse_mask(
                b.layout, static_cast<std::size_t>(block_size), static_cast<std::size_t>(window));
            const std::size_t r = bm.n_rows, n = bm.n_blocks;
            nb::dict d;
            d["block_size"] = bm.block_size;
            d["kv_num_blocks"] = to_numpy(std::move(bm.kv_num_blocks), {r, n});
            d["kv_indices"] = to_numpy(std::move(bm.kv_indices), {r, n, n});
            d["full_kv_num_blocks"] = to_numpy(std::move(bm.full_kv_num_blocks), {r, n});
            d["full_kv_indices"] = to_numpy(std::move(bm.full_kv_indices), {r, n, n});
            return d;
          },
          "block_size"_a = 128, "window"_a = 0,
          "The block-diagonal causal mask in FlexAttention's block-sparse form, the arrays "
          "torch's BlockMask.from_kv_blocks takes (add the head axis): per row and query block "
          "of block_size slots, the key blocks the mask opens in part (kv_num_blocks [n_rows, "
          "n_blocks] int32, kv_indices [n_rows, n_blocks, n_blocks] int32) and in full "
          "(full_kv_num_blocks, full_kv_indices), n_blocks = ceil(width / block_size). window > "
          "0: a query attends keys less than window slots back (a sliding-window layer). Pad "
          "queries attend their own slot. O(n_rows * n_blocks^2): never width^2.")
      .def("__repr__", [](const packed_batch& b) {
        return "PackedBatch(" + std::to_string(b.layout.n_prompts()) + " prompts in " +
               std::to_string(b.layout.n_rows()) + " rows of " + std::to_string(b.layout.width()) +
               ", " + std::to_string(b.layout.useful_tokens()) + " tokens)";
      });

  m.def(
      "pack",
      [](prompts_like prompts_obj, optional_array_like lengths,
         std::optional<std::int64_t> capacity, const std::string& method,
         std::optional<plan64> plan, long long pad_id, long long pad_position) {
        const prepack::layout_options opt{pad_id, pad_position};
        packed_batch b;
        if (!lengths.is_none()) {
          // Flat tokens and lengths: the tokens are read in place when they are int32 or int64.
          const plan64 p = plan ? std::move(*plan) : make_plan(lengths, capacity, method, "left");
          nb::ndarray<const std::int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> t32;
          if (nb::try_cast(prompts_obj.obj, t32, false)) {
            b.layout = prepack::make_layout<std::int64_t, std::int64_t>(
                p, prepack::span<const std::int32_t>(t32.data(), t32.shape(0)), opt);
          } else {
            const int_array<std::int64_t> t(prompts_obj, "tokens");
            b.layout = prepack::make_layout<std::int64_t, std::int64_t>(p, t.span(), opt);
          }
          return b;
        }
        prompts storage;
        const prompts& ps = as_prompts(prompts_obj, storage);
        std::vector<std::int64_t> len;
        len.reserve(ps.tokens.size());
        for (const auto& t : ps.tokens) len.push_back(static_cast<std::int64_t>(t.size()));
        plan64 p;
        if (plan) {
          p = std::move(*plan);
        } else {
          p = plan_lengths(len, capacity, method, "left");
        }
        b.layout = prepack::make_layout<std::int64_t, std::int64_t>(p, ps.tokens, opt);
        return b;
      },
      "prompts"_a, "lengths"_a = nb::none(), "capacity"_a = nb::none(), "method"_a = "ffd",
      "plan"_a = nb::none(), "pad_id"_a = 0, "pad_position"_a = 0,
      "Packs prompts into rows: `prompts` is a sequence of token-id sequences (or Prompts), or "
      "with `lengths` every prompt's tokens concatenated (a 1-D integer array, read in place "
      "when int32 or int64). The plan is plan(lengths, capacity, method) unless `plan` is "
      "given. Returns a PackedBatch. O(slots). ValueError as plan() does, and for tokens that "
      "do not match the lengths (\"prompt 2: 3 tokens, the plan says length 4\").");
}

}  // namespace pp
