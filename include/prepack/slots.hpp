// prepack/slots.hpp - where each token's K and V go in a paged KV pool: the slot mapping
// (vLLM's slot_mapping: one pool slot, block * block_size + offset, per token, -1 for pads),
// built from a packed layout and a block table or adopted from an engine's own, checked once
// (blocks in range, no pool slot written twice). write_slots (unpack.hpp) writes a layer's K or
// V through it; step inputs (step.hpp) carry one for each step. The block arithmetic it rests on
// (blocks_for, slot_of, block tables and their checks) is paged.hpp's. Standard library only.
//
// Cost: make_slot_mapping O(slots + b log b) for the b blocks the prompts touch;
// slot_mapping::from_slots O(t log t) for t tokens.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "detail/checked.hpp"
#include "detail/views.hpp"
#include "error.hpp"
#include "layout.hpp"
#include "paged.hpp"
#include "span.hpp"

PREPACK_NAMESPACE_BEGIN
namespace detail {

// Checks a block table for a layout over a pool of n_blocks blocks of block_size: enough
// entries in the pool for every prompt's positions, no block listed twice by a prompt, written by
// two, or written by one while another reads it as context. O(prompts + b log b) for the b blocks
// the prompts touch.
template <class B, class Token, class Index>
void check_block_table(const packed_layout<Token, Index>& l, const tensor_view<B, 2>& block_table,
                       std::size_t n_blocks, std::size_t block_size) {
  static_assert(std::is_integral_v<B>, "block ids must be integers");
  require(block_size > 0, "paged pool: block size 0");
  require(n_blocks > 0, "paged pool: the pool has no blocks");
  check_view(block_table, "block table", false);
  require(block_table.extent[0] >= l.n_prompts(), "block table: ", block_table.extent[0],
          " rows for ", l.n_prompts(), " prompts");
  std::vector<block_use> uses;
  const auto name = [](std::size_t i) { return "prompt " + std::to_string(i); };
  for (std::size_t i = 0; i < l.n_prompts(); ++i) {
    const auto ctx = static_cast<std::size_t>(l.prompt_context()[i]);
    const auto len = static_cast<std::size_t>(l.prompt_length()[i]);
    const auto entry = [&](std::size_t k) { return block_table(i, k); };
    check_row(entry, block_table.extent[1], ctx + len, block_size, n_blocks,
              [&] { return name(i); });
    add_block_uses(uses, entry, ctx, len, block_size, i);
  }
  check_block_uses(uses, name);
}

template <class B, class Token, class Index>
std::size_t pool_slot(const packed_layout<Token, Index>& l, const tensor_view<B, 2>& block_table,
                      std::size_t block_size, std::size_t i, std::size_t t) {
  const std::size_t pos = static_cast<std::size_t>(l.prompt_context()[i]) + t;
  return static_cast<std::size_t>(
      slot_of(static_cast<std::int64_t>(block_table(i, pos / block_size)), pos, block_size));
}

}  // namespace detail

/// Where every slot of a layout goes in a paged KV pool: one pool slot (block * block_size +
/// offset in block) per layout slot, -1 for pad slots, as vLLM's slot_mapping. Built once from a
/// block table and checked once (blocks in range, no pool slot written twice); write_slots then
/// uses it for every layer and for K and V with O(1) checks per call.
class slot_mapping {
 public:
  /// An empty mapping (no tokens), as a moved-from one is.
  slot_mapping() = default;
  std::size_t block_size() const noexcept { return block_size_; }
  std::size_t n_blocks() const noexcept { return n_blocks_; }
  /// [n_tokens]  pool slot of each token (layout slot), -1 where nothing is written.
  span<const std::int64_t> slots() const noexcept { return slots_; }

  /// Checks and adopts a mapping computed elsewhere (an engine's own, or a step's): every
  /// entry -1 or inside n_blocks * block_size, no pool slot named twice. Throws prepack::error
  /// naming the first bad entry.
  static slot_mapping from_slots(std::vector<std::int64_t> slots, std::size_t n_blocks,
                                 std::size_t block_size) {
    detail::require(block_size > 0, "slot mapping: block size 0");
    detail::require(n_blocks > 0, "slot mapping: the pool has no blocks");
    const std::size_t pool = detail::mul(n_blocks, block_size, "pool slots");
    std::vector<std::pair<std::int64_t, std::size_t>> order;  // (pool slot, token)
    order.reserve(slots.size());
    for (std::size_t t = 0; t < slots.size(); ++t) {
      const std::int64_t s = slots[t];
      detail::require(s >= -1 && (s < 0 || static_cast<std::uint64_t>(s) < pool), "token ", t,
                      ": slot ", s, " outside the pool's ", pool, " slots");
      if (s >= 0) order.emplace_back(s, t);
    }
    std::sort(order.begin(), order.end());
    for (std::size_t k = 1; k < order.size(); ++k) {
      detail::require(order[k].first != order[k - 1].first, "token ", order[k].second, ": slot ",
                      order[k].first, " is also written by token ", order[k - 1].second);
    }
    return slot_mapping(std::move(slots), n_blocks, block_size);
  }

 private:
  template <class B, class Token, class Index>
  friend slot_mapping make_slot_mapping(const packed_layout<Token, Index>&, tensor_view<B, 2>,
                                        std::size_t, std::size_t);
  slot_mapping(std::vector<std::int64_t> slots, std::size_t n_blocks, std::size_t block_size)
      : slots_(std::move(slots)), n_blocks_(n_blocks), block_size_(block_size) {}
  std::vector<std::int64_t> slots_;
  std::size_t n_blocks_ = 0, block_size_ = 0;
};

/// The slot mapping of a layout over a paged pool of n_blocks blocks of block_size slots:
/// token t of prompt i (position prompt_context[i] + t) goes to block
/// block_table(i, position / block_size) at offset position % block_size; pad slots map to -1.
/// Entries of the table past those a prompt needs are ignored. Throws prepack::error, naming
/// the prompt and entry, if the table has too few rows or entries, an entry is outside the
/// pool, or a block is written by two prompts.
template <class B, class Token, class Index>
slot_mapping make_slot_mapping(const packed_layout<Token, Index>& l, tensor_view<B, 2> block_table,
                               std::size_t n_blocks, std::size_t block_size) {
  detail::check_block_table(l, block_table, n_blocks, block_size);
  std::vector<std::int64_t> slots(l.n_slots(), -1);
  for (std::size_t i = 0; i < l.n_prompts(); ++i) {
    const std::size_t first = l.first_slot(i);
    for (std::size_t t = 0; t < static_cast<std::size_t>(l.prompt_length()[i]); ++t) {
      slots[first + t] =
          static_cast<std::int64_t>(detail::pool_slot(l, block_table, block_size, i, t));
    }
  }
  return slot_mapping(std::move(slots), n_blocks, block_size);
}

PREPACK_NAMESPACE_END
