// Stress: 10^6 prompts through planner, layout and unpack (no kernel). Every token is tagged with
// its prompt and position; the test checks nothing is lost or mixed anywhere, and measures the
// heap the pipeline needs against the data it must hold (a counting operator new in this binary).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <vector>

#include "prepack/prepack.hpp"
#include "support/workload.hpp"

// ---- heap accounting for this test binary ----
namespace {
std::atomic<std::size_t> g_live{0}, g_peak{0};
}  // namespace

void* operator new(std::size_t n) {
  // A header before each block remembers its size, so delete can subtract it.
  void* p = std::malloc(n + 16);
  if (p == nullptr) throw std::bad_alloc();
  *static_cast<std::size_t*>(p) = n;
  const std::size_t live = g_live += n;
  std::size_t peak = g_peak.load();
  while (live > peak && !g_peak.compare_exchange_weak(peak, live)) {
  }
  return static_cast<char*>(p) + 16;
}
void operator delete(void* p) noexcept {
  if (p == nullptr) return;
  void* base = static_cast<char*>(p) - 16;
  g_live -= *static_cast<std::size_t*>(base);
  std::free(base);
}
void operator delete(void* p, std::size_t) noexcept { operator delete(p); }

namespace {

template <class T>
std::size_t bytes(const std::vector<T>& v) {
  return v.capacity() * sizeof(T);
}

std::int32_t tag(std::size_t prompt, std::size_t pos) {
  return static_cast<std::int32_t>((prompt * 2654435761u + pos * 40503u) & 0x7fffffff);
}

TEST(Stress, AMillionPromptsThroughPlanLayoutAndUnpack) {
  constexpr std::size_t n = 1000000;
  const auto lengths = support::generate_lengths(support::profile::heavy_cut, n, 5, 64);
  std::size_t total = 0;
  for (int l : lengths) total += static_cast<std::size_t>(l);
  std::vector<std::int32_t> tokens;
  tokens.reserve(total);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t t = 0; t < static_cast<std::size_t>(lengths[i]); ++t)
      tokens.push_back(tag(i, t));
  }
  const std::size_t base = g_live.load();
  g_peak = base;

  const auto plan = prepack::first_fit_decreasing(lengths);
  const auto layout = prepack::make_layout(plan, tokens);
  ASSERT_EQ(layout.n_prompts(), n);
  ASSERT_EQ(layout.useful_tokens(), total);
  // Nothing lost or mixed in the layout: every real slot holds its own prompt's token.
  std::size_t real = 0;
  for (std::size_t s = 0; s < layout.n_slots(); ++s) {
    if (layout.segments()[s] < 0) continue;
    ++real;
    ASSERT_EQ(layout.tokens()[s], tag(static_cast<std::size_t>(layout.segments()[s]),
                                      static_cast<std::size_t>(layout.positions()[s])));
  }
  ASSERT_EQ(real, total);

  // Unpack the token ids (as a packed per-token tensor: 1 head x 1 dim) into a paged pool.
  const std::size_t block = 16;
  std::vector<std::int32_t> table;  // [n][max_blocks]
  const std::size_t max_blocks = (64 + block - 1) / block;
  table.reserve(n * max_blocks);
  std::size_t next = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t need = (static_cast<std::size_t>(lengths[i]) + block - 1) / block;
    for (std::size_t k = 0; k < max_blocks; ++k)
      table.push_back(k < need ? static_cast<std::int32_t>(next++) : -1);
  }
  std::vector<std::int32_t> pool(next * block, -1);
  const auto src = prepack::packed_view<const std::int32_t>(layout.tokens().data(),
                                                            prepack::kv_order::row_slot_head_dim,
                                                            layout.n_rows(), layout.width(), 1, 1);
  prepack::unpack_paged(
      layout, src, prepack::contiguous_view<std::int32_t, 4>(pool.data(), {next, block, 1, 1}),
      prepack::contiguous_view<const std::int32_t, 2>(table.data(), {n, max_blocks}));
  std::size_t written = 0;
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t t = 0; t < static_cast<std::size_t>(lengths[i]); ++t) {
      const auto b = static_cast<std::size_t>(table[i * max_blocks + t / block]);
      ASSERT_EQ(pool[b * block + t % block], tag(i, t)) << "prompt " << i << " token " << t;
      ++written;
    }
  }
  ASSERT_EQ(written, total);

  // Working memory: the heap's peak above what existed before the pipeline, against what the
  // pipeline must hold at its end (the plan, the layout, the block table and the pool).
  const std::size_t held =
      bytes(plan.length) + bytes(plan.row) + bytes(plan.offset) + bytes(plan.fill) +
      bytes(plan.row_begin) + bytes(plan.row_prompts) + bytes(layout.parts().tokens) +
      bytes(layout.parts().positions) + bytes(layout.parts().segments) +
      bytes(layout.parts().row_begin) + bytes(layout.parts().row_prompts) +
      bytes(layout.parts().row_cu_seqlens) + bytes(layout.parts().prompt_row) +
      bytes(layout.parts().prompt_offset) + bytes(layout.parts().prompt_length) +
      bytes(layout.parts().prompt_context) + bytes(layout.parts().last_token) + bytes(table) +
      bytes(pool);
  const double ratio = static_cast<double>(g_peak.load() - base) / static_cast<double>(held);
  std::printf(
      "1e6 prompts, %zu tokens, %zu rows: peak working heap %.1f MiB for %.1f MiB of data held: "
      "%.3fx\n",
      total, layout.n_rows(), static_cast<double>(g_peak.load() - base) / 1048576.0,
      static_cast<double>(held) / 1048576.0, ratio);
  EXPECT_LE(ratio, 1.2);
}

}  // namespace
