// prepack/unpack.hpp - scatters per-token results of a packed prefill (K, V, hidden states)
// back to the prompts they belong to, into caller memory described by strided views.
//
// Source: any per-token tensor of the packed batch seen as (row, slot, head, dim), whatever its
// physical layout ([n_rows][n_heads][width][head_dim], [n_rows][width][n_heads][head_dim], or
// any strides); with a leading layer dimension, K and V of every layer in one call.
// Destinations: one buffer per prompt, a left-padded decode batch, a paged KV pool through a
// block table (vLLM style); gather_last picks each prompt's last-token row. Destinations may
// hold float, double, prepack::half or prepack::bfloat16: the copy converts, rounding to
// nearest even, as engines' cache kernels do. Frameworks that copy on their own device (torch on
// a GPU) take the same destinations as gather indices instead: left_padded_slots, prompt_slots.
//
// Engines that write KV layer by layer as the forward pass produces it build a slot_mapping
// once (slots.hpp: one pool slot per layout slot, -1 for pad slots, checked once) and call
// write_slots per layer: O(1) checks per call, no allocation. paged_view names the common pool
// layouts (vLLM's flash NHD, HND, its paged-attention value cache) and split_key_view vLLM's
// paged-attention key cache [blocks][heads][head_dim / x][block_size][x].
//
// Cost: O(useful tokens * n_heads * head_dim) copies per layer and K/V; the checks are
// O(n_prompts) plus, for destinations that could overlap (several views, or K and V), a sort of
// the contiguous runs they write: O(r log r) with r the number of runs, computed once per call
// whatever the number of layers. Every function checks all of its input first and throws
// prepack::error without writing anything.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "detail/checked.hpp"
#include "detail/views.hpp"
#include "error.hpp"
#include "layout.hpp"
#include "numeric.hpp"
#include "paged.hpp"
#include "slots.hpp"
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

/// A view with one more leading dimension of extent 1: a single layer seen as a stack of one.
template <class T, std::size_t R>
tensor_view<T, R + 1> one_layer(const tensor_view<T, R>& v) {
  tensor_view<T, R + 1> out{v.data, {}, {}};
  out.extent[0] = 1;
  out.stride[0] = 0;
  for (std::size_t d = 0; d < R; ++d) {
    out.extent[d + 1] = v.extent[d];
    out.stride[d + 1] = v.stride[d];
  }
  return out;
}

namespace detail {

// The memory a destination writes, as contiguous runs of elements: [first, last] addresses.
// Overlap between destinations is decided on these, the elements actually written, so views
// that interleave without sharing an element ([max_len][batch][heads][dim] seen prompt by
// prompt) are accepted and views that share one are refused.
class written_runs {
 public:
  // Adds the elements of view v at indices [lo[d], lo[d] + count[d]) in every dimension d.
  template <class T, std::size_t R>
  void add(const tensor_view<T, R>& v, const std::array<std::size_t, R>& lo,
           const std::array<std::size_t, R>& count) {
    for (std::size_t c : count) {
      if (c == 0) return;
    }
    boxes_.push_back([v, lo, count](std::vector<run>& out) { enumerate(v, lo, count, out); });
    std::size_t first = 0, last = 0;
    for (std::size_t d = 0; d < R; ++d) {
      first += lo[d] * v.stride[d];
      last += (lo[d] + count[d] - 1) * v.stride[d];
    }
    const auto start = reinterpret_cast<std::uintptr_t>(v.data);
    ranges_.emplace_back(start + first * sizeof(T), start + (last + 1) * sizeof(T) - 1);
  }

  // Throws naming `what` if two of the boxes added share an element. When their address
  // ranges are disjoint (separate buffers: the common case) that is all it takes; otherwise the
  // runs of every box are enumerated and compared.
  void require_disjoint(const char* what) {
    if (disjoint(ranges_)) return;
    std::vector<run> runs;
    for (const auto& box : boxes_) box(runs);
    require(disjoint(runs), what, ": two destinations write the same element");
  }

 private:
  using run = std::pair<std::uintptr_t, std::uintptr_t>;  // first and last byte

  static bool disjoint(std::vector<run>& runs) {
    std::sort(runs.begin(), runs.end());
    for (std::size_t k = 1; k < runs.size(); ++k) {
      if (runs[k].first <= runs[k - 1].second) return false;
    }
    return true;
  }

  template <class T, std::size_t R>
  static void enumerate(const tensor_view<T, R>& v, const std::array<std::size_t, R>& lo,
                        const std::array<std::size_t, R>& count, std::vector<run>& out) {
    std::array<std::size_t, R> dims;
    std::iota(dims.begin(), dims.end(), std::size_t{0});
    std::sort(dims.begin(), dims.end(),
              [&](std::size_t a, std::size_t b) { return v.stride[a] < v.stride[b]; });
    // Merge the innermost dimensions while each continues the previous one's run.
    std::size_t len = 1, merged = 0;
    for (std::size_t d : dims) {
      if (count[d] == 1) {
        ++merged;
        continue;
      }
      if (v.stride[d] != len) break;
      len *= count[d];
      ++merged;
    }
    std::size_t base = 0;
    for (std::size_t d = 0; d < R; ++d) base += lo[d] * v.stride[d];
    std::array<std::size_t, R> idx{};
    const auto start = reinterpret_cast<std::uintptr_t>(v.data);
    for (;;) {
      std::size_t off = base;
      for (std::size_t k = merged; k < R; ++k) off += idx[k] * v.stride[dims[k]];
      out.emplace_back(start + off * sizeof(T), start + (off + len) * sizeof(T) - 1);
      std::size_t k = merged;
      for (; k < R; ++k) {
        if (++idx[k] < count[dims[k]]) break;
        idx[k] = 0;
      }
      if (k == R) break;
    }
  }

  std::vector<run> ranges_;
  std::vector<std::function<void(std::vector<run>&)>> boxes_;
};

// The source must be (layer, row, slot, head, dim) over this layout.
template <class S, class Token, class Index>
void check_source(const tensor_view<S, 5>& src, const packed_layout<Token, Index>& l,
                  const char* what) {
  check_view(src, what, false);
  require(src.extent[1] == l.n_rows() && src.extent[2] == l.width(), what, ": ", src.extent[1],
          " rows x ", src.extent[2], " slots, but the layout has ", l.n_rows(), " x ", l.width(),
          " (a layout from another batch?)");
}

// The destination has at least the source's layers (its first ones are written) and the same
// heads and dims.
template <class S, class T, std::size_t R>
void check_heads(const tensor_view<S, 5>& src, const tensor_view<T, R>& dst, const char* what) {
  require(dst.extent[0] >= src.extent[0], what, ": ", dst.extent[0], " layers, the source has ",
          src.extent[0]);
  require(dst.extent[R - 2] == src.extent[3] && dst.extent[R - 1] == src.extent[4], what, ": ",
          dst.extent[R - 2], " heads x ", dst.extent[R - 1], " dims, the source has ",
          src.extent[3], " x ", src.extent[4]);
}

// Copies one token's (head, dim) block, converting to the destination's element type.
template <class S, class D>
void copy_token(const S* s, std::size_t s_head, std::size_t s_dim, D* d, std::size_t d_head,
                std::size_t d_dim, std::size_t n_heads, std::size_t head_dim) {
  for (std::size_t h = 0; h < n_heads; ++h) {
    const S* sh = s + h * s_head;
    D* dh = d + h * d_head;
    if constexpr (std::is_same_v<std::remove_const_t<S>, D>) {
      if (s_dim == 1 && d_dim == 1) {
        std::copy(sh, sh + head_dim, dh);
      } else {
        for (std::size_t k = 0; k < head_dim; ++k) dh[k * d_dim] = sh[k * s_dim];
      }
    } else {
      for (std::size_t k = 0; k < head_dim; ++k) {
        dh[k * d_dim] = convert<D>(sh[k * s_dim]);
      }
    }
  }
}

// Scatters every layer of src into dst: dst_of(layer, prompt, t) is the destination of token t
// of prompt `prompt` in `layer`, as a (pointer, head stride, dim stride) triple. Checked already.
template <class S, class Token, class Index, class Dst>
void scatter(const packed_layout<Token, Index>& l, const tensor_view<S, 5>& src, Dst&& dst_of) {
  for (std::size_t layer = 0; layer < src.extent[0]; ++layer) {
    for (std::size_t i = 0; i < l.n_prompts(); ++i) {
      const auto row = static_cast<std::size_t>(l.prompt_row()[i]);
      const auto off = static_cast<std::size_t>(l.prompt_offset()[i]);
      for (std::size_t t = 0; t < static_cast<std::size_t>(l.prompt_length()[i]); ++t) {
        const auto [d, d_head, d_dim] = dst_of(layer, i, t);
        copy_token(&src(layer, row, off + t, 0, 0), src.stride[3], src.stride[4], d, d_head, d_dim,
                   src.extent[3], src.extent[4]);
      }
    }
  }
}

template <class T>
struct token_dst {
  T* data;
  std::size_t head_stride, dim_stride;
};

}  // namespace detail

/// K and V of every layer of a packed prefill, each seen as (layer, row, slot, head, dim).
template <class S>
struct packed_kv {
  tensor_view<S, 5> k, v;
};

/// Scatters K and V of every layer into one destination per prompt: k_dst[i] and v_dst[i]
/// seen as (layer, position, head, dim); token t of prompt i lands at position
/// prompt_context[i] + t (a chunk continues its prompt's cache). Positions outside are left as
/// they are. Throws prepack::error, writing nothing, if the source does not match the layout,
/// a destination count differs from n_prompts, a view has too few layers or positions, heads or
/// dims differ, a view's strides overlap, or two destinations (of two prompts, or a K and a V)
/// write the same element.
template <class T, class S, class Token, class Index>
void unpack_prompts(const packed_layout<Token, Index>& l, const packed_kv<S>& src,
                    span<const tensor_view<T, 4>> k_dst, span<const tensor_view<T, 4>> v_dst) {
  detail::check_source(src.k, l, "keys");
  detail::check_source(src.v, l, "values");
  detail::require(src.k.extent == src.v.extent, "keys and values differ in shape");
  detail::written_runs runs;
  for (const auto* dst : {&k_dst, &v_dst}) {
    detail::require(dst->size() == l.n_prompts(), "destinations: ", dst->size(), " views for ",
                    l.n_prompts(), " prompts");
    for (std::size_t i = 0; i < dst->size(); ++i) {
      const tensor_view<T, 4>& d = (*dst)[i];
      const auto ctx = static_cast<std::size_t>(l.prompt_context()[i]);
      const auto len = static_cast<std::size_t>(l.prompt_length()[i]);
      detail::require(d.extent[1] >= ctx + len, "prompt ", i, ": destination holds ", d.extent[1],
                      " positions, the prompt needs ", ctx + len);
      detail::check_heads(src.k, d, "prompt destination");
      detail::check_view(d, "prompt destination", true);
      runs.add(d, {0, ctx, 0, 0}, {src.k.extent[0], len, d.extent[2], d.extent[3]});
    }
  }
  runs.require_disjoint("prompt destinations");
  const auto into = [&](span<const tensor_view<T, 4>> dst) {
    return [&l, dst](std::size_t layer, std::size_t i, std::size_t t) {
      const tensor_view<T, 4>& d = dst[i];
      const std::size_t pos = static_cast<std::size_t>(l.prompt_context()[i]) + t;
      return detail::token_dst<T>{&d(layer, pos, 0, 0), d.stride[2], d.stride[3]};
    };
  };
  detail::scatter(l, src.k, into(k_dst));
  detail::scatter(l, src.v, into(v_dst));
}

/// One layer: src (row, slot, head, dim) into one view per prompt, dst[i] seen as (position,
/// head, dim). Same placement and errors as above.
template <class T, class S, class Token, class Index>
void unpack_prompts(const packed_layout<Token, Index>& l, tensor_view<S, 4> src,
                    span<const tensor_view<T, 3>> dst) {
  const tensor_view<S, 5> s = one_layer(src);
  detail::check_source(s, l, "source");
  detail::require(dst.size() == l.n_prompts(), "destinations: ", dst.size(), " views for ",
                  l.n_prompts(), " prompts");
  detail::written_runs runs;
  for (std::size_t i = 0; i < dst.size(); ++i) {
    const auto d = one_layer(dst[i]);
    const auto ctx = static_cast<std::size_t>(l.prompt_context()[i]);
    const auto len = static_cast<std::size_t>(l.prompt_length()[i]);
    detail::require(d.extent[1] >= ctx + len, "prompt ", i, ": destination holds ", d.extent[1],
                    " positions, the prompt needs ", ctx + len);
    detail::check_heads(s, d, "prompt destination");
    detail::check_view(d, "prompt destination", true);
    runs.add(d, {0, ctx, 0, 0}, {1, len, d.extent[2], d.extent[3]});
  }
  runs.require_disjoint("prompt destinations");
  detail::scatter(l, s, [&](std::size_t, std::size_t i, std::size_t t) {
    const std::size_t pos = static_cast<std::size_t>(l.prompt_context()[i]) + t;
    return detail::token_dst<T>{&dst[i](pos, 0, 0), dst[i].stride[1], dst[i].stride[2]};
  });
}

template <class T, class S, class Token, class Index>
void unpack_prompts(const packed_layout<Token, Index>& l, tensor_view<S, 4> src,
                    const std::vector<tensor_view<T, 3>>& dst) {
  unpack_prompts(l, src, span<const tensor_view<T, 3>>(dst));
}

/// Scatters K and V of every layer into a left-padded decode batch, k_dst and v_dst seen as
/// (layer, prompt, slot, head, dim): prompt i's token t lands at slot extent[2] - length_i + t,
/// as Hugging Face lays out a batch for generation. Pad slots are left as they are. Throws
/// prepack::error, writing nothing, if the source does not match the layout, a destination has
/// too few layers, prompts or slots, heads or dims differ, strides overlap, or K and V share an
/// element. Whole prompts only (a chunk has no left-padded place).
template <class T, class S, class Token, class Index>
void unpack_left_padded(const packed_layout<Token, Index>& l, const packed_kv<S>& src,
                        tensor_view<T, 5> k_dst, tensor_view<T, 5> v_dst) {
  detail::check_source(src.k, l, "keys");
  detail::check_source(src.v, l, "values");
  detail::require(src.k.extent == src.v.extent, "keys and values differ in shape");
  detail::written_runs runs;
  for (const auto* dst : {&k_dst, &v_dst}) {
    detail::require(dst->extent[1] >= l.n_prompts(), "left-padded destination: ", dst->extent[1],
                    " rows for ", l.n_prompts(), " prompts");
    for (std::size_t i = 0; i < l.n_prompts(); ++i) {
      detail::require(l.prompt_context()[i] == 0, "prompt ", i, ": a chunk at position ",
                      l.prompt_context()[i], " has no place in a left-padded batch");
      detail::require(static_cast<std::size_t>(l.prompt_length()[i]) <= dst->extent[2], "prompt ",
                      i, ": length ", l.prompt_length()[i], " exceeds the destination's ",
                      dst->extent[2], " slots");
    }
    detail::check_heads(src.k, *dst, "left-padded destination");
    detail::check_view(*dst, "left-padded destination", true);
    runs.add(*dst, {0, 0, 0, 0, 0},
             {src.k.extent[0], l.n_prompts(), dst->extent[2], dst->extent[3], dst->extent[4]});
  }
  runs.require_disjoint("left-padded destinations");
  const auto into = [&l](const tensor_view<T, 5>& d) {
    return [&l, d](std::size_t layer, std::size_t i, std::size_t t) {
      const std::size_t slot = d.extent[2] - static_cast<std::size_t>(l.prompt_length()[i]) + t;
      return detail::token_dst<T>{&d(layer, i, slot, 0, 0), d.stride[3], d.stride[4]};
    };
  };
  detail::scatter(l, src.k, into(k_dst));
  detail::scatter(l, src.v, into(v_dst));
}

/// One layer: src (row, slot, head, dim) into dst (prompt, slot, head, dim), left-padded.
template <class T, class S, class Token, class Index>
void unpack_left_padded(const packed_layout<Token, Index>& l, tensor_view<S, 4> src,
                        tensor_view<T, 4> dst) {
  const auto s = one_layer(src);
  const auto d = one_layer(dst);
  detail::check_source(s, l, "source");
  detail::require(d.extent[1] >= l.n_prompts(), "left-padded destination: ", d.extent[1],
                  " rows for ", l.n_prompts(), " prompts");
  for (std::size_t i = 0; i < l.n_prompts(); ++i) {
    detail::require(l.prompt_context()[i] == 0, "prompt ", i, ": a chunk at position ",
                    l.prompt_context()[i], " has no place in a left-padded batch");
    detail::require(static_cast<std::size_t>(l.prompt_length()[i]) <= d.extent[2], "prompt ", i,
                    ": length ", l.prompt_length()[i], " exceeds the destination's ", d.extent[2],
                    " slots");
  }
  detail::check_heads(s, d, "left-padded destination");
  detail::check_view(d, "left-padded destination", true);
  detail::scatter(l, s, [&](std::size_t, std::size_t i, std::size_t t) {
    const std::size_t slot = d.extent[2] - static_cast<std::size_t>(l.prompt_length()[i]) + t;
    return detail::token_dst<T>{&d(0, i, slot, 0, 0), d.stride[3], d.stride[4]};
  });
}

/// The gather form of unpack_left_padded, for frameworks that copy a layer with one indexed
/// gather on their own device (torch.index_select): [n_prompts][columns] flat layout slots (row *
/// width + offset + t), prompt i's token t at column columns - length_i + t, -1 on the pad
/// columns before it. Throws prepack::error if a prompt is a chunk (it has no left-padded place)
/// or longer than columns. O(n_prompts * columns).
template <class Token, class Index>
std::vector<std::int64_t> left_padded_slots(const packed_layout<Token, Index>& l,
                                            std::size_t columns) {
  for (std::size_t i = 0; i < l.n_prompts(); ++i) {
    detail::require(l.prompt_context()[i] == 0, "prompt ", i, ": a chunk at position ",
                    l.prompt_context()[i], " has no place in a left-padded batch");
    detail::require(static_cast<std::size_t>(l.prompt_length()[i]) <= columns, "prompt ", i,
                    ": length ", l.prompt_length()[i], " exceeds the ", columns, " columns");
  }
  std::vector<std::int64_t> out(detail::mul(l.n_prompts(), columns, "left-padded index"), -1);
  for (std::size_t i = 0; i < l.n_prompts(); ++i) {
    const auto len = static_cast<std::size_t>(l.prompt_length()[i]);
    const auto first = static_cast<std::int64_t>(l.first_slot(i));
    std::int64_t* row = out.data() + i * columns + (columns - len);
    for (std::size_t t = 0; t < len; ++t) row[t] = first + static_cast<std::int64_t>(t);
  }
  return out;
}

/// The gather form of unpack_prompts: the flat layout slots of every prompt's last `last` tokens
/// (all of them by default), prompt after prompt in the layout's prompt order, each prompt's in
/// token order: [sum_i min(length_i, last)]. A cache that keeps only a window of the newest
/// tokens (a sliding-window layer) gathers last = window - 1. O(useful tokens).
template <class Token, class Index>
std::vector<std::int64_t> prompt_slots(const packed_layout<Token, Index>& l,
                                       std::size_t last = static_cast<std::size_t>(-1)) {
  std::vector<std::int64_t> out;
  out.reserve(l.useful_tokens());
  for (std::size_t i = 0; i < l.n_prompts(); ++i) {
    const auto len = static_cast<std::size_t>(l.prompt_length()[i]);
    const std::size_t from = len > last ? len - last : 0;
    const auto first = static_cast<std::int64_t>(l.first_slot(i));
    for (std::size_t t = from; t < len; ++t) out.push_back(first + static_cast<std::int64_t>(t));
  }
  return out;
}

namespace detail {

// What every write_slots checks before its heads and dims: the views are addressable (the pool
// without overlapping strides), one source token per mapping entry, the mapping's pool shape.
template <class S, class T, std::size_t R>
void check_slot_write(const slot_mapping& m, const tensor_view<S, 3>& src,
                      const tensor_view<T, R>& pool) {
  check_view(src, "source", false);
  check_view(pool, "paged pool", true);
  require(src.extent[0] == m.slots().size(), "source: ", src.extent[0],
          " tokens, the slot mapping has ", m.slots().size());
  require(pool.extent[0] == m.n_blocks() && pool.extent[1] == m.block_size(),
          "paged pool: ", pool.extent[0], " blocks of ", pool.extent[1],
          ", the slot mapping was built for ", m.n_blocks(), " of ", m.block_size());
}

}  // namespace detail

/// Writes one layer's per-token tensor src (token, head, dim) into a paged pool seen as
/// (block, offset in block, head, dim) through a slot mapping, vLLM's reshape_and_cache:
/// token t goes to pool slot m.slots()[t]; tokens mapped to -1 are skipped. Converts to the
/// pool's element type. Throws prepack::error, writing nothing, if src does not hold one token
/// per mapping entry, the pool's blocks and block size differ from the mapping's, heads or dims
/// differ, or the pool's strides overlap.
template <class T, class S>
void write_slots(const slot_mapping& m, tensor_view<S, 3> src, tensor_view<T, 4> pool) {
  detail::check_slot_write(m, src, pool);
  detail::require(pool.extent[2] == src.extent[1] && pool.extent[3] == src.extent[2],
                  "paged pool: ", pool.extent[2], " heads x ", pool.extent[3],
                  " dims, the source has ", src.extent[1], " x ", src.extent[2]);
  for (std::size_t t = 0; t < src.extent[0]; ++t) {
    const std::int64_t s = m.slots()[t];
    if (s < 0) continue;
    const auto slot = static_cast<std::size_t>(s);
    detail::copy_token(&src(t, 0, 0), src.stride[1], src.stride[2],
                       &pool(slot / m.block_size(), slot % m.block_size(), 0, 0), pool.stride[2],
                       pool.stride[3], src.extent[1], src.extent[2]);
  }
}

/// Physical orders of a paged KV pool, for paged_view(). Each is seen as (block, offset in
/// block, head, dim), the order write_slots and unpack_paged take.
enum class paged_order {
  block_slot_head_dim,  // [n_blocks][block_size][n_heads][head_dim]  (vLLM's flash layout, NHD)
  block_head_slot_dim,  // [n_blocks][n_heads][block_size][head_dim]  (HND)
  block_head_dim_slot,  // [n_blocks][n_heads][head_dim][block_size]  (vLLM's paged-attention
                        //                                             value cache)
};

/// Views a contiguous paged pool as (block, offset in block, head, dim).
template <class T>
tensor_view<T, 4> paged_view(T* data, paged_order order, std::size_t n_blocks,
                             std::size_t block_size, std::size_t n_heads, std::size_t head_dim) {
  const std::size_t block = block_size * n_heads * head_dim;
  if (order == paged_order::block_head_slot_dim) {
    return {data,
            {n_blocks, block_size, n_heads, head_dim},
            {block, head_dim, block_size * head_dim, 1}};
  }
  if (order == paged_order::block_head_dim_slot) {
    return {data,
            {n_blocks, block_size, n_heads, head_dim},
            {block, 1, head_dim * block_size, block_size}};
  }
  return {
      data, {n_blocks, block_size, n_heads, head_dim}, {block, n_heads * head_dim, head_dim, 1}};
}

/// Views vLLM's paged-attention key cache [n_blocks][n_heads][head_dim / x][block_size][x]
/// (x elements make 16 bytes: 4 floats, 8 halves) as (block, offset in block, head,
/// dim / x, dim % x), for write_slots. Throws prepack::error if x is 0 or does not divide
/// head_dim.
template <class T>
tensor_view<T, 5> split_key_view(T* data, std::size_t n_blocks, std::size_t block_size,
                                 std::size_t n_heads, std::size_t head_dim,
                                 std::size_t x = 16 / sizeof(T)) {
  detail::require(x > 0 && head_dim % x == 0, "split key cache: head dim ", head_dim,
                  " is not a multiple of x = ", x);
  const std::size_t chunks = head_dim / x;
  return {data,
          {n_blocks, block_size, n_heads, chunks, x},
          {n_heads * head_dim * block_size, x, head_dim * block_size, block_size * x, 1}};
}

/// Views vLLM's CPU attention cache, one tensor [n_blocks][n_heads][block_size][2 * head_dim]
/// as its CPU backend allocates it (vllm/v1/attention/backends/cpu_attn.py), as two (block,
/// offset in block, head, dim) views for write_slots: per block and head it holds K transposed,
/// [head_dim][block_size], then V, [block_size][head_dim] (what cpu_attn_reshape_and_cache
/// writes with the "vec" ISA: x86 without AMX, block sizes a multiple of 32; checked against
/// vLLM's own op by python/tests/test_vllm_cpu.py). Returns {K, V}.
template <class T>
std::array<tensor_view<T, 4>, 2> vllm_cpu_kv_views(T* data, std::size_t n_blocks,
                                                   std::size_t block_size, std::size_t n_heads,
                                                   std::size_t head_dim) {
  const std::size_t head = 2 * block_size * head_dim, block = n_heads * head;
  const std::array<std::size_t, 4> extent{n_blocks, block_size, n_heads, head_dim};
  return {tensor_view<T, 4>{data, extent, {block, 1, head, block_size}},
          tensor_view<T, 4>{data + block_size * head_dim, extent, {block, head_dim, head, 1}}};
}

/// write_slots into a pool whose head dimension is split in two, seen as (block, offset in
/// block, head, dim / x, dim % x) with x = pool.extent[4]: vLLM's paged-attention key cache
/// (split_key_view). Same placement and errors as the (block, offset, head, dim) form.
template <class T, class S>
void write_slots(const slot_mapping& m, tensor_view<S, 3> src, tensor_view<T, 5> pool) {
  detail::check_slot_write(m, src, pool);
  const std::size_t x = pool.extent[4], chunks = pool.extent[3];
  detail::require(pool.extent[2] == src.extent[1] && chunks * x == src.extent[2],
                  "paged pool: ", pool.extent[2], " heads x ", chunks, " x ", x,
                  " dims, the source has ", src.extent[1], " x ", src.extent[2]);
  if (detail::empty_view(pool)) return;
  for (std::size_t t = 0; t < src.extent[0]; ++t) {
    const std::int64_t s = m.slots()[t];
    if (s < 0) continue;
    const auto slot = static_cast<std::size_t>(s);
    for (std::size_t c = 0; c < chunks; ++c) {
      detail::copy_token(&src(t, 0, c * x), src.stride[1], src.stride[2],
                         &pool(slot / m.block_size(), slot % m.block_size(), 0, c, 0),
                         pool.stride[2], pool.stride[4], src.extent[1], x);
    }
  }
}

/// A packed (row, slot, head, dim) tensor seen as (token, head, dim) over its n_rows * width
/// slots, for write_slots. Throws prepack::error if its rows are not evenly spaced slots
/// (stride of a row != width x stride of a slot).
template <class S>
tensor_view<S, 3> flatten_rows(const tensor_view<S, 4>& v) {
  detail::require(v.extent[0] <= 1 || v.stride[0] == v.extent[1] * v.stride[1],
                  "source: rows are not contiguous runs of slots (row stride ", v.stride[0],
                  ", width ", v.extent[1], " x slot stride ", v.stride[1], ")");
  return {v.data,
          {v.extent[0] * v.extent[1], v.extent[2], v.extent[3]},
          {v.stride[1], v.stride[2], v.stride[3]}};
}

/// Scatters K and V of every layer into a paged KV pool, k_pool and v_pool seen as (layer,
/// block, offset in block, head, dim): token t of prompt i (position prompt_context[i] + t)
/// lands in block block_table(i, position / block_size) at offset position % block_size.
/// Throws prepack::error, writing nothing, for what make_slot_mapping refuses, a source that
/// does not match the layout, pools with too few layers, heads or dims that differ, overlapping
/// strides, or K and V pools that share an element the copy writes.
template <class T, class S, class B, class Token, class Index>
void unpack_paged(const packed_layout<Token, Index>& l, const packed_kv<S>& src,
                  tensor_view<T, 5> k_pool, tensor_view<T, 5> v_pool,
                  tensor_view<B, 2> block_table) {
  detail::check_source(src.k, l, "keys");
  detail::check_source(src.v, l, "values");
  detail::require(src.k.extent == src.v.extent, "keys and values differ in shape");
  detail::require(k_pool.extent == v_pool.extent, "key and value pools differ in shape");
  detail::check_heads(src.k, k_pool, "paged pool");
  detail::check_view(k_pool, "key pool", true);
  detail::check_view(v_pool, "value pool", true);
  const std::size_t block_size = k_pool.extent[2];
  detail::check_block_table(l, block_table, k_pool.extent[1], block_size);
  detail::written_runs runs;
  for (const auto* pool : {&k_pool, &v_pool}) {
    runs.add(*pool, {0, 0, 0, 0, 0}, pool->extent);
  }
  runs.require_disjoint("key and value pools");
  const auto into = [&](const tensor_view<T, 5>& pool) {
    return [&, pool](std::size_t layer, std::size_t i, std::size_t t) {
      const std::size_t slot = detail::pool_slot(l, block_table, block_size, i, t);
      return detail::token_dst<T>{&pool(layer, slot / block_size, slot % block_size, 0, 0),
                                  pool.stride[3], pool.stride[4]};
    };
  };
  detail::scatter(l, src.k, into(k_pool));
  detail::scatter(l, src.v, into(v_pool));
}

/// One layer: src (row, slot, head, dim) into a pool seen as (block, offset in block, head,
/// dim). Same placement and errors as above.
template <class T, class S, class B, class Token, class Index>
void unpack_paged(const packed_layout<Token, Index>& l, tensor_view<S, 4> src,
                  tensor_view<T, 4> pool, tensor_view<B, 2> block_table) {
  detail::check_source(one_layer(src), l, "source");
  detail::require(pool.extent[2] == src.extent[2] && pool.extent[3] == src.extent[3],
                  "paged pool: ", pool.extent[2], " heads x ", pool.extent[3],
                  " dims, the source has ", src.extent[2], " x ", src.extent[3]);
  detail::check_view(pool, "paged pool", true);
  const std::size_t block_size = pool.extent[1];
  detail::check_block_table(l, block_table, pool.extent[0], block_size);
  detail::scatter(l, one_layer(src), [&](std::size_t, std::size_t i, std::size_t t) {
    const std::size_t slot = detail::pool_slot(l, block_table, block_size, i, t);
    return detail::token_dst<T>{&pool(slot / block_size, slot % block_size, 0, 0), pool.stride[2],
                                pool.stride[3]};
  });
}

/// Gathers each prompt's last-token row: src is (flat slot, feature) over the n_rows * width
/// slots, dst is (prompt, feature). For logits or hidden states. Throws prepack::error, writing
/// nothing, if src does not hold the layout's slots, dst has fewer than n_prompts rows, the
/// feature sizes differ, or dst's strides overlap.
template <class T, class S, class Token, class Index>
void gather_last(const packed_layout<Token, Index>& l, tensor_view<S, 2> src,
                 tensor_view<T, 2> dst) {
  detail::check_view(src, "source", false);
  detail::check_view(dst, "last-token destination", true);
  detail::require(src.extent[0] == l.n_slots(), "source: ", src.extent[0],
                  " slots, the layout has ", l.n_slots(), " (a layout from another batch?)");
  detail::require(dst.extent[0] >= l.n_prompts(), "last-token destination: ", dst.extent[0],
                  " rows for ", l.n_prompts(), " prompts");
  detail::require(dst.extent[1] == src.extent[1], "last-token destination: ", dst.extent[1],
                  " features, the source has ", src.extent[1]);
  for (std::size_t i = 0; i < l.n_prompts(); ++i) {
    const auto s = static_cast<std::size_t>(l.last_token()[i]);
    for (std::size_t f = 0; f < src.extent[1]; ++f) {
      if constexpr (std::is_same_v<std::remove_const_t<S>, T>) {
        dst(i, f) = src(s, f);
      } else {
        dst(i, f) = convert<T>(src(s, f));
      }
    }
  }
}

/// Convenience: each prompt's rows copied into a new contiguous buffer [length][heads][dim]
/// (the chunk's own tokens, whatever its context).
/// Allocates the buffers; prefer unpack_prompts to write into an engine's own memory.
template <class S, class Token, class Index, class T = std::remove_const_t<S>>
std::vector<std::vector<T>> unpack_contiguous(const packed_layout<Token, Index>& l,
                                              tensor_view<S, 4> src) {
  detail::check_source(one_layer(src), l, "source");
  std::vector<std::vector<T>> out(l.n_prompts());
  for (std::size_t i = 0; i < l.n_prompts(); ++i) {
    out[i].resize(static_cast<std::size_t>(l.prompt_length()[i]) * src.extent[2] * src.extent[3]);
  }
  const auto s = one_layer(src);
  detail::scatter(l, s, [&](std::size_t, std::size_t i, std::size_t t) {
    return detail::token_dst<T>{out[i].data() + t * src.extent[2] * src.extent[3], src.extent[3],
                                1};
  });
  return out;
}

PREPACK_NAMESPACE_END
