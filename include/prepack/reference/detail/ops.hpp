// prepack/reference/detail/ops.hpp - the reference model's operations, one small function
// each, on row-major [tokens][features] activations. Plain loops where Eigen adds nothing.
#pragma once

#include <Eigen/Core>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "../../config.hpp"

PREPACK_NAMESPACE_BEGIN
namespace reference {

/// Activations and weights: row-major, so a token's features are contiguous.
using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using vector = Eigen::VectorXf;

namespace detail {

// out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w, for each token t. out may alias x.
template <class In, class Out>
void rms_norm(const In& x, const vector& w, float eps, Out& out) {
  for (Eigen::Index t = 0; t < x.rows(); ++t) {
    const float ms = x.row(t).squaredNorm() / static_cast<float>(x.cols());
    const float scale = 1.0f / std::sqrt(ms + eps);
    out.row(t) = (x.row(t).array() * scale * w.transpose().array()).matrix();
  }
}

// cos/sin of every (position, frequency) pair a batch needs, rotate-half convention.
struct rope_table {
  int half = 0;            // rotary_dim / 2 frequencies
  std::vector<float> cos;  // [max_position + 1][half]
  std::vector<float> sin;  // [max_position + 1][half]
};

inline rope_table make_rope_table(int rotary_dim, double theta, std::int64_t max_position) {
  rope_table r;
  r.half = rotary_dim / 2;
  const std::size_t n =
      static_cast<std::size_t>(max_position + 1) * static_cast<std::size_t>(r.half);
  r.cos.resize(n);
  r.sin.resize(n);
  for (std::int64_t p = 0; p <= max_position; ++p) {
    for (int i = 0; i < r.half; ++i) {
      // inv_freq_i = theta^(-2i / rotary_dim), computed in double as Hugging Face does in fp32
      // from an fp32 exponent: the same value for the same position in every batch shape.
      const double inv_freq = std::pow(theta, -2.0 * i / rotary_dim);
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
  const float* c = r.cos.data() + static_cast<std::size_t>(pos) * static_cast<std::size_t>(r.half);
  const float* s = r.sin.data() + static_cast<std::size_t>(pos) * static_cast<std::size_t>(r.half);
  for (int i = 0; i < r.half; ++i) {
    const float x1 = x[i], x2 = x[i + r.half];
    x[i] = x1 * c[i] - x2 * s[i];
    x[i + r.half] = x2 * c[i] + x1 * s[i];
  }
}

// In-place softmax of scores[0, n), vectorised; entries equal to -inf get probability exactly 0,
// and a row that is -inf throughout (a pad query) becomes all zeros instead of NaN.
inline void softmax(float* scores, std::size_t n) {
  Eigen::Map<Eigen::ArrayXf> x(scores, static_cast<Eigen::Index>(n));
  const float max = x.maxCoeff();
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  if (max == ninf) {
    x.setZero();
    return;
  }
  // exp of a clamped argument is tiny but not 0 for -inf: select keeps masked entries at 0.
  x = (x == ninf).select(0.0f, (x - max).exp());
  x *= 1.0f / x.sum();
}

// x <- silu(x) * y = x / (1 + exp(-x)) * y, elementwise over n floats (SwiGLU), vectorised.
inline void swiglu(float* x, const float* y, std::size_t n) {
  Eigen::Map<Eigen::ArrayXf> a(x, static_cast<Eigen::Index>(n));
  Eigen::Map<const Eigen::ArrayXf> b(y, static_cast<Eigen::Index>(n));
  a = a / (1.0f + (-a).exp()) * b;
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
