// prepack/reference/alone.hpp - the oracles every equivalence check is held to: each prompt
// prefilled alone (a batch of one, no padding, no packing), and the largest difference between
// two sets of per-prompt caches. For tests, demos and benchmarks; not part of a kernel.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../layout.hpp"
#include "../plan.hpp"
#include "../unpack.hpp"
#include "decode.hpp"
#include "model.hpp"

PREPACK_NAMESPACE_BEGIN
namespace reference {

/// Prefills each prompt alone: returns one paged cache holding every prompt (room for `extra`
/// more positions each) and the logits of each prompt's last token, [n_prompts][vocab]. Throws
/// prepack::error for an empty prompt or a token outside the vocabulary.
template <class T>
std::pair<paged_cache, matrix> prefill_alone(const model& m,
                                             const std::vector<std::vector<T>>& prompts,
                                             std::size_t extra = 0, const prefill_options& opt = {},
                                             std::size_t block_size = 16) {
  std::vector<std::size_t> room;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    prepack::detail::require(!prompts[i].empty(), "prompt ", i, ": length 0");
    room.push_back(prompts[i].size() + extra);
  }
  paged_cache cache = make_cache(m.cfg(), room, block_size);
  matrix logits(static_cast<Eigen::Index>(prompts.size()), m.cfg().vocab);
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const auto plan = first_fit_decreasing({static_cast<long long>(prompts[i].size())});
    const auto l = make_layout(plan, prompts[i], {m.cfg().pad_id, 0});
    const prefill_result r = m.prefill(l, opt);
    const block_tables t = make_block_tables({cache.seqs[i].blocks}, block_size);
    unpack_paged(l, r.kv(), cache.pool.key_view(), cache.pool.value_view(), t.view());
    cache.seqs[i].length = prompts[i].size();
    mark_cached(cache.pool, cache.seqs[i], 0, prompts[i].size());
    logits.row(static_cast<Eigen::Index>(i)) = r.logits.row(0);
  }
  return {std::move(cache), std::move(logits)};
}

/// Largest |a - b| over the cached positions of every sequence, K and V, every layer.
/// Throws prepack::error if the caches differ in sequences, lengths or shape.
inline float max_abs_diff(const paged_cache& a, const paged_cache& b) {
  using prepack::detail::require;
  require(a.seqs.size() == b.seqs.size(), "caches: ", a.seqs.size(), " vs ", b.seqs.size(),
          " sequences");
  require(a.pool.n_layers() == b.pool.n_layers() && a.pool.kv_dim() == b.pool.kv_dim(),
          "caches: pools of different shapes");
  const std::size_t kv = a.pool.kv_dim();
  float worst = 0.0f;
  for (std::size_t i = 0; i < a.seqs.size(); ++i) {
    require(a.seqs[i].length == b.seqs[i].length, "sequence ", i, ": length ", a.seqs[i].length,
            " vs ", b.seqs[i].length);
    for (int layer = 0; layer < a.pool.n_layers(); ++layer) {
      for (std::size_t p = 0; p < a.seqs[i].length; ++p) {
        const std::size_t sa = a.seqs[i].slot(p, a.pool.block_size()) * kv;
        const std::size_t sb = b.seqs[i].slot(p, b.pool.block_size()) * kv;
        for (std::size_t e = 0; e < kv; ++e) {
          worst =
              std::max(worst, std::abs(a.pool.keys(layer)[sa + e] - b.pool.keys(layer)[sb + e]));
          worst = std::max(worst,
                           std::abs(a.pool.values(layer)[sa + e] - b.pool.values(layer)[sb + e]));
        }
      }
    }
  }
  return worst;
}

}  // namespace reference
PREPACK_NAMESPACE_END
