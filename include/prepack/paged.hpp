// prepack/paged.hpp - the bookkeeping of a paged KV pool, as vLLM's block manager keeps it, and
// its page arithmetic, defined once for every part of prepack that touches a pool:
//
//  block_allocator  blocks handed out lowest first, reference counted (a block shared read-only
//                   by several sequences, a common prefix, is free again when its last holder
//                   releases it), block 0 kept back as an engine's null block when asked: the
//                   one allocator, which the serving pool (serve.hpp block_pool) builds on
//  block_tables     per-sequence block lists laid out as the padded [n_seqs][max_blocks] array
//                   kernels take
//  block_row        one sequence's page arithmetic: position p lives at pool slot
//                   blocks[p / block_size] * block_size + p % block_size
//  blocks_for       blocks that hold n positions
// and, for the validators of step inputs, unpackers and the reference model, the checks of a
// table row against a pool and of the blocks a step touches (detail::check_block_uses). The slot
// mapping of a layout or a step over a pool is slots.hpp's. Standard library only; the pool's
// memory is the engine's (or prepack::reference::kv_pool). Cost: O(log blocks released) per block
// allocated or released, O(1) to share; memory grows with the highest block ever handed out, never
// with the pool's size. O(n_seqs * max_blocks) to lay out tables; the checks O(b log b) in the b
// blocks a step touches.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <queue>
#include <string>
#include <vector>

#include "detail/checked.hpp"
#include "error.hpp"
#include "span.hpp"

PREPACK_NAMESPACE_BEGIN

/// Blocks for `positions` positions at `block_size` per block (block_size > 0).
constexpr std::size_t blocks_for(std::size_t positions, std::size_t block_size) noexcept {
  return positions / block_size + (positions % block_size != 0 ? 1 : 0);
}

/// Blocks 0 .. n_blocks - 1 of a pool, handed out lowest first, reference counted. Blocks never
/// handed out cost nothing: the counters grow with the highest block used, so a pool of 10^7
/// blocks is as cheap to create as one of 10.
class block_allocator {
 public:
  /// With null_block, block 0 is never handed out: vLLM keeps it as its null block (padding
  /// rows of block tables point there) and SGLang's allocators start at 1 (padded tokens write
  /// location 0), so a real sequence's cache must not live there. Throws prepack::error,
  /// allocating nothing, for no blocks (none but the null block), or more than int32 ids name.
  explicit block_allocator(std::size_t n_blocks, bool null_block = false)
      : n_blocks_(n_blocks), null_block_(null_block) {
    detail::require(n_blocks > (null_block ? 1u : 0u), "block allocator: the pool has no blocks",
                    null_block ? " besides the null block" : "");
    detail::require(n_blocks <= static_cast<std::size_t>(INT32_MAX), "block allocator: ", n_blocks,
                    " blocks do not fit int32 block ids");
    if (null_block) refs_.push_back(1);  // held for good
  }

  /// Whether block 0 is reserved as the engine's null block.
  bool null_block() const noexcept { return null_block_; }

  std::size_t n_blocks() const noexcept { return n_blocks_; }
  std::size_t n_free() const noexcept { return n_blocks_ - refs_.size() + released_.size(); }
  /// Blocks held (the null block not counted).
  std::size_t n_used() const noexcept { return n_blocks_ - n_free() - (null_block_ ? 1 : 0); }
  /// Holders of block b (0: free). Throws prepack::error for a block outside the pool.
  std::size_t refs(std::int32_t b) const {
    const std::size_t i = checked(b);
    return i < refs_.size() ? refs_[i] : 0;
  }

  /// n free blocks, the lowest first, each with one reference. Throws prepack::error,
  /// allocating nothing, when fewer than n are free. O(n log blocks).
  std::vector<std::int32_t> allocate(std::size_t n) {
    detail::require(n <= n_free(), "block allocator: ", n, " blocks wanted, ", n_free(), " of ",
                    n_blocks_, " free");
    std::vector<std::int32_t> out;
    out.reserve(n);
    for (std::size_t k = 0; k < n; ++k) out.push_back(*try_allocate());
    return out;
  }
  /// The lowest free block, with one reference; nullopt when none is free. O(log blocks).
  std::optional<std::int32_t> try_allocate() {
    if (n_free() == 0) return std::nullopt;
    std::int32_t b;
    if (!released_.empty()) {  // every released block is below the never-used ones
      b = released_.top();
      released_.pop();
    } else {
      b = static_cast<std::int32_t>(refs_.size());
      refs_.push_back(0);
    }
    refs_[static_cast<std::size_t>(b)] = 1;
    return b;
  }
  /// One more holder of an allocated block (a sequence that shares a prefix block). Throws
  /// prepack::error for a free block or one outside the pool.
  void share(std::int32_t b) {
    const std::size_t i = checked(b);
    detail::require(i < refs_.size() && refs_[i] > 0, "block allocator: block ", b,
                    " is free, it cannot be shared");
    ++refs_[i];
  }
  /// Drops one reference; the block is free again when none is left. Throws prepack::error for
  /// a free block or one outside the pool.
  void release(std::int32_t b) {
    const std::size_t i = checked(b);
    detail::require(i < refs_.size() && refs_[i] > 0, "block allocator: block ", b,
                    " is already free");
    if (--refs_[i] == 0) released_.push(b);
  }

 private:
  std::size_t checked(std::int32_t b) const {
    if (b < 0 || static_cast<std::size_t>(b) >= n_blocks_) {
      detail::fail("block allocator: block ", b, " outside 0..", n_blocks_ - 1);
    }
    if (b == 0 && null_block_) detail::fail("block allocator: block 0 is the null block");
    return static_cast<std::size_t>(b);
  }
  std::size_t n_blocks_ = 0;
  bool null_block_ = false;
  std::vector<std::size_t> refs_;  // [blocks handed out so far]  holders of each
  std::priority_queue<std::int32_t, std::vector<std::int32_t>, std::greater<>>
      released_;  // free blocks below refs_.size(), the lowest on top
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
  /// Row s up to its padding (the first negative entry).
  span<const std::int32_t> blocks(std::size_t s) const noexcept {
    const span<const std::int32_t> r = row(s);
    std::size_t n = 0;
    while (n < r.size() && r[n] >= 0) ++n;
    return {r.data(), n};
  }
  /// The table as (sequence, entry), for prepack's unpackers and step inputs.
  tensor_view<const std::int32_t, 2> view() const noexcept {
    return contiguous_view<const std::int32_t, 2>(table.data(), {n_seqs(), max_blocks});
  }
};

/// Lays out ragged per-sequence block lists as a padded table (at least one entry per row).
/// Throws prepack::error for a block size of 0 or a negative block id.
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

/// The pool slot of position p when `block` holds it: block * block_size + p % block_size.
constexpr std::int64_t slot_of(std::int64_t block, std::size_t p, std::size_t block_size) noexcept {
  return block * static_cast<std::int64_t>(block_size) + static_cast<std::int64_t>(p % block_size);
}

/// Releases one reference to every block each row of `tables` lists (up to its padding): what a
/// sequence does when it is done with its cache. Throws prepack::error, releasing nothing, for a
/// block that is free or outside the pool.
inline void release_blocks(block_allocator& alloc, const block_tables& tables) {
  // A block listed by several rows is released once per row: count them all before any release.
  std::vector<std::int32_t> listed;
  for (std::size_t s = 0; s < tables.n_seqs(); ++s) {
    const auto row = tables.blocks(s);
    listed.insert(listed.end(), row.begin(), row.end());
  }
  std::sort(listed.begin(), listed.end());
  for (std::size_t i = 0; i < listed.size();) {
    std::size_t j = i;
    while (j < listed.size() && listed[j] == listed[i]) ++j;
    const std::size_t held = alloc.refs(listed[i]);  // throws for a block outside the pool
    if (j - i > held) {
      detail::fail("release: block ", listed[i], " is listed ", j - i, " times but held ", held,
                   held == 1 ? " time" : " times");
    }
    i = j;
  }
  for (std::int32_t b : listed) alloc.release(b);
}

/// One sequence's page arithmetic, FlashInfer's paged_kv_t for a single sequence: position p
/// lives in block blocks[p / block_size] at offset p % block_size, pool slot
/// blocks[p / block_size] * block_size + p % block_size. The entries are not checked here
/// (detail::check_row does that once per step).
template <class B = std::int32_t>
struct block_row {
  span<const B> blocks;        // [entries]  the sequence's blocks, in position order
  std::size_t block_size = 0;  // slots per block

  /// The pool block holding position p.
  std::int64_t block(std::size_t p) const noexcept {
    return static_cast<std::int64_t>(blocks[p / block_size]);
  }
  /// The pool slot of position p: block(p) * block_size + p % block_size.
  std::int64_t slot(std::size_t p) const noexcept { return slot_of(block(p), p, block_size); }
};

namespace detail {

// Checks that a table row holds blocks of a pool of n_blocks for positions [0, n_positions):
// at least blocks_for(n_positions) entries, each in [0, n_blocks) (a negative one is padding
// where a block is needed). `entry(k)` reads entry k of the row's `n_entries`; `who()` names the
// sequence in the message (called only on failure). O(entries checked).
template <class Entry, class Who>
void check_row(Entry&& entry, std::size_t n_entries, std::size_t n_positions,
               std::size_t block_size, std::size_t n_blocks, Who&& who) {
  const std::size_t need = blocks_for(n_positions, block_size);
  if (n_entries < need) {
    fail(who(), ": positions up to ", n_positions, " need ", need, " blocks of ", block_size,
         ", its block table has ", n_entries, " entries");
  }
  for (std::size_t k = 0; k < need; ++k) {
    const auto b = entry(k);
    if (is_negative(b))
      fail(who(), ": block_table[", k, "] = ", b, " (padding) where a block is needed");
    if (static_cast<std::size_t>(b) >= n_blocks) {
      fail(who(), ": block_table[", k, "] = ", b, " outside the pool's blocks 0..", n_blocks - 1);
    }
  }
}
template <class B, class Who>
void check_row(span<const B> row, std::size_t n_positions, std::size_t block_size,
               std::size_t n_blocks, Who&& who) {
  check_row([&](std::size_t k) { return row[k]; }, row.size(), n_positions, block_size, n_blocks,
            who);
}

// One sequence's use of one block in a step: entry `entry` of its table, written (it holds
// positions the step computes) or only read (cached context). 16 bytes: a step's uses are
// sorted, and a layout of 10^6 prompts has as many.
struct block_use {
  std::int64_t block = 0;
  std::uint32_t seq = 0;
  std::uint32_t tag = 0;  // entry << 1 | writes

  block_use(std::int64_t b, std::size_t s, std::size_t e, bool w)
      : block(b),
        seq(static_cast<std::uint32_t>(s)),
        tag(static_cast<std::uint32_t>(e << 1) | (w ? 1u : 0u)) {}
  std::uint32_t entry() const noexcept { return tag >> 1; }
  bool writes() const noexcept { return (tag & 1u) != 0; }
};

// Appends the uses of the blocks a sequence touches when it computes positions
// [context, context + length): entries below context / block_size are read, the rest written.
// The row has been checked (check_row); `entry(k)` reads entry k.
template <class Entry>
void add_block_uses(std::vector<block_use>& uses, Entry&& entry, std::size_t context,
                    std::size_t length, std::size_t block_size, std::size_t seq) {
  const std::size_t first_written = context / block_size;
  const std::size_t need = blocks_for(context + length, block_size);
  if (seq > UINT32_MAX || need > (std::size_t{1} << 31)) {
    fail("block table: ", seq + 1, " sequences of up to ", need,
         " blocks are more than one step can hold");
  }
  for (std::size_t k = 0; k < need; ++k) {
    uses.emplace_back(static_cast<std::int64_t>(entry(k)), seq, k, k >= first_written);
  }
}

// Throws unless the blocks of a step are used safely: no sequence lists a block twice, no block
// is written by two sequences, and (unless the engine writes a step's K and V before any
// attention reads them: writes_before_reads) no block one sequence reads as cached context is
// written by another in the same step. Several sequences may read one block (a shared prefix).
// `name(seq)` names a sequence in messages (called only on failure). O(b log b) in the b uses;
// sorts `uses`.
template <class Name>
void check_block_uses(std::vector<block_use>& uses, Name&& name, bool writes_before_reads = false) {
  std::sort(uses.begin(), uses.end(), [](const block_use& a, const block_use& b) {
    if (a.block != b.block) return a.block < b.block;
    if (a.writes() != b.writes()) return a.writes();  // a block's writer first
    return a.seq != b.seq ? a.seq < b.seq : a.entry() < b.entry();
  });
  for (std::size_t i = 1; i < uses.size(); ++i) {
    const block_use& a = uses[i - 1];
    const block_use& b = uses[i];
    if (a.block != b.block) continue;
    if (a.seq == b.seq) {
      fail(name(a.seq), ": block ", a.block, " appears twice in its block table (entries ",
           std::min(a.entry(), b.entry()), " and ", std::max(a.entry(), b.entry()), ")");
    }
    if (a.writes() && b.writes()) {
      fail(name(b.seq), ": block ", b.block, " is also written by ", name(a.seq));
    }
    if (a.writes() && !writes_before_reads) {  // b only reads it
      fail(name(b.seq), ": block ", b.block, " (entry ", b.entry(),
           ") holds context it reads, but ", name(a.seq), " writes that block in this step");
    }
  }
}

}  // namespace detail

PREPACK_NAMESPACE_END
