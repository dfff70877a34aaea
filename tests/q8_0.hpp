// ggml's Q8_0 encoding for the tests' writers (as llama.cpp's quantize_row_q8_0_ref encodes a
// row): the GGUF writer's Q8_0 tensors and the in-memory held models share it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "prepack/numeric.hpp"

namespace test {

// n values (a multiple of 32) as Q8_0 blocks: an fp16 scale amax / 127, then 32 int8 values.
inline std::vector<unsigned char> q8_0_bytes(const float* v, std::size_t n) {
  std::vector<unsigned char> out;
  out.reserve(n / 32 * 34);
  for (std::size_t b = 0; b < n; b += 32) {
    float amax = 0;
    for (std::size_t k = 0; k < 32; ++k) amax = std::max(amax, std::abs(v[b + k]));
    const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    const std::uint16_t h = prepack::half::from_float(d);
    out.push_back(static_cast<unsigned char>(h & 0xFF));
    out.push_back(static_cast<unsigned char>(h >> 8));
    for (std::size_t k = 0; k < 32; ++k) {
      const auto q = static_cast<std::int8_t>(std::round(v[b + k] * id));
      out.push_back(static_cast<unsigned char>(q));
    }
  }
  return out;
}

}  // namespace test
