// support/trace.hpp - request traces for the serving example and benchmark: a trace file (one
// request a line: arrival_ms max_new_tokens token_id token_id ...; '#' starts a comment), or a
// seeded stream of Poisson arrivals over a workload profile. Not part of the library.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "prepack/detail/random.hpp"
#include "prepack/reference/serve.hpp"
#include "support/main.hpp"
#include "support/workload.hpp"

namespace support {

/// The requests of a trace file, ids 0, 1, ... in line order. Throws usage_error naming the file
/// and line for an arrival that is not a non-negative number, a max_new_tokens outside
/// 1..max_new, no prompt tokens, or a token id that is not below vocab.
inline std::vector<prepack::reference::timed_request> read_trace(const std::string& file, int vocab,
                                                                 long long max_new) {
  std::ifstream in(file);
  if (!in) throw usage_error("cannot open '" + file + "'");
  std::vector<prepack::reference::timed_request> out;
  std::string line;
  for (std::size_t n = 1; std::getline(in, line); ++n) {
    const std::string where = file + ":" + std::to_string(n) + ": ";
    line = line.substr(0, line.find('#'));
    std::vector<std::string> f;
    for (std::size_t i = 0; i < line.size();) {
      while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
      std::size_t j = i;
      while (j < line.size() && line[j] != ' ' && line[j] != '\t' && line[j] != '\r') ++j;
      if (j > i) f.push_back(line.substr(i, j - i));
      i = j;
    }
    if (f.empty()) continue;
    char* end = nullptr;
    const double arrival = std::strtod(f[0].c_str(), &end);
    if (*end != '\0' || !std::isfinite(arrival) || arrival < 0) {
      throw usage_error(where + "arrival '" + f[0] + "' is not a non-negative number of ms");
    }
    if (f.size() < 2) throw usage_error(where + "no max_new_tokens");
    const long long m = std::strtoll(f[1].c_str(), &end, 10);
    if (*end != '\0' || m < 1 || m > max_new) {
      throw usage_error(where + "max_new_tokens '" + f[1] + "' outside 1.." +
                        std::to_string(max_new));
    }
    if (f.size() < 3) throw usage_error(where + "no prompt tokens");
    prepack::reference::timed_request t;
    t.arrival_ms = arrival;
    t.r.id = static_cast<std::int64_t>(out.size());
    t.r.max_new_tokens = static_cast<std::size_t>(m);
    for (std::size_t k = 2; k < f.size(); ++k) {
      const long long v = std::strtoll(f[k].c_str(), &end, 10);
      if (*end != '\0' || f[k][0] == '-' || f[k][0] == '+') {
        throw usage_error(where + "token id '" + f[k] + "' is not a non-negative integer");
      }
      if (v >= vocab) {
        throw usage_error(where + "token id " + f[k] + " is not below " + std::to_string(vocab));
      }
      t.r.prompt.push_back(static_cast<std::int32_t>(v));
    }
    out.push_back(std::move(t));
  }
  if (out.empty()) throw usage_error(file + ": no requests");
  return out;
}

/// A seeded stream: `n` requests arriving as a Poisson process of `rate` requests a second
/// (rate 0: all at once), prompts of a length profile or of a shared-prefix profile, each
/// asking for `new_tokens` tokens.
inline std::vector<prepack::reference::timed_request> generate_trace(const std::string& profile,
                                                                     std::size_t n, double rate,
                                                                     std::size_t new_tokens,
                                                                     int vocab, int max_len,
                                                                     std::uint64_t seed) {
  std::vector<std::vector<int>> prompts;
  prefix_profile pp{};
  if (parse_prefix_profile(profile, pp)) {
    prompts = generate_prefixed_prompts(pp, n, vocab, seed);
  } else {
    prompts =
        generate_prompts(generate_lengths(parse_profile(profile), n, seed, max_len), vocab, seed);
  }
  prepack::detail::splitmix g(seed ^ 0x5e7e5e7e5e7eull);
  std::vector<prepack::reference::timed_request> out;
  double t = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (rate > 0 && i > 0) t += -std::log(1.0 - g.uniform()) / rate * 1000.0;
    prepack::reference::timed_request r;
    r.arrival_ms = t;
    r.r.id = static_cast<std::int64_t>(i);
    r.r.prompt.assign(prompts[i].begin(), prompts[i].end());
    r.r.max_new_tokens = new_tokens;
    out.push_back(std::move(r));
  }
  return out;
}

/// The p-quantile (p in [0, 1]) of v, linearly interpolated between the nearest ranks; 0 for an
/// empty v. O(n log n).
inline double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double at = p * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(at));
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (at - static_cast<double>(lo));
}

}  // namespace support
