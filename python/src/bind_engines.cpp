// Each engine's own form of a step (prepack/engines/): dicts of arrays by the engine's names and
// dtypes, built by the C++ headers.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "prepack/engines.hpp"

namespace pp {
namespace {

nb::ndarray<nb::numpy, bool> as_bool(std::vector<std::uint8_t>&& v) {
  return to_numpy_bool(std::move(v));
}

nb::dict paged_kv_dict(prepack::flashinfer::paged_kv&& p) {
  nb::dict d;
  d["qo_indptr"] = to_numpy(std::move(p.qo_indptr));
  d["paged_kv_indptr"] = to_numpy(std::move(p.paged_kv_indptr));
  d["paged_kv_indices"] = to_numpy(std::move(p.paged_kv_indices));
  d["paged_kv_last_page_len"] = to_numpy(std::move(p.paged_kv_last_page_len));
  return d;
}

nb::dict llama_batch_dict(prepack::llama_cpp::batch&& b) {
  nb::dict d;
  d["n_tokens"] = b.n_tokens();
  d["token"] = to_numpy(std::move(b.token));
  d["pos"] = to_numpy(std::move(b.pos));
  d["n_seq_id"] = to_numpy(std::move(b.n_seq_id));
  d["seq_id"] = to_numpy(std::move(b.seq_id));
  d["logits"] = to_numpy(std::move(b.logits));
  d["output_item"] =
      to_numpy(std::vector<std::int64_t>(b.output_item.begin(), b.output_item.end()));
  return d;
}

}  // namespace

void bind_engines(nb::module_& m) {
  nb::module_ vllm =
      m.def_submodule("vllm", "vLLM v1's form of a step (prepack/engines/vllm.hpp).");
  vllm.def(
      "make_step",
      [](const step_inputs_box& b, count max_num_blocks_per_req_in, count num_tokens_padded_in,
         count num_reqs_padded_in, count block_size_multiple_in, const std::string& runner,
         count reorder_batch_threshold_in) {
        const std::size_t max_num_blocks_per_req =
            max_num_blocks_per_req_in("max_num_blocks_per_req");
        const std::size_t num_tokens_padded = num_tokens_padded_in("num_tokens_padded");
        const std::size_t num_reqs_padded = num_reqs_padded_in("num_reqs_padded");
        const std::size_t block_size_multiple = block_size_multiple_in("block_size_multiple");
        const std::size_t reorder_batch_threshold =
            reorder_batch_threshold_in("reorder_batch_threshold");
        prepack::vllm::options o;
        if (runner == "v1") {
          o.model_runner = prepack::vllm::runner::v1;
        } else if (runner != "v2") {
          throw nb::value_error(
              ("vllm.make_step: runner '" + runner + "', not 'v1' or 'v2'").c_str());
        }
        o.reorder_batch_threshold = reorder_batch_threshold;
        o.block_size_multiple = block_size_multiple;
        o.max_num_blocks_per_req = max_num_blocks_per_req;
        o.num_tokens_padded = num_tokens_padded;
        o.num_reqs_padded = num_reqs_padded;
        auto s = prepack::vllm::make_step(b.in, o);
        nb::dict d;
        d["req_order"] =
            to_numpy(std::vector<std::int64_t>(s.req_order.begin(), s.req_order.end()));
        d["num_reqs"] = s.num_reqs;
        d["num_reqs_padded"] = s.num_reqs_padded;
        d["num_actual_tokens"] = s.num_actual_tokens;
        d["max_query_len"] = s.max_query_len;
        d["max_seq_len"] = s.max_seq_len;
        d["block_size"] = s.block_size;
        d["common_prefix_len"] = s.common_prefix_len;
        d["req_ids"] = to_numpy(std::move(s.req_ids));
        d["query_start_loc"] = to_numpy(std::move(s.query_start_loc));
        d["seq_lens"] = to_numpy(std::move(s.seq_lens));
        d["num_computed_tokens"] = to_numpy(std::move(s.num_computed_tokens));
        d["is_prefilling"] = as_bool(std::move(s.is_prefilling));
        d["block_table_tensor"] =
            to_numpy(std::move(s.block_table_tensor),
                     {static_cast<std::size_t>(s.num_reqs_padded), s.max_num_blocks_per_req});
        d["input_ids"] = to_numpy(std::move(s.input_ids));
        d["positions"] = to_numpy(std::move(s.positions));
        d["slot_mapping"] = to_numpy(std::move(s.slot_mapping));
        d["logits_indices"] = to_numpy(std::move(s.logits_indices));
        d["discard_request_mask"] = as_bool(std::move(s.discard_request_mask));
        return d;
      },
      "inputs"_a, "max_num_blocks_per_req"_a = 0, "num_tokens_padded"_a = 0,
      "num_reqs_padded"_a = 0, "block_size_multiple"_a = 0, "runner"_a = "v2",
      "reorder_batch_threshold"_a = 1,
      "The step as vLLM's model runner builds it, requests in that runner's batch order from "
      "the step's ('v2', vLLM's default from 0.25 and only runner from 0.34: sorted by tokens, "
      "single tokens first; 'v1' with the attention backend's reorder_batch_threshold: "
      "decodes, short extends, long extends, prefills by vLLM's own swaps, 0 for backends that "
      "keep the order: CPU, FlashAttention, Triton): "
      "req_order [num_reqs] int64 (the step's sequence at each position); num_reqs, "
      "num_actual_tokens, max_query_len, max_seq_len, block_size, common_prefix_len (ints); "
      "req_ids [num_reqs] int64; query_start_loc [num_reqs + 1], seq_lens, num_computed_tokens, "
      "logits_indices [num_reqs] int32; is_prefilling [num_reqs] bool; block_table_tensor "
      "[num_reqs, max_num_blocks_per_req] int32 (0 past a "
      "request's blocks); input_ids [num_tokens] int32, positions and slot_mapping "
      "[num_tokens] int64 (-1 on padding); discard_request_mask [num_reqs] bool.");

  vllm.def(
      "write_cpu_cache",
      [](array_like kv_cache, array_like key, array_like value, array_like slot_mapping) {
        nb::ndarray<nb::c_contig, nb::device::cpu> cache;
        nb::ndarray<nb::ro, nb::device::cpu> k, v;
        if (!nb::try_cast(kv_cache.obj, cache, false) || cache.ndim() != 4) {
          throw nb::type_error(
              "write_cpu_cache: kv_cache must be a writable C-contiguous CPU array "
              "[num_blocks, num_kv_heads, block_size, 2 * head_size]");
        }
        if (!nb::try_cast(key.obj, k, false) || !nb::try_cast(value.obj, v, false) ||
            k.ndim() != 3 || v.ndim() != 3) {
          throw nb::type_error("write_cpu_cache: key and value must be [num_tokens, heads, dim]");
        }
        if (k.dtype() != cache.dtype() || v.dtype() != cache.dtype()) {
          throw nb::type_error("write_cpu_cache: key, value and kv_cache differ in dtype");
        }
        const std::size_t nb_ = cache.shape(0), heads = cache.shape(1), bs = cache.shape(2);
        const std::size_t hd = cache.shape(3) / 2;
        const auto slots = prepack::slot_mapping::from_slots(
            int_array<std::int64_t>(slot_mapping, "slot_mapping").vector(), nb_, bs);
        const auto write = [&](auto* data) {
          using U = std::remove_pointer_t<decltype(data)>;
          const auto kv = prepack::vllm_cpu_kv_views(data, nb_, bs, heads, hd);
          const auto src = [](const nb::ndarray<nb::ro, nb::device::cpu>& a) {
            return prepack::tensor_view<const U, 3>{
                static_cast<const U*>(a.data()),
                {a.shape(0), a.shape(1), a.shape(2)},
                {static_cast<std::size_t>(a.stride(0)), static_cast<std::size_t>(a.stride(1)),
                 static_cast<std::size_t>(a.stride(2))}};
          };
          prepack::write_slots(slots, src(k), kv[0]);
          prepack::write_slots(slots, src(v), kv[1]);
        };
        switch (cache.itemsize()) {  // the same dtype everywhere: elements moved bit for bit
          case 2:
            write(static_cast<std::uint16_t*>(cache.data()));
            break;
          case 4:
            write(static_cast<std::uint32_t*>(cache.data()));
            break;
          default:
            throw nb::type_error("write_cpu_cache: elements of 2 or 4 bytes expected");
        }
      },
      "kv_cache"_a, "key"_a, "value"_a, "slot_mapping"_a,
      "Writes one layer's key and value [num_tokens, num_kv_heads, head_size] into vLLM's CPU "
      "attention cache [num_blocks, num_kv_heads, block_size, 2 * head_size] through a slot "
      "mapping (-1: skipped), in the layout vLLM's cpu_attn_reshape_and_cache writes (per block "
      "and head: K as [head_size][block_size], then V as [block_size][head_size]; "
      "prepack::vllm_cpu_kv_views). ValueError for slots outside the cache or written twice.");

  nb::module_ fi = m.def_submodule("flashinfer",
                                   "FlashInfer's form of a step (prepack/engines/flashinfer.hpp).");
  fi.def(
      "make_step",
      [](const step_inputs_box& b, std::optional<int> num_qo_heads, std::optional<int> num_kv_heads,
         std::optional<int> head_dim, nb::handle q_data_type, nb::handle kv_data_type) {
        auto p = prepack::flashinfer::make_step(b.in);
        const std::size_t n = p.seq_lens.size();
        nb::dict d;
        d["page_size"] = p.page_size;
        d["request_ids"] = to_numpy(std::move(p.request_ids));
        // Every argument of BatchPrefillWithPagedKVCacheWrapper.plan the step (and the model,
        // when given) determines: wrapper.plan(**form["plan"]) after moving arrays to the device.
        nb::dict plan = paged_kv_dict(prepack::flashinfer::paged_kv(p.attention));
        plan["page_size"] = p.page_size;
        plan["causal"] = p.causal;
        plan["seq_lens"] = to_numpy(std::move(p.seq_lens));
        plan["seq_lens_q"] = to_numpy(std::move(p.seq_lens_q));
        plan["block_tables"] = to_numpy(std::move(p.block_tables), {n, p.max_pages});
        plan["max_token_per_sequence"] = p.max_token_per_sequence;
        plan["max_sequence_kv"] = p.max_sequence_kv;
        if (num_qo_heads) plan["num_qo_heads"] = *num_qo_heads;
        if (num_kv_heads) plan["num_kv_heads"] = *num_kv_heads;
        if (head_dim) plan["head_dim_qk"] = *head_dim;
        if (!q_data_type.is_none()) plan["q_data_type"] = q_data_type;
        if (!kv_data_type.is_none()) plan["kv_data_type"] = kv_data_type;
        d["plan"] = plan;
        d["attention"] = paged_kv_dict(std::move(p.attention));
        d["batch_indices"] = to_numpy(std::move(p.batch_indices));
        d["positions"] = to_numpy(std::move(p.positions));
        if (p.cascade) {
          nb::dict c;
          c["shared_pages"] = p.cascade->shared_pages;
          c["shared"] = paged_kv_dict(std::move(p.cascade->shared));
          c["unique"] = paged_kv_dict(std::move(p.cascade->unique));
          d["cascade"] = c;
        } else {
          d["cascade"] = nb::none();
        }
        return d;
      },
      "inputs"_a, "num_qo_heads"_a = nb::none(), "num_kv_heads"_a = nb::none(),
      "head_dim"_a = nb::none(), "q_data_type"_a = nb::none(), "kv_data_type"_a = nb::none(),
      "The step as FlashInfer's wrappers take it: plan, the keyword arguments of "
      "BatchPrefillWithPagedKVCacheWrapper.plan the step determines (the page table, page_size, "
      "causal=True, and seq_lens, seq_lens_q, block_tables [batch, max pages], "
      "max_token_per_sequence, max_sequence_kv for its trtllm-gen / cuDNN backends) plus the "
      "model's heads, head dim and data types when given; page_size; request_ids [batch] int64; "
      "attention: the plan() page table (qo_indptr, paged_kv_indptr [batch + 1], "
      "paged_kv_indices, paged_kv_last_page_len [batch], all int32); batch_indices and "
      "positions [nnz] int32 for append_paged_kv_cache; cascade: the two levels of "
      "MultiLevelCascadeAttentionWrapper, or None.");

  nb::module_ sg =
      m.def_submodule("sglang", "SGLang's form of a step (prepack/engines/sglang.hpp).");
  sg.def(
      "make_forward_batch",
      [](const step_inputs_box& b, optional_array_like req_pool_indices, count width_in) {
        const std::size_t width = width_in("width");
        const auto rows = optional_ints<std::int64_t>(req_pool_indices, "req_pool_indices");
        auto f = prepack::sglang::make_forward_batch(b.in, rows, width);
        nb::dict d;
        d["forward_mode"] = f.mode == prepack::sglang::forward_mode::extend   ? "EXTEND"
                            : f.mode == prepack::sglang::forward_mode::decode ? "DECODE"
                                                                              : "MIXED";
        d["seq_order"] =
            to_numpy(std::vector<std::int64_t>(f.seq_order.begin(), f.seq_order.end()));
        d["batch_size"] = f.batch_size;
        d["rids"] = to_numpy(std::move(f.rids));
        d["input_ids"] = to_numpy(std::move(f.input_ids));
        d["req_pool_indices"] = to_numpy(std::move(f.req_pool_indices));
        d["seq_lens"] = to_numpy(std::move(f.seq_lens));
        d["seq_lens_sum"] = f.seq_lens_sum;
        d["out_cache_loc"] = to_numpy(std::move(f.out_cache_loc));
        d["positions"] = to_numpy(std::move(f.positions));
        // None in DECODE mode, as ForwardBatch.init_new leaves them.
        const auto opt = [](std::optional<std::vector<std::int32_t>>& v) -> nb::object {
          return v ? nb::cast(to_numpy(std::move(*v))) : nb::none();
        };
        d["extend_num_tokens"] = f.extend_num_tokens ? nb::cast(*f.extend_num_tokens) : nb::none();
        d["extend_prefix_lens"] = opt(f.extend_prefix_lens);
        d["extend_seq_lens"] = opt(f.extend_seq_lens);
        d["extend_start_loc"] = opt(f.extend_start_loc);
        d["req_to_token"] =
            to_numpy(std::move(f.req_to_token),
                     {static_cast<std::size_t>(f.batch_size), f.req_to_token_width});
        return d;
      },
      "inputs"_a, "req_pool_indices"_a = nb::none(), "req_to_token_width"_a = 0,
      "The step as SGLang's ForwardBatch holds it, extends before decodes: seq_order [bs] int64 "
      "(the step's sequence at each position); forward_mode ('EXTEND', 'DECODE', "
      "'MIXED'), batch_size, seq_lens_sum, extend_num_tokens (None in DECODE); rids, input_ids, "
      "req_pool_indices, seq_lens, out_cache_loc, positions int64; extend_prefix_lens, "
      "extend_seq_lens, extend_start_loc [bs] int32 (None in DECODE); req_to_token [bs, width] "
      "int32.");

  sg.def(
      "write_req_to_token",
      [](const step_inputs_box& b, const nb::dict& form, array_like req_to_token) {
        nb::ndarray<std::int32_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> table;
        if (!nb::try_cast(req_to_token.obj, table, false)) {
          throw nb::type_error(
              "sglang.write_req_to_token: req_to_token must be a writable C-contiguous int32 CPU "
              "array [pool_size, max_context_len] (ReqToTokenPool.req_to_token)");
        }
        if (!form.contains("seq_order") || !form.contains("req_pool_indices")) {
          throw nb::value_error(
              "sglang.write_req_to_token: form must be make_forward_batch's dict (seq_order, "
              "req_pool_indices)");
        }
        const auto order = int_array<std::int64_t>(form["seq_order"], "seq_order").vector();
        const auto rows =
            int_array<std::int64_t>(form["req_pool_indices"], "req_pool_indices").vector();
        std::vector<std::size_t> seq_order(order.size());
        for (std::size_t r = 0; r < order.size(); ++r) {
          prepack::detail::require(order[r] >= 0, "sglang: seq_order[", r, "] = ", order[r]);
          seq_order[r] = static_cast<std::size_t>(order[r]);
        }
        prepack::sglang::write_req_to_token(
            b.in, prepack::span<const std::size_t>(seq_order),
            prepack::span<const std::int64_t>(rows),
            prepack::span<std::int32_t>(table.data(), table.shape(0) * table.shape(1)),
            table.shape(0), table.shape(1));
      },
      "inputs"_a, "form"_a, "req_to_token"_a,
      "Writes the step into SGLang's ReqToTokenPool.req_to_token [pool_size, max_context_len] "
      "int32 (numpy or a CPU torch tensor), in place, as SGLang does before the forward pass: "
      "each extend's positions [0, seq_len) (write_req_to_token_pool_triton), each decode's new "
      "position (prepare_for_decode), in row form['req_pool_indices'][r]; other entries kept. "
      "ValueError, writing nothing, for a row outside the pool or shared, a request longer "
      "than max_context_len. O(step tokens + extends' prefixes).");

  nb::module_ tr =
      m.def_submodule("trtllm", "TensorRT-LLM's form of a step (prepack/engines/trtllm.hpp).");
  tr.def(
      "make_step",
      [](const step_inputs_box& b, count num_layers_in, count max_blocks_per_seq_in,
         optional_array_like pool_layers, bool layer_first, bool k_only) {
        const std::size_t num_layers = num_layers_in("num_layers");
        const std::size_t max_blocks_per_seq = max_blocks_per_seq_in("max_blocks_per_seq");
        prepack::trtllm::options o;
        o.num_layers = num_layers;
        o.max_blocks_per_seq = max_blocks_per_seq;
        for (const auto l : optional_ints<std::int64_t>(pool_layers, "pool_layers")) {
          prepack::detail::require(l > 0, "trtllm: a pool of ", l, " layers");
          o.pool_layers.push_back(static_cast<std::size_t>(l));
        }
        o.layout = layer_first ? prepack::trtllm::pool_layout::layer_first
                               : prepack::trtllm::pool_layout::block_first;
        o.k_only = k_only;
        auto a = prepack::trtllm::make_step(b.in, o);
        const std::size_t n = a.request_ids.size();
        nb::dict d;
        d["seq_order"] =
            to_numpy(std::vector<std::int64_t>(a.seq_order.begin(), a.seq_order.end()));
        d["num_contexts"] = a.num_contexts;
        d["num_generations"] = a.num_generations;
        d["request_ids"] = to_numpy(std::move(a.request_ids));
        d["seq_lens"] = to_numpy(std::move(a.seq_lens));
        d["num_cached_tokens_per_seq"] = to_numpy(std::move(a.num_cached_tokens_per_seq));
        d["kv_lens"] = to_numpy(std::move(a.kv_lens));
        d["context_lengths"] = to_numpy(std::move(a.context_lengths));
        d["host_request_types"] = to_numpy(std::move(a.host_request_types));
        d["kv_cache_block_offsets"] = to_numpy(std::move(a.kv_cache_block_offsets),
                                               {a.num_pools, n, 2, a.max_blocks_per_seq});
        d["input_ids"] = to_numpy(std::move(a.input_ids));
        d["position_ids"] = to_numpy(std::move(a.position_ids));
        d["tokens_per_block"] = a.tokens_per_block.empty() ? 0 : a.tokens_per_block[0];
        return d;
      },
      "inputs"_a, "num_layers"_a = 1, "max_blocks_per_seq"_a = 0, "pool_layers"_a = nb::none(),
      "layer_first"_a = false, "k_only"_a = false,
      "The step as TensorRT-LLM's attention metadata takes it, context requests first (pools of "
      "pool_layers layers each, default one of num_layers; layer_first: pools laid out layer by "
      "layer; k_only: a K-only cache, MLA's): "
      "seq_order [num_seqs] int64 (the step's sequence at each position); num_contexts, "
      "num_generations; request_ids int64; seq_lens, num_cached_tokens_per_seq, kv_lens, "
      "context_lengths, host_request_types [num_seqs] int32; kv_cache_block_offsets [num_pools, "
      "num_seqs, 2, max_blocks_per_seq] int32 (setOffsets' values); input_ids, position_ids "
      "[num_tokens] int32; "
      "tokens_per_block.");

  nb::module_ ll =
      m.def_submodule("llama_cpp", "llama.cpp's form of a step (prepack/engines/llama_cpp.hpp).");
  ll.attr("max_seq") = prepack::llama_cpp::max_seq;
  ll.def(
      "make_batch",
      [](const prepack::step_schedule& sched, count step_in, prompts_like item_tokens,
         array_like seq_ids, std::int32_t n_seq_max) {
        const std::size_t step = step_in("step");
        prompts storage;
        const prompts& toks = as_prompts(item_tokens, storage);
        const auto ids = int_array<std::int64_t>(seq_ids, "seq_ids").vector();
        return llama_batch_dict(
            prepack::llama_cpp::make_batch(sched, step, toks.tokens, ids, n_seq_max));
      },
      "schedule"_a, "step"_a, "item_tokens"_a, "seq_ids"_a,
      "n_seq_max"_a = prepack::llama_cpp::max_seq,
      "Step `step` as a llama_batch's arrays: n_tokens; token, pos, n_seq_id, seq_id "
      "[n_tokens] int32; logits [n_tokens] int8; output_item (the item of each logits row) "
      "int64. seq_ids: each item's llama_seq_id.");
  ll.def(
      "make_prefix_steps",
      [](const prepack::prefix_plan& plan, const prepack::step_schedule& sched,
         prompts_like prompts_obj, array_like seq_ids, std::int32_t n_seq_max) {
        prompts storage;
        const prompts& ps = as_prompts(prompts_obj, storage);
        const auto ids = int_array<std::int64_t>(seq_ids, "seq_ids").vector();
        auto steps = prepack::llama_cpp::make_prefix_steps(plan, sched, ps.tokens, ids, n_seq_max);
        nb::list out;
        for (auto& st : steps) {
          std::vector<std::int32_t> copies;
          for (const auto& c : st.copies_after)
            copies.insert(copies.end(), {c.src, c.dst, c.p0, c.p1});
          const std::size_t n = st.copies_after.size();
          nb::dict d;
          d["batch"] = llama_batch_dict(std::move(st.batch));
          d["copies_after"] = to_numpy(std::move(copies), {n, 4});
          out.append(d);
        }
        return out;
      },
      "plan"_a, "schedule"_a, "prompts"_a, "seq_ids"_a, "n_seq_max"_a = prepack::llama_cpp::max_seq,
      "Every step of a prefix plan's schedule as llama.cpp runs shared prefixes: a list of "
      "{batch: make_batch's dict, copies_after: [n, 4] int32 (src, dst, p0, p1) for "
      "llama_memory_seq_cp after the batch}.");
}

}  // namespace pp
