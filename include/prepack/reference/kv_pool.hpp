// prepack/reference/kv_pool.hpp - a paged KV pool for the reference model, vLLM's layout: per
// layer, K and V each [n_blocks][block_size][n_kv_heads][head_dim] (a slot is block *
// block_size + offset). The forward pass writes new keys and values through a slot mapping and
// reads a sequence's context through its block table. The pool remembers, per block, which
// position its first slot holds and how many of its slots are filled, so a chunk whose context
// was never written is refused before anything runs, with one check per block.
// Memory: 2 * n_layers * n_blocks * block_size * kv_dim floats, plus two words per block.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../detail/checked.hpp"
#include "../error.hpp"
#include "../paged.hpp"
#include "../span.hpp"
#include "weights.hpp"

PREPACK_NAMESPACE_BEGIN
namespace reference {

class kv_pool {
 public:
  /// An empty pool (no blocks), as a moved-from one is: assign a built one to it.
  kv_pool() = default;
  /// Throws prepack::error for an invalid config, no blocks, a block size of 0, or a size that
  /// overflows size_t; std::bad_alloc when the pool does not fit in memory.
  kv_pool(const config& c, std::size_t n_blocks, std::size_t block_size)
      : n_layers_(c.n_layers),
        n_kv_heads_(c.n_kv_heads),
        head_dim_(c.head_size()),
        n_blocks_(n_blocks),
        block_size_(block_size) {
    c.validate();
    prepack::detail::require(n_blocks > 0, "kv pool: no blocks");
    prepack::detail::require(block_size > 0, "kv pool: block size 0");
    n_slots_ = prepack::detail::mul(n_blocks, block_size, "kv pool slots");
    const std::size_t per_layer = prepack::detail::mul(n_slots_, kv_dim(), "kv pool");
    const std::size_t total =
        prepack::detail::mul(per_layer, static_cast<std::size_t>(n_layers_), "kv pool");
    keys_.assign(total, 0.0f);
    values_.assign(total, 0.0f);
    first_.assign(n_blocks, -1);
    filled_.assign(n_blocks, 0);
  }

  int n_layers() const noexcept { return n_layers_; }
  int n_kv_heads() const noexcept { return n_kv_heads_; }
  int head_dim() const noexcept { return head_dim_; }
  std::size_t kv_dim() const noexcept {
    return static_cast<std::size_t>(n_kv_heads_) * static_cast<std::size_t>(head_dim_);
  }
  std::size_t n_blocks() const noexcept { return n_blocks_; }
  std::size_t block_size() const noexcept { return block_size_; }
  std::size_t n_slots() const noexcept { return n_slots_; }
  std::size_t bytes() const noexcept {
    return (keys_.size() + values_.size()) * sizeof(float) +
           (first_.size() + filled_.size()) * sizeof(std::int64_t);
  }

  /// Layer l's keys / values: [n_slots][kv_dim], slot-major.
  float* keys(int layer) noexcept { return keys_.data() + offset(layer); }
  float* values(int layer) noexcept { return values_.data() + offset(layer); }
  const float* keys(int layer) const noexcept { return keys_.data() + offset(layer); }
  const float* values(int layer) const noexcept { return values_.data() + offset(layer); }

  /// Every layer's keys / values as (layer, block, offset in block, head, dim), for prepack's
  /// unpackers and for engines' own kernels.
  tensor_view<float, 5> key_view() noexcept { return view(keys_.data()); }
  tensor_view<float, 5> value_view() noexcept { return view(values_.data()); }

  /// Whether block b holds positions [first, first + count) in its first `count` slots: what a
  /// sequence whose position `first` starts block b needs of its cached context.
  bool holds(std::size_t b, std::int64_t first, std::size_t count) const noexcept {
    return count == 0 || (first_[b] == first && static_cast<std::size_t>(filled_[b]) >= count);
  }
  /// The position block b's first slot holds (-1: never written) and its filled slots.
  std::int64_t first_position(std::size_t b) const noexcept { return first_[b]; }
  std::size_t filled(std::size_t b) const noexcept { return static_cast<std::size_t>(filled_[b]); }

  /// Records that position `pos` was written at `slot` (the forward pass does, and
  /// reference::mark_cached for K and V written by other means). A write at a block's first
  /// slot starts the block afresh; a write that continues what the block holds extends it; any
  /// other (a gap, another sequence's positions) leaves the block holding nothing checkable.
  void record_write(std::size_t slot, std::int64_t pos) noexcept {
    const std::size_t b = slot / block_size_;
    const auto offset = static_cast<std::int64_t>(slot % block_size_);
    if (offset == 0) {
      first_[b] = pos;
      filled_[b] = 1;
    } else if (first_[b] >= 0 && first_[b] == pos - offset && filled_[b] >= offset) {
      filled_[b] = std::max(filled_[b], offset + 1);
    } else {
      first_[b] = -1;
      filled_[b] = 0;
    }
  }

 private:
  std::size_t offset(int layer) const noexcept {
    return static_cast<std::size_t>(layer) * n_slots_ * kv_dim();
  }
  tensor_view<float, 5> view(float* data) noexcept {
    return contiguous_view<float, 5>(
        data, {static_cast<std::size_t>(n_layers_), n_blocks_, block_size_,
               static_cast<std::size_t>(n_kv_heads_), static_cast<std::size_t>(head_dim_)});
  }

  int n_layers_ = 0, n_kv_heads_ = 0, head_dim_ = 0;
  std::size_t n_blocks_ = 0, block_size_ = 0, n_slots_ = 0;
  std::vector<float> keys_;           // [n_layers][n_slots][kv_dim]
  std::vector<float> values_;         // [n_layers][n_slots][kv_dim]
  std::vector<std::int64_t> first_;   // [n_blocks]  position held by the block's first slot
  std::vector<std::int64_t> filled_;  // [n_blocks]  slots filled, from the first on
};

/// A sequence cached in a pool: its blocks and how many positions are filled.
struct paged_sequence {
  std::vector<std::int32_t> blocks;  // position p lives in blocks[p / block_size]
  std::size_t length = 0;            // positions 0 .. length - 1 are cached

  /// The pool slot of position p.
  std::size_t slot(std::size_t p, std::size_t block_size) const {
    return static_cast<std::size_t>(
        block_row<std::int32_t>{span<const std::int32_t>(blocks), block_size}.slot(p));
  }
};

/// Per-sequence caches in one pool: what prefill leaves behind and decoding continues from.
struct paged_cache {
  kv_pool pool;
  std::vector<paged_sequence> seqs;  // [n_sequences]
};

}  // namespace reference
PREPACK_NAMESPACE_END
