// Tests of prepack/mask.hpp: dense masks against the definition (query and key in the same
// prompt, key not after query), additive and 2D masks, bool arrays, and size errors.
#include "prepack/mask.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>
#include <random>
#include <vector>

#include "common.hpp"
#include "random_layout.hpp"

namespace {

using test::random_layout;

TEST(Mask, DenseMasksMatchTheDefinition) {
  std::mt19937_64 rng(17);
  for (int trial = 0; trial < 300; ++trial) {
    const auto l = random_layout(rng, trial);
    const auto m = prepack::dense_mask(l);
    const auto add = prepack::additive_mask(l);
    const auto am = prepack::attention_mask(l);
    const std::size_t w = l.width();
    ASSERT_EQ(m.size(), l.n_rows() * w * w);
    // From the per-prompt table alone: q may see k iff both lie in one prompt's slots, k <= q.
    std::vector<std::uint8_t> want(m.size(), 0), want2d(l.n_slots(), 0);
    for (std::size_t i = 0; i < l.n_prompts(); ++i) {
      const std::size_t r = static_cast<std::size_t>(l.prompt_row()[i]);
      const std::size_t b = static_cast<std::size_t>(l.prompt_offset()[i]);
      const std::size_t e = b + static_cast<std::size_t>(l.prompt_length()[i]);
      for (std::size_t q = b; q < e; ++q) {
        want2d[r * w + q] = 1;
        for (std::size_t k = b; k <= q; ++k) want[(r * w + q) * w + k] = 1;
      }
    }
    ASSERT_EQ(m, want);
    ASSERT_EQ(am, want2d);
    for (std::size_t x = 0; x < m.size(); ++x) {
      ASSERT_EQ(add[x], want[x] ? 0.0f : -std::numeric_limits<float>::infinity());
    }
    // Any element type, into caller memory.
    std::vector<double> dm(m.size(), 7.0);
    prepack::fill_dense_mask(l, prepack::span<double>(dm), 1.0, 0.0);
    for (std::size_t x = 0; x < m.size(); ++x) ASSERT_EQ(dm[x], want[x] ? 1.0 : 0.0);
  }
}

// transformers' convention: additive, the dtype's finite minimum (torch.finfo(dtype).min, written
// here from the formats' definitions), and a pad query open to its own slot alone.
TEST(Mask, TransformersMaskOpensEveryRowAndStaysFinite) {
  std::mt19937_64 rng(29);
  const float f32_min = -3.4028234663852886e38f;   // -(2 - 2^-23) 2^127
  const float bf16_min = -3.3895313892515355e38f;  // -(2 - 2^-7) 2^127
  const float f16_min = -65504.0f;                 // -(2 - 2^-10) 2^15
  for (int trial = 0; trial < 200; ++trial) {
    const auto l = random_layout(rng, trial);
    const std::size_t w = l.width();
    const auto bytes = prepack::dense_mask(l);
    const auto f = prepack::transformers_mask<float>(l);
    const auto b = prepack::transformers_mask<prepack::bfloat16>(l);
    const auto h = prepack::transformers_mask<prepack::half>(l);
    std::vector<std::uint8_t> open(bytes);
    for (std::size_t r = 0; r < l.n_rows(); ++r) {
      for (std::size_t q = 0; q < w; ++q) {
        if (l.segments()[r * w + q] < 0) open[(r * w + q) * w + q] = 1;  // a pad query: itself
      }
    }
    for (std::size_t x = 0; x < bytes.size(); ++x) {
      ASSERT_EQ(f[x], open[x] ? 0.0f : f32_min) << x;
      ASSERT_EQ(static_cast<float>(b[x]), open[x] ? 0.0f : bf16_min) << x;
      ASSERT_EQ(static_cast<float>(h[x]), open[x] ? 0.0f : f16_min) << x;
    }
    // Every query row opens exactly one key or more, pad rows exactly their own slot.
    for (std::size_t row = 0; row < l.n_rows() * w; ++row) {
      std::size_t n_open = 0;
      for (std::size_t k = 0; k < w; ++k) n_open += open[row * w + k];
      ASSERT_GE(n_open, 1u);
    }
  }
}

TEST(MaskErrors, SizesThatCannotBeAllocatedOrMismatch) {
  // One row of 2^22 slots: its layout is 48 MiB, its additive mask of doubles 2^47 bytes, more
  // than any x86-64 process can map: std::bad_alloc, as any allocation that cannot succeed.
  const auto big = prepack::make_layout(prepack::first_fit_decreasing({1 << 22}),
                                        std::vector<int>(std::size_t{1} << 22, 1));
  EXPECT_EQ(prepack::dense_mask_size(big), std::size_t{1} << 44);
  if (PREPACK_TEST_NEW_THROWS) {
    EXPECT_THROW(prepack::additive_mask<double>(big), std::bad_alloc);
  }
  const auto l = prepack::make_layout(prepack::first_fit_decreasing(std::vector<int>{2, 1}),
                                      std::vector<int>{1, 2, 3});
  std::vector<float> small(3, 5.0f);
  EXPECT_PREPACK_ERROR(prepack::fill_dense_mask(l, prepack::span<float>(small), 0.0f, 1.0f),
                       "buffer holds 3 elements, 2 x 2 x 2 = 8 needed");
  EXPECT_EQ(small, std::vector<float>(3, 5.0f));
}

// A bool mask goes into a bool array (std::vector<bool> has no contiguous storage and is
// refused at compile time with a message saying so).
TEST(Mask, BoolMasksIntoABoolArray) {
  const auto l =
      prepack::make_layout(prepack::first_fit_decreasing({2, 1}), std::vector<int>{1, 2, 3});
  const std::size_t n = prepack::dense_mask_size(l);
  std::unique_ptr<bool[]> m(new bool[n]);
  prepack::fill_dense_mask(l, prepack::span<bool>(m.get(), n), true, false);
  const auto bytes = prepack::dense_mask(l);
  for (std::size_t x = 0; x < n; ++x) EXPECT_EQ(m[x], bytes[x] == 1);
}

}  // namespace
