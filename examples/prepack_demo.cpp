// prepack_demo: prefill a batch of prompts of mixed lengths - padded to the longest, as engines
// batch them; prepacked into rows; and, with --budget, as budgeted steps over a paged KV pool, as
// engines that never pad run them - with the reference model, and show what each costs and that
// each gives every prompt the KV cache, logits and greedy tokens it gets alone.
//
//   prepack_demo                      built-in workload: 64 heavy-tailed prompts (seeded)
//   prepack_demo --prompts FILE       one prompt per line, token ids separated by spaces
//   prepack_demo --budget 512         also budgeted steps of at most 512 tokens over a pool
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
#include "prepack/reference.hpp"
#include "prepack/workload.hpp"
#ifdef PREPACK_DEMO_CHECKPOINTS
#include "prepack/reference/checkpoint.hpp"
#endif

namespace ref = prepack::reference;

namespace {

const char* kHelp = R"(prepack_demo - padded vs prepacked vs budgeted prefill on the reference model

Workload (default: 64 prompts of profile heavy-cut, max length 512, seed 1):
  --prompts FILE      one prompt per line, token ids separated by spaces ('#' comments)
  --profile NAME      equal | mild | heavy | heavy-cut | one-long, or, with shared prefixes in
                      the token ids, few-shot | system-prompt
  --batch N           prompts to generate (1..100000, default 64)
  --max-len N         the profile's length scale (8..65536, default 512)
  --seed S            workload and weight seed (default 1)
Model (default: Llama-style, vocab 4096, hidden 256, 4 layers, 8 heads, 2 kv heads,
       head dim 32, ffn 688, rope theta 10000):
  --vocab N  --hidden N  --layers N  --heads N  --kv-heads N  --head-dim N  --ffn N
  --rope-theta X
  --model PATH        a real checkpoint instead: a .gguf file (llama, qwen2) or a Hugging Face
                      model directory (config.json + safetensors); the workload's token ids
                      are drawn from its vocabulary
  --bf16              hold the projection weights in bf16 (activations rounded to bf16,
                      products accumulated in fp32)
  --backend auto|eigen|onednn
                      the GEMM library (default auto: oneDNN when the build has it)
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
  --budget N          also run budgeted steps of at most N tokens over a paged KV pool
                      (prefix-free varlen forward passes, long prompts chunked)
  --policy whole|fill whole prompts first (default) or every step filled to the budget
  --block-size N      the pool's block size in tokens (default 16)
  --prefix            also run prefix-aware prefill: the batch's shared prefixes (found in the
                      token ids) prefilled once, block-aligned, then the suffixes over them;
                      with --budget, in steps of that budget (default: prefixes, then suffixes)
  --threads N         threads (default: all cores)
  --new-tokens N      greedy tokens per prompt to compare (default 8)
  --repeat N          time each method N times, report the fastest (default 1)
Output:
  --json              one JSON object on stdout instead of the report
  --logits FILE       write each prompt's last-token logits of the prepacked prefill, raw
                      float32 [n_prompts][vocab] in prompt order
Exit codes: 0 ok; 1 a method's results disagree with prefilling alone; 2 bad flags or input.
)";

// What one method produced: time, memory, per-prompt caches and logits.
struct outcome {
  std::string name;
  double seconds = 0;
  std::size_t peak_bytes = 0;
  ref::paged_cache cache;
  ref::matrix logits;
  float max_kv = 0, max_logits = 0;
  bool tokens_match = false;
  std::size_t steps = 0, steps_lower_bound = 0, chunked = 0;  // budgeted and prefix only
  std::size_t tokens_computed = 0, prefixes = 0;
};

template <class F>
double seconds_of(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Padded or prepacked: plan, layout, one prefill, unpack into per-prompt caches.
template <class Plan>
outcome run_rows(const std::string& name, const ref::model& m,
                 const std::vector<std::vector<int>>& prompts, Plan make_plan,
                 const ref::prefill_options& opt, int repeat, int new_tokens) {
  outcome best;
  for (int k = 0; k < repeat; ++k) {
    outcome o;
    o.name = name;
    o.seconds = seconds_of([&] {
      const auto plan = make_plan();
      const auto layout = prepack::make_layout(plan, prompts, {m.cfg().pad_id, 0});
      const auto r = m.prefill(layout, opt);
      o.cache = ref::unpack_caches(m, layout, r, static_cast<std::size_t>(new_tokens));
      o.peak_bytes = r.memory.peak_bytes;
      o.logits = r.logits;
    });
    if (k == 0 || o.seconds < best.seconds) best = std::move(o);
  }
  return best;
}

// Budgeted: a schedule of steps of at most `budget` tokens, each a forward pass over the pool
// that writes K and V straight into it (no packed buffer, no unpack).
outcome run_budgeted(const ref::model& m, const std::vector<std::vector<int>>& prompts,
                     const std::vector<int>& len, const prepack::budget_options& bo,
                     std::size_t block_size, const ref::exec_options& opt, int repeat,
                     int new_tokens) {
  outcome best;
  for (int k = 0; k < repeat; ++k) {
    outcome o;
    o.name = "budgeted";
    std::vector<std::size_t> room;
    for (int l : len) room.push_back(static_cast<std::size_t>(l + new_tokens));
    o.seconds = seconds_of([&] {
      const auto sched = prepack::budgeted_schedule(len, bo);
      o.cache = ref::make_cache(m.cfg(), room, block_size);
      const auto run =
          ref::run_schedule(m, sched, prompts, ref::tables_of(o.cache), o.cache.pool, opt);
      o.logits = run.item_logits;
      for (std::size_t i = 0; i < prompts.size(); ++i) o.cache.seqs[i].length = prompts[i].size();
      o.peak_bytes = o.cache.pool.bytes() + run.workspace_bytes;
      o.steps = sched.n_steps();
      o.steps_lower_bound = sched.lower_bound();
      o.chunked = sched.n_chunked();
      o.tokens_computed = sched.total_tokens();
    });
    if (k == 0 || o.seconds < best.seconds) best = std::move(o);
  }
  return best;
}

// Prefix-aware: the batch's shared prefixes prefilled once, then the suffixes over them, as
// budgeted steps over a pool whose prefix blocks several block tables share.
outcome run_prefix(const ref::model& m, const std::vector<std::vector<int>>& prompts,
                   const prepack::budget_options& bo, std::size_t block_size,
                   const ref::exec_options& opt, int repeat, int new_tokens) {
  outcome best;
  for (int k = 0; k < repeat; ++k) {
    outcome o;
    o.name = "prefix";
    o.seconds = seconds_of([&] {
      auto run = ref::prefill_with_prefixes(m, prompts, {block_size, block_size, 16}, bo,
                                            static_cast<std::size_t>(new_tokens), opt);
      o.cache = std::move(run.cache);
      o.logits = std::move(run.logits);
      o.peak_bytes = o.cache.pool.bytes() + run.run.workspace_bytes;
      o.steps = run.sched.n_steps();
      o.steps_lower_bound = run.sched.lower_bound();
      o.chunked = run.sched.n_chunked();
      o.tokens_computed = run.plan.tokens_computed();
      o.prefixes = run.plan.n_prefixes();
    });
    if (k == 0 || o.seconds < best.seconds) best = std::move(o);
  }
  return best;
}

std::string mib(std::size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

int demo(int argc, char** argv) {
  const cli::args a(
      argc, argv,
      {"--prompts",    "--profile",  "--batch",  "--max-len",   "--seed",       "--vocab",
       "--hidden",     "--layers",   "--heads",  "--kv-heads",  "--head-dim",   "--ffn",
       "--rope-theta", "--capacity", "--packer", "--attention", "--threads",    "--new-tokens",
       "--repeat",     "--max-pad",  "--budget", "--policy",    "--block-size", "--backend",
       "--model",      "--logits"},
      {"--json", "--help", "--prefix", "--bf16"});
  if (a.has("--help")) {
    std::cout << kHelp;
    return 0;
  }
  ref::config c;
  std::string model_line;  // what the report says of a loaded checkpoint
  std::string model_json;  // and the JSON
  const std::string model_path = a.str("--model", "");
  if (!model_path.empty()) {
#ifdef PREPACK_DEMO_CHECKPOINTS
    for (const char* flag : {"--vocab", "--hidden", "--layers", "--heads", "--kv-heads",
                             "--head-dim", "--ffn", "--rope-theta"}) {
      if (a.has(flag))
        throw cli::usage_error(std::string(flag) + " cannot be combined with --model");
    }
    const ref::checkpoint_info info = ref::inspect_checkpoint(model_path);
    c = info.cfg;
    std::string types;
    for (const auto& [t, n] : info.tensor_types) {
      types += (types.empty() ? "" : ", ") + t + " x " + std::to_string(n);
    }
    char line[512];
    std::snprintf(line, sizeof line, "%s (%s, %s), %.1fM parameters; tensors %s", info.name.c_str(),
                  info.architecture.c_str(), info.format.c_str(), info.n_params / 1e6,
                  types.c_str());
    model_line = line;
    model_json = "\"name\": \"" + info.name + "\", \"architecture\": \"" + info.architecture +
                 "\", \"format\": \"" + info.format +
                 "\", \"params\": " + std::to_string(static_cast<long long>(info.n_params)) + ", ";
#else
    throw cli::usage_error("--model: this build has no checkpoint loader (needs nlohmann-json)");
#endif
  } else {
    c.vocab = static_cast<int>(a.integer("--vocab", 4096, 2, 1 << 20));
    c.hidden = static_cast<int>(a.integer("--hidden", 256, 1, 1 << 14));
    c.n_layers = static_cast<int>(a.integer("--layers", 4, 1, 256));
    c.n_heads = static_cast<int>(a.integer("--heads", 8, 1, 1024));
    c.n_kv_heads = static_cast<int>(a.integer("--kv-heads", 2, 1, 1024));
    c.head_dim = static_cast<int>(a.integer("--head-dim", 32, 0, 1024));
    c.ffn = static_cast<int>(a.integer("--ffn", 688, 1, 1 << 16));
    c.rope_theta = a.real("--rope-theta", 10000.0, 1.0001, 1e12);
  }
  c.validate();
  const ref::model_options mopt{a.has("--bf16") ? ref::weight_type::bf16 : ref::weight_type::f32};
  const auto seed = static_cast<std::uint64_t>(a.integer("--seed", 1, 0, (1ll << 62)));
  const bool json = a.has("--json");
  const int threads = static_cast<int>(a.integer("--threads", 0, 0, 1024));
  const int new_tokens = static_cast<int>(a.integer("--new-tokens", 8, 1, 4096));
  const int repeat = static_cast<int>(a.integer("--repeat", 1, 1, 100));
  const bool bfd = a.choice("--packer", "ffd", {"ffd", "bfd"}) == "bfd";
  const auto path = a.choice("--attention", "segment", {"dense", "segment"}) == "dense"
                        ? ref::attention::dense
                        : ref::attention::segment;
  const std::string backend_flag = a.choice("--backend", "auto", {"auto", "eigen", "onednn"});
  const ref::gemm_backend backend =
      ref::resolve(backend_flag == "eigen"    ? ref::gemm_backend::eigen
                   : backend_flag == "onednn" ? ref::gemm_backend::onednn
                                              : ref::gemm_backend::automatic);
  const bool budgeted = a.has("--budget");
  const auto budget = static_cast<std::size_t>(a.integer("--budget", 512, 1, 1ll << 30));
  const bool fill = a.choice("--policy", "whole", {"whole", "fill"}) == "fill";
  const auto block_size = static_cast<std::size_t>(a.integer("--block-size", 16, 1, 1 << 16));
  const bool prefix = a.has("--prefix");
  if (!budgeted && !prefix && (a.has("--policy") || a.has("--block-size"))) {
    throw cli::usage_error("--policy and --block-size go with --budget or --prefix");
  }

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
    const std::string name = a.str("--profile", "heavy-cut");
    const auto n = static_cast<std::size_t>(a.integer("--batch", 64, 1, 100000));
    prepack::prefix_profile pp{};
    if (prepack::parse_prefix_profile(name, pp)) {
      if (a.has("--max-len")) throw cli::usage_error("--max-len does not apply to " + name);
      prompts = prepack::generate_prefixed_prompts(pp, n, c.vocab, seed);
      for (const auto& p : prompts) len.push_back(static_cast<int>(p.size()));
    } else {
      const auto prof = prepack::parse_profile(name);
      const int max_len = static_cast<int>(a.integer("--max-len", 512, 8, 65536));
      len = prepack::generate_lengths(prof, n, seed, max_len);
    }
    workload = "profile " + name + ", seed " + std::to_string(seed);
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
  // prompts, and the larger of the two prefills with its layout arrays and the caches.
  const auto need = [&](std::size_t rows, std::size_t width, ref::attention p) {
    return static_cast<double>(ref::estimate_prefill_memory(c, rows, width, len.size(),
                                                            static_cast<std::size_t>(longest), p,
                                                            threads)
                                   .peak_bytes) +
           3.0 * static_cast<double>(rows * width * sizeof(int));
  };
  const double caches =
      2.0 * c.n_layers * static_cast<double>(c.kv_dim()) * sizeof(float) *
      static_cast<double>(useful +
                          len.size() * (static_cast<std::size_t>(new_tokens) + block_size));
  const double peak_need =
      ref::weight_bytes(c) + 2.0 * static_cast<double>(useful * sizeof(int)) + 2 * caches +
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
#ifdef PREPACK_DEMO_CHECKPOINTS
  const ref::model m = model_path.empty() ? ref::model(c, seed, mopt)
                                          : ref::model(c, ref::load_checkpoint(model_path).w, mopt);
#else
  const ref::model m(c, seed, mopt);
#endif
  const ref::exec_options exec{threads, backend};

  // One untimed pass first: the first pass of a process pays for what every later one reuses
  // (oneDNN generating its kernels, the model's activation buffers, page faults); the method that
  // happens to run first should not be charged for it.
  {
    const std::vector<int> warm_len{std::min(longest, 64), 3};
    const auto warm = prepack::generate_prompts(warm_len, c.vocab, seed + 1);
    const auto l = prepack::make_layout(prepack::padded(warm_len), warm, {c.pad_id, 0});
    m.prefill(l, {ref::attention::dense, threads, backend});
    m.prefill(l, {ref::attention::segment, threads, backend});
  }
  std::vector<outcome> methods;
  methods.push_back(run_rows(
      "padded", m, prompts, [&] { return prepack::padded(len); },
      {ref::attention::dense, threads, backend}, repeat, new_tokens));
  methods.push_back(run_rows("prepacked", m, prompts, make_packed_plan, {path, threads, backend},
                             repeat, new_tokens));
  if (budgeted) {
    const prepack::budget_options bo{
        budget, fill ? prepack::chunking::fill : prepack::chunking::whole_first,
        prepack::schedule_order::arrival};
    methods.push_back(run_budgeted(m, prompts, len, bo, block_size, exec, repeat, new_tokens));
  }
  if (prefix) {
    const prepack::budget_options bo{
        budgeted ? budget : 0, fill ? prepack::chunking::fill : prepack::chunking::whole_first,
        prepack::schedule_order::arrival};
    methods.push_back(run_prefix(m, prompts, bo, block_size, exec, repeat, new_tokens));
  }
  auto [alone, alone_logits] = ref::prefill_alone(m, prompts, static_cast<std::size_t>(new_tokens),
                                                  {ref::attention::segment, threads, backend});
  const int n_threads = ref::detail::threads_for(threads);
  bool agree = true;
  float max_kv = 0, max_lg = 0;
  for (outcome& o : methods) {
    o.max_kv = ref::max_abs_diff(alone, o.cache);
    o.max_logits = (alone_logits - o.logits).cwiseAbs().maxCoeff();
    max_kv = std::max(max_kv, o.max_kv);
    max_lg = std::max(max_lg, o.max_logits);
  }
  // Greedy continuations, each from its own cache (decoding appends to it).
  const auto want = ref::greedy_decode(m, alone, alone_logits, new_tokens, exec);
  std::vector<ref::decode_result> decoded;
  for (outcome& o : methods) {
    decoded.push_back(ref::greedy_decode(m, o.cache, o.logits, new_tokens, exec));
    o.tokens_match = decoded.back().tokens == want.tokens;
    agree = agree && o.tokens_match && o.max_kv <= 1e-3f && o.max_logits <= 1e-3f;
  }
  if (a.has("--logits")) {
    const std::string file = a.str("--logits", "");
    std::ofstream out(file, std::ios::binary);
    if (!out) throw cli::usage_error("cannot write '" + file + "'");
    const ref::matrix& lg = methods[1].logits;  // the prepacked prefill's, prompt order
    for (Eigen::Index i = 0; i < lg.rows(); ++i) {
      out.write(reinterpret_cast<const char*>(lg.row(i).data()),
                static_cast<std::streamsize>(sizeof(float) * static_cast<std::size_t>(lg.cols())));
    }
    if (!out) throw cli::usage_error("cannot write '" + file + "'");
  }
  const outcome& padded = methods[0];
  const outcome& packed = methods[1];
  const double speedup = padded.seconds / packed.seconds;
  const double mem_ratio =
      static_cast<double>(padded.peak_bytes) / static_cast<double>(packed.peak_bytes);

  if (json) {
    std::ostringstream js;
    char buf[1024];
    std::snprintf(buf, sizeof buf,
                  "{\"workload\": \"%s\", \"n_prompts\": %zu, \"useful_tokens\": %zu, "
                  "\"padded_tokens\": %zu, \"n_rows\": %zu, \"packed_slots\": %zu, \"capacity\": "
                  "%d, \"packer\": \"%s\", \"attention\": \"%s\", \"threads\": %d, \"backend\": "
                  "\"%s\", \"seconds_padded\": %.6f, \"seconds_prepacked\": %.6f, \"speedup\": "
                  "%.4f, \"peak_bytes_padded\": %zu, \"peak_bytes_prepacked\": %zu, "
                  "\"memory_ratio\": %.4f, ",
                  workload.c_str(), len.size(), useful, padded_slots, plan.n_rows(), plan.slots(),
                  plan.capacity, bfd ? "bfd" : "ffd",
                  path == ref::attention::dense ? "dense" : "segment", n_threads,
                  ref::backend_name(backend), padded.seconds, packed.seconds, speedup,
                  padded.peak_bytes, packed.peak_bytes, mem_ratio);
    js << buf << "\"methods\": {";
    for (std::size_t k = 0; k < methods.size(); ++k) {
      const outcome& o = methods[k];
      std::snprintf(buf, sizeof buf,
                    "%s\"%s\": {\"seconds\": %.6f, \"peak_bytes\": %zu, \"max_abs_diff_kv\": %.3g, "
                    "\"max_abs_diff_logits\": %.3g, \"greedy_tokens_match\": %s",
                    k ? ", " : "", o.name.c_str(), o.seconds, o.peak_bytes,
                    static_cast<double>(o.max_kv), static_cast<double>(o.max_logits),
                    o.tokens_match ? "true" : "false");
      js << buf;
      if (o.name == "budgeted" || o.name == "prefix") {
        std::snprintf(buf, sizeof buf,
                      ", \"budget\": %zu, \"policy\": \"%s\", \"block_size\": %zu, \"steps\": %zu, "
                      "\"steps_lower_bound\": %zu, \"chunked_prompts\": %zu, \"tokens_computed\": "
                      "%zu, \"useful_tokens\": %zu",
                      o.name == "prefix" && !budgeted ? 0 : budget, fill ? "fill" : "whole",
                      block_size, o.steps, o.steps_lower_bound, o.chunked, o.tokens_computed,
                      useful);
        js << buf;
      }
      if (o.name == "prefix") {
        std::snprintf(buf, sizeof buf, ", \"prefixes\": %zu, \"distinct_tokens\": %zu", o.prefixes,
                      prepack::prefix_index<int>(prompts).distinct_tokens());
        js << buf;
      }
      js << "}";
    }
    std::snprintf(buf, sizeof buf,
                  "}, \"max_abs_diff_kv\": %.3g, \"max_abs_diff_logits\": %.3g, "
                  "\"greedy_tokens_match\": %s, \"model\": {%s\"weights\": \"%s\", \"vocab\": %d, "
                  "\"hidden\": %d, "
                  "\"layers\": %d, \"heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"ffn\": %d, "
                  "\"rope_theta\": %g}}\n",
                  static_cast<double>(max_kv), static_cast<double>(max_lg),
                  agree ? "true" : "false", model_json.c_str(), ref::weight_type_name(mopt.weights),
                  c.vocab, c.hidden, c.n_layers, c.n_heads, c.n_kv_heads, c.head_size(), c.ffn,
                  c.rope_theta);
    js << buf;
    std::fputs(js.str().c_str(), stdout);
    return agree ? 0 : 1;
  }

  std::printf("prepack demo: %zu prompts (%s), lengths %d..%d, %zu tokens\n", len.size(),
              workload.c_str(), *std::min_element(len.begin(), len.end()), longest, useful);
  if (!model_line.empty()) std::printf("checkpoint: %s\n", model_line.c_str());
  std::printf(
      "model: %d layers, hidden %d, %d heads / %d kv heads x %d, ffn %d, vocab %d; %s weights; "
      "%d threads, %s GEMMs\n\n",
      c.n_layers, c.hidden, c.n_heads, c.n_kv_heads, c.head_size(), c.ffn, c.vocab,
      ref::weight_type_name(mopt.weights), n_threads, ref::backend_name(backend));
  std::printf("plan (%s, capacity %d%s): %zu rows, %zu slots, fill %.1f%%\n",
              bfd ? "best-fit" : "first-fit", plan.capacity,
              fit ? (" fitted to --max-pad " + a.str("--max-pad", "")).c_str() : "", plan.n_rows(),
              plan.slots(),
              100.0 * static_cast<double>(useful) / static_cast<double>(plan.slots()));
  std::printf("  padding computes %zu slots (%.2fx the useful tokens), prepacking %zu (%.2fx)\n",
              padded_slots, static_cast<double>(padded_slots) / static_cast<double>(useful),
              plan.slots(), static_cast<double>(plan.slots()) / static_cast<double>(useful));
  if (budgeted) {
    const outcome& b = methods[2];
    std::printf(
        "  budgeted (%s, %zu tokens a step, blocks of %zu): %zu steps, lower bound %zu, "
        "%zu prompts chunked, no pad slot\n",
        fill ? "fill" : "whole prompts first", budget, block_size, b.steps, b.steps_lower_bound,
        b.chunked);
  }
  for (const outcome& o : methods) {
    if (o.name != "prefix") continue;
    std::printf(
        "  prefix-aware (blocks of %zu): %zu shared prefixes prefilled once; %zu of %zu tokens "
        "computed (%zu distinct), %zu steps\n",
        block_size, o.prefixes, o.tokens_computed, useful,
        prepack::prefix_index<int>(prompts).distinct_tokens(), o.steps);
  }
  std::printf("\n%-36s %8s %12s %10s %10s\n", "", "seconds", "peak memory", "vs padded", "memory");
  const auto label = [&](const outcome& o) {
    if (o.name == "padded") return "padded (left, dense mask)";
    if (o.name == "prepacked") {
      return path == ref::attention::dense ? "prepacked (dense mask)"
                                           : "prepacked (segment attention)";
    }
    if (o.name == "budgeted") return "budgeted steps over a paged pool";
    return "shared prefixes once, then suffixes";
  };
  for (const outcome& o : methods) {
    std::printf("%-36s %8.3f %12s %9.2fx %9.2fx\n", label(o), o.seconds, mib(o.peak_bytes).c_str(),
                padded.seconds / o.seconds,
                static_cast<double>(padded.peak_bytes) / static_cast<double>(o.peak_bytes));
  }
  std::printf("\nmax |difference| from prefilling each prompt alone:\n");
  for (const outcome& o : methods) {
    std::printf("  %-10s KV %.2g, last-token logits %.2g\n", (o.name + ":").c_str(),
                static_cast<double>(o.max_kv), static_cast<double>(o.max_logits));
  }
  std::printf("\ngreedy continuations (%d tokens), first prompts:\n", new_tokens);
  for (std::size_t i = 0; i < std::min<std::size_t>(3, len.size()); ++i) {
    const auto show = [&](const std::string& name, const std::vector<int>& t) {
      std::printf("  prompt %zu %-10s", i, name.c_str());
      for (int x : t) std::printf(" %d", x);
      std::printf("\n");
    };
    show("alone", want.tokens[i]);
    for (std::size_t k = 0; k < methods.size(); ++k) show(methods[k].name, decoded[k].tokens[i]);
  }
  std::string names = "alone";
  for (const outcome& o : methods) names += (&o == &methods.back() ? " and " : ", ") + o.name;
  bool match = true;
  for (const outcome& o : methods) match = match && o.tokens_match;
  std::printf("greedy tokens of all %zu prompts: %s\n", len.size(),
              match ? ("identical across " + names).c_str() : "DIFFER");
  if (!agree)
    std::fprintf(stderr, "prepack_demo: a method's results disagree with prefilling alone\n");
  return agree ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return cli::guarded_main("prepack_demo", [&] { return demo(argc, argv); });
}
