// Tests of prepack/plan.hpp: the planners' invariants on random instances, equality with naive
// first-fit / best-fit written here, the FFD bound against a brute-force optimum, baselines,
// length types, projections and every documented error.
#include "prepack/plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common.hpp"

namespace {

using prepack::pack_plan;

// Every prompt placed exactly once, inside its row, rows never overfull nor overlapping, and the
// per-row tables agree with the per-prompt ones.
template <class L>
void expect_valid_plan(const std::vector<L>& len, const pack_plan<L>& p, L capacity) {
  const std::size_t n = len.size();
  ASSERT_EQ(p.n_prompts(), n);
  ASSERT_EQ(p.capacity, capacity);
  ASSERT_EQ(p.row.size(), n);
  ASSERT_EQ(p.offset.size(), n);
  ASSERT_EQ(p.row_begin.size(), p.n_rows() + 1);
  ASSERT_EQ(p.row_prompts.size(), n);
  std::vector<std::vector<int>> occupant(p.n_rows(),
                                         std::vector<int>(static_cast<std::size_t>(capacity), -1));
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(p.length[i], len[i]);
    ASSERT_LT(p.row[i], p.n_rows());
    ASSERT_LE(static_cast<long long>(p.offset[i]) + static_cast<long long>(len[i]),
              static_cast<long long>(capacity));
    for (L t = 0; t < len[i]; ++t) {
      int& o = occupant[p.row[i]][static_cast<std::size_t>(p.offset[i] + t)];
      ASSERT_EQ(o, -1) << "prompt " << i << " overlaps prompt " << o;
      o = static_cast<int>(i);
    }
  }
  std::vector<int> seen(n, 0);
  for (std::size_t r = 0; r < p.n_rows(); ++r) {
    long long used = 0;
    ASSERT_LT(p.row_begin[r], p.row_begin[r + 1]) << "row " << r << " is empty";
    for (std::size_t k = p.row_begin[r]; k < p.row_begin[r + 1]; ++k) {
      const std::size_t i = p.row_prompts[k];
      ASSERT_EQ(p.row[i], r);
      ++seen[i];
      if (k > p.row_begin[r]) {
        const std::size_t prev = p.row_prompts[k - 1];
        EXPECT_EQ(p.offset[i], p.offset[prev] + p.length[prev]) << "row " << r << " has a gap";
      }
      used += static_cast<long long>(len[i]);
    }
    ASSERT_EQ(used, static_cast<long long>(p.fill[r]));
    ASSERT_LE(used, static_cast<long long>(capacity));
  }
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], 1) << "prompt " << i;
}

// Naive first-fit / best-fit decreasing, O(n * rows): the definitions, written independently.
struct naive_result {
  std::vector<std::size_t> row;
  std::vector<long long> offset;
  std::size_t n_rows = 0;
};

naive_result naive_fit_decreasing(const std::vector<int>& len, int cap, bool best) {
  std::vector<std::size_t> order(len.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return len[a] > len[b]; });
  std::vector<long long> used;
  naive_result out{std::vector<std::size_t>(len.size()), std::vector<long long>(len.size()), 0};
  for (std::size_t i : order) {
    std::size_t chosen = used.size();
    for (std::size_t r = 0; r < used.size(); ++r) {
      if (used[r] + len[i] > cap) continue;
      if (!best) {
        chosen = r;
        break;
      }
      if (chosen == used.size() || used[r] > used[chosen]) chosen = r;
    }
    if (chosen == used.size()) used.push_back(0);
    out.row[i] = chosen;
    out.offset[i] = used[chosen];
    used[chosen] += len[i];
  }
  out.n_rows = used.size();
  return out;
}

// Exact minimum number of bins, by branch and bound over items in decreasing order.
std::size_t optimum_rows(std::vector<int> len, int cap) {
  std::sort(len.rbegin(), len.rend());
  std::size_t best = len.size();
  std::vector<int> bins;
  std::function<void(std::size_t)> go = [&](std::size_t k) {
    if (bins.size() >= best) return;
    if (k == len.size()) {
      best = bins.size();
      return;
    }
    for (std::size_t b = 0; b < bins.size(); ++b) {
      if (bins[b] + len[k] > cap) continue;
      bool dup = false;  // skip bins with the same load as an earlier one: same subtree
      for (std::size_t c = 0; c < b; ++c) dup = dup || bins[c] == bins[b];
      if (dup) continue;
      bins[b] += len[k];
      go(k + 1);
      bins[b] -= len[k];
    }
    bins.push_back(len[k]);
    go(k + 1);
    bins.pop_back();
  };
  go(0);
  return best;
}

TEST(Plan, RandomInstancesAreValidAndMatchNaiveFitDecreasing) {
  std::mt19937_64 rng(2024);
  for (int trial = 0; trial < 3000; ++trial) {
    const std::size_t n = 1 + rng() % 120;
    const int hi = 1 + static_cast<int>(rng() % 300);
    auto len = test::random_lengths(rng, n, 1, hi);
    const int longest = *std::max_element(len.begin(), len.end());
    const bool larger = trial % 3 == 0;
    const int cap = larger ? longest + static_cast<int>(rng() % 200) : longest;
    const std::optional<int> given = larger ? std::optional<int>(cap) : std::nullopt;
    for (bool best : {false, true}) {
      const auto p = best ? prepack::best_fit_decreasing(len, given)
                          : prepack::first_fit_decreasing(len, given);
      expect_valid_plan(len, p, cap);
      const naive_result ref = naive_fit_decreasing(len, cap, best);
      ASSERT_EQ(p.n_rows(), ref.n_rows) << "trial " << trial << (best ? " bfd" : " ffd");
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_EQ(p.row[i], ref.row[i]) << "trial " << trial << " prompt " << i;
        ASSERT_EQ(p.offset[i], ref.offset[i]) << "trial " << trial << " prompt " << i;
      }
    }
  }
}

TEST(Plan, HeavyTailedInstancesAreValid) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    auto len = test::heavy_tailed_lengths(rng, 1 + rng() % 2000, 2048);
    const int cap = *std::max_element(len.begin(), len.end());
    expect_valid_plan(len, prepack::first_fit_decreasing(len), cap);
    expect_valid_plan(len, prepack::best_fit_decreasing(len), cap);
  }
}

TEST(Plan, FitDecreasingWithinBoundOfBruteForceOptimum) {
  std::mt19937_64 rng(11);
  int strictly_worse = 0;
  for (int trial = 0; trial < 1500; ++trial) {
    const std::size_t n = 1 + rng() % 11;
    const int cap = 2 + static_cast<int>(rng() % 30);
    auto len = test::random_lengths(rng, n, 1, cap);
    const std::size_t opt = optimum_rows(len, cap);
    for (bool best : {false, true}) {
      const auto p = best ? prepack::best_fit_decreasing(len, std::optional<int>(cap))
                          : prepack::first_fit_decreasing(len, std::optional<int>(cap));
      ASSERT_GE(p.n_rows(), opt);
      // 9 * rows <= 11 * OPT + 6 (Dosa, 2007), in integers.
      ASSERT_LE(9 * p.n_rows(), 11 * opt + 6)
          << "trial " << trial << ": " << p.n_rows() << " rows, optimum " << opt;
      strictly_worse += p.n_rows() > opt ? 1 : 0;
    }
  }
  // The brute force must disagree sometimes, or it is not testing anything.
  EXPECT_GT(strictly_worse, 0);
}

TEST(Plan, KnownWorstCaseForFirstFitDecreasing) {
  // Classic instance: OPT = 2 rows of 60, FFD needs 3 ({31 25 ...}).
  const std::vector<int> len{31, 26, 25, 19, 19, 20};
  const std::size_t opt = optimum_rows(len, 70);
  const auto p = prepack::first_fit_decreasing(len, std::optional<int>(70));
  EXPECT_LE(9 * p.n_rows(), 11 * opt + 6);
  EXPECT_EQ(opt, 2u);
  EXPECT_EQ(p.n_rows(), 3u);  // 31+26 | 25+20+19 | 19, worked by hand
}

TEST(Plan, CapacityDefaultsToLongestPrompt) {
  const std::vector<int> len{5, 3, 9, 1};
  EXPECT_EQ(prepack::first_fit_decreasing(len).capacity, 9);
  EXPECT_EQ(prepack::best_fit_decreasing(len).capacity, 9);
  EXPECT_EQ(prepack::padded(len).capacity, 9);
  EXPECT_EQ(prepack::first_fit_decreasing(len, 40).n_rows(), 1u);
}

TEST(Plan, EqualLengthsKeepArrivalOrderAndPlansAreDeterministic) {
  const std::vector<int> len(10, 4);
  const auto p = prepack::first_fit_decreasing(len, 12);
  ASSERT_EQ(p.n_rows(), 4u);
  for (std::size_t k = 0; k < 10; ++k) EXPECT_EQ(p.row_prompts[k], k);
  std::mt19937_64 rng(3);
  auto r = test::random_lengths(rng, 500, 1, 64);
  const auto a = prepack::best_fit_decreasing(r), b = prepack::best_fit_decreasing(r);
  EXPECT_EQ(a.row, b.row);
  EXPECT_EQ(a.offset, b.offset);
}

TEST(Plan, PaddedPlansPutOnePromptPerRow) {
  const std::vector<int> len{3, 7, 1};
  const auto left = prepack::padded(len, prepack::padding_side::left);
  const auto right = prepack::padded(len, prepack::padding_side::right);
  expect_valid_plan(len, left, 7);
  expect_valid_plan(len, right, 7);
  for (std::size_t i = 0; i < len.size(); ++i) {
    EXPECT_EQ(left.row[i], i);
    EXPECT_EQ(left.offset[i], 7 - len[i]);
    EXPECT_EQ(right.offset[i], 0);
  }
  EXPECT_EQ(left.slots(), 21u);
  EXPECT_EQ(left.useful_tokens(), 11u);
}

TEST(Plan, BatchFormers) {
  const auto a = prepack::arrival_batches(7, 3);
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a[0], (std::vector<std::size_t>{0, 1, 2}));
  EXPECT_EQ(a[2], (std::vector<std::size_t>{6}));
  const std::vector<int> len{2, 9, 4, 9, 1};
  const auto s = prepack::length_sorted_batches(prepack::span<const int>(len), 2);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0], (std::vector<std::size_t>{1, 3}));
  EXPECT_EQ(s[1], (std::vector<std::size_t>{2, 0}));
  EXPECT_EQ(s[2], (std::vector<std::size_t>{4}));
  const std::vector<std::size_t> ids{3, 4};
  EXPECT_EQ(prepack::select(prepack::span<const int>(len), prepack::span<const std::size_t>(ids)),
            (std::vector<int>{9, 1}));
  EXPECT_PREPACK_ERROR(prepack::arrival_batches(0, 3), "empty batch");
  EXPECT_PREPACK_ERROR(prepack::arrival_batches(3, 0), "batch size 0");
  const std::vector<std::size_t> bad{5};
  EXPECT_PREPACK_ERROR(
      prepack::select(prepack::span<const int>(len), prepack::span<const std::size_t>(bad)),
      "prompt 5 out of range");
}

TEST(Plan, SplitRowsCutsADatasetPlanIntoValidBatches) {
  std::mt19937_64 rng(13);
  for (int trial = 0; trial < 200; ++trial) {
    const auto len = test::random_lengths(rng, 1 + rng() % 200, 1, 100);
    const auto whole = prepack::first_fit_decreasing(len);
    const std::size_t per = 1 + rng() % 7;
    const auto batches = prepack::split_rows(whole, per);
    ASSERT_EQ(batches.size(), (whole.n_rows() + per - 1) / per);
    std::vector<int> seen(len.size(), 0);
    for (const auto& b : batches) {
      ASSERT_LE(b.plan.n_rows(), per);
      std::vector<int> sub(b.prompts.size());
      for (std::size_t k = 0; k < b.prompts.size(); ++k) {
        const std::size_t i = b.prompts[k];
        ++seen[i];
        sub[k] = len[i];
        // Each prompt keeps its row (shifted) and its offset.
        ASSERT_EQ(b.plan.row[k] + b.first_row, whole.row[i]);
        ASSERT_EQ(b.plan.offset[k], whole.offset[i]);
      }
      expect_valid_plan(sub, b.plan, whole.capacity);
    }
    for (int c : seen) ASSERT_EQ(c, 1);
  }
  EXPECT_PREPACK_ERROR(prepack::split_rows(prepack::first_fit_decreasing(std::vector<int>{1}), 0),
                       "rows per batch 0");
}

struct request {
  std::string name;
  std::vector<int> tokens;
};

TEST(Plan, ArbitraryItemsThroughAProjection) {
  std::vector<request> reqs{
      {"a", std::vector<int>(5)}, {"b", std::vector<int>(2)}, {"c", std::vector<int>(3)}};
  const auto p = prepack::make_plan(prepack::packer::first_fit_decreasing, reqs,
                                    [](const request& r) { return r.tokens.size(); });
  static_assert(std::is_same_v<decltype(p)::length_type, std::size_t>);
  EXPECT_EQ(p.capacity, 5u);
  EXPECT_EQ(p.n_rows(), 2u);
  EXPECT_EQ(p.row[1], p.row[2]);
}

template <class L>
class PlanLengthTypes : public ::testing::Test {};
using length_types = ::testing::Types<std::int8_t, std::uint8_t, std::int16_t, std::uint16_t,
                                      std::int32_t, std::uint32_t, std::int64_t, std::uint64_t>;
TYPED_TEST_SUITE(PlanLengthTypes, length_types);

TYPED_TEST(PlanLengthTypes, PlansAreValidAtTheTypesLimits) {
  using L = TypeParam;
  std::mt19937_64 rng(5);
  const long long max = static_cast<long long>(std::min<unsigned long long>(
      static_cast<unsigned long long>(std::numeric_limits<L>::max()), 1ull << 40));
  for (int trial = 0; trial < 200; ++trial) {
    auto len = test::random_lengths<L>(rng, 1 + rng() % 50, 1, max);
    const L cap = std::numeric_limits<L>::max();  // a capacity at the type's maximum
    // Occupancy checks need small capacities; check the big ones through the naive rows count.
    const auto p = prepack::first_fit_decreasing(len, cap);
    const auto b = prepack::best_fit_decreasing(len, cap);
    ASSERT_EQ(p.capacity, cap);
    for (const auto* plan : {&p, &b}) {
      for (std::size_t i = 0; i < len.size(); ++i) {
        ASSERT_LE(static_cast<unsigned long long>(plan->offset[i]),
                  static_cast<unsigned long long>(cap - len[i]));
      }
      unsigned long long total = 0;
      for (L f : plan->fill) total += static_cast<unsigned long long>(f);
      unsigned long long want = 0;
      for (L v : len) want += static_cast<unsigned long long>(v);
      ASSERT_EQ(total, want);
    }
  }
  if (max <= 300) {
    auto len = test::random_lengths<L>(rng, 40, 1, max);
    const L longest = *std::max_element(len.begin(), len.end());
    expect_valid_plan(len, prepack::first_fit_decreasing(len), longest);
  }
}

// fitted_plan against the definitions, by brute force over every width: a valid plan that is
// exactly the naive packing at the width it picked; when some width up to the bound meets the
// padding budget, the narrowest such width; otherwise the width with the fewest slots (the
// narrowest among equals). Bounded and unbounded widths.
TEST(FittedPlan, NarrowestWidthMeetingTheBudgetElseFewestSlots) {
  std::mt19937_64 rng(11);
  int widened = 0, out_of_reach = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const std::size_t n = 1 + rng() % 48;
    std::vector<int> len;
    switch (trial % 3) {
      case 0:  // uniform
        len = test::random_lengths(rng, n, 1, 120);
        break;
      case 1:  // mildly varied: every pair overflows the longest, so the paper's rows pad
        len = test::random_lengths(rng, n, 64, 120);
        break;
      default:  // one long prompt and short ones
        len = test::random_lengths(rng, n, 1, 12);
        len[rng() % n] = 120;
        break;
    }
    const int longest = *std::max_element(len.begin(), len.end());
    const long long total = std::accumulate(len.begin(), len.end(), 0ll);
    for (double max_pad : {0.0, 0.02, 0.05, 0.3}) {
      for (bool best : {false, true}) {
        for (bool bounded : {false, true}) {
          const auto kind =
              best ? prepack::packer::best_fit_decreasing : prepack::packer::first_fit_decreasing;
          const long long widest =
              bounded ? std::min<long long>(total, longest + static_cast<long long>(rng() % 60))
                      : total;
          prepack::fit_options opt{max_pad, std::nullopt};
          if (bounded) opt.max_capacity = static_cast<unsigned long long>(widest);
          const auto p = prepack::fitted_plan(kind, len, opt);
          const std::string where = "trial " + std::to_string(trial) + " max_pad " +
                                    std::to_string(max_pad) + (best ? " bfd" : " ffd") +
                                    " widest " + std::to_string(widest);
          ASSERT_GE(p.capacity, longest) << where;
          ASSERT_LE(p.capacity, widest) << where;
          expect_valid_plan(len, p, p.capacity);
          const naive_result ref = naive_fit_decreasing(len, p.capacity, best);
          ASSERT_EQ(p.n_rows(), ref.n_rows) << where;
          for (std::size_t i = 0; i < n; ++i) {
            ASSERT_EQ(p.row[i], ref.row[i]) << where << " prompt " << i;
            ASSERT_EQ(p.offset[i], ref.offset[i]) << where << " prompt " << i;
          }
          // Brute force: the slots of every width.
          long long narrowest_within = -1, fewest_width = -1, fewest = -1;
          for (long long w = longest; w <= widest; ++w) {
            const long long s = static_cast<long long>(
                                    naive_fit_decreasing(len, static_cast<int>(w), best).n_rows) *
                                w;
            if (narrowest_within < 0 &&
                static_cast<double>(s) <= static_cast<double>(total) * (1 + max_pad)) {
              narrowest_within = w;
            }
            if (fewest < 0 || s < fewest) {
              fewest = s;
              fewest_width = w;
            }
          }
          if (narrowest_within >= 0) {
            ASSERT_EQ(p.capacity, narrowest_within) << where;
            widened += p.capacity > longest ? 1 : 0;
          } else {
            ASSERT_EQ(p.capacity, fewest_width) << where;
            ++out_of_reach;
          }
          if (max_pad == 0.0 && !bounded) {
            ASSERT_EQ(static_cast<long long>(p.slots()), total) << where;
          }
        }
      }
    }
  }
  // The instances exercise the search, not only the paper's width, and the fallback.
  EXPECT_GT(widened, 1000);
  EXPECT_GT(out_of_reach, 100);
}

// The smallest case where trying only doubled widths misses: 9 | 6 + 4 at width 10.
TEST(FittedPlan, FindsAWidthBetweenTheLongestAndTheBound) {
  const auto p = prepack::fitted_plan(prepack::packer::first_fit_decreasing, {9, 4, 6}, {0.3, 16});
  EXPECT_EQ(p.capacity, 10);
  EXPECT_EQ(p.n_rows(), 2u);
}

// max_packings bounds the search: {5, 6, 3} at 20% padding (16.8 slots) needs two packings
// (width 6 is ruled out by its bound; 7 packs 6 | 5 | 3, 21 slots; 8 packs 6 | 5 3, 16 slots),
// so a limit of one is an error naming it and a limit of two gives the answer.
TEST(FittedPlan, MaxPackingsBoundsTheSearch) {
  const std::vector<int> len{5, 6, 3};
  const prepack::fit_options opt{0.2, {}};
  EXPECT_PREPACK_ERROR(
      prepack::fitted_plan(prepack::packer::first_fit_decreasing, len, opt, 1),
      "fitted_plan: 1 packings (max_packings) searched widths up to 8 without an answer");
  EXPECT_EQ(prepack::fitted_plan(prepack::packer::first_fit_decreasing, len, opt, 2).capacity, 8);
  // Lengths of billions of tokens spanning orders of magnitude: best-fit changes packing every
  // few widths for a long way (the fuzzer's input; about 2 x 10^5 packings unbounded).
  const std::vector<std::uint32_t> wide{
      1712394255u, 1785292903u, 1852664939u, 1920036975u, 1987409011u, 2054781047u, 2122153083u,
      201393213u,  83886080u,   50331648u,   134217728u,  150994944u,  16777216u,   83887104u,
      50331648u,   131072u,     12u,         5u,          3u,          8u,          9u,
      262145u,     3u,          1024u,       3072u,       256u,        1024u,       2172681984u,
      2240054146u, 2575861638u, 2644286362u, 2711658398u, 2779030434u, 2846402470u, 43946u,
      2997989464u, 3065361587u, 3132733687u, 33u,         1073741824u, 3318006716u};
  EXPECT_PREPACK_ERROR(
      prepack::fitted_plan(prepack::packer::best_fit_decreasing, wide, {0.1875, {}}, 1000),
      "fitted_plan: 1000 packings (max_packings)");
}

TEST(FittedPlan, MaxCapacityBoundsTheWidth) {
  const std::vector<int> len{10, 6, 6, 6};
  // No width up to 12 removes every pad slot: 10 gives 4 rows (40 slots), 12 gives 3 (36).
  const auto p = prepack::fitted_plan(prepack::packer::first_fit_decreasing, len, {0.0, 12});
  expect_valid_plan(len, p, 12);
  EXPECT_EQ(p.n_rows(), 3u);
  // A budget reachable under the bound: 40% padding (39.2 slots) is missed at widths 10 and 11
  // (4 rows) and met at 12 (3 rows, 36 slots) and 13 (39 slots); the narrower wins.
  const auto q = prepack::fitted_plan(prepack::packer::first_fit_decreasing, len, {0.4, 13});
  EXPECT_EQ(q.capacity, 12);
  EXPECT_EQ(q.n_rows(), 3u);
  // Unbounded, a budget of 0 puts everything in one row of the total.
  const auto r = prepack::fitted_plan(prepack::packer::best_fit_decreasing, len, {0.0, {}});
  EXPECT_EQ(r.capacity, 28);
  EXPECT_EQ(r.n_rows(), 1u);
}

TEST(FittedPlan, WidthStopsAtTheLengthTypesMaximum) {
  const std::vector<std::int8_t> len{100, 100, 27};  // 227 tokens do not fit one int8 row
  const auto p = prepack::fitted_plan(prepack::packer::first_fit_decreasing, len, {0.0, {}});
  EXPECT_EQ(p.capacity, 127);
  expect_valid_plan(len, p, std::int8_t{127});
  EXPECT_EQ(p.n_rows(), 2u);  // 100 + 27 | 100: fewer slots (254) than the paper's 300
}

TEST(FittedPlan, Errors) {
  const auto ffd = prepack::packer::first_fit_decreasing;
  EXPECT_PREPACK_ERROR(prepack::fitted_plan(ffd, std::vector<int>{}), "empty batch");
  EXPECT_PREPACK_ERROR(prepack::fitted_plan(ffd, std::vector<int>{4, 0}), "prompt 1: length 0");
  EXPECT_PREPACK_ERROR(prepack::fitted_plan(ffd, std::vector<int>{4}, {-0.5, {}}),
                       "max_pad -0.5 (must be a number >= 0)");
  EXPECT_PREPACK_ERROR(prepack::fitted_plan(ffd, std::vector<int>{4},
                                            {std::numeric_limits<double>::quiet_NaN(), {}}),
                       "max_pad nan");
  EXPECT_PREPACK_ERROR(prepack::fitted_plan(ffd, std::vector<int>{4, 9}, {0.1, 5}),
                       "prompt 1: length 9 exceeds max capacity 5");
  EXPECT_PREPACK_ERROR(prepack::fitted_plan(ffd, std::vector<int>{4}, {0.1, 0}), "max capacity 0");
}

// Every planner takes a span, a container or a braced list, with or without the length type
// spelled out.
TEST(Plan, LengthsAsSpansContainersAndBracedLists) {
  const std::vector<int> v{5, 2, 3};
  const std::array<int, 3> a{5, 2, 3};
  const auto reference = prepack::first_fit_decreasing(prepack::span<const int>(v));
  EXPECT_EQ(prepack::first_fit_decreasing<int>({5, 2, 3}).row, reference.row);
  EXPECT_EQ(prepack::first_fit_decreasing({5, 2, 3}).row, reference.row);
  EXPECT_EQ(prepack::first_fit_decreasing(a).row, reference.row);
  EXPECT_EQ(prepack::best_fit_decreasing<int>({5, 2, 3}, 8).n_rows(), 2u);
  EXPECT_EQ(prepack::padded({5, 2, 3}).n_rows(), 3u);
  EXPECT_EQ(prepack::length_sorted_batches(v, 2),
            (std::vector<std::vector<std::size_t>>{{0, 2}, {1}}));
  EXPECT_EQ(prepack::length_sorted_batches({5, 2, 3}, 2).size(), 2u);
  const std::vector<std::size_t> ids{2, 0};
  EXPECT_EQ(prepack::select(v, ids), (std::vector<int>{3, 5}));
}

TEST(PlanErrors, NameTheOffendingPromptAndValue) {
  EXPECT_PREPACK_ERROR(prepack::first_fit_decreasing(std::vector<int>{}), "empty batch");
  EXPECT_PREPACK_ERROR(prepack::first_fit_decreasing(std::vector<int>{3, 4, 5, 6, 7, 8, 9, 0}),
                       "prompt 7: length 0");
  EXPECT_PREPACK_ERROR(prepack::best_fit_decreasing(std::vector<int>{3, -2}),
                       "prompt 1: length -2");
  EXPECT_PREPACK_ERROR(prepack::first_fit_decreasing(std::vector<int>{3}, 0), "capacity 0");
  EXPECT_PREPACK_ERROR(prepack::first_fit_decreasing(std::vector<int>{3}, -5), "capacity -5");
  EXPECT_PREPACK_ERROR(prepack::best_fit_decreasing(std::vector<int>{3, 9}, 8),
                       "prompt 1: length 9 exceeds capacity 8");
  EXPECT_PREPACK_ERROR(prepack::padded(std::vector<std::int8_t>{3, -1}), "prompt 1: length -1");
  EXPECT_PREPACK_ERROR(prepack::length_sorted_batches(prepack::span<const int>(), 4),
                       "empty batch");
}

}  // namespace
