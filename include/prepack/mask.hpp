// prepack/mask.hpp - attention masks of a packed layout, for kernels that take a mask.
//
//  dense mask      [n_rows][width][width]  block-diagonal causal; any element type (uint8,
//                                          additive float 0 / -inf). O(n_rows * width^2).
//  transformers    [n_rows][1][width][width]  the dense mask as Hugging Face transformers reads a
//   mask                                   4D attention_mask under eager and sdpa attention:
//                                          additive in the model's dtype, 0 / its lowest finite
//                                          value, every pad query attending to its own slot.
//  attention mask  [n_rows][width]         1 on real tokens, 0 on pad (Hugging Face's 2D mask).
// Prefer the compact engine formats (prepack/engine.hpp: cu_seqlens, per-token arrays): the
// dense mask is for kernels that can take nothing else. A chunk that continues cached context
// attends to that context too, which a mask over the batch's own slots cannot say: its mask
// covers the batch's part only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <new>
#include <type_traits>
#include <vector>

#include "detail/checked.hpp"
#include "error.hpp"
#include "layout.hpp"
#include "numeric.hpp"
#include "span.hpp"

PREPACK_NAMESPACE_BEGIN

/// Elements of the dense mask of a layout: n_rows * width * width. Throws prepack::error if
/// the count overflows size_t.
template <class Token, class Index>
std::size_t dense_mask_size(const packed_layout<Token, Index>& l) {
  return detail::mul(detail::mul(l.n_rows(), l.width(), "dense mask"), l.width(), "dense mask");
}

/// What a pad slot's query row of a dense mask opens.
enum class pad_query {
  nothing,  // no key: kernels that give an empty row zeros (prepack's own)
  self,     // its own slot only: for softmax over a finite mask (transformers' eager attention),
            // where a row with no key open would give NaN that reaches real tokens through the
            // next layer's K and V; real queries never attend a pad slot either way
};

/// Writes the block-diagonal causal mask into out, [n_rows][width][width], row-major: element
/// (r, q, k) is `allowed` when query slot q may attend key slot k (same prompt, k <= q) and
/// `blocked` otherwise; a pad query attends to nothing, or to itself with pad_query::self.
/// Throws prepack::error, writing nothing, if out.size() != dense_mask_size(l). For a mask of
/// bool, pass a bool array (std::unique_ptr<bool[]>, std::array) or use uint8: std::vector<bool>
/// packs bits and has no contiguous storage.
template <class T, class Token, class Index>
void fill_dense_mask(const packed_layout<Token, Index>& l, span<T> out, T allowed, T blocked,
                     pad_query pad = pad_query::nothing) {
  const std::size_t size = dense_mask_size(l);
  detail::require(out.size() == size, "dense mask: buffer holds ", out.size(), " elements, ",
                  l.n_rows(), " x ", l.width(), " x ", l.width(), " = ", size, " needed");
  const std::size_t w = l.width();
  for (std::size_t r = 0; r < l.n_rows(); ++r) {
    const Index* seg = l.segments().data() + r * w;
    for (std::size_t q = 0; q < w; ++q) {
      T* m = out.data() + (r * w + q) * w;
      if (seg[q] < 0) {
        std::fill(m, m + w, blocked);
        if (pad == pad_query::self) m[q] = allowed;
        continue;
      }
      for (std::size_t k = 0; k < w; ++k) {
        m[k] = (k <= q && seg[k] == seg[q]) ? allowed : blocked;
      }
    }
  }
}

template <class Token, class Index, class A>
void fill_dense_mask(const packed_layout<Token, Index>&, std::vector<bool, A>&, bool, bool) {
  static_assert(!std::is_same_v<A, A>,
                "std::vector<bool> has no contiguous storage: use std::vector<std::uint8_t>, or "
                "a bool array (std::unique_ptr<bool[]>) through prepack::span<bool>");
}

namespace detail {
template <class T, class Token, class Index>
std::vector<T> allocate_mask(const packed_layout<Token, Index>& l) {
  const std::size_t size = dense_mask_size(l);
  // A mask larger than memory stays std::bad_alloc (nothing is written); one larger than any
  // vector can hold is the caller's layout: prepack::error.
  try {
    return std::vector<T>(size);
  } catch (const std::length_error&) {
    fail("dense mask: ", size, " elements exceed the largest vector");
  }
}
}  // namespace detail

/// The dense mask as bytes: 1 = attend, 0 = masked. [n_rows][width][width]. Throws
/// std::bad_alloc when it does not fit in memory, prepack::error when its size overflows.
template <class Token, class Index>
std::vector<std::uint8_t> dense_mask(const packed_layout<Token, Index>& l) {
  std::vector<std::uint8_t> m = detail::allocate_mask<std::uint8_t>(l);
  fill_dense_mask(l, span<std::uint8_t>(m), std::uint8_t{1}, std::uint8_t{0});
  return m;
}

/// The dense mask as an additive bias, as Hugging Face's 4D masks are: 0 = attend,
/// -infinity = masked. [n_rows][width][width]. Throws as dense_mask does.
template <class F = float, class Token, class Index>
std::vector<F> additive_mask(const packed_layout<Token, Index>& l) {
  std::vector<F> m = detail::allocate_mask<F>(l);
  fill_dense_mask(l, span<F>(m), F(0), -std::numeric_limits<F>::infinity());
  return m;
}

/// Fills out ([n_rows][1][width][width], row-major) with the mask as Hugging Face transformers
/// reads a 4D attention_mask: additive, 0 where a query may attend and F's lowest finite value
/// (torch.finfo(dtype).min) elsewhere, and every pad query attending to its own slot. Eager
/// attention adds the mask to the scores, so an infinity or a row with no key open would give
/// NaN; sdpa takes the same float mask. F is the model's dtype: float, double, half or bfloat16.
/// Throws as fill_dense_mask does.
template <class F, class Token, class Index>
void fill_transformers_mask(const packed_layout<Token, Index>& l, span<F> out) {
  fill_dense_mask(l, out, convert<F>(0.0f), lowest_finite<F>(), pad_query::self);
}

/// The same, as a new buffer. Throws as additive_mask does.
template <class F = float, class Token, class Index>
std::vector<F> transformers_mask(const packed_layout<Token, Index>& l) {
  std::vector<F> m = detail::allocate_mask<F>(l);
  fill_transformers_mask(l, span<F>(m));
  return m;
}

/// Hugging Face's 2D attention_mask: [n_rows][width], 1 on real tokens, 0 on pad slots.
template <class Token, class Index>
std::vector<std::uint8_t> attention_mask(const packed_layout<Token, Index>& l) {
  std::vector<std::uint8_t> m(l.n_slots());
  for (std::size_t s = 0; s < m.size(); ++s) m[s] = l.segments()[s] >= 0 ? 1 : 0;
  return m;
}

PREPACK_NAMESPACE_END
