// Tests of prepack/serve.hpp with an engine that checks everything it is handed: it keeps
// (token, position) in every pool slot it is told to write, reads a sequence back through its
// block table for every position it attends to (cached context from earlier steps, other
// requests' shared prefix blocks included), and samples the next token as a hash of exactly
// those tokens. So a request's generated tokens equal generating it alone only if every step put
// the right tokens at the right positions in the right blocks, and every cache hit held what the
// request would have computed. Random arrival traces, budgets from 1 up, block sizes 1, 3 and
// 16, pools tight enough to force preemption and eviction, prefix cache on and off, every
// policy. (The same loop on the reference model: tests/test_chunked.cpp, ServeLoop.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common.hpp"
#include "prepack/engines.hpp"
#include "prepack/serve.hpp"

namespace {

using prepack::admission;
using prepack::scheduler;

constexpr std::int32_t kVocab = 50;

// The next token after a sequence: a hash of every token, as a model's would depend on them.
std::int32_t next_token(const std::vector<std::int32_t>& seq) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::int32_t t : seq) h = (h ^ static_cast<std::uint64_t>(t + 1)) * 1099511628211ull;
  return static_cast<std::int32_t>((h >> 17) % kVocab);
}

// What a request generates alone.
std::vector<std::int32_t> alone(const prepack::request& r) {
  std::vector<std::int32_t> seq = r.prompt, out;
  while (out.size() < r.max_new_tokens) {
    const std::int32_t t = next_token(seq);
    out.push_back(t);
    seq.push_back(t);
    if (r.stop_token && t == *r.stop_token) break;
  }
  return out;
}

struct checking_engine {
  struct slot {
    std::int32_t token = -1;
    std::int64_t pos = -1;
  };
  std::vector<slot> slots;
  std::size_t bs;
  checking_engine(std::size_t n_blocks, std::size_t block_size)
      : slots(n_blocks * block_size), bs(block_size) {}

  // One step: writes every token, then samples each sequence that wants logits from what its
  // block table holds. Fails the test on any inconsistency.
  std::vector<std::int32_t> run(const prepack::step_inputs<>& in) {
    EXPECT_EQ(in.slot_mapping.size(), in.tokens.size());
    for (std::size_t t = 0; t < in.tokens.size(); ++t) {
      slots.at(static_cast<std::size_t>(in.slot_mapping[t])) = {in.tokens[t], in.positions[t]};
    }
    std::vector<std::int32_t> out;
    for (std::size_t q = 0; q < in.n_seqs(); ++q) {
      const auto end = static_cast<std::size_t>(in.seq_lens[q]);
      EXPECT_EQ(in.context_lens[q] + in.query_lens[q], in.seq_lens[q]);
      std::vector<std::int32_t> seq;
      for (std::size_t p = 0; p < end; ++p) {
        const auto b = in.tables.table[q * in.tables.max_blocks + p / bs];
        const slot& s = slots.at(static_cast<std::size_t>(b) * bs + p % bs);
        EXPECT_EQ(s.pos, static_cast<std::int64_t>(p))
            << "request " << in.seq_id[q] << " position " << p << " in block " << b;
        seq.push_back(s.token);
      }
      if (in.completes[q]) out.push_back(next_token(seq));
    }
    return out;
  }
};

struct trace_options {
  std::size_t n_requests = 40, budget = 64, max_seqs = 8, n_blocks = 64, block_size = 3;
  admission policy = admission::fcfs;
  bool cache = true;
  bool shared_prefixes = true;
};

// Random requests (some sharing prefixes, some of one token, some longer than the budget),
// arriving over the steps; runs them to the end, checking every step and the totals.
prepack::scheduler_stats run_trace(std::mt19937_64& rng, const trace_options& t) {
  prepack::scheduler_options so;
  so.token_budget = t.budget;
  so.max_seqs = t.max_seqs;
  so.n_blocks = t.n_blocks;
  so.block_size = t.block_size;
  so.policy = t.policy;
  so.prefix_cache = t.cache;
  so.reserve_blocks = rng() % 3;
  so.max_wait_steps = 8;
  so.null_block = rng() % 2 == 0;  // block 0 kept for vLLM and SGLang
  scheduler s(so);
  checking_engine engine(t.n_blocks, t.block_size);
  const std::size_t max_positions = s.blocks().usable() * t.block_size;
  std::vector<std::vector<std::int32_t>> stems(3);
  for (auto& stem : stems) {
    for (int k = 0; k < 20; ++k) stem.push_back(static_cast<std::int32_t>(rng() % kVocab));
  }
  std::vector<prepack::request> reqs;
  std::vector<std::size_t> arrival;
  for (std::size_t i = 0; i < t.n_requests; ++i) {
    prepack::request r;
    r.id = static_cast<std::int64_t>(1000 + i * 7);
    if (t.shared_prefixes && rng() % 2 == 0) {
      const auto& stem = stems[rng() % stems.size()];
      r.prompt.assign(stem.begin(), stem.begin() + static_cast<long>(1 + rng() % stem.size()));
    }
    const std::size_t extra = rng() % 4 == 0 ? 0 : rng() % (rng() % 5 == 0 ? 3 * t.budget : 12);
    for (std::size_t k = 0; k < extra || r.prompt.empty(); ++k) {
      r.prompt.push_back(static_cast<std::int32_t>(rng() % kVocab));
    }
    r.max_new_tokens = 1 + rng() % 10;
    if (rng() % 4 == 0) r.stop_token = static_cast<std::int32_t>(rng() % kVocab);
    if (r.prompt.size() + r.max_new_tokens - 1 > max_positions) continue;  // never fits
    reqs.push_back(r);
    arrival.push_back(rng() % (3 * t.n_requests));
  }
  std::map<std::int64_t, std::vector<std::int32_t>> got;
  std::size_t next = 0, step = 0, idle_steps = 0;
  std::vector<std::size_t> order(reqs.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return arrival[a] < arrival[b]; });
  while (next < order.size() || !s.idle()) {
    while (next < order.size() && arrival[order[next]] <= step) s.add(reqs[order[next++]]);
    const prepack::scheduled_step st = s.next_step();
    ++step;
    if (st.empty()) {
      EXPECT_TRUE(s.idle()) << "nothing scheduled while requests wait";
      if (!s.idle()) return s.stats();
      ++idle_steps;
      continue;
    }
    EXPECT_LE(st.inputs.n_tokens(), t.budget);
    EXPECT_LE(st.inputs.n_seqs(), t.max_seqs);
    // Decodes come first.
    bool prefill_seen = false;
    for (std::size_t q = 0; q < st.inputs.n_seqs(); ++q) {
      if (!st.inputs.decodes[q]) prefill_seen = true;
      EXPECT_FALSE(st.inputs.decodes[q] && prefill_seen) << "a decode after a prefill chunk";
    }
    // Every engine form takes the step (their own checks run).
    if (so.null_block) {  // vLLM and SGLang keep block 0 for themselves
      EXPECT_NO_THROW(prepack::vllm::make_step(st.inputs));
      EXPECT_NO_THROW(prepack::sglang::make_forward_batch(st.inputs));
    }
    EXPECT_NO_THROW(prepack::flashinfer::make_step(st.inputs));
    const auto sampled = engine.run(st.inputs);
    EXPECT_EQ(sampled.size(), st.n_samples);
    for (const auto& f : s.commit(prepack::span<const std::int32_t>(sampled))) {
      got[f.id] = f.generated;
    }
    if (step > 100000) {
      ADD_FAILURE() << "no progress";
      return s.stats();
    }
  }
  for (const auto& r : reqs) {
    EXPECT_EQ(got[r.id], alone(r)) << "request " << r.id;
  }
  // Blocks conserved: every block free or held by the cache; dropping the cache frees all.
  const auto& pool = s.blocks();
  EXPECT_EQ(pool.available(), pool.usable());
  EXPECT_EQ(pool.free() + pool.cached_unreferenced(), pool.usable());
  s.drop_cache();
  EXPECT_EQ(pool.free(), pool.usable());
  EXPECT_EQ(s.stats().finished, reqs.size());
  return s.stats();
}

TEST(Serve, EveryRequestGeneratesWhatItGeneratesAloneUnderEveryPolicyAndPool) {
  std::mt19937_64 rng(21);
  std::size_t preemptions = 0, hits = 0, trials = 0;
  for (admission pol : {admission::fcfs, admission::packed, admission::shortest_first}) {
    for (std::size_t bs : {1, 3, 16}) {
      for (bool cache : {true, false}) {
        for (int k = 0; k < 6; ++k) {
          trace_options t;
          t.policy = pol;
          t.block_size = bs;
          t.cache = cache;
          t.budget = k == 0 ? 1 : 1 + rng() % 80;
          t.max_seqs = 1 + rng() % 10;
          // Tight pools: a few requests' worth of blocks (each fits alone).
          t.n_blocks = prepack::blocks_for(3 * t.budget + 60, bs) / (k % 2 == 0 ? 1 : 3) + 2;
          SCOPED_TRACE("policy " + std::to_string(static_cast<int>(pol)) + ", block size " +
                       std::to_string(bs) + ", cache " + std::to_string(cache) + ", budget " +
                       std::to_string(t.budget) + ", max_seqs " + std::to_string(t.max_seqs) +
                       ", blocks " + std::to_string(t.n_blocks));
          const auto st = run_trace(rng, t);
          preemptions += st.preemptions;
          hits += st.cache_hit_tokens;
          ++trials;
        }
      }
    }
  }
  std::printf("%zu traces: %zu preemptions, %zu prompt tokens from the prefix cache\n", trials,
              preemptions, hits);
  EXPECT_GT(preemptions, 0u);
  EXPECT_GT(hits, 0u);
}

// Preemption and the prefix cache, each seen to happen (the property test above would pass
// vacuously if neither ever did).
TEST(Serve, TightPoolsPreemptAndSharedPrefixesHitTheCache) {
  prepack::scheduler_options so;
  so.token_budget = 32;
  so.max_seqs = 8;
  so.n_blocks = 12;
  so.block_size = 4;
  scheduler s(so);
  checking_engine engine(so.n_blocks, so.block_size);
  std::vector<prepack::request> reqs;
  const std::vector<std::int32_t> stem{1, 2, 3, 4, 5, 6, 7, 8, 9};
  for (int i = 0; i < 6; ++i) {
    prepack::request r{i, stem, 12, std::nullopt};
    r.prompt.push_back(10 + i);
    reqs.push_back(r);
  }
  std::map<std::int64_t, std::vector<std::int32_t>> got;
  s.add(reqs[0]);
  std::size_t preempted = 0;
  for (int step = 0; !s.idle() || step < 3; ++step) {
    if (step == 2) {
      for (int i = 1; i < 6; ++i) s.add(reqs[static_cast<std::size_t>(i)]);
    }
    const auto st = s.next_step();
    preempted += st.preempted.size();
    const auto sampled = engine.run(st.inputs);
    for (const auto& f : s.commit(prepack::span<const std::int32_t>(sampled)))
      got[f.id] = f.generated;
  }
  for (const auto& r : reqs) EXPECT_EQ(got[r.id], alone(r)) << r.id;
  EXPECT_GT(s.stats().cache_hit_tokens, 0u) << "request 0's prompt blocks were not reused";
  EXPECT_GT(preempted, 0u) << "a pool of 12 blocks for 6 x 22 positions should preempt";
  EXPECT_EQ(s.stats().preemptions, preempted);
  EXPECT_EQ(s.blocks().available(), so.n_blocks);
}

// A block's key is everything before it: the same tokens after another prefix are another
// block. Prompts built from four blocks' worth of tokens in every order: a cache that keyed a
// block by its own tokens alone would hand a request a block computed after the wrong prefix.
TEST(Serve, TheSameTokensAfterAnotherPrefixAreNotACacheHit) {
  prepack::scheduler_options so;
  so.token_budget = 16;
  so.n_blocks = 64;
  so.block_size = 4;
  scheduler s(so);
  checking_engine engine(so.n_blocks, so.block_size);
  const std::vector<std::vector<std::int32_t>> parts{{1, 2, 3, 4}, {5, 6, 7, 8}, {9, 9, 9, 9}};
  std::vector<prepack::request> reqs;
  std::int64_t id = 0;
  for (int a = 0; a < 3; ++a) {
    for (int b = 0; b < 3; ++b) {
      for (int c = 0; c < 3; ++c) {
        prepack::request r{id++, {}, 3, std::nullopt};
        for (int k : {a, b, c}) r.prompt.insert(r.prompt.end(), parts[k].begin(), parts[k].end());
        r.prompt.push_back(42);
        reqs.push_back(r);
      }
    }
  }
  std::map<std::int64_t, std::vector<std::int32_t>> got;
  std::size_t next = 0;
  while (next < reqs.size() || !s.idle()) {
    if (next < reqs.size()) s.add(reqs[next++]);
    const auto st = s.next_step();
    const auto sampled = engine.run(st.inputs);
    for (const auto& f : s.commit(prepack::span<const std::int32_t>(sampled)))
      got[f.id] = f.generated;
  }
  for (const auto& r : reqs) EXPECT_EQ(got[r.id], alone(r)) << r.id;
  EXPECT_GT(s.stats().cache_hit_tokens, 0u);
}

TEST(Serve, ThePackedPolicyChunksOnlyWhatCannotFit) {
  // Budget 10; waiting prompts of 7, 6, 3 and 2 tokens. packed: 7 + 3 in the first step (the
  // longest that fits, then the longest that fits the 3 left), nothing chunked; fcfs: 7 whole,
  // then 3 of the 6 (chunked).
  const auto first_step = [](admission pol) {
    prepack::scheduler_options so;
    so.token_budget = 10;
    so.n_blocks = 64;
    so.block_size = 4;
    so.policy = pol;
    scheduler s(so);
    const std::vector<std::size_t> lens{7, 6, 3, 2};
    for (std::size_t i = 0; i < lens.size(); ++i) {
      s.add({static_cast<std::int64_t>(i), std::vector<std::int32_t>(lens[i], 1), 1, std::nullopt});
    }
    const auto st = s.next_step();
    std::vector<std::pair<std::int64_t, std::int32_t>> out;
    for (std::size_t q = 0; q < st.inputs.n_seqs(); ++q) {
      out.push_back({st.inputs.seq_id[q], st.inputs.query_lens[q]});
    }
    return out;
  };
  using v = std::vector<std::pair<std::int64_t, std::int32_t>>;
  EXPECT_EQ(first_step(admission::packed), (v{{0, 7}, {2, 3}}));
  EXPECT_EQ(first_step(admission::fcfs), (v{{0, 7}, {1, 3}}));
  EXPECT_EQ(first_step(admission::shortest_first), (v{{3, 2}, {2, 3}, {0, 5}}));
}

TEST(ServeErrors, RefusedWithTheRequestAndItsSizes) {
  prepack::scheduler_options so;
  so.n_blocks = 4;
  so.block_size = 16;
  scheduler s(so);
  EXPECT_PREPACK_ERROR(s.add({7, std::vector<std::int32_t>(60, 1), 10, std::nullopt}),
                       "request 7: 60 prompt tokens + 10 new need 5 blocks of 16, the pool has 4");
  EXPECT_PREPACK_ERROR(s.add({8, {}, 10, std::nullopt}), "request 8: empty prompt");
  EXPECT_PREPACK_ERROR(s.add({9, {1}, 0, std::nullopt}), "request 9: max_new_tokens 0");
  s.add({1, {1, 2, 3}, 2, std::nullopt});
  EXPECT_PREPACK_ERROR(s.add({1, {1}, 1, std::nullopt}), "request 1: already queued or running");
  const auto st = s.next_step();
  EXPECT_PREPACK_ERROR(s.next_step(), "the previous step is not committed");
  const std::vector<std::int32_t> two{5, 6};
  EXPECT_PREPACK_ERROR(s.commit(prepack::span<const std::int32_t>(two)),
                       "2 sampled tokens for a step that samples 1");
  const std::vector<std::int32_t> one{5};
  EXPECT_TRUE(s.commit(prepack::span<const std::int32_t>(one)).empty());
  EXPECT_PREPACK_ERROR(prepack::scheduler({0, 1, 4, 16}), "token budget 0");
  EXPECT_PREPACK_ERROR(prepack::scheduler({8, 0, 4, 16}), "max_seqs 0");
  EXPECT_PREPACK_ERROR(prepack::scheduler({8, 1, 0, 16}), "block pool: no blocks");
  EXPECT_PREPACK_ERROR(prepack::scheduler({8, 1, 4, 0}), "block size 0");
  (void)st;
}

// The block pool alone: lowest free first, references, LRU eviction of leaves only.
TEST(BlockPool, ReferencesCachingAndLeafFirstEviction) {
  prepack::block_pool p(4, 2, true);
  const auto a = *p.allocate(), b = *p.allocate(), c = *p.allocate();
  EXPECT_EQ((std::vector<std::int32_t>{a, b, c}), (std::vector<std::int32_t>{0, 1, 2}));
  const std::vector<std::int32_t> t1{1, 2}, t2{3, 4};
  EXPECT_TRUE(p.insert(a, -1, prepack::span<const std::int32_t>(t1)));
  EXPECT_TRUE(p.insert(b, a, prepack::span<const std::int32_t>(t2)));
  EXPECT_FALSE(p.insert(c, -1, prepack::span<const std::int32_t>(t1)));  // content cached already
  EXPECT_EQ(p.find(-1, prepack::span<const std::int32_t>(t1)), a);
  EXPECT_EQ(p.find(a, prepack::span<const std::int32_t>(t2)), b);
  EXPECT_EQ(p.find(b, prepack::span<const std::int32_t>(t2)), -1);
  p.release(a);
  p.release(b);
  p.release(c);
  EXPECT_EQ(p.free(), 2u);  // c and the never-used 3
  EXPECT_EQ(p.cached_unreferenced(), 2u);
  EXPECT_EQ(*p.allocate(), 2);
  EXPECT_EQ(*p.allocate(), 3);
  // The pool is out of free blocks: eviction takes b (the leaf) before a (b follows a).
  EXPECT_EQ(*p.allocate(), b);
  EXPECT_EQ(p.find(a, prepack::span<const std::int32_t>(t2)), -1);
  EXPECT_EQ(*p.allocate(), a);
  EXPECT_FALSE(p.allocate().has_value());
  EXPECT_PREPACK_ERROR(prepack::block_pool(2, 2, true).release(0), "released without a reference");
}

// A parent that is not a cached block is refused as prepack::error (it was std::out_of_range):
// a block held but private, one never handed out, one outside the pool, and the block itself.
TEST(BlockPool, InsertAfterABlockNotCachedIsRefused) {
  prepack::block_pool p(4, 1, true);
  const auto a = *p.allocate(), b = *p.allocate();
  const std::vector<std::int32_t> t{7};
  const prepack::span<const std::int32_t> one(t);
  for (const std::int32_t parent : {a, std::int32_t{3}, std::int32_t{9}, b}) {
    EXPECT_PREPACK_ERROR(p.insert(b, parent, one), "which is not a cached block");
  }
  EXPECT_EQ(p.cached(), 0u);
  EXPECT_TRUE(p.insert(a, -1, one));
  EXPECT_TRUE(p.insert(b, a, one));
  EXPECT_PREPACK_ERROR(p.insert(9, -1, one), "block pool: block 9 outside the pool of 4");
}

// available() is what allocate() gives, and drop_cache() frees every unreferenced cached block,
// also when a cached block's prefix is idle while the block itself is held (an engine using the
// pool directly): the prefix is reclaimed and the held block leaves the cache with it.
TEST(BlockPool, IdlePrefixOfAHeldBlockIsReclaimable) {
  const std::vector<std::int32_t> t0{1}, t1{2};
  {
    prepack::block_pool p(2, 1, true);
    const auto b0 = *p.allocate(), b1 = *p.allocate();
    ASSERT_TRUE(p.insert(b0, -1, prepack::span<const std::int32_t>(t0)));
    ASSERT_TRUE(p.insert(b1, b0, prepack::span<const std::int32_t>(t1)));
    p.release(b0);  // b1 still held
    EXPECT_EQ(p.available(), 1u);
    EXPECT_EQ(p.allocate(), std::optional<std::int32_t>(b0));
    EXPECT_FALSE(p.is_cached(b1));  // its key named b0, which now holds other content
    EXPECT_EQ(p.find(b0, prepack::span<const std::int32_t>(t1)), -1);
    EXPECT_EQ(p.available(), 0u);
    EXPECT_FALSE(p.allocate().has_value());
    p.release(b1);  // private now: freed, not cached
    EXPECT_EQ(p.free(), 1u);
  }
  {
    prepack::block_pool p(2, 1, true);
    const auto b0 = *p.allocate(), b1 = *p.allocate();
    ASSERT_TRUE(p.insert(b0, -1, prepack::span<const std::int32_t>(t0)));
    ASSERT_TRUE(p.insert(b1, b0, prepack::span<const std::int32_t>(t1)));
    p.release(b0);
    EXPECT_EQ(p.drop_cache(), 1u);
    EXPECT_EQ(p.cached(), 0u);
    EXPECT_EQ(p.references(b1), 1u);
    p.release(b1);
    EXPECT_EQ(p.free(), 2u);
    EXPECT_EQ(p.available(), 2u);
  }
}

// With aligned chunks every prefill chunk but a request's last is whole blocks, so every step
// goes to TensorRT-LLM's form (budget 5, blocks of 4: the first chunk of a 10-token prompt is
// 4 tokens, not 5); without, the same stream gives a 5-token chunk TensorRT-LLM refuses.
TEST(Serve, AlignedChunksAreWholeBlocksForTensorRTLLM) {
  for (const bool aligned : {true, false}) {
    prepack::scheduler_options so;
    so.token_budget = 5;
    so.block_size = 4;
    so.n_blocks = 16;
    so.aligned_chunks = aligned;
    scheduler s(so);
    prepack::request r;
    r.id = 1;
    r.prompt.assign(10, 3);
    r.max_new_tokens = 3;
    s.add(r);
    std::size_t steps = 0;
    bool refused = false;
    while (!s.idle()) {
      const auto st = s.next_step();
      ASSERT_FALSE(st.empty());
      if (steps++ == 0) {
        EXPECT_EQ(st.inputs.query_lens[0], aligned ? 4 : 5);
      }
      try {
        prepack::trtllm::make_step(st.inputs);
      } catch (const prepack::error& e) {
        refused = true;
        EXPECT_NE(std::string(e.what()).find("is not a whole number of blocks of 4"),
                  std::string::npos);
      }
      std::vector<std::int32_t> sampled(st.n_samples, 2);
      s.commit(prepack::span<const std::int32_t>(sampled));
    }
    EXPECT_EQ(refused, !aligned);
  }
  prepack::scheduler_options bad;
  bad.token_budget = 3;
  bad.block_size = 4;
  bad.n_blocks = 4;
  bad.aligned_chunks = true;
  EXPECT_PREPACK_ERROR(scheduler{bad},
                       "aligned chunks need a block (4 tokens) within the token budget (3)");
}

// A request preempted after generating is recomputed from its prompt and what it generated:
// prompt_lens stays its prompt (vLLM's num_prompt_tokens) while the chunk covers more, and
// TensorRT-LLM's context_lengths is the chunk's own tokens, never below what it computes.
TEST(Serve, RecomputedRequestsKeepTheirPromptLength) {
  prepack::scheduler_options so;
  so.token_budget = 8;
  so.block_size = 1;
  so.n_blocks = 6;
  so.prefix_cache = false;
  scheduler s(so);
  prepack::request a, b;
  a.id = 1;
  a.prompt = {1, 2};
  a.max_new_tokens = 4;
  b.id = 2;
  b.prompt = {3, 4};
  b.max_new_tokens = 4;
  s.add(a);
  s.add(b);
  bool recomputed = false;
  while (!s.idle()) {
    const auto st = s.next_step();
    const auto t = prepack::trtllm::make_step(st.inputs);
    for (std::size_t r = 0; r < t.seq_order.size(); ++r) {
      const std::size_t q = t.seq_order[r];
      EXPECT_EQ(st.inputs.prompt_lens[q], 2);
      if (!st.inputs.decodes[q]) {
        EXPECT_EQ(t.context_lengths[r], t.seq_lens[r]);
        recomputed = recomputed || st.inputs.query_lens[q] > 2;
      }
    }
    std::vector<std::int32_t> sampled(st.n_samples, 5);
    s.commit(prepack::span<const std::int32_t>(sampled));
  }
  EXPECT_TRUE(recomputed) << "the pool was meant to force a preemption after generating";
}

}  // namespace
