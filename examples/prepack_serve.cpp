// prepack_serve: a live request stream served by prepack::scheduler on the reference model -
// continuous batching (decodes and prefill chunks in one step), admission by KV blocks,
// preemption by recompute, a prefix cache across requests - with every request's time to first
// token, time per output token and end-to-end latency on the trace's clock, and (--check) proof
// that every request's tokens equal generating it alone.
//
//   prepack_serve                       built-in stream: 48 requests, Poisson arrivals
//   prepack_serve --trace FILE          one request a line: arrival_ms max_new_tokens token ids
//   prepack_serve --check --json        verify against generating each request alone; JSON
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "prepack/prepack.hpp"
#include "prepack/reference.hpp"
#include "support/cli.hpp"
#include "support/model_flags.hpp"
#include "support/trace.hpp"

namespace ref = prepack::reference;
using json = nlohmann::ordered_json;

namespace {

struct options {
  support::model_choice model;
  std::uint64_t seed = 1;
  prepack::scheduler_options sched;
  std::string policy;  // as named on the command line
  bool check = false, json = false;
  std::vector<ref::timed_request> trace;
  std::string source;  // where the trace came from, for the report
};

// Each request alone: its prompt prefilled by itself, then greedy decoding. Returns, per
// request, "" when its tokens are the same, a note for a near-tie split, or the difference.
struct check_result {
  std::size_t same = 0, near_ties = 0, differ = 0;
  std::vector<std::string> notes;
};

check_result check_alone(const ref::model& m, const std::vector<ref::timed_request>& trace,
                         const ref::serve_report& rep, const options& o) {
  check_result out;
  const ref::exec_options exec{o.model.threads, o.model.backend};
  for (std::size_t i = 0; i < trace.size(); ++i) {
    const auto& r = trace[i].r;
    const std::vector<std::vector<int>> p{std::vector<int>(r.prompt.begin(), r.prompt.end())};
    auto [cache, logits] = ref::prefill_alone(
        m, p, r.max_new_tokens, {ref::attention::segment, o.model.threads, o.model.backend});
    const ref::decode_result want =
        ref::greedy_decode(m, cache, logits, static_cast<int>(r.max_new_tokens), exec);
    const auto& got = rep.requests[i].generated;
    std::size_t k = 0;
    while (k < got.size() && k < want.tokens[0].size() && got[k] == want.tokens[0][k]) ++k;
    if (k == want.tokens[0].size() && k == got.size()) {
      ++out.same;
    } else if (k < want.margins[0].size() && want.margins[0][k] < 1e-3f) {
      ++out.near_ties;
      out.notes.push_back("request " + std::to_string(r.id) + " parts at token " +
                          std::to_string(k) + " on a near-tie");
    } else {
      ++out.differ;
      out.notes.push_back("request " + std::to_string(r.id) + " differs at token " +
                          std::to_string(k));
    }
  }
  return out;
}

// The flags as given, before the model and the trace are read.
struct flags {
  support::model_flags model;
  std::uint64_t seed = 1;
  std::string trace, profile = "system-prompt";
  std::size_t requests = 48, new_tokens = 16;
  double rate = 16.0;
  int max_len = 256;
  prepack::scheduler_options sched;
  std::string policy = "fcfs", prefix_cache = "on";
  bool check = false, json = false;
};

void add_flags(CLI::App& app, flags& f) {
  using support::integer;
  const std::string requests =
      "Requests (default: 48 of profile system-prompt, Poisson arrivals at 16 a second, 16 new "
      "tokens)";
  CLI::Option* trace =
      app.add_option("--trace", f.trace,
                     "one request a line: arrival_ms max_new_tokens token_id token_id ...\n"
                     "('#' starts a comment); arrivals are honoured on the trace's clock")
          ->check(support::text())
          ->type_name("FILE")
          ->group(requests);
  const std::vector<CLI::Option*> generated{
      app.add_option("--profile", f.profile,
                     "equal | mild | heavy | heavy-cut | one-long | few-shot | system-prompt")
          ->check(support::text())
          ->type_name("NAME"),
      app.add_option("--requests", f.requests, "requests to generate (default 48)")
          ->check(integer(1, 1 << 20))
          ->type_name("N"),
      app.add_option("--rate", f.rate, "arrivals a second (Poisson; 0: all at once; default 16)")
          ->check(support::real(0.0, 1e6))
          ->type_name("R"),
      app.add_option("--new-tokens", f.new_tokens,
                     "tokens each generated request asks for (default 16)")
          ->check(integer(1, 1 << 16))
          ->type_name("N"),
      app.add_option("--max-len", f.max_len, "the profile's length scale (default 256)")
          ->check(integer(8, 1 << 16))
          ->type_name("N")};
  for (CLI::Option* o : generated) o->group(requests)->excludes(trace);
  app.add_option("--seed", f.seed, "stream and weight seed (default 1)")
      ->check(integer(0, 1ll << 62))
      ->type_name("S")
      ->group(requests);

  auto& so = f.sched;
  so.token_budget = 256;
  so.max_seqs = 32;
  so.n_blocks = 512;
  so.block_size = 16;
  so.reserve_blocks = 0;
  const std::string sched = "Scheduler";
  const auto count = [&](const char* name, std::size_t& v, long long lo, long long hi,
                         const char* what) {
    app.add_option(name, v, what)->check(integer(lo, hi))->type_name("N")->group(sched);
  };
  count("--budget", so.token_budget, 1, 1 << 20, "tokens a step computes, at most (default 256)");
  count("--max-seqs", so.max_seqs, 1, 1 << 16, "sequences a step holds, at most (default 32)");
  count("--blocks", so.n_blocks, 1, 1 << 24, "KV pool blocks (default 512)");
  count("--block-size", so.block_size, 1, 1 << 12, "tokens a block holds (default 16)");
  count("--reserve", so.reserve_blocks, 0, 1 << 24,
        "free blocks admission leaves for running decodes (default 0)");
  const std::vector<std::string> policies{"fcfs", "packed", "shortest"}, on_off{"on", "off"};
  app.add_option("--policy", f.policy,
                 "admission: arrival order, prompts chunked (vLLM's default); whole\n"
                 "prompts first-fit-decreasing into the room left, only what cannot fit\n"
                 "chunked; or the shortest prompts first (default fcfs)")
      ->check(support::one_of(policies))
      ->type_name(support::choices(policies))
      ->group(sched);
  app.add_option("--prefix-cache", f.prefix_cache,
                 "keep full blocks after their requests finish, for later requests with\n"
                 "the same prefix (default on)")
      ->check(support::one_of(on_off))
      ->type_name(support::choices(on_off))
      ->group(sched);

  app.add_flag("--check", f.check,
               "generate every request alone too; exit 1 unless every request's tokens\n"
               "are the same (a near-tie a rounding flips is reported, not failed)")
      ->group("Output");
  app.add_flag("--json", f.json, "one JSON object on stdout")->group("Output");
  support::add_model_flags(app, f.model);
}

// The options of the command line, the trace included; nothing when --help was asked for.
std::optional<options> parse(int argc, char** argv) {
  flags f;
  CLI::App app{"", "prepack_serve"};
  support::configure(
      app, "prepack_serve - continuous batching of a request stream on the reference model",
      "Exit codes: 0 ok; 1 --check failed (or an internal error); 2 bad flags or input.");
  add_flags(app, f);
  if (!support::parse(app, argc, argv)) return std::nullopt;
  options o;
  o.seed = f.seed;
  o.model = support::parse_model(f.model, o.seed);
  o.check = f.check;
  o.json = f.json;
  o.sched = f.sched;
  o.policy = f.policy;
  o.sched.policy = o.policy == "packed"     ? prepack::admission::packed
                   : o.policy == "shortest" ? prepack::admission::shortest_first
                                            : prepack::admission::fcfs;
  o.sched.prefix_cache = f.prefix_cache == "on";
  if (!f.trace.empty()) {
    o.source = f.trace;
    o.trace = support::read_trace(o.source, o.model.cfg.vocab, 1 << 16);
    return o;
  }
  o.trace = support::generate_trace(f.profile, f.requests, f.rate, f.new_tokens, o.model.cfg.vocab,
                                    f.max_len, o.seed);
  char buf[160];
  std::snprintf(buf, sizeof buf, "profile %s, %zu requests at %g a second, seed %llu",
                f.profile.c_str(), f.requests, f.rate, static_cast<unsigned long long>(o.seed));
  o.source = buf;
  return o;
}

// Refuses, before the model is built, requests that can never fit the pool (with their sizes),
// and a pool or model this machine cannot hold.
void admit(const options& o) {
  prepack::scheduler probe(o.sched);
  for (const auto& t : o.trace) probe.add(t.r);
  const ref::config& c = o.model.cfg;
  const double pool = 2.0 * static_cast<double>(c.n_layers) * static_cast<double>(c.kv_dim()) *
                      sizeof(float) * static_cast<double>(o.sched.n_blocks * o.sched.block_size);
  support::admit_memory(o.model, pool, "use fewer --blocks or a smaller --block-size");
}

// What a run gives: the scheduler's report, and whether its blocks came back.
struct run_result {
  ref::serve_report rep;
  bool conserved = false;
  check_result check;
};

run_result run(const options& o) {
  const ref::model m = support::build_model(o.model);
  {  // one untimed pass first: oneDNN's kernels and the model's buffers, paid once
    const std::vector<std::vector<int>> warm{std::vector<int>(16, 1)};
    ref::prefill_alone(m, warm, 1, {ref::attention::segment, o.model.threads, o.model.backend});
  }
  prepack::scheduler s(o.sched);
  ref::serve_options sopt;
  sopt.exec = {o.model.threads, o.model.backend};
  run_result r;
  r.rep = ref::serve(m, s, o.trace, sopt);
  r.conserved = s.blocks().available() == s.blocks().usable();
  if (o.check) r.check = check_alone(m, o.trace, r.rep, o);
  return r;
}

// The stream's totals: latencies, throughput, the prefix cache's share.
struct totals {
  std::vector<double> ttft, tpot, e2e;
  std::size_t prompt_tokens = 0, generated = 0, useful = 0;
  double seconds = 0, hit_rate = 0;

  explicit totals(const ref::serve_report& rep) {
    for (const auto& r : rep.requests) {
      ttft.push_back(r.ttft_ms());
      if (r.generated.size() > 1) tpot.push_back(r.tpot_ms());
      e2e.push_back(r.e2e_ms());
      prompt_tokens += r.prompt_tokens;
      generated += r.generated.size();
    }
    useful = prompt_tokens + generated - rep.requests.size();
    seconds = rep.clock_ms / 1000.0;
    hit_rate = prompt_tokens ? static_cast<double>(rep.stats.cache_hit_tokens) /
                                   static_cast<double>(prompt_tokens)
                             : 0.0;
  }
  double per_second(std::size_t n) const {
    return seconds > 0 ? static_cast<double>(n) / seconds : 0.0;
  }
};

void print_json(const options& o, const run_result& r, const totals& t) {
  const auto& rep = r.rep;
  const auto& so = o.sched;
  json j;
  j["source"] = o.source;
  j["model"] = support::describe_json(o.model);
  j["scheduler"] = {{"policy", o.policy},
                    {"budget", so.token_budget},
                    {"max_seqs", so.max_seqs},
                    {"blocks", so.n_blocks},
                    {"block_size", so.block_size},
                    {"reserve", so.reserve_blocks},
                    {"prefix_cache", so.prefix_cache}};
  json& reqs = j["requests"];
  for (const auto& q : rep.requests) {
    reqs.push_back({{"id", q.id},
                    {"prompt_tokens", q.prompt_tokens},
                    {"generated", q.generated},
                    {"arrival_ms", q.arrival_ms},
                    {"ttft_ms", q.ttft_ms()},
                    {"tpot_ms", q.tpot_ms()},
                    {"e2e_ms", q.e2e_ms()},
                    {"preemptions", q.preemptions},
                    {"cached_prompt_tokens", q.cached_prompt_tokens}});
  }
  j["totals"] = {{"requests", rep.requests.size()},
                 {"seconds", t.seconds},
                 {"steps", rep.steps},
                 {"generated_tokens", t.generated},
                 {"throughput_tokens_per_s", t.per_second(t.generated)},
                 {"throughput_requests_per_s", t.per_second(rep.requests.size())},
                 {"ttft_ms_p50", support::percentile(t.ttft, 0.5)},
                 {"ttft_ms_p99", support::percentile(t.ttft, 0.99)},
                 {"tpot_ms_p50", support::percentile(t.tpot, 0.5)},
                 {"tpot_ms_p99", support::percentile(t.tpot, 0.99)},
                 {"e2e_ms_p50", support::percentile(t.e2e, 0.5)},
                 {"e2e_ms_p99", support::percentile(t.e2e, 0.99)},
                 {"preemptions", rep.stats.preemptions},
                 {"prefix_cache_hit_tokens", rep.stats.cache_hit_tokens},
                 {"prefix_cache_hit_rate", t.hit_rate},
                 {"prompt_tokens", t.prompt_tokens},
                 {"tokens_computed", rep.stats.tokens_computed},
                 {"tokens_useful", t.useful},
                 {"scheduler_seconds", rep.scheduler_seconds},
                 {"forward_seconds", rep.forward_seconds},
                 {"blocks_conserved", r.conserved}};
  if (o.check) {
    j["check"] = {{"same", r.check.same},
                  {"near_ties", r.check.near_ties},
                  {"differ", r.check.differ},
                  {"tokens_match", r.check.differ == 0},
                  {"notes", r.check.notes}};
  }
  std::cout << j.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
}

void print_text(const options& o, const run_result& r, const totals& t) {
  const auto& rep = r.rep;
  const auto& so = o.sched;
  std::printf("prepack serve: %zu requests (%s), %zu prompt tokens\n", rep.requests.size(),
              o.source.c_str(), t.prompt_tokens);
  std::printf("%s\n", support::describe(o.model).c_str());
  std::printf(
      "scheduler: %s, budget %zu tokens, %zu sequences, %zu blocks of %zu (%.1f MiB "
      "KV), prefix cache %s\n\n",
      o.policy.c_str(), so.token_budget, so.max_seqs, so.n_blocks, so.block_size,
      static_cast<double>(rep.kv_pool_bytes) / (1024.0 * 1024.0), so.prefix_cache ? "on" : "off");
  std::printf("%6s %7s %5s %10s %10s %10s %9s %7s\n", "id", "prompt", "new", "ttft_ms", "tpot_ms",
              "e2e_ms", "preempted", "cached");
  const std::size_t shown = std::min<std::size_t>(rep.requests.size(), 12);
  for (std::size_t i = 0; i < shown; ++i) {
    const auto& q = rep.requests[i];
    std::printf("%6lld %7zu %5zu %10.1f %10.2f %10.1f %9zu %7zu\n", static_cast<long long>(q.id),
                q.prompt_tokens, q.generated.size(), q.ttft_ms(), q.tpot_ms(), q.e2e_ms(),
                q.preemptions, q.cached_prompt_tokens);
  }
  if (shown < rep.requests.size()) std::printf("  (%zu more)\n", rep.requests.size() - shown);
  std::printf(
      "\n%.2f s on the trace's clock, %zu steps: %.1f tokens/s, %.2f requests/s\n"
      "TTFT p50 %.1f ms, p99 %.1f ms; TPOT p50 %.2f ms, p99 %.2f ms; end-to-end p50 %.1f ms\n"
      "preemptions %zu; prefix cache %zu of %zu prompt tokens (%.1f%%); computed %zu tokens for "
      "%zu useful (%.2fx)\n"
      "scheduler %.1f ms of %.1f ms in forward passes (%.2f%%); blocks %s\n",
      t.seconds, rep.steps, t.per_second(t.generated), t.per_second(rep.requests.size()),
      support::percentile(t.ttft, 0.5), support::percentile(t.ttft, 0.99),
      support::percentile(t.tpot, 0.5), support::percentile(t.tpot, 0.99),
      support::percentile(t.e2e, 0.5), rep.stats.preemptions, rep.stats.cache_hit_tokens,
      t.prompt_tokens, 100.0 * t.hit_rate, rep.stats.tokens_computed, t.useful,
      static_cast<double>(rep.stats.tokens_computed) / static_cast<double>(t.useful),
      1000.0 * rep.scheduler_seconds, 1000.0 * rep.forward_seconds,
      100.0 * rep.scheduler_seconds / std::max(rep.forward_seconds, 1e-12),
      r.conserved ? "conserved (all free or cached)" : "NOT conserved");
  if (o.check) {
    std::printf("check: %zu of %zu requests' tokens equal generating them alone%s\n", r.check.same,
                rep.requests.size(),
                r.check.differ      ? "; SOME DIFFER"
                : r.check.near_ties ? " (the rest part on near-ties)"
                                    : "");
    for (const auto& n : r.check.notes) std::printf("  %s\n", n.c_str());
  }
}

int serve_main(int argc, char** argv) {
  const std::optional<options> o = parse(argc, argv);
  if (!o) return 0;
  admit(*o);
  const run_result r = run(*o);
  const totals t(r.rep);
  if (o->json) {
    print_json(*o, r, t);
  } else {
    print_text(*o, r, t);
  }
  return (o->check && r.check.differ > 0) || !r.conserved ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  return support::guarded_main("prepack_serve", [&] { return serve_main(argc, argv); });
}
