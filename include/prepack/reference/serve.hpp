// prepack/reference/serve.hpp - the reference model as a serving engine: a request trace
// replayed through prepack::scheduler, each step one forward pass over a kv_pool, greedy
// sampling, and every request's time to first token, time per output token and end-to-end
// latency on the trace's clock (a request is never served before it arrives; idle time until
// the next arrival is skipped, not slept).
// Cost: the model's forward passes plus, per step, the scheduler's (prepack/serve.hpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../serve.hpp"
#include "decode.hpp"
#include "kv_pool.hpp"
#include "model.hpp"

PREPACK_NAMESPACE_BEGIN
namespace reference {

/// A request and when it arrives, in milliseconds on the trace's clock.
struct timed_request {
  request r;
  double arrival_ms = 0;
};

/// What happened to one request.
struct served_request {
  std::int64_t id = 0;
  std::size_t prompt_tokens = 0;
  std::vector<std::int32_t> generated;
  double arrival_ms = 0, first_token_ms = 0, finish_ms = 0;
  std::size_t preemptions = 0, cached_prompt_tokens = 0;
  double ttft_ms() const noexcept { return first_token_ms - arrival_ms; }
  double e2e_ms() const noexcept { return finish_ms - arrival_ms; }
  /// Mean time per output token after the first (0 for a single token).
  double tpot_ms() const noexcept {
    return generated.size() > 1
               ? (finish_ms - first_token_ms) / static_cast<double>(generated.size() - 1)
               : 0.0;
  }
};

struct serve_report {
  std::vector<served_request> requests;  // in the trace's order
  scheduler_stats stats;
  double clock_ms = 0;           // the trace's clock when the last request finished
  double busy_ms = 0;            // of which spent running steps
  double scheduler_seconds = 0;  // in next_step and commit
  double forward_seconds = 0;    // in the model's forward passes
  std::size_t steps = 0;
  std::size_t kv_pool_bytes = 0;
};

struct serve_options {
  exec_options exec;
  /// Advance the clock by step_ms per step instead of the wall clock (deterministic traces).
  bool virtual_clock = false;
  double step_ms = 1.0;
  /// Called for each finished request with the pool, before its blocks can be reused.
  std::function<void(const finished_request&, const kv_pool&)> on_finish;
};

/// Replays `trace` through scheduler `s` on model `m` with greedy sampling. Throws
/// prepack::error for a request the scheduler refuses (naming it) or a token outside the
/// model's vocabulary; std::bad_alloc when the pool does not fit in memory.
inline serve_report serve(const model& m, scheduler& s, std::vector<timed_request> trace,
                          const serve_options& opt = {}) {
  using clock = std::chrono::steady_clock;
  const scheduler_options& so = s.options();
  kv_pool pool(m.cfg(), so.n_blocks, so.block_size);
  std::stable_sort(trace.begin(), trace.end(), [](const timed_request& a, const timed_request& b) {
    return a.arrival_ms < b.arrival_ms;
  });
  serve_report rep;
  rep.kv_pool_bytes = pool.bytes();
  std::unordered_map<std::int64_t, std::size_t> index;
  for (const timed_request& t : trace) {
    for (std::int32_t tok : t.r.prompt) {
      prepack::detail::require(tok >= 0 && tok < m.cfg().vocab, "request ", t.r.id, ": token ", tok,
                               " outside the vocabulary of ", m.cfg().vocab);
    }
    served_request sr;
    sr.id = t.r.id;
    sr.prompt_tokens = t.r.prompt.size();
    sr.arrival_ms = t.arrival_ms;
    index[t.r.id] = rep.requests.size();
    rep.requests.push_back(std::move(sr));
  }
  const auto t_start = clock::now();
  double skipped = 0;  // idle time jumped over
  const auto now = [&] {
    return opt.virtual_clock
               ? static_cast<double>(rep.steps) * opt.step_ms + skipped
               : std::chrono::duration<double, std::milli>(clock::now() - t_start).count() +
                     skipped;
  };
  std::size_t next = 0;
  std::vector<std::int32_t> sampled;
  std::vector<bool> started(rep.requests.size(), false);  // its first token is out
  while (next < trace.size() || !s.idle()) {
    double t = now();
    while (next < trace.size() && trace[next].arrival_ms <= t) s.add(std::move(trace[next++].r));
    if (s.idle()) {  // nothing to run until the next arrival
      skipped += trace[next].arrival_ms - t;
      continue;
    }
    const auto a = clock::now();
    const scheduled_step st = s.next_step();
    const auto b = clock::now();
    PREPACK_ASSERT(!st.empty());
    const step_result r = m.forward(st.inputs, pool, opt.exec);
    const auto c = clock::now();
    sampled.clear();
    for (Eigen::Index k = 0; k < r.logits.rows(); ++k) {
      sampled.push_back(detail::argmax_with_margin(r.logits.row(k).data(),
                                                   static_cast<std::size_t>(m.cfg().vocab))
                            .first);
    }
    const double t_begin = t;
    ++rep.steps;
    t = now();
    const std::vector<finished_request> done = s.commit(span<const std::int32_t>(sampled));
    const auto d = clock::now();
    rep.scheduler_seconds += std::chrono::duration<double>((b - a) + (d - c)).count();
    rep.forward_seconds += std::chrono::duration<double>(c - b).count();
    rep.busy_ms += t - t_begin;
    for (std::size_t q = 0; q < st.inputs.n_seqs(); ++q) {
      if (!st.inputs.completes[q]) continue;
      const std::size_t i = index.at(st.inputs.seq_id[q]);
      if (!started[i]) {
        started[i] = true;
        rep.requests[i].first_token_ms = t;
      }
    }
    for (const finished_request& f : done) {
      served_request& sr = rep.requests[index.at(f.id)];
      sr.generated = f.generated;
      sr.finish_ms = t;
      sr.preemptions = f.preemptions;
      sr.cached_prompt_tokens = f.cached_prompt_tokens;
      if (opt.on_finish) opt.on_finish(f, pool);
    }
  }
  rep.stats = s.stats();
  rep.clock_ms = now();
  return rep;
}

}  // namespace reference
PREPACK_NAMESPACE_END
