// prepack/checkpoint/load.hpp - real checkpoints into the reference model: a GGUF file
// (llama.cpp's format; architectures llama, qwen2 and qwen3) or a Hugging Face model directory
// (config.json + model.safetensors, or shards listed in model.safetensors.index.json;
// LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM). Tensors are read one
// at a time from memory-mapped files: dequantized to fp32, or ggml's quantized projections held as
// the file stores them (open with hold_quantized). Link prepack::checkpoint (POSIX;
// nlohmann-json for config.json and safetensors headers; the reference model's weights).
//
// Two conventions differ from the reference model's (Hugging Face's):
//  - ggml's dimension order: a GGUF tensor {in, out} holds torch's [out][in] rows, transposed
//    here to the model's [in][out];
//  - llama.cpp's converter permutes the rows of Q and K of architecture llama so that its
//    interleaved RoPE computes what rotate-half computes on the original rows; the permutation
//    is undone here (qwen2 is converted unpermuted: llama.cpp runs its NEOX, rotate-half, RoPE).
// inspect() reads shapes and types only, so a caller can refuse a model that will not fit before
// converting anything.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "../error.hpp"
#include "../reference/weights.hpp"
#include "gguf.hpp"
#include "mapped_file.hpp"
#include "safetensors.hpp"

PREPACK_NAMESPACE_BEGIN
namespace checkpoint {

/// A checkpoint's description, from its headers alone.
struct info {
  std::string path, name, format, architecture;  // format: "gguf" or "safetensors"
  reference::config cfg;
  std::map<std::string, std::size_t> tensor_types;  // type name -> tensors of that type
  double n_params = 0;                              // parameters in the file
  // The layers' projections a model can hold in the file's own encoding (ggml's quantized
  // blocks: open_options::hold_quantized): their parameters and their bytes in the file.
  double quantized_projection_params = 0, quantized_projection_bytes = 0;
  // The same for the token embedding and an untied LM head (token_embd, output).
  double quantized_embedding_params = 0, quantized_embedding_bytes = 0;
};

/// How checkpoint::open hands the weights over.
struct open_options {
  /// The layers' projections, the token embedding and the LM head stored in ggml's quantized
  /// blocks (Q4_0 ... Q6_K, IQ4_NL, IQ4_XS) handed over as they are stored
  /// (layer_weights::quantized, weight_source::embed_quantized / lm_head_quantized), for the model
  /// to hold at the file's size and decode inside its GEMMs; false: every tensor dequantized to
  /// fp32 (the form any consumer of layer_weights reads). Plain float types (F32, F16, BF16) are
  /// always widened.
  bool hold_quantized = false;
};

/// Whether a model holds tensors of ggml type t as stored when asked to (a block-quantized type
/// prepack decodes).
inline bool holds_quantized(ggml_type t) noexcept { return ggml::traits(t).quantized; }

/// A loaded checkpoint: its description and its weights in the model's (semantic) form.
struct loaded {
  checkpoint::info info;
  reference::weights weights;
};

namespace detail {

inline std::string file_stem(const std::string& path) {
  std::string s = path;
  while (!s.empty() && s.back() == '/') s.pop_back();
  const auto slash = s.find_last_of('/');
  if (slash != std::string::npos) s = s.substr(slash + 1);
  const auto dot = s.rfind('.');
  return dot == std::string::npos || dot == 0 ? s : s.substr(0, dot);
}

// Undoes llama.cpp's Q/K row permutation on a torch-order [rows][cols] weight (or a bias, cols
// 1) of n_head heads: file row h*d + 2i + j holds original row h*d + j*(d/2) + i.
inline std::vector<float> unpermute_rows(const std::vector<float>& w, std::size_t rows,
                                         std::size_t cols, std::size_t n_head) {
  const std::size_t d = rows / n_head, half = d / 2;
  std::vector<float> out(w.size());
  for (std::size_t h = 0; h < n_head; ++h) {
    for (std::size_t i = 0; i < half; ++i) {
      for (std::size_t j = 0; j < 2; ++j) {
        const std::size_t file = h * d + 2 * i + j, orig = h * d + j * half + i;
        std::copy(w.begin() + static_cast<std::ptrdiff_t>(file * cols),
                  w.begin() + static_cast<std::ptrdiff_t>((file + 1) * cols),
                  out.begin() + static_cast<std::ptrdiff_t>(orig * cols));
      }
    }
    if (d % 2 == 1) {  // an odd head dim's last row stays
      const std::size_t r = h * d + d - 1;
      std::copy(w.begin() + static_cast<std::ptrdiff_t>(r * cols),
                w.begin() + static_cast<std::ptrdiff_t>((r + 1) * cols),
                out.begin() + static_cast<std::ptrdiff_t>(r * cols));
    }
  }
  return out;
}

// A torch-order [rows][cols] buffer as the model's [cols][rows] matrix.
inline reference::matrix transposed(const std::vector<float>& w, std::size_t rows,
                                    std::size_t cols) {
  return Eigen::Map<const reference::matrix>(w.data(), static_cast<Eigen::Index>(rows),
                                             static_cast<Eigen::Index>(cols))
      .transpose();
}

// The tensors of a checkpoint in Hugging Face's naming, whatever its file format: `read` gives
// a tensor's torch-order shape and fp32 values.
struct tensor_source {
  std::string file;  // for messages
  std::function<bool(const std::string&)> has;
  std::function<std::vector<std::uint64_t>(const std::string&)> shape;  // torch order
  std::function<std::vector<float>(const std::string&)> read;
  // A tensor's bytes as stored, where the format keeps ggml's blocks (GGUF; else unset).
  std::function<reference::quantized_matrix(const std::string&)> read_quantized;
  std::function<ggml_type(const std::string&)> type;  // GGUF only
};

inline void expect_shape(const tensor_source& src, const std::string& name,
                         const std::vector<std::uint64_t>& want) {
  prepack::detail::require(src.has(name), src.file, ": tensor ", name, " missing");
  const auto got = src.shape(name);
  if (got != want) {
    std::ostringstream g, w;
    for (auto d : got) g << (g.tellp() > 0 ? " x " : "") << d;
    for (auto d : want) w << (w.tellp() > 0 ? " x " : "") << d;
    prepack::detail::fail(src.file, ": tensor ", name, " is ", g.str(), ", the config says ",
                          w.str());
  }
}

// The weights of Hugging Face-named tensors, read a piece at a time as the model asks for them;
// permuted: undo llama.cpp's Q/K order. Each read checks the tensor's presence and shape.
class tensor_weights final : public reference::weight_source {
 public:
  tensor_weights(const reference::config& c, tensor_source src, bool permuted,
                 bool hold_quantized = false)
      : c_(c), src_(std::move(src)), permuted_(permuted), hold_(hold_quantized) {}

  reference::quantized_matrix embed_quantized() override {
    return held("model.embed_tokens.weight", u(c_.vocab), u(c_.hidden));
  }
  reference::quantized_matrix lm_head_quantized() override {
    return held("lm_head.weight", u(c_.vocab), u(c_.hidden));
  }
  reference::matrix embed() override {
    expect_shape(src_, "model.embed_tokens.weight", {u(c_.vocab), u(c_.hidden)});
    const auto x = src_.read("model.embed_tokens.weight");
    return Eigen::Map<const reference::matrix>(x.data(), c_.vocab, c_.hidden);
  }
  reference::layer_weights layer(int l) override {
    const std::uint64_t h = u(c_.hidden), q = u(c_.q_dim()), kv = u(c_.kv_dim()), f = u(c_.ffn);
    const std::size_t qh = permuted_ ? static_cast<std::size_t>(c_.n_heads) : 0;
    const std::size_t kh = permuted_ ? static_cast<std::size_t>(c_.n_kv_heads) : 0;
    const std::string p = "model.layers." + std::to_string(l) + ".";
    reference::layer_weights lw;
    lw.attn_norm = vec(p + "input_layernorm.weight", h);
    reference::quantized_projections& z = lw.quantized;
    proj(p + "self_attn.q_proj.weight", q, h, qh, lw.wq, z.wq);
    proj(p + "self_attn.k_proj.weight", kv, h, kh, lw.wk, z.wk);
    proj(p + "self_attn.v_proj.weight", kv, h, 0, lw.wv, z.wv);
    if (c_.qkv_bias) {
      lw.bq = bias(p + "self_attn.q_proj.bias", q, qh);
      lw.bk = bias(p + "self_attn.k_proj.bias", kv, kh);
      lw.bv = bias(p + "self_attn.v_proj.bias", kv, 0);
    }
    if (c_.qk_norm) {
      lw.q_norm = vec(p + "self_attn.q_norm.weight", u(c_.head_size()));
      lw.k_norm = vec(p + "self_attn.k_norm.weight", u(c_.head_size()));
    }
    proj(p + "self_attn.o_proj.weight", h, q, 0, lw.wo, z.wo);
    lw.mlp_norm = vec(p + "post_attention_layernorm.weight", h);
    proj(p + "mlp.gate_proj.weight", f, h, 0, lw.w_gate, z.w_gate);
    proj(p + "mlp.up_proj.weight", f, h, 0, lw.w_up, z.w_up);
    proj(p + "mlp.down_proj.weight", h, f, 0, lw.w_down, z.w_down);
    return lw;
  }
  reference::vector final_norm() override { return vec("model.norm.weight", u(c_.hidden)); }
  reference::matrix lm_head() override {
    if (c_.tied_embeddings) return reference::matrix();
    return lin("lm_head.weight", u(c_.vocab), u(c_.hidden), 0);
  }

 private:
  static std::uint64_t u(int v) { return static_cast<std::uint64_t>(v); }
  reference::vector vec(const std::string& name, std::uint64_t n) const {
    expect_shape(src_, name, {n});
    const auto x = src_.read(name);
    return Eigen::Map<const reference::vector>(x.data(), static_cast<Eigen::Index>(n));
  }
  reference::matrix lin(const std::string& name, std::uint64_t out, std::uint64_t in,
                        std::size_t heads) const {
    expect_shape(src_, name, {out, in});
    auto x = src_.read(name);
    if (heads > 0) x = unpermute_rows(x, out, in, heads);
    return transposed(x, out, in);
  }
  // A [rows][cols] tensor as stored when it is held quantized, else empty.
  reference::quantized_matrix held(const std::string& name, std::uint64_t rows,
                                   std::uint64_t cols) const {
    if (!hold_ || !src_.type || !src_.has(name) || !holds_quantized(src_.type(name))) return {};
    expect_shape(src_, name, {rows, cols});
    return src_.read_quantized(name);
  }
  // A projection into m (fp32, the model's [in][out]) or, held quantized, into qm ([out][in]
  // rows as stored, Q/K rows unpermuted the same way).
  void proj(const std::string& name, std::uint64_t out, std::uint64_t in, std::size_t heads,
            reference::matrix& m, reference::quantized_matrix& qm) const {
    if (!hold_ || !src_.type || !holds_quantized(src_.type(name))) {
      m = lin(name, out, in, heads);
      return;
    }
    expect_shape(src_, name, {out, in});
    qm = src_.read_quantized(name);
    if (heads > 0) {
      // unpermute_rows' mapping: file row h*d + 2i + j holds original row h*d + j*(d/2) + i.
      const std::size_t d = static_cast<std::size_t>(out) / heads, half = d / 2;
      std::vector<std::size_t> from(static_cast<std::size_t>(out));
      for (std::size_t r = 0; r < from.size(); ++r) from[r] = r;
      for (std::size_t hh = 0; hh < heads; ++hh) {
        for (std::size_t i = 0; i < half; ++i) {
          for (std::size_t j = 0; j < 2; ++j) from[hh * d + j * half + i] = hh * d + 2 * i + j;
        }
      }
      qm = qm.permuted_rows(from);
    }
  }
  reference::vector bias(const std::string& name, std::uint64_t n, std::size_t heads) const {
    expect_shape(src_, name, {n});
    auto x = src_.read(name);
    if (heads > 0) x = unpermute_rows(x, n, 1, heads);
    return Eigen::Map<const reference::vector>(x.data(), static_cast<Eigen::Index>(n));
  }

  reference::config c_;
  tensor_source src_;
  bool permuted_;
  bool hold_ = false;
};

// GGUF tensor names (and ggml shapes) in Hugging Face's names and torch order.
inline std::string gguf_name(const std::string& hf) {
  static const std::map<std::string, std::string> top{
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"}};
  if (const auto it = top.find(hf); it != top.end()) return it->second;
  static const std::map<std::string, std::string> per{
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"}};
  const std::string prefix = "model.layers.";
  if (hf.rfind(prefix, 0) == 0) {
    const auto dot = hf.find('.', prefix.size());
    const std::string layer = hf.substr(prefix.size(), dot - prefix.size());
    if (const auto it = per.find(hf.substr(dot + 1)); it != per.end()) {
      return "blk." + layer + "." + it->second;
    }
  }
  return hf;
}

struct gguf_source {
  std::shared_ptr<mapped_file> file;
  std::shared_ptr<gguf_file> gguf;
};

inline tensor_source gguf_tensors(const gguf_source& g) {
  tensor_source s;
  s.file = g.file->path();
  s.has = [g](const std::string& hf) { return g.gguf->find(gguf_name(hf)) != nullptr; };
  s.shape = [g](const std::string& hf) {
    const gguf_tensor* t = g.gguf->find(gguf_name(hf));
    return std::vector<std::uint64_t>(t->dims.rbegin(), t->dims.rend());  // ggml -> torch order
  };
  s.read = [g](const std::string& hf) {
    const gguf_tensor* t = g.gguf->find(gguf_name(hf));
    std::vector<float> x(static_cast<std::size_t>(t->elements()));
    g.gguf->read(*t, span<float>(x));
    g.file->release(static_cast<std::size_t>(t->offset), static_cast<std::size_t>(t->bytes));
    return x;
  };
  s.type = [g](const std::string& hf) { return g.gguf->find(gguf_name(hf))->type; };
  s.read_quantized = [g](const std::string& hf) {
    const gguf_tensor* t = g.gguf->find(gguf_name(hf));
    prepack::detail::require(t->dims.size() == 2, g.file->path(), ": tensor ", t->name, " has ",
                             t->dims.size(), " dimensions, a projection 2");
    auto q = reference::quantized_matrix::from_bytes(
        t->type, static_cast<Eigen::Index>(t->dims[1]), static_cast<Eigen::Index>(t->dims[0]),
        g.file->bytes().data() + t->offset, static_cast<std::size_t>(t->bytes),
        g.file->path() + ": tensor " + t->name);
    g.file->release(static_cast<std::size_t>(t->offset), static_cast<std::size_t>(t->bytes));
    return q;
  };
  return s;
}

// Reads a GGUF file's header and its config; `src` keeps the mapping for the weights.
inline info inspect_gguf(const std::string& path, gguf_source& src) {
  using prepack::detail::require;
  src.file = std::make_shared<mapped_file>(path);
  src.gguf = std::make_shared<gguf_file>(src.file->bytes(), path);
  const gguf_file& g = *src.gguf;
  info out;
  out.path = path;
  out.format = "gguf";
  out.architecture = g.text("general.architecture");
  const std::string& a = out.architecture;
  require(a == "llama" || a == "qwen2" || a == "qwen3", path, ": architecture ", a,
          " is not supported (llama, qwen2, qwen3)");
  out.name = g.has("general.name") ? g.text("general.name") : file_stem(path);
  reference::config& c = out.cfg;
  const auto int_of = [&](const std::string& key) {
    const long long v = g.integer(a + "." + key);
    require(v > 0 && v < (1ll << 31), path, ": metadata ", a, ".", key, " = ", v);
    return static_cast<int>(v);
  };
  c.hidden = int_of("embedding_length");
  c.n_layers = int_of("block_count");
  c.n_heads = int_of("attention.head_count");
  c.n_kv_heads =
      g.has(a + ".attention.head_count_kv") ? int_of("attention.head_count_kv") : c.n_heads;
  c.ffn = int_of("feed_forward_length");
  c.head_dim = g.has(a + ".attention.key_length") ? int_of("attention.key_length") : 0;
  c.rope_theta = g.has(a + ".rope.freq_base") ? g.real(a + ".rope.freq_base") : 10000.0;
  c.rms_eps = static_cast<float>(g.real(a + ".attention.layer_norm_rms_epsilon"));
  const gguf_tensor* embd = g.find("token_embd.weight");
  require(embd != nullptr, path, ": tensor token_embd.weight missing");
  require(embd->dims.size() == 2 && embd->dims[1] < (1ull << 31), path,
          ": tensor token_embd.weight has ", embd->dims.size(), " dimensions");
  c.vocab = static_cast<int>(embd->dims[1]);
  if (g.has(a + ".vocab_size")) {
    require(g.integer(a + ".vocab_size") == c.vocab, path, ": metadata ", a, ".vocab_size ",
            g.integer(a + ".vocab_size"), " disagrees with token_embd.weight's ", c.vocab, " rows");
  }
  c.tied_embeddings = g.find("output.weight") == nullptr;
  c.qkv_bias = g.find("blk.0.attn_q.bias") != nullptr;
  c.qk_norm = g.find("blk.0.attn_q_norm.weight") != nullptr;
  require(a != "qwen3" || c.qk_norm, path, ": qwen3 without blk.0.attn_q_norm.weight");
  c.validate();
  if (g.has(a + ".rope.dimension_count")) {
    require(g.integer(a + ".rope.dimension_count") == c.head_size(), path,
            ": rope.dimension_count ", g.integer(a + ".rope.dimension_count"),
            " is not the head dim ", c.head_size(), " (partial rotary is not supported)");
  }
  // Scaled RoPE as llama.cpp applies it: frequency i divided by rope_freqs[i] (Llama 3's
  // factors, a tensor of the file) and by the linear scaling factor (freq_scale = 1 / factor).
  double linear = 1.0;
  if (g.has(a + ".rope.scaling.type")) {
    const std::string& t = g.text(a + ".rope.scaling.type");
    require(t == "none" || t == "linear", path, ": ", a, ".rope.scaling.type ", t,
            " is not supported (none, linear)");
    if (t == "linear") {
      linear = g.real(a + ".rope.scaling.factor");
      require(linear > 0 && std::isfinite(linear), path, ": ", a, ".rope.scaling.factor ", linear);
    }
  }
  const std::size_t half = static_cast<std::size_t>(c.rotary_dim() / 2);
  if (const gguf_tensor* f = g.find("rope_freqs.weight")) {
    require(f->dims.size() == 1 && f->dims[0] == half, path, ": tensor rope_freqs.weight has ",
            f->elements(), " elements, expected ", half, " (head dim / 2)");
    std::vector<float> x(half);
    g.read(*f, span<float>(x));
    for (std::size_t i = 0; i < half; ++i) c.rope_freq_factors.push_back(linear * x[i]);
  } else if (linear != 1.0) {
    c.rope_freq_factors = reference::rope_factors_linear(c.rotary_dim(), linear);
  }
  c.validate();
  require(c.n_layers <= 4096 && c.hidden <= (1 << 20), path, ": absurd shape");
  static const std::vector<std::string> projections{
      ".attn_q.weight",   ".attn_k.weight", ".attn_v.weight",  ".attn_output.weight",
      ".ffn_gate.weight", ".ffn_up.weight", ".ffn_down.weight"};
  for (const gguf_tensor& t : g.tensors()) {
    ++out.tensor_types[ggml_type_name(t.type)];
    out.n_params += static_cast<double>(t.elements());
    const bool projection =
        t.name.rfind("blk.", 0) == 0 &&
        std::any_of(projections.begin(), projections.end(), [&](const std::string& e) {
          return t.name.size() > e.size() &&
                 t.name.compare(t.name.size() - e.size(), e.size(), e) == 0;
        });
    if (projection && holds_quantized(t.type)) {
      out.quantized_projection_params += static_cast<double>(t.elements());
      out.quantized_projection_bytes += static_cast<double>(t.bytes);
    }
    if ((t.name == "token_embd.weight" || t.name == "output.weight") && holds_quantized(t.type)) {
      out.quantized_embedding_params += static_cast<double>(t.elements());
      out.quantized_embedding_bytes += static_cast<double>(t.bytes);
    }
  }
  return out;
}

struct safetensors_source {
  std::vector<std::shared_ptr<mapped_file>> files;
  std::vector<std::shared_ptr<safetensors_file>> parsed;
  std::map<std::string, std::size_t> where;  // tensor -> parsed file
};

inline tensor_source safetensors_tensors(const std::shared_ptr<safetensors_source>& st,
                                         const std::string& dir) {
  tensor_source s;
  s.file = dir;
  s.has = [st](const std::string& n) { return st->where.count(n) != 0; };
  s.shape = [st](const std::string& n) { return st->parsed[st->where.at(n)]->find(n)->shape; };
  s.read = [st](const std::string& n) {
    const safetensors_file& f = *st->parsed[st->where.at(n)];
    const safetensors_tensor* t = f.find(n);
    std::vector<float> x(static_cast<std::size_t>(t->elements()));
    f.read(*t, span<float>(x));
    return x;
  };
  return s;
}

// A JSON file, read through the same checks as a weight file (a regular file; the reason it
// cannot be opened named).
inline nlohmann::json read_json(const std::string& path) {
  const mapped_file f(path);
  const auto b = f.bytes();
  try {
    return nlohmann::json::parse(b.begin(), b.end());
  } catch (const nlohmann::json::exception& e) {
    prepack::detail::fail(path, ": not JSON (", e.what(), ")");
  }
}

inline info inspect_safetensors(const std::string& dir, safetensors_source& src) {
  using prepack::detail::require;
  const std::string cfg_path = dir + "/config.json";
  const nlohmann::json j = read_json(cfg_path);
  require(j.is_object(), cfg_path, ": not a JSON object");
  info out;
  out.path = dir;
  out.format = "safetensors";
  out.name = file_stem(dir);
  std::string arch = j.contains("architectures") && j["architectures"].is_array() &&
                             !j["architectures"].empty() && j["architectures"][0].is_string()
                         ? j["architectures"][0].get<std::string>()
                         : "";
  require(arch == "LlamaForCausalLM" || arch == "MistralForCausalLM" ||
              arch == "Qwen2ForCausalLM" || arch == "Qwen3ForCausalLM",
          cfg_path, ": architecture '", arch,
          "' is not supported (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
          "Qwen3ForCausalLM)");
  out.architecture = arch;
  const auto num = [&](const char* key, bool required, double fallback) {
    if (!j.contains(key) || j[key].is_null()) {
      require(!required, cfg_path, ": ", key, " missing");
      return fallback;
    }
    require(j[key].is_number(), cfg_path, ": ", key, " is not a number");
    return j[key].get<double>();
  };
  const auto count = [&](const char* key, bool required, double fallback) {
    const double v = num(key, required, fallback);
    require(v >= 0 && v < 2147483648.0 && v == static_cast<double>(static_cast<long long>(v)),
            cfg_path, ": ", key, " = ", v);
    return static_cast<int>(v);
  };
  reference::config& c = out.cfg;
  c.hidden = count("hidden_size", true, 0);
  c.n_layers = count("num_hidden_layers", true, 0);
  c.n_heads = count("num_attention_heads", true, 0);
  c.n_kv_heads = count("num_key_value_heads", false, c.n_heads);
  c.ffn = count("intermediate_size", true, 0);
  c.vocab = count("vocab_size", true, 0);
  c.head_dim = count("head_dim", false, 0);
  c.rope_theta = num("rope_theta", false, 10000.0);
  c.rms_eps = static_cast<float>(num("rms_norm_eps", false, 1e-6));
  c.tied_embeddings = j.contains("tie_word_embeddings") && j["tie_word_embeddings"].is_boolean() &&
                      j["tie_word_embeddings"].get<bool>();
  c.qkv_bias = arch == "Qwen2ForCausalLM" ||
               (j.contains("attention_bias") && j["attention_bias"].is_boolean() &&
                j["attention_bias"].get<bool>());
  c.qk_norm = arch == "Qwen3ForCausalLM";
  c.validate();
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    const nlohmann::json& rs = j["rope_scaling"];
    require(rs.is_object(), cfg_path, ": rope_scaling is not an object");
    const char* type_key = rs.contains("rope_type") ? "rope_type" : "type";
    require(rs.contains(type_key) && rs[type_key].is_string(), cfg_path,
            ": rope_scaling has no rope_type");
    const std::string type = rs[type_key].get<std::string>();
    const auto field = [&](const char* key, double fallback) {
      if (!rs.contains(key) || rs[key].is_null()) return fallback;
      require(rs[key].is_number(), cfg_path, ": rope_scaling.", key, " is not a number");
      return rs[key].get<double>();
    };
    if (type == "llama3") {
      c.rope_freq_factors = reference::rope_factors_llama3(
          c.rotary_dim(), c.rope_theta, field("factor", 8.0), field("low_freq_factor", 1.0),
          field("high_freq_factor", 4.0), field("original_max_position_embeddings", 8192.0));
    } else if (type == "linear") {
      c.rope_freq_factors = reference::rope_factors_linear(c.rotary_dim(), field("factor", 1.0));
    } else {
      require(type == "default", cfg_path, ": rope_scaling rope_type '", type,
              "' is not supported (default, linear, llama3)");
    }
  }
  // The weight files: one, or the shards an index lists.
  std::vector<std::string> files;
  std::error_code ec;
  if (std::filesystem::exists(dir + "/model.safetensors", ec)) {
    files.push_back(dir + "/model.safetensors");
  } else {
    const std::string idx = dir + "/model.safetensors.index.json";
    const nlohmann::json index = read_json(idx);
    require(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
            idx, ": no weight_map");
    std::set<std::string> shards;
    for (const auto& [name, file] : index["weight_map"].items()) {
      require(file.is_string(), idx, ": weight_map entry ", name, " is not a file name");
      const std::string f = file.get<std::string>();
      require(f.find('/') == std::string::npos && f.find("..") == std::string::npos, idx,
              ": shard '", f, "' is not a file of the directory");
      shards.insert(f);
    }
    for (const auto& f : shards) files.push_back(dir + "/" + f);
  }
  for (const auto& f : files) {
    src.files.push_back(std::make_shared<mapped_file>(f));
    src.parsed.push_back(std::make_shared<safetensors_file>(src.files.back()->bytes(), f));
    for (const auto& t : src.parsed.back()->tensors()) {
      require(src.where.count(t.name) == 0, f, ": tensor ", t.name, " is also in another shard");
      src.where[t.name] = src.parsed.size() - 1;
      ++out.tensor_types[t.dtype];
      out.n_params += static_cast<double>(t.elements());
    }
  }
  return out;
}

// True when `path` names a directory (a Hugging Face model); anything else is read as GGUF.
inline bool is_directory(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec);
}

// Runs a reading step, turning what nlohmann-json throws on a value of an unexpected JSON type
// into prepack::error naming the checkpoint.
template <class F>
auto json_guarded(const std::string& path, F&& f) {
  try {
    return f();
  } catch (const nlohmann::json::exception& e) {
    prepack::detail::fail(path, ": ", e.what());
  }
}

}  // namespace detail

/// The description of a checkpoint (a GGUF file, or a Hugging Face model directory) from its
/// headers, without converting a weight. Throws prepack::error naming the file and item.
inline info inspect(const std::string& path) {
  return detail::json_guarded(path, [&] {
    if (!detail::is_directory(path)) {
      detail::gguf_source src;
      return detail::inspect_gguf(path, src);
    }
    detail::safetensors_source src;
    return detail::inspect_safetensors(path, src);
  });
}

/// A checkpoint opened for reading: its description and a source of its weights in the model's
/// form (Q/K rows of a llama GGUF unpermuted), each tensor read (and dequantized to fp32) only
/// when the model asks for it, so `reference::model(info.cfg, *weights, options)` never holds
/// the checkpoint's fp32 weights whole. The source keeps the files open (mapped) while it lives.
struct opened {
  checkpoint::info info;
  std::unique_ptr<reference::weight_source> weights;
};

/// Opens a checkpoint: its headers parsed and checked (as inspect), its tensors read later
/// (with options.hold_quantized, a GGUF's quantized projections handed over as stored).
/// Throws what inspect throws; the source's reads throw prepack::error naming the file and the
/// tensor for a missing tensor or a shape that disagrees with the config.
inline opened open(const std::string& path, const open_options& options = {}) {
  return detail::json_guarded(path, [&] {
    opened out;
    if (!detail::is_directory(path)) {
      detail::gguf_source src;
      out.info = detail::inspect_gguf(path, src);
      out.weights = std::make_unique<detail::tensor_weights>(
          out.info.cfg, detail::gguf_tensors(src), out.info.architecture == "llama",
          options.hold_quantized);
    } else {
      auto src = std::make_shared<detail::safetensors_source>();
      out.info = detail::inspect_safetensors(path, *src);
      out.weights = std::make_unique<detail::tensor_weights>(
          out.info.cfg, detail::safetensors_tensors(src, path), false);
    }
    return out;
  });
}

/// Loads a checkpoint whole: its description and fp32 weights in the model's form. Throws
/// prepack::error naming the file and the item for anything the parsers refuse, an unsupported
/// architecture, a missing tensor, or a shape that disagrees with the config; std::bad_alloc
/// when the weights do not fit in memory.
inline loaded load(const std::string& path) {
  opened o = open(path);
  loaded out;
  out.weights =
      detail::json_guarded(path, [&] { return reference::collect(o.info.cfg, *o.weights); });
  out.info = std::move(o.info);
  return out;
}

}  // namespace checkpoint
PREPACK_NAMESPACE_END
