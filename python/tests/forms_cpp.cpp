// The C++ side of the Python package's tests: reads a scenario (JSON, stdin) and writes what
// prepack's C++ API gives for it (JSON, stdout), built here straight from the headers, so
// python/tests can check every Python form field by field against the C++ one on the same
// inputs. Scenarios:
//   {"kind": "pack", "prompts": [[..], ..], "capacity": n?, "method": "ffd"|"bfd"}
//   {"kind": "steps", "prompts": [[..], ..], "budget": n, "policy": .., "block_size": n,
//    "chunk_block_size": n, "n_blocks": n, "prefix": bool, "seq_ids": [..]?,
//    "num_layers": n}                      every step in prepack's and every engine's form
//   {"kind": "serve", "options": {..}, "requests": [[id, max_new, [tokens]], ..]}
//                                          a scheduler loop whose sampled token is
//                                          (id * 31 + seq_len) % 1000
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "prepack/engines.hpp"
#include "prepack/prepack.hpp"

namespace {

using json = nlohmann::json;

template <class T>
json arr(const std::vector<T>& v) {
  json a = json::array();
  for (const auto& x : v) a.push_back(static_cast<long long>(x));
  return a;
}
template <class T>
json arr(prepack::span<const T> v) {
  json a = json::array();
  for (const auto& x : v) a.push_back(static_cast<long long>(x));
  return a;
}

json floats(const std::vector<float>& v) {
  json a = json::array();
  for (float x : v) a.push_back(x);
  return a;
}

json pack_json(const json& in) {
  const auto prompts = in.at("prompts").get<std::vector<std::vector<std::int32_t>>>();
  std::vector<std::int64_t> len;
  for (const auto& p : prompts) len.push_back(static_cast<std::int64_t>(p.size()));
  std::optional<std::int64_t> cap;
  if (in.contains("capacity")) cap = in.at("capacity").get<std::int64_t>();
  const auto kind = in.value("method", std::string("ffd")) == "bfd"
                        ? prepack::packer::best_fit_decreasing
                        : prepack::packer::first_fit_decreasing;
  const auto plan = prepack::make_plan(kind, len, cap);
  const auto l = prepack::make_layout<std::int64_t, std::int64_t>(plan, prompts);
  const auto v = prepack::make_varlen(l);
  json out;
  out["n_rows"] = l.n_rows();
  out["width"] = l.width();
  out["input_ids"] = arr(l.tokens());
  out["position_ids"] = arr(l.positions());
  out["segment_ids"] = arr(l.segments());
  out["last_token"] = arr(l.last_token());
  out["prompt_row"] = arr(l.prompt_row());
  out["prompt_offset"] = arr(l.prompt_offset());
  out["cu_seqlens"] = arr(v.cu_seqlens);
  out["max_seqlen"] = v.max_seqlen;
  out["mask"] = floats(prepack::transformers_mask<float>(l));
  return out;
}

json step_json(const prepack::step_inputs<std::int32_t, std::int32_t>& in, std::size_t layers) {
  json s;
  s["seq_id"] = arr(in.seq_id);
  s["context_lens"] = arr(in.context_lens);
  s["query_lens"] = arr(in.query_lens);
  s["seq_lens"] = arr(in.seq_lens);
  s["cu_seqlens_q"] = arr(in.cu_seqlens_q);
  s["cu_seqlens_k"] = arr(in.cu_seqlens_k);
  s["completes"] = arr(in.completes);
  s["decodes"] = arr(in.decodes);
  s["prompt_lens"] = arr(in.prompt_lens);
  s["block_table"] = arr(in.tables.table);
  s["tokens"] = arr(in.tokens);
  s["positions"] = arr(in.positions);
  s["token_seq_id"] = arr(in.token_seq_id);
  s["logits"] = arr(in.logits);
  s["slot_mapping"] = arr(in.slot_mapping);
  const auto v = prepack::vllm::make_step(in);
  s["vllm"] = {{"req_order", arr(v.req_order)},
               {"query_start_loc", arr(v.query_start_loc)},
               {"seq_lens", arr(v.seq_lens)},
               {"num_computed_tokens", arr(v.num_computed_tokens)},
               {"is_prefilling", arr(v.is_prefilling)},
               {"block_table_tensor", arr(v.block_table_tensor)},
               {"input_ids", arr(v.input_ids)},
               {"positions", arr(v.positions)},
               {"slot_mapping", arr(v.slot_mapping)},
               {"logits_indices", arr(v.logits_indices)},
               {"discard_request_mask", arr(v.discard_request_mask)},
               {"common_prefix_len", v.common_prefix_len}};
  const auto f = prepack::flashinfer::make_step(in);
  s["flashinfer"] = {{"qo_indptr", arr(f.attention.qo_indptr)},
                     {"paged_kv_indptr", arr(f.attention.paged_kv_indptr)},
                     {"paged_kv_indices", arr(f.attention.paged_kv_indices)},
                     {"paged_kv_last_page_len", arr(f.attention.paged_kv_last_page_len)},
                     {"batch_indices", arr(f.batch_indices)},
                     {"positions", arr(f.positions)},
                     {"cascade", f.cascade.has_value()}};
  const auto g = prepack::sglang::make_forward_batch(in);
  s["sglang"] = {{"seq_lens", arr(g.seq_lens)},
                 {"out_cache_loc", arr(g.out_cache_loc)},
                 {"positions", arr(g.positions)},
                 {"extend_prefix_lens", g.extend_prefix_lens ? arr(*g.extend_prefix_lens) : json()},
                 {"extend_seq_lens", g.extend_seq_lens ? arr(*g.extend_seq_lens) : json()},
                 {"extend_start_loc", g.extend_start_loc ? arr(*g.extend_start_loc) : json()},
                 {"seq_order", arr(g.seq_order)},
                 {"req_to_token", arr(g.req_to_token)}};
  try {
    prepack::trtllm::options o;
    o.num_layers = layers;
    const auto t = prepack::trtllm::make_step(in, o);
    s["trtllm"] = {{"seq_order", arr(t.seq_order)},
                   {"seq_lens", arr(t.seq_lens)},
                   {"kv_lens", arr(t.kv_lens)},
                   {"context_lengths", arr(t.context_lengths)},
                   {"host_request_types", arr(t.host_request_types)},
                   {"kv_cache_block_offsets", arr(t.kv_cache_block_offsets)}};
  } catch (const prepack::error& e) {
    s["trtllm"] = {{"error", e.what()}};
  }
  return s;
}

json steps_json(const json& in) {
  const auto prompts = in.at("prompts").get<std::vector<std::vector<std::int32_t>>>();
  prepack::budget_options o;
  o.budget = in.at("budget").get<std::size_t>();
  o.policy = in.value("policy", std::string("whole_first")) == "fill"
                 ? prepack::chunking::fill
                 : prepack::chunking::whole_first;
  o.block_size = in.value("chunk_block_size", std::size_t{0});
  const auto bs = in.at("block_size").get<std::size_t>();
  const auto n_blocks = in.at("n_blocks").get<std::size_t>();
  const auto layers = in.value("num_layers", std::size_t{1});
  prepack::block_allocator alloc(n_blocks, true);  // block 0: vLLM's null block
  prepack::step_schedule sched;
  std::vector<std::vector<std::int32_t>> item_tokens;
  prepack::block_tables tables;
  std::vector<std::int64_t> ids;
  std::optional<prepack::prefix_plan> plan;
  if (in.value("prefix", false)) {
    plan = prepack::make_prefix_plan(prompts, {bs, 16, 16});
    sched = prepack::budgeted_schedule(prepack::span<const prepack::schedule_item>(plan->items), o);
    item_tokens = plan->item_tokens(prompts);
    tables = prepack::allocate_prefix_tables(*plan, alloc).items;
  } else {
    std::vector<std::size_t> len;
    for (const auto& p : prompts) len.push_back(p.size());
    sched = prepack::budgeted_schedule(len, o);
    item_tokens = prompts;
    std::vector<std::vector<std::int32_t>> rows;
    for (const auto& p : prompts) rows.push_back(alloc.allocate(prepack::blocks_for(p.size(), bs)));
    tables = prepack::make_block_tables(rows, bs);
  }
  if (in.contains("seq_ids")) ids = in.at("seq_ids").get<std::vector<std::int64_t>>();
  prepack::step_options so;
  so.seq_ids = ids;
  json out;
  out["n_steps"] = sched.n_steps();
  out["steps"] = json::array();
  for (std::size_t s = 0; s < sched.n_steps(); ++s) {
    const auto st = prepack::make_step_inputs<std::int32_t, std::int32_t>(sched, s, item_tokens,
                                                                          tables, n_blocks, so);
    json j = step_json(st, layers);
    if (!plan) {
      std::vector<std::int64_t> seq(prompts.size());
      for (std::size_t i = 0; i < seq.size(); ++i) seq[i] = static_cast<std::int64_t>(i);
      const auto b = prepack::llama_cpp::make_batch(sched, s, item_tokens, seq);
      j["llama_cpp"] = {{"token", arr(b.token)},
                        {"pos", arr(b.pos)},
                        {"seq_id", arr(b.seq_id)},
                        {"logits", arr(b.logits)}};
    }
    out["steps"].push_back(j);
  }
  return out;
}

json serve_json(const json& in) {
  const json& o = in.at("options");
  prepack::scheduler_options so;
  so.token_budget = o.at("token_budget").get<std::size_t>();
  so.max_seqs = o.at("max_seqs").get<std::size_t>();
  so.n_blocks = o.at("n_blocks").get<std::size_t>();
  so.block_size = o.at("block_size").get<std::size_t>();
  const auto policy = o.at("policy").get<std::string>();
  so.policy = policy == "packed"           ? prepack::admission::packed
              : policy == "shortest_first" ? prepack::admission::shortest_first
                                           : prepack::admission::fcfs;
  so.prefix_cache = o.at("prefix_cache").get<bool>();
  so.aligned_chunks = o.value("aligned_chunks", false);
  so.null_block = true;
  prepack::scheduler sched(so);
  for (const auto& r : in.at("requests")) {
    prepack::request q;
    q.id = r.at(0).get<std::int64_t>();
    q.max_new_tokens = r.at(1).get<std::size_t>();
    q.prompt = r.at(2).get<std::vector<std::int32_t>>();
    sched.add(std::move(q));
  }
  json out;
  out["steps"] = json::array();
  out["finished"] = json::array();
  while (!sched.idle()) {
    const auto st = sched.next_step();
    json j = step_json(st.inputs, 1);
    j["preempted"] = arr(st.preempted);
    std::vector<std::int32_t> sampled;
    for (std::size_t q = 0; q < st.inputs.n_seqs(); ++q) {
      if (st.inputs.completes[q]) {
        sampled.push_back(
            static_cast<std::int32_t>((st.inputs.seq_id[q] * 31 + st.inputs.seq_lens[q]) % 1000));
      }
    }
    for (const auto& f : sched.commit(sampled)) {
      out["finished"].push_back({{"id", f.id}, {"generated", arr(f.generated)}});
    }
    out["steps"].push_back(j);
  }
  return out;
}

}  // namespace

int main() {
  try {
    const json in = json::parse(std::cin);
    const auto kind = in.at("kind").get<std::string>();
    const json out = kind == "pack"    ? pack_json(in)
                     : kind == "steps" ? steps_json(in)
                                       : serve_json(in);
    std::cout << out.dump() << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "forms_cpp: " << e.what() << "\n";
    return 1;
  }
}
