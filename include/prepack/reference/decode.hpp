// prepack/reference/decode.hpp - per-prompt caches in a paged pool, scattered out of a packed
// prefill with prepack's unpacker, and batched greedy decoding that continues every prompt from
// its cache through the model's one transformer block: a decode step is a step of one-token
// chunks over their context (model::forward over the pool).
//
// Cost of one decode step for B sequences: B * per-token linear FLOPs (GEMMs over the batch)
// plus, per sequence, attention over its cache; O(B * max_blocks) to lay out the step.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../layout.hpp"
#include "../paged.hpp"
#include "../step.hpp"
#include "../unpack.hpp"
#include "kv_pool.hpp"
#include "model.hpp"

PREPACK_NAMESPACE_BEGIN
namespace reference {

/// Marks positions [from, to) of a sequence as cached in its pool (after writing them by other
/// means than model::forward, e.g. prepack's unpackers), so later steps may attend to them.
inline void mark_cached(kv_pool& pool, const paged_sequence& s, std::size_t from, std::size_t to) {
  for (std::size_t p = from; p < to; ++p) {
    pool.record_write(s.slot(p, pool.block_size()), static_cast<std::int64_t>(p));
  }
}

/// A pool with blocks for `positions[i]` positions of each sequence i, handed out in order
/// (sequence 0 gets blocks 0, 1, ..), lengths 0.
inline paged_cache make_cache(const config& c, const std::vector<std::size_t>& positions,
                              std::size_t block_size) {
  std::size_t total = 0;
  for (std::size_t p : positions) total += std::max<std::size_t>(1, blocks_for(p, block_size));
  paged_cache out{kv_pool(c, std::max<std::size_t>(total, 1), block_size), {}};
  block_allocator alloc(out.pool.n_blocks());
  for (std::size_t p : positions) {
    out.seqs.push_back({alloc.allocate(std::max<std::size_t>(1, blocks_for(p, block_size))), 0});
  }
  return out;
}

/// Block tables of a cache's sequences, padded.
inline block_tables tables_of(const paged_cache& cache) {
  std::vector<std::vector<std::int32_t>> rows;
  for (const paged_sequence& s : cache.seqs) rows.push_back(s.blocks);
  return make_block_tables(rows, cache.pool.block_size());
}

/// Scatters a prefill's packed KV (every layer, K and V) into a paged cache with room for
/// `extra` more positions per prompt, through prepack::unpack_paged. Throws prepack::error if
/// the result was not computed over this layout (shapes differ) or by a model of another shape.
template <class Token, class Index>
paged_cache unpack_caches(const model& m, const packed_layout<Token, Index>& l,
                          const prefill_result& r, std::size_t extra = 0,
                          std::size_t block_size = 16) {
  const config& c = m.cfg();
  prepack::detail::require(
      r.n_layers == c.n_layers && r.n_kv_heads == c.n_kv_heads && r.head_dim == c.head_size(),
      "prefill result: ", r.n_layers, " layers x ", r.n_kv_heads, " kv heads x ", r.head_dim,
      " dims, the model has ", c.n_layers, " x ", c.n_kv_heads, " x ", c.head_size());
  prepack::detail::require(r.n_rows == l.n_rows() && r.width == l.width(),
                           "prefill result: ", r.n_rows, " rows x ", r.width,
                           " slots, the layout has ", l.n_rows(), " x ", l.width(),
                           " (a layout from another batch?)");
  std::vector<std::size_t> room;
  for (std::size_t i = 0; i < l.n_prompts(); ++i) {
    room.push_back(static_cast<std::size_t>(l.prompt_length()[i]) + extra);
  }
  paged_cache cache = make_cache(c, room, block_size);
  const block_tables t = tables_of(cache);
  unpack_paged(l, r.kv(), cache.pool.key_view(), cache.pool.value_view(), t.view());
  for (std::size_t i = 0; i < l.n_prompts(); ++i) {
    cache.seqs[i].length = static_cast<std::size_t>(l.prompt_length()[i]);
    mark_cached(cache.pool, cache.seqs[i], 0, cache.seqs[i].length);
  }
  return cache;
}

/// Greedy continuations: tokens[i][k] is sequence i's k-th new token; margins[i][k] how far its
/// logit led the runner-up (a small margin marks a near-tie that rounding could flip).
struct decode_result {
  std::vector<std::vector<int>> tokens;     // [n_seqs][n_new]
  std::vector<std::vector<float>> margins;  // [n_seqs][n_new]
};

/// The step that feeds token tokens[i] to every sequence i of the cache at its next position
/// (prepack::make_decode_inputs).
inline step_inputs<> decode_step(const paged_cache& cache, const std::vector<int>& tokens) {
  std::vector<decode_sequence<int>> seqs(cache.seqs.size());
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    const paged_sequence& s = cache.seqs[i];
    seqs[i] = {static_cast<std::int64_t>(i), tokens[i], s.length,
               span<const std::int32_t>(s.blocks), s.length};
  }
  return make_decode_inputs(seqs, cache.pool.block_size(), cache.pool.n_blocks());
}

/// Continues every sequence of the cache greedily for n_new tokens: the first from
/// `first_logits` (the prefill's, [n_seqs][vocab]), each next one from a decode step over the
/// pool, appending to the sequences. Throws prepack::error, changing nothing, if the counts
/// differ, a sequence lacks blocks for n_new - 1 more positions or is empty, or n_new < 0.
inline decode_result greedy_decode(const model& m, paged_cache& cache, const matrix& first_logits,
                                   int n_new, const exec_options& opt = {}) {
  using prepack::detail::require;
  const config& c = m.cfg();
  const std::size_t b = cache.seqs.size();
  require(n_new >= 0, "n_new ", n_new);
  require(static_cast<std::size_t>(first_logits.rows()) == b && first_logits.cols() == c.vocab,
          "first_logits: ", first_logits.rows(), " x ", first_logits.cols(), " for ", b,
          " sequences and vocab ", c.vocab);
  for (std::size_t i = 0; i < b; ++i) {
    const paged_sequence& s = cache.seqs[i];
    require(s.length >= 1, "sequence ", i, ": nothing cached to continue");
    const std::size_t room = s.blocks.size() * cache.pool.block_size();
    require(n_new == 0 || s.length + static_cast<std::size_t>(n_new) - 1 <= room, "sequence ", i,
            ": its blocks hold ", room, " positions, ", n_new - 1, " more after ", s.length,
            " do not fit");
  }
  decode_result out;
  out.tokens.assign(b, std::vector<int>());
  out.margins.assign(b, std::vector<float>());
  if (n_new == 0 || b == 0) return out;
  matrix logits = first_logits;
  std::vector<int> next(b);
  for (int step = 0;; ++step) {
    for (std::size_t i = 0; i < b; ++i) {
      const auto [token, margin] = detail::argmax_with_margin(
          logits.row(static_cast<Eigen::Index>(i)).data(), static_cast<std::size_t>(c.vocab));
      out.tokens[i].push_back(token);
      out.margins[i].push_back(margin);
      next[i] = token;
    }
    if (step + 1 == n_new) break;
    step_result r = m.forward(decode_step(cache, next), cache.pool, opt);
    for (paged_sequence& s : cache.seqs) ++s.length;
    logits = std::move(r.logits);  // one row per sequence, in order
  }
  return out;
}

}  // namespace reference
PREPACK_NAMESPACE_END
