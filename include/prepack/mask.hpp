// prepack/mask.hpp - attention masks of a packed layout, for kernels that take a mask.
//
//  dense mask      [n_rows][width][width]  block-diagonal causal; any element type (uint8,
//                                          additive float 0 / -inf). O(n_rows * width^2).
//  transformers    [n_rows][1][width][width]  the dense mask as Hugging Face transformers reads a
//   mask                                   4D attention_mask under eager and sdpa attention:
//                                          additive in the model's dtype, 0 / its lowest finite
//                                          value, every pad query attending to its own slot.
//  attention mask  [n_rows][width]         1 on real tokens, 0 on pad (Hugging Face's 2D mask).
//  block-sparse    [n_rows][n_blocks]..    FlexAttention's BlockMask tables: per row and query
//   mask                                   block, the key blocks the mask opens in part and in
//                                          full; optionally a sliding window. O(n_rows *
//                                          n_blocks^2), never width^2.
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

/// The mask of a layout in FlexAttention's block-sparse form (the arrays torch's
/// BlockMask.from_kv_blocks takes): the width cut into blocks of block_size slots and, for every
/// row and query block, the key blocks where some query may attend some key but not every query
/// every key ("partial": the kernel evaluates the mask inside them) and those where every query
/// may attend every key ("full": computed without the mask), disjoint, each list in increasing
/// order and padded with 0. A real query attends keys of its own prompt at or before it, and with
/// window > 0 only those less than window slots back (transformers' sliding_window); a pad query
/// attends its own slot (pad_query::self). Only whole blocks inside the width are ever full, so a
/// kernel never meets a slot past the width in a block it computes without the mask.
struct block_sparse_mask {
  std::size_t block_size = 0;                    // slots per block, query and key
  std::size_t n_rows = 0;                        // rows of the layout
  std::size_t n_blocks = 0;                      // ceil(width / block_size)
  std::vector<std::int32_t> kv_num_blocks;       // [n_rows][n_blocks]  partial key blocks
  std::vector<std::int32_t> kv_indices;          // [n_rows][n_blocks][n_blocks]
  std::vector<std::int32_t> full_kv_num_blocks;  // [n_rows][n_blocks]  full key blocks
  std::vector<std::int32_t> full_kv_indices;     // [n_rows][n_blocks][n_blocks]
};

/// Builds the block-sparse mask of a layout. Throws prepack::error for block_size 0 or a
/// block count that does not fit int32. Cost: O(n_rows * n_blocks^2 + n_prompts * n_blocks)
/// time and 2 * n_rows * n_blocks * (n_blocks + 1) int32 of memory.
template <class Token, class Index>
block_sparse_mask make_block_sparse_mask(const packed_layout<Token, Index>& l,
                                         std::size_t block_size, std::size_t window = 0) {
  detail::require(block_size > 0, "block-sparse mask: block size 0");
  const std::size_t w = l.width();
  block_sparse_mask m;
  m.block_size = block_size;
  m.n_rows = l.n_rows();
  m.n_blocks = w / block_size + (w % block_size != 0 ? 1 : 0);
  const std::size_t nb = m.n_blocks;
  detail::narrow<std::int32_t>(nb, "block count");
  const std::size_t tables = detail::mul(m.n_rows, nb, "block-sparse mask");
  m.kv_num_blocks.assign(tables, 0);
  m.full_kv_num_blocks.assign(tables, 0);
  m.kv_indices.assign(detail::mul(tables, nb, "block-sparse mask"), 0);
  m.full_kv_indices.assign(m.kv_indices.size(), 0);
  enum : unsigned char { none, partial, full };
  std::vector<unsigned char> kind(nb);
  for (std::size_t r = 0; r < m.n_rows; ++r) {
    const Index* seg = l.segments().data() + r * w;
    for (std::size_t qb = 0; qb < nb; ++qb) {
      const std::size_t q0 = qb * block_size, q1 = std::min(q0 + block_size, w);
      std::fill(kind.begin(), kind.end(), none);
      for (std::size_t q = q0; q < q1; ++q) {
        // A pad query attends its own slot: all its block when that is one slot.
        if (seg[q] < 0) kind[qb] = q1 - q0 == 1 && block_size == 1 ? full : partial;
      }
      for (const Index id : l.prompts_in_row(r)) {
        const auto i = static_cast<std::size_t>(id);
        const auto s0 = static_cast<std::size_t>(l.prompt_offset()[i]);
        const std::size_t s1 = s0 + static_cast<std::size_t>(l.prompt_length()[i]);
        if (s1 <= q0 || s0 >= q1) continue;
        const std::size_t qs = std::max(s0, q0), qe = std::min(s1, q1) - 1;
        // Keys some query of [qs, qe] attends: [klo, qe], klo the oldest the window leaves.
        const std::size_t klo = window > 0 && qs + 1 > window ? std::max(s0, qs + 1 - window) : s0;
        const bool q_whole = s0 <= q0 && q1 <= s1 && q1 - q0 == block_size;
        for (std::size_t kb = klo / block_size; kb <= qe / block_size; ++kb) {
          const std::size_t k0 = kb * block_size, k1 = std::min(k0 + block_size, w);
          const bool is_full = q_whole && s0 <= k0 && k1 <= s1 && k1 - k0 == block_size &&
                               k1 - 1 <= q0 && (window == 0 || q1 - 1 - k0 < window);
          kind[kb] = std::max<unsigned char>(kind[kb], is_full ? full : partial);
        }
      }
      const std::size_t at = r * nb + qb;
      for (std::size_t kb = 0; kb < nb; ++kb) {
        if (kind[kb] == partial) {
          m.kv_indices[at * nb + static_cast<std::size_t>(m.kv_num_blocks[at]++)] =
              static_cast<std::int32_t>(kb);
        } else if (kind[kb] == full) {
          m.full_kv_indices[at * nb + static_cast<std::size_t>(m.full_kv_num_blocks[at]++)] =
              static_cast<std::int32_t>(kb);
        }
      }
    }
  }
  return m;
}

PREPACK_NAMESPACE_END
