// prepack/reference/run.hpp - whole batches through the reference model as budgeted steps over
// a paged pool: run_schedule runs every step of a schedule in order (each step's inputs built by
// prepack::make_step_inputs, as an engine would), and prefill_with_prefixes plans a batch's
// shared prefixes (prepack/prefix.hpp), prefills each once, then the suffixes over them.
// For demos, benchmarks and tests: an engine runs its own loop over the same inputs.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../paged.hpp"
#include "../prefix.hpp"
#include "../schedule.hpp"
#include "../step.hpp"
#include "decode.hpp"
#include "kv_pool.hpp"
#include "model.hpp"

PREPACK_NAMESPACE_BEGIN
namespace reference {

/// What running a schedule produced.
struct schedule_run {
  matrix item_logits;               // [n_items][vocab]  logits of each item's last token
  std::vector<double> step_end;     // [n_steps]  seconds from the start to each step's end
  std::vector<double> item_finish;  // [n_items]  seconds from the start to the item's last
                                    //            chunk's step end (its time to first token)
  std::size_t workspace_bytes = 0;  // the largest step's activations and scratch
  prefill_profile profile;          // summed over the steps
  double seconds = 0;
};

/// Runs every step of `sched` in order: item k's tokens are item_tokens[k], its blocks
/// tables.row(k), in `pool`. Throws what make_step_inputs and model::forward throw, before the
/// step that would fail writes anything.
template <class T>
schedule_run run_schedule(const model& m, const step_schedule& sched,
                          const std::vector<std::vector<T>>& item_tokens,
                          const block_tables& tables, kv_pool& pool, const exec_options& opt = {}) {
  const auto t0 = std::chrono::steady_clock::now();
  schedule_run run;
  run.item_logits = matrix::Zero(static_cast<Eigen::Index>(sched.n_items()), m.cfg().vocab);
  run.item_finish.assign(sched.n_items(), 0.0);
  for (std::size_t s = 0; s < sched.n_steps(); ++s) {
    const auto in = make_step_inputs(sched, s, item_tokens, tables, pool.n_blocks());
    const step_result r = m.forward(in, pool, opt);
    for (std::size_t k = 0; k < r.output_seq.size(); ++k) {
      run.item_logits.row(static_cast<Eigen::Index>(in.seq_item[r.output_seq[k]])) =
          r.logits.row(static_cast<Eigen::Index>(k));
    }
    run.workspace_bytes = std::max(run.workspace_bytes, r.memory.peak_bytes - r.memory.kv_bytes);
    run.profile.seconds_linear += r.profile.seconds_linear;
    run.profile.seconds_attention += r.profile.seconds_attention;
    run.profile.linear_flops += r.profile.linear_flops;
    run.profile.attention_flops += r.profile.attention_flops;
    run.profile.n_threads = r.profile.n_threads;
    run.profile.backend = r.profile.backend;
    run.step_end.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  for (std::size_t k = 0; k < sched.n_items(); ++k) {
    run.item_finish[k] = run.step_end[sched.finish_step[k]];
  }
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  run.profile.seconds_total = run.seconds;
  return run;
}

/// A batch prefilled with its shared prefixes computed once.
struct prefix_prefill {
  prefix_plan plan;
  step_schedule sched;
  paged_cache cache;  // every prompt's cache (shared prefix blocks in several tables)
  matrix logits;      // [n_prompts][vocab]  each prompt's last-token logits
  std::vector<double> prompt_finish;  // [n_prompts]  seconds to each prompt's first token
  schedule_run run;
};

/// Plans the shared prefixes of `prompts`, schedules prefixes then suffixes into steps of at
/// most budget.budget tokens (0: one step per level: all prefixes, then all suffixes), and runs
/// them over a pool holding every prompt plus `extra` positions each. Throws what
/// make_prefix_plan, budgeted_schedule and run_schedule throw.
template <class T>
prefix_prefill prefill_with_prefixes(const model& m, const std::vector<std::vector<T>>& prompts,
                                     const prefix_options& popt, budget_options bopt,
                                     std::size_t extra = 0, const exec_options& opt = {}) {
  prefix_prefill out;
  out.plan = make_prefix_plan(prompts, popt);
  if (bopt.budget == 0) bopt.budget = std::max<std::size_t>(1, out.plan.tokens_computed());
  out.sched = budgeted_schedule(out.plan.items, bopt);
  check_schedule(out.sched);
  // Blocks: every prefix once, every prompt's own rest and `extra`.
  std::size_t need = 0;
  for (const auto& p : out.plan.prefixes) need += p.length / popt.block_size;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    need += blocks_for(prompts[i].size() + extra, popt.block_size);
  }
  block_allocator alloc(std::max<std::size_t>(need, 1));
  const prefix_tables tables = allocate_prefix_tables(out.plan, alloc, extra);
  check_prefix_tables(out.plan, tables.items);
  out.cache.pool = kv_pool(m.cfg(), alloc.n_blocks(), popt.block_size);
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const auto row = tables.prompts.blocks(i);
    out.cache.seqs.push_back({std::vector<std::int32_t>(row.begin(), row.end()), 0});
  }
  out.run =
      run_schedule(m, out.sched, out.plan.item_tokens(prompts), tables.items, out.cache.pool, opt);
  out.logits = matrix(static_cast<Eigen::Index>(prompts.size()), m.cfg().vocab);
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const std::size_t item = out.plan.prompt_last_item[i];
    out.logits.row(static_cast<Eigen::Index>(i)) =
        out.run.item_logits.row(static_cast<Eigen::Index>(item));
    out.prompt_finish.push_back(out.run.item_finish[item]);
    out.cache.seqs[i].length = prompts[i].size();
  }
  return out;
}

}  // namespace reference
PREPACK_NAMESPACE_END
