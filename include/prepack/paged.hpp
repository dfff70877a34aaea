// prepack/paged.hpp - the bookkeeping of a paged KV pool, as vLLM's block manager keeps it:
// a free list of fixed-size blocks with reference counts (a block shared read-only by several
// sequences, a common prefix, is freed when its last reader releases it), and per-sequence
// block tables laid out as the padded [n_seqs][max_blocks] array kernels take.
// Standard library only; the pool's memory is the engine's (or prepack::reference::kv_pool).
// Cost: O(1) per block allocated, shared or released; O(n_seqs * max_blocks) to lay out tables.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "detail/checked.hpp"
#include "error.hpp"
#include "span.hpp"

PREPACK_NAMESPACE_BEGIN

/// Blocks 0 .. n_blocks - 1 of a pool, handed out lowest first, reference counted.
class block_allocator {
 public:
  explicit block_allocator(std::size_t n_blocks) : refs_(n_blocks, 0) {
    detail::require(n_blocks > 0, "block allocator: the pool has no blocks");
    detail::require(n_blocks <= static_cast<std::size_t>(INT32_MAX), "block allocator: ", n_blocks,
                    " blocks do not fit int32 block ids");
    free_.reserve(n_blocks);
    for (std::size_t b = n_blocks; b-- > 0;) free_.push_back(static_cast<std::int32_t>(b));
  }

  std::size_t n_blocks() const noexcept { return refs_.size(); }
  std::size_t n_free() const noexcept { return free_.size(); }
  std::size_t n_used() const noexcept { return refs_.size() - free_.size(); }
  /// Sequences holding block b (0: free).
  std::size_t refs(std::int32_t b) const { return refs_.at(checked(b)); }

  /// n fresh blocks, each with one reference. Throws prepack::error, allocating nothing, when
  /// fewer than n are free.
  std::vector<std::int32_t> allocate(std::size_t n) {
    detail::require(n <= free_.size(), "block allocator: ", n, " blocks wanted, ", free_.size(),
                    " of ", refs_.size(), " free");
    std::vector<std::int32_t> out(free_.end() - static_cast<std::ptrdiff_t>(n), free_.end());
    std::reverse(out.begin(), out.end());
    free_.resize(free_.size() - n);
    for (std::int32_t b : out) refs_[static_cast<std::size_t>(b)] = 1;
    return out;
  }
  /// One more reader of an allocated block (a sequence that shares a prefix block).
  void share(std::int32_t b) {
    const std::size_t i = checked(b);
    detail::require(refs_[i] > 0, "block allocator: block ", b, " is free, it cannot be shared");
    ++refs_[i];
  }
  /// Drops one reference; the block is free again when none is left.
  void release(std::int32_t b) {
    const std::size_t i = checked(b);
    detail::require(refs_[i] > 0, "block allocator: block ", b, " is already free");
    if (--refs_[i] == 0) free_.push_back(b);
  }

 private:
  std::size_t checked(std::int32_t b) const {
    detail::require(b >= 0 && static_cast<std::size_t>(b) < refs_.size(), "block allocator: block ",
                    b, " outside 0..", refs_.size() - 1);
    return static_cast<std::size_t>(b);
  }
  std::vector<std::size_t> refs_;   // [n_blocks]  readers of each block
  std::vector<std::int32_t> free_;  // free blocks, the lowest on top
};

/// Block tables of several sequences: row s lists the blocks holding positions
/// [k * block_size, (k + 1) * block_size) of sequence s, padded with -1 to the longest row, as
/// vLLM's block_tables tensor and FlashAttention's page_table are.
struct block_tables {
  std::size_t block_size = 0;
  std::size_t max_blocks = 0;       // entries per row
  std::vector<std::int32_t> table;  // [n_seqs][max_blocks]  -1 past a sequence's blocks

  std::size_t n_seqs() const noexcept { return max_blocks == 0 ? 0 : table.size() / max_blocks; }
  span<const std::int32_t> row(std::size_t s) const noexcept {
    return {table.data() + s * max_blocks, max_blocks};
  }
  /// The table as (sequence, entry), for prepack's unpackers and step inputs.
  tensor_view<const std::int32_t, 2> view() const noexcept {
    return contiguous_view<const std::int32_t, 2>(table.data(), {n_seqs(), max_blocks});
  }
};

/// Lays out ragged per-sequence block lists as a padded table. Throws prepack::error for a
/// block size of 0 or a negative block id.
inline block_tables make_block_tables(const std::vector<std::vector<std::int32_t>>& blocks,
                                      std::size_t block_size) {
  detail::require(block_size > 0, "block tables: block size 0");
  block_tables t;
  t.block_size = block_size;
  for (const auto& b : blocks) t.max_blocks = std::max(t.max_blocks, b.size());
  t.max_blocks = std::max<std::size_t>(t.max_blocks, 1);
  t.table.assign(detail::mul(blocks.size(), t.max_blocks, "block tables"), -1);
  for (std::size_t s = 0; s < blocks.size(); ++s) {
    for (std::size_t k = 0; k < blocks[s].size(); ++k) {
      detail::require(blocks[s][k] >= 0, "sequence ", s, ": block ", k, " is ", blocks[s][k]);
      t.table[s * t.max_blocks + k] = blocks[s][k];
    }
  }
  return t;
}

/// Blocks for `positions` positions at `block_size` per block.
inline std::size_t blocks_for(std::size_t positions, std::size_t block_size) {
  return (positions + block_size - 1) / block_size;
}

PREPACK_NAMESPACE_END
