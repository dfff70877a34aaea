// llama_cpp_batches: prepack's llama.cpp form driving a real libllama (built only when CMake is
// given -DPREPACK_LLAMA_CPP=ON and finds llama.h and libllama, e.g. through CMAKE_PREFIX_PATH
// pointing at a llama.cpp install; nothing in the test suite needs it).
//
//   llama_cpp_batches MODEL.gguf [--budget N]
//
// Seeded prompts (three groups sharing a long stem, and loners of 3 to 400 tokens) run three
// ways on one llama_context:
//   alone      each prompt by itself, the cache cleared before it (the reference);
//   budgeted   one budgeted schedule of every prompt (chunking::fill, N tokens a step), each step
//              a llama_batch from llama_cpp::make_batch, sequence id = the prompt's index;
//   prefixes   make_prefix_plan's shared prefixes prefilled once, handed to the other sharers by
//              llama_memory_seq_cp (llama.h's name since llama_kv_cache_seq_cp was removed) from
//              llama_cpp::make_prefix_steps, then each prompt's own rest.
// For each, every prompt must get exactly one logits row and llama_decode must accept every batch
// (exit 1 otherwise). The logits are compared with `alone` next to llama.cpp's own spread: each
// prompt again in one hand-built batch, after the other prompts were decoded into the cache,
// which llama.cpp does not compute bit for bit the same as alone (its attention runs over the
// cache's cells, whose number and placement change with what else the cache holds).
#include <llama.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "prepack/prepack.hpp"
#include "support/cli.hpp"

namespace {

using prepack::span;
namespace lc = prepack::llama_cpp;

struct model_handle {
  llama_model* m = nullptr;
  explicit model_handle(const char* path)
      : m(llama_model_load_from_file(path, llama_model_default_params())) {
    if (m == nullptr) throw support::usage_error(std::string(path) + ": llama.cpp cannot load it");
  }
  model_handle(const model_handle&) = delete;
  model_handle& operator=(const model_handle&) = delete;
  ~model_handle() { llama_model_free(m); }
};

struct context {
  llama_context* ctx = nullptr;
  explicit context(llama_model* m, int n_batch, int n_seq) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 8192;
    cp.n_batch = static_cast<std::uint32_t>(n_batch);
    cp.n_ubatch = static_cast<std::uint32_t>(n_batch);
    cp.n_seq_max = static_cast<std::uint32_t>(n_seq);
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    ctx = llama_init_from_model(m, cp);
    if (ctx == nullptr) throw std::runtime_error("llama_init_from_model failed");
  }
  context(const context&) = delete;
  context& operator=(const context&) = delete;
  ~context() { llama_free(ctx); }
};

// Decodes one batch; returns its output rows (logits), in output order.
std::vector<std::vector<float>> decode(llama_context* c, const lc::batch& b, int n_vocab) {
  llama_batch lb = llama_batch_init(b.n_tokens(), 0, 1);
  b.fill(lb);
  const int rc = llama_decode(c, lb);
  llama_batch_free(lb);
  if (rc != 0) throw std::runtime_error("llama_decode returned " + std::to_string(rc));
  std::vector<std::vector<float>> out;
  for (int i = 0; i < b.n_tokens(); ++i) {
    if (b.logits[static_cast<std::size_t>(i)] == 0) continue;
    const float* l = llama_get_logits_ith(c, i);
    out.emplace_back(l, l + n_vocab);
  }
  return out;
}

// A llama_batch of one whole prompt under one sequence id, built by hand from llama.h's
// definition (independent of prepack's form): logits on its last token when `last`.
std::vector<float> decode_by_hand(llama_context* c, const std::vector<int>& prompt, llama_seq_id id,
                                  bool last, int n_vocab) {
  const auto n = static_cast<std::int32_t>(prompt.size());
  llama_batch b = llama_batch_init(n, 0, 1);
  b.n_tokens = n;
  for (std::int32_t t = 0; t < n; ++t) {
    b.token[t] = prompt[static_cast<std::size_t>(t)];
    b.pos[t] = t;
    b.n_seq_id[t] = 1;
    b.seq_id[t][0] = id;
    b.logits[t] = last && t + 1 == n ? 1 : 0;
  }
  const int rc = llama_decode(c, b);
  llama_batch_free(b);
  if (rc != 0) throw std::runtime_error("llama_decode returned " + std::to_string(rc));
  if (!last) return {};
  const float* l = llama_get_logits_ith(c, n - 1);
  return std::vector<float>(l, l + n_vocab);
}

struct agreement {
  double max_rel = 0;  // max |difference| over max |logit|
  int argmax_differs = 0;
  std::size_t rows = 0;
  void add(const std::vector<float>& want, const std::vector<float>& got) {
    double scale = 0, d = 0;
    for (std::size_t k = 0; k < want.size(); ++k) {
      scale = std::max(scale, static_cast<double>(std::fabs(want[k])));
      d = std::max(d, static_cast<double>(std::fabs(want[k] - got[k])));
    }
    max_rel = std::max(max_rel, d / scale);
    argmax_differs += std::max_element(want.begin(), want.end()) - want.begin() !=
                      std::max_element(got.begin(), got.end()) - got.begin();
    ++rows;
  }
};

std::vector<std::vector<int>> seeded_prompts(int n_vocab) {
  std::mt19937 rng(7);
  const auto token = [&] {
    return 100 + static_cast<int>(rng() % static_cast<unsigned>(n_vocab - 100));
  };
  std::vector<std::vector<int>> prompts;
  for (int g = 0; g < 3; ++g) {
    std::vector<int> stem(static_cast<std::size_t>(96 + 32 * g));
    for (int& t : stem) t = token();
    for (int j = 0; j < 4; ++j) {
      std::vector<int> p = stem;
      const int tail = 1 + static_cast<int>(rng() % 120);
      for (int k = 0; k < tail; ++k) p.push_back(token());
      prompts.push_back(p);
    }
  }
  for (int len : {3, 17, 250, 400}) {
    std::vector<int> p(static_cast<std::size_t>(len));
    for (int& t : p) t = token();
    prompts.push_back(p);
  }
  return prompts;
}

int run(int argc, char** argv) {
  std::string path;
  std::size_t budget = 128;
  CLI::App app{"", "llama_cpp_batches"};
  support::configure(app,
                     "llama_cpp_batches - prepack's llama.cpp form driving a real libllama: "
                     "budgeted and shared-prefix batches\nagainst each prompt alone",
                     "Exit codes: 0 ok; 1 a batch refused or a logits row missing; 2 bad flags or "
                     "input.");
  app.add_option("model", path, "a GGUF file llama.cpp can load")
      ->required()
      ->check(support::text())
      ->type_name("MODEL.gguf");
  app.add_option("--budget", budget, "tokens a budgeted step holds (default 128)")
      ->check(support::integer(1, 1 << 20))
      ->type_name("N");
  if (!support::parse(app, argc, argv)) return 0;
  llama_backend_init();
  const model_handle owner(path.c_str());
  llama_model* model = owner.m;
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  const auto prompts = seeded_prompts(n_vocab);
  const std::size_t n = prompts.size();
  std::size_t total = 0;
  for (const auto& p : prompts) total += p.size();
  context c(model, 512, static_cast<int>(n));
  bool ok = true;

  // Alone: each prompt by itself in a cleared cache. The spread: each prompt again, after every
  // other prompt was decoded into the cache under its own id (as in the runs below).
  std::vector<std::vector<float>> alone(n);
  agreement spread;
  for (std::size_t i = 0; i < n; ++i) {
    llama_memory_clear(llama_get_memory(c.ctx), true);
    alone[i] = decode_by_hand(c.ctx, prompts[i], 0, true, n_vocab);
    llama_memory_clear(llama_get_memory(c.ctx), true);
    for (std::size_t j = 0; j < n; ++j) {
      if (j != i) decode_by_hand(c.ctx, prompts[j], static_cast<llama_seq_id>(j), false, n_vocab);
    }
    spread.add(alone[i],
               decode_by_hand(c.ctx, prompts[i], static_cast<llama_seq_id>(i), true, n_vocab));
  }
  std::printf("llama_cpp_batches: %zu prompts, %zu tokens, vocab %d, budget %zu\n", n, total,
              n_vocab, budget);
  std::printf(
      "  llama.cpp's own spread (alone, and after the other prompts in the cache): max |diff| / "
      "scale "
      "%.2e, argmax differs on %d of %zu\n",
      spread.max_rel, spread.argmax_differs, spread.rows);

  std::vector<std::int64_t> ids(n);
  for (std::size_t i = 0; i < n; ++i) ids[i] = static_cast<std::int64_t>(i);
  {
    llama_memory_clear(llama_get_memory(c.ctx), true);
    std::vector<std::size_t> len;
    for (const auto& p : prompts) len.push_back(p.size());
    const auto sched = prepack::budgeted_schedule(len, {budget, prepack::chunking::fill});
    agreement a;
    std::vector<int> rows_of(n, 0);
    for (std::size_t s = 0; s < sched.n_steps(); ++s) {
      const lc::batch b = lc::make_batch(sched, s, prompts, span<const std::int64_t>(ids));
      const auto rows = decode(c.ctx, b, n_vocab);
      for (std::size_t k = 0; k < rows.size(); ++k) {
        a.add(alone[b.output_item[k]], rows[k]);
        ++rows_of[b.output_item[k]];
      }
    }
    const bool each_once =
        std::all_of(rows_of.begin(), rows_of.end(), [](int r) { return r == 1; });
    ok = ok && each_once;
    std::printf(
        "  budgeted: %zu steps, every prompt one logits row: %s; max |diff| / scale %.2e, "
        "argmax differs on %d of %zu\n",
        sched.n_steps(), each_once ? "yes" : "NO", a.max_rel, a.argmax_differs, a.rows);
  }
  {
    llama_memory_clear(llama_get_memory(c.ctx), true);
    const auto plan = prepack::make_prefix_plan(prompts, {16, 16, 0});
    const auto sched = prepack::budgeted_schedule(plan.items, {budget, prepack::chunking::fill});
    const auto steps = lc::make_prefix_steps(plan, sched, prompts, span<const std::int64_t>(ids));
    // The prompts each output row belongs to: the prompt's own item, or its deepest prefix
    // when the prompt ends there.
    std::vector<std::vector<std::size_t>> prompts_of(plan.items.size());
    for (std::size_t i = 0; i < n; ++i) {
      prompts_of[plan.prompt_item[i] ? *plan.prompt_item[i] : *plan.prompt_prefix[i]].push_back(i);
    }
    agreement a;
    std::vector<int> rows_of(n, 0);
    std::size_t computed = 0, copies = 0;
    for (const lc::step& st : steps) {
      const auto rows = decode(c.ctx, st.batch, n_vocab);
      computed += static_cast<std::size_t>(st.batch.n_tokens());
      for (std::size_t k = 0; k < rows.size(); ++k) {
        for (std::size_t i : prompts_of[st.batch.output_item[k]]) {
          a.add(alone[i], rows[k]);
          ++rows_of[i];
        }
      }
      for (const lc::seq_copy& cp : st.copies_after) {
        llama_memory_seq_cp(llama_get_memory(c.ctx), cp.src, cp.dst, cp.p0, cp.p1);
        ++copies;
      }
    }
    const bool each_once =
        std::all_of(rows_of.begin(), rows_of.end(), [](int r) { return r == 1; });
    ok = ok && each_once;
    std::printf(
        "  prefixes: %zu shared prefixes, %zu copies, %zu steps, %zu of %zu tokens "
        "computed, every prompt one logits row: %s; max |diff| / scale %.2e, argmax "
        "differs on %d of %zu\n",
        plan.prefixes.size(), copies, steps.size(), computed, total, each_once ? "yes" : "NO",
        a.max_rel, a.argmax_differs, a.rows);
  }
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return support::guarded_main("llama_cpp_batches", [&] { return run(argc, argv); });
}
