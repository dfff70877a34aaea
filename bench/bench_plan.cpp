// Planning throughput: first-fit-decreasing, best-fit-decreasing and fitted_plan (FFD, rows
// widened to 5% padding) over 10^3 .. 10^6 prompts of the heavy-tailed profile (lengths up to
// 2048), plus layout building. Google Benchmark
// fits the growth (expect n log n). Goal: 10^6 prompts planned in under 0.3 s.
#include <benchmark/benchmark.h>

#include <vector>

#include "prepack/prepack.hpp"
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

BENCHMARK_MAIN();
