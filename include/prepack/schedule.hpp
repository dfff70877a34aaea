// prepack/schedule.hpp - budgeted steps: prompts into forward passes of at most `budget` tokens,
// as engines that never pad run them (vLLM, SGLang, TensorRT-LLM, llama.cpp). No pad compute,
// no cross-prompt attention; a prompt that does not fit the room left in a step is split into
// chunks, chunk k + 1 in a later step than chunk k (it attends to chunk k's cached KV).
//
// Prepacking's bin packing carries over as a scheduling problem: the fewest steps is
// ceil(total tokens / budget) (lower_bound()), reached exactly by filling every step; packing
// whole prompts first keeps prompts whole (no chunk re-reads its own context, and a short
// prompt finishes in one step) at the cost of steps that are not full. Two policies:
//
//  whole_first  first-fit-decreasing over steps: longest prompt first, each whole into the
//               earliest step with room for it; only prompts longer than the budget are chunked
//               (full chunks of `budget`, then the rest), each chunk into the earliest step with
//               room after the previous chunk. Fewest chunks; steps used at most
//               11/9 OPT + 6/9 + one per chunked prompt's tail, most often the lower bound or one
//               more.
//  fill         every step filled to the budget: prompts in the chosen order, each put into the
//               earliest step with room, split where that room ends and continued in the next.
//               Exactly the lower bound (without dependencies), at most one split per step; the
//               price is chunked prompts, whose later chunks re-read their cached context and
//               whose first token waits for their last chunk.
//
// Items may depend on others (a suffix on the shared prefix it continues, prepack/prefix.hpp):
// an item's first chunk goes in a later step than the last chunk of the item it follows.
// Cost: O((n + chunks) log steps) after an O(n log n) sort; deterministic (ties by index).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <optional>
#include <type_traits>
#include <vector>

#include "detail/checked.hpp"
#include "error.hpp"
#include "plan.hpp"
#include "span.hpp"

PREPACK_NAMESPACE_BEGIN

/// How a budgeted schedule splits prompts into steps.
enum class chunking {
  whole_first,  // prompts whole (first-fit-decreasing); chunk only what exceeds the budget
  fill,         // every step filled to the budget; split a prompt where a step's room ends
};

/// In which order `fill` takes the prompts (whole_first always takes the longest first).
enum class schedule_order {
  arrival,         // first come, first served (vLLM's scheduler)
  shortest_first,  // the least mean time to first token (in steps)
  longest_first,   // long prompts start first; short ones fill the rest
};

struct budget_options {
  std::size_t budget = 2048;  // tokens per step (an engine's max_num_batched_tokens)
  chunking policy = chunking::whole_first;
  schedule_order order = schedule_order::arrival;  // fill only
};

/// One thing to prefill: `length` tokens that continue `context` tokens already cached (a
/// suffix after its shared prefix; 0 for a whole prompt), to run after item `after`'s last
/// chunk when set.
struct schedule_item {
  std::size_t length = 0;
  std::size_t context = 0;
  std::optional<std::size_t> after;
};

/// A piece of an item prefilled in one step.
struct chunk {
  std::size_t item = 0;     // the item (prompt) it belongs to
  std::size_t start = 0;    // its first token within the item
  std::size_t length = 0;   // its tokens
  std::size_t context = 0;  // tokens of the sequence cached before it: item context + start,
                            // the position of its first token
  bool last = false;        // it completes the item: its last token yields the item's logits
};

/// Prompts split into steps of at most `budget` tokens. Chunks are listed step by step.
struct step_schedule {
  std::size_t budget = 0;
  std::vector<schedule_item> items;      // [n_items]      what was scheduled
  std::vector<chunk> chunks;             // [n_chunks]     step by step
  std::vector<std::size_t> step_begin;   // [n_steps + 1]  step s holds chunks[step_begin[s],
                                         //                step_begin[s + 1])
  std::vector<std::size_t> finish_step;  // [n_items]      step of each item's last chunk

  std::size_t n_items() const noexcept { return items.size(); }
  std::size_t n_steps() const noexcept { return step_begin.empty() ? 0 : step_begin.size() - 1; }
  span<const chunk> step(std::size_t s) const noexcept {
    return {chunks.data() + step_begin[s], step_begin[s + 1] - step_begin[s]};
  }
  std::size_t step_tokens(std::size_t s) const noexcept {
    std::size_t n = 0;
    for (const chunk& c : step(s)) n += c.length;
    return n;
  }
  std::size_t total_tokens() const noexcept {
    std::size_t n = 0;
    for (const schedule_item& it : items) n += it.length;
    return n;
  }
  /// The fewest steps any schedule can use: ceil(total tokens / budget).
  std::size_t lower_bound() const noexcept {
    return budget == 0 ? 0 : (total_tokens() + budget - 1) / budget;
  }
  /// Items split into more than one chunk.
  std::size_t n_chunked() const noexcept {
    std::size_t n = 0;
    for (const chunk& c : chunks) n += c.last && c.start > 0 ? 1 : 0;
    return n;
  }
};

namespace detail {

// A max-tree over the free room of steps, growing as steps open: "the earliest step at or after
// `from` with room >= k", in O(log n).
class step_tree {
 public:
  step_tree(std::size_t max_steps, std::size_t budget) {
    while (leaves_ < max_steps) leaves_ *= 2;
    tree_.assign(2 * leaves_, budget);
  }
  std::size_t find(std::size_t from, std::size_t k) const {
    const std::size_t s = find(1, 0, leaves_, from, k);
    PREPACK_ASSERT(s < leaves_);
    return s;
  }
  std::size_t room(std::size_t s) const { return tree_[leaves_ + s]; }
  void take(std::size_t s, std::size_t n) {
    std::size_t i = leaves_ + s;
    tree_[i] -= n;
    for (i /= 2; i >= 1; i /= 2) tree_[i] = std::max(tree_[2 * i], tree_[2 * i + 1]);
  }

 private:
  // The lowest leaf >= from in node's range [lo, hi) with room >= k, or leaves_ if none.
  std::size_t find(std::size_t node, std::size_t lo, std::size_t hi, std::size_t from,
                   std::size_t k) const {
    if (hi <= from || tree_[node] < k) return leaves_;
    if (hi - lo == 1) return lo;
    const std::size_t mid = lo + (hi - lo) / 2;
    const std::size_t left = find(2 * node, lo, mid, from, k);
    return left != leaves_ ? left : find(2 * node + 1, mid, hi, from, k);
  }
  std::size_t leaves_ = 1;
  std::vector<std::size_t> tree_;  // [2 * leaves_]  max room below each node
};

// Depth of each item in the `after` forest (0: runs after nothing); throws for a reference to
// no other item or a chain that loops.
inline std::vector<std::size_t> item_depths(span<const schedule_item> items) {
  const std::size_t n = items.size();
  constexpr std::size_t unknown = static_cast<std::size_t>(-1);
  std::vector<std::size_t> depth(n, unknown);
  std::vector<unsigned char> on_path(n, 0);
  std::vector<std::size_t> path;
  for (std::size_t i = 0; i < n; ++i) {
    const auto& after = items[i].after;
    require(!after || (*after < n && *after != i), "item ", i, ": after ", after ? *after : 0,
            " is not another item (", n, " items)");
  }
  for (std::size_t i = 0; i < n; ++i) {
    // Follow the chain up to an item whose depth is known or that follows nothing.
    for (std::size_t j = i; depth[j] == unknown;) {
      require(!on_path[j], "item ", j, ": its `after` chain loops back to it");
      on_path[j] = 1;
      path.push_back(j);
      if (!items[j].after) break;
      j = *items[j].after;
    }
    for (std::size_t k = path.size(); k-- > 0;) {
      const std::size_t j = path[k];
      depth[j] = items[j].after ? depth[*items[j].after] + 1 : 0;
      on_path[j] = 0;
    }
    path.clear();
  }
  return depth;
}

}  // namespace detail

/// Schedules items (prompts, or suffixes after shared prefixes) into steps of at most
/// opt.budget tokens with the policy opt.policy. Throws prepack::error for no items, a length
/// of 0, a budget of 0, or an `after` that names no other item or loops.
inline step_schedule budgeted_schedule(span<const schedule_item> items, const budget_options& opt) {
  using detail::require;
  require(!items.empty(), "empty batch: no prompts to schedule");
  require(opt.budget > 0, "budget 0");
  std::size_t total = 0, max_chunks = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    require(items[i].length > 0, "prompt ", i, ": length 0");
    total = detail::add(total, items[i].length, "tokens");
    max_chunks += (items[i].length + opt.budget - 1) / opt.budget + 1;
  }
  const std::vector<std::size_t> depth = detail::item_depths(items);
  const std::size_t levels = *std::max_element(depth.begin(), depth.end()) + 1;

  // Processing order: level by level (an item after its predecessor), then by the policy's key.
  std::vector<std::size_t> order(items.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  const bool longest =
      opt.policy == chunking::whole_first || opt.order == schedule_order::longest_first;
  const bool shortest = opt.policy == chunking::fill && opt.order == schedule_order::shortest_first;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (depth[a] != depth[b]) return depth[a] < depth[b];
    if (longest && items[a].length != items[b].length) return items[a].length > items[b].length;
    if (shortest && items[a].length != items[b].length) return items[a].length < items[b].length;
    return false;
  });

  step_schedule out;
  out.budget = opt.budget;
  out.items.assign(items.begin(), items.end());
  out.finish_step.assign(items.size(), 0);
  // At most one step per chunk, and a chunk per item per `budget` tokens plus its tail.
  detail::step_tree tree(max_chunks + levels, opt.budget);
  std::vector<std::pair<std::size_t, chunk>> placed;  // (step, chunk), in placement order
  std::size_t n_steps = 0;
  for (std::size_t i : order) {
    const schedule_item& it = items[i];
    std::size_t from = it.after ? out.finish_step[*it.after] + 1 : 0;
    std::size_t done = 0;
    while (done < it.length) {
      const std::size_t rest = it.length - done;
      std::size_t s, piece;
      if (opt.policy == chunking::fill) {
        s = tree.find(from, 1);
        piece = std::min(rest, tree.room(s));
      } else {
        piece = std::min(rest, opt.budget);
        s = tree.find(from, piece);
      }
      tree.take(s, piece);
      placed.push_back({s, chunk{i, done, piece, it.context + done, done + piece == it.length}});
      done += piece;
      from = s + 1;
      n_steps = std::max(n_steps, s + 1);
    }
    out.finish_step[i] = from - 1;
  }
  // Chunks step by step, in placement order within a step.
  std::stable_sort(placed.begin(), placed.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  out.step_begin.assign(n_steps + 1, 0);
  for (const auto& p : placed) ++out.step_begin[p.first + 1];
  std::partial_sum(out.step_begin.begin(), out.step_begin.end(), out.step_begin.begin());
  out.chunks.reserve(placed.size());
  for (const auto& p : placed) out.chunks.push_back(p.second);
  return out;
}

/// Checks a schedule's own invariants, as an engine handed one (or one edited by hand) should
/// before running it: step_begin delimits the chunks, every item is covered by its chunks in
/// order, each chunk in a later step than the item's previous one, at the context it says, and
/// an item that follows another starts after that one's last chunk; finish_step agrees.
/// Throws prepack::error naming the first violation ("prompt 3: chunk in step 1 runs before
/// item 0 it follows ends in step 2"). O(chunks + items).
inline void check_schedule(const step_schedule& s) {
  using detail::require;
  const std::size_t n = s.n_items();
  require(
      !s.step_begin.empty() && s.step_begin.front() == 0 && s.step_begin.back() == s.chunks.size(),
      "schedule: step_begin does not delimit ", s.chunks.size(), " chunks");
  require(s.finish_step.size() == n, "schedule: ", s.finish_step.size(), " finish steps for ", n,
          " items");
  detail::item_depths(span<const schedule_item>(s.items));  // `after` names other items, no loop
  std::vector<std::size_t> done(n, 0), last_step(n, 0), first_step(n, 0);
  std::vector<bool> started(n, false);
  for (std::size_t st = 0; st < s.n_steps(); ++st) {
    require(s.step_begin[st] <= s.step_begin[st + 1], "schedule: step ", st, " has negative size");
    for (const chunk& c : s.step(st)) {
      require(c.item < n, "schedule: step ", st, ": chunk of item ", c.item, " outside ", n);
      const schedule_item& it = s.items[c.item];
      require(c.start == done[c.item] && c.length > 0 && c.length <= it.length - done[c.item],
              "prompt ", c.item, ": chunk at token ", c.start, " of ", c.length, " tokens in step ",
              st, " is not its next ", it.length - done[c.item], " tokens from ", done[c.item]);
      require(!started[c.item] || st > last_step[c.item], "prompt ", c.item,
              ": two chunks in step ", st, " or out of order");
      require(c.context == it.context + c.start, "prompt ", c.item, ": chunk context ", c.context,
              " is not the prompt's context ", it.context, " + its start ", c.start);
      require(c.last == (c.start + c.length == it.length), "prompt ", c.item, ": chunk in step ",
              st, " is marked last wrongly");
      if (!started[c.item]) first_step[c.item] = st;
      started[c.item] = true;
      done[c.item] += c.length;
      last_step[c.item] = st;
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    require(done[i] == s.items[i].length, "prompt ", i, ": ", done[i], " of ", s.items[i].length,
            " tokens scheduled");
    require(s.finish_step[i] == last_step[i], "prompt ", i, ": finish step ", s.finish_step[i],
            ", its last chunk is in step ", last_step[i]);
  }
  for (std::size_t i = 0; i < n; ++i) {
    const auto& a = s.items[i].after;
    if (!a) continue;
    require(first_step[i] > last_step[*a], "prompt ", i, ": chunk in step ", first_step[i],
            " runs before item ", *a, " it follows ends in step ", last_step[*a]);
  }
}

/// Schedules whole prompts of the given lengths (any integer type): one item per prompt.
/// Throws as above, and for a negative length.
template <class Length>
step_schedule budgeted_schedule(span<const Length> length, const budget_options& opt) {
  static_assert(std::is_integral_v<Length>, "lengths must be integers");
  std::vector<schedule_item> items(length.size());
  for (std::size_t i = 0; i < length.size(); ++i) {
    detail::require(!detail::is_negative(length[i]), "prompt ", i, ": length ", length[i]);
    items[i].length = static_cast<std::size_t>(length[i]);
  }
  return budgeted_schedule(span<const schedule_item>(items), opt);
}

template <class Range, class = detail::if_length_range<Range>>
step_schedule budgeted_schedule(const Range& length, const budget_options& opt) {
  return budgeted_schedule(detail::as_span(length), opt);
}

inline step_schedule budgeted_schedule(const std::vector<schedule_item>& items,
                                       const budget_options& opt) {
  return budgeted_schedule(span<const schedule_item>(items), opt);
}

PREPACK_NAMESPACE_END
