// Tests of prepack/mask.hpp: dense masks against the definition (query and key in the same
// prompt, key not after query), additive and 2D masks, bool arrays, the block-sparse form
// against every element of the dense definition, and size errors.
#include "prepack/mask.hpp"

#include <gtest/gtest.h>

#include <algorithm>
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

// The block-sparse form against the definition evaluated slot by slot: a key block is listed for
// a query block iff some pair in them may attend (with the window, and a pad query its own slot),
// listed as full iff every pair may and both blocks lie whole inside the width; lists ascending,
// disjoint, padded with 0.
TEST(Mask, BlockSparseMaskListsExactlyTheBlocksTheDefinitionOpens) {
  std::mt19937_64 rng(41);
  std::size_t n_full = 0, n_partial = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const auto l = random_layout(rng, trial);
    const std::size_t w = l.width();
    for (std::size_t bs : {1, 2, 3, 4, 7, 16}) {
      for (std::size_t window : {0, 1, 2, 3, 5, 100}) {
        const auto m = prepack::make_block_sparse_mask(l, bs, window);
        const std::size_t nb = (w + bs - 1) / bs;
        ASSERT_EQ(m.n_blocks, nb);
        ASSERT_EQ(m.n_rows, l.n_rows());
        ASSERT_EQ(m.kv_indices.size(), l.n_rows() * nb * nb);
        const auto open = [&](std::size_t r, std::size_t q, std::size_t k) {
          const auto sq = l.segments()[r * w + q], sk = l.segments()[r * w + k];
          if (sq < 0) return q == k;
          return sq == sk && k <= q && (window == 0 || q - k < window);
        };
        for (std::size_t r = 0; r < l.n_rows(); ++r) {
          for (std::size_t qb = 0; qb < nb; ++qb) {
            const std::size_t at = r * nb + qb;
            std::vector<int> listed(nb, 0);  // 1 partial, 2 full
            for (int j = 0; j < m.kv_num_blocks[at]; ++j) {
              ASSERT_EQ(listed[static_cast<std::size_t>(m.kv_indices[at * nb + j])]++, 0);
            }
            for (int j = 0; j < m.full_kv_num_blocks[at]; ++j) {
              ASSERT_EQ(listed[static_cast<std::size_t>(m.full_kv_indices[at * nb + j])], 0);
              listed[static_cast<std::size_t>(m.full_kv_indices[at * nb + j])] = 2;
            }
            for (std::size_t j = 1; j < nb; ++j) {
              if (static_cast<int>(j) < m.kv_num_blocks[at]) {
                ASSERT_LT(m.kv_indices[at * nb + j - 1], m.kv_indices[at * nb + j]);
              } else {
                ASSERT_EQ(m.kv_indices[at * nb + j], 0);
              }
              if (static_cast<int>(j) < m.full_kv_num_blocks[at]) {
                ASSERT_LT(m.full_kv_indices[at * nb + j - 1], m.full_kv_indices[at * nb + j]);
              } else {
                ASSERT_EQ(m.full_kv_indices[at * nb + j], 0);
              }
            }
            for (std::size_t kb = 0; kb < nb; ++kb) {
              bool any = false, all = true;
              for (std::size_t q = qb * bs; q < std::min(qb * bs + bs, w); ++q) {
                for (std::size_t k = kb * bs; k < std::min(kb * bs + bs, w); ++k) {
                  any = any || open(r, q, k);
                  all = all && open(r, q, k);
                }
              }
              const bool whole = qb * bs + bs <= w && kb * bs + bs <= w;
              const int want = !any ? 0 : all && whole ? 2 : 1;
              ASSERT_EQ(listed[kb], want)
                  << "trial " << trial << " block size " << bs << " window " << window << " row "
                  << r << " query block " << qb << " key block " << kb;
              n_full += want == 2;
              n_partial += want == 1;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(n_full, 1000u);  // both kinds really occur
  EXPECT_GT(n_partial, 1000u);
  const auto l = prepack::make_layout(prepack::first_fit_decreasing(std::vector<int>{2, 1}),
                                      std::vector<int>{1, 2, 3});
  EXPECT_PREPACK_ERROR(prepack::make_block_sparse_mask(l, 0), "block-sparse mask: block size 0");
}

}  // namespace
