// A driver that instantiates the reference model's templates for clang-tidy; also run as a test.
#include <prepack/reference.hpp>

#include <vector>

int main() {
  namespace ref = prepack::reference;
  const ref::config c;
  const ref::model m(c, 1);
  const std::vector<std::vector<int>> prompts{{1, 2, 3}, {4, 5}};
  const std::vector<int> len{3, 2};
  const auto l = prepack::make_layout(prepack::first_fit_decreasing(len), prompts);
  const auto r = m.prefill(l);
  auto caches = ref::unpack_caches(m, l, r, 4);
  const auto d = ref::greedy_decode(m, caches, r.logits, 3);
  const auto alone = ref::prefill_alone(m, prompts);
  // A budgeted schedule over a pool, as varlen steps and as rows.
  const auto sched = prepack::budgeted_schedule(len, {2, prepack::chunking::fill});
  ref::paged_cache pool = ref::make_cache(c, {3, 2}, 2);
  const auto tables = ref::tables_of(pool);
  for (std::size_t s = 0; s < sched.n_steps(); ++s) {
    if (s % 2 == 0) {
      m.forward(prepack::make_step_inputs(sched, s, prompts, tables, pool.pool.n_blocks()),
                pool.pool);
    } else {
      m.forward(prepack::make_step_layout(sched, s, prompts, tables, pool.pool.n_blocks()),
                pool.pool);
    }
  }
  return d.tokens.size() == 2 && alone.first.seqs.size() == 2 ? 0 : 1;
}
