// prepack/detail/random.hpp - splitmix64, a tiny generator whose output is the same on every
// platform and standard library (unlike <random>'s distributions): seeded workloads and weights
// reproduce exactly everywhere.
#pragma once

#include <cmath>
#include <cstdint>

#include "../config.hpp"

PREPACK_NAMESPACE_BEGIN
namespace detail {

class splitmix {
 public:
  explicit splitmix(std::uint64_t seed) : s_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1), 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  // Uniform in [-a, a).
  float symmetric(float a) { return static_cast<float>((2.0 * uniform() - 1.0) * a); }
  // Uniform integer in [lo, hi].
  int between(int lo, int hi) {
    return lo + static_cast<int>(next() % static_cast<std::uint64_t>(hi - lo + 1));
  }
  // Standard normal (Box-Muller).
  double normal() {
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  std::uint64_t s_;
};

}  // namespace detail
PREPACK_NAMESPACE_END
