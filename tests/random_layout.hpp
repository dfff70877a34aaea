// A random packed layout for the tests of what is derived from layouts (masks, engine formats):
// padded, first-fit or best-fit (with room to spare) plans over up to 12 prompts of up to 20
// tokens, each token tagged with its prompt and position.
#pragma once

#include <algorithm>
#include <random>

#include "common.hpp"
#include "prepack/layout.hpp"

namespace test {

inline prepack::packed_layout<> random_layout(std::mt19937_64& rng, int trial) {
  const auto len = random_lengths(rng, 1 + rng() % 12, 1, 1 + static_cast<long long>(rng() % 20));
  const auto plan = trial % 3 == 0   ? prepack::padded(len)
                    : trial % 3 == 1 ? prepack::first_fit_decreasing(len)
                                     : prepack::best_fit_decreasing(
                                           len, *std::max_element(len.begin(), len.end()) + 5);
  return prepack::make_layout(plan, tagged_prompts(len, 50));
}

}  // namespace test
