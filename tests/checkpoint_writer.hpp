// Small writers of GGUF and safetensors checkpoints, for the tests to write the files they load:
// the formats as llama.cpp's gguf-py and Hugging Face's safetensors write them (GGUF version 3,
// ggml dimension order, tensors aligned to 32 bytes, Q/K rows permuted for architecture llama
// as llama.cpp's converter does; safetensors with an 8-byte header length and a JSON header,
// optionally sharded with model.safetensors.index.json).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "prepack/numeric.hpp"
#include "prepack/reference/weights.hpp"
#include "q8_0.hpp"

namespace test {

namespace ref = prepack::reference;

enum class dtype { f32, f16, bf16, q8_0 };

inline const char* dtype_name(dtype t) {
  switch (t) {
    case dtype::f32:
      return "F32";
    case dtype::f16:
      return "F16";
    case dtype::bf16:
      return "BF16";
    default:
      return "Q8_0";
  }
}

// A named tensor in torch order (shape outermost first) with fp32 values.
struct named_tensor {
  std::string name;
  std::vector<std::uint64_t> shape;
  std::vector<float> values;
};

// The model's weights as Hugging Face names them, torch order ([out][in] for projections).
inline std::vector<named_tensor> hf_tensors(const ref::config& c, const ref::weights& w) {
  const auto u = [](Eigen::Index v) { return static_cast<std::uint64_t>(v); };
  std::vector<named_tensor> out;
  const auto mat = [&](const std::string& n, const ref::matrix& m, bool transpose) {
    named_tensor t{n, {}, {}};
    if (transpose) {  // [in][out] -> torch [out][in]
      t.shape = {u(m.cols()), u(m.rows())};
      for (Eigen::Index r = 0; r < m.cols(); ++r)
        for (Eigen::Index k = 0; k < m.rows(); ++k) t.values.push_back(m(k, r));
    } else {
      t.shape = {u(m.rows()), u(m.cols())};
      t.values.assign(m.data(), m.data() + m.size());
    }
    out.push_back(std::move(t));
  };
  const auto vec = [&](const std::string& n, const ref::vector& v) {
    out.push_back({n, {u(v.size())}, std::vector<float>(v.data(), v.data() + v.size())});
  };
  mat("model.embed_tokens.weight", w.embed, false);
  for (int l = 0; l < c.n_layers; ++l) {
    const auto& lw = w.layers[static_cast<std::size_t>(l)];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    vec(p + "input_layernorm.weight", lw.attn_norm);
    mat(p + "self_attn.q_proj.weight", lw.wq, true);
    mat(p + "self_attn.k_proj.weight", lw.wk, true);
    mat(p + "self_attn.v_proj.weight", lw.wv, true);
    if (c.qkv_bias) {
      vec(p + "self_attn.q_proj.bias", lw.bq);
      vec(p + "self_attn.k_proj.bias", lw.bk);
      vec(p + "self_attn.v_proj.bias", lw.bv);
    }
    mat(p + "self_attn.o_proj.weight", lw.wo, true);
    vec(p + "post_attention_layernorm.weight", lw.mlp_norm);
    mat(p + "mlp.gate_proj.weight", lw.w_gate, true);
    mat(p + "mlp.up_proj.weight", lw.w_up, true);
    mat(p + "mlp.down_proj.weight", lw.w_down, true);
  }
  vec("model.norm.weight", w.final_norm);
  if (!c.tied_embeddings) mat("lm_head.weight", w.lm_head, true);
  return out;
}

// llama.cpp's converter's permutation of Q/K rows (torch order, rows = heads x head_dim).
inline std::vector<float> permute_rows(const std::vector<float>& v, std::size_t rows,
                                       std::size_t cols, std::size_t n_head) {
  const std::size_t d = rows / n_head, half = d / 2;
  std::vector<float> out(v);
  for (std::size_t h = 0; h < n_head; ++h) {
    for (std::size_t i = 0; i < half; ++i) {
      for (std::size_t j = 0; j < 2; ++j) {
        const std::size_t file = h * d + 2 * i + j, orig = h * d + j * half + i;
        std::copy(v.begin() + static_cast<long>(orig * cols),
                  v.begin() + static_cast<long>((orig + 1) * cols),
                  out.begin() + static_cast<long>(file * cols));
      }
    }
  }
  return out;
}

// What a value becomes after storing as `t` and reading back (the format's own rounding): the
// test's independent expectation of a loader's output.
inline std::vector<float> rounded(const std::vector<float>& v, dtype t) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (t == dtype::f16)
      out[i] = prepack::half::to_float(prepack::half::from_float(v[i]));
    else if (t == dtype::bf16)
      out[i] = prepack::bfloat16::to_float(prepack::bfloat16::from_float(v[i]));
    else
      out[i] = v[i];
  }
  if (t == dtype::q8_0) {
    for (std::size_t b = 0; b + 32 <= v.size(); b += 32) {
      float amax = 0;
      for (std::size_t k = 0; k < 32; ++k) amax = std::max(amax, std::abs(v[b + k]));
      const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
      const float dh = prepack::half::to_float(prepack::half::from_float(d));
      for (std::size_t k = 0; k < 32; ++k) out[b + k] = dh * std::round(v[b + k] * id);
    }
  }
  return out;
}

class byte_writer {
 public:
  template <class T>
  void put(T v) {
    const auto* p = reinterpret_cast<const unsigned char*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof(T));
  }
  void str(const std::string& s) {
    put<std::uint64_t>(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
  }
  void pad(std::size_t alignment) {
    while (bytes.size() % alignment != 0) bytes.push_back(0);
  }
  std::vector<unsigned char> bytes;
};

struct gguf_options {
  std::string arch = "llama";   // llama: Q/K permuted; qwen2: as they are
  dtype matrices = dtype::f32;  // type of 2-D tensors (norms and biases stay F32)
  std::string name = "test-model";
  // Write the tokenizer metadata as llama.cpp's converter does (tokens, scores, token types,
  // merges, special ids) and one key of every other value type, an array of arrays included;
  // none of it is needed, so the loader skips it.
  bool vocab_list = true;
};

// The GGUF bytes of a model.
inline std::vector<unsigned char> gguf_bytes(const ref::config& c, const ref::weights& w,
                                             const gguf_options& opt) {
  static const std::map<std::string, std::string> names{
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"},
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"}};
  const auto gname = [&](const std::string& hf) {
    if (names.count(hf)) return names.at(hf);
    const std::string pre = "model.layers.";
    const auto dot = hf.find('.', pre.size());
    return "blk." + hf.substr(pre.size(), dot - pre.size()) + "." + names.at(hf.substr(dot + 1));
  };
  auto tensors = hf_tensors(c, w);
  const bool permute = opt.arch == "llama";
  for (auto& t : tensors) {
    const bool q = t.name.find("q_proj") != std::string::npos;
    const bool k = t.name.find("k_proj") != std::string::npos;
    if (permute && (q || k)) {
      const std::size_t heads = static_cast<std::size_t>(q ? c.n_heads : c.n_kv_heads);
      t.values = permute_rows(t.values, t.shape[0], t.shape.size() > 1 ? t.shape[1] : 1, heads);
    }
  }
  byte_writer h;
  const char magic[4] = {'G', 'G', 'U', 'F'};
  for (char ch : magic) h.put(ch);
  h.put<std::uint32_t>(3);
  h.put<std::uint64_t>(tensors.size());
  const std::string a = opt.arch;
  byte_writer m;  // the metadata entries, counted as they are written
  std::uint64_t n_meta = 0;
  const auto u32 = [&](const std::string& key, std::uint32_t v) {
    m.str(key);
    m.put<std::uint32_t>(4);
    m.put<std::uint32_t>(v);
    ++n_meta;
  };
  const auto f32 = [&](const std::string& key, float v) {
    m.str(key);
    m.put<std::uint32_t>(6);
    m.put<float>(v);
    ++n_meta;
  };
  const auto text = [&](const std::string& key, const std::string& v) {
    m.str(key);
    m.put<std::uint32_t>(8);
    m.str(v);
    ++n_meta;
  };
  const auto u = [](int v) { return static_cast<std::uint32_t>(v); };
  text("general.architecture", a);
  text("general.name", opt.name);
  u32(a + ".embedding_length", u(c.hidden));
  u32(a + ".block_count", u(c.n_layers));
  u32(a + ".attention.head_count", u(c.n_heads));
  u32(a + ".attention.head_count_kv", u(c.n_kv_heads));
  u32(a + ".feed_forward_length", u(c.ffn));
  u32(a + ".context_length", 4096);
  u32(a + ".rope.dimension_count", u(c.head_size()));
  f32(a + ".rope.freq_base", static_cast<float>(c.rope_theta));
  f32(a + ".attention.layer_norm_rms_epsilon", c.rms_eps);
  if (c.head_dim > 0) u32(a + ".attention.key_length", u(c.head_dim));
  if (opt.vocab_list) {
    const auto n_vocab = static_cast<std::uint64_t>(c.vocab);
    const auto array = [&](const std::string& key, std::uint32_t type, std::uint64_t n) {
      m.str(key);
      m.put<std::uint32_t>(9);
      m.put<std::uint32_t>(type);
      m.put<std::uint64_t>(n);
      ++n_meta;
    };
    array("tokenizer.ggml.tokens", 8, n_vocab);
    for (std::uint64_t i = 0; i < n_vocab; ++i) m.str("tok" + std::to_string(i));
    array("tokenizer.ggml.scores", 6, n_vocab);
    for (std::uint64_t i = 0; i < n_vocab; ++i) m.put<float>(-static_cast<float>(i));
    array("tokenizer.ggml.token_type", 5, n_vocab);
    for (std::uint64_t i = 0; i < n_vocab; ++i) m.put<std::int32_t>(1);
    array("tokenizer.ggml.merges", 8, 2);
    m.str("t o");
    m.str("to k");
    u32("tokenizer.ggml.bos_token_id", 1);
    u32("tokenizer.ggml.eos_token_id", 2);
    text("tokenizer.ggml.model", "llama");
    u32("general.file_type", 0);
    u32("general.quantization_version", 2);
    const auto scalar = [&](const std::string& key, std::uint32_t type, auto v) {
      m.str(key);
      m.put<std::uint32_t>(type);
      m.put(v);
      ++n_meta;
    };
    scalar("test.u8", 0, std::uint8_t{1});
    scalar("test.i8", 1, std::int8_t{-1});
    scalar("test.u16", 2, std::uint16_t{2});
    scalar("test.i16", 3, std::int16_t{-2});
    scalar("test.i32", 5, std::int32_t{-3});
    scalar("tokenizer.ggml.add_bos_token", 7, std::uint8_t{1});
    scalar("test.u64", 10, std::uint64_t{4});
    scalar("test.i64", 11, std::int64_t{-4});
    scalar("test.f64", 12, 0.5);
    array("test.nested", 9, 2);  // [[7, 8], ["a"]]
    m.put<std::uint32_t>(4);
    m.put<std::uint64_t>(2);
    m.put<std::uint32_t>(7);
    m.put<std::uint32_t>(8);
    m.put<std::uint32_t>(8);
    m.put<std::uint64_t>(1);
    m.str("a");
  }
  h.put<std::uint64_t>(n_meta);
  h.bytes.insert(h.bytes.end(), m.bytes.begin(), m.bytes.end());
  // Tensor data, each aligned to 32 bytes.
  byte_writer data;
  for (const auto& t : tensors) {
    const dtype ty = t.shape.size() == 2 ? opt.matrices : dtype::f32;
    h.str(gname(t.name));
    h.put<std::uint32_t>(static_cast<std::uint32_t>(t.shape.size()));
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it)
      h.put<std::uint64_t>(*it);  // ggml order
    h.put<std::uint32_t>(ty == dtype::f32 ? 0 : ty == dtype::f16 ? 1 : ty == dtype::bf16 ? 30 : 8);
    data.pad(32);
    h.put<std::uint64_t>(data.bytes.size());
    if (ty == dtype::q8_0) {
      const auto q = q8_0_bytes(t.values.data(), t.values.size());
      data.bytes.insert(data.bytes.end(), q.begin(), q.end());
    } else {
      for (float v : t.values) {
        if (ty == dtype::f32)
          data.put<float>(v);
        else if (ty == dtype::f16)
          data.put<std::uint16_t>(prepack::half::from_float(v));
        else
          data.put<std::uint16_t>(prepack::bfloat16::from_float(v));
      }
    }
  }
  h.pad(32);
  h.bytes.insert(h.bytes.end(), data.bytes.begin(), data.bytes.end());
  return h.bytes;
}

inline void write_file(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

// The safetensors bytes of some tensors stored as `t` (F32, F16 or BF16).
inline std::vector<unsigned char> safetensors_bytes(const std::vector<named_tensor>& tensors,
                                                    dtype t) {
  nlohmann::json header = nlohmann::json::object();
  byte_writer data;
  for (const auto& x : tensors) {
    const std::size_t begin = data.bytes.size();
    for (float v : x.values) {
      if (t == dtype::f32)
        data.put<float>(v);
      else if (t == dtype::f16)
        data.put<std::uint16_t>(prepack::half::from_float(v));
      else
        data.put<std::uint16_t>(prepack::bfloat16::from_float(v));
    }
    header[x.name] = {
        {"dtype", dtype_name(t)}, {"shape", x.shape}, {"data_offsets", {begin, data.bytes.size()}}};
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');
  byte_writer out;
  out.put<std::uint64_t>(h.size());
  out.bytes.insert(out.bytes.end(), h.begin(), h.end());
  out.bytes.insert(out.bytes.end(), data.bytes.begin(), data.bytes.end());
  return out.bytes;
}

inline nlohmann::json hf_config(const ref::config& c) {
  nlohmann::json j;
  j["architectures"] = {c.qkv_bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = c.qkv_bias ? "qwen2" : "llama";
  j["hidden_size"] = c.hidden;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = c.n_kv_heads;
  j["intermediate_size"] = c.ffn;
  j["vocab_size"] = c.vocab;
  if (c.head_dim > 0) j["head_dim"] = c.head_dim;
  j["rope_theta"] = c.rope_theta;
  j["rms_norm_eps"] = c.rms_eps;
  j["tie_word_embeddings"] = c.tied_embeddings;
  j["rope_scaling"] = nullptr;
  return j;
}

// A Hugging Face model directory: config.json and one weight file, or `shards` files listed in
// model.safetensors.index.json.
inline void write_hf_dir(const std::string& dir, const ref::config& c, const ref::weights& w,
                         dtype t, int shards) {
  std::ofstream(dir + "/config.json") << hf_config(c).dump(2);
  const auto tensors = hf_tensors(c, w);
  if (shards <= 1) {
    write_file(dir + "/model.safetensors", safetensors_bytes(tensors, t));
    return;
  }
  nlohmann::json index;
  for (int s = 0; s < shards; ++s) {
    std::vector<named_tensor> part;
    for (std::size_t k = static_cast<std::size_t>(s); k < tensors.size();
         k += static_cast<std::size_t>(shards)) {
      part.push_back(tensors[k]);
    }
    const std::string file =
        "model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(shards) + ".safetensors";
    write_file(dir + "/" + file, safetensors_bytes(part, t));
    for (const auto& x : part) index["weight_map"][x.name] = file;
  }
  std::ofstream(dir + "/model.safetensors.index.json") << index.dump(2);
}

}  // namespace test
