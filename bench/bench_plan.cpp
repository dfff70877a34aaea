// Planning throughput: first-fit-decreasing and best-fit-decreasing over 10^3 .. 10^6 prompts
// of the heavy-tailed profile (lengths up to 2048), plus layout building. Google Benchmark
// fits the growth (expect n log n). Goal: 10^6 prompts planned in under 0.3 s.
#include <benchmark/benchmark.h>

#include <vector>

#include "prepack/prepack.hpp"

namespace {

std::vector<int> lengths(std::int64_t n) {
  return prepack::generate_lengths(prepack::profile::heavy, static_cast<std::size_t>(n), 42, 512);
}

void BM_PlanFFD(benchmark::State& state) {
  const auto len = lengths(state.range(0));
  for (auto _ : state) {
    auto plan = prepack::first_fit_decreasing(len);
    benchmark::DoNotOptimize(plan.fill.data());
  }
  state.SetComplexityN(state.range(0));
  state.counters["prompts_per_s"] = benchmark::Counter(
      static_cast<double>(state.range(0)), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_PlanBFD(benchmark::State& state) {
  const auto len = lengths(state.range(0));
  for (auto _ : state) {
    auto plan = prepack::best_fit_decreasing(len);
    benchmark::DoNotOptimize(plan.fill.data());
  }
  state.SetComplexityN(state.range(0));
  state.counters["prompts_per_s"] = benchmark::Counter(
      static_cast<double>(state.range(0)), benchmark::Counter::kIsIterationInvariantRate);
}

// Plan + packed layout (tokens, positions, segments), the std-only work before a prefill.
void BM_PlanAndLayout(benchmark::State& state) {
  const auto len = lengths(state.range(0));
  std::size_t total = 0;
  for (int l : len) total += static_cast<std::size_t>(l);
  const std::vector<int> tokens(total, 7);
  for (auto _ : state) {
    const auto plan = prepack::first_fit_decreasing(len);
    auto layout = prepack::make_layout(plan, tokens);
    benchmark::DoNotOptimize(layout.tokens.data());
  }
  state.SetComplexityN(state.range(0));
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(total), benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_PlanFFD)
    ->RangeMultiplier(10)
    ->Range(1000, 1000000)
    ->Unit(benchmark::kMillisecond)
    ->Complexity(benchmark::oNLogN);
BENCHMARK(BM_PlanBFD)
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

BENCHMARK_MAIN();
