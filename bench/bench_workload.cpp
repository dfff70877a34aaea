// bench_workload: prints one of the benchmarks' seeded workloads as JSON ({"lengths": [..],
// "prompts": [[..], ..]}), so benchmarks in other languages (bench/bench_hf.py) run the very
// prompts bench_prefill runs.
//
//   bench_workload --profile heavy-cut --batch 32 --seed 1 --max-len 512 --vocab 32000
//                  [--lengths-only]
// Profiles: equal mild heavy heavy-cut one-long few-shot system-prompt (support/workload.hpp).
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/cli.hpp"
#include "support/workload.hpp"

int main(int argc, char** argv) {
  return support::guarded_main("bench_workload", [&] {
    const support::args a(argc, argv, {"--profile", "--batch", "--seed", "--max-len", "--vocab"},
                          {"--lengths-only"});
    const std::string name = a.str("--profile", "heavy-cut");
    const auto n = static_cast<std::size_t>(a.integer("--batch", 32, 1, 10000000));
    const auto seed = static_cast<std::uint64_t>(a.integer("--seed", 1, 0, 1ll << 62));
    const int max_len = static_cast<int>(a.integer("--max-len", 512, 8, 1 << 20));
    const int vocab = static_cast<int>(a.integer("--vocab", 32000, 2, 1 << 30));
    std::vector<std::vector<int>> prompts;
    std::vector<int> lengths;
    support::prefix_profile pp{};
    if (support::parse_prefix_profile(name, pp)) {
      prompts = support::generate_prefixed_prompts(pp, n, vocab, seed);
      for (const auto& p : prompts) lengths.push_back(static_cast<int>(p.size()));
    } else {
      lengths = support::generate_lengths(support::parse_profile(name), n, seed, max_len);
      if (!a.has("--lengths-only")) prompts = support::generate_prompts(lengths, vocab, seed);
    }
    nlohmann::json out;
    out["lengths"] = lengths;
    if (!a.has("--lengths-only")) out["prompts"] = prompts;
    std::puts(out.dump().c_str());
    return 0;
  });
}
