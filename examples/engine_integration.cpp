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
#include "prepack/workload.hpp"
#include "prepack/reference.hpp"

namespace ref = prepack::reference;

// ---------------------------------------------------------------------------------------------
// The engine's side (what already exists before prepacking).
struct paged_pool {
  int n_layers, n_kv_heads, head_dim;
  std::size_t n_blocks, block_size;
  std::vector<float> k, v;  // [n_layers][n_blocks][block_size][n_kv_heads][head_dim]

  paged_pool(const ref::config& c, std::size_t blocks, std::size_t bs)
      : n_layers(c.n_layers),
        n_kv_heads(c.n_kv_heads),
        head_dim(c.head_size()),
        n_blocks(blocks),
        block_size(bs),
        k(static_cast<std::size_t>(n_layers) * blocks * bs *
          static_cast<std::size_t>(n_kv_heads * head_dim)),
        v(k.size()) {}
  // One layer of the pool as (block, slot in block, head, dim), the unpacker's view.
  prepack::tensor_view<float, 4> layer(std::vector<float>& kv, int l) {
    const std::size_t per_layer =
        n_blocks * block_size * static_cast<std::size_t>(n_kv_heads * head_dim);
    return prepack::contiguous_view<float, 4>(
        kv.data() + static_cast<std::size_t>(l) * per_layer,
        {n_blocks, block_size, static_cast<std::size_t>(n_kv_heads),
         static_cast<std::size_t>(head_dim)});
  }
};

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
  try {
    ref::config cfg;  // a small Llama-style model: 2 layers, hidden 128, 4 heads / 2 kv heads
    const ref::model model(cfg, 7);
    const engine eng{model};
    const int new_tokens = 6;

    // The requests waiting for prefill: token ids of very different lengths.
    const std::vector<int> lengths =
        prepack::generate_lengths(prepack::profile::heavy_cut, 12, 3, 96);
    const auto prompts = prepack::generate_prompts(lengths, cfg.vocab, 3);

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
    //    prepack scatters the packed KV into them through the block table.
    const std::size_t block_size = 16;
    std::vector<std::size_t> blocks_of(lengths.size());
    std::size_t max_blocks = 0, total_blocks = 0;
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      blocks_of[i] =
          (static_cast<std::size_t>(lengths[i] + new_tokens) + block_size - 1) / block_size;
      max_blocks = std::max(max_blocks, blocks_of[i]);
      total_blocks += blocks_of[i];
    }
    paged_pool pool(cfg, total_blocks + 4, block_size);
    std::vector<int> block_table(lengths.size() * max_blocks, -1);  // [n_prompts][max_blocks]
    int next_free = static_cast<int>(total_blocks) + 3;             // hand out blocks from the top
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      for (std::size_t b = 0; b < blocks_of[i]; ++b) block_table[i * max_blocks + b] = next_free--;
    }
    const auto table =
        prepack::contiguous_view<const int, 2>(block_table.data(), {lengths.size(), max_blocks});
    for (int l = 0; l < cfg.n_layers; ++l) {
      // prepack: the engine's packed KV seen as (row, slot, head, dim), scattered into its pool.
      prepack::unpack_paged(layout, out.key_view(l), pool.layer(pool.k, l), table);
      prepack::unpack_paged(layout, out.value_view(l), pool.layer(pool.v, l), table);
    }
    std::printf("4. unpack: %zu prompts scattered into %zu blocks of %zu slots\n", lengths.size(),
                total_blocks, block_size);

    // 5. Decoding continues from the pool. A real engine's paged attention reads the blocks in
    //    place; this stand-in copies each prompt's blocks into the reference decoder's cache.
    std::vector<ref::kv_cache> caches;
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      ref::kv_cache kc(cfg, static_cast<std::size_t>(lengths[i] + new_tokens));
      kc.length = static_cast<std::size_t>(lengths[i]);
      for (int l = 0; l < cfg.n_layers; ++l) {
        auto pk = pool.layer(pool.k, l), pv = pool.layer(pool.v, l);
        for (std::size_t t = 0; t < kc.length; ++t) {
          const auto blk = static_cast<std::size_t>(block_table[i * max_blocks + t / block_size]);
          for (int g = 0; g < cfg.n_kv_heads; ++g) {
            for (int d = 0; d < cfg.head_size(); ++d) {
              kc.key(l, g, t)[d] = pk(blk, t % block_size, g, d);
              kc.value(l, g, t)[d] = pv(blk, t % block_size, g, d);
            }
          }
        }
      }
      caches.push_back(std::move(kc));
    }
    const auto generated = ref::greedy_decode(model, caches, out.logits, new_tokens);

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
  } catch (const prepack::error& e) {
    std::fprintf(stderr, "engine_integration: %s\n", e.what());
    return 2;
  }
}
