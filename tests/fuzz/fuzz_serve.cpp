// libFuzzer target: random operation sequences on prepack::block_pool and prepack::scheduler.
//
// block_pool: allocate, acquire, release, insert, find and drop_cache with block ids from the
// input (invalid ones included), checked after every operation against a plain model of the
// pool written from its documented contract (lowest free block first; reference counts; a
// content-keyed cache whose idle blocks are reclaimed least recently used, leaves before blocks
// others follow, a reclaimed block's cached descendants leaving the cache with it): every
// result, every block's references and cache membership, and the counts free / cached /
// available. Every refusal must be prepack::error, and exactly when the model refuses.
//
// scheduler: add (valid and invalid requests), next_step, commit (right and wrong counts),
// drop_cache, checked for the step's limits, refusals as prepack::error that change nothing,
// blocks conserved, and every request finishing once the input ends and the loop drains.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "prepack/serve.hpp"

namespace {

#define CHECK(cond)                \
  do {                             \
    if (!(cond)) __builtin_trap(); \
  } while (0)

struct bytes {
  const std::uint8_t* p;
  std::size_t n, at = 0;
  bool done() const { return at >= n; }
  std::uint8_t next() { return at < n ? p[at++] : 0; }
};

// The pool as its contract describes it, with plain containers and linear scans.
struct model_pool {
  struct entry {
    std::int32_t parent;
    std::vector<std::int32_t> tokens;
    std::uint64_t last_use = 0;
  };
  std::size_t n, bs;
  bool caching;
  std::vector<std::uint32_t> refs;
  std::set<std::int32_t> free;
  std::map<std::int32_t, entry> cached;
  std::uint64_t clock = 0;

  model_pool(std::size_t n_blocks, std::size_t block_size, bool c)
      : n(n_blocks), bs(block_size), caching(c), refs(n_blocks, 0) {
    for (std::size_t b = 0; b < n; ++b) free.insert(static_cast<std::int32_t>(b));
  }
  bool in_pool(std::int32_t b) const { return b >= 0 && static_cast<std::size_t>(b) < n; }
  bool has_kids(std::int32_t b) const {
    for (const auto& [k, e] : cached) {
      if (e.parent == b) return true;
    }
    return false;
  }
  std::size_t idle() const {
    std::size_t c = 0;
    for (const auto& [b, e] : cached) c += refs[static_cast<std::size_t>(b)] == 0 ? 1 : 0;
    return c;
  }
  // The idle cached block reclaimed next: the least recently used leaf, else block others
  // follow; -1 when none.
  std::int32_t victim() const {
    std::int32_t best = -1;
    bool best_leaf = false;
    std::uint64_t best_use = 0;
    for (const auto& [b, e] : cached) {
      if (refs[static_cast<std::size_t>(b)] != 0) continue;
      const bool leaf = !has_kids(b);
      if (best < 0 || (leaf && !best_leaf) || (leaf == best_leaf && e.last_use < best_use)) {
        best = b;
        best_leaf = leaf;
        best_use = e.last_use;
      }
    }
    return best;
  }
  void uncache(std::int32_t b, bool free_b) {
    std::vector<std::int32_t> todo{b};
    while (!todo.empty()) {
      const std::int32_t x = todo.back();
      todo.pop_back();
      for (const auto& [k, e] : cached) {
        if (e.parent == x) todo.push_back(k);
      }
      if (refs[static_cast<std::size_t>(x)] == 0 && (x != b || free_b)) free.insert(x);
      cached.erase(x);
    }
  }
  std::optional<std::int32_t> allocate() {
    std::int32_t b;
    if (!free.empty()) {
      b = *free.begin();
      free.erase(free.begin());
    } else if ((b = victim()) >= 0) {
      uncache(b, false);
    } else {
      return std::nullopt;
    }
    refs[static_cast<std::size_t>(b)] = 1;
    return b;
  }
  std::int32_t find(std::int32_t parent, const std::vector<std::int32_t>& t) const {
    for (const auto& [b, e] : cached) {
      if (e.parent == parent && e.tokens == t) return b;
    }
    return -1;
  }
};

void check_same(const prepack::block_pool& p, const model_pool& m) {
  CHECK(p.free() == m.free.size());
  CHECK(p.cached() == m.cached.size());
  CHECK(p.cached_unreferenced() == m.idle());
  CHECK(p.available() == m.free.size() + m.idle());
  for (std::size_t b = 0; b < m.n; ++b) {
    const auto id = static_cast<std::int32_t>(b);
    CHECK(p.references(id) == m.refs[b]);
    CHECK(p.is_cached(id) == (m.cached.count(id) != 0));
    // Conserved: every block is free, referenced or idle in the cache, exactly one of them.
    const int states = (m.free.count(id) ? 1 : 0) + (m.refs[b] > 0 ? 1 : 0) +
                       (m.refs[b] == 0 && m.cached.count(id) ? 1 : 0);
    CHECK(states == 1);
  }
}

std::int32_t some_block(bytes& in, std::size_t n) {
  const std::uint8_t v = in.next();
  if (v % 16 == 0) return -1;
  if (v % 16 == 1) return static_cast<std::int32_t>(n + v / 16);  // outside the pool
  return static_cast<std::int32_t>(v % n);
}

void fuzz_pool(bytes& in) {
  const std::size_t n = 1 + in.next() % 12, bs = 1 + in.next() % 3;
  const bool caching = in.next() % 4 != 0;
  prepack::block_pool p(n, bs, caching);
  model_pool m(n, bs, caching);
  while (!in.done()) {
    const std::uint8_t op = in.next() % 6;
    bool refused = false, expect_refused = false;
    try {
      if (op == 0) {
        const auto got = p.allocate();
        const auto want = m.allocate();
        CHECK(got == want);
      } else if (op == 1) {
        const std::int32_t b = some_block(in, n);
        expect_refused =
            !m.in_pool(b) || (m.refs[static_cast<std::size_t>(b)] == 0 && m.cached.count(b) == 0);
        p.acquire(b);
        ++m.refs[static_cast<std::size_t>(b)];
      } else if (op == 2) {
        const std::int32_t b = some_block(in, n);
        expect_refused = !m.in_pool(b) || m.refs[static_cast<std::size_t>(b)] == 0;
        p.release(b);
        if (--m.refs[static_cast<std::size_t>(b)] == 0) {
          if (m.cached.count(b)) {
            m.cached[b].last_use = ++m.clock;
          } else {
            m.free.insert(b);
          }
        }
      } else if (op == 3 || op == 4) {
        const std::int32_t b = some_block(in, n);
        const std::int32_t parent = in.next() % 3 == 0 ? -1 : some_block(in, n);
        std::vector<std::int32_t> t(in.next() % 8 == 0 ? bs + 1 : bs);
        for (auto& x : t) x = in.next() % 3;
        if (op == 3) {
          CHECK(p.find(parent, prepack::span<const std::int32_t>(t)) ==
                (t.size() == bs ? m.find(parent, t) : -1));
        } else {
          expect_refused = t.size() != bs || !m.in_pool(b) ||
                           m.refs[static_cast<std::size_t>(b)] == 0 ||
                           !(parent == -1 || (parent != b && m.cached.count(parent) != 0));
          const bool got = p.insert(b, parent, prepack::span<const std::int32_t>(t));
          const bool want = m.caching && m.cached.count(b) == 0 && m.find(parent, t) < 0;
          CHECK(!expect_refused && got == want);
          if (want) m.cached[b] = {parent, t, 0};
        }
      } else {
        const std::size_t before = m.free.size();
        for (std::int32_t v; (v = m.victim()) >= 0;) m.uncache(v, true);
        CHECK(p.drop_cache() == m.free.size() - before);
      }
    } catch (const prepack::error&) {
      refused = true;
    }
    CHECK(refused == expect_refused);
    check_same(p, m);
  }
}

void fuzz_scheduler(bytes& in) {
  prepack::scheduler_options o;
  o.token_budget = 1 + in.next() % 24;
  o.max_seqs = 1 + in.next() % 6;
  o.block_size = 1 + in.next() % 4;
  o.n_blocks = 1 + in.next() % 24;
  o.reserve_blocks = in.next() % 3;
  o.policy = static_cast<prepack::admission>(in.next() % 3);
  o.prefix_cache = in.next() % 2 == 0;
  o.max_wait_steps = in.next() % 6;
  o.aligned_chunks = in.next() % 3 == 0 && o.block_size <= o.token_budget;
  o.null_block = in.next() % 2 == 0 && o.n_blocks > 1;
  prepack::scheduler s(o);
  std::set<std::int64_t> live;
  std::int64_t next_id = 0;
  std::optional<prepack::scheduled_step> pending;
  const auto conserved = [&] {
    const auto& pool = s.blocks();
    CHECK(pool.available() <= pool.usable());
    CHECK(pool.free() + pool.cached_unreferenced() <= pool.usable());
  };
  const auto run = [&](const prepack::scheduled_step& st, bool wrong) {
    std::vector<std::int32_t> sampled(st.n_samples + (wrong ? 1 : 0), 1);
    for (auto& t : sampled) t = in.next() % 5;
    try {
      for (const auto& f : s.commit(sampled)) {
        CHECK(live.erase(f.id) == 1);
      }
      CHECK(!wrong);
    } catch (const prepack::error&) {
      CHECK(wrong);
      return false;
    }
    return true;
  };
  while (!in.done()) {
    const std::uint8_t op = in.next() % 5;
    if (op == 0 || op == 1) {  // add: sometimes a duplicate id, an empty prompt, 0 new tokens
      prepack::request r;
      r.id = in.next() % 8 == 0 && next_id > 0 ? next_id - 1 : next_id;
      const std::size_t len = in.next() % 40;
      for (std::size_t k = 0; k < len; ++k) r.prompt.push_back(in.next() % 4);
      r.max_new_tokens = in.next() % 6;
      if (in.next() % 4 == 0) r.stop_token = in.next() % 4;
      const std::size_t positions = r.prompt.size() + (r.max_new_tokens ? r.max_new_tokens - 1 : 0);
      const bool bad =
          live.count(r.id) != 0 || r.prompt.empty() || r.max_new_tokens == 0 ||
          prepack::blocks_for(positions, o.block_size) > o.n_blocks - (o.null_block ? 1 : 0);
      try {
        s.add(r);
        CHECK(!bad);
        live.insert(r.id);
        if (r.id == next_id) ++next_id;
      } catch (const prepack::error&) {
        CHECK(bad);
      }
    } else if (op == 2 || op == 3) {
      if (pending) {
        try {
          s.next_step();
          CHECK(false);  // an uncommitted step must be refused
        } catch (const prepack::error&) {
        }
        if (run(*pending, in.next() % 4 == 0)) pending.reset();
        continue;
      }
      prepack::scheduled_step st = s.next_step();
      CHECK(st.inputs.n_tokens() <= o.token_budget && st.inputs.n_seqs() <= o.max_seqs);
      CHECK(!st.empty() || live.empty());  // a live request always gets a step
      if (!st.empty()) pending = std::move(st);
    } else {
      s.drop_cache();
    }
    conserved();
  }
  // Drain: every live request finishes, and then every block is free once the cache is dropped.
  for (std::size_t guard = 0; !s.idle(); ++guard) {
    CHECK(guard < 100000);
    if (!pending) {
      prepack::scheduled_step st = s.next_step();
      CHECK(!st.empty());
      pending = std::move(st);
    }
    if (run(*pending, false)) pending.reset();
  }
  CHECK(live.empty());
  s.drop_cache();
  CHECK(s.blocks().free() == s.blocks().usable());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  bytes in{data + 1, size - 1};
  if (data[0] % 2 == 0) {
    fuzz_pool(in);
  } else {
    fuzz_scheduler(in);
  }
  return 0;
}
