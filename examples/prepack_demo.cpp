// prepack_demo: prefill a batch of prompts of mixed lengths twice - padded to the longest, as
// engines batch them, and prepacked - with the reference model, and show what prepacking saves
// and that both give every prompt the KV cache, logits and greedy tokens it gets alone.
//
//   prepack_demo                      built-in workload: 64 heavy-tailed prompts (seeded)
//   prepack_demo --prompts FILE       one prompt per line, token ids separated by spaces
//   prepack_demo --json               one JSON object on stdout
//   prepack_demo --help               every flag
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "cli.hpp"
#include "prepack/prepack.hpp"
#include "prepack/workload.hpp"
#include "prepack/reference.hpp"

namespace ref = prepack::reference;

namespace {

const char* kHelp = R"(prepack_demo - padded vs prepacked prefill on the reference model

Workload (default: 64 prompts of profile heavy-cut, max length 512, seed 1):
  --prompts FILE      one prompt per line, token ids separated by spaces ('#' comments)
  --profile NAME      equal | mild | heavy | heavy-cut | one-long
  --batch N           prompts to generate (1..100000, default 64)
  --max-len N         the profile's length scale (8..65536, default 512)
  --seed S            workload and weight seed (default 1)
Model (default: Llama-style, vocab 4096, hidden 256, 4 layers, 8 heads, 2 kv heads,
       head dim 32, ffn 688, rope theta 10000):
  --vocab N  --hidden N  --layers N  --heads N  --kv-heads N  --head-dim N  --ffn N
  --rope-theta X
Method:
  --capacity N        tokens per packed row (default: the longest prompt); with --max-pad,
                      the widest row allowed
  --max-pad F         widen rows past the longest prompt until pad slots are at most F x the
                      tokens (0.05: 5%), as narrow as that allows (prepack::fitted_plan)
  --packer ffd|bfd    first-fit-decreasing (default) or best-fit-decreasing
  --attention dense|segment
                      prepacked attention: per-row block-diagonal mask (the paper's) or
                      each prompt's causal block only (default segment); the padded baseline
                      always runs the dense mask, as Hugging Face does
  --threads N         threads (default: all cores)
  --new-tokens N      greedy tokens per prompt to compare (default 8)
  --repeat N          time each method N times, report the fastest (default 1)
Output:
  --json              one JSON object on stdout instead of the report
Exit codes: 0 ok; 1 padded and prepacked results disagree; 2 bad flags or input.
)";

struct timing {
  double seconds = 0;
  ref::prefill_result result;
  std::vector<ref::kv_cache> caches;
};

template <class Plan>
timing run(const ref::model& m, const std::vector<std::vector<int>>& prompts, Plan make_plan,
           ref::attention path, int threads, int repeat, int new_tokens) {
  timing best;
  for (int k = 0; k < repeat; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto plan = make_plan();
    const auto layout = prepack::make_layout(plan, prompts, {m.cfg().pad_id, 0});
    auto r = m.prefill(layout, {path, threads});
    auto caches = ref::unpack_caches(m, layout, r, static_cast<std::size_t>(new_tokens));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (k == 0 || s < best.seconds) best = {s, std::move(r), std::move(caches)};
  }
  return best;
}

std::string mib(std::size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

int demo(int argc, char** argv) {
  const cli::args a(argc, argv,
                    {"--prompts",   "--profile", "--batch",      "--max-len",  "--seed",
                     "--vocab",     "--hidden",  "--layers",     "--heads",    "--kv-heads",
                     "--head-dim",  "--ffn",     "--rope-theta", "--capacity", "--packer",
                     "--attention", "--threads", "--new-tokens", "--repeat",   "--max-pad"},
                    {"--json", "--help"});
  if (a.has("--help")) {
    std::cout << kHelp;
    return 0;
  }
  ref::config c;
  c.vocab = static_cast<int>(a.integer("--vocab", 4096, 2, 1 << 20));
  c.hidden = static_cast<int>(a.integer("--hidden", 256, 1, 1 << 14));
  c.n_layers = static_cast<int>(a.integer("--layers", 4, 1, 256));
  c.n_heads = static_cast<int>(a.integer("--heads", 8, 1, 1024));
  c.n_kv_heads = static_cast<int>(a.integer("--kv-heads", 2, 1, 1024));
  c.head_dim = static_cast<int>(a.integer("--head-dim", 32, 0, 1024));
  c.ffn = static_cast<int>(a.integer("--ffn", 688, 1, 1 << 16));
  c.rope_theta = a.real("--rope-theta", 10000.0, 1.0001, 1e12);
  c.validate();
  const auto seed = static_cast<std::uint64_t>(a.integer("--seed", 1, 0, (1ll << 62)));
  const bool json = a.has("--json");
  const int threads = static_cast<int>(a.integer("--threads", 0, 0, 1024));
  const int new_tokens = static_cast<int>(a.integer("--new-tokens", 8, 1, 4096));
  const int repeat = static_cast<int>(a.integer("--repeat", 1, 1, 100));
  const bool bfd = a.choice("--packer", "ffd", {"ffd", "bfd"}) == "bfd";
  const auto path = a.choice("--attention", "segment", {"dense", "segment"}) == "dense"
                        ? ref::attention::dense
                        : ref::attention::segment;

  // The workload: lengths first, so its memory is checked before any prompt is built.
  std::vector<std::vector<int>> prompts;
  std::vector<int> len;
  std::string workload;
  if (a.has("--prompts")) {
    if (a.has("--profile") || a.has("--batch") || a.has("--max-len")) {
      throw cli::usage_error("--prompts cannot be combined with --profile, --batch or --max-len");
    }
    const std::string file = a.str("--prompts", "");
    std::ifstream in(file);
    if (!in) throw cli::usage_error("cannot open '" + file + "'");
    for (auto& rec : prepack::read_records(in, file, "token id", c.vocab)) {
      prompts.emplace_back(rec.values.begin(), rec.values.end());
      len.push_back(static_cast<int>(rec.values.size()));
    }
    workload = file;
  } else {
    const auto prof = prepack::parse_profile(a.str("--profile", "heavy-cut"));
    const auto n = static_cast<std::size_t>(a.integer("--batch", 64, 1, 100000));
    const int max_len = static_cast<int>(a.integer("--max-len", 512, 8, 65536));
    len = prepack::generate_lengths(prof, n, seed, max_len);
    workload =
        std::string("profile ") + prepack::profile_name(prof) + ", seed " + std::to_string(seed);
  }
  const int longest = *std::max_element(len.begin(), len.end());
  const long long cap_flag = a.integer("--capacity", 0, 0, 1 << 24);
  if (a.has("--capacity") && cap_flag < longest) {
    throw cli::usage_error("--capacity " + std::to_string(cap_flag) +
                           " is below the longest prompt (" + std::to_string(longest) + " tokens)");
  }
  const std::optional<int> capacity =
      cap_flag > 0 ? std::optional<int>(static_cast<int>(cap_flag)) : std::nullopt;

  const auto kind =
      bfd ? prepack::packer::best_fit_decreasing : prepack::packer::first_fit_decreasing;
  const bool fit = a.has("--max-pad");
  const auto make_packed_plan = [&] { return cli::plan_from_flags(a, kind, len, capacity); };
  // The plan, for the report (the timed runs plan again: planning is part of the cost).
  const auto plan = make_packed_plan();
  const std::size_t useful = plan.useful_tokens();
  const std::size_t padded_slots = len.size() * static_cast<std::size_t>(longest);

  // Refuse a workload that cannot fit, before allocating anything for it: the weights, the
  // prompts, and the larger of the two prefills with its layout arrays.
  const auto need = [&](std::size_t rows, std::size_t width, ref::attention p) {
    return static_cast<double>(ref::estimate_prefill_memory(c, rows, width, len.size(),
                                                            static_cast<std::size_t>(longest), p,
                                                            threads)
                                   .peak_bytes) +
           3.0 * static_cast<double>(rows * width * sizeof(int));
  };
  const double peak_need =
      ref::weight_bytes(c) + 2.0 * static_cast<double>(useful * sizeof(int)) +
      std::max(need(len.size(), static_cast<std::size_t>(longest), ref::attention::dense),
               need(plan.n_rows(), static_cast<std::size_t>(plan.capacity), path));
  const double machine =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  if (machine > 0 && peak_need > 0.8 * machine) {
    throw cli::usage_error("this workload needs about " + mib(static_cast<std::size_t>(peak_need)) +
                           ", more than 80% of the " + mib(static_cast<std::size_t>(machine)) +
                           " of memory here; use fewer or shorter prompts or a smaller model");
  }
  if (prompts.empty()) prompts = prepack::generate_prompts(len, c.vocab, seed);
  const ref::model m(c, seed);

  const timing padded = run(
      m, prompts, [&] { return prepack::padded(len); }, ref::attention::dense, threads, repeat,
      new_tokens);
  const timing packed = run(m, prompts, make_packed_plan, path, threads, repeat, new_tokens);
  auto [alone, alone_logits] =
      ref::prefill_alone(m, prompts, static_cast<std::size_t>(new_tokens), {path, threads});

  const float kv_padded = ref::max_abs_diff(alone, padded.caches);
  const float kv_packed = ref::max_abs_diff(alone, packed.caches);
  const float lg_padded = (alone_logits - padded.result.logits).cwiseAbs().maxCoeff();
  const float lg_packed = (alone_logits - packed.result.logits).cwiseAbs().maxCoeff();

  auto caches_alone = alone;
  auto caches_padded = padded.caches;
  auto caches_packed = packed.caches;
  const auto g_alone = ref::greedy_decode(m, caches_alone, alone_logits, new_tokens, {threads});
  const auto g_padded =
      ref::greedy_decode(m, caches_padded, padded.result.logits, new_tokens, {threads});
  const auto g_packed =
      ref::greedy_decode(m, caches_packed, packed.result.logits, new_tokens, {threads});
  const bool match = g_alone.tokens == g_padded.tokens && g_alone.tokens == g_packed.tokens;
  const float max_kv = std::max(kv_padded, kv_packed), max_lg = std::max(lg_padded, lg_packed);
  const bool agree = match && max_kv <= 1e-3f && max_lg <= 1e-3f;
  const double speedup = padded.seconds / packed.seconds;
  const double mem_ratio = static_cast<double>(padded.result.memory.peak_bytes) /
                           static_cast<double>(packed.result.memory.peak_bytes);

  if (json) {
    std::printf(
        "{\"workload\": \"%s\", \"n_prompts\": %zu, \"useful_tokens\": %zu, \"padded_tokens\": "
        "%zu, "
        "\"n_rows\": %zu, \"packed_slots\": %zu, \"capacity\": %d, \"packer\": \"%s\", "
        "\"attention\": \"%s\", "
        "\"threads\": %d, \"seconds_padded\": %.6f, \"seconds_prepacked\": %.6f, \"speedup\": "
        "%.4f, "
        "\"peak_bytes_padded\": %zu, \"peak_bytes_prepacked\": %zu, \"memory_ratio\": %.4f, "
        "\"max_abs_diff_kv\": %.3g, \"max_abs_diff_logits\": %.3g, \"greedy_tokens_match\": %s, "
        "\"model\": {\"vocab\": %d, \"hidden\": %d, \"layers\": %d, \"heads\": %d, \"kv_heads\": "
        "%d, "
        "\"head_dim\": %d, \"ffn\": %d, \"rope_theta\": %g}}\n",
        workload.c_str(), len.size(), useful, padded_slots, plan.n_rows(), plan.slots(),
        plan.capacity, bfd ? "bfd" : "ffd", path == ref::attention::dense ? "dense" : "segment",
        packed.result.profile.n_threads, padded.seconds, packed.seconds, speedup,
        padded.result.memory.peak_bytes, packed.result.memory.peak_bytes, mem_ratio,
        static_cast<double>(max_kv), static_cast<double>(max_lg), match ? "true" : "false", c.vocab,
        c.hidden, c.n_layers, c.n_heads, c.n_kv_heads, c.head_size(), c.ffn, c.rope_theta);
    return agree ? 0 : 1;
  }

  std::printf("prepack demo: %zu prompts (%s), lengths %d..%d, %zu tokens\n", len.size(),
              workload.c_str(), *std::min_element(len.begin(), len.end()), longest, useful);
  std::printf(
      "model: %d layers, hidden %d, %d heads / %d kv heads x %d, ffn %d, vocab %d; %d threads\n\n",
      c.n_layers, c.hidden, c.n_heads, c.n_kv_heads, c.head_size(), c.ffn, c.vocab,
      packed.result.profile.n_threads);
  std::printf("plan (%s, capacity %d%s): %zu rows, %zu slots, fill %.1f%%\n",
              bfd ? "best-fit" : "first-fit", plan.capacity,
              fit ? (" fitted to --max-pad " + a.str("--max-pad", "")).c_str() : "", plan.n_rows(),
              plan.slots(),
              100.0 * static_cast<double>(useful) / static_cast<double>(plan.slots()));
  std::printf("  padding computes %zu slots (%.2fx the useful tokens), prepacking %zu (%.2fx)\n\n",
              padded_slots, static_cast<double>(padded_slots) / static_cast<double>(useful),
              plan.slots(), static_cast<double>(plan.slots()) / static_cast<double>(useful));
  std::printf("%-34s %10s %12s\n", "", "seconds", "peak memory");
  std::printf("%-34s %10.3f %12s\n", "padded (left, dense mask)", padded.seconds,
              mib(padded.result.memory.peak_bytes).c_str());
  std::printf(
      "%-34s %10.3f %12s\n",
      path == ref::attention::dense ? "prepacked (dense mask)" : "prepacked (segment attention)",
      packed.seconds, mib(packed.result.memory.peak_bytes).c_str());
  std::printf("%-34s %9.2fx %11.2fx\n\n", "padded / prepacked", speedup, mem_ratio);
  std::printf("max |difference| from prefilling each prompt alone:\n");
  std::printf("  padded:    KV %.2g, last-token logits %.2g\n", static_cast<double>(kv_padded),
              static_cast<double>(lg_padded));
  std::printf("  prepacked: KV %.2g, last-token logits %.2g\n\n", static_cast<double>(kv_packed),
              static_cast<double>(lg_packed));
  std::printf("greedy continuations (%d tokens), first prompts:\n", new_tokens);
  for (std::size_t i = 0; i < std::min<std::size_t>(3, len.size()); ++i) {
    const auto show = [&](const char* name, const std::vector<int>& t) {
      std::printf("  prompt %zu %-9s", i, name);
      for (int x : t) std::printf(" %d", x);
      std::printf("\n");
    };
    show("alone", g_alone.tokens[i]);
    show("padded", g_padded.tokens[i]);
    show("prepacked", g_packed.tokens[i]);
  }
  std::printf("greedy tokens of all %zu prompts: %s\n", len.size(),
              match ? "identical across alone, padded and prepacked" : "DIFFER");
  if (!agree) std::fprintf(stderr, "prepack_demo: padded and prepacked results disagree\n");
  return agree ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return cli::guarded_main("prepack_demo", [&] { return demo(argc, argv); });
}
