// prepack/unpack.hpp - scatters per-token results of a packed prefill (K, V, hidden states)
// back to the prompts they belong to, into caller memory described by strided views.
//
// Source: any per-token tensor of the packed batch seen as (row, slot, head, dim), whatever its
// physical layout ([n_rows][n_heads][width][head_dim], [n_rows][width][n_heads][head_dim], or
// any strides). Destinations: one buffer per prompt, a left-padded decode batch, a paged KV
// pool through a block table; gather_last picks each prompt's last-token row.
// Cost: O(useful tokens * n_heads * head_dim) copies, O(n_prompts) checks, no allocation
// (except the overlap check of per-prompt destinations: O(n_prompts)). Every function checks all
// of its input first and throws prepack::error without writing anything.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <functional>
#include <numeric>
#include <vector>

#include "detail/checked.hpp"
#include "error.hpp"
#include "layout.hpp"
#include "span.hpp"

PREPACK_NAMESPACE_BEGIN

/// Physical orders of a packed KV tensor, for packed_view().
enum class kv_order {
  row_head_slot_dim,  // [n_rows][n_heads][width][head_dim]  (Hugging Face past_key_values)
  row_slot_head_dim,  // [n_rows][width][n_heads][head_dim]  (the projections' output order)
};

/// Views a contiguous packed tensor as (row, slot, head, dim).
template <class T>
tensor_view<T, 4> packed_view(T* data, kv_order order, std::size_t n_rows, std::size_t width,
                              std::size_t n_heads, std::size_t head_dim) {
  if (order == kv_order::row_head_slot_dim) {
    return {data,
            {n_rows, width, n_heads, head_dim},
            {n_heads * width * head_dim, head_dim, width * head_dim, 1}};
  }
  return {data,
          {n_rows, width, n_heads, head_dim},
          {width * n_heads * head_dim, n_heads * head_dim, head_dim, 1}};
}

/// Physical orders of one prompt's cache, for prompt_view().
enum class cache_order {
  head_position_dim,  // [n_heads][capacity][head_dim]  (Hugging Face, one prompt)
  position_head_dim,  // [capacity][n_heads][head_dim]
};

/// Views one prompt's contiguous cache of `capacity` positions as (position, head, dim).
template <class T>
tensor_view<T, 3> prompt_view(T* data, cache_order order, std::size_t capacity, std::size_t n_heads,
                              std::size_t head_dim) {
  if (order == cache_order::head_position_dim) {
    return {data, {capacity, n_heads, head_dim}, {head_dim, capacity * head_dim, 1}};
  }
  return {data, {capacity, n_heads, head_dim}, {n_heads * head_dim, head_dim, 1}};
}

namespace detail {

// The source seen read-only; its element type must be the destination's.
template <class T, class S, std::size_t R>
tensor_view<const T, R> as_const(const tensor_view<S, R>& v) {
  static_assert(std::is_same_v<std::remove_const_t<S>, T>,
                "source and destination element types differ");
  return {v.data, v.extent, v.stride};
}

// Offset of the last element a view can reach, checked against size_t overflow.
template <class T, std::size_t R>
std::size_t reach(const tensor_view<T, R>& v, const char* what) {
  std::size_t off = 0;
  for (std::size_t d = 0; d < R; ++d) {
    if (v.extent[d] == 0) return 0;
    off = add(off, mul(v.extent[d] - 1, v.stride[d], what), what);
  }
  return off;
}

template <class T, std::size_t R>
bool empty_view(const tensor_view<T, R>& v) {
  for (std::size_t e : v.extent) {
    if (e == 0) return true;
  }
  return false;
}

// Checks a view is addressable, and for a destination that no two indices share an element
// (sufficient test: sorted by stride, each stride exceeds the reach of all smaller ones).
template <class T, std::size_t R>
void check_view(const tensor_view<T, R>& v, const char* what, bool destination) {
  if (empty_view(v)) return;
  require(v.data != nullptr, what, ": null data for a non-empty view");
  reach(v, what);
  if (!destination) return;
  std::array<std::size_t, R> dims;
  std::iota(dims.begin(), dims.end(), std::size_t{0});
  std::sort(dims.begin(), dims.end(),
            [&](std::size_t a, std::size_t b) { return v.stride[a] < v.stride[b]; });
  std::size_t covered = 0;  // largest offset reachable with the dimensions seen so far
  for (std::size_t d : dims) {
    if (v.extent[d] <= 1) continue;
    require(v.stride[d] > covered, what, ": overlapping strides (dimension ", d, " has stride ",
            v.stride[d], " within the reach ", covered, " of the smaller ones)");
    covered += (v.extent[d] - 1) * v.stride[d];
  }
}

template <class S, class Token, class Index>
void check_source(const tensor_view<const S, 4>& src, const packed_layout<Token, Index>& l) {
  check_view(src, "source", false);
  require(src.extent[0] == l.n_rows && src.extent[1] == l.width, "source: ", src.extent[0],
          " rows x ", src.extent[1], " slots, but the layout has ", l.n_rows, " x ", l.width,
          " (a layout from another batch?)");
  require(l.prompt_row.size() == l.n_prompts() && l.prompt_offset.size() == l.n_prompts() &&
              l.last_token.size() == l.n_prompts(),
          "layout: per-prompt tables have inconsistent sizes");
  for (std::size_t i = 0; i < l.n_prompts(); ++i) {
    const Index row = l.prompt_row[i], off = l.prompt_offset[i], len = l.prompt_length[i];
    require(row >= 0 && static_cast<std::size_t>(row) < l.n_rows && off >= 0 && len > 0 &&
                static_cast<std::size_t>(off) + static_cast<std::size_t>(len) <= l.width,
            "layout: prompt ", i, " (row ", row, ", offset ", off, ", length ", len,
            ") lies outside ", l.n_rows, " rows of width ", l.width);
  }
}

template <class T, std::size_t R>
void check_heads(const tensor_view<const T, 4>& src, const tensor_view<T, R>& dst,
                 const char* what) {
  require(dst.extent[R - 2] == src.extent[2] && dst.extent[R - 1] == src.extent[3], what, ": ",
          dst.extent[R - 2], " heads x ", dst.extent[R - 1], " dims, the source has ",
          src.extent[2], " x ", src.extent[3]);
}

// Copies one token's (head, dim) block.
template <class T, class D>
void copy_token(const T* s, std::size_t s_head, std::size_t s_dim, D* d, std::size_t d_head,
                std::size_t d_dim, std::size_t n_heads, std::size_t head_dim) {
  for (std::size_t h = 0; h < n_heads; ++h) {
    const T* sh = s + h * s_head;
    D* dh = d + h * d_head;
    if (s_dim == 1 && d_dim == 1) {
      std::copy(sh, sh + head_dim, dh);
    } else {
      for (std::size_t k = 0; k < head_dim; ++k) dh[k * d_dim] = sh[k * s_dim];
    }
  }
}

}  // namespace detail

/// Scatters src (row, slot, head, dim) into one view per prompt, dst[i] seen as (position,
/// head, dim): token t of prompt i lands at dst[i](t, h, d). Positions past the prompt's length
/// are left as they are. Throws prepack::error, writing nothing, if the source does not match
/// the layout, dst.size() != n_prompts, a view is shorter than its prompt, heads or dims differ,
/// a view's strides overlap, or two prompts' views overlap in memory.
template <class T, class S, class Token, class Index>
void unpack_prompts(const packed_layout<Token, Index>& l, tensor_view<S, 4> source,
                    span<const tensor_view<T, 3>> dst) {
  const tensor_view<const T, 4> src = detail::as_const<T>(source);
  detail::check_source(src, l);
  detail::require(dst.size() == l.n_prompts(), "destinations: ", dst.size(), " views for ",
                  l.n_prompts(), " prompts");
  std::vector<std::pair<const T*, const T*>> ranges;  // [n_prompts]  first and last element written
  ranges.reserve(dst.size());
  for (std::size_t i = 0; i < dst.size(); ++i) {
    const std::size_t len = static_cast<std::size_t>(l.prompt_length[i]);
    detail::require(dst[i].extent[0] >= len, "prompt ", i, ": destination holds ", dst[i].extent[0],
                    " positions, length is ", len);
    detail::check_heads(src, dst[i], "prompt destination");
    tensor_view<T, 3> written = dst[i];
    written.extent[0] = len;
    detail::check_view(written, "prompt destination", true);
    if (!detail::empty_view(written)) {
      ranges.emplace_back(written.data,
                          written.data + detail::reach(written, "prompt destination"));
    }
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const auto& a, const auto& b) { return std::less<const T*>()(a.first, b.first); });
  for (std::size_t k = 1; k < ranges.size(); ++k) {
    detail::require(std::less<const T*>()(ranges[k - 1].second, ranges[k].first),
                    "destinations: two prompts' buffers overlap in memory");
  }
  for (std::size_t i = 0; i < dst.size(); ++i) {
    const std::size_t row = static_cast<std::size_t>(l.prompt_row[i]);
    const std::size_t off = static_cast<std::size_t>(l.prompt_offset[i]);
    for (std::size_t t = 0; t < static_cast<std::size_t>(l.prompt_length[i]); ++t) {
      detail::copy_token(&src(row, off + t, 0, 0), src.stride[2], src.stride[3], &dst[i](t, 0, 0),
                         dst[i].stride[1], dst[i].stride[2], src.extent[2], src.extent[3]);
    }
  }
}

template <class T, class S, class Token, class Index>
void unpack_prompts(const packed_layout<Token, Index>& l, tensor_view<S, 4> src,
                    const std::vector<tensor_view<T, 3>>& dst) {
  unpack_prompts(l, src, span<const tensor_view<T, 3>>(dst));
}

/// Scatters src into a left-padded decode batch dst seen as (prompt, slot, head, dim): prompt
/// i's token t lands at slot extent[1] - length_i + t, as Hugging Face lays out a batch for
/// generation. Pad slots are left as they are. Throws prepack::error, writing nothing, if the
/// source does not match the layout, dst has fewer than n_prompts rows or fewer slots than the
/// longest prompt, heads or dims differ, or dst's strides overlap.
template <class T, class S, class Token, class Index>
void unpack_left_padded(const packed_layout<Token, Index>& l, tensor_view<S, 4> source,
                        tensor_view<T, 4> dst) {
  const tensor_view<const T, 4> src = detail::as_const<T>(source);
  detail::check_source(src, l);
  detail::require(dst.extent[0] >= l.n_prompts(), "left-padded destination: ", dst.extent[0],
                  " rows for ", l.n_prompts(), " prompts");
  for (std::size_t i = 0; i < l.n_prompts(); ++i) {
    detail::require(static_cast<std::size_t>(l.prompt_length[i]) <= dst.extent[1], "prompt ", i,
                    ": length ", l.prompt_length[i], " exceeds the destination's ", dst.extent[1],
                    " slots");
  }
  detail::check_heads(src, dst, "left-padded destination");
  detail::check_view(dst, "left-padded destination", true);
  for (std::size_t i = 0; i < l.n_prompts(); ++i) {
    const std::size_t row = static_cast<std::size_t>(l.prompt_row[i]);
    const std::size_t off = static_cast<std::size_t>(l.prompt_offset[i]);
    const std::size_t len = static_cast<std::size_t>(l.prompt_length[i]);
    const std::size_t start = dst.extent[1] - len;
    for (std::size_t t = 0; t < len; ++t) {
      detail::copy_token(&src(row, off + t, 0, 0), src.stride[2], src.stride[3],
                         &dst(i, start + t, 0, 0), dst.stride[2], dst.stride[3], src.extent[2],
                         src.extent[3]);
    }
  }
}

/// Scatters src into a paged KV pool seen as (block, slot in block, head, dim), vLLM style:
/// token t of prompt i lands in block block_table(i, t / block_size) at slot t % block_size,
/// block_size = pool.extent[1]. block_table is (prompt, entry); entries past those a prompt
/// needs are ignored. Throws prepack::error, writing nothing, if the source does not match the
/// layout, the table has too few rows or entries, an entry is negative or >= the pool's blocks,
/// two prompts (or one prompt twice) name the same block, heads or dims differ, or the pool's
/// strides overlap.
template <class T, class S, class B, class Token, class Index>
void unpack_paged(const packed_layout<Token, Index>& l, tensor_view<S, 4> source,
                  tensor_view<T, 4> pool, tensor_view<B, 2> block_table) {
  static_assert(std::is_integral_v<B>, "block ids must be integers");
  const tensor_view<const T, 4> src = detail::as_const<T>(source);
  detail::check_source(src, l);
  const std::size_t block_size = pool.extent[1];
  const std::size_t n_blocks = pool.extent[0];
  detail::require(block_size > 0, "paged pool: block size 0");
  detail::check_heads(src, pool, "paged pool");
  detail::check_view(pool, "paged pool", true);
  detail::check_view(block_table, "block table", false);
  detail::require(block_table.extent[0] >= l.n_prompts(), "block table: ", block_table.extent[0],
                  " rows for ", l.n_prompts(), " prompts");
  constexpr std::size_t unused = static_cast<std::size_t>(-1);
  std::vector<std::size_t> owner(n_blocks, unused);  // [n_blocks]  prompt writing each block
  for (std::size_t i = 0; i < l.n_prompts(); ++i) {
    const std::size_t len = static_cast<std::size_t>(l.prompt_length[i]);
    const std::size_t need = (len + block_size - 1) / block_size;
    detail::require(need <= block_table.extent[1], "prompt ", i, ": length ", len, " needs ", need,
                    " blocks of ", block_size, ", the block table has ", block_table.extent[1]);
    for (std::size_t k = 0; k < need; ++k) {
      const B id = block_table(i, k);
      detail::require(!detail::is_negative(id) && static_cast<std::size_t>(id) < n_blocks,
                      "prompt ", i, ": block_table[", i, "][", k, "] = ", id, " outside 0..",
                      n_blocks - 1);
      std::size_t& who = owner[static_cast<std::size_t>(id)];
      detail::require(who == unused, "prompt ", i, ": block ", id, " is already used by prompt ",
                      who);
      who = i;
    }
  }
  for (std::size_t i = 0; i < l.n_prompts(); ++i) {
    const std::size_t row = static_cast<std::size_t>(l.prompt_row[i]);
    const std::size_t off = static_cast<std::size_t>(l.prompt_offset[i]);
    for (std::size_t t = 0; t < static_cast<std::size_t>(l.prompt_length[i]); ++t) {
      const std::size_t block = static_cast<std::size_t>(block_table(i, t / block_size));
      detail::copy_token(&src(row, off + t, 0, 0), src.stride[2], src.stride[3],
                         &pool(block, t % block_size, 0, 0), pool.stride[2], pool.stride[3],
                         src.extent[2], src.extent[3]);
    }
  }
}

/// Gathers each prompt's last-token row: src is (flat slot, feature) over the n_rows * width
/// slots, dst is (prompt, feature). For logits or hidden states. Throws prepack::error, writing
/// nothing, if src does not hold the layout's slots, dst has fewer than n_prompts rows, the
/// feature sizes differ, or dst's strides overlap.
template <class T, class S, class Token, class Index>
void gather_last(const packed_layout<Token, Index>& l, tensor_view<S, 2> source,
                 tensor_view<T, 2> dst) {
  const tensor_view<const T, 2> src = detail::as_const<T>(source);
  detail::check_view(src, "source", false);
  detail::check_view(dst, "last-token destination", true);
  detail::require(src.extent[0] == l.n_slots(), "source: ", src.extent[0],
                  " slots, the layout has ", l.n_slots(), " (a layout from another batch?)");
  detail::require(dst.extent[0] >= l.n_prompts(), "last-token destination: ", dst.extent[0],
                  " rows for ", l.n_prompts(), " prompts");
  detail::require(dst.extent[1] == src.extent[1], "last-token destination: ", dst.extent[1],
                  " features, the source has ", src.extent[1]);
  detail::require(l.last_token.size() == l.n_prompts(), "layout: last_token has ",
                  l.last_token.size(), " entries for ", l.n_prompts(), " prompts");
  for (std::size_t i = 0; i < l.n_prompts(); ++i) {
    detail::require(l.last_token[i] >= 0 && static_cast<std::size_t>(l.last_token[i]) < l.n_slots(),
                    "layout: prompt ", i, ": last token ", l.last_token[i], " outside ",
                    l.n_slots(), " slots");
  }
  for (std::size_t i = 0; i < l.n_prompts(); ++i) {
    const std::size_t s = static_cast<std::size_t>(l.last_token[i]);
    for (std::size_t f = 0; f < src.extent[1]; ++f) dst(i, f) = src(s, f);
  }
}

/// Convenience: each prompt's rows copied into a new contiguous buffer [length][heads][dim].
/// Allocates the buffers; prefer unpack_prompts to write into an engine's own memory.
template <class S, class Token, class Index, class T = std::remove_const_t<S>>
std::vector<std::vector<T>> unpack_contiguous(const packed_layout<Token, Index>& l,
                                              tensor_view<S, 4> source) {
  const tensor_view<const T, 4> src = detail::as_const<T>(source);
  detail::check_source(src, l);
  std::vector<std::vector<T>> out(l.n_prompts());
  std::vector<tensor_view<T, 3>> views(l.n_prompts());
  for (std::size_t i = 0; i < l.n_prompts(); ++i) {
    out[i].resize(static_cast<std::size_t>(l.prompt_length[i]) * src.extent[2] * src.extent[3]);
    views[i] =
        prompt_view(out[i].data(), cache_order::position_head_dim,
                    static_cast<std::size_t>(l.prompt_length[i]), src.extent[2], src.extent[3]);
  }
  unpack_prompts(l, src, span<const tensor_view<T, 3>>(views));
  return out;
}

PREPACK_NAMESPACE_END
