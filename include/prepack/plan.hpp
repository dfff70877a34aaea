// prepack/plan.hpp - bin packing of prompt lengths into rows, and the padding baselines.
//
// A plan assigns every prompt a row and an offset inside that row; it holds no tokens.
// Cost: first_fit_decreasing and best_fit_decreasing run in O(n log n) time (the sort is a
// counting sort, O(n + longest), when the longest prompt is at most 4n) and allocate O(n) words;
// the padding plans are O(n); fitted_plan widens the rows to a padding budget with
// O(log(width range)) packings. Every planner is deterministic: prompts of equal
// length are placed in order of their original index, and among equally good rows the lowest
// index wins.
#pragma once

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <numeric>
#include <optional>
#include <set>
#include <type_traits>
#include <utility>
#include <vector>

#include "detail/checked.hpp"
#include "detail/range.hpp"
#include "error.hpp"
#include "span.hpp"

PREPACK_NAMESPACE_BEGIN

/// Where each prompt goes. Length is the caller's length type (any integer type).
template <class Length>
struct pack_plan {
  static_assert(std::is_integral_v<Length> && !std::is_same_v<Length, bool>,
                "lengths must be an integer type");
  using length_type = Length;

  Length capacity = 0;                   // tokens per row: the width of every row
  std::vector<Length> length;            // [n_prompts]    tokens of prompt i
  std::vector<std::size_t> row;          // [n_prompts]    row holding prompt i
  std::vector<Length> offset;            // [n_prompts]    first slot of prompt i in its row
  std::vector<Length> fill;              // [n_rows]       tokens used in row r (<= capacity)
  std::vector<std::size_t> row_begin;    // [n_rows + 1]   row r holds row_prompts[row_begin[r],
                                         //                row_begin[r + 1])
  std::vector<std::size_t> row_prompts;  // [n_prompts]    prompt ids row by row, in slot order

  std::size_t n_prompts() const noexcept { return length.size(); }
  std::size_t n_rows() const noexcept { return fill.size(); }
  /// Tokens that carry a prompt: the sum of all lengths.
  std::size_t useful_tokens() const noexcept {
    std::size_t s = 0;
    for (Length f : fill) s += static_cast<std::size_t>(f);
    return s;
  }
  /// Slots a prefill over this plan computes: n_rows * capacity.
  std::size_t slots() const noexcept { return n_rows() * static_cast<std::size_t>(capacity); }
};

/// The planners by name, for code that chooses one at run time.
enum class packer { first_fit_decreasing, best_fit_decreasing };

/// Which side of a padded row the pad slots go.
enum class padding_side { left, right };

namespace detail {

struct identity {
  template <class T>
  constexpr T&& operator()(T&& v) const noexcept {
    return std::forward<T>(v);
  }
};

// Checks the lengths and the capacity; returns the capacity to use. Throws before any output.
template <class Length>
Length checked_capacity(span<const Length> length, std::optional<Length> capacity) {
  require(!length.empty(), "empty batch: no prompts to plan");
  Length longest = 0;
  for (std::size_t i = 0; i < length.size(); ++i) {
    require(length[i] > 0, "prompt ", i, ": length ", length[i]);
    longest = std::max(longest, length[i]);
  }
  if (!capacity) return longest;
  require(*capacity > 0, "capacity ", *capacity);
  for (std::size_t i = 0; i < length.size(); ++i) {
    require(length[i] <= *capacity, "prompt ", i, ": length ", length[i], " exceeds capacity ",
            *capacity);
  }
  return *capacity;
}

// Prompt ids by decreasing length, ties by increasing id. Lengths are positive (checked). When
// the longest is at most 4n, a counting sort does it in O(n + longest); else a comparison sort.
template <class Length>
std::vector<std::size_t> decreasing_order(span<const Length> length) {
  const std::size_t n = length.size();
  std::vector<std::size_t> order(n);
  Length longest = 0;
  for (Length l : length) longest = std::max(longest, l);
  if (static_cast<unsigned long long>(longest) <= 4ull * n) {
    const auto top = static_cast<std::size_t>(longest);
    std::vector<std::size_t> start(top + 2, 0);  // start[top - l + 1] counts length l
    for (Length l : length) ++start[top - static_cast<std::size_t>(l) + 1];
    for (std::size_t k = 1; k < start.size(); ++k) start[k] += start[k - 1];
    for (std::size_t i = 0; i < n; ++i)
      order[start[top - static_cast<std::size_t>(length[i])]++] = i;
    return order;
  }
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return length[a] != length[b] ? length[a] > length[b] : a < b;
  });
  return order;
}

// Fills row, offset, fill, row_begin and row_prompts from the row each prompt was given,
// keeping the order in which prompts were placed.
template <class Length>
void finish_plan(pack_plan<Length>& p, const std::vector<std::size_t>& placement_order) {
  const std::size_t n_rows = p.fill.size();
  p.row_begin.assign(n_rows + 1, 0);
  for (std::size_t r : p.row) ++p.row_begin[r + 1];
  for (std::size_t r = 0; r < n_rows; ++r) p.row_begin[r + 1] += p.row_begin[r];
  p.row_prompts.assign(p.length.size(), 0);
  std::vector<std::size_t> cursor(p.row_begin.begin(), p.row_begin.end() - 1);
  for (std::size_t i : placement_order) p.row_prompts[cursor[p.row[i]]++] = i;
}

// A max-tree over the free space of n candidate rows (all start empty), answering "the
// lowest row with at least k free slots" in O(log n).
template <class Length>
class first_fit_tree {
 public:
  first_fit_tree(std::size_t n, Length capacity) {
    while (leaves_ < n) leaves_ *= 2;
    tree_.assign(2 * leaves_, Length{0});
    for (std::size_t i = 0; i < n; ++i) tree_[leaves_ + i] = capacity;
    for (std::size_t i = leaves_; i-- > 1;) tree_[i] = std::max(tree_[2 * i], tree_[2 * i + 1]);
  }
  // Lowest row whose free space is >= k; the caller guarantees one exists.
  std::size_t find(Length k) const {
    PREPACK_ASSERT(tree_[1] >= k);
    std::size_t i = 1;
    while (i < leaves_) i = tree_[2 * i] >= k ? 2 * i : 2 * i + 1;
    return i - leaves_;
  }
  // The same, and the largest free space of the rows before it (those k did not fit) in
  // `passed`, left untouched when there are none.
  std::size_t find(Length k, std::optional<Length>& passed) const {
    PREPACK_ASSERT(tree_[1] >= k);
    std::size_t i = 1;
    while (i < leaves_) {
      if (tree_[2 * i] >= k) {
        i = 2 * i;
      } else {
        if (!passed || tree_[2 * i] > *passed) passed = tree_[2 * i];
        i = 2 * i + 1;
      }
    }
    return i - leaves_;
  }
  Length free(std::size_t row) const { return tree_[leaves_ + row]; }
  void set(std::size_t row, Length free) {
    std::size_t i = leaves_ + row;
    tree_[i] = free;
    for (i /= 2; i >= 1; i /= 2) tree_[i] = std::max(tree_[2 * i], tree_[2 * i + 1]);
  }

 private:
  std::size_t leaves_ = 1;
  std::vector<Length> tree_;  // [2 * leaves_]  tree_[1] is the root, leaves from tree_[leaves_]
};

template <class Length>
pack_plan<Length> start_plan(span<const Length> length, Length capacity) {
  pack_plan<Length> p;
  p.capacity = capacity;
  p.length.assign(length.begin(), length.end());
  p.row.assign(length.size(), 0);
  p.offset.assign(length.size(), Length{0});
  return p;
}

// The smallest row width above `width` at which a packing decision could change: a prompt of
// `length` that did not fit a row with `free` slots fits it from width + length - free on.
// Saturates at the largest width.
template <class Length>
void note_flip(unsigned long long* next, Length width, Length length, Length free) {
  if (next == nullptr) return;
  const auto w = static_cast<unsigned long long>(width);
  const auto gap = static_cast<unsigned long long>(length) - static_cast<unsigned long long>(free);
  const unsigned long long flip = w > ~0ull - gap ? ~0ull : w + gap;
  *next = std::min(*next, flip);
}

// First-fit-decreasing over prompts given in decreasing order, into rows of `cap` (>= every
// length, checked by the caller). With `next_change`, also the smallest width above cap at
// which the packing would differ (every placement decision is the same below it): rows of a
// width in [cap, next_change) are this packing, only wider.
template <class Length>
pack_plan<Length> ffd_sorted(span<const Length> length, const std::vector<std::size_t>& order,
                             Length cap, unsigned long long* next_change = nullptr) {
  pack_plan<Length> p = start_plan(length, cap);
  first_fit_tree<Length> tree(length.size(), cap);
  std::size_t n_rows = 0;
  for (std::size_t i : order) {
    std::size_t r;
    if (next_change != nullptr) {
      std::optional<Length> passed;  // the most room among the rows length[i] did not fit
      r = tree.find(length[i], passed);
      if (passed) note_flip(next_change, cap, length[i], *passed);
    } else {
      r = tree.find(length[i]);
    }
    const Length free = tree.free(r);
    p.row[i] = r;
    p.offset[i] = static_cast<Length>(cap - free);
    tree.set(r, static_cast<Length>(free - length[i]));
    n_rows = std::max(n_rows, r + 1);
  }
  p.fill.resize(n_rows);
  for (std::size_t r = 0; r < n_rows; ++r) p.fill[r] = static_cast<Length>(cap - tree.free(r));
  finish_plan(p, order);
  return p;
}

// Best-fit-decreasing, same contract as ffd_sorted. A row that did not fit a prompt is one of
// the open rows with less room, or a full row (no room).
template <class Length>
pack_plan<Length> bfd_sorted(span<const Length> length, const std::vector<std::size_t>& order,
                             Length cap, unsigned long long* next_change = nullptr) {
  pack_plan<Length> p = start_plan(length, cap);
  std::set<std::pair<Length, std::size_t>> open;  // (free slots, row) of rows with room
  std::size_t full = 0;                           // rows without room
  for (std::size_t i : order) {
    auto it = open.lower_bound({length[i], std::size_t{0}});
    if (next_change != nullptr) {
      if (it != open.begin()) {
        note_flip(next_change, cap, length[i], std::prev(it)->first);
      } else if (full > 0) {
        note_flip(next_change, cap, length[i], Length{0});
      }
    }
    std::size_t r;
    Length free;
    if (it == open.end()) {
      r = p.fill.size();
      free = cap;
      p.fill.push_back(Length{0});
    } else {
      r = it->second;
      free = it->first;
      open.erase(it);
    }
    p.row[i] = r;
    p.offset[i] = p.fill[r];
    p.fill[r] = static_cast<Length>(p.fill[r] + length[i]);
    const Length left = static_cast<Length>(free - length[i]);
    if (left > 0) {
      open.emplace(left, r);
    } else {
      ++full;
    }
  }
  finish_plan(p, order);
  return p;
}

template <class Length>
pack_plan<Length> pack_sorted(packer kind, span<const Length> length,
                              const std::vector<std::size_t>& order, Length cap,
                              unsigned long long* next_change = nullptr) {
  return kind == packer::best_fit_decreasing ? bfd_sorted(length, order, cap, next_change)
                                             : ffd_sorted(length, order, cap, next_change);
}

// Checks the lengths and capacity, sorts, packs: what every public packer does.
template <class Length>
pack_plan<Length> pack(packer kind, span<const Length> length, std::optional<Length> capacity) {
  const Length cap = checked_capacity(length, capacity);
  return pack_sorted(kind, length, decreasing_order(length), cap);
}

template <class Range, class Proj>
auto project_lengths(const Range& items, Proj proj) {
  using std::begin;
  using std::end;
  using Length = std::decay_t<decltype(proj(*begin(items)))>;
  static_assert(std::is_integral_v<Length>, "the size projection must return an integer");
  std::vector<Length> out;
  for (auto it = begin(items); it != end(items); ++it) out.push_back(proj(*it));
  return out;
}

}  // namespace detail

namespace detail {
// The padding baseline over checked lengths (see prepack::padded).
template <class Length>
pack_plan<Length> padded_plan(span<const Length> length, padding_side side,
                              std::optional<Length> capacity) {
  const Length cap = checked_capacity(length, capacity);
  pack_plan<Length> p = start_plan(length, cap);
  p.fill.assign(length.begin(), length.end());
  std::vector<std::size_t> order(length.size());
  for (std::size_t i = 0; i < length.size(); ++i) {
    order[i] = i;
    p.row[i] = i;
    p.offset[i] = side == padding_side::left ? static_cast<Length>(cap - length[i]) : Length{0};
  }
  finish_plan(p, order);
  return p;
}
}  // namespace detail

// Every planner takes the lengths as a range (prepack::span, std::vector, std::array: any
// contiguous container of an integer type, which becomes the plan's length type) or as a braced
// list (first_fit_decreasing({5, 2, 3})); the second form of each only forwards to the first.

/// Packs prompts into rows of `capacity` tokens, first-fit-decreasing: longest prompt first,
/// each into the lowest row with room. Capacity defaults to the longest prompt.
/// Throws prepack::error for an empty batch, a length <= 0, a capacity <= 0, or a prompt
/// longer than the capacity. Rows used are at most 11/9 OPT + 6/9.
template <class Range, class = detail::if_length_range<Range>>
pack_plan<detail::range_value_t<Range>> first_fit_decreasing(
    const Range& length, std::optional<detail::range_value_t<Range>> capacity = std::nullopt) {
  return detail::pack(packer::first_fit_decreasing, detail::as_span(length), capacity);
}
template <class Length>
pack_plan<Length> first_fit_decreasing(
    std::initializer_list<Length> length,
    std::optional<detail::nondeduced<Length>> capacity = std::nullopt) {
  return first_fit_decreasing(span<const Length>(length.begin(), length.size()), capacity);
}

/// Packs prompts into rows best-fit-decreasing: longest prompt first, each into the row it
/// leaves with the least free space (the lowest such row on ties). Same defaults, errors and
/// bound as first_fit_decreasing.
template <class Range, class = detail::if_length_range<Range>>
pack_plan<detail::range_value_t<Range>> best_fit_decreasing(
    const Range& length, std::optional<detail::range_value_t<Range>> capacity = std::nullopt) {
  return detail::pack(packer::best_fit_decreasing, detail::as_span(length), capacity);
}
template <class Length>
pack_plan<Length> best_fit_decreasing(
    std::initializer_list<Length> length,
    std::optional<detail::nondeduced<Length>> capacity = std::nullopt) {
  return best_fit_decreasing(span<const Length>(length.begin(), length.size()), capacity);
}

/// The packer `kind` by name, for code that chooses one at run time.
template <class Range, class = detail::if_length_range<Range>>
pack_plan<detail::range_value_t<Range>> make_plan(
    packer kind, const Range& length,
    std::optional<detail::range_value_t<Range>> capacity = std::nullopt) {
  return detail::pack(kind, detail::as_span(length), capacity);
}
template <class Length>
pack_plan<Length> make_plan(packer kind, std::initializer_list<Length> length,
                            std::optional<detail::nondeduced<Length>> capacity = std::nullopt) {
  return make_plan(kind, span<const Length>(length.begin(), length.size()), capacity);
}

/// The padding baseline as a plan: prompt i alone in row i, its pad slots on `side` (left as
/// Hugging Face pads for generation). Same defaults and errors as first_fit_decreasing.
template <class Range, class = detail::if_length_range<Range>>
pack_plan<detail::range_value_t<Range>> padded(
    const Range& length, padding_side side = padding_side::left,
    std::optional<detail::range_value_t<Range>> capacity = std::nullopt) {
  return detail::padded_plan(detail::as_span(length), side, capacity);
}
template <class Length>
pack_plan<Length> padded(std::initializer_list<Length> length,
                         padding_side side = padding_side::left,
                         std::optional<detail::nondeduced<Length>> capacity = std::nullopt) {
  return padded(span<const Length>(length.begin(), length.size()), side, capacity);
}

/// Plans arbitrary items through a size projection: `size_of(item)` gives an item's length,
/// whose integer type becomes the plan's length type.
///   auto p = prepack::make_plan(prepack::packer::first_fit_decreasing, requests,
///                               [](const request& r) { return r.tokens.size(); });
template <class Range, class Proj,
          class Length = std::decay_t<
              std::invoke_result_t<Proj&, decltype(*std::begin(std::declval<const Range&>()))>>>
pack_plan<Length> make_plan(packer kind, const Range& items, Proj size_of,
                            std::optional<detail::nondeduced<Length>> capacity = std::nullopt) {
  const std::vector<Length> length = detail::project_lengths(items, size_of);
  return make_plan(kind, length, capacity);
}

/// How fitted_plan chooses the row width.
struct fit_options {
  /// Pad slots allowed, as a fraction of the useful tokens (0.05: at most 5% more slots than
  /// tokens). 0 asks for rows with no pad slot at all.
  double max_pad = 0.05;
  /// The widest row allowed (an engine's per-row token budget). Default: every prompt in one row.
  std::optional<unsigned long long> max_capacity;
};

namespace detail {

inline unsigned long long ceil_div(unsigned long long a, unsigned long long b) {
  return a / b + (a % b != 0 ? 1 : 0);
}
inline unsigned long long saturating_mul(unsigned long long a, unsigned long long b) {
  return b != 0 && a > ~0ull / b ? ~0ull : a * b;
}

// Lower bounds on the rows any packing of the lengths into rows of width w needs, and the next
// width at which a bound can change: every row holds at most w tokens (ceil(total / w)), and at
// most j prompts longer than w / (j + 1) (j = 1 .. 8). O(n log n) to build, O(log n) per width.
template <class Length>
class row_bounds {
 public:
  row_bounds(span<const Length> length, unsigned long long total) : total_(total) {
    asc_.reserve(length.size());
    for (Length l : length) asc_.push_back(static_cast<unsigned long long>(l));
    std::sort(asc_.begin(), asc_.end());
  }
  // {the bound at width w, the smallest width > w at which it may change}
  std::pair<unsigned long long, unsigned long long> at(unsigned long long w) const {
    const unsigned long long by_tokens = ceil_div(total_, w);
    unsigned long long bound = by_tokens;
    unsigned long long next = by_tokens > 1 ? ceil_div(total_, by_tokens - 1) : ~0ull;
    for (unsigned long long j = 1; j <= 8; ++j) {
      // prompts longer than w / (j + 1), i.e. l > floor(w / (j + 1)): at most j share a row
      const auto first = std::upper_bound(asc_.begin(), asc_.end(), w / (j + 1));
      const auto count = static_cast<unsigned long long>(asc_.end() - first);
      bound = std::max(bound, ceil_div(count, j));
      if (first != asc_.end()) next = std::min(next, saturating_mul(j + 1, *first));
    }
    // `next` saturates at the largest width: a run that reaches it ends the scan.
    return {bound, next > w ? next : (w == ~0ull ? ~0ull : w + 1)};
  }

 private:
  unsigned long long total_;
  std::vector<unsigned long long> asc_;  // [n_prompts]  lengths, ascending
};

}  // namespace detail

/// Packs prompts with `kind` into rows as narrow as possible while leaving at most
/// opt.max_pad * useful_tokens pad slots: the paper's rows (capacity = the longest prompt) when
/// they already meet that budget, else the narrowest wider rows that do.
///
/// Rows as wide as the longest prompt waste slots whenever the prompts cannot fill them (lengths
/// all above half the longest; one long prompt and a few short ones). Kernels whose attention
/// stays inside each prompt (varlen, segment) pay for a row's width only in its pad slots, so a
/// wider row is free and the pad slots are not; kernels with a dense mask pay n_rows * width^2
/// for attention, so the narrowest width that meets the budget is the one to take for both.
///
/// The result is the narrowest width in [longest prompt, max_capacity] whose packing meets the
/// budget (a packer's padding is not monotone in the width, so no width is passed over
/// unchecked); when none does, the width with the fewest slots (the narrowest among equals).
/// Widths are scanned upward, and a width is packed only when it could matter: lower bounds on
/// its row count (total tokens / width; at most j prompts longer than width / (j + 1) in a row)
/// skip runs of widths that cannot meet the budget, and every packing also reports the widest
/// width up to which it stays the same packing (no placement decision flips below it), whose
/// wider copies only add slots. Without max_capacity some width always meets the budget (every
/// prompt in one row has no pad slot).
/// Cost: one sort, then one O(n log n) packing per distinct packing the bounds leave: one for
/// most heavy-tailed batches, a few dozen for lengths within a factor two of each other
/// (bench_plan: 10^6 such prompts in well under a second). When the budget is out of reach
/// under max_capacity, the fewest slots take a second scan of the same kind. The worst case is
/// not small: prompts of billions of tokens whose lengths span orders of magnitude can need
/// 10^5 packings and more (best-fit more often than first-fit: more of its decisions can flip);
/// max_packings bounds that: past it the
/// search gives up with prepack::error (default: no limit, exact whatever it costs). Callers
/// that take lengths from untrusted input bound the time with it.
/// Throws prepack::error for what first_fit_decreasing refuses, for max_pad negative or not a
/// number, for a prompt longer than max_capacity, and when the search would exceed
/// max_packings.
template <class Range, class = detail::if_length_range<Range>>
pack_plan<detail::range_value_t<Range>> fitted_plan(
    packer kind, const Range& lengths, fit_options opt = {},
    std::optional<std::size_t> max_packings = std::nullopt) {
  using Length = detail::range_value_t<Range>;
  const span<const Length> length = detail::as_span(lengths);
  const Length longest = detail::checked_capacity(length, std::optional<Length>{});
  detail::require(opt.max_pad >= 0, "max_pad ", opt.max_pad, " (must be a number >= 0)");
  unsigned long long total = 0;  // the useful tokens; saturates, which only caps the width
  for (Length l : length) {
    const auto v = static_cast<unsigned long long>(l);
    total = total > ~0ull - v ? ~0ull : total + v;
  }
  unsigned long long widest = std::min<unsigned long long>(
      total, static_cast<unsigned long long>(std::numeric_limits<Length>::max()));
  if (opt.max_capacity) {
    detail::require(*opt.max_capacity > 0, "max capacity ", *opt.max_capacity);
    for (std::size_t i = 0; i < length.size(); ++i) {
      detail::require(static_cast<unsigned long long>(length[i]) <= *opt.max_capacity, "prompt ", i,
                      ": length ", length[i], " exceeds max capacity ", *opt.max_capacity);
    }
    widest = std::min(widest, *opt.max_capacity);
  }
  const long double allowed =
      static_cast<long double>(total) * (1.0L + static_cast<long double>(opt.max_pad));
  const auto slots = [](const pack_plan<Length>& p) {
    return static_cast<long double>(p.n_rows()) * static_cast<long double>(p.capacity);
  };
  const std::vector<std::size_t> order = detail::decreasing_order(length);
  const detail::row_bounds<Length> bounds(length, total);
  std::size_t packings = 0;
  // Widths upward from the longest prompt: a width is packed only when `worth(bound)` says its
  // lower bound on slots (rows * width) could matter, and then each packing is handed to
  // `visit` (true: done) and the scan jumps past the widths with the same packing.
  const auto scan = [&](auto&& worth, auto&& visit) {
    for (auto w = static_cast<unsigned long long>(longest); w <= widest;) {
      const auto [rows, next] = bounds.at(w);
      // Every width in [w, next) needs `rows` rows or more, hence rows * w slots or more.
      if (!worth(static_cast<long double>(rows) * static_cast<long double>(w))) {
        if (next <= w || w == widest) return;
        w = next;
        continue;
      }
      if (max_packings && packings >= *max_packings) {
        detail::fail("fitted_plan: ", *max_packings,
                     " packings (max_packings) searched widths up to ", w, " without an answer");
      }
      ++packings;
      unsigned long long same_until = ~0ull;  // the packing is this one up to that width
      pack_plan<Length> p =
          detail::pack_sorted(kind, length, order, static_cast<Length>(w), &same_until);
      if (visit(std::move(p))) return;
      // Wider rows of the same packing have more slots: on to the next packing.
      if (same_until <= w || w == widest) return;
      w = same_until;
    }
  };
  // First the narrowest width that meets the budget.
  std::optional<pack_plan<Length>> found;
  scan([&](long double bound) { return bound <= allowed; },
       [&](pack_plan<Length>&& p) {
         if (slots(p) > allowed) return false;
         found = std::move(p);
         return true;
       });
  if (found) return std::move(*found);
  // None does (the widest row allowed is too narrow): the fewest slots, packing only the widths
  // whose bound could beat the fewest seen.
  scan([&](long double bound) { return !found || bound < slots(*found); },
       [&](pack_plan<Length>&& p) {
         if (!found || slots(p) < slots(*found)) found = std::move(p);
         return false;
       });
  PREPACK_ASSERT(found.has_value());
  return std::move(*found);
}
template <class Length>
pack_plan<Length> fitted_plan(packer kind, std::initializer_list<Length> length,
                              fit_options opt = {},
                              std::optional<std::size_t> max_packings = std::nullopt) {
  return fitted_plan(kind, span<const Length>(length.begin(), length.size()), opt, max_packings);
}

/// One batch of rows cut from a larger plan: a plan of its own over the prompts of those rows
/// (renumbered 0..), and the original id of each.
template <class Length>
struct plan_batch {
  pack_plan<Length> plan;            // rows [first_row, first_row + plan.n_rows()) of the source
  std::vector<std::size_t> prompts;  // [plan.n_prompts()]  original id of each prompt
  std::size_t first_row = 0;
};

/// Cuts a plan into consecutive batches of at most rows_per_batch rows: dataset-level
/// prepacking plans the whole dataset once, then prefills it batch by batch. O(n_prompts).
/// Throws prepack::error for rows_per_batch == 0.
template <class Length>
std::vector<plan_batch<Length>> split_rows(const pack_plan<Length>& p, std::size_t rows_per_batch) {
  detail::require(rows_per_batch > 0, "rows per batch ", rows_per_batch);
  std::vector<plan_batch<Length>> out;
  for (std::size_t r0 = 0; r0 < p.n_rows(); r0 += rows_per_batch) {
    const std::size_t r1 = std::min(p.n_rows(), r0 + rows_per_batch);
    plan_batch<Length> b;
    b.first_row = r0;
    b.plan.capacity = p.capacity;
    b.plan.fill.assign(p.fill.begin() + static_cast<std::ptrdiff_t>(r0),
                       p.fill.begin() + static_cast<std::ptrdiff_t>(r1));
    b.plan.row_begin.push_back(0);
    for (std::size_t r = r0; r < r1; ++r) {
      for (std::size_t k = p.row_begin[r]; k < p.row_begin[r + 1]; ++k) {
        const std::size_t i = p.row_prompts[k];
        b.plan.row_prompts.push_back(b.prompts.size());
        b.prompts.push_back(i);
        b.plan.length.push_back(p.length[i]);
        b.plan.row.push_back(r - r0);
        b.plan.offset.push_back(p.offset[i]);
      }
      b.plan.row_begin.push_back(b.prompts.size());
    }
    out.push_back(std::move(b));
  }
  return out;
}

/// Splits prompts 0..n-1 into batches of at most `batch_size` in arrival order: the batches a
/// server forms when it pads whatever arrives. Throws for n == 0 or batch_size == 0.
inline std::vector<std::vector<std::size_t>> arrival_batches(std::size_t n_prompts,
                                                             std::size_t batch_size) {
  detail::require(n_prompts > 0, "empty batch: no prompts to split");
  detail::require(batch_size > 0, "batch size ", batch_size);
  std::vector<std::vector<std::size_t>> out;
  for (std::size_t b = 0; b < n_prompts; b += batch_size) {
    std::vector<std::size_t> batch;
    for (std::size_t i = b; i < std::min(n_prompts, b + batch_size); ++i) batch.push_back(i);
    out.push_back(std::move(batch));
  }
  return out;
}

/// Splits prompts into batches of at most `batch_size` after a stable sort by decreasing
/// length: the length-sorted padding baseline, whose batches hold prompts of similar length.
/// Throws for an empty batch, a length <= 0 or batch_size == 0.
template <class Range, class = detail::if_length_range<Range>>
std::vector<std::vector<std::size_t>> length_sorted_batches(const Range& lengths,
                                                            std::size_t batch_size) {
  using Length = detail::range_value_t<Range>;
  const span<const Length> length = detail::as_span(lengths);
  detail::checked_capacity(length, std::optional<Length>{});
  detail::require(batch_size > 0, "batch size ", batch_size);
  const std::vector<std::size_t> order = detail::decreasing_order(length);
  std::vector<std::vector<std::size_t>> out;
  for (std::size_t b = 0; b < order.size(); b += batch_size) {
    out.emplace_back(
        order.begin() + static_cast<std::ptrdiff_t>(b),
        order.begin() + static_cast<std::ptrdiff_t>(std::min(order.size(), b + batch_size)));
  }
  return out;
}
template <class Length>
std::vector<std::vector<std::size_t>> length_sorted_batches(std::initializer_list<Length> length,
                                                            std::size_t batch_size) {
  return length_sorted_batches(span<const Length>(length.begin(), length.size()), batch_size);
}

/// The lengths of the prompts `ids` picks, in that order (to plan one batch of a dataset).
/// Throws for an id out of range.
template <class Range, class = detail::if_length_range<Range>>
std::vector<detail::range_value_t<Range>> select(const Range& lengths,
                                                 span<const std::size_t> ids) {
  const auto length = detail::as_span(lengths);
  for (std::size_t k = 0; k < ids.size(); ++k) {
    detail::require(ids[k] < length.size(), "id ", k, ": prompt ", ids[k], " out of range (",
                    length.size(), " prompts)");
  }
  std::vector<detail::range_value_t<Range>> out(ids.size());
  for (std::size_t k = 0; k < ids.size(); ++k) out[k] = length[ids[k]];
  return out;
}

PREPACK_NAMESPACE_END
