// prepack/reference/attention.hpp - the reference model's attention: a blocked online-softmax
// kernel (FlashAttention's algorithm on the CPU) over one sequence and one KV head at a time.
//
// A task is a tile of up to query_tile queries of one sequence, stacked with every query head of
// its KV head's group (grouped-query attention reads each key once for the whole group). Keys
// come from a KV store ([slots][kv_heads * head_dim] per layer: a paged pool or a packed
// buffer) through runs of consecutive slots, in position order: the sequence's cached context
// first, then its own new keys. Causal tasks visit only the key tiles some query of the tile
// may see (cost about sum over sequences of q_len * (context + q_len / 2)); masked tasks (a
// dense additive mask, as padded baselines take) visit every key of their row.
// Per-thread scratch is allocated once per forward pass (attention_scratch), never per task.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "../config.hpp"
#include "detail/ops.hpp"

PREPACK_NAMESPACE_BEGIN
namespace reference {
namespace detail {

constexpr Eigen::Index query_tile = 64;  // queries per task
constexpr Eigen::Index key_tile = 128;   // keys per step of the online softmax

// Consecutive store slots holding consecutive positions of a sequence.
struct key_run {
  std::int64_t slot = 0;   // first slot
  std::int64_t count = 0;  // slots (positions) in the run
};

// One attention task: queries [first, last) of a sequence for one KV head.
struct attention_task {
  std::int64_t q_row = 0;      // batch row of the sequence's query 0
  std::int64_t first = 0;      // first query of the tile (index within the sequence)
  std::int64_t last = 0;       // one past its last query
  std::int64_t context = 0;    // keys cached before query 0: query i sees keys 0 .. context + i
  std::int64_t n_keys = 0;     // keys of the sequence (context + its queries, or a row's width)
  std::size_t runs_begin = 0;  // its key runs: runs[runs_begin, runs_end), in position order
  std::size_t runs_end = 0;
  int kv_head = 0;
  const float* mask = nullptr;  // [queries][n_keys] additive (dense path); null: causal
  double cost() const noexcept {
    const double q = static_cast<double>(last - first);
    return q * static_cast<double>(mask != nullptr ? n_keys : context + last);
  }
};

// What one thread needs for any task: sized for the largest tile once per forward pass.
struct attention_scratch {
  matrix q, k, v, s, o;  // [rows][d], [key_tile][d] x 2, [rows][key_tile], [rows][d]
  Eigen::ArrayXf m, l;   // [rows]  running max and sum of each row
  attention_scratch(Eigen::Index rows, Eigen::Index head_dim)
      : q(rows, head_dim),
        k(key_tile, head_dim),
        v(key_tile, head_dim),
        s(rows, key_tile),
        o(rows, head_dim),
        m(rows),
        l(rows) {}
  /// Bytes of a scratch for `rows` stacked queries of head_dim features.
  static std::size_t bytes_for(Eigen::Index rows, Eigen::Index head_dim) noexcept {
    return static_cast<std::size_t>(2 * rows * head_dim + 2 * key_tile * head_dim +
                                    rows * key_tile + 2 * rows) *
           sizeof(float);
  }
};

// The layer's tensors a task reads and writes.
struct attention_io {
  const float* q = nullptr;       // [tokens][q_stride]  n_heads * head_dim queries after RoPE
  float* out = nullptr;           // [tokens][out_stride]  n_heads * head_dim
  const float* keys = nullptr;    // [store slots][kv_dim]
  const float* values = nullptr;  // [store slots][kv_dim]
  Eigen::Index q_stride = 0, out_stride = 0, kv_dim = 0, head_dim = 0;
  int group = 1;       // query heads per KV head
  float scale = 1.0f;  // 1 / sqrt(head_dim)
  const key_run* runs = nullptr;
};

// Copies the keys and values of positions [from, from + n) of a task into the tiles, walking
// its runs from the cursor (run index, offset in the run), which it advances.
inline void gather_keys(const attention_io& io, const attention_task& t, std::size_t& run,
                        std::int64_t& offset, Eigen::Index n, attention_scratch& w) {
  const Eigen::Index d = io.head_dim;
  const std::size_t col = static_cast<std::size_t>(t.kv_head) * static_cast<std::size_t>(d);
  for (Eigen::Index j = 0; j < n; ++j) {
    while (offset == io.runs[run].count) {
      ++run;
      offset = 0;
    }
    const auto slot = static_cast<std::size_t>(io.runs[run].slot + offset);
    const std::size_t at = slot * static_cast<std::size_t>(io.kv_dim) + col;
    std::copy(io.keys + at, io.keys + at + d, w.k.row(j).data());
    std::copy(io.values + at, io.values + at + d, w.v.row(j).data());
    ++offset;
  }
}

// Attention of one task, FlashAttention style: for each key tile, scores S = Q K^T, the running
// max m and sum l of each row updated, the output rescaled and P V added; at the end O / l.
// Returns the multiply-adds done (QK^T and PV, as computed), for the profile.
inline double attend(const attention_io& io, const attention_task& t, attention_scratch& w) {
  const Eigen::Index d = io.head_dim, g = io.group;
  const Eigen::Index n_q = t.last - t.first, rows = n_q * g;
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  // Q tile: query i of the tile, head j of the group, at row i * g + j; pre-scaled.
  for (Eigen::Index i = 0; i < n_q; ++i) {
    const float* src = io.q + (t.q_row + t.first + i) * io.q_stride + t.kv_head * g * d;
    for (Eigen::Index j = 0; j < g; ++j) {
      Eigen::Map<const Eigen::RowVectorXf> head(src + j * d, d);
      w.q.row(i * g + j) = head * io.scale;
    }
  }
  auto q = w.q.topRows(rows);
  auto o = w.o.topRows(rows);
  o.setZero();
  w.m.head(rows).setConstant(ninf);
  w.l.head(rows).setZero();
  const std::int64_t visible = t.mask != nullptr ? t.n_keys : t.context + t.last;
  std::size_t run = t.runs_begin;
  std::int64_t offset = 0;
  double flops = 0;
  for (std::int64_t k0 = 0; k0 < visible; k0 += key_tile) {
    const Eigen::Index kc =
        static_cast<Eigen::Index>(std::min<std::int64_t>(key_tile, visible - k0));
    gather_keys(io, t, run, offset, kc, w);
    auto s = w.s.topLeftCorner(rows, kc);
    s.noalias() = q * w.k.topRows(kc).transpose();
    flops += 4.0 * static_cast<double>(rows) * static_cast<double>(kc) * static_cast<double>(d);
    for (Eigen::Index r = 0; r < rows; ++r) {
      const Eigen::Index i = r / g;  // query of the tile
      auto row = s.row(r).array();
      Eigen::Index seen = kc;  // keys of this tile the query may see
      if (t.mask != nullptr) {
        const float* mrow = t.mask + (t.first + i) * t.n_keys + k0;
        row += Eigen::Map<const Eigen::ArrayXf>(mrow, kc).transpose();
      } else {
        const std::int64_t limit = t.context + t.first + i;  // last key it sees
        seen = static_cast<Eigen::Index>(std::clamp<std::int64_t>(limit - k0 + 1, 0, kc));
      }
      float mx = ninf;
      if (seen > 0) mx = row.head(seen).maxCoeff();
      const float m_new = std::max(w.m[r], mx);
      if (m_new == ninf) {  // nothing visible yet (or a fully masked query)
        row.setZero();
        continue;
      }
      const float corr = std::exp(w.m[r] - m_new);  // 0 on the first visible tile
      if (t.mask != nullptr) {
        row = (row == ninf).select(0.0f, (row - m_new).exp());
      } else {
        row.head(seen) = (row.head(seen) - m_new).exp();
        row.tail(kc - seen).setZero();
      }
      w.l[r] = w.l[r] * corr + row.sum();
      o.row(r) *= corr;
      w.m[r] = m_new;
    }
    o.noalias() += s * w.v.topRows(kc);
  }
  for (Eigen::Index i = 0; i < n_q; ++i) {
    float* dst = io.out + (t.q_row + t.first + i) * io.out_stride + t.kv_head * g * d;
    for (Eigen::Index j = 0; j < g; ++j) {
      const Eigen::Index r = i * g + j;
      Eigen::Map<Eigen::RowVectorXf> head(dst + j * d, d);
      if (w.l[r] > 0) {
        head = o.row(r) / w.l[r];
      } else {
        head.setZero();  // a query that sees no key (a fully masked pad slot) yields zeros
      }
    }
  }
  return flops;
}

}  // namespace detail
}  // namespace reference
PREPACK_NAMESPACE_END
