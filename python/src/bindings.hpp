// prepack's Python module (_prepack): what the binding files share. The logic is prepack's C++
// headers; these files only carry arrays across (arrays.hpp) and name things as Python does.
#pragma once

#include <nanobind/nanobind.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "prepack/prepack.hpp"

namespace pp {

/// Prompts as prepack's C++ takes them: one token vector per prompt (int32 token ids, as every
/// engine's vocabulary fits). Built once from Python sequences, then passed by reference.
struct prompts {
  std::vector<std::vector<std::int32_t>> tokens;

  std::size_t total() const noexcept {
    std::size_t n = 0;
    for (const auto& p : tokens) n += p.size();
    return n;
  }
};

/// A list of sequences (lists, tuples, arrays, tensors) or a `Prompts`, as prompts; `what`
/// names them in messages ("prompt 3: token 5 = 'x' is not an integer").
const prompts& as_prompts(nb::handle obj, prompts& storage);

/// A packed batch (int64 token and position ids, as transformers takes them).
using layout64 = prepack::packed_layout<std::int64_t, std::int64_t>;
struct packed_batch {
  layout64 layout;
};

using step_inputs32 = prepack::step_inputs<std::int32_t, std::int32_t>;
struct step_inputs_box {
  step_inputs32 in;
};

/// A string option among `choices` (each with its value), or ValueError listing them.
template <class E>
E choose(const std::string& what, const std::string& got,
         std::initializer_list<std::pair<const char*, E>> choices) {
  std::string names;
  for (const auto& [name, value] : choices) {
    if (got == name) return value;
    names += names.empty() ? "" : ", ";
    names += std::string("'") + name + "'";
  }
  throw nb::value_error((what + ": '" + got + "', expected one of " + names).c_str());
}

/// The step's arrays as a dict (every field, prepack's names).
nb::dict step_dict(const step_inputs32& in);

void bind_pack(nb::module_& m);
void bind_steps(nb::module_& m);
void bind_engines(nb::module_& m);
void bind_serve(nb::module_& m);

}  // namespace pp
