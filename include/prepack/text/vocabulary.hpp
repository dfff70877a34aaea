// prepack/text/vocabulary.hpp - what a tokenizer is made of, as a model's files give it: the
// token texts, their kinds and scores, the BPE merges, the pre-tokenizer's regexes, the special
// ids; and the pre-tokenizers llama.cpp names in a GGUF file's tokenizer.ggml.pre, as the
// patterns their Hugging Face tokenizer.json files hold.
// Standard library only. Cost: O(1) per call.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "../error.hpp"

PREPACK_NAMESPACE_BEGIN
namespace text {

/// How text becomes tokens (GGUF's tokenizer.ggml.model).
enum class model_kind {
  spm,  // "llama": SentencePiece-style; pieces merged by score, spaces as U+2581, byte fallback
  bpe,  // "gpt2": byte-level BPE; a pre-tokenizer's regexes, then merges by rank
};

/// A token's kind (GGUF's tokenizer.ggml.token_type, llama.cpp's llama_token_type).
enum class token_type : std::int32_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,       // special (BOS, EOS, chat markers): matched in text only when asked
  user_defined = 4,  // added tokens: always matched in text, never split
  unused = 5,
  byte = 6,  // SentencePiece byte fallback: <0xXX>
};

/// Everything a tokenizer needs; the loaders (text/load.hpp) fill it from GGUF metadata or a
/// Hugging Face tokenizer.json, and tokenizer's constructor checks it.
struct vocabulary {
  std::string name;  // the file, for messages
  model_kind model = model_kind::bpe;
  std::vector<std::string> tokens;  // [n]  bpe: in GPT-2's byte-to-unicode alphabet; spm: with
                                    //      U+2581 for a space
  std::vector<float> scores;        // [n] or empty  spm: higher merges first
  std::vector<token_type> types;    // [n] or empty  (empty: every token normal)
  std::vector<std::string> merges;  // bpe: "left right" (split at the first space after the
                                    //      first byte), earlier merges first
  std::vector<std::string> pre_patterns;  // bpe: regexes splitting the text, applied in turn
  bool ignore_merges = false;     // bpe: a pre-tokenized word that is a token is that one token
  bool add_space_prefix = false;  // spm: a space before the text (and after a special token)
  std::int32_t bos = -1, eos = -1, unk = -1;  // -1: none
  bool add_bos = false;                       // encode() starts with bos unless told not to
};

namespace detail {
// The pre-tokenizers' patterns, as their tokenizer.json files write them.
inline const char* const gpt2_pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
inline const char* const llama3_pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
inline const char* const qwen2_pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
}  // namespace detail

/// The byte-level pre-tokenizer a GGUF file names (tokenizer.ggml.pre), as llama.cpp groups the
/// names: its regexes, applied in turn, and whether whole-word tokens skip the merges. Throws
/// prepack::error naming an unknown pre-tokenizer.
struct pre_tokenizer {
  std::vector<std::string> patterns;
  bool ignore_merges = false;
  bool add_bos = false;  // what llama.cpp assumes when the file does not say
};

inline pre_tokenizer pre_tokenizer_named(const std::string& pre) {
  const auto is = [&](std::initializer_list<const char*> names) {
    for (const char* n : names) {
      if (pre == n) return true;
    }
    return false;
  };
  // Llama 3's: a word that is a token skips the merges, and a BOS starts every text.
  if (is({"llama3", "llama-v3", "llama-bpe", "falcon3"}))
    return {{detail::llama3_pattern}, true, true};
  if (is({"dbrx", "smaug-bpe", "chatglm-bpe"})) return {{detail::llama3_pattern}, false, false};
  if (is({"qwen2", "deepseek-r1-qwen", "megrez", "stablelm2"})) {
    return {{detail::qwen2_pattern}, false, false};
  }
  if (is({"gpt-2", "gpt2", "phi-2", "roberta-bpe", "mpt", "olmo", "jais"})) {
    return {{detail::gpt2_pattern}, false, false};
  }
  // Digits split off one by one, then GPT-2's regex (a Digits pre-tokenizer before ByteLevel).
  if (is({"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"})) {
    return {{"\\p{N}", detail::gpt2_pattern}, false, false};
  }
  if (pre.empty() || pre == "default") {
    return {{"[\\p{P}\\$\\+<=>\\^~\\|]+", detail::gpt2_pattern, "\\p{N}+", "[0-9][0-9][0-9]"},
            false,
            false};
  }
  prepack::detail::fail("pre-tokenizer '", pre,
                        "' is not supported (llama-bpe, qwen2, gpt-2, smollm, starcoder, "
                        "default and their aliases)");
}

}  // namespace text
PREPACK_NAMESPACE_END
