// bench_serve: serving a live request stream on the reference model, side by side in one run.
//
//   serve/<workload>/<method>/<rate>   a seeded stream of Poisson arrivals (256 requests, 16 new
//                                      tokens each) served by:
//     static-padded     static batches (up to 16 waiting requests), padded to the longest and
//                       prefilled with a dense mask, then decoded together until all are done
//                       (Hugging Face generate)
//     static-prepacked  the same batches prepacked (first-fit-decreasing rows, segment
//                       attention): the paper's setting
//     fcfs, packed,     prepack::scheduler, continuous batching: vLLM's chunked FCFS,
//     shortest          prepack's packing and shortest-first; "+cache" with the prefix cache on
//   scheduler/<live>                   the scheduler's own time per step at 10^4 live requests,
//                                      against the forward pass of a step that size
//   decode/<seqs>                      decode steps of the large model (fp32) at 1, 8 and 32
//                                      sequences, against the weight-streaming bound (weight
//                                      bytes over the read bandwidth measured here)
//   quantized/<form>/...               with --model=PATH (a quantized GGUF): the checkpoint's
//                                      projections held as stored (fp32 activations, and
//                                      held-int8: 8-bit activations, with the drift of its
//                                      logits from the fp32 ones) against dequantized to fp32
//                                      (the demo's --widen): resident weight bytes, prefill
//                                      tokens/s (8 prompts x 128 tokens, prepacked, one pass)
//                                      and decode steps at 1, 8 and 32 sequences against each
//                                      form's weight-streaming bound
// Writes <report_dir>/serve.md (tables, targets), serve.csv and the chart data (gnuplot:
// serve.gp draws TTFT p99 against the request rate, one line per method); a run of the
// quantized family alone writes <report_dir>/quantized-<file>.md instead (the serving report
// stays), to which bench/llama_cpp_decode.py --markdown appends llama.cpp's steps. --smoke: a tiny
// model and one rate, for the tests.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "machine.hpp"
#include "prepack/prepack.hpp"
#include "prepack/reference.hpp"
#ifdef PREPACK_BENCH_CHECKPOINTS
#include "prepack/checkpoint.hpp"
#endif
#include "support/main.hpp"
#include "support/trace.hpp"
#include "support/workload.hpp"

namespace ref = prepack::reference;

namespace {

struct options {
  bool smoke = false, quick = false;
  std::string report_dir = "serve-report";
  std::string model_path;  // --model: a quantized checkpoint for the quantized/ family
};
options g_opt;
// Requests a stream: enough that a p99 is not the single worst request.
constexpr std::size_t stream_requests = 256;

ref::config small_config(bool tiny) {
  ref::config c;
  if (tiny) {
    c.vocab = 256, c.hidden = 32, c.n_layers = 1, c.n_heads = 4, c.n_kv_heads = 2, c.ffn = 64;
  } else {
    c.vocab = 4096, c.hidden = 256, c.n_layers = 4, c.n_heads = 8, c.n_kv_heads = 2, c.ffn = 688;
  }
  return c;
}

struct latency {
  std::vector<double> ttft, tpot;
  double span_ms = 0;  // first arrival to last finish
  std::size_t generated = 0;
  double throughput() const {
    return span_ms > 0 ? 1000.0 * static_cast<double>(generated) / span_ms : 0;
  }
};

// Static batching: whenever the engine is free, the requests that have arrived (up to `batch`)
// are prefilled together (padded, or prepacked) and decoded together until all are done.
latency serve_static(const ref::model& m, std::vector<ref::timed_request> trace, std::size_t batch,
                     bool prepacked) {
  using clock = std::chrono::steady_clock;
  std::stable_sort(trace.begin(), trace.end(),
                   [](const auto& a, const auto& b) { return a.arrival_ms < b.arrival_ms; });
  latency out;
  const auto t0 = clock::now();
  double skipped = 0;
  const auto now = [&] {
    return std::chrono::duration<double, std::milli>(clock::now() - t0).count() + skipped;
  };
  std::size_t next = 0;
  const ref::exec_options exec{0, ref::gemm_backend::automatic};
  while (next < trace.size()) {
    double t = now();
    if (trace[next].arrival_ms > t) {
      skipped += trace[next].arrival_ms - t;
      t = now();
    }
    std::vector<std::vector<int>> prompts;
    std::vector<double> arrivals;
    std::size_t new_tokens = 0;
    while (next < trace.size() && trace[next].arrival_ms <= t && prompts.size() < batch) {
      const auto& r = trace[next++];
      prompts.emplace_back(r.r.prompt.begin(), r.r.prompt.end());
      arrivals.push_back(r.arrival_ms);
      new_tokens = std::max(new_tokens, r.r.max_new_tokens);
    }
    std::vector<int> len;
    for (const auto& p : prompts) len.push_back(static_cast<int>(p.size()));
    const auto plan = prepacked ? prepack::first_fit_decreasing(len) : prepack::padded(len);
    const auto layout = prepack::make_layout(plan, prompts, {m.cfg().pad_id, 0});
    const auto r = m.prefill(layout, {prepacked ? ref::attention::segment : ref::attention::dense,
                                      exec.n_threads, exec.backend});
    auto cache = ref::unpack_caches(m, layout, r, new_tokens);
    const double first = now();
    ref::greedy_decode(m, cache, r.logits, static_cast<int>(new_tokens), exec);
    const double done = now();
    for (double a : arrivals) {
      out.ttft.push_back(first - a);
      if (new_tokens > 1) out.tpot.push_back((done - first) / static_cast<double>(new_tokens - 1));
    }
    out.generated += new_tokens * prompts.size();
    out.span_ms = done - trace.front().arrival_ms;
  }
  return out;
}

latency serve_continuous(const ref::model& m, const std::vector<ref::timed_request>& trace,
                         prepack::admission policy, bool cache) {
  prepack::scheduler_options so;
  so.token_budget = 512;
  so.max_seqs = 64;
  so.n_blocks = 4096;
  so.block_size = 16;
  so.policy = policy;
  so.prefix_cache = cache;
  prepack::scheduler s(so);
  const ref::serve_report rep = ref::serve(m, s, trace);
  latency out;
  double first_arrival = 1e300, last = 0;
  for (const auto& r : rep.requests) {
    out.ttft.push_back(r.ttft_ms());
    if (r.generated.size() > 1) out.tpot.push_back(r.tpot_ms());
    out.generated += r.generated.size();
    first_arrival = std::min(first_arrival, r.arrival_ms);
    last = std::max(last, r.finish_ms);
  }
  out.span_ms = last - first_arrival;
  return out;
}

struct serve_row {
  std::string workload, method;
  double rate = 0;
  latency lat;
};
std::vector<serve_row> g_serve;
struct sched_row {
  std::size_t live = 0;
  double sched_ms = 0, forward_ms = 0;
};
std::vector<sched_row> g_sched;
struct decode_row {
  std::size_t seqs = 0;
  double step_ms = 0, bound_ms = 0, compute_ms = 0, bandwidth = 0, peak = 0, weight_mb = 0;
};
std::vector<decode_row> g_decode;
struct quant_row {
  std::string form;  // "held", "held-int8" or "widened"
  double weight_mb = 0, prefill_tps = 0, bandwidth = 0;
  double logit_drift = -1;  // held-int8: max |logits - held fp32 logits| / max |logit|
  std::map<std::size_t, double> step_ms;  // by sequences
};
std::map<std::string, quant_row> g_quant;
machine::cpu_times g_t0;

void register_serve() {
  static std::vector<std::unique_ptr<ref::model>> keep;
  keep.push_back(std::make_unique<ref::model>(small_config(g_opt.smoke), 7));
  const ref::model* m = keep.back().get();
  // Warm up once (oneDNN's kernels, the model's buffers).
  ref::prefill_alone(*m, std::vector<std::vector<int>>{std::vector<int>(32, 1)}, 1);
  const std::vector<std::string> workloads =
      g_opt.smoke ? std::vector<std::string>{"heavy-cut"}
                  : std::vector<std::string>{"heavy-cut", "few-shot", "system-prompt"};
  const std::vector<double> rates =
      g_opt.smoke   ? std::vector<double>{8}
      : g_opt.quick ? std::vector<double>{4, 32, 256}
                    : std::vector<double>{2, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 512};
  const std::size_t n = g_opt.smoke ? 12 : stream_requests;
  const int max_len = g_opt.smoke ? 48 : 512;
  const std::vector<std::string> methods{"static-padded", "static-prepacked", "fcfs",
                                         "packed",        "shortest",         "fcfs+cache",
                                         "packed+cache"};
  for (const std::string& w : workloads) {
    for (double rate : rates) {
      const auto trace = support::generate_trace(w, n, rate, 16, m->cfg().vocab, max_len, 11);
      for (const std::string& me : methods) {
        const std::string name =
            "serve/" + w + "/" + me + "/" + std::to_string(static_cast<int>(rate));
        benchmark::RegisterBenchmark(
            name.c_str(),
            [=](benchmark::State& state) {
              latency lat;
              for (auto _ : state) {
                if (me == "static-padded") {
                  lat = serve_static(*m, trace, 16, false);
                } else if (me == "static-prepacked") {
                  lat = serve_static(*m, trace, 16, true);
                } else {
                  const auto pol = me.rfind("packed", 0) == 0 ? prepack::admission::packed
                                   : me.rfind("shortest", 0) == 0
                                       ? prepack::admission::shortest_first
                                       : prepack::admission::fcfs;
                  lat = serve_continuous(*m, trace, pol, me.find("+cache") != std::string::npos);
                }
                state.SetIterationTime(lat.span_ms / 1000.0);
              }
              state.counters["ttft_p50_ms"] = support::percentile(lat.ttft, 0.5);
              state.counters["ttft_p99_ms"] = support::percentile(lat.ttft, 0.99);
              state.counters["tpot_p50_ms"] = support::percentile(lat.tpot, 0.5);
              state.counters["tpot_p99_ms"] = support::percentile(lat.tpot, 0.99);
              state.counters["tokens_per_s"] = lat.throughput();
              g_serve.push_back({w, me, rate, lat});
            })
            ->Iterations(1)
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
}

// The scheduler alone at `live` requests: steps of 512 tokens, 256 sequences, with an engine
// that samples token 1; its time per step against a forward pass of the same shape.
void register_scheduler() {
  const std::size_t live = g_opt.smoke ? 500 : 10000;
  benchmark::RegisterBenchmark(
      ("scheduler/" + std::to_string(live)).c_str(),
      [=](benchmark::State& state) {
        static const ref::model m(small_config(g_opt.smoke), 7);
        double sched_s = 0, forward_s = 0;
        for (auto _ : state) {
          prepack::scheduler_options so;
          so.token_budget = 512;
          so.max_seqs = 256;
          so.block_size = 16;
          so.n_blocks = live * 8;
          so.policy = prepack::admission::packed;
          prepack::scheduler s(so);
          prepack::detail::splitmix g(5);
          for (std::size_t i = 0; i < live; ++i) {
            prepack::request r;
            r.id = static_cast<std::int64_t>(i);
            r.prompt.assign(16 + g.next() % 96, static_cast<std::int32_t>(g.next() % 200));
            r.max_new_tokens = 64;
            s.add(std::move(r));
          }
          std::vector<std::int32_t> sampled;
          prepack::step_inputs<> last;
          std::size_t steps = 0;
          const auto t0 = std::chrono::steady_clock::now();
          // 200 steps (or until the stream drains); the shape of the last is measured below.
          for (; steps < 200 && !s.idle(); ++steps) {
            auto st = s.next_step();
            sampled.assign(st.n_samples, 1);
            s.commit(prepack::span<const std::int32_t>(sampled));
            last = std::move(st.inputs);
          }
          sched_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                    static_cast<double>(steps);
          // A forward pass of the last step's shape (its sequences' contexts and chunks), on a pool
          // holding just those sequences.
          std::vector<std::size_t> room;
          for (std::size_t q = 0; q < last.n_seqs(); ++q)
            room.push_back(static_cast<std::size_t>(last.seq_lens[q]));
          ref::paged_cache cache = ref::make_cache(m.cfg(), room, 16);
          prepack::step_builder<> b(16, cache.pool.n_blocks(),
                                    [](std::size_t q) { return std::to_string(q); });
          for (std::size_t q = 0; q < last.n_seqs(); ++q) {
            const auto ctx = static_cast<std::size_t>(last.context_lens[q]);
            for (std::size_t p = 0; p < ctx; ++p) {
              cache.pool.record_write(cache.seqs[q].slot(p, 16), static_cast<std::int64_t>(p));
            }
            const std::vector<std::int32_t> toks(static_cast<std::size_t>(last.query_lens[q]), 1);
            b.add(q, static_cast<std::int64_t>(q), ctx, prepack::span<const std::int32_t>(toks),
                  prepack::span<const std::int32_t>(cache.seqs[q].blocks), last.completes[q] != 0,
                  last.decodes[q] != 0, ctx + toks.size());
          }
          const auto in = std::move(b).finish();
          m.forward(in, cache.pool);
          const auto t1 = std::chrono::steady_clock::now();
          for (int k = 0; k < 3; ++k) m.forward(in, cache.pool);
          forward_s =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count() / 3;
          state.SetIterationTime(sched_s);
        }
        state.counters["scheduler_ms"] = 1000 * sched_s;
        state.counters["forward_ms"] = 1000 * forward_s;
        state.counters["share"] = sched_s / forward_s;
        g_sched.push_back({live, 1000 * sched_s, 1000 * forward_s});
      })
      ->Iterations(1)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond);
}

// The best of `repeats` decode steps of `seqs` sequences (128-token prompts prefilled alone).
double best_decode_step(const ref::model& m, std::size_t seqs, int repeats) {
  const auto prompts = support::generate_prompts(std::vector<int>(seqs, 128), m.cfg().vocab, 4);
  auto [cache, logits] = ref::prefill_alone(m, prompts, static_cast<std::size_t>(repeats) + 1);
  std::vector<int> next(seqs, 1);
  double best = 1e300;
  for (int k = 0; k < repeats; ++k) {
    const auto in = ref::decode_step(cache, next);
    const auto t0 = std::chrono::steady_clock::now();
    m.forward(in, cache.pool);
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    for (auto& s : cache.seqs) ++s.length;
  }
  return best;
}

// Decode steps of the large model against the weight-streaming bound.
void register_decode() {
  ref::config c;
  if (g_opt.smoke) {
    c = small_config(true);
  } else {
    c.vocab = 32000, c.hidden = 1024, c.n_layers = 8, c.n_heads = 16, c.n_kv_heads = 4;
    c.head_dim = 64, c.ffn = 2816;
  }
  static double bandwidth = 0, peak = 0;
  for (std::size_t seqs : {std::size_t{1}, std::size_t{8}, std::size_t{32}}) {
    benchmark::RegisterBenchmark(
        ("decode/" + std::to_string(seqs)).c_str(),
        [=](benchmark::State& state) {
          static std::unique_ptr<ref::model> m;
          if (!m) m = std::make_unique<ref::model>(c, 3);
          if (bandwidth == 0) {
            bandwidth = machine::read_bandwidth_gbs(ref::threads_for(0));
            peak = machine::fma_peak_gflops(ref::threads_for(0));
          }
          double best = 1e300;
          for (auto _ : state) {
            best = best_decode_step(*m, seqs, 16);
            state.SetIterationTime(best);
          }
          // Bytes a decode step streams: every weight but the rows of an untied embedding table
          // it does not touch. Its FLOPs: two per weight (fp32) per sequence.
          const double table = c.tied_embeddings ? 0.0
                                                 : 4.0 * static_cast<double>(c.vocab) *
                                                       static_cast<double>(c.hidden);
          const double bytes = static_cast<double>(m->weight_bytes()) - table;
          const double bound = bytes / (bandwidth * 1e9);
          const double compute = 2.0 * (bytes / 4.0) * static_cast<double>(seqs) / (peak * 1e9);
          state.counters["step_ms"] = 1000 * best;
          state.counters["bound_ms"] = 1000 * bound;
          state.counters["compute_ms"] = 1000 * compute;
          state.counters["ratio"] = best / bound;
          g_decode.push_back(
              {seqs, 1000 * best, 1000 * bound, 1000 * compute, bandwidth, peak, bytes / 1e6});
        })
        ->Iterations(1)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
}

// A quantized checkpoint held as stored against widened to fp32, side by side (--model).
void register_quantized() {
#ifdef PREPACK_BENCH_CHECKPOINTS
  if (g_opt.model_path.empty()) return;
  for (const std::string form : {"held", "held-int8", "widened"}) {
    benchmark::RegisterBenchmark(
        ("quantized/" + form).c_str(),
        [=](benchmark::State& state) {
          const bool held = form != "widened", int8 = form == "held-int8";
          const auto ck = prepack::checkpoint::open(g_opt.model_path, {held});
          ref::model_options mo;
          if (int8) mo.activations = ref::activation_type::int8;
          const ref::model m(ck.info.cfg, *ck.weights, mo);
          quant_row& row = g_quant[form];
          row.form = form;
          row.bandwidth = machine::read_bandwidth_gbs(ref::threads_for(0));
          row.weight_mb = static_cast<double>(m.weight_bytes()) / 1e6;
          const auto prompts =
              support::generate_prompts(std::vector<int>(8, 128), m.cfg().vocab, 5);
          const auto l = prepack::make_layout(
              prepack::first_fit_decreasing(std::vector<int>(8, 128)), prompts);
          double best = 1e300;
          for (auto _ : state) {
            best = std::min(best, machine::best_seconds([&] { (void)m.prefill(l); }, 3));
            state.SetIterationTime(best);
          }
          row.prefill_tps = 8 * 128 / best;
          if (int8) {  // what 8-bit activations change: the prefill's logits against fp32 ones
            const auto ck32 = prepack::checkpoint::open(g_opt.model_path, {true});
            const ref::model exact(ck32.info.cfg, *ck32.weights);
            const ref::matrix a = m.prefill(l).logits, b = exact.prefill(l).logits;
            row.logit_drift = (a - b).cwiseAbs().maxCoeff() / b.cwiseAbs().maxCoeff();
            state.counters["logit_drift"] = row.logit_drift;
          }
          for (std::size_t seqs : {std::size_t{1}, std::size_t{8}, std::size_t{32}}) {
            row.step_ms[seqs] = 1000 * best_decode_step(m, seqs, 16);
            state.counters["decode" + std::to_string(seqs) + "_ms"] = row.step_ms[seqs];
          }
          state.counters["weights_mb"] = row.weight_mb;
          state.counters["prefill_tps"] = row.prefill_tps;
        })
        ->Iterations(1)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
#endif
}

// The quantized family's table (held, held-int8, widened on one file) and its target.
void write_quantized(std::ostream& md, std::vector<std::string>& targets) {
  char buf[512];
  if (!(g_quant.count("held") && g_quant.count("widened"))) return;
  const quant_row& h = g_quant["held"];
  const quant_row& w = g_quant["widened"];
  md << "### Quantized checkpoint " << std::filesystem::path(g_opt.model_path).filename().string()
     << ": projections held as stored against dequantized to fp32 (same run)\n\n"
     << "Bound: the weights the model holds, streamed once a step at the " << h.bandwidth
     << " GB/s read bandwidth measured here (an upper bound on the bytes: an untied "
        "embedding table is read a row a token).\n\n"
     << "| form | weights MB | prefill tokens/s (8 x 128) | decode ms, 1 seq | 8 seqs | 32 seqs "
        "| tokens/s at 1 seq | streaming bound ms | 1 seq / bound | logits against fp32 "
        "activations |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n";
  std::vector<const quant_row*> rows{&h};
  if (g_quant.count("held-int8")) rows.push_back(&g_quant["held-int8"]);
  rows.push_back(&w);
  for (const quant_row* r : rows) {
    const double bound_ms = r->weight_mb / r->bandwidth;  // MB / (GB/s) = ms
    char drift[64] = "exact (fp32 products)";
    if (r->logit_drift >= 0) {
      std::snprintf(drift, sizeof drift, "max diff %.2e of max |logit|", r->logit_drift);
    }
    std::snprintf(
        buf, sizeof buf, "| %s | %.1f | %.0f | %.2f | %.2f | %.2f | %.1f | %.2f | %.2fx | %s |\n",
        r->form.c_str(), r->weight_mb, r->prefill_tps, r->step_ms.at(1), r->step_ms.at(8),
        r->step_ms.at(32), 1000.0 / r->step_ms.at(1), bound_ms, r->step_ms.at(1) / bound_ms, drift);
    md << buf;
  }
  std::snprintf(buf, sizeof buf,
                "\nHeld against widened: %.2fx less weight memory, prefill %.2fx, decode "
                "%.2fx / %.2fx / %.2fx the speed at 1 / 8 / 32 sequences.\n\n",
                w.weight_mb / h.weight_mb, h.prefill_tps / w.prefill_tps,
                w.step_ms.at(1) / h.step_ms.at(1), w.step_ms.at(8) / h.step_ms.at(8),
                w.step_ms.at(32) / h.step_ms.at(32));
  md << buf;
  std::snprintf(buf, sizeof buf,
                "| quantized file: prefill held >= 0.9x the widened (fp32) path | %.2fx | %s |",
                h.prefill_tps / w.prefill_tps,
                h.prefill_tps >= 0.9 * w.prefill_tps ? "met" : "missed");
  targets.push_back(buf);
}

void write_report() {
  namespace fs = std::filesystem;
  const std::string& dir = g_opt.report_dir;
  fs::create_directories(dir);
  if (g_serve.empty() && g_sched.empty() && g_decode.empty()) {
    // The quantized family alone (a --model run filtered to it): its own file, named for the
    // checkpoint, beside the serving report rather than over it.
    if (g_quant.empty()) return;
    const std::string path =
        dir + "/quantized-" + fs::path(g_opt.model_path).stem().string() + ".md";
    std::ofstream md(path);
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "Other processes used %.1f%% of the machine's CPU time during the run.\n\n",
                  100 * machine::others_share(g_t0, machine::cpu_times::now()));
    md << buf;
    std::vector<std::string> targets;
    write_quantized(md, targets);
    md << "### Targets\n\n| target | measured | verdict |\n|---|---|---|\n";
    for (const std::string& t : targets) md << t << '\n';
    std::printf("quantized report written to %s\n", path.c_str());
    return;
  }
  std::ofstream csv(dir + "/serve.csv");
  csv << "workload,method,rate,ttft_p50_ms,ttft_p99_ms,tpot_p50_ms,tpot_p99_ms,tokens_per_s\n";
  std::map<std::string, std::map<std::string, std::map<double, const serve_row*>>> by;
  for (const serve_row& r : g_serve) {
    csv << r.workload << ',' << r.method << ',' << r.rate << ','
        << support::percentile(r.lat.ttft, 0.5) << ',' << support::percentile(r.lat.ttft, 0.99)
        << ',' << support::percentile(r.lat.tpot, 0.5) << ','
        << support::percentile(r.lat.tpot, 0.99) << ',' << r.lat.throughput() << '\n';
    by[r.workload][r.method][r.rate] = &r;
  }
  std::ofstream md(dir + "/serve.md");
  const machine::cpu_times t1 = machine::cpu_times::now();
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "Serving benchmark: %zu requests a stream, 16 new tokens each, Poisson arrivals; "
                "continuous methods with a budget of 512 tokens, 64 sequences, 4096 blocks of 16. "
                "Other processes used %.1f%% of the machine's CPU time during the run.\n\n",
                g_opt.smoke ? std::size_t{12} : stream_requests,
                100 * machine::others_share(g_t0, t1));
  md << buf;
  std::vector<std::string> targets;
  for (const auto& [w, methods] : by) {
    md << "### " << w << ": TTFT p50 / p99 (ms), TPOT p50 / p99 (ms), throughput (tokens/s)\n\n";
    md << "| rate (req/s) |";
    for (const auto& [me, _] : methods) md << ' ' << me << " |";
    md << "\n|---|";
    for (std::size_t k = 0; k < methods.size(); ++k) md << "---|";
    md << '\n';
    std::set<double> rates;
    for (const auto& [me, rs] : methods) {
      for (const auto& [rate, _] : rs) rates.insert(rate);
    }
    for (double rate : rates) {
      std::snprintf(buf, sizeof buf, "| %g |", rate);
      md << buf;
      for (const auto& [me, rs] : methods) {
        const auto it = rs.find(rate);
        if (it == rs.end()) {
          md << " |";
          continue;
        }
        const latency& l = it->second->lat;
        std::snprintf(buf, sizeof buf, " %.3g / %.3g, %.3g / %.3g, %.0f |",
                      support::percentile(l.ttft, 0.5), support::percentile(l.ttft, 0.99),
                      support::percentile(l.tpot, 0.5), support::percentile(l.tpot, 0.99),
                      l.throughput());
        md << buf;
      }
      md << '\n';
    }
    md << '\n';
    // The chart's data: rate, then TTFT p99 of each method.
    std::ofstream dat(dir + "/serve_" + w + ".dat");
    dat << "# rate";
    for (const auto& [me, _] : methods) dat << ' ' << me;
    dat << '\n';
    for (double rate : rates) {
      dat << rate;
      for (const auto& [me, rs] : methods) {
        const auto it = rs.find(rate);
        dat << ' '
            << (it == rs.end() ? std::nan("") : support::percentile(it->second->lat.ttft, 0.99));
      }
      dat << '\n';
    }
    // Targets: at the highest rate FCFS holds under 5x its unloaded TTFT p99 (every rate up to
    // it held), each of prepack's policies (packing; packing shortest-first) against it.
    const auto fc = methods.find("fcfs");
    if (fc != methods.end() && !fc->second.empty()) {
      const double unloaded = support::percentile(fc->second.begin()->second->lat.ttft, 0.99);
      double held = -1;
      for (const auto& [rate, r] : fc->second) {
        if (support::percentile(r->lat.ttft, 0.99) > 5 * unloaded) break;
        held = rate;
      }
      for (const char* policy : {"packed", "shortest"}) {
        const auto pk = methods.find(policy);
        if (held < 0 || pk == methods.end() || !pk->second.count(held)) continue;
        const latency& a = fc->second.at(held)->lat;
        const latency& b = pk->second.at(held)->lat;
        const double tp = b.throughput() / a.throughput();
        const double tt = support::percentile(b.ttft, 0.99) / support::percentile(a.ttft, 0.99);
        std::snprintf(buf, sizeof buf,
                      "| %s: at %g req/s (the highest FCFS holds under 5x its unloaded TTFT p99 "
                      "of %.0f ms), %s >= 1.2x FCFS's throughput or <= 0.8x its TTFT p99 | "
                      "throughput %.2fx, TTFT p99 %.2fx | %s |",
                      w.c_str(), held, unloaded, policy, tp, tt,
                      tp >= 1.2 || tt <= 0.8 ? "met" : "missed");
        targets.push_back(buf);
      }
    }
    if (w == "few-shot") {
      const auto a = methods.find("packed"), b = methods.find("packed+cache");
      if (a != methods.end() && b != methods.end() && !a->second.empty()) {
        const double rate = a->second.rbegin()->first;
        const double ratio =
            b->second.at(rate)->lat.throughput() / a->second.at(rate)->lat.throughput();
        std::snprintf(buf, sizeof buf,
                      "| few-shot at %g req/s: packed with the prefix cache >= 2x its throughput "
                      "without | %.2fx | %s |",
                      rate, ratio, ratio >= 2 ? "met" : "missed");
        targets.push_back(buf);
      }
    }
  }
  for (const sched_row& s : g_sched) {
    std::snprintf(buf, sizeof buf,
                  "| the scheduler's time under 2%% of the step's at %zu live requests | %.3f ms "
                  "of a %.1f ms forward pass: %.2f%% | %s |",
                  s.live, s.sched_ms, s.forward_ms, 100 * s.sched_ms / s.forward_ms,
                  s.sched_ms <= 0.02 * s.forward_ms ? "met" : "missed");
    targets.push_back(buf);
  }
  if (!g_decode.empty()) {
    md << "### Decode steps of the large model (fp32) against the weight-streaming bound\n\n"
       << "A step streams " << g_decode[0].weight_mb << " MB of weights (all but the untied "
       << "embedding table) at the " << g_decode[0].bandwidth << " GB/s read bandwidth measured "
       << "here: the bound. Its FLOPs at the " << g_decode[0].peak << " GFLOP/s FMA peak measured "
       << "here: the compute floor, which passes the bound where the sequences are many.\n\n"
       << "| sequences | step ms | streaming bound ms | ratio | compute floor ms | ratio to "
          "max(bound, floor) |\n|---|---|---|---|---|---|\n";
    for (const decode_row& d : g_decode) {
      const double roof = std::max(d.bound_ms, d.compute_ms);
      std::snprintf(buf, sizeof buf, "| %zu | %.2f | %.2f | %.2fx | %.2f | %.2fx |\n", d.seqs,
                    d.step_ms, d.bound_ms, d.step_ms / d.bound_ms, d.compute_ms, d.step_ms / roof);
      md << buf;
      std::snprintf(buf, sizeof buf,
                    "| decode at %zu sequences within 1.3x of the weight-streaming bound | %.2fx "
                    "(%.2fx of max(bound, compute floor)) | %s |",
                    d.seqs, d.step_ms / d.bound_ms, d.step_ms / roof,
                    d.step_ms <= 1.3 * d.bound_ms ? "met" : "missed");
      targets.push_back(buf);
    }
    md << '\n';
  }
  write_quantized(md, targets);
  md << "### Targets\n\n| target | measured | verdict |\n|---|---|---|\n";
  for (const std::string& t : targets) md << t << '\n';
  std::ofstream gp(dir + "/serve.gp");
  gp << "set terminal pngcairo size 900,560\nset key top left\nset logscale x 2\n"
        "set xlabel 'requests per second'\nset ylabel 'TTFT p99 (ms)'\nset logscale y\n";
  for (const auto& [w, methods] : by) {
    gp << "set output 'serve_" << w << "_ttft.png'\nset title 'TTFT p99, " << w << "'\nplot ";
    std::size_t k = 0;
    for (const auto& [me, _] : methods) {
      gp << (k ? ", " : "") << "'serve_" << w << ".dat' using 1:" << k + 2
         << " with linespoints title '" << me << "'";
      ++k;
    }
    gp << '\n';
  }
  std::printf("serving report written to %s\n", dir.c_str());
}

int run(int argc, char** argv) {
  std::vector<char*> rest{argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--smoke") {
      g_opt.smoke = true;
    } else if (a == "--quick") {
      g_opt.quick = true;
    } else if (a.rfind("--report_dir=", 0) == 0) {
      g_opt.report_dir = a.substr(13);
    } else if (a.rfind("--model=", 0) == 0) {
      g_opt.model_path = a.substr(8);
    } else {
      rest.push_back(argv[i]);
    }
  }
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  if (benchmark::ReportUnrecognizedArguments(n, rest.data())) return 2;
  g_t0 = machine::cpu_times::now();
  register_serve();
  register_scheduler();
  register_decode();
  register_quantized();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  write_report();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return support::guarded_main("bench_serve", [&] { return run(argc, argv); });
}
