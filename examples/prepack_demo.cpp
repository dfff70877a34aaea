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
//
// The program is its steps, one function each: flags, workload, memory admission, the model,
// the methods, the check against prefilling alone, the reports.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "prepack/prepack.hpp"
#include "prepack/reference.hpp"
#include "support/cli.hpp"
#include "support/model_flags.hpp"
#include "support/workload.hpp"
#ifdef PREPACK_SUPPORT_TEXT
#include "prepack/text.hpp"
#include "support/text_input.hpp"
#endif

namespace ref = prepack::reference;
using json = nlohmann::ordered_json;

namespace {

// What the flags ask for, besides the model.
struct options {
  support::model_choice model;
  std::uint64_t seed = 1;
  bool json = false;
  int new_tokens = 8, repeat = 1;
  prepack::packer packer = prepack::packer::first_fit_decreasing;
  ref::attention path = ref::attention::segment;
  std::optional<std::size_t> budget;  // --budget: run budgeted steps
  prepack::chunking policy = prepack::chunking::whole_first;
  std::size_t block_size = 16;
  bool prefix = false;
  std::optional<int> capacity;
  std::string logits_file;
};

// The flags as given.
struct flags {
  support::model_flags model;
  support::plan_flags plan;
  std::string prompts, text, tokenize, profile = "heavy-cut";
  std::size_t batch = 64;
  int max_len = 512;
  std::uint64_t seed = 1;
  std::optional<int> capacity;
  std::string packer = "ffd", attention = "segment", policy = "whole";
  std::optional<std::size_t> budget;
  std::size_t block_size = 16;
  bool prefix = false, json = false;
  int new_tokens = 8, repeat = 1;
  std::string logits;
  // Given on the command line: --max-len; --policy or --block-size.
  bool max_len_given = false, pool_given = false;
};

void add_workload_flags(CLI::App& app, flags& f) {
  using support::integer;
  const std::string group =
      "Workload (default: 64 prompts of profile heavy-cut, max length 512, seed 1)";
  CLI::Option* prompts =
      app.add_option("--prompts", f.prompts,
                     "one prompt per line, token ids separated by spaces ('#' comments)")
          ->check(support::text())
          ->type_name("FILE")
          ->group(group);
  CLI::Option* text =
      app.add_option("--text", f.text,
                     "one prompt per line as UTF-8 text (leading spaces kept; \\n, \\t, \\\\\n"
                     "escapes), tokenized by --model's own tokenizer; continuations are\n"
                     "printed as text")
          ->check(support::text())
          ->type_name("FILE")
          ->group(group);
  app.add_option("--tokenize", f.tokenize,
                 "print each line's token ids under --model's tokenizer (no BOS; an empty\n"
                 "line gives an empty line) and exit;\n"
                 "works on a vocabulary-only GGUF")
      ->check(support::text())
      ->type_name("FILE")
      ->group(group);
  const std::vector<CLI::Option*> generator{
      app.add_option("--profile", f.profile,
                     "equal | mild | heavy | heavy-cut | one-long, or, with shared prefixes in\n"
                     "the token ids, few-shot | system-prompt")
          ->check(support::text())
          ->type_name("NAME"),
      app.add_option("--batch", f.batch, "prompts to generate (1..100000, default 64)")
          ->check(integer(1, 100000))
          ->type_name("N"),
      app.add_option("--max-len", f.max_len, "the profile's length scale (8..65536, default 512)")
          ->check(integer(8, 65536))
          ->type_name("N")};
  for (CLI::Option* o : generator) o->group(group)->excludes(prompts)->excludes(text);
  text->excludes(prompts);
  app.add_option("--seed", f.seed, "workload and weight seed (default 1)")
      ->check(integer(0, 1ll << 62))
      ->type_name("S")
      ->group(group);
}

void add_method_flags(CLI::App& app, flags& f) {
  using support::integer;
  const std::string group = "Method";
  app.add_option("--capacity", f.capacity,
                 "tokens per packed row (default: the longest prompt); with --max-pad,\n"
                 "the widest row allowed")
      ->check(integer(0, 1 << 24))
      ->type_name("N")
      ->group(group);
  support::add_max_pad(app, f.plan,
                       "widen rows past the longest prompt until pad slots are at most F x the\n"
                       "tokens (0.05: 5%), as narrow as that allows (prepack::fitted_plan)")
      ->group(group);
  const std::vector<std::string> packers{"ffd", "bfd"}, attentions{"dense", "segment"},
      policies{"whole", "fill"};
  app.add_option("--packer", f.packer, "first-fit-decreasing (default) or best-fit-decreasing")
      ->check(support::one_of(packers))
      ->type_name(support::choices(packers))
      ->group(group);
  app.add_option("--attention", f.attention,
                 "prepacked attention: per-row block-diagonal mask (the paper's) or\n"
                 "each prompt's causal block only (default segment); the padded baseline\n"
                 "always runs the dense mask, as Hugging Face does")
      ->check(support::one_of(attentions))
      ->type_name(support::choices(attentions))
      ->group(group);
  app.add_option("--budget", f.budget,
                 "also run budgeted steps of at most N tokens over a paged KV pool\n"
                 "(prefix-free varlen forward passes, long prompts chunked)")
      ->check(integer(1, 1ll << 30))
      ->type_name("N")
      ->group(group);
  app.add_option("--policy", f.policy,
                 "whole prompts first (default) or every step filled to the budget")
      ->check(support::one_of(policies))
      ->type_name(support::choices(policies))
      ->group(group);
  app.add_option("--block-size", f.block_size, "the pool's block size in tokens (default 16)")
      ->check(integer(1, 1 << 16))
      ->type_name("N")
      ->group(group);
  app.add_flag("--prefix", f.prefix,
               "also run prefix-aware prefill: the batch's shared prefixes (found in the\n"
               "token ids) prefilled once, block-aligned, then the suffixes over them;\n"
               "with --budget, in steps of that budget (default: prefixes, then suffixes)")
      ->group(group);
  app.add_option("--new-tokens", f.new_tokens, "greedy tokens per prompt to compare (default 8)")
      ->check(integer(1, 4096))
      ->type_name("N")
      ->group(group);
  app.add_option("--repeat", f.repeat, "time each method N times, report the fastest (default 1)")
      ->check(integer(1, 100))
      ->type_name("N")
      ->group(group);
  app.add_flag("--json", f.json, "one JSON object on stdout instead of the report")
      ->group("Output");
  app.add_option("--logits", f.logits,
                 "write each prompt's last-token logits of the prepacked prefill, raw\n"
                 "float32 [n_prompts][vocab] in prompt order")
      ->check(support::text())
      ->type_name("FILE")
      ->group("Output");
}

// The flags of the command line; nothing when --help was asked for.
std::optional<flags> parse_flags(int argc, char** argv) {
  flags f;
  CLI::App app{"", "prepack_demo"};
  support::configure(
      app, "prepack_demo - padded vs prepacked vs budgeted prefill on the reference model",
      "Exit codes: 0 ok; 1 a method's results disagree with prefilling alone (or an "
      "internal error);\n2 bad flags or input.");
  add_workload_flags(app, f);
  support::add_model_flags(app, f.model);
  add_method_flags(app, f);
  if (!support::parse(app, argc, argv)) return std::nullopt;
  f.max_len_given = support::given(app, "--max-len");
  f.pool_given = support::given(app, "--policy") || support::given(app, "--block-size");
  return f;
}

// What the flags ask for, the model's headers read.
options make_options(const flags& f) {
  options o;
  o.seed = f.seed;
  o.model = support::parse_model(f.model, o.seed);
  o.json = f.json;
  o.new_tokens = f.new_tokens;
  o.repeat = f.repeat;
  o.packer = f.packer == "bfd" ? prepack::packer::best_fit_decreasing
                               : prepack::packer::first_fit_decreasing;
  o.path = f.attention == "dense" ? ref::attention::dense : ref::attention::segment;
  o.budget = f.budget;
  o.policy = f.policy == "fill" ? prepack::chunking::fill : prepack::chunking::whole_first;
  o.block_size = f.block_size;
  o.prefix = f.prefix;
  if (!o.budget && !o.prefix && f.pool_given) {
    throw support::usage_error("--policy and --block-size go with --budget or --prefix");
  }
  o.capacity = f.capacity;
  o.logits_file = f.logits;
  return o;
}

// The prompts: from a file, or generated (lengths first, so the memory check comes before any
// prompt is built).
struct workload {
  std::string name;  // the file, or "profile P, seed S"
#ifdef PREPACK_SUPPORT_TEXT
  std::optional<prepack::text::tokenizer> tok;  // --text: the model's tokenizer
  std::vector<std::string> texts;               // --text: the prompts as text
#endif
  std::vector<int> lengths;               // [n_prompts]
  std::vector<std::vector<int>> prompts;  // [n_prompts][length]  empty until make_prompts
  int longest() const { return *std::max_element(lengths.begin(), lengths.end()); }
  std::size_t tokens() const {
    std::size_t n = 0;
    for (int l : lengths) n += static_cast<std::size_t>(l);
    return n;
  }
};

workload load_workload(const flags& f, const options& o) {
  workload w;
  const int vocab = o.model.cfg.vocab;
  if (!f.text.empty()) {
#ifdef PREPACK_SUPPORT_TEXT
    if (o.model.path.empty()) throw support::usage_error("--text needs --model (its tokenizer)");
    const std::string& file = f.text;
    w.tok.emplace(prepack::text::load_tokenizer(o.model.path));
    for (const auto& line : support::read_text_lines(file)) {
      std::vector<std::int32_t> ids = w.tok->encode(line.text);
      for (std::int32_t id : ids) {
        if (id >= vocab) {
          throw support::usage_error(file + ":" + std::to_string(line.line) + ": token " +
                                     std::to_string(id) + " is outside the model's vocabulary of " +
                                     std::to_string(vocab));
        }
      }
      w.prompts.emplace_back(ids.begin(), ids.end());
      w.lengths.push_back(static_cast<int>(ids.size()));
      w.texts.push_back(line.text);
    }
    w.name = file;
    return w;
#else
    throw support::usage_error("--text needs a build with prepack::text (libpcre2-dev)");
#endif
  }
  if (!f.prompts.empty()) {
    const std::string& file = f.prompts;
    std::ifstream in(file);
    if (!in) throw support::usage_error("cannot open '" + file + "'");
    for (auto& rec : support::read_records(in, file, "token id", vocab)) {
      w.prompts.emplace_back(rec.values.begin(), rec.values.end());
      w.lengths.push_back(static_cast<int>(rec.values.size()));
    }
    w.name = file;
    return w;
  }
  const std::string& name = f.profile;
  const std::size_t n = f.batch;
  support::prefix_profile pp{};
  if (support::parse_prefix_profile(name, pp)) {
    if (f.max_len_given) throw support::usage_error("--max-len does not apply to " + name);
    w.prompts = support::generate_prefixed_prompts(pp, n, vocab, o.seed);
    for (const auto& p : w.prompts) w.lengths.push_back(static_cast<int>(p.size()));
  } else {
    const auto profile = support::parse_profile(name);
    w.lengths = support::generate_lengths(profile, n, o.seed, f.max_len);
  }
  w.name = "profile " + name + ", seed " + std::to_string(o.seed);
  return w;
}

// Refuses a workload that cannot fit, before allocating anything for it: the weights, the
// prompts, and the larger of the two prefills with its layout arrays and the caches.
void admit(const options& o, const workload& w, const prepack::pack_plan<int>& plan) {
  const ref::config& c = o.model.cfg;
  bool held = false;  // quantized projections held as stored: their scaled inputs, int8 copies
#ifdef PREPACK_SUPPORT_CHECKPOINTS
  held = o.model.hold_quantized && o.model.info && o.model.info->quantized_projection_params > 0;
#endif
  const bool int8 = held && o.model.options.activations == ref::activation_type::int8;
  const auto need = [&](std::size_t rows, std::size_t width, ref::attention p) {
    return static_cast<double>(
               ref::estimate_prefill_memory(c, rows, width, w.lengths.size(),
                                            static_cast<std::size_t>(w.longest()), p,
                                            o.model.threads, o.model.options.weights,
                                            o.model.backend, o.model.options.layout, held, int8)
                   .peak_bytes) +
           3.0 * static_cast<double>(rows * width * sizeof(int));
  };
  const double caches =
      2.0 * c.n_layers * static_cast<double>(c.kv_dim()) * sizeof(float) *
      static_cast<double>(w.tokens() + w.lengths.size() *
                                           (static_cast<std::size_t>(o.new_tokens) + o.block_size));
  const double workload =
      2.0 * static_cast<double>(w.tokens() * sizeof(int)) + 2 * caches +
      std::max(need(w.lengths.size(), static_cast<std::size_t>(w.longest()), ref::attention::dense),
               need(plan.n_rows(), static_cast<std::size_t>(plan.capacity), o.path));
  support::admit_memory(o.model, workload, "use fewer or shorter prompts or a smaller model");
}

// One untimed pass first: the first pass of a process pays for what every later one reuses
// (oneDNN generating its kernels, the model's activation buffers, page faults); the method that
// happens to run first should not be charged for it.
void warm_up(const ref::model& m, const options& o, int longest) {
  const std::vector<int> len{std::min(longest, 64), 3};
  const auto prompts = support::generate_prompts(len, m.cfg().vocab, o.seed + 1);
  const auto l = prepack::make_layout(prepack::padded(len), prompts, {m.cfg().pad_id, 0});
  m.prefill(l, {ref::attention::dense, o.model.threads, o.model.backend});
  m.prefill(l, {ref::attention::segment, o.model.threads, o.model.backend});
}

// What one method produced: time, memory, per-prompt caches and logits, and how it compares
// with prefilling each prompt alone.
struct outcome {
  std::string name;  // padded, prepacked, budgeted, prefix
  std::string label;
  double seconds = 0;
  std::size_t peak_bytes = 0;
  ref::paged_cache cache;
  ref::matrix logits;
  std::size_t steps = 0, steps_lower_bound = 0, chunked = 0;  // budgeted and prefix only
  std::size_t tokens_computed = 0, prefixes = 0;
  float max_kv = 0, max_logits = 0;  // from prefilling alone
  ref::decode_result decoded;        // its greedy continuations
  bool tokens_match = false;         // identical to alone's, or apart only after a near-tie
  std::string near_tie;              // where it parted from alone's on a near-tie, if it did
};

// Every method run, by name.
struct outcomes {
  outcome padded, prepacked;
  std::optional<outcome> budgeted, prefix;
  std::vector<outcome*> all() {
    std::vector<outcome*> v{&padded, &prepacked};
    if (budgeted) v.push_back(&*budgeted);
    if (prefix) v.push_back(&*prefix);
    return v;
  }
};

template <class F>
double seconds_of(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Runs `once` (which fills an outcome and returns it) `repeat` times; keeps the fastest.
template <class Once>
outcome fastest(int repeat, Once&& once) {
  outcome best;
  for (int k = 0; k < repeat; ++k) {
    outcome o = once();
    if (k == 0 || o.seconds < best.seconds) best = std::move(o);
  }
  return best;
}

// Padded or prepacked rows: plan, layout, one prefill, unpack into per-prompt caches.
template <class Plan>
outcome run_rows(const char* name, const char* label, const ref::model& m, const options& o,
                 const workload& w, Plan&& make_plan, ref::attention path) {
  return fastest(o.repeat, [&] {
    outcome out;
    out.name = name;
    out.label = label;
    out.seconds = seconds_of([&] {
      const auto plan = make_plan();
      const auto layout = prepack::make_layout(plan, w.prompts, {m.cfg().pad_id, 0});
      const auto r = m.prefill(layout, {path, o.model.threads, o.model.backend});
      out.cache = ref::unpack_caches(m, layout, r, static_cast<std::size_t>(o.new_tokens));
      out.peak_bytes = r.memory.peak_bytes;
      out.logits = r.logits;
    });
    return out;
  });
}

// Budgeted: a schedule of steps of at most `budget` tokens, each a forward pass over the pool
// that writes K and V straight into it (no packed buffer, no unpack).
outcome run_budgeted(const ref::model& m, const options& o, const workload& w) {
  const prepack::budget_options bo{*o.budget, o.policy, prepack::schedule_order::arrival};
  std::vector<std::size_t> room;
  for (int l : w.lengths) room.push_back(static_cast<std::size_t>(l + o.new_tokens));
  return fastest(o.repeat, [&] {
    outcome out;
    out.name = "budgeted";
    out.label = "budgeted steps over a paged pool";
    out.seconds = seconds_of([&] {
      const auto sched = prepack::budgeted_schedule(w.lengths, bo);
      out.cache = ref::make_cache(m.cfg(), room, o.block_size);
      const auto run = ref::run_schedule(m, sched, w.prompts, ref::tables_of(out.cache),
                                         out.cache.pool, {o.model.threads, o.model.backend});
      out.logits = run.item_logits;
      for (std::size_t i = 0; i < w.prompts.size(); ++i) {
        out.cache.seqs[i].length = w.prompts[i].size();
      }
      out.peak_bytes = out.cache.pool.bytes() + run.workspace_bytes;
      out.steps = sched.n_steps();
      out.steps_lower_bound = sched.lower_bound();
      out.chunked = sched.n_chunked();
      out.tokens_computed = sched.total_tokens();
    });
    return out;
  });
}

// Prefix-aware: the batch's shared prefixes prefilled once, then the suffixes over them, as
// budgeted steps over a pool whose prefix blocks several block tables share.
outcome run_prefix(const ref::model& m, const options& o, const workload& w) {
  const prepack::budget_options bo{o.budget.value_or(0), o.policy,
                                   prepack::schedule_order::arrival};
  return fastest(o.repeat, [&] {
    outcome out;
    out.name = "prefix";
    out.label = "shared prefixes once, then suffixes";
    out.seconds = seconds_of([&] {
      auto run = ref::prefill_with_prefixes(m, w.prompts, {o.block_size, o.block_size, 16}, bo,
                                            static_cast<std::size_t>(o.new_tokens),
                                            {o.model.threads, o.model.backend});
      out.cache = std::move(run.cache);
      out.logits = std::move(run.logits);
      out.peak_bytes = out.cache.pool.bytes() + run.run.workspace_bytes;
      out.steps = run.sched.n_steps();
      out.steps_lower_bound = run.sched.lower_bound();
      out.chunked = run.sched.n_chunked();
      out.tokens_computed = run.plan.tokens_computed();
      out.prefixes = run.plan.n_prefixes();
    });
    return out;
  });
}

outcomes run_methods(const ref::model& m, const options& o, const workload& w,
                     const std::function<prepack::pack_plan<int>()>& packed_plan) {
  outcomes r;
  r.padded = run_rows(
      "padded", "padded (left, dense mask)", m, o, w, [&] { return prepack::padded(w.lengths); },
      ref::attention::dense);
  r.prepacked = run_rows(
      "prepacked",
      o.path == ref::attention::dense ? "prepacked (dense mask)" : "prepacked (segment attention)",
      m, o, w, packed_plan, o.path);
  if (o.budget) r.budgeted = run_budgeted(m, o, w);
  if (o.prefix) r.prefix = run_prefix(m, o, w);
  return r;
}

// How far a method may be from prefilling alone: fp32, 1e-3 (accumulation order only); bf16
// weights, 0.5% of the values' scale (activations are rounded to bf16 before every GEMM, so an
// accumulation-order difference that flips a rounding moves a result by bf16's step).
struct tolerance {
  float kv = 1e-3f, logits = 1e-3f;
  bool int8 = false;  // the model dots 8-bit activations (the bound is theirs)
};

// Each method against prefilling every prompt alone: the caches, the logits, and the greedy
// continuations each decodes from its own cache (decoding appends to it). Returns the
// continuations of the prompts alone.
ref::decode_result verify(const ref::model& m, const options& o, const workload& w, outcomes& r,
                          tolerance& tol) {
  const ref::exec_options exec{o.model.threads, o.model.backend};
  auto [alone, alone_logits] =
      ref::prefill_alone(m, w.prompts, static_cast<std::size_t>(o.new_tokens),
                         {ref::attention::segment, o.model.threads, o.model.backend});
  // bf16 weights round the activations to bf16, and 8-bit activations round them to a step
  // of their block: sums ordered otherwise (a padded row, a dense mask) can land a value on the
  // other side of a rounding, so the methods agree within a share of the values' scale.
  tol.int8 = m.int8_activations();
  const bool rounded = o.model.options.weights == ref::weight_type::bf16 || tol.int8;
  if (rounded) {
    const float share = tol.int8 ? 5e-2f : 5e-3f;
    float kv_scale = 0;
    const auto kv = alone.pool.key_view(), vv = alone.pool.value_view();
    for (std::size_t e = 0; e < kv.extent[0] * kv.stride[0]; ++e) {
      kv_scale = std::max({kv_scale, std::abs(kv.data[e]), std::abs(vv.data[e])});
    }
    tol.kv = share * std::max(1.0f, kv_scale);
    tol.logits = share * std::max(1.0f, alone_logits.cwiseAbs().maxCoeff());
  }
  for (outcome* x : r.all()) {
    x->max_kv = ref::max_abs_diff(alone, x->cache);
    x->max_logits = (alone_logits - x->logits).cwiseAbs().maxCoeff();
  }
  const ref::decode_result want = ref::greedy_decode(m, alone, alone_logits, o.new_tokens, exec);
  for (outcome* x : r.all()) {
    x->decoded = ref::greedy_decode(m, x->cache, x->logits, o.new_tokens, exec);
    x->tokens_match = true;
    for (std::size_t i = 0; i < want.tokens.size() && x->tokens_match; ++i) {
      const auto& a = want.tokens[i];
      const auto& b = x->decoded.tokens[i];
      const auto k =
          static_cast<std::size_t>(std::mismatch(a.begin(), a.end(), b.begin()).first - a.begin());
      if (k == a.size()) continue;
      // Parting on a near-tie (alone's winner led by less than the logits' bound) is what bf16
      // or int8 rounding may do; anywhere else it is a difference. fp32's bound is 0: none
      // allowed.
      const float margin = want.margins[i][k];
      const bool tie = rounded && margin <= tol.logits;
      x->tokens_match = tie;
      if (tie && x->near_tie.empty()) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "prompt %zu parts at token %zu on a near-tie (margin %.2g)",
                      i, k, static_cast<double>(margin));
        x->near_tie = buf;
      }
    }
  }
  return want;
}

bool agrees(const outcome& x, const tolerance& tol) {
  return x.tokens_match && x.max_kv <= tol.kv && x.max_logits <= tol.logits;
}

#ifdef PREPACK_SUPPORT_TEXT
// A greedy continuation as text, up to the model's end-of-sequence token.
std::string continuation_text(const prepack::text::tokenizer& t, const std::vector<int>& tokens) {
  std::vector<std::int32_t> ids;
  for (int x : tokens) {
    if (x == t.eos()) break;
    ids.push_back(x);
  }
  return t.decode(ids);
}
#endif

// The prepacked prefill's last-token logits, raw float32 [n_prompts][vocab] in prompt order.
void write_logits(const std::string& file, const ref::matrix& lg) {
  std::ofstream out(file, std::ios::binary);
  if (!out) throw support::usage_error("cannot write '" + file + "'");
  for (Eigen::Index i = 0; i < lg.rows(); ++i) {
    out.write(reinterpret_cast<const char*>(lg.row(i).data()),
              static_cast<std::streamsize>(sizeof(float) * static_cast<std::size_t>(lg.cols())));
  }
  if (!out) throw support::usage_error("cannot write '" + file + "'");
}

// What the report says about the plan and the schedules.
struct plan_facts {
  prepack::pack_plan<int> plan;
  bool fitted = false;
  std::string max_pad;              // --max-pad's text
  std::size_t padded_slots = 0;     // n_prompts x longest
  std::size_t distinct_tokens = 0;  // the prefix index's (prefix runs only)
};

json report_json(const options& o, const workload& w, const plan_facts& f, outcomes& r,
                 const ref::decode_result& alone, const tolerance& tol) {
  const std::size_t useful = w.tokens();
  json j;
  j["workload"] = w.name;
  j["n_prompts"] = w.lengths.size();
  j["useful_tokens"] = useful;
  j["padded_tokens"] = f.padded_slots;
  j["n_rows"] = f.plan.n_rows();
  j["packed_slots"] = f.plan.slots();
  j["capacity"] = f.plan.capacity;
  j["packer"] = o.packer == prepack::packer::best_fit_decreasing ? "bfd" : "ffd";
  j["attention"] = o.path == ref::attention::dense ? "dense" : "segment";
  j["threads"] = ref::threads_for(o.model.threads);
  j["backend"] = ref::backend_name(o.model.backend);
  j["seconds_padded"] = r.padded.seconds;
  j["seconds_prepacked"] = r.prepacked.seconds;
  j["speedup"] = r.padded.seconds / r.prepacked.seconds;
  j["peak_bytes_padded"] = r.padded.peak_bytes;
  j["peak_bytes_prepacked"] = r.prepacked.peak_bytes;
  j["memory_ratio"] =
      static_cast<double>(r.padded.peak_bytes) / static_cast<double>(r.prepacked.peak_bytes);
  json& methods = j["methods"];
  float max_kv = 0, max_lg = 0;
  bool all_agree = true;
  for (outcome* x : r.all()) {
    json m;
    m["seconds"] = x->seconds;
    m["peak_bytes"] = x->peak_bytes;
    m["max_abs_diff_kv"] = x->max_kv;
    m["max_abs_diff_logits"] = x->max_logits;
    m["greedy_tokens_match"] = x->tokens_match;
    if (!x->near_tie.empty()) m["near_tie"] = x->near_tie;
    if (x->name == "budgeted" || x->name == "prefix") {
      m["budget"] = x->name == "prefix" && !o.budget ? 0 : o.budget.value_or(0);
      m["policy"] = o.policy == prepack::chunking::fill ? "fill" : "whole";
      m["block_size"] = o.block_size;
      m["steps"] = x->steps;
      m["steps_lower_bound"] = x->steps_lower_bound;
      m["chunked_prompts"] = x->chunked;
      m["tokens_computed"] = x->tokens_computed;
      m["useful_tokens"] = useful;
    }
    if (x->name == "prefix") {
      m["prefixes"] = x->prefixes;
      m["distinct_tokens"] = f.distinct_tokens;
    }
    methods[x->name] = std::move(m);
    max_kv = std::max(max_kv, x->max_kv);
    max_lg = std::max(max_lg, x->max_logits);
    all_agree = all_agree && agrees(*x, tol);
  }
  j["max_abs_diff_kv"] = max_kv;
  j["max_abs_diff_logits"] = max_lg;
  j["tolerance"] = {{"kv", tol.kv}, {"logits", tol.logits}};
  j["greedy_tokens_match"] = all_agree;
  j["model"] = support::describe_json(o.model);
  j["greedy_tokens"] = alone.tokens;  // [n_prompts][new_tokens]  every method's, when they match
#ifdef PREPACK_SUPPORT_TEXT
  if (w.tok) {  // --text: the prompts and every method's continuation as text
    json& texts = j["texts"];
    for (std::size_t i = 0; i < w.texts.size(); ++i) {
      json t;
      t["prompt"] = w.texts[i];
      t["continuation"] = continuation_text(*w.tok, alone.tokens[i]);
      for (outcome* x : r.all())
        t["methods"][x->name] = continuation_text(*w.tok, x->decoded.tokens[i]);
      texts.push_back(std::move(t));
    }
  }
#endif
  return j;
}

void report_text(const options& o, const workload& w, const plan_facts& f, outcomes& r,
                 const ref::decode_result& alone, const tolerance& tol) {
  const std::size_t useful = w.tokens();
  std::printf("prepack demo: %zu prompts (%s), lengths %d..%d, %zu tokens\n", w.lengths.size(),
              w.name.c_str(), *std::min_element(w.lengths.begin(), w.lengths.end()), w.longest(),
              useful);
  std::printf("%s\n\n", support::describe(o.model).c_str());
  const bool bfd = o.packer == prepack::packer::best_fit_decreasing;
  std::printf("plan (%s, capacity %d%s): %zu rows, %zu slots, fill %.1f%%\n",
              bfd ? "best-fit" : "first-fit", f.plan.capacity,
              f.fitted ? (" fitted to --max-pad " + f.max_pad).c_str() : "", f.plan.n_rows(),
              f.plan.slots(),
              100.0 * static_cast<double>(useful) / static_cast<double>(f.plan.slots()));
  std::printf("  padding computes %zu slots (%.2fx the useful tokens), prepacking %zu (%.2fx)\n",
              f.padded_slots, static_cast<double>(f.padded_slots) / static_cast<double>(useful),
              f.plan.slots(), static_cast<double>(f.plan.slots()) / static_cast<double>(useful));
  if (r.budgeted) {
    std::printf(
        "  budgeted (%s, %zu tokens a step, blocks of %zu): %zu steps, lower bound %zu, "
        "%zu prompts chunked, no pad slot\n",
        o.policy == prepack::chunking::fill ? "fill" : "whole prompts first", *o.budget,
        o.block_size, r.budgeted->steps, r.budgeted->steps_lower_bound, r.budgeted->chunked);
  }
  if (r.prefix) {
    std::printf(
        "  prefix-aware (blocks of %zu): %zu shared prefixes prefilled once; %zu of %zu tokens "
        "computed (%zu distinct), %zu steps\n",
        o.block_size, r.prefix->prefixes, r.prefix->tokens_computed, useful, f.distinct_tokens,
        r.prefix->steps);
  }
  std::printf("\n%-36s %8s %12s %10s %10s\n", "", "seconds", "peak memory", "vs padded", "memory");
  for (const outcome* x : r.all()) {
    std::printf("%-36s %8.3f %12s %9.2fx %9.2fx\n", x->label.c_str(), x->seconds,
                support::mib(static_cast<double>(x->peak_bytes)).c_str(),
                r.padded.seconds / x->seconds,
                static_cast<double>(r.padded.peak_bytes) / static_cast<double>(x->peak_bytes));
  }
  if (o.model.options.weights == ref::weight_type::bf16) {
    std::printf(
        "\nmax |difference| from prefilling each prompt alone (bf16 bound: KV %.2g, "
        "logits %.2g, 0.5%% of their scale):\n",
        static_cast<double>(tol.kv), static_cast<double>(tol.logits));
  } else if (tol.int8) {
    std::printf(
        "\nmax |difference| from prefilling each prompt alone (8-bit activations: KV %.2g, "
        "logits %.2g, 5%% of their scale, bound the prepack methods; padding reorders each "
        "prompt's sums, so its roundings and then its values may drift further):\n",
        static_cast<double>(tol.kv), static_cast<double>(tol.logits));
  } else {
    std::printf("\nmax |difference| from prefilling each prompt alone:\n");
  }
  for (const outcome* x : r.all()) {
    std::printf("  %-10s KV %.2g, last-token logits %.2g\n", (x->name + ":").c_str(),
                static_cast<double>(x->max_kv), static_cast<double>(x->max_logits));
  }
#ifdef PREPACK_SUPPORT_TEXT
  if (w.tok) {
    std::printf("\ncontinuations (%d greedy tokens, as text):\n", o.new_tokens);
    for (std::size_t i = 0; i < std::min<std::size_t>(16, w.texts.size()); ++i) {
      const std::string want = continuation_text(*w.tok, alone.tokens[i]);
      std::printf("  %zu. %s -> %s\n", i, support::one_line(w.texts[i]).c_str(),
                  support::one_line(want).c_str());
      for (const outcome* x : r.all()) {
        const std::string got = continuation_text(*w.tok, x->decoded.tokens[i]);
        if (got != want) {
          std::printf("     %s: %s\n", x->name.c_str(), support::one_line(got).c_str());
        }
      }
    }
    if (w.texts.size() > 16) std::printf("  (%zu more)\n", w.texts.size() - 16);
  }
#endif
  std::printf("\ngreedy continuations (%d tokens), first prompts:\n", o.new_tokens);
  for (std::size_t i = 0; i < std::min<std::size_t>(3, w.lengths.size()); ++i) {
    const auto show = [&](const std::string& name, const std::vector<int>& t) {
      std::printf("  prompt %zu %-10s", i, name.c_str());
      for (int x : t) std::printf(" %d", x);
      std::printf("\n");
    };
    show("alone", alone.tokens[i]);
    for (const outcome* x : r.all()) show(x->name, x->decoded.tokens[i]);
  }
  std::string names = "alone";
  bool match = true;
  const auto all = r.all();
  for (const outcome* x : all) {
    names += (x == all.back() ? " and " : ", ") + x->name;
    match = match && x->tokens_match;
  }
  bool ties = false;
  for (const outcome* x : all) ties = ties || !x->near_tie.empty();
  std::printf("greedy tokens of all %zu prompts: %s%s\n", w.lengths.size(),
              match ? ("identical across " + names).c_str() : "DIFFER",
              match && ties ? ", apart from near-ties rounding (bf16, int8) may flip:" : "");
  for (const outcome* x : all) {
    if (!x->near_tie.empty()) std::printf("  %s: %s\n", x->name.c_str(), x->near_tie.c_str());
  }
}

// --tokenize FILE: each line's token ids under --model's tokenizer, no BOS; nothing else read
// from the model (a vocabulary-only GGUF is enough).
int tokenize(const flags& f) {
#ifdef PREPACK_SUPPORT_TEXT
  const std::string& model = f.model.path;
  if (model.empty()) throw support::usage_error("--tokenize needs --model (its tokenizer)");
  const auto tok = prepack::text::load_tokenizer(model);
  for (const auto& line : support::read_text_lines(f.tokenize, support::line_kind::texts)) {
    const auto ids = tok.encode(line.text, {false});
    std::string out;
    for (std::int32_t id : ids) out += (out.empty() ? "" : " ") + std::to_string(id);
    std::printf("%s\n", out.c_str());
  }
  return 0;
#else
  (void)f;
  throw support::usage_error("--tokenize needs a build with prepack::text (libpcre2-dev)");
#endif
}

int demo(int argc, char** argv) {
  const std::optional<flags> f = parse_flags(argc, argv);
  if (!f) return 0;
  if (!f->tokenize.empty()) return tokenize(*f);
  const options o = make_options(*f);
  workload w = load_workload(*f, o);
  if (o.capacity && *o.capacity < w.longest()) {
    throw support::usage_error("--capacity " + std::to_string(*o.capacity) +
                               " is below the longest prompt (" + std::to_string(w.longest()) +
                               " tokens)");
  }
  const std::optional<int> capacity =
      o.capacity && *o.capacity > 0 ? o.capacity : std::optional<int>();
  const auto packed_plan = [&] {
    return support::plan_from_flags(f->plan, o.packer, w.lengths, capacity);
  };
  plan_facts facts;
  facts.plan = packed_plan();  // for the report (the timed runs plan again: it is part of the cost)
  facts.fitted = f->plan.max_pad.has_value();
  facts.max_pad = f->plan.max_pad_text;
  facts.padded_slots = w.lengths.size() * static_cast<std::size_t>(w.longest());
  admit(o, w, facts.plan);
  if (w.prompts.empty())
    w.prompts = support::generate_prompts(w.lengths, o.model.cfg.vocab, o.seed);
  if (o.prefix) facts.distinct_tokens = prepack::prefix_index<int>(w.prompts).distinct_tokens();

  const ref::model m = support::build_model(o.model);
  warm_up(m, o, w.longest());
  outcomes r = run_methods(m, o, w, packed_plan);
  tolerance tol;
  const ref::decode_result alone = verify(m, o, w, r, tol);
  if (!o.logits_file.empty()) write_logits(o.logits_file, r.prepacked.logits);

  // With 8-bit activations the padded baseline orders each prompt's attention sums unlike the
  // prompt alone (pads shift its key tiles), so some activation rounds to the other step and the
  // difference grows layer by layer: it is reported, not held to the bound. The prepack
  // methods keep each prompt's own order and must agree.
  bool agree = true;
  for (const outcome* x : r.all()) {
    agree = agree && (agrees(*x, tol) || (tol.int8 && x == &r.padded));
  }
  if (o.json) {
    std::cout << report_json(o, w, facts, r, alone, tol)
                     .dump(-1, ' ', false, json::error_handler_t::replace)
              << "\n";
  } else {
    report_text(o, w, facts, r, alone, tol);
  }
  if (!agree)
    std::fprintf(stderr, "prepack_demo: a method's results disagree with prefilling alone\n");
  return agree ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return support::guarded_main("prepack_demo", [&] { return demo(argc, argv); });
}
