// Tests of prepack/step.hpp: the inputs of every step of random schedules against their
// definitions (per sequence lengths and cumulative sums, positions from the context, the
// caller's ids, logits flags, slot mapping through the block tables), the rows form of a step
// against the same definitions, and every bad input refused with the prompt named.
#include "prepack/step.hpp"

#include "prepack/prefix.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common.hpp"

namespace {

struct world {
  std::vector<std::vector<int>> tokens;  // per prompt
  prepack::block_tables tables;
  std::size_t n_blocks = 0;
};

world make_world(std::mt19937_64& rng, const std::vector<int>& len, std::size_t bs) {
  world w;
  w.tokens = test::tagged_prompts(len, 1 << 20);
  std::size_t need = 0;
  for (int l : len) need += prepack::blocks_for(static_cast<std::size_t>(l), bs);
  w.n_blocks = need + 3;
  std::vector<std::int32_t> ids(w.n_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<std::vector<std::int32_t>> rows;
  std::size_t next = 0;
  for (int l : len) {
    rows.emplace_back();
    for (std::size_t k = 0; k < prepack::blocks_for(static_cast<std::size_t>(l), bs); ++k)
      rows.back().push_back(ids[next++]);
  }
  w.tables = prepack::make_block_tables(rows, bs);
  return w;
}

TEST(Step, InputsOfEveryStepMatchTheirDefinitions) {
  std::mt19937_64 rng(81);
  for (int trial = 0; trial < 120; ++trial) {
    const auto len = test::random_lengths(rng, 1 + rng() % 12, 1, 90);
    const std::size_t bs = std::size_t{1} + rng() % 17;
    const world w = make_world(rng, len, bs);
    std::vector<std::int64_t> ids(len.size());
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = 7000 + 3 * static_cast<std::int64_t>(i);
    const auto policy = trial % 2 ? prepack::chunking::fill : prepack::chunking::whole_first;
    const auto sched = prepack::budgeted_schedule(len, {1 + rng() % 64, policy});
    std::vector<std::size_t> seen(len.size(), 0);
    std::vector<int> logits_of(len.size(), 0);
    for (std::size_t s = 0; s < sched.n_steps(); ++s) {
      const auto in = prepack::make_step_inputs(sched, s, w.tokens, w.tables, w.n_blocks,
                                                {prepack::span<const std::int64_t>(ids)});
      ASSERT_EQ(in.n_seqs(), sched.step(s).size());
      ASSERT_EQ(in.cu_seqlens_q.front(), 0);
      std::size_t t = 0;
      for (std::size_t q = 0; q < in.n_seqs(); ++q) {
        const auto& c = sched.step(s)[q];
        const std::size_t i = in.seq_item[q];
        ASSERT_EQ(i, c.item);
        ASSERT_EQ(static_cast<std::size_t>(in.context_lens[q]), seen[i]) << "context = cached";
        ASSERT_EQ(in.seq_lens[q], in.context_lens[q] + in.query_lens[q]);
        ASSERT_EQ(in.cu_seqlens_q[q + 1] - in.cu_seqlens_q[q], in.query_lens[q]);
        ASSERT_EQ(in.cu_seqlens_k[q + 1] - in.cu_seqlens_k[q], in.seq_lens[q]);
        ASSERT_LE(in.query_lens[q], in.max_seqlen_q);
        ASSERT_LE(in.seq_lens[q], in.max_seqlen_k);
        ASSERT_EQ(in.seq_id[q], ids[i]);
        for (int k = 0; k < in.query_lens[q]; ++k, ++t) {
          const std::size_t pos = seen[i] + static_cast<std::size_t>(k);
          ASSERT_EQ(in.tokens[t], w.tokens[i][pos]);
          ASSERT_EQ(static_cast<std::size_t>(in.positions[t]), pos);
          ASSERT_EQ(in.token_seq_id[t], ids[i]);
          const auto block = static_cast<std::size_t>(w.tables.row(i)[pos / bs]);
          ASSERT_EQ(static_cast<std::size_t>(in.slot_mapping[t]), block * bs + pos % bs);
          logits_of[i] += in.logits[t];
          if (in.logits[t]) {
            ASSERT_EQ(pos + 1, static_cast<std::size_t>(len[i]));
          }
        }
        seen[i] += static_cast<std::size_t>(in.query_lens[q]);
      }
      ASSERT_EQ(t, in.n_tokens());
      // The rows form of the same step: same tokens, positions and slots, pads at -1.
      const auto rows = prepack::make_step_layout(sched, s, w.tokens, w.tables, w.n_blocks);
      ASSERT_EQ(rows.layout.n_prompts(), in.n_seqs());
      for (std::size_t q = 0; q < in.n_seqs(); ++q) {
        ASSERT_EQ(rows.seq_item[q], in.seq_item[q]);
        ASSERT_EQ(rows.layout.prompt_context()[q], in.context_lens[q]);
        const std::size_t first = rows.layout.first_slot(q);
        for (int k = 0; k < in.query_lens[q]; ++k) {
          const auto t2 = static_cast<std::size_t>(in.cu_seqlens_q[q] + k);
          ASSERT_EQ(rows.layout.tokens()[first + static_cast<std::size_t>(k)], in.tokens[t2]);
          ASSERT_EQ(rows.layout.positions()[first + static_cast<std::size_t>(k)], in.positions[t2]);
          ASSERT_EQ(rows.slots.slots()[first + static_cast<std::size_t>(k)], in.slot_mapping[t2]);
        }
      }
      for (std::size_t x = 0; x < rows.layout.n_slots(); ++x) {
        if (rows.layout.segments()[x] < 0) {
          ASSERT_EQ(rows.slots.slots()[x], -1);
        }
      }
    }
    for (std::size_t i = 0; i < len.size(); ++i) {
      ASSERT_EQ(seen[i], static_cast<std::size_t>(len[i]));
      ASSERT_EQ(logits_of[i], 1) << "one logits row per prompt";
    }
  }
}

TEST(StepErrors, RefusedBeforeAnythingIsBuilt) {
  const std::vector<int> len{10, 4};
  const auto tokens = test::tagged_prompts(len, 100);
  const auto sched = prepack::budgeted_schedule(len, {6, prepack::chunking::fill});
  // 4-slot blocks: prompt 0 needs 3 blocks, prompt 1 one.
  const auto good = prepack::make_block_tables({{0, 1, 2}, {3}}, 4);
  EXPECT_NO_THROW(prepack::make_step_inputs(sched, 1, tokens, good, 4));
  EXPECT_PREPACK_ERROR(prepack::make_step_inputs(sched, 5, tokens, good, 4), "step 5 outside");
  const auto short_table = prepack::make_block_tables({{0, 1}, {3}}, 4);
  EXPECT_PREPACK_ERROR(
      prepack::make_step_inputs(sched, 1, tokens, short_table, 4),
      "prompt 0: positions up to 10 need 3 blocks of 4, its block table has 2 entries");
  const auto shared = prepack::make_block_tables({{0, 1, 2}, {2}}, 4);
  EXPECT_PREPACK_ERROR(prepack::make_step_inputs(sched, 1, tokens, shared, 4),
                       "prompt 1: block 2 is also written by prompt 0");
  const auto twice = prepack::make_block_tables({{0, 1, 1}, {3}}, 4);
  EXPECT_PREPACK_ERROR(prepack::make_step_inputs(sched, 1, tokens, twice, 4),
                       "prompt 0: block 1 appears twice in its block table");
  EXPECT_PREPACK_ERROR(prepack::make_step_inputs(sched, 1, tokens, good, 3),
                       "prompt 1: block_table[0] = 3 outside the pool's blocks 0..2");
  auto wrong_count = tokens;
  wrong_count[1].pop_back();
  EXPECT_PREPACK_ERROR(prepack::make_step_inputs(sched, 1, wrong_count, good, 4),
                       "prompt 1: 3 tokens, the schedule says 4");
  auto edited = sched;
  edited.chunks[edited.step_begin[1]].context = 9;  // a context past what was cached
  EXPECT_PREPACK_ERROR(prepack::make_step_inputs(edited, 1, tokens, good, 4),
                       "prompt 0: chunk context 9 is not the item's context 0 + its start 6");
  auto past = sched;
  past.chunks[past.step_begin[1]].start = 8;  // runs past the prompt's 10 tokens
  EXPECT_PREPACK_ERROR(prepack::make_step_inputs(past, 1, tokens, good, 4), "runs past its 10");
  const std::vector<std::int64_t> one_id{5};
  EXPECT_PREPACK_ERROR(prepack::make_step_inputs(sched, 0, tokens, good, 4,
                                                 {prepack::span<const std::int64_t>(one_id)}),
                       "sequence ids: 1 for 2 items");
  const auto wide = test::tagged_prompts({10, 4}, 1000);
  EXPECT_PREPACK_ERROR((prepack::make_step_inputs<std::int8_t>(sched, 0, wide, good, 4)),
                       "does not fit the token type");
}

// A sequence that reads as cached context a block another sequence writes in the same step would
// read what the step overwrites: refused before anything is built.
// Engines that write a step's K and V before attention reads them (vLLM, FlashInfer, SGLang)
// take a step whose sequence reads a block another writes (vLLM schedules a prefix-cache hit on
// a block computed in the same step); prepack refuses it unless asked.
TEST(Step, WritesBeforeReadsLetsASequenceReadABlockWrittenInTheStep) {
  std::vector<prepack::schedule_item> items(2);
  items[0].length = 6;
  items[0].prompt = 0;
  items[1].length = 3;
  items[1].context = 4;
  items[1].prompt = 1;
  const auto sched =
      prepack::budgeted_schedule(prepack::span<const prepack::schedule_item>(items), {16});
  ASSERT_EQ(sched.n_steps(), 1u);
  const std::vector<std::vector<int>> toks{{1, 2, 3, 4, 5, 6}, {7, 8, 9}};
  const auto tables = prepack::make_block_tables({{1, 2}, {1, 3}}, 4);
  EXPECT_PREPACK_ERROR(prepack::make_step_inputs(sched, 0, toks, tables, 4),
                       "prompt 1: block 1 (entry 0) holds context it reads, but prompt 0 writes "
                       "that block in this step");
  prepack::step_options opt;
  opt.writes_before_reads = true;
  const auto in = prepack::make_step_inputs(sched, 0, toks, tables, 4, opt);
  EXPECT_EQ(in.context_lens[1], 4);
  EXPECT_EQ(in.slot_mapping[6], 3 * 4 + 0);  // position 4 of prompt 1: block 3
  // Two writers of one block stay refused.
  const auto clash = prepack::make_block_tables({{1, 2}, {1, 2}}, 4);
  EXPECT_PREPACK_ERROR(prepack::make_step_inputs(sched, 0, toks, clash, 4, opt),
                       "block 2 is also written by prompt 0");
}

// A step an engine's scheduler decided, in its order: each sequence's tokens at its positions
// over its own blocks, as a schedule's step with the same chunks gives them.
TEST(Step, SequenceInputsEqualTheScheduleStepOfTheSameChunks) {
  std::vector<prepack::schedule_item> items(2);
  items[0].length = 6;
  items[0].prompt = 0;
  items[1].length = 3;
  items[1].context = 5;
  items[1].prompt = 1;
  const auto sched =
      prepack::budgeted_schedule(prepack::span<const prepack::schedule_item>(items), {16});
  ASSERT_EQ(sched.n_steps(), 1u);
  const std::vector<std::vector<int>> toks{{1, 2, 3, 4, 5, 6}, {7, 8, 9}};
  const auto tables = prepack::make_block_tables({{1, 2}, {3, 4}}, 4);
  const auto want = prepack::make_step_inputs(sched, 0, toks, tables, 8);
  std::vector<prepack::scheduled_sequence<int>> seqs(2);
  for (std::size_t q = 0; q < 2; ++q) {
    const std::size_t i = want.seq_item[q];
    seqs[q] = {static_cast<std::int64_t>(i),
               items[i].context,
               prepack::span<const int>(toks[i]),
               tables.blocks(i),
               items[i].context + items[i].length,
               true,
               false};
  }
  const auto got = prepack::make_sequence_inputs(
      prepack::span<const prepack::scheduled_sequence<int>>(seqs), 4, 8);
  EXPECT_EQ(got.seq_id, want.seq_id);
  EXPECT_EQ(got.context_lens, want.context_lens);
  EXPECT_EQ(got.cu_seqlens_q, want.cu_seqlens_q);
  EXPECT_EQ(got.positions, want.positions);
  EXPECT_EQ(got.slot_mapping, want.slot_mapping);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.logits, want.logits);
  EXPECT_EQ(got.prompt_lens, want.prompt_lens);
  EXPECT_EQ(got.tables.table, want.tables.table);
  // Malformed: a table short of the positions, a block past the pool, a read-write hazard.
  const std::vector<std::int32_t> short_row{1}, far_row{1, 9}, shared{3, 5};
  seqs[want.seq_item[0] == 0 ? 0 : 1].blocks = prepack::span<const std::int32_t>(short_row);
  const auto run = [&] {
    return prepack::make_sequence_inputs(
        prepack::span<const prepack::scheduled_sequence<int>>(seqs), 4, 8);
  };
  EXPECT_PREPACK_ERROR(run(), "sequence 0: positions up to 6 need 2 blocks of 4");
  seqs[want.seq_item[0] == 0 ? 0 : 1].blocks = prepack::span<const std::int32_t>(far_row);
  EXPECT_PREPACK_ERROR(run(), "sequence 0: block_table[1] = 9 outside the pool's blocks 0..7");
  seqs[want.seq_item[0] == 0 ? 0 : 1].blocks = prepack::span<const std::int32_t>(shared);
  EXPECT_PREPACK_ERROR(run(), "holds context it reads, but sequence 0 writes that block");
  EXPECT_NO_THROW(prepack::make_sequence_inputs(
      prepack::span<const prepack::scheduled_sequence<int>>(seqs), 4, 8, true));
}

TEST(StepErrors, ReadWriteHazardIsRefused) {
  // Prompt 0 (8 tokens) is chunked 6 + 2; prompt 1 (4 tokens) runs in step 1 beside chunk 2.
  std::vector<prepack::schedule_item> items(2);
  items[0].length = 8;
  items[0].prompt = 0;
  items[1].length = 4;
  items[1].prompt = 1;
  const auto sched = prepack::budgeted_schedule(items, {6, prepack::chunking::fill});
  const auto tokens = test::tagged_prompts({8, 4}, 100);
  ASSERT_EQ(sched.n_steps(), 2u);
  // In step 1 prompt 0 reads block 0 (positions 0..3) as context; prompt 1 writing block 0 too
  // is a hazard, whichever step wrote it before.
  const auto hazard = prepack::make_block_tables({{0, 1}, {0}}, 4);
  EXPECT_PREPACK_ERROR(prepack::make_step_inputs(sched, 1, tokens, hazard, 4),
                       "prompt 0: block 0 (entry 0) holds context it reads, but prompt 1 writes "
                       "that block");
  const auto fine = prepack::make_block_tables({{0, 1}, {2}}, 4);
  EXPECT_NO_THROW(prepack::make_step_inputs(sched, 1, tokens, fine, 4));
}

// Step inputs cost the step's tokens and the blocks it touches, nothing in the pool's size: a
// pool of 2^31 - 1 blocks (and a block table pointing near its end) builds at once, where arrays
// of the pool's size would need 32 GiB.
TEST(Step, CostIsIndependentOfThePoolSize) {
  const std::vector<int> len{5, 3};
  const auto tokens = test::tagged_prompts(len, 100);
  const auto sched = prepack::budgeted_schedule(len, {16});
  const std::size_t huge = INT32_MAX;
  const auto tables =
      prepack::make_block_tables({{INT32_MAX - 3, INT32_MAX - 2}, {INT32_MAX - 1}}, 4);
  const auto in = prepack::make_step_inputs(sched, 0, tokens, tables, huge);
  ASSERT_EQ(in.n_tokens(), 8u);
  EXPECT_EQ(in.slot_mapping[4], static_cast<std::int64_t>(INT32_MAX - 2) * 4 + 0);
}

// Shared-prefix items are not prompts: no logits row, no `completes`, an id apart, named as
// items; a prefix that is a whole prompt yields that prompt's logits; identical prompts each map
// to the row of the item they end at.
TEST(Step, PrefixItemsAreKeptApartFromPrompts) {
  std::vector<int> shared(8);
  std::iota(shared.begin(), shared.end(), 1);
  std::vector<int> a = shared, b = shared;
  a.push_back(50);
  b.push_back(60);
  // Prompts: a, b (each the prefix and one more token), the prefix itself twice (identical).
  const std::vector<std::vector<int>> prompts{a, b, shared, shared};
  const auto plan = prepack::make_prefix_plan(prompts, {4, 4, 0});
  ASSERT_EQ(plan.n_prefixes(), 1u);
  EXPECT_FALSE(plan.items[0].prompt.has_value());
  EXPECT_TRUE(plan.items[0].ends_prompt);  // prompts 2 and 3 end there
  EXPECT_EQ(plan.ending[0], (std::vector<std::size_t>{2, 3}));
  const auto sched = prepack::budgeted_schedule(plan.items, {64});
  prepack::block_allocator alloc(16);
  const auto t = prepack::allocate_prefix_tables(plan, alloc, 0);
  const auto items = plan.item_tokens(prompts);
  const auto in0 = prepack::make_step_inputs(sched, 0, items, t.items, 16);
  ASSERT_EQ(in0.n_seqs(), 1u);
  EXPECT_EQ(in0.seq_id[0], -1);  // item 0, a prefix: -1 - 0
  EXPECT_EQ(in0.completes[0], 1);
  EXPECT_EQ(std::count(in0.logits.begin(), in0.logits.end(), 1), 1);
  const auto in1 = prepack::make_step_inputs(sched, 1, items, t.items, 16);
  ASSERT_EQ(in1.n_seqs(), 2u);
  EXPECT_EQ(in1.seq_id, (std::vector<std::int64_t>{0, 1}));  // the prompts' own indexes
  // A prefix that ends no prompt gives no logits and does not complete.
  const std::vector<std::vector<int>> two{a, b};
  const auto plan2 = prepack::make_prefix_plan(two, {4, 4, 0});
  ASSERT_EQ(plan2.n_prefixes(), 1u);
  EXPECT_FALSE(plan2.items[0].ends_prompt);
  const auto sched2 = prepack::budgeted_schedule(plan2.items, {64});
  prepack::block_allocator alloc2(16);
  const auto t2 = prepack::allocate_prefix_tables(plan2, alloc2, 0);
  const auto p0 = prepack::make_step_inputs(sched2, 0, plan2.item_tokens(two), t2.items, 16);
  EXPECT_EQ(p0.completes[0], 0);
  EXPECT_EQ(std::count(p0.logits.begin(), p0.logits.end(), 1), 0);
  // Caller ids through the plan: prompts' ids and the prefixes' own.
  const std::vector<std::int64_t> prompt_ids{100, 200};
  EXPECT_EQ(plan2.item_ids(prompt_ids), (std::vector<std::int64_t>{-1, 100, 200}));
  // An item's mistake names the item, not a prompt of the same number.
  auto bad = sched2;
  bad.chunks[0].context = 3;
  EXPECT_PREPACK_ERROR(prepack::make_step_inputs(bad, 0, plan2.item_tokens(two), t2.items, 16),
                       "item 0: chunk context 3");
}

}  // namespace
