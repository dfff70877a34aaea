// Tests of prepack/unpack.hpp: tagged data round-trips exactly through every destination kind
// and every source order; nothing outside the destinations' real slots is written; every bad
// input throws before writing.
#include "prepack/unpack.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "common.hpp"
#include "prepack/plan.hpp"

namespace {

constexpr int kSentinel = -7;

// A value that names prompt i, token t, head h, dim d.
template <class T>
T code(std::size_t i, std::size_t t, std::size_t h, std::size_t d) {
  return static_cast<T>(((i * 1000 + t) * 8 + h) * 16 + d);
}

struct fixture {
  prepack::packed_layout<> layout;
  std::size_t n_heads = 0, head_dim = 0;
};

fixture random_fixture(std::mt19937_64& rng, int trial) {
  const auto len =
      test::random_lengths(rng, 1 + rng() % 15, 1, 1 + static_cast<long long>(rng() % 40));
  const auto plan = trial % 3 == 0   ? prepack::padded(len, prepack::padding_side::right)
                    : trial % 3 == 1 ? prepack::first_fit_decreasing(len)
                                     : prepack::best_fit_decreasing(len, 60);
  fixture f;
  f.layout = prepack::make_layout(plan, test::tagged_prompts(len, 100));
  f.n_heads = 1 + rng() % 4;
  f.head_dim = 1 + rng() % 9;
  return f;
}

// The packed tensor in the given order: code(i, t, h, d) at prompt slots, sentinel on pads.
template <class T>
std::vector<T> packed_source(const fixture& f, prepack::kv_order order) {
  const auto& l = f.layout;
  std::vector<T> buf(l.n_slots() * f.n_heads * f.head_dim, static_cast<T>(kSentinel));
  auto v = prepack::packed_view(buf.data(), order, l.n_rows(), l.width(), f.n_heads, f.head_dim);
  for (std::size_t i = 0; i < l.n_prompts(); ++i) {
    for (std::size_t t = 0; t < static_cast<std::size_t>(l.prompt_length()[i]); ++t) {
      for (std::size_t h = 0; h < f.n_heads; ++h) {
        for (std::size_t d = 0; d < f.head_dim; ++d) {
          v(static_cast<std::size_t>(l.prompt_row()[i]),
            static_cast<std::size_t>(l.prompt_offset()[i]) + t, h, d) = code<T>(i, t, h, d);
        }
      }
    }
  }
  return buf;
}

template <class T>
class Unpack : public ::testing::Test {};
using element_types = ::testing::Types<float, double, std::int32_t, std::int16_t>;
TYPED_TEST_SUITE(Unpack, element_types);

TYPED_TEST(Unpack, PerPromptBuffersRoundTrip) {
  using T = TypeParam;
  std::mt19937_64 rng(31);
  for (int trial = 0; trial < 200; ++trial) {
    const fixture f = random_fixture(rng, trial);
    const auto& l = f.layout;
    for (auto order :
         {prepack::kv_order::row_head_slot_dim, prepack::kv_order::row_slot_head_dim}) {
      const auto src_buf = packed_source<T>(f, order);
      const auto src =
          prepack::packed_view(src_buf.data(), order, l.n_rows(), l.width(), f.n_heads, f.head_dim);
      for (auto corder :
           {prepack::cache_order::position_head_dim, prepack::cache_order::head_position_dim}) {
        const std::size_t spare = trial % 4;  // capacity beyond the prompt, must stay untouched
        std::vector<std::vector<T>> bufs(l.n_prompts());
        std::vector<prepack::tensor_view<T, 3>> dst;
        for (std::size_t i = 0; i < l.n_prompts(); ++i) {
          const std::size_t cap = static_cast<std::size_t>(l.prompt_length()[i]) + spare;
          bufs[i].assign(cap * f.n_heads * f.head_dim, static_cast<T>(kSentinel));
          dst.push_back(prepack::prompt_view(bufs[i].data(), corder, cap, f.n_heads, f.head_dim));
        }
        prepack::unpack_prompts(l, src, dst);
        for (std::size_t i = 0; i < l.n_prompts(); ++i) {
          for (std::size_t t = 0; t < dst[i].extent[0]; ++t) {
            for (std::size_t h = 0; h < f.n_heads; ++h) {
              for (std::size_t d = 0; d < f.head_dim; ++d) {
                const T want = t < static_cast<std::size_t>(l.prompt_length()[i])
                                   ? code<T>(i, t, h, d)
                                   : static_cast<T>(kSentinel);
                ASSERT_EQ(dst[i](t, h, d), want) << "prompt " << i << " t " << t;
              }
            }
          }
        }
      }
      const auto contiguous = prepack::unpack_contiguous(l, src);
      for (std::size_t i = 0; i < l.n_prompts(); ++i) {
        for (std::size_t k = 0; k < contiguous[i].size(); ++k) {
          const std::size_t d = k % f.head_dim, h = (k / f.head_dim) % f.n_heads,
                            t = k / (f.head_dim * f.n_heads);
          ASSERT_EQ(contiguous[i][k], code<T>(i, t, h, d));
        }
      }
    }
  }
}

TYPED_TEST(Unpack, LeftPaddedBatchRoundTrips) {
  using T = TypeParam;
  std::mt19937_64 rng(37);
  for (int trial = 0; trial < 200; ++trial) {
    const fixture f = random_fixture(rng, trial);
    const auto& l = f.layout;
    const auto src_buf = packed_source<T>(f, prepack::kv_order::row_head_slot_dim);
    const auto src = prepack::packed_view(src_buf.data(), prepack::kv_order::row_head_slot_dim,
                                          l.n_rows(), l.width(), f.n_heads, f.head_dim);
    const std::size_t longest = static_cast<std::size_t>(
        *std::max_element(l.prompt_length().begin(), l.prompt_length().end()));
    const std::size_t width = longest + trial % 3;
    std::vector<T> buf(l.n_prompts() * width * f.n_heads * f.head_dim, static_cast<T>(kSentinel));
    // (prompt, slot, head, dim) over a [prompt][head][slot][dim] buffer.
    prepack::tensor_view<T, 4> dst{
        buf.data(),
        {l.n_prompts(), width, f.n_heads, f.head_dim},
        {f.n_heads * width * f.head_dim, f.head_dim, width * f.head_dim, 1}};
    prepack::unpack_left_padded(l, src, dst);
    for (std::size_t i = 0; i < l.n_prompts(); ++i) {
      const std::size_t pad = width - static_cast<std::size_t>(l.prompt_length()[i]);
      for (std::size_t s = 0; s < width; ++s) {
        for (std::size_t h = 0; h < f.n_heads; ++h) {
          for (std::size_t d = 0; d < f.head_dim; ++d) {
            const T want = s < pad ? static_cast<T>(kSentinel) : code<T>(i, s - pad, h, d);
            ASSERT_EQ(dst(i, s, h, d), want);
          }
        }
      }
    }
  }
}

TYPED_TEST(Unpack, PagedPoolRoundTrips) {
  using T = TypeParam;
  std::mt19937_64 rng(41);
  for (int trial = 0; trial < 200; ++trial) {
    const fixture f = random_fixture(rng, trial);
    const auto& l = f.layout;
    const auto src_buf = packed_source<T>(f, prepack::kv_order::row_slot_head_dim);
    const auto src = prepack::packed_view(src_buf.data(), prepack::kv_order::row_slot_head_dim,
                                          l.n_rows(), l.width(), f.n_heads, f.head_dim);
    const std::size_t block_size = 1 + rng() % 8;
    std::size_t need = 0, most = 0;
    for (auto len : l.prompt_length()) {
      const std::size_t b = (static_cast<std::size_t>(len) + block_size - 1) / block_size;
      need += b;
      most = std::max(most, b);
    }
    const std::size_t n_blocks = need + rng() % 5;
    std::vector<int> ids(n_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    const std::size_t max_blocks = most + 1;
    std::vector<int> table(l.n_prompts() * max_blocks, -1);  // unused entries stay -1
    std::size_t next = 0;
    for (std::size_t i = 0; i < l.n_prompts(); ++i) {
      const std::size_t b =
          (static_cast<std::size_t>(l.prompt_length()[i]) + block_size - 1) / block_size;
      for (std::size_t k = 0; k < b; ++k) table[i * max_blocks + k] = ids[next++];
    }
    std::vector<T> pool_buf(n_blocks * block_size * f.n_heads * f.head_dim,
                            static_cast<T>(kSentinel));
    // vLLM's value cache order: [n_blocks][n_heads][block_size][head_dim].
    prepack::tensor_view<T, 4> pool{
        pool_buf.data(),
        {n_blocks, block_size, f.n_heads, f.head_dim},
        {f.n_heads * block_size * f.head_dim, f.head_dim, block_size * f.head_dim, 1}};
    const auto tv =
        prepack::contiguous_view<const int, 2>(table.data(), {l.n_prompts(), max_blocks});
    prepack::unpack_paged(l, src, pool, tv);
    // Read every element of the pool: each is either the sentinel or exactly one token's value.
    std::size_t written = 0;
    for (std::size_t i = 0; i < l.n_prompts(); ++i) {
      for (std::size_t t = 0; t < static_cast<std::size_t>(l.prompt_length()[i]); ++t) {
        const auto blk = static_cast<std::size_t>(table[i * max_blocks + t / block_size]);
        for (std::size_t h = 0; h < f.n_heads; ++h) {
          for (std::size_t d = 0; d < f.head_dim; ++d) {
            ASSERT_EQ(pool(blk, t % block_size, h, d), code<T>(i, t, h, d));
            ++written;
          }
        }
      }
    }
    const auto untouched = static_cast<std::size_t>(
        std::count(pool_buf.begin(), pool_buf.end(), static_cast<T>(kSentinel)));
    ASSERT_EQ(untouched + written, pool_buf.size()) << "something outside the prompts was written";
  }
}

TYPED_TEST(Unpack, GatherLastRows) {
  using T = TypeParam;
  std::mt19937_64 rng(43);
  for (int trial = 0; trial < 100; ++trial) {
    const fixture f = random_fixture(rng, trial);
    const auto& l = f.layout;
    const std::size_t features = f.n_heads * f.head_dim;
    // (flat slot, feature): the feature is the code of the slot's token.
    std::vector<T> src(l.n_slots() * features, static_cast<T>(kSentinel));
    for (std::size_t s = 0; s < l.n_slots(); ++s) {
      if (l.segments()[s] < 0) continue;
      for (std::size_t x = 0; x < features; ++x) {
        src[s * features + x] = code<T>(static_cast<std::size_t>(l.segments()[s]),
                                        static_cast<std::size_t>(l.positions()[s]), 0, x);
      }
    }
    std::vector<T> out(l.n_prompts() * features, static_cast<T>(kSentinel));
    prepack::gather_last(l,
                         prepack::contiguous_view<const T, 2>(src.data(), {l.n_slots(), features}),
                         prepack::contiguous_view<T, 2>(out.data(), {l.n_prompts(), features}));
    for (std::size_t i = 0; i < l.n_prompts(); ++i) {
      for (std::size_t x = 0; x < features; ++x) {
        ASSERT_EQ(out[i * features + x],
                  code<T>(i, static_cast<std::size_t>(l.prompt_length()[i]) - 1, 0, x));
      }
    }
  }
}

// ---- bad input: every case throws, and the destination is untouched ----

struct bad_input : ::testing::Test {
  std::vector<int> len{5, 3, 2};
  prepack::packed_layout<> l =
      prepack::make_layout(prepack::first_fit_decreasing(len), std::vector<int>(10, 1));
  std::size_t heads = 2, dim = 3;
  std::vector<float> src_buf = std::vector<float>(l.n_slots() * heads * dim, 1.0f);
  prepack::tensor_view<const float, 4> src = prepack::packed_view<const float>(
      src_buf.data(), prepack::kv_order::row_head_slot_dim, l.n_rows(), l.width(), heads, dim);
  std::vector<float> dst_buf = std::vector<float>(1000, 9.0f);

  void expect_untouched() { EXPECT_EQ(dst_buf, std::vector<float>(1000, 9.0f)); }
  std::vector<prepack::tensor_view<float, 3>> prompt_views(std::size_t cap) {
    std::vector<prepack::tensor_view<float, 3>> v;
    for (std::size_t i = 0; i < l.n_prompts(); ++i) {
      v.push_back(prepack::prompt_view(dst_buf.data() + i * 100,
                                       prepack::cache_order::head_position_dim, cap, heads, dim));
    }
    return v;
  }
};

TEST_F(bad_input, SourceFromAnotherBatch) {
  auto other = src;
  other.extent[0] = l.n_rows() + 1;
  EXPECT_PREPACK_ERROR(prepack::unpack_prompts(l, other, prompt_views(5)), "another batch");
  expect_untouched();
}

TEST_F(bad_input, PromptDestinationTooShort) {
  EXPECT_PREPACK_ERROR(prepack::unpack_prompts(l, src, prompt_views(4)),
                       "prompt 0: destination holds 4 positions, the prompt needs 5");
  auto views = prompt_views(5);
  views.pop_back();
  EXPECT_PREPACK_ERROR(prepack::unpack_prompts(l, src, views), "2 views for 3 prompts");
  expect_untouched();
}

TEST_F(bad_input, HeadsOrDimsDiffer) {
  auto views = prompt_views(5);
  views[1].extent[2] = dim + 1;
  EXPECT_PREPACK_ERROR(prepack::unpack_prompts(l, src, views), "heads x");
  expect_untouched();
}

TEST_F(bad_input, OverlappingStridesAndBuffers) {
  auto views = prompt_views(5);
  views[2].stride[0] = 0;  // every position on the same element
  EXPECT_PREPACK_ERROR(prepack::unpack_prompts(l, src, views), "overlapping strides");
  auto shared = prompt_views(5);
  shared[1].data = shared[0].data + 3;  // two prompts in one buffer
  EXPECT_PREPACK_ERROR(prepack::unpack_prompts(l, src, shared),
                       "two destinations write the same element");
  prepack::tensor_view<float, 4> batch{dst_buf.data(), {3, 5, heads, dim}, {30, 3, 1, 1}};
  EXPECT_PREPACK_ERROR(prepack::unpack_left_padded(l, src, batch), "overlapping strides");
  expect_untouched();
}

TEST_F(bad_input, LeftPaddedTooSmall) {
  auto batch = prepack::contiguous_view<float, 4>(dst_buf.data(), {3, 4, heads, dim});
  EXPECT_PREPACK_ERROR(prepack::unpack_left_padded(l, src, batch),
                       "prompt 0: length 5 exceeds the destination's 4 slots");
  EXPECT_PREPACK_ERROR(prepack::left_padded_slots(l, 4),
                       "prompt 0: length 5 exceeds the 4 columns");
  auto few = prepack::contiguous_view<float, 4>(dst_buf.data(), {2, 5, heads, dim});
  EXPECT_PREPACK_ERROR(prepack::unpack_left_padded(l, src, few), "2 rows for 3 prompts");
  expect_untouched();
}

// The gather indices name, for every destination element, the packed slot unpack_left_padded and
// unpack_prompts copy it from: gathering the packed source's slot codes through them gives what
// the scatter wrote.
TEST(Unpack, GatherIndicesNameTheSlotsTheScatterCopies) {
  std::mt19937_64 rng(43);
  for (int trial = 0; trial < 200; ++trial) {
    fixture f = random_fixture(rng, trial);
    f.n_heads = f.head_dim = 1;
    const auto& l = f.layout;
    std::vector<std::int64_t> src_buf(l.n_slots());
    std::iota(src_buf.begin(), src_buf.end(), std::int64_t{0});  // each slot holds its number
    const auto src = prepack::packed_view(src_buf.data(), prepack::kv_order::row_slot_head_dim,
                                          l.n_rows(), l.width(), 1, 1);
    std::size_t longest = 0;
    for (auto len : l.prompt_length()) longest = std::max(longest, static_cast<std::size_t>(len));
    const std::size_t columns = longest + trial % 3;
    std::vector<std::int64_t> batch(l.n_prompts() * columns, -1);
    prepack::unpack_left_padded(
        l, src,
        prepack::contiguous_view<std::int64_t, 4>(batch.data(), {l.n_prompts(), columns, 1, 1}));
    EXPECT_EQ(prepack::left_padded_slots(l, columns), batch);
    std::vector<std::vector<std::int64_t>> each(l.n_prompts());
    std::vector<prepack::tensor_view<std::int64_t, 3>> views;
    for (std::size_t i = 0; i < l.n_prompts(); ++i) {
      each[i].resize(static_cast<std::size_t>(l.prompt_length()[i]));
      views.push_back(
          prepack::contiguous_view<std::int64_t, 3>(each[i].data(), {each[i].size(), 1, 1}));
    }
    prepack::unpack_prompts(l, src, views);
    for (std::size_t last :
         {std::size_t{1}, std::size_t{3}, longest, static_cast<std::size_t>(-1)}) {
      std::vector<std::int64_t> want;
      for (const auto& one : each) {
        want.insert(want.end(), one.end() - static_cast<std::ptrdiff_t>(std::min(one.size(), last)),
                    one.end());
      }
      EXPECT_EQ(prepack::prompt_slots(l, last), want);
    }
  }
}

TEST_F(bad_input, BlockTables) {
  auto pool = prepack::contiguous_view<float, 4>(dst_buf.data(), {6, 2, heads, dim});
  const std::vector<int> ok{0, 1, 2, 3, 4, -1, 5, -1, -1};  // 3 + 2 + 1 blocks of 2
  EXPECT_NO_THROW(prepack::unpack_paged(l, src, pool,
                                        prepack::contiguous_view<const int, 2>(ok.data(), {3, 3})));
  std::fill(dst_buf.begin(), dst_buf.end(), 9.0f);
  const std::vector<int> dup{0, 1, 2, 3, 1, -1, 5, -1, -1};
  EXPECT_PREPACK_ERROR(
      prepack::unpack_paged(l, src, pool,
                            prepack::contiguous_view<const int, 2>(dup.data(), {3, 3})),
      "prompt 1: block 1 is also written by prompt 0");
  const std::vector<int> range{0, 1, 2, 3, 4, -1, 6, -1, -1};
  EXPECT_PREPACK_ERROR(
      prepack::unpack_paged(l, src, pool,
                            prepack::contiguous_view<const int, 2>(range.data(), {3, 3})),
      "prompt 2: block_table[0] = 6 outside the pool's blocks 0..5");
  const std::vector<int> neg{0, 1, -3, 3, 4, -1, 5, -1, -1};
  EXPECT_PREPACK_ERROR(
      prepack::unpack_paged(l, src, pool,
                            prepack::contiguous_view<const int, 2>(neg.data(), {3, 3})),
      "prompt 0: block_table[2] = -3 (padding) where a block is needed");
  EXPECT_PREPACK_ERROR(
      prepack::unpack_paged(l, src, pool,
                            prepack::contiguous_view<const int, 2>(ok.data(), {3, 2})),
      "prompt 0: positions up to 5 need 3 blocks of 2, its block table has 2 entries");
  EXPECT_PREPACK_ERROR(prepack::unpack_paged(
                           l, src, pool, prepack::contiguous_view<const int, 2>(ok.data(), {2, 3})),
                       "block table: 2 rows for 3 prompts");
  expect_untouched();
}

TEST_F(bad_input, GatherLast) {
  std::vector<float> flat(l.n_slots() * 4, 1.0f);
  const auto s = prepack::contiguous_view<const float, 2>(flat.data(), {l.n_slots(), 4});
  EXPECT_PREPACK_ERROR(
      prepack::gather_last(l, s, prepack::contiguous_view<float, 2>(dst_buf.data(), {2, 4})),
      "2 rows for 3 prompts");
  EXPECT_PREPACK_ERROR(
      prepack::gather_last(l, s, prepack::contiguous_view<float, 2>(dst_buf.data(), {3, 5})),
      "5 features, the source has 4");
  auto wrong = s;
  wrong.extent[0] -= 1;
  EXPECT_PREPACK_ERROR(
      prepack::gather_last(l, wrong, prepack::contiguous_view<float, 2>(dst_buf.data(), {3, 4})),
      "another batch");
  expect_untouched();
}

// Destinations are told apart by the elements they write, not by address ranges: a
// [max_len][batch][heads][dim] cache seen prompt by prompt interleaves the prompts' views
// without sharing an element (accepted), while views that share an element only past a
// prompt's length are fine and views that share a written element are refused.
TEST_F(bad_input, OverlapIsDecidedByTheElementsWritten) {
  const std::size_t max_len = 5, batch = l.n_prompts();
  std::vector<float> cache(max_len * batch * heads * dim, 9.0f);
  std::vector<prepack::tensor_view<float, 3>> interleaved;
  for (std::size_t i = 0; i < batch; ++i) {
    interleaved.push_back(
        {cache.data() + i * heads * dim, {max_len, heads, dim}, {batch * heads * dim, dim, 1}});
  }
  EXPECT_NO_THROW(prepack::unpack_prompts(l, src, interleaved));
  EXPECT_EQ(std::count(cache.begin(), cache.end(), 9.0f),
            static_cast<long>(cache.size() - l.useful_tokens() * heads * dim));
  // Prompt 2 (2 tokens) and prompt 1 (3 tokens) in one contiguous buffer, prompt 2's view
  // starting where prompt 1's third position would be had it a capacity of 5: they overlap in
  // range but not in what is written...
  auto views = prompt_views(5);
  for (auto& v : views)
    v = prepack::prompt_view(v.data, prepack::cache_order::position_head_dim, 5, heads, dim);
  views[2].data = views[1].data + 3 * heads * dim;
  EXPECT_NO_THROW(prepack::unpack_prompts(l, src, views));
  // ...until prompt 2 starts one position earlier, on prompt 1's last written token.
  std::fill(dst_buf.begin(), dst_buf.end(), 9.0f);
  views[2].data = views[1].data + 2 * heads * dim;
  EXPECT_PREPACK_ERROR(prepack::unpack_prompts(l, src, views), "two destinations write the same");
  expect_untouched();
}

// K and V of every layer in one call, converted to half or bfloat16 on the way (rounding to
// nearest even), equal to the per-layer float copy converted element by element.
template <class H>
void expect_all_layers_convert(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 40; ++trial) {
    const fixture f = random_fixture(rng, trial);
    const auto& l = f.layout;
    const std::size_t n_layers = 1 + rng() % 3, heads = f.n_heads, dim = f.head_dim;
    std::vector<float> kbuf(n_layers * l.n_slots() * heads * dim), vbuf(kbuf.size());
    std::uniform_real_distribution<float> u(-3, 3);
    for (auto& x : kbuf) x = u(rng);
    for (auto& x : vbuf) x = u(rng);
    const auto view5 = [&](const std::vector<float>& b) {
      return prepack::contiguous_view<const float, 5>(
          b.data(), {n_layers, l.n_rows(), l.width(), heads, dim});
    };
    const prepack::packed_kv<const float> src{view5(kbuf), view5(vbuf)};
    // A paged pool per K and V: (layer, block, offset, head, dim), one block per prompt.
    const std::size_t bs = static_cast<std::size_t>(
        *std::max_element(l.prompt_length().begin(), l.prompt_length().end()));
    const std::size_t n_blocks = l.n_prompts() + 2;
    std::vector<H> kpool(n_layers * n_blocks * bs * heads * dim, H(-1.0f)), vpool(kpool);
    std::vector<int> table(l.n_prompts());
    for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int>(n_blocks - 1 - i);
    const auto pool5 = [&](std::vector<H>& b) {
      return prepack::contiguous_view<H, 5>(b.data(), {n_layers, n_blocks, bs, heads, dim});
    };
    prepack::unpack_paged(l, src, pool5(kpool), pool5(vpool),
                          prepack::contiguous_view<const int, 2>(table.data(), {l.n_prompts(), 1}));
    const auto kp = pool5(kpool), vp = pool5(vpool);
    for (std::size_t layer = 0; layer < n_layers; ++layer) {
      for (std::size_t i = 0; i < l.n_prompts(); ++i) {
        for (std::size_t t = 0; t < static_cast<std::size_t>(l.prompt_length()[i]); ++t) {
          const std::size_t slot = l.first_slot(i) + t;
          for (std::size_t h = 0; h < heads; ++h) {
            for (std::size_t d = 0; d < dim; ++d) {
              const std::size_t e = ((layer * l.n_slots() + slot) * heads + h) * dim + d;
              const auto blk = static_cast<std::size_t>(table[i]);
              ASSERT_EQ(kp(layer, blk, t, h, d).bits, H(kbuf[e]).bits);
              ASSERT_EQ(vp(layer, blk, t, h, d).bits, H(vbuf[e]).bits);
            }
          }
        }
      }
    }
    // The two spare blocks stay untouched.
    for (std::size_t layer = 0; layer < n_layers; ++layer) {
      for (std::size_t blk = 0; blk < 2; ++blk) {
        for (std::size_t o = 0; o < bs; ++o) {
          ASSERT_EQ(static_cast<float>(kp(layer, blk, o, 0, 0)), -1.0f);
        }
      }
    }
    // K and V in one and the same pool are refused: they would write the same elements.
    EXPECT_PREPACK_ERROR(prepack::unpack_paged(l, src, pool5(kpool), pool5(kpool),
                                               prepack::contiguous_view<const int, 2>(
                                                   table.data(), {l.n_prompts(), 1})),
                         "key and value pools: two destinations write the same element");
  }
}

TEST(UnpackAllLayers, PagedHalfPool) { expect_all_layers_convert<prepack::half>(3); }
TEST(UnpackAllLayers, PagedBFloat16Pool) { expect_all_layers_convert<prepack::bfloat16>(4); }

// A slot mapping, built and checked once, writes every layer through write_slots; chunks that
// continue a context land after it.
TEST(SlotMapping, WritesEachLayerThroughTheMapping) {
  const std::vector<int> len{3, 2};
  const std::vector<long long> context{4, 0};               // prompt 0 continues 4 cached tokens
  const auto plan = prepack::first_fit_decreasing(len, 4);  // rows: 3 + pad | 2 + pads
  const auto l =
      prepack::make_layout(plan, prepack::span<const int>(std::vector<int>{1, 2, 3, 4, 5}),
                           prepack::span<const long long>(context));
  const std::size_t bs = 2, n_blocks = 8, heads = 1, dim = 2;
  // prompt 0: positions 4..6 -> blocks 2, 3 (entries 2 and 3 of its table); prompt 1: block 5.
  const std::vector<int> table{0, 1, 6, 7, 5, -1, -1, -1};
  const auto m = prepack::make_slot_mapping(
      l, prepack::contiguous_view<const int, 2>(table.data(), {2, 4}), n_blocks, bs);
  std::vector<std::int64_t> want(l.n_slots(), -1);
  want[l.first_slot(0) + 0] = 6 * 2 + 0;  // position 4: block table[0][2] = 6, offset 0
  want[l.first_slot(0) + 1] = 6 * 2 + 1;
  want[l.first_slot(0) + 2] = 7 * 2 + 0;  // position 6
  want[l.first_slot(1) + 0] = 5 * 2 + 0;
  want[l.first_slot(1) + 1] = 5 * 2 + 1;
  EXPECT_EQ(std::vector<std::int64_t>(m.slots().begin(), m.slots().end()), want);
  std::vector<float> src(l.n_slots() * heads * dim);
  std::iota(src.begin(), src.end(), 1.0f);
  std::vector<double> pool(n_blocks * bs * heads * dim, 0.0);
  prepack::write_slots(
      m, prepack::contiguous_view<const float, 3>(src.data(), {l.n_slots(), heads, dim}),
      prepack::contiguous_view<double, 4>(pool.data(), {n_blocks, bs, heads, dim}));
  for (std::size_t s = 0; s < l.n_slots(); ++s) {
    if (want[s] < 0) continue;
    const auto p = static_cast<std::size_t>(want[s]);
    EXPECT_EQ(pool[p * dim], src[s * dim]);
    EXPECT_EQ(pool[p * dim + 1], src[s * dim + 1]);
  }
  EXPECT_EQ(std::count(pool.begin(), pool.end(), 0.0), static_cast<long>(pool.size() - 10));
  // Errors: a pool of another shape; a mapping with a slot twice or out of range.
  EXPECT_PREPACK_ERROR(
      prepack::write_slots(
          m, prepack::contiguous_view<const float, 3>(src.data(), {l.n_slots(), heads, dim}),
          prepack::contiguous_view<double, 4>(pool.data(), {4, 4, heads, dim})),
      "paged pool: 4 blocks of 4, the slot mapping was built for 8 of 2");
  EXPECT_PREPACK_ERROR(prepack::slot_mapping::from_slots({3, -1, 3}, 4, 2),
                       "token 2: slot 3 is also written by token 0");
  EXPECT_PREPACK_ERROR(prepack::slot_mapping::from_slots({3, 8}, 4, 2),
                       "token 1: slot 8 outside the pool's 8 slots");
  EXPECT_PREPACK_ERROR(prepack::slot_mapping::from_slots({0}, 0, 2), "the pool has no blocks");
  const std::vector<int> empty_pool{0};
  EXPECT_PREPACK_ERROR(
      prepack::make_slot_mapping(
          l, prepack::contiguous_view<const int, 2>(empty_pool.data(), {1, 1}), 0, 2),
      "paged pool: the pool has no blocks");
}

// Every named pool layout, vLLM's split key cache included, receives each token at the element
// the layout's own index formula names (written out here, not taken from the views), converting
// to half precision on the way; every other element keeps its sentinel.
template <class T>
void expect_pool_layouts(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::size_t n_blocks = 5, bs = 3, heads = 2, dim = 16, tokens = 11;
  // A random injective mapping of the tokens into the pool's slots, a few tokens skipped (-1).
  std::vector<std::int64_t> pool_slots(n_blocks * bs);
  std::iota(pool_slots.begin(), pool_slots.end(), 0);
  std::shuffle(pool_slots.begin(), pool_slots.end(), rng);
  std::vector<std::int64_t> slots(pool_slots.begin(), pool_slots.begin() + tokens);
  slots[2] = slots[7] = -1;
  const auto m = prepack::slot_mapping::from_slots(slots, n_blocks, bs);
  std::vector<float> src(tokens * heads * dim);
  for (std::size_t k = 0; k < src.size(); ++k) src[k] = static_cast<float>(k % 251);
  const auto src_view = prepack::contiguous_view<const float, 3>(src.data(), {tokens, heads, dim});
  const std::size_t x = 16 / sizeof(T);
  // Physical index of (block b, offset o, head h, dim d) in each layout.
  using index_fn = std::size_t (*)(std::size_t, std::size_t, std::size_t, std::size_t);
  const std::vector<std::pair<prepack::paged_order, index_fn>> orders{
      {prepack::paged_order::block_slot_head_dim,
       [](std::size_t b, std::size_t o, std::size_t h, std::size_t d) {
         return ((b * bs + o) * heads + h) * dim + d;
       }},
      {prepack::paged_order::block_head_slot_dim,
       [](std::size_t b, std::size_t o, std::size_t h, std::size_t d) {
         return ((b * heads + h) * bs + o) * dim + d;
       }},
      {prepack::paged_order::block_head_dim_slot,
       [](std::size_t b, std::size_t o, std::size_t h, std::size_t d) {
         return ((b * heads + h) * dim + d) * bs + o;
       }},
  };
  const auto expect_written = [&](const std::vector<T>& pool, auto&& index) {
    std::vector<bool> hit(pool.size(), false);
    for (std::size_t t = 0; t < tokens; ++t) {
      if (slots[t] < 0) continue;
      const auto slot = static_cast<std::size_t>(slots[t]);
      for (std::size_t h = 0; h < heads; ++h) {
        for (std::size_t d = 0; d < dim; ++d) {
          const std::size_t at = index(slot / bs, slot % bs, h, d);
          hit[at] = true;
          ASSERT_EQ(prepack::to_float(pool[at]), src[(t * heads + h) * dim + d])
              << "token " << t << " head " << h << " dim " << d;
        }
      }
    }
    for (std::size_t k = 0; k < pool.size(); ++k) {
      if (!hit[k]) {
        ASSERT_EQ(prepack::to_float(pool[k]), static_cast<float>(kSentinel)) << k;
      }
    }
  };
  const T sentinel = prepack::convert_to<T>(static_cast<float>(kSentinel));
  for (const auto& [order, index] : orders) {
    std::vector<T> pool(n_blocks * bs * heads * dim, sentinel);
    prepack::write_slots(m, src_view,
                         prepack::paged_view(pool.data(), order, n_blocks, bs, heads, dim));
    expect_written(pool, index);
  }
  std::vector<T> key(n_blocks * bs * heads * dim, sentinel);
  prepack::write_slots(m, src_view, prepack::split_key_view(key.data(), n_blocks, bs, heads, dim));
  expect_written(key, [x](std::size_t b, std::size_t o, std::size_t h, std::size_t d) {
    return (((b * heads + h) * (dim / x) + d / x) * bs + o) * x + d % x;
  });
  // Errors, nothing written: x not dividing the head dim; heads or dims that differ.
  EXPECT_PREPACK_ERROR(prepack::split_key_view(key.data(), n_blocks, bs, heads, dim, 3),
                       "split key cache: head dim 16 is not a multiple of x = 3");
  std::vector<T> small(n_blocks * bs * heads * 8, sentinel);
  EXPECT_PREPACK_ERROR(prepack::write_slots(m, src_view,
                                            prepack::split_key_view(small.data(), n_blocks, bs,
                                                                    heads, std::size_t{8}, 4)),
                       "paged pool: 2 heads x 2 x 4 dims, the source has 2 x 16");
  for (const T& v : small) ASSERT_EQ(prepack::to_float(v), static_cast<float>(kSentinel));
}

TEST(SlotMapping, WritesVllmPoolLayoutsFloat) { expect_pool_layouts<float>(5); }
TEST(SlotMapping, WritesVllmPoolLayoutsHalf) { expect_pool_layouts<prepack::half>(6); }

// A destination with more layers than the source gets the source's layers in its first ones
// (the rest untouched); one with fewer is refused. A double source goes into a half pool
// rounded once (1 + 2^-11 + 2^-40 is 0x3C01, not the 0x3C00 rounding through float gives).
TEST(UnpackAllLayers, MoreDestinationLayersAndDoublesIntoHalf) {
  const std::vector<int> len{2, 1};
  const auto l =
      prepack::make_layout(prepack::first_fit_decreasing(len, 3), std::vector<int>{1, 2, 3});
  const std::size_t n_layers = 2, heads = 1, dim = 1, bs = 2, n_blocks = 4;
  const double odd = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  std::vector<double> kbuf(n_layers * l.n_slots(), odd), vbuf(kbuf);
  const auto view5 = [&](const std::vector<double>& b) {
    return prepack::contiguous_view<const double, 5>(b.data(),
                                                     {n_layers, l.n_rows(), l.width(), heads, dim});
  };
  const prepack::packed_kv<const double> src{view5(kbuf), view5(vbuf)};
  const std::vector<int> table{0, 1};
  const auto tv = prepack::contiguous_view<const int, 2>(table.data(), {2, 1});
  std::vector<prepack::half> kpool(3 * n_blocks * bs, prepack::half(-1.0f)), vpool(kpool);
  const auto pool5 = [&](std::vector<prepack::half>& b, std::size_t layers) {
    return prepack::contiguous_view<prepack::half, 5>(b.data(), {layers, n_blocks, bs, heads, dim});
  };
  prepack::unpack_paged(l, src, pool5(kpool, 3), pool5(vpool, 3), tv);
  const auto kp = pool5(kpool, 3);
  for (std::size_t layer = 0; layer < 3; ++layer) {
    EXPECT_EQ(kp(layer, 0, 0, 0, 0).bits, layer < n_layers ? 0x3C01u : prepack::half(-1.0f).bits)
        << "layer " << layer;
  }
  std::vector<prepack::half> small(1 * n_blocks * bs);
  EXPECT_PREPACK_ERROR(prepack::unpack_paged(l, src, pool5(small, 1), pool5(small, 1), tv),
                       "1 layers, the source has 2");
}

}  // namespace

namespace {
// vLLM's CPU cache: per block and head, K as [head_dim][block_size], then V as
// [block_size][head_dim] (python/tests/test_vllm_cpu.py checks it against vLLM's own op).
TEST(Unpack, VllmCpuCacheViewsPlaceKTransposedThenV) {
  const std::size_t nb = 3, bs = 4, heads = 2, hd = 3;
  std::vector<float> cache(nb * heads * bs * 2 * hd, 0.0f);
  const auto kv = prepack::vllm_cpu_kv_views(cache.data(), nb, bs, heads, hd);
  const std::vector<std::int64_t> slots{1 * 4 + 2, 2 * 4 + 3};
  const auto m = prepack::slot_mapping::from_slots(slots, nb, bs);
  std::vector<float> k(2 * heads * hd), v(2 * heads * hd);
  for (std::size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<float>(i + 1);
    v[i] = -static_cast<float>(i + 1);
  }
  prepack::write_slots(m, prepack::contiguous_view<const float, 3>(k.data(), {2, heads, hd}),
                       kv[0]);
  prepack::write_slots(m, prepack::contiguous_view<const float, 3>(v.data(), {2, heads, hd}),
                       kv[1]);
  for (std::size_t t = 0; t < 2; ++t) {
    const auto slot = static_cast<std::size_t>(slots[t]);
    const std::size_t b = slot / bs, o = slot % bs;
    for (std::size_t h = 0; h < heads; ++h) {
      const std::size_t base = (b * heads + h) * 2 * bs * hd;
      for (std::size_t d = 0; d < hd; ++d) {
        EXPECT_EQ(cache[base + d * bs + o], k[(t * heads + h) * hd + d]);
        EXPECT_EQ(cache[base + bs * hd + o * hd + d], v[(t * heads + h) * hd + d]);
      }
    }
  }
  std::size_t written = 0;
  for (float x : cache) written += x != 0.0f ? 1 : 0;
  EXPECT_EQ(written, 2 * 2 * heads * hd);  // nothing else touched
}
}  // namespace
