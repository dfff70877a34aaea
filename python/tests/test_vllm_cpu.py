"""vLLM's own CPU attention backend as the oracle of prepack's vLLM form.

prepack.Scheduler serves a stream (a shared system prompt and few-shot prefix, prompts longer
than the budget chunked over their cached context, decodes mixed in, prefix-cache hits, a pool
tight enough to preempt); every step goes through prepack.vllm.make_step and then through the
ops vLLM's CPU backend runs (vllm/v1/attention/backends/cpu_attn.py:
CPUAttentionMetadataBuilder.build -> ops.cpu_attn_get_scheduler_metadata;
CPUAttentionBackendImpl.do_kv_cache_update -> ops.cpu_attn_reshape_and_cache; .forward ->
ops.cpu_attention_with_kv_cache), on a KV cache laid out as vLLM allocates it for that backend
([num_blocks, num_kv_heads, block_size, 2 * head_size]). Each token's query, key and value are a
function of the tokens up to it (as a model's are), so a prefix-cache hit reads what the request
would have computed. Every output must equal a naive causal attention of each sequence over its
own positions; a swapped block-table entry must not.
"""
import hashlib

import numpy as np
import pytest

from conftest import need, report

torch = need("torch", whole_file=True)
need("vllm", whole_file=True)
import prepack  # noqa: E402
from vllm import _custom_ops as ops  # noqa: E402
from vllm.v1.attention.backends.cpu_attn import _get_attn_isa  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 64
# The block sizes vLLM's CPU backend takes, from vLLM itself (MultipleOf(32)).
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend  # noqa: E402

KERNEL_BLOCK = CPUAttentionBackend.get_supported_kernel_block_sizes()[0].base


def vectors(tokens, position, dtype):
    """q [HEADS, HEAD_DIM], k and v [KV_HEADS, HEAD_DIM] of the token at `position`, a function of
    tokens[:position + 1] alone."""
    h = hashlib.blake2b(np.asarray(tokens[:position + 1], np.int64).tobytes(), digest_size=8)
    g = torch.Generator().manual_seed(int.from_bytes(h.digest(), "little") >> 1)
    x = torch.randn(HEADS + 2 * KV_HEADS, HEAD_DIM, generator=g)
    return x[:HEADS].to(dtype), x[HEADS:HEADS + KV_HEADS].to(dtype), x[HEADS + KV_HEADS:].to(dtype)


def naive(tokens, first, last, dtype):
    """Causal attention of positions [first, last) over positions [0, last): [last - first,
    HEADS, HEAD_DIM] in fp32."""
    qkv = [vectors(tokens, p, dtype) for p in range(last)]
    k = torch.stack([x[1] for x in qkv]).float()  # [last, KV_HEADS, D]
    v = torch.stack([x[2] for x in qkv]).float()
    out = []
    for p in range(first, last):
        q = qkv[p][0].float()  # [HEADS, D]
        kk = k[:p + 1].repeat_interleave(HEADS // KV_HEADS, dim=1)  # [p + 1, HEADS, D]
        vv = v[:p + 1].repeat_interleave(HEADS // KV_HEADS, dim=1)
        w = torch.softmax(torch.einsum("hd,thd->ht", q, kk) / HEAD_DIM ** 0.5, dim=-1)
        out.append(torch.einsum("ht,thd->hd", w, vv))
    return torch.stack(out)


def stream(seed, block_size):
    rng = np.random.default_rng(seed)
    system = rng.integers(1, 500, 2 * block_size + 7).tolist()
    shots = rng.integers(1, 500, block_size + 3).tolist()
    prompts = []
    for i in range(18):
        kind = i % 3
        head = system if kind == 0 else system + shots if kind == 1 else []
        tail = rng.integers(1, 500, int(rng.integers(1, 3 * block_size if i % 5 else 5 * block_size))).tolist()
        prompts.append(head + tail)
    return prompts


class VllmCpuAttention:
    """vLLM's CPU attention over one KV cache, as its backend runs a layer."""

    def __init__(self, n_blocks, block_size, dtype):
        self.dtype = dtype
        self.isa = _get_attn_isa(dtype, block_size, HEAD_DIM, "auto")
        self.kv_cache = torch.zeros(n_blocks, KV_HEADS, block_size, 2 * HEAD_DIM, dtype=dtype)
        view = self.kv_cache.view(n_blocks, KV_HEADS, block_size * 2, HEAD_DIM)
        self.key_cache, self.value_cache = view.chunk(2, dim=2)
        self.mirror = torch.zeros_like(self.kv_cache)  # written by prepack alone
        self.layout_checked = 0

    def step(self, form, q, k, v, write=True):
        t = lambda name, dtype: torch.from_numpy(np.ascontiguousarray(form[name])).to(dtype)  # noqa: E731
        query_start_loc = t("query_start_loc", torch.int32)
        seq_lens = t("seq_lens", torch.int32)
        block_table = t("block_table_tensor", torch.int32)
        slot_mapping = t("slot_mapping", torch.int64)
        if write:
            ops.cpu_attn_reshape_and_cache(k, v, self.key_cache, self.value_cache, slot_mapping,
                                           self.isa)
            # prepack's view of the same cache, written by prepack: bit for bit what vLLM wrote.
            if self.isa == "vec":
                bits = torch.int32 if self.dtype == torch.float32 else torch.int16
                prepack.vllm.write_cpu_cache(self.mirror, k, v, form["slot_mapping"])
                assert torch.equal(self.mirror.view(bits), self.kv_cache.view(bits))
                self.layout_checked += 1
        meta = ops.cpu_attn_get_scheduler_metadata(
            num_reqs=form["num_reqs"], num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM,
            seq_lens=seq_lens, dtype=self.dtype, query_start_loc=query_start_loc, causal=True,
            sliding_window_size=-1, isa=self.isa, enable_kv_split=False)
        out = torch.empty(q.shape[0], HEADS, HEAD_DIM, dtype=self.dtype)
        ops.cpu_attention_with_kv_cache(
            query=q, key_cache=self.key_cache, value_cache=self.value_cache, output=out,
            query_start_loc=query_start_loc, seq_lens=seq_lens, scale=HEAD_DIM ** -0.5,
            causal=True, alibi_slopes=None, sliding_window=-1, block_table=block_table,
            softcap=0.0, scheduler_metadata=meta, s_aux=None)
        return out


# (block size, dtype, pool blocks, new tokens): the first pool is tight enough to preempt.
@pytest.mark.parametrize("block_size,dtype,n_blocks,new", [(32, torch.float32, 12, 40),
                                                          (128, torch.float32, 12, 4),
                                                          (32, torch.bfloat16, 40, 4)])
def test_vllm_cpu_attention_runs_prepacks_steps_exactly(block_size, dtype, n_blocks, new):
    prompts = stream(7, block_size)
    sched = prepack.Scheduler(token_budget=96, max_seqs=8, n_blocks=n_blocks,
                              block_size=block_size, policy="packed", prefix_cache=True,
                              null_block=True)
    tokens = {}
    for i, p in enumerate(prompts):
        sched.add(i, p, max_new_tokens=int(new + i % 4))
        tokens[i] = list(p)
    engine = VllmCpuAttention(n_blocks, block_size, dtype)
    tol = 2e-5 if dtype == torch.float32 else 3e-2
    steps = checked = decodes = prefill_over_context = mutations = 0
    worst = 0.0
    while not sched.idle:
        st = sched.next_step()
        s = st.inputs
        form = prepack.vllm.make_step(s, block_size_multiple=KERNEL_BLOCK)  # vLLM's batch order
        qsl = form["query_start_loc"]
        req_of_token = np.repeat(form["req_ids"], np.diff(qsl))
        qkv = [vectors(tokens[int(rid)], int(pos), dtype)
               for rid, pos in zip(req_of_token, form["positions"][:form["num_actual_tokens"]])]
        q = torch.stack([x[0] for x in qkv])
        k = torch.stack([x[1] for x in qkv])
        v = torch.stack([x[2] for x in qkv])
        out = engine.step(form, q, k, v)
        for r in range(form["num_reqs"]):
            rid, ctx = int(form["req_ids"][r]), int(form["num_computed_tokens"][r])
            a, b = int(qsl[r]), int(qsl[r + 1])
            n = b - a
            want = naive(tokens[rid], ctx, ctx + n, dtype)
            diff = (out[a:b].float() - want).abs().max().item()
            worst = max(worst, diff)
            assert diff < tol, f"step {steps}, request {rid}: {diff}"
            checked += n
            seq = int(form["req_order"][r])
            decodes += int(s.decodes[seq])
            prefill_over_context += int(not s.decodes[seq] and ctx > 0)
        # The test can fail: a block-table entry swapped for another request's block gives
        # another answer (attention is blind to the order of whole blocks, not to their content).
        bt = form["block_table_tensor"]
        rows = [r for r in range(form["num_reqs"]) if form["num_computed_tokens"][r] > 0]
        others = [b for b in range(1, n_blocks) if not (bt == b).any()]
        if rows and others and mutations < 3:
            r = rows[0]
            bad = dict(form)
            bad["block_table_tensor"] = bt.copy()
            bad["block_table_tensor"][r, 0] = others[0]
            out_bad = engine.step(bad, q, k, v, write=False)
            a, b = int(qsl[r]), int(qsl[r + 1])
            assert (out_bad[a:b].float() - out[a:b].float()).abs().max().item() > tol
            mutations += 1
        sampled = [int(hashlib.blake2b(str(tokens[int(s.seq_id[r])]).encode(), digest_size=2).hexdigest(), 16) % 500
                   for r in range(s.n_seqs) if s.completes[r]]
        j = 0
        for r in range(s.n_seqs):
            if s.completes[r]:
                tokens[int(s.seq_id[r])].append(sampled[j])
                j += 1
        sched.commit(sampled)
        steps += 1
    stats = sched.stats
    report(f"block_size {block_size} {dtype}: {steps} steps, {checked} query tokens checked, "
          f"{decodes} decodes, {prefill_over_context} chunks over cached context, "
          f"{stats['cache_hit_tokens']} prefix-cache tokens, {stats['preemptions']} preemptions; "
          f"worst {worst:.2e}")
    assert decodes > 0 and prefill_over_context > 0 and stats["cache_hit_tokens"] > 0
    assert mutations > 0
    assert stats["preemptions"] > 0 or new < 40  # the tight pool preempts
    # The cache layout, where vLLM writes it with its "vec" kernels (x86 without AMX).
    report(f"ISA {engine.isa}: cache writes compared bit for bit in {engine.layout_checked} steps")
    assert engine.layout_checked == steps or engine.isa != "vec"


def test_a_prefix_hit_on_a_block_written_in_the_same_step(dtype=torch.float32):
    """vLLM schedules a prefix-cache hit on a block another request computes in the same step,
    and it is right there: the layer writes the step's K and V (do_kv_cache_update) before
    attention reads them. prepack builds such a step with writes_before_reads, and vLLM's ops
    attend over the block as written this step; without it the step is refused."""
    block_size, n_blocks = 32, 8
    rng = np.random.default_rng(3)
    a = rng.integers(1, 500, 40).tolist()
    b = a[:block_size] + rng.integers(1, 500, 9).tolist()  # b's first block is a's
    sched = prepack.budgeted_schedule([40, 9], budget=64, contexts=[0, block_size])
    assert sched.n_steps == 1
    tables = prepack.BlockTables.from_lists([[1, 2], [1, 3]], block_size)
    items = [a, b[block_size:]]
    with pytest.raises(ValueError, match="holds context it reads, but prompt 0 writes that block"):
        prepack.step_inputs(sched, 0, items, tables, n_blocks)
    s = prepack.step_inputs(sched, 0, items, tables, n_blocks, writes_before_reads=True)
    form = prepack.vllm.make_step(s)
    engine = VllmCpuAttention(n_blocks, block_size, dtype)
    tokens = {0: a, 1: b}
    qsl = form["query_start_loc"]
    req_of_token = np.repeat(form["req_ids"], np.diff(qsl))
    qkv = [vectors(tokens[int(r)], int(p), dtype) for r, p in zip(req_of_token, form["positions"])]
    out = engine.step(form, *(torch.stack([x[i] for x in qkv]) for i in range(3)))
    for r in range(form["num_reqs"]):
        rid, ctx = int(form["req_ids"][r]), int(form["num_computed_tokens"][r])
        want = naive(tokens[rid], ctx, ctx + int(qsl[r + 1] - qsl[r]), dtype)
        assert (out[qsl[r]:qsl[r + 1]].float() - want).abs().max().item() < 2e-5


def test_block_sizes_the_cpu_backend_refuses_are_refused():
    """vLLM's CPU engine refuses block size 16 ("No common block size for 16 (CPU_ATTN:
    [MultipleOf(32)])"); so does the form asked for the CPU backend's multiple."""
    assert KERNEL_BLOCK == 32
    sched = prepack.budgeted_schedule([5], budget=8)
    s = prepack.step_inputs(sched, 0, [[1, 2, 3, 4, 5]], prepack.BlockTables.from_lists([[1]], 16), 4)
    with pytest.raises(ValueError, match="block size 16 is not a multiple of 32"):
        prepack.vllm.make_step(s, block_size_multiple=KERNEL_BLOCK)
    prepack.vllm.make_step(s)  # unchecked without it (FlashAttention takes 16)
