// A driver that instantiates the reference model's templates for clang-tidy; also run as a test.
#include <prepack/reference.hpp>

#include <vector>

int main() {
  const prepack::reference::config c;
  const prepack::reference::model m(c, 1);
  const std::vector<std::vector<int>> prompts{{1, 2, 3}, {4, 5}};
  const auto l =
      prepack::make_layout(prepack::first_fit_decreasing(std::vector<int>{3, 2}), prompts);
  const auto r = m.prefill(l);
  auto caches = prepack::reference::unpack_caches(m, l, r, 4);
  const auto d = prepack::reference::greedy_decode(m, caches, r.logits, 3);
  const auto alone = prepack::reference::prefill_alone(m, prompts);
  return d.tokens.size() == 2 && alone.first.size() == 2 ? 0 : 1;
}
