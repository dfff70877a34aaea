// prepack/reference/batch.hpp - what the reference model's forward pass sees of a batch, and the
// adapters that build it from prepack's batch forms, each checking its input against the model's
// config and the paged pool before anything is computed or written:
//
//  rows_batch      the slots of a rectangular batch (a packed or padded layout, raw masked rows)
//  step_batch      a step over a paged pool (step_inputs): every sequence's context read through
//                  its block table, its new K and V written through the slot mapping
//  rows_step_batch a step laid out as rows (step_layout)
//
// The pool checks cost one test per block a sequence's context occupies (the pool records, per
// block, the position of its first slot and how many slots are filled) plus one per new token,
// and a sort of the blocks the step touches; messages are built only when a check fails.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../layout.hpp"
#include "../paged.hpp"
#include "../span.hpp"
#include "../step.hpp"
#include "attention.hpp"
#include "kv_pool.hpp"
#include "weights.hpp"

PREPACK_NAMESPACE_BEGIN
namespace reference {
namespace detail {

/// Positions a forward pass accepts: 0 .. 2^24.
constexpr long long max_position = 1 << 24;

// Where a forward pass writes K and V and attention reads them: per layer [n_slots][kv_dim].
struct kv_store {
  float* keys = nullptr;
  float* values = nullptr;
  std::size_t layer_stride = 0;  // elements between layers
  std::size_t n_slots = 0;
  std::size_t bytes = 0;  // for the memory report

  float* layer_keys(int layer) const noexcept {
    return keys + static_cast<std::size_t>(layer) * layer_stride;
  }
  float* layer_values(int layer) const noexcept {
    return values + static_cast<std::size_t>(layer) * layer_stride;
  }
};

// What the forward pass sees of a batch: token rows, where each row's K and V go, and the
// sequences whose queries attend. It knows nothing of prompts, plans or schedules.
struct batch {
  std::vector<std::int32_t> token;   // [n]  token id of each row
  std::vector<std::int64_t> pos;     // [n]  position of each row
  std::vector<std::int64_t> slot;    // [n]  store slot of the row's K and V; -1: not written
  std::vector<key_run> runs;         // key runs of every sequence
  std::vector<attention_task> seqs;  // one per sequence: queries [0, q_len) of q_row on
  std::vector<std::size_t> outputs;  // rows whose logits are wanted, in output order
  std::vector<std::size_t> idle;     // rows no sequence covers (pad slots): attention gives 0
  std::size_t mask_bytes = 0;        // the dense mask's size, for the memory report

  std::size_t n() const noexcept { return token.size(); }
  std::int64_t max_pos() const noexcept {
    std::int64_t top = 0;
    for (std::int64_t p : pos) top = std::max(top, p);
    return top;
  }
  // A sequence whose queries are rows [q_row, q_row + q_len), after `context` cached keys, with
  // its keys in `keys` (runs in position order) or, for a dense row, a [q_len][n_keys] mask.
  void add_sequence(std::int64_t q_row, std::int64_t q_len, std::int64_t context,
                    std::int64_t n_keys, const std::vector<key_run>& keys,
                    const float* mask = nullptr) {
    attention_task t;
    t.q_row = q_row;
    t.first = 0;
    t.last = q_len;
    t.context = context;
    t.n_keys = n_keys;
    t.runs_begin = runs.size();
    runs.insert(runs.end(), keys.begin(), keys.end());
    t.runs_end = runs.size();
    t.mask = mask;
    seqs.push_back(t);
  }
};

// Runs of the pool slots holding positions [0, n_keys) of a sequence with these blocks;
// adjacent blocks merge into one run.
inline std::vector<key_run> block_runs(span<const std::int32_t> blocks, std::size_t block_size,
                                       std::size_t n_keys) {
  const block_row<std::int32_t> row{blocks, block_size};
  std::vector<key_run> out;
  for (std::size_t p = 0; p < n_keys; p += block_size) {
    const std::int64_t first = row.slot(p);
    const auto count = static_cast<std::int64_t>(std::min(block_size, n_keys - p));
    if (!out.empty() && out.back().slot + out.back().count == first) {
      out.back().count += count;
    } else {
      out.push_back({first, count});
    }
  }
  return out;
}

// Token rows of a rectangular batch; tokens checked against the vocabulary, positions range.
// segments (optional) marks pad slots (-1): their token must still be an id, their position is
// never used.
template <class Token, class Index>
batch rows_batch(const config& c, std::size_t n, span<const Token> tokens,
                 span<const Index> positions, span<const Index> segments) {
  batch b;
  b.token.resize(n);
  b.pos.resize(n);
  b.slot.assign(n, -1);
  for (std::size_t s = 0; s < n; ++s) {
    const auto tok = static_cast<long long>(tokens[s]);
    const bool pad = !segments.empty() && segments[s] < 0;
    if (tok < 0 || tok >= c.vocab) {
      if (!pad && !segments.empty()) {
        prepack::detail::fail("prompt ", segments[s], ": token ", positions[s], " = ", tok,
                              " outside vocab ", c.vocab);
      }
      prepack::detail::fail(pad ? "pad slot " : "slot ", s, ": token ", tok, " outside vocab ",
                            c.vocab);
    }
    const auto pos = static_cast<long long>(positions[s]);
    if (!pad && (pos < 0 || pos > max_position)) {
      prepack::detail::fail("slot ", s, ": position ", pos, " outside 0..", max_position);
    }
    b.token[s] = static_cast<std::int32_t>(tok);
    b.pos[s] = pad ? 0 : pos;  // a pad slot's position is never used; 0 keeps RoPE in range
  }
  return b;
}

// Dense rows: every row a sequence of `width` queries over the row's keys, under its mask.
inline void add_rows(batch& b, std::size_t n_rows, std::size_t width, const float* mask) {
  const auto w = static_cast<std::int64_t>(width);
  for (std::size_t r = 0; r < n_rows; ++r) {
    const auto first = static_cast<std::int64_t>(r) * w;
    b.add_sequence(first, w, 0, w, {{first, w}}, mask + static_cast<std::size_t>(first) * width);
  }
  b.mask_bytes = n_rows * width * width * sizeof(float);
}

// Rows no sequence covers (pad slots) are marked idle: their attention output is zero.
inline void mark_idle(batch& b) {
  std::vector<unsigned char> covered(b.n(), 0);
  for (const auto& t : b.seqs) {
    std::fill(covered.begin() + t.q_row, covered.begin() + t.q_row + t.last, 1);
  }
  for (std::size_t r = 0; r < covered.size(); ++r) {
    if (!covered[r]) b.idle.push_back(r);
  }
}

// Checks one sequence of a step against the pool: its block table covers context + query with
// blocks of the pool, its context is cached there (one test per block), and each new token's
// position is context + i and its slot where the table puts that position. Adds the blocks it
// reads and writes to `uses`. `name()` names the sequence (called only on failure).
template <class Name>
void check_pool_sequence(const kv_pool& pool, span<const std::int32_t> row, std::size_t context,
                         std::size_t q_len, const std::int64_t* slots, const std::int64_t* pos,
                         std::size_t seq, std::vector<prepack::detail::block_use>& uses,
                         Name&& name) {
  const std::size_t bs = pool.block_size();
  prepack::detail::check_row(row, context + q_len, bs, pool.n_blocks(), name);
  const block_row<std::int32_t> r{row, bs};
  for (std::size_t p = 0; p < context; p += bs) {
    const auto b = static_cast<std::size_t>(r.block(p));
    const std::size_t count = std::min(bs, context - p);
    if (!pool.holds(b, static_cast<std::int64_t>(p), count)) {
      const std::int64_t first = pool.first_position(b);
      prepack::detail::fail(
          name(), ": context positions ", p, "..", p + count - 1, " are not cached (block ", b,
          " holds ",
          first < 0 ? std::string("nothing")
                    : std::to_string(pool.filled(b)) + " positions from " + std::to_string(first),
          ")");
    }
  }
  for (std::size_t i = 0; i < q_len; ++i) {
    if (pos[i] != static_cast<std::int64_t>(context + i)) {
      prepack::detail::fail(name(), ": token ", i, " has position ", pos[i], ", expected ",
                            context + i);
    }
    const std::int64_t want = r.slot(context + i);
    if (slots[i] != want) {
      prepack::detail::fail(name(), ": token ", i, " maps to slot ", slots[i],
                            " but its block table puts position ", context + i, " at slot ", want);
    }
  }
  prepack::detail::add_block_uses(
      uses, [&](std::size_t k) { return row[k]; }, context, q_len, bs, seq);
}

// The batch of a step over a paged pool (see model::forward).
template <class Token, class Index>
batch step_batch(const config& c, const step_inputs<Token, Index>& in, const kv_pool& pool) {
  using prepack::detail::require;
  const std::size_t n = in.tokens.size(), n_seqs = in.query_lens.size();
  require(n > 0 && n_seqs > 0, "step: no tokens");
  require(in.positions.size() == n && in.slot_mapping.size() == n && in.logits.size() == n,
          "step: ", n, " tokens but ", in.positions.size(), " positions, ", in.slot_mapping.size(),
          " slots, ", in.logits.size(), " logits flags");
  require(in.context_lens.size() == n_seqs && in.cu_seqlens_q.size() == n_seqs + 1 &&
              in.tables.n_seqs() >= n_seqs && (in.seq_id.empty() || in.seq_id.size() == n_seqs),
          "step: per-sequence arrays disagree with ", n_seqs, " sequences");
  require(in.cu_seqlens_q.front() == 0 && static_cast<std::size_t>(in.cu_seqlens_q.back()) == n,
          "step: cu_seqlens_q does not delimit ", n, " tokens");
  require(in.tables.block_size == pool.block_size() && in.n_blocks == pool.n_blocks(),
          "step: block size ", in.tables.block_size, " and ", in.n_blocks, " blocks, the pool has ",
          pool.block_size(), " and ", pool.n_blocks());
  batch b;
  b.token.resize(n);
  b.pos.resize(n);
  b.slot.assign(in.slot_mapping.begin(), in.slot_mapping.end());
  for (std::size_t t = 0; t < n; ++t) {
    const auto tok = static_cast<long long>(in.tokens[t]);
    require(tok >= 0 && tok < c.vocab, "token ", t, ": id ", tok, " outside vocab ", c.vocab);
    b.token[t] = static_cast<std::int32_t>(tok);
    b.pos[t] = static_cast<std::int64_t>(in.positions[t]);
    require(b.pos[t] >= 0 && b.pos[t] <= max_position, "token ", t, ": position ", b.pos[t],
            " outside 0..", max_position);
  }
  std::vector<prepack::detail::block_use> uses;
  const auto name = [&](std::size_t q) {
    return "sequence " + std::to_string(in.seq_id.empty() ? static_cast<long long>(q)
                                                          : static_cast<long long>(in.seq_id[q]));
  };
  for (std::size_t q = 0; q < n_seqs; ++q) {
    const auto q0 = static_cast<std::size_t>(in.cu_seqlens_q[q]);
    const auto q1 = static_cast<std::size_t>(in.cu_seqlens_q[q + 1]);
    require(in.cu_seqlens_q[q] >= 0 && q0 < q1 && q1 <= n &&
                static_cast<long long>(q1 - q0) == static_cast<long long>(in.query_lens[q]),
            "step: sequence ", q, ": cu_seqlens_q disagree with query_lens");
    require(in.context_lens[q] >= 0, "step: sequence ", q, ": context ", in.context_lens[q]);
    const auto ctx = static_cast<std::size_t>(in.context_lens[q]);
    const span<const std::int32_t> row = in.tables.row(q);
    check_pool_sequence(pool, row, ctx, q1 - q0, b.slot.data() + q0, b.pos.data() + q0, q, uses,
                        [&] { return name(q); });
    const std::size_t keys = ctx + (q1 - q0);
    b.add_sequence(static_cast<std::int64_t>(q0), static_cast<std::int64_t>(q1 - q0),
                   static_cast<std::int64_t>(ctx), static_cast<std::int64_t>(keys),
                   block_runs(row, pool.block_size(), keys));
  }
  prepack::detail::check_block_uses(uses, name);
  for (std::size_t t = 0; t < n; ++t) {
    if (in.logits[t]) b.outputs.push_back(t);
  }
  return b;
}

// The batch of a step laid out as rows (see model::forward).
template <class Token, class Index>
batch rows_step_batch(const config& c, const step_layout<Token, Index>& s, const kv_pool& pool) {
  using prepack::detail::require;
  const auto& l = s.layout;
  require(!l.empty(), "step layout: empty");
  require(s.slots.slots().size() == l.n_slots() && s.tables.n_seqs() >= l.n_prompts(),
          "step layout: slot mapping or block tables disagree with the layout");
  require(s.tables.block_size == pool.block_size() && s.slots.n_blocks() == pool.n_blocks(),
          "step layout: block size ", s.tables.block_size, " and ", s.slots.n_blocks(),
          " blocks, the pool has ", pool.block_size(), " and ", pool.n_blocks());
  batch b = rows_batch(c, l.n_slots(), l.tokens(), l.positions(), l.segments());
  b.slot.assign(s.slots.slots().begin(), s.slots.slots().end());
  std::vector<prepack::detail::block_use> uses;
  const auto name = [](std::size_t i) { return "sequence " + std::to_string(i); };
  for (std::size_t i = 0; i < l.n_prompts(); ++i) {
    const std::size_t first = l.first_slot(i);
    const auto ctx = static_cast<std::size_t>(l.prompt_context()[i]);
    const auto len = static_cast<std::size_t>(l.prompt_length()[i]);
    const span<const std::int32_t> row = s.tables.row(i);
    check_pool_sequence(pool, row, ctx, len, b.slot.data() + first, b.pos.data() + first, i, uses,
                        [&] { return name(i); });
    b.add_sequence(static_cast<std::int64_t>(first), static_cast<std::int64_t>(len),
                   static_cast<std::int64_t>(ctx), static_cast<std::int64_t>(ctx + len),
                   block_runs(row, pool.block_size(), ctx + len));
    b.outputs.push_back(static_cast<std::size_t>(l.last_token()[i]));
  }
  prepack::detail::check_block_uses(uses, name);
  mark_idle(b);
  return b;
}

}  // namespace detail
}  // namespace reference
PREPACK_NAMESPACE_END
