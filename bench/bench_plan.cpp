// Planning throughput: first-fit-decreasing, best-fit-decreasing and fitted_plan (FFD, rows
// widened to 5% padding) over 10^3 .. 10^6 prompts of the heavy-tailed profile (lengths up to
// 2048), plus layout building. Google Benchmark
// fits the growth (expect n log n). Goal: 10^6 prompts planned in under 0.3 s.
#include <benchmark/benchmark.h>

#include <vector>

#include "prepack/prepack.hpp"
#include "support/main.hpp"
#include "support/workload.hpp"

namespace {

std::vector<int> lengths(std::int64_t n, support::profile profile = support::profile::heavy) {
  return support::generate_lengths(profile, static_cast<std::size_t>(n), 42, 512);
}

// One planner over n prompts of a profile; `plan` maps the lengths to a plan.
template <class Planner>
void BM_Plan(benchmark::State& state, Planner plan, support::profile profile) {
  const auto len = lengths(state.range(0), profile);
  for (auto _ : state) {
    auto p = plan(len);
    benchmark::DoNotOptimize(p.fill.data());
  }
  state.SetComplexityN(state.range(0));
  state.counters["prompts_per_s"] = benchmark::Counter(
      static_cast<double>(state.range(0)), benchmark::Counter::kIsIterationInvariantRate);
}

const auto ffd = [](const std::vector<int>& len) { return prepack::first_fit_decreasing(len); };
const auto bfd = [](const std::vector<int>& len) { return prepack::best_fit_decreasing(len); };
// Rows widened to at most 5% pad slots: one sort, then a bisection of packings.
const auto fitted = [](const std::vector<int>& len) {
  return prepack::fitted_plan(prepack::packer::first_fit_decreasing, len);
};

// Plan + packed layout (tokens, positions, segments), the std-only work before a prefill.
void BM_PlanAndLayout(benchmark::State& state) {
  const auto len = lengths(state.range(0));
  std::size_t total = 0;
  for (int l : len) total += static_cast<std::size_t>(l);
  const std::vector<int> tokens(total, 7);
  for (auto _ : state) {
    const auto plan = prepack::first_fit_decreasing(len);
    auto layout = prepack::make_layout(plan, tokens);
    benchmark::DoNotOptimize(layout.tokens().data());
  }
  state.SetComplexityN(state.range(0));
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(total), benchmark::Counter::kIsIterationInvariantRate);
}

// One step's inputs (64 sequences of 32 new tokens over 2 KiB contexts, blocks of 16) over pools of
// 10^4 and 10^7 blocks: the same step, the same blocks, so the time must not grow with the pool.
// Then every engine's form of that step.
void BM_StepInputs(benchmark::State& state) {
  const auto pool = static_cast<std::size_t>(state.range(0));
  const std::size_t n = 64, q = 32, ctx = 2048, bs = 16;
  std::vector<prepack::schedule_item> items(n);
  std::vector<std::vector<int>> tokens(n, std::vector<int>(q, 5));
  std::vector<std::vector<std::int32_t>> rows(n);
  for (std::size_t i = 0; i < n; ++i) {
    items[i].length = q;
    items[i].context = ctx;
    items[i].prompt = i;
    const std::size_t nb = prepack::blocks_for(ctx + q, bs), spread = pool / (n * nb);
    for (std::size_t k = 0; k < nb; ++k) {  // distinct blocks, spread over the whole pool
      rows[i].push_back(static_cast<std::int32_t>(1 + (i * nb + k) * spread));  // 0: null block
    }
  }
  const auto tables = prepack::make_block_tables(rows, bs);
  const auto sched = prepack::budgeted_schedule(items, {n * q});
  for (auto _ : state) {
    auto in = prepack::make_step_inputs(sched, 0, tokens, tables, pool);
    benchmark::DoNotOptimize(in.slot_mapping.data());
    if (state.range(1) != 0) {
      auto v = prepack::vllm::make_step(in);
      auto f = prepack::flashinfer::make_step(in);
      prepack::trtllm::options o;
      o.num_layers = 8;
      auto t = prepack::trtllm::make_step(in, o);
      benchmark::DoNotOptimize(v.slot_mapping.data());
      benchmark::DoNotOptimize(f.attention.paged_kv_indices.data());
      benchmark::DoNotOptimize(t.kv_cache_block_offsets.data());
    }
  }
  state.counters["pool_blocks"] = static_cast<double>(pool);
}
// The calls the Python package's overhead is measured against (bench_hf.py --overhead runs the
// same calls from Python on the same inputs): pack of 10^5 heavy-cut prompts (seed 1, max 512)
// given as flat int32 tokens and int64 lengths, as prepack.pack(tokens, lengths=...) takes them;
// and the inputs of the first step of a 512-token budget over 64 such prompts (fill, blocks of 16
// handed out lowest first), as prepack.step_inputs gives them.
void BM_PythonPack(benchmark::State& state) {
  const auto len32 = support::generate_lengths(support::profile::heavy_cut,
                                               static_cast<std::size_t>(state.range(0)), 1, 512);
  const std::vector<std::int64_t> len(len32.begin(), len32.end());
  std::size_t total = 0;
  for (auto l : len) total += static_cast<std::size_t>(l);
  std::vector<std::int32_t> tokens(total);
  for (std::size_t k = 0; k < total; ++k) tokens[k] = static_cast<std::int32_t>(k % 32000);
  for (auto _ : state) {
    const auto plan = prepack::first_fit_decreasing(len);
    auto l = prepack::make_layout<std::int64_t, std::int64_t>(
        plan, prepack::span<const std::int32_t>(tokens));
    benchmark::DoNotOptimize(l.tokens().data());
  }
  state.counters["tokens"] = static_cast<double>(total);
}
BENCHMARK(BM_PythonPack)->Arg(100000)->Unit(benchmark::kMillisecond);

void BM_PythonStepInputs(benchmark::State& state) {
  const auto len = support::generate_lengths(support::profile::heavy_cut, 64, 1, 512);
  const auto prompts = support::generate_prompts(len, 32000, 1);
  std::vector<std::vector<std::int32_t>> items(prompts.begin(), prompts.end());
  for (std::size_t i = 0; i < prompts.size(); ++i)
    items[i].assign(prompts[i].begin(), prompts[i].end());
  const std::size_t bs = 16, n_blocks = 4096;
  prepack::block_allocator alloc(n_blocks);
  std::vector<std::vector<std::int32_t>> rows;
  for (int l : len)
    rows.push_back(alloc.allocate(prepack::blocks_for(static_cast<std::size_t>(l), bs)));
  const auto tables = prepack::make_block_tables(rows, bs);
  const auto sched = prepack::budgeted_schedule(
      len, {static_cast<std::size_t>(state.range(0)), prepack::chunking::fill});
  for (auto _ : state) {
    auto in =
        prepack::make_step_inputs<std::int32_t, std::int32_t>(sched, 0, items, tables, n_blocks);
    benchmark::DoNotOptimize(in.slot_mapping.data());
  }
  state.counters["step_tokens"] = static_cast<double>(sched.step_tokens(0));
}
BENCHMARK(BM_PythonStepInputs)->Arg(512)->Unit(benchmark::kMicrosecond);

BENCHMARK(BM_StepInputs)
    ->Args({10000, 0})
    ->Args({10000000, 0})
    ->Args({10000, 1})
    ->Args({10000000, 1})
    ->ArgNames({"pool", "engines"})
    ->Unit(benchmark::kMicrosecond);

BENCHMARK_CAPTURE(BM_Plan, ffd, ffd, support::profile::heavy)
    ->RangeMultiplier(10)
    ->Range(1000, 1000000)
    ->Unit(benchmark::kMillisecond)
    ->Complexity(benchmark::oNLogN);
BENCHMARK_CAPTURE(BM_Plan, bfd, bfd, support::profile::heavy)
    ->RangeMultiplier(10)
    ->Range(1000, 1000000)
    ->Unit(benchmark::kMillisecond)
    ->Complexity(benchmark::oNLogN);
// Heavy-tailed rows meet the budget at the longest prompt's width; mildly varied ones (all
// lengths within a factor 1.5 or so) need the bisection.
BENCHMARK_CAPTURE(BM_Plan, fitted, fitted, support::profile::heavy)
    ->RangeMultiplier(10)
    ->Range(1000, 1000000)
    ->Unit(benchmark::kMillisecond)
    ->Complexity(benchmark::oNLogN);
BENCHMARK_CAPTURE(BM_Plan, fitted_mild, fitted, support::profile::mild)
    ->RangeMultiplier(10)
    ->Range(1000, 1000000)
    ->Unit(benchmark::kMillisecond)
    ->Complexity(benchmark::oNLogN);
BENCHMARK(BM_PlanAndLayout)
    ->RangeMultiplier(10)
    ->Range(1000, 100000)
    ->Unit(benchmark::kMillisecond)
    ->Complexity(benchmark::oN);

}  // namespace

int main(int argc, char** argv) {
  return support::guarded_main("bench_plan", [&] {
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
  });
}
