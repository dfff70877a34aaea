// prepack/reference/model.hpp - the clean reference kernel: a Llama-family decoder on the CPU
// (Eigen, fp32) that prefills a packed or padded batch in one pass, emits the packed KV cache
// and every prompt's last-token logits, and decodes greedily from per-prompt caches.
//
// Written to be read top to bottom and to prove prepacking exact, not to rival production
// kernels. Hugging Face conventions: token embedding; per layer RMSNorm -> Q, K, V projections
// -> RoPE (rotate-half) -> grouped-query attention -> output projection -> residual -> RMSNorm
// -> SwiGLU MLP -> residual; final RMSNorm; LM head. Weights are [in][out] (the transpose of
// torch.nn.Linear.weight). Linear layers are GEMMs over all slots of the batch; attention and the
// GEMMs use n_threads threads (OpenMP, when the build has it).
//
// Cost of prefill over a layout of S = n_rows * width slots: S * per-token linear FLOPs, plus
// attention of n_rows * width^2 (dense path) or sum(length^2) (segment path) per head and layer.
// Memory: the KV cache (2 * n_layers * S * kv_dim floats), activations (S * (3 hidden + 2 q_dim
// + 2 ffn) floats), the dense mask (n_rows * width^2 floats, dense path only) and per-thread
// score scratch; prefill_result::memory reports each.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "../detail/random.hpp"
#include "../error.hpp"
#include "../layout.hpp"
#include "../mask.hpp"
#include "../unpack.hpp"
#include "detail/ops.hpp"

PREPACK_NAMESPACE_BEGIN
namespace reference {

/// Model hyper-parameters. validate() checks them; the model's constructors call it.
struct config {
  int vocab = 512;   // token ids are 0 .. vocab - 1
  int hidden = 128;  // residual stream width
  int n_layers = 2;
  int n_heads = 4;     // query heads
  int n_kv_heads = 2;  // key/value heads; n_heads must be a multiple (grouped-query)
  int head_dim = 0;    // 0: hidden / n_heads (then hidden must be a multiple of n_heads)
  int ffn = 256;       // SwiGLU inner width
  double rope_theta = 10000.0;
  float rms_eps = 1e-5f;
  int pad_id = 0;  // token id of pad slots; must be < vocab

  int head_size() const noexcept {
    return head_dim > 0 ? head_dim : (n_heads > 0 ? hidden / n_heads : 0);
  }
  int q_dim() const noexcept { return n_heads * head_size(); }
  int kv_dim() const noexcept { return n_kv_heads * head_size(); }
  /// Features rotated by RoPE: the head size rounded down to even; an odd last feature passes.
  int rotary_dim() const noexcept { return head_size() & ~1; }

  /// Throws prepack::error naming the first inconsistent field and its value.
  void validate() const {
    using prepack::detail::require;
    require(vocab > 0, "config: vocab ", vocab);
    require(hidden > 0, "config: hidden ", hidden);
    require(n_layers > 0, "config: n_layers ", n_layers);
    require(n_heads > 0, "config: n_heads ", n_heads);
    require(n_kv_heads > 0, "config: n_kv_heads ", n_kv_heads);
    require(n_heads % n_kv_heads == 0, "config: n_heads ", n_heads,
            " is not a multiple of n_kv_heads ", n_kv_heads);
    require(head_dim >= 0, "config: head_dim ", head_dim);
    require(head_dim > 0 || hidden % n_heads == 0, "config: hidden ", hidden,
            " is not a multiple of n_heads ", n_heads, " (head_dim 0 derives the head size)");
    require(ffn > 0, "config: ffn ", ffn);
    require(rope_theta > 1.0 && std::isfinite(rope_theta), "config: rope_theta ", rope_theta);
    require(rms_eps > 0.0f && std::isfinite(rms_eps), "config: rms_eps ", rms_eps);
    require(pad_id >= 0 && pad_id < vocab, "config: pad_id ", pad_id, " outside vocab ", vocab);
  }
};

/// One decoder layer's parameters; shapes in [rows][cols].
struct layer_weights {
  vector attn_norm;  // [hidden]
  matrix wq;         // [hidden][n_heads * head_dim]
  matrix wk;         // [hidden][n_kv_heads * head_dim]
  matrix wv;         // [hidden][n_kv_heads * head_dim]
  matrix wo;         // [n_heads * head_dim][hidden]
  vector mlp_norm;   // [hidden]
  matrix w_gate;     // [hidden][ffn]
  matrix w_up;       // [hidden][ffn]
  matrix w_down;     // [ffn][hidden]
};

struct weights {
  matrix embed;                       // [vocab][hidden]
  std::vector<layer_weights> layers;  // [n_layers]
  vector final_norm;                  // [hidden]
  matrix lm_head;                     // [hidden][vocab]
};

namespace detail {

using rng = prepack::detail::splitmix;

// A matrix of the given shape with entries of standard deviation `std` (uniform distribution).
inline matrix random_matrix(rng& g, int rows, int cols, double std) {
  matrix m(rows, cols);
  const float a = static_cast<float>(std * std::sqrt(3.0));
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = g.symmetric(a);
  return m;
}

inline vector norm_weight(rng& g, int n) {
  vector v(n);
  for (Eigen::Index i = 0; i < n; ++i) v[i] = 1.0f + g.symmetric(0.1f);
  return v;
}

inline void check_shape(const matrix& m, int rows, int cols, const std::string& name) {
  prepack::detail::require(m.rows() == rows && m.cols() == cols, "weights: ", name, " is ",
                           m.rows(), " x ", m.cols(), ", expected ", rows, " x ", cols);
}

inline void check_shape(const vector& v, int n, const std::string& name) {
  prepack::detail::require(v.size() == n, "weights: ", name, " has ", v.size(),
                           " entries, expected ", n);
}

}  // namespace detail

/// Deterministic weights from a seed, scaled so activations keep a unit scale through many
/// layers: projections have standard deviation 1/sqrt(fan_in), the residual branches' output
/// projections a further 1/sqrt(2 n_layers); the LM head is scaled up so greedy choices are
/// decisive. Throws prepack::error if c is invalid.
inline weights random_weights(const config& c, std::uint64_t seed) {
  c.validate();
  detail::rng g(seed);
  const double residual = 1.0 / std::sqrt(2.0 * c.n_layers);
  weights w;
  w.embed = detail::random_matrix(g, c.vocab, c.hidden, 1.0);
  for (int l = 0; l < c.n_layers; ++l) {
    layer_weights lw;
    lw.attn_norm = detail::norm_weight(g, c.hidden);
    lw.wq = detail::random_matrix(g, c.hidden, c.q_dim(), 1.0 / std::sqrt(c.hidden));
    lw.wk = detail::random_matrix(g, c.hidden, c.kv_dim(), 1.0 / std::sqrt(c.hidden));
    lw.wv = detail::random_matrix(g, c.hidden, c.kv_dim(), 1.0 / std::sqrt(c.hidden));
    lw.wo = detail::random_matrix(g, c.q_dim(), c.hidden, residual / std::sqrt(c.q_dim()));
    lw.mlp_norm = detail::norm_weight(g, c.hidden);
    lw.w_gate = detail::random_matrix(g, c.hidden, c.ffn, 1.0 / std::sqrt(c.hidden));
    lw.w_up = detail::random_matrix(g, c.hidden, c.ffn, 1.0 / std::sqrt(c.hidden));
    lw.w_down = detail::random_matrix(g, c.ffn, c.hidden, residual / std::sqrt(c.ffn));
    w.layers.push_back(std::move(lw));
  }
  w.final_norm = detail::norm_weight(g, c.hidden);
  w.lm_head = detail::random_matrix(g, c.hidden, c.vocab, 4.0 / std::sqrt(c.hidden));
  return w;
}

/// Throws prepack::error naming the first parameter whose shape disagrees with c.
inline void check_weights(const config& c, const weights& w) {
  c.validate();
  detail::check_shape(w.embed, c.vocab, c.hidden, "embed");
  prepack::detail::require(w.layers.size() == static_cast<std::size_t>(c.n_layers),
                           "weights: ", w.layers.size(), " layers, config has ", c.n_layers);
  for (std::size_t l = 0; l < w.layers.size(); ++l) {
    const layer_weights& lw = w.layers[l];
    const std::string p = "layers[" + std::to_string(l) + "].";
    detail::check_shape(lw.attn_norm, c.hidden, p + "attn_norm");
    detail::check_shape(lw.wq, c.hidden, c.q_dim(), p + "wq");
    detail::check_shape(lw.wk, c.hidden, c.kv_dim(), p + "wk");
    detail::check_shape(lw.wv, c.hidden, c.kv_dim(), p + "wv");
    detail::check_shape(lw.wo, c.q_dim(), c.hidden, p + "wo");
    detail::check_shape(lw.mlp_norm, c.hidden, p + "mlp_norm");
    detail::check_shape(lw.w_gate, c.hidden, c.ffn, p + "w_gate");
    detail::check_shape(lw.w_up, c.hidden, c.ffn, p + "w_up");
    detail::check_shape(lw.w_down, c.ffn, c.hidden, p + "w_down");
  }
  detail::check_shape(w.final_norm, c.hidden, "final_norm");
  detail::check_shape(w.lm_head, c.hidden, c.vocab, "lm_head");
}

/// How attention sees a packed row.
enum class attention {
  dense,    // a materialised [width][width] block-diagonal mask per row: n_rows * width^2 work
  segment,  // each prompt's own causal block only: sum(length^2) work
};

struct prefill_options {
  attention path = attention::segment;
  int n_threads = 0;  // 0: all the machine offers (OpenMP's default)
};

/// Bytes a prefill allocated, by kind, at its peak (all of them are live at once).
struct memory_stats {
  std::size_t kv_bytes = 0;          // the packed KV cache the result carries
  std::size_t activation_bytes = 0;  // residual stream, projections, MLP, RoPE table, logits
  std::size_t mask_bytes = 0;        // the dense mask (dense path only)
  std::size_t scratch_bytes = 0;     // per-thread attention scores
  std::size_t peak_bytes = 0;        // the sum: the most the prefill held at one time
};

/// Where a prefill spent its time, and the work it did.
struct prefill_profile {
  double seconds_total = 0;
  double seconds_linear = 0;  // Q/K/V/O projections, MLP and LM head GEMMs
  double seconds_attention = 0;
  double linear_flops = 0;     // 2 * m * n * k summed over those GEMMs
  double attention_flops = 0;  // QK^T and PV products, as computed
  int n_threads = 1;
};

/// The output of one prefill over a layout.
struct prefill_result {
  std::size_t n_rows = 0, width = 0;
  int n_layers = 0, n_kv_heads = 0, head_dim = 0;
  std::vector<float> keys;    // [n_layers][n_rows][width][n_kv_heads][head_dim]  after RoPE
  std::vector<float> values;  // [n_layers][n_rows][width][n_kv_heads][head_dim]
  matrix logits;              // [n_prompts][vocab]  logits of each prompt's last token
  memory_stats memory;
  prefill_profile profile;

  /// Layer l's packed keys / values as (row, slot, head, dim), for prepack's unpackers.
  tensor_view<const float, 4> key_view(int layer) const { return view(keys, layer); }
  tensor_view<const float, 4> value_view(int layer) const { return view(values, layer); }

 private:
  tensor_view<const float, 4> view(const std::vector<float>& kv, int layer) const {
    prepack::detail::require(layer >= 0 && layer < n_layers, "layer ", layer, " outside 0..",
                             n_layers - 1);
    const std::size_t per_layer = n_rows * width * static_cast<std::size_t>(n_kv_heads * head_dim);
    return packed_view(kv.data() + static_cast<std::size_t>(layer) * per_layer,
                       kv_order::row_slot_head_dim, n_rows, width,
                       static_cast<std::size_t>(n_kv_heads), static_cast<std::size_t>(head_dim));
  }
};

namespace detail {

// Sets Eigen's and our thread count for one call, and restores Eigen's afterwards.
class thread_scope {
 public:
  explicit thread_scope(int requested) {
    prepack::detail::require(requested >= 0, "n_threads ", requested);
#ifdef _OPENMP
    n_ = requested > 0 ? requested : omp_get_max_threads();
#else
    n_ = 1;
#endif
    saved_ = Eigen::nbThreads();
    Eigen::setNbThreads(n_);
  }
  ~thread_scope() { Eigen::setNbThreads(saved_); }
  thread_scope(const thread_scope&) = delete;
  thread_scope& operator=(const thread_scope&) = delete;
  int n() const noexcept { return n_; }

 private:
  int n_ = 1;
  int saved_ = 1;
};

inline int thread_id() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

using clock = std::chrono::steady_clock;
inline double seconds_since(clock::time_point t) {
  return std::chrono::duration<double>(clock::now() - t).count();
}

// One attention task: `len` queries starting at `start` (a flat slot) against the keys of the
// same slots, for one query head.
struct attention_task {
  Eigen::Index start, len;
  int head;
};

// K and V live in the result's KV buffer (an Eigen::Map); a Ref takes it without a copy.
using const_matrix_ref = const Eigen::Ref<const matrix>&;

// Queries are processed in blocks of this many rows: the scores of a block ([block][keys]) stay
// small enough for Eigen to keep its GEMM packing buffers on the stack (no heap traffic per
// task), and a causal block needs only the keys up to its last query.
constexpr Eigen::Index query_block = 32;

// Causal attention within one prompt's slots. scratch holds query_block * len floats.
inline void attend_causal(const matrix& q, const_matrix_ref k, const_matrix_ref v, matrix& out,
                          const attention_task& t, int head_dim, int group, float scale,
                          float* scratch) {
  const Eigen::Index hd = head_dim, qc = t.head * hd, kc = (t.head / group) * hd;
  for (Eigen::Index r0 = 0; r0 < t.len; r0 += query_block) {
    const Eigen::Index rows = std::min(query_block, t.len - r0), keys = r0 + rows;
    Eigen::Map<matrix> s(scratch, rows, keys);  // [rows][keys]
    s.noalias() = q.block(t.start + r0, qc, rows, hd) * k.block(t.start, kc, keys, hd).transpose();
    for (Eigen::Index i = 0; i < rows; ++i) {
      float* row = s.row(i).data();
      const Eigen::Index seen = r0 + i + 1;  // query r0 + i sees keys 0 .. r0 + i
      for (Eigen::Index j = 0; j < seen; ++j) row[j] *= scale;
      softmax(row, static_cast<std::size_t>(seen));
      for (Eigen::Index j = seen; j < keys; ++j) row[j] = 0.0f;
    }
    out.block(t.start + r0, qc, rows, hd).noalias() = s * v.block(t.start, kc, keys, hd);
  }
}

// Attention of a whole row under its materialised additive mask [width][width], every query
// against every key of the row, as a kernel that takes a 4D mask computes it.
inline void attend_masked(const matrix& q, const_matrix_ref k, const_matrix_ref v, matrix& out,
                          const attention_task& t, int head_dim, int group, float scale,
                          const float* mask, float* scratch) {
  const Eigen::Index hd = head_dim, qc = t.head * hd, kc = (t.head / group) * hd, n = t.len;
  for (Eigen::Index r0 = 0; r0 < n; r0 += query_block) {
    const Eigen::Index rows = std::min(query_block, n - r0);
    Eigen::Map<matrix> s(scratch, rows, n);  // [rows][n]
    s.noalias() = q.block(t.start + r0, qc, rows, hd) * k.block(t.start, kc, n, hd).transpose();
    s *= scale;
    s += Eigen::Map<const matrix>(mask + r0 * n, rows, n);
    for (Eigen::Index i = 0; i < rows; ++i) softmax(s.row(i).data(), static_cast<std::size_t>(n));
    out.block(t.start + r0, qc, rows, hd).noalias() = s * v.block(t.start, kc, n, hd);
  }
}

// Multiply-adds of a task as attend_* compute it (QK^T and PV), for the profile.
inline double attention_flops(const attention_task& t, bool causal, int head_dim) {
  double keys = 0;
  for (Eigen::Index r0 = 0; r0 < t.len; r0 += query_block) {
    const Eigen::Index rows = std::min(query_block, t.len - r0);
    keys += static_cast<double>(rows) * static_cast<double>(causal ? r0 + rows : t.len);
  }
  return 4.0 * keys * head_dim;
}

// What a prefill allocates, by kind (the accounting behind prefill_result::memory and
// model::estimate_memory): n_slots tokens through every layer, n_outputs rows of logits, a RoPE
// table of rope_positions, a dense mask of mask_elems floats, and per-thread scores for the
// longest attention task. Throws prepack::error if a size overflows size_t.
inline memory_stats prefill_memory(const config& c, std::size_t n_slots, std::size_t n_outputs,
                                   std::size_t rope_positions, std::size_t mask_elems,
                                   std::size_t longest_task, int n_threads) {
  using prepack::detail::add;
  using prepack::detail::mul;
  const auto u = [](int v) { return static_cast<std::size_t>(v); };
  const std::size_t f = sizeof(float);
  memory_stats m;
  // K and V of every layer: [n_layers][n_slots][kv_dim] each.
  m.kv_bytes = mul(mul(mul(2 * u(c.n_layers), n_slots, "KV cache"), u(c.kv_dim()), "KV cache"), f,
                   "KV cache");
  // h, x: hidden; q, att: q_dim; gate, up: ffn; per slot. Then the RoPE table and the outputs.
  const std::size_t per_slot = 2 * u(c.hidden) + 2 * u(c.q_dim()) + 2 * u(c.ffn);
  std::size_t act = mul(n_slots, per_slot, "activations");
  act = add(act, mul(rope_positions, 2 * u(c.rotary_dim() / 2), "RoPE table"), "activations");
  act = add(act, mul(n_outputs, u(c.hidden) + u(c.vocab), "logits"), "activations");
  m.activation_bytes = mul(act, f, "activations");
  m.mask_bytes = mul(mask_elems, f, "dense mask");
  const std::size_t block =
      std::min<std::size_t>(longest_task, static_cast<std::size_t>(query_block));
  m.scratch_bytes =
      mul(mul(mul(u(n_threads), block, "scratch"), longest_task, "scratch"), f, "scratch");
  m.peak_bytes = add(add(add(m.kv_bytes, m.activation_bytes, "memory"), m.mask_bytes, "memory"),
                     m.scratch_bytes, "memory");
  return m;
}

}  // namespace detail

namespace detail {

// What the forward pass sees of a batch: flat [n_rows][width] arrays, and either the dense
// additive mask or the causal blocks to attend within. It knows nothing of prompts.
template <class Token, class Index>
struct batch_view {
  std::size_t n_rows = 0, width = 0;
  const Token* tokens = nullptr;      // [n_rows][width]
  const Index* positions = nullptr;   // [n_rows][width]
  const Index* segments = nullptr;    // [n_rows][width]  -1 on pad slots; null: no pad slots known
  const float* mask = nullptr;        // [n_rows][width][width]  additive; null: segment path
  std::vector<attention_task> tasks;  // per head: a row (dense) or a causal block (segment)
  std::vector<std::size_t> outputs;   // flat slots whose logits are wanted
  std::size_t mask_bytes = 0;         // the mask's size, for the memory report
};

}  // namespace detail

/// The reference model: a config and its weights.
class model {
 public:
  /// Throws prepack::error if c is invalid or w's shapes disagree with it.
  model(const config& c, weights w) : cfg_(c), w_(std::move(w)) { check_weights(cfg_, w_); }
  /// Deterministic weights from seed (see random_weights).
  model(const config& c, std::uint64_t seed) : cfg_(c), w_(random_weights(c, seed)) {}

  const config& cfg() const noexcept { return cfg_; }
  const weights& params() const noexcept { return w_; }

  /// Prefills every prompt of a packed (or padded) layout in one pass; logits row i belongs to
  /// prompt i. Throws prepack::error, computing nothing, if the layout is inconsistent (see
  /// check_layout), a token id is outside the vocabulary, or n_threads < 0.
  template <class Token, class Index>
  prefill_result prefill(const packed_layout<Token, Index>& l,
                         const prefill_options& opt = {}) const {
    prepack::detail::require(!l.empty(), "layout: empty (no prompts)");
    detail::batch_view<Token, Index> b;
    b.n_rows = l.n_rows();
    b.width = l.width();
    b.tokens = l.tokens().data();
    b.positions = l.positions().data();
    b.segments = l.segments().data();
    Index longest = 0;
    for (Index len : l.prompt_length()) longest = std::max(longest, len);
    std::vector<float> mask;  // [n_rows][width][width]  additive, dense path only
    if (opt.path == attention::dense) {
      mask = additive_mask<float>(l);
      b.mask = mask.data();
      b.mask_bytes = mask.size() * sizeof(float);
      for (std::size_t row = 0; row < l.n_rows(); ++row) {
        for (int head = 0; head < cfg_.n_heads; ++head) {
          b.tasks.push_back(
              {static_cast<Eigen::Index>(row * l.width()), static_cast<Eigen::Index>(l.width()), head});
        }
      }
    } else {
      for (std::size_t i = 0; i < l.n_prompts(); ++i) {
        for (int head = 0; head < cfg_.n_heads; ++head) {
          b.tasks.push_back({static_cast<Eigen::Index>(l.first_slot(i)),
                             static_cast<Eigen::Index>(l.prompt_length()[i]), head});
        }
      }
    }
    for (Index s : l.last_token()) b.outputs.push_back(static_cast<std::size_t>(s));
    return forward(b, opt.n_threads);
  }

  /// The engine-facing form: prefills raw Hugging Face-style inputs, with no notion of prompts:
  /// input ids and position ids [n_rows][width], an additive attention mask
  /// [n_rows][width][width] (0 = attend, -inf = masked; a fully masked query yields zeros), and
  /// the flat slots whose logits to return (in that order). Throws prepack::error, computing
  /// nothing, if a size disagrees with n_rows x width, a token id is outside the vocabulary, a
  /// position is negative or above 2^24, an output slot is out of range, or n_threads < 0.
  template <class Token, class Index>
  prefill_result prefill_masked(std::size_t n_rows, std::size_t width, span<const Token> tokens,
                                span<const Index> positions, span<const float> mask,
                                span<const Index> output_slots, int n_threads = 0) const {
    using prepack::detail::require;
    const std::size_t slots = prepack::detail::mul(n_rows, width, "batch slots");
    require(slots > 0, "batch: ", n_rows, " rows x ", width, " slots");
    require(tokens.size() == slots, "tokens: ", tokens.size(), " ids for ", n_rows, " x ", width,
            " slots");
    require(positions.size() == slots, "positions: ", positions.size(), " ids for ", n_rows, " x ",
            width, " slots");
    require(mask.size() == prepack::detail::mul(slots, width, "mask"), "mask: ", mask.size(),
            " elements for ", n_rows, " x ", width, " x ", width);
    for (std::size_t k = 0; k < output_slots.size(); ++k) {
      require(output_slots[k] >= 0 && static_cast<std::size_t>(output_slots[k]) < slots,
              "output slot ", k, ": ", output_slots[k], " outside ", slots, " slots");
    }
    detail::batch_view<Token, Index> b;
    b.n_rows = n_rows;
    b.width = width;
    b.tokens = tokens.data();
    b.positions = positions.data();
    b.mask = mask.data();
    b.mask_bytes = mask.size() * sizeof(float);
    for (std::size_t row = 0; row < n_rows; ++row) {
      for (int head = 0; head < cfg_.n_heads; ++head) {
        b.tasks.push_back(
            {static_cast<Eigen::Index>(row * width), static_cast<Eigen::Index>(width), head});
      }
    }
    for (Index s : output_slots) b.outputs.push_back(static_cast<std::size_t>(s));
    return forward(b, n_threads);
  }

  /// What prefill() would allocate: see estimate_prefill_memory.
  memory_stats estimate_memory(std::size_t n_rows, std::size_t width, std::size_t n_prompts,
                               std::size_t longest, attention path, int n_threads = 0) const;

 private:
  template <class Token, class Index>
  prefill_result forward(detail::batch_view<Token, Index>& b, int n_threads) const;

  config cfg_;
  weights w_;
};

/// What a prefill over n_rows x width slots holding n_prompts prompts (the longest `longest`
/// tokens) allocates (prefill_result::memory), from shapes alone, without a model: check that a
/// workload fits before building anything for it. Throws prepack::error if a size overflows
/// size_t, c is invalid, or n_threads < 0.
inline memory_stats estimate_prefill_memory(const config& c, std::size_t n_rows, std::size_t width,
                                            std::size_t n_prompts, std::size_t longest,
                                            attention path, int n_threads = 0) {
  c.validate();
  const detail::thread_scope threads(n_threads);
  const std::size_t slots = prepack::detail::mul(n_rows, width, "batch slots");
  const bool dense = path == attention::dense;
  return detail::prefill_memory(c, slots, n_prompts, longest,
                                dense ? prepack::detail::mul(slots, width, "dense mask") : 0,
                                dense ? width : longest, threads.n());
}

inline memory_stats model::estimate_memory(std::size_t n_rows, std::size_t width,
                                           std::size_t n_prompts, std::size_t longest,
                                           attention path, int n_threads) const {
  return estimate_prefill_memory(cfg_, n_rows, width, n_prompts, longest, path, n_threads);
}

/// Bytes of the weights of a model of config c (fp32), computed without allocating them.
inline double weight_bytes(const config& c) {
  const double h = c.hidden, q = c.q_dim(), kv = c.kv_dim(), f = c.ffn, v = c.vocab;
  const double per_layer = 2 * h + h * (q + 2 * kv) + q * h + 3 * h * f;
  return 4.0 * (2 * v * h + h + c.n_layers * per_layer);
}

template <class Token, class Index>
prefill_result model::forward(detail::batch_view<Token, Index>& b, int n_threads) const {
  const auto t_start = detail::clock::now();
  const config& c = cfg_;
  const std::size_t n_slots = b.n_rows * b.width;
  constexpr long long max_position = 1 << 24;
  long long top = 0;  // largest position a real slot uses: the RoPE table's extent
  for (std::size_t s = 0; s < n_slots; ++s) {
    const auto tok = static_cast<long long>(b.tokens[s]);
    const bool pad = b.segments != nullptr && b.segments[s] < 0;
    if (tok < 0 || tok >= c.vocab) {
      if (!pad && b.segments != nullptr) {
        prepack::detail::fail("prompt ", b.segments[s], ": token ", b.positions[s], " = ", tok,
                              " outside vocab ", c.vocab);
      }
      prepack::detail::fail(pad ? "pad slot " : "slot ", s, ": token ", tok, " outside vocab ",
                            c.vocab);
    }
    if (pad) continue;
    const auto pos = static_cast<long long>(b.positions[s]);
    prepack::detail::require(pos >= 0 && pos <= max_position, "slot ", s, ": position ", pos,
                             " outside 0..", max_position);
    top = std::max(top, pos);
  }
  detail::thread_scope threads(n_threads);
  const int nt = threads.n();

  const int hd = c.head_size(), group = c.n_heads / c.n_kv_heads;
  const Eigen::Index n = static_cast<Eigen::Index>(n_slots);
  const Eigen::Index kv_dim = c.kv_dim(), q_dim = c.q_dim();
  const Eigen::Index n_out = static_cast<Eigen::Index>(b.outputs.size());
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  prefill_result r;
  r.n_rows = b.n_rows;
  r.width = b.width;
  r.n_layers = c.n_layers;
  r.n_kv_heads = c.n_kv_heads;
  r.head_dim = hd;
  const std::size_t per_layer = n_slots * static_cast<std::size_t>(kv_dim);
  r.keys.resize(per_layer * static_cast<std::size_t>(c.n_layers));
  r.values.resize(per_layer * static_cast<std::size_t>(c.n_layers));

  // Activations, allocated once and reused by every layer.
  // Zeroed here so their pages are mapped before the timed GEMMs first write them (the
  // profile's linear time is then the GEMMs' own).
  matrix h(n, c.hidden);                 // [n_slots][hidden]  residual stream
  matrix x = matrix::Zero(n, c.hidden);  // [n_slots][hidden]  normalised input of a block
  matrix q = matrix::Zero(n, q_dim);     // [n_slots][n_heads * head_dim]
  matrix att = matrix::Zero(n, q_dim);   // [n_slots][n_heads * head_dim]  attention output
  matrix gate = matrix::Zero(n, c.ffn);  // [n_slots][ffn]
  matrix up = matrix::Zero(n, c.ffn);    // [n_slots][ffn]
  const detail::rope_table rope = detail::make_rope_table(c.rotary_dim(), c.rope_theta, top);
  // Longest tasks first, so the dynamic schedule balances the threads.
  std::stable_sort(b.tasks.begin(), b.tasks.end(),
                   [](const auto& u, const auto& v) { return u.len > v.len; });
  const Eigen::Index side = b.tasks.empty() ? 0 : b.tasks.front().len;
  const Eigen::Index per_thread = std::min(side, detail::query_block) * side;
  std::vector<float> scratch(static_cast<std::size_t>(nt) *
                             static_cast<std::size_t>(per_thread));  // [n_threads][block][side]
  r.memory =
      detail::prefill_memory(c, n_slots, b.outputs.size(),
                             rope.cos.size() / static_cast<std::size_t>(std::max(1, rope.half)),
                             b.mask_bytes / sizeof(float), static_cast<std::size_t>(side), nt);

  double t_linear = 0, t_attention = 0;
  for (Eigen::Index s = 0; s < n; ++s)
    h.row(s) = w_.embed.row(static_cast<Eigen::Index>(b.tokens[s]));

  for (int layer = 0; layer < c.n_layers; ++layer) {
    const layer_weights& lw = w_.layers[static_cast<std::size_t>(layer)];
    Eigen::Map<matrix> k(r.keys.data() + static_cast<std::size_t>(layer) * per_layer, n, kv_dim);
    Eigen::Map<matrix> v(r.values.data() + static_cast<std::size_t>(layer) * per_layer, n, kv_dim);

    detail::rms_norm(h, lw.attn_norm, c.rms_eps, x);
    auto t0 = detail::clock::now();
    q.noalias() = x * lw.wq;
    k.noalias() = x * lw.wk;
    v.noalias() = x * lw.wv;
    t_linear += detail::seconds_since(t0);

    t0 = detail::clock::now();
#pragma omp parallel for num_threads(nt) schedule(static)
    for (Eigen::Index s = 0; s < n; ++s) {
      if (b.segments != nullptr && b.segments[s] < 0) {
        att.row(s).setZero();  // a pad query attends to nothing
        continue;
      }
      const auto pos = static_cast<std::int64_t>(b.positions[s]);
      for (Eigen::Index head = 0; head < c.n_heads; ++head)
        detail::rope(q.row(s).data() + head * hd, rope, pos);
      for (Eigen::Index head = 0; head < c.n_kv_heads; ++head)
        detail::rope(k.row(s).data() + head * hd, rope, pos);
    }
    const Eigen::Index n_tasks = static_cast<Eigen::Index>(b.tasks.size());
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (Eigen::Index ti = 0; ti < n_tasks; ++ti) {
      const detail::attention_task& t = b.tasks[static_cast<std::size_t>(ti)];
      float* s = scratch.data() + detail::thread_id() * per_thread;
      if (b.mask != nullptr) {
        const float* m = b.mask + static_cast<std::size_t>(t.start) * b.width;
        detail::attend_masked(q, k, v, att, t, hd, group, scale, m, s);
      } else {
        detail::attend_causal(q, k, v, att, t, hd, group, scale, s);
      }
    }
    t_attention += detail::seconds_since(t0);

    t0 = detail::clock::now();
    h.noalias() += att * lw.wo;
    t_linear += detail::seconds_since(t0);
    detail::rms_norm(h, lw.mlp_norm, c.rms_eps, x);
    t0 = detail::clock::now();
    gate.noalias() = x * lw.w_gate;
    up.noalias() = x * lw.w_up;
    t_linear += detail::seconds_since(t0);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (Eigen::Index s = 0; s < n; ++s)
      detail::swiglu(gate.row(s).data(), up.row(s).data(), static_cast<std::size_t>(c.ffn));
    t0 = detail::clock::now();
    h.noalias() += gate * lw.w_down;
    t_linear += detail::seconds_since(t0);
  }

  // Only the wanted slots go through the final norm and the LM head.
  matrix last(n_out, c.hidden);  // [n_outputs][hidden]
  for (Eigen::Index i = 0; i < n_out; ++i)
    last.row(i) = h.row(static_cast<Eigen::Index>(b.outputs[static_cast<std::size_t>(i)]));
  detail::rms_norm(last, w_.final_norm, c.rms_eps, last);
  auto t0 = detail::clock::now();
  r.logits.noalias() = last * w_.lm_head;
  t_linear += detail::seconds_since(t0);

  const double hidden = c.hidden, qd = c.q_dim(), kvd = c.kv_dim(), ffn = c.ffn;
  const double per_token =
      2.0 * hidden * (qd + 2.0 * kvd) + 2.0 * qd * hidden + 3.0 * 2.0 * hidden * ffn;
  r.profile.linear_flops = per_token * static_cast<double>(n) * c.n_layers +
                           2.0 * static_cast<double>(n_out) * hidden * c.vocab;
  double att_flops = 0;
  for (const auto& t : b.tasks) att_flops += detail::attention_flops(t, b.mask == nullptr, hd);
  r.profile.attention_flops = att_flops * c.n_layers;
  r.profile.seconds_linear = t_linear;
  r.profile.seconds_attention = t_attention;
  r.profile.n_threads = nt;
  r.profile.seconds_total = detail::seconds_since(t_start);
  return r;
}

}  // namespace reference
PREPACK_NAMESPACE_END
