// Tests of prepack/prefix.hpp: the radix tree against brute force (every node's prompts are
// exactly those that start with its path; its distinct tokens are the distinct prefixes of the
// batch), the planner's choices against their definitions (block-aligned, shared by every
// sharer, items covering every prompt once, the cost rule), the planted cases (shorter than a
// block, exactly a block, nested, a prompt that is another's prefix, shared by one prompt only),
// block tables that share only prefix blocks, and schedules that run a suffix before its prefix.
#include "prepack/prefix.hpp"

#include <gtest/gtest.h>

#include <map>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common.hpp"
#include "support/workload.hpp"

namespace {

// Random prompts with planted prefixes: a few "roots", some extended into nested prefixes.
std::vector<std::vector<int>> planted(std::mt19937_64& rng, int vocab) {
  std::vector<std::vector<int>> roots;
  for (int r = 0; r < 1 + static_cast<int>(rng() % 3); ++r) {
    std::vector<int> t(1 + rng() % 60);
    for (int& x : t) x = 1 + static_cast<int>(rng() % static_cast<std::uint64_t>(vocab - 1));
    roots.push_back(t);
  }
  std::vector<std::vector<int>> out;
  const std::size_t n = 2 + rng() % 10;
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<int> p = roots[rng() % roots.size()];
    switch (rng() % 4) {
      case 0:  // the root alone, or cut short: a prompt that is another's prefix
        p.resize(1 + rng() % p.size());
        break;
      case 1:  // a duplicate of an earlier prompt
        if (!out.empty()) p = out[rng() % out.size()];
        break;
      default: {  // the root and a suffix
        const std::size_t extra = 1 + rng() % 40;
        for (std::size_t k = 0; k < extra; ++k)
          p.push_back(1 + static_cast<int>(rng() % static_cast<std::uint64_t>(vocab - 1)));
      }
    }
    out.push_back(p);
  }
  return out;
}

bool starts_with(const std::vector<int>& p, const std::vector<int>& prefix) {
  return p.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), p.begin());
}

TEST(Prefix, RadixTreeMatchesBruteForce) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    const auto prompts = planted(rng, trial % 2 ? 3 : 50);  // tiny vocab: many accidental shares
    const prepack::prefix_index<int> index(prompts);
    const auto& nodes = index.nodes();
    std::set<std::vector<int>> distinct;
    for (const auto& p : prompts) {
      for (std::size_t k = 1; k <= p.size(); ++k)
        distinct.insert({p.begin(), p.begin() + static_cast<long>(k)});
    }
    ASSERT_EQ(index.distinct_tokens(), distinct.size()) << "trial " << trial;
    for (std::size_t v = 1; v < nodes.size(); ++v) {
      const auto& node = nodes[v];
      // The node's path: the first `depth` tokens of any of its prompts.
      ASSERT_FALSE(node.prompts.empty());
      const auto& some = prompts[node.prompts.front()];
      const std::vector<int> path(some.begin(), some.begin() + static_cast<long>(node.depth));
      std::vector<std::size_t> want;
      for (std::size_t i = 0; i < prompts.size(); ++i) {
        if (starts_with(prompts[i], path)) want.push_back(i);
      }
      ASSERT_EQ(node.prompts, want) << "trial " << trial << " node " << v;
      ASSERT_LT(nodes[node.parent].depth, node.depth);
      // A node is a branch point or where a prompt ends (radix tree: no chains).
      ASSERT_TRUE(node.children.size() != 1 || !node.ending.empty())
          << "trial " << trial << ": node " << v << " neither branches nor ends a prompt";
    }
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_EQ(nodes[index.end_of(i)].depth, prompts[i].size());
    }
  }
}

// Every prompt is covered exactly once by its prefix chain and its own item, every prefix is
// block-aligned and shared by sharers that all start with its tokens, and the cost rule holds.
void expect_valid_plan(const prepack::prefix_plan& plan,
                       const std::vector<std::vector<int>>& prompts,
                       const prepack::prefix_options& opt, const std::string& where) {
  const std::size_t bs = opt.block_size;
  for (std::size_t k = 0; k < plan.n_prefixes(); ++k) {
    const auto& p = plan.prefixes[k];
    ASSERT_EQ(p.length % bs, 0u) << where;
    ASSERT_EQ(p.start % bs, 0u) << where;
    ASSERT_GE(p.start + p.length, opt.min_length) << where;
    ASSERT_GE(p.sharers.size(), 2u) << where;
    ASSERT_GT((p.sharers.size() - 1) * p.length, opt.overhead_tokens) << where;
    if (p.parent) {
      ASSERT_LT(*p.parent, k);
      ASSERT_EQ(plan.prefixes[*p.parent].start + plan.prefixes[*p.parent].length, p.start);
    } else {
      ASSERT_EQ(p.start, 0u);
    }
    const auto& first = prompts[p.sharers.front()];
    const std::vector<int> tokens(first.begin(),
                                  first.begin() + static_cast<long>(p.start + p.length));
    for (std::size_t i : p.sharers) ASSERT_TRUE(starts_with(prompts[i], tokens)) << where;
    // Nobody else starts with it (the sharers are everyone who could).
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      if (!std::count(p.sharers.begin(), p.sharers.end(), i)) {
        ASSERT_FALSE(starts_with(prompts[i], tokens)) << where << ": prompt " << i << " left out";
      }
    }
  }
  std::size_t computed = 0;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    // Walk the prompt's chain from its deepest prefix: it covers [0, done) once.
    std::size_t done = 0;
    if (plan.prompt_prefix[i]) {
      std::size_t expect_end = plan.prefixes[*plan.prompt_prefix[i]].start +
                               plan.prefixes[*plan.prompt_prefix[i]].length;
      done = expect_end;
      for (auto k = plan.prompt_prefix[i]; k; k = plan.prefixes[*k].parent) {
        ASSERT_EQ(plan.prefixes[*k].start + plan.prefixes[*k].length, expect_end) << where;
        expect_end = plan.prefixes[*k].start;
        ASSERT_TRUE(
            std::count(plan.prefixes[*k].sharers.begin(), plan.prefixes[*k].sharers.end(), i));
      }
      ASSERT_EQ(expect_end, 0u) << where;
    }
    if (plan.prompt_item[i]) {
      const auto& it = plan.items[*plan.prompt_item[i]];
      ASSERT_EQ(it.context, done) << where;
      ASSERT_EQ(it.context + it.length, prompts[i].size()) << where;
      ASSERT_EQ(plan.item_prompt[*plan.prompt_item[i]], i);
      ASSERT_EQ(*plan.prompt_item[i], plan.prompt_last_item[i]);
    } else {
      ASSERT_EQ(done, prompts[i].size()) << where << ": prompt " << i << " not covered";
      ASSERT_EQ(plan.prompt_last_item[i], *plan.prompt_prefix[i]);
    }
  }
  for (const auto& it : plan.items) computed += it.length;
  ASSERT_EQ(plan.tokens_computed(), computed);
  ASSERT_LE(plan.tokens_computed(), plan.useful_tokens());
}

TEST(Prefix, PlansMatchTheirDefinitions) {
  std::mt19937_64 rng(6);
  int shared = 0, nested = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const auto prompts = planted(rng, 40);
    for (std::size_t bs : {std::size_t{1}, std::size_t{3}, std::size_t{16}}) {
      const prepack::prefix_options opt{bs, bs * (1 + rng() % 3), rng() % 20};
      const auto plan = prepack::make_prefix_plan(prompts, opt);
      expect_valid_plan(plan, prompts, opt, "trial " + std::to_string(trial));
      shared += plan.n_prefixes() > 0;
      for (const auto& p : plan.prefixes) nested += p.parent.has_value();
      // The items schedule: prefixes before their suffixes, under any budget.
      const auto sched =
          prepack::budgeted_schedule(plan.items, {1 + rng() % 50, prepack::chunking::fill});
      EXPECT_NO_THROW(prepack::check_schedule(sched));
    }
  }
  EXPECT_GT(shared, 300);
  EXPECT_GT(nested, 50);
}

TEST(Prefix, PlantedCases) {
  const prepack::prefix_options opt{4, 4, 0};
  std::vector<int> a(12);
  std::iota(a.begin(), a.end(), 1);
  // Shared by one prompt only: nothing split off.
  auto plan = prepack::make_prefix_plan(std::vector<std::vector<int>>{a, {50, 51}}, opt);
  EXPECT_EQ(plan.n_prefixes(), 0u);
  EXPECT_EQ(plan.tokens_computed(), 14u);
  // Shorter than a block: 3 shared tokens with blocks of 4: not shared.
  plan = prepack::make_prefix_plan(std::vector<std::vector<int>>{{1, 2, 3, 9}, {1, 2, 3, 8}}, opt);
  EXPECT_EQ(plan.n_prefixes(), 0u);
  // Exactly a block, and a prompt that is entirely the other's prefix: it is the prefix.
  plan = prepack::make_prefix_plan(std::vector<std::vector<int>>{{1, 2, 3, 4}, {1, 2, 3, 4, 5, 6}},
                                   opt);
  ASSERT_EQ(plan.n_prefixes(), 1u);
  EXPECT_EQ(plan.prefixes[0].length, 4u);
  EXPECT_FALSE(plan.prompt_item[0].has_value());  // prompt 0 ends where the prefix does
  EXPECT_EQ(plan.prompt_last_item[0], 0u);
  EXPECT_EQ(plan.tokens_computed(), 6u);
  // Nested: 12 shared by three, 8 more shared by two of them.
  std::vector<int> b = a, c = a, d = a;
  for (int k = 0; k < 8; ++k) {
    b.push_back(100 + k);
    c.push_back(100 + k);
  }
  b.push_back(7);
  c.push_back(8);
  d.push_back(9);
  plan = prepack::make_prefix_plan(std::vector<std::vector<int>>{b, c, d}, opt);
  ASSERT_EQ(plan.n_prefixes(), 2u);
  EXPECT_EQ(plan.prefixes[0].length, 12u);
  EXPECT_EQ(plan.prefixes[1].start, 12u);
  EXPECT_EQ(plan.prefixes[1].length, 8u);
  EXPECT_EQ(plan.tokens_computed(), 12u + 8u + 1u + 1u + 1u);
  // The cost rule: with an overhead of 100 tokens, sharing 12 tokens twice is not worth it.
  plan = prepack::make_prefix_plan(std::vector<std::vector<int>>{b, c, d}, {4, 4, 100});
  EXPECT_EQ(plan.n_prefixes(), 0u);
  EXPECT_PREPACK_ERROR(prepack::make_prefix_plan(std::vector<std::vector<int>>{a, {}}),
                       "prompt 1: length 0");
  EXPECT_PREPACK_ERROR(prepack::make_prefix_plan(std::vector<std::vector<int>>{a}, {0, 1, 1}),
                       "block size 0");
}

TEST(Prefix, TablesShareOnlyPrefixBlocks) {
  std::vector<int> a(12);
  std::iota(a.begin(), a.end(), 1);
  std::vector<int> b = a, c = a;
  b.push_back(40);
  c.push_back(41);
  const auto plan = prepack::make_prefix_plan(std::vector<std::vector<int>>{b, c}, {4, 4, 0});
  ASSERT_EQ(plan.n_prefixes(), 1u);
  prepack::block_allocator alloc(32);
  const auto t = prepack::allocate_prefix_tables(plan, alloc, 2);
  EXPECT_NO_THROW(prepack::check_prefix_tables(plan, t.items));
  // The prefix's 3 blocks are in both prompts' tables, counted once in the pool.
  EXPECT_EQ(alloc.n_used(), 3u + 1u + 1u);
  for (std::size_t e = 0; e < 3; ++e) EXPECT_EQ(t.prompts.row(0)[e], t.prompts.row(1)[e]);
  EXPECT_EQ(alloc.refs(t.prompts.row(0)[0]), 2u);  // held by its two sharers' tables
  EXPECT_EQ(alloc.refs(t.prompts.row(0)[3]), 1u);  // a prompt's own block by its own
  // A table that shares a block that is not a prefix block: prompt 1's own block in prompt 0's
  // table.
  auto bad = t.items;
  bad.table[1 * bad.max_blocks + 3] = t.items.row(2)[3];
  EXPECT_PREPACK_ERROR(prepack::check_prefix_tables(plan, bad),
                       "a shared block must be a prefix block");
  auto read = t.items;  // a suffix reading a block the prefix does not write
  read.table[1 * read.max_blocks + 0] = t.items.row(2)[3];
  EXPECT_PREPACK_ERROR(prepack::check_prefix_tables(plan, read),
                       "is not a prefix block it runs after");
}

// Every block is held once by each prompt table that lists it, so releasing every prompt's table
// frees the pool, nested prefixes, whole-prompt prefixes and identical prompts included (the
// prefix blocks used to stay held once more, with nothing to free them).
TEST(Prefix, EveryBlockReturnsWhenTheLastTableIsReleased) {
  std::mt19937_64 rng(41);
  for (int trial = 0; trial < 200; ++trial) {
    // Prompts from a few stems (nested and identical prefixes), tokens from a tiny alphabet.
    std::vector<std::vector<int>> prompts;
    std::vector<int> stem;
    for (int k = 0; k < 20; ++k) stem.push_back(static_cast<int>(rng() % 3));
    const std::size_t n = 2 + rng() % 8;
    for (std::size_t i = 0; i < n; ++i) {
      std::vector<int> p(stem.begin(), stem.begin() + static_cast<long>(rng() % stem.size() + 1));
      const std::size_t tail = rng() % 6;
      for (std::size_t k = 0; k < tail; ++k) p.push_back(static_cast<int>(rng() % 3));
      prompts.push_back(std::move(p));
    }
    const std::size_t bs = 1 + rng() % 4;
    const auto plan = prepack::make_prefix_plan(prompts, {bs, bs, 0});
    prepack::block_allocator alloc(512);
    const std::size_t extra = rng() % 3;
    const auto t = prepack::allocate_prefix_tables(plan, alloc, extra);
    ASSERT_NO_THROW(prepack::check_prefix_tables(plan, t.items));
    // References: how many prompt tables list each block.
    std::map<std::int32_t, std::size_t> listed;
    for (std::size_t i = 0; i < plan.n_prompts(); ++i) {
      for (std::int32_t b : t.prompts.blocks(i)) ++listed[b];
    }
    for (const auto& [b, count] : listed)
      ASSERT_EQ(alloc.refs(b), count) << "trial " << trial << " block " << b;
    ASSERT_EQ(alloc.n_used(), listed.size());
    prepack::release_blocks(alloc, t.prompts);
    ASSERT_EQ(alloc.n_used(), 0u) << "trial " << trial;
  }
}

// The checker of prefix tables reads no entry past a row's end, whatever the rows' width.
TEST(Prefix, NarrowTablesAreRefusedBeforeTheyAreRead) {
  std::vector<int> a(12, 7);
  std::vector<int> b = a, c = a;
  b.push_back(1);
  c.push_back(2);
  const auto plan = prepack::make_prefix_plan(std::vector<std::vector<int>>{b, c}, {4, 4, 0});
  prepack::block_allocator alloc(16);
  const auto t = prepack::allocate_prefix_tables(plan, alloc, 0);
  // Rows of 2 entries, where the prefix needs 3 and every suffix 4.
  auto narrow = prepack::make_block_tables({{0, 1}, {0, 1}, {0, 1}}, 4);
  EXPECT_PREPACK_ERROR(prepack::check_prefix_tables(plan, narrow),
                       "item 0: positions up to 12 need 3 blocks of 4, its table has 2 entries");
}

TEST(Prefix, ASuffixScheduledBeforeItsPrefixIsRefused) {
  std::vector<int> a(8, 3);
  std::vector<int> b = a, c = a;
  b.push_back(1);
  c.push_back(2);
  const auto plan = prepack::make_prefix_plan(std::vector<std::vector<int>>{b, c}, {4, 4, 0});
  auto sched = prepack::budgeted_schedule(plan.items, {100, prepack::chunking::fill});
  ASSERT_EQ(sched.n_steps(), 2u);
  EXPECT_NO_THROW(prepack::check_schedule(sched));
  // Move a suffix's chunk into step 0, beside its prefix.
  auto early = sched;
  std::swap(early.chunks[0], early.chunks[1]);
  early.step_begin[1] = 2;
  early.finish_step[early.chunks[0].item] = 0;  // the suffix now ends in step 0
  EXPECT_PREPACK_ERROR(prepack::check_schedule(early), "runs before item 0 it follows ends");
}

TEST(Prefix, Workloads) {
  for (support::prefix_profile p : support::all_prefix_profiles()) {
    const auto prompts = support::generate_prefixed_prompts(p, 24, 1000, 3);
    EXPECT_EQ(prompts, support::generate_prefixed_prompts(p, 24, 1000, 3));
    const auto plan = prepack::make_prefix_plan(prompts);
    // few-shot: 3 subjects; system-prompt: one prefix.
    EXPECT_EQ(plan.n_prefixes(), p == support::prefix_profile::few_shot ? 3u : 1u)
        << support::prefix_profile_name(p);
    EXPECT_LT(plan.tokens_computed(), plan.useful_tokens() / 2);
    support::prefix_profile back{};
    EXPECT_TRUE(support::parse_prefix_profile(support::prefix_profile_name(p), back));
    EXPECT_EQ(back, p);
  }
}

}  // namespace
