// support/workload.hpp - named prompt-length profiles for the examples, tests and benchmarks, and
// a reader for prompt files (not part of the library: not installed). Deterministic: the same
// (profile, n, seed, max_len) gives the same lengths on every platform (its generator is
// splitmix64, not <random>'s distributions).
//
//  equal      every prompt max_len / 2 tokens: nothing to save, the control.
//  mild       uniform in [max_len / 2, max_len]: padding wastes about 1/3.
//  heavy      log-normal, median max_len / 8, sigma 1.25, clamped to [4, 4 max_len]: most
//             prompts short, a few very long (about 1 in 20 above max_len), as chat and
//             few-shot QA traffic (MMLU-like) looks.
//  heavy-cut  heavy, clamped to [4, max_len]: the same traffic under a context limit.
//  one-long   one prompt of max_len, the rest uniform in [4, 32]: the worst case for padding.
// Cost: O(n).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <istream>
#include <string>
#include <vector>

#include "prepack/detail/random.hpp"
#include "prepack/error.hpp"

namespace support {

enum class profile { equal, mild, heavy, heavy_cut, one_long };

inline const char* profile_name(profile p) {
  switch (p) {
    case profile::equal:
      return "equal";
    case profile::mild:
      return "mild";
    case profile::heavy:
      return "heavy";
    case profile::heavy_cut:
      return "heavy-cut";
    case profile::one_long:
      return "one-long";
  }
  return "?";
}

inline const std::vector<profile>& all_profiles() {
  static const std::vector<profile> all{profile::equal, profile::mild, profile::heavy,
                                        profile::heavy_cut, profile::one_long};
  return all;
}

/// The profile of a name; throws prepack::error listing the names for an unknown one.
inline profile parse_profile(const std::string& name) {
  for (profile p : all_profiles()) {
    if (name == profile_name(p)) return p;
  }
  prepack::detail::fail("unknown profile '", name, "' (equal, mild, heavy, heavy-cut, one-long)");
}

/// n prompt lengths of profile p. Throws prepack::error for n == 0 or max_len < 8.
inline std::vector<int> generate_lengths(profile p, std::size_t n, std::uint64_t seed,
                                         int max_len = 512) {
  prepack::detail::require(n > 0, "workload: 0 prompts");
  prepack::detail::require(max_len >= 8, "workload: max_len ", max_len, " (at least 8)");
  prepack::detail::splitmix g(seed);
  std::vector<int> len(n);
  const auto lognormal = [&](int hi) {
    const double v = std::exp(std::log(max_len / 8.0) + 1.25 * g.normal());
    return static_cast<int>(std::lround(std::min<double>(hi, std::max(4.0, v))));
  };
  for (std::size_t i = 0; i < n; ++i) {
    switch (p) {
      case profile::equal:
        len[i] = max_len / 2;
        break;
      case profile::mild:
        len[i] = g.between(max_len / 2, max_len);
        break;
      case profile::heavy:
        len[i] = lognormal(4 * max_len);
        break;
      case profile::heavy_cut:
        len[i] = lognormal(max_len);
        break;
      case profile::one_long:
        len[i] = g.between(4, 32);
        break;
    }
  }
  if (p == profile::one_long) len[static_cast<std::size_t>(g.next() % n)] = max_len;
  return len;
}

/// Random token ids in [first, vocab) for prompts of the given lengths (first > 0 keeps a pad
/// id of 0 out of the prompts, which changes nothing but reads better).
inline std::vector<std::vector<int>> generate_prompts(const std::vector<int>& lengths, int vocab,
                                                      std::uint64_t seed, int first = 1) {
  prepack::detail::require(vocab > first, "workload: vocab ", vocab);
  prepack::detail::splitmix g(seed ^ 0x5DEECE66Dull);
  std::vector<std::vector<int>> p(lengths.size());
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    prepack::detail::require(lengths[i] > 0, "prompt ", i, ": length ", lengths[i]);
    p[i].resize(static_cast<std::size_t>(lengths[i]));
    for (int& t : p[i]) t = g.between(first, vocab - 1);
  }
  return p;
}

/// Batches whose prompts share prefixes, token ids included (shared prefixes are in the tokens,
/// not only in the lengths):
///  few-shot       subjects of 8 prompts each (MMLU-like): every subject a shared prefix of
///                 200..400 tokens (its worked examples), every prompt then a question of
///                 heavy-tailed length (log-normal, median 40, clamped to [8, 240]).
///  system-prompt  one shared prefix of 300 tokens, then chat-length suffixes (log-normal,
///                 median 60, clamped to [4, 400]).
enum class prefix_profile { few_shot, system_prompt };

inline const char* prefix_profile_name(prefix_profile p) {
  return p == prefix_profile::few_shot ? "few-shot" : "system-prompt";
}

inline const std::vector<prefix_profile>& all_prefix_profiles() {
  static const std::vector<prefix_profile> all{prefix_profile::few_shot,
                                               prefix_profile::system_prompt};
  return all;
}

/// The prefix profile of a name, or nothing.
inline bool parse_prefix_profile(const std::string& name, prefix_profile& out) {
  for (prefix_profile p : all_prefix_profiles()) {
    if (name == prefix_profile_name(p)) {
      out = p;
      return true;
    }
  }
  return false;
}

/// n prompts of a prefix profile with token ids in [first, vocab). Deterministic. Throws
/// prepack::error for n == 0 or vocab <= first.
inline std::vector<std::vector<int>> generate_prefixed_prompts(prefix_profile p, std::size_t n,
                                                               int vocab, std::uint64_t seed,
                                                               int first = 1) {
  prepack::detail::require(n > 0, "workload: 0 prompts");
  prepack::detail::require(vocab > first, "workload: vocab ", vocab);
  prepack::detail::splitmix g(seed ^ 0xC0FFEEull);
  const auto lognormal = [&](double median, int lo, int hi) {
    const double v = std::exp(std::log(median) + 1.0 * g.normal());
    return static_cast<int>(std::lround(std::min<double>(hi, std::max<double>(lo, v))));
  };
  const auto tokens = [&](int count) {
    std::vector<int> t(static_cast<std::size_t>(count));
    for (int& x : t) x = g.between(first, vocab - 1);
    return t;
  };
  std::vector<std::vector<int>> out;
  std::vector<int> prefix;
  for (std::size_t i = 0; i < n; ++i) {
    if (p == prefix_profile::few_shot) {
      if (i % 8 == 0) prefix = tokens(g.between(200, 400));  // a new subject
      out.push_back(prefix);
      const auto q = tokens(lognormal(40, 8, 240));
      out.back().insert(out.back().end(), q.begin(), q.end());
    } else {
      if (i == 0) prefix = tokens(300);
      out.push_back(prefix);
      const auto q = tokens(lognormal(60, 4, 400));
      out.back().insert(out.back().end(), q.begin(), q.end());
    }
  }
  return out;
}

/// One non-blank line of a record file.
struct record {
  std::size_t line = 0;           // 1-based line number in the source
  std::vector<long long> values;  // the line's integers, in order
};

/// Reads integers, one record per non-blank line ('#' starts a comment), separated by spaces,
/// tabs or commas. Throws prepack::error naming `source`, the line and the offending text for
/// anything that is not a non-negative integer below `limit` ("prompts.txt:3: token id 'x7' is
/// not a non-negative integer"), for a line with more than max_per_line values, and for an
/// input with no records. `what` names a value in messages.
inline std::vector<record> read_records(std::istream& in, const std::string& source,
                                        const char* what, long long limit,
                                        std::size_t max_per_line = std::size_t{1} << 24) {
  std::vector<record> out;
  std::string line;
  std::size_t line_no = 0;
  const auto is_sep = [](char ch) { return ch == ' ' || ch == '\t' || ch == ',' || ch == '\r'; };
  while (std::getline(in, line)) {
    ++line_no;
    record rec{line_no, {}};
    const std::size_t end = std::min(line.size(), line.find('#'));
    std::size_t i = 0;
    while (i < end) {
      if (is_sep(line[i])) {
        ++i;
        continue;
      }
      std::size_t j = i;
      while (j < end && !is_sep(line[j])) ++j;
      const std::string tok = line.substr(i, j - i);
      const std::string shown = tok.size() > 32 ? tok.substr(0, 32) + "..." : tok;
      // Digits only, accumulated with an overflow check: any number of digits is read, and a
      // value past long long is simply not below the limit.
      bool digits = true, overflow = false;
      unsigned long long v = 0;
      for (char d : tok) {
        digits = digits && d >= '0' && d <= '9';
        if (!digits) break;
        const auto digit = static_cast<unsigned long long>(d - '0');
        overflow = overflow || v > (~0ull - digit) / 10;
        if (!overflow) v = v * 10 + digit;
      }
      if (!digits)
        prepack::detail::fail(source, ":", line_no, ": ", what, " '", shown,
                              "' is not a non-negative integer");
      if (overflow || limit <= 0 || v >= static_cast<unsigned long long>(limit))
        prepack::detail::fail(source, ":", line_no, ": ", what, " ", shown, " is not below ",
                              limit);
      if (rec.values.size() == max_per_line) {
        prepack::detail::fail(source, ":", line_no, ": more than ", max_per_line,
                              " values on one line");
      }
      rec.values.push_back(static_cast<long long>(v));
      i = j;
    }
    if (!rec.values.empty()) out.push_back(std::move(rec));
  }
  prepack::detail::require(!in.bad(), source, ": read error");
  prepack::detail::require(!out.empty(), source, ": no records (empty input?)");
  return out;
}

}  // namespace support
