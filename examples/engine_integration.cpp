// engine_integration: how an inference engine adopts prepacking with only the standard-library
// headers (prepack/prepack.hpp), step by step:
//
//   lengths -> plan -> the engine's own inputs -> the engine's forward pass -> unpack into the
//   engine's paged KV pool through a block table -> the engine continues decoding.
//
// The "engine" below is a stand-in: its forward pass is prepack's reference model, but it is
// reached only through the arrays an engine already takes (input ids, position ids and a 4D
// additive mask, Hugging Face style), and its KV cache is a vLLM-style pool of fixed-size blocks.
// Every prepack call is marked "prepack:".
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <vector>

#include "prepack/prepack.hpp"
#include "prepack/reference.hpp"
#include "support/main.hpp"
#include "support/workload.hpp"

namespace ref = prepack::reference;

// ---------------------------------------------------------------------------------------------
// The engine's side (what already exists before prepacking): a forward pass over rectangular
// batches, and a vLLM-style paged KV pool, [n_layers][n_blocks][block_size][n_kv_heads][head_dim]
// for K and for V (here the reference model's kv_pool, reached only through its views).
struct engine {
  const ref::model& model;
  // The engine's batched forward pass over [n_rows][width] inputs. Knows nothing about prompts.
  ref::prefill_result forward(std::size_t n_rows, std::size_t width,
                              const std::vector<int>& input_ids,
                              const std::vector<int>& position_ids,
                              const std::vector<float>& mask_4d,
                              const std::vector<int>& output_slots) const {
    return model.prefill_masked(
        n_rows, width, prepack::span<const int>(input_ids), prepack::span<const int>(position_ids),
        prepack::span<const float>(mask_4d), prepack::span<const int>(output_slots));
  }
};

int main() {
  return support::guarded_main("engine_integration", [] {
    ref::config cfg;  // a small Llama-style model: 2 layers, hidden 128, 4 heads / 2 kv heads
    const ref::model model(cfg, 7);
    const engine eng{model};
    const int new_tokens = 6;

    // The requests waiting for prefill: token ids of very different lengths.
    const std::vector<int> lengths =
        support::generate_lengths(support::profile::heavy_cut, 12, 3, 96);
    const auto prompts = support::generate_prompts(lengths, cfg.vocab, 3);

    // 1. prepack: plan. First-fit-decreasing into rows as wide as the longest prompt.
    const auto plan = prepack::first_fit_decreasing(lengths);
    std::printf(
        "1. plan: %zu prompts, %zu tokens -> %zu rows of %d slots (padding would use %zu rows)\n",
        plan.n_prompts(), plan.useful_tokens(), plan.n_rows(), plan.capacity, plan.n_prompts());

    // 2. prepack: the packed batch, and the inputs the engine takes. input_ids and position_ids
    //    are [n_rows][width]; positions restart at 0 for every prompt, so RoPE sees each prompt
    //    exactly as if it were alone. The 4D mask is block-diagonal causal, [n_rows][width][width].
    const auto layout =
        prepack::make_layout(plan, prompts, {/*pad_id=*/cfg.pad_id, /*pad_position=*/0});
    const std::vector<float> mask = prepack::additive_mask(layout);
    std::printf("2. inputs: input_ids/position_ids %zu x %zu, mask %zu x %zu x %zu\n",
                layout.n_rows(), layout.width(), layout.n_rows(), layout.width(), layout.width());
    //    Engines with varlen attention (FlashAttention, vLLM) take cu_seqlens instead of a mask;
    //    llama.cpp-style engines take per-token (token, pos, seq_id, logits) arrays:
    const auto varlen = prepack::make_varlen(layout);
    const auto batch = prepack::make_token_batch(layout);
    std::printf("   varlen: %zu sequences, max_seqlen %d, cu_seqlens =", varlen.seq_prompt.size(),
                varlen.max_seqlen);
    for (int x : varlen.cu_seqlens) std::printf(" %d", x);
    std::printf("\n   token batch: %zu tokens, %d with logits\n", batch.token.size(),
                std::accumulate(batch.logits.begin(), batch.logits.end(), 0));

    // 3. The engine's forward pass, on its own inputs. It returns KV per layer in its own layout
    //    [n_rows][width][n_kv_heads][head_dim] and logits for the slots asked for: each prompt's
    //    last token (layout.last_token).
    const auto out = eng.forward(layout.n_rows(), layout.width(), layout.parts().tokens,
                                 layout.parts().positions, mask, layout.parts().last_token);
    std::printf("3. forward: %.1f MFLOP in %.3f s\n",
                (out.profile.linear_flops + out.profile.attention_flops) / 1e6,
                out.profile.seconds_total);

    // 4. The engine allocates blocks for each prompt (room for the tokens it will generate) and
    //    prepack scatters the packed KV of every layer into them through the block table, in
    //    one call (the table is checked once, K and V of all layers copied).
    const std::size_t block_size = 16;
    std::vector<std::size_t> room;
    for (int l : lengths) room.push_back(static_cast<std::size_t>(l + new_tokens));
    ref::paged_cache pool = ref::make_cache(cfg, room, block_size);
    const prepack::block_tables table = ref::tables_of(pool);
    prepack::unpack_paged(layout, out.kv(), pool.pool.key_view(), pool.pool.value_view(),
                          table.view());
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      pool.seqs[i].length = static_cast<std::size_t>(lengths[i]);
      ref::mark_cached(pool.pool, pool.seqs[i], 0, pool.seqs[i].length);
    }
    std::printf("4. unpack: %zu prompts scattered into %zu blocks of %zu slots\n", lengths.size(),
                pool.pool.n_blocks(), block_size);

    // 5. Decoding continues from the pool: each decode step is one token per sequence at its
    //    next position, attending to its blocks in place.
    const auto generated = ref::greedy_decode(model, pool, out.logits, new_tokens);

    // 6. Check against prefilling each prompt alone: the same tokens, the same numbers.
    auto [alone, alone_logits] =
        ref::prefill_alone(model, prompts, static_cast<std::size_t>(new_tokens));
    const float diff = (alone_logits - out.logits).cwiseAbs().maxCoeff();
    const auto expected = ref::greedy_decode(model, alone, alone_logits, new_tokens);
    const bool same = expected.tokens == generated.tokens;
    std::printf("5. decode: %d tokens per prompt; prompt 0 -> ", new_tokens);
    for (int t : generated.tokens[0]) std::printf("%d ", t);
    std::printf("\n6. versus each prompt alone: logits max |diff| %.2g, greedy tokens %s\n",
                static_cast<double>(diff), same ? "identical" : "DIFFER");
    return same && diff < 1e-3f ? 0 : 1;
  });
}
