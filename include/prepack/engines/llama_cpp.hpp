// prepack/engines/llama_cpp.hpp - steps of a schedule in llama.cpp's own form (llama.cpp of 2026,
// with KV streams): the arrays of a llama_batch (include/llama.h, struct llama_batch; laid out as
// llama_batch_init(n_tokens, 0, 1) allocates them) that llama_decode accepts, by the rules
// llama_batch_allocr::init checks (src/llama-batch.cpp): every token id below the vocabulary,
// every seq_id in [0, n_seq_max), and each sequence's positions consecutive, starting right
// after what the KV cache holds for it; and llama_decode refuses an empty batch.
//
// No block table and no block count: llama.cpp manages its own KV cells by sequence id. Shared
// prefixes run as llama.cpp runs them: a prefix is computed once, under the sequence id of its
// first sharer, and right after the step that ends it every other sharer gets the whole of that
// sequence by llama_memory_seq_cp(mem, src, dst, -1, -1), before it computes anything of its
// own. The copy is whole because llama.cpp's default context keeps one KV stream per sequence
// (llama_context_params.kv_unified = false), and a copy across streams copies the stream
// (llama_kv_cache::seq_cp: GGML_ASSERT(is_full && "seq_cp() is only supported for full KV
// buffers")); with kv_unified = true the same call shares the cells without copying them. At
// that moment the source holds exactly the prefix (its own tokens run in later steps), so both
// give each sharer the prefix's positions and nothing more. The context needs n_seq_max above
// every sequence id used (at most LLAMA_MAX_SEQ, 256); no token carries more than one id.
//
//  token     [n_tokens] int32   llama_token
//  pos       [n_tokens] int32   llama_pos
//  n_seq_id  [n_tokens] int32   1 for every token
//  seq_id    [n_tokens] int32   seq_id[i][0]
//  logits    [n_tokens] int8    1 on the last token of an item that ends a prompt
// Cost: O(step tokens) per batch, O(sharers) per prefix's copies. Standard library only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../detail/checked.hpp"
#include "../error.hpp"
#include "../prefix.hpp"
#include "../schedule.hpp"
#include "../span.hpp"
#include "../step.hpp"

PREPACK_NAMESPACE_BEGIN
namespace llama_cpp {

/// llama.cpp's LLAMA_MAX_SEQ: the most sequence ids a context can have.
constexpr std::int32_t max_seq = 256;

/// The arrays of one llama_batch.
struct batch {
  std::vector<std::int32_t> token;       // [n_tokens]
  std::vector<std::int32_t> pos;         // [n_tokens]
  std::vector<std::int32_t> n_seq_id;    // [n_tokens]  1
  std::vector<std::int32_t> seq_id;      // [n_tokens]  the token's one sequence id
  std::vector<std::int8_t> logits;       // [n_tokens]
  std::vector<std::size_t> output_item;  // [outputs]  the item whose logits each output row is

  std::int32_t n_tokens() const noexcept { return static_cast<std::int32_t>(token.size()); }

  /// Writes the batch into a llama_batch from llama_batch_init(n, 0, 1) with n >= n_tokens():
  /// any struct with llama_batch's members (n_tokens, token, pos, n_seq_id, seq_id, logits).
  template <class LlamaBatch>
  void fill(LlamaBatch& b) const {
    b.n_tokens = n_tokens();
    for (std::size_t i = 0; i < token.size(); ++i) {
      b.token[i] = token[i];
      b.pos[i] = pos[i];
      b.n_seq_id[i] = n_seq_id[i];
      b.seq_id[i][0] = seq_id[i];
      b.logits[i] = logits[i];
    }
  }
};

/// llama_memory_seq_cp(mem, src, dst, p0, p1): dst gets src's cells at positions [p0, p1); -1,
/// -1 (what make_prefix_steps emits): all of them, the only copy llama.cpp makes across KV
/// streams.
struct seq_copy {
  std::int32_t src = 0, dst = 0;
  std::int32_t p0 = -1, p1 = -1;
};

/// One step: decode `batch`, then make the copies.
struct step {
  llama_cpp::batch batch;
  std::vector<seq_copy> copies_after;
};

namespace detail {
inline std::int32_t checked_seq_id(std::int64_t id, std::int32_t n_seq_max,
                                   const std::string& who) {
  if (id < 0 || id >= n_seq_max) {
    prepack::detail::fail(who, ": seq_id ", id, " outside llama.cpp's 0..", n_seq_max - 1,
                          " (n_seq_max ", n_seq_max, ")");
  }
  return static_cast<std::int32_t>(id);
}
}  // namespace detail

/// Step s of a schedule as a llama_batch: item i's tokens are item_tokens[i], its sequence id
/// item_seq_ids[i]. Throws prepack::error naming the item for an id outside [0, n_seq_max), a
/// token or position that does not fit int32, or what make_step_inputs refuses of the step.
template <class T>
batch make_batch(const step_schedule& sched, std::size_t s,
                 const std::vector<std::vector<T>>& item_tokens,
                 span<const std::int64_t> item_seq_ids, std::int32_t n_seq_max = max_seq) {
  using prepack::detail::narrow;
  prepack::detail::check_step(sched, s, item_tokens);
  prepack::detail::require(item_seq_ids.size() == sched.n_items(),
                           "llama.cpp: ", item_seq_ids.size(), " sequence ids for ",
                           sched.n_items(), " items");
  prepack::detail::require(n_seq_max > 0 && n_seq_max <= max_seq, "llama.cpp: n_seq_max ",
                           n_seq_max, " outside 1..", max_seq);
  prepack::detail::require(!sched.step(s).empty(), "llama.cpp: step ", s,
                           " has no tokens (llama_decode refuses an empty batch)");
  batch b;
  for (const chunk& c : sched.step(s)) {
    const schedule_item& it = sched.items[c.item];
    const std::int32_t id =
        detail::checked_seq_id(item_seq_ids[c.item], n_seq_max, item_name(it, c.item));
    const bool wanted = c.last && it.ends_prompt;
    for (std::size_t t = 0; t < c.length; ++t) {
      b.token.push_back(narrow<std::int32_t>(item_tokens[c.item][c.start + t], "token", "token"));
      b.pos.push_back(narrow<std::int32_t>(c.context + t, "position"));
      b.n_seq_id.push_back(1);
      b.seq_id.push_back(id);
      b.logits.push_back(wanted && t + 1 == c.length ? 1 : 0);
    }
    if (wanted) b.output_item.push_back(c.item);
  }
  return b;
}

/// Every step of a prefix plan's schedule, as llama.cpp runs shared prefixes: prefix k under
/// the sequence id of its first sharer, each prompt's own item under the prompt's id
/// (prompt_seq_ids[i]), and after the step that ends prefix k one whole-sequence copy
/// (p0 = p1 = -1) from that sharer to each other sharer. Throws as make_batch does, and for a
/// schedule that is not of the plan's items.
template <class T>
std::vector<step> make_prefix_steps(const prefix_plan& plan, const step_schedule& sched,
                                    const std::vector<std::vector<T>>& prompts,
                                    span<const std::int64_t> prompt_seq_ids,
                                    std::int32_t n_seq_max = max_seq) {
  prepack::detail::require(sched.n_items() == plan.items.size(), "llama.cpp: the schedule has ",
                           sched.n_items(), " items, the prefix plan ", plan.items.size());
  prepack::detail::require(prompt_seq_ids.size() == plan.n_prompts(),
                           "llama.cpp: ", prompt_seq_ids.size(), " sequence ids for ",
                           plan.n_prompts(), " prompts");
  std::vector<std::int64_t> prefix_owner(plan.n_prefixes());
  for (std::size_t k = 0; k < plan.n_prefixes(); ++k) {
    prefix_owner[k] = prompt_seq_ids[plan.prefixes[k].sharers.front()];
  }
  const std::vector<std::int64_t> ids = plan.item_ids(prompt_seq_ids, prefix_owner);
  const auto item_tokens = plan.item_tokens(prompts);
  std::vector<step> out(sched.n_steps());
  for (std::size_t s = 0; s < sched.n_steps(); ++s) {
    out[s].batch = make_batch(sched, s, item_tokens, span<const std::int64_t>(ids), n_seq_max);
  }
  for (std::size_t k = 0; k < plan.n_prefixes(); ++k) {
    const auto& p = plan.prefixes[k];
    const auto src =
        detail::checked_seq_id(prefix_owner[k], n_seq_max, "prefix " + std::to_string(k));
    for (std::size_t j = 1; j < p.sharers.size(); ++j) {
      const auto dst = detail::checked_seq_id(prompt_seq_ids[p.sharers[j]], n_seq_max,
                                              "prompt " + std::to_string(p.sharers[j]));
      out[sched.finish_step[k]].copies_after.push_back({src, dst, -1, -1});
    }
  }
  return out;
}

}  // namespace llama_cpp
PREPACK_NAMESPACE_END
