// libFuzzer target: the planners on any lengths, capacities and length types. Bad input must
// throw prepack::error; good input must give a plan that places every prompt exactly once,
// inside its row, with no two prompts sharing a slot, and that make_layout accepts.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "prepack/layout.hpp"
#include "prepack/plan.hpp"

namespace {

#define CHECK(cond)                \
  do {                             \
    if (!(cond)) __builtin_trap(); \
  } while (0)

struct reader {
  const std::uint8_t* p;
  std::size_t n;
  template <class T>
  bool get(T& out) {
    if (n < sizeof(T)) return false;
    std::memcpy(&out, p, sizeof(T));
    p += sizeof(T);
    n -= sizeof(T);
    return true;
  }
};

template <class L>
void check_plan(const std::vector<L>& len, const prepack::pack_plan<L>& p) {
  CHECK(p.n_prompts() == len.size());
  CHECK(p.row_begin.size() == p.n_rows() + 1 && p.row_begin.back() == len.size());
  std::vector<unsigned char> seen(len.size(), 0);
  for (std::size_t r = 0; r < p.n_rows(); ++r) {
    unsigned long long end = 0;  // slots are adjacent and increasing within a row
    bool first = true;
    unsigned long long used = 0;
    for (std::size_t k = p.row_begin[r]; k < p.row_begin[r + 1]; ++k) {
      const std::size_t i = p.row_prompts[k];
      CHECK(i < len.size() && !seen[i] && p.row[i] == r && p.length[i] == len[i]);
      seen[i] = 1;
      const auto off = static_cast<unsigned long long>(p.offset[i]);
      CHECK(first || off == end);
      first = false;
      end = off + static_cast<unsigned long long>(len[i]);
      CHECK(end <= static_cast<unsigned long long>(p.capacity));
      used += static_cast<unsigned long long>(len[i]);
    }
    CHECK(used == static_cast<unsigned long long>(p.fill[r]) && used > 0);
  }
  for (unsigned char s : seen) CHECK(s == 1);
  prepack::detail::check_plan(p);  // the layout's own validator agrees
}

template <class L>
void run(reader& in) {
  std::uint8_t mode = 0;
  in.get(mode);
  L cap{};
  const bool give_cap = (mode & 1) != 0;
  if (give_cap && !in.get(cap)) return;
  std::vector<L> len;
  L v{};
  while (len.size() < 4096 && in.get(v)) len.push_back(v);
  const std::optional<L> capacity = give_cap ? std::optional<L>(cap) : std::nullopt;
  // fitted_plan: a budget from the mode byte, the given capacity (if not negative) as the widest.
  prepack::fit_options fit;
  fit.max_pad = static_cast<double>(mode >> 2) / 16.0;
  if (give_cap && static_cast<long double>(cap) >= 0)
    fit.max_capacity = static_cast<unsigned long long>(cap);
  // Lengths of billions of tokens can make the exact search long (see fitted_plan): bounded,
  // the limit's error is one more prepack::error.
  const std::size_t max_packings =
      std::max<std::size_t>(8, (std::size_t{1} << 18) / (len.size() + 1));
  for (int kind = 0; kind < 5; ++kind) {
    try {
      const auto p =
          kind == 0   ? prepack::first_fit_decreasing(len, capacity)
          : kind == 1 ? prepack::best_fit_decreasing(len, capacity)
          : kind == 2
              ? prepack::padded(
                    len, (mode & 2) ? prepack::padding_side::left : prepack::padding_side::right,
                    capacity)
              : prepack::fitted_plan(kind == 3 ? prepack::packer::first_fit_decreasing
                                               : prepack::packer::best_fit_decreasing,
                                     len, fit, max_packings);
      check_plan(len, p);
      if (kind >= 3 && fit.max_capacity) {
        CHECK(static_cast<unsigned long long>(p.capacity) <= *fit.max_capacity);
      }
    } catch (const prepack::error&) {
      // Bad input: fine, as long as it is a prepack::error.
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  reader in{data + 1, size - 1};
  switch (data[0] % 8) {
    case 0:
      run<std::int8_t>(in);
      break;
    case 1:
      run<std::uint8_t>(in);
      break;
    case 2:
      run<std::int16_t>(in);
      break;
    case 3:
      run<std::uint16_t>(in);
      break;
    case 4:
      run<std::int32_t>(in);
      break;
    case 5:
      run<std::uint32_t>(in);
      break;
    case 6:
      run<std::int64_t>(in);
      break;
    default:
      run<std::uint64_t>(in);
      break;
  }
  return 0;
}
