// prepack/text/regex.hpp - the Unicode regular expressions of the pre-tokenizers, on PCRE2
// (UTF mode, Unicode properties for \p{L}, \p{N}, \s; JIT-compiled where PCRE2 can), and the
// split they drive: a piece of text cut into the matches and the text between them, as
// Hugging Face's Split pre-tokenizer (behaviour "isolated") and llama.cpp's regex splits cut it.
// Link prepack::text (libpcre2-8). Cost: compiling O(pattern); a split O(text) for these
// patterns.
#pragma once

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include <cstddef>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "../error.hpp"

PREPACK_NAMESPACE_BEGIN
namespace text {

/// A compiled pattern; shareable between threads (each match gets its own match data).
class regex {
 public:
  /// Compiles `pattern`. Throws prepack::error naming the pattern, PCRE2's message and the
  /// offset it points at.
  explicit regex(std::string pattern) : pattern_(std::move(pattern)) {
    int code = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(),
                                  PCRE2_UTF | PCRE2_UCP, &code, &offset, nullptr);
    if (c == nullptr) {
      prepack::detail::fail("regex '", pattern_, "': ", message(code), " at offset ", offset);
    }
    code_ = std::shared_ptr<pcre2_code>(c, code_free{});
    jit_ = pcre2_jit_compile(c, PCRE2_JIT_COMPLETE) == 0;
  }

  const std::string& pattern() const noexcept { return pattern_; }

  /// Appends to `out` the pieces of `s` (valid UTF-8): each match and each non-empty stretch
  /// between matches, in order. An empty match cuts nothing.
  void split(std::string_view s, std::vector<std::string_view>& out) const {
    const std::unique_ptr<pcre2_match_data, match_data_free> md(
        pcre2_match_data_create_from_pattern(code_.get(), nullptr));
    if (!md) throw std::bad_alloc();
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    std::size_t at = 0, kept = 0;
    while (at <= s.size()) {
      const int rc = jit_
                         ? pcre2_jit_match(code_.get(), subject, s.size(), at, 0, md.get(), nullptr)
                         : pcre2_match(code_.get(), subject, s.size(), at, PCRE2_NO_UTF_CHECK,
                                       md.get(), nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) prepack::detail::fail("regex '", pattern_, "': ", message(rc));
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
      const std::size_t begin = ov[0], end = ov[1];
      if (end == begin) {  // an empty match: move on by one character
        at = begin + 1;
        while (at < s.size() && (static_cast<unsigned char>(s[at]) & 0xC0) == 0x80) ++at;
        continue;
      }
      if (begin > kept) out.push_back(s.substr(kept, begin - kept));
      out.push_back(s.substr(begin, end - begin));
      kept = at = end;
    }
    if (kept < s.size()) out.push_back(s.substr(kept));
  }

 private:
  struct code_free {
    void operator()(pcre2_code* c) const noexcept { pcre2_code_free(c); }
  };
  struct match_data_free {
    void operator()(pcre2_match_data* m) const noexcept { pcre2_match_data_free(m); }
  };
  static std::string message(int code) {
    PCRE2_UCHAR buf[256];
    const int n = pcre2_get_error_message(code, buf, sizeof buf);
    return n < 0 ? "PCRE2 error " + std::to_string(code)
                 : std::string(reinterpret_cast<const char*>(buf), static_cast<std::size_t>(n));
  }

  std::string pattern_;
  std::shared_ptr<pcre2_code> code_;
  bool jit_ = false;
};

}  // namespace text
PREPACK_NAMESPACE_END
