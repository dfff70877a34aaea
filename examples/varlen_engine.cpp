// varlen_engine: how an engine that never pads (vLLM, SGLang, TensorRT-LLM, llama.cpp) adopts
// prepack, step by step:
//
//   requests -> block manager -> budgeted schedule (steps of at most B tokens, long prompts
//   chunked) -> each step's inputs (cu_seqlens_q/k, positions from the context, block tables,
//   slot_mapping) -> the engine's forward pass writes K and V straight into its paged pool ->
//   decode steps continue from the pool.
//
// The "engine" is a stand-in: its forward pass is prepack's reference model, reached only
// through the step inputs an engine's attention metadata holds, and its KV cache is a paged pool
// of fixed-size blocks. Every prepack call is marked "prepack:".
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <vector>

#include "prepack/prepack.hpp"
#include "prepack/reference.hpp"
#include "support/main.hpp"
#include "support/workload.hpp"

namespace ref = prepack::reference;

int main() {
  return support::guarded_main("varlen_engine", [] {
    ref::config cfg;  // a small Llama-style model: 2 layers, hidden 128, 4 heads / 2 kv heads
    const ref::model model(cfg, 7);
    const int new_tokens = 6;
    const std::size_t budget = 64, block_size = 8;

    // 1. The requests: token ids of very different lengths, two longer than the budget.
    std::vector<int> lengths = support::generate_lengths(support::profile::heavy_cut, 10, 5, 96);
    lengths[3] = 150;
    lengths[7] = 97;
    const auto prompts = support::generate_prompts(lengths, cfg.vocab, 5);
    const std::vector<std::int64_t> request_ids{101, 102, 103, 104, 105, 106, 107, 108, 109, 110};

    // 2. The engine's block manager hands out blocks for prompt + generated tokens.
    //    prepack: a reference-counted allocator and padded block tables.
    std::size_t total_blocks = 0;
    for (int l : lengths)
      total_blocks += prepack::blocks_for(static_cast<std::size_t>(l + new_tokens), block_size);
    prepack::block_allocator blocks(total_blocks + 2);
    ref::paged_cache cache{ref::kv_pool(cfg, blocks.n_blocks(), block_size), {}};
    for (int l : lengths) {
      cache.seqs.push_back({blocks.allocate(prepack::blocks_for(
                                static_cast<std::size_t>(l + new_tokens), block_size)),
                            0});
    }
    const prepack::block_tables tables = ref::tables_of(cache);
    std::printf("1. %zu requests, %d tokens; pool of %zu blocks of %zu slots\n", lengths.size(),
                std::accumulate(lengths.begin(), lengths.end(), 0), blocks.n_blocks(), block_size);

    // 3. prepack: the schedule. Every step filled to the budget; prompts that do not fit the
    //    room left are chunked, each chunk after the previous one.
    const auto sched = prepack::budgeted_schedule(lengths, {budget, prepack::chunking::fill});
    std::printf("2. schedule: %zu steps of <= %zu tokens (lower bound %zu), %zu prompts chunked\n",
                sched.n_steps(), budget, sched.lower_bound(), sched.n_chunked());

    // 4. Each step: prepack gives the attention metadata; the engine's forward pass writes K and
    //    V through the slot mapping and returns logits where a prompt's last chunk ends.
    ref::matrix first_logits(static_cast<Eigen::Index>(lengths.size()), cfg.vocab);
    for (std::size_t s = 0; s < sched.n_steps(); ++s) {
      const auto in = prepack::make_step_inputs(sched, s, prompts, tables, cache.pool.n_blocks(),
                                                {prepack::span<const std::int64_t>(request_ids)});
      if (s < 2) {
        std::printf("   step %zu: %zu sequences, %zu tokens; cu_seqlens_q =", s, in.n_seqs(),
                    in.n_tokens());
        for (int x : in.cu_seqlens_q) std::printf(" %d", x);
        std::printf(", cu_seqlens_k =");
        for (int x : in.cu_seqlens_k) std::printf(" %d", x);
        std::printf(", context_lens =");
        for (int x : in.context_lens) std::printf(" %d", x);
        std::printf("\n");
      }
      const auto out = model.forward(in, cache.pool);  // the engine's forward pass
      for (std::size_t k = 0; k < out.output_seq.size(); ++k) {
        first_logits.row(static_cast<Eigen::Index>(in.seq_item[out.output_seq[k]])) =
            out.logits.row(static_cast<Eigen::Index>(k));
      }
    }
    for (std::size_t i = 0; i < lengths.size(); ++i) cache.seqs[i].length = prompts[i].size();
    std::printf("3. prefill: %zu steps wrote every prompt's K and V into the pool, no unpack\n",
                sched.n_steps());

    // 5. Decode steps: one token per sequence at its next position, the same forward pass.
    const auto generated = ref::greedy_decode(model, cache, first_logits, new_tokens);
    std::printf("4. decode: %d tokens per request; request %lld -> ", new_tokens,
                static_cast<long long>(request_ids[3]));
    for (int t : generated.tokens[3]) std::printf("%d ", t);
    std::printf("\n");

    // 6. Check against prefilling each prompt alone: the same numbers, the same tokens.
    auto [alone, alone_logits] =
        ref::prefill_alone(model, prompts, static_cast<std::size_t>(new_tokens));
    const float diff = (alone_logits - first_logits).cwiseAbs().maxCoeff();
    const auto expected = ref::greedy_decode(model, alone, alone_logits, new_tokens);
    const bool same = expected.tokens == generated.tokens;
    std::printf("5. versus each prompt alone: logits max |diff| %.2g, greedy tokens %s\n",
                static_cast<double>(diff), same ? "identical" : "DIFFER");
    return same && diff < 1e-3f ? 0 : 1;
  });
}
