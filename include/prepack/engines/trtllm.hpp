// prepack/engines/trtllm.hpp - one step in TensorRT-LLM's own form (TensorRT-LLM 0.17 to 1.2, its
// PyTorch flow): the attention inputs TrtllmAttentionMetadata.prepare fills
// (tensorrt_llm/_torch/attention_backend/trtllm.py) and the KV block offsets its KV cache manager
// writes (cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp: WindowBlockManager::setOffsets, each
// request's rows copied by KVCacheManager::copyBlockOffsets):
//
//  context requests first, then generation requests (num_contexts of them)
//  seq_lens                   [num_seqs] int32  new tokens (1 for a generation request)
//  num_cached_tokens_per_seq  [num_seqs] int32  tokens already in the cache
//  kv_lens                    [num_seqs] int32  cached + new
//  context_lengths            [num_seqs] int32  a context request's tokens in this chunk, a
//                                               generation request's prompt length
//                                               (_prepare_tp_inputs: prompt_lengths)
//  host_request_types         [num_seqs] int32  0 context, 1 generation
//  kv_cache_block_offsets     [num_pools][num_seqs][2 (K, V)][max_blocks_per_seq] int32: for
//                             block b (its memory-pool block index) in pool p of L_p layers,
//                             setOffsets' flat_index3 with kvFactor 2 (K field 0, V field 1):
//                             block-first pools [blocks][layers][K|V][...]: (b L_p + 0) 2 + field
//                             = 2 b L_p (+1 for V); layer-first pools ([layers][blocks][K|V][...],
//                             pool.layerFirstLayout): (0 num_blocks + b) 2 + field = 2 b (+1);
//                             a K-only cache (CacheType::kSELFKONLY, MLA's latent cache: kvFactor
//                             1) gives both entries field 0: b L_p, or b layer-first. 0 past a
//                             request's blocks. Several pools (one per KV-head count or attention
//                             window) repeat the request's blocks with each pool's layers.
//                             Beam width 1 (prepack schedules no beams: TensorRT-LLM gives beam
//                             i of a request row slot * beam_width + i); no placeholder blocks
//                             (TensorRT-LLM's nullIndex, for recurrent states).
// Chunked context needs every chunk but a prompt's last to be a whole number of blocks
// (MicroBatchScheduler::setCtxRequestsChunkSize: non-final chunk sizes are multiples of
// tokens_per_block; a chunk may start anywhere, after a partial prefix reuse): make_step refuses
// a step that breaks it, naming the request (budget_options::block_size and
// scheduler_options::aligned_chunks schedule so).
// Cost: O(tokens + num_seqs x max_blocks_per_seq). Standard library only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../detail/checked.hpp"
#include "../error.hpp"
#include "../step.hpp"

PREPACK_NAMESPACE_BEGIN
namespace trtllm {

/// One forward pass in TensorRT-LLM's order and arrays. Position r is the step's sequence
/// seq_order[r].
struct attention_inputs {
  std::vector<std::size_t> seq_order;  // [num_seqs]  step sequence at each position
  std::int32_t num_contexts = 0;       // context requests (the first ones)
  std::int32_t num_generations = 0;
  std::vector<std::int64_t> request_ids;                // [num_seqs]
  std::vector<std::int32_t> seq_lens;                   // [num_seqs]
  std::vector<std::int32_t> num_cached_tokens_per_seq;  // [num_seqs]
  std::vector<std::int32_t> kv_lens;                    // [num_seqs]
  std::vector<std::int32_t> context_lengths;            // [num_seqs]  prompt lengths
  std::vector<std::int32_t> host_request_types;         // [num_seqs]  0 context, 1 generation
  std::size_t max_blocks_per_seq = 0;
  std::size_t num_pools = 1;
  std::vector<std::int32_t> kv_cache_block_offsets;  // [num_pools][num_seqs][2][max_blocks]
  std::vector<std::int32_t> input_ids;               // [num_tokens]  in seq_order
  std::vector<std::int32_t> position_ids;            // [num_tokens]
  std::vector<std::int32_t> tokens_per_block;        // {block size}
};

/// How a pool lays out its blocks (WindowBlockManager's pool.layerFirstLayout).
enum class pool_layout { block_first, layer_first };

struct options {
  std::size_t num_layers = 1;          // layers of the KV pool (the offsets count in them)
  std::size_t max_blocks_per_seq = 0;  // offsets' width; 0: the step's widest block list
  /// Layers of each pool when there are several (one per KV-head count or attention window, in
  /// TensorRT-LLM's pool order); empty: one pool of num_layers.
  std::vector<std::size_t> pool_layers{};
  pool_layout layout = pool_layout::block_first;
  bool k_only = false;  // CacheType::kSELFKONLY (MLA): kvFactor 1, K and V entries both field 0
};

/// The step in TensorRT-LLM's form. Throws prepack::error, naming the request, for a chunk of a
/// context request that, short of its prompt's end, is not a whole number of blocks (a chunk may
/// start anywhere, after a partial prefix reuse); for a width below a request's blocks,
/// num_layers 0 or a pool of no layers; for a value that does not fit int32.
template <class Token, class Index>
attention_inputs make_step(const step_inputs<Token, Index>& in, const options& opt = {}) {
  using prepack::detail::narrow;
  using prepack::detail::require;
  const std::size_t n = in.n_seqs(), bs = in.tables.block_size;
  require(opt.num_layers > 0, "trtllm: num_layers 0");
  const std::vector<std::size_t> pools =
      opt.pool_layers.empty() ? std::vector<std::size_t>{opt.num_layers} : opt.pool_layers;
  for (std::size_t p = 0; p < pools.size(); ++p) {
    require(pools[p] > 0, "trtllm: pool ", p, " has no layers");
  }
  attention_inputs a;
  a.tokens_per_block = {narrow<std::int32_t>(bs, "tokens per block")};
  std::size_t width = 0;
  for (std::size_t q = 0; q < n; ++q) {
    width = std::max(width, in.tables.blocks(q).size());
    if (in.decodes[q]) continue;
    const auto ctx = static_cast<std::size_t>(in.context_lens[q]);
    const auto len = static_cast<std::size_t>(in.query_lens[q]);
    const bool last = in.completes[q] || ctx + len >= static_cast<std::size_t>(in.prompt_lens[q]);
    if (len % bs != 0 && !last) {
      prepack::detail::fail("trtllm: request ", in.seq_id[q], ": context chunk of ", len,
                            " tokens is not a whole number of blocks of ", bs,
                            " (only a prompt's last chunk may be)");
    }
  }
  if (opt.max_blocks_per_seq > 0) {
    require(opt.max_blocks_per_seq >= width, "trtllm: max_blocks_per_seq ", opt.max_blocks_per_seq,
            " is below a request's ", width, " blocks");
    width = opt.max_blocks_per_seq;
  }
  a.max_blocks_per_seq = std::max<std::size_t>(width, 1);
  for (std::size_t q = 0; q < n; ++q) {
    if (!in.decodes[q]) a.seq_order.push_back(q);
  }
  a.num_contexts = static_cast<std::int32_t>(a.seq_order.size());
  for (std::size_t q = 0; q < n; ++q) {
    if (in.decodes[q]) a.seq_order.push_back(q);
  }
  a.num_generations = static_cast<std::int32_t>(n) - a.num_contexts;
  a.num_pools = pools.size();
  const std::size_t per_pool = prepack::detail::mul(prepack::detail::mul(n, 2, "block offsets"),
                                                    a.max_blocks_per_seq, "block offsets");
  a.kv_cache_block_offsets.assign(prepack::detail::mul(per_pool, pools.size(), "block offsets"), 0);
  const std::size_t kv_factor = opt.k_only ? 1 : 2;
  for (std::size_t r = 0; r < n; ++r) {
    const std::size_t q = a.seq_order[r];
    a.request_ids.push_back(in.seq_id[q]);
    a.seq_lens.push_back(narrow<std::int32_t>(in.query_lens[q], "seq_lens"));
    a.num_cached_tokens_per_seq.push_back(
        narrow<std::int32_t>(in.context_lens[q], "cached tokens"));
    a.kv_lens.push_back(narrow<std::int32_t>(in.seq_lens[q], "kv_lens"));
    // A context request's chunk, a generation request's prompt (_prepare_tp_inputs).
    a.context_lengths.push_back(narrow<std::int32_t>(
        in.decodes[q] ? in.prompt_lens[q] : in.query_lens[q], "context_lengths"));
    a.host_request_types.push_back(in.decodes[q] ? 1 : 0);
    const auto row = in.tables.blocks(q);
    for (std::size_t p = 0; p < pools.size(); ++p) {
      // setOffsets: flat_index3(b, 0, field, L_p, kvFactor) block-first, flat_index3(0, b, field,
      // num_blocks, kvFactor) layer-first.
      const std::size_t stride = opt.layout == pool_layout::layer_first
                                     ? kv_factor
                                     : prepack::detail::mul(pools[p], kv_factor, "block offsets");
      for (std::size_t k = 0; k < row.size(); ++k) {
        const std::size_t base =
            prepack::detail::mul(static_cast<std::size_t>(row[k]), stride, "block offset");
        for (std::size_t x = 0; x < 2; ++x) {
          const std::size_t field = opt.k_only ? 0 : x;
          a.kv_cache_block_offsets[p * per_pool + (r * 2 + x) * a.max_blocks_per_seq + k] =
              narrow<std::int32_t>(base + field, "block offset");
        }
      }
    }
    const auto t0 = static_cast<std::size_t>(in.cu_seqlens_q[q]);
    const auto t1 = static_cast<std::size_t>(in.cu_seqlens_q[q + 1]);
    for (std::size_t t = t0; t < t1; ++t) {
      a.input_ids.push_back(narrow<std::int32_t>(in.tokens[t], "input id", "token"));
      a.position_ids.push_back(narrow<std::int32_t>(in.positions[t], "position"));
    }
  }
  return a;
}

}  // namespace trtllm
PREPACK_NAMESPACE_END
