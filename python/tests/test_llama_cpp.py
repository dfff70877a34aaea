"""libllama itself (built by llama-cpp-python from PyPI) as the oracle of prepack's llama.cpp
form, on the real model the other oracle tests use (SmolLM2-135M-Instruct, Q4_1 GGUF).

A budgeted schedule and a shared-prefix plan of text prompts go to llama_decode batch by batch,
shared prefixes as llama_memory_seq_cp copies, under both of llama.cpp's KV layouts: one stream
per sequence (its default, kv_unified = false: a copy across streams must be whole) and a
unified buffer. Every batch must be accepted, every prompt must get exactly one logits row, and
its logits must equal the prompt run alone in a fresh context within llama.cpp's own spread
(llama.cpp's results depend a little on what else shares a batch: the bound is what it gives
itself for the same prompt when others share its batches), with the same greedy token.
"""
import ctypes

import numpy as np
import pytest

from conftest import need, real_model_file, report

llama = need("llama_cpp", whole_file=True)
path = real_model_file()
import prepack  # noqa: E402

TEXTS = [
    "The capital of France is",
    "Once upon a time, there was a little girl who lived in a village near the forest. "
    "Whenever she went out, the little girl wore a red riding cloak, so everyone in the "
    "village called her Little Red Riding Hood. One morning,",
    "def fibonacci(n):\n    ",
    "Q: What is 12 times 12?\nA:",
    "You are a helpful assistant. Answer briefly.\nUser: What is the boiling point of water?\n"
    "Assistant:",
    "You are a helpful assistant. Answer briefly.\nUser: Name the largest planet.\nAssistant:",
    "You are a helpful assistant. Answer briefly.\nUser: Who wrote Hamlet?\nAssistant:",
    "Translate to French: good morning ->",
]


@pytest.fixture(scope="module")
def model():
    llama.llama_backend_init()
    mp = llama.llama_model_default_params()
    # The weights in the plain CPU buffer: on a CPU with AMX (Intel Sapphire Rapids and later),
    # libllama's extra buffer types repack them for its AMX kernels, whose matrix product
    # segfaults inside llama_decode on this model (ggml-org/llama.cpp#20824, seen here with
    # llama-cpp-python 0.3.36). What this test checks, libllama's batches in prepack's form
    # against each prompt alone, does not depend on how libllama lays out its weights.
    mp.use_extra_bufts = False
    m = llama.llama_model_load_from_file(path.encode(), mp)
    assert m, "llama.cpp could not load the model"
    yield m
    llama.llama_model_free(m)


def tokenize(m, text):
    vocab = llama.llama_model_get_vocab(m)
    buf = (llama.llama_token * 512)()
    n = llama.llama_tokenize(vocab, text.encode(), len(text.encode()), buf, 512, True, False)
    assert n > 0
    return list(buf[:n])


def context(m, n_seq_max, unified, n_batch=512):
    cp = llama.llama_context_default_params()
    cp.n_ctx = 512 * n_seq_max
    cp.n_batch = n_batch
    cp.n_ubatch = n_batch
    cp.n_seq_max = n_seq_max
    cp.kv_unified = unified
    cp.n_threads = 2
    cp.n_threads_batch = 2
    ctx = llama.llama_init_from_model(m, cp)
    assert ctx
    return ctx


def decode(ctx, form, n_vocab):
    """llama_decode of one batch in prepack's form; the logits of its output rows, in order."""
    n = int(form["n_tokens"])
    b = llama.llama_batch_init(max(n, 1), 0, 1)
    try:
        b.n_tokens = n
        for i in range(n):
            b.token[i] = int(form["token"][i])
            b.pos[i] = int(form["pos"][i])
            b.n_seq_id[i] = int(form["n_seq_id"][i])
            b.seq_id[i][0] = int(form["seq_id"][i])
            b.logits[i] = int(form["logits"][i])
        rc = llama.llama_decode(ctx, b)
        assert rc == 0, f"llama_decode refused a batch of prepack's form: {rc}"
        rows = [i for i in range(n) if form["logits"][i]]
        return [np.ctypeslib.as_array(llama.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).copy()
                for i in rows]
    finally:
        llama.llama_batch_free(b)


def alone(m, prompt, n_vocab):
    ctx = context(m, 1, False)
    try:
        form = {"n_tokens": len(prompt), "token": prompt, "pos": list(range(len(prompt))),
                "n_seq_id": [1] * len(prompt), "seq_id": [0] * len(prompt),
                "logits": [0] * (len(prompt) - 1) + [1]}
        return decode(ctx, form, n_vocab)[0]
    finally:
        llama.llama_free(ctx)


@pytest.mark.parametrize("unified", [False, True])
@pytest.mark.parametrize("prefix", [False, True])
def test_llama_decode_accepts_prepacks_batches_and_copies(model, unified, prefix):
    prompts = [tokenize(model, t) for t in TEXTS]
    n_vocab = llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(model))
    ids = np.arange(len(prompts), dtype=np.int64)
    ctx = context(model, len(prompts), unified)
    mem = llama.llama_get_memory(ctx)
    got = {}
    steps = copies = 0
    try:
        if prefix:
            plan = prepack.prefix_plan(prompts, block_size=4, min_length=8)
            assert plan.n_prefixes >= 1
            sched = plan.schedule(budget=48, policy="fill")
            for st in prepack.llama_cpp.make_prefix_steps(plan, sched, prompts, ids,
                                                          n_seq_max=len(prompts)):
                rows = decode(ctx, st["batch"], n_vocab)
                for item, row in zip(st["batch"]["output_item"], rows):
                    for i in np.flatnonzero(plan.prompt_last_item == item):
                        assert i not in got
                        got[int(i)] = row
                for src, dst, p0, p1 in st["copies_after"]:
                    llama.llama_memory_seq_cp(mem, int(src), int(dst), int(p0), int(p1))
                    copies += 1
                steps += 1
        else:
            sched = prepack.budgeted_schedule([len(p) for p in prompts], budget=48, policy="fill")
            for s in range(sched.n_steps):
                form = prepack.llama_cpp.make_batch(sched, s, prompts, ids, n_seq_max=len(prompts))
                rows = decode(ctx, form, n_vocab)
                for item, row in zip(form["output_item"], rows):
                    assert int(item) not in got
                    got[int(item)] = row
                steps += 1
        assert sorted(got) == list(range(len(prompts)))  # one logits row per prompt
        worst = 0.0
        for i, p in enumerate(prompts):
            want = alone(model, p, n_vocab)
            rel = np.abs(got[i] - want).max() / np.abs(want).max()
            worst = max(worst, rel)
            assert np.argmax(got[i]) == np.argmax(want), f"prompt {i}: another greedy token"
            assert rel < 0.05, f"prompt {i}: logits {rel:.2%} of their scale from running alone"
        report(f"kv_unified={unified} prefix={prefix}: {steps} batches, {copies} seq_cp copies, "
              f"logits within {worst:.2e} of their scale of each prompt alone")
    finally:
        llama.llama_free(ctx)


def test_without_the_copies_the_sharers_lose_their_prefix(model):
    """The control: the copies carry the prefix. Without them llama.cpp still takes the sharers'
    batches (a sequence holding nothing may start at any position) but they attend to nothing
    before their own tokens, and their logits are not the prompt's."""
    prompts = [tokenize(model, t) for t in TEXTS]
    n_vocab = llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(model))
    ids = np.arange(len(prompts), dtype=np.int64)
    plan = prepack.prefix_plan(prompts, block_size=4, min_length=8)
    sched = plan.schedule(budget=48, policy="fill")
    ctx = context(model, len(prompts), False)
    got = {}
    try:
        for st in prepack.llama_cpp.make_prefix_steps(plan, sched, prompts, ids,
                                                      n_seq_max=len(prompts)):
            for item, row in zip(st["batch"]["output_item"], decode(ctx, st["batch"], n_vocab)):
                for i in np.flatnonzero(plan.prompt_last_item == item):
                    got[int(i)] = row
    finally:
        llama.llama_free(ctx)
    sharers = {int(i) for p in plan.prefixes for i in p["sharers"][1:]}
    assert sharers
    worst = max(np.abs(got[i] - alone(model, prompts[i], n_vocab)).max() for i in sharers)
    assert worst > 1.0, "without the copies the sharers' logits should differ"
