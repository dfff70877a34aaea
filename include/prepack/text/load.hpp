// prepack/text/load.hpp - a model's own tokenizer, from its files:
//
//  GGUF     the tokenizer.ggml.* metadata llama.cpp writes (model, tokens, token_type, scores,
//           merges, pre, bos/eos/unknown ids, add_bos_token, add_space_prefix), with llama.cpp's
//           defaults where a key is absent. Tensors are not read: a vocabulary-only GGUF works.
//  Hugging Face directory
//           tokenizer.json (a BPE model with a byte-level pre-tokenizer: ByteLevel, Split,
//           Digits, or a Sequence of them; added tokens), and tokenizer_config.json or
//           tokenizer.json's post-processor for BOS. SentencePiece-style tokenizer.json files
//           (Metaspace, byte fallback) are refused by name: use the model's GGUF file.
// Link prepack::text (PCRE2, nlohmann-json, POSIX). Cost: O(file's tokenizer data).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "../checkpoint/gguf.hpp"
#include "../checkpoint/mapped_file.hpp"
#include "../error.hpp"
#include "tokenizer.hpp"
#include "vocabulary.hpp"

PREPACK_NAMESPACE_BEGIN
namespace text {

/// The vocabulary of a parsed GGUF file. Throws prepack::error naming the file and key for a
/// missing or malformed key, a tokenizer model other than llama / gpt2, an unknown
/// pre-tokenizer.
inline vocabulary vocabulary_of(const checkpoint::gguf_file& g) {
  using prepack::detail::require;
  const std::string& f = g.name();
  vocabulary v;
  v.name = f;
  require(g.has("tokenizer.ggml.model"), f, ": no tokenizer (tokenizer.ggml.model missing)");
  const std::string& model = g.text("tokenizer.ggml.model");
  require(model == "llama" || model == "gpt2", f, ": tokenizer.ggml.model '", model,
          "' is not supported (llama, gpt2)");
  v.model = model == "llama" ? model_kind::spm : model_kind::bpe;
  for (std::string_view t : g.strings("tokenizer.ggml.tokens")) v.tokens.emplace_back(t);
  if (g.has("tokenizer.ggml.scores")) v.scores = g.numbers<float>("tokenizer.ggml.scores");
  if (g.has("tokenizer.ggml.token_type")) {
    for (std::int32_t t : g.numbers<std::int32_t>("tokenizer.ggml.token_type")) {
      require(t >= 0 && t <= 6, f, ": tokenizer.ggml.token_type ", t, " is not a token type");
      v.types.push_back(static_cast<token_type>(t));
    }
  }
  const auto id = [&](const char* key, std::int32_t fallback) {
    if (!g.has(key)) return fallback;
    const long long x = g.integer(key);
    require(x >= 0 && x < static_cast<long long>(v.tokens.size()), f, ": ", key, " ", x,
            " outside the vocabulary of ", v.tokens.size());
    return static_cast<std::int32_t>(x);
  };
  const bool spm = v.model == model_kind::spm;
  const auto in_vocab = [&](std::int32_t x) {
    return x < static_cast<std::int32_t>(v.tokens.size()) ? x : -1;
  };
  bool add_bos_default = spm;
  if (!spm) {
    for (std::string_view m : g.strings("tokenizer.ggml.merges")) v.merges.emplace_back(m);
    pre_tokenizer pre = pre_tokenizer_named(
        g.has("tokenizer.ggml.pre") ? g.text("tokenizer.ggml.pre") : std::string("default"));
    v.pre_patterns = std::move(pre.patterns);
    v.ignore_merges = pre.ignore_merges;
    add_bos_default = pre.add_bos;
  }
  // llama.cpp's defaults: SentencePiece bos 1, eos 2, unknown 0; GPT-2's bos = eos = 11.
  v.bos = id("tokenizer.ggml.bos_token_id", in_vocab(spm ? 1 : 11));
  v.eos = id("tokenizer.ggml.eos_token_id", in_vocab(spm ? 2 : 11));
  v.unk = id("tokenizer.ggml.unknown_token_id", spm ? in_vocab(0) : -1);
  v.add_bos = g.has("tokenizer.ggml.add_bos_token") ? g.integer("tokenizer.ggml.add_bos_token") != 0
                                                    : add_bos_default;
  v.add_space_prefix = g.has("tokenizer.ggml.add_space_prefix")
                           ? g.integer("tokenizer.ggml.add_space_prefix") != 0
                           : spm;
  return v;
}

namespace detail {

inline nlohmann::json read_json_file(const std::string& path) {
  const checkpoint::mapped_file m(path);
  const auto b = m.bytes();
  try {
    return nlohmann::json::parse(b.begin(), b.end());
  } catch (const nlohmann::json::exception& e) {
    prepack::detail::fail(path, ": not JSON (", e.what(), ")");
  }
}

// The regexes of a byte-level pre-tokenizer of tokenizer.json, appended in order.
inline void add_pre_tokenizer(const nlohmann::json& p, const std::string& f,
                              std::vector<std::string>& out) {
  using prepack::detail::require;
  require(p.is_object() && p.contains("type") && p["type"].is_string(), f,
          ": pre_tokenizer without a type");
  const std::string type = p["type"].get<std::string>();
  if (type == "Sequence") {
    for (const auto& q : p.at("pretokenizers")) add_pre_tokenizer(q, f, out);
  } else if (type == "ByteLevel") {
    require(!p.value("add_prefix_space", false), f,
            ": pre_tokenizer ByteLevel with add_prefix_space is not supported");
    if (p.value("use_regex", true)) out.emplace_back(text::detail::gpt2_pattern);
  } else if (type == "Split") {
    require(p.value("behavior", std::string()) == "Isolated" && !p.value("invert", false), f,
            ": pre_tokenizer Split with behavior '", p.value("behavior", std::string()),
            "' is not supported (Isolated)");
    const auto& pat = p.at("pattern");
    if (pat.contains("Regex")) {
      out.push_back(pat["Regex"].get<std::string>());
    } else {
      // A literal string: escaped into a pattern.
      std::string lit;
      for (char c : pat.at("String").get<std::string>()) {
        if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) lit += '\\';
        lit += c;
      }
      out.push_back(lit);
    }
  } else if (type == "Digits") {
    out.emplace_back(p.value("individual_digits", false) ? "\\p{N}" : "\\p{N}+");
  } else {
    prepack::detail::fail(f, ": pre_tokenizer ", type,
                          " is not supported (ByteLevel, Split, Digits, Sequence)");
  }
}

// A token's id given by name, or a {"content": name} object, in tokenizer_config.json.
inline std::string token_name(const nlohmann::json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) {
    return j["content"].get<std::string>();
  }
  return {};
}

inline vocabulary vocabulary_of_hf(const std::string& dir) {
  using prepack::detail::require;
  const std::string f = dir + "/tokenizer.json";
  const nlohmann::json j = read_json_file(f);
  vocabulary v;
  v.name = f;
  v.model = model_kind::bpe;
  require(j.is_object() && j.contains("model") && j["model"].is_object(), f, ": no model");
  const auto& m = j["model"];
  const std::string type = m.value("type", std::string("BPE"));
  require(type == "BPE", f, ": model type '", type, "' is not supported (BPE)");
  require(!m.value("byte_fallback", false), f,
          ": a SentencePiece-style BPE (byte_fallback) is not supported from tokenizer.json: "
          "use the model's GGUF file");
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    const std::string n = j["normalizer"].value("type", std::string());
    require(n == "NFC", f, ": normalizer ", n, " is not supported (text is taken as NFC)");
  }
  require(j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null(), f,
          ": no pre_tokenizer (a byte-level BPE needs one)");
  add_pre_tokenizer(j["pre_tokenizer"], f, v.pre_patterns);
  v.ignore_merges = m.value("ignore_merges", false);
  std::vector<std::pair<std::int64_t, std::string>> entries;
  for (const auto& [text, id] : m.at("vocab").items()) {
    require(id.is_number_integer(), f, ": vocab entry '", text, "' has no integer id");
    entries.emplace_back(id.get<std::int64_t>(), text);
  }
  std::vector<std::pair<std::int64_t, std::pair<std::string, bool>>> added;
  if (j.contains("added_tokens")) {
    for (const auto& a : j["added_tokens"]) {
      added.push_back({a.at("id").get<std::int64_t>(),
                       {a.at("content").get<std::string>(), a.value("special", false)}});
    }
  }
  std::int64_t n = 0;
  for (const auto& e : entries) n = std::max(n, e.first + 1);
  for (const auto& a : added) n = std::max(n, a.first + 1);
  require(n > 0 && n < (std::int64_t{1} << 31), f, ": ", n, " tokens");
  v.tokens.assign(static_cast<std::size_t>(n), std::string());
  v.types.assign(static_cast<std::size_t>(n), token_type::unused);
  for (const auto& [id, text] : entries) {
    require(id >= 0, f, ": vocab entry '", text, "' has id ", id);
    v.tokens[static_cast<std::size_t>(id)] = text;
    v.types[static_cast<std::size_t>(id)] = token_type::normal;
  }
  for (const auto& [id, a] : added) {
    require(id >= 0, f, ": added token '", a.first, "' has id ", id);
    v.tokens[static_cast<std::size_t>(id)] = a.first;
    v.types[static_cast<std::size_t>(id)] =
        a.second ? token_type::control : token_type::user_defined;
  }
  for (const auto& x : m.at("merges")) {
    if (x.is_string()) {
      v.merges.push_back(x.get<std::string>());
    } else {
      require(x.is_array() && x.size() == 2, f, ": a merge is neither \"a b\" nor [a, b]");
      v.merges.push_back(x[0].get<std::string>() + " " + x[1].get<std::string>());
    }
  }
  const auto find = [&](const std::string& name) -> std::int32_t {
    if (name.empty()) return -1;
    for (std::size_t i = 0; i < v.tokens.size(); ++i) {
      if (v.tokens[i] == name) return static_cast<std::int32_t>(i);
    }
    return -1;
  };
  // BOS: a post-processor that puts a special token before the text (Llama 3), or
  // tokenizer_config.json's add_bos_token with its bos_token.
  if (j.contains("post_processor") && j["post_processor"].is_object()) {
    const auto& pp = j["post_processor"];
    const auto& procs = pp.value("type", std::string()) == "Sequence" && pp.contains("processors")
                            ? pp["processors"]
                            : nlohmann::json::array({pp});
    for (const auto& p : procs) {
      if (p.value("type", std::string()) == "TemplateProcessing" && p.contains("single") &&
          !p["single"].empty() && p["single"][0].contains("SpecialToken")) {
        v.bos = find(p["single"][0]["SpecialToken"].value("id", std::string()));
        v.add_bos = v.bos >= 0;
      }
    }
  }
  std::error_code ec;
  if (std::filesystem::exists(dir + "/tokenizer_config.json", ec)) {
    const nlohmann::json c = read_json_file(dir + "/tokenizer_config.json");
    if (c.contains("bos_token")) v.bos = std::max(v.bos, find(token_name(c["bos_token"])));
    if (c.contains("eos_token")) v.eos = find(token_name(c["eos_token"]));
    if (c.contains("add_bos_token") && c["add_bos_token"].is_boolean()) {
      v.add_bos = c["add_bos_token"].get<bool>() && v.bos >= 0;
    }
  }
  return v;
}

}  // namespace detail

/// A model's tokenizer: from a GGUF file (its metadata only), or from a Hugging Face model
/// directory's tokenizer.json. Throws prepack::error naming the file and the item.
inline tokenizer load_tokenizer(const std::string& path) {
  std::error_code ec;
  try {
    if (std::filesystem::is_directory(path, ec)) return tokenizer(detail::vocabulary_of_hf(path));
    const checkpoint::mapped_file f(path);
    const checkpoint::gguf_file g(f.bytes(), path);
    return tokenizer(vocabulary_of(g));
  } catch (const nlohmann::json::exception& e) {
    prepack::detail::fail(path, ": tokenizer: ", e.what());
  }
}

}  // namespace text
PREPACK_NAMESPACE_END
