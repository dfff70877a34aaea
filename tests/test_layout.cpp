// Tests of prepack/layout.hpp: token, position and segment arrays against their definitions on
// random plans of every kind; per-row cu_seqlens; index-type limits; inconsistent inputs.
#include "prepack/layout.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "common.hpp"

namespace {

enum class kind { ffd, bfd, left, right };

prepack::pack_plan<int> plan_of(kind k, const std::vector<int>& len, std::optional<int> cap = {}) {
  switch (k) {
    case kind::ffd:
      return prepack::first_fit_decreasing(len, cap);
    case kind::bfd:
      return prepack::best_fit_decreasing(len, cap);
    case kind::left:
      return prepack::padded(len, prepack::padding_side::left, cap);
    case kind::right:
      return prepack::padded(len, prepack::padding_side::right, cap);
  }
  return {};
}

TEST(Layout, ArraysMatchTheirDefinitionsOnRandomPlans) {
  std::mt19937_64 rng(99);
  for (int trial = 0; trial < 600; ++trial) {
    const auto len =
        test::random_lengths(rng, 1 + rng() % 40, 1, 1 + static_cast<long long>(rng() % 90));
    const auto prompts = test::tagged_prompts(len, 1000);
    const kind k = static_cast<kind>(trial % 4);
    const auto plan = plan_of(k, len);
    const auto l = prepack::make_layout(plan, prompts, {/*pad_id=*/1001, /*pad_position=*/1});
    ASSERT_EQ(l.n_rows(), plan.n_rows());
    ASSERT_EQ(l.width(), static_cast<std::size_t>(plan.capacity));
    ASSERT_EQ(l.n_prompts(), len.size());
    // Expected arrays built from the plan alone.
    std::vector<int> tok(l.n_slots(), 1001), pos(l.n_slots(), 1), seg(l.n_slots(), -1);
    for (std::size_t i = 0; i < len.size(); ++i) {
      for (int t = 0; t < len[i]; ++t) {
        const std::size_t s =
            plan.row[i] * l.width() + static_cast<std::size_t>(plan.offset[i] + t);
        tok[s] = prompts[i][static_cast<std::size_t>(t)];
        pos[s] = t;
        seg[s] = static_cast<int>(i);
      }
      ASSERT_EQ(l.last_token()[i],
                static_cast<int>(plan.row[i] * l.width()) + plan.offset[i] + len[i] - 1);
      ASSERT_EQ(l.prompt_row()[i], static_cast<int>(plan.row[i]));
      ASSERT_EQ(l.prompt_offset()[i], plan.offset[i]);
      ASSERT_EQ(l.prompt_length()[i], len[i]);
      ASSERT_EQ(l.prompt_context()[i], 0);
    }
    ASSERT_EQ(l.parts().tokens, tok);
    ASSERT_EQ(l.parts().positions, pos);
    ASSERT_EQ(l.parts().segments, seg);
    for (std::size_t r = 0; r < l.n_rows(); ++r) {
      const auto cu = l.row_cu(r);
      const auto ids = l.prompts_in_row(r);
      ASSERT_EQ(cu.size(), ids.size() + 1);
      for (std::size_t k2 = 0; k2 < ids.size(); ++k2) {
        const auto i = static_cast<std::size_t>(ids[k2]);
        EXPECT_EQ(cu[k2], plan.offset[i]);
        EXPECT_EQ(cu[k2 + 1] - cu[k2], len[i]);
      }
    }
    // The library's own layouts are accepted back by the checked constructor.
    EXPECT_NO_THROW((prepack::packed_layout<int, int>::from_parts(l.parts())));
  }
}

// Chunks that continue cached context: positions start at their context.
TEST(Layout, ContextsShiftPositions) {
  const std::vector<int> len{3, 2};
  const std::vector<long long> context{5, 0};
  const auto plan = prepack::first_fit_decreasing(len, 5);  // one row: [0 0 0 1 1]
  const std::vector<int> tokens{1, 2, 3, 4, 5};
  const auto l = prepack::make_layout(plan, prepack::span<const int>(tokens),
                                      prepack::span<const long long>(context));
  EXPECT_EQ(l.parts().positions, (std::vector<int>{5, 6, 7, 0, 1}));
  EXPECT_EQ(l.prompt_context()[0], 5);
  EXPECT_NO_THROW((prepack::packed_layout<int, int>::from_parts(l.parts())));
  const std::vector<long long> bad{-1, 0};
  EXPECT_PREPACK_ERROR(prepack::make_layout(plan, prepack::span<const int>(tokens),
                                            prepack::span<const long long>(bad)),
                       "prompt 0: context -1");
  const std::vector<long long> far{126, 0};
  EXPECT_PREPACK_ERROR(
      (prepack::make_layout<int, std::int8_t>(plan, prepack::span<const int>(tokens),
                                              prepack::span<const long long>(far))),
      "prompt 0: position 128 does not fit the int8 index type");
}

TEST(Layout, FlatTokensAndPerPromptTokensAgree) {
  const std::vector<int> len{3, 1, 2};
  const std::vector<std::int64_t> flat{10, 11, 12, 20, 30, 31};
  const auto plan = prepack::first_fit_decreasing(len);
  const auto a = prepack::make_layout(plan, flat);
  const auto b = prepack::make_layout(
      plan, std::vector<std::vector<std::int64_t>>{{10, 11, 12}, {20}, {30, 31}});
  EXPECT_EQ(a.parts().tokens, b.parts().tokens);
  EXPECT_EQ(a.parts().tokens, (std::vector<int>{10, 11, 12, 30, 31, 20}));  // [3] [2 + 1]
}

TEST(LayoutErrors, TokenCountsAndTypes) {
  const std::vector<int> len{3, 2};
  const auto plan = prepack::first_fit_decreasing(len);
  EXPECT_PREPACK_ERROR(prepack::make_layout(plan, std::vector<int>{1, 2, 3, 4}),
                       "token count 4 does not match the lengths' total 5");
  EXPECT_PREPACK_ERROR(prepack::make_layout(plan, std::vector<std::vector<int>>{{1, 2, 3}, {4}}),
                       "prompt 1: 1 tokens, the plan says length 2");
  EXPECT_PREPACK_ERROR((prepack::make_layout<std::int8_t>(plan, std::vector<int>{1, 2, 300, 4, 5})),
                       "token 2: id 300");
  EXPECT_PREPACK_ERROR((prepack::make_layout<std::int8_t>(plan, std::vector<int>{1, 2, 3, 4, 5},
                                                          {/*pad_id=*/200, 0})),
                       "pad id 200 does not fit the int8 token type");
  EXPECT_PREPACK_ERROR((prepack::make_layout<std::uint8_t>(plan, std::vector<int>{1, 2, 3, 4, 5},
                                                           {/*pad_id=*/-1, 0})),
                       "pad id -1 does not fit the uint8 token type");
}

TEST(LayoutErrors, IndexTypeTooSmallForTheTokenCount) {
  // 300 prompts of 200 tokens in an int16 layout: 60000 slots > 32767.
  const std::vector<int> len(300, 200);
  const auto plan = prepack::first_fit_decreasing(len);
  const std::vector<int> tokens(60000, 1);
  EXPECT_PREPACK_ERROR((prepack::make_layout<int, std::int16_t>(plan, tokens)),
                       "flat slot index 59999 does not fit the int16 index type");
  EXPECT_NO_THROW((prepack::make_layout<int, std::int32_t>(plan, tokens)));
}

TEST(LayoutErrors, CapacitiesNearTheTypesLimitFailCleanlyBeforeAllocating) {
  // Three rows of 2^63 slots: the slot count overflows size_t.
  const std::vector<std::uint64_t> huge{std::uint64_t{1} << 63, std::uint64_t{1} << 63, 5};
  const auto p = prepack::first_fit_decreasing(huge);
  ASSERT_EQ(p.n_rows(), 3u);
  EXPECT_PREPACK_ERROR(prepack::make_layout(p, std::vector<int>{}),
                       "tokens: 9223372036854775808 + 9223372036854775808 overflows size_t");
  const auto q = prepack::padded(std::vector<std::uint64_t>{1, 1}, prepack::padding_side::left,
                                 std::uint64_t{1} << 63);
  EXPECT_PREPACK_ERROR(prepack::make_layout(q, std::vector<int>{1, 2}),
                       "layout slots: 2 x 9223372036854775808 overflows size_t");
  // 2^40 slots fit size_t but not an int32 index: refused before any array is allocated.
  const auto r = prepack::padded(std::vector<std::int64_t>{1}, prepack::padding_side::left,
                                 std::int64_t{1} << 40);
  EXPECT_PREPACK_ERROR(prepack::make_layout(r, std::vector<int>{7}),
                       "row width 1099511627776 does not fit the int32 index type");
  // int8 lengths at their maximum capacity plan and lay out fine.
  const auto s8 =
      prepack::first_fit_decreasing(std::vector<std::int8_t>{127, 1, 126}, std::int8_t{127});
  EXPECT_EQ(s8.n_rows(), 2u);
  EXPECT_NO_THROW(prepack::make_layout(s8, std::vector<int>(254, 1)));
}

TEST(LayoutErrors, InconsistentPlansAreRefused) {
  const std::vector<int> len{2, 1, 1};  // rows {0} {1 2}
  const std::vector<int> tokens(4, 1);
  auto plan = prepack::first_fit_decreasing(len);
  auto p1 = plan;
  p1.offset[2] = 0;  // on top of prompt 1
  EXPECT_PREPACK_ERROR(prepack::make_layout(p1, tokens), "row 1: prompt 2 starts at slot 0");
  auto p0 = plan;
  p0.offset[2] = 2;
  EXPECT_PREPACK_ERROR(prepack::make_layout(p0, tokens),
                       "prompt 2: offset 2 + length 1 outside capacity 2");
  auto p2 = plan;
  p2.row[0] = 9;
  EXPECT_PREPACK_ERROR(prepack::make_layout(p2, tokens), "prompt 0: row 9 out of range");
  auto p3 = plan;
  p3.row_prompts[1] = p3.row_prompts[0];
  EXPECT_PREPACK_ERROR(prepack::make_layout(p3, tokens), "listed twice");
  auto p4 = plan;
  p4.fill[0] = 1;
  EXPECT_PREPACK_ERROR(prepack::make_layout(p4, tokens), "fill 1");
}

// Every value a layout stores fits its index type: a full row of width 128 has prompt length
// and cumulative end 128, which int8 cannot hold, though its largest slot number (127) fits.
TEST(LayoutErrors, ValuesOneAboveTheLastSlotFitTheIndexType) {
  const auto one_row = prepack::first_fit_decreasing({128});
  EXPECT_PREPACK_ERROR((prepack::make_layout<int, std::int8_t>(one_row, std::vector<int>(128, 1))),
                       "row width 128 does not fit the int8 index type");
  const auto fits = prepack::first_fit_decreasing({127});
  const auto l = prepack::make_layout<int, std::int8_t>(fits, std::vector<int>(127, 1));
  EXPECT_EQ(l.prompt_length()[0], 127);
  EXPECT_EQ(l.row_cu(0)[1], 127);
  const auto wide16 = prepack::first_fit_decreasing({32768});
  EXPECT_PREPACK_ERROR(
      (prepack::make_layout<int, std::int16_t>(wide16, std::vector<int>(32768, 1))),
      "row width 32768 does not fit the int16 index type");
}

// from_parts adopts hand-built arrays only after checking every invariant, and names the
// first violation; release() hands the arrays back to edit.
TEST(LayoutErrors, FromPartsRefusesInconsistentArrays) {
  const std::vector<int> len{3, 2, 2};
  const auto plan = prepack::first_fit_decreasing(len);
  const auto good = prepack::make_layout(plan, std::vector<int>(7, 1));
  using layout = prepack::packed_layout<int, int>;
  const auto edited = [&](auto edit) {
    auto parts = good.parts();
    edit(parts);
    return parts;
  };
  EXPECT_PREPACK_ERROR(layout::from_parts(edited([](auto& p) { p.segments[0] = 2; })),
                       "prompt 0: slot 0 holds segment 2");
  EXPECT_PREPACK_ERROR(layout::from_parts(edited([](auto& p) { p.tokens.pop_back(); })),
                       "arrays do not hold");
  EXPECT_PREPACK_ERROR(layout::from_parts(edited([](auto& p) { p.last_token[1] = 0; })),
                       "prompt 1: last token 0");
  EXPECT_PREPACK_ERROR(layout::from_parts(edited([](auto& p) { p.positions[1] = 7; })),
                       "prompt 0: slot 1 holds segment 0 position 7, expected 0 and 1");
  // A wrong but in-range offset: the prompt's slots no longer carry its segment id.
  EXPECT_PREPACK_ERROR(layout::from_parts(edited([](auto& p) { p.prompt_offset[1] = 1; })),
                       "layout: prompt 1: last token 4, expected 5");
  EXPECT_PREPACK_ERROR(layout::from_parts(edited([](auto& p) { p.row_cu_seqlens[1] = 2; })),
                       "cu_seqlens disagree");
  // Pad slots carry -1 and nothing else (rows of width 3 hold 3 | 2 + pad | 2 + pad).
  const auto pad = static_cast<std::size_t>(
      std::find(good.segments().begin(), good.segments().end(), -1) - good.segments().begin());
  ASSERT_LT(pad, good.n_slots());
  EXPECT_PREPACK_ERROR(layout::from_parts(edited([&](auto& p) { p.segments[pad] = -2; })),
                       "holds segment -2 (a pad slot's segment is -1)");
  // Released arrays, edited back into shape, are adopted.
  auto parts = layout(good).release();
  parts.tokens[0] = 9;
  EXPECT_EQ(layout::from_parts(std::move(parts)).tokens()[0], 9);
}

// Offset tables checked only at their ends were indexed out of bounds (under AddressSanitizer:
// a heap-buffer-overflow in the checker): every validator checks monotonicity first.
TEST(LayoutErrors, RowBeginOutOfOrderIsRefusedBeforeItIsIndexed) {
  // Two prompts, one per row, and row_begin {0, 3, 2}: right at both ends, row 0 past the end.
  const std::vector<int> len{2, 2};
  const auto plan = prepack::padded(len, prepack::padding_side::right);
  const auto good = prepack::make_layout(plan, std::vector<int>(4, 1));
  auto parts = good.parts();
  ASSERT_EQ(parts.row_begin.size(), 3u);
  parts.row_begin = {0, 3, 2};
  EXPECT_PREPACK_ERROR((prepack::packed_layout<int, int>::from_parts(parts)),
                       "row_begin[1] = 3 > row_begin[2] = 2");
  // The same on a hand-edited plan handed to make_layout.
  auto edited = plan;
  edited.row_begin = {0, 3, 2};
  EXPECT_PREPACK_ERROR(prepack::make_layout(edited, std::vector<int>(4, 1)),
                       "plan: row_begin[1] = 3 > row_begin[2] = 2");
}

}  // namespace
