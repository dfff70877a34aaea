// support/text_input.hpp - text prompts for the example binaries: a UTF-8 file, one prompt per
// line, leading spaces kept, with the escapes \n (newline), \t (tab) and \\ (backslash); and the
// way a continuation is shown on one terminal line. Not part of the library.
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include "prepack/text/utf8.hpp"
#include "support/main.hpp"

namespace support {

/// A text prompt and where it came from.
struct text_line {
  std::size_t line = 0;  // 1-based
  std::string text;      // the escapes undone
};

/// The prompts of a text file (with `texts`: any lines, empty ones included, for tokenizing).
/// Throws usage_error naming the file and line for a file that cannot be read, an unknown
/// escape, bytes that are not UTF-8, and for prompts an empty line or no line at all.
enum class line_kind { prompts, texts };
inline std::vector<text_line> read_text_lines(const std::string& file,
                                              line_kind kind = line_kind::prompts) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw usage_error("cannot open '" + file + "'");
  std::vector<text_line> out;
  std::string raw;
  for (std::size_t n = 1; std::getline(in, raw); ++n) {
    if (!raw.empty() && raw.back() == '\r') raw.pop_back();  // CRLF files
    const std::string where = file + ":" + std::to_string(n);
    try {
      prepack::text::utf8::check(raw, where);
    } catch (const prepack::error& e) {
      throw usage_error(e.what());
    }
    std::string t;
    for (std::size_t k = 0; k < raw.size(); ++k) {
      if (raw[k] != '\\') {
        t += raw[k];
        continue;
      }
      const char e = k + 1 < raw.size() ? raw[k + 1] : '\0';
      if (e == 'n') {
        t += '\n';
      } else if (e == 't') {
        t += '\t';
      } else if (e == '\\') {
        t += '\\';
      } else {
        throw usage_error(where + ": unknown escape '\\" + std::string(e ? 1 : 0, e) +
                          "' (\\n, \\t and \\\\ are the escapes)");
      }
      ++k;
    }
    if (t.empty() && kind == line_kind::prompts) throw usage_error(where + ": empty prompt");
    out.push_back({n, std::move(t)});
  }
  if (in.bad()) throw usage_error(file + ": read error");
  if (out.empty() && kind == line_kind::prompts) throw usage_error(file + ": no prompts");
  return out;
}

/// Text on one line: the escapes of read_text_lines for newline, tab and backslash, other
/// control bytes as \xHH.
inline std::string one_line(const std::string& s) {
  std::string out;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (u < 0x20 || u == 0x7F) {
      const char hex[] = {'\\', 'x', "0123456789abcdef"[u >> 4], "0123456789abcdef"[u & 15], 0};
      out += hex;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace support
