// prepack/engine.hpp - engine input formats of a packed layout, for kernels that take no mask:
//
//  varlen batch  the real tokens of all rows as one flat variable-length batch, cu_seqlens per
//                sequence, FlashAttention's flash_attn_varlen_func / vLLM prefill style.
//  token batch   per-token (token, pos, seq_id, logits) as llama.cpp's llama_batch takes them,
//                with the batch's prompt ids or the caller's own sequence ids.
// Budgeted steps over a paged KV pool have their own, richer form: prepack/step.hpp.
// Cost: O(n_slots) time, O(useful tokens) memory. Every value stored is checked to fit Index.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "detail/checked.hpp"
#include "error.hpp"
#include "layout.hpp"
#include "span.hpp"

PREPACK_NAMESPACE_BEGIN

/// The real tokens of a layout as one flat variable-length batch (FlashAttention's
/// flash_attn_varlen_func, vLLM's prefill metadata): sequence s is the s-th prompt met in
/// row-major slot order, its tokens at [cu_seqlens[s], cu_seqlens[s + 1]).
template <class Token, class Index>
struct varlen_batch {
  std::vector<Index> cu_seqlens;  // [n_seqs + 1]    0, end of sequence 0, end of sequence 1, ..
  Index max_seqlen = 0;           // longest sequence
  std::vector<Index> seq_prompt;  // [n_seqs]        prompt id of sequence s
  std::vector<Index> slot;        // [n_tokens]      flat layout slot of token t (gather index)
  std::vector<Token> tokens;      // [n_tokens]      token ids
  std::vector<Index> positions;   // [n_tokens]      position ids (from each prompt's context)
};

/// Throws prepack::error if the layout's useful tokens do not fit Index (cu_seqlens holds
/// their total).
template <class Token, class Index>
varlen_batch<Token, Index> make_varlen(const packed_layout<Token, Index>& l) {
  detail::narrow<Index>(l.useful_tokens(), "cu_seqlens total");
  varlen_batch<Token, Index> v;
  v.cu_seqlens.reserve(l.n_prompts() + 1);
  v.slot.reserve(l.useful_tokens());
  v.tokens.reserve(l.useful_tokens());
  v.positions.reserve(l.useful_tokens());
  v.cu_seqlens.push_back(0);
  for (std::size_t r = 0; r < l.n_rows(); ++r) {
    for (Index i : l.prompts_in_row(r)) {
      const auto p = static_cast<std::size_t>(i);
      const std::size_t first = l.first_slot(p);
      const Index len = l.prompt_length()[p];
      for (std::size_t t = 0; t < static_cast<std::size_t>(len); ++t) {
        v.slot.push_back(static_cast<Index>(first + t));
        v.tokens.push_back(l.tokens()[first + t]);
        v.positions.push_back(l.positions()[first + t]);
      }
      v.seq_prompt.push_back(i);
      v.cu_seqlens.push_back(static_cast<Index>(v.slot.size()));
      if (len > v.max_seqlen) v.max_seqlen = len;
    }
  }
  return v;
}

/// Per-token arrays as llama.cpp's llama_batch takes them (one sequence id per token): token i
/// has token[i], pos[i], seq_id[i], and logits[i] = 1 on each prompt's last token. Tokens are
/// the layout's real tokens in row-major slot order.
template <class Token, class Index, class SeqId = Index>
struct token_batch {
  std::vector<Token> token;         // [n_tokens]  token ids
  std::vector<Index> pos;           // [n_tokens]  position within the prompt
  std::vector<SeqId> seq_id;        // [n_tokens]  the prompt's id, or the caller's id for it
  std::vector<std::int8_t> logits;  // [n_tokens]  1 where the engine must output logits
};

namespace detail {
template <class SeqId, class Token, class Index, class Id>
token_batch<Token, Index, SeqId> token_batch_of(const packed_layout<Token, Index>& l, Id&& id_of) {
  token_batch<Token, Index, SeqId> b;
  const std::size_t n = l.useful_tokens();
  b.token.reserve(n);
  b.pos.reserve(n);
  b.seq_id.reserve(n);
  b.logits.reserve(n);
  for (std::size_t s = 0; s < l.n_slots(); ++s) {
    const Index seg = l.segments()[s];
    if (seg < 0) continue;
    const auto p = static_cast<std::size_t>(seg);
    b.token.push_back(l.tokens()[s]);
    b.pos.push_back(l.positions()[s]);
    b.seq_id.push_back(id_of(p));
    b.logits.push_back(static_cast<std::size_t>(l.last_token()[p]) == s ? 1 : 0);
  }
  return b;
}
}  // namespace detail

/// The token batch with the batch's prompt ids (0 .. n_prompts - 1) as sequence ids.
template <class Token, class Index>
token_batch<Token, Index> make_token_batch(const packed_layout<Token, Index>& l) {
  return detail::token_batch_of<Index>(l, [](std::size_t p) { return static_cast<Index>(p); });
}

/// The token batch with the caller's own sequence ids: prompt i's tokens carry seq_ids[i] (a
/// llama_seq_id, a request id). Throws prepack::error if seq_ids does not hold one id per
/// prompt.
template <class Token, class Index, class SeqId>
token_batch<Token, Index, SeqId> make_token_batch(const packed_layout<Token, Index>& l,
                                                  span<const SeqId> seq_ids) {
  detail::require(seq_ids.size() == l.n_prompts(), "sequence ids: ", seq_ids.size(), " for ",
                  l.n_prompts(), " prompts");
  return detail::token_batch_of<SeqId>(l, [&](std::size_t p) { return seq_ids[p]; });
}

template <class Token, class Index, class SeqId>
token_batch<Token, Index, SeqId> make_token_batch(const packed_layout<Token, Index>& l,
                                                  const std::vector<SeqId>& seq_ids) {
  return make_token_batch(l, span<const SeqId>(seq_ids));
}

PREPACK_NAMESPACE_END
