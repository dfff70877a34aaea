// prepack/prefix.hpp - shared prefixes: prefill each common prefix of a batch once, then pack
// the suffixes as chunks over it.
//
// Batches repeat themselves: few-shot prompts share their worked examples, chat requests a
// system prompt, retrieval a document. A prefix index (a radix tree over the batch's token ids,
// built in O(total tokens)) finds every shared prefix; a planner decides which to prefill once.
// The chosen prefixes become schedule items of their own, computed first; every sharer's rest
// becomes an item that continues the prefix's cached KV (its context), after the prefix item.
// In the paged pool the prefix's blocks are written once and read by every sharer: several
// block tables point at the same blocks (reference counted by block_allocator::share).
//
// Cost model, in tokens: sharing a prefix of d tokens among s prompts saves (s - 1) * d token
// computations through every linear layer (and their attention among themselves), and costs one
// more sequence in a step plus its bookkeeping, counted as `overhead_tokens`; a prefix is chosen
// when (s - 1) * d' - overhead_tokens > 0, with d' its tokens beyond the nearest chosen prefix it
// extends, and d at least `min_length`. Chosen greedily from the root down (a nested prefix
// shared by fewer prompts is considered after the prefix that contains it); deterministic.
//
// Block alignment: prefix splits are rounded down to a multiple of the block size, so a shared
// block is always full and never written again: each sharer's own tokens start in a block of its
// own, and decoding appends to it without touching another's cache. The alternative (copying a
// partially filled last block into every sharer, copy-on-write) costs a copy per sharer, layer,
// K and V, and a copy kernel in the engine; alignment costs recomputing fewer than block_size
// tokens per sharer. vLLM's automatic prefix caching shares only full blocks for the same
// reason.
// Cost: O(total tokens * log(branching)) for the index, O(nodes) for the choice.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "detail/checked.hpp"
#include "error.hpp"
#include "paged.hpp"
#include "schedule.hpp"
#include "span.hpp"

PREPACK_NAMESPACE_BEGIN

/// A radix tree over token sequences: every node is a point where the prompts through it
/// branch or one of them ends; depth() is the number of tokens from the root.
template <class T>
class prefix_index {
 public:
  struct node {
    std::size_t depth = 0;              // tokens from the root to the end of this node's edge
    std::size_t parent = 0;             // the root is its own parent
    std::vector<std::size_t> prompts;   // prompts whose tokens run through this node's end
    std::vector<std::size_t> ending;    // prompts that end exactly here
    std::map<T, std::size_t> children;  // by the first token of the child's edge
    std::size_t edge_prompt = 0;        // the edge's tokens: prompts[edge_prompt] at
    std::size_t edge_begin = 0;         //   [edge_begin, depth)
  };

  /// Builds the tree of `prompts` (their tokens are referred to, not copied: keep them alive).
  /// O(total tokens * log(branching)). Throws prepack::error for an empty prompt.
  explicit prefix_index(const std::vector<std::vector<T>>& prompts) : prompts_(&prompts) {
    nodes_.emplace_back();  // the root: depth 0
    for (std::size_t p = 0; p < prompts.size(); ++p) {
      detail::require(!prompts[p].empty(), "prompt ", p, ": length 0");
      insert(p);
    }
    // Every node's prompts list is in increasing order: prompts are inserted in order and a
    // split copies an ordered list.
  }

  const std::vector<node>& nodes() const noexcept { return nodes_; }
  /// The node where prompt p ends.
  std::size_t end_of(std::size_t p) const { return end_[p]; }
  /// Distinct tokens: the sum of the edges' lengths (what prefilling every shared prefix once,
  /// unaligned, would compute).
  std::size_t distinct_tokens() const noexcept {
    std::size_t n = 0;
    for (std::size_t v = 1; v < nodes_.size(); ++v)
      n += nodes_[v].depth - nodes_[nodes_[v].parent].depth;
    return n;
  }

 private:
  void insert(std::size_t p) {
    const std::vector<T>& s = (*prompts_)[p];
    std::size_t v = 0, i = 0;  // at node v, i tokens of s matched
    nodes_[0].prompts.push_back(p);
    while (i < s.size()) {
      const auto it = nodes_[v].children.find(s[i]);
      if (it == nodes_[v].children.end()) {  // a new leaf for the rest of s
        const std::size_t leaf = add_node(v, p, i, s.size());
        nodes_[leaf].prompts.push_back(p);
        v = leaf;
        i = s.size();
        break;
      }
      const std::size_t c = it->second;
      const std::vector<T>& e = (*prompts_)[nodes_[c].edge_prompt];
      std::size_t k = nodes_[c].edge_begin;  // walk c's edge
      while (k < nodes_[c].depth && i < s.size() && e[k] == s[i]) {
        ++k;
        ++i;
      }
      if (k < nodes_[c].depth) {  // split c's edge at k
        const std::size_t mid = split(c, k);
        nodes_[mid].prompts.push_back(p);
        v = mid;
        continue;
      }
      nodes_[c].prompts.push_back(p);
      v = c;
    }
    nodes_[v].ending.push_back(p);
    if (end_.size() <= p) end_.resize(p + 1);
    end_[p] = v;
  }

  std::size_t add_node(std::size_t parent, std::size_t p, std::size_t begin, std::size_t depth) {
    node n;
    n.depth = depth;
    n.parent = parent;
    n.edge_prompt = p;
    n.edge_begin = begin;
    nodes_.push_back(std::move(n));
    const std::size_t id = nodes_.size() - 1;
    nodes_[parent].children[(*prompts_)[p][begin]] = id;
    return id;
  }

  // Splits node c's edge so that a new node ends at depth k (between c's parent and c).
  std::size_t split(std::size_t c, std::size_t k) {
    const std::size_t parent = nodes_[c].parent;
    node mid;
    mid.depth = k;
    mid.parent = parent;
    mid.edge_prompt = nodes_[c].edge_prompt;
    mid.edge_begin = nodes_[c].edge_begin;
    mid.prompts = nodes_[c].prompts;  // every prompt through c runs through mid
    nodes_.push_back(std::move(mid));
    const std::size_t m = nodes_.size() - 1;
    const std::vector<T>& e = (*prompts_)[nodes_[c].edge_prompt];
    nodes_[parent].children[e[nodes_[m].edge_begin]] = m;
    nodes_[c].parent = m;
    nodes_[c].edge_begin = k;
    nodes_[m].children[e[k]] = c;
    return m;
  }

  const std::vector<std::vector<T>>* prompts_;
  std::vector<node> nodes_;
  std::vector<std::size_t> end_;  // [n_prompts]  node where each prompt ends
};

/// How the planner chooses prefixes.
struct prefix_options {
  std::size_t block_size = 16;       // the pool's block size: splits are multiples of it
  std::size_t min_length = 16;       // a shared prefix shorter than this is not split off
  std::size_t overhead_tokens = 16;  // the cost of one more prefix item, in token computations
};

/// Which prefixes to prefill once and how every prompt is split over them: the schedule items
/// (prefixes first, each after the prefix it extends; then every prompt's own rest after its
/// deepest prefix) and each item's tokens and positions.
struct prefix_plan {
  /// A prefix computed once: positions [start, start + length) of every sharer.
  struct prefix {
    std::size_t start = 0;              // tokens before it: its parent prefix's end
    std::size_t length = 0;             // tokens it computes (a multiple of block_size)
    std::optional<std::size_t> parent;  // the prefix it extends
    std::vector<std::size_t> sharers;   // prompts that start with it (>= 2)
  };
  std::size_t block_size = 0;
  std::vector<prefix> prefixes;                           // [n_prefixes]  parents before children
  std::vector<std::optional<std::size_t>> prompt_prefix;  // [n_prompts]  deepest prefix of each
  std::vector<std::size_t> prompt_length;                 // [n_prompts]
  // The schedule items: prefix k is item k; prompt i's own rest is item n_prefixes +
  // suffix_index[i], or none when the prompt ends where its deepest prefix does.
  std::vector<schedule_item> items;      // [n_items]
  std::vector<std::size_t> item_prompt;  // [n_items]  a prompt whose tokens the item holds
  std::vector<std::size_t> item_begin;   // [n_items]  first token of the item in that prompt
  std::vector<std::optional<std::size_t>> prompt_item;  // [n_prompts]  the prompt's own item
  std::vector<std::size_t> prompt_last_item;     // [n_prompts]  the item whose last token ends it
  std::vector<std::vector<std::size_t>> ending;  // [n_items]  prompts that end where item k
                                                 //   ends: its logits row is each of theirs
                                                 //   (several when prompts are identical)

  std::size_t n_prompts() const noexcept { return prompt_length.size(); }
  std::size_t n_prefixes() const noexcept { return prefixes.size(); }
  /// Tokens prefill computes with this plan (each prefix once).
  std::size_t tokens_computed() const noexcept {
    std::size_t n = 0;
    for (const schedule_item& it : items) n += it.length;
    return n;
  }
  /// Tokens of the prompts (what prefilling each whole computes).
  std::size_t useful_tokens() const noexcept {
    std::size_t n = 0;
    for (std::size_t l : prompt_length) n += l;
    return n;
  }
  /// Each item's caller id, for make_step_inputs (step_options::seq_ids): a prompt's own item
  /// gets prompt_ids[its prompt], prefix k gets prefix_ids[k] (default: -1 - k, apart from any
  /// non-negative prompt id). Throws prepack::error for counts that differ from the plan's.
  std::vector<std::int64_t> item_ids(span<const std::int64_t> prompt_ids,
                                     span<const std::int64_t> prefix_ids = {}) const {
    detail::require(prompt_ids.size() == n_prompts(), "prompt ids: ", prompt_ids.size(), " for ",
                    n_prompts(), " prompts");
    detail::require(prefix_ids.empty() || prefix_ids.size() == n_prefixes(),
                    "prefix ids: ", prefix_ids.size(), " for ", n_prefixes(), " prefixes");
    std::vector<std::int64_t> out(items.size());
    for (std::size_t k = 0; k < items.size(); ++k) {
      if (items[k].prompt) {
        out[k] = prompt_ids[*items[k].prompt];
      } else {
        out[k] = prefix_ids.empty() ? -1 - static_cast<std::int64_t>(k) : prefix_ids[k];
      }
    }
    return out;
  }
  /// Each item's tokens, copied out of the prompts (for make_step_inputs).
  template <class T>
  std::vector<std::vector<T>> item_tokens(const std::vector<std::vector<T>>& prompts) const {
    std::vector<std::vector<T>> out;
    for (std::size_t k = 0; k < items.size(); ++k) {
      const auto& p = prompts[item_prompt[k]];
      const auto b = p.begin() + static_cast<std::ptrdiff_t>(item_begin[k]);
      out.emplace_back(b, b + static_cast<std::ptrdiff_t>(items[k].length));
    }
    return out;
  }
};

/// Finds the batch's shared prefixes and plans them (see the file comment for the cost model
/// and the block alignment). A batch with nothing worth sharing gets one item per prompt and
/// no prefix; no prompts give an empty plan. Throws prepack::error for an empty prompt or a
/// block size of 0.
template <class T>
prefix_plan make_prefix_plan(const std::vector<std::vector<T>>& prompts,
                             const prefix_options& opt = {}) {
  detail::require(opt.block_size > 0, "prefix plan: block size 0");
  const prefix_index<T> index(prompts);
  const auto& nodes = index.nodes();
  const std::size_t bs = opt.block_size;
  prefix_plan plan;
  plan.block_size = bs;
  plan.prompt_prefix.assign(prompts.size(), std::nullopt);
  for (const auto& p : prompts) plan.prompt_length.push_back(p.size());
  // Top-down over the tree: a node shared by >= 2 prompts becomes a prefix (its depth aligned
  // down to blocks) when it saves more than it costs beyond the nearest chosen ancestor.
  struct frame {
    std::size_t node;
    std::optional<std::size_t> chosen;  // the nearest chosen prefix above
  };
  std::vector<frame> stack{{0, std::nullopt}};
  while (!stack.empty()) {
    const frame f = stack.back();
    stack.pop_back();
    const auto& v = nodes[f.node];
    std::optional<std::size_t> here = f.chosen;
    const std::size_t above =
        f.chosen ? plan.prefixes[*f.chosen].start + plan.prefixes[*f.chosen].length : 0;
    const std::size_t aligned = v.depth / bs * bs;
    const std::size_t s = v.prompts.size();
    if (f.node != 0 && s >= 2 && aligned > above && aligned >= opt.min_length &&
        (s - 1) * (aligned - above) > opt.overhead_tokens) {
      prefix_plan::prefix p;
      p.start = above;
      p.length = aligned - above;
      p.parent = f.chosen;
      p.sharers = v.prompts;
      plan.prefixes.push_back(std::move(p));
      here = plan.prefixes.size() - 1;
      for (std::size_t prompt : v.prompts) plan.prompt_prefix[prompt] = here;
    }
    // Children in reverse token order on the stack: visited in token order.
    for (auto it = v.children.rbegin(); it != v.children.rend(); ++it)
      stack.push_back({it->second, here});
  }
  // Items: the prefixes, then every prompt's own rest.
  for (std::size_t k = 0; k < plan.prefixes.size(); ++k) {
    const auto& p = plan.prefixes[k];
    schedule_item it;
    it.length = p.length;
    it.context = p.start;
    it.after = p.parent;
    it.prompt = std::nullopt;  // a prefix is no prompt's own; ends_prompt is set below
    it.ends_prompt = false;
    plan.items.push_back(it);
    plan.item_prompt.push_back(p.sharers.front());
    plan.item_begin.push_back(p.start);
  }
  plan.prompt_item.assign(prompts.size(), std::nullopt);
  plan.prompt_last_item.assign(prompts.size(), 0);
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const std::optional<std::size_t> pre = plan.prompt_prefix[i];
    const std::size_t done = pre ? plan.prefixes[*pre].start + plan.prefixes[*pre].length : 0;
    if (done == prompts[i].size()) {  // the prompt is its deepest prefix
      plan.prompt_last_item[i] = *pre;
      plan.items[*pre].ends_prompt = true;
      continue;
    }
    schedule_item own;
    own.length = prompts[i].size() - done;
    own.context = done;
    own.after = pre;
    own.prompt = i;
    plan.items.push_back(own);
    plan.item_prompt.push_back(i);
    plan.item_begin.push_back(done);
    plan.prompt_item[i] = plan.items.size() - 1;
    plan.prompt_last_item[i] = plan.items.size() - 1;
  }
  plan.ending.assign(plan.items.size(), {});
  for (std::size_t i = 0; i < prompts.size(); ++i)
    plan.ending[plan.prompt_last_item[i]].push_back(i);
  return plan;
}

/// Blocks for a prefix plan: every prefix gets fresh blocks for its own positions, shared by
/// every prompt that starts with it; every prompt gets fresh blocks for the rest of its
/// positions and `extra` more (room to decode). Returns one table per item (the blocks of
/// positions [0, context + length)) and one per prompt (its whole cache, shared blocks first).
struct prefix_tables {
  block_tables items;    // [n_items][...]    views for the prefill's steps: they hold nothing
  block_tables prompts;  // [n_prompts][...]  each row holds one reference to each of its blocks
};

/// Allocates through `alloc`: each block is held once by every prompt table that lists it (a
/// prefix's blocks by each of its sharers, a prompt's own blocks by that prompt alone), so
/// release_blocks(alloc, tables.prompts) returns every block to the allocator; the item tables
/// hold no reference. Throws prepack::error, allocating nothing, when the pool is too small
/// (naming the blocks needed and free).
inline prefix_tables allocate_prefix_tables(const prefix_plan& plan, block_allocator& alloc,
                                            std::size_t extra = 0) {
  const std::size_t bs = plan.block_size;
  const auto done_of = [&](std::size_t i) {
    const auto pre = plan.prompt_prefix[i];
    return pre ? plan.prefixes[*pre].start + plan.prefixes[*pre].length : std::size_t{0};
  };
  std::size_t need = 0;
  for (const auto& p : plan.prefixes) need += p.length / bs;
  for (std::size_t i = 0; i < plan.n_prompts(); ++i) {
    need += blocks_for(plan.prompt_length[i] + extra - done_of(i), bs);
  }
  detail::require(need <= alloc.n_free(), "prefix plan: ", need, " blocks needed for ",
                  plan.n_prompts(), " prompts and ", plan.n_prefixes(), " prefixes, ",
                  alloc.n_free(), " free");
  // Each prefix's own blocks, allocated with one reference: the first sharer's.
  std::vector<std::vector<std::int32_t>> own(plan.n_prefixes());
  for (std::size_t k = 0; k < plan.n_prefixes(); ++k)
    own[k] = alloc.allocate(plan.prefixes[k].length / bs);
  std::vector<bool> taken(plan.n_prefixes(), false);
  std::vector<std::vector<std::int32_t>> prompt_blocks(plan.n_prompts());
  for (std::size_t i = 0; i < plan.n_prompts(); ++i) {
    std::vector<std::size_t> chain;  // the prompt's prefixes, outermost first
    for (auto p = plan.prompt_prefix[i]; p; p = plan.prefixes[*p].parent) chain.push_back(*p);
    std::reverse(chain.begin(), chain.end());
    for (std::size_t k : chain) {
      if (taken[k]) {
        for (std::int32_t b : own[k]) alloc.share(b);
      }
      taken[k] = true;
      prompt_blocks[i].insert(prompt_blocks[i].end(), own[k].begin(), own[k].end());
    }
    const auto rest = alloc.allocate(blocks_for(plan.prompt_length[i] + extra - done_of(i), bs));
    prompt_blocks[i].insert(prompt_blocks[i].end(), rest.begin(), rest.end());
  }
  // Item tables: a prefix's chain of blocks; a prompt's own item, the prompt's table.
  std::vector<std::vector<std::int32_t>> item_blocks;
  for (std::size_t k = 0; k < plan.n_prefixes(); ++k) {
    std::vector<std::int32_t> chain;
    for (std::optional<std::size_t> p = k; p; p = plan.prefixes[*p].parent) {
      chain.insert(chain.begin(), own[*p].begin(), own[*p].end());
    }
    item_blocks.push_back(std::move(chain));
  }
  for (std::size_t i = 0; i < plan.n_prompts(); ++i) {
    if (plan.prompt_item[i]) item_blocks.push_back(prompt_blocks[i]);
  }
  return {make_block_tables(item_blocks, bs), make_block_tables(prompt_blocks, bs)};
}

/// Checks that block tables run a prefix plan safely: every block an item writes (its
/// positions [context, context + length)) is written by that item alone, and every other
/// table that lists the block lists it at the same entry for positions it only reads, after the
/// writer: a shared block is a prefix block. Throws prepack::error naming the block and items.
inline void check_prefix_tables(const prefix_plan& plan, const block_tables& items) {
  const std::size_t bs = plan.block_size;
  detail::require(items.block_size == bs, "prefix tables: block size ", items.block_size,
                  ", the plan's is ", bs);
  detail::require(items.n_seqs() >= plan.items.size(), "prefix tables: ", items.n_seqs(),
                  " rows for ", plan.items.size(), " items");
  struct use {
    std::size_t item, entry;
    bool writes;
  };
  std::map<std::int32_t, std::vector<use>> uses;
  for (std::size_t k = 0; k < plan.items.size(); ++k) {
    const schedule_item& it = plan.items[k];
    const std::size_t n = blocks_for(it.context + it.length, bs);
    if (n > items.max_blocks) {
      detail::fail(item_name(it, k), ": positions up to ", it.context + it.length, " need ", n,
                   " blocks of ", bs, ", its table has ", items.max_blocks, " entries");
    }
    for (std::size_t e = 0; e < n; ++e) {
      const std::int32_t b = items.row(k)[e];
      if (b < 0) detail::fail(item_name(it, k), ": no block for entry ", e);
      uses[b].push_back({k, e, e >= it.context / bs});
    }
  }
  // The item chain of each item: the items it runs after.
  const auto runs_after = [&](std::size_t reader, std::size_t writer) {
    for (auto a = plan.items[reader].after; a; a = plan.items[*a].after) {
      if (*a == writer) return true;
    }
    return false;
  };
  for (const auto& [b, list] : uses) {
    std::optional<use> writer;
    for (const use& u : list) {
      if (!u.writes) continue;
      if (writer) {
        detail::fail("block ", b, " is written by ",
                     item_name(plan.items[writer->item], writer->item), " and ",
                     item_name(plan.items[u.item], u.item),
                     ": a shared block must be a prefix block");
      }
      writer = u;
    }
    for (const use& u : list) {
      if (u.writes) continue;
      if (!writer || u.entry != writer->entry || !runs_after(u.item, writer->item)) {
        detail::fail(item_name(plan.items[u.item], u.item), ": block ", b, " (entry ", u.entry,
                     ") is not a prefix block it runs after");
      }
    }
  }
}

PREPACK_NAMESPACE_END
