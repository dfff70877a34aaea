// Padding vs length-sorted padding vs prepacking vs budgeted steps vs shared prefixes, on the
// reference model, measured side by side in one run. One benchmark per (model, workload, batch
// size, method); a pass prefills a whole dataset of prompts batch by batch, timing what a
// server's time-to-first-token holds: plan + layout + prefill + the per-prompt caches + the first
// greedy token. Each benchmark makes at least 3 passes and 0.5 s of them and reports its fastest
// pass (the machine is shared: a slower pass was slowed by something else); every pass checks
// its logits against prefilling each prompt alone.
//
// Methods (a batch is `batch` prompts in arrival order unless said otherwise):
//   padding       each batch padded to its longest prompt, left, dense mask (Hugging Face)
//   sorted        the dataset sorted by length, then batched and padded as above
//   ffd-dense     each batch prepacked first-fit-decreasing, block-diagonal dense mask (the paper)
//   ffd-segment   the same rows, attention within each prompt's causal block only
//   bfd-segment   best-fit-decreasing rows, segment attention
//   ffd-fit       FFD rows widened past the longest prompt until pad slots are at most 5% of
//                 the tokens (prepack::fitted_plan), segment attention
//   dataset       the whole dataset prepacked once (FFD), its rows split into as many batches
//   flat          each batch as one row of unbounded width, segment attention: no pad slot at
//                 all, the physical limit of this problem on one machine
//   budget-B      each batch as budgeted steps of at most B tokens over a paged pool (every step
//                 filled, long prompts chunked), K and V written through the slot mapping;
//                 B = max_len and 4 x max_len (512 and 2048 at the default scale)
//   prefix        (prefix workloads) each batch's shared prefixes prefilled once, block-aligned,
//                 then the suffixes over them, as steps over a paged pool
// Time to first token: every prompt's, from the pass's start to the end of the batch or step
// that completes it (steps run in schedule order); p50 and p99 over the dataset.
//
// The kernel family (full run and --kernel): the `large` model (hidden 1024, 8 layers, 16 / 4
// heads of 64, FFN 2816, vocab 32000) on 8 prompts of 512 and a heavy-tailed batch of 32, per GEMM
// backend and weight type, with prefill tokens/s, the linear layers' GFLOP/s and their share of
// the FMA peak measured here, and attention's share of the time.
//
// Flags of our own, before Google Benchmark's:
//   --quick             batch sizes 8 and 32, the small model only, no kernel family
//   --smoke             a tiny model and dataset: checks results, for the test suite
//   --kernel            the kernel family only
//   --model=PATH        a real checkpoint (.gguf file or Hugging Face directory) instead of the
//                       seeded models, for the prefill and the kernel families
//   --lengths=FILE      add a workload "file" from prompt lengths in FILE
//   --report_dir=DIR    write results.csv, results.md and the chart data there
//   --dataset=N         prompts per dataset (default 64)
//   --max_len=N         workload length scale (default 512)
// Exit code 1 when any method's logits differ from prefilling each prompt alone (> 1e-3; for
// bf16 weights, against the same bf16 model prefilled alone, > 0.5% of the logits' scale).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "machine.hpp"
#include "prepack/prepack.hpp"
#include "prepack/reference.hpp"
#include "report.hpp"
#include "support/main.hpp"
#include "support/workload.hpp"
#ifdef PREPACK_BENCH_CHECKPOINTS
#include "prepack/checkpoint.hpp"
#endif

namespace ref = prepack::reference;

namespace {

struct options {
  bool quick = false, smoke = false, kernel_only = false;
  std::string lengths_file, report_dir, model_path;
  std::size_t dataset = 64;
  int max_len = 512;
  int min_passes = 3;        // dataset passes per benchmark, at least
  double min_seconds = 0.5;  // and at least this long
};
options g_opt;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct model_spec {
  std::string name;
  ref::config cfg;
  std::string path;  // a checkpoint to load, or seeded weights
};

std::unique_ptr<ref::model> build(const model_spec& ms, ref::model_options opt = {}) {
#ifdef PREPACK_BENCH_CHECKPOINTS
  if (!ms.path.empty()) {
    const prepack::checkpoint::opened ck = prepack::checkpoint::open(ms.path);
    return std::make_unique<ref::model>(ck.info.cfg, *ck.weights, opt);
  }
#endif
  return std::make_unique<ref::model>(ms.cfg, 7, opt);
}

ref::config make_config(int vocab, int hidden, int layers, int heads, int kv_heads, int head_dim,
                        int ffn) {
  ref::config c;
  c.vocab = vocab;
  c.hidden = hidden;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.ffn = ffn;
  return c;
}

model_spec checkpoint_spec() {
#ifdef PREPACK_BENCH_CHECKPOINTS
  const prepack::checkpoint::info info = prepack::checkpoint::inspect(g_opt.model_path);
  // Named by its file (a model's general.name may hold spaces).
  std::string name = std::filesystem::path(g_opt.model_path).filename().string();
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".gguf") == 0)
    name.resize(name.size() - 5);
  return {name.empty() ? info.name : name, info.cfg, g_opt.model_path};
#else
  throw prepack::error("--model: this build has no checkpoint loader (needs nlohmann-json)");
#endif
}

std::vector<model_spec> models() {
  if (!g_opt.model_path.empty()) return {checkpoint_spec()};
  const model_spec tiny{"tiny", make_config(256, 32, 1, 4, 2, 8, 64), ""};
  const model_spec small{"small", make_config(4096, 256, 4, 8, 2, 32, 688), ""};
  const model_spec medium{"medium", make_config(8192, 512, 4, 8, 2, 64, 1376), ""};
  if (g_opt.smoke) return {tiny};
  if (g_opt.quick) return {small};
  return {small, medium};
}

model_spec large_model() {
  if (!g_opt.model_path.empty()) return checkpoint_spec();
  if (g_opt.smoke) return {"tiny", make_config(256, 32, 1, 4, 2, 8, 64), ""};
  return {"large", make_config(32000, 1024, 8, 16, 4, 64, 2816), ""};
}

enum class kind {
  padding,
  sorted,
  ffd_dense,
  ffd_segment,
  bfd_segment,
  ffd_fit,
  dataset,
  flat,
  budget,
  prefix
};
struct method {
  kind k;
  std::string name;
  std::size_t budget = 0;  // budget methods
};
constexpr double kFitMaxPad = 0.05;  // ffd-fit's padding budget

std::vector<method> methods_for(bool prefix_workload) {
  const auto b1 = static_cast<std::size_t>(g_opt.max_len), b2 = 4 * b1;
  std::vector<method> m{{kind::padding, "padding"},
                        {kind::sorted, "sorted"},
                        {kind::ffd_dense, "ffd-dense"},
                        {kind::ffd_segment, "ffd-segment"},
                        {kind::bfd_segment, "bfd-segment"},
                        {kind::ffd_fit, "ffd-fit"},
                        {kind::dataset, "dataset"},
                        {kind::flat, "flat"},
                        {kind::budget, "budget-" + std::to_string(b1), b1},
                        {kind::budget, "budget-" + std::to_string(b2), b2}};
  if (prefix_workload) {
    // The row methods that matter next to prefix sharing; the rest say nothing new here.
    m = {m[0], m[3], m[5], m[7], m[8], m[9], {kind::prefix, "prefix"}};
  }
  return m;
}

struct workload {
  std::string name;
  std::vector<std::vector<int>> prompts;  // token ids (drawn from the vocabulary of each model
                                          // for length profiles; planted for prefix profiles)
  std::vector<int> lengths;
  bool prefix = false;
};

std::vector<workload> workloads(int vocab) {
  std::vector<workload> out;
  for (support::profile p : support::all_profiles()) {
    workload w{support::profile_name(p),
               {},
               support::generate_lengths(p, g_opt.dataset, 2024, g_opt.max_len),
               false};
    w.prompts = support::generate_prompts(w.lengths, vocab, 99);
    out.push_back(std::move(w));
  }
  if (!g_opt.lengths_file.empty()) {
    std::ifstream in(g_opt.lengths_file);
    if (!in) throw prepack::error("cannot open '" + g_opt.lengths_file + "'");
    workload w{"file", {}, {}, false};
    for (const auto& rec : support::read_records(in, g_opt.lengths_file, "length", 1 << 20)) {
      for (long long v : rec.values) {
        if (v == 0)
          throw prepack::error(g_opt.lengths_file + ":" + std::to_string(rec.line) + ": length 0");
        w.lengths.push_back(static_cast<int>(v));
      }
    }
    w.prompts = support::generate_prompts(w.lengths, vocab, 99);
    out.push_back(std::move(w));
  }
  for (support::prefix_profile p : support::all_prefix_profiles()) {
    workload w{support::prefix_profile_name(p),
               support::generate_prefixed_prompts(p, g_opt.dataset, vocab, 2024),
               {},
               true};
    if (g_opt.smoke) {  // short prompts for the tiny model
      for (auto& q : w.prompts) q.resize(std::min<std::size_t>(q.size(), 24 + q.size() % 17));
    }
    for (const auto& q : w.prompts) w.lengths.push_back(static_cast<int>(q.size()));
    out.push_back(std::move(w));
  }
  return out;
}

// One prefill batch: which prompts, and how they are planned.
struct batch_job {
  std::vector<std::size_t> ids;                 // prompts of the dataset, in batch order
  std::optional<prepack::pack_plan<int>> plan;  // set when planned ahead (dataset method)
};

struct totals {
  double useful = 0, computed = 0, slots = 0, linear_flops = 0, linear_seconds = 0;
  double attention_seconds = 0, prefill_seconds = 0;
  std::size_t peak_bytes = 0, n_batches = 0, steps = 0, steps_lower_bound = 0;
  double peak_slots = 0;      // slots of the prefill with the peak memory
  double max_logit_diff = 0;  // against prefilling each prompt alone
  std::vector<double> ttft;   // [n_prompts]  seconds from the pass's start
};

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double at = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(at));
  const auto hi = std::min(v.size() - 1, lo + 1);
  return v[lo] + (v[hi] - v[lo]) * (at - static_cast<double>(lo));
}

void first_token(const ref::matrix& logits) {
  for (Eigen::Index i = 0; i < logits.rows(); ++i) {
    Eigen::Index best;
    logits.row(i).maxCoeff(&best);
    benchmark::DoNotOptimize(best);
  }
}

// Prefills the dataset with one method; the timed region of the benchmark.
totals run_dataset(const ref::model& m, const workload& w, const method& me, std::size_t batch,
                   const ref::matrix& alone, const ref::exec_options& exec) {
  const auto pass_start = std::chrono::steady_clock::now();
  const auto& prompts = w.prompts;
  const auto& len = w.lengths;
  totals t;
  t.ttft.assign(prompts.size(), 0.0);
  const ref::attention path =
      me.k == kind::padding || me.k == kind::sorted || me.k == kind::ffd_dense
          ? ref::attention::dense
          : ref::attention::segment;
  std::vector<batch_job> jobs;
  if (me.k == kind::dataset) {
    const auto whole = prepack::first_fit_decreasing(len);
    const std::size_t n_batches = (len.size() + batch - 1) / batch;
    const std::size_t rows = std::max<std::size_t>(1, (whole.n_rows() + n_batches - 1) / n_batches);
    for (auto& b : prepack::split_rows(whole, rows))
      jobs.push_back({std::move(b.prompts), std::move(b.plan)});
  } else {
    const auto groups = me.k == kind::sorted ? prepack::length_sorted_batches(len, batch)
                                             : prepack::arrival_batches(len.size(), batch);
    for (const auto& g : groups) jobs.push_back({g, std::nullopt});
  }
  const auto check = [&](const std::vector<std::size_t>& ids, const ref::matrix& logits) {
    for (std::size_t k = 0; k < ids.size(); ++k) {
      const double d =
          (alone.row(static_cast<Eigen::Index>(ids[k])) - logits.row(static_cast<Eigen::Index>(k)))
              .cwiseAbs()
              .maxCoeff();
      t.max_logit_diff = std::max(t.max_logit_diff, d);
    }
  };
  for (const batch_job& job : jobs) {
    std::vector<std::vector<int>> batch_prompts;
    std::vector<int> batch_len;
    for (std::size_t i : job.ids) {
      batch_prompts.push_back(prompts[i]);
      batch_len.push_back(len[i]);
    }
    int total = 0;
    for (int l : batch_len) total += l;
    t.useful += total;
    ++t.n_batches;
    if (me.k == kind::budget || me.k == kind::prefix) {
      // Steps over a paged pool: the pool is the KV memory, each step's workspace the rest.
      const double batch_start = seconds_since(pass_start);
      ref::schedule_run run;
      std::vector<double> finish;
      std::size_t pool_bytes = 0;
      ref::matrix logits;
      double computed = 0;
      if (me.k == kind::budget) {
        const auto sched =
            prepack::budgeted_schedule(batch_len, {me.budget, prepack::chunking::fill});
        std::vector<std::size_t> room(batch_len.begin(), batch_len.end());
        ref::paged_cache cache = ref::make_cache(m.cfg(), room, 16);
        run = ref::run_schedule(m, sched, batch_prompts, ref::tables_of(cache), cache.pool, exec);
        logits = run.item_logits;
        finish = run.item_finish;
        pool_bytes = cache.pool.bytes();
        computed = total;
        t.steps += sched.n_steps();
        t.steps_lower_bound += sched.lower_bound();
      } else {
        auto pp = ref::prefill_with_prefixes(m, batch_prompts, {16, 16, 16}, {0}, 0, exec);
        run = pp.run;
        logits = pp.logits;
        finish = pp.prompt_finish;
        pool_bytes = pp.cache.pool.bytes();
        computed = static_cast<double>(pp.plan.tokens_computed());
        t.steps += pp.sched.n_steps();
        t.steps_lower_bound += pp.sched.lower_bound();
      }
      first_token(logits);
      t.computed += computed;
      t.slots += computed;  // no pad slot: the slots are what is computed
      t.linear_flops += run.profile.linear_flops;
      t.linear_seconds += run.profile.seconds_linear;
      t.attention_seconds += run.profile.seconds_attention;
      t.prefill_seconds += run.seconds;
      const std::size_t peak = pool_bytes + run.workspace_bytes;
      if (peak > t.peak_bytes) {
        t.peak_bytes = peak;
        t.peak_slots = total;
      }
      for (std::size_t k = 0; k < job.ids.size(); ++k) t.ttft[job.ids[k]] = batch_start + finish[k];
      check(job.ids, logits);
      continue;
    }
    prepack::pack_plan<int> plan;
    switch (me.k) {
      case kind::padding:
      case kind::sorted:
        plan = prepack::padded(batch_len);
        break;
      case kind::ffd_dense:
      case kind::ffd_segment:
        plan = prepack::first_fit_decreasing(batch_len);
        break;
      case kind::bfd_segment:
        plan = prepack::best_fit_decreasing(batch_len);
        break;
      case kind::ffd_fit:
        plan = prepack::fitted_plan(prepack::packer::first_fit_decreasing, batch_len,
                                    {kFitMaxPad, std::nullopt});
        break;
      case kind::dataset:
        plan = *job.plan;
        break;
      default:  // flat
        plan = prepack::first_fit_decreasing(batch_len, total);
        break;
    }
    const auto layout = prepack::make_layout(plan, batch_prompts, {m.cfg().pad_id, 0});
    const auto r = m.prefill(layout, {path, exec.n_threads, exec.backend});
    const auto caches = ref::unpack_caches(m, layout, r, 0);
    first_token(r.logits);
    benchmark::DoNotOptimize(caches.seqs.data());
    t.computed += static_cast<double>(plan.slots());
    t.slots += static_cast<double>(plan.slots());
    t.linear_flops += r.profile.linear_flops;
    t.linear_seconds += r.profile.seconds_linear;
    t.attention_seconds += r.profile.seconds_attention;
    t.prefill_seconds += r.profile.seconds_total;
    if (r.memory.peak_bytes > t.peak_bytes) {
      t.peak_bytes = r.memory.peak_bytes;
      t.peak_slots = static_cast<double>(plan.slots());
    }
    const double done = seconds_since(pass_start);
    for (std::size_t i : job.ids) t.ttft[i] = done;
    check(job.ids, r.logits);
  }
  return t;
}

report::table g_results;
int g_failed = 0;  // benchmarks that stopped with an error (results differing from alone)
std::map<std::string, double> g_padding_seconds;  // seconds per pass of padding, by group
std::map<std::string, double> g_flat_seconds;     // and of flat
double g_fma_peak = 0;                            // GFLOP/s, measured at start

// Passes of a dataset until min_passes and min_seconds; the fastest pass and its totals.
template <class Run>
std::pair<double, totals> fastest_pass(Run&& run_once, double& worst_diff) {
  totals best_t;
  double best = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int passes = 0;; ++passes) {
    if (passes >= g_opt.min_passes && seconds_since(start) >= g_opt.min_seconds) break;
    const auto t0 = std::chrono::steady_clock::now();
    totals t = run_once();
    const double pass = seconds_since(t0);
    worst_diff = std::max(worst_diff, t.max_logit_diff);
    if (passes == 0 || pass < best) {
      best = pass;
      best_t = std::move(t);
    }
  }
  return {best, std::move(best_t)};
}

void register_prefill() {
  static std::vector<std::unique_ptr<ref::model>> keep;
  const std::vector<std::size_t> batches = g_opt.smoke ? std::vector<std::size_t>{4, 8}
                                           : g_opt.quick
                                               ? std::vector<std::size_t>{8, 32}
                                               : std::vector<std::size_t>{4, 8, 16, 32, 64};
  for (const model_spec& ms : models()) {
    const auto t0 = std::chrono::steady_clock::now();
    keep.push_back(build(ms));
    if (!ms.path.empty()) {
      // A checkpoint's load: mapping, dequantizing every tensor, the model's own layout.
      char buf[256];
      std::snprintf(buf, sizeof buf, "`%s`: loaded (every tensor dequantized to fp32) in %.2f s",
                    ms.name.c_str(), seconds_since(t0));
      g_results.checkpoints.push_back(buf);
      std::fprintf(stderr, "checkpoint %s\n", buf);
    }
    const ref::model* m = keep.back().get();
    for (const workload& w0 : workloads(ms.cfg.vocab)) {
      auto w = std::make_shared<workload>(w0);
      auto alone = std::make_shared<ref::matrix>();
      for (std::size_t batch : batches) {
        for (const method& me : methods_for(w->prefix)) {
          const std::string name =
              "prefill/" + ms.name + "/" + w->name + "/" + me.name + "/" + std::to_string(batch);
          report::key key{ms.name, w->name, me.name, batch};
          const std::string group = ms.name + "/" + w->name + "/" + std::to_string(batch);
          benchmark::RegisterBenchmark(
              name.c_str(),
              [=](benchmark::State& state) {
                if (alone->size() == 0) *alone = ref::prefill_alone(*m, w->prompts).second;
                double worst_diff = 0, best = 0;
                totals t;
                for (auto _ : state) {
                  std::tie(best, t) = fastest_pass(
                      [&] { return run_dataset(*m, *w, me, batch, *alone, {}); }, worst_diff);
                  state.SetIterationTime(best);
                }
                if (worst_diff > 1e-3) {
                  const std::string why = "logits differ from prefilling each prompt alone by " +
                                          std::to_string(worst_diff);
                  state.SkipWithError(why.c_str());
                  return;
                }
                // Padding runs first in each (model, workload, batch) group; the others divide.
                if (me.k == kind::padding) g_padding_seconds[group] = best;
                if (me.k == kind::flat) g_flat_seconds[group] = best;
                if (g_padding_seconds.count(group) != 0) {
                  state.counters["speedup"] = g_padding_seconds[group] / best;
                }
                const double gflops = t.linear_flops / t.linear_seconds / 1e9;
                state.counters["batches"] = static_cast<double>(t.n_batches);
                state.counters["useful_tok_per_s"] = t.useful / best;
                state.counters["padded_ratio"] = t.slots / t.useful;
                state.counters["computed_ratio"] = t.computed / t.useful;
                state.counters["peak_MiB"] = static_cast<double>(t.peak_bytes) / (1024.0 * 1024.0);
                state.counters["linear_GFLOPs"] = gflops;
                state.counters["peak_share"] = gflops / g_fma_peak;
                state.counters["ttft_p50_ms"] = 1e3 * percentile(t.ttft, 0.5);
                state.counters["ttft_p99_ms"] = 1e3 * percentile(t.ttft, 0.99);
                state.counters["max_diff"] = worst_diff;
                report::row row;
                row.k = key;
                row.seconds = best;
                row.useful_tokens = t.useful;
                row.computed_tokens = t.computed;
                row.slots = t.slots;
                row.peak_bytes = static_cast<double>(t.peak_bytes);
                row.peak_slots = t.peak_slots;
                row.linear_gflops = gflops;
                row.fma_peak = g_fma_peak;
                row.attention_share = t.attention_seconds / std::max(1e-12, t.prefill_seconds);
                row.ttft_p50 = percentile(t.ttft, 0.5);
                row.ttft_p99 = percentile(t.ttft, 0.99);
                row.steps = static_cast<double>(t.steps);
                row.steps_lower_bound = static_cast<double>(t.steps_lower_bound);
                row.max_diff = worst_diff;
                row.batches = static_cast<double>(t.n_batches);
                g_results.pending[name] = row;
              })
              ->UseManualTime()
              ->Iterations(1)
              ->Unit(benchmark::kMillisecond);
        }
      }
    }
  }
}

// The kernel family: one packed prefill (ffd-segment) per pass, per backend and weight type.
void register_kernel() {
  static std::vector<std::unique_ptr<ref::model>> keep;
  const model_spec ms = large_model();
  struct case_t {
    std::string name;
    std::vector<int> lengths;
  };
  const int scale = g_opt.smoke ? 32 : 512;
  std::vector<case_t> cases{
      {"8x" + std::to_string(scale), std::vector<int>(8, scale)},
      {"heavy-32", support::generate_lengths(support::profile::heavy_cut, 32, 2024, scale)}};
  std::vector<ref::gemm_backend> backends{ref::gemm_backend::eigen};
  if (ref::onednn_available()) backends.push_back(ref::gemm_backend::onednn);
  for (ref::weight_type wt : {ref::weight_type::f32, ref::weight_type::bf16}) {
    // Each backend multiplies weights laid out for it (model_options::layout).
    std::map<ref::gemm_backend, const ref::model*> laid_out;
    for (ref::gemm_backend be : backends) {
      keep.push_back(build(ms, ref::model_options{wt, be}));
      laid_out[be] = keep.back().get();
    }
    for (const case_t& cs : cases) {
      auto prompts = std::make_shared<std::vector<std::vector<int>>>(
          support::generate_prompts(cs.lengths, ms.cfg.vocab, 5));
      auto lengths = std::make_shared<std::vector<int>>(cs.lengths);
      auto alone = std::make_shared<ref::matrix>();
      for (ref::gemm_backend be : backends) {
        // bf16 on Eigen is an emulation (bf16-rounded fp32 GEMMs) that proves equality, not speed.
        if (wt == ref::weight_type::bf16 && be == ref::gemm_backend::eigen && !g_opt.smoke)
          continue;
        const ref::model* m = laid_out.at(be);
        const std::string bname = ref::backend_name(be);
        const std::string wname = ref::weight_type_name(wt);
        const std::string name = "kernel/" + ms.name + "/" + cs.name + "/" + bname + "/" + wname;
        benchmark::RegisterBenchmark(
            name.c_str(),
            [=](benchmark::State& state) {
              if (alone->size() == 0) {
                *alone =
                    ref::prefill_alone(*m, *prompts, 0, {ref::attention::segment, 0, be}).second;
              }
              double worst_diff = 0, best = 0;
              totals t;
              for (auto _ : state) {
                std::tie(best, t) = fastest_pass(
                    [&] {
                      totals x;
                      const auto layout = prepack::make_layout(
                          prepack::first_fit_decreasing(*lengths), *prompts, {m->cfg().pad_id, 0});
                      const auto r = m->prefill(layout, {ref::attention::segment, 0, be});
                      x.useful = static_cast<double>(layout.useful_tokens());
                      x.linear_flops = r.profile.linear_flops;
                      x.linear_seconds = r.profile.seconds_linear;
                      x.attention_seconds = r.profile.seconds_attention;
                      x.prefill_seconds = r.profile.seconds_total;
                      x.max_logit_diff = (r.logits - *alone).cwiseAbs().maxCoeff();
                      return x;
                    },
                    worst_diff);
                state.SetIterationTime(best);
              }
              // bf16 activations: a rounding an fp32 accumulation order flips moves logits by
              // bf16's step; the bound is 0.5% of the logits' scale (fp32: 1e-3).
              const double bound =
                  wt == ref::weight_type::bf16
                      ? 5e-3 * std::max(1.0, static_cast<double>(alone->cwiseAbs().maxCoeff()))
                      : 1e-3;
              if (worst_diff > bound) {
                const std::string why = "logits differ from prefilling each prompt alone by " +
                                        std::to_string(worst_diff);
                state.SkipWithError(why.c_str());
                return;
              }
              report::kernel_row row;
              row.model = ms.name;
              row.workload = cs.name;
              row.backend = bname;
              row.weights = wname;
              if (wt == ref::weight_type::bf16) row.bf16_path = ref::bf16_path(be).describe();
              row.seconds = best;
              row.tokens_per_s = t.useful / best;
              row.linear_gflops = t.linear_flops / t.linear_seconds / 1e9;
              row.fma_peak = g_fma_peak;
              row.attention_share = t.attention_seconds / t.prefill_seconds;
              row.max_diff = worst_diff;
              state.counters["tok_per_s"] = row.tokens_per_s;
              state.counters["linear_GFLOPs"] = row.linear_gflops;
              state.counters["peak_share"] = row.linear_gflops / g_fma_peak;
              state.counters["attention_share"] = row.attention_share;
              state.counters["max_diff"] = worst_diff;
              g_results.pending_kernel[name] = row;
            })
            ->UseManualTime()
            ->Iterations(1)
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
}

// Collects the rows of the benchmarks that ran without error into the report.
class collecting_reporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      if (r.error_occurred) ++g_failed;
      if (r.error_occurred || r.run_type != Run::RT_Iteration) continue;
      const std::string name = r.run_name.function_name;
      if (const auto it = g_results.pending.find(name); it != g_results.pending.end()) {
        g_results.rows.push_back(it->second);
      }
      if (const auto it = g_results.pending_kernel.find(name);
          it != g_results.pending_kernel.end()) {
        g_results.kernel_rows.push_back(it->second);
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
};

// A count flag's value, range-checked: a mistake is a usage_error naming the flag.
long long count_flag(const char* flag, const std::string& v, long long lo, long long hi) {
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || x < lo || x > hi) {
    throw support::usage_error(std::string(flag) + " '" + v + "' is not an integer in " +
                               std::to_string(lo) + ".." + std::to_string(hi));
  }
  return x;
}

bool take_flag(const char* arg, const char* name, std::string* value) {
  const std::size_t n = std::strlen(name);
  if (std::strncmp(arg, name, n) != 0) return false;
  if (value == nullptr) return arg[n] == '\0';
  if (arg[n] != '=') return false;
  *value = arg + n + 1;
  return true;
}

int run(int argc, char** argv) {
  std::vector<char*> rest{argv[0]};
  for (int i = 1; i < argc; ++i) {
    std::string v;
    if (take_flag(argv[i], "--quick", nullptr))
      g_opt.quick = true;
    else if (take_flag(argv[i], "--smoke", nullptr))
      g_opt.smoke = true;
    else if (take_flag(argv[i], "--kernel", nullptr))
      g_opt.kernel_only = true;
    else if (take_flag(argv[i], "--model", &v))
      g_opt.model_path = v;
    else if (take_flag(argv[i], "--lengths", &v))
      g_opt.lengths_file = v;
    else if (take_flag(argv[i], "--report_dir", &v))
      g_opt.report_dir = v;
    else if (take_flag(argv[i], "--dataset", &v))
      g_opt.dataset = static_cast<std::size_t>(count_flag("--dataset", v, 1, 1 << 20));
    else if (take_flag(argv[i], "--max_len", &v))
      g_opt.max_len = static_cast<int>(count_flag("--max_len", v, 8, 1 << 16));
    else
      rest.push_back(argv[i]);
  }
  if (g_opt.smoke) {
    g_opt.dataset = std::min<std::size_t>(g_opt.dataset, 12);
    g_opt.min_passes = 1;
    g_opt.min_seconds = 0;
    g_opt.max_len = std::min(g_opt.max_len, 48);
  }
  if (!g_opt.kernel_only) register_prefill();
  if (!g_opt.quick) register_kernel();
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  if (benchmark::ReportUnrecognizedArguments(n, rest.data())) return 2;
  const int threads = ref::threads_for(0);
  g_fma_peak = machine::fma_peak_gflops(threads);
  std::printf("FMA peak of %d threads, measured: %.1f GFLOP/s\n", threads, g_fma_peak);
  std::printf("bf16 weights: %s on eigen%s%s\n",
              ref::bf16_path(ref::gemm_backend::eigen).describe().c_str(),
              ref::onednn_available() ? ", " : "",
              ref::onednn_available()
                  ? (ref::bf16_path(ref::gemm_backend::onednn).describe() + " on onednn").c_str()
                  : "");
  // What bf16 costs or gains on this CPU, measured before the run on the large model's
  // feed-forward shape: the bf16 rows below are read against it.
  for (const ref::gemm_backend be : {ref::gemm_backend::eigen, ref::gemm_backend::onednn}) {
    if (be == ref::gemm_backend::onednn && !ref::onednn_available()) continue;
    const ref::bf16_speed s = ref::measure_bf16_speed(be, 128, 1024, 2816);
    g_results.bf16_here.push_back(std::string("On ") + ref::backend_name(be) + ", " + s.describe() +
                                  (s.faster() ? "" : ": bf16 is slower here"));
    std::printf("%s\n", g_results.bf16_here.back().c_str());
  }
  const auto cpu0 = machine::cpu_times::now();
  collecting_reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  g_results.others_share = machine::others_share(cpu0, machine::cpu_times::now());
  g_results.fma_peak = g_fma_peak;
  g_results.threads = threads;
  std::printf("other processes used %.1f%% of the machine's CPU time during the run\n",
              100.0 * g_results.others_share);
  if (!g_opt.report_dir.empty()) {
    report::write(g_results, g_opt.report_dir);
    std::printf("report written to %s\n", g_opt.report_dir.c_str());
  }
  if (g_failed > 0) {
    std::fprintf(stderr, "bench_prefill: %d benchmark(s) failed (see ERROR OCCURRED above)\n",
                 g_failed);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return support::guarded_main("bench_prefill", [&] { return run(argc, argv); });
}
