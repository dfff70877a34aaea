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
    std::string name = "heavy-cut";
    std::size_t n = 32;
    std::uint64_t seed = 1;
    int max_len = 512, vocab = 32000;
    bool lengths_only = false;
    CLI::App app{"", "bench_workload"};
    support::configure(app, "bench_workload - print a seeded benchmark workload as JSON", "");
    app.add_option("--profile", name, "a profile of support/workload.hpp (default heavy-cut)")
        ->check(support::text())
        ->type_name("NAME");
    app.add_option("--batch", n, "prompts (default 32)")
        ->check(support::integer(1, 10000000))
        ->type_name("N");
    app.add_option("--seed", seed, "seed (default 1)")
        ->check(support::integer(0, 1ll << 62))
        ->type_name("S");
    app.add_option("--max-len", max_len, "the profile's length scale (default 512)")
        ->check(support::integer(8, 1 << 20))
        ->type_name("N");
    app.add_option("--vocab", vocab, "token ids below this (default 32000)")
        ->check(support::integer(2, 1 << 30))
        ->type_name("N");
    app.add_flag("--lengths-only", lengths_only, "print the lengths only");
    if (!support::parse(app, argc, argv)) return 0;
    std::vector<std::vector<int>> prompts;
    std::vector<int> lengths;
    support::prefix_profile pp{};
    if (support::parse_prefix_profile(name, pp)) {
      prompts = support::generate_prefixed_prompts(pp, n, vocab, seed);
      for (const auto& p : prompts) lengths.push_back(static_cast<int>(p.size()));
    } else {
      lengths = support::generate_lengths(support::parse_profile(name), n, seed, max_len);
      if (!lengths_only) prompts = support::generate_prompts(lengths, vocab, seed);
    }
    nlohmann::json out;
    out["lengths"] = lengths;
    if (!lengths_only) out["prompts"] = prompts;
    std::puts(out.dump().c_str());
    return 0;
  });
}
