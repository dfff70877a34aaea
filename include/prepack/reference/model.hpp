// prepack/reference/model.hpp - the clean reference kernel: a Llama-family decoder on the CPU
// (fp32 projection weights, bf16, or ggml's quantized blocks held as a checkpoint stores them)
// with one transformer block for every kind of batch:
//
//  prefill(layout)        a packed or padded batch of whole prompts; K and V come out packed
//                         ([layer][row][slot][kv_head][dim]) with every prompt's last logits.
//  prefill_masked(...)    raw Hugging Face-style inputs with a 4D additive mask.
//  forward(step, pool)    one step over a paged KV pool: each sequence's queries attend to its
//                         cached context (read through its block table) and to its own causal
//                         block; new K and V go into the pool through the slot mapping.
//                         Whole-prompt prefill, chunked prefill and decode (one-token chunks over
//                         their context) are all this.
//
// Hugging Face conventions: token embedding; per layer RMSNorm -> Q, K, V projections (with
// biases for Qwen2-style configs) -> RoPE (rotate-half) -> grouped-query attention -> output
// projection -> residual -> RMSNorm -> SwiGLU MLP -> residual; final RMSNorm; LM head (or the
// embedding, tied). forward_pass below reads as that list, one named step per operation, and
// runs near the machine's limit: Q, K and V are one GEMM and gate and up another, with the
// norms' weights folded into them when the model is built; each GEMM's neighbours (norm scale,
// bias, RoPE, the KV write, SwiGLU, the residual add) happen in the pass that already touches
// those rows; the GEMMs run on oneDNN or Eigen (gemm.hpp); attention is a blocked online-softmax
// kernel (attention.hpp). The batch adapters and pool checks live in batch.hpp, the buffers and
// threads in workspace.hpp. Threads: OpenMP, the caller's count.
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
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../layout.hpp"
#include "../mask.hpp"
#include "../step.hpp"
#include "../unpack.hpp"
#include "attention.hpp"
#include "batch.hpp"
#include "detail/ops.hpp"
#include "gemm.hpp"
#include "kv_pool.hpp"
#include "linear.hpp"
#include "matrix.hpp"
#include "weights.hpp"
#include "workspace.hpp"

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

/// What a held quantized projection multiplies its rows with.
enum class activation_type {
  fp32,  // the activations as they are: the function of the widened weights (the default)
  int8,  // quantized to 8 bits per 32-value block, dotted in integers (llama.cpp's way): faster
         // on held Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q3_K / Q4_K / Q5_K / Q6_K / IQ4_NL / IQ4_XS
         // rows, each
         // dot within half a step
         // of every activation block times its weights (detail::int8_rows states the bound); still
         // per token, so every request equals running it alone under it. Other types, and fp32
         // weights, stay fp32.
};

/// How the model holds its weights.
struct model_options {
  weight_type weights = weight_type::f32;
  /// The backend the weights are laid out for: oneDNN (the default in builds with it) holds
  /// each projection (and an untied LM head) in its own blocked layout where it chooses one on
  /// this CPU, which few-row GEMMs (decode) need to stream weights at the memory's speed; Eigen
  /// holds them plain. Calls may still run on either backend (see linear).
  gemm_backend layout = gemm_backend::automatic;
  /// Activations of the projections held quantized (opt-in: activation_type::int8).
  activation_type activations = activation_type::fp32;
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

// One forward pass in progress: its threads and backend, the workspace's buffers for this batch,
// the attention tasks and their I/O (built once, used by every layer), and the time and work it
// counts. The workspace must have been reserved for the batch.
struct pass {
  pass(workspace& w, const config& c, const batch& b, int threads, gemm_backend be)
      : n_threads(threads),
        backend(be),
        n(static_cast<Eigen::Index>(b.n())),
        work(&w),
        h(w.h(n, c.hidden)),
        qkv(w.qkv(n, c.q_dim() + 2 * c.kv_dim())),
        att(w.att(n, c.q_dim())),
        gu(w.gu(n, 2 * static_cast<Eigen::Index>(c.ffn))),
        scale(w.scale()),
        tasks(attention_tasks(b, c.n_kv_heads)) {
    io.q = qkv.data();
    io.q_stride = qkv.cols();
    io.out = att.data();
    io.out_stride = att.cols();
    io.kv_dim = c.kv_dim();
    io.head_dim = c.head_size();
    io.group = c.n_heads / c.n_kv_heads;
    io.scale = 1.0f / std::sqrt(static_cast<float>(c.head_size()));
    io.runs = b.runs.data();
  }
  pass(const pass&) = delete;
  pass& operator=(const pass&) = delete;

  // c[m][out] = (or +=) a[m][in] W, timed and counted: every GEMM of the pass.
  void linear(const reference::linear& w, Eigen::Index m, const float* a, Eigen::Index lda,
              float* c, Eigen::Index ldc, bool accumulate) {
    seconds_linear += timed([&] { w.apply(backend, m, a, lda, c, ldc, accumulate, work->gemm()); });
    linear_flops +=
        2.0 * static_cast<double>(m) * static_cast<double>(w.in()) * static_cast<double>(w.out());
  }

  // Attention tasks of a batch: every sequence x KV head x tile of queries, the costliest first.
  static std::vector<attention_task> attention_tasks(const batch& b, int n_kv_heads) {
    std::vector<attention_task> out;
    for (const auto& seq : b.seqs) {
      for (int g = 0; g < n_kv_heads; ++g) {
        for (std::int64_t q0 = 0; q0 < seq.last; q0 += query_tile) {
          attention_task t = seq;
          t.first = q0;
          t.last = std::min<std::int64_t>(seq.last, q0 + query_tile);
          t.kv_head = g;
          out.push_back(t);
        }
      }
    }
    std::stable_sort(out.begin(), out.end(),
                     [](const auto& u, const auto& v) { return u.cost() > v.cost(); });
    return out;
  }

  int n_threads = 1;
  gemm_backend backend = gemm_backend::eigen;
  Eigen::Index n = 0;                 // token rows
  workspace* work = nullptr;          // its buffers, locked for the pass
  workspace::view h;                  // [n][hidden]           residual stream
  workspace::view qkv;                // [n][q_dim + 2 kv_dim] fused projection, Q after RoPE
  workspace::view att;                // [n][q_dim]            attention output
  workspace::view gu;                 // [n][2 ffn]            gate | up
  float* scale = nullptr;             // [n]                   RMSNorm scale of each row
  std::vector<attention_task> tasks;  // every sequence x KV head x query tile
  attention_io io;                    // what attention reads; the layer's K, V set per layer
  double seconds_linear = 0, seconds_attention = 0, linear_flops = 0, attention_flops = 0;
};

}  // namespace detail

/// The reference model: a config and its prepared weights.
class model {
 public:
  /// Throws prepack::error if c is invalid or w's shapes disagree with it.
  model(const config& c, weights w, model_options opt = {}) : cfg_(c), opt_(opt) {
    check_weights(cfg_, w);
    held_weights src(std::move(w));
    prepare(src);
  }
  /// The weights a source hands over, each piece prepared (and, with bf16 projections,
  /// converted) as it arrives: the model never holds more than one layer of the source's fp32
  /// weights besides its own. Throws what the source throws, or prepack::error if c is invalid
  /// or a piece's shape disagrees with it.
  model(const config& c, weight_source& src, model_options opt = {}) : cfg_(c), opt_(opt) {
    cfg_.validate();
    prepare(src);
  }
  /// Deterministic weights from seed (see random_weights), generated a layer at a time.
  model(const config& c, std::uint64_t seed, model_options opt = {}) : cfg_(c), opt_(opt) {
    random_source src(c, seed);
    prepare(src);
  }

  const config& cfg() const noexcept { return cfg_; }
  weight_type weights_type() const noexcept { return opt_.weights; }
  /// Whether some projections are held quantized (a source handed them so: see linear), and
  /// how many weight matrices of each ggml type ("Q4_K" -> 154) are held that way.
  bool quantized() const noexcept { return !quantized_types_.empty(); }
  const std::map<std::string, int>& quantized_types() const noexcept { return quantized_types_; }
  /// Whether held quantized projections dot with 8-bit activations (model_options::activations
  /// asked for it and some layer's types allow it: int8_layers()). O(1).
  bool int8_activations() const noexcept { return int8_layers_.first > 0; }
  /// Of the quantized layers (fused projections and the LM head), how many dot with 8-bit
  /// activations (model_options::activations; a layer with a segment of another type keeps
  /// fp32), and how many there are: counted once, when the model is made. O(1).
  std::pair<int, int> int8_layers() const noexcept { return int8_layers_; }
  /// Bytes of the prepared weights the model holds.
  std::size_t weight_bytes() const noexcept {
    std::size_t b = static_cast<std::size_t>(embed_.size() + final_norm_.size()) * sizeof(float) +
                    lm_head_.bytes() + embed_q_.bytes.size();
    for (const layer& l : layers_) {
      b += l.qkv.bytes() + l.o.bytes() + l.gate_up.bytes() + l.down.bytes() +
           static_cast<std::size_t>(l.qkv_bias.size() + l.q_norm.size() + l.k_norm.size()) *
               sizeof(float);
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
      if (l.prompt_context()[i] != 0) {
        prepack::detail::fail("prompt ", i, ": context ", l.prompt_context()[i],
                              ": a packed prefill has no cache to attend to (use forward over a "
                              "kv_pool)");
      }
    }
    detail::batch b =
        detail::rows_batch(cfg_, l.n_slots(), l.tokens(), l.positions(), l.segments());
    for (std::size_t s = 0; s < l.n_slots(); ++s) b.slot[s] = static_cast<std::int64_t>(s);
    std::vector<float> mask;  // [n_rows][width][width]  additive, dense path only
    if (opt.path == attention::dense) {
      mask = additive_mask<float>(l);
      detail::add_rows(b, l.n_rows(), l.width(), mask.data());
    } else {
      for (std::size_t i = 0; i < l.n_prompts(); ++i) {
        const auto len = static_cast<std::int64_t>(l.prompt_length()[i]);
        const auto first = static_cast<std::int64_t>(l.first_slot(i));
        b.add_sequence(first, len, 0, len, {{first, len}});
      }
      detail::mark_idle(b);
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
      if (output_slots[k] < 0 || static_cast<std::size_t>(output_slots[k]) >= slots) {
        prepack::detail::fail("output slot ", k, ": ", output_slots[k], " outside ", slots,
                              " slots");
      }
    }
    detail::batch b = detail::rows_batch(cfg_, slots, tokens, positions, span<const Index>());
    for (std::size_t s = 0; s < slots; ++s) b.slot[s] = static_cast<std::int64_t>(s);
    detail::add_rows(b, n_rows, width, mask.data());
    for (Index s : output_slots) b.outputs.push_back(static_cast<std::size_t>(s));
    return packed_prefill(b, n_rows, width, opt);
  }

  /// One step over a paged pool: the step's sequences attend to their cached context (read
  /// through their block tables) and their own causal block; their K and V are written into the
  /// pool through the slot mapping; the logits of the tokens flagged in `in.logits` come back.
  /// Throws prepack::error, writing nothing, if the inputs disagree with themselves (sizes,
  /// cumulative lengths, positions not context + i), with the pool (block size, block count) or
  /// with the model (token ids), a block table is too short for context + query or names a
  /// block outside the pool, a token's slot is not where its block table puts its position, a
  /// block is written by two sequences or written by one while another reads it as context, or
  /// a sequence's context is not cached in the pool. Cost besides the compute: O(step tokens +
  /// blocks the step touches x log of them), whatever the pool's size.
  template <class Token, class Index>
  step_result forward(const step_inputs<Token, Index>& in, kv_pool& pool,
                      const exec_options& opt = {}) const {
    detail::batch b = detail::step_batch(cfg_, in, pool);
    return pool_forward(b, pool, opt, [&](std::size_t t) {
      const auto it =
          std::upper_bound(in.cu_seqlens_q.begin(), in.cu_seqlens_q.end(), static_cast<Index>(t));
      return static_cast<std::size_t>(it - in.cu_seqlens_q.begin()) - 1;
    });
  }

  /// A step laid out as rows (make_step_layout) over a paged pool: as above, pad slots
  /// computed but neither written nor attended.
  template <class Token, class Index>
  step_result forward(const step_layout<Token, Index>& s, kv_pool& pool,
                      const exec_options& opt = {}) const {
    detail::batch b = detail::rows_step_batch(cfg_, s, pool);
    const auto& l = s.layout;
    return pool_forward(b, pool, opt, [&](std::size_t slot) {
      return static_cast<std::size_t>(l.segments()[slot]);
    });
  }

  /// What prefill() would allocate: see estimate_prefill_memory.
  memory_stats estimate_memory(std::size_t n_rows, std::size_t width, std::size_t n_prompts,
                               std::size_t longest, attention path, int n_threads = 0,
                               gemm_backend backend = gemm_backend::automatic) const;

 private:
  // One decoder layer, prepared: the norms' weights folded into the projections they feed.
  struct layer {
    linear qkv;       // [hidden][q_dim + 2 kv_dim]  diag(attn_norm) [wq | wk | wv]
    vector qkv_bias;  // [q_dim + 2 kv_dim]          [bq | bk | bv], empty without biases
    vector q_norm;    // [head_dim]                  per-head Q and K RMSNorm weights (Qwen3),
    vector k_norm;    // [head_dim]                  empty without
    linear o;         // [q_dim][hidden]
    linear gate_up;   // [hidden][2 ffn]             diag(mlp_norm) [w_gate | w_up]
    linear down;      // [ffn][hidden]
  };

  void prepare(weight_source& src) {
    const config& c = cfg_;
    const weight_type wt = opt_.weights;
    const gemm_backend lay = opt_.layout;
    const bool int8 = opt_.activations == activation_type::int8;
    // The embedding (and an untied LM head) as stored where the source holds them quantized: a
    // row decoded per token, and the head's rows decoded a panel at a time like a projection.
    quantized_matrix embed_q = src.embed_quantized();
    matrix embed;
    if (embed_q.empty()) {
      embed = src.embed();
      detail::check_shape(embed, c.vocab, c.hidden, "embed");
    } else {
      prepack::detail::require(embed_q.rows == c.vocab && embed_q.cols == c.hidden,
                               "weights: embed (", embed_q.type_name(), ") is ", embed_q.rows,
                               " x ", embed_q.cols, " rows, expected ", c.vocab, " x ", c.hidden);
    }
    for (int li = 0; li < c.n_layers; ++li) {
      layer_weights lw = src.layer(li);
      check_layer(c, lw, static_cast<std::size_t>(li));
      layer L;
      quantized_projections& q = lw.quantized;
      // Held quantized where the source hands a projection so: the fused layers take their
      // pieces as rows (an fp32 piece beside quantized ones as F32 rows), and the norm's weight
      // scales their input instead of being folded into rows that cannot absorb it exactly.
      const auto rows = [](matrix& m, quantized_matrix& qm) {
        quantized_matrix out = qm.empty() ? quantized_matrix::from_fp32(m) : std::move(qm);
        m = matrix();
        return out;
      };
      if (!q.wq.empty() || !q.wk.empty() || !q.wv.empty()) {
        std::vector<quantized_matrix> seg;
        seg.push_back(rows(lw.wq, q.wq));
        seg.push_back(rows(lw.wk, q.wk));
        seg.push_back(rows(lw.wv, q.wv));
        L.qkv = linear(std::move(seg), lw.attn_norm, int8);
      } else {
        matrix qkv(c.hidden, c.q_dim() + 2 * c.kv_dim());
        qkv << lw.wq, lw.wk, lw.wv;
        lw.wq = lw.wk = lw.wv = matrix();               // the pieces go as each fused layer is made
        qkv.array().colwise() *= lw.attn_norm.array();  // diag(attn_norm) qkv, in place
        L.qkv = linear(std::move(qkv), false, wt, lay);
      }
      if (c.qkv_bias) {
        L.qkv_bias.resize(c.q_dim() + 2 * c.kv_dim());
        L.qkv_bias << lw.bq, lw.bk, lw.bv;
      }
      L.q_norm = std::move(lw.q_norm);
      L.k_norm = std::move(lw.k_norm);
      L.o = q.wo.empty() ? linear(std::move(lw.wo), false, wt, lay)
                         : linear(std::vector<quantized_matrix>{std::move(q.wo)}, vector(), int8);
      if (!q.w_gate.empty() || !q.w_up.empty()) {
        std::vector<quantized_matrix> seg;
        seg.push_back(rows(lw.w_gate, q.w_gate));
        seg.push_back(rows(lw.w_up, q.w_up));
        L.gate_up = linear(std::move(seg), lw.mlp_norm, int8);
      } else {
        matrix gu(c.hidden, 2 * c.ffn);
        gu << lw.w_gate, lw.w_up;
        lw.w_gate = lw.w_up = matrix();
        gu.array().colwise() *= lw.mlp_norm.array();
        L.gate_up = linear(std::move(gu), false, wt, lay);
      }
      L.down = q.w_down.empty()
                   ? linear(std::move(lw.w_down), false, wt, lay)
                   : linear(std::vector<quantized_matrix>{std::move(q.w_down)}, vector(), int8);
      for (const linear* x : {&L.qkv, &L.o, &L.gate_up, &L.down}) {
        for (const quantized_matrix& m : x->quantized_segments()) ++quantized_types_[m.type_name()];
      }
      layers_.push_back(std::move(L));
    }
    final_norm_ = src.final_norm();
    detail::check_shape(final_norm_, c.hidden, "final_norm");
    quantized_matrix head_q = c.tied_embeddings ? quantized_matrix() : src.lm_head_quantized();
    matrix head;
    if (head_q.empty()) {
      head = src.lm_head();
      check_lm_head(c, head);
    } else {
      prepack::detail::require(head_q.rows == c.vocab && head_q.cols == c.hidden,
                               "weights: lm_head (", head_q.type_name(), ") is ", head_q.rows,
                               " x ", head_q.cols, " rows, expected ", c.vocab, " x ", c.hidden);
    }
    for (const quantized_matrix* m : {&embed_q, &head_q}) {
      if (!m->empty()) ++quantized_types_[m->type_name()];
    }
    // The LM head runs over a few rows per batch: fp32 (or as stored). Tied: one matrix serves
    // both (the embedding reads its rows).
    if (c.tied_embeddings && !embed_q.empty()) {
      lm_head_ = linear(std::vector<quantized_matrix>{std::move(embed_q)}, vector(), int8);
    } else if (c.tied_embeddings) {
      lm_head_ = linear(std::move(embed), true, weight_type::f32, gemm_backend::eigen);
    } else {
      if (embed_q.empty()) {
        embed_ = std::move(embed);
      } else {
        embed_q_ = std::move(embed_q);
      }
      lm_head_ = head_q.empty()
                     ? linear(std::move(head), false, weight_type::f32, lay)
                     : linear(std::vector<quantized_matrix>{std::move(head_q)}, vector(), int8);
    }
    const auto count = [this](const linear& x) {
      if (!x.quantized()) return;
      ++int8_layers_.second;
      if (x.int8_activations()) ++int8_layers_.first;
    };
    for (const layer& L : layers_) {
      for (const linear* x : {&L.qkv, &L.o, &L.gate_up, &L.down}) count(*x);
    }
    count(lm_head_);
  }

  // Token `token`'s embedding into out[hidden]: a row of the fp32 table, or decoded from the
  // rows held as stored.
  void embedding(std::int32_t token, float* out) const noexcept {
    const quantized_matrix* q = cfg_.tied_embeddings && lm_head_.quantized()
                                    ? &lm_head_.quantized_segments()[0]
                                    : (embed_q_.empty() ? nullptr : &embed_q_);
    if (q != nullptr) {
      q->decode_rows(token, 1, out);
      return;
    }
    const matrix& e = cfg_.tied_embeddings ? lm_head_.weights() : embed_;
    std::copy_n(e.data() + static_cast<std::size_t>(token) * static_cast<std::size_t>(cfg_.hidden),
                cfg_.hidden, out);
  }

  // The forward pass over a packed batch whose K and V go into the result's own buffers.
  prefill_result packed_prefill(const detail::batch& b, std::size_t n_rows, std::size_t width,
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
    const detail::kv_store store{r.keys.data(), r.values.data(), per_layer, b.n(),
                                 2 * total * sizeof(float)};
    r.logits = forward_pass(b, store, opt, r.memory, r.profile);
    return r;
  }

  // The forward pass over a pool; records the positions written once it is done.
  template <class SeqOf>
  step_result pool_forward(const detail::batch& b, kv_pool& pool, const exec_options& opt,
                           SeqOf&& seq_of) const {
    const detail::kv_store store{pool.keys(0), pool.values(0), pool.n_slots() * pool.kv_dim(),
                                 pool.n_slots(), pool.bytes()};
    step_result r;
    r.logits = forward_pass(b, store, opt, r.memory, r.profile);
    for (std::size_t t = 0; t < b.n(); ++t) {
      if (b.slot[t] >= 0) pool.record_write(static_cast<std::size_t>(b.slot[t]), b.pos[t]);
    }
    for (std::size_t k : b.outputs) {
      r.output_token.push_back(k);
      r.output_seq.push_back(seq_of(k));
    }
    return r;
  }

  // The transformer over a batch: the layer as a list of named steps.
  matrix forward_pass(const detail::batch& b, const detail::kv_store& store,
                      const exec_options& opt, memory_stats& memory,
                      prefill_profile& profile) const {
    const auto t_start = detail::clock::now();
    const detail::thread_scope threads(opt.n_threads);
    const gemm_backend backend = resolve(opt.backend);
    const std::lock_guard<std::mutex> guard(work_.lock);
    detail::workspace& w = work_.work;
    w.reserve(cfg_, b.n(), b.outputs.size(), b.max_pos(), threads.n());
    memory = detail::total_memory(
        store.bytes,
        w.bytes(cfg_, b.n(), b.outputs.size(), b.max_pos(), threads.n(), opt_.weights, backend,
                opt_.layout, quantized(), int8_activations()),
        b.mask_bytes);
    detail::pass p(w, cfg_, b, threads.n(), backend);
    const Eigen::Index hidden = cfg_.hidden, ffn = cfg_.ffn, q_dim = cfg_.q_dim();
    embed(p, b);
    for (int li = 0; li < cfg_.n_layers; ++li) {
      const layer& L = layers_[static_cast<std::size_t>(li)];
      // Attention block: norm, fused Q K V, RoPE and the KV write, attention, output projection
      // added to the residual stream.
      norm_scales(p);
      p.linear(L.qkv, p.n, p.h.data(), hidden, p.qkv.data(), p.qkv.cols(), false);
      qkv_epilogue(p, L, b, store.layer_keys(li), store.layer_values(li));
      attend(p, b, store.layer_keys(li), store.layer_values(li));
      p.linear(L.o, p.n, p.att.data(), q_dim, p.h.data(), hidden, true);
      // MLP block: norm, fused gate | up, SwiGLU, down projection added to the residual stream.
      norm_scales(p);
      p.linear(L.gate_up, p.n, p.h.data(), hidden, p.gu.data(), 2 * ffn, false);
      swiglu_rows(p);
      p.linear(L.down, p.n, p.gu.data(), 2 * ffn, p.h.data(), hidden, true);
    }
    matrix logits = lm_head_rows(p, b);
    profile.linear_flops = p.linear_flops;
    profile.attention_flops = p.attention_flops;
    profile.seconds_linear = p.seconds_linear;
    profile.seconds_attention = p.seconds_attention;
    profile.n_threads = p.n_threads;
    profile.backend = p.backend;
    profile.seconds_total = std::chrono::duration<double>(detail::clock::now() - t_start).count();
    return logits;
  }

  // h = the embedding of every row's token.
  void embed(detail::pass& p, const detail::batch& b) const {
    for (Eigen::Index t = 0; t < p.n; ++t) {
      embedding(b.token[static_cast<std::size_t>(t)], p.h.row(t).data());
    }
  }

  // scale[t] = RMSNorm's 1 / rms of row t of the residual stream (the norm's weight is folded
  // into the next projection).
  void norm_scales(detail::pass& p) const {
    const Eigen::Index n = p.n;
    PREPACK_OMP(parallel for num_threads(p.n_threads) schedule(static))
    for (Eigen::Index t = 0; t < n; ++t) {
      p.scale[t] =
          detail::rms_scale(p.h.row(t).data(), static_cast<std::size_t>(p.h.cols()), cfg_.rms_eps);
    }
  }

  // Per row of the fused projection: the norm's scale, the biases, each Q and K head's own
  // RMSNorm (Qwen3), RoPE on every Q and K head, then the row's K and V into the store at its
  // slot.
  void qkv_epilogue(detail::pass& p, const layer& L, const detail::batch& b, float* keys,
                    float* values) const {
    const Eigen::Index n = p.n, q_dim = cfg_.q_dim(), kv_dim = cfg_.kv_dim(),
                       qkv_dim = q_dim + 2 * kv_dim, hd = cfg_.head_size();
    const int rope_heads = cfg_.n_heads + cfg_.n_kv_heads;
    const detail::rope_table& rope = p.work->rope();
    PREPACK_OMP(parallel for num_threads(p.n_threads) schedule(static))
    for (Eigen::Index t = 0; t < n; ++t) {
      float* row = p.qkv.row(t).data();
      Eigen::Map<Eigen::ArrayXf> r(row, qkv_dim);
      r *= p.scale[t];
      if (L.qkv_bias.size() > 0) r += L.qkv_bias.array();
      if (L.q_norm.size() > 0) {
        for (int head = 0; head < rope_heads; ++head) {
          float* x = row + head * hd;
          const vector& w = head < cfg_.n_heads ? L.q_norm : L.k_norm;
          const float s = detail::rms_scale(x, static_cast<std::size_t>(hd), cfg_.rms_eps);
          Eigen::Map<Eigen::ArrayXf>(x, hd) *= s * w.array();
        }
      }
      const std::int64_t pos = b.pos[static_cast<std::size_t>(t)];
      for (int head = 0; head < rope_heads; ++head) detail::rope(row + head * hd, rope, pos);
      const std::int64_t slot = b.slot[static_cast<std::size_t>(t)];
      if (slot >= 0) {
        const std::size_t at = static_cast<std::size_t>(slot) * static_cast<std::size_t>(kv_dim);
        std::copy(row + q_dim, row + q_dim + kv_dim, keys + at);
        std::copy(row + q_dim + kv_dim, row + qkv_dim, values + at);
      }
    }
  }

  // att = attention of every sequence over its keys (its context from the store, then its
  // own), task by task; idle rows (pad slots) are zero.
  void attend(detail::pass& p, const detail::batch& b, const float* keys,
              const float* values) const {
    for (std::size_t r : b.idle) p.att.row(static_cast<Eigen::Index>(r)).setZero();
    p.io.keys = keys;
    p.io.values = values;
    const auto n_tasks = static_cast<std::int64_t>(p.tasks.size());
    double flops = 0;
    p.seconds_attention += detail::timed([&] {
      PREPACK_OMP(parallel for num_threads(p.n_threads) schedule(dynamic, 1) reduction(+ : flops))
      for (std::int64_t k = 0; k < n_tasks; ++k) {
        flops += detail::attend(p.io, p.tasks[static_cast<std::size_t>(k)],
                                p.work->scratch(detail::thread_id()));
      }
    });
    p.attention_flops += flops;
  }

  // gate <- silu(gate * s) * (up * s) per row (s: the row's norm scale).
  void swiglu_rows(detail::pass& p) const {
    const Eigen::Index n = p.n, ffn = cfg_.ffn;
    PREPACK_OMP(parallel for num_threads(p.n_threads) schedule(static))
    for (Eigen::Index t = 0; t < n; ++t) {
      float* row = p.gu.row(t).data();
      detail::swiglu(row, row + ffn, p.scale[t], static_cast<std::size_t>(ffn));
    }
  }

  // The final norm and the LM head over the rows whose logits are wanted only.
  matrix lm_head_rows(detail::pass& p, const detail::batch& b) const {
    const Eigen::Index hidden = cfg_.hidden;
    const auto n_out = static_cast<Eigen::Index>(b.outputs.size());
    auto last = p.work->last(n_out, hidden);
    auto logits = p.work->logits(n_out, cfg_.vocab);
    for (Eigen::Index i = 0; i < n_out; ++i) {
      const auto row = p.h.row(static_cast<Eigen::Index>(b.outputs[static_cast<std::size_t>(i)]));
      const float s = detail::rms_scale(row.data(), static_cast<std::size_t>(hidden), cfg_.rms_eps);
      last.row(i) = (row.array() * s * final_norm_.transpose().array()).matrix();
    }
    p.linear(lm_head_, n_out, last.data(), hidden, logits.data(), cfg_.vocab, false);
    return logits;
  }

  config cfg_;
  model_options opt_;
  mutable detail::workspace_slot work_;  // activations kept between passes
  std::vector<layer> layers_;
  std::map<std::string, int> quantized_types_;  // held quantized: matrices of each ggml type
  std::pair<int, int> int8_layers_{0, 0};       // quantized layers dotting int8, and all
  quantized_matrix embed_q_;                    // untied embedding held as stored, or empty
  matrix embed_;       // [vocab][hidden]  (empty when tied: lm_head_ holds it)
  vector final_norm_;  // [hidden]
  linear lm_head_;     // [hidden][vocab], or the embedding [vocab][hidden] transposed
};

/// What a prefill over n_rows x width slots holding n_prompts prompts (the longest `longest`
/// tokens) allocates (prefill_result::memory) with weights of type `weights` laid out for
/// `layout` (model_options::layout), multiplied on `backend`, or held quantized (`quantized`,
/// model::quantized(); `int8_activations`, model::int8_activations()), from shapes alone, with the
/// forward pass's own accounting and without changing any thread setting. Throws prepack::error if
/// a size overflows size_t, c is invalid, or n_threads < 0.
inline memory_stats estimate_prefill_memory(const config& c, std::size_t n_rows, std::size_t width,
                                            std::size_t n_prompts, std::size_t longest,
                                            attention path, int n_threads = 0,
                                            weight_type weights = weight_type::f32,
                                            gemm_backend backend = gemm_backend::automatic,
                                            gemm_backend layout = gemm_backend::automatic,
                                            bool quantized = false, bool int8_activations = false) {
  c.validate();
  const std::size_t slots = prepack::detail::mul(n_rows, width, "batch slots");
  detail::workspace w;  // counts, allocates nothing
  const auto work =
      w.bytes(c, slots, n_prompts,
              static_cast<std::int64_t>(path == attention::dense ? width : longest) - 1,
              threads_for(n_threads), weights, backend, layout, quantized, int8_activations);
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
                                           attention path, int n_threads,
                                           gemm_backend backend) const {
  return estimate_prefill_memory(cfg_, n_rows, width, n_prompts, longest, path, n_threads,
                                 opt_.weights, backend, opt_.layout, quantized(),
                                 int8_activations());
}

}  // namespace reference
PREPACK_NAMESPACE_END
