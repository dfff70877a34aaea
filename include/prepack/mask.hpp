// prepack/mask.hpp - attention masks and engine input formats derived from a packed layout.
//
//  dense mask      [n_rows][width][width]  block-diagonal causal; any element type (bool,
//                                          uint8, additive float 0 / -inf). O(n_rows * width^2).
//  attention mask  [n_rows][width]         1 on real tokens, 0 on pad (Hugging Face's 2D mask).
//  varlen batch    cu_seqlens over the real tokens of all rows, FlashAttention / vLLM style.
//  token batch     per-token (token, pos, seq_id, logits) as llama.cpp's llama_batch takes them.
// Prefer the compact forms: the dense mask is for kernels that can take nothing else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <new>
#include <vector>

#include "detail/checked.hpp"
#include "error.hpp"
#include "layout.hpp"
#include "span.hpp"

PREPACK_NAMESPACE_BEGIN

/// Elements of the dense mask of a layout: n_rows * width * width. Throws prepack::error if
/// the count overflows size_t.
template <class Token, class Index>
std::size_t dense_mask_size(const packed_layout<Token, Index>& l) {
  return detail::mul(detail::mul(l.n_rows, l.width, "dense mask"), l.width, "dense mask");
}

/// Writes the block-diagonal causal mask into out, [n_rows][width][width], row-major: element
/// (r, q, k) is `allowed` when query slot q may attend key slot k (same prompt, k <= q) and
/// `blocked` otherwise. A pad query attends to nothing. Throws prepack::error, writing nothing,
/// if out.size() != dense_mask_size(l) or the layout is inconsistent (see check_layout). Every
/// function here checks the layout first, so a hand-edited layout is refused, never read past.
template <class T, class Token, class Index>
void fill_dense_mask(const packed_layout<Token, Index>& l, span<T> out, T allowed, T blocked) {
  const std::size_t size = dense_mask_size(l);
  check_layout(l);
  detail::require(out.size() == size, "dense mask: buffer holds ", out.size(), " elements, ",
                  l.n_rows, " x ", l.width, " x ", l.width, " = ", size, " needed");
  const std::size_t w = l.width;
  for (std::size_t r = 0; r < l.n_rows; ++r) {
    const Index* seg = l.segments.data() + r * w;
    for (std::size_t q = 0; q < w; ++q) {
      T* m = out.data() + (r * w + q) * w;
      for (std::size_t k = 0; k < w; ++k) {
        m[k] = (seg[q] >= 0 && k <= q && seg[k] == seg[q]) ? allowed : blocked;
      }
    }
  }
}

namespace detail {
template <class T, class Token, class Index>
std::vector<T> allocate_mask(const packed_layout<Token, Index>& l) {
  const std::size_t size = dense_mask_size(l);
  try {
    return std::vector<T>(size);
  } catch (const std::bad_alloc&) {
    fail("dense mask: ", size, " elements (", l.n_rows, " x ", l.width, " x ", l.width,
         ") cannot be allocated");
  } catch (const std::length_error&) {
    fail("dense mask: ", size, " elements exceed the largest vector");
  }
}
}  // namespace detail

/// The dense mask as bytes: 1 = attend, 0 = masked. [n_rows][width][width].
template <class Token, class Index>
std::vector<std::uint8_t> dense_mask(const packed_layout<Token, Index>& l) {
  std::vector<std::uint8_t> m = detail::allocate_mask<std::uint8_t>(l);
  fill_dense_mask(l, span<std::uint8_t>(m), std::uint8_t{1}, std::uint8_t{0});
  return m;
}

/// The dense mask as an additive bias, as Hugging Face's 4D masks are: 0 = attend,
/// -infinity = masked. [n_rows][width][width].
template <class F = float, class Token, class Index>
std::vector<F> additive_mask(const packed_layout<Token, Index>& l) {
  std::vector<F> m = detail::allocate_mask<F>(l);
  fill_dense_mask(l, span<F>(m), F(0), -std::numeric_limits<F>::infinity());
  return m;
}

/// Hugging Face's 2D attention_mask: [n_rows][width], 1 on real tokens, 0 on pad slots.
template <class Token, class Index>
std::vector<std::uint8_t> attention_mask(const packed_layout<Token, Index>& l) {
  check_layout(l);
  std::vector<std::uint8_t> m(l.segments.size());
  for (std::size_t s = 0; s < m.size(); ++s) m[s] = l.segments[s] >= 0 ? 1 : 0;
  return m;
}

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
  std::vector<Index> positions;   // [n_tokens]      position ids (restart at 0 per sequence)
};

template <class Token, class Index>
varlen_batch<Token, Index> make_varlen(const packed_layout<Token, Index>& l) {
  check_layout(l);
  varlen_batch<Token, Index> v;
  v.cu_seqlens.push_back(0);
  for (std::size_t r = 0; r < l.n_rows; ++r) {
    for (Index i : l.prompts_in_row(r)) {
      const std::size_t first =
          r * l.width + static_cast<std::size_t>(l.prompt_offset[static_cast<std::size_t>(i)]);
      const Index len = l.prompt_length[static_cast<std::size_t>(i)];
      for (std::size_t t = 0; t < static_cast<std::size_t>(len); ++t) {
        v.slot.push_back(static_cast<Index>(first + t));
        v.tokens.push_back(l.tokens[first + t]);
        v.positions.push_back(l.positions[first + t]);
      }
      v.seq_prompt.push_back(i);
      v.cu_seqlens.push_back(static_cast<Index>(v.slot.size()));
      if (len > v.max_seqlen) v.max_seqlen = len;
    }
  }
  return v;
}

/// Per-token arrays as llama.cpp's llama_batch takes them (one sequence id per token, the
/// prompt id): token i has token[i], pos[i], seq_id[i], and logits[i] = 1 on each prompt's last
/// token. Tokens are the layout's real tokens in row-major slot order.
template <class Token, class Index>
struct token_batch {
  std::vector<Token> token;         // [n_tokens]  token ids
  std::vector<Index> pos;           // [n_tokens]  position within the prompt
  std::vector<Index> seq_id;        // [n_tokens]  prompt id
  std::vector<std::int8_t> logits;  // [n_tokens]  1 where the engine must output logits
};

template <class Token, class Index>
token_batch<Token, Index> make_token_batch(const packed_layout<Token, Index>& l) {
  check_layout(l);
  token_batch<Token, Index> b;
  const std::size_t n = l.useful_tokens();
  b.token.reserve(n);
  b.pos.reserve(n);
  b.seq_id.reserve(n);
  b.logits.reserve(n);
  for (std::size_t s = 0; s < l.segments.size(); ++s) {
    const Index seg = l.segments[s];
    if (seg < 0) continue;
    b.token.push_back(l.tokens[s]);
    b.pos.push_back(l.positions[s]);
    b.seq_id.push_back(seg);
    b.logits.push_back(
        static_cast<std::size_t>(l.last_token[static_cast<std::size_t>(seg)]) == s ? 1 : 0);
  }
  return b;
}

PREPACK_NAMESPACE_END
