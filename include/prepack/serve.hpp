// prepack/serve.hpp - a serving loop's scheduler: continuous batching of a live request stream
// over a paged KV pool, decode and prefill in one step, and a prefix cache across requests.
//
//   scheduler s({budget, max_seqs, n_blocks, block_size, ...});
//   s.add({id, prompt, max_new_tokens});          // whenever a request arrives
//   while (!s.idle()) {
//     scheduled_step st = s.next_step();          // decodes first, then prefill chunks
//     engine.forward(st.inputs);                  // step_inputs, or any form of engines/
//     s.commit(sampled);                          // one token per sequence that samples
//   }
//
// Each step holds one decode token per running sequence (rotating when the budget or the cap on
// sequences cannot take them all), then prefill chunks of admitted and waiting requests in the
// room left, by the admission policy:
//
//  fcfs            vLLM's default: requests in arrival order, the head's prompt chunked into
//                  whatever room is left; a head that cannot get its blocks waits, and so does
//                  every request behind it. Fair and predictable; a long prompt delays the short
//                  ones behind it.
//  packed          prepacking for a stream: whole prompts first, the longest that fits the room
//                  left, again and again (first-fit-decreasing into the step), then the oldest
//                  waiting request chunked into what remains, so a prompt is chunked only when
//                  it cannot fit. Fewer chunks and fuller steps; requests that waited
//                  max_wait_steps are admitted first, in arrival order, so none starves.
//  shortest_first  whole prompts, the shortest first (the best time to first token on average),
//                  then as packed; the same aging bound.
//
// A request is admitted when the blocks of every token it knows (after its longest cached
// prefix) plus `reserve_blocks` can be had (the reserve is waived when nothing else runs, so a
// request that fits the pool always runs); a decode that cannot get a block preempts the newest
// running request that is not in this step (or itself), which frees its blocks and is recomputed
// later from its prompt and the tokens it generated. A request that could never fit (prompt and
// new tokens beyond the pool) is refused when added, with its id and sizes.
//
// Prefix cache (block_pool): a full block stays cached after its last user, keyed by its tokens
// and the cached block before it (so by everything before it), reference counted, evicted least
// recently used among the unreferenced blocks no cached block follows. A new request starts
// after its longest cached block-aligned prefix (at least its last token is computed, for its
// logits); shared blocks are full and never written again.
//
// Deterministic for the same calls. Cost per step: O(step tokens + blocks the step touches +
// log(waiting requests)) (each admission O(log waiting); a preemption O(its blocks)); commit
// O(step tokens + blocks filled). Standard library only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <list>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "detail/checked.hpp"
#include "error.hpp"
#include "paged.hpp"
#include "span.hpp"
#include "step.hpp"

PREPACK_NAMESPACE_BEGIN

/// A serving pool's blocks: reference counts and the null block as block_allocator
/// (paged.hpp) keeps them, handed out lowest-numbered first, and (with caching) full blocks
/// kept after their last reference as a content-keyed prefix cache.
///
/// The cache is a forest: a cached block is keyed by its tokens and the cached block before it
/// (its parent), so by everything before it. Every unreferenced ("idle") cached block can be
/// reclaimed: least recently used leaves first, then, when only blocks that others follow are
/// idle, the least recently used of those, whose cached descendants leave the cache with it (a
/// key naming a block that now holds other content would match the wrong prefix): idle ones are
/// freed, referenced ones stay with their holders as private blocks. A serving loop that holds
/// every block of a sequence (prepack::scheduler) never meets that case; an engine that holds a
/// block without its prefix can.
class block_pool {
 public:
  /// With null_block, block 0 is never handed out (vLLM's null block, SGLang's padding
  /// location: see block_allocator). Throws prepack::error for no blocks (none but the null
  /// block), a block size of 0, or more blocks than int32 ids.
  block_pool(std::size_t n_blocks, std::size_t block_size, bool caching, bool null_block = false)
      : blocks_(checked_size(n_blocks, block_size, null_block), null_block),
        block_size_(block_size),
        caching_(caching) {}

  std::size_t n_blocks() const noexcept { return blocks_.n_blocks(); }
  std::size_t block_size() const noexcept { return block_size_; }
  bool caching() const noexcept { return caching_; }
  bool null_block() const noexcept { return blocks_.null_block(); }
  /// Blocks requests can ever hold: every block but the null block.
  std::size_t usable() const noexcept { return n_blocks() - (null_block() ? 1 : 0); }
  /// Blocks that hold nothing.
  std::size_t free() const noexcept { return blocks_.n_free(); }
  /// Blocks held in the cache only (unreferenced): each can be reclaimed by allocate().
  std::size_t cached_unreferenced() const noexcept { return leaves_.size() + inner_.size(); }
  /// Blocks a request could get now: free, or reclaimed from the cache. allocate() succeeds
  /// exactly this many times in a row.
  std::size_t available() const noexcept { return free() + cached_unreferenced(); }
  /// Blocks in the cache, referenced or not.
  std::size_t cached() const noexcept { return entries_.size(); }
  /// Whether block b is in the cache. False for a block outside the pool.
  bool is_cached(std::int32_t b) const { return entries_.count(b) != 0; }
  /// References to block b (0 for a free or idle cached block, or a block outside the pool).
  /// O(1) expected.
  std::uint32_t references(std::int32_t b) const {
    if (b < 0 || static_cast<std::size_t>(b) >= n_blocks() || (b == 0 && null_block())) return 0;
    // The cache holds one of a cached block's references.
    return static_cast<std::uint32_t>(blocks_.refs(b) - entries_.count(b));
  }

  /// A block for new content, with one reference: the lowest free one, else the least recently
  /// used idle cached leaf, else the least recently used idle cached block others follow (its
  /// cached descendants leave the cache: see the class comment). nullopt when none.
  /// O(log cached), and O(its descendants) when a followed block is reclaimed.
  std::optional<std::int32_t> allocate() {
    if (const auto b = blocks_.try_allocate()) return b;
    if (leaves_.empty() && inner_.empty()) return std::nullopt;
    const std::int32_t b = (!leaves_.empty() ? leaves_ : inner_).begin()->second;
    uncache(b, /*free_idle=*/false);  // the cache's reference to b becomes the caller's
    return b;
  }

  /// One more reference to block b: a cached one (a cache hit) or one already referenced.
  /// Throws prepack::error for a block outside the pool or one free. O(log cached).
  void acquire(std::int32_t b) {
    check_id(b);
    const auto it = entries_.find(b);
    detail::require(references(b) > 0 || it != entries_.end(), "block pool: block ", b,
                    " is free: only a cached or referenced block is acquired");
    if (references(b) == 0) idle_set(it->second).erase({it->second.last_use, b});
    blocks_.share(b);
  }

  /// Drops a reference: an unreferenced block is freed, or stays cached (idle) if it is in the
  /// cache. Throws prepack::error for a block outside the pool or one without a reference.
  /// O(log cached).
  void release(std::int32_t b) {
    check_id(b);
    detail::require(references(b) > 0, "block pool: block ", b, " released without a reference");
    blocks_.release(b);  // frees b if it held the last reference and is not cached
    const auto it = entries_.find(b);
    if (it == entries_.end() || references(b) > 0) return;
    it->second.last_use = ++clock_;
    idle_set(it->second).insert({it->second.last_use, b});
  }

  /// The cached block that holds `tokens` (block_size of them) right after cached block
  /// `parent` (-1: at the start of a sequence), or -1. O(block_size).
  template <class T>
  std::int32_t find(std::int32_t parent, span<const T> tokens) const {
    const auto range = index_.equal_range(hash(parent, tokens));
    for (auto it = range.first; it != range.second; ++it) {
      const entry& e = entries_.at(it->second);
      if (e.parent == parent &&
          std::equal(tokens.begin(), tokens.end(), e.tokens.begin(), e.tokens.end(),
                     [](T a, std::int32_t b) { return static_cast<std::int64_t>(a) == b; })) {
        return it->second;
      }
    }
    return -1;
  }

  /// Puts referenced block b, full of `tokens` after cached block `parent` (-1: first), in the
  /// cache. False (b left private) without caching, or when b or that content is cached
  /// already. Throws prepack::error, changing nothing, for a token count other than the block
  /// size, a block b outside the pool or without a reference, or a parent that is not a cached
  /// block (or is b). O(block_size + log cached).
  template <class T>
  bool insert(std::int32_t b, std::int32_t parent, span<const T> tokens) {
    detail::require(tokens.size() == block_size_, "block pool: ", tokens.size(),
                    " tokens for a block of ", block_size_);
    detail::require(b >= 0 && static_cast<std::size_t>(b) < n_blocks(), "block pool: block ", b,
                    " outside the pool of ", n_blocks());
    detail::require(references(b) > 0, "block pool: caching block ", b, " without a reference");
    detail::require(parent == -1 || (parent != b && entries_.count(parent) != 0),
                    "block pool: block ", b, " follows block ", parent,
                    ", which is not a cached block (-1: the start of a sequence)");
    if (!caching_ || entries_.count(b) != 0 || find(parent, tokens) >= 0) return false;
    if (parent >= 0) {
      entry& p = entries_.at(parent);
      if (references(parent) == 0 && p.kids.empty()) {  // an idle leaf that others now follow
        leaves_.erase({p.last_use, parent});
        inner_.insert({p.last_use, parent});
      }
      p.kids.push_back(b);
    }
    entry e;
    e.parent = parent;
    e.tokens.assign(tokens.begin(), tokens.end());
    index_.emplace(hash(parent, tokens), b);
    entries_.emplace(b, std::move(e));
    blocks_.share(b);  // the cache's own reference, kept while b is cached
    return true;
  }

  /// Frees every unreferenced cached block (referenced blocks whose prefix is freed stay with
  /// their holders, out of the cache); returns how many were freed. O(cached log cached).
  std::size_t drop_cache() {
    const std::size_t before = free();
    while (!leaves_.empty() || !inner_.empty()) {
      const std::int32_t b = (!leaves_.empty() ? leaves_ : inner_).begin()->second;
      uncache(b, /*free_idle=*/true);
    }
    return free() - before;
  }

 private:
  struct entry {
    std::int32_t parent = -1;
    std::vector<std::int32_t> tokens;
    std::vector<std::int32_t> kids;  // cached blocks that follow this one
    std::uint64_t last_use = 0;
  };
  using by_use = std::set<std::pair<std::uint64_t, std::int32_t>>;

  static std::size_t checked_size(std::size_t n_blocks, std::size_t block_size, bool null_block) {
    detail::require(n_blocks > (null_block ? 1u : 0u), "block pool: no blocks",
                    null_block ? " besides the null block" : "");
    detail::require(block_size > 0, "block pool: block size 0");
    detail::narrow<std::int32_t>(n_blocks, "block pool size");
    return n_blocks;
  }

  void check_id(std::int32_t b) const {
    detail::require(b >= 0 && static_cast<std::size_t>(b) < n_blocks(), "block pool: block ", b,
                    " outside the pool of ", n_blocks());
    detail::require(b != 0 || !null_block(), "block pool: block 0 is the null block");
  }

  // The set an idle cached block is in: leaves_ when no cached block follows it, else inner_.
  by_use& idle_set(const entry& e) { return e.kids.empty() ? leaves_ : inner_; }

  template <class T>
  static std::uint64_t hash(std::int32_t parent, span<const T> tokens) {
    std::uint64_t h = 1469598103934665603ull ^ static_cast<std::uint64_t>(parent + 1);
    for (T t : tokens)
      h = (h ^ static_cast<std::uint64_t>(static_cast<std::int64_t>(t))) * 1099511628211ull;
    return h;
  }

  // Takes idle cached block b out of the cache with its cached descendants: idle descendants are
  // freed, referenced ones stay with their holders, private; b itself is freed when free_idle,
  // else handed to the caller (allocate). Its parent may become an idle leaf.
  void uncache(std::int32_t b, bool free_idle) {
    entry& e = entries_.at(b);
    if (e.parent >= 0) {
      entry& p = entries_.at(e.parent);
      p.kids.erase(std::find(p.kids.begin(), p.kids.end(), b));
      if (p.kids.empty() && references(e.parent) == 0) {
        inner_.erase({p.last_use, e.parent});
        leaves_.insert({p.last_use, e.parent});
      }
    }
    std::vector<std::int32_t> todo{b};
    while (!todo.empty()) {
      const std::int32_t x = todo.back();
      todo.pop_back();
      auto it = entries_.find(x);
      entry& ex = it->second;
      todo.insert(todo.end(), ex.kids.begin(), ex.kids.end());
      if (references(x) == 0) idle_set(ex).erase({ex.last_use, x});
      const auto range = index_.equal_range(hash(ex.parent, span<const std::int32_t>(ex.tokens)));
      for (auto i = range.first; i != range.second; ++i) {
        if (i->second == x) {
          index_.erase(i);
          break;
        }
      }
      entries_.erase(it);
      // The cache's reference: an idle block is freed by it, a referenced one stays with its
      // holders; allocate's block b keeps it, for its caller.
      if (x != b || free_idle) blocks_.release(x);
    }
  }

  // Reference counts and free blocks: a request's reference to a block is one, and the cache
  // holds one more of every cached block (an idle cached block: only that one).
  block_allocator blocks_;
  std::size_t block_size_;
  bool caching_;
  std::unordered_map<std::int32_t, entry> entries_;             // cached blocks
  std::unordered_multimap<std::uint64_t, std::int32_t> index_;  // content hash -> block
  by_use leaves_;  // idle cached blocks no cached block follows, oldest first
  by_use inner_;   // idle cached blocks others follow, oldest first
  std::uint64_t clock_ = 0;
};

/// How waiting requests are admitted into a step (the header comment compares them).
enum class admission { fcfs, packed, shortest_first };

struct scheduler_options {
  std::size_t token_budget = 512;  // tokens a step computes, at most
  std::size_t max_seqs = 256;      // sequences a step holds, at most
  std::size_t n_blocks = 0;        // the KV pool's blocks
  std::size_t block_size = 16;     // tokens a block holds
  std::size_t reserve_blocks = 0;  // free blocks admission leaves for running requests' decodes
  admission policy = admission::fcfs;
  bool prefix_cache = true;
  std::size_t max_wait_steps = 64;  // packed, shortest_first: waited this long, admitted first
  /// Block 0 is never handed out: the engine's null block (vLLM: padding rows of block tables
  /// point there; SGLang: padded tokens write location 0). Set it for those engines' forms.
  bool null_block = false;
  /// Every prefill chunk but a request's last is a whole number of blocks (TensorRT-LLM's
  /// chunked context: non-final chunk sizes a multiple of tokens_per_block); a chunk that would
  /// round down to nothing waits for a step with room. Needs block_size <= token_budget.
  bool aligned_chunks = false;
};

/// A request as it arrives.
struct request {
  std::int64_t id = 0;                     // the caller's, unique among live requests
  std::vector<std::int32_t> prompt;        // at least one token
  std::size_t max_new_tokens = 1;          // at least 1
  std::optional<std::int32_t> stop_token;  // generation also ends after this token
};

/// One step for the engine.
struct scheduled_step {
  /// The step (sequence q: request inputs.seq_id[q]; its last token's logits wanted where
  /// inputs.completes[q], and one sampled token per such sequence goes to commit, in order).
  step_inputs<std::int32_t> inputs;
  std::size_t n_decodes = 0;            // sequences feeding one generated token
  std::size_t n_prefill_tokens = 0;     // prompt (or recomputed) tokens
  std::size_t n_samples = 0;            // tokens commit expects
  std::vector<std::int64_t> preempted;  // requests preempted to make room (recomputed later)
  bool empty() const noexcept { return inputs.n_seqs() == 0; }
};

/// A request that finished in a commit.
struct finished_request {
  std::int64_t id = 0;
  std::vector<std::int32_t> generated;  // the tokens it generated, stop token included
  std::vector<std::int32_t> blocks;     // its block table at the end (released; their content
                                        // stays until the next step writes)
  std::size_t cached_positions = 0;     // positions 0 .. cached_positions - 1 are in `blocks`
  std::size_t preemptions = 0;
  std::size_t cached_prompt_tokens = 0;  // prompt tokens it took from the prefix cache
};

struct scheduler_stats {
  std::size_t steps = 0, tokens_computed = 0, decode_tokens = 0, prefill_tokens = 0;
  std::size_t prompt_tokens = 0;     // of the requests admitted (first admission)
  std::size_t cache_hit_tokens = 0;  // prompt tokens taken from the prefix cache
  std::size_t preemptions = 0, recomputed_tokens = 0;
  std::size_t finished = 0;
};

class scheduler {
 public:
  /// Throws prepack::error for a budget, cap, pool or block size of 0, or aligned chunks with
  /// a block larger than the budget.
  explicit scheduler(const scheduler_options& opt)
      : opt_(opt), pool_(opt.n_blocks, opt.block_size, opt.prefix_cache, opt.null_block) {
    detail::require(opt.token_budget > 0, "scheduler: token budget 0");
    detail::require(opt.max_seqs > 0, "scheduler: max_seqs 0");
    detail::require(!opt.aligned_chunks || opt.block_size <= opt.token_budget,
                    "scheduler: aligned chunks need a block (", opt.block_size,
                    " tokens) within the token budget (", opt.token_budget, ")");
  }

  /// Queues a request. Throws prepack::error naming it, queuing nothing, for an id already
  /// live, an empty prompt, max_new_tokens 0, or a request whose prompt and new tokens need more
  /// blocks than the pool has. O(log waiting).
  void add(request r) {
    const auto name = "request " + std::to_string(r.id);
    detail::require(live_.count(r.id) == 0, name, ": already queued or running");
    detail::require(!r.prompt.empty(), name, ": empty prompt");
    detail::require(r.max_new_tokens > 0, name, ": max_new_tokens 0");
    const std::size_t positions =
        detail::add(r.prompt.size(), r.max_new_tokens - 1, "request positions");
    const std::size_t need = blocks_for(positions, opt_.block_size);
    detail::require(need <= pool_.usable(), name, ": ", r.prompt.size(), " prompt tokens + ",
                    r.max_new_tokens, " new need ", need, " blocks of ", opt_.block_size,
                    ", the pool has ", pool_.usable());
    live& q = live_[r.id];
    q.tokens = r.prompt;
    q.r = std::move(r);
    q.arrival = arrivals_++;
    wait(q);
  }

  /// The next step (empty when nothing can run: idle()). Throws prepack::error if the previous
  /// step was not committed.
  scheduled_step next_step() {
    detail::require(!pending_, "scheduler: the previous step is not committed");
    scheduled_step st;
    planned_.clear();
    in_step_.clear();
    budget_ = opt_.token_budget;
    seqs_ = opt_.max_seqs;
    plan_decodes(st);
    plan_prefills();
    plan_admissions();
    step_builder<std::int32_t> b(opt_.block_size, opt_.n_blocks, [&](std::size_t k) {
      return "request " + std::to_string(planned_[k].id);
    });
    std::size_t n_tokens = 0;
    for (const plan& p : planned_) n_tokens += p.n;
    b.reserve(planned_.size(), n_tokens);
    for (const plan& p : planned_) {
      live& q = live_.at(p.id);
      const span<const std::int32_t> toks(q.tokens.data() + q.computed, p.n);
      const bool samples = q.computed + p.n == q.tokens.size();
      b.add(b.n_seqs(), q.r.id, q.computed, toks, span<const std::int32_t>(q.row), samples,
            p.decode, q.r.prompt.size());
      if (p.decode) {
        ++st.n_decodes;
      } else {
        st.n_prefill_tokens += p.n;
      }
      st.n_samples += samples ? 1 : 0;
    }
    st.inputs = std::move(b).finish();
    pending_ = !planned_.empty();
    if (pending_) {
      ++stats_.steps;
      ++step_no_;
    }
    return st;
  }

  /// Records the step's results: `sampled` holds the token sampled for each sequence whose
  /// logits were wanted, in the step's order. Returns the requests that finished (their blocks
  /// released). Throws prepack::error, changing nothing, for a count that differs from the
  /// step's samples. O(step tokens + blocks filled).
  std::vector<finished_request> commit(span<const std::int32_t> sampled) {
    std::size_t want = 0;
    for (const plan& p : planned_) {
      const live& q = live_.at(p.id);
      want += q.computed + p.n == q.tokens.size() ? 1 : 0;
    }
    detail::require(pending_ || planned_.empty(), "scheduler: no step to commit");
    detail::require(sampled.size() == want, "scheduler: ", sampled.size(),
                    " sampled tokens for a step that samples ", want);
    std::vector<finished_request> done;
    std::size_t next = 0;
    for (const plan& p : planned_) {
      live& q = live_.at(p.id);
      const bool samples = q.computed + p.n == q.tokens.size();
      q.computed += p.n;
      stats_.tokens_computed += p.n;
      (p.decode ? stats_.decode_tokens : stats_.prefill_tokens) += p.n;
      cache_full_blocks(q);
      if (!samples) continue;
      const std::int32_t t = sampled[next++];
      q.tokens.push_back(t);
      ++q.generated;
      if (q.generated == q.r.max_new_tokens || (q.r.stop_token && t == *q.r.stop_token)) {
        done.push_back(finish(q));
      } else if (!q.decoding) {
        q.decoding = true;
        prefill_.erase(q.in_prefill);
        q.in_decode = decode_.insert(decode_.end(), q.r.id);
      }
    }
    for (const finished_request& f : done) live_.erase(f.id);
    pending_ = false;
    planned_.clear();
    return done;
  }

  bool idle() const noexcept { return live_.empty(); }
  std::size_t n_waiting() const noexcept { return fifo_.size(); }
  std::size_t n_running() const noexcept { return running_.size(); }
  const block_pool& blocks() const noexcept { return pool_; }
  const scheduler_stats& stats() const noexcept { return stats_; }
  const scheduler_options& options() const noexcept { return opt_; }
  /// Frees every unreferenced cached block (the pool then holds only running requests').
  std::size_t drop_cache() { return pool_.drop_cache(); }

 private:
  struct live {
    request r;
    std::vector<std::int32_t> tokens;  // prompt, then what it generated
    std::size_t computed = 0;          // positions whose K and V are in the pool
    std::vector<std::int32_t> row;     // its blocks
    std::size_t cached_blocks = 0;     // leading blocks in the prefix cache (taken or added)
    bool chain = true;                 // whether its next full block may join the cache
    std::size_t generated = 0, preemptions = 0, cache_hit = 0;
    std::uint64_t arrival = 0, admitted = 0;
    std::size_t waiting_since = 0;  // step number it (re)entered the queue
    bool decoding = false;          // running and feeding generated tokens one at a time
    std::list<std::int64_t>::iterator in_decode, in_prefill;
  };
  struct plan {
    std::int64_t id;
    std::size_t n;
    bool decode;
  };
  using by_length = std::set<std::tuple<std::size_t, std::uint64_t, std::int64_t>>;

  void wait(live& q) {
    q.waiting_since = step_no_;
    fifo_.insert({q.arrival, q.r.id});
    lengths_.insert({q.tokens.size(), q.arrival, q.r.id});
  }
  void unwait(const live& q) {
    fifo_.erase({q.arrival, q.r.id});
    lengths_.erase({q.tokens.size(), q.arrival, q.r.id});
  }

  // Blocks for positions [0, end) of q, allocated as needed; false if the pool has none left.
  bool grow(live& q, std::size_t end) {
    while (q.row.size() * opt_.block_size < end) {
      const auto b = pool_.allocate();
      if (!b) return false;
      q.row.push_back(*b);
    }
    return true;
  }

  void release_blocks(live& q) {
    for (std::int32_t b : q.row) pool_.release(b);
  }

  // Frees q's blocks and queues it again, to recompute its prompt and what it generated.
  void preempt(live& q, scheduled_step& st) {
    release_blocks(q);
    stats_.recomputed_tokens += q.computed;
    q.row.clear();
    q.computed = 0;
    q.cached_blocks = 0;
    q.chain = true;
    ++q.preemptions;
    ++stats_.preemptions;
    running_.erase({q.admitted, q.r.id});
    if (q.decoding) {
      decode_.erase(q.in_decode);
    } else {
      prefill_.erase(q.in_prefill);
    }
    q.decoding = false;
    st.preempted.push_back(q.r.id);
    wait(q);
  }

  // The newest running request outside this step, or nullptr.
  live* newest_outside_step(std::int64_t except) {
    for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
      if (it->second != except && in_step_.count(it->second) == 0) return &live_.at(it->second);
    }
    return nullptr;
  }

  // Tokens of q's prefill that fit `room`: all that is left when it fits, else `room`, rounded
  // down to whole blocks with aligned chunks (0: nothing fits this step).
  std::size_t chunk(const live& q, std::size_t room) const {
    const std::size_t left = q.tokens.size() - q.computed;
    if (left <= room) return left;
    return opt_.aligned_chunks ? room / opt_.block_size * opt_.block_size : room;
  }

  void schedule(live& q, std::size_t n, bool decode) {
    planned_.push_back({q.r.id, n, decode});
    in_step_.insert(q.r.id);
    budget_ -= n;
    --seqs_;
  }

  // 1. One token per decoding sequence, rotating through them.
  void plan_decodes(scheduled_step& st) {
    std::size_t left = decode_.size();
    while (left-- > 0 && budget_ > 0 && seqs_ > 0 && !decode_.empty()) {
      const std::int64_t id = decode_.front();
      live& q = live_.at(id);
      decode_.splice(decode_.end(), decode_, decode_.begin());  // to the back: rotation
      bool ok = grow(q, q.computed + 1);
      while (!ok) {
        live* victim = newest_outside_step(id);
        if (victim == nullptr) break;
        if (victim->decoding && left > 0) --left;  // it will not come round
        preempt(*victim, st);
        ok = grow(q, q.computed + 1);
      }
      if (!ok) {
        preempt(q, st);
        continue;
      }
      schedule(q, 1, true);
    }
  }

  // 2. Admitted prompts not yet computed, oldest admission first.
  void plan_prefills() {
    for (std::int64_t id : prefill_) {
      if (budget_ == 0 || seqs_ == 0) break;
      live& q = live_.at(id);
      if (in_step_.count(id) != 0) continue;
      const std::size_t n = chunk(q, budget_);
      if (n > 0) schedule(q, n, false);
    }
  }

  // Takes q from the queue if its blocks can be had: its longest cached prefix, then blocks for
  // every token it knows. `whole`: only if all of them fit this step.
  bool admit(live& q, bool whole) {
    const std::size_t bs = opt_.block_size;
    std::vector<std::int32_t> hits;
    if (pool_.caching()) {
      std::int32_t parent = -1;
      for (std::size_t k = 0; (k + 1) * bs <= q.tokens.size() - 1; ++k) {
        const std::int32_t b =
            pool_.find(parent, span<const std::int32_t>(q.tokens.data() + k * bs, bs));
        if (b < 0) break;
        hits.push_back(parent = b);
      }
    }
    const std::size_t todo = q.tokens.size() - hits.size() * bs;
    if (whole && todo > budget_) return false;
    // The first chunk (aligned chunks: whole blocks unless it is the last).
    const std::size_t first =
        todo <= budget_ || !opt_.aligned_chunks ? std::min(budget_, todo) : budget_ / bs * bs;
    if (first == 0) return false;
    const std::size_t need = blocks_for(q.tokens.size(), bs) - hits.size();
    // Hit blocks that are idle in the cache stop counting as available once taken.
    std::size_t idle_hits = 0;
    for (std::int32_t b : hits) idle_hits += pool_.references(b) == 0 ? 1 : 0;
    const std::size_t reserve = running_.empty() ? 0 : opt_.reserve_blocks;
    if (pool_.available() < need + idle_hits + reserve) return false;
    unwait(q);
    for (std::int32_t b : hits) pool_.acquire(b);
    q.row = hits;
    q.cached_blocks = hits.size();
    q.computed = hits.size() * bs;
    const bool ok = grow(q, q.tokens.size());
    PREPACK_ASSERT(ok);
    (void)ok;
    if (q.preemptions == 0) {
      stats_.prompt_tokens += q.r.prompt.size();
      stats_.cache_hit_tokens += q.computed;
      q.cache_hit = q.computed;
    }
    q.admitted = admissions_++;
    running_.insert({q.admitted, q.r.id});
    q.in_prefill = prefill_.insert(prefill_.end(), q.r.id);
    schedule(q, first, false);
    return true;
  }

  // 3. Waiting requests, by the policy.
  void plan_admissions() {
    const auto room = [&] { return budget_ > 0 && seqs_ > 0; };
    if (opt_.policy == admission::fcfs) {
      while (room() && !fifo_.empty() && admit(live_.at(fifo_.begin()->second), false)) {
      }
      return;
    }
    // Aged requests first, in arrival order (chunked if need be).
    while (room() && !fifo_.empty()) {
      live& q = live_.at(fifo_.begin()->second);
      if (step_no_ - q.waiting_since < opt_.max_wait_steps || !admit(q, false)) break;
    }
    // Whole prompts: the longest that fits the room (packed) or the shortest (shortest_first).
    while (room() && !lengths_.empty()) {
      by_length::iterator it;
      if (opt_.policy == admission::packed) {
        it = lengths_.upper_bound({budget_, std::numeric_limits<std::uint64_t>::max(),
                                   std::numeric_limits<std::int64_t>::max()});
        if (it == lengths_.begin()) break;
        --it;
      } else {
        it = lengths_.begin();
      }
      // A prefix-cache hit can only shorten what is left to compute; admit() checks the room.
      if (!admit(live_.at(std::get<2>(*it)), true)) break;
    }
    // What cannot fit whole: the oldest waiting request, chunked into the room left.
    if (room() && !fifo_.empty()) admit(live_.at(fifo_.begin()->second), false);
  }

  // Adds q's newly full blocks to the prefix cache, in order, while its chain of cached blocks
  // is unbroken (a block whose content is cached already stays private, and so do those after).
  void cache_full_blocks(live& q) {
    const std::size_t bs = opt_.block_size;
    while (q.chain && pool_.caching() && (q.cached_blocks + 1) * bs <= q.computed) {
      const std::size_t k = q.cached_blocks;
      const std::int32_t parent = k == 0 ? -1 : q.row[k - 1];
      if (!pool_.insert(q.row[k], parent, span<const std::int32_t>(q.tokens.data() + k * bs, bs))) {
        q.chain = false;
        break;
      }
      ++q.cached_blocks;
    }
  }

  finished_request finish(live& q) {
    finished_request f;
    f.id = q.r.id;
    f.generated.assign(q.tokens.end() - static_cast<std::ptrdiff_t>(q.generated), q.tokens.end());
    f.blocks = q.row;
    f.cached_positions = q.computed;
    f.preemptions = q.preemptions;
    f.cached_prompt_tokens = q.cache_hit;
    release_blocks(q);
    running_.erase({q.admitted, q.r.id});
    if (q.decoding) {
      decode_.erase(q.in_decode);
    } else {
      prefill_.erase(q.in_prefill);
    }
    ++stats_.finished;
    return f;
  }

  scheduler_options opt_;
  block_pool pool_;
  std::unordered_map<std::int64_t, live> live_;
  std::set<std::pair<std::uint64_t, std::int64_t>> fifo_;     // waiting, by arrival
  by_length lengths_;                                         // waiting, by tokens to compute
  std::set<std::pair<std::uint64_t, std::int64_t>> running_;  // by admission
  std::list<std::int64_t> decode_, prefill_;
  std::vector<plan> planned_;
  std::unordered_set<std::int64_t> in_step_;
  std::size_t budget_ = 0, seqs_ = 0, step_no_ = 0;
  std::uint64_t arrivals_ = 0, admissions_ = 0;
  bool pending_ = false;
  scheduler_stats stats_;
};

PREPACK_NAMESPACE_END
