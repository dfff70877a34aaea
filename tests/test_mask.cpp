// Tests of prepack/mask.hpp: dense masks against the definition (query and key in the same
// prompt, key not after query), additive and 2D masks, varlen and llama_batch-style arrays,
// and size errors.
#include "prepack/mask.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "common.hpp"

namespace {

prepack::packed_layout<> random_layout(std::mt19937_64& rng, int trial) {
  const auto len =
      test::random_lengths(rng, 1 + rng() % 12, 1, 1 + static_cast<long long>(rng() % 20));
  const auto plan = trial % 3 == 0   ? prepack::padded(len)
                    : trial % 3 == 1 ? prepack::first_fit_decreasing(len)
                                     : prepack::best_fit_decreasing(
                                           len, *std::max_element(len.begin(), len.end()) + 5);
  return prepack::make_layout(plan, test::tagged_prompts(len, 50));
}

TEST(Mask, DenseMasksMatchTheDefinition) {
  std::mt19937_64 rng(17);
  for (int trial = 0; trial < 300; ++trial) {
    const auto l = random_layout(rng, trial);
    const auto m = prepack::dense_mask(l);
    const auto add = prepack::additive_mask(l);
    const auto am = prepack::attention_mask(l);
    const std::size_t w = l.width;
    ASSERT_EQ(m.size(), l.n_rows * w * w);
    // From the per-prompt table alone: q may see k iff both lie in one prompt's slots, k <= q.
    std::vector<std::uint8_t> want(m.size(), 0), want2d(l.n_slots(), 0);
    for (std::size_t i = 0; i < l.n_prompts(); ++i) {
      const std::size_t r = static_cast<std::size_t>(l.prompt_row[i]);
      const std::size_t b = static_cast<std::size_t>(l.prompt_offset[i]);
      const std::size_t e = b + static_cast<std::size_t>(l.prompt_length[i]);
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

TEST(Mask, VarlenAndTokenBatchCoverEveryRealTokenOnce) {
  std::mt19937_64 rng(23);
  for (int trial = 0; trial < 300; ++trial) {
    const auto l = random_layout(rng, trial);
    const auto v = prepack::make_varlen(l);
    ASSERT_EQ(v.cu_seqlens.size(), l.n_prompts() + 1);
    ASSERT_EQ(v.seq_prompt.size(), l.n_prompts());
    ASSERT_EQ(static_cast<std::size_t>(v.cu_seqlens.back()), l.useful_tokens());
    std::vector<int> seen(l.n_prompts(), 0);
    int longest = 0;
    for (std::size_t s = 0; s < v.seq_prompt.size(); ++s) {
      const auto i = static_cast<std::size_t>(v.seq_prompt[s]);
      ++seen[i];
      ASSERT_EQ(v.cu_seqlens[s + 1] - v.cu_seqlens[s], l.prompt_length[i]);
      longest = std::max(longest, l.prompt_length[i]);
      for (int t = 0; t < l.prompt_length[i]; ++t) {
        const auto k = static_cast<std::size_t>(v.cu_seqlens[s] + t);
        const auto slot = static_cast<std::size_t>(l.prompt_row[i]) * l.width +
                          static_cast<std::size_t>(l.prompt_offset[i] + t);
        ASSERT_EQ(static_cast<std::size_t>(v.slot[k]), slot);
        ASSERT_EQ(v.tokens[k], l.tokens[slot]);
        ASSERT_EQ(v.positions[k], t);
      }
    }
    for (int c : seen) ASSERT_EQ(c, 1);
    ASSERT_EQ(v.max_seqlen, longest);

    const auto b = prepack::make_token_batch(l);
    ASSERT_EQ(b.token.size(), l.useful_tokens());
    std::vector<int> next(l.n_prompts(), 0), outputs(l.n_prompts(), 0);
    for (std::size_t k = 0; k < b.token.size(); ++k) {
      const auto i = static_cast<std::size_t>(b.seq_id[k]);
      ASSERT_EQ(b.pos[k], next[i]++) << "positions of a sequence must be consecutive";
      if (b.logits[k]) {
        ++outputs[i];
        ASSERT_EQ(b.pos[k], l.prompt_length[i] - 1);
      }
    }
    for (std::size_t i = 0; i < l.n_prompts(); ++i) {
      ASSERT_EQ(next[i], l.prompt_length[i]);
      ASSERT_EQ(outputs[i], 1);
    }
  }
}

TEST(MaskErrors, SizesThatOverflowOrMismatch) {
  prepack::packed_layout<> huge;
  huge.n_rows = 4;
  huge.width = std::size_t{1} << 32;  // 4 * 2^64 elements
  EXPECT_PREPACK_ERROR(prepack::dense_mask_size(huge), "overflows size_t");
  EXPECT_PREPACK_ERROR(prepack::dense_mask(huge), "overflows size_t");
#if !PREPACK_TEST_UNDER_ASAN  // AddressSanitizer aborts on a failed new instead of throwing
  prepack::packed_layout<> big;
  big.n_rows = 1;
  big.width = std::size_t{1} << 31;  // 2^62 bytes: not allocatable
  EXPECT_PREPACK_ERROR(prepack::dense_mask(big), "dense mask");
#endif

  const auto l = prepack::make_layout(prepack::first_fit_decreasing(std::vector<int>{2, 1}),
                                      std::vector<int>{1, 2, 3});
  std::vector<float> small(3, 5.0f);
  EXPECT_PREPACK_ERROR(prepack::fill_dense_mask(l, prepack::span<float>(small), 0.0f, 1.0f),
                       "buffer holds 3 elements, 2 x 2 x 2 = 8 needed");
  EXPECT_EQ(small, std::vector<float>(3, 5.0f));
}

TEST(MaskErrors, EditedLayoutsAreRefusedNotReadPastTheEnd) {
  const std::vector<int> len{3, 2, 2};
  const auto good =
      prepack::make_layout(prepack::first_fit_decreasing(len), std::vector<int>(7, 1));
  auto a = good;
  a.segments[0] = 40;  // a prompt id far outside the tables
  EXPECT_PREPACK_ERROR(prepack::make_token_batch(a), "layout: prompt 0: slot 0 holds segment 40");
  auto b = good;
  b.row_begin[1] = 3;
  EXPECT_PREPACK_ERROR(prepack::make_varlen(b), "layout: row 0: entry 1");
  auto c = good;
  c.row_cu_seqlens[1] = 99;
  EXPECT_PREPACK_ERROR(prepack::make_varlen(c), "cu_seqlens disagree");
  auto d = good;
  d.positions.pop_back();
  EXPECT_PREPACK_ERROR(prepack::attention_mask(d), "arrays do not hold");
  auto e = good;
  e.prompt_length[2] = -1;
  std::vector<float> out(prepack::dense_mask_size(e), 3.0f);
  EXPECT_PREPACK_ERROR(prepack::fill_dense_mask(e, prepack::span<float>(out), 0.0f, 1.0f),
                       "length -1");
  EXPECT_EQ(out, std::vector<float>(out.size(), 3.0f));
}

}  // namespace
