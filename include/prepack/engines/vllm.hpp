// prepack/engines/vllm.hpp - one step in vLLM's own form (the v1 engine, vLLM 0.32: the arrays
// its model runners build for a forward pass (vllm/v1/worker/gpu_model_runner.py, _prepare_inputs
// and _compute_cascade_attn_prefix_len; V2's vllm/v1/worker/gpu/model_runner.py builds the same
// fields), the block table and slot mapping of its BlockTable (vllm/v1/worker/block_table.py) and
// its CommonAttentionMetadata (vllm/v1/attention/backend.py), by their names and dtypes.
//
//  req_order           [num_reqs]            the step's sequence at each request position: vLLM's
//                                            batch order, decodes first (below)
//  (per-request arrays run to num_reqs_padded, per-token ones to num_tokens_padded, when
//  options ask for V2's full-CUDA-graph padding)
//  query_start_loc     [num_reqs + 1] int32  prefix sums of the scheduled tokens
//  seq_lens            [num_reqs] int32      num_computed_tokens + num_scheduled_tokens; the
//                                            FlashAttention backend passes it as seqused_k
//  block_table_tensor  [num_reqs][max_num_blocks_per_req] int32, zero past a request's blocks
//                                            (block 0 is vLLM's null block: BlockPool.null_block)
//  slot_mapping        [num_tokens] int64    block_table[req, pos // block_size] * block_size +
//                                            pos % block_size; PAD_SLOT_ID (-1) on padding
//  logits_indices      [num_reqs] int32      query_start_loc[1:] - 1: vLLM samples every
//                                            request, partial prefills included, and drops those
//                                            samples (discard_request_mask)
//  common_prefix_len   the cascade-attention prefix before vLLM's heuristics: the leading blocks
//                      every request of the step shares, in tokens, capped by the least
//                      num_computed_tokens and floored to the block size (vLLM counts the blocks
//                      all running requests share; use_cascade_attention then decides whether to
//                      run cascade attention, and passes 0 when it does not; the CPU backend
//                      ignores it)
// Batch order: vLLM's backends that split a batch (split_decodes_and_prefills in
// vllm/v1/attention/backends/utils.py: FlashInfer, MLA, ...) need it ordered as
// reorder_batch_to_split_decodes_and_prefills leaves it: decodes (one token, done prefilling:
// num_computed_tokens >= num_prompt_tokens, prepack's context_lens >= prompt_lens),
// short extends (one token of a prompt over cached context), long extends (more, over cached
// context), prefills (nothing cached). make_step orders requests so, keeping the step's order
// within each region. Refused, as vLLM would fail on them: a step with no request
// (_prepare_inputs asserts num_reqs > 0), and block 0 in a request's table (vLLM's null block:
// padding rows point there, and V2 pads requests into it; reserve it with
// block_allocator(n, true) or scheduler_options::null_block).
// Cost: O(tokens + n_reqs x max_num_blocks_per_req). Standard library only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../detail/checked.hpp"
#include "../error.hpp"
#include "../step.hpp"

PREPACK_NAMESPACE_BEGIN
namespace vllm {

/// One forward pass as vLLM v1's model runner and attention backends take it. Request r is
/// sequence r of the step.
struct step_metadata {
  std::vector<std::size_t> req_order;  // [num_reqs]  the step's sequence at each position
  std::int32_t num_reqs = 0;
  std::int32_t num_reqs_padded = 0;    // num_reqs, or options::num_reqs_padded
  std::int32_t num_actual_tokens = 0;  // tokens of the step (before any padding)
  std::int32_t max_query_len = 0;
  std::int32_t max_seq_len = 0;
  std::vector<std::int64_t> req_ids;               // [num_reqs]  the caller's ids
  std::vector<std::int32_t> query_start_loc;       // [num_reqs + 1]
  std::vector<std::int32_t> seq_lens;              // [num_reqs]  computed + scheduled
  std::vector<std::int32_t> num_computed_tokens;   // [num_reqs]
  std::size_t max_num_blocks_per_req = 0;          //  block_table_tensor's width
  std::vector<std::int32_t> block_table_tensor;    // [num_reqs][max_num_blocks_per_req]
  std::vector<std::int32_t> input_ids;             // [num_tokens]  num_tokens >= actual
  std::vector<std::int64_t> positions;             // [num_tokens]
  std::vector<std::int64_t> slot_mapping;          // [num_tokens]  -1 on padding tokens
  std::vector<std::int32_t> logits_indices;        // [num_reqs]
  std::vector<std::uint8_t> discard_request_mask;  // [num_reqs]  1: the prompt is not yet
                                                   //  fully computed, its sample is dropped
  std::int32_t common_prefix_len = 0;              //  tokens, a multiple of the block size
  std::int32_t block_size = 0;
};

struct options {
  /// Width of block_table_tensor (vLLM's cdiv(max_model_len, block_size)); 0: the step's widest
  /// block list. Throws if narrower than a request's blocks.
  std::size_t max_num_blocks_per_req = 0;
  /// Pad the per-token arrays to this many tokens (a CUDA-graph size): input_ids and positions
  /// with 0, slot_mapping with -1. 0: no padding. Throws if below the step's tokens.
  std::size_t num_tokens_padded = 0;
  /// Pad the per-request arrays to this many requests, as vLLM's V2 model runner does for a
  /// full CUDA graph (vllm/v1/worker/gpu/model_runner.py): query_start_loc continues with the
  /// step's token count (non-decreasing), seq_lens and num_computed_tokens with 0, and the
  /// block table with rows of 0 (the null block). 0: no padding. Throws if below the requests.
  std::size_t num_reqs_padded = 0;
  /// The block size vLLM's attention backend takes, as a multiple (its
  /// get_supported_kernel_block_sizes: MultipleOf(32) for the CPU backend, whose default block
  /// is 128; MultipleOf(16) for FlashAttention). 0: not checked. Throws if the step's block
  /// size is not one.
  std::size_t block_size_multiple = 0;
};

/// vLLM's region of a step's sequence q in its batch order: 0 decode, 1 short extend, 2 long
/// extend, 3 prefill (reorder_batch_to_split_decodes_and_prefills, decode_threshold 1).
template <class Token, class Index>
int batch_region(const step_inputs<Token, Index>& in, std::size_t q) {
  if (in.context_lens[q] == 0) return 3;
  if (in.query_lens[q] > 1) return 2;
  // done prefilling: num_computed_tokens >= num_prompt_tokens (prompt_lens is that count)
  return in.context_lens[q] >= in.prompt_lens[q] ? 0 : 1;
}

/// The step in vLLM v1's form, requests in vLLM's batch order. Throws prepack::error for an
/// empty step, a table holding block 0 (vLLM's null block), widths asked for too small, or a
/// value that does not fit int32. Cost: O(tokens + num_reqs x max_num_blocks_per_req).
template <class Token, class Index>
step_metadata make_step(const step_inputs<Token, Index>& in, const options& opt = {}) {
  using prepack::detail::narrow;
  using prepack::detail::require;
  const std::size_t n = in.n_seqs(), t = in.n_tokens();
  require(n > 0, "vllm: a step with no requests (vLLM's _prepare_inputs asserts num_reqs > 0)");
  require(opt.block_size_multiple == 0 || in.tables.block_size % opt.block_size_multiple == 0,
          "vllm: block size ", in.tables.block_size, " is not a multiple of ",
          opt.block_size_multiple, ", as the attention backend needs");
  for (std::size_t q = 0; q < n; ++q) {
    const auto row = in.tables.blocks(q);
    for (std::size_t k = 0; k < row.size(); ++k) {
      if (row[k] == 0) {
        prepack::detail::fail("vllm: request ", in.seq_id[q], ": block_table[", k,
                              "] = 0, vLLM's null block (reserve it: block_allocator(n, true), "
                              "scheduler_options::null_block)");
      }
    }
  }
  step_metadata m;
  for (int region = 0; region < 4; ++region) {
    for (std::size_t q = 0; q < n; ++q) {
      if (batch_region(in, q) == region) m.req_order.push_back(q);
    }
  }
  m.block_size = narrow<std::int32_t>(in.tables.block_size, "block size");
  m.num_reqs = narrow<std::int32_t>(n, "num_reqs");
  m.num_actual_tokens = narrow<std::int32_t>(t, "num_actual_tokens");
  std::size_t width = 0;
  for (std::size_t q = 0; q < n; ++q) width = std::max(width, in.tables.blocks(q).size());
  if (opt.max_num_blocks_per_req > 0) {
    require(opt.max_num_blocks_per_req >= width, "vllm: max_num_blocks_per_req ",
            opt.max_num_blocks_per_req, " is below a request's ", width, " blocks");
    width = opt.max_num_blocks_per_req;
  }
  const std::size_t padded = opt.num_tokens_padded > 0 ? opt.num_tokens_padded : t;
  require(padded >= t, "vllm: num_tokens_padded ", opt.num_tokens_padded, " is below the step's ",
          t, " tokens");
  const std::size_t reqs = opt.num_reqs_padded > 0 ? opt.num_reqs_padded : n;
  require(reqs >= n, "vllm: num_reqs_padded ", opt.num_reqs_padded, " is below the step's ", n,
          " requests");
  m.num_reqs_padded = narrow<std::int32_t>(reqs, "num_reqs_padded");
  m.max_num_blocks_per_req = std::max<std::size_t>(width, 1);
  m.block_table_tensor.assign(prepack::detail::mul(reqs, m.max_num_blocks_per_req, "block table"),
                              0);
  m.query_start_loc.assign(reqs + 1, 0);
  const auto row0 = in.tables.blocks(m.req_order[0]);
  std::size_t common = row0.size();  // leading blocks all share
  std::size_t min_computed = static_cast<std::size_t>(in.context_lens[m.req_order[0]]);
  m.input_ids.assign(padded, 0);
  m.positions.assign(padded, 0);
  m.slot_mapping.assign(padded, -1);
  std::size_t at = 0;  // the next token's index in vLLM's order
  for (std::size_t r = 0; r < n; ++r) {
    const std::size_t q = m.req_order[r];
    const auto row = in.tables.blocks(q);
    std::copy(
        row.begin(), row.end(),
        m.block_table_tensor.begin() + static_cast<std::ptrdiff_t>(r * m.max_num_blocks_per_req));
    std::size_t k = 0;
    while (k < common && k < row.size() && row[k] == row0[k]) ++k;
    common = k;
    const auto computed = static_cast<std::size_t>(in.context_lens[q]);
    min_computed = std::min(min_computed, computed);
    m.req_ids.push_back(in.seq_id[q]);
    const auto t0 = static_cast<std::size_t>(in.cu_seqlens_q[q]);
    const auto t1 = static_cast<std::size_t>(in.cu_seqlens_q[q + 1]);
    for (std::size_t i = t0; i < t1; ++i, ++at) {
      m.input_ids[at] = narrow<std::int32_t>(in.tokens[i], "input id", "token");
      m.positions[at] = static_cast<std::int64_t>(in.positions[i]);
      m.slot_mapping[at] = in.slot_mapping[i];
    }
    m.query_start_loc[r + 1] = narrow<std::int32_t>(at, "query_start_loc");
    m.seq_lens.push_back(narrow<std::int32_t>(in.seq_lens[q], "seq_lens"));
    m.num_computed_tokens.push_back(
        narrow<std::int32_t>(in.context_lens[q], "num_computed_tokens"));
    m.max_query_len =
        std::max(m.max_query_len, narrow<std::int32_t>(in.query_lens[q], "query len"));
    m.max_seq_len = std::max(m.max_seq_len, m.seq_lens.back());
    m.logits_indices.push_back(m.query_start_loc[r + 1] - 1);
    m.discard_request_mask.push_back(in.completes[q] ? 0 : 1);
  }
  for (std::size_t r = n; r < reqs; ++r) {  // V2's padded requests: no tokens, no context
    m.query_start_loc[r + 1] = m.query_start_loc[n];
    m.seq_lens.push_back(0);
    m.num_computed_tokens.push_back(0);
  }
  // The cascade prefix: the shared blocks, capped by the least computed tokens, in whole blocks.
  const std::size_t bs = in.tables.block_size;
  const std::size_t prefix = std::min(common * bs, min_computed) / bs * bs;
  m.common_prefix_len = narrow<std::int32_t>(prefix, "common_prefix_len");
  return m;
}

}  // namespace vllm
PREPACK_NAMESPACE_END
