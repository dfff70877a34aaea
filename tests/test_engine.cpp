// Tests of prepack/engine.hpp: the varlen batch and the llama_batch-style token batch cover
// every real token once, in order, with the caller's sequence ids when given; every value they
// store fits the index type.
#include "prepack/engine.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "common.hpp"
#include "random_layout.hpp"

namespace {

using test::random_layout;

TEST(Engine, VarlenAndTokenBatchCoverEveryRealTokenOnce) {
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
      ASSERT_EQ(v.cu_seqlens[s + 1] - v.cu_seqlens[s], l.prompt_length()[i]);
      longest = std::max(longest, l.prompt_length()[i]);
      for (int t = 0; t < l.prompt_length()[i]; ++t) {
        const auto k = static_cast<std::size_t>(v.cu_seqlens[s] + t);
        const auto slot = static_cast<std::size_t>(l.prompt_row()[i]) * l.width() +
                          static_cast<std::size_t>(l.prompt_offset()[i] + t);
        ASSERT_EQ(static_cast<std::size_t>(v.slot[k]), slot);
        ASSERT_EQ(v.tokens[k], l.tokens()[slot]);
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
        ASSERT_EQ(b.pos[k], l.prompt_length()[i] - 1);
      }
    }
    for (std::size_t i = 0; i < l.n_prompts(); ++i) {
      ASSERT_EQ(next[i], l.prompt_length()[i]);
      ASSERT_EQ(outputs[i], 1);
    }
    // The caller's own sequence ids replace the prompt ids, token for token.
    std::vector<std::int64_t> ids(l.n_prompts());
    for (std::size_t i = 0; i < ids.size(); ++i)
      ids[i] = 1000003 * static_cast<std::int64_t>(i) + 17;
    const auto c = prepack::make_token_batch(l, ids);
    ASSERT_EQ(c.seq_id.size(), b.seq_id.size());
    for (std::size_t k = 0; k < b.seq_id.size(); ++k) {
      ASSERT_EQ(c.seq_id[k], ids[static_cast<std::size_t>(b.seq_id[k])]);
    }
    EXPECT_EQ(c.token, b.token);
    EXPECT_EQ(c.pos, b.pos);
  }
}

// Two full rows of 64 in an int8 layout: cu_seqlens would end at 128, which int8 cannot hold.
TEST(EngineErrors, CuSeqlensFitTheIndexType) {
  const auto plan = prepack::first_fit_decreasing({64, 64});
  const auto l = prepack::make_layout<int, std::int8_t>(plan, std::vector<int>(128, 1));
  EXPECT_PREPACK_ERROR(prepack::make_varlen(l), "cu_seqlens total 128 does not fit the int8");
  const auto ok = prepack::make_layout<int, std::int8_t>(prepack::first_fit_decreasing({64, 63}),
                                                         std::vector<int>(127, 1));
  EXPECT_EQ(prepack::make_varlen(ok).cu_seqlens.back(), 127);
  EXPECT_PREPACK_ERROR(prepack::make_token_batch(ok, std::vector<long long>{1}),
                       "sequence ids: 1 for 2 prompts");
}

}  // namespace
