"""The serving scheduler and block pool from a Python engine loop: the same steps and results
as prepack's C++ API driven the same way (forms_cpp), blocks conserved, and bad input."""
import numpy as np
import pytest

import prepack
from conftest import equal, random_prompts


@pytest.mark.parametrize("policy,cache,aligned", [("fcfs", True, False), ("packed", True, True),
                                                  ("shortest_first", False, False)])
def test_a_python_engine_loop_runs_the_cpp_schedulers_steps(cpp, policy, cache, aligned):
    rng = np.random.default_rng(21)
    shared = rng.integers(0, 1000, 40).tolist()
    prompts = [shared + p for p in random_prompts(rng, 10, 1, 60)] + random_prompts(rng, 8, 1, 120)
    options = {"token_budget": 64, "max_seqs": 8, "n_blocks": 48, "block_size": 8,
               "policy": policy, "prefix_cache": cache, "aligned_chunks": aligned, "null_block": True}
    requests = [[i, int(rng.integers(1, 9)), p] for i, p in enumerate(prompts)]
    c = cpp({"kind": "serve", "options": options, "requests": requests})
    s = prepack.Scheduler(**options)
    for i, max_new, p in requests:
        s.add(i, p, max_new_tokens=max_new)
    steps, finished = 0, {}
    while not s.idle:
        st = s.next_step()
        x = st.inputs
        want = c["steps"][steps]
        for name in ("seq_id", "context_lens", "query_lens", "tokens", "positions", "slot_mapping", "completes", "decodes"):
            equal(getattr(x, name), want[name], name)
        equal(st.preempted, want["preempted"], "preempted")
        assert st.n_samples == int(x.completes.sum())
        sampled = ((x.seq_id * 31 + x.seq_lens) % 1000)[x.completes == 1]
        for f in s.commit(sampled):
            finished[f.id] = f.generated.tolist()
        steps += 1
    assert steps == len(c["steps"])
    assert finished == {f["id"]: f["generated"] for f in c["finished"]}
    assert all(len(finished[i]) == m for i, m, _ in requests)
    s.drop_cache()
    assert s.free_blocks == options["n_blocks"] - 1  # all but the null block


def test_block_pool_caches_full_blocks_by_content():
    pool = prepack.BlockPool(4, 2, caching=True)
    a = pool.allocate()
    b = pool.allocate()
    assert (a, b) == (0, 1) and pool.free == 2
    assert pool.insert(a, -1, [5, 6]) and pool.insert(b, a, [7, 8])
    assert not pool.insert(b, a, [7, 8])  # already cached
    assert pool.find(-1, [5, 6]) == a and pool.find(a, [7, 8]) == b and pool.find(-1, [7, 8]) == -1
    pool.release(b)
    pool.release(a)
    assert pool.cached == 2 and pool.cached_unreferenced == 2 and pool.available == 4
    pool.acquire(a)
    assert pool.references(a) == 1
    pool.release(a)
    assert pool.drop_cache() == 2 and pool.free == 4


def held_pool():
    pool = prepack.BlockPool(4, 1)
    pool.allocate()
    pool.allocate()
    return pool


def test_bad_serving_input_raises():
    s = prepack.Scheduler(n_blocks=4, block_size=4, token_budget=8)
    s.add(1, [1, 2, 3])
    cases = [
        (lambda: s.add(1, [4]), "request 1: already queued or running"),
        (lambda: s.add(2, []), "request 2: empty prompt"),
        (lambda: s.add(3, [1], max_new_tokens=0), "request 3: max_new_tokens 0"),
        (lambda: s.add(4, list(range(20)), max_new_tokens=2), "request 4: 20 prompt tokens + 2 new need 6 blocks of 4, the pool has 4"),
        (lambda: prepack.Scheduler(n_blocks=0), "block pool: no blocks"),
        (lambda: prepack.Scheduler(n_blocks=4, token_budget=0), "scheduler: token budget 0"),
        (lambda: prepack.Scheduler(n_blocks=4, policy="lifo"), "policy: 'lifo', expected one of"),
        (lambda: s.commit([1]), "scheduler: 1 sampled tokens for a step that samples 0"),
        (lambda: prepack.BlockPool(2, 2).release(0), "block pool: block 0 released without a reference"),
        (lambda: prepack.BlockPool(2, 2).insert(0, -1, [1, 2, 3]), "block pool: 3 tokens for a block of 2"),
        (lambda: held_pool().insert(1, 0, [1]), "block 1 follows block 0, which is not a cached block"),
        (lambda: prepack.Scheduler(n_blocks=4, block_size=8, token_budget=4, aligned_chunks=True),
         "aligned chunks need a block (8 tokens) within the token budget (4)"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError) as e:
            call()
        assert message in str(e.value), (message, str(e.value))
    st = s.next_step()
    with pytest.raises(ValueError, match="previous step is not committed"):
        s.next_step()
    with pytest.raises(ValueError, match="sampled tokens for a step that samples 1"):
        s.commit([])
    assert [f.generated.tolist() for f in s.commit([42])] == [[42]]
    with pytest.raises(TypeError, match="sampled: float64 values"):
        s.commit([1.5])
