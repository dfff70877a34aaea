// Tests of prepack/numeric.hpp: fp16 and bf16 conversions against their definitions. Every
// 16-bit pattern converts to a float and back unchanged (NaNs stay NaN); a float converts to the
// representable value nearest to it (ties to the even pattern), found here by search over all
// 65536 values rather than by bit manipulation.
#include "prepack/numeric.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace {

template <class H>
void expect_round_trips() {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float f = H::to_float(bits);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(H::to_float(H::from_float(f)))) << b;
    } else {
      ASSERT_EQ(H::from_float(f), bits) << "pattern " << b << " value " << f;
    }
  }
}

// The pattern nearest to f among all finite values of H (ties: the even pattern); values past
// the largest finite one by half an ulp or more round to infinity, as IEEE says.
template <class H>
std::uint16_t nearest(float f, const std::vector<std::pair<double, std::uint16_t>>& finite,
                      double overflow) {
  if (std::abs(static_cast<double>(f)) >= overflow) {
    return H::from_float(f < 0 ? -std::numeric_limits<float>::infinity()
                               : std::numeric_limits<float>::infinity());
  }
  const auto it = std::lower_bound(finite.begin(), finite.end(),
                                   std::make_pair(static_cast<double>(f), std::uint16_t{0}));
  std::uint16_t best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (auto j = it == finite.begin() ? it : it - 1; j != finite.end() && j <= it + 1; ++j) {
    const double d = std::abs(j->first - static_cast<double>(f));
    if (d < best_d || (d == best_d && (j->second & 1u) == 0)) {
      best_d = d;
      best = j->second;
    }
  }
  return best;
}

template <class H>
void expect_nearest(double overflow, float scale) {
  std::vector<std::pair<double, std::uint16_t>> finite;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const float f = H::to_float(static_cast<std::uint16_t>(b));
    if (std::isfinite(f) && !(f == 0 && std::signbit(f))) finite.emplace_back(f, b);
  }
  std::sort(finite.begin(), finite.end());
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> e(-30, 18);
  for (int k = 0; k < 200000; ++k) {
    const float f = u(rng) * std::ldexp(scale, e(rng));
    if (f == 0) continue;
    const std::uint16_t got = H::from_float(f);
    std::uint16_t want = nearest<H>(f, finite, overflow);
    // A negative value rounding to zero keeps its sign.
    if (H::to_float(want) == 0 && f < 0) want = static_cast<std::uint16_t>(want | 0x8000u);
    ASSERT_EQ(got, want) << "float " << f;
  }
  // Ties: exactly halfway between two neighbours goes to the even pattern.
  for (std::size_t j = 0; j + 1 < finite.size(); j += 97) {
    const double mid = (finite[j].first + finite[j + 1].first) / 2;
    const auto f = static_cast<float>(mid);
    if (static_cast<double>(f) != mid) continue;  // not representable in float
    const std::uint16_t even =
        (finite[j].second & 1u) == 0 ? finite[j].second : finite[j + 1].second;
    ASSERT_EQ(H::from_float(f), even) << "halfway " << mid;
  }
}

TEST(Numeric, HalfRoundTripsEveryPattern) { expect_round_trips<prepack::half>(); }
TEST(Numeric, BFloat16RoundTripsEveryPattern) { expect_round_trips<prepack::bfloat16>(); }
TEST(Numeric, HalfRoundsToNearestEven) { expect_nearest<prepack::half>(65520.0, 1.0f); }
TEST(Numeric, BFloat16RoundsToNearestEven) {
  expect_nearest<prepack::bfloat16>(3.3961775292304194e38, 1.0f);
}

TEST(Numeric, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(prepack::half::from_float(inf), 0x7C00u);
  EXPECT_EQ(prepack::half::from_float(-inf), 0xFC00u);
  EXPECT_EQ(prepack::half::from_float(65504.0f), 0x7BFFu);
  EXPECT_EQ(prepack::half::from_float(65520.0f), 0x7C00u);  // halfway past the largest: infinity
  EXPECT_TRUE(std::isnan(static_cast<float>(prepack::half(std::nanf("")))));
  EXPECT_TRUE(std::isnan(static_cast<float>(prepack::bfloat16(std::nanf("")))));
  EXPECT_EQ(static_cast<float>(prepack::half(5.9604644775390625e-8f)), 5.9604644775390625e-8f);
  EXPECT_EQ(prepack::bfloat16::from_float(1.0f), 0x3F80u);
}

// A double is rounded once, from its own value: through float it would be rounded twice, and
// 1 + 2^-11 + 2^-40 (just above halfway between two halves) would land on the even pattern below.
template <class H>
void expect_nearest_from_double(double overflow, int exponents) {
  std::vector<std::pair<double, std::uint16_t>> finite;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const float f = H::to_float(static_cast<std::uint16_t>(b));
    if (std::isfinite(f) && !(f == 0 && std::signbit(f))) finite.emplace_back(f, b);
  }
  std::sort(finite.begin(), finite.end());
  const auto nearest_to = [&](double d) -> std::uint16_t {
    if (std::abs(d) >= overflow) {
      return H::from_float(d < 0 ? -std::numeric_limits<float>::infinity()
                                 : std::numeric_limits<float>::infinity());
    }
    const auto it =
        std::lower_bound(finite.begin(), finite.end(), std::make_pair(d, std::uint16_t{0}));
    std::uint16_t best = 0;
    long double best_d = std::numeric_limits<long double>::infinity();
    for (auto j = it == finite.begin() ? it : it - 1; j != finite.end() && j <= it + 1; ++j) {
      const long double dist =
          std::abs(static_cast<long double>(j->first) - static_cast<long double>(d));
      if (dist < best_d || (dist == best_d && (j->second & 1u) == 0)) {
        best_d = dist;
        best = j->second;
      }
    }
    if (H::to_float(best) == 0 && d < 0) best = static_cast<std::uint16_t>(best | 0x8000u);
    return best;
  };
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::uniform_int_distribution<int> e(-exponents, 17);
  for (int k = 0; k < 200000; ++k) {
    double d = u(rng) * std::ldexp(1.0, e(rng));
    if (k % 2 == 0 && !finite.empty()) {  // just off a halfway point, below float's precision
      const std::size_t j = static_cast<std::size_t>(rng() % (finite.size() - 1));
      const double mid = (finite[j].first + finite[j + 1].first) / 2;
      d = mid + (rng() % 2 == 0 ? 1 : -1) * std::abs(mid) * std::ldexp(1.0, -40);
    }
    if (d == 0) continue;
    ASSERT_EQ(H::from_double(d), nearest_to(d)) << "double " << d;
    ASSERT_EQ(H(d).bits, nearest_to(d)) << "double " << d;
    ASSERT_EQ(prepack::convert<H>(d).bits, nearest_to(d)) << "double " << d;
  }
}

TEST(Numeric, DoublesRoundOnceToHalf) {
  EXPECT_EQ(prepack::half::from_double(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40)), 0x3C01u);
  EXPECT_EQ(prepack::half::from_float(
                static_cast<float>(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40))),
            0x3C00u);  // what rounding through float gives
  expect_nearest_from_double<prepack::half>(65520.0, 30);
}
TEST(Numeric, DoublesRoundOnceToBFloat16) {
  EXPECT_EQ(prepack::bfloat16::from_double(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40)),
            0x3F81u);
  expect_nearest_from_double<prepack::bfloat16>(3.3961775292304194e38, 130);
}

}  // namespace
