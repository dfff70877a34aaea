// A program built by a project that consumes prepack as a package: plans a batch, lays it out,
// unpacks a tagged tensor and checks every value landed at its prompt. With
// PREPACK_CONSUMER_REFERENCE, also prefills with the reference model.
#include <prepack/prepack.hpp>

#include <cstdio>
#include <vector>

#ifdef PREPACK_CONSUMER_REFERENCE
#include <prepack/reference.hpp>
#endif

int main() {
  const std::vector<int> lengths{7, 3, 5, 1, 4};
  std::vector<int> tokens;
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    for (int t = 0; t < lengths[i]; ++t) tokens.push_back(static_cast<int>(i * 100) + t);
  }
  const auto plan = prepack::first_fit_decreasing(lengths);
  const auto layout = prepack::make_layout(plan, tokens);
  std::vector<float> packed(layout.n_slots());
  for (std::size_t s = 0; s < packed.size(); ++s)
    packed[s] = static_cast<float>(layout.tokens()[s]);
  const auto per_prompt = prepack::unpack_contiguous(
      layout, prepack::packed_view<const float>(packed.data(), prepack::kv_order::row_slot_head_dim,
                                                layout.n_rows(), layout.width(), 1, 1));
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    for (int t = 0; t < lengths[i]; ++t) {
      if (per_prompt[i][static_cast<std::size_t>(t)] !=
          static_cast<float>(i * 100) + static_cast<float>(t)) {
        std::printf("prompt %zu token %d misplaced\n", i, t);
        return 1;
      }
    }
  }
#ifdef PREPACK_CONSUMER_REFERENCE
  prepack::reference::config c;
  c.vocab = 1000;
  const prepack::reference::model m(c, 1);
  const auto r = m.prefill(layout);
  if (r.logits.rows() != static_cast<long>(lengths.size())) return 1;
  std::printf("consumer: reference prefill ok\n");
#endif
  std::printf("consumer: %zu prompts in %zu rows, unpacked exactly\n", lengths.size(),
              plan.n_rows());
  return 0;
}
