// prepack/engines/flashinfer.hpp - one step in FlashInfer's own form (FlashInfer 0.2 to 0.7), as
// its documentation defines the page table (docs/tutorials/kv_layout.rst, "Page Table Layout" and
// "Multi-level Cascade Inference Data Layout") and as these take it:
//
//  BatchPrefillWithPagedKVCacheWrapper.plan / BatchDecodeWithPagedKVCacheWrapper.plan
//                        (flashinfer/prefill.py, flashinfer/decode.py)
//    qo_indptr               [batch + 1] int32  prefix sums of each request's new tokens
//    paged_kv_indptr         [batch + 1] int32  prefix sums of each request's page counts
//    paged_kv_indices        [paged_kv_indptr[-1]] int32  each request's pages, in order: only
//                            the pages that hold its kv_len tokens
//    paged_kv_last_page_len  [batch] int32 in [1, page_size]; a request's kv_len is
//                            page_size * (pages - 1) + last_page_len: its cached context plus the
//                            new tokens (appended first, then attended, causal bottom-right)
//  append_paged_kv_cache(append_key, append_value, batch_indices, positions, ...)
//                        (flashinfer/page.py; get_batch_indices_positions computes the two)
//    batch_indices           [nnz] int32  request of each new token
//    positions               [nnz] int32  its position: kv_len - (qo_len) + i
//  MultiLevelCascadeAttentionWrapper.plan (flashinfer/cascade.py): two levels, the pages every
//    request of the step shares (level 0: all queries as one request, non-causal) and each
//    request's own (level 1, causal).
// And the rest of what BatchPrefillWithPagedKVCacheWrapper.plan takes that a step determines
// (flashinfer/prefill.py, FlashInfer 0.7): causal = true (its default is False: a step's queries
// attend causally, bottom-right, over their cached context), and for its trtllm-gen and cuDNN
// backends seq_lens (kv lengths), seq_lens_q, block_tables [batch][max pages] (0-padded),
// max_token_per_sequence and max_sequence_kv. The heads, head dims and data types are the
// model's: the caller adds them.
// The ragged-KV form (BatchPrefillWithRaggedKVCacheWrapper) takes kv_indptr over the new tokens
// only: that is qo_indptr, not prepack's cu_seqlens_k. Cost: O(tokens + pages). Standard library.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "../detail/checked.hpp"
#include "../error.hpp"
#include "../paged.hpp"
#include "../step.hpp"

PREPACK_NAMESPACE_BEGIN
namespace flashinfer {

/// The page table of a batch, as plan() takes it.
struct paged_kv {
  std::vector<std::int32_t> qo_indptr;               // [batch + 1]
  std::vector<std::int32_t> paged_kv_indptr;         // [batch + 1]
  std::vector<std::int32_t> paged_kv_indices;        // [paged_kv_indptr.back()]
  std::vector<std::int32_t> paged_kv_last_page_len;  // [batch]  1 .. page_size
};

/// Two-level cascade: level 0 the pages all requests share, level 1 each request's own.
struct cascade_levels {
  paged_kv shared;  // qo_indptr {0, total}: every query of the step, one request
  paged_kv unique;  // qo_indptr of the step; each request's pages after the shared ones
  std::int32_t shared_pages = 0;
};

/// One step: the paged attention's plan, the append's indices, and the cascade when it applies.
struct step_plan {
  std::int32_t page_size = 0;
  bool causal = true;                       // plan(causal=...): its default is False
  std::vector<std::int32_t> seq_lens;       // [batch]  kv lengths (context + new tokens)
  std::vector<std::int32_t> seq_lens_q;     // [batch]  new tokens
  std::size_t max_pages = 0;                // block_tables' width
  std::vector<std::int32_t> block_tables;   // [batch][max_pages]  each request's pages, 0-padded
  std::int32_t max_token_per_sequence = 0;  // the longest seq_lens_q
  std::int32_t max_sequence_kv = 0;         // the longest seq_lens
  std::vector<std::int64_t> request_ids;    // [batch]  the caller's ids
  paged_kv attention;                       // BatchPrefill/BatchDecode...Wrapper.plan
  std::vector<std::int32_t> batch_indices;  // [nnz]  append_paged_kv_cache
  std::vector<std::int32_t> positions;      // [nnz]
  std::optional<cascade_levels> cascade;    // when every request shares leading pages that
                                            // hold only cached context of each
};

/// The step in FlashInfer's form. Throws prepack::error if a value does not fit int32. Cost:
/// O(tokens + the pages of the step's requests).
template <class Token, class Index>
step_plan make_step(const step_inputs<Token, Index>& in) {
  using prepack::detail::narrow;
  const std::size_t n = in.n_seqs(), ps = in.tables.block_size;
  step_plan p;
  p.page_size = narrow<std::int32_t>(ps, "page size");
  p.attention.qo_indptr.push_back(0);
  p.attention.paged_kv_indptr.push_back(0);
  std::size_t shared = n > 0 ? in.tables.blocks(0).size() : 0;
  std::size_t min_context = n > 0 ? static_cast<std::size_t>(in.context_lens[0]) : 0;
  for (std::size_t q = 0; q < n; ++q) {
    const auto kv_len = static_cast<std::size_t>(in.seq_lens[q]);
    const std::size_t pages = blocks_for(kv_len, ps);
    const auto row = in.tables.blocks(q);
    p.request_ids.push_back(in.seq_id[q]);
    p.attention.qo_indptr.push_back(narrow<std::int32_t>(in.cu_seqlens_q[q + 1], "qo_indptr"));
    for (std::size_t k = 0; k < pages; ++k) p.attention.paged_kv_indices.push_back(row[k]);
    p.attention.paged_kv_indptr.push_back(
        narrow<std::int32_t>(p.attention.paged_kv_indices.size(), "paged_kv_indptr"));
    p.attention.paged_kv_last_page_len.push_back(static_cast<std::int32_t>((kv_len - 1) % ps + 1));
    const auto row0 = in.tables.blocks(0);
    std::size_t k = 0;
    while (k < shared && k < pages && row[k] == row0[k]) ++k;
    shared = k;
    min_context = std::min(min_context, static_cast<std::size_t>(in.context_lens[q]));
    for (Index i = 0; i < in.query_lens[q]; ++i) {
      p.batch_indices.push_back(static_cast<std::int32_t>(q));
      p.positions.push_back(narrow<std::int32_t>(in.context_lens[q] + i, "position"));
    }
  }
  // The trtllm-gen / cuDNN arguments: lengths and a padded page table.
  for (std::size_t q = 0; q < n; ++q) {
    p.seq_lens.push_back(narrow<std::int32_t>(in.seq_lens[q], "seq_lens"));
    p.seq_lens_q.push_back(narrow<std::int32_t>(in.query_lens[q], "seq_lens_q"));
    p.max_token_per_sequence = std::max(p.max_token_per_sequence, p.seq_lens_q.back());
    p.max_sequence_kv = std::max(p.max_sequence_kv, p.seq_lens.back());
    const auto pages = static_cast<std::size_t>(p.attention.paged_kv_indptr[q + 1] -
                                                p.attention.paged_kv_indptr[q]);
    p.max_pages = std::max(p.max_pages, pages);
  }
  p.block_tables.assign(prepack::detail::mul(n, p.max_pages, "block_tables"), 0);
  for (std::size_t q = 0; q < n; ++q) {
    const auto b = static_cast<std::size_t>(p.attention.paged_kv_indptr[q]);
    const auto e = static_cast<std::size_t>(p.attention.paged_kv_indptr[q + 1]);
    std::copy(p.attention.paged_kv_indices.begin() + static_cast<std::ptrdiff_t>(b),
              p.attention.paged_kv_indices.begin() + static_cast<std::ptrdiff_t>(e),
              p.block_tables.begin() + static_cast<std::ptrdiff_t>(q * p.max_pages));
  }
  // Level 0 is attended without a causal mask: its pages must hold cached context of every
  // request (positions before each one's first query), whole pages of it.
  shared = std::min(shared, min_context / ps);
  if (n > 1 && shared > 0) {
    cascade_levels c;
    c.shared_pages = static_cast<std::int32_t>(shared);
    c.shared.qo_indptr = {0, p.attention.qo_indptr.back()};
    c.shared.paged_kv_indptr = {0, c.shared_pages};
    const auto row0 = in.tables.blocks(0);
    c.shared.paged_kv_indices.assign(row0.begin(),
                                     row0.begin() + static_cast<std::ptrdiff_t>(shared));
    c.shared.paged_kv_last_page_len = {p.page_size};
    c.unique.qo_indptr = p.attention.qo_indptr;
    c.unique.paged_kv_indptr.push_back(0);
    for (std::size_t q = 0; q < n; ++q) {
      const auto b = static_cast<std::size_t>(p.attention.paged_kv_indptr[q]);
      const auto e = static_cast<std::size_t>(p.attention.paged_kv_indptr[q + 1]);
      c.unique.paged_kv_indices.insert(
          c.unique.paged_kv_indices.end(),
          p.attention.paged_kv_indices.begin() + static_cast<std::ptrdiff_t>(b + shared),
          p.attention.paged_kv_indices.begin() + static_cast<std::ptrdiff_t>(e));
      c.unique.paged_kv_indptr.push_back(
          static_cast<std::int32_t>(c.unique.paged_kv_indices.size()));
    }
    c.unique.paged_kv_last_page_len = p.attention.paged_kv_last_page_len;
    p.cascade = std::move(c);
  }
  return p;
}

}  // namespace flashinfer
PREPACK_NAMESPACE_END
