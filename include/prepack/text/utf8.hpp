// prepack/text/utf8.hpp - UTF-8 as the tokenizers need it: validation (naming the offending byte),
// the length of a sequence from its lead byte, a code point's encoding, and the longest prefix of
// a byte string that ends on a whole character (for text decoded one token at a time).
// Standard library only. Cost: O(bytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "../error.hpp"

PREPACK_NAMESPACE_BEGIN
namespace text {
namespace utf8 {

/// Bytes of the sequence a lead byte starts: 1..4, or 0 for a byte that cannot lead one.
inline std::size_t sequence_length(unsigned char lead) noexcept {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

/// The length of the valid UTF-8 character at s[at], or 0 if none starts there (a bad lead or
/// continuation byte, an overlong form, a surrogate, a code point past U+10FFFF, a cut sequence).
inline std::size_t valid_at(std::string_view s, std::size_t at) noexcept {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[at + k]); };
  const std::size_t n = sequence_length(b(0));
  if (n == 0 || at + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xC0) != 0x80) return 0;
  }
  if (n == 3 && ((b(0) == 0xE0 && b(1) < 0xA0) || (b(0) == 0xED && b(1) >= 0xA0))) return 0;
  if (n == 4 && ((b(0) == 0xF0 && b(1) < 0x90) || (b(0) == 0xF4 && b(1) >= 0x90))) return 0;
  return n;
}

/// Throws prepack::error naming `what` and the byte offset of the first invalid sequence.
inline void check(std::string_view s, const std::string& what) {
  for (std::size_t at = 0; at < s.size();) {
    const std::size_t n = valid_at(s, at);
    if (n == 0) {
      const auto b = static_cast<unsigned char>(s[at]);
      const char hex[] = {'0', 'x', "0123456789abcdef"[b >> 4], "0123456789abcdef"[b & 15], 0};
      prepack::detail::fail(what, ": invalid UTF-8 at byte ", at, " (", hex, ")");
    }
    at += n;
  }
}

/// The UTF-8 encoding of code point cp (cp <= 0x10FFFF, not a surrogate).
inline std::string encode(char32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

/// The code point of the valid character of n bytes at p.
inline char32_t decode(const char* p, std::size_t n) noexcept {
  const auto b = [&](std::size_t k) {
    return static_cast<char32_t>(static_cast<unsigned char>(p[k]));
  };
  switch (n) {
    case 1:
      return b(0);
    case 2:
      return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3:
      return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default:
      return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

/// Bytes of s that end on a whole character: all of s unless it ends inside a sequence that
/// further bytes could still complete (at most 3 held back). Invalid bytes are not held back.
inline std::size_t complete_prefix(std::string_view s) noexcept {
  const std::size_t n = s.size();
  for (std::size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const std::size_t len = sequence_length(c);
    return len > back ? n - back : n;  // a lead byte whose sequence is cut short
  }
  return n;
}

}  // namespace utf8
}  // namespace text
PREPACK_NAMESPACE_END
