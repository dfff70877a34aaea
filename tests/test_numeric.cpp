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

}  // namespace
