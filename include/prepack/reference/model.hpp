// prepack/reference/model.hpp - the clean reference kernel: a Llama-family decoder on the CPU
// (fp32, or bf16 projection weights) with one transformer block for every kind of batch:
//
//  prefill(layout)        a packed or padded batch of whole prompts; K and V come out packed
//                         ([layer][row][slot][kv_head][dim]) with every prompt's last logits.
//  prefill_masked(...)    raw Hugging Face-style inputs with a 4D additive mask.
//  forward(step, pool)    one step of a budgeted schedule over a paged KV pool: each sequence's
//                         queries attend to its cached context (read through its block table)
//                         and to its own causal block; new K and V go into the pool through the
//                         slot mapping. Whole-prompt prefill, chunked prefill and decode (one-token
//                         chunks over their context) are all this.
//
// Hugging Face conventions: token embedding; per layer RMSNorm -> Q, K, V projections (with
// biases for Qwen2-style configs) -> RoPE (rotate-half) -> grouped-query attention -> output
// projection -> residual -> RMSNorm -> SwiGLU MLP -> residual; final RMSNorm; LM head (or the
// embedding, tied). Written to be read top to bottom (forward_pass below, one named step per
// operation) and to run near the machine's limit: Q, K and V are one GEMM and gate and up
// another, with the norms' weights folded into them when the model is built; each GEMM's
// neighbours (norm scale, bias, RoPE, the KV write, SwiGLU, the residual add) happen in the pass
// that already touches those rows; the GEMMs run on oneDNN or Eigen (gemm.hpp); attention is a
// blocked online-softmax kernel (attention.hpp). Threads: OpenMP, the caller's count.
//
// Cost of a batch of n token rows: n * per-token linear FLOPs, plus attention of sum over
// sequences of q_len * (context + q_len / 2) per head and layer (causal), or n_rows * width^2
// (dense mask). Memory: see memory_stats; estimate_prefill_memory computes it from shapes with
// the very accounting the forward pass reports.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "../error.hpp"
#include "../layout.hpp"
#include "../mask.hpp"
#include "../step.hpp"
#include "../unpack.hpp"
#include "attention.hpp"
#include "detail/ops.hpp"
#include "gemm.hpp"
#include "kv_pool.hpp"
#include "weights.hpp"

PREPACK_NAMESPACE_BEGIN
namespace reference {

/// How attention sees a packed row.
enum class attention {
  dense,    // a materialised [width][width] block-diagonal mask per row: n_rows * width^2 work
  segment,  // each prompt's own causal block only: sum(length^2) work
};

/// How a call runs: threads (0: all OpenMP offers) and which library multiplies.
struct exec_options {
  int n_threads = 0;
  gemm_backend backend = gemm_backend::automatic;
};

struct prefill_options {
  attention path = attention::segment;
  int n_threads = 0;  // 0: all the machine offers (OpenMP's default)
  gemm_backend backend = gemm_backend::automatic;
};

/// How the model holds its weights.
struct model_options {
  weight_type weights = weight_type::f32;
};

/// Bytes a forward pass allocated, by kind, at its peak (all of them are live at once).
struct memory_stats {
  std::size_t kv_bytes = 0;          // the KV it writes into: packed output, or the paged pool
  std::size_t activation_bytes = 0;  // residual stream, projections, MLP, RoPE table, logits
  std::size_t mask_bytes = 0;        // the dense mask (dense path only)
  std::size_t scratch_bytes = 0;     // per-thread attention tiles
  std::size_t peak_bytes = 0;        // the sum: the most the pass held at one time
};

/// Where a forward pass spent its time, and the work it did.
struct prefill_profile {
  double seconds_total = 0;
  double seconds_linear = 0;  // the projection, MLP and LM head GEMMs
  double seconds_attention = 0;
  double linear_flops = 0;     // 2 * m * n * k summed over those GEMMs
  double attention_flops = 0;  // QK^T and PV products, as computed
  int n_threads = 1;
  gemm_backend backend = gemm_backend::eigen;
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

  /// Every layer's packed keys and values as (layer, row, slot, head, dim), for prepack's
  /// unpackers.
  packed_kv<const float> kv() const { return {view(keys), view(values)}; }
  /// Layer l's packed keys / values as (row, slot, head, dim).
  tensor_view<const float, 4> key_view(int layer) const { return layer_view(keys, layer); }
  tensor_view<const float, 4> value_view(int layer) const { return layer_view(values, layer); }

 private:
  tensor_view<const float, 5> view(const std::vector<float>& kv) const {
    return contiguous_view<const float, 5>(
        kv.data(), {static_cast<std::size_t>(n_layers), n_rows, width,
                    static_cast<std::size_t>(n_kv_heads), static_cast<std::size_t>(head_dim)});
  }
  tensor_view<const float, 4> layer_view(const std::vector<float>& kv, int layer) const {
    prepack::detail::require(layer >= 0 && layer < n_layers, "layer ", layer, " outside 0..",
                             n_layers - 1);
    const std::size_t per_layer = n_rows * width * static_cast<std::size_t>(n_kv_heads * head_dim);
    return packed_view(kv.data() + static_cast<std::size_t>(layer) * per_layer,
                       kv_order::row_slot_head_dim, n_rows, width,
                       static_cast<std::size_t>(n_kv_heads), static_cast<std::size_t>(head_dim));
  }
};

/// The output of one forward pass over a paged pool (a step).
struct step_result {
  matrix logits;                          // [n_outputs][vocab]  one row per flagged token
  std::vector<std::size_t> output_seq;    // [n_outputs]  sequence of the step each row is for
  std::vector<std::size_t> output_token;  // [n_outputs]  its token (row of the batch)
  memory_stats memory;
  prefill_profile profile;
};

namespace detail {

// Sets Eigen's and OpenMP's thread counts for one call, and restores them afterwards: oneDNN's
// GEMMs and our loops then use exactly the caller's count, with no oversubscription.
class thread_scope {
 public:
  explicit thread_scope(int requested) {
    prepack::detail::require(requested >= 0, "n_threads ", requested);
#ifdef _OPENMP
    saved_omp_ = omp_get_max_threads();
    n_ = requested > 0 ? requested : saved_omp_;
    omp_set_num_threads(n_);
#else
    n_ = 1;
#endif
    saved_eigen_ = Eigen::nbThreads();
    Eigen::setNbThreads(n_);
  }
  ~thread_scope() {
    Eigen::setNbThreads(saved_eigen_);
#ifdef _OPENMP
    omp_set_num_threads(saved_omp_);
#endif
  }
  thread_scope(const thread_scope&) = delete;
  thread_scope& operator=(const thread_scope&) = delete;
  int n() const noexcept { return n_; }

 private:
  int n_ = 1, saved_eigen_ = 1;
#ifdef _OPENMP
  int saved_omp_ = 1;
#endif
};

// The threads a call with `requested` (0: OpenMP's default) would use, without changing any.
inline int threads_for(int requested) {
  prepack::detail::require(requested >= 0, "n_threads ", requested);
#ifdef _OPENMP
  return requested > 0 ? requested : omp_get_max_threads();
#else
  return 1;
#endif
}

inline int thread_id() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

using clock = std::chrono::steady_clock;
template <class F>
double timed(F&& f) {
  const auto t0 = clock::now();
  f();
  return std::chrono::duration<double>(clock::now() - t0).count();
}

// Where a forward pass writes K and V and attention reads them: per layer [n_slots][kv_dim].
struct kv_store {
  float* keys = nullptr;
  float* values = nullptr;
  std::size_t layer_stride = 0;  // elements between layers
  std::size_t n_slots = 0;
  std::size_t bytes = 0;  // for the memory report
};

// What the forward pass sees of a batch: token rows, where each row's K and V go, and the
// sequences whose queries attend. It knows nothing of prompts, plans or schedules.
struct batch {
  std::vector<std::int32_t> token;   // [n]  token id of each row
  std::vector<std::int64_t> pos;     // [n]  position of each row
  std::vector<std::int64_t> slot;    // [n]  store slot of the row's K and V; -1: not written
  std::vector<key_run> runs;         // key runs of every sequence
  std::vector<attention_task> seqs;  // one per sequence: queries [0, q_len) of q_row on
  std::vector<std::size_t> outputs;  // rows whose logits are wanted, in output order
  std::vector<std::size_t> idle;     // rows no sequence covers (pad slots): attention gives 0
  std::size_t mask_bytes = 0;        // the dense mask's size, for the memory report

  std::size_t n() const noexcept { return token.size(); }
  std::int64_t max_pos() const noexcept {
    std::int64_t top = 0;
    for (std::int64_t p : pos) top = std::max(top, p);
    return top;
  }
  // A sequence whose queries are rows [q_row, q_row + q_len), after `context` cached keys, with
  // its keys in `runs` (in position order) or, for a dense row, a [q_len][n_keys] mask.
  void add_sequence(std::int64_t q_row, std::int64_t q_len, std::int64_t context,
                    std::int64_t n_keys, const std::vector<key_run>& keys,
                    const float* mask = nullptr) {
    attention_task t;
    t.q_row = q_row;
    t.first = 0;
    t.last = q_len;
    t.context = context;
    t.n_keys = n_keys;
    t.runs_begin = runs.size();
    runs.insert(runs.end(), keys.begin(), keys.end());
    t.runs_end = runs.size();
    t.mask = mask;
    seqs.push_back(t);
  }
};

// Runs of the pool slots holding positions [0, n_keys) of a sequence with these blocks;
// adjacent blocks merge into one run.
inline std::vector<key_run> block_runs(span<const std::int32_t> blocks, std::size_t block_size,
                                       std::size_t n_keys) {
  std::vector<key_run> out;
  for (std::size_t k = 0; k * block_size < n_keys; ++k) {
    const auto first = static_cast<std::int64_t>(blocks[k]) * static_cast<std::int64_t>(block_size);
    const auto count = static_cast<std::int64_t>(std::min(block_size, n_keys - k * block_size));
    if (!out.empty() && out.back().slot + out.back().count == first) {
      out.back().count += count;
    } else {
      out.push_back({first, count});
    }
  }
  return out;
}

// The buffers of a forward pass, declared once (for_each_buffer): sized for a pass of n rows and
// n_out outputs, they are counted from that list (the report, and estimate_prefill_memory from
// shapes alone) and grown from it. A model keeps its workspace between passes, as engines keep
// their activation buffers: a fresh allocation per pass would pay its page faults every time.
class workspace {
 public:
  // Calls f(buffer, rows, cols) for every activation buffer of a pass.
  template <class F>
  void for_each_buffer(const config& c, std::size_t n, std::size_t n_out, F&& f) {
    const auto u = [](int v) { return static_cast<std::size_t>(v); };
    f(h_, n, u(c.hidden));                      // residual stream
    f(qkv_, n, u(c.q_dim() + 2 * c.kv_dim()));  // fused projection; Q after RoPE
    f(att_, n, u(c.q_dim()));                   // attention output
    f(gu_, n, 2 * u(c.ffn));                    // gate | up; SwiGLU over the gate half
    f(scale_, n, std::size_t{1});               // RMSNorm scale of each row
    f(last_, n_out, u(c.hidden));               // final-normed output rows
    f(logits_, n_out, u(c.vocab));              // their logits
  }

  // Bytes of a pass's activations (RoPE table included) and per-thread attention scratch.
  std::pair<std::size_t, std::size_t> bytes(const config& c, std::size_t n, std::size_t n_out,
                                            std::int64_t max_pos, int n_threads) {
    std::size_t act = 0;
    for_each_buffer(c, n, n_out, [&](std::vector<float>&, std::size_t rows, std::size_t cols) {
      act =
          prepack::detail::add(act,
                               prepack::detail::mul(prepack::detail::mul(rows, cols, "activations"),
                                                    sizeof(float), "activations"),
                               "activations");
    });
    act = prepack::detail::add(
        act,
        prepack::detail::mul(static_cast<std::size_t>(max_pos + 1),
                             static_cast<std::size_t>(c.rotary_dim() / 2) * 2 * sizeof(float),
                             "RoPE table"),
        "activations");
    const std::size_t scratch = static_cast<std::size_t>(n_threads) *
                                attention_scratch::bytes_for(tile_rows(c), c.head_size());
    return {act, scratch};
  }

  // Makes every buffer hold a pass of this shape (growing, never shrinking).
  void reserve(const config& c, std::size_t n, std::size_t n_out, std::int64_t max_pos,
               int n_threads) {
    for_each_buffer(c, n, n_out, [](std::vector<float>& buf, std::size_t rows, std::size_t cols) {
      if (buf.size() < rows * cols) buf.assign(rows * cols, 0.0f);
    });
    if (rope_max_ < max_pos || rope_.half != c.rotary_dim() / 2) {
      rope_ = make_rope_table(c.rotary_dim(), c.rope_theta, max_pos);
      rope_max_ = max_pos;
    }
    while (scratch_.size() < static_cast<std::size_t>(n_threads)) {
      scratch_.emplace_back(tile_rows(c), c.head_size());
    }
  }

  static Eigen::Index tile_rows(const config& c) { return query_tile * (c.n_heads / c.n_kv_heads); }

  using view = Eigen::Map<matrix>;
  view h(Eigen::Index n, Eigen::Index cols) { return {h_.data(), n, cols}; }
  view qkv(Eigen::Index n, Eigen::Index cols) { return {qkv_.data(), n, cols}; }
  view att(Eigen::Index n, Eigen::Index cols) { return {att_.data(), n, cols}; }
  view gu(Eigen::Index n, Eigen::Index cols) { return {gu_.data(), n, cols}; }
  view last(Eigen::Index n, Eigen::Index cols) { return {last_.data(), n, cols}; }
  view logits(Eigen::Index n, Eigen::Index cols) { return {logits_.data(), n, cols}; }
  float* scale() { return scale_.data(); }
  const rope_table& rope() const { return rope_; }
  attention_scratch& scratch(int thread) { return scratch_[static_cast<std::size_t>(thread)]; }

 private:
  std::vector<float> h_, qkv_, att_, gu_, scale_, last_, logits_;
  rope_table rope_;
  std::int64_t rope_max_ = -1;
  std::vector<attention_scratch> scratch_;
};

// A workspace and the lock that gives it to one pass at a time. A copied or moved model starts
// with an empty one of its own.
struct workspace_slot {
  std::mutex lock;
  workspace work;
  workspace_slot() = default;
  workspace_slot(const workspace_slot&) {}
  workspace_slot& operator=(const workspace_slot&) { return *this; }
};

inline memory_stats total_memory(std::size_t kv, std::pair<std::size_t, std::size_t> work,
                                 std::size_t mask) {
  memory_stats m;
  m.kv_bytes = kv;
  m.activation_bytes = work.first;
  m.mask_bytes = mask;
  m.scratch_bytes = work.second;
  m.peak_bytes = kv + work.first + mask + work.second;
  return m;
}

}  // namespace detail

/// The reference model: a config and its prepared weights.
class model {
 public:
  /// Throws prepack::error if c is invalid or w's shapes disagree with it.
  model(const config& c, weights w, model_options opt = {}) : cfg_(c), opt_(opt) {
    check_weights(cfg_, w);
    prepare(std::move(w));
  }
  /// Deterministic weights from seed (see random_weights).
  model(const config& c, std::uint64_t seed, model_options opt = {})
      : model(c, random_weights(c, seed), opt) {}

  const config& cfg() const noexcept { return cfg_; }
  weight_type weights_type() const noexcept { return opt_.weights; }
  /// Bytes of the prepared weights the model holds.
  std::size_t weight_bytes() const noexcept {
    std::size_t b = static_cast<std::size_t>(embed_.size() + final_norm_.size()) * sizeof(float) +
                    lm_head_.bytes();
    for (const layer& l : layers_) {
      b += l.qkv.bytes() + l.o.bytes() + l.gate_up.bytes() + l.down.bytes() +
           static_cast<std::size_t>(l.qkv_bias.size()) * sizeof(float);
    }
    return b;
  }

  /// Prefills every prompt of a packed (or padded) layout of whole prompts in one pass; logits
  /// row i belongs to prompt i. Throws prepack::error, computing nothing, if the layout is empty
  /// or holds chunks (a context to attend to: use forward over a pool), a token id is outside
  /// the vocabulary, a position is past 2^24, n_threads < 0, or the backend is not built.
  template <class Token, class Index>
  prefill_result prefill(const packed_layout<Token, Index>& l,
                         const prefill_options& opt = {}) const {
    prepack::detail::require(!l.empty(), "layout: empty (no prompts)");
    for (std::size_t i = 0; i < l.n_prompts(); ++i) {
      prepack::detail::require(l.prompt_context()[i] == 0, "prompt ", i, ": context ",
                               l.prompt_context()[i],
                               ": a packed prefill has no cache to attend to (use forward over a "
                               "kv_pool)");
    }
    detail::batch b = rows_batch(l.n_slots(), l.tokens(), l.positions(), l.segments());
    for (std::size_t s = 0; s < l.n_slots(); ++s) b.slot[s] = static_cast<std::int64_t>(s);
    std::vector<float> mask;  // [n_rows][width][width]  additive, dense path only
    if (opt.path == attention::dense) {
      mask = additive_mask<float>(l);
      add_rows(b, l.n_rows(), l.width(), mask.data());
    } else {
      for (std::size_t i = 0; i < l.n_prompts(); ++i) {
        const auto len = static_cast<std::int64_t>(l.prompt_length()[i]);
        const auto first = static_cast<std::int64_t>(l.first_slot(i));
        b.add_sequence(first, len, 0, len, {{first, len}});
      }
      mark_idle(b);
    }
    for (Index s : l.last_token()) b.outputs.push_back(static_cast<std::size_t>(s));
    return packed_prefill(b, l.n_rows(), l.width(), {opt.n_threads, opt.backend});
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
                                span<const Index> output_slots,
                                const exec_options& opt = {}) const {
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
    detail::batch b = rows_batch(slots, tokens, positions, span<const Index>());
    for (std::size_t s = 0; s < slots; ++s) b.slot[s] = static_cast<std::int64_t>(s);
    add_rows(b, n_rows, width, mask.data());
    for (Index s : output_slots) b.outputs.push_back(static_cast<std::size_t>(s));
    return packed_prefill(b, n_rows, width, opt);
  }

  /// One step over a paged pool: the step's sequences attend to their cached context (read
  /// through their block tables) and their own causal block; their K and V are written into the
  /// pool through the slot mapping; the logits of the tokens flagged in `in.logits` come back.
  /// Throws prepack::error, writing nothing, if the inputs disagree with themselves (sizes,
  /// cumulative lengths, positions not context + i), with the pool (block size, block count) or
  /// with the model (token ids), a block table is too short for context + query or names a
  /// block outside the pool, a token's slot is not where its block table puts its position, two
  /// tokens map to one slot, or a sequence's context is not cached in the pool yet.
  template <class Token, class Index>
  step_result forward(const step_inputs<Token, Index>& in, kv_pool& pool,
                      const exec_options& opt = {}) const {
    detail::batch b = step_batch(in, pool);
    return pool_forward(b, pool, opt, [&](std::size_t t) { return seq_of_token(in, t); });
  }

  /// A step laid out as rows (make_step_layout) over a paged pool: as above, pad slots
  /// computed but neither written nor attended.
  template <class Token, class Index>
  step_result forward(const step_layout<Token, Index>& s, kv_pool& pool,
                      const exec_options& opt = {}) const {
    detail::batch b = rows_step_batch(s, pool);
    const auto& l = s.layout;
    return pool_forward(b, pool, opt, [&](std::size_t slot) {
      return static_cast<std::size_t>(l.segments()[slot]);
    });
  }

  /// What prefill() would allocate: see estimate_prefill_memory.
  memory_stats estimate_memory(std::size_t n_rows, std::size_t width, std::size_t n_prompts,
                               std::size_t longest, attention path, int n_threads = 0) const;

 private:
  // One decoder layer, prepared: the norms' weights folded into the projections they feed.
  struct layer {
    linear qkv;       // [hidden][q_dim + 2 kv_dim]  diag(attn_norm) [wq | wk | wv]
    vector qkv_bias;  // [q_dim + 2 kv_dim]          [bq | bk | bv], empty without biases
    linear o;         // [q_dim][hidden]
    linear gate_up;   // [hidden][2 ffn]             diag(mlp_norm) [w_gate | w_up]
    linear down;      // [ffn][hidden]
  };

  void prepare(weights w) {
    const config& c = cfg_;
    const weight_type wt = opt_.weights;
    for (layer_weights& lw : w.layers) {
      layer L;
      matrix qkv(c.hidden, c.q_dim() + 2 * c.kv_dim());
      qkv << lw.wq, lw.wk, lw.wv;
      qkv = lw.attn_norm.asDiagonal() * qkv;
      L.qkv = linear(std::move(qkv), false, wt);
      if (c.qkv_bias) {
        L.qkv_bias.resize(c.q_dim() + 2 * c.kv_dim());
        L.qkv_bias << lw.bq, lw.bk, lw.bv;
      }
      L.o = linear(std::move(lw.wo), false, wt);
      matrix gu(c.hidden, 2 * c.ffn);
      gu << lw.w_gate, lw.w_up;
      gu = lw.mlp_norm.asDiagonal() * gu;
      L.gate_up = linear(std::move(gu), false, wt);
      L.down = linear(std::move(lw.w_down), false, wt);
      layers_.push_back(std::move(L));
      lw = layer_weights{};  // free the semantic copy as we go
    }
    final_norm_ = std::move(w.final_norm);
    // The LM head runs over a few rows per batch: fp32 always. Tied: one matrix serves both.
    if (c.tied_embeddings) {
      lm_head_ = linear(std::move(w.embed), true, weight_type::f32);
    } else {
      embed_ = std::move(w.embed);
      lm_head_ = linear(std::move(w.lm_head), false, weight_type::f32);
    }
  }

  const float* embedding(std::int32_t token) const noexcept {
    const matrix& e = cfg_.tied_embeddings ? lm_head_.weights() : embed_;
    return e.data() + static_cast<std::size_t>(token) * static_cast<std::size_t>(cfg_.hidden);
  }

  // Token rows of a rectangular batch; tokens checked against the vocabulary, positions range.
  template <class Token, class Index>
  detail::batch rows_batch(std::size_t n, span<const Token> tokens, span<const Index> positions,
                           span<const Index> segments) const {
    detail::batch b;
    b.token.resize(n);
    b.pos.resize(n);
    b.slot.assign(n, -1);
    for (std::size_t s = 0; s < n; ++s) {
      const auto tok = static_cast<long long>(tokens[s]);
      const bool pad = !segments.empty() && segments[s] < 0;
      if (tok < 0 || tok >= cfg_.vocab) {
        if (!pad && !segments.empty()) {
          prepack::detail::fail("prompt ", segments[s], ": token ", positions[s], " = ", tok,
                                " outside vocab ", cfg_.vocab);
        }
        prepack::detail::fail(pad ? "pad slot " : "slot ", s, ": token ", tok, " outside vocab ",
                              cfg_.vocab);
      }
      const auto pos = static_cast<long long>(positions[s]);
      if (!pad) {
        prepack::detail::require(pos >= 0 && pos <= max_position, "slot ", s, ": position ", pos,
                                 " outside 0..", max_position);
      }
      b.token[s] = static_cast<std::int32_t>(tok);
      b.pos[s] = pad ? 0 : pos;  // a pad slot's position is never used; 0 keeps RoPE in range
    }
    return b;
  }

  // Dense rows: every row a sequence of `width` queries over the row's keys, under its mask.
  static void add_rows(detail::batch& b, std::size_t n_rows, std::size_t width, const float* mask) {
    const auto w = static_cast<std::int64_t>(width);
    for (std::size_t r = 0; r < n_rows; ++r) {
      const auto first = static_cast<std::int64_t>(r) * w;
      b.add_sequence(first, w, 0, w, {{first, w}}, mask + static_cast<std::size_t>(first) * width);
    }
    b.mask_bytes = n_rows * width * width * sizeof(float);
  }

  static void mark_idle(detail::batch& b) {
    std::vector<unsigned char> covered(b.n(), 0);
    for (const auto& t : b.seqs) {
      std::fill(covered.begin() + t.q_row, covered.begin() + t.q_row + t.last, 1);
    }
    for (std::size_t r = 0; r < covered.size(); ++r) {
      if (!covered[r]) b.idle.push_back(r);
    }
  }

  // The forward pass over a packed batch whose K and V go into the result's own buffers.
  prefill_result packed_prefill(detail::batch& b, std::size_t n_rows, std::size_t width,
                                const exec_options& opt) const {
    const config& c = cfg_;
    prefill_result r;
    r.n_rows = n_rows;
    r.width = width;
    r.n_layers = c.n_layers;
    r.n_kv_heads = c.n_kv_heads;
    r.head_dim = c.head_size();
    const std::size_t per_layer =
        prepack::detail::mul(b.n(), static_cast<std::size_t>(c.kv_dim()), "KV cache");
    const std::size_t total =
        prepack::detail::mul(per_layer, static_cast<std::size_t>(c.n_layers), "KV cache");
    r.keys.assign(total, 0.0f);
    r.values.assign(total, 0.0f);
    detail::kv_store store{r.keys.data(), r.values.data(), per_layer, b.n(),
                           2 * total * sizeof(float)};
    r.logits = forward_pass(b, store, opt, r.memory, r.profile);
    return r;
  }

  // The forward pass over a pool; records the positions written once it is done.
  template <class SeqOf>
  step_result pool_forward(detail::batch& b, kv_pool& pool, const exec_options& opt,
                           SeqOf&& seq_of) const {
    detail::kv_store store{pool.keys(0), pool.values(0), pool.n_slots() * pool.kv_dim(),
                           pool.n_slots(), pool.bytes()};
    step_result r;
    r.logits = forward_pass(b, store, opt, r.memory, r.profile);
    for (std::size_t t = 0; t < b.n(); ++t) {
      if (b.slot[t] >= 0) pool.set_position(static_cast<std::size_t>(b.slot[t]), b.pos[t]);
    }
    for (std::size_t k : b.outputs) {
      r.output_token.push_back(k);
      r.output_seq.push_back(seq_of(k));
    }
    return r;
  }

  template <class Token, class Index>
  static std::size_t seq_of_token(const step_inputs<Token, Index>& in, std::size_t t) {
    const auto it =
        std::upper_bound(in.cu_seqlens_q.begin(), in.cu_seqlens_q.end(), static_cast<Index>(t));
    return static_cast<std::size_t>(it - in.cu_seqlens_q.begin()) - 1;
  }

  // Checks a sequence against the pool before anything is written: its block table covers
  // context + query with blocks of the pool, its context is cached at the slots the table
  // names, and each of its tokens' slots is where the table puts the token's position.
  void check_pool_sequence(const kv_pool& pool, span<const std::int32_t> blocks,
                           std::size_t context, std::size_t q_len, const std::int64_t* slots,
                           const std::int64_t* pos, std::int64_t id,
                           std::vector<std::pair<std::int64_t, std::int64_t>>& read) const {
    using prepack::detail::require;
    const std::size_t bs = pool.block_size();
    const std::size_t need = blocks_for(context + q_len, bs);
    std::size_t have = 0;
    while (have < blocks.size() && blocks[have] >= 0) ++have;
    require(have >= need, "sequence ", id, ": context ", context, " + query ", q_len, " needs ",
            need, " blocks of ", bs, ", its block table has ", have);
    for (std::size_t k = 0; k < need; ++k) {
      require(static_cast<std::size_t>(blocks[k]) < pool.n_blocks(), "sequence ", id,
              ": block_table[", k, "] = ", blocks[k], " outside the pool's blocks 0..",
              pool.n_blocks() - 1);
    }
    const auto slot_of = [&](std::size_t p) {
      return static_cast<std::size_t>(blocks[p / bs]) * bs + p % bs;
    };
    for (std::size_t p = 0; p < context; ++p) {
      const std::int64_t held = pool.positions()[slot_of(p)];
      require(held == static_cast<std::int64_t>(p), "sequence ", id, ": context position ", p,
              " is not cached (its slot ", slot_of(p), " holds ",
              held < 0 ? std::string("nothing") : "position " + std::to_string(held), ")");
      read.emplace_back(static_cast<std::int64_t>(slot_of(p)), id);
    }
    for (std::size_t i = 0; i < q_len; ++i) {
      require(pos[i] == static_cast<std::int64_t>(context + i), "sequence ", id, ": token ", i,
              " has position ", pos[i], ", expected ", context + i);
      require(slots[i] == static_cast<std::int64_t>(slot_of(context + i)), "sequence ", id,
              ": token ", i, " maps to slot ", slots[i], " but its block table puts position ",
              context + i, " at slot ", slot_of(context + i));
    }
  }

  // No slot written twice, and none of the context slots the step reads written over.
  static void check_slots(const detail::batch& b, const kv_pool& pool,
                          std::vector<std::pair<std::int64_t, std::int64_t>>& read) {
    std::vector<std::pair<std::int64_t, std::size_t>> order;
    for (std::size_t t = 0; t < b.n(); ++t) {
      if (b.slot[t] >= 0) order.emplace_back(b.slot[t], t);
    }
    std::sort(order.begin(), order.end());
    for (std::size_t k = 1; k < order.size(); ++k) {
      prepack::detail::require(order[k].first != order[k - 1].first, "token ", order[k].second,
                               ": slot ", order[k].first, " is also written by token ",
                               order[k - 1].second);
    }
    std::sort(read.begin(), read.end());
    std::size_t r = 0;
    for (const auto& [slot, t] : order) {
      while (r < read.size() && read[r].first < slot) ++r;
      if (r < read.size() && read[r].first == slot) {
        prepack::detail::fail("token ", t, ": slot ", slot, " would overwrite the cached position ",
                              pool.positions()[static_cast<std::size_t>(slot)], " that sequence ",
                              read[r].second, " attends to");
      }
    }
  }

  template <class Token, class Index>
  detail::batch step_batch(const step_inputs<Token, Index>& in, const kv_pool& pool) const {
    using prepack::detail::require;
    const std::size_t n = in.tokens.size(), n_seqs = in.seq_item.size();
    require(n > 0 && n_seqs > 0, "step: no tokens");
    require(in.positions.size() == n && in.slot_mapping.size() == n && in.logits.size() == n,
            "step: ", n, " tokens but ", in.positions.size(), " positions, ",
            in.slot_mapping.size(), " slots, ", in.logits.size(), " logits flags");
    require(in.context_lens.size() == n_seqs && in.query_lens.size() == n_seqs &&
                in.cu_seqlens_q.size() == n_seqs + 1 && in.tables.n_seqs() >= n_seqs,
            "step: per-sequence arrays disagree with ", n_seqs, " sequences");
    require(in.cu_seqlens_q.front() == 0 && static_cast<std::size_t>(in.cu_seqlens_q.back()) == n,
            "step: cu_seqlens_q does not delimit ", n, " tokens");
    require(in.tables.block_size == pool.block_size() && in.n_blocks == pool.n_blocks(),
            "step: block size ", in.tables.block_size, " and ", in.n_blocks,
            " blocks, the pool has ", pool.block_size(), " and ", pool.n_blocks());
    detail::batch b;
    b.token.resize(n);
    b.pos.resize(n);
    b.slot.assign(in.slot_mapping.begin(), in.slot_mapping.end());
    for (std::size_t t = 0; t < n; ++t) {
      const auto tok = static_cast<long long>(in.tokens[t]);
      require(tok >= 0 && tok < cfg_.vocab, "token ", t, ": id ", tok, " outside vocab ",
              cfg_.vocab);
      b.token[t] = static_cast<std::int32_t>(tok);
      b.pos[t] = static_cast<std::int64_t>(in.positions[t]);
      require(b.pos[t] >= 0 && b.pos[t] <= max_position, "token ", t, ": position ", b.pos[t],
              " outside 0..", max_position);
    }
    std::vector<std::pair<std::int64_t, std::int64_t>> read;  // (context slot, sequence id)
    for (std::size_t q = 0; q < n_seqs; ++q) {
      const auto q0 = static_cast<std::size_t>(in.cu_seqlens_q[q]);
      const auto q1 = static_cast<std::size_t>(in.cu_seqlens_q[q + 1]);
      require(q0 < q1 && q1 <= n &&
                  static_cast<long long>(q1 - q0) == static_cast<long long>(in.query_lens[q]),
              "step: sequence ", q, ": cu_seqlens_q disagree with query_lens");
      require(in.context_lens[q] >= 0, "step: sequence ", q, ": context ", in.context_lens[q]);
      const auto ctx = static_cast<std::size_t>(in.context_lens[q]);
      const std::int64_t id = q < in.seq_id.size() ? in.seq_id[q] : static_cast<std::int64_t>(q);
      check_pool_sequence(pool, in.tables.row(q), ctx, q1 - q0, b.slot.data() + q0,
                          b.pos.data() + q0, id, read);
      const std::size_t keys = ctx + (q1 - q0);
      b.add_sequence(static_cast<std::int64_t>(q0), static_cast<std::int64_t>(q1 - q0),
                     static_cast<std::int64_t>(ctx), static_cast<std::int64_t>(keys),
                     detail::block_runs(in.tables.row(q), pool.block_size(), keys));
    }
    check_slots(b, pool, read);
    for (std::size_t t = 0; t < n; ++t) {
      if (in.logits[t]) b.outputs.push_back(t);
    }
    return b;
  }

  template <class Token, class Index>
  detail::batch rows_step_batch(const step_layout<Token, Index>& s, const kv_pool& pool) const {
    using prepack::detail::require;
    const auto& l = s.layout;
    require(!l.empty(), "step layout: empty");
    require(s.slots.slots().size() == l.n_slots() && s.tables.n_seqs() >= l.n_prompts(),
            "step layout: slot mapping or block tables disagree with the layout");
    require(s.tables.block_size == pool.block_size() && s.slots.n_blocks() == pool.n_blocks(),
            "step layout: block size ", s.tables.block_size, " and ", s.slots.n_blocks(),
            " blocks, the pool has ", pool.block_size(), " and ", pool.n_blocks());
    detail::batch b = rows_batch(l.n_slots(), l.tokens(), l.positions(), l.segments());
    b.slot.assign(s.slots.slots().begin(), s.slots.slots().end());
    std::vector<std::pair<std::int64_t, std::int64_t>> read;  // (context slot, sequence)
    for (std::size_t i = 0; i < l.n_prompts(); ++i) {
      const std::size_t first = l.first_slot(i);
      const auto ctx = static_cast<std::size_t>(l.prompt_context()[i]);
      const auto len = static_cast<std::size_t>(l.prompt_length()[i]);
      check_pool_sequence(pool, s.tables.row(i), ctx, len, b.slot.data() + first,
                          b.pos.data() + first, static_cast<std::int64_t>(i), read);
      b.add_sequence(static_cast<std::int64_t>(first), static_cast<std::int64_t>(len),
                     static_cast<std::int64_t>(ctx), static_cast<std::int64_t>(ctx + len),
                     detail::block_runs(s.tables.row(i), pool.block_size(), ctx + len));
      b.outputs.push_back(static_cast<std::size_t>(l.last_token()[i]));
    }
    mark_idle(b);
    check_slots(b, pool, read);
    return b;
  }

  // The transformer over a batch, layer by layer: one named step per operation, timing beside.
  matrix forward_pass(detail::batch& b, const detail::kv_store& store, const exec_options& opt,
                      memory_stats& memory, prefill_profile& profile) const {
    const auto t_start = detail::clock::now();
    const config& c = cfg_;
    const detail::thread_scope threads(opt.n_threads);
    const int nt = threads.n();
    const gemm_backend backend = resolve(opt.backend);
    const Eigen::Index n = static_cast<Eigen::Index>(b.n());
    const Eigen::Index hidden = c.hidden, hd = c.head_size(), q_dim = c.q_dim(),
                       kv_dim = c.kv_dim(), qkv_dim = q_dim + 2 * kv_dim, ffn = c.ffn;
    const int group = c.n_heads / c.n_kv_heads;

    // Attention tasks: every sequence x KV head x tile of queries, the costliest first.
    std::vector<detail::attention_task> tasks;
    for (const auto& seq : b.seqs) {
      for (int g = 0; g < c.n_kv_heads; ++g) {
        for (std::int64_t q0 = 0; q0 < seq.last; q0 += detail::query_tile) {
          detail::attention_task t = seq;
          t.first = q0;
          t.last = std::min<std::int64_t>(seq.last, q0 + detail::query_tile);
          t.kv_head = g;
          tasks.push_back(t);
        }
      }
    }
    std::stable_sort(tasks.begin(), tasks.end(),
                     [](const auto& u, const auto& v) { return u.cost() > v.cost(); });

    const auto n_out = static_cast<Eigen::Index>(b.outputs.size());
    const std::lock_guard<std::mutex> guard(work_.lock);
    detail::workspace& w = work_.work;
    w.reserve(c, b.n(), b.outputs.size(), b.max_pos(), nt);
    memory = detail::total_memory(store.bytes, w.bytes(c, b.n(), b.outputs.size(), b.max_pos(), nt),
                                  b.mask_bytes);
    auto h = w.h(n, hidden);
    auto qkv = w.qkv(n, qkv_dim);
    auto att = w.att(n, q_dim);
    auto gu = w.gu(n, 2 * ffn);
    float* scale = w.scale();
    double t_linear = 0, t_attention = 0, flops_attention = 0;

    // Embedding.
    for (Eigen::Index t = 0; t < n; ++t) {
      h.row(t) = Eigen::Map<const Eigen::RowVectorXf>(
          embedding(b.token[static_cast<std::size_t>(t)]), hidden);
    }
    for (int li = 0; li < c.n_layers; ++li) {
      const layer& L = layers_[static_cast<std::size_t>(li)];
      float* layer_keys = store.keys + static_cast<std::size_t>(li) * store.layer_stride;
      float* layer_values = store.values + static_cast<std::size_t>(li) * store.layer_stride;

      // Attention block: RMSNorm scale, fused Q K V projection.
      row_scales(h, scale, nt);
      t_linear += detail::timed(
          [&] { L.qkv.apply(backend, n, h.data(), hidden, qkv.data(), qkv_dim, false); });
      // Norm scale and bias, RoPE on Q and K, then K and V into the store at their slots.
      PREPACK_OMP(parallel for num_threads(nt) schedule(static))
      for (Eigen::Index t = 0; t < n; ++t) {
        float* row = qkv.row(t).data();
        Eigen::Map<Eigen::ArrayXf> r(row, qkv_dim);
        r *= scale[t];
        if (L.qkv_bias.size() > 0) r += L.qkv_bias.array();
        const std::int64_t pos = b.pos[static_cast<std::size_t>(t)];
        for (int head = 0; head < c.n_heads + c.n_kv_heads; ++head) {
          detail::rope(row + head * hd, w.rope(), pos);
        }
        const std::int64_t slot = b.slot[static_cast<std::size_t>(t)];
        if (slot >= 0) {
          const std::size_t at = static_cast<std::size_t>(slot) * static_cast<std::size_t>(kv_dim);
          std::copy(row + q_dim, row + q_dim + kv_dim, layer_keys + at);
          std::copy(row + q_dim + kv_dim, row + qkv_dim, layer_values + at);
        }
      }
      // Attention over each sequence's keys: its context from the store, then its own.
      for (std::size_t r : b.idle) att.row(static_cast<Eigen::Index>(r)).setZero();
      detail::attention_io io;
      io.q = qkv.data();
      io.q_stride = qkv_dim;
      io.out = att.data();
      io.out_stride = q_dim;
      io.keys = layer_keys;
      io.values = layer_values;
      io.kv_dim = kv_dim;
      io.head_dim = hd;
      io.group = group;
      io.scale = 1.0f / std::sqrt(static_cast<float>(hd));
      io.runs = b.runs.data();
      t_attention += detail::timed([&] {
        const auto n_tasks = static_cast<std::int64_t>(tasks.size());
        double f = 0;
        PREPACK_OMP(parallel for num_threads(nt) schedule(dynamic, 1) reduction(+ : f))
        for (std::int64_t k = 0; k < n_tasks; ++k) {
          f += detail::attend(io, tasks[static_cast<std::size_t>(k)],
                              w.scratch(detail::thread_id()));
        }
        flops_attention += f;
      });
      // Output projection, added to the residual stream.
      t_linear +=
          detail::timed([&] { L.o.apply(backend, n, att.data(), q_dim, h.data(), hidden, true); });

      // MLP block: RMSNorm scale, fused gate | up projection, SwiGLU, down projection added to
      // the residual stream.
      row_scales(h, scale, nt);
      t_linear += detail::timed(
          [&] { L.gate_up.apply(backend, n, h.data(), hidden, gu.data(), 2 * ffn, false); });
      PREPACK_OMP(parallel for num_threads(nt) schedule(static))
      for (Eigen::Index t = 0; t < n; ++t) {
        float* row = gu.row(t).data();
        detail::swiglu(row, row + ffn, scale[t], static_cast<std::size_t>(ffn));
      }
      t_linear += detail::timed(
          [&] { L.down.apply(backend, n, gu.data(), 2 * ffn, h.data(), hidden, true); });
    }

    // Final norm and LM head, over the rows whose logits are wanted only.
    auto last = w.last(n_out, hidden);
    auto logits = w.logits(n_out, c.vocab);
    for (Eigen::Index i = 0; i < n_out; ++i) {
      const auto row = h.row(static_cast<Eigen::Index>(b.outputs[static_cast<std::size_t>(i)]));
      const float s = detail::rms_scale(row.data(), static_cast<std::size_t>(hidden), c.rms_eps);
      last.row(i) = (row.array() * s * final_norm_.transpose().array()).matrix();
    }
    t_linear += detail::timed([&] {
      lm_head_.apply(backend, n_out, last.data(), hidden, logits.data(), c.vocab, false);
    });

    double per_token = 0;
    for (const layer& L : layers_) {
      per_token +=
          2.0 * static_cast<double>(L.qkv.in() * L.qkv.out() + L.o.in() * L.o.out() +
                                    L.gate_up.in() * L.gate_up.out() + L.down.in() * L.down.out());
    }
    profile.linear_flops = per_token * static_cast<double>(n) +
                           2.0 * static_cast<double>(n_out) * static_cast<double>(hidden) * c.vocab;
    profile.attention_flops = flops_attention;
    profile.seconds_linear = t_linear;
    profile.seconds_attention = t_attention;
    profile.n_threads = nt;
    profile.backend = backend;
    profile.seconds_total = std::chrono::duration<double>(detail::clock::now() - t_start).count();
    return logits;
  }

  void row_scales(const detail::workspace::view& h, float* scale, int nt) const {
    (void)nt;  // only the OpenMP directive reads it
    const Eigen::Index n = h.rows();
    PREPACK_OMP(parallel for num_threads(nt) schedule(static))
    for (Eigen::Index t = 0; t < n; ++t) {
      scale[t] =
          detail::rms_scale(h.row(t).data(), static_cast<std::size_t>(h.cols()), cfg_.rms_eps);
    }
  }

  static constexpr long long max_position = 1 << 24;

  config cfg_;
  model_options opt_;
  mutable detail::workspace_slot work_;  // activations kept between passes
  std::vector<layer> layers_;
  matrix embed_;       // [vocab][hidden]  (empty when tied: lm_head_ holds it)
  vector final_norm_;  // [hidden]
  linear lm_head_;     // [hidden][vocab], or the embedding [vocab][hidden] transposed
};

/// What a prefill over n_rows x width slots holding n_prompts prompts (the longest `longest`
/// tokens) allocates (prefill_result::memory), from shapes alone, with the forward pass's own
/// accounting and without changing any thread setting. Throws prepack::error if a size
/// overflows size_t, c is invalid, or n_threads < 0.
inline memory_stats estimate_prefill_memory(const config& c, std::size_t n_rows, std::size_t width,
                                            std::size_t n_prompts, std::size_t longest,
                                            attention path, int n_threads = 0) {
  c.validate();
  const std::size_t slots = prepack::detail::mul(n_rows, width, "batch slots");
  detail::workspace w;  // counts, allocates nothing
  const auto work =
      w.bytes(c, slots, n_prompts,
              static_cast<std::int64_t>(path == attention::dense ? width : longest) - 1,
              detail::threads_for(n_threads));
  const std::size_t kv = prepack::detail::mul(
      prepack::detail::mul(2 * static_cast<std::size_t>(c.n_layers), slots, "KV cache"),
      static_cast<std::size_t>(c.kv_dim()) * sizeof(float), "KV cache");
  const std::size_t mask =
      path == attention::dense
          ? prepack::detail::mul(prepack::detail::mul(slots, width, "dense mask"), sizeof(float),
                                 "dense mask")
          : 0;
  return detail::total_memory(kv, work, mask);
}

inline memory_stats model::estimate_memory(std::size_t n_rows, std::size_t width,
                                           std::size_t n_prompts, std::size_t longest,
                                           attention path, int n_threads) const {
  return estimate_prefill_memory(cfg_, n_rows, width, n_prompts, longest, path, n_threads);
}

}  // namespace reference
PREPACK_NAMESPACE_END
