// prepack/reference/detail/ops.hpp - the reference model's elementwise operations, one small
// function each, on row-major [tokens][features] activations.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "../../config.hpp"
#include "../matrix.hpp"

PREPACK_NAMESPACE_BEGIN
namespace reference {
namespace detail {

// The lanes the row operations below work in: whole registers of one fixed width, so a value's
// arithmetic never depends on where its row lies in memory. Eigen's loops over a map of unknown
// alignment start their vector packets at the first aligned address and do the elements before
// it one at a time: a sum then adds in an order set by the address, and exp() of a head element
// takes the scalar function rather than the vector one, so the same token would give other last
// bits in another row of a pass, or after the buffers grew.
using row_lanes = Eigen::Array<float, 16, 1>;

// 1 / sqrt(mean(x^2) + eps) of one token's n features: RMSNorm's scale. The norm's weight is
// folded into the next projection's rows, so normalising a token is this one scalar. Squares
// are summed lane-wise over whole 16-value chunks (two running sums, then added), the rest in
// order, then the lanes: one order for a row wherever it is.
inline float rms_scale(const float* x, std::size_t n, float eps) {
  row_lanes acc = row_lanes::Zero(), acc2 = row_lanes::Zero();
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {  // two chains, as Eigen's own reduction runs
    acc += Eigen::Map<const row_lanes>(x + i).square();
    acc2 += Eigen::Map<const row_lanes>(x + i + 16).square();
  }
  if (i + 16 <= n) {
    acc += Eigen::Map<const row_lanes>(x + i).square();
    i += 16;
  }
  acc += acc2;
  float rest = 0.0f;
  for (; i < n; ++i) rest += x[i] * x[i];
  return 1.0f / std::sqrt((acc.sum() + rest) / static_cast<float>(n) + eps);
}

// cos/sin of every (position, frequency) pair a batch needs, rotate-half convention.
struct rope_table {
  int half = 0;            // rotary_dim / 2 frequencies
  std::vector<float> cos;  // [max_position + 1][half]
  std::vector<float> sin;  // [max_position + 1][half]
};

// factors: empty, or [rotary_dim / 2] divisors of the frequencies (scaled RoPE).
inline rope_table make_rope_table(int rotary_dim, double theta, std::int64_t max_position,
                                  const std::vector<double>& factors = {}) {
  rope_table r;
  r.half = rotary_dim / 2;
  const std::size_t n =
      static_cast<std::size_t>(max_position + 1) * static_cast<std::size_t>(r.half);
  r.cos.resize(n);
  r.sin.resize(n);
  for (int i = 0; i < r.half; ++i) {
    // inv_freq_i = theta^(-2i / rotary_dim), in double: the same value for the same position in
    // every batch shape.
    const double inv_freq = std::pow(theta, -2.0 * i / rotary_dim) /
                            (factors.empty() ? 1.0 : factors[static_cast<std::size_t>(i)]);
    for (std::int64_t p = 0; p <= max_position; ++p) {
      const double angle = static_cast<double>(p) * inv_freq;
      const std::size_t k = static_cast<std::size_t>(p) * static_cast<std::size_t>(r.half) +
                            static_cast<std::size_t>(i);
      r.cos[k] = static_cast<float>(std::cos(angle));
      r.sin[k] = static_cast<float>(std::sin(angle));
    }
  }
  return r;
}

// Rotates the first 2 * half features of one head vector x (head_dim floats) at position pos:
// x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin with x1 = x[0, half), x2 = x[half, 2 half).
// Features past 2 * half (odd head dims) pass through, as in partial rotary embeddings.
inline void rope(float* x, const rope_table& r, std::int64_t pos) {
  const std::size_t at = static_cast<std::size_t>(pos) * static_cast<std::size_t>(r.half);
  const float* c = r.cos.data() + at;
  const float* s = r.sin.data() + at;
  for (int i = 0; i < r.half; ++i) {
    const float x1 = x[i], x2 = x[i + r.half];
    x[i] = x1 * c[i] - x2 * s[i];
    x[i + r.half] = x2 * c[i] + x1 * s[i];
  }
}

// g <- silu(g * s) * (u * s) over n features: SwiGLU of a token whose gate and up projections
// were computed from the un-normalised input (s, its RMSNorm scale, applied here). Every value
// goes through the vector exp, 16 at a time in aligned lanes (the last chunk zero-padded).
inline void swiglu(float* g, const float* u, float s, std::size_t n) {
  row_lanes a, b;
  const auto f = [&] { a = (a * s) / (1.0f + (-(a * s)).exp()) * (b * s); };
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a = Eigen::Map<const row_lanes>(g + i);
    b = Eigen::Map<const row_lanes>(u + i);
    f();
    Eigen::Map<row_lanes>(g + i) = a;
  }
  if (i < n) {
    a.setZero();
    b.setZero();
    std::copy(g + i, g + n, a.data());
    std::copy(u + i, u + n, b.data());
    f();
    std::copy(a.data(), a.data() + (n - i), g + i);
  }
}

// Index of the largest logit (the lowest index on ties) and its margin over the runner-up.
inline std::pair<int, float> argmax_with_margin(const float* logits, std::size_t n) {
  std::size_t best = 0;
  for (std::size_t j = 1; j < n; ++j) best = logits[j] > logits[best] ? j : best;
  float second = -std::numeric_limits<float>::infinity();
  for (std::size_t j = 0; j < n; ++j) {
    if (j != best && logits[j] > second) second = logits[j];
  }
  return {static_cast<int>(best), logits[best] - second};
}

}  // namespace detail
}  // namespace reference
PREPACK_NAMESPACE_END
