// prepack/reference/weights.hpp - the reference model's hyper-parameters and parameters in
// their semantic (Hugging Face) form: one matrix per projection, [in][out] (the transpose of
// torch.nn.Linear.weight). Checkpoint loaders produce this form; the model prepares its own
// (fused, folded) copy from it once.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../detail/random.hpp"
#include "../error.hpp"
#include "matrix.hpp"
#include "quantized.hpp"

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
  int pad_id = 0;                // token id of pad slots; must be < vocab
  bool qkv_bias = false;         // Q, K and V projections have biases (Qwen2)
  bool tied_embeddings = false;  // the LM head is the token embedding (no lm_head matrix)
  bool qk_norm = false;          // each Q and K head RMS-normalised before RoPE (Qwen3)
  // RoPE frequency i is theta^(-2i / rotary_dim) / rope_freq_factors[i]: empty for plain RoPE,
  // [rotary_dim / 2] divisors for scaled RoPE (Llama 3's rope_freqs, linear scaling: all equal
  // to the factor). rope_factors_llama3 and rope_factors_linear compute them from a config's
  // rope_scaling.
  std::vector<double> rope_freq_factors;

  int head_size() const noexcept {
    return head_dim > 0 ? head_dim : (n_heads > 0 ? hidden / n_heads : 0);
  }
  int q_dim() const noexcept { return n_heads * head_size(); }
  int kv_dim() const noexcept { return n_kv_heads * head_size(); }
  /// Features rotated by RoPE: the head size rounded down to even; an odd last feature passes.
  int rotary_dim() const noexcept { return head_size() & ~1; }
  /// Parameters of a model of this shape.
  double n_params() const noexcept {
    const double h = hidden, q = q_dim(), kv = kv_dim();
    const double per_layer =
        2 * h + (qkv_bias ? q + 2 * kv : 0) + (qk_norm ? 2.0 * head_size() : 0);
    return embedding_params() + h + n_layers * per_layer + projection_params();
  }
  /// Weights of the layers' projections (Q, K, V, O, gate, up, down): what --bf16 halves.
  double projection_params() const noexcept {
    const double h = hidden, q = q_dim(), kv = kv_dim(), f = ffn;
    return n_layers * (h * (q + 2 * kv) + q * h + 3 * h * f);
  }
  /// Weights of the embedding and the LM head (one matrix when tied): always fp32.
  double embedding_params() const noexcept {
    return (tied_embeddings ? 1.0 : 2.0) * static_cast<double>(vocab) * hidden;
  }

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
    require(rope_freq_factors.empty() ||
                rope_freq_factors.size() == static_cast<std::size_t>(rotary_dim() / 2),
            "config: ", rope_freq_factors.size(), " rope_freq_factors, expected 0 or ",
            rotary_dim() / 2, " (rotary_dim / 2)");
    for (std::size_t i = 0; i < rope_freq_factors.size(); ++i) {
      require(rope_freq_factors[i] > 0 && std::isfinite(rope_freq_factors[i]),
              "config: rope_freq_factors[", i, "] = ", rope_freq_factors[i]);
    }
  }
};

/// One decoder layer's parameters; shapes in [rows][cols].
struct layer_weights {
  vector attn_norm;   // [hidden]
  matrix wq;          // [hidden][n_heads * head_dim]
  matrix wk;          // [hidden][n_kv_heads * head_dim]
  matrix wv;          // [hidden][n_kv_heads * head_dim]
  vector bq, bk, bv;  // [q_dim], [kv_dim], [kv_dim]  only with config::qkv_bias
  vector q_norm;      // [head_dim]  only with config::qk_norm: every Q head's RMSNorm weight
  vector k_norm;      // [head_dim]  and every K head's
  matrix wo;          // [n_heads * head_dim][hidden]
  vector mlp_norm;    // [hidden]
  matrix w_gate;      // [hidden][ffn]
  matrix w_up;        // [hidden][ffn]
  matrix w_down;      // [ffn][hidden]
  // Projections handed over in a checkpoint's own encoding (checkpoint::open with
  // hold_quantized): each non-empty one stands in for the fp32 matrix of its name, which is
  // then empty, and holds [out][in] rows (the transpose of the shapes above).
  quantized_projections quantized;
};

struct weights {
  matrix embed;                       // [vocab][hidden]
  std::vector<layer_weights> layers;  // [n_layers]
  vector final_norm;                  // [hidden]
  matrix lm_head;                     // [hidden][vocab]  empty with config::tied_embeddings
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

inline vector random_vector(rng& g, int n, float center, float spread) {
  vector v(n);
  for (Eigen::Index i = 0; i < n; ++i) v[i] = center + g.symmetric(spread);
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

/// Throws prepack::error naming the first parameter of layer l whose shape disagrees with c.
inline void check_layer(const config& c, const layer_weights& lw, std::size_t l) {
  const std::string p = "layers[" + std::to_string(l) + "].";
  const quantized_projections& q = lw.quantized;
  // A projection is either fp32 [in][out] or quantized [out][in] rows, never both.
  const auto proj = [&](const matrix& m, const quantized_matrix& qm, int in, int out,
                        const char* name) {
    if (qm.empty()) {
      detail::check_shape(m, in, out, p + name);
      return;
    }
    detail::check_shape(m, 0, 0, p + name + " (held quantized)");
    prepack::detail::require(qm.rows == out && qm.cols == in, "weights: ", p, name, " (",
                             qm.type_name(), ") is ", qm.rows, " x ", qm.cols, " rows, expected ",
                             out, " x ", in);
  };
  detail::check_shape(lw.attn_norm, c.hidden, p + "attn_norm");
  proj(lw.wq, q.wq, c.hidden, c.q_dim(), "wq");
  proj(lw.wk, q.wk, c.hidden, c.kv_dim(), "wk");
  proj(lw.wv, q.wv, c.hidden, c.kv_dim(), "wv");
  detail::check_shape(lw.bq, c.qkv_bias ? c.q_dim() : 0, p + "bq");
  detail::check_shape(lw.bk, c.qkv_bias ? c.kv_dim() : 0, p + "bk");
  detail::check_shape(lw.bv, c.qkv_bias ? c.kv_dim() : 0, p + "bv");
  detail::check_shape(lw.q_norm, c.qk_norm ? c.head_size() : 0, p + "q_norm");
  detail::check_shape(lw.k_norm, c.qk_norm ? c.head_size() : 0, p + "k_norm");
  proj(lw.wo, q.wo, c.q_dim(), c.hidden, "wo");
  detail::check_shape(lw.mlp_norm, c.hidden, p + "mlp_norm");
  proj(lw.w_gate, q.w_gate, c.hidden, c.ffn, "w_gate");
  proj(lw.w_up, q.w_up, c.hidden, c.ffn, "w_up");
  proj(lw.w_down, q.w_down, c.ffn, c.hidden, "w_down");
}

/// Throws prepack::error naming the LM head if its shape disagrees with c (empty when tied).
inline void check_lm_head(const config& c, const matrix& lm_head) {
  if (c.tied_embeddings) {
    detail::check_shape(lm_head, 0, 0, "lm_head (tied to embed)");
  } else {
    detail::check_shape(lm_head, c.hidden, c.vocab, "lm_head");
  }
}

/// Throws prepack::error naming the first parameter whose shape disagrees with c.
inline void check_weights(const config& c, const weights& w) {
  c.validate();
  detail::check_shape(w.embed, c.vocab, c.hidden, "embed");
  prepack::detail::require(w.layers.size() == static_cast<std::size_t>(c.n_layers),
                           "weights: ", w.layers.size(), " layers, config has ", c.n_layers);
  for (std::size_t l = 0; l < w.layers.size(); ++l) check_layer(c, w.layers[l], l);
  detail::check_shape(w.final_norm, c.hidden, "final_norm");
  check_lm_head(c, w.lm_head);
}

/// A model's weights handed over a piece at a time, each piece asked for once and in this
/// order: embed_quantized then (if that is empty) embed, layer(0) .. layer(n_layers - 1),
/// final_norm, then (untied) lm_head_quantized and (if that is empty) lm_head; tied, lm_head
/// (an empty matrix). A model built from a source holds at most one layer in this fp32 form
/// besides its prepared weights, so a model with bf16 projections never holds its fp32 weights
/// whole. Errors are the source's own (a checkpoint's names the file and tensor).
class weight_source {
 public:
  virtual ~weight_source() = default;
  /// The embedding as a checkpoint stores it ([vocab][hidden] rows), asked for before embed();
  /// empty (the default) for sources that hand it over in fp32, and then embed() is asked.
  virtual quantized_matrix embed_quantized() { return {}; }
  /// The untied LM head as stored ([vocab][hidden] rows), asked for before lm_head(); empty (the
  /// default): lm_head() is asked.
  virtual quantized_matrix lm_head_quantized() { return {}; }
  virtual matrix embed() = 0;
  virtual layer_weights layer(int l) = 0;
  virtual vector final_norm() = 0;
  virtual matrix lm_head() = 0;
};

/// The source over weights already whole in memory: each piece is moved out as it is asked for.
class held_weights final : public weight_source {
 public:
  explicit held_weights(weights w) : w_(std::move(w)) {}
  matrix embed() override { return std::move(w_.embed); }
  layer_weights layer(int l) override {
    return std::move(w_.layers.at(static_cast<std::size_t>(l)));
  }
  vector final_norm() override { return std::move(w_.final_norm); }
  matrix lm_head() override { return std::move(w_.lm_head); }

 private:
  weights w_;
};

/// The weights random_weights returns, generated a piece at a time as they are asked for.
/// Validates c first.
class random_source final : public weight_source {
 public:
  random_source(const config& c, std::uint64_t seed) : c_(c), g_(seed) { c_.validate(); }
  matrix embed() override { return detail::random_matrix(g_, c_.vocab, c_.hidden, 1.0); }
  layer_weights layer(int) override {
    const config& c = c_;
    const double residual = 1.0 / std::sqrt(2.0 * c.n_layers);
    layer_weights lw;
    lw.attn_norm = detail::random_vector(g_, c.hidden, 1.0f, 0.1f);
    lw.wq = detail::random_matrix(g_, c.hidden, c.q_dim(), 1.0 / std::sqrt(c.hidden));
    lw.wk = detail::random_matrix(g_, c.hidden, c.kv_dim(), 1.0 / std::sqrt(c.hidden));
    lw.wv = detail::random_matrix(g_, c.hidden, c.kv_dim(), 1.0 / std::sqrt(c.hidden));
    if (c.qkv_bias) {
      lw.bq = detail::random_vector(g_, c.q_dim(), 0.0f, 0.5f);
      lw.bk = detail::random_vector(g_, c.kv_dim(), 0.0f, 0.5f);
      lw.bv = detail::random_vector(g_, c.kv_dim(), 0.0f, 0.5f);
    }
    if (c.qk_norm) {
      lw.q_norm = detail::random_vector(g_, c.head_size(), 1.0f, 0.3f);
      lw.k_norm = detail::random_vector(g_, c.head_size(), 1.0f, 0.3f);
    }
    lw.wo = detail::random_matrix(g_, c.q_dim(), c.hidden, residual / std::sqrt(c.q_dim()));
    lw.mlp_norm = detail::random_vector(g_, c.hidden, 1.0f, 0.1f);
    lw.w_gate = detail::random_matrix(g_, c.hidden, c.ffn, 1.0 / std::sqrt(c.hidden));
    lw.w_up = detail::random_matrix(g_, c.hidden, c.ffn, 1.0 / std::sqrt(c.hidden));
    lw.w_down = detail::random_matrix(g_, c.ffn, c.hidden, residual / std::sqrt(c.ffn));
    return lw;
  }
  vector final_norm() override {
    // Tied, the head is embed^T: a larger norm weight gives the logits the untied head's scale.
    return c_.tied_embeddings ? detail::random_vector(g_, c_.hidden, 4.0f, 0.4f)
                              : detail::random_vector(g_, c_.hidden, 1.0f, 0.1f);
  }
  matrix lm_head() override {
    if (c_.tied_embeddings) return matrix();
    return detail::random_matrix(g_, c_.hidden, c_.vocab, 4.0 / std::sqrt(c_.hidden));
  }

 private:
  config c_;
  detail::rng g_;
};

/// Every piece of a source, whole, checked against c. Throws what the source throws, or
/// prepack::error naming the first parameter whose shape disagrees with c.
inline weights collect(const config& c, weight_source& src) {
  c.validate();
  weights w;
  w.embed = src.embed();
  for (int l = 0; l < c.n_layers; ++l) w.layers.push_back(src.layer(l));
  w.final_norm = src.final_norm();
  w.lm_head = src.lm_head();
  check_weights(c, w);
  return w;
}

/// Deterministic weights from a seed, scaled so activations keep a unit scale through many
/// layers: projections have standard deviation 1/sqrt(fan_in), the residual branches' output
/// projections a further 1/sqrt(2 n_layers); the LM head is scaled up so greedy choices are
/// decisive (with tied embeddings the embedding is, and the hidden state is scaled instead by
/// the final norm). Throws prepack::error if c is invalid.
inline weights random_weights(const config& c, std::uint64_t seed) {
  random_source src(c, seed);
  return collect(c, src);
}

/// The RoPE frequency divisors of Llama 3's scaling (Hugging Face's rope_type "llama3":
/// factor, low_freq_factor, high_freq_factor, original_max_position_embeddings), for a model of
/// rotary_dim features and base theta: wavelengths longer than original / low_freq_factor are
/// stretched by factor, shorter than original / high_freq_factor kept, and those between
/// interpolated smoothly. Throws prepack::error for a value outside its domain.
inline std::vector<double> rope_factors_llama3(int rotary_dim, double theta, double factor,
                                               double low_freq_factor, double high_freq_factor,
                                               double original_max_positions) {
  using prepack::detail::require;
  require(rotary_dim >= 2 && theta > 1.0, "rope_scaling llama3: rotary_dim ", rotary_dim,
          ", theta ", theta);
  require(factor >= 1.0 && std::isfinite(factor), "rope_scaling llama3: factor ", factor);
  require(
      low_freq_factor > 0 && high_freq_factor > low_freq_factor && std::isfinite(high_freq_factor),
      "rope_scaling llama3: low_freq_factor ", low_freq_factor, ", high_freq_factor ",
      high_freq_factor, " (need 0 < low < high)");
  require(original_max_positions > 0 && std::isfinite(original_max_positions),
          "rope_scaling llama3: original_max_position_embeddings ", original_max_positions);
  const double pi = 3.14159265358979323846;
  const double low_wavelen = original_max_positions / low_freq_factor;
  const double high_wavelen = original_max_positions / high_freq_factor;
  std::vector<double> out(static_cast<std::size_t>(rotary_dim / 2));
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double inv_freq = std::pow(theta, -2.0 * static_cast<double>(i) / rotary_dim);
    const double wavelen = 2 * pi / inv_freq;
    if (wavelen < high_wavelen) {
      out[i] = 1.0;
    } else if (wavelen > low_wavelen) {
      out[i] = factor;
    } else {
      const double smooth = (original_max_positions / wavelen - low_freq_factor) /
                            (high_freq_factor - low_freq_factor);
      // inv_freq' = (1 - smooth) inv_freq / factor + smooth inv_freq
      out[i] = 1.0 / ((1 - smooth) / factor + smooth);
    }
  }
  return out;
}

/// Linear RoPE scaling (positions divided by factor): every frequency divided by it.
inline std::vector<double> rope_factors_linear(int rotary_dim, double factor) {
  prepack::detail::require(factor > 0 && std::isfinite(factor), "rope_scaling linear: factor ",
                           factor);
  return std::vector<double>(static_cast<std::size_t>(std::max(rotary_dim / 2, 0)), factor);
}

/// Bytes of the weights of a model of config c, its projections held as `projections` (2 bytes a
/// weight for bf16, 4 for fp32) and everything else as fp32, computed without allocating.
inline double weight_bytes(const config& c, weight_type projections = weight_type::f32) {
  const double p = c.projection_params();
  return 4.0 * (c.n_params() - p) + (projections == weight_type::bf16 ? 2.0 : 4.0) * p;
}

}  // namespace reference
PREPACK_NAMESPACE_END
