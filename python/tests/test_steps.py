"""Schedules, prefix plans, step inputs and every engine's form, from Python: against the
definitions computed here with numpy, against prepack's C++ API on the same inputs (forms_cpp),
and every bad input."""
import numpy as np
import pytest

import prepack
from conftest import equal, random_prompts


def whole_prompt_tables(prompts, block_size, alloc):
    """Each prompt's blocks from `alloc` (a BlockAllocator keeping block 0: vLLM's null block)."""
    return prepack.BlockTables.from_lists(
        [alloc.allocate(-(-len(p) // block_size)).tolist() for p in prompts], block_size)


def check_step_definitions(s, item_tokens, chunks):
    """StepInputs s of a step whose chunks are `chunks` (Schedule.chunks(step)), by definition."""
    bs = s.block_size
    ctx = chunks["context"]
    q = chunks["length"]
    assert s.context_lens.tolist() == ctx.tolist()
    assert s.query_lens.tolist() == q.tolist()
    assert s.seq_lens.tolist() == (ctx + q).tolist()
    assert s.cu_seqlens_q.tolist() == [0] + np.cumsum(q).tolist()
    assert s.cu_seqlens_k.tolist() == [0] + np.cumsum(ctx + q).tolist()
    tokens, positions, slots = [], [], []
    for k, item in enumerate(chunks["item"]):
        start, n = chunks["start"][k], q[k]
        tokens += list(item_tokens[item][start:start + n])
        pos = np.arange(ctx[k], ctx[k] + n)
        positions += pos.tolist()
        row = s.block_table[k]
        slots += (row[pos // bs].astype(np.int64) * bs + pos % bs).tolist()
    assert s.tokens.tolist() == tokens
    assert s.positions.tolist() == positions
    assert s.slot_mapping.tolist() == slots


def check_engine_definitions(s):
    """Each engine's form of StepInputs s, computed here from its definition."""
    bs = s.block_size
    n = s.n_seqs
    blocks = [row[row >= 0] for row in s.block_table]
    v = prepack.vllm.make_step(s, runner="v1")
    order = v["req_order"]
    # vLLM's regions (reorder_batch_to_split_decodes_and_prefills): decode, short extend, long
    # extend, prefill; non-decreasing along the batch.
    region = np.where(s.context_lens == 0, 3, np.where(s.query_lens > 1, 2,
                                                      np.where(s.context_lens >= s.prompt_lens, 0, 1)))
    assert sorted(order.tolist()) == list(range(n)) and (np.diff(region[order]) >= 0).all()
    # V2 (vllm/v1/worker/gpu/model_runner.py, sort_batch_req_ids): stable by (tokens != 1, tokens).
    v2 = prepack.vllm.make_step(s)["req_order"].tolist()
    assert v2 == sorted(range(n), key=lambda q: (s.query_lens[q] != 1, s.query_lens[q]))
    q = s.query_lens[order]
    assert v["query_start_loc"].dtype == np.int32
    assert v["query_start_loc"].tolist() == [0] + np.cumsum(q).tolist()
    assert v["seq_lens"].tolist() == s.seq_lens[order].tolist()
    assert v["logits_indices"].tolist() == (v["query_start_loc"][1:] - 1).tolist()
    assert v["slot_mapping"].dtype == np.int64 and v["positions"].dtype == np.int64
    assert v["discard_request_mask"].dtype == np.bool_
    assert v["discard_request_mask"].tolist() == (s.completes[order] == 0).tolist()
    width = v["block_table_tensor"].shape[1]
    for r, seq in enumerate(order):
        want = np.zeros(width, np.int32)
        want[:len(blocks[seq])] = blocks[seq]
        assert v["block_table_tensor"][r].tolist() == want.tolist()
    f = prepack.flashinfer.make_step(s)
    pages = [-(-int(L) // bs) for L in s.seq_lens]
    assert f["attention"]["paged_kv_indptr"].tolist() == [0] + np.cumsum(pages).tolist()
    assert f["attention"]["paged_kv_indices"].tolist() == sum((blocks[r][:pages[r]].tolist() for r in range(n)), [])
    assert f["attention"]["paged_kv_last_page_len"].tolist() == [(int(L) - 1) % bs + 1 for L in s.seq_lens]
    assert f["positions"].tolist() == s.positions.tolist()
    # BatchPrefillWithPagedKVCacheWrapper.plan's arguments (flashinfer/prefill.py).
    plan = prepack.flashinfer.make_step(s, num_qo_heads=8, num_kv_heads=2, head_dim=64,
                                        q_data_type="bfloat16")["plan"]
    assert plan["causal"] is True and plan["page_size"] == bs
    assert plan["num_qo_heads"] == 8 and plan["head_dim_qk"] == 64 and plan["q_data_type"] == "bfloat16"
    assert plan["seq_lens"].tolist() == s.seq_lens.tolist() and plan["seq_lens_q"].tolist() == s.query_lens.tolist()
    assert plan["max_token_per_sequence"] == s.query_lens.max() and plan["max_sequence_kv"] == s.seq_lens.max()
    for r in range(n):
        row = plan["block_tables"][r]
        assert row[:pages[r]].tolist() == blocks[r][:pages[r]].tolist() and (row[pages[r]:] == 0).all()
    for name in ("qo_indptr", "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len"):
        assert plan[name].tolist() == f["attention"][name].tolist()
    assert f["batch_indices"].tolist() == np.repeat(np.arange(n), s.query_lens).tolist()
    g = prepack.sglang.make_forward_batch(s)
    order = g["seq_order"]  # extends, then decodes (mix_with_running)
    assert order.tolist() == [q for q in range(n) if not s.decodes[q]] + [q for q in range(n) if s.decodes[q]]
    assert g["out_cache_loc"].tolist() == [int(x) for seq in order for x in
                                           s.slot_mapping[s.cu_seqlens_q[seq]:s.cu_seqlens_q[seq + 1]]]
    if g["forward_mode"] != "DECODE":
        assert g["extend_start_loc"].tolist() == [0] + np.cumsum(s.query_lens[order])[:-1].tolist()
    else:
        assert g["extend_start_loc"] is None and g["extend_seq_lens"] is None
    for r, seq in enumerate(order):
        p = np.arange(s.seq_lens[seq])
        assert g["req_to_token"][r, :len(p)].tolist() == (blocks[seq][p // bs].astype(np.int64) * bs + p % bs).tolist()
    # The pool's own table, rows at req_pool_indices (write_req_to_token_pool_triton for extends:
    # [0, seq_len); prepare_for_decode: the new position); the rest untouched.
    rows = (np.arange(n) * 2 + 1).astype(np.int64)
    g = prepack.sglang.make_forward_batch(s, req_pool_indices=rows)
    table = np.full((2 * n + 3, int(s.seq_lens.max()) + 2), -5, np.int32)
    want = table.copy()
    for r, seq in enumerate(order):
        first = int(s.seq_lens[seq]) - 1 if s.decodes[seq] else 0
        p = np.arange(first, s.seq_lens[seq])
        want[rows[r], p] = blocks[seq][p // bs] * bs + p % bs
    prepack.sglang.write_req_to_token(s, g, table)
    assert np.array_equal(table, want)


@pytest.mark.parametrize("policy", ["whole_first", "fill"])
def test_schedules_cover_every_prompt_within_the_budget(policy):
    rng = np.random.default_rng(11)
    for trial in range(20):
        lengths = rng.integers(1, 300, size=int(rng.integers(1, 30)))
        budget = int(rng.integers(16, 256))
        sched = prepack.budgeted_schedule(lengths, budget=budget, policy=policy)
        sched.check()
        c = sched.chunks()
        for st in range(sched.n_steps):
            assert c["length"][c["step"] == st].sum() <= budget
        for i, L in enumerate(lengths):
            mine = c["item"] == i
            assert c["length"][mine].sum() == L and c["start"][mine].tolist() == np.cumsum(np.r_[0, c["length"][mine][:-1]]).tolist()
        if policy == "fill":
            assert sched.n_steps == sched.lower_bound == -(-int(lengths.sum()) // budget)


@pytest.mark.parametrize("prefix", [False, True])
def test_steps_and_engine_forms_by_definition_and_as_the_cpp_api(cpp, prefix):
    rng = np.random.default_rng(12)
    block_size, n_blocks = 8, 4096
    if prefix:
        shared = rng.integers(0, 1000, 70).tolist()
        prompts = [shared + p for p in random_prompts(rng, 12, 1, 90)] + random_prompts(rng, 5, 1, 90)
    else:
        prompts = random_prompts(rng, 19, 1, 150)
    scenario = {"kind": "steps", "prompts": prompts, "budget": 96, "policy": "fill",
                "block_size": block_size, "n_blocks": n_blocks, "prefix": prefix,
                "num_layers": 3, "chunk_block_size": block_size}
    c = cpp(scenario)
    alloc = prepack.BlockAllocator(n_blocks, null_block=True)  # block 0: vLLM's null block
    if prefix:
        plan = prepack.prefix_plan(prompts, block_size=block_size)
        assert plan.n_prefixes >= 1 and plan.tokens_computed < plan.useful_tokens
        sched = plan.schedule(budget=96, policy="fill", block_size=block_size)
        items = plan.item_tokens(prompts)
        tables, _ = plan.allocate_tables(alloc)
        plan.check_tables(tables)
    else:
        sched = prepack.budgeted_schedule([len(p) for p in prompts], budget=96, policy="fill",
                                          block_size=block_size)
        items = prepack.Prompts(prompts)
        tables = whole_prompt_tables(prompts, block_size, alloc)
    assert sched.n_steps == c["n_steps"]
    item_lists = [items[i].tolist() for i in range(len(items))]
    for st in range(sched.n_steps):
        s = prepack.step_inputs(sched, st, items, tables, n_blocks)
        cs = c["steps"][st]
        check_step_definitions(s, item_lists, sched.chunks(st))
        check_engine_definitions(s)
        for name in ("seq_id", "context_lens", "query_lens", "seq_lens", "cu_seqlens_q", "cu_seqlens_k",
                     "completes", "decodes", "prompt_lens", "block_table", "tokens", "positions",
                     "token_seq_id", "logits", "slot_mapping"):
            equal(getattr(s, name), cs[name], name)
        for engine, form in (("vllm", prepack.vllm.make_step(s)), ("flashinfer", prepack.flashinfer.make_step(s)),
                             ("sglang", prepack.sglang.make_forward_batch(s))):
            for name, want in cs[engine].items():
                got = form["attention"][name] if engine == "flashinfer" and name in form["attention"] else form.get(name)
                if name == "cascade":
                    assert (form["cascade"] is not None) == want
                elif np.isscalar(want):
                    assert got == want, (engine, name)
                else:
                    equal(got, want, f"{engine}.{name}")
        if "error" in cs["trtllm"]:
            with pytest.raises(ValueError) as e:
                prepack.trtllm.make_step(s, num_layers=3)
            assert str(e.value) == cs["trtllm"]["error"]
        else:
            t = prepack.trtllm.make_step(s, num_layers=3)
            for name, want in cs["trtllm"].items():
                equal(t[name], want, f"trtllm.{name}")
            assert t["kv_cache_block_offsets"].shape == (1, s.n_seqs, 2, t["kv_cache_block_offsets"].shape[3])
            # Two pools, layer-first, K-only (WindowBlockManager::setOffsets: block b, field 0).
            u = prepack.trtllm.make_step(s, pool_layers=[2, 5], layer_first=True, k_only=True)
            o = u["kv_cache_block_offsets"]
            assert o.shape[:3] == (2, s.n_seqs, 2)
            for r, seq in enumerate(u["seq_order"]):
                row = s.block_table[seq]
                row = row[row >= 0]
                assert (o[:, r, :, :len(row)] == row).all() and (o[:, r, :, len(row):] == 0).all()
        if not prefix:
            b = prepack.llama_cpp.make_batch(sched, st, items, np.arange(len(prompts)))
            for name, want in cs["llama_cpp"].items():
                equal(b[name], want, f"llama_cpp.{name}")
            assert b["token"].tolist() == s.tokens.tolist() and b["pos"].tolist() == s.positions.tolist()


def test_decode_inputs_and_step_layout():
    alloc = prepack.BlockAllocator(64, null_block=True)
    tables = prepack.BlockTables.from_lists([alloc.allocate(2).tolist(), alloc.allocate(1).tolist()], 4)
    d = prepack.decode_inputs([7, 9], [11, 12], [5, 2], tables, 64, prompt_lens=[5, 2])
    assert d.decodes.tolist() == [1, 1] and d.positions.tolist() == [5, 2]
    assert d.slot_mapping.tolist() == [int(tables.table[0, 1]) * 4 + 1, int(tables.table[1, 0]) * 4 + 2]
    assert d.token_seq_id.tolist() == [7, 9] and d.logits.tolist() == [1, 1]
    sched = prepack.budgeted_schedule([10, 3], budget=6, policy="fill")
    items = [list(range(10)), [20, 21, 22]]
    t2 = prepack.BlockTables.from_lists([[0, 1, 2], [3]], 4)
    lay = prepack.step_layout(sched, 1, items, t2, 8)
    b = lay["batch"]
    assert b.prompt_context.tolist() == [int(x) for x in sched.chunks(1)["context"]]
    ids = b.unpack(b.input_ids)
    c = sched.chunks(1)
    for k in range(len(ids)):
        item, start, n = c["item"][k], c["start"][k], c["length"][k]
        assert ids[k].tolist() == items[item][start:start + n]
    slots = lay["slot_mapping"].reshape(b.n_rows, b.width)
    assert (slots[b.segment_ids < 0] == -1).all()


def test_bad_steps_raise_with_the_cpp_message():
    sched = prepack.budgeted_schedule([10, 3], budget=8)
    t = prepack.BlockTables.from_lists([[1, 2, 3], [4]], 4)
    items = [list(range(10)), [1, 2, 3]]
    cases = [
        (lambda: prepack.budgeted_schedule([3, 0], budget=8), "prompt 1: length 0"),
        (lambda: prepack.budgeted_schedule([3], budget=0), "budget 0"),
        (lambda: prepack.budgeted_schedule([3], budget=4, block_size=8), "block size 8 exceeds the budget 4"),
        (lambda: prepack.budgeted_schedule([3], policy="greedy"), "policy: 'greedy', expected one of"),
        (lambda: prepack.step_inputs(sched, 9, items, t, 8), "step 9 outside the schedule's"),
        (lambda: prepack.step_inputs(sched, 0, [list(range(9)), [1, 2, 3]], t, 8), "prompt 0: 9 tokens, the schedule says 10"),
        (lambda: prepack.step_inputs(sched, 1, items, prepack.BlockTables.from_lists([[1, 2, 9], [4]], 4), 8),
         "prompt 0: block_table[2] = 9 outside the pool's blocks 0..7"),
        (lambda: prepack.step_inputs(sched, 1, items, prepack.BlockTables.from_lists([[1, 2, 3], [3]], 4), 8),
         "block 3 is also written by prompt"),
        (lambda: prepack.step_inputs(sched, 1, items, prepack.BlockTables.from_lists([[1, 2], [4]], 4), 8),
         "prompt 0: positions up to 10 need 3 blocks of 4, its block table has 2 entries"),
        (lambda: prepack.vllm.make_step(prepack.step_inputs(sched, 0, items, prepack.BlockTables.from_lists([[0, 1, 2], [4]], 4), 8)),
         "vllm: request 0: block_table[0] = 0, vLLM's null block"),
        (lambda: prepack.step_inputs(sched, 0, items, t, 8, seq_ids=[1]), "sequence ids: 1 for 2 items"),
        (lambda: prepack.BlockTables.from_lists([[0, -2]], 4), "sequence 0: block 1 is -2"),
        (lambda: prepack.BlockAllocator(4).allocate(5), "block allocator: 5 blocks wanted, 4 of 4 free"),
        (lambda: prepack.vllm.make_step(prepack.step_inputs(sched, 0, items, t, 8), max_num_blocks_per_req=1),
         "vllm: max_num_blocks_per_req 1 is below a request's"),
        (lambda: prepack.llama_cpp.make_batch(sched, 1, items, [0, 300]), "seq_id 300 outside llama.cpp's 0..255"),
        (lambda: prepack.prefix_plan([[1, 2], []]), "length 0"),
        (lambda: prepack.sequence_inputs([7, 8], [[1, 2]], [0, 0], t, 8), "sequence inputs: 2 ids, 1 token lists"),
        (lambda: prepack.sglang.write_req_to_token(
            prepack.sequence_inputs([7], [[1]], [0], t, 8),
            prepack.sglang.make_forward_batch(prepack.sequence_inputs([7], [[1]], [0], t, 8), req_pool_indices=[9]),
            np.zeros((4, 8), np.int32)), "sglang: request 7: req_pool_indices[0] = 9 outside the pool's rows 0..3"),
        (lambda: prepack.sequence_inputs([7], [[1, 2]], [-1], t, 8), "sequence 7: context -1"),
        (lambda: prepack.sequence_inputs([7], [[]], [0], t, 8), "sequence 7: no tokens to compute"),
        (lambda: prepack.sequence_inputs([7, 8], [[1] * 5, [2]], [9, 0], t, 8),
         "sequence 7: positions up to 14 need 4 blocks of 4, its block table has 3 entries"),
        (lambda: prepack.sequence_inputs([7, 8], [[1], [2]], [4, 0], prepack.BlockTables.from_lists([[1, 2], [1]], 4), 8),
         "sequence 7: block 1 (entry 0) holds context it reads, but sequence 8 writes that block"),
        (lambda: prepack.vllm.make_step(prepack.sequence_inputs([7], [[1]], [0], t, 8), runner="v3"),
         "runner 'v3', not 'v1' or 'v2'"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError) as e:
            call()
        assert message in str(e.value), (message, str(e.value))


def test_sequence_inputs_follow_the_callers_schedule():
    """A step the caller scheduled (prepack.sequence_inputs) holds each sequence's tokens at its
    positions over its blocks, in the caller's order, with the defaults the docstring states."""
    t = prepack.BlockTables.from_lists([[5, 6], [1], [2, 3]], 4)
    s = prepack.sequence_inputs([30, 10, 20], [[9, 8, 7], [4], [1, 2]], [4, 0, 5], t, 8,
                                prompt_lens=[7, 1, 5])
    assert s.seq_id.tolist() == [30, 10, 20]
    assert s.context_lens.tolist() == [4, 0, 5] and s.query_lens.tolist() == [3, 1, 2]
    assert s.positions.tolist() == [4, 5, 6, 0, 5, 6]
    assert s.slot_mapping.tolist() == [6 * 4 + 0, 6 * 4 + 1, 6 * 4 + 2, 1 * 4 + 0, 3 * 4 + 1, 3 * 4 + 2]
    assert s.completes.tolist() == [1, 1, 1] and s.decodes.tolist() == [0, 0, 1]
    assert s.prompt_lens.tolist() == [7, 1, 5]
    d = prepack.sequence_inputs([1], [[3]], [2], prepack.BlockTables.from_lists([[4]], 4), 8)
    assert d.prompt_lens.tolist() == [3] and d.completes.tolist() == [1] and d.decodes.tolist() == [0]
