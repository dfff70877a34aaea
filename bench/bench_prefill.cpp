// Padding vs length-sorted padding vs prepacking, on the reference model, measured side by side
// in one run. One benchmark per (model, workload, batch size, method); a pass prefills a whole
// dataset of prompts batch by batch, timing what a server's time-to-first-token contains:
// plan + layout + prefill + unpack into per-prompt caches + the first greedy token. Each
// benchmark makes at least 3 passes and 0.5 s of them and reports its fastest pass (the machine
// is shared: a slower pass was slowed by something else); every pass checks its logits against
// prefilling each prompt alone.
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
//
// Flags of our own, before Google Benchmark's:
//   --quick             batch sizes 8 and 32, the small model only
//   --smoke             a tiny model and dataset: checks results, for the test suite
//   --lengths=FILE      add a workload "file" from prompt lengths in FILE
//   --report_dir=DIR    write results.csv, results.md and the chart data there
//   --dataset=N         prompts per dataset (default 64)
//   --max_len=N         workload length scale (default 512)
// Counters: batches, s_per_batch, useful_tok_per_s, padded_ratio (slots / useful tokens),
// speedup (padding's time / this method's, same run), peak_MiB (largest prefill), linear_GFLOPs
// (the fastest pass's) and gemm_GFLOPs (raw Eigen GEMMs of the same shapes and weights, same
// run), max_diff (logits vs alone, worst pass).
// Exit code 1 when any method's logits differ from prefilling each prompt alone (> 1e-3).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "prepack/prepack.hpp"
#include "prepack/reference.hpp"
#include "prepack/workload.hpp"
#include "report.hpp"

namespace ref = prepack::reference;

namespace {

struct options {
  bool quick = false, smoke = false;
  std::string lengths_file, report_dir;
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
};

std::vector<model_spec> models() {
  ref::config small;
  small.vocab = 4096, small.hidden = 256, small.n_layers = 4, small.n_heads = 8,
  small.n_kv_heads = 2;
  small.head_dim = 32, small.ffn = 688;
  ref::config medium;
  medium.vocab = 8192, medium.hidden = 512, medium.n_layers = 4, medium.n_heads = 8,
  medium.n_kv_heads = 2;
  medium.head_dim = 64, medium.ffn = 1376;
  ref::config tiny;
  tiny.vocab = 256, tiny.hidden = 32, tiny.n_layers = 1, tiny.n_heads = 4, tiny.n_kv_heads = 2;
  tiny.head_dim = 8, tiny.ffn = 64;
  if (g_opt.smoke) return {{"tiny", tiny}};
  if (g_opt.quick) return {{"small", small}};
  return {{"small", small}, {"medium", medium}};
}

enum class method { padding, sorted, ffd_dense, ffd_segment, bfd_segment, ffd_fit, dataset, flat };
const std::vector<std::pair<method, const char*>> kMethods = {
    {method::padding, "padding"},         {method::sorted, "sorted"},
    {method::ffd_dense, "ffd-dense"},     {method::ffd_segment, "ffd-segment"},
    {method::bfd_segment, "bfd-segment"}, {method::ffd_fit, "ffd-fit"},
    {method::dataset, "dataset"},         {method::flat, "flat"}};
constexpr double kFitMaxPad = 0.05;  // ffd-fit's padding budget

struct workload {
  std::string name;
  std::vector<int> lengths;
};

std::vector<workload> workloads() {
  std::vector<workload> out;
  for (prepack::profile p : prepack::all_profiles()) {
    out.push_back({prepack::profile_name(p),
                   prepack::generate_lengths(p, g_opt.dataset, 2024, g_opt.max_len)});
  }
  if (!g_opt.lengths_file.empty()) {
    std::ifstream in(g_opt.lengths_file);
    if (!in) throw prepack::error("cannot open '" + g_opt.lengths_file + "'");
    workload w{"file", {}};
    for (const auto& rec : prepack::read_records(in, g_opt.lengths_file, "length", 1 << 20)) {
      for (long long v : rec.values) {
        if (v == 0)
          throw prepack::error(g_opt.lengths_file + ":" + std::to_string(rec.line) + ": length 0");
        w.lengths.push_back(static_cast<int>(v));
      }
    }
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
  double useful = 0, slots = 0, linear_flops = 0, linear_seconds = 0;
  std::size_t peak_bytes = 0, n_batches = 0;
  double peak_slots = 0;  // slots of the prefill with the peak memory
  // [n_batches] (slots, prompts) of each prefill: the shapes of its linear layers and LM head
  std::vector<std::pair<std::size_t, std::size_t>> batch_shapes;
  double max_logit_diff = 0;  // against prefilling each prompt alone
};

// Prefills the dataset with one method; the timed region of the benchmark.
totals run_dataset(const ref::model& m, const std::vector<std::vector<int>>& prompts,
                   const std::vector<int>& len, method me, std::size_t batch,
                   const ref::matrix& alone) {
  totals t;
  const ref::attention path =
      me == method::padding || me == method::sorted || me == method::ffd_dense
          ? ref::attention::dense
          : ref::attention::segment;
  std::vector<batch_job> jobs;
  if (me == method::dataset) {
    const auto whole = prepack::first_fit_decreasing(len);
    const std::size_t n_batches = (len.size() + batch - 1) / batch;
    const std::size_t rows = std::max<std::size_t>(1, (whole.n_rows() + n_batches - 1) / n_batches);
    for (auto& b : prepack::split_rows(whole, rows))
      jobs.push_back({std::move(b.prompts), std::move(b.plan)});
  } else {
    const auto groups = me == method::sorted
                            ? prepack::length_sorted_batches(prepack::span<const int>(len), batch)
                            : prepack::arrival_batches(len.size(), batch);
    for (const auto& g : groups) jobs.push_back({g, std::nullopt});
  }
  for (const batch_job& job : jobs) {
    std::vector<std::vector<int>> batch_prompts;
    std::vector<int> batch_len;
    for (std::size_t i : job.ids) {
      batch_prompts.push_back(prompts[i]);
      batch_len.push_back(len[i]);
    }
    int total = 0;
    for (int l : batch_len) total += l;
    prepack::pack_plan<int> plan;
    switch (me) {
      case method::padding:
      case method::sorted:
        plan = prepack::padded(batch_len);
        break;
      case method::ffd_dense:
      case method::ffd_segment:
        plan = prepack::first_fit_decreasing(batch_len);
        break;
      case method::bfd_segment:
        plan = prepack::best_fit_decreasing(batch_len);
        break;
      case method::ffd_fit:
        plan = prepack::fitted_plan(prepack::packer::first_fit_decreasing, batch_len,
                                    {kFitMaxPad, std::nullopt});
        break;
      case method::dataset:
        plan = *job.plan;
        break;
      case method::flat:
        plan = prepack::first_fit_decreasing(batch_len, total);
        break;
    }
    const auto layout = prepack::make_layout(plan, batch_prompts, {m.cfg().pad_id, 0});
    const auto r = m.prefill(layout, {path, 0});
    const auto caches = ref::unpack_caches(m, layout, r, 0);
    for (Eigen::Index i = 0; i < r.logits.rows(); ++i) {  // the first token
      Eigen::Index best;
      r.logits.row(i).maxCoeff(&best);
      benchmark::DoNotOptimize(best);
    }
    benchmark::DoNotOptimize(caches.seqs.data());
    t.useful += static_cast<double>(plan.useful_tokens());
    t.slots += static_cast<double>(plan.slots());
    t.linear_flops += r.profile.linear_flops;
    t.linear_seconds += r.profile.seconds_linear;
    if (r.memory.peak_bytes > t.peak_bytes) {
      t.peak_bytes = r.memory.peak_bytes;
      t.peak_slots = static_cast<double>(plan.slots());
    }
    t.batch_shapes.emplace_back(plan.slots(), plan.n_prompts());
    ++t.n_batches;
    for (std::size_t k = 0; k < job.ids.size(); ++k) {
      const double d = (alone.row(static_cast<Eigen::Index>(job.ids[k])) -
                        r.logits.row(static_cast<Eigen::Index>(k)))
                           .cwiseAbs()
                           .maxCoeff();
      t.max_logit_diff = std::max(t.max_logit_diff, d);
    }
  }
  return t;
}

report::table g_results;
int g_failed = 0;  // benchmarks that stopped with an error (results differing from alone)
std::map<std::string, double> g_padding_seconds;  // seconds per pass of padding, by group

void register_all() {
  static std::vector<std::unique_ptr<ref::model>> keep;
  const std::vector<std::size_t> batches = g_opt.smoke ? std::vector<std::size_t>{4, 8}
                                           : g_opt.quick
                                               ? std::vector<std::size_t>{8, 32}
                                               : std::vector<std::size_t>{4, 8, 16, 32, 64};
  for (const model_spec& ms : models()) {
    keep.push_back(std::make_unique<ref::model>(ms.cfg, 7));
    const ref::model* m = keep.back().get();
    for (const workload& w : workloads()) {
      auto prompts = std::make_shared<std::vector<std::vector<int>>>(
          prepack::generate_prompts(w.lengths, ms.cfg.vocab, 99));
      auto lengths = std::make_shared<std::vector<int>>(w.lengths);
      auto alone = std::make_shared<ref::matrix>();
      for (std::size_t batch : batches) {
        for (const auto& [me, mname] : kMethods) {
          const std::string name =
              "prefill/" + ms.name + "/" + w.name + "/" + mname + "/" + std::to_string(batch);
          report::key key{ms.name, w.name, mname, batch};
          const std::string group = ms.name + "/" + w.name + "/" + std::to_string(batch);
          benchmark::RegisterBenchmark(
              name.c_str(),
              [=](benchmark::State& state) {
                if (alone->size() == 0) *alone = ref::prefill_alone(*m, *prompts).second;
                // Passes of the whole dataset until at least min_passes and min_seconds; the
                // time is the fastest pass (the others were slowed by something else on the
                // machine), and every pass checks its logits against prefilling each prompt
                // alone (a comparison of n_prompts x vocab floats, next to nothing).
                totals t;
                double best = 0, linear_gflops = 0, worst_diff = 0;
                for (auto _ : state) {
                  const auto start = std::chrono::steady_clock::now();
                  for (int passes = 0;; ++passes) {
                    if (passes >= g_opt.min_passes && seconds_since(start) >= g_opt.min_seconds)
                      break;
                    const auto t0 = std::chrono::steady_clock::now();
                    t = run_dataset(*m, *prompts, *lengths, me, batch, *alone);
                    const double pass = seconds_since(t0);
                    best = passes == 0 ? pass : std::min(best, pass);
                    linear_gflops =
                        std::max(linear_gflops, t.linear_flops / t.linear_seconds / 1e9);
                    worst_diff = std::max(worst_diff, t.max_logit_diff);
                  }
                  state.SetIterationTime(best);
                }
                if (worst_diff > 1e-3) {
                  state.SkipWithError("logits differ from prefilling each prompt alone");
                  return;
                }
                // Padding runs first in each (model, workload, batch) group; the others divide.
                if (me == method::padding) g_padding_seconds[group] = best;
                if (g_padding_seconds.count(group) != 0) {
                  state.counters["speedup"] = g_padding_seconds[group] / best;
                }
                const double gemm = 0;  // the FMA-peak yardstick replaces it
                state.counters["batches"] = static_cast<double>(t.n_batches);
                state.counters["s_per_batch"] = best / static_cast<double>(t.n_batches);
                state.counters["useful_tok_per_s"] = t.useful / best;
                state.counters["padded_ratio"] = t.slots / t.useful;
                state.counters["peak_MiB"] = static_cast<double>(t.peak_bytes) / (1024.0 * 1024.0);
                state.counters["linear_GFLOPs"] = linear_gflops;
                state.counters["gemm_GFLOPs"] = gemm;
                state.counters["max_diff"] = worst_diff;
                report::row row;
                row.k = key;
                row.seconds = best;
                row.useful_tokens = t.useful;
                row.slots = t.slots;
                row.peak_bytes = static_cast<double>(t.peak_bytes);
                row.peak_slots = t.peak_slots;
                row.linear_gflops = linear_gflops;
                row.gemm_gflops = gemm;
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

// Collects the rows of the benchmarks that ran without error into the report.
class collecting_reporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      if (r.error_occurred) ++g_failed;
      if (r.error_occurred || r.run_type != Run::RT_Iteration) continue;
      const auto it = g_results.pending.find(r.run_name.function_name);
      if (it == g_results.pending.end()) continue;
      g_results.rows.push_back(it->second);
    }
    ConsoleReporter::ReportRuns(runs);
  }
};

bool take_flag(const char* arg, const char* name, std::string* value) {
  const std::size_t n = std::strlen(name);
  if (std::strncmp(arg, name, n) != 0) return false;
  if (value == nullptr) return arg[n] == '\0';
  if (arg[n] != '=') return false;
  *value = arg + n + 1;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<char*> rest{argv[0]};
  try {
    for (int i = 1; i < argc; ++i) {
      std::string v;
      if (take_flag(argv[i], "--quick", nullptr))
        g_opt.quick = true;
      else if (take_flag(argv[i], "--smoke", nullptr))
        g_opt.smoke = true;
      else if (take_flag(argv[i], "--lengths", &v))
        g_opt.lengths_file = v;
      else if (take_flag(argv[i], "--report_dir", &v))
        g_opt.report_dir = v;
      else if (take_flag(argv[i], "--dataset", &v))
        g_opt.dataset = static_cast<std::size_t>(std::stoul(v));
      else if (take_flag(argv[i], "--max_len", &v))
        g_opt.max_len = std::stoi(v);
      else
        rest.push_back(argv[i]);
    }
    if (g_opt.smoke) {
      g_opt.dataset = std::min<std::size_t>(g_opt.dataset, 12);
      g_opt.min_passes = 1;
      g_opt.min_seconds = 0;
      g_opt.max_len = std::min(g_opt.max_len, 48);
    }
    register_all();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_prefill: %s\n", e.what());
    return 2;
  }
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  if (benchmark::ReportUnrecognizedArguments(n, rest.data())) return 2;
  collecting_reporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
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
