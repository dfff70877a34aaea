// prepack's Python module: numpy arrays in and out of prepack's C++ headers.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <string>

#include "bindings.hpp"

NB_MODULE(_prepack, m) {
  m.doc() =
      "prepack's C++ core: plans, packed batches and masks, unpacking, schedules, step inputs, "
      "each engine's form of a step, and the serving scheduler. Arrays come back as numpy "
      "arrays (no copy); arguments take numpy arrays, torch tensors, anything with __dlpack__, "
      "the buffer protocol or __array__, and lists. Caller mistakes raise ValueError or "
      "TypeError with prepack's own message (the prompt and value named).";
  m.attr("__version__") = std::to_string(PREPACK_VERSION_MAJOR) + "." +
                          std::to_string(PREPACK_VERSION_MINOR) + "." +
                          std::to_string(PREPACK_VERSION_PATCH);
  pp::bind_pack(m);
  pp::bind_steps(m);
  pp::bind_engines(m);
  pp::bind_serve(m);
}
