// prepack/engines/sglang.hpp - one step in SGLang's own form (SGLang 0.5): the fields of its
// ForwardBatch for an extend (prefill), decode or mixed batch, as ForwardBatch.init_new fills
// them (python/sglang/srt/model_executor/forward_batch_info.py), with the rows of its
// ReqToTokenPool.req_to_token (python/sglang/srt/mem_cache/memory_pool.py) the batch reads:
//
//  seq_order           [bs]          the step's sequence at each position: extends first, then
//                                    decodes, as ScheduleBatch.mix_with_running appends the
//                                    running decodes after the new extends
//                                    (python/sglang/srt/managers/schedule_batch.py)
//  req_pool_indices    [bs] int64    row of each request in req_to_token
//  seq_lens            [bs] int64    prefix + extend: every token the request's cache holds after
//                                    the pass
//  out_cache_loc       [num_tokens] int64  the KV-pool location of each new token
//  positions           [num_tokens] int64  arange(prefix_len, prefix_len + extend_len) per
//                                    request (seq_len - 1 for a decode)
//  extend_prefix_lens  [bs] int32    tokens already cached (SGLang's prefix: a radix-cache hit or
//                                    earlier chunks)
//  extend_seq_lens     [bs] int32    new tokens
//  extend_start_loc    [bs] int32    exclusive prefix sums of extend_seq_lens
//                      (the extend_* fields and extend_num_tokens only for EXTEND and MIXED:
//                      init_new leaves them None for DECODE)
//  req_to_token        [bs][width] int32  the rows the batch reads, compact: row r holds what
//                                    ReqToTokenPool.req_to_token[req_pool_indices[r]][p] holds
//                                    (the location of position p, for p < seq_lens[r]; 0 past it)
// SGLang's own table is the pool's [pool_size][max_context_len], a request's row kept across
// steps and indexed by req_pool_indices: write_req_to_token writes a step into it as SGLang does
// before the forward pass (python/sglang/srt/mem_cache/common.py, write_req_to_token_pool_triton:
// an extend's prefix [0, prefix_len) and its new tokens [prefix_len, seq_len) from
// out_cache_loc; ScheduleBatch.prepare_for_decode: a decode's one new position).
// SGLang's pool is token-granular (page size 1: a location is a token's slot); with prepack's
// block tables a location is block * block_size + position % block_size, which is SGLang's paged
// allocator's location for page size block_size. SGLang's allocators hand out from 1 (location 0
// takes the padded tokens' writes: TokenToKVPoolAllocator, PagedTokenToKVPoolAllocator), so a
// table holding block 0 is refused (reserve it: block_allocator(n, true),
// scheduler_options::null_block); so is an empty step. Cost: O(tokens + sum of seq_lens) (the
// rows are per token, as SGLang's are). Standard library only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "../detail/checked.hpp"
#include "../error.hpp"
#include "../paged.hpp"
#include "../span.hpp"
#include "../step.hpp"

PREPACK_NAMESPACE_BEGIN
namespace sglang {

/// SGLang's ForwardMode of a batch.
enum class forward_mode { extend, decode, mixed };

/// The batch as ForwardBatch holds it, and the req_to_token rows it reads.
struct forward_batch {
  forward_mode mode = forward_mode::extend;
  std::vector<std::size_t> seq_order;  // [bs]  the step's sequence at each position
  std::int64_t batch_size = 0;
  std::vector<std::int64_t> rids;              // [bs]  the caller's ids
  std::vector<std::int64_t> input_ids;         // [num_tokens]
  std::vector<std::int64_t> req_pool_indices;  // [bs]
  std::vector<std::int64_t> seq_lens;          // [bs]
  std::int64_t seq_lens_sum = 0;
  std::vector<std::int64_t> out_cache_loc;                      // [num_tokens]
  std::vector<std::int64_t> positions;                          // [num_tokens]
  std::optional<std::int64_t> extend_num_tokens;                // EXTEND, MIXED only
  std::optional<std::vector<std::int32_t>> extend_prefix_lens;  // [bs]
  std::optional<std::vector<std::int32_t>> extend_seq_lens;     // [bs]
  std::optional<std::vector<std::int32_t>> extend_start_loc;    // [bs]
  std::size_t req_to_token_width = 0;                           // positions per row
  std::vector<std::int32_t> req_to_token;                       // [bs][req_to_token_width]
};

/// The step in SGLang's form. Request r is the step's sequence seq_order[r] (extends first); its
/// req_to_token row is req_pool_indices[r] (default: r; give the pool rows of your
/// ReqToTokenPool, in that order). Throws prepack::error for an empty step, block 0 in a table,
/// a row count that differs from the step's, a location that does not fit int32, or a width
/// below the longest seq_len. Cost: O(tokens + sum of seq_lens).
template <class Token, class Index>
forward_batch make_forward_batch(const step_inputs<Token, Index>& in,
                                 span<const std::int64_t> req_pool_indices = {},
                                 std::size_t req_to_token_width = 0) {
  using prepack::detail::narrow;
  using prepack::detail::require;
  const std::size_t n = in.n_seqs(), bs = in.tables.block_size;
  require(n > 0, "sglang: a step with no requests");
  require(req_pool_indices.empty() || req_pool_indices.size() == n,
          "sglang: ", req_pool_indices.size(), " req_pool_indices for ", n, " requests");
  forward_batch f;
  f.batch_size = static_cast<std::int64_t>(n);
  std::size_t widest = 0;
  bool any_decode = false, any_extend = false;
  for (std::size_t q = 0; q < n; ++q) {
    widest = std::max(widest, static_cast<std::size_t>(in.seq_lens[q]));
    (in.decodes[q] ? any_decode : any_extend) = true;
    const auto row = in.tables.blocks(q);
    for (std::size_t k = 0; k < row.size(); ++k) {
      if (row[k] == 0) {
        prepack::detail::fail("sglang: request ", in.seq_id[q], ": block_table[", k,
                              "] = 0 holds location 0, where SGLang writes padded tokens "
                              "(reserve it: block_allocator(n, true), "
                              "scheduler_options::null_block)");
      }
    }
  }
  f.mode = any_decode && any_extend ? forward_mode::mixed
           : any_decode             ? forward_mode::decode
                                    : forward_mode::extend;
  for (const bool decode : {false, true}) {  // extends first, then decodes
    for (std::size_t q = 0; q < n; ++q) {
      if ((in.decodes[q] != 0) == decode) f.seq_order.push_back(q);
    }
  }
  if (req_to_token_width > 0) {
    require(req_to_token_width >= widest, "sglang: req_to_token width ", req_to_token_width,
            " is below a request's ", widest, " tokens");
    widest = req_to_token_width;
  }
  f.req_to_token_width = widest;
  f.req_to_token.assign(prepack::detail::mul(n, widest, "req_to_token"), 0);
  const bool extend = f.mode != forward_mode::decode;
  if (extend) {
    f.extend_prefix_lens.emplace();
    f.extend_seq_lens.emplace();
    f.extend_start_loc.emplace();
    f.extend_num_tokens = static_cast<std::int64_t>(in.n_tokens());
  }
  std::int32_t start = 0;
  for (std::size_t r = 0; r < n; ++r) {
    const std::size_t q = f.seq_order[r];
    const auto seq_len = static_cast<std::size_t>(in.seq_lens[q]);
    const block_row<std::int32_t> row{in.tables.blocks(q), bs};
    for (std::size_t p = 0; p < seq_len; ++p) {
      f.req_to_token[r * widest + p] = narrow<std::int32_t>(row.slot(p), "token location");
    }
    f.rids.push_back(in.seq_id[q]);
    f.req_pool_indices.push_back(req_pool_indices.empty() ? static_cast<std::int64_t>(r)
                                                          : req_pool_indices[r]);
    f.seq_lens.push_back(static_cast<std::int64_t>(seq_len));
    f.seq_lens_sum += static_cast<std::int64_t>(seq_len);
    if (extend) {
      f.extend_prefix_lens->push_back(
          narrow<std::int32_t>(in.context_lens[q], "extend_prefix_lens"));
      f.extend_seq_lens->push_back(narrow<std::int32_t>(in.query_lens[q], "extend_seq_lens"));
      f.extend_start_loc->push_back(start);
      start += f.extend_seq_lens->back();
    }
    const auto t0 = static_cast<std::size_t>(in.cu_seqlens_q[q]);
    const auto t1 = static_cast<std::size_t>(in.cu_seqlens_q[q + 1]);
    for (std::size_t t = t0; t < t1; ++t) {
      f.input_ids.push_back(static_cast<std::int64_t>(in.tokens[t]));
      f.positions.push_back(static_cast<std::int64_t>(in.positions[t]));
      f.out_cache_loc.push_back(in.slot_mapping[t]);
    }
  }
  return f;
}

/// Writes a step's token locations into SGLang's ReqToTokenPool.req_to_token, a row-major int32
/// table [pool_size][max_context_len], as SGLang does before the forward pass: request r (the
/// step's sequence seq_order[r]) in row req_pool_indices[r]; an extend its positions
/// [0, seq_len), the cached prefix and the new tokens (python/sglang/srt/mem_cache/common.py,
/// write_req_to_token_pool_triton: prefix_indices into [0, pre_len), out_cache_loc into
/// [pre_len, seq_len)); a decode its one new position (ScheduleBatch.prepare_for_decode). Other
/// entries are left as they are. Throws prepack::error, writing nothing, for a table of another
/// size, a row outside [0, pool_size) or given to two requests, a request longer than
/// max_context_len, or a location that does not fit int32. Cost: O(step tokens + extends'
/// prefixes + bs log bs); nothing in the pool's size.
template <class Token, class Index>
void write_req_to_token(const step_inputs<Token, Index>& in, span<const std::size_t> seq_order,
                        span<const std::int64_t> req_pool_indices, span<std::int32_t> table,
                        std::size_t pool_size, std::size_t max_context_len) {
  using prepack::detail::require;
  const std::size_t n = in.n_seqs(), bs = in.tables.block_size;
  require(seq_order.size() == n && req_pool_indices.size() == n, "sglang: ", seq_order.size(),
          " seq_order entries and ", req_pool_indices.size(), " req_pool_indices for ", n,
          " requests");
  require(table.size() / (max_context_len > 0 ? max_context_len : 1) == pool_size &&
              table.size() % (max_context_len > 0 ? max_context_len : 1) == 0 &&
              max_context_len > 0,
          "sglang: req_to_token holds ", table.size(), " entries, not ", pool_size, " x ",
          max_context_len);
  std::vector<std::pair<std::int64_t, std::size_t>> rows(n);
  std::vector<bool> seen(n, false);
  for (std::size_t r = 0; r < n; ++r) {
    const std::size_t q = seq_order[r];
    require(q < n && !seen[q], "sglang: seq_order[", r, "] = ", q,
            " is not a permutation of the step's ", n, " sequences");
    seen[q] = true;
    const std::int64_t row = req_pool_indices[r];
    if (row < 0 || static_cast<std::uint64_t>(row) >= pool_size) {
      prepack::detail::fail("sglang: request ", in.seq_id[q], ": req_pool_indices[", r, "] = ", row,
                            " outside the pool's rows 0..", pool_size - 1);
    }
    if (static_cast<std::size_t>(in.seq_lens[q]) > max_context_len) {
      prepack::detail::fail("sglang: request ", in.seq_id[q], ": ", in.seq_lens[q],
                            " tokens exceed max_context_len ", max_context_len);
    }
    const auto blocks = in.tables.blocks(q);
    const std::size_t used = (static_cast<std::size_t>(in.seq_lens[q]) + bs - 1) / bs;
    for (std::size_t k = 0; k < used && k < blocks.size(); ++k) {
      const auto last = static_cast<std::uint64_t>(blocks[k]) * bs + (bs - 1);
      if (blocks[k] < 0 ||
          last > static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max())) {
        prepack::detail::fail("sglang: request ", in.seq_id[q], ": block_table[", k,
                              "] = ", blocks[k], " gives locations that do not fit int32");
      }
    }
    rows[r] = {row, r};
  }
  std::sort(rows.begin(), rows.end());
  for (std::size_t i = 1; i < n; ++i) {
    if (rows[i].first == rows[i - 1].first) {
      prepack::detail::fail("sglang: requests ", in.seq_id[seq_order[rows[i - 1].second]], " and ",
                            in.seq_id[seq_order[rows[i].second]], " share req_to_token row ",
                            rows[i].first);
    }
  }
  for (std::size_t r = 0; r < n; ++r) {  // checked: every write below is in bounds
    const std::size_t q = seq_order[r];
    const block_row<std::int32_t> blocks{in.tables.blocks(q), bs};
    const auto row = static_cast<std::size_t>(req_pool_indices[r]);
    std::int32_t* out = table.data() + row * max_context_len;
    const auto prefix = static_cast<std::size_t>(in.context_lens[q]);
    const auto end = static_cast<std::size_t>(in.seq_lens[q]);
    for (std::size_t p = in.decodes[q] ? prefix : 0; p < end; ++p) {
      out[p] = static_cast<std::int32_t>(blocks.slot(p));  // checked above to fit
    }
  }
}

/// write_req_to_token for a forward_batch of the same step (its seq_order and req_pool_indices).
template <class Token, class Index>
void write_req_to_token(const step_inputs<Token, Index>& in, const forward_batch& f,
                        span<std::int32_t> table, std::size_t pool_size,
                        std::size_t max_context_len) {
  write_req_to_token(in, span<const std::size_t>(f.seq_order),
                     span<const std::int64_t>(f.req_pool_indices), table, pool_size,
                     max_context_len);
}

}  // namespace sglang
PREPACK_NAMESPACE_END
