// Schedules, shared prefixes, block tables and step inputs (prepack/schedule.hpp, prefix.hpp,
// paged.hpp, step.hpp).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
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

prepack::budget_options budget_opts(std::size_t budget, const std::string& policy,
                                    const std::string& order, std::size_t block_size) {
  prepack::budget_options o;
  o.budget = budget;
  o.policy = choose<prepack::chunking>(
      "policy", policy,
      {{"whole_first", prepack::chunking::whole_first}, {"fill", prepack::chunking::fill}});
  o.order =
      choose<prepack::schedule_order>("order", order,
                                      {{"arrival", prepack::schedule_order::arrival},
                                       {"shortest_first", prepack::schedule_order::shortest_first},
                                       {"longest_first", prepack::schedule_order::longest_first}});
  o.block_size = block_size;
  return o;
}

// The chunks of steps [first, last) as arrays.
nb::dict chunk_arrays(const prepack::step_schedule& s, std::size_t first, std::size_t last) {
  std::vector<std::int64_t> item, start, length, context, step;
  std::vector<bool> last_chunk;
  std::vector<std::uint8_t> lastv;
  for (std::size_t st = first; st < last; ++st) {
    for (const prepack::chunk& c : s.step(st)) {
      item.push_back(static_cast<std::int64_t>(c.item));
      start.push_back(static_cast<std::int64_t>(c.start));
      length.push_back(static_cast<std::int64_t>(c.length));
      context.push_back(static_cast<std::int64_t>(c.context));
      lastv.push_back(c.last ? 1 : 0);
      step.push_back(static_cast<std::int64_t>(st));
    }
  }
  nb::dict d;
  d["step"] = to_numpy(std::move(step));
  d["item"] = to_numpy(std::move(item));
  d["start"] = to_numpy(std::move(start));
  d["length"] = to_numpy(std::move(length));
  d["context"] = to_numpy(std::move(context));
  d["last"] = to_numpy_bool(std::move(lastv));
  return d;
}

prepack::block_tables tables_from_array(nb::handle table, std::size_t block_size) {
  nb::object a = as_numpy(table);
  const auto ndim = nb::cast<std::size_t>(a.attr("ndim"));
  if (ndim != 2) {
    throw nb::value_error(("block tables: a " + std::to_string(ndim) +
                           "-dimensional array, [n_seqs, max_blocks] expected")
                              .c_str());
  }
  const auto rows = nb::cast<std::size_t>(a.attr("shape")[0]);
  const auto cols = nb::cast<std::size_t>(a.attr("shape")[1]);
  const int_array<std::int32_t> flat(a.attr("reshape")(-1), "block table");
  prepack::detail::require(block_size > 0, "block tables: block size 0");
  prepack::block_tables t;
  t.block_size = block_size;
  t.max_blocks = std::max<std::size_t>(cols, 1);
  t.table.assign(rows * t.max_blocks, -1);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t k = 0; k < cols; ++k)
      t.table[r * t.max_blocks + k] = flat.data()[r * cols + k];
  }
  return t;
}

std::vector<std::vector<std::int32_t>> int32_lists(nb::handle obj, const char* what) {
  std::vector<std::vector<std::int32_t>> out;
  std::size_t i = 0;
  for (nb::handle row : nb::iter(obj)) {
    const std::string name = std::string(what) + " " + std::to_string(i++);
    out.push_back(int_array<std::int32_t>(row, name.c_str()).vector());
  }
  return out;
}

template <class T>
auto view_of(nb::handle self, const std::vector<T>& v) {
  return view(v, self);
}

#define PP_STEP_ARRAY(name, doc)                                                                   \
  def_prop_ro(                                                                                     \
      #name, [](nb::handle s) { return view_of(s, nb::cast<const step_inputs_box&>(s).in.name); }, \
      doc)

}  // namespace

nb::dict step_dict(const step_inputs32& in) {
  nb::dict d;
  const auto copy = [](const auto& v) { return to_numpy(std::vector(v.begin(), v.end())); };
  d["seq_item"] = copy(in.seq_item);
  d["seq_id"] = copy(in.seq_id);
  d["context_lens"] = copy(in.context_lens);
  d["query_lens"] = copy(in.query_lens);
  d["seq_lens"] = copy(in.seq_lens);
  d["cu_seqlens_q"] = copy(in.cu_seqlens_q);
  d["cu_seqlens_k"] = copy(in.cu_seqlens_k);
  d["max_seqlen_q"] = in.max_seqlen_q;
  d["max_seqlen_k"] = in.max_seqlen_k;
  d["completes"] = copy(in.completes);
  d["decodes"] = copy(in.decodes);
  d["prompt_lens"] = copy(in.prompt_lens);
  d["block_table"] =
      to_numpy(std::vector(in.tables.table), {in.tables.n_seqs(), in.tables.max_blocks});
  d["block_size"] = in.tables.block_size;
  d["tokens"] = copy(in.tokens);
  d["positions"] = copy(in.positions);
  d["token_seq_id"] = copy(in.token_seq_id);
  d["logits"] = copy(in.logits);
  d["slot_mapping"] = copy(in.slot_mapping);
  d["n_blocks"] = in.n_blocks;
  return d;
}

void bind_steps(nb::module_& m) {
  nb::class_<prepack::step_schedule>(
      m, "Schedule",
      "Prompts (or schedule items) split into steps of at most `budget` tokens "
      "(prepack::step_schedule); chunks are listed step by step.")
      .def_ro("budget", &prepack::step_schedule::budget)
      .def_prop_ro("n_steps", &prepack::step_schedule::n_steps)
      .def_prop_ro("n_items", &prepack::step_schedule::n_items)
      .def_prop_ro("n_chunked", &prepack::step_schedule::n_chunked,
                   "Items split into more than one chunk.")
      .def_prop_ro("total_tokens", &prepack::step_schedule::total_tokens)
      .def_prop_ro("lower_bound", &prepack::step_schedule::lower_bound,
                   "ceil(total tokens / budget): the fewest steps any schedule can use.")
      .def_prop_ro(
          "finish_step",
          [](nb::handle s) {
            return view(nb::cast<const prepack::step_schedule&>(s).finish_step, s);
          },
          "[n_items] int64: the step of each item's last chunk.")
      .def_prop_ro(
          "step_begin",
          [](nb::handle s) {
            return view(nb::cast<const prepack::step_schedule&>(s).step_begin, s);
          },
          "[n_steps + 1] int64: step s holds chunks[step_begin[s]:step_begin[s + 1]].")
      .def(
          "step_tokens",
          [](const prepack::step_schedule& s, count st_in) {
            const std::size_t st = st_in("step");
            prepack::detail::require(st < s.n_steps(), "step ", st, " outside the schedule's ",
                                     s.n_steps(), " steps");
            return s.step_tokens(st);
          },
          "step"_a)
      .def(
          "chunks",
          [](const prepack::step_schedule& s, std::optional<std::size_t> step) {
            if (!step) return chunk_arrays(s, 0, s.n_steps());
            prepack::detail::require(*step < s.n_steps(), "step ", *step,
                                     " outside the schedule's ", s.n_steps(), " steps");
            return chunk_arrays(s, *step, *step + 1);
          },
          "step"_a = nb::none(),
          "The chunks of one step (or of all, in step order) as arrays [n_chunks]: step, item, "
          "start (first token within the item), length, context (tokens cached before it) "
          "int64, and last (bool: it completes the item).")
      .def(
          "check",
          [](const prepack::step_schedule& s, count bs_in) {
            const std::size_t bs = bs_in("block_size");
            prepack::check_schedule(s, bs);
          },
          "block_size"_a = 0,
          "Checks the schedule's invariants (prepack::check_schedule); ValueError naming the "
          "first violation.")
      .def("__repr__", [](const prepack::step_schedule& s) {
        return "Schedule(" + std::to_string(s.n_items()) + " items in " +
               std::to_string(s.n_steps()) + " steps of at most " + std::to_string(s.budget) +
               " tokens)";
      });

  m.def(
      "budgeted_schedule",
      [](array_like lengths, count budget_in, const std::string& policy, const std::string& order,
         count block_size_in, optional_array_like contexts) {
        const std::size_t budget = budget_in("budget");
        const std::size_t block_size = block_size_in("block_size");
        const int_array<std::int64_t> len(lengths, "lengths");
        const auto opts = budget_opts(budget, policy, order, block_size);
        if (contexts.is_none()) return prepack::budgeted_schedule(len.span(), opts);
        const int_array<std::int64_t> ctx(contexts, "contexts");
        prepack::detail::require(ctx.size() == len.size(), "contexts: ", ctx.size(), " for ",
                                 len.size(), " prompts");
        std::vector<prepack::schedule_item> items(len.size());
        for (std::size_t i = 0; i < items.size(); ++i) {
          prepack::detail::require(len.data()[i] >= 0, "prompt ", i, ": length ", len.data()[i]);
          prepack::detail::require(ctx.data()[i] >= 0, "prompt ", i, ": context ", ctx.data()[i]);
          items[i].length = static_cast<std::size_t>(len.data()[i]);
          items[i].context = static_cast<std::size_t>(ctx.data()[i]);
          items[i].prompt = i;
        }
        return prepack::budgeted_schedule(prepack::span<const prepack::schedule_item>(items), opts);
      },
      "lengths"_a, "budget"_a = 2048, "policy"_a = "whole_first", "order"_a = "arrival",
      "block_size"_a = 0, "contexts"_a = nb::none(),
      "Schedules whole prompts of the given lengths into steps of at most `budget` tokens "
      "(prepack::budgeted_schedule): contexts, when given, the tokens each prompt continues "
      "(already cached: a prefix-cache hit); policy 'whole_first' (first-fit-decreasing, chunking "
      "only "
      "what exceeds the budget) or 'fill' (every step filled; order 'arrival', "
      "'shortest_first' or 'longest_first'); block_size > 0 makes every chunk but a prompt's "
      "last a whole number of blocks. O((n + chunks) log steps). ValueError for a length <= 0, "
      "budget 0, or block_size above the budget.");

  using prepack::prefix_plan;
  nb::class_<prefix_plan>(
      m, "PrefixPlan",
      "A batch's shared prefixes, each prefilled once (prepack::prefix_plan): the schedule "
      "items (prefixes first, then every prompt's rest after its deepest prefix).")
      .def_ro("block_size", &prefix_plan::block_size)
      .def_prop_ro("n_prompts", &prefix_plan::n_prompts)
      .def("__repr__",
           [](const prefix_plan& p) {
             return "PrefixPlan(" + std::to_string(p.n_prompts()) + " prompts, " +
                    std::to_string(p.n_prefixes()) + " shared prefixes, " +
                    std::to_string(p.tokens_computed()) + " of " +
                    std::to_string(p.useful_tokens()) + " tokens computed)";
           })
      .def_prop_ro("n_prefixes", &prefix_plan::n_prefixes)
      .def_prop_ro("n_items", [](const prefix_plan& p) { return p.items.size(); })
      .def_prop_ro("tokens_computed", &prefix_plan::tokens_computed,
                   "Tokens a prefill with this plan computes (each prefix once).")
      .def_prop_ro("useful_tokens", &prefix_plan::useful_tokens)
      .def_prop_ro(
          "items",
          [](const prefix_plan& p) {
            std::vector<std::int64_t> length, context, after, prompt;
            std::vector<std::uint8_t> ends;
            for (const auto& it : p.items) {
              length.push_back(static_cast<std::int64_t>(it.length));
              context.push_back(static_cast<std::int64_t>(it.context));
              after.push_back(it.after ? static_cast<std::int64_t>(*it.after) : -1);
              prompt.push_back(it.prompt ? static_cast<std::int64_t>(*it.prompt) : -1);
              ends.push_back(it.ends_prompt ? 1 : 0);
            }
            nb::dict d;
            d["length"] = to_numpy(std::move(length));
            d["context"] = to_numpy(std::move(context));
            d["after"] = to_numpy(std::move(after));
            d["prompt"] = to_numpy(std::move(prompt));
            d["ends_prompt"] = to_numpy_bool(std::move(ends));
            return d;
          },
          "The schedule items as arrays [n_items]: length, context (tokens cached before it), "
          "after (the item it runs after, -1: none), prompt (whose own tokens it holds, -1: a "
          "shared prefix) int64, ends_prompt bool.")
      .def_prop_ro(
          "prefixes",
          [](const prefix_plan& p) {
            nb::list out;
            for (const auto& x : p.prefixes) {
              nb::dict d;
              d["start"] = x.start;
              d["length"] = x.length;
              d["parent"] = x.parent ? nb::cast(*x.parent) : nb::none();
              d["sharers"] =
                  to_numpy(std::vector<std::int64_t>(x.sharers.begin(), x.sharers.end()));
              out.append(d);
            }
            return out;
          },
          "Each prefix: start, length, parent (or None), sharers (int64 prompt ids).")
      .def_prop_ro(
          "prompt_last_item",
          [](nb::handle s) { return view(nb::cast<const prefix_plan&>(s).prompt_last_item, s); },
          "[n_prompts] int64: the item whose last token ends prompt i (its logits row).")
      .def(
          "schedule",
          [](const prefix_plan& p, count budget_in, const std::string& policy,
             const std::string& order, count block_size_in) {
            const std::size_t budget = budget_in("budget");
            const std::size_t block_size = block_size_in("block_size");
            return prepack::budgeted_schedule(prepack::span<const prepack::schedule_item>(p.items),
                                              budget_opts(budget, policy, order, block_size));
          },
          "budget"_a = 2048, "policy"_a = "whole_first", "order"_a = "arrival", "block_size"_a = 0,
          "The plan's items as a budgeted schedule (as budgeted_schedule).")
      .def(
          "item_tokens",
          [](const prefix_plan& p, prompts_like prompts_obj) {
            prompts storage;
            const prompts& ps = as_prompts(prompts_obj, storage);
            prepack::detail::require(ps.tokens.size() == p.n_prompts(),
                                     "prompts: ", ps.tokens.size(), " for a plan of ",
                                     p.n_prompts());
            return prompts{p.item_tokens(ps.tokens)};
          },
          "prompts"_a, "Each item's tokens (Prompts), from the prompts the plan was made of.")
      .def(
          "item_ids",
          [](const prefix_plan& p, array_like prompt_ids, optional_array_like prefix_ids) {
            const auto a = int_array<std::int64_t>(prompt_ids, "prompt_ids").vector();
            const auto b = optional_ints<std::int64_t>(prefix_ids, "prefix_ids");
            return to_numpy(p.item_ids(a, b));
          },
          "prompt_ids"_a, "prefix_ids"_a = nb::none(),
          "Each item's caller id [n_items] int64: a prompt's item prompt_ids[prompt], prefix k "
          "prefix_ids[k] (default -1 - k).")
      .def(
          "allocate_tables",
          [](const prefix_plan& p, prepack::block_allocator& alloc, count extra_in) {
            const std::size_t extra = extra_in("extra");
            auto t = prepack::allocate_prefix_tables(p, alloc, extra);
            return std::make_pair(std::move(t.items), std::move(t.prompts));
          },
          "allocator"_a, "extra"_a = 0,
          "Blocks for the plan: (item tables, prompt tables), each a BlockTables; prefix blocks "
          "shared by their sharers' prompt rows, `extra` more blocks per prompt for decoding. "
          "ValueError, allocating nothing, when the pool is too small.")
      .def(
          "check_tables",
          [](const prefix_plan& p, const prepack::block_tables& t) {
            prepack::check_prefix_tables(p, t);
          },
          "item_tables"_a,
          "Checks that item tables run the plan safely (only prefix blocks shared).");

  m.def(
      "prefix_plan",
      [](prompts_like prompts_obj, count block_size_in, count min_length_in,
         count overhead_tokens_in) {
        const std::size_t block_size = block_size_in("block_size");
        const std::size_t min_length = min_length_in("min_length");
        const std::size_t overhead_tokens = overhead_tokens_in("overhead_tokens");
        prompts storage;
        const prompts& ps = as_prompts(prompts_obj, storage);
        return prepack::make_prefix_plan(ps.tokens, {block_size, min_length, overhead_tokens});
      },
      "prompts"_a, "block_size"_a = 16, "min_length"_a = 16, "overhead_tokens"_a = 16,
      "Finds the batch's shared prefixes and plans them (prepack::make_prefix_plan): splits "
      "aligned to block_size, a prefix chosen when it saves more than overhead_tokens. "
      "O(total tokens). ValueError for an empty prompt or a block size of 0.");

  nb::class_<prepack::block_tables>(
      m, "BlockTables",
      "Block tables of several sequences as kernels take them: [n_seqs, max_blocks] int32, "
      "-1 past a sequence's blocks (prepack::block_tables).")
      .def(
          "__init__",
          [](prepack::block_tables* self, array_like table, count block_size_in) {
            const std::size_t block_size = block_size_in("block_size");
            new (self) prepack::block_tables(tables_from_array(table, block_size));
          },
          "table"_a, "block_size"_a,
          "table: [n_seqs, max_blocks] integers, -1 (any negative) past each sequence's blocks.")
      .def_static(
          "from_lists",
          [](nb::handle rows, count block_size_in) {
            const std::size_t block_size = block_size_in("block_size");
            return prepack::make_block_tables(int32_lists(rows, "sequence"), block_size);
          },
          "rows"_a, "block_size"_a,
          "From one list of block ids per sequence. ValueError for a negative id or block size "
          "0.")
      .def_ro("block_size", &prepack::block_tables::block_size)
      .def_ro("max_blocks", &prepack::block_tables::max_blocks)
      .def("__repr__",
           [](const prepack::block_tables& t) {
             return "BlockTables(" + std::to_string(t.n_seqs()) + " sequences, up to " +
                    std::to_string(t.max_blocks) + " blocks of " + std::to_string(t.block_size) +
                    ")";
           })
      .def_prop_ro("n_seqs", &prepack::block_tables::n_seqs)
      .def_prop_ro(
          "table",
          [](nb::handle s) {
            const auto& t = nb::cast<const prepack::block_tables&>(s);
            return view(t.table.data(), {t.n_seqs(), t.max_blocks}, s);
          },
          "[n_seqs, max_blocks] int32, -1 past each sequence's blocks.")
      .def(
          "blocks",
          [](const prepack::block_tables& t, count s_in) {
            const std::size_t s = s_in("seq");
            prepack::detail::require(s < t.n_seqs(), "block tables: sequence ", s, " outside ",
                                     t.n_seqs());
            const auto b = t.blocks(s);
            return to_numpy(std::vector<std::int32_t>(b.begin(), b.end()));
          },
          "seq"_a, "Sequence s's blocks up to its padding, int32.");

  nb::class_<prepack::block_allocator>(
      m, "BlockAllocator",
      "Blocks 0 .. n_blocks - 1 of a pool, handed out lowest first, reference counted "
      "(prepack::block_allocator). O(log blocks) per block.")
      .def(
          "__init__",
          [](prepack::block_allocator* self, count n_blocks, bool null_block) {
            new (self) prepack::block_allocator(n_blocks("n_blocks"), null_block);
          },
          "n_blocks"_a, "null_block"_a = false,
          "null_block: block 0 is never handed out (vLLM's null block, SGLang's padding "
          "location); set it for those engines' forms.")
      .def_prop_ro("null_block", &prepack::block_allocator::null_block)
      .def_prop_ro("n_blocks", &prepack::block_allocator::n_blocks)
      .def("__repr__",
           [](const prepack::block_allocator& a) {
             return "BlockAllocator(" + std::to_string(a.n_blocks()) + " blocks, " +
                    std::to_string(a.n_free()) + " free" +
                    (a.null_block() ? ", null block 0" : "") + ")";
           })
      .def_prop_ro("n_free", &prepack::block_allocator::n_free)
      .def_prop_ro("n_used", &prepack::block_allocator::n_used)
      .def("refs", &prepack::block_allocator::refs, "block"_a)
      .def(
          "allocate",
          [](prepack::block_allocator& a, count n_in) {
            const std::size_t n = n_in("n");
            return to_numpy(a.allocate(n));
          },
          "n"_a,
          "n free blocks, lowest first, as int32. ValueError, allocating nothing, when fewer "
          "are free.")
      .def("share", &prepack::block_allocator::share, "block"_a)
      .def("release", &prepack::block_allocator::release, "block"_a)
      .def(
          "release_tables",
          [](prepack::block_allocator& a, const prepack::block_tables& t) {
            prepack::release_blocks(a, t);
          },
          "tables"_a, "Releases one reference to every block each row lists.");

  nb::class_<step_inputs_box>(
      m, "StepInputs",
      "One forward pass over a paged KV pool, prepack's engine-neutral form "
      "(prepack::step_inputs): per sequence and per token arrays (read-only views). Every "
      "engine's own form is built from it (prepack.vllm, .flashinfer, .sglang, .trtllm).")
      .def_prop_ro("n_seqs", [](const step_inputs_box& b) { return b.in.n_seqs(); })
      .def_prop_ro("n_tokens", [](const step_inputs_box& b) { return b.in.n_tokens(); })
      .def_prop_ro("n_blocks", [](const step_inputs_box& b) { return b.in.n_blocks; })
      .def_prop_ro("block_size", [](const step_inputs_box& b) { return b.in.tables.block_size; })
      .def_prop_ro("max_seqlen_q", [](const step_inputs_box& b) { return b.in.max_seqlen_q; })
      .def_prop_ro("max_seqlen_k", [](const step_inputs_box& b) { return b.in.max_seqlen_k; })
      .PP_STEP_ARRAY(seq_item, "[n_seqs] int64: the schedule item of each sequence.")
      .PP_STEP_ARRAY(seq_id, "[n_seqs] int64: the caller's id of each sequence.")
      .PP_STEP_ARRAY(context_lens, "[n_seqs] int32: tokens already cached.")
      .PP_STEP_ARRAY(query_lens, "[n_seqs] int32: tokens computed in this step.")
      .PP_STEP_ARRAY(seq_lens, "[n_seqs] int32: context + query (vLLM's seq_lens).")
      .PP_STEP_ARRAY(cu_seqlens_q, "[n_seqs + 1] int32: prefix sums of query_lens.")
      .PP_STEP_ARRAY(cu_seqlens_k, "[n_seqs + 1] int32: prefix sums of seq_lens.")
      .PP_STEP_ARRAY(completes, "[n_seqs] uint8: 1 if the chunk ends a prompt (logits wanted).")
      .PP_STEP_ARRAY(decodes, "[n_seqs] uint8: 1 if it feeds back a generated token.")
      .PP_STEP_ARRAY(prompt_lens, "[n_seqs] int32: positions of the prompt it computes.")
      .PP_STEP_ARRAY(tokens, "[n_tokens] int32: token ids.")
      .PP_STEP_ARRAY(positions, "[n_tokens] int32: context_len + i within a sequence.")
      .PP_STEP_ARRAY(token_seq_id, "[n_tokens] int64: the sequence's seq_id.")
      .PP_STEP_ARRAY(logits,
                     "[n_tokens] int8: 1 on the last token of a sequence that completes "
                     "a prompt.")
      .PP_STEP_ARRAY(slot_mapping,
                     "[n_tokens] int64: pool slot (block * block_size + position "
                     "% block_size).")
      .def_prop_ro(
          "block_table",
          [](nb::handle s) {
            const auto& t = nb::cast<const step_inputs_box&>(s).in.tables;
            return view(t.table.data(), {t.n_seqs(), t.max_blocks}, s);
          },
          "[n_seqs, max_blocks] int32: the sequences' blocks, -1 past each one's.")
      .def(
          "as_dict", [](const step_inputs_box& b) { return step_dict(b.in); },
          "Every field as a dict of new arrays (prepack's names).")
      .def("__repr__", [](const step_inputs_box& b) {
        return "StepInputs(" + std::to_string(b.in.n_seqs()) + " sequences, " +
               std::to_string(b.in.n_tokens()) + " tokens)";
      });

  m.def(
      "step_inputs",
      [](const prepack::step_schedule& sched, count step_in, prompts_like item_tokens,
         const prepack::block_tables& tables, count n_blocks_in, optional_array_like seq_ids,
         bool writes_before_reads) {
        const std::size_t step = step_in("step");
        const std::size_t n_blocks = n_blocks_in("n_blocks");
        prompts storage;
        const prompts& toks = as_prompts(item_tokens, storage);
        prepack::step_options opt;
        opt.writes_before_reads = writes_before_reads;
        std::vector<std::int64_t> ids;
        if (!seq_ids.is_none()) {
          ids = int_array<std::int64_t>(seq_ids, "seq_ids").vector();
          opt.seq_ids = ids;
        }
        return step_inputs_box{prepack::make_step_inputs<std::int32_t, std::int32_t>(
            sched, step, toks.tokens, tables, n_blocks, opt)};
      },
      "schedule"_a, "step"_a, "item_tokens"_a, "tables"_a, "n_blocks"_a, "seq_ids"_a = nb::none(),
      "writes_before_reads"_a = false,
      "The inputs of one step of a schedule (prepack::make_step_inputs): item_tokens holds "
      "each item's tokens (Prompts, or a list), tables each item's blocks in a pool of n_blocks "
      "blocks of tables.block_size. O(step tokens + blocks it touches). ValueError naming the "
      "prompt and value for a step out of range, tokens that differ from the schedule, a table "
      "too short or outside the pool, or blocks used unsafely (writes_before_reads: a sequence "
      "may read a block another writes in this step, as on engines that write a layer's K and V "
      "before attention reads them: vLLM, FlashInfer, SGLang).");

  m.def(
      "decode_inputs",
      [](array_like ids, array_like tokens, array_like contexts, const prepack::block_tables& t,
         count n_blocks_in, optional_array_like prompt_lens) {
        const std::size_t n_blocks = n_blocks_in("n_blocks");
        const auto id = int_array<std::int64_t>(ids, "ids").vector();
        const auto tok = int_array<std::int32_t>(tokens, "tokens").vector();
        const auto ctx = int_array<std::int64_t>(contexts, "contexts").vector();
        const auto pl = optional_ints<std::int64_t>(prompt_lens, "prompt_lens");
        const std::size_t n = id.size();
        prepack::detail::require(
            tok.size() == n && ctx.size() == n && t.n_seqs() >= n && (pl.empty() || pl.size() == n),
            "decode inputs: ", n, " ids, ", tok.size(), " tokens, ", ctx.size(), " contexts, ",
            t.n_seqs(), " table rows, ", pl.size(), " prompt lengths");
        std::vector<prepack::decode_sequence<std::int32_t>> seqs(n);
        for (std::size_t q = 0; q < n; ++q) {
          prepack::detail::require(ctx[q] >= 0, "sequence ", id[q], ": context ", ctx[q]);
          seqs[q] = {id[q], tok[q], static_cast<std::size_t>(ctx[q]), t.blocks(q),
                     pl.empty() ? 0 : static_cast<std::size_t>(pl[q])};
        }
        return step_inputs_box{
            prepack::make_decode_inputs<std::int32_t, std::int32_t>(seqs, t.block_size, n_blocks)};
      },
      "ids"_a, "tokens"_a, "contexts"_a, "tables"_a, "n_blocks"_a, "prompt_lens"_a = nb::none(),
      "A decode step (prepack::make_decode_inputs): sequence q feeds back tokens[q] at "
      "position contexts[q] over its blocks tables.blocks(q). O(sequences + blocks).");

  m.def(
      "sequence_inputs",
      [](array_like ids, prompts_like tokens, array_like contexts, const prepack::block_tables& t,
         count n_blocks_in, optional_array_like prompt_lens, optional_array_like completes,
         optional_array_like decodes, bool writes_before_reads) {
        const std::size_t n_blocks = n_blocks_in("n_blocks");
        const auto id = int_array<std::int64_t>(ids, "ids").vector();
        prompts storage;
        const prompts& toks = as_prompts(tokens, storage);
        const auto ctx = int_array<std::int64_t>(contexts, "contexts").vector();
        const auto pl = optional_ints<std::int64_t>(prompt_lens, "prompt_lens");
        const auto done = optional_ints<std::int64_t>(completes, "completes");
        const auto dec = optional_ints<std::int64_t>(decodes, "decodes");
        const std::size_t n = id.size();
        prepack::detail::require(
            toks.tokens.size() == n && ctx.size() == n && t.n_seqs() >= n &&
                (pl.empty() || pl.size() == n) && (done.empty() || done.size() == n) &&
                (dec.empty() || dec.size() == n),
            "sequence inputs: ", n, " ids, ", toks.tokens.size(), " token lists, ", ctx.size(),
            " contexts, ", t.n_seqs(), " table rows, ", pl.size(), " prompt lengths, ", done.size(),
            " completes, ", dec.size(), " decodes");
        std::vector<prepack::scheduled_sequence<std::int32_t>> seqs(n);
        for (std::size_t q = 0; q < n; ++q) {
          prepack::detail::require(ctx[q] >= 0, "sequence ", id[q], ": context ", ctx[q]);
          prepack::detail::require(pl.empty() || pl[q] >= 0, "sequence ", id[q], ": prompt length ",
                                   pl.empty() ? 0 : pl[q]);
          const auto c = static_cast<std::size_t>(ctx[q]);
          const std::size_t end = c + toks.tokens[q].size();  // both far below 2^63
          const std::size_t prompt = pl.empty() ? end : static_cast<std::size_t>(pl[q]);
          seqs[q] = {id[q],
                     c,
                     prepack::span<const std::int32_t>(toks.tokens[q]),
                     t.blocks(q),
                     prompt,
                     done.empty() ? end >= prompt : done[q] != 0,
                     dec.empty() ? c >= prompt : dec[q] != 0};
        }
        return step_inputs_box{prepack::make_sequence_inputs<std::int32_t, std::int32_t>(
            prepack::span<const prepack::scheduled_sequence<std::int32_t>>(seqs), t.block_size,
            n_blocks, writes_before_reads)};
      },
      "ids"_a, "tokens"_a, "contexts"_a, "tables"_a, "n_blocks"_a, "prompt_lens"_a = nb::none(),
      "completes"_a = nb::none(), "decodes"_a = nb::none(), "writes_before_reads"_a = false,
      "A step an engine's own scheduler decided (prepack::make_sequence_inputs), in its order: "
      "sequence q (id ids[q]) computes tokens[q] at positions contexts[q] on, over its blocks "
      "tables.blocks(q). prompt_lens: each prompt's tokens (default: context + tokens); "
      "completes: its logits are wanted (default: it reaches its prompt's end); decodes: it "
      "feeds back a generated token (default: context >= prompt length). ValueError naming the "
      "sequence and value as step_inputs. O(step tokens + blocks it touches).");

  m.def(
      "step_layout",
      [](const prepack::step_schedule& sched, count step_in, prompts_like item_tokens,
         const prepack::block_tables& tables, count n_blocks_in, std::optional<std::size_t> cap) {
        const std::size_t step = step_in("step");
        const std::size_t n_blocks = n_blocks_in("n_blocks");
        prompts storage;
        const prompts& toks = as_prompts(item_tokens, storage);
        auto sl = prepack::make_step_layout<std::int64_t, std::int64_t>(sched, step, toks.tokens,
                                                                        tables, n_blocks, cap);
        nb::dict d;
        d["batch"] = packed_batch{std::move(sl.layout)};
        d["seq_item"] = to_numpy(std::move(sl.seq_item));
        d["tables"] = std::move(sl.tables);
        d["slot_mapping"] =
            to_numpy(std::vector<std::int64_t>(sl.slots.slots().begin(), sl.slots.slots().end()));
        return d;
      },
      "schedule"_a, "step"_a, "item_tokens"_a, "tables"_a, "n_blocks"_a, "capacity"_a = nb::none(),
      "A step laid out as rows (prepack::make_step_layout): batch (a PackedBatch, positions "
      "from each chunk's context), seq_item, tables (BlockTables) and slot_mapping "
      "[n_rows * width] int64 (-1 on pad slots).");
}

}  // namespace pp
