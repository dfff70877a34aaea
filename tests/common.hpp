// Helpers shared by prepack's tests.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "prepack/error.hpp"

// Whether this test binary runs under AddressSanitizer.
#if defined(__SANITIZE_ADDRESS__)
#define PREPACK_TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PREPACK_TEST_UNDER_ASAN 1
#endif
#endif
#ifndef PREPACK_TEST_UNDER_ASAN
#define PREPACK_TEST_UNDER_ASAN 0
#endif

// Whether a failed allocation throws std::bad_alloc here: AddressSanitizer's and
// ThreadSanitizer's operator new report out-of-memory and abort instead (whatever
// allocator_may_return_null says), so tests of allocation failure run in the other builds.
#if defined(__SANITIZE_THREAD__)
#define PREPACK_TEST_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PREPACK_TEST_UNDER_TSAN 1
#endif
#endif
#ifndef PREPACK_TEST_UNDER_TSAN
#define PREPACK_TEST_UNDER_TSAN 0
#endif
#define PREPACK_TEST_NEW_THROWS (!PREPACK_TEST_UNDER_ASAN && !PREPACK_TEST_UNDER_TSAN)

// Asserts that stmt throws prepack::error whose message contains `needle`.
#define EXPECT_PREPACK_ERROR(stmt, needle)                                          \
  do {                                                                              \
    try {                                                                           \
      stmt;                                                                         \
      ADD_FAILURE() << "expected prepack::error containing \"" << (needle) << "\""; \
    } catch (const prepack::error& err_) {                                          \
      EXPECT_NE(std::string(err_.what()).find(needle), std::string::npos)           \
          << "message: " << err_.what() << "\nexpected to contain: " << (needle);   \
    }                                                                               \
  } while (0)

namespace test {

// Lengths drawn uniformly from [lo, hi].
template <class L = int>
std::vector<L> random_lengths(std::mt19937_64& rng, std::size_t n, long long lo, long long hi) {
  std::uniform_int_distribution<long long> d(lo, hi);
  std::vector<L> out(n);
  for (auto& v : out) v = static_cast<L>(d(rng));
  return out;
}

// Heavy-tailed lengths: most short, a few long (log-uniform), clamped to [1, hi].
inline std::vector<int> heavy_tailed_lengths(std::mt19937_64& rng, std::size_t n, int hi) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<int> out(n);
  for (auto& v : out) {
    v = static_cast<int>(std::exp(u(rng) * std::log(static_cast<double>(hi))));
    if (v < 1) v = 1;
    if (v > hi) v = hi;
  }
  return out;
}

// Tokens for prompts: token j of prompt i is a tag that identifies both (mod vocab).
inline std::vector<std::vector<int>> tagged_prompts(const std::vector<int>& lengths, int vocab) {
  std::vector<std::vector<int>> p(lengths.size());
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    for (int t = 0; t < lengths[i]; ++t) {
      p[i].push_back(static_cast<int>((i * 7919 + static_cast<std::size_t>(t) * 31 + 1) %
                                      static_cast<std::size_t>(vocab)));
    }
  }
  return p;
}

}  // namespace test
