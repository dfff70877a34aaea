// Tests of prepack/paged.hpp: the block allocator hands out every block once, lowest first,
// frees a shared block only when its last reader releases it, and refuses what would corrupt
// its books; block tables pad ragged rows with -1.
#include "prepack/paged.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "common.hpp"

namespace {

TEST(Paged, AllocatorHandsOutEachBlockOnceAndCountsReaders) {
  prepack::block_allocator a(10);
  const auto x = a.allocate(3);
  EXPECT_EQ(x, (std::vector<std::int32_t>{0, 1, 2}));
  const auto y = a.allocate(7);
  EXPECT_EQ(a.n_free(), 0u);
  EXPECT_PREPACK_ERROR(a.allocate(1), "1 blocks wanted, 0 of 10 free");
  a.share(1);
  EXPECT_EQ(a.refs(1), 2u);
  a.release(1);
  EXPECT_EQ(a.n_free(), 0u);  // one reader left
  a.release(1);
  EXPECT_EQ(a.n_free(), 1u);
  EXPECT_EQ(a.allocate(1), (std::vector<std::int32_t>{1}));
  EXPECT_PREPACK_ERROR(a.share(11), "block 11 outside 0..9");
  a.release(y[0]);
  EXPECT_PREPACK_ERROR(a.release(y[0]), "is already free");
  EXPECT_PREPACK_ERROR(a.share(y[0]), "is free, it cannot be shared");
  EXPECT_PREPACK_ERROR(prepack::block_allocator(0), "the pool has no blocks");
}

TEST(Paged, RandomAllocationsNeverHandOutALiveBlock) {
  std::mt19937_64 rng(3);
  prepack::block_allocator a(64);
  std::multiset<std::int32_t> live;  // one entry per reference
  for (int k = 0; k < 5000; ++k) {
    const int op = static_cast<int>(rng() % 3);
    if (op == 0 && a.n_free() > 0) {
      for (std::int32_t b : a.allocate(1 + rng() % a.n_free())) {
        ASSERT_EQ(live.count(b), 0u) << "block " << b << " handed out while in use";
        live.insert(b);
      }
    } else if (op == 1 && !live.empty()) {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      a.share(*it);
      live.insert(*it);
    } else if (!live.empty()) {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      a.release(*it);
      live.erase(it);
    }
    std::set<std::int32_t> distinct(live.begin(), live.end());
    ASSERT_EQ(a.n_used(), distinct.size());
  }
}

TEST(Paged, BlockTablesPadRaggedRows) {
  const auto t = prepack::make_block_tables({{4, 5, 6}, {}, {9}}, 16);
  EXPECT_EQ(t.max_blocks, 3u);
  EXPECT_EQ(t.n_seqs(), 3u);
  EXPECT_EQ(t.table, (std::vector<std::int32_t>{4, 5, 6, -1, -1, -1, 9, -1, -1}));
  EXPECT_EQ(t.view()(2, 0), 9);
  EXPECT_PREPACK_ERROR(prepack::make_block_tables({{1, -2}}, 16), "sequence 0: block 1 is -2");
  EXPECT_PREPACK_ERROR(prepack::make_block_tables({{1}}, 0), "block size 0");
  EXPECT_EQ(prepack::blocks_for(33, 16), 3u);
  EXPECT_EQ(prepack::blocks_for(32, 16), 2u);
}

// The allocator checks its size before allocating anything for it (no length_error, no 16 GiB of
// counters zeroed before a refusal) and hands out the lowest free blocks first, released ones
// included.
TEST(Paged, AllocatorChecksItsSizeFirstAndHandsOutTheLowestFreeBlocks) {
  EXPECT_PREPACK_ERROR(prepack::block_allocator(SIZE_MAX), "do not fit int32 block ids");
  EXPECT_PREPACK_ERROR(prepack::block_allocator(std::size_t{1} << 31),
                       "do not fit int32 block ids");
  prepack::block_allocator huge(std::size_t{1} << 30);  // costs nothing until blocks are used
  EXPECT_EQ(huge.n_free(), std::size_t{1} << 30);
  EXPECT_EQ(huge.allocate(2), (std::vector<std::int32_t>{0, 1}));
  EXPECT_EQ(huge.refs((1 << 30) - 1), 0u);
  prepack::block_allocator a(8);
  EXPECT_EQ(a.allocate(4), (std::vector<std::int32_t>{0, 1, 2, 3}));
  a.release(1);
  a.release(3);
  EXPECT_EQ(a.allocate(1), (std::vector<std::int32_t>{1}));
  EXPECT_EQ(a.allocate(3), (std::vector<std::int32_t>{3, 4, 5}));
  // Random use: every allocation is the lowest free blocks, by a set of the free ones.
  std::mt19937_64 rng(5);
  prepack::block_allocator b(50);
  std::set<std::int32_t> free_set;
  for (std::int32_t k = 0; k < 50; ++k) free_set.insert(k);
  std::vector<std::int32_t> held;
  for (int step = 0; step < 2000; ++step) {
    if (held.empty() || (rng() % 2 == 0 && !free_set.empty())) {
      const std::size_t n = 1 + rng() % std::min<std::size_t>(4, free_set.size());
      std::vector<std::int32_t> want(free_set.begin(),
                                     std::next(free_set.begin(), static_cast<long>(n)));
      ASSERT_EQ(b.allocate(n), want) << "step " << step;
      for (std::int32_t x : want) free_set.erase(x);
      held.insert(held.end(), want.begin(), want.end());
    } else {
      const std::size_t k = rng() % held.size();
      b.release(held[k]);
      free_set.insert(held[k]);
      held.erase(held.begin() + static_cast<long>(k));
    }
    ASSERT_EQ(b.n_free(), free_set.size());
  }
}

// release_blocks gives back one reference per row that lists a block, all or nothing.
TEST(Paged, ReleaseBlocksOfTablesAllOrNothing) {
  prepack::block_allocator a(8);
  const auto x = a.allocate(3);
  a.share(x[0]);
  const auto rest = a.allocate(1);
  const auto t = prepack::make_block_tables({{x[0], x[1], x[2]}, {x[0], rest[0]}}, 4);
  auto twice = prepack::make_block_tables({{x[1]}, {x[1]}}, 4);
  EXPECT_PREPACK_ERROR(prepack::release_blocks(a, twice),
                       "block 1 is listed 2 times but held 1 time");
  EXPECT_EQ(a.n_used(), 4u);  // nothing released
  prepack::release_blocks(a, t);
  EXPECT_EQ(a.n_used(), 0u);
}

}  // namespace
