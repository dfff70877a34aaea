// The serving scheduler and its block pool (prepack/serve.hpp), for a Python engine loop.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"

namespace pp {
namespace {

// A step as Python sees it: its inputs moved once into a StepInputs object.
struct scheduled_step_box {
  nb::object inputs;  // StepInputs
  std::size_t n_decodes = 0, n_prefill_tokens = 0, n_samples = 0;
  std::vector<std::int64_t> preempted;
  bool empty = true;

  explicit scheduled_step_box(prepack::scheduled_step&& st)
      : n_decodes(st.n_decodes),
        n_prefill_tokens(st.n_prefill_tokens),
        n_samples(st.n_samples),
        preempted(std::move(st.preempted)),
        empty(st.empty()) {
    inputs = nb::cast(step_inputs_box{std::move(st.inputs)});
  }
};

}  // namespace

void bind_serve(nb::module_& m) {
  using prepack::block_pool;
  nb::class_<block_pool>(
      m, "BlockPool",
      "A serving pool's blocks: reference counts, lowest free block first, and (with caching) "
      "full blocks kept after their last reference as a content-keyed prefix cache, evicted "
      "least recently used (prepack::block_pool).")
      .def(
          "__init__",
          [](block_pool* self, count n_blocks, count block_size, bool caching, bool null_block) {
            new (self)
                block_pool(n_blocks("n_blocks"), block_size("block_size"), caching, null_block);
          },
          "n_blocks"_a, "block_size"_a, "caching"_a = true, "null_block"_a = false,
          "null_block: block 0 is never handed out (vLLM's null block, SGLang's padding "
          "location).")
      .def("__repr__",
           [](const block_pool& p) {
             return "BlockPool(" + std::to_string(p.n_blocks()) + " blocks of " +
                    std::to_string(p.block_size()) + ", " + std::to_string(p.free()) + " free, " +
                    std::to_string(p.cached()) + " cached)";
           })
      .def_prop_ro("null_block", &block_pool::null_block)
      .def_prop_ro("usable", &block_pool::usable, "Every block but the null block.")
      .def_prop_ro("n_blocks", &block_pool::n_blocks)
      .def_prop_ro("block_size", &block_pool::block_size)
      .def_prop_ro("caching", &block_pool::caching)
      .def_prop_ro("free", &block_pool::free, "Blocks that hold nothing.")
      .def_prop_ro("available", &block_pool::available,
                   "Blocks a request could get now: free, or evicted from the cache.")
      .def_prop_ro("cached", &block_pool::cached, "Blocks in the cache, referenced or not.")
      .def_prop_ro("cached_unreferenced", &block_pool::cached_unreferenced)
      .def("references", &block_pool::references, "block"_a)
      .def("is_cached", &block_pool::is_cached, "block"_a)
      .def("allocate", &block_pool::allocate,
           "A block for new content with one reference (the lowest free, else the least "
           "recently used evictable cached block), or None. O(log cached).")
      .def("acquire", &block_pool::acquire, "block"_a, "One more reference to a cached block.")
      .def("release", &block_pool::release, "block"_a, "Drops a reference.")
      .def(
          "find",
          [](const block_pool& p, std::int32_t parent, array_like tokens) {
            const int_array<std::int32_t> t(tokens, "tokens");
            return p.find(parent, t.span());
          },
          "parent"_a, "tokens"_a,
          "The cached block holding `tokens` (block_size of them) right after cached block "
          "`parent` (-1: at the start), or -1. O(block_size).")
      .def(
          "insert",
          [](block_pool& p, std::int32_t b, std::int32_t parent, array_like tokens) {
            const int_array<std::int32_t> t(tokens, "tokens");
            return p.insert(b, parent, t.span());
          },
          "block"_a, "parent"_a, "tokens"_a,
          "Puts referenced block `block`, full of `tokens` after cached block `parent`, in the "
          "cache; False when caching is off or that content is cached already.")
      .def("drop_cache", &block_pool::drop_cache,
           "Frees every unreferenced cached block; returns how many.");

  nb::class_<prepack::finished_request>(m, "FinishedRequest",
                                        "A request that finished in a commit.")
      .def_ro("id", &prepack::finished_request::id)
      .def_prop_ro(
          "generated",
          [](const prepack::finished_request& f) {
            return to_numpy(std::vector<std::int32_t>(f.generated));
          },
          nb::rv_policy::automatic, "[n] int32: the tokens it generated, a stop token included.")
      .def_prop_ro(
          "blocks",
          [](const prepack::finished_request& f) {
            return to_numpy(std::vector<std::int32_t>(f.blocks));
          },
          nb::rv_policy::automatic, "[n] int32: its block table at the end (released).")
      .def_ro("cached_positions", &prepack::finished_request::cached_positions)
      .def_ro("preemptions", &prepack::finished_request::preemptions)
      .def_ro("cached_prompt_tokens", &prepack::finished_request::cached_prompt_tokens)
      .def("__repr__", [](const prepack::finished_request& f) {
        return "FinishedRequest(id=" + std::to_string(f.id) + ", " +
               std::to_string(f.generated.size()) + " tokens)";
      });

  nb::class_<scheduled_step_box>(m, "ScheduledStep", "One step for the engine.")
      .def_ro("inputs", &scheduled_step_box::inputs,
              "The step as StepInputs (sequence q is request inputs.seq_id[q]; one token is "
              "sampled for each sequence with inputs.completes[q], in order).")
      .def_ro("n_decodes", &scheduled_step_box::n_decodes)
      .def_ro("n_prefill_tokens", &scheduled_step_box::n_prefill_tokens)
      .def_ro("n_samples", &scheduled_step_box::n_samples, "Tokens commit() expects.")
      .def_prop_ro(
          "preempted",
          [](const scheduled_step_box& b) {
            return to_numpy(std::vector<std::int64_t>(b.preempted));
          },
          nb::rv_policy::automatic,
          "[n] int64: requests preempted to make room (recomputed later).")
      .def_ro("empty", &scheduled_step_box::empty)
      .def("__repr__", [](const scheduled_step_box& b) {
        return "ScheduledStep(" + std::to_string(b.n_decodes) + " decodes, " +
               std::to_string(b.n_prefill_tokens) + " prefill tokens, " +
               std::to_string(b.preempted.size()) + " preempted)";
      });

  using prepack::scheduler;
  nb::class_<scheduler>(
      m, "Scheduler",
      "Continuous batching of a request stream over a paged KV pool (prepack::scheduler): "
      "add() requests, then next_step(), run it, commit() the sampled tokens. Per step "
      "O(step tokens + blocks it touches + log waiting requests).")
      .def(
          "__init__",
          [](scheduler* self, count token_budget_in, count max_seqs_in, count n_blocks_in,
             count block_size_in, count reserve_blocks_in, const std::string& policy,
             bool prefix_cache, count max_wait_steps_in, bool aligned_chunks, bool null_block) {
            const std::size_t token_budget = token_budget_in("token_budget");
            const std::size_t max_seqs = max_seqs_in("max_seqs");
            const std::size_t n_blocks = n_blocks_in("n_blocks");
            const std::size_t block_size = block_size_in("block_size");
            const std::size_t reserve_blocks = reserve_blocks_in("reserve_blocks");
            const std::size_t max_wait_steps = max_wait_steps_in("max_wait_steps");
            prepack::scheduler_options o;
            o.token_budget = token_budget;
            o.max_seqs = max_seqs;
            o.n_blocks = n_blocks;
            o.block_size = block_size;
            o.reserve_blocks = reserve_blocks;
            o.policy = choose<prepack::admission>(
                "policy", policy,
                {{"fcfs", prepack::admission::fcfs},
                 {"packed", prepack::admission::packed},
                 {"shortest_first", prepack::admission::shortest_first}});
            o.prefix_cache = prefix_cache;
            o.max_wait_steps = max_wait_steps;
            o.aligned_chunks = aligned_chunks;
            o.null_block = null_block;
            new (self) scheduler(o);
          },
          nb::kw_only(), "token_budget"_a = 512, "max_seqs"_a = 256, "n_blocks"_a,
          "block_size"_a = 16, "reserve_blocks"_a = 0, "policy"_a = "fcfs", "prefix_cache"_a = true,
          "max_wait_steps"_a = 64, "aligned_chunks"_a = false, "null_block"_a = false,
          "policy: 'fcfs' (vLLM's), 'packed' (whole prompts first-fit-decreasing into the room "
          "left) or 'shortest_first'; aligned_chunks: every prefill chunk but a request's last "
          "whole blocks (TensorRT-LLM's chunked context); null_block: block 0 never handed out "
          "(vLLM's null block, SGLang's padding location: set it for those engines' forms). "
          "ValueError for a budget, cap, pool or block size of 0, or aligned chunks with a "
          "block above the budget.")
      .def(
          "add",
          [](scheduler& s, std::int64_t id, array_like prompt, count max_new_tokens_in,
             std::optional<std::int32_t> stop_token) {
            const std::size_t max_new_tokens = max_new_tokens_in("max_new_tokens");
            prepack::request r;
            r.id = id;
            r.prompt = int_array<std::int32_t>(prompt, "prompt").vector();
            r.max_new_tokens = max_new_tokens;
            r.stop_token = stop_token;
            s.add(std::move(r));
          },
          "id"_a, "prompt"_a, "max_new_tokens"_a = 1, "stop_token"_a = nb::none(),
          "Queues a request. ValueError naming it for an id already live, an empty prompt, "
          "max_new_tokens 0, or one that could never fit the pool.")
      .def(
          "next_step", [](scheduler& s) { return scheduled_step_box(s.next_step()); },
          "The next step (empty when nothing can run). ValueError if the previous step was not "
          "committed.")
      .def(
          "commit",
          [](scheduler& s, array_like sampled) {
            const int_array<std::int32_t> t(sampled, "sampled");
            return s.commit(t.span());
          },
          "sampled"_a,
          "Records the step's sampled tokens (one per sequence whose logits were wanted, in "
          "the step's order); returns the requests that finished. ValueError, changing "
          "nothing, for a count that differs from the step's samples.")
      .def("__repr__",
           [](const scheduler& s) {
             return "Scheduler(" + std::to_string(s.n_running()) + " running, " +
                    std::to_string(s.n_waiting()) + " waiting, " +
                    std::to_string(s.blocks().free()) + " free blocks)";
           })
      .def_prop_ro("idle", &scheduler::idle)
      .def_prop_ro("n_waiting", &scheduler::n_waiting)
      .def_prop_ro("n_running", &scheduler::n_running)
      .def_prop_ro("free_blocks", [](const scheduler& s) { return s.blocks().free(); })
      .def_prop_ro("available_blocks", [](const scheduler& s) { return s.blocks().available(); })
      .def_prop_ro("cached_blocks", [](const scheduler& s) { return s.blocks().cached(); })
      .def_prop_ro(
          "stats",
          [](const scheduler& s) {
            const auto& st = s.stats();
            nb::dict d;
            d["steps"] = st.steps;
            d["tokens_computed"] = st.tokens_computed;
            d["decode_tokens"] = st.decode_tokens;
            d["prefill_tokens"] = st.prefill_tokens;
            d["prompt_tokens"] = st.prompt_tokens;
            d["cache_hit_tokens"] = st.cache_hit_tokens;
            d["preemptions"] = st.preemptions;
            d["recomputed_tokens"] = st.recomputed_tokens;
            d["finished"] = st.finished;
            return d;
          },
          "Counts so far (a dict).")
      .def("drop_cache", &scheduler::drop_cache,
           "Frees every unreferenced cached block; returns how many.");
}

}  // namespace pp
