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
// Block-aligned chunking (budget_options::block_size, both policies): every chunk but an item's
// last is a whole number of blocks, as TensorRT-LLM's chunked context requires, so a chunk never
// ends inside a block a later chunk writes. Its cost in steps: whole_first chunks a long item
// into pieces of budget rounded down to the block size; fill leaves less than block_size tokens
// of room in a step it splits an item at, so without dependencies it uses at most
// ceil(total / (budget - block_size + 1)) steps (every step but the last filled to within
// block_size - 1 tokens) instead of exactly ceil(total / budget).
//
// Items may depend on others (a suffix on the shared prefix it continues, prepack/prefix.hpp):
// an item's first chunk goes in a later step than the last chunk of the item it follows. An item
// is a prompt's own tokens (its `prompt` names it: step inputs give it the prompt's id and
// logits where it ends) or a shared prefix (no prompt: an id apart, and logits only when a
// prompt ends there too, `ends_prompt`). An empty batch is a schedule of zero steps.
// Cost: O((n + chunks) log steps) after an O(n log n) sort; deterministic (ties by index).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <numeric>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "detail/checked.hpp"
#include "detail/range.hpp"
#include "error.hpp"
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
  /// When > 0, every chunk but an item's last is a multiple of this many tokens (the pool's
  /// block size: TensorRT-LLM's rule for chunked context). 0: chunks of any length.
  std::size_t block_size = 0;
};

/// One thing to prefill: `length` tokens that continue `context` tokens already cached (a
/// suffix after its shared prefix; 0 for a whole prompt), to run after item `after`'s last
/// chunk when set.
struct schedule_item {
  std::size_t length = 0;
  std::size_t context = 0;
  std::optional<std::size_t> after = std::nullopt;
  /// The prompt whose own tokens the item holds (a whole prompt, or its rest after a shared
  /// prefix); none for a shared prefix, which is no prompt's own.
  std::optional<std::size_t> prompt = std::nullopt;
  /// A prompt ends where the item does: its last token's logits are wanted. Always true for a
  /// prompt's own item; for a prefix, true when some prompt is that prefix exactly.
  bool ends_prompt = true;
};

/// How messages name item i: "prompt 3" for a prompt's own item, "item 1" for any other (a
/// shared prefix): an item's index is not a prompt's.
inline std::string item_name(const schedule_item& it, std::size_t i) {
  return it.prompt ? "prompt " + std::to_string(*it.prompt) : "item " + std::to_string(i);
}

/// A piece of an item prefilled in one step.
struct chunk {
  std::size_t item = 0;     // the item it belongs to
  std::size_t start = 0;    // its first token within the item
  std::size_t length = 0;   // its tokens
  std::size_t context = 0;  // tokens of the sequence cached before it: item context + start,
                            // the position of its first token
  bool last = false;        // it completes the item (its last token yields the item's logits
                            // when the item ends a prompt)
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
  /// The chunks of step s (s < n_steps(); step_begin checked, as check_schedule does).
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
// `from` with room >= k" (k <= budget), in O(log steps); the tree doubles when every step it
// holds lacks the room (amortized O(1) per step).
class step_tree {
 public:
  step_tree(std::size_t steps, std::size_t budget) : budget_(budget) {
    while (leaves_ < steps) leaves_ *= 2;
    tree_.assign(2 * leaves_, budget);
  }
  std::size_t find(std::size_t from, std::size_t k) {
    PREPACK_ASSERT(k <= budget_);
    for (;;) {
      const std::size_t s = find(1, 0, leaves_, from, k);
      if (s < leaves_) return s;
      grow();
    }
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
  // Twice the steps: the old leaves, then fresh ones with the whole budget.
  void grow() {
    std::vector<std::size_t> next(4 * leaves_, budget_);
    std::copy(tree_.begin() + static_cast<std::ptrdiff_t>(leaves_), tree_.end(),
              next.begin() + static_cast<std::ptrdiff_t>(2 * leaves_));
    leaves_ *= 2;
    tree_ = std::move(next);
    for (std::size_t i = leaves_; i-- > 1;) tree_[i] = std::max(tree_[2 * i], tree_[2 * i + 1]);
  }
  std::size_t budget_ = 0;
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
/// opt.budget tokens with the policy opt.policy (block-aligned when opt.block_size > 0). No items
/// give a schedule of zero steps. Throws prepack::error for a length of 0, a budget of 0, a
/// block size above the budget, or an `after` that names no other item or loops.
inline step_schedule budgeted_schedule(span<const schedule_item> items, const budget_options& opt) {
  using detail::require;
  require(opt.budget > 0, "budget 0");
  const std::size_t bs = opt.block_size;
  require(bs <= opt.budget, "block size ", bs, " exceeds the budget ", opt.budget,
          " (a block-aligned chunk needs at least one block)");
  step_schedule out;
  out.budget = opt.budget;
  out.items.assign(items.begin(), items.end());
  out.finish_step.assign(items.size(), 0);
  out.step_begin.assign(1, 0);
  if (items.empty()) return out;
  // Whole-first chunks: the budget, rounded down to whole blocks when aligned.
  const std::size_t full_chunk = bs > 0 ? opt.budget / bs * bs : opt.budget;
  std::size_t total = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (items[i].length == 0) detail::fail(item_name(items[i], i), ": length 0");
    total = detail::add(total, items[i].length, "tokens");
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

  // Room for the lower bound of steps and a few more; the tree grows past them if it must.
  detail::step_tree tree(total / opt.budget + levels + 1, opt.budget);
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
        // The earliest step with room for the rest, or (aligned) for at least one block of it.
        s = tree.find(from, bs > 0 ? std::min(rest, bs) : 1);
        const std::size_t room = tree.room(s);
        piece = rest <= room ? rest : (bs > 0 ? room / bs * bs : room);
      } else {
        // Whole when the rest fits a step (an item's last chunk needs no alignment); else a
        // full chunk of the budget, rounded down to whole blocks when aligned.
        piece = rest <= opt.budget ? rest : full_chunk;
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
/// before running it: step_begin delimits the chunks (checked before any chunk is read), no
/// step holds more tokens than the budget, every item is covered by its chunks in order, each
/// chunk in a later step than the item's previous one, at the context it says, and an item that
/// follows another starts after that one's last chunk; finish_step agrees; with a block size,
/// every chunk but an item's last is a whole number of blocks. Throws prepack::error naming the
/// first violation ("prompt 3: chunk in step 1 runs before item 0 it follows ends in step 2").
/// O(chunks + items).
inline void check_schedule(const step_schedule& s, std::size_t block_size = 0) {
  using detail::require;
  const std::size_t n = s.n_items();
  require(s.budget > 0, "schedule: budget 0");
  require(
      !s.step_begin.empty() && s.step_begin.front() == 0 && s.step_begin.back() == s.chunks.size(),
      "schedule: step_begin does not delimit ", s.chunks.size(), " chunks");
  for (std::size_t st = 0; st + 1 < s.step_begin.size(); ++st) {
    if (s.step_begin[st] > s.step_begin[st + 1]) {
      detail::fail("schedule: step_begin[", st, "] = ", s.step_begin[st], " > step_begin[", st + 1,
                   "] = ", s.step_begin[st + 1], " (step ", st, " has negative size)");
    }
  }
  require(s.finish_step.size() == n, "schedule: ", s.finish_step.size(), " finish steps for ", n,
          " items");
  detail::item_depths(span<const schedule_item>(s.items));  // `after` names other items, no loop
  std::vector<std::size_t> done(n, 0), last_step(n, 0), first_step(n, 0);
  std::vector<bool> started(n, false);
  for (std::size_t st = 0; st < s.n_steps(); ++st) {
    std::size_t tokens = 0;
    for (const chunk& c : s.step(st)) {
      require(c.item < n, "schedule: step ", st, ": chunk of item ", c.item, " outside ", n);
      const schedule_item& it = s.items[c.item];
      const auto name = [&] { return item_name(it, c.item); };
      if (c.start != done[c.item] || c.length == 0 || c.length > it.length - done[c.item]) {
        detail::fail(name(), ": chunk at token ", c.start, " of ", c.length, " tokens in step ", st,
                     " is not its next ", it.length - done[c.item], " tokens from ", done[c.item]);
      }
      if (started[c.item] && st <= last_step[c.item]) {
        detail::fail(name(), ": two chunks in step ", st, " or out of order");
      }
      if (c.context != it.context + c.start) {
        detail::fail(name(), ": chunk context ", c.context, " is not the item's context ",
                     it.context, " + its start ", c.start);
      }
      if (c.last != (c.start + c.length == it.length)) {
        detail::fail(name(), ": chunk in step ", st, " is marked last wrongly");
      }
      if (block_size > 0 && !c.last && c.length % block_size != 0) {
        detail::fail(name(), ": chunk of ", c.length, " tokens in step ", st,
                     " is not a whole number of blocks of ", block_size, " (only the last may be)");
      }
      if (!started[c.item]) first_step[c.item] = st;
      started[c.item] = true;
      done[c.item] += c.length;
      last_step[c.item] = st;
      tokens += c.length;
    }
    if (tokens > s.budget) {
      detail::fail("schedule: step ", st, " holds ", tokens, " tokens, over the budget ", s.budget);
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (done[i] != s.items[i].length) {
      detail::fail(item_name(s.items[i], i), ": ", done[i], " of ", s.items[i].length,
                   " tokens scheduled");
    }
    if (s.finish_step[i] != last_step[i]) {
      detail::fail(item_name(s.items[i], i), ": finish step ", s.finish_step[i],
                   ", its last chunk is in step ", last_step[i]);
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    const auto& a = s.items[i].after;
    if (a && first_step[i] <= last_step[*a]) {
      detail::fail(item_name(s.items[i], i), ": chunk in step ", first_step[i], " runs before ",
                   item_name(s.items[*a], *a), " it follows ends in step ", last_step[*a]);
    }
  }
}

/// Schedules whole prompts of the given lengths (any contiguous range of an integer type, or a
/// braced list): item i is prompt i. Throws as above, and for a negative length.
template <class Range, class = detail::if_length_range<Range>>
step_schedule budgeted_schedule(const Range& lengths, const budget_options& opt) {
  const auto length = detail::as_span(lengths);
  std::vector<schedule_item> items(length.size());
  for (std::size_t i = 0; i < length.size(); ++i) {
    detail::require(!detail::is_negative(length[i]), "prompt ", i, ": length ", length[i]);
    items[i].length = static_cast<std::size_t>(length[i]);
    items[i].prompt = i;
  }
  return budgeted_schedule(span<const schedule_item>(items), opt);
}
template <class Length>
step_schedule budgeted_schedule(std::initializer_list<Length> lengths, const budget_options& opt) {
  return budgeted_schedule(span<const Length>(lengths.begin(), lengths.size()), opt);
}

PREPACK_NAMESPACE_END
