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
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "detail/checked.hpp"
#include "error.hpp"
#include "layout.hpp"
#include "paged.hpp"
#include "plan.hpp"
#include "schedule.hpp"
#include "slots.hpp"
#include "span.hpp"

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
  std::vector<std::uint8_t> decodes;    // [n_seqs]    1 if it feeds back a generated token (a
                                        //             decode: TensorRT-LLM's generation request)
  std::vector<Index> prompt_lens;       // [n_seqs]    tokens of the sequence's prompt (vLLM's
                                        //             num_prompt_tokens): a schedule item's
                                        //             context + length; a serving request's
                                        //             prompt alone, however much it has
                                        //             generated (recomputed after preemption it
                                        //             prefills past prompt_lens)
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

/// Builds the inputs of one step, sequence by sequence: what make_step_inputs, make_decode_inputs
/// and the serving scheduler share. Every sequence is checked as it is added (its row covers its
/// positions with blocks of the pool, every value fits Token / Index), and finish() checks the
/// blocks the step touches together (none listed twice by a sequence, written by two, or read as
/// context while another writes it). Cost: O(tokens + blocks) per sequence, O(b log b) in finish.
template <class Token = std::int32_t, class Index = std::int32_t>
class step_builder {
 public:
  /// `name(q)` names sequence q in messages (called only on failure). With writes_before_reads,
  /// a sequence may read as cached context a block another one writes in the same step: safe on
  /// engines that write every token's K and V of a layer before any attention reads them (vLLM:
  /// do_kv_cache_update before forward; FlashInfer: append_paged_kv_cache, then attention;
  /// SGLang: set_kv_buffer, then attention), where a prefix-cache hit on a block computed in the
  /// same step is scheduled; refused otherwise (prepack's reference model reads its pool before
  /// the step's writes land).
  step_builder(std::size_t block_size, std::size_t n_blocks,
               std::function<std::string(std::size_t)> name, bool writes_before_reads = false)
      : bs_(block_size), name_(std::move(name)), writes_before_reads_(writes_before_reads) {
    detail::require(block_size > 0, "block tables: block size 0");
    detail::require(n_blocks > 0, "paged pool: the pool has no blocks");
    in_.n_blocks = n_blocks;
    in_.cu_seqlens_q.push_back(0);
    in_.cu_seqlens_k.push_back(0);
  }

  /// Adds sequence q = n_seqs() (item `item`, caller id `id`): tokens [0, n) computed at
  /// positions context .. context + n - 1, its blocks `row` (position p in row[p / block_size]),
  /// `completes` (its last token's logits are wanted), `decode`, and the length of the prompt
  /// it computes. Throws prepack::error, adding nothing, for what the class comment lists.
  template <class T>
  void add(std::size_t item, std::int64_t id, std::size_t context, span<const T> tokens,
           span<const std::int32_t> row, bool completes, bool decode, std::size_t prompt_len) {
    const std::size_t q = in_.seq_item.size();
    const auto who = [&] { return name_(q); };
    detail::require(!tokens.empty(), who(), ": no tokens to compute");
    if (context > std::numeric_limits<std::size_t>::max() - tokens.size()) {
      detail::fail(who(), ": context ", context, " + ", tokens.size(), " tokens overflows size_t");
    }
    const std::size_t end = context + tokens.size();
    if (!detail::fits<Index>(end)) {
      detail::fail(who(), ": context ", context, " + ", tokens.size(), " tokens = ", end,
                   " positions do not fit the ", detail::type_name<Index>(), " index type");
    }
    if (!detail::fits<Index>(prompt_len)) {
      detail::fail(who(), ": prompt length ", prompt_len, " does not fit the ",
                   detail::type_name<Index>(), " index type");
    }
    detail::check_row(row, end, bs_, in_.n_blocks, who);
    for (std::size_t t = 0; t < tokens.size(); ++t) {
      if (!detail::fits<Token>(tokens[t])) {
        detail::fail(who(), ": token ", t, " = ", tokens[t], " does not fit the token type");
      }
    }
    const std::size_t total_q = detail::add(n_tokens_, tokens.size(), "step tokens");
    const std::size_t total_k = detail::add(n_keys_, end, "step keys");
    detail::narrow<Index>(total_q, "cu_seqlens_q total");
    detail::narrow<Index>(total_k, "cu_seqlens_k total");
    // Checked: nothing below throws but for a failed allocation.
    detail::add_block_uses(
        uses_, [&](std::size_t k) { return row[k]; }, context, tokens.size(), bs_, q);
    n_tokens_ = total_q;
    n_keys_ = total_k;
    rows_.emplace_back(row.begin(), row.end());
    in_.seq_item.push_back(item);
    in_.seq_id.push_back(id);
    in_.context_lens.push_back(static_cast<Index>(context));
    in_.query_lens.push_back(static_cast<Index>(tokens.size()));
    in_.seq_lens.push_back(static_cast<Index>(end));
    in_.cu_seqlens_q.push_back(static_cast<Index>(total_q));
    in_.cu_seqlens_k.push_back(static_cast<Index>(total_k));
    in_.max_seqlen_q = std::max(in_.max_seqlen_q, static_cast<Index>(tokens.size()));
    in_.max_seqlen_k = std::max(in_.max_seqlen_k, static_cast<Index>(end));
    in_.completes.push_back(completes ? 1 : 0);
    in_.decodes.push_back(decode ? 1 : 0);
    in_.prompt_lens.push_back(static_cast<Index>(prompt_len));
    // Per token: each array grown once, then written in one plain loop.
    const std::size_t n = tokens.size(), at = in_.tokens.size();
    in_.tokens.resize(at + n);
    in_.positions.resize(at + n);
    in_.token_seq_id.resize(at + n, id);
    in_.logits.resize(at + n, 0);
    in_.slot_mapping.resize(at + n);
    const block_row<std::int32_t> r{row, bs_};
    for (std::size_t t = 0; t < n; ++t) {
      const std::size_t pos = context + t;
      in_.tokens[at + t] = static_cast<Token>(tokens[t]);
      in_.positions[at + t] = static_cast<Index>(pos);
      in_.slot_mapping[at + t] = r.slot(pos);
    }
    if (completes) in_.logits[at + n - 1] = 1;
  }

  std::size_t n_seqs() const noexcept { return in_.seq_item.size(); }
  std::size_t n_tokens() const noexcept { return n_tokens_; }

  /// Room for `seqs` sequences of `tokens` tokens in all, so adding them allocates nothing more
  /// (a hint: adding more still works).
  void reserve(std::size_t seqs, std::size_t tokens) {
    in_.seq_item.reserve(seqs);
    in_.seq_id.reserve(seqs);
    for (auto* v : {&in_.context_lens, &in_.query_lens, &in_.seq_lens, &in_.prompt_lens}) {
      v->reserve(seqs);
    }
    in_.cu_seqlens_q.reserve(seqs + 1);
    in_.cu_seqlens_k.reserve(seqs + 1);
    in_.completes.reserve(seqs);
    in_.decodes.reserve(seqs);
    rows_.reserve(seqs);
    in_.tokens.reserve(tokens);
    in_.positions.reserve(tokens);
    in_.token_seq_id.reserve(tokens);
    in_.logits.reserve(tokens);
    in_.slot_mapping.reserve(tokens);
  }

  /// The step: throws prepack::error for a block used unsafely (see the class comment).
  step_inputs<Token, Index> finish() && {
    detail::check_block_uses(uses_, name_, writes_before_reads_);
    in_.tables = make_block_tables(rows_, bs_);
    return std::move(in_);
  }

 private:
  std::size_t bs_ = 0;
  std::function<std::string(std::size_t)> name_;
  bool writes_before_reads_ = false;
  step_inputs<Token, Index> in_;
  std::vector<std::vector<std::int32_t>> rows_;
  std::vector<detail::block_use> uses_;
  std::size_t n_tokens_ = 0, n_keys_ = 0;
};

/// Options for make_step_inputs.
struct step_options {
  /// The caller's id of each item (a request id, a llama_seq_id); default: a prompt's item its
  /// prompt's index, a shared prefix's item -1 - its index (apart from every prompt's id).
  span<const std::int64_t> seq_ids;
  /// Let a sequence read as context a block another one writes in this step (see step_builder:
  /// engines that write a layer's K and V before attention reads them, vLLM among them).
  bool writes_before_reads = false;
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
  detail::check_step(sched, s, item_tokens);
  detail::require(tables.n_seqs() >= sched.n_items(), "block tables: ", tables.n_seqs(),
                  " rows for ", sched.n_items(), " items");
  detail::require(opt.seq_ids.empty() || opt.seq_ids.size() == sched.n_items(),
                  "sequence ids: ", opt.seq_ids.size(), " for ", sched.n_items(), " items");
  const span<const chunk> chunks = sched.step(s);
  step_builder<Token, Index> b(
      tables.block_size, n_blocks,
      [&](std::size_t q) { return item_name(sched.items[chunks[q].item], chunks[q].item); },
      opt.writes_before_reads);
  std::size_t n_tokens = 0;
  for (const chunk& c : chunks) n_tokens += c.length;  // checked against the items above
  b.reserve(chunks.size(), n_tokens);
  for (const chunk& c : chunks) {
    const schedule_item& it = sched.items[c.item];
    const std::int64_t id = !opt.seq_ids.empty() ? opt.seq_ids[c.item]
                            : it.prompt          ? static_cast<std::int64_t>(*it.prompt)
                                                 : -1 - static_cast<std::int64_t>(c.item);
    const auto& toks = item_tokens[c.item];
    b.add(c.item, id, c.context, span<const T>(toks.data() + c.start, c.length),
          tables.blocks(c.item), c.last && it.ends_prompt, false, it.context + it.length);
  }
  return std::move(b).finish();
}

/// One sequence of a decode step: it feeds back `token` at position `context` (the positions
/// before it cached), over its blocks.
template <class T = std::int32_t>
struct decode_sequence {
  std::int64_t id = 0;              // the caller's id (a request id, a llama_seq_id)
  T token{};                        // the token it generated last
  std::size_t context = 0;          // positions cached: the token's position
  span<const std::int32_t> blocks;  // its block table row, covering context + 1 positions
  std::size_t prompt_len = 0;       // its prompt's length (TensorRT-LLM's context length)
};

/// A decode step: every sequence one token, its logits wanted. Throws prepack::error as
/// step_builder does ("sequence <id>: ..."). Cost: O(n_seqs + blocks touched).
template <class Token = std::int32_t, class Index = std::int32_t, class T>
step_inputs<Token, Index> make_decode_inputs(span<const decode_sequence<T>> seqs,
                                             std::size_t block_size, std::size_t n_blocks) {
  step_builder<Token, Index> b(block_size, n_blocks, [&](std::size_t q) {
    return "sequence " + std::to_string(seqs[q].id);
  });
  b.reserve(seqs.size(), seqs.size());
  for (std::size_t q = 0; q < seqs.size(); ++q) {
    const auto& d = seqs[q];
    b.add(q, d.id, d.context, span<const T>(&d.token, 1), d.blocks, true, true, d.prompt_len);
  }
  return std::move(b).finish();
}
template <class Token = std::int32_t, class Index = std::int32_t, class T>
step_inputs<Token, Index> make_decode_inputs(const std::vector<decode_sequence<T>>& seqs,
                                             std::size_t block_size, std::size_t n_blocks) {
  return make_decode_inputs<Token, Index>(span<const decode_sequence<T>>(seqs), block_size,
                                          n_blocks);
}

/// One sequence of a step an engine's own scheduler decided (vLLM's SchedulerOutput, SGLang's
/// ScheduleBatch): it computes `tokens` at positions context .. context + n - 1 over its blocks.
template <class T = std::int32_t>
struct scheduled_sequence {
  std::int64_t id = 0;              // the caller's id (a request id)
  std::size_t context = 0;          // positions cached before this step (num_computed_tokens)
  span<const T> tokens;             // the tokens it computes in this step (at least one)
  span<const std::int32_t> blocks;  // its block table row, covering context + tokens positions
  std::size_t prompt_len = 0;       // its prompt's tokens (vLLM's num_prompt_tokens)
  bool completes = false;           // its last token's logits are wanted (the prompt is done)
  bool decode = false;              // it feeds back a generated token
};

/// The inputs of a step whose sequences the caller scheduled, in the caller's order (an engine
/// keeping its own scheduler and using prepack for the step's arrays and engine forms). Throws
/// prepack::error as step_builder does ("sequence <id>: ..."), writes_before_reads as there.
/// Cost: O(step tokens + b log b) for the b blocks the sequences touch.
template <class Token = std::int32_t, class Index = std::int32_t, class T>
step_inputs<Token, Index> make_sequence_inputs(span<const scheduled_sequence<T>> seqs,
                                               std::size_t block_size, std::size_t n_blocks,
                                               bool writes_before_reads = false) {
  step_builder<Token, Index> b(
      block_size, n_blocks, [&](std::size_t q) { return "sequence " + std::to_string(seqs[q].id); },
      writes_before_reads);
  std::size_t n_tokens = 0;
  for (const auto& s : seqs) n_tokens += s.tokens.size();  // a hint: add checks each
  b.reserve(seqs.size(), n_tokens);
  for (std::size_t q = 0; q < seqs.size(); ++q) {
    const auto& s = seqs[q];
    b.add(q, s.id, s.context, s.tokens, s.blocks, s.completes, s.decode, s.prompt_len);
  }
  return std::move(b).finish();
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
