// libFuzzer target: plan -> layout -> masks -> unpack with tagged data. Every value must land
// at its prompt and position; nothing else may be written; a bad block table or destination
// must throw prepack::error with the destination untouched.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "prepack/prepack.hpp"

namespace {

#define CHECK(cond)                \
  do {                             \
    if (!(cond)) __builtin_trap(); \
  } while (0)

constexpr int kUntouched = -1;

int tag(std::size_t i, std::size_t t, std::size_t h) {
  return static_cast<int>((i * 4096 + t) * 4 + h);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 4) return 0;
  const std::uint8_t mode = data[0];
  const std::size_t heads = 1 + data[1] % 3;
  const std::size_t block_size = 1 + data[2] % 9;
  const std::size_t n = std::min<std::size_t>(64, (size - 3) / 2);
  std::vector<int> len(n);
  std::vector<int> table;  // raw block ids from the input, possibly invalid
  for (std::size_t i = 0; i < n; ++i) {
    len[i] = data[3 + i] % 64;  // 0 is a bad length on purpose
    table.push_back(data[3 + n + i] % 80);
  }
  try {
    const int kind = mode % 4;
    const std::optional<int> cap = (mode & 4) ? std::optional<int>(64) : std::nullopt;
    const auto plan = kind == 0   ? prepack::first_fit_decreasing(len, cap)
                      : kind == 1 ? prepack::best_fit_decreasing(len, cap)
                      : kind == 2 ? prepack::padded(len, prepack::padding_side::left, cap)
                                  : prepack::padded(len, prepack::padding_side::right, cap);
    std::vector<int> tokens;
    for (std::size_t i = 0; i < n; ++i) {
      for (int t = 0; t < len[i]; ++t) tokens.push_back(static_cast<int>(i));
    }
    const auto l = prepack::make_layout(plan, tokens);
    // Masks: ones of the dense mask = sum len (len + 1) / 2; varlen covers every token once.
    const auto m = prepack::dense_mask(l);
    std::size_t ones = 0, want = 0;
    for (auto b : m) ones += b;
    for (int x : len) want += static_cast<std::size_t>(x) * static_cast<std::size_t>(x + 1) / 2;
    CHECK(ones == want);
    const auto v = prepack::make_varlen(l);
    CHECK(static_cast<std::size_t>(v.cu_seqlens.back()) == tokens.size());

    // Tagged packed source, (row, slot, head, dim = 1).
    std::vector<int> src(l.n_slots() * heads, -2);
    const auto sv = prepack::packed_view<int>(
        src.data(),
        (mode & 8) ? prepack::kv_order::row_head_slot_dim : prepack::kv_order::row_slot_head_dim,
        l.n_rows(), l.width(), heads, 1);
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t t = 0; t < static_cast<std::size_t>(len[i]); ++t) {
        for (std::size_t h = 0; h < heads; ++h) {
          sv(static_cast<std::size_t>(l.prompt_row()[i]),
             static_cast<std::size_t>(l.prompt_offset()[i]) + t, h, 0) = tag(i, t, h);
        }
      }
    }
    // Paged pool through the fuzzer's block table: either exact placement or an error with the
    // pool untouched.
    const std::size_t n_blocks = 80;
    std::vector<int> pool(n_blocks * block_size * heads, kUntouched);
    const std::size_t max_blocks = 1;
    std::vector<int> bt(n * max_blocks);
    for (std::size_t i = 0; i < n; ++i) bt[i] = table[i];
    const auto pv = prepack::contiguous_view<int, 4>(pool.data(), {n_blocks, block_size, heads, 1});
    bool ok = true;
    try {
      prepack::unpack_paged(l, sv, pv,
                            prepack::contiguous_view<const int, 2>(bt.data(), {n, max_blocks}));
    } catch (const prepack::error&) {
      ok = false;
      CHECK(std::all_of(pool.begin(), pool.end(), [](int x) { return x == kUntouched; }));
    }
    if (ok) {
      std::size_t written = 0;
      for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t t = 0; t < static_cast<std::size_t>(len[i]); ++t) {
          for (std::size_t h = 0; h < heads; ++h) {
            CHECK(pv(static_cast<std::size_t>(bt[i]), t, h, 0) == tag(i, t, h));
            ++written;
          }
        }
      }
      CHECK(static_cast<std::size_t>(std::count(pool.begin(), pool.end(), kUntouched)) + written ==
            pool.size());
    }
    // Per-prompt buffers, then a left-padded batch: exact placement, pads untouched.
    const auto per = prepack::unpack_contiguous(l, sv);
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t t = 0; t < static_cast<std::size_t>(len[i]); ++t) {
        for (std::size_t h = 0; h < heads; ++h) CHECK(per[i][t * heads + h] == tag(i, t, h));
      }
    }
    const std::size_t w = static_cast<std::size_t>(*std::max_element(len.begin(), len.end()));
    std::vector<int> lp(n * w * heads, kUntouched);
    prepack::unpack_left_padded(l, sv,
                                prepack::contiguous_view<int, 4>(lp.data(), {n, w, heads, 1}));
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t pad = w - static_cast<std::size_t>(len[i]);
      for (std::size_t s = 0; s < w; ++s) {
        for (std::size_t h = 0; h < heads; ++h) {
          CHECK(lp[(i * w + s) * heads + h] == (s < pad ? kUntouched : tag(i, s - pad, h)));
        }
      }
    }
  } catch (const prepack::error&) {
    // Bad lengths (a 0) or an empty batch: a clear error is the right answer.
  }
  return 0;
}
