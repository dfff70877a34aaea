// Tests of prepack/engines/: every engine's form of random steps (chunked prefill of plain and
// shared-prefix schedules, decode steps, steps that mix both) checked against that engine's own
// definition of its inputs, written here from the engine's code and documentation, never from
// prepack's:
//  vLLM v1      query_start_loc, seq_lens = computed + scheduled, the block table zero-padded,
//               the slot mapping of _compute_slot_mapping_kernel, logits_indices =
//               query_start_loc[1:] - 1, discard_request_mask, _compute_cascade_attn_prefix_len
//  FlashInfer   kv_len = page_size * (pages - 1) + last_page_len with last_page_len in
//               [1, page_size] (kv_layout.rst), get_batch_indices_positions' example, the
//               two-level cascade layout
//  SGLang       ForwardBatch.init_new: positions = arange(prefix, prefix + extend),
//               extend_start_loc = exclusive cumsum; req_to_token rows; out_cache_loc
//  TensorRT-LLM context requests first, kv_lens = cached + new, host_request_types, setOffsets'
//               flat_index3(block, 0, field, num_layers, 2), aligned chunks
//  llama.cpp    llama_batch_allocr::init's rules replayed over a model of its KV cells by
//               sequence id, llama_memory_seq_cp's [p0, p1) copies
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common.hpp"
#include "prepack/engines.hpp"
#include "prepack/paged.hpp"
#include "prepack/prefix.hpp"
#include "prepack/schedule.hpp"
#include "prepack/serve.hpp"
#include "prepack/step.hpp"

namespace {

// Blocks for each item of a schedule, drawn from a shuffled pool (row order and block order
// differ, so a mix-up of a request's row with its index shows). Items of a prefix plan get the
// plan's own tables.
struct world {
  prepack::step_schedule sched;
  std::vector<std::vector<int>> item_tokens;
  prepack::block_tables tables;
  std::size_t n_blocks = 0;
  std::size_t block_size = 0;
};

world plain_world(std::mt19937_64& rng, std::size_t n_prompts, std::size_t bs, std::size_t budget,
                  bool aligned) {
  world w;
  w.block_size = bs;
  std::vector<int> len;
  for (std::size_t i = 0; i < n_prompts; ++i) len.push_back(1 + static_cast<int>(rng() % 70));
  w.item_tokens = test::tagged_prompts(len, 1000);
  w.sched = prepack::budgeted_schedule(
      len, {budget, rng() % 2 ? prepack::chunking::fill : prepack::chunking::whole_first,
            prepack::schedule_order::arrival, aligned ? bs : 0});
  std::size_t need = 0;
  for (int l : len) need += prepack::blocks_for(static_cast<std::size_t>(l), bs) + 1;
  w.n_blocks = need + 5;
  std::vector<std::int32_t> ids(w.n_blocks);
  std::iota(ids.begin(), ids.end(), 1);  // block 0 is vLLM's null block, SGLang's padding
  w.n_blocks += 1;
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<std::vector<std::int32_t>> rows;
  std::size_t next = 0;
  for (int l : len) {
    rows.emplace_back();
    const std::size_t n = prepack::blocks_for(static_cast<std::size_t>(l), bs) + rng() % 2;
    for (std::size_t k = 0; k < n; ++k) rows.back().push_back(ids[next++]);
  }
  w.tables = prepack::make_block_tables(rows, bs);
  return w;
}

world prefix_world(std::mt19937_64& rng, std::size_t bs, std::size_t budget,
                   std::vector<std::vector<int>>& prompts, prepack::prefix_plan& plan) {
  world w;
  w.block_size = bs;
  std::vector<int> stem;
  for (int k = 0; k < 40; ++k) stem.push_back(1 + static_cast<int>(rng() % 5));
  prompts.clear();
  const std::size_t n = 2 + rng() % 6;
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<int> p(stem.begin(), stem.begin() + static_cast<long>(8 + rng() % 32));
    const std::size_t tail = rng() % 9;
    for (std::size_t k = 0; k < tail; ++k) p.push_back(100 + static_cast<int>(rng() % 50));
    prompts.push_back(std::move(p));
  }
  plan = prepack::make_prefix_plan(prompts, {bs, bs, 0});
  w.sched = prepack::budgeted_schedule(
      plan.items, {budget, prepack::chunking::fill, prepack::schedule_order::arrival, bs});
  w.item_tokens = plan.item_tokens(prompts);
  prepack::block_allocator alloc(2048, true);
  w.tables = prepack::allocate_prefix_tables(plan, alloc, 0).items;
  w.n_blocks = alloc.n_blocks();
  return w;
}

// A step that mixes decodes (sequences with a cached context, feeding one token) and prefill
// chunks, through step_builder as a serving loop builds it.
prepack::step_inputs<> mixed_step(std::mt19937_64& rng, std::size_t bs,
                                  std::vector<std::vector<std::int32_t>>& rows) {
  rows.clear();
  const std::size_t n = 1 + rng() % 6;
  std::vector<std::int32_t> ids(200);
  std::iota(ids.begin(), ids.end(), 1);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::size_t next = 0;
  prepack::step_builder<> b(bs, 201, [](std::size_t q) { return "seq " + std::to_string(q); });
  for (std::size_t q = 0; q < n; ++q) {
    // A decode, a prompt's last chunk, or (a whole number of blocks) a chunk short of its end.
    const bool decode = rng() % 2 == 0, last = rng() % 2 == 0;
    const std::size_t context = decode ? 1 + rng() % 40 : (rng() % 3) * bs;
    const std::size_t len = decode ? 1 : last ? 1 + rng() % 20 : bs * (1 + rng() % 3);
    rows.emplace_back();
    for (std::size_t k = 0; k < prepack::blocks_for(context + len, bs); ++k) {
      rows.back().push_back(ids[next++]);
    }
    std::vector<int> toks(len, 7 + static_cast<int>(q));
    // The prompt's tokens (vLLM's num_prompt_tokens): a decode's lie within its context.
    const std::size_t prompt_len = decode ? context : last ? context + len : context + len + bs;
    b.add(q, static_cast<std::int64_t>(100 + q), context, prepack::span<const int>(toks),
          prepack::span<const std::int32_t>(rows.back()), decode || context + len == prompt_len,
          decode, prompt_len);
  }
  return std::move(b).finish();
}

// ---------- vLLM v1 ----------
// vLLM's region of request q (vllm/v1/attention/backends/utils.py,
// reorder_batch_to_split_decodes_and_prefills): no context yet: prefill (3); context and more
// than decode_threshold tokens: long extend (2); as few tokens of a prompt still prefilling
// (num_computed_tokens < num_prompt_tokens): short extend (1); else decode (0).
int vllm_region(const prepack::step_inputs<>& in, std::size_t q, int threshold = 1) {
  const bool has_context = in.context_lens[q] > 0, below = in.query_lens[q] <= threshold;
  const bool done_prefilling = in.context_lens[q] >= in.prompt_lens[q];
  if (!has_context) return 3;
  if (!below) return 2;
  return done_prefilling ? 0 : 1;
}

// The batch order reorder_batch_to_split_decodes_and_prefills leaves, statement by statement
// (vllm/v1/attention/backends/utils.py, vLLM 0.32): target_regions = repeat([0, 1, 2, 3],
// counts); orig_indices = where(req_regions != target_regions); src_indices = orig_indices
// [argsort(req_regions[needs_swap], stable)]; src_dest_map = {src: dst}; then for each src (in
// insertion order) swap_states(src, dst) along the cycle, marking each dst done.
std::vector<std::size_t> vllm_v1_order(const prepack::step_inputs<>& in, int threshold) {
  const std::size_t n = in.n_seqs();
  std::vector<std::size_t> batch(n);
  for (std::size_t i = 0; i < n; ++i) batch[i] = i;
  std::vector<int> req_regions(n), target;
  for (std::size_t i = 0; i < n; ++i) req_regions[i] = vllm_region(in, i, threshold);
  for (int region = 0; region < 4; ++region) {
    for (std::size_t i = 0; i < n; ++i) {
      if (req_regions[i] == region) target.push_back(region);
    }
  }
  std::vector<std::size_t> orig_indices;
  for (std::size_t i = 0; i < n; ++i) {
    if (req_regions[i] != target[i]) orig_indices.push_back(i);
  }
  std::vector<std::size_t> sorted_order(orig_indices.size());
  for (std::size_t k = 0; k < sorted_order.size(); ++k) sorted_order[k] = k;
  std::stable_sort(sorted_order.begin(), sorted_order.end(), [&](std::size_t a, std::size_t b) {
    return req_regions[orig_indices[a]] < req_regions[orig_indices[b]];
  });
  std::vector<std::pair<std::size_t, std::size_t>> keys;  // the dict's insertion order
  std::map<std::size_t, std::size_t> src_dest_map;
  for (std::size_t k = 0; k < orig_indices.size(); ++k) {
    const std::size_t src = orig_indices[sorted_order[k]];
    keys.emplace_back(src, orig_indices[k]);
    src_dest_map[src] = orig_indices[k];
  }
  for (const auto& key : keys) {
    const std::size_t src = key.first;
    std::size_t dst = src_dest_map[src];
    while (src != dst) {
      std::swap(batch[src], batch[dst]);
      const auto it = src_dest_map.find(dst);
      const std::size_t next_dst = it == src_dest_map.end() ? dst : it->second;
      src_dest_map[dst] = dst;
      dst = next_dst;
    }
  }
  return batch;
}

// V2's order (vllm/v1/worker/gpu/model_runner.py, sort_batch_req_ids without drafts): sorted
// by the key (num_tokens != decode_query_len, num_tokens), Python's sort being stable.
std::vector<std::size_t> vllm_v2_order(const prepack::step_inputs<>& in) {
  std::vector<std::size_t> order(in.n_seqs());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const int na = in.query_lens[a], nb = in.query_lens[b];
    return std::make_tuple(na != 1, na) < std::make_tuple(nb != 1, nb);
  });
  return order;
}

void expect_vllm(const prepack::step_inputs<>& in, const std::string& where) {
  prepack::vllm::options v1;
  v1.num_tokens_padded = in.n_tokens() + 3;
  v1.model_runner = prepack::vllm::runner::v1;
  const auto m = prepack::vllm::make_step(in, v1);
  const std::size_t n = in.n_seqs(), bs = in.tables.block_size;
  ASSERT_EQ(m.num_reqs, static_cast<int>(n)) << where;
  ASSERT_EQ(m.num_actual_tokens, static_cast<int>(in.n_tokens()));
  // The batch as each runner orders it: V1 with a backend's reorder_batch_threshold (1 by
  // default: split_decodes_and_prefills needs decodes first; 128 as FlashMLA; 0 as the CPU
  // backend: no reorder), V2.
  ASSERT_EQ(m.req_order, vllm_v1_order(in, 1)) << where;
  for (const int threshold : {0, 128}) {
    prepack::vllm::options o;
    o.model_runner = prepack::vllm::runner::v1;
    o.reorder_batch_threshold = static_cast<std::size_t>(threshold);
    std::vector<std::size_t> want(n);
    for (std::size_t i = 0; i < n; ++i) want[i] = i;
    if (threshold > 0) want = vllm_v1_order(in, threshold);
    ASSERT_EQ(prepack::vllm::make_step(in, o).req_order, want) << where;
  }
  ASSERT_EQ(prepack::vllm::make_step(in).req_order, vllm_v2_order(in)) << where;  // V2: default
  ASSERT_EQ(m.req_order.size(), n);
  for (std::size_t r = 1; r < n; ++r) {  // decodes first, as split_decodes_and_prefills needs
    ASSERT_LE(vllm_region(in, m.req_order[r - 1]), vllm_region(in, m.req_order[r])) << where;
  }
  // query_start_loc: prefix sums of num_scheduled_tokens, in that order.
  std::vector<int> qsl{0};
  for (std::size_t r = 0; r < n; ++r) qsl.push_back(qsl.back() + in.query_lens[m.req_order[r]]);
  ASSERT_EQ(m.query_start_loc, qsl) << where;
  int max_q = 0, max_s = 0;
  for (std::size_t r = 0; r < n; ++r) {
    const std::size_t q = m.req_order[r];
    const int computed = in.context_lens[q], scheduled = in.query_lens[q];
    ASSERT_EQ(m.req_ids[r], in.seq_id[q]);
    ASSERT_EQ(m.num_computed_tokens[r], computed);
    // is_prefilling = num_computed_tokens_cpu < num_prompt_tokens_cpu (gpu_model_runner.py)
    ASSERT_EQ(m.is_prefilling[r] != 0, in.context_lens[q] < in.prompt_lens[q]) << where;
    ASSERT_EQ(m.seq_lens[r], computed + scheduled) << where;  // computed + newly scheduled
    max_q = std::max(max_q, scheduled);
    max_s = std::max(max_s, computed + scheduled);
    // BlockTable rows: the request's blocks, then zeros (the null block).
    const auto blocks = in.tables.blocks(q);
    for (std::size_t k = 0; k < m.max_num_blocks_per_req; ++k) {
      ASSERT_EQ(m.block_table_tensor[r * m.max_num_blocks_per_req + k],
                k < blocks.size() ? blocks[k] : 0)
          << where;
    }
    // _compute_slot_mapping_kernel: block_table[req, pos // bs] * bs + pos % bs.
    for (int i = qsl[r]; i < qsl[r + 1]; ++i) {
      const long long pos = m.positions[static_cast<std::size_t>(i)];
      ASSERT_EQ(pos, computed + (i - qsl[r]));
      const long long block =
          m.block_table_tensor[r * m.max_num_blocks_per_req + static_cast<std::size_t>(pos) / bs];
      ASSERT_EQ(m.slot_mapping[static_cast<std::size_t>(i)],
                block * static_cast<long long>(bs) + pos % static_cast<long long>(bs));
      ASSERT_EQ(m.input_ids[static_cast<std::size_t>(i)],
                in.tokens[static_cast<std::size_t>(in.cu_seqlens_q[q] + (i - qsl[r]))]);
    }
    ASSERT_EQ(m.logits_indices[r], qsl[r + 1] - 1);  // query_start_loc[1:] - 1
    // discard_request_mask: the request's sample is not wanted (a chunk short of its prompt's
    // end, or a shared prefix that ends no prompt).
    ASSERT_EQ(m.discard_request_mask[r] != 0, !in.completes[q]) << where;
  }
  ASSERT_EQ(m.max_query_len, max_q);
  ASSERT_EQ(m.max_seq_len, max_s);
  for (std::size_t i = in.n_tokens(); i < m.slot_mapping.size(); ++i) {
    ASSERT_EQ(m.slot_mapping[i], -1);  // PAD_SLOT_ID
  }
  // _compute_cascade_attn_prefix_len before its heuristics: blocks every request shares.
  const auto first = in.tables.blocks(m.req_order[0]);
  std::size_t shared = first.size();
  int min_computed = in.context_lens[m.req_order[0]];
  for (std::size_t q = 0; q < n; ++q) {
    const auto b = in.tables.blocks(q);
    std::size_t k = 0;
    while (k < shared && k < b.size() && first[k] == b[k]) ++k;
    shared = k;
    min_computed = std::min(min_computed, in.context_lens[q]);
  }
  long long prefix = static_cast<long long>(shared * bs);
  prefix = std::min<long long>(prefix, min_computed);
  prefix = prefix / static_cast<long long>(bs) * static_cast<long long>(bs);
  ASSERT_EQ(m.common_prefix_len, prefix) << where;
  // V2's full-CUDA-graph padding (vllm/v1/worker/gpu/model_runner.py: query_start_loc_np
  // [num_reqs + 1:] = num_tokens; seq_lens' padded entries left at zero; the block-table gather
  // zeroes padded rows).
  prepack::vllm::options pad = v1;
  pad.num_tokens_padded = 0;
  pad.num_reqs_padded = n + 2;
  const auto padded = prepack::vllm::make_step(in, pad);
  ASSERT_EQ(padded.num_reqs, static_cast<int>(n));
  ASSERT_EQ(padded.num_reqs_padded, static_cast<int>(n + 2));
  ASSERT_EQ(padded.query_start_loc.size(), n + 3);
  for (std::size_t r = n; r < n + 2; ++r) {
    ASSERT_EQ(padded.query_start_loc[r + 1], static_cast<int>(in.n_tokens()));
    ASSERT_EQ(padded.seq_lens[r], 0);
    ASSERT_EQ(padded.num_computed_tokens[r], 0);
    for (std::size_t k = 0; k < padded.max_num_blocks_per_req; ++k) {
      ASSERT_EQ(padded.block_table_tensor[r * padded.max_num_blocks_per_req + k], 0);
    }
  }
  ASSERT_EQ(std::vector<int>(padded.query_start_loc.begin(),
                             padded.query_start_loc.begin() + static_cast<long>(n) + 1),
            m.query_start_loc);
}

// ---------- FlashInfer ----------
void expect_flashinfer(const prepack::step_inputs<>& in, const std::string& where) {
  const auto p = prepack::flashinfer::make_step(in);
  const std::size_t n = in.n_seqs();
  const int ps = p.page_size;
  ASSERT_EQ(ps, static_cast<int>(in.tables.block_size));
  ASSERT_EQ(p.attention.qo_indptr.size(), n + 1);
  ASSERT_EQ(p.attention.paged_kv_indptr.size(), n + 1);
  ASSERT_EQ(p.attention.paged_kv_indptr.back(),
            static_cast<int>(p.attention.paged_kv_indices.size()));
  for (std::size_t r = 0; r < n; ++r) {
    ASSERT_EQ(p.attention.qo_indptr[r + 1] - p.attention.qo_indptr[r], in.query_lens[r]);
    const int pages = p.attention.paged_kv_indptr[r + 1] - p.attention.paged_kv_indptr[r];
    const int last = p.attention.paged_kv_last_page_len[r];
    ASSERT_GE(last, 1) << where;
    ASSERT_LE(last, ps) << where;
    // The KV sequence length of request i is page_size * (len(page_indices[i]) - 1) +
    // last_page_length[i]: its cached context and the new tokens.
    ASSERT_EQ(ps * (pages - 1) + last, in.context_lens[r] + in.query_lens[r]) << where;
    const auto blocks = in.tables.blocks(r);
    for (int k = 0; k < pages; ++k) {
      ASSERT_EQ(p.attention
                    .paged_kv_indices[static_cast<std::size_t>(p.attention.paged_kv_indptr[r] + k)],
                blocks[static_cast<std::size_t>(k)]);
    }
  }
  // plan()'s other arguments (flashinfer/prefill.py, BatchPrefillWithPagedKVCacheWrapper.plan):
  // causal (default False there), and for trtllm-gen / cuDNN seq_lens (kv), seq_lens_q,
  // block_tables and the two maxima.
  ASSERT_TRUE(p.causal);
  int max_q = 0, max_kv = 0;
  for (std::size_t r = 0; r < n; ++r) {
    ASSERT_EQ(p.seq_lens[r], in.context_lens[r] + in.query_lens[r]);
    ASSERT_EQ(p.seq_lens_q[r], in.query_lens[r]);
    max_q = std::max(max_q, in.query_lens[r]);
    max_kv = std::max(max_kv, in.seq_lens[r]);
    const auto blocks = in.tables.blocks(r);
    const auto pages = static_cast<std::size_t>(p.attention.paged_kv_indptr[r + 1] -
                                                p.attention.paged_kv_indptr[r]);
    for (std::size_t k = 0; k < p.max_pages; ++k) {
      ASSERT_EQ(p.block_tables[r * p.max_pages + k], k < pages ? blocks[k] : 0) << where;
    }
  }
  ASSERT_EQ(p.max_token_per_sequence, max_q);
  ASSERT_EQ(p.max_sequence_kv, max_kv);
  // get_batch_indices_positions(append_indptr, seq_lens, nnz): batch b's entries get b, and
  // positions seq_lens[b] - append_len + i (the docs' example: [4, 3, 4, 2, 3, 4, ...]).
  std::vector<int> bi, pos;
  for (std::size_t b = 0; b < n; ++b) {
    const int append = p.attention.qo_indptr[b + 1] - p.attention.qo_indptr[b];
    const int seq_len = in.seq_lens[b];
    for (int i = 0; i < append; ++i) {
      bi.push_back(static_cast<int>(b));
      pos.push_back(seq_len - append + i);
    }
  }
  ASSERT_EQ(p.batch_indices, bi) << where;
  ASSERT_EQ(p.positions, pos) << where;
  if (p.cascade) {
    const auto& c = *p.cascade;
    ASSERT_EQ(c.shared.qo_indptr, (std::vector<int>{0, p.attention.qo_indptr.back()}));
    ASSERT_EQ(c.unique.qo_indptr, p.attention.qo_indptr);
    ASSERT_EQ(c.shared.paged_kv_last_page_len, (std::vector<int>{ps}));  // whole pages
    for (std::size_t r = 0; r < n; ++r) {
      // The shared pages lead every request's pages and hold only its cached context (level 0
      // has no causal mask); its own pages follow.
      ASSERT_LE(c.shared_pages * ps, in.context_lens[r]) << where;
      std::vector<int> joined(c.shared.paged_kv_indices);
      joined.insert(joined.end(), c.unique.paged_kv_indices.begin() + c.unique.paged_kv_indptr[r],
                    c.unique.paged_kv_indices.begin() + c.unique.paged_kv_indptr[r + 1]);
      const std::vector<int> full(
          p.attention.paged_kv_indices.begin() + p.attention.paged_kv_indptr[r],
          p.attention.paged_kv_indices.begin() + p.attention.paged_kv_indptr[r + 1]);
      ASSERT_EQ(joined, full) << where;
    }
  }
}

// ---------- SGLang ----------
void expect_sglang(const prepack::step_inputs<>& in, const std::string& where) {
  std::vector<std::int64_t> pool_rows;
  for (std::size_t r = 0; r < in.n_seqs(); ++r)
    pool_rows.push_back(static_cast<std::int64_t>(3 * r + 1));
  const auto f =
      prepack::sglang::make_forward_batch(in, prepack::span<const std::int64_t>(pool_rows));
  const std::size_t n = in.n_seqs(), bs = in.tables.block_size;
  ASSERT_EQ(f.req_pool_indices, pool_rows);
  // ScheduleBatch.mix_with_running (python/sglang/srt/managers/schedule_batch.py): the new
  // extends, then the running decodes (merge_batch appends them); each in the step's order.
  std::vector<std::size_t> order;
  for (const bool decode : {false, true}) {
    for (std::size_t q = 0; q < n; ++q) {
      if ((in.decodes[q] != 0) == decode) order.push_back(q);
    }
  }
  ASSERT_EQ(f.seq_order, order) << where;
  // ForwardBatch.init_new fills the extend_* fields for EXTEND and MIXED only.
  const bool extend = f.mode != prepack::sglang::forward_mode::decode;
  ASSERT_EQ(f.extend_seq_lens.has_value(), extend);
  ASSERT_EQ(f.extend_prefix_lens.has_value(), extend);
  ASSERT_EQ(f.extend_start_loc.has_value(), extend);
  ASSERT_EQ(f.extend_num_tokens.has_value(), extend);
  std::vector<std::int32_t> start{0};
  std::vector<std::int64_t> positions, ids;
  for (std::size_t r = 0; r < n; ++r) {
    const std::size_t q = order[r];
    const int prefix = in.context_lens[q], len = in.query_lens[q];
    if (extend) {
      ASSERT_EQ((*f.extend_prefix_lens)[r], prefix);
      ASSERT_EQ((*f.extend_seq_lens)[r], len);
      if (r + 1 < n) start.push_back(start.back() + len);  // zeros_like; [1:] = cumsum([:-1])
    }
    ASSERT_EQ(f.seq_lens[r], prefix + len);
    ASSERT_EQ(f.rids[r], in.seq_id[q]);
    for (int p = prefix; p < prefix + len; ++p) positions.push_back(p);  // arange
    for (int t = in.cu_seqlens_q[q]; t < in.cu_seqlens_q[q + 1]; ++t) {
      ids.push_back(in.tokens[static_cast<std::size_t>(t)]);
    }
    // req_to_token[row][p]: the location of position p (token granular; page*size + offset).
    const auto blocks = in.tables.blocks(q);
    for (int p = 0; p < prefix + len; ++p) {
      const std::size_t pp = static_cast<std::size_t>(p);
      ASSERT_EQ(f.req_to_token[r * f.req_to_token_width + pp],
                blocks[pp / bs] * static_cast<int>(bs) + static_cast<int>(pp % bs))
          << where;
    }
  }
  if (extend) {
    ASSERT_EQ(*f.extend_start_loc, start) << where;
    ASSERT_EQ(*f.extend_num_tokens, static_cast<std::int64_t>(in.n_tokens()));
  }
  ASSERT_EQ(f.positions, positions) << where;
  ASSERT_EQ(f.input_ids, ids) << where;
  // out_cache_loc: what the step writes into req_to_token[req, prefix : seq_len].
  std::size_t t = 0;
  for (std::size_t r = 0; r < n; ++r) {
    const int len = in.query_lens[order[r]];
    for (int i = 0; i < len; ++i, ++t) {
      ASSERT_EQ(
          f.out_cache_loc[t],
          f.req_to_token[r * f.req_to_token_width + static_cast<std::size_t>(f.positions[t])]);
    }
  }
  // The pool's own table [pool_size][max_context_len], rows kept across steps: SGLang writes an
  // extend's [0, seq_len) (write_req_to_token_pool_triton: prefix_indices, then out_cache_loc)
  // and a decode's new position (prepare_for_decode); every other entry keeps what it held.
  const std::size_t pool_size = 3 * n + 2, max_ctx = f.req_to_token_width + 3;
  const std::int32_t old = -7;
  std::vector<std::int32_t> table(pool_size * max_ctx, old);
  prepack::sglang::write_req_to_token(in, f, prepack::span<std::int32_t>(table), pool_size,
                                      max_ctx);
  for (std::size_t row = 0; row < pool_size; ++row) {
    const auto it = std::find(pool_rows.begin(), pool_rows.end(), static_cast<std::int64_t>(row));
    const std::size_t r = static_cast<std::size_t>(it - pool_rows.begin());
    for (std::size_t p = 0; p < max_ctx; ++p) {
      std::int32_t want = old;
      if (it != pool_rows.end() && p < static_cast<std::size_t>(f.seq_lens[r])) {
        const bool decode = in.decodes[order[r]] != 0;
        if (!decode || p + 1 == static_cast<std::size_t>(f.seq_lens[r])) {
          want = f.req_to_token[r * f.req_to_token_width + p];
        }
      }
      ASSERT_EQ(table[row * max_ctx + p], want) << where << " row " << row << " position " << p;
    }
  }
  bool any_decode = false, any_extend = false;
  for (std::size_t r = 0; r < n; ++r) (in.decodes[r] ? any_decode : any_extend) = true;
  ASSERT_EQ(f.mode, any_decode && any_extend ? prepack::sglang::forward_mode::mixed
                    : any_decode             ? prepack::sglang::forward_mode::decode
                                             : prepack::sglang::forward_mode::extend);
}

// Each malformed argument of write_req_to_token is refused, naming it, with nothing written.
TEST(EnginesErrors, SglangReqToTokenRefusesBadRowsAndSizes) {
  std::vector<std::vector<std::int32_t>> rows{{1, 2}, {3}};
  prepack::step_builder<> b(4, 8, [](std::size_t q) { return "seq " + std::to_string(q); });
  const std::vector<int> six{1, 2, 3, 4, 5, 6}, one{7};
  b.add(0, 40, 0, prepack::span<const int>(six), prepack::span<const std::int32_t>(rows[0]), true,
        false, 6);
  b.add(1, 41, 2, prepack::span<const int>(one), prepack::span<const std::int32_t>(rows[1]), true,
        true, 2);
  const auto in = std::move(b).finish();
  const std::vector<std::size_t> order{0, 1};
  std::vector<std::int32_t> table(4 * 8, -1);
  const auto table0 = table;
  const auto write = [&](std::vector<std::int64_t> pool_rows, std::size_t pool, std::size_t ctx,
                         std::vector<std::size_t> seq_order) {
    prepack::sglang::write_req_to_token(in, prepack::span<const std::size_t>(seq_order),
                                        prepack::span<const std::int64_t>(pool_rows),
                                        prepack::span<std::int32_t>(table), pool, ctx);
  };
  EXPECT_PREPACK_ERROR(write({0, 4}, 4, 8, order),
                       "sglang: request 41: req_pool_indices[1] = 4 outside the pool's rows 0..3");
  EXPECT_PREPACK_ERROR(write({-1, 2}, 4, 8, order), "req_pool_indices[0] = -1 outside");
  EXPECT_PREPACK_ERROR(write({2, 2}, 4, 8, order),
                       "sglang: requests 40 and 41 share req_to_token row 2");
  EXPECT_PREPACK_ERROR(write({0, 1}, 8, 4, order),
                       "sglang: request 40: 6 tokens exceed max_context_len 4");
  EXPECT_PREPACK_ERROR(write({0, 1}, 5, 8, order),
                       "sglang: req_to_token holds 32 entries, not 5 x 8");
  EXPECT_PREPACK_ERROR(write({0, 1}, 4, 8, {1, 1}),
                       "sglang: seq_order[1] = 1 is not a permutation of the step's 2 sequences");
  EXPECT_PREPACK_ERROR(write({0}, 4, 8, order),
                       "sglang: 2 seq_order entries and 1 req_pool_indices");
  EXPECT_EQ(table, table0);  // nothing half-written
  write({3, 0}, 4, 8, order);
  EXPECT_EQ(std::vector<std::int32_t>(table.begin() + 24, table.begin() + 32),
            (std::vector<std::int32_t>{4, 5, 6, 7, 8, 9, -1, -1}));
  EXPECT_EQ(std::vector<std::int32_t>(table.begin(), table.begin() + 4),
            (std::vector<std::int32_t>{-1, -1, 14, -1}));  // the decode's one position
}

// ---------- TensorRT-LLM ----------
void expect_trtllm(const prepack::step_inputs<>& in, const std::string& where) {
  const std::size_t layers = 3;
  const auto a = prepack::trtllm::make_step(in, {layers, 0});
  const std::size_t n = in.n_seqs();
  // Context requests first, each group in step order.
  std::vector<std::size_t> order;
  for (std::size_t q = 0; q < n; ++q)
    if (!in.decodes[q]) order.push_back(q);
  const auto contexts = static_cast<int>(order.size());
  for (std::size_t q = 0; q < n; ++q)
    if (in.decodes[q]) order.push_back(q);
  ASSERT_EQ(a.seq_order, order) << where;
  ASSERT_EQ(a.num_contexts, contexts);
  std::vector<int> ids;
  for (std::size_t r = 0; r < n; ++r) {
    const std::size_t q = order[r];
    ASSERT_EQ(a.host_request_types[r], static_cast<int>(r) < contexts ? 0 : 1);
    ASSERT_EQ(a.kv_lens[r], a.num_cached_tokens_per_seq[r] + a.seq_lens[r]);
    ASSERT_EQ(a.seq_lens[r], in.query_lens[q]);
    // TensorRT-LLM's _prepare_tp_inputs (tensorrt_llm/_torch/pyexecutor/model_engine.py)
    // passes as context_lengths the tokens of this chunk for a context request
    // (prompt_lengths.append(len(prompt_tokens))) and the prompt's length for a generation one.
    ASSERT_EQ(a.context_lengths[r], in.decodes[q] ? in.prompt_lens[q] : in.query_lens[q]);
    const auto blocks = in.tables.blocks(q);
    for (std::size_t k = 0; k < a.max_blocks_per_seq; ++k) {
      for (int field = 0; field < 2; ++field) {
        // flat_index3(block, layerIdx = 0, fieldIdx, numLayers, kvFactor = 2)
        const int want =
            k < blocks.size() ? (blocks[k] * static_cast<int>(layers) + 0) * 2 + field : 0;
        ASSERT_EQ(a.kv_cache_block_offsets[(r * 2 + static_cast<std::size_t>(field)) *
                                               a.max_blocks_per_seq +
                                           k],
                  want)
            << where;
      }
    }
    // TensorRT-LLM 1.2's WindowBlockManager::setOffsets (kvCacheManager.cpp) for several pools,
    // layer-first pools and K-only caches: offsets[pool][slot][x][k] = flat_index3(b, 0, field,
    // pool.numLayers, kvFactor), or flat_index3(0, b, field, numPrimaryBlocks, kvFactor) when
    // pool.layerFirstLayout; kvFactor 1 and fieldIdx 0 for CacheType::kSELFKONLY.
    const auto flat_index3 = [](long i, long j, long k, long dim1, long dim2) {
      return (i * dim1 + j) * dim2 + k;
    };
    for (const bool layer_first : {false, true}) {
      for (const bool k_only : {false, true}) {
        prepack::trtllm::options o;
        o.pool_layers = {2, 5};
        o.layout = layer_first ? prepack::trtllm::pool_layout::layer_first
                               : prepack::trtllm::pool_layout::block_first;
        o.k_only = k_only;
        const auto v = prepack::trtllm::make_step(in, o);
        ASSERT_EQ(v.num_pools, 2u);
        const long kv_factor = k_only ? 1 : 2, num_primary_blocks = 1000;
        for (std::size_t pool = 0; pool < 2; ++pool) {
          for (std::size_t k = 0; k < v.max_blocks_per_seq; ++k) {
            for (long x = 0; x < 2; ++x) {
              const long field = k_only ? 0 : x;
              long want = 0;
              if (k < blocks.size()) {
                want = layer_first ? flat_index3(0, blocks[k], field, num_primary_blocks, kv_factor)
                                   : flat_index3(blocks[k], 0, field,
                                                 static_cast<long>(o.pool_layers[pool]), kv_factor);
              }
              ASSERT_EQ(
                  v.kv_cache_block_offsets[((pool * n + r) * 2 + static_cast<std::size_t>(x)) *
                                               v.max_blocks_per_seq +
                                           k],
                  want)
                  << where << " pool " << pool << " layer_first " << layer_first << " k_only "
                  << k_only;
            }
          }
        }
      }
    }
    for (int t = in.cu_seqlens_q[q]; t < in.cu_seqlens_q[q + 1]; ++t) {
      ids.push_back(in.tokens[static_cast<std::size_t>(t)]);
    }
  }
  ASSERT_EQ(a.input_ids, ids) << where;
}

TEST(Engines, EveryFormMatchesItsEnginesDefinitionOnRandomSteps) {
  std::mt19937_64 rng(77);
  int steps = 0, cascades = 0;
  for (int trial = 0; trial < 150; ++trial) {
    const std::size_t bs = 1 + rng() % 8, budget = bs + rng() % 60;
    const world w = plain_world(rng, 1 + rng() % 8, bs, budget, true);
    for (std::size_t s = 0; s < w.sched.n_steps(); ++s, ++steps) {
      const auto in = prepack::make_step_inputs(w.sched, s, w.item_tokens, w.tables, w.n_blocks);
      const std::string where =
          "plain trial " + std::to_string(trial) + " step " + std::to_string(s);
      expect_vllm(in, where);
      expect_flashinfer(in, where);
      expect_sglang(in, where);
      expect_trtllm(in, where);
    }
    std::vector<std::vector<int>> prompts;
    prepack::prefix_plan plan;
    const world pw = prefix_world(rng, bs, budget, prompts, plan);
    for (std::size_t s = 0; s < pw.sched.n_steps(); ++s, ++steps) {
      const auto in =
          prepack::make_step_inputs(pw.sched, s, pw.item_tokens, pw.tables, pw.n_blocks);
      const std::string where =
          "prefix trial " + std::to_string(trial) + " step " + std::to_string(s);
      expect_vllm(in, where);
      expect_flashinfer(in, where);
      expect_sglang(in, where);
      expect_trtllm(in, where);
      cascades += prepack::flashinfer::make_step(in).cascade.has_value() ? 1 : 0;
    }
    std::vector<std::vector<std::int32_t>> rows;
    const auto mixed = mixed_step(rng, bs, rows);
    const std::string where = "mixed trial " + std::to_string(trial);
    expect_vllm(mixed, where);
    expect_flashinfer(mixed, where);
    expect_sglang(mixed, where);
    expect_trtllm(mixed, where);
  }
  EXPECT_GT(steps, 500);
  EXPECT_GT(cascades, 10);  // suffix steps of shared prefixes give cascade levels
}

// vLLM's batch order on a step holding all four regions in reverse: V1 with a backend's
// reorder_batch_threshold of 1 reverses it; V2 sorts by tokens (1, 1, 3, 3).
TEST(Engines, VllmOrdersDecodesFirstAsItsBackendsSplitThem) {
  std::vector<std::vector<std::int32_t>> rows{{1, 2}, {3, 4}, {5, 6, 7}, {8, 9, 10}};
  prepack::step_builder<> b(4, 16, [](std::size_t q) { return "seq " + std::to_string(q); });
  const std::vector<int> three{1, 2, 3}, one{4};
  // prefill (nothing cached), long extend, short extend (still prefilling), decode.
  b.add(0, 10, 0, prepack::span<const int>(three), prepack::span<const std::int32_t>(rows[0]), true,
        false, 3);
  b.add(1, 11, 4, prepack::span<const int>(three), prepack::span<const std::int32_t>(rows[1]),
        false, false, 9);
  b.add(2, 12, 8, prepack::span<const int>(one), prepack::span<const std::int32_t>(rows[2]), false,
        false, 12);
  b.add(3, 13, 9, prepack::span<const int>(one), prepack::span<const std::int32_t>(rows[3]), true,
        true, 5);
  const auto in = std::move(b).finish();
  prepack::vllm::options v1;
  v1.model_runner = prepack::vllm::runner::v1;
  const auto m = prepack::vllm::make_step(in, v1);
  EXPECT_EQ(m.req_order, (std::vector<std::size_t>{3, 2, 1, 0}));
  EXPECT_EQ(prepack::vllm::make_step(in).req_order, (std::vector<std::size_t>{2, 3, 0, 1}));
  EXPECT_EQ(m.query_start_loc, (std::vector<std::int32_t>{0, 1, 2, 5, 8}));
  EXPECT_EQ(m.req_ids, (std::vector<std::int64_t>{13, 12, 11, 10}));
  expect_vllm(in, "regions");
  const auto f = prepack::sglang::make_forward_batch(in);
  EXPECT_EQ(f.seq_order, (std::vector<std::size_t>{0, 1, 2, 3}));  // extends, then the decode
  EXPECT_EQ(f.mode, prepack::sglang::forward_mode::mixed);
}

// vLLM's V1 reorder swaps, it does not sort stably: a prefill ahead of two decodes trades places
// with the last decode (reorder_batch_to_split_decodes_and_prefills: needs_swap at positions 0
// and 2, src_dest_map {2: 0, 0: 2}, one swap_states(2, 0)), so the decodes run 2, 1. V2 sorts
// stably by tokens (1, 1, 3): 1, 2, 0. Backends without a threshold (CPU) keep 0, 1, 2.
TEST(Engines, VllmBatchOrderIsEachRunnersOwn) {
  std::vector<std::vector<std::int32_t>> rows{{1}, {2}, {3}};
  prepack::step_builder<> b(4, 8, [](std::size_t q) { return "seq " + std::to_string(q); });
  const std::vector<int> three{1, 2, 3}, one{4};
  b.add(0, 10, 0, prepack::span<const int>(three), prepack::span<const std::int32_t>(rows[0]), true,
        false, 3);
  for (std::size_t q = 1; q < 3; ++q) {
    b.add(q, static_cast<std::int64_t>(10 + q), 2, prepack::span<const int>(one),
          prepack::span<const std::int32_t>(rows[q]), true, true, 2);
  }
  const auto in = std::move(b).finish();
  prepack::vllm::options v1;
  v1.model_runner = prepack::vllm::runner::v1;
  EXPECT_EQ(prepack::vllm::make_step(in, v1).req_order, (std::vector<std::size_t>{2, 1, 0}));
  EXPECT_EQ(prepack::vllm::make_step(in, v1).is_prefilling, (std::vector<std::uint8_t>{0, 0, 1}));
  v1.reorder_batch_threshold = 0;
  EXPECT_EQ(prepack::vllm::make_step(in, v1).req_order, (std::vector<std::size_t>{0, 1, 2}));
  EXPECT_EQ(prepack::vllm::make_step(in).req_order, (std::vector<std::size_t>{1, 2, 0}));  // V2
  expect_vllm(in, "three");
}

// What the engines would fail on is refused: an empty step (vLLM's _prepare_inputs asserts
// num_reqs > 0; llama_decode returns -1 on an empty batch) and block 0 (vLLM's null block:
// vllm/v1/core/block_pool.py, BlockPool.null_block; SGLang's allocators hand out from 1).
TEST(Engines, EmptyStepsAndTheNullBlockAreRefused) {
  const auto empty =
      std::move(prepack::step_builder<>(4, 8, [](std::size_t) { return ""; })).finish();
  EXPECT_PREPACK_ERROR(prepack::vllm::make_step(empty), "vllm: a step with no requests");
  EXPECT_PREPACK_ERROR(prepack::sglang::make_forward_batch(empty),
                       "sglang: a step with no requests");
  prepack::step_schedule hollow;
  hollow.budget = 4;
  hollow.step_begin = {0, 0};
  EXPECT_PREPACK_ERROR(prepack::llama_cpp::make_batch(hollow, 0, std::vector<std::vector<int>>{},
                                                      prepack::span<const std::int64_t>()),
                       "llama.cpp: step 0 has no tokens");
  const auto sched = prepack::budgeted_schedule(std::vector<int>{5}, {8});
  const auto toks = test::tagged_prompts({5}, 100);
  const auto with_zero =
      prepack::make_step_inputs(sched, 0, toks, prepack::make_block_tables({{3, 0}}, 4), 8);
  EXPECT_PREPACK_ERROR(prepack::vllm::make_step(with_zero),
                       "vllm: request 0: block_table[1] = 0, vLLM's null block");
  EXPECT_PREPACK_ERROR(prepack::sglang::make_forward_batch(with_zero),
                       "sglang: request 0: block_table[1] = 0 holds location 0");
  // The allocators that keep it.
  prepack::block_allocator alloc(3, true);
  EXPECT_EQ(alloc.n_free(), 2u);
  EXPECT_EQ(alloc.allocate(2), (std::vector<std::int32_t>{1, 2}));
  EXPECT_PREPACK_ERROR(alloc.allocate(1), "1 blocks wanted, 0 of 3 free");
  EXPECT_PREPACK_ERROR(alloc.release(0), "block 0 is the null block");
  prepack::block_pool pool(3, 4, true, true);
  EXPECT_EQ(pool.usable(), 2u);
  EXPECT_EQ(pool.allocate(), std::optional<std::int32_t>(1));
  EXPECT_EQ(pool.allocate(), std::optional<std::int32_t>(2));
  EXPECT_FALSE(pool.allocate().has_value());
  EXPECT_PREPACK_ERROR(pool.acquire(0), "block pool: block 0 is the null block");
}

TEST(Engines, DecodeStepsInEveryForm) {
  const std::size_t bs = 4;
  std::vector<std::vector<std::int32_t>> rows{{5, 9}, {2}, {7, 1, 3}};
  std::vector<prepack::decode_sequence<int>> seqs;
  const std::size_t ctx[] = {6, 3, 9};
  for (std::size_t i = 0; i < rows.size(); ++i) {
    seqs.push_back({static_cast<std::int64_t>(i + 10), 42 + static_cast<int>(i), ctx[i],
                    prepack::span<const std::int32_t>(rows[i]), ctx[i]});
  }
  const auto in = prepack::make_decode_inputs(seqs, bs, 16);
  expect_vllm(in, "decode");
  expect_flashinfer(in, "decode");
  expect_sglang(in, "decode");
  expect_trtllm(in, "decode");
  const auto f = prepack::sglang::make_forward_batch(in);
  EXPECT_EQ(f.mode, prepack::sglang::forward_mode::decode);
  for (std::size_t r = 0; r < 3; ++r) EXPECT_EQ(f.positions[r], f.seq_lens[r] - 1);  // decode
  const auto t = prepack::trtllm::make_step(in);
  EXPECT_EQ(t.num_contexts, 0);
  EXPECT_EQ(t.num_generations, 3);
  // A decode whose table lacks the block of its new position is refused, named.
  std::vector<std::int32_t> short_row{5};
  seqs[0].blocks = prepack::span<const std::int32_t>(short_row);
  EXPECT_PREPACK_ERROR(prepack::make_decode_inputs(seqs, bs, 16),
                       "sequence 10: positions up to 7 need 2 blocks of 4");
  // Overflowing contexts name the sequence too.
  seqs[0].context = std::numeric_limits<std::size_t>::max();
  EXPECT_PREPACK_ERROR(prepack::make_decode_inputs(seqs, bs, 16),
                       "sequence 10: context 18446744073709551615 + 1 tokens overflows size_t");
  seqs[0].context = std::size_t{1} << 40;
  EXPECT_PREPACK_ERROR(prepack::make_decode_inputs(seqs, bs, 16),
                       "sequence 10: context 1099511627776 + 1 tokens = 1099511627777 positions "
                       "do not fit the int32 index type");
}

TEST(Engines, FormsRefuseWhatTheirEngineRefuses) {
  std::mt19937_64 rng(3);
  // TensorRT-LLM: a context chunk short of its prompt's end that is not whole blocks.
  const auto sched = prepack::budgeted_schedule(std::vector<int>{10}, {7, prepack::chunking::fill});
  const auto toks = test::tagged_prompts({10}, 100);
  const auto tables = prepack::make_block_tables({{1, 2, 3}}, 4);
  const auto first = prepack::make_step_inputs(sched, 0, toks, tables, 5);
  EXPECT_PREPACK_ERROR(prepack::trtllm::make_step(first),
                       "request 0: context chunk of 7 tokens is not a whole number of blocks of 4");
  // A prompt's last chunk may be any length and start anywhere.
  const auto second = prepack::make_step_inputs(sched, 1, toks, tables, 5);
  EXPECT_NO_THROW(prepack::trtllm::make_step(second));
  // A chunk need not start at a block boundary (MicroBatchScheduler::setCtxRequestsChunkSize
  // sizes chunks, not starts: after a partial prefix reuse a request resumes mid-block); only
  // its size must be whole blocks when more of the prompt follows.
  std::vector<prepack::schedule_item> reuse(1);
  reuse[0].length = 12;
  reuse[0].context = 5;
  reuse[0].prompt = 0;
  const auto resumed =
      prepack::budgeted_schedule(prepack::span<const prepack::schedule_item>(reuse),
                                 {8, prepack::chunking::fill, prepack::schedule_order::arrival, 4});
  const auto rtoks = test::tagged_prompts({12}, 100);
  const auto rtables = prepack::make_block_tables({{0, 1, 2, 3, 4}}, 4);
  for (std::size_t s = 0; s < resumed.n_steps(); ++s) {
    const auto in = prepack::make_step_inputs(resumed, s, rtoks, rtables, 8);
    ASSERT_EQ(in.context_lens[0], s == 0 ? 5 : 13);
    EXPECT_NO_THROW(prepack::trtllm::make_step(in));
  }
  const auto aligned = prepack::budgeted_schedule(
      std::vector<int>{10}, {7, prepack::chunking::fill, prepack::schedule_order::arrival, 4});
  for (std::size_t s = 0; s < aligned.n_steps(); ++s) {
    EXPECT_NO_THROW(
        prepack::trtllm::make_step(prepack::make_step_inputs(aligned, s, toks, tables, 5)));
  }
  // Widths below what a step needs.
  EXPECT_PREPACK_ERROR(prepack::vllm::make_step(first, {1, 0}), "max_num_blocks_per_req 1");
  EXPECT_PREPACK_ERROR(prepack::vllm::make_step(first, {0, 2}), "num_tokens_padded 2");
  // vLLM's CPU backend takes block sizes that are multiples of 32 (CPUAttentionBackend.
  // get_supported_kernel_block_sizes: MultipleOf(32)): blocks of 4 are refused when asked.
  EXPECT_PREPACK_ERROR(prepack::vllm::make_step(first, {0, 0, 0, 32}),
                       "vllm: block size 4 is not a multiple of 32");
  EXPECT_NO_THROW(prepack::vllm::make_step(first, {0, 0, 0, 4}));
  const auto two = prepack::make_step_inputs(
      prepack::budgeted_schedule(std::vector<int>{3, 2}, {8}), 0, test::tagged_prompts({3, 2}, 7),
      prepack::make_block_tables({{1}, {2}}, 4), 4);
  EXPECT_PREPACK_ERROR(prepack::vllm::make_step(two, {0, 0, 1}),
                       "num_reqs_padded 1 is below the step's 2 requests");
  EXPECT_PREPACK_ERROR(prepack::sglang::make_forward_batch(first, {}, 3), "req_to_token width 3");
  const std::vector<std::int64_t> rows_of_two{0, 1};
  EXPECT_PREPACK_ERROR(
      prepack::sglang::make_forward_batch(first, prepack::span<const std::int64_t>(rows_of_two)),
      "2 req_pool_indices for 1 requests");
}

// ---------- llama.cpp ----------
// A model of llama.cpp's KV cells by sequence id, with the checks llama_batch_allocr::init makes
// on every batch: ids in [0, n_seq_max), tokens below the vocabulary, each sequence's positions
// continuous, non-decreasing and starting right after what the cache holds for it.
struct llama_memory {
  std::map<int, std::set<int>> cells;  // seq id -> positions held

  void decode(const prepack::llama_cpp::batch& b, int n_vocab, int n_seq_max,
              const std::string& where) {
    std::map<int, std::vector<int>> by_seq;
    for (std::size_t i = 0; i < b.token.size(); ++i) {
      ASSERT_EQ(b.n_seq_id[i], 1);
      ASSERT_GE(b.token[i], 0);
      ASSERT_LT(b.token[i], n_vocab);
      ASSERT_GE(b.seq_id[i], 0) << where;
      ASSERT_LT(b.seq_id[i], n_seq_max) << where;
      auto& v = by_seq[b.seq_id[i]];
      if (!v.empty()) {
        ASSERT_GE(b.pos[i], v.back()) << where << ": positions decreasing";
      }
      v.push_back(b.pos[i]);
    }
    for (const auto& [s, v] : by_seq) {
      const auto& held = cells[s];
      const int p0 = held.empty() ? -1 : *held.rbegin();  // seq_pos_max
      if (p0 >= 0) {
        ASSERT_EQ(v.front(), p0 + 1) << where << ": sequence " << s;
      }
      ASSERT_EQ(v.back() - v.front() + 1, static_cast<int>(v.size()))
          << where << ": not continuous";
    }
    for (const auto& [s, v] : by_seq) cells[s].insert(v.begin(), v.end());
  }
  // llama_kv_cache::seq_cp across KV streams (kv_unified = false, llama.cpp's default): only a
  // whole-sequence copy (p0 and p1 negative, or covering the buffer) is allowed, and it makes
  // dst's stream a copy of src's (GGML_ASSERT(is_full && "seq_cp() is only supported for full
  // KV buffers")); partial ranges abort there.
  void seq_cp(const prepack::llama_cpp::seq_copy& c) {
    ASSERT_TRUE(c.p0 < 0 && c.p1 < 0) << "a partial copy aborts llama.cpp's default context";
    cells[c.dst] = cells[c.src];
  }
};

TEST(Engines, LlamaCppBatchesFollowItsRulesAndSharePrefixesByCopies) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t bs = 1 + rng() % 6;
    std::vector<std::vector<int>> prompts;
    prepack::prefix_plan plan;
    const world w = prefix_world(rng, bs, bs + rng() % 40, prompts, plan);
    std::vector<std::int64_t> ids;
    for (std::size_t i = 0; i < prompts.size(); ++i)
      ids.push_back(static_cast<std::int64_t>(2 * i + 1));
    const auto steps = prepack::llama_cpp::make_prefix_steps(
        plan, w.sched, prompts, prepack::span<const std::int64_t>(ids), 16);
    llama_memory mem;
    std::vector<std::size_t> outputs;
    for (std::size_t s = 0; s < steps.size(); ++s) {
      mem.decode(steps[s].batch, 1000, 16,
                 "trial " + std::to_string(trial) + " step " + std::to_string(s));
      for (const auto& c : steps[s].copies_after) mem.seq_cp(c);
      outputs.insert(outputs.end(), steps[s].batch.output_item.begin(),
                     steps[s].batch.output_item.end());
      // As many logits flags as output rows, each on an item that ends a prompt.
      const auto& bt = steps[s].batch;
      ASSERT_EQ(static_cast<std::size_t>(std::count(bt.logits.begin(), bt.logits.end(), 1)),
                bt.output_item.size());
      for (std::size_t item : bt.output_item) ASSERT_TRUE(plan.items[item].ends_prompt);
    }
    // Every prompt's sequence holds exactly positions [0, its length), and every prompt's last
    // item gives one output row.
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      const auto& held = mem.cells[static_cast<int>(ids[i])];
      ASSERT_EQ(held.size(), prompts[i].size()) << "trial " << trial << " prompt " << i;
      ASSERT_EQ(*held.rbegin(), static_cast<int>(prompts[i].size()) - 1);
      ASSERT_NE(std::find(outputs.begin(), outputs.end(), plan.prompt_last_item[i]), outputs.end());
    }
    std::set<std::size_t> unique(outputs.begin(), outputs.end());
    ASSERT_EQ(unique.size(), outputs.size());  // one row per item that ends a prompt
  }
  // Ids outside n_seq_max are refused, naming the item.
  const auto sched = prepack::budgeted_schedule(std::vector<int>{3, 2}, {8});
  const auto toks = test::tagged_prompts({3, 2}, 100);
  const std::vector<std::int64_t> bad{0, 16};
  EXPECT_PREPACK_ERROR(
      prepack::llama_cpp::make_batch(sched, 0, toks, prepack::span<const std::int64_t>(bad), 16),
      "prompt 1: seq_id 16 outside llama.cpp's 0..15");
  // The batch fills a llama_batch-shaped struct.
  struct fake_batch {
    int n_tokens = 0;
    std::vector<int> token_v, pos_v, n_seq_id_v;
    std::vector<std::vector<int>> seq;
    std::vector<std::int8_t> logits_v;
    int* token;
    int* pos;
    int* n_seq_id;
    std::vector<int*> seq_ptrs;
    int** seq_id;
    std::int8_t* logits;
    explicit fake_batch(int count)
        : token_v(static_cast<std::size_t>(count)),
          pos_v(token_v.size()),
          n_seq_id_v(token_v.size()),
          seq(token_v.size(), std::vector<int>(1)),
          logits_v(token_v.size()) {
      token = token_v.data();
      pos = pos_v.data();
      n_seq_id = n_seq_id_v.data();
      for (auto& s : seq) seq_ptrs.push_back(s.data());
      seq_id = seq_ptrs.data();
      logits = logits_v.data();
    }
  };
  const std::vector<std::int64_t> good{4, 5};
  const auto b =
      prepack::llama_cpp::make_batch(sched, 0, toks, prepack::span<const std::int64_t>(good));
  fake_batch fb(8);
  b.fill(fb);
  EXPECT_EQ(fb.n_tokens, 5);
  EXPECT_EQ(fb.seq[4][0], 5);
  EXPECT_EQ(fb.logits_v[2], 1);
  EXPECT_EQ(fb.logits_v[4], 1);
  EXPECT_EQ(fb.pos_v[3], 0);
}

}  // namespace
