// prepack/layout.hpp - the packed batch: a plan plus the prompts' tokens laid out as
// [n_rows][width] arrays of token ids, position ids and segment ids.
//
// Cost: O(n_rows * width + n_prompts) time; allocates 3 * n_rows * width elements for the
// token, position and segment arrays plus O(n_prompts + n_rows) for the per-prompt tables.
// The padded baseline is the same structure built from prepack::padded(...).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "detail/checked.hpp"
#include "error.hpp"
#include "plan.hpp"
#include "span.hpp"

PREPACK_NAMESPACE_BEGIN

/// A packed (or padded) batch, ready for a prefill kernel. Token and Index are the engine's
/// integer types; Index must be signed (segment id -1 marks a pad slot).
template <class Token = std::int32_t, class Index = std::int32_t>
struct packed_layout {
  static_assert(std::is_integral_v<Token>, "token ids must be an integer type");
  static_assert(std::is_integral_v<Index> && std::is_signed_v<Index>,
                "Index must be a signed integer type");
  using token_type = Token;
  using index_type = Index;

  std::size_t n_rows = 0;              // rows of the batch
  std::size_t width = 0;               // slots per row (the plan's capacity)
  std::vector<Token> tokens;           // [n_rows][width]  token ids; pad slots hold the pad id
  std::vector<Index> positions;        // [n_rows][width]  0, 1, .. within each prompt
  std::vector<Index> segments;         // [n_rows][width]  prompt id of the slot, -1 on pad slots
  std::vector<std::size_t> row_begin;  // [n_rows + 1]     row r holds row_prompts[row_begin[r],
                                       //                  row_begin[r + 1])
  std::vector<Index> row_prompts;      // [n_prompts]      prompt ids row by row, in slot order
  std::vector<Index> row_cu_seqlens;   // [n_prompts + n_rows]  per row, the slot where its first
                                       //                  prompt starts then where each prompt
                                       //                  ends; see row_cu()
  std::vector<Index> prompt_row;       // [n_prompts]      row of prompt i
  std::vector<Index> prompt_offset;    // [n_prompts]      first slot of prompt i in its row
  std::vector<Index> prompt_length;    // [n_prompts]      tokens of prompt i
  std::vector<Index> last_token;       // [n_prompts]      flat slot (row * width + slot) of the
                                       //                  last token of prompt i

  std::size_t n_prompts() const noexcept { return prompt_length.size(); }
  std::size_t n_slots() const noexcept { return n_rows * width; }
  std::size_t useful_tokens() const noexcept {
    std::size_t s = 0;
    for (Index l : prompt_length) s += static_cast<std::size_t>(l);
    return s;
  }
  /// Row r's cumulative boundaries, in slots of that row: {start of its first prompt, end of
  /// prompt 1, end of prompt 2, ..}; row_prompts(r).size() + 1 entries. For a packed row this is
  /// cu_seqlens of the row as FlashAttention's varlen kernels take it.
  span<const Index> row_cu(std::size_t r) const noexcept {
    return {row_cu_seqlens.data() + row_begin[r] + r, row_begin[r + 1] - row_begin[r] + 1};
  }
  span<const Index> prompts_in_row(std::size_t r) const noexcept {
    return {row_prompts.data() + row_begin[r], row_begin[r + 1] - row_begin[r]};
  }
};

/// Values written into pad slots. Pad slots are masked everywhere, so neither value changes any
/// result; Hugging Face writes position 1 on left-padded slots, 0 is as good.
struct layout_options {
  long long pad_id = 0;
  long long pad_position = 0;
};

namespace detail {

// Checks that a plan is internally consistent: every prompt exactly once, inside its row, and
// the prompts of a row adjacent in slot order. Throws naming the first inconsistency.
template <class Length>
void check_plan(const pack_plan<Length>& p) {
  const std::size_t n = p.length.size();
  const std::size_t n_rows = p.fill.size();
  require(n > 0, "empty batch: the plan holds no prompts");
  require(p.capacity > 0, "plan: capacity ", p.capacity);
  require(p.row.size() == n && p.offset.size() == n && p.row_prompts.size() == n, "plan: ", n,
          " lengths but ", p.row.size(), " rows, ", p.offset.size(), " offsets, ",
          p.row_prompts.size(), " row entries");
  require(p.row_begin.size() == n_rows + 1 && p.row_begin.front() == 0 && p.row_begin.back() == n,
          "plan: row_begin does not delimit ", n, " prompts in ", n_rows, " rows");
  for (std::size_t i = 0; i < n; ++i) {
    require(p.length[i] > 0, "prompt ", i, ": length ", p.length[i]);
    require(p.row[i] < n_rows, "prompt ", i, ": row ", p.row[i], " out of range (", n_rows,
            " rows)");
    require(!is_negative(p.offset[i]) && p.length[i] <= p.capacity &&
                p.offset[i] <= p.capacity - p.length[i],
            "prompt ", i, ": offset ", p.offset[i], " + length ", p.length[i], " outside capacity ",
            p.capacity);
  }
  std::vector<unsigned char> seen(n, 0);
  for (std::size_t r = 0; r < n_rows; ++r) {
    require(p.row_begin[r] <= p.row_begin[r + 1], "plan: row ", r, " has negative size");
    std::size_t used = 0;
    for (std::size_t k = p.row_begin[r]; k < p.row_begin[r + 1]; ++k) {
      const std::size_t i = p.row_prompts[k];
      require(i < n && !seen[i] && p.row[i] == r, "row ", r, ": entry ", k, " (prompt ", i,
              ") is not a prompt of this row or is listed twice");
      seen[i] = 1;
      if (k > p.row_begin[r]) {
        const std::size_t prev = p.row_prompts[k - 1];
        require(p.offset[i] == p.offset[prev] + p.length[prev], "row ", r, ": prompt ", i,
                " starts at slot ", p.offset[i], ", not where prompt ", prev, " ends (",
                p.offset[prev] + p.length[prev], ")");
      }
      used += static_cast<std::size_t>(p.length[i]);
    }
    require(used == static_cast<std::size_t>(p.fill[r]), "row ", r, ": fill ", p.fill[r],
            " but its prompts hold ", used, " tokens");
  }
}

template <class Token, class Index, class Length>
packed_layout<Token, Index> layout_skeleton(const pack_plan<Length>& p, const layout_options& opt) {
  check_plan(p);
  const std::size_t n = p.n_prompts();
  packed_layout<Token, Index> l;
  l.n_rows = p.n_rows();
  l.width = static_cast<std::size_t>(p.capacity);
  const std::size_t slots = mul(l.n_rows, l.width, "layout slots");
  // Every value the layout stores must fit Index: slot numbers, prompt ids and positions.
  narrow<Index>(slots - 1, "flat slot index");
  narrow<Index>(n - 1, "prompt id");
  const Token pad_id = narrow<Token>(opt.pad_id, "pad id");
  const Index pad_position = narrow<Index>(opt.pad_position, "pad position");

  l.tokens.assign(slots, pad_id);
  l.positions.assign(slots, pad_position);
  l.segments.assign(slots, Index{-1});
  l.row_begin = p.row_begin;
  l.row_prompts.resize(n);
  l.row_cu_seqlens.resize(n + l.n_rows);
  l.prompt_row.resize(n);
  l.prompt_offset.resize(n);
  l.prompt_length.resize(n);
  l.last_token.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    l.prompt_row[i] = static_cast<Index>(p.row[i]);
    l.prompt_offset[i] = static_cast<Index>(p.offset[i]);
    l.prompt_length[i] = static_cast<Index>(p.length[i]);
    const std::size_t first = p.row[i] * l.width + static_cast<std::size_t>(p.offset[i]);
    const std::size_t len = static_cast<std::size_t>(p.length[i]);
    l.last_token[i] = static_cast<Index>(first + len - 1);
    for (std::size_t t = 0; t < len; ++t) {
      l.positions[first + t] = static_cast<Index>(t);
      l.segments[first + t] = static_cast<Index>(i);
    }
  }
  for (std::size_t r = 0; r < l.n_rows; ++r) {
    Index* cu = l.row_cu_seqlens.data() + p.row_begin[r] + r;
    cu[0] = p.row_begin[r] == p.row_begin[r + 1]
                ? Index{0}
                : static_cast<Index>(p.offset[p.row_prompts[p.row_begin[r]]]);
    for (std::size_t k = p.row_begin[r]; k < p.row_begin[r + 1]; ++k) {
      const std::size_t i = p.row_prompts[k];
      l.row_prompts[k] = static_cast<Index>(i);
      cu[k - p.row_begin[r] + 1] = static_cast<Index>(p.offset[i] + p.length[i]);
    }
  }
  return l;
}

}  // namespace detail

/// Builds the packed batch from a plan and the prompts' tokens concatenated in prompt order
/// (prompt 0's tokens, then prompt 1's, ..). Throws prepack::error if the plan is inconsistent,
/// if tokens.size() differs from the lengths' total, or if a slot number, prompt id, pad id or
/// position does not fit Token / Index.
template <class Token = std::int32_t, class Index = std::int32_t, class Length, class T>
packed_layout<Token, Index> make_layout(const pack_plan<Length>& plan, span<const T> tokens,
                                        const layout_options& opt = {}) {
  static_assert(std::is_integral_v<T>, "token ids must be integers");
  std::size_t total = 0;
  for (Length len : plan.length)
    total = detail::add(total, static_cast<std::size_t>(len), "tokens");
  detail::require(tokens.size() == total, "token count ", tokens.size(),
                  " does not match the lengths' total ", total);
  for (std::size_t k = 0; k < tokens.size(); ++k) {
    if (!detail::fits<Token>(tokens[k]))
      detail::fail("token ", k, ": id ", tokens[k], " does not fit the token type");
  }
  packed_layout<Token, Index> l = detail::layout_skeleton<Token, Index>(plan, opt);
  std::size_t src = 0;
  for (std::size_t i = 0; i < plan.n_prompts(); ++i) {
    const std::size_t first = plan.row[i] * l.width + static_cast<std::size_t>(plan.offset[i]);
    for (std::size_t t = 0; t < static_cast<std::size_t>(plan.length[i]); ++t) {
      l.tokens[first + t] = static_cast<Token>(tokens[src++]);
    }
  }
  return l;
}

template <class Token = std::int32_t, class Index = std::int32_t, class Length, class T>
packed_layout<Token, Index> make_layout(const pack_plan<Length>& plan, const std::vector<T>& tokens,
                                        const layout_options& opt = {}) {
  return make_layout<Token, Index>(plan, span<const T>(tokens), opt);
}

/// Builds the packed batch from one token vector per prompt. Throws as above, naming the
/// prompt whose token count differs from its planned length.
template <class Token = std::int32_t, class Index = std::int32_t, class Length, class T>
packed_layout<Token, Index> make_layout(const pack_plan<Length>& plan,
                                        const std::vector<std::vector<T>>& prompts,
                                        const layout_options& opt = {}) {
  detail::require(prompts.size() == plan.n_prompts(), "prompt count ", prompts.size(),
                  " does not match the plan's ", plan.n_prompts());
  std::vector<T> flat;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    detail::require(
        i >= plan.length.size() || prompts[i].size() == static_cast<std::size_t>(plan.length[i]),
        "prompt ", i, ": ", prompts[i].size(), " tokens, the plan says length ", plan.length[i]);
    flat.insert(flat.end(), prompts[i].begin(), prompts[i].end());
  }
  return make_layout<Token, Index>(plan, span<const T>(flat), opt);
}

/// Checks a layout's own invariants (array sizes agree with n_rows, width and n_prompts; each
/// prompt's slots carry its segment id). Kernels call it on layouts they are handed, so a
/// layout edited by hand or mixed from two batches is refused. Throws prepack::error.
template <class Token, class Index>
void check_layout(const packed_layout<Token, Index>& l) {
  using detail::require;
  const std::size_t slots = detail::mul(l.n_rows, l.width, "layout slots");
  const std::size_t n = l.n_prompts();
  require(n > 0 && l.n_rows > 0 && l.width > 0, "layout: empty (", n, " prompts, ", l.n_rows,
          " rows, width ", l.width, ")");
  require(l.tokens.size() == slots && l.positions.size() == slots && l.segments.size() == slots,
          "layout: arrays do not hold n_rows * width = ", slots, " slots");
  require(l.prompt_row.size() == n && l.prompt_offset.size() == n && l.last_token.size() == n &&
              l.row_prompts.size() == n && l.row_begin.size() == l.n_rows + 1 &&
              l.row_cu_seqlens.size() == n + l.n_rows,
          "layout: per-prompt or per-row tables have inconsistent sizes");
  std::size_t useful = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const Index row = l.prompt_row[i], off = l.prompt_offset[i], len = l.prompt_length[i];
    require(row >= 0 && static_cast<std::size_t>(row) < l.n_rows && off >= 0 && len > 0 &&
                static_cast<std::size_t>(off) + static_cast<std::size_t>(len) <= l.width,
            "layout: prompt ", i, " (row ", row, ", offset ", off, ", length ", len,
            ") lies outside ", l.n_rows, " rows of width ", l.width);
    const std::size_t first =
        static_cast<std::size_t>(row) * l.width + static_cast<std::size_t>(off);
    const std::size_t last = first + static_cast<std::size_t>(len) - 1;
    require(l.last_token[i] >= 0 && static_cast<std::size_t>(l.last_token[i]) == last,
            "layout: prompt ", i, ": last token ", l.last_token[i], ", expected ", last);
    for (std::size_t t = 0; t < static_cast<std::size_t>(len); ++t) {
      require(l.segments[first + t] == static_cast<Index>(i) &&
                  l.positions[first + t] == static_cast<Index>(t),
              "layout: prompt ", i, ": slot ", first + t, " holds segment ", l.segments[first + t],
              " position ", l.positions[first + t]);
    }
    useful += static_cast<std::size_t>(len);
  }
  std::size_t marked = 0;
  for (Index seg : l.segments) marked += seg >= 0 ? 1 : 0;
  require(marked == useful, "layout: ", marked, " slots carry a segment id but the prompts hold ",
          useful, " tokens");
  // Row tables: row_begin delimits row_prompts; each row lists its own prompts once, adjacent in
  // slot order, and row_cu_seqlens holds their boundaries.
  require(l.row_begin.front() == 0 && l.row_begin.back() == n,
          "layout: row_begin does not delimit ", n, " prompts");
  std::vector<unsigned char> seen(n, 0);
  for (std::size_t r = 0; r < l.n_rows; ++r) {
    require(l.row_begin[r] <= l.row_begin[r + 1], "layout: row ", r, ": row_begin decreases");
    const Index* cu = l.row_cu_seqlens.data() + l.row_begin[r] + r;
    for (std::size_t k = l.row_begin[r]; k < l.row_begin[r + 1]; ++k) {
      const Index id = l.row_prompts[k];
      require(id >= 0 && static_cast<std::size_t>(id) < n && !seen[static_cast<std::size_t>(id)] &&
                  l.prompt_row[static_cast<std::size_t>(id)] == static_cast<Index>(r),
              "layout: row ", r, ": entry ", k, " (prompt ", id,
              ") is not a prompt of this row or is listed twice");
      const auto i = static_cast<std::size_t>(id);
      seen[i] = 1;
      const std::size_t j = k - l.row_begin[r];
      require((j > 0 || cu[0] == l.prompt_offset[i]) && cu[j] == l.prompt_offset[i] &&
                  cu[j + 1] == l.prompt_offset[i] + l.prompt_length[i],
              "layout: row ", r, ": cu_seqlens disagree with prompt ", i);
    }
  }
}

PREPACK_NAMESPACE_END
