// prepack/layout.hpp - the packed batch: a plan plus the prompts' tokens laid out as
// [n_rows][width] arrays of token ids, position ids and segment ids.
//
// A packed_layout is valid by construction: make_layout builds it from a checked plan, and
// packed_layout::from_parts adopts arrays built elsewhere only after checking every invariant.
// Its arrays are read-only, so everything downstream (masks, engine formats, unpackers, the
// reference kernel) trusts it without checking it again.
//
// Cost: O(n_rows * width + n_prompts) time; allocates 3 * n_rows * width elements for the
// token, position and segment arrays plus O(n_prompts + n_rows) for the per-prompt tables.
// The padded baseline is the same structure built from prepack::padded(...).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "detail/checked.hpp"
#include "error.hpp"
#include "plan.hpp"
#include "span.hpp"

PREPACK_NAMESPACE_BEGIN

/// The arrays of a packed batch, as plain data: what packed_layout holds, and what an engine
/// that builds a batch by hand passes to packed_layout::from_parts. "Prompt" i is the i-th
/// sequence of the batch: a whole prompt, or a chunk of one that continues `prompt_context[i]`
/// tokens already cached (its positions then start there).
template <class Token = std::int32_t, class Index = std::int32_t>
struct layout_parts {
  std::size_t n_rows = 0;              // rows of the batch
  std::size_t width = 0;               // slots per row
  std::vector<Token> tokens;           // [n_rows][width]  token ids; pad slots hold the pad id
  std::vector<Index> positions;        // [n_rows][width]  context, context + 1, .. per prompt
  std::vector<Index> segments;         // [n_rows][width]  prompt id of the slot, -1 on pad slots
  std::vector<std::size_t> row_begin;  // [n_rows + 1]     row r holds row_prompts[row_begin[r],
                                       //                  row_begin[r + 1])
  std::vector<Index> row_prompts;      // [n_prompts]      prompt ids row by row, in slot order
  std::vector<Index> row_cu_seqlens;   // [n_prompts + n_rows]  per row, the slot where its first
                                       //                  prompt starts then where each ends
  std::vector<Index> prompt_row;       // [n_prompts]      row of prompt i
  std::vector<Index> prompt_offset;    // [n_prompts]      first slot of prompt i in its row
  std::vector<Index> prompt_length;    // [n_prompts]      tokens of prompt i in this batch
  std::vector<Index> prompt_context;   // [n_prompts]      tokens of prompt i already cached
                                       //                  (0 for a whole prompt)
  std::vector<Index> last_token;       // [n_prompts]      flat slot (row * width + slot) of the
                                       //                  last token of prompt i
};

namespace detail {
struct layout_access;
}  // namespace detail

/// A packed (or padded) batch, ready for a prefill kernel. Token and Index are the engine's
/// integer types; Index must be signed (segment id -1 marks a pad slot). Every value it stores
/// fits Index (slot numbers, cumulative ends, lengths, positions), checked when it is built.
template <class Token = std::int32_t, class Index = std::int32_t>
class packed_layout {
 public:
  static_assert(std::is_integral_v<Token>, "token ids must be an integer type");
  static_assert(std::is_integral_v<Index> && std::is_signed_v<Index>,
                "Index must be a signed integer type");
  using token_type = Token;
  using index_type = Index;
  using parts_type = layout_parts<Token, Index>;

  /// Adopts arrays built elsewhere, after checking every invariant: array sizes agree with
  /// n_rows, width and n_prompts; each prompt lies inside its row and its slots carry its
  /// segment id and positions context, context + 1, ..; pad slots carry segment -1; each row
  /// lists its own prompts once, adjacent, with row_cu_seqlens at their boundaries; every value
  /// fits Index. Throws prepack::error naming the first violation.
  static packed_layout from_parts(parts_type parts);

  /// An empty layout (no rows, no prompts), as a moved-from one is: assign a built one to it.
  packed_layout() = default;
  bool empty() const noexcept { return p_.prompt_length.empty(); }

  std::size_t n_rows() const noexcept { return p_.n_rows; }
  std::size_t width() const noexcept { return p_.width; }
  std::size_t n_prompts() const noexcept { return p_.prompt_length.size(); }
  std::size_t n_slots() const noexcept { return p_.n_rows * p_.width; }
  /// Tokens that carry a prompt: the sum of the lengths.
  std::size_t useful_tokens() const noexcept { return useful_; }

  span<const Token> tokens() const noexcept { return p_.tokens; }                  // [rows][width]
  span<const Index> positions() const noexcept { return p_.positions; }            // [rows][width]
  span<const Index> segments() const noexcept { return p_.segments; }              // [rows][width]
  span<const std::size_t> row_begin() const noexcept { return p_.row_begin; }      // [rows + 1]
  span<const Index> row_prompts() const noexcept { return p_.row_prompts; }        // [n_prompts]
  span<const Index> row_cu_seqlens() const noexcept { return p_.row_cu_seqlens; }  // [n + rows]
  span<const Index> prompt_row() const noexcept { return p_.prompt_row; }          // [n_prompts]
  span<const Index> prompt_offset() const noexcept { return p_.prompt_offset; }    // [n_prompts]
  span<const Index> prompt_length() const noexcept { return p_.prompt_length; }    // [n_prompts]
  span<const Index> prompt_context() const noexcept { return p_.prompt_context; }  // [n_prompts]
  span<const Index> last_token() const noexcept { return p_.last_token; }          // [n_prompts]

  /// Flat slot (row * width + offset) of prompt i's first token.
  std::size_t first_slot(std::size_t i) const noexcept {
    return static_cast<std::size_t>(p_.prompt_row[i]) * p_.width +
           static_cast<std::size_t>(p_.prompt_offset[i]);
  }
  /// Row r's cumulative boundaries, in slots of that row: {start of its first prompt, end of
  /// prompt 1, end of prompt 2, ..}; prompts_in_row(r).size() + 1 entries. For a packed row this
  /// is cu_seqlens of the row as FlashAttention's varlen kernels take it.
  span<const Index> row_cu(std::size_t r) const noexcept {
    return {p_.row_cu_seqlens.data() + p_.row_begin[r] + r,
            p_.row_begin[r + 1] - p_.row_begin[r] + 1};
  }
  span<const Index> prompts_in_row(std::size_t r) const noexcept {
    return {p_.row_prompts.data() + p_.row_begin[r], p_.row_begin[r + 1] - p_.row_begin[r]};
  }

  /// Every array at once, read-only.
  const parts_type& parts() const noexcept { return p_; }
  /// Hands the arrays back (to edit them and adopt them again with from_parts).
  parts_type release() && { return std::move(p_); }

 private:
  parts_type p_;
  std::size_t useful_ = 0;

  friend struct detail::layout_access;
};

/// Values written into pad slots. Pad slots are masked everywhere, so neither value changes any
/// result; Hugging Face writes position 1 on left-padded slots, 0 is as good.
struct layout_options {
  long long pad_id = 0;
  long long pad_position = 0;
};

namespace detail {

// Adopts parts that make_layout built valid by construction (or that check_parts has checked)
// without checking them again. Internal: from_parts is the public way in.
struct layout_access {
  template <class Token, class Index>
  static packed_layout<Token, Index> adopt(layout_parts<Token, Index> parts) {
    packed_layout<Token, Index> l;
    l.p_ = std::move(parts);
    for (Index len : l.p_.prompt_length) l.useful_ += static_cast<std::size_t>(len);
    return l;
  }
};

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
  for (std::size_t r = 0; r < n_rows; ++r) {  // every row's range inside row_prompts
    if (p.row_begin[r] > p.row_begin[r + 1]) {
      fail("plan: row_begin[", r, "] = ", p.row_begin[r], " > row_begin[", r + 1,
           "] = ", p.row_begin[r + 1], " (row ", r, " has negative size)");
    }
  }
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

// The layout of a checked plan: every table and the position/segment arrays, with the token
// array filled with the pad id. Every value the layout stores is checked to fit Index first:
// the width (which bounds offsets, lengths and the cumulative row ends), the largest slot
// number, the largest prompt id and the largest position (context + length - 1).
template <class Token, class Index, class Length>
layout_parts<Token, Index> layout_skeleton(const pack_plan<Length>& p,
                                           span<const long long> context,
                                           const layout_options& opt) {
  check_plan(p);
  const std::size_t n = p.n_prompts();
  require(context.empty() || context.size() == n, "contexts: ", context.size(), " for ", n,
          " prompts");
  layout_parts<Token, Index> l;
  l.n_rows = p.n_rows();
  l.width = static_cast<std::size_t>(p.capacity);
  const std::size_t slots = mul(l.n_rows, l.width, "layout slots");
  narrow<Index>(l.width, "row width");
  narrow<Index>(slots - 1, "flat slot index");
  narrow<Index>(n - 1, "prompt id");
  for (std::size_t i = 0; i < context.size(); ++i) {
    require(context[i] >= 0, "prompt ", i, ": context ", context[i]);
    const unsigned long long last = static_cast<unsigned long long>(context[i]) +
                                    static_cast<unsigned long long>(p.length[i]) - 1;
    if (!fits<Index>(last)) {
      fail("prompt ", i, ": position ", last, " does not fit the ", type_name<Index>(),
           " index type");
    }
  }
  const Token pad_id = narrow<Token>(opt.pad_id, "pad id", "token");
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
  l.prompt_context.assign(n, Index{0});
  l.last_token.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const Index ctx = context.empty() ? Index{0} : static_cast<Index>(context[i]);
    l.prompt_row[i] = static_cast<Index>(p.row[i]);
    l.prompt_offset[i] = static_cast<Index>(p.offset[i]);
    l.prompt_length[i] = static_cast<Index>(p.length[i]);
    l.prompt_context[i] = ctx;
    const std::size_t first = p.row[i] * l.width + static_cast<std::size_t>(p.offset[i]);
    const std::size_t len = static_cast<std::size_t>(p.length[i]);
    l.last_token[i] = static_cast<Index>(first + len - 1);
    for (std::size_t t = 0; t < len; ++t) {
      l.positions[first + t] = static_cast<Index>(static_cast<std::size_t>(ctx) + t);
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

// Checks every invariant of hand-built parts (see packed_layout::from_parts).
template <class Token, class Index>
std::size_t check_parts(const layout_parts<Token, Index>& l) {
  const std::size_t slots = mul(l.n_rows, l.width, "layout slots");
  const std::size_t n = l.prompt_length.size();
  require(n > 0 && l.n_rows > 0 && l.width > 0, "layout: empty (", n, " prompts, ", l.n_rows,
          " rows, width ", l.width, ")");
  require(fits<Index>(l.width) && fits<Index>(slots - 1) && fits<Index>(n - 1),
          "layout: ", l.n_rows, " rows of width ", l.width, " and ", n, " prompts do not fit the ",
          type_name<Index>(), " index type");
  require(l.tokens.size() == slots && l.positions.size() == slots && l.segments.size() == slots,
          "layout: arrays do not hold n_rows * width = ", slots, " slots");
  require(l.prompt_row.size() == n && l.prompt_offset.size() == n && l.last_token.size() == n &&
              l.prompt_context.size() == n && l.row_prompts.size() == n &&
              l.row_begin.size() == l.n_rows + 1 && l.row_cu_seqlens.size() == n + l.n_rows,
          "layout: per-prompt or per-row tables have inconsistent sizes");
  std::size_t useful = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const Index row = l.prompt_row[i], off = l.prompt_offset[i], len = l.prompt_length[i];
    const Index ctx = l.prompt_context[i];
    require(row >= 0 && static_cast<std::size_t>(row) < l.n_rows && off >= 0 && len > 0 &&
                static_cast<std::size_t>(off) + static_cast<std::size_t>(len) <= l.width,
            "layout: prompt ", i, " (row ", row, ", offset ", off, ", length ", len,
            ") lies outside ", l.n_rows, " rows of width ", l.width);
    require(ctx >= 0 && fits<Index>(static_cast<unsigned long long>(ctx) +
                                    static_cast<unsigned long long>(len) - 1),
            "layout: prompt ", i, ": context ", ctx, " + length ", len, " outside the ",
            type_name<Index>(), " index type");
    const std::size_t first =
        static_cast<std::size_t>(row) * l.width + static_cast<std::size_t>(off);
    const std::size_t last = first + static_cast<std::size_t>(len) - 1;
    require(l.last_token[i] >= 0 && static_cast<std::size_t>(l.last_token[i]) == last,
            "layout: prompt ", i, ": last token ", l.last_token[i], ", expected ", last);
    for (std::size_t t = 0; t < static_cast<std::size_t>(len); ++t) {
      require(l.segments[first + t] == static_cast<Index>(i) &&
                  l.positions[first + t] == static_cast<Index>(static_cast<std::size_t>(ctx) + t),
              "layout: prompt ", i, ": slot ", first + t, " holds segment ", l.segments[first + t],
              " position ", l.positions[first + t], ", expected ", i, " and ",
              static_cast<std::size_t>(ctx) + t);
    }
    useful += static_cast<std::size_t>(len);
  }
  std::size_t marked = 0;
  for (std::size_t s = 0; s < slots; ++s) {
    const Index seg = l.segments[s];
    require(seg >= -1, "layout: slot ", s, " holds segment ", seg, " (a pad slot's segment is -1)");
    marked += seg >= 0 ? 1 : 0;
  }
  require(marked == useful, "layout: ", marked, " slots carry a segment id but the prompts hold ",
          useful, " tokens");
  // Row tables: row_begin delimits row_prompts; each row lists its own prompts once, adjacent in
  // slot order, and row_cu_seqlens holds their boundaries.
  require(l.row_begin.front() == 0 && l.row_begin.back() == n,
          "layout: row_begin does not delimit ", n, " prompts");
  for (std::size_t r = 0; r < l.n_rows; ++r) {  // every row's range inside row_prompts
    if (l.row_begin[r] > l.row_begin[r + 1]) {
      fail("layout: row ", r, ": row_begin[", r, "] = ", l.row_begin[r], " > row_begin[", r + 1,
           "] = ", l.row_begin[r + 1]);
    }
  }
  std::vector<unsigned char> seen(n, 0);
  for (std::size_t r = 0; r < l.n_rows; ++r) {
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
      require(cu[j] == l.prompt_offset[i] && cu[j + 1] == l.prompt_offset[i] + l.prompt_length[i],
              "layout: row ", r, ": cu_seqlens disagree with prompt ", i);
    }
  }
  return useful;
}

}  // namespace detail

template <class Token, class Index>
packed_layout<Token, Index> packed_layout<Token, Index>::from_parts(parts_type parts) {
  detail::check_parts(parts);
  return detail::layout_access::adopt(std::move(parts));
}

namespace detail {

template <class Token, class Index, class Length, class T>
packed_layout<Token, Index> build_layout(const pack_plan<Length>& plan, span<const T> tokens,
                                         span<const long long> context, const layout_options& opt) {
  static_assert(std::is_integral_v<T>, "token ids must be integers");
  std::size_t total = 0;
  for (Length len : plan.length) total = add(total, static_cast<std::size_t>(len), "tokens");
  require(tokens.size() == total, "token count ", tokens.size(),
          " does not match the lengths' total ", total);
  for (std::size_t k = 0; k < tokens.size(); ++k) {
    if (!fits<Token>(tokens[k]))
      fail("token ", k, ": id ", tokens[k], " does not fit the token type");
  }
  layout_parts<Token, Index> l = layout_skeleton<Token, Index>(plan, context, opt);
  std::size_t src = 0;
  for (std::size_t i = 0; i < plan.n_prompts(); ++i) {
    const std::size_t first = plan.row[i] * l.width + static_cast<std::size_t>(plan.offset[i]);
    for (std::size_t t = 0; t < static_cast<std::size_t>(plan.length[i]); ++t) {
      l.tokens[first + t] = static_cast<Token>(tokens[src++]);
    }
  }
  return layout_access::adopt(std::move(l));
}

template <class T>
std::vector<T> concatenate(const std::vector<std::vector<T>>& prompts) {
  std::vector<T> flat;
  for (const auto& p : prompts) flat.insert(flat.end(), p.begin(), p.end());
  return flat;
}

template <class T, class Length>
void check_prompt_sizes(const std::vector<std::vector<T>>& prompts, const pack_plan<Length>& plan) {
  require(prompts.size() == plan.n_prompts(), "prompt count ", prompts.size(),
          " does not match the plan's ", plan.n_prompts());
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    require(prompts[i].size() == static_cast<std::size_t>(plan.length[i]), "prompt ", i, ": ",
            prompts[i].size(), " tokens, the plan says length ", plan.length[i]);
  }
}

}  // namespace detail

/// Builds the packed batch from a plan and the prompts' tokens concatenated in prompt order
/// (prompt 0's tokens, then prompt 1's, ..). Throws prepack::error if the plan is inconsistent,
/// if tokens.size() differs from the lengths' total, or if a slot number, row width, prompt id,
/// pad id or position does not fit Token / Index.
template <class Token = std::int32_t, class Index = std::int32_t, class Length, class T>
packed_layout<Token, Index> make_layout(const pack_plan<Length>& plan, span<const T> tokens,
                                        const layout_options& opt = {}) {
  return detail::build_layout<Token, Index>(plan, tokens, {}, opt);
}

/// As above, for chunks that continue cached context: prompt i's positions start at
/// context[i] (>= 0), as a chunk of a longer prompt does after its earlier chunks.
template <class Token = std::int32_t, class Index = std::int32_t, class Length, class T>
packed_layout<Token, Index> make_layout(const pack_plan<Length>& plan, span<const T> tokens,
                                        span<const long long> context,
                                        const layout_options& opt = {}) {
  return detail::build_layout<Token, Index>(plan, tokens, context, opt);
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
  detail::check_prompt_sizes(prompts, plan);
  const std::vector<T> flat = detail::concatenate(prompts);
  return make_layout<Token, Index>(plan, span<const T>(flat), opt);
}

PREPACK_NAMESPACE_END
