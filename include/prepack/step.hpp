// prepack/step.hpp - what an engine's forward pass takes for one step of a budgeted schedule
// (prepack/schedule.hpp), over a paged KV pool: prepack's own, engine-neutral form of a step.
// Per sequence its context, query and total lengths and their prefix sums, its block table; per
// token its id, position (from the context on), the caller's sequence id and a logits flag, and
// the slot_mapping that writes its K and V straight into the pool (vLLM's reshape_and_cache): no
// packed KV buffer, no unpack copy. The reference model runs this form; every engine's own form
// of the same step is built from it (prepack/engines/: vLLM, FlashInfer, SGLang, TensorRT-LLM,
// llama.cpp), with that engine's names, types and conventions.
//
// A step can also be laid out as rows of a capacity, for engines that take rectangular
// batches: make_step_layout gives the packed_layout of its chunks (positions from their
// contexts) and a slot mapping with -1 on pad slots.
// Cost: O(step tokens + b log b) for the b blocks the step's sequences touch, whatever the pool's
// size; every value stored is checked to fit.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
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
  std::vector<std::size_t> seq_item;  // [n_seqs]      schedule item of sequence s
  std::vector<std::int64_t> seq_id;   // [n_seqs]      the caller's id: step_options::seq_ids, or
                                      //               by default its prompt's index, and for a
                                      //               shared prefix -1 - its item (apart from
                                      //               every prompt's)
  std::vector<Index> context_lens;    // [n_seqs]      tokens already cached (vLLM's
                                      //               num_computed_tokens, SGLang's prefix lens)
  std::vector<Index> query_lens;      // [n_seqs]      tokens computed in this step
  std::vector<Index> seq_lens;        // [n_seqs]      context + query: vLLM v1's seq_lens, which
                                      //               its FlashAttention call passes as seqused_k
  std::vector<Index> cu_seqlens_q;    // [n_seqs + 1]  prefix sums of query_lens: vLLM's
                                      //               query_start_loc, FlashInfer's qo_indptr
  std::vector<Index> cu_seqlens_k;    // [n_seqs + 1]  prefix sums of seq_lens (context + query):
                                      //               FlashAttention-2's cu_seqlens_k for its
                                      //               paged varlen call, vLLM v0's seq_start_loc.
                                      //               Not FlashInfer's ragged kv_indptr (new tokens
                                      //               only: cu_seqlens_q), not what vLLM v1 passes
                                      //               (seq_lens as seqused_k): engines/ has each
  Index max_seqlen_q = 0;             //               longest query
  Index max_seqlen_k = 0;             //               longest context + query
  std::vector<std::uint8_t> completes;  // [n_seqs]    1 if the chunk ends a prompt (its item's
                                        //             last chunk, of an item that ends a prompt)
  block_tables tables;                  // [n_seqs][max_blocks]  the sequences' blocks
  // Per token.
  std::vector<Token> tokens;               // [n_tokens]    token ids
  std::vector<Index> positions;            // [n_tokens]    context_len + i within a sequence
  std::vector<std::int64_t> token_seq_id;  // [n_tokens]    the sequence's seq_id
  std::vector<std::int8_t> logits;         // [n_tokens]    1 on the last token of a sequence
                                           //               that completes a prompt, else 0
  std::vector<std::int64_t> slot_mapping;  // [n_tokens]    pool slot: block * block_size +
                                           //               position % block_size
  std::size_t n_blocks = 0;                // blocks of the pool the slots index

  std::size_t n_seqs() const noexcept { return seq_item.size(); }
  std::size_t n_tokens() const noexcept { return tokens.size(); }
};

namespace detail {

// Checks the chunks of step `s` against the schedule's items and the item tokens given.
// O(sequences of the step).
template <class T>
void check_step(const step_schedule& sched, std::size_t s,
                const std::vector<std::vector<T>>& item_tokens) {
  require(s < sched.n_steps(), "step ", s, " outside the schedule's ", sched.n_steps(), " steps");
  require(item_tokens.size() == sched.n_items(), "item tokens: ", item_tokens.size(), " for ",
          sched.n_items(), " scheduled items");
  require(sched.step_begin[s] <= sched.step_begin[s + 1] &&
              sched.step_begin[s + 1] <= sched.chunks.size(),
          "schedule: step_begin does not delimit step ", s, " within ", sched.chunks.size(),
          " chunks");
  for (const chunk& c : sched.step(s)) {
    require(c.item < sched.n_items(), "step ", s, ": chunk of item ", c.item, " outside ",
            sched.n_items(), " items");
    const schedule_item& it = sched.items[c.item];
    if (item_tokens[c.item].size() != it.length) {
      fail(item_name(it, c.item), ": ", item_tokens[c.item].size(), " tokens, the schedule says ",
           it.length);
    }
    if (c.length == 0 || c.start > it.length || c.length > it.length - c.start) {
      fail(item_name(it, c.item), ": chunk at token ", c.start, " of ", c.length,
           " tokens runs past its ", it.length, " tokens");
    }
    if (c.context != it.context + c.start) {
      fail(item_name(it, c.item), ": chunk context ", c.context, " is not the item's context ",
           it.context, " + its start ", c.start);
    }
  }
}

}  // namespace detail

/// Options for make_step_inputs.
struct step_options {
  /// The caller's id of each item (a request id, a llama_seq_id); default: a prompt's item its
  /// prompt's index, a shared prefix's item -1 - its index (apart from every prompt's id).
  span<const std::int64_t> seq_ids;
};

/// The inputs of step `s` of a schedule: item_tokens[i] holds item i's tokens (the schedule's
/// item lengths), tables.row(i) item i's blocks in a pool of n_blocks blocks of
/// tables.block_size slots (positions 0 .. context + length, the context's blocks read, the
/// rest written). Throws prepack::error, naming the prompt (or prefix item) and value, if the
/// step is out of range, a chunk disagrees with its item (a context longer than the item, a
/// length past its end), an item's tokens differ in count, a block table is too short for
/// context + query or names a block outside the pool, a sequence lists a block twice, two
/// sequences of the step write one block, a sequence reads as context a block another one
/// writes, or a value does not fit Token / Index. Cost: O(step tokens + b log b) for the b
/// blocks the step's sequences touch; nothing in the pool's size.
template <class Token = std::int32_t, class Index = std::int32_t, class T>
step_inputs<Token, Index> make_step_inputs(const step_schedule& sched, std::size_t s,
                                           const std::vector<std::vector<T>>& item_tokens,
                                           const block_tables& tables, std::size_t n_blocks,
                                           const step_options& opt = {}) {
  using detail::require;
  detail::check_step(sched, s, item_tokens);
  require(tables.block_size > 0, "block tables: block size 0");
  require(n_blocks > 0, "paged pool: the pool has no blocks");
  require(tables.n_seqs() >= sched.n_items(), "block tables: ", tables.n_seqs(), " rows for ",
          sched.n_items(), " items");
  require(opt.seq_ids.empty() || opt.seq_ids.size() == sched.n_items(),
          "sequence ids: ", opt.seq_ids.size(), " for ", sched.n_items(), " items");
  const span<const chunk> chunks = sched.step(s);
  const std::size_t bs = tables.block_size;
  const auto name = [&](std::size_t q) {
    return item_name(sched.items[chunks[q].item], chunks[q].item);
  };
  // Blocks: each sequence's row covers its positions with blocks of the pool, and the blocks
  // the step touches are used safely (one writer each, none read while another writes it).
  std::vector<std::vector<std::int32_t>> rows;
  std::vector<detail::block_use> uses;
  std::size_t total_q = 0, total_k = 0;
  for (std::size_t q = 0; q < chunks.size(); ++q) {
    const chunk& c = chunks[q];
    const span<const std::int32_t> row = tables.blocks(c.item);
    detail::check_row(row, c.context + c.length, bs, n_blocks, [&] { return name(q); });
    detail::add_block_uses(
        uses, [&](std::size_t k) { return row[k]; }, c.context, c.length, bs, q);
    rows.emplace_back(row.begin(), row.end());
    total_q = detail::add(total_q, c.length, "step tokens");
    total_k = detail::add(total_k, c.context + c.length, "step keys");
    detail::narrow<Index>(c.context + c.length, "position");
  }
  detail::check_block_uses(uses, name);
  detail::narrow<Index>(total_q, "cu_seqlens_q total");
  detail::narrow<Index>(total_k, "cu_seqlens_k total");

  step_inputs<Token, Index> in;
  in.n_blocks = n_blocks;
  in.tables = make_block_tables(rows, bs);
  in.cu_seqlens_q.push_back(0);
  in.cu_seqlens_k.push_back(0);
  in.tokens.reserve(total_q);
  in.positions.reserve(total_q);
  in.token_seq_id.reserve(total_q);
  in.logits.reserve(total_q);
  in.slot_mapping.reserve(total_q);
  for (std::size_t q = 0; q < chunks.size(); ++q) {
    const chunk& c = chunks[q];
    const schedule_item& it = sched.items[c.item];
    const std::int64_t id = !opt.seq_ids.empty() ? opt.seq_ids[c.item]
                            : it.prompt          ? static_cast<std::int64_t>(*it.prompt)
                                                 : -1 - static_cast<std::int64_t>(c.item);
    const bool completes = c.last && it.ends_prompt;
    in.seq_item.push_back(c.item);
    in.seq_id.push_back(id);
    in.context_lens.push_back(static_cast<Index>(c.context));
    in.query_lens.push_back(static_cast<Index>(c.length));
    in.seq_lens.push_back(static_cast<Index>(c.context + c.length));
    in.cu_seqlens_q.push_back(static_cast<Index>(in.cu_seqlens_q.back() + in.query_lens.back()));
    in.cu_seqlens_k.push_back(static_cast<Index>(in.cu_seqlens_k.back() + in.seq_lens.back()));
    in.max_seqlen_q = std::max(in.max_seqlen_q, in.query_lens.back());
    in.max_seqlen_k = std::max(in.max_seqlen_k, in.seq_lens.back());
    in.completes.push_back(completes ? 1 : 0);
    const auto& toks = item_tokens[c.item];
    const block_row<std::int32_t> row{in.tables.row(q), bs};
    for (std::size_t t = 0; t < c.length; ++t) {
      const T tok = toks[c.start + t];
      if (!detail::fits<Token>(tok)) {
        detail::fail(name(q), ": token ", c.start + t, " = ", tok, " does not fit the token type");
      }
      const std::size_t pos = c.context + t;
      in.tokens.push_back(static_cast<Token>(tok));
      in.positions.push_back(static_cast<Index>(pos));
      in.token_seq_id.push_back(id);
      in.logits.push_back(completes && t + 1 == c.length ? 1 : 0);
      in.slot_mapping.push_back(row.slot(pos));
    }
  }
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
                  " rows for ", sched.n_items(), " items");
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
    const span<const std::int32_t> row = tables.blocks(c.item);
    rows.emplace_back(row.begin(), row.end());
    out.seq_item.push_back(c.item);
  }
  const auto plan = first_fit_decreasing(lengths, capacity);
  out.layout =
      make_layout<Token, Index>(plan, span<const T>(flat), span<const long long>(context), opt);
  out.tables = make_block_tables(rows, tables.block_size);
  out.slots = make_slot_mapping(out.layout, out.tables.view(), n_blocks, tables.block_size);
  return out;
}

PREPACK_NAMESPACE_END
