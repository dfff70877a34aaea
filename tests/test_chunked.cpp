// Tests of budgeted, chunked prefill over a paged pool (model::forward with step inputs): on
// random configs and prompt sets, under budgets from 1 up to the total (below the shortest
// prompt, primes), both policies, block sizes 1, 3 and 16, the pool ends with the K and V of
// prefilling each prompt alone and the last-token logits agree; greedy decoding from the pool
// (the same block, one-token chunks) continues identically; blocks no sequence owns stay
// untouched; the rows form of a step gives the same; bad input is refused before anything is
// written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <new>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "held_weights.hpp"
#include "reference_common.hpp"

namespace {

namespace ref = prepack::reference;
using namespace test;

constexpr float kSentinel = 1234.5f;

// A pool with every prompt's blocks (room for `extra` more positions) from a shuffled free list,
// two spare blocks no sequence owns, and every value set to a sentinel.
ref::paged_cache pool_for(const ref::config& c, const std::vector<int>& len, std::size_t bs,
                          std::size_t extra, std::mt19937_64& rng) {
  std::size_t need = 0;
  for (int l : len) need += prepack::blocks_for(static_cast<std::size_t>(l) + extra, bs);
  ref::paged_cache cache{ref::kv_pool(c, need + 2, bs), {}};
  std::vector<std::int32_t> ids(need + 2);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::size_t next = 0;
  for (int l : len) {
    ref::paged_sequence s;
    for (std::size_t k = 0; k < prepack::blocks_for(static_cast<std::size_t>(l) + extra, bs); ++k)
      s.blocks.push_back(ids[next++]);
    cache.seqs.push_back(s);
  }
  for (auto view : {cache.pool.key_view(), cache.pool.value_view()}) {
    std::fill(view.data, view.data + view.extent[0] * view.stride[0], kSentinel);
  }
  return cache;
}

// Runs every step of the schedule, collects each prompt's logits (from the step of its last
// chunk), either as varlen step inputs or as rows.
ref::matrix run_schedule(const ref::model& m, const prepack::step_schedule& sched,
                         const std::vector<std::vector<int>>& prompts, ref::paged_cache& cache,
                         bool rows, ref::gemm_backend be) {
  const auto tables = ref::tables_of(cache);
  ref::matrix logits(static_cast<Eigen::Index>(prompts.size()), m.cfg().vocab);
  for (std::size_t s = 0; s < sched.n_steps(); ++s) {
    ref::step_result r;
    if (rows) {
      const auto st = prepack::make_step_layout(sched, s, prompts, tables, cache.pool.n_blocks(),
                                                std::nullopt, {m.cfg().pad_id, 0});
      r = m.forward(st, cache.pool, {0, be});
      for (std::size_t k = 0; k < r.output_seq.size(); ++k) {
        const std::size_t q = r.output_seq[k];
        if (!sched.step(s)[q].last) continue;  // rows give every chunk's last token
        logits.row(static_cast<Eigen::Index>(st.seq_item[q])) =
            r.logits.row(static_cast<Eigen::Index>(k));
      }
    } else {
      const auto in = prepack::make_step_inputs(sched, s, prompts, tables, cache.pool.n_blocks());
      r = m.forward(in, cache.pool, {0, be});
      for (std::size_t k = 0; k < r.output_seq.size(); ++k) {
        logits.row(static_cast<Eigen::Index>(in.seq_item[r.output_seq[k]])) =
            r.logits.row(static_cast<Eigen::Index>(k));
      }
    }
  }
  for (std::size_t i = 0; i < prompts.size(); ++i) cache.seqs[i].length = prompts[i].size();
  return logits;
}

// The spare blocks (owned by no sequence) still hold the sentinel everywhere.
void expect_spare_untouched(ref::paged_cache& cache, const std::string& where) {
  std::vector<bool> owned(cache.pool.n_blocks(), false);
  for (const auto& s : cache.seqs) {
    for (std::int32_t b : s.blocks) owned[static_cast<std::size_t>(b)] = true;
  }
  for (auto view : {cache.pool.key_view(), cache.pool.value_view()}) {
    for (std::size_t layer = 0; layer < view.extent[0]; ++layer) {
      for (std::size_t b = 0; b < view.extent[1]; ++b) {
        if (owned[b]) continue;
        for (std::size_t o = 0; o < view.extent[2]; ++o) {
          for (std::size_t h = 0; h < view.extent[3]; ++h) {
            for (std::size_t d = 0; d < view.extent[4]; ++d) {
              ASSERT_EQ(view(layer, b, o, h, d), kSentinel) << where << ": spare block " << b;
            }
          }
        }
      }
    }
  }
}

TEST(Chunked, BudgetedStepsOverAPoolEqualPrefillingEachPromptAlone) {
  for (ref::gemm_backend be : backends()) {
    std::mt19937_64 rng(11);
    double worst_kv = 0, worst_logits = 0;
    int runs = 0, chunked = 0;
    for (int trial = 0; trial < 8; ++trial) {
      ref::config c = random_config(rng);
      if (trial % 4 == 3) c = test::whole_blocks(c);
      const std::uint64_t seed = rng();
      // Trials 2, 3, 6, 7 hold the projections quantized; 3 and 7 with 8-bit activations.
      const ref::model m =
          (trial / 2) % 2 ? test::held_model(c, seed, trial % 4 == 3) : ref::model(c, seed);
      const auto len = trial % 2 ? test::heavy_tailed_lengths(rng, 6, 70)
                                 : test::random_lengths(rng, 2 + rng() % 5, 1, 60);
      const auto prompts = random_prompts(rng, len, c.vocab);
      const int total = std::accumulate(len.begin(), len.end(), 0);
      const int shortest = *std::min_element(len.begin(), len.end());
      const int new_tokens = 4;
      auto [alone, alone_logits] =
          ref::prefill_alone(m, prompts, new_tokens, {ref::attention::segment, 0, be});
      const auto want = ref::greedy_decode(m, alone, alone_logits, new_tokens, {0, be});
      auto [fresh, fresh_logits] =
          ref::prefill_alone(m, prompts, 0, {ref::attention::segment, 0, be});
      const std::size_t budgets[] = {1, static_cast<std::size_t>(std::max(1, shortest - 1)), 7, 31,
                                     static_cast<std::size_t>(total)};
      for (std::size_t budget : budgets) {
        for (std::size_t bs : {std::size_t{1}, std::size_t{3}, std::size_t{16}}) {
          for (auto policy : {prepack::chunking::fill, prepack::chunking::whole_first}) {
            if (budget == 1 && (bs != 3 || policy != prepack::chunking::fill)) continue;  // slow
            const bool rows = (trial + static_cast<int>(bs)) % 2 == 0;
            const std::string where = std::string(ref::backend_name(be)) + " trial " +
                                      std::to_string(trial) + " budget " + std::to_string(budget) +
                                      " block " + std::to_string(bs) + (rows ? " rows" : " varlen");
            const auto sched = prepack::budgeted_schedule(len, {budget, policy});
            chunked += static_cast<int>(sched.n_chunked());
            auto cache = pool_for(c, len, bs, new_tokens, rng);
            const ref::matrix logits = run_schedule(m, sched, prompts, cache, rows, be);
            // Compare the prompts' positions only (the caches have room for more).
            const float kv = ref::max_abs_diff(fresh, cache);
            const double lg = (fresh_logits - logits).cwiseAbs().maxCoeff();
            worst_kv = std::max<double>(worst_kv, kv);
            worst_logits = std::max(worst_logits, lg);
            const test::slack tol = test::slack_for(m);
            ASSERT_LE(kv, tol.kv) << where;
            ASSERT_LE(lg, tol.logits) << where;
            expect_spare_untouched(cache, where);
            if (budget == 7 || budget == static_cast<std::size_t>(total)) {
              const auto got = ref::greedy_decode(m, cache, logits, new_tokens, {0, be});
              expect_same_tokens(want, got, where, tol.tie);
              if (!m.int8_activations()) {
                EXPECT_EQ(got.tokens, want.tokens) << where;
              }
            }
            ++runs;
          }
        }
      }
    }
    std::printf(
        "[%s] chunked prefill over a pool vs alone (%d schedules, %d prompts chunked): "
        "max abs diff KV %.3g, logits %.3g\n",
        ref::backend_name(be), runs, chunked, worst_kv, worst_logits);
    EXPECT_GT(chunked, 50);
  }
}

// Decode steps are steps of the same block: a cache prefilled whole, then continued token by
// token through model::forward, equals prefilling the longer prompts alone.
TEST(Chunked, DecodeStepsAreOneTokenChunks) {
  std::mt19937_64 rng(12);
  const ref::config c = random_config(rng);
  const ref::model m(c, 5);
  const auto prompts = random_prompts(rng, {9, 1, 30}, c.vocab);
  auto [cache, logits] = ref::prefill_alone(m, prompts, 6, {}, 3);
  const auto d = ref::greedy_decode(m, cache, logits, 6);
  // The prompts extended by their first five new tokens, prefilled alone, hold the same cache.
  std::vector<std::vector<int>> longer = prompts;
  for (std::size_t i = 0; i < longer.size(); ++i) {
    longer[i].insert(longer[i].end(), d.tokens[i].begin(), d.tokens[i].begin() + 5);
  }
  auto [again, again_logits] = ref::prefill_alone(m, longer, 0, {}, 5);
  const float kv = ref::max_abs_diff(again, cache);
  std::printf("decode through the pool vs prefilling the continued prompts alone: KV %.3g\n",
              static_cast<double>(kv));
  EXPECT_LE(kv, 1e-4);
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const auto [next, margin] = prepack::reference::detail::argmax_with_margin(
        again_logits.row(static_cast<Eigen::Index>(i)).data(), static_cast<std::size_t>(c.vocab));
    if (margin > 1e-3f) {
      EXPECT_EQ(next, d.tokens[i][5]) << "prompt " << i;
    }
  }
}

// Random batches with planted shared prefixes (shorter than a block, exactly a block, nested,
// prompts that are another's prefix, prefixes of one prompt only), prefilled with each shared
// prefix computed once and the suffixes over it: every prompt's cache, logits and greedy
// continuation equal prefilling it alone; shared blocks are counted once in the pool.
TEST(Chunked, SharedPrefixesEqualPrefillingEachPromptAlone) {
  std::mt19937_64 rng(13);
  double worst_kv = 0, worst_logits = 0;
  std::size_t computed = 0, useful = 0, prefixes = 0, nested = 0;
  for (int trial = 0; trial < 24; ++trial) {
    ref::config c = random_config(rng);
    if (trial % 4 == 3) c = test::whole_blocks(c);
    const std::uint64_t seed = rng();
    const ref::model m =
        (trial / 2) % 2 ? test::held_model(c, seed, trial % 4 == 3) : ref::model(c, seed);
    // Roots of planted prefixes; prompts are a root (cut, extended, or nested twice) or fresh.
    std::vector<std::vector<int>> roots;
    for (int r = 0; r < 2; ++r)
      roots.push_back(random_prompts(rng, {1 + static_cast<int>(rng() % 50)}, c.vocab)[0]);
    std::vector<std::vector<int>> prompts;
    for (int i = 0; i < 3 + static_cast<int>(rng() % 6); ++i) {
      std::vector<int> p = roots[rng() % roots.size()];
      const int kind = static_cast<int>(rng() % 5);
      if (kind == 0) p.resize(1 + rng() % p.size());
      if (kind == 1 && !prompts.empty()) p = prompts[rng() % prompts.size()];
      if (kind >= 2) {
        const auto more = random_prompts(rng, {1 + static_cast<int>(rng() % 30)}, c.vocab)[0];
        p.insert(p.end(), more.begin(), more.end());
      }
      if (kind == 4) p = random_prompts(rng, {1 + static_cast<int>(rng() % 20)}, c.vocab)[0];
      prompts.push_back(p);
    }
    const int new_tokens = 3;
    auto [alone, alone_logits] = ref::prefill_alone(m, prompts, new_tokens);
    auto [fresh, fresh_logits] = ref::prefill_alone(m, prompts);
    const auto want = ref::greedy_decode(m, alone, alone_logits, new_tokens);
    for (std::size_t bs : {std::size_t{1}, std::size_t{3}, std::size_t{16}}) {
      const std::size_t budget = trial % 3 == 0 ? 0 : 1 + rng() % 40;
      const auto policy = trial % 2 ? prepack::chunking::fill : prepack::chunking::whole_first;
      auto run = ref::prefill_with_prefixes(m, prompts, {bs, bs, 0}, {budget, policy},
                                            static_cast<std::size_t>(new_tokens));
      const std::string where = "trial " + std::to_string(trial) + " block " + std::to_string(bs);
      const float kv = ref::max_abs_diff(fresh, run.cache);
      const double lg = (fresh_logits - run.logits).cwiseAbs().maxCoeff();
      worst_kv = std::max<double>(worst_kv, kv);
      worst_logits = std::max(worst_logits, lg);
      const test::slack tol = test::slack_for(m);
      ASSERT_LE(kv, tol.kv) << where;
      ASSERT_LE(lg, tol.logits) << where;
      // Shared blocks once: the pool holds the prefixes' blocks once and each prompt's own.
      std::size_t own = 0, shared_blocks = 0;
      for (const auto& p : run.plan.prefixes) shared_blocks += p.length / bs;
      for (std::size_t i = 0; i < prompts.size(); ++i) {
        const auto pre = run.plan.prompt_prefix[i];
        const std::size_t done =
            pre ? run.plan.prefixes[*pre].start + run.plan.prefixes[*pre].length : 0;
        own += prepack::blocks_for(prompts[i].size() + new_tokens - done, bs);
      }
      std::set<std::int32_t> distinct;
      for (const auto& s : run.cache.seqs) distinct.insert(s.blocks.begin(), s.blocks.end());
      ASSERT_EQ(distinct.size(), shared_blocks + own) << where;
      const auto got = ref::greedy_decode(m, run.cache, run.logits, new_tokens);
      expect_same_tokens(want, got, where, tol.tie);
      computed += run.plan.tokens_computed();
      useful += run.plan.useful_tokens();
      prefixes += run.plan.n_prefixes();
      for (const auto& p : run.plan.prefixes) nested += p.parent.has_value();
    }
  }
  std::printf(
      "shared prefixes vs alone: max abs diff KV %.3g, logits %.3g; %zu prefixes (%zu "
      "nested), %zu of %zu tokens computed\n",
      worst_kv, worst_logits, prefixes, nested, computed, useful);
  EXPECT_GT(prefixes, 30u);
  EXPECT_GT(nested, 3u);
}

// A suffix run before its prefix finds its context uncached: refused, nothing written.
TEST(ChunkedErrors, ASuffixBeforeItsPrefixIsRefused) {
  ref::config c;
  c.vocab = 64;
  const ref::model m(c, 3);
  std::vector<int> a(8, 5);
  std::vector<int> b = a, d = a;
  b.push_back(1);
  d.push_back(2);
  const std::vector<std::vector<int>> prompts{b, d};
  const auto plan = prepack::make_prefix_plan(prompts, {4, 4, 0});
  const auto sched = prepack::budgeted_schedule(plan.items, {100, prepack::chunking::fill});
  prepack::block_allocator alloc(16);
  const auto t = prepack::allocate_prefix_tables(plan, alloc, 0);
  ref::kv_pool pool(c, alloc.n_blocks(), 4);
  const auto items = plan.item_tokens(prompts);
  const auto suffixes = prepack::make_step_inputs(sched, 1, items, t.items, pool.n_blocks());
  const auto v = pool.key_view();
  const std::vector<float> before(v.data, v.data + v.extent[0] * v.stride[0]);
  EXPECT_PREPACK_ERROR(m.forward(suffixes, pool), "context positions 0..3 are not cached");
  EXPECT_EQ(std::vector<float>(v.data, v.data + v.extent[0] * v.stride[0]), before);
  EXPECT_NO_THROW(
      m.forward(prepack::make_step_inputs(sched, 0, items, t.items, pool.n_blocks()), pool));
  EXPECT_NO_THROW(m.forward(suffixes, pool));
}

TEST(ChunkedErrors, RefusedBeforeAnythingIsWritten) {
  ref::config c;
  c.vocab = 64;
  const ref::model m(c, 2);
  const std::vector<int> len{10, 4};
  const auto prompts = test::tagged_prompts(len, 64);
  const auto sched = prepack::budgeted_schedule(len, {6, prepack::chunking::fill});
  // Steps: [0: 0..5] [0: 6..9, 1: 0..1] [1: 2..3]
  std::mt19937_64 rng(1);
  auto cache = pool_for(c, len, 4, 0, rng);
  const auto tables = ref::tables_of(cache);
  const auto snapshot = [&] {
    const auto v = cache.pool.key_view();
    return std::vector<float>(v.data, v.data + v.extent[0] * v.stride[0]);
  };
  const auto before = snapshot();
  // Step 1 before step 0: prompt 0's context (positions 0..5) is not cached yet.
  const auto in1 = prepack::make_step_inputs(sched, 1, prompts, tables, cache.pool.n_blocks());
  EXPECT_PREPACK_ERROR(m.forward(in1, cache.pool),
                       "sequence 0: context positions 0..3 are not cached");
  EXPECT_EQ(snapshot(), before);
  // Step 0, then a step whose slot mapping disagrees with its block table.
  const auto in0 = prepack::make_step_inputs(sched, 0, prompts, tables, cache.pool.n_blocks());
  auto wrong = in1;
  wrong.slot_mapping[0] += 1;
  EXPECT_NO_THROW(m.forward(in0, cache.pool));
  const auto after0 = snapshot();
  EXPECT_PREPACK_ERROR(m.forward(wrong, cache.pool), "token 0 maps to slot");
  // Two sequences writing one block (tables that agree with their slot mappings): prompt 1's
  // positions 0, 1 on the block of prompt 0's positions 8, 9 (tokens 2 and 3 of the step).
  auto twice = in1;
  twice.tables.table[twice.tables.max_blocks] = twice.tables.table[2];
  twice.slot_mapping[4] = twice.slot_mapping[2];
  twice.slot_mapping[5] = twice.slot_mapping[3];
  EXPECT_PREPACK_ERROR(m.forward(twice, cache.pool), "sequence 1: block " +
                                                         std::to_string(twice.tables.table[2]) +
                                                         " is also written by sequence 0");
  // Prompt 1 writing the block that holds prompt 0's positions 0..3, which prompt 0 reads as
  // context in this very step (a read/write hazard).
  auto hazard = in1;
  hazard.tables.table[hazard.tables.max_blocks] = hazard.tables.table[0];
  hazard.slot_mapping[4] = hazard.tables.table[0] * 4;
  hazard.slot_mapping[5] = hazard.tables.table[0] * 4 + 1;
  EXPECT_PREPACK_ERROR(m.forward(hazard, cache.pool),
                       "sequence 0: block " + std::to_string(hazard.tables.table[0]) +
                           " (entry 0) holds context it reads, but sequence 1 writes that block");
  EXPECT_EQ(snapshot(), after0);
  // Positions 8, 9 written over the cached positions 4, 5 of the same sequence (its table names
  // one block for both).
  auto over = in1;
  over.tables.table[2] = over.tables.table[1];
  over.slot_mapping[2] = over.tables.table[1] * 4;
  over.slot_mapping[3] = over.tables.table[1] * 4 + 1;
  EXPECT_PREPACK_ERROR(m.forward(over, cache.pool),
                       "sequence 0: block " + std::to_string(over.tables.table[1]) +
                           " appears twice in its block table (entries 1 and 2)");
  // A block table too short for context + query.
  auto short_table = in1;
  for (std::size_t k = 2; k < short_table.tables.max_blocks; ++k) short_table.tables.table[k] = -1;
  EXPECT_PREPACK_ERROR(m.forward(short_table, cache.pool),
                       "sequence 0: block_table[2] = -1 (padding) where a block is needed");
  // A context longer than the prompt is refused when the step is built.
  auto long_ctx = sched;
  long_ctx.chunks[long_ctx.step_begin[1]].context = 11;
  EXPECT_PREPACK_ERROR(
      prepack::make_step_inputs(long_ctx, 1, prompts, tables, cache.pool.n_blocks()),
      "prompt 0: chunk context 11");
  // Tokens outside the vocabulary, a pool of another block size.
  auto bad_token = in1;
  bad_token.tokens[0] = 64;
  EXPECT_PREPACK_ERROR(m.forward(bad_token, cache.pool), "token 0: id 64 outside vocab 64");
  ref::kv_pool other(c, cache.pool.n_blocks(), 8);
  EXPECT_PREPACK_ERROR(m.forward(in1, other), "step: block size 4");
  EXPECT_EQ(snapshot(), after0);
  // The right step still runs.
  EXPECT_NO_THROW(m.forward(in1, cache.pool));
}

// Allocations that cannot succeed stay std::bad_alloc and leave everything usable: a pool larger
// than any process can map, and a dense-mask prefill whose mask needs 2^48 bytes; after them
// the same model computes what it did before. (Under AddressSanitizer and ThreadSanitizer, whose
// operator new aborts on failure, only the rest runs.) A size that overflows is the
// caller's: prepack::error.
TEST(ChunkedErrors, AllocationsThatCannotSucceedLeaveEverythingUsable) {
  ref::config c;
  c.n_layers = 1;
  c.hidden = 32;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn = 48;
  c.vocab = 64;
  if (PREPACK_TEST_NEW_THROWS) {
    EXPECT_THROW(ref::kv_pool(c, std::size_t{1} << 40, 16), std::bad_alloc);
  }
  EXPECT_PREPACK_ERROR(ref::kv_pool(c, std::size_t{1} << 62, 16), "kv pool");
  const ref::model m(c, 4);
  const std::vector<int> len{9, 5, 3};
  const auto prompts = test::tagged_prompts(len, 64);
  const auto l = prepack::make_layout(prepack::first_fit_decreasing(len), prompts);
  const auto before = m.prefill(l);
  // One row of 2^23 tokens, attended densely: its additive mask is 2^46 floats, more than an
  // x86-64 process can map (whatever the kernel's overcommit policy).
  if (PREPACK_TEST_NEW_THROWS) {
    const std::vector<int> big(std::size_t{1} << 23, 1);
    const auto huge = prepack::make_layout(prepack::first_fit_decreasing({1 << 23}), big);
    EXPECT_THROW(m.prefill(huge, {ref::attention::dense}), std::bad_alloc);
  }
  const auto after = m.prefill(l);
  EXPECT_EQ(ref::max_abs_diff(ref::unpack_caches(m, l, after), ref::unpack_caches(m, l, before)),
            0.0);
  EXPECT_EQ((after.logits - before.logits).cwiseAbs().maxCoeff(), 0.0f);
}

}  // namespace

namespace {

// The serving loop on the reference model: random arrival traces through prepack::scheduler
// (every policy, budgets from 1 up, block sizes 1, 3 and 16, pools tight enough to preempt and
// evict, prefix cache on and off), each step one forward pass with greedy sampling. Every
// request's generated tokens equal generating it alone (up to a near-tie a rounding can flip),
// and its cache when it finishes equals prefilling its tokens alone; blocks are conserved.
TEST(ServeLoop, EveryRequestEqualsRunningItAlone) {
  std::mt19937_64 rng(31);
  std::size_t preemptions = 0, hits = 0, checked = 0;
  int trial = 0;
  for (prepack::admission pol :
       {prepack::admission::fcfs, prepack::admission::packed, prepack::admission::shortest_first}) {
    for (const std::size_t bs : {std::size_t{1}, std::size_t{3}, std::size_t{16}}) {
      for (bool cache : {true, false}) {
        ++trial;
        ref::config c = test::random_config(rng);
        if (trial % 4 == 3) c = test::whole_blocks(c);
        c.n_layers = 1 + trial % 2;
        const std::uint64_t seed = rng();
        const ref::model m =
            (trial / 2) % 2 ? test::held_model(c, seed, trial % 4 == 3) : ref::model(c, seed);
        prepack::scheduler_options so;
        so.token_budget = trial % 5 == 0 ? 1 : 4 + rng() % 40;
        so.max_seqs = 1 + rng() % 6;
        so.block_size = bs;
        so.policy = pol;
        so.prefix_cache = cache;
        so.n_blocks =
            prepack::blocks_for(70, bs) + (trial % 2 == 0 ? 0 : prepack::blocks_for(90, bs));
        std::vector<int> stem;
        for (int k = 0; k < 24; ++k)
          stem.push_back(static_cast<int>(rng() % static_cast<std::uint64_t>(c.vocab)));
        std::vector<ref::timed_request> trace;
        for (int i = 0; i < 10; ++i) {
          prepack::request r;
          r.id = 100 + i;
          if (rng() % 2 == 0)
            r.prompt.assign(stem.begin(),
                            stem.begin() + 1 + static_cast<long>(rng() % stem.size()));
          const std::size_t extra = rng() % 3 == 0 ? 0 : rng() % 30;
          for (std::size_t k = 0; k < extra || r.prompt.empty(); ++k) {
            r.prompt.push_back(
                static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(c.vocab)));
          }
          r.max_new_tokens = 1 + rng() % 8;
          trace.push_back({r, static_cast<double>(rng() % 20)});
        }
        prepack::scheduler s(so);
        ref::serve_options opt;
        opt.virtual_clock = true;
        // The cache of each finished request against prefilling its tokens alone.
        std::map<std::int64_t, std::vector<std::int32_t>> prompts;
        for (const auto& t : trace) prompts[t.r.id] = t.r.prompt;
        double worst = 0;
        opt.on_finish = [&](const prepack::finished_request& f, const ref::kv_pool& pool) {
          std::vector<int> seq(prompts[f.id].begin(), prompts[f.id].end());
          seq.insert(seq.end(), f.generated.begin(), f.generated.end() - 1);
          ASSERT_EQ(seq.size(), f.cached_positions);
          const auto [alone, logits] = ref::prefill_alone(m, std::vector<std::vector<int>>{seq});
          const std::size_t kv = static_cast<std::size_t>(c.kv_dim());
          for (int layer = 0; layer < c.n_layers; ++layer) {
            for (std::size_t p = 0; p < seq.size(); ++p) {
              const std::size_t at =
                  (static_cast<std::size_t>(f.blocks[p / bs]) * bs + p % bs) * kv;
              const std::size_t want = alone.seqs[0].slot(p, alone.pool.block_size()) * kv;
              for (std::size_t e = 0; e < kv; ++e) {
                worst = std::max<double>(
                    worst, std::abs(pool.keys(layer)[at + e] - alone.pool.keys(layer)[want + e]));
                worst = std::max<double>(worst, std::abs(pool.values(layer)[at + e] -
                                                         alone.pool.values(layer)[want + e]));
              }
            }
          }
          ++checked;
        };
        const ref::serve_report rep = ref::serve(m, s, trace, opt);
        EXPECT_LE(worst, test::slack_for(m).kv) << "trial " << trial;
        for (std::size_t i = 0; i < trace.size(); ++i) {
          const auto& r = trace[i].r;
          const auto [cache0, logits0] = ref::prefill_alone(
              m, std::vector<std::vector<int>>{std::vector<int>(r.prompt.begin(), r.prompt.end())},
              r.max_new_tokens);
          auto cache1 = cache0;
          const ref::decode_result want =
              ref::greedy_decode(m, cache1, logits0, static_cast<int>(r.max_new_tokens));
          ref::decode_result got;
          const auto& served =
              *std::find_if(rep.requests.begin(), rep.requests.end(),
                            [&](const ref::served_request& x) { return x.id == r.id; });
          got.tokens = {std::vector<int>(served.generated.begin(), served.generated.end())};
          got.margins = want.margins;
          test::expect_same_tokens(
              want, got, "trial " + std::to_string(trial) + " request " + std::to_string(r.id),
              test::slack_for(m).tie);
          EXPECT_GE(served.first_token_ms, served.arrival_ms);
          EXPECT_GE(served.finish_ms, served.first_token_ms);
        }
        EXPECT_EQ(s.blocks().available(), so.n_blocks);
        s.drop_cache();
        EXPECT_EQ(s.blocks().free(), so.n_blocks);
        preemptions += rep.stats.preemptions;
        hits += rep.stats.cache_hit_tokens;
      }
    }
  }
  std::printf(
      "serving on the model: %zu requests' caches checked, %zu preemptions, %zu prompt "
      "tokens from the prefix cache\n",
      checked, preemptions, hits);
  EXPECT_GT(preemptions, 0u);
  EXPECT_GT(hits, 0u);
}

}  // namespace
