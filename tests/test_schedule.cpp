// Tests of prepack/schedule.hpp: on random prompt sets and budgets (below the shortest prompt,
// primes, 1, up to the total), every token of every prompt is scheduled exactly once, in order,
// chunk k + 1 in a later step than chunk k, no step over the budget; `fill` uses exactly the
// lower bound; `whole_first` chunks only prompts longer than the budget and equals a naive
// first-fit-decreasing written here; dependencies are respected; errors name the item.
#include "prepack/schedule.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common.hpp"

namespace {

// The definitions every schedule meets.
void expect_valid(const prepack::step_schedule& s, const std::vector<prepack::schedule_item>& items,
                  const std::string& where) {
  ASSERT_EQ(s.n_items(), items.size()) << where;
  ASSERT_EQ(s.step_begin.front(), 0u);
  ASSERT_EQ(s.step_begin.back(), s.chunks.size());
  std::vector<std::size_t> next(items.size(), 0), last_step(items.size(), 0);
  std::vector<bool> started(items.size(), false);
  for (std::size_t st = 0; st < s.n_steps(); ++st) {
    ASSERT_LE(s.step_tokens(st), s.budget) << where << " step " << st;
    ASSERT_GT(s.step(st).size(), 0u) << where << ": step " << st << " is empty";
    std::vector<bool> in_step(items.size(), false);
    for (const prepack::chunk& c : s.step(st)) {
      ASSERT_LT(c.item, items.size());
      ASSERT_FALSE(in_step[c.item]) << where << ": prompt " << c.item << " twice in step " << st;
      in_step[c.item] = true;
      ASSERT_EQ(c.start, next[c.item]) << where << ": prompt " << c.item << " out of order";
      ASSERT_GT(c.length, 0u);
      ASSERT_EQ(c.context, items[c.item].context + c.start);
      if (started[c.item]) {
        ASSERT_GT(st, last_step[c.item]);
      }
      if (!started[c.item] && items[c.item].after) {
        ASSERT_GT(st, s.finish_step[*items[c.item].after])
            << where << ": prompt " << c.item << " starts before the item it follows ends";
      }
      started[c.item] = true;
      next[c.item] += c.length;
      last_step[c.item] = st;
      ASSERT_EQ(c.last, next[c.item] == items[c.item].length);
    }
  }
  for (std::size_t i = 0; i < items.size(); ++i) {
    ASSERT_EQ(next[i], items[i].length) << where << ": prompt " << i << " not fully scheduled";
    ASSERT_EQ(s.finish_step[i], last_step[i]);
  }
}

// Naive whole-first: longest first (ties by index), whole into the earliest step with room;
// longer than the budget: full chunks then the rest, each into the earliest step with room
// after the previous one. Linear scans over steps.
std::vector<std::vector<std::pair<std::size_t, std::size_t>>> naive_whole_first(
    const std::vector<std::size_t>& len, std::size_t budget) {
  std::vector<std::size_t> order(len.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return len[a] > len[b]; });
  std::vector<std::size_t> room;
  std::vector<std::vector<std::pair<std::size_t, std::size_t>>> steps;  // (item, length)
  for (std::size_t i : order) {
    std::size_t done = 0, from = 0;
    while (done < len[i]) {
      const std::size_t piece = std::min(budget, len[i] - done);
      std::size_t s = from;
      while (s < room.size() && room[s] < piece) ++s;
      if (s == room.size()) {
        room.push_back(budget);
        steps.emplace_back();
      }
      room[s] -= piece;
      steps[s].emplace_back(i, piece);
      done += piece;
      from = s + 1;
    }
  }
  return steps;
}

std::vector<std::size_t> random_lengths(std::mt19937_64& rng, int kind) {
  switch (kind % 3) {
    case 0:
      return test::random_lengths<std::size_t>(rng, 1 + rng() % 30, 1, 200);
    case 1: {
      auto l = test::random_lengths<std::size_t>(rng, 1 + rng() % 20, 1, 20);
      l[rng() % l.size()] = 300 + rng() % 400;
      return l;
    }
    default: {
      auto h = test::heavy_tailed_lengths(rng, 1 + rng() % 40, 600);
      return std::vector<std::size_t>(h.begin(), h.end());
    }
  }
}

TEST(Schedule, RandomPromptsAndBudgets) {
  std::mt19937_64 rng(71);
  int chunked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const auto len = random_lengths(rng, trial);
    const std::size_t total = std::accumulate(len.begin(), len.end(), std::size_t{0});
    const std::size_t shortest = *std::min_element(len.begin(), len.end());
    const std::size_t budgets[] = {
        1, std::max<std::size_t>(1, shortest / 2), 7, 13, 97, 1 + rng() % total, total};
    std::vector<prepack::schedule_item> items;
    for (std::size_t l : len) items.push_back({l, 0, std::nullopt});
    for (std::size_t budget : budgets) {
      for (auto order : {prepack::schedule_order::arrival, prepack::schedule_order::shortest_first,
                         prepack::schedule_order::longest_first}) {
        const auto fill = prepack::budgeted_schedule(len, {budget, prepack::chunking::fill, order});
        const std::string where =
            "trial " + std::to_string(trial) + " budget " + std::to_string(budget);
        expect_valid(fill, items, where + " fill");
        ASSERT_EQ(fill.n_steps(), fill.lower_bound()) << where;
        ASSERT_EQ(fill.lower_bound(), (total + budget - 1) / budget);
        // Every step but the last is full.
        for (std::size_t st = 0; st + 1 < fill.n_steps(); ++st) {
          ASSERT_EQ(fill.step_tokens(st), budget);
        }
      }
      const auto whole = prepack::budgeted_schedule(len, {budget, prepack::chunking::whole_first});
      const std::string where =
          "trial " + std::to_string(trial) + " budget " + std::to_string(budget) + " whole_first";
      expect_valid(whole, items, where);
      ASSERT_GE(whole.n_steps(), whole.lower_bound());
      for (const prepack::chunk& c : whole.chunks) {
        if (len[c.item] <= budget) {
          ASSERT_EQ(c.length, len[c.item]) << where << " chunked";
        }
      }
      chunked += static_cast<int>(whole.n_chunked());
      const auto naive = naive_whole_first(len, budget);
      ASSERT_EQ(whole.n_steps(), naive.size()) << where;
      for (std::size_t st = 0; st < naive.size(); ++st) {
        ASSERT_EQ(whole.step(st).size(), naive[st].size()) << where << " step " << st;
        for (std::size_t k = 0; k < naive[st].size(); ++k) {
          ASSERT_EQ(whole.step(st)[k].item, naive[st][k].first) << where;
          ASSERT_EQ(whole.step(st)[k].length, naive[st][k].second) << where;
        }
      }
    }
  }
  EXPECT_GT(chunked, 1000);
}

TEST(Schedule, OrdersOfFill) {
  const std::vector<int> len{5, 1, 3};
  const auto arrival = prepack::budgeted_schedule(len, {4, prepack::chunking::fill});
  // [5: 4] [5: 1, 1, 3: 2] [3: 1]
  ASSERT_EQ(arrival.n_steps(), 3u);
  EXPECT_EQ(arrival.step(0)[0].item, 0u);
  EXPECT_EQ(arrival.step(1).size(), 3u);
  const auto shortest = prepack::budgeted_schedule(
      len, {4, prepack::chunking::fill, prepack::schedule_order::shortest_first});
  EXPECT_EQ(shortest.step(0)[0].item, 1u);  // 1, then 3: step 0 full with the two short ones
  EXPECT_EQ(shortest.step(0)[1].item, 2u);
  EXPECT_EQ(shortest.finish_step[1], 0u);
  EXPECT_EQ(shortest.finish_step[2], 0u);
}

TEST(Schedule, DependenciesRunAfterTheirItem) {
  std::mt19937_64 rng(73);
  for (int trial = 0; trial < 200; ++trial) {
    // A few prefixes and suffixes that follow them (with the prefix's length as context),
    // some suffixes themselves followed (nested prefixes).
    std::vector<prepack::schedule_item> items;
    const std::size_t n = 2 + rng() % 20;
    for (std::size_t i = 0; i < n; ++i) {
      prepack::schedule_item it;
      it.length = 1 + rng() % 150;
      if (i > 0 && rng() % 3 != 0) {
        const std::size_t a = rng() % i;
        it.after = a;
        it.context = items[a].context + items[a].length;
      }
      items.push_back(it);
    }
    for (std::size_t budget :
         {std::size_t{1}, std::size_t{16}, std::size_t{61}, std::size_t{400}}) {
      for (auto policy : {prepack::chunking::fill, prepack::chunking::whole_first}) {
        const auto s = prepack::budgeted_schedule(items, {budget, policy});
        expect_valid(s, items, "trial " + std::to_string(trial));
      }
    }
  }
}

TEST(ScheduleErrors, NameTheItem) {
  // An empty batch is a schedule of zero steps, which its checker accepts.
  const auto none = prepack::budgeted_schedule(std::vector<int>{}, {4});
  EXPECT_EQ(none.n_steps(), 0u);
  EXPECT_EQ(none.n_items(), 0u);
  EXPECT_NO_THROW(prepack::check_schedule(none));
  EXPECT_PREPACK_ERROR(prepack::budgeted_schedule(std::vector<int>{3, 0}, {4}),
                       "prompt 1: length 0");
  EXPECT_PREPACK_ERROR(prepack::budgeted_schedule(std::vector<int>{3, -2}, {4}),
                       "prompt 1: length -2");
  EXPECT_PREPACK_ERROR(prepack::budgeted_schedule(std::vector<int>{3}, {0}), "budget 0");
  std::vector<prepack::schedule_item> loop{{2, 0, 1}, {2, 0, 0}};
  EXPECT_PREPACK_ERROR(prepack::budgeted_schedule(loop, {4}), "loops back");
  std::vector<prepack::schedule_item> self{{2, 0, 0}};
  EXPECT_PREPACK_ERROR(prepack::budgeted_schedule(self, {4}), "item 0: after 0 is not another");
  std::vector<prepack::schedule_item> far{{2, 0, 5}};
  EXPECT_PREPACK_ERROR(prepack::budgeted_schedule(far, {4}), "item 0: after 5 is not another");
}

// Block-aligned chunking (TensorRT-LLM's rule): every chunk but an item's last is a whole number
// of blocks, under both policies, for random lengths, budgets and block sizes; fill stays within
// its stated bound of steps, whole_first chunks into pieces of the budget rounded down to blocks.
TEST(Schedule, BlockAlignedChunksAreWholeBlocks) {
  std::mt19937_64 rng(29);
  for (int trial = 0; trial < 300; ++trial) {
    const auto len = random_lengths(rng, trial);
    const std::size_t total = std::accumulate(len.begin(), len.end(), std::size_t{0});
    for (const std::size_t bs : {std::size_t{1}, std::size_t{3}, std::size_t{16}}) {
      for (const std::size_t budget : {bs, bs + 1, 2 * bs + 5, std::size_t{97}, 4 * bs + 3}) {
        if (budget < bs) continue;
        std::vector<prepack::schedule_item> items;
        for (std::size_t l : len) {
          prepack::schedule_item it;
          it.length = l;
          items.push_back(it);
        }
        for (const auto policy : {prepack::chunking::fill, prepack::chunking::whole_first}) {
          const std::string where = "trial " + std::to_string(trial) + " bs " + std::to_string(bs) +
                                    " budget " + std::to_string(budget) +
                                    (policy == prepack::chunking::fill ? " fill" : " whole");
          const auto sched = prepack::budgeted_schedule(
              len, {budget, policy, prepack::schedule_order::arrival, bs});
          expect_valid(sched, items, where);
          EXPECT_NO_THROW(prepack::check_schedule(sched, bs)) << where;
          for (const prepack::chunk& c : sched.chunks) {
            if (!c.last) {
              ASSERT_EQ(c.length % bs, 0u) << where << ": item " << c.item;
            }
            if (policy == prepack::chunking::whole_first && !c.last) {
              ASSERT_EQ(c.length, budget / bs * bs) << where;
            }
          }
          if (policy == prepack::chunking::fill) {
            const std::size_t room = budget - bs + 1;
            EXPECT_LE(sched.n_steps(), (total + room - 1) / room) << where;
          }
        }
      }
    }
  }
  EXPECT_PREPACK_ERROR(
      prepack::budgeted_schedule(std::vector<int>{8},
                                 {4, prepack::chunking::fill, prepack::schedule_order::arrival, 5}),
      "block size 5 exceeds the budget 4");
  // whole_first chunks only what exceeds the budget, aligned or not: a 9-token prompt under a
  // budget of 10 with blocks of 4 runs whole, in one step (its last chunk needs no alignment).
  for (const std::size_t bs : {std::size_t{0}, std::size_t{4}}) {
    const auto whole = prepack::budgeted_schedule(
        std::vector<int>{9},
        {10, prepack::chunking::whole_first, prepack::schedule_order::arrival, bs});
    ASSERT_EQ(whole.n_steps(), 1u) << "block size " << bs;
    ASSERT_EQ(whole.chunks.size(), 1u);
    EXPECT_EQ(whole.chunks[0].length, 9u);
    EXPECT_EQ(whole.n_chunked(), 0u);
  }
  // Without alignment, fill splits where the room ends: a chunk of 5 tokens of 3-token blocks.
  const auto unaligned =
      prepack::budgeted_schedule(std::vector<int>{5, 9}, {7, prepack::chunking::fill});
  EXPECT_PREPACK_ERROR(prepack::check_schedule(unaligned, 3),
                       "is not a whole number of blocks of 3");
}

// The checker of a schedule handed to an engine: offsets bounded before they index, and the
// budget held by every step.
TEST(ScheduleErrors, CheckerRefusesWhatItExistsToCatch) {
  const auto sched =
      prepack::budgeted_schedule(std::vector<int>{5, 5, 5}, {5, prepack::chunking::fill});
  ASSERT_EQ(sched.n_steps(), 3u);
  ASSERT_NO_THROW(prepack::check_schedule(sched));
  // step_begin right at its ends only: {0, 4, 3} over 3 chunks.
  auto cut = sched;
  cut.step_begin = {0, 4, 3};
  EXPECT_PREPACK_ERROR(prepack::check_schedule(cut), "step_begin[1] = 4 > step_begin[2] = 3");
  // Three 5-token steps merged into one of 15 tokens, over the budget of 5.
  auto merged = sched;
  merged.step_begin = {0, 3};
  merged.finish_step = {0, 0, 0};
  EXPECT_PREPACK_ERROR(prepack::check_schedule(merged),
                       "step 0 holds 15 tokens, over the budget 5");
  // Items name prompts as prompts and other items as items.
  auto wrong = sched;
  wrong.chunks[0].context = 2;
  EXPECT_PREPACK_ERROR(prepack::check_schedule(wrong), "prompt 0: chunk context 2");
  std::vector<prepack::schedule_item> items(2);
  items[0].length = 4;  // a shared prefix: no prompt of its own
  items[1].length = 3;
  items[1].context = 4;
  items[1].after = 0;
  items[1].prompt = 7;
  auto deps = prepack::budgeted_schedule(items, {8});
  ASSERT_NO_THROW(prepack::check_schedule(deps));
  deps.chunks[0].length = 5;
  EXPECT_PREPACK_ERROR(prepack::check_schedule(deps), "item 0: chunk at token 0 of 5 tokens");
}

}  // namespace
