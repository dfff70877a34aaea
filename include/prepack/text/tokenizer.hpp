// prepack/text/tokenizer.hpp - text to token ids and back, by a model's own vocabulary:
//
//  bpe  byte-level BPE (GGUF tokenizer.ggml.model "gpt2"; Llama 3, Qwen2/3, SmolLM, Mistral
//       Nemo): special tokens split out, the pre-tokenizer's regexes cut the rest into words,
//       each word's bytes mapped to GPT-2's byte-to-unicode alphabet and merged pair by pair,
//       lowest merge rank first (leftmost on ties); a word that is a token stays whole when the
//       vocabulary says ignore_merges.
//  spm  SentencePiece-style (tokenizer.ggml.model "llama"; Llama 1/2, Mistral 7B, Gemma):
//       spaces as U+2581 (and one before the text when add_space_prefix), characters merged pair
//       by pair, highest score first (leftmost on ties), what no token covers as its bytes'
//       <0xXX> tokens.
// Both follow llama.cpp's tokenizers (src/llama-vocab.cpp), which follow Hugging Face's; the
// tests check them against Hugging Face's tokenizers on the same vocabulary.
// Link prepack::text (PCRE2). Cost: construction O(tokens + merges); encode O(n log n) in the
// text's bytes (plus, per byte, the special tokens that start with it); decode O(output bytes).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../span.hpp"
#include "regex.hpp"
#include "utf8.hpp"
#include "vocabulary.hpp"

PREPACK_NAMESPACE_BEGIN
namespace text {

struct encode_options {
  bool add_bos = true;        // start with BOS when the vocabulary says so (vocabulary::add_bos)
  bool parse_special = true;  // control tokens written in the text (<|im_start|>) become those
                              // tokens; user-defined tokens always do
};

struct decode_options {
  bool special = false;  // control tokens as their text (else nothing)
};

class tokenizer {
 public:
  /// Checks the vocabulary and prepares it. Throws prepack::error naming the vocabulary's file
  /// and the item: no tokens, arrays of another length, a special id out of range, a merge with
  /// no space, a pattern PCRE2 refuses, an spm vocabulary without scores.
  explicit tokenizer(vocabulary v) : v_(std::move(v)) {
    using prepack::detail::require;
    const std::string& f = v_.name;
    const std::size_t n = v_.tokens.size();
    require(n > 0 && n < (std::size_t{1} << 31), f, ": tokenizer: ", n, " tokens");
    require(v_.types.empty() || v_.types.size() == n, f, ": tokenizer: ", v_.types.size(),
            " token types for ", n, " tokens");
    require(v_.scores.empty() || v_.scores.size() == n, f, ": tokenizer: ", v_.scores.size(),
            " scores for ", n, " tokens");
    require(v_.model != model_kind::spm || !v_.scores.empty(), f,
            ": tokenizer: a SentencePiece-style vocabulary without scores");
    for (const auto& [what, id] :
         {std::pair<const char*, std::int32_t>{"bos", v_.bos}, {"eos", v_.eos}, {"unk", v_.unk}}) {
      require(id >= -1 && id < static_cast<std::int64_t>(n), f, ": tokenizer: ", what, " id ", id,
              " outside the vocabulary of ", n);
    }
    require(!v_.add_bos || v_.bos >= 0, f, ": tokenizer: add_bos without a bos token");
    if (v_.types.empty()) v_.types.assign(n, token_type::normal);
    byte_tokens_.fill(-1);
    for (std::size_t i = 0; i < n; ++i) {
      ids_.emplace(v_.tokens[i], static_cast<std::int32_t>(i));
      const token_type t = v_.types[i];
      if ((t == token_type::control || t == token_type::user_defined) && !v_.tokens[i].empty()) {
        specials_[static_cast<unsigned char>(v_.tokens[i][0])].push_back(
            static_cast<std::int32_t>(i));
      }
      if (t == token_type::byte) {
        const int b = byte_of(v_.tokens[i]);
        require(b >= 0, f, ": tokenizer: byte token ", i, " is '", v_.tokens[i], "'");
        byte_tokens_[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(i);
      }
    }
    // Longest first, so a special token that starts another is tried after it.
    for (auto& list : specials_) {
      std::stable_sort(list.begin(), list.end(), [&](std::int32_t a, std::int32_t b) {
        return v_.tokens[static_cast<std::size_t>(a)].size() >
               v_.tokens[static_cast<std::size_t>(b)].size();
      });
    }
    if (v_.model == model_kind::bpe) {
      for (std::size_t r = 0; r < v_.merges.size(); ++r) {
        const std::string& m = v_.merges[r];
        const std::size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
        require(sp != std::string::npos, f, ": tokenizer: merge ", r, " '", m, "' has no space");
        ranks_.emplace(m, static_cast<int>(r));
      }
      for (const std::string& p : v_.pre_patterns) pre_.emplace_back(p);
      for (int b = 0; b < 256; ++b) {
        const std::string u = utf8::encode(byte_char(static_cast<unsigned char>(b)));
        byte_text_[static_cast<std::size_t>(b)] = u;
        unbyte_.emplace(byte_char(static_cast<unsigned char>(b)), static_cast<unsigned char>(b));
      }
    }
  }

  const vocabulary& vocab() const noexcept { return v_; }
  std::size_t size() const noexcept { return v_.tokens.size(); }
  std::int32_t bos() const noexcept { return v_.bos; }
  std::int32_t eos() const noexcept { return v_.eos; }
  /// The id of a token's exact text, or -1.
  std::int32_t find(std::string_view token) const {
    const auto it = ids_.find(std::string(token));
    return it == ids_.end() ? -1 : it->second;
  }

  /// The token ids of UTF-8 text. Throws prepack::error for text that is not valid UTF-8 (naming
  /// the byte) or a character the vocabulary cannot spell (no token, no byte fallback, no unk).
  std::vector<std::int32_t> encode(std::string_view s, const encode_options& opt = {}) const {
    utf8::check(s, v_.name + ": text");
    std::vector<std::int32_t> out;
    if (opt.add_bos && v_.add_bos) out.push_back(v_.bos);
    bool after_special = true;  // spm: the text's start counts as after a special token
    std::size_t plain = 0;      // start of the text not yet tokenized
    const auto flush = [&](std::size_t end) {
      if (end > plain) {
        if (v_.model == model_kind::bpe) {
          encode_bpe(s.substr(plain, end - plain), out);
        } else {
          encode_spm(s.substr(plain, end - plain), after_special, out);
        }
        after_special = false;
      }
    };
    for (std::size_t at = 0; at < s.size();) {
      const std::int32_t sp = special_at(s, at, opt.parse_special);
      if (sp < 0) {
        ++at;
        continue;
      }
      flush(at);
      out.push_back(sp);
      after_special = true;
      at += v_.tokens[static_cast<std::size_t>(sp)].size();
      plain = at;
    }
    flush(s.size());
    return out;
  }

  /// The bytes token `id` stands for (BPE: its byte-level text undone; spm: U+2581 as a space,
  /// <0xXX> as its byte). Control tokens give nothing unless opt.special. Throws prepack::error
  /// for an id outside the vocabulary.
  std::string piece(std::int32_t id, const decode_options& opt = {}) const {
    prepack::detail::require(id >= 0 && static_cast<std::size_t>(id) < size(), v_.name,
                             ": token id ", id, " outside the vocabulary of ", size());
    const std::string& t = v_.tokens[static_cast<std::size_t>(id)];
    switch (v_.types[static_cast<std::size_t>(id)]) {
      case token_type::control:
        return opt.special ? t : std::string();
      case token_type::user_defined:
        return t;
      case token_type::byte:
        return std::string(1, static_cast<char>(byte_of(t)));
      case token_type::unknown:
        return v_.model == model_kind::spm ? "\xe2\x96\x85" : t;  // llama.cpp's rendering
      case token_type::normal:
      case token_type::undefined:
      case token_type::unused:
        break;
    }
    return v_.model == model_kind::bpe ? from_byte_level(t) : from_spm(t);
  }

  /// The text of a sequence of tokens: their pieces joined, so a character whose bytes span
  /// tokens comes out whole. (An incomplete character at the end is left as its bytes.)
  std::string decode(span<const std::int32_t> ids, const decode_options& opt = {}) const {
    std::string out;
    for (std::int32_t id : ids) out += piece(id, opt);
    return out;
  }

 private:
  // GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes
  // for U+0100 upwards, in byte order.
  static char32_t byte_char(unsigned char b) noexcept {
    const auto printable = [](unsigned c) {
      return (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255);
    };
    if (printable(b)) return b;
    char32_t n = 0;
    for (unsigned c = 0; c < b; ++c) n += printable(c) ? 0 : 1;
    return 256 + n;
  }
  // "<0xAB>" -> 0xAB, else -1.
  static int byte_of(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    int v = 0;
    for (std::size_t k = 3; k < 5; ++k) {
      const char c = t[k];
      const int d = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                           : -1;
      if (d < 0) return -1;
      v = v * 16 + d;
    }
    return v;
  }

  std::int32_t special_at(std::string_view s, std::size_t at, bool parse_special) const {
    for (std::int32_t id : specials_[static_cast<unsigned char>(s[at])]) {
      const std::string& t = v_.tokens[static_cast<std::size_t>(id)];
      if (!parse_special && v_.types[static_cast<std::size_t>(id)] == token_type::control) continue;
      if (s.compare(at, t.size(), t) == 0) return id;
    }
    return -1;
  }

  // A symbol of a word being merged: a byte range of the word, linked to its neighbours.
  struct symbol {
    std::size_t begin = 0, size = 0;
    int prev = -1, next = -1;
  };
  struct pair_candidate {
    double priority;  // lower pops first
    int left, right;
    std::size_t size;  // bytes of the merged text when queued (stale entries are skipped)
    bool operator<(const pair_candidate& o) const {  // priority_queue pops the largest
      return priority != o.priority ? priority > o.priority : left > o.left;
    }
  };

  static std::vector<symbol> characters(std::string_view w) {
    std::vector<symbol> sym;
    for (std::size_t at = 0; at < w.size();) {
      const std::size_t n = std::max<std::size_t>(1, utf8::valid_at(w, at));
      sym.push_back({at, n, static_cast<int>(sym.size()) - 1, -1});
      at += n;
    }
    for (std::size_t k = 0; k + 1 < sym.size(); ++k) sym[k].next = static_cast<int>(k + 1);
    return sym;
  }

  // Merges adjacent symbols of w while `priority` (of the left and right texts) offers a pair,
  // best first; returns the symbols left.
  template <class Priority>
  static std::vector<symbol> merge(std::string_view w, Priority&& priority) {
    std::vector<symbol> sym = characters(w);
    std::priority_queue<pair_candidate> queue;
    const auto offer = [&](int l, int r) {
      if (l < 0 || r < 0) return;
      const symbol &a = sym[static_cast<std::size_t>(l)], &b = sym[static_cast<std::size_t>(r)];
      double p = 0;
      if (priority(w.substr(a.begin, a.size), w.substr(b.begin, b.size), p)) {
        queue.push({p, l, r, a.size + b.size});
      }
    };
    for (std::size_t k = 1; k < sym.size(); ++k)
      offer(static_cast<int>(k - 1), static_cast<int>(k));
    while (!queue.empty()) {
      const pair_candidate c = queue.top();
      queue.pop();
      symbol &a = sym[static_cast<std::size_t>(c.left)],
             &b = sym[static_cast<std::size_t>(c.right)];
      if (a.size == 0 || b.size == 0 || a.next != c.right || a.size + b.size != c.size) continue;
      a.size += b.size;
      b.size = 0;
      a.next = b.next;
      if (b.next >= 0) sym[static_cast<std::size_t>(b.next)].prev = c.left;
      offer(a.prev, c.left);
      offer(c.left, a.next);
    }
    std::vector<symbol> out;
    for (int k = sym.empty() ? -1 : 0; k >= 0; k = sym[static_cast<std::size_t>(k)].next) {
      out.push_back(sym[static_cast<std::size_t>(k)]);
    }
    return out;
  }

  void encode_bpe(std::string_view s, std::vector<std::int32_t>& out) const {
    std::vector<std::string_view> words{s}, next;
    for (const regex& r : pre_) {
      next.clear();
      for (std::string_view w : words) r.split(w, next);
      words.swap(next);
    }
    std::string mapped;
    for (std::string_view w : words) {
      mapped.clear();
      for (char c : w) mapped += byte_text_[static_cast<unsigned char>(c)];
      if (v_.ignore_merges) {
        if (const auto it = ids_.find(mapped); it != ids_.end()) {
          out.push_back(it->second);
          continue;
        }
      }
      std::string key;
      const auto rank = [&](std::string_view a, std::string_view b, double& p) {
        key.assign(a);
        key += ' ';
        key += b;
        const auto it = ranks_.find(key);
        if (it == ranks_.end()) return false;
        p = it->second;
        return true;
      };
      for (const symbol& x : merge(mapped, rank)) {
        const std::string_view t = std::string_view(mapped).substr(x.begin, x.size);
        if (const auto it = ids_.find(std::string(t)); it != ids_.end()) {
          out.push_back(it->second);
        } else {
          for (std::size_t at = 0; at < t.size();) {  // character by character
            const std::size_t n = std::max<std::size_t>(1, utf8::valid_at(t, at));
            out.push_back(spell(t.substr(at, n)));
            at += n;
          }
        }
      }
    }
  }

  void encode_spm(std::string_view s, bool after_special, std::vector<std::int32_t>& out) const {
    std::string t;
    if (v_.add_space_prefix && after_special) t += "\xe2\x96\x81";
    for (char c : s) {
      if (c == ' ') {
        t += "\xe2\x96\x81";
      } else {
        t += c;
      }
    }
    std::map<std::string, std::pair<std::size_t, std::size_t>, std::less<>>
        split;  // text -> its halves' sizes
    const auto score = [&](std::string_view a, std::string_view b, double& p) {
      std::string joined(a);
      joined += b;
      const auto it = ids_.find(joined);
      if (it == ids_.end()) return false;
      p = -static_cast<double>(v_.scores[static_cast<std::size_t>(it->second)]);
      split[joined] = {a.size(), b.size()};
      return true;
    };
    for (const symbol& x : merge(t, score))
      spm_resegment(std::string_view(t).substr(x.begin, x.size), split, out);
  }

  // A merged spm symbol as tokens: itself, else the two halves it was merged from, else (a
  // character no token covers) its bytes' tokens.
  template <class Split>
  void spm_resegment(std::string_view t, const Split& split, std::vector<std::int32_t>& out) const {
    if (const auto it = ids_.find(std::string(t)); it != ids_.end()) {
      out.push_back(it->second);
      return;
    }
    if (const auto it = split.find(t); it != split.end()) {
      spm_resegment(t.substr(0, it->second.first), split, out);
      spm_resegment(t.substr(it->second.first), split, out);
      return;
    }
    for (char c : t) {
      const std::int32_t b = byte_tokens_[static_cast<unsigned char>(c)];
      if (b >= 0) {
        out.push_back(b);
      } else {
        out.push_back(spell(t));
        return;
      }
    }
  }

  // The unknown token, for text the vocabulary cannot spell; an error without one.
  std::int32_t spell(std::string_view t) const {
    if (v_.unk >= 0) return v_.unk;
    prepack::detail::fail(v_.name, ": tokenizer: '", std::string(t),
                          "' has no token, no byte fallback and the vocabulary no unknown token");
  }

  std::string from_byte_level(const std::string& t) const {
    std::string out;
    for (std::size_t at = 0; at < t.size();) {
      const std::size_t n = utf8::valid_at(t, at);
      if (n == 0) {  // not UTF-8: pass the byte through
        out += t[at++];
        continue;
      }
      const auto it = unbyte_.find(utf8::decode(t.data() + at, n));
      if (it != unbyte_.end()) {
        out += static_cast<char>(it->second);
      } else {
        out.append(t, at, n);
      }
      at += n;
    }
    return out;
  }

  static std::string from_spm(const std::string& t) {
    std::string out;
    for (std::size_t at = 0; at < t.size();) {
      if (t.compare(at, 3, "\xe2\x96\x81") == 0) {
        out += ' ';
        at += 3;
      } else {
        out += t[at++];
      }
    }
    return out;
  }

  vocabulary v_;
  std::unordered_map<std::string, std::int32_t> ids_;
  std::unordered_map<std::string, int> ranks_;
  std::vector<regex> pre_;
  std::array<std::vector<std::int32_t>, 256> specials_;  // by first byte, longest first
  std::array<std::int32_t, 256> byte_tokens_{};  // spm: each byte's <0xXX> token, -1 if none
  std::array<std::string, 256> byte_text_;       // bpe: each byte's character, as UTF-8
  std::unordered_map<char32_t, unsigned char> unbyte_;
};

/// Text decoded one token at a time (generation): each append gives the characters that are
/// complete so far, holding back a character whose bytes continue in the next token.
class text_stream {
 public:
  explicit text_stream(const tokenizer& t, decode_options opt = {}) : t_(&t), opt_(opt) {}
  /// The new complete text after token id. Throws what tokenizer::piece throws.
  std::string append(std::int32_t id) {
    held_ += t_->piece(id, opt_);
    const std::size_t n = utf8::complete_prefix(held_);
    std::string out = held_.substr(0, n);
    held_.erase(0, n);
    return out;
  }
  /// What is held back (an incomplete character at the end), emptied.
  std::string finish() { return std::exchange(held_, std::string()); }

 private:
  const tokenizer* t_;
  decode_options opt_;
  std::string held_;
};

}  // namespace text
PREPACK_NAMESPACE_END
