// prepack/step.hpp - what an engine's forward pass takes for one step of a budgeted schedule
// (prepack/schedule.hpp), over a paged KV pool, in the vocabulary of the engines that run such
// steps: per sequence its context, query and total lengths, cu_seqlens_q / cu_seqlens_k
// (FlashAttention's varlen kernels with a KV cache; vLLM's query_start_loc / seq_lens), block
// tables; per token its id, position (from the context on), the caller's sequence id and a
// logits flag (llama_batch), and the slot_mapping that writes its K and V straight into the pool
// (vLLM's reshape_and_cache): no packed KV buffer, no unpack copy.
//
// A step can also be laid out as rows of a capacity, for engines that take rectangular
// batches: make_step_layout gives the packed_layout of its chunks (positions from their
// contexts) and a slot mapping with -1 on pad slots.
// Cost: O(tokens of the step + n_seqs * max_blocks). Every value stored is checked to fit.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "detail/checked.hpp"
#include "error.hpp"
#include "layout.hpp"
#include "paged.hpp"
#include "plan.hpp"
#include "schedule.hpp"
#include "span.hpp"
#include "unpack.hpp"

PREPACK_NAMESPACE_BEGIN

/// One forward pass of a budgeted schedule: sequence s of the step is chunk s of the step.
template <class Token = std::int32_t, class Index = std::int32_t>
struct step_inputs {
  // Per sequence.
  std::vector<std::size_t> seq_item;    // [n_seqs]      schedule item (prompt) of sequence s
  std::vector<std::int64_t> seq_id;     // [n_seqs]      the caller's id for it
  std::vector<Index> context_lens;      // [n_seqs]      tokens already cached
  std::vector<Index> query_lens;        // [n_seqs]      tokens computed in this step
  std::vector<Index> seq_lens;          // [n_seqs]      context + query (seqused_k)
  std::vector<Index> cu_seqlens_q;      // [n_seqs + 1]  query_start_loc
  std::vector<Index> cu_seqlens_k;      // [n_seqs + 1]  over seq_lens: context + query
  Index max_seqlen_q = 0;               //               longest query
  Index max_seqlen_k = 0;               //               longest context + query
  std::vector<std::uint8_t> completes;  // [n_seqs]      1 if the chunk ends its prompt
  block_tables tables;                  // [n_seqs][max_blocks]  the sequences' blocks
  // Per token.
  std::vector<Token> tokens;               // [n_tokens]    token ids
  std::vector<Index> positions;            // [n_tokens]    context_len + i within a sequence
  std::vector<std::int64_t> token_seq_id;  // [n_tokens]    caller's sequence id (llama_batch)
  std::vector<std::int8_t> logits;         // [n_tokens]    1 on the last token of a sequence
                                           //               whose chunk completes its prompt
  std::vector<std::int64_t> slot_mapping;  // [n_tokens]    pool slot: block * block_size +
                                           //               position % block_size
  std::size_t n_blocks = 0;                // blocks of the pool the slots index

  std::size_t n_seqs() const noexcept { return seq_item.size(); }
  std::size_t n_tokens() const noexcept { return tokens.size(); }
};

namespace detail {

// Checks the chunks of step `s` against the schedule's items and the item tokens given.
template <class T>
void check_step(const step_schedule& sched, std::size_t s,
                const std::vector<std::vector<T>>& item_tokens) {
  require(s < sched.n_steps(), "step ", s, " outside the schedule's ", sched.n_steps(), " steps");
  require(item_tokens.size() == sched.n_items(), "item tokens: ", item_tokens.size(), " for ",
          sched.n_items(), " scheduled prompts");
  for (const chunk& c : sched.step(s)) {
    require(c.item < sched.n_items(), "step ", s, ": chunk of prompt ", c.item, " outside ",
            sched.n_items(), " prompts");
    const schedule_item& it = sched.items[c.item];
    require(item_tokens[c.item].size() == it.length, "prompt ", c.item, ": ",
            item_tokens[c.item].size(), " tokens, the schedule says ", it.length);
    require(c.length > 0 && c.start <= it.length && c.length <= it.length - c.start, "prompt ",
            c.item, ": chunk at token ", c.start, " of ", c.length, " tokens runs past its ",
            it.length, " tokens");
    require(c.context == it.context + c.start, "prompt ", c.item, ": chunk context ", c.context,
            " is not the prompt's context ", it.context, " + its start ", c.start);
  }
}

// A block table row up to its padding (the first negative entry).
inline std::vector<std::int32_t> table_row(const block_tables& t, std::size_t r) {
  const auto row = t.row(r);
  std::vector<std::int32_t> out;
  for (std::int32_t b : row) {
    if (b < 0) break;
    out.push_back(b);
  }
  return out;
}

// Checks that each sequence's blocks cover its context and query, entries in range, and that no
// block is written by two sequences of the step.
inline void check_step_blocks(const std::vector<std::size_t>& ctx,
                              const std::vector<std::size_t>& len,
                              const std::vector<std::size_t>& item,
                              const std::vector<std::vector<std::int32_t>>& rows,
                              std::size_t block_size, std::size_t n_blocks) {
  require(n_blocks > 0, "paged pool: the pool has no blocks");
  constexpr std::size_t none = static_cast<std::size_t>(-1);
  std::vector<std::size_t> writer(n_blocks, none), listed(n_blocks, none);
  for (std::size_t q = 0; q < ctx.size(); ++q) {
    const std::size_t need = blocks_for(ctx[q] + len[q], block_size);
    require(rows[q].size() >= need, "prompt ", item[q], ": context ", ctx[q], " + query ", len[q],
            " needs ", need, " blocks of ", block_size, ", its block table has ", rows[q].size());
    for (std::size_t k = 0; k < need; ++k) {
      const std::int32_t b = rows[q][k];
      require(b >= 0 && static_cast<std::size_t>(b) < n_blocks, "prompt ", item[q],
              ": block_table[", k, "] = ", b, " outside the pool's blocks 0..", n_blocks - 1);
      std::size_t& seen = listed[static_cast<std::size_t>(b)];
      require(seen != q, "prompt ", item[q], ": block ", b, " appears twice in its block table");
      seen = q;
      if (k < ctx[q] / block_size) continue;  // read only
      std::size_t& w = writer[static_cast<std::size_t>(b)];
      if (w != none) {
        fail("prompt ", item[q], ": block ", b, " is also written by prompt ", item[w],
             " in this step");
      }
      w = q;
    }
  }
}

}  // namespace detail

/// Options for make_step_inputs.
struct step_options {
  /// The caller's id of each item (a request id, a llama_seq_id); default: the item index.
  span<const std::int64_t> seq_ids;
};

/// The inputs of step `s` of a schedule: item_tokens[i] holds item i's tokens (the schedule's
/// item lengths), tables.row(i) item i's blocks in a pool of n_blocks blocks of
/// tables.block_size slots (positions 0 .. context + length, the context's blocks read, the
/// rest written). Throws prepack::error, naming the prompt and value, if the step is out of
/// range, a chunk disagrees with its item (a context longer than the prompt, a length past its
/// end), an item's tokens differ in count, a block table is too short for context + query or
/// names a block outside the pool, two sequences of the step write one block, two tokens map
/// to one slot, or a value does not fit Token / Index.
template <class Token = std::int32_t, class Index = std::int32_t, class T>
step_inputs<Token, Index> make_step_inputs(const step_schedule& sched, std::size_t s,
                                           const std::vector<std::vector<T>>& item_tokens,
                                           const block_tables& tables, std::size_t n_blocks,
                                           const step_options& opt = {}) {
  using detail::require;
  detail::check_step(sched, s, item_tokens);
  require(tables.block_size > 0, "block tables: block size 0");
  require(tables.n_seqs() >= sched.n_items(), "block tables: ", tables.n_seqs(), " rows for ",
          sched.n_items(), " prompts");
  require(opt.seq_ids.empty() || opt.seq_ids.size() == sched.n_items(),
          "sequence ids: ", opt.seq_ids.size(), " for ", sched.n_items(), " prompts");
  const span<const chunk> chunks = sched.step(s);
  step_inputs<Token, Index> in;
  in.n_blocks = n_blocks;
  std::vector<std::size_t> ctx, len, items;
  std::vector<std::vector<std::int32_t>> rows;
  std::size_t total_q = 0, total_k = 0;
  for (const chunk& c : chunks) {
    ctx.push_back(c.context);
    len.push_back(c.length);
    items.push_back(c.item);
    rows.push_back(detail::table_row(tables, c.item));
    total_q = detail::add(total_q, c.length, "step tokens");
    total_k = detail::add(total_k, c.context + c.length, "step keys");
    detail::narrow<Index>(c.context + c.length, "position");
  }
  detail::narrow<Index>(total_q, "cu_seqlens_q total");
  detail::narrow<Index>(total_k, "cu_seqlens_k total");
  detail::check_step_blocks(ctx, len, items, rows, tables.block_size, n_blocks);
  in.tables = make_block_tables(rows, tables.block_size);

  const std::size_t bs = tables.block_size;
  in.cu_seqlens_q.push_back(0);
  in.cu_seqlens_k.push_back(0);
  for (std::size_t q = 0; q < chunks.size(); ++q) {
    const chunk& c = chunks[q];
    const std::int64_t id =
        opt.seq_ids.empty() ? static_cast<std::int64_t>(c.item) : opt.seq_ids[c.item];
    in.seq_item.push_back(c.item);
    in.seq_id.push_back(id);
    in.context_lens.push_back(static_cast<Index>(c.context));
    in.query_lens.push_back(static_cast<Index>(c.length));
    in.seq_lens.push_back(static_cast<Index>(c.context + c.length));
    in.cu_seqlens_q.push_back(static_cast<Index>(in.cu_seqlens_q.back() + in.query_lens.back()));
    in.cu_seqlens_k.push_back(static_cast<Index>(in.cu_seqlens_k.back() + in.seq_lens.back()));
    in.max_seqlen_q = std::max(in.max_seqlen_q, in.query_lens.back());
    in.max_seqlen_k = std::max(in.max_seqlen_k, in.seq_lens.back());
    in.completes.push_back(c.last ? 1 : 0);
    const auto& toks = item_tokens[c.item];
    const auto row = in.tables.row(q);
    for (std::size_t t = 0; t < c.length; ++t) {
      const T tok = toks[c.start + t];
      if (!detail::fits<Token>(tok)) {
        detail::fail("prompt ", c.item, ": token ", c.start + t, " = ", tok,
                     " does not fit the token type");
      }
      const std::size_t pos = c.context + t;
      in.tokens.push_back(static_cast<Token>(tok));
      in.positions.push_back(static_cast<Index>(pos));
      in.token_seq_id.push_back(id);
      in.logits.push_back(c.last && t + 1 == c.length ? 1 : 0);
      in.slot_mapping.push_back(static_cast<std::int64_t>(row[pos / bs]) *
                                    static_cast<std::int64_t>(bs) +
                                static_cast<std::int64_t>(pos % bs));
    }
  }
  // Two tokens on one slot: refused with the token named (block ownership above already rules
  // out two sequences; this catches a table that lists one block twice).
  (void)slot_mapping::from_slots(in.slot_mapping, n_blocks, bs);
  return in;
}

/// A step laid out as rows, for engines that take rectangular batches: the chunks of the step
/// packed first-fit-decreasing into rows of `capacity` (default: the longest chunk), each
/// prompt's positions from its context on, and the slot mapping of every slot (-1 on pads).
template <class Token = std::int32_t, class Index = std::int32_t>
struct step_layout {
  packed_layout<Token, Index> layout;  // prompt q of the layout is sequence q of the step
  std::vector<std::size_t> seq_item;   // [n_seqs]  schedule item of each
  block_tables tables;                 // [n_seqs][max_blocks]
  slot_mapping slots;                  // [n_rows * width]
};

/// Throws as make_step_inputs, and as first_fit_decreasing for a capacity below a chunk.
template <class Token = std::int32_t, class Index = std::int32_t, class T>
step_layout<Token, Index> make_step_layout(const step_schedule& sched, std::size_t s,
                                           const std::vector<std::vector<T>>& item_tokens,
                                           const block_tables& tables, std::size_t n_blocks,
                                           std::optional<std::size_t> capacity = std::nullopt,
                                           const layout_options& opt = {}) {
  detail::check_step(sched, s, item_tokens);
  detail::require(tables.n_seqs() >= sched.n_items(), "block tables: ", tables.n_seqs(),
                  " rows for ", sched.n_items(), " prompts");
  const span<const chunk> chunks = sched.step(s);
  std::vector<std::size_t> lengths;
  std::vector<long long> context;
  std::vector<T> flat;
  std::vector<std::vector<std::int32_t>> rows;
  step_layout<Token, Index> out;
  for (const chunk& c : chunks) {
    lengths.push_back(c.length);
    context.push_back(static_cast<long long>(c.context));
    const auto& toks = item_tokens[c.item];
    flat.insert(flat.end(), toks.begin() + static_cast<std::ptrdiff_t>(c.start),
                toks.begin() + static_cast<std::ptrdiff_t>(c.start + c.length));
    rows.push_back(detail::table_row(tables, c.item));
    out.seq_item.push_back(c.item);
  }
  const auto plan = first_fit_decreasing(span<const std::size_t>(lengths), capacity);
  out.layout =
      make_layout<Token, Index>(plan, span<const T>(flat), span<const long long>(context), opt);
  out.tables = make_block_tables(rows, tables.block_size);
  out.slots = make_slot_mapping(out.layout, out.tables.view(), n_blocks, tables.block_size);
  return out;
}

PREPACK_NAMESPACE_END
