"""prepack.hf on transformers' own models, checked against transformers itself: every prompt's
last-token logits and cache from one prepacked forward pass equal running the prompt alone, and
the batch cache holds what transformers' own cache holds after a padded prefill, for every decoder
family (full attention, sliding windows shorter than the prompts, local and global layers) under
eager, sdpa and flex attention; generate equals model.generate on each prompt alone, with
generate's own arguments; inputs in every form users have them; what cannot be packed is refused
by name."""
import contextlib
import functools
import inspect

import numpy as np
import pytest

from conftest import cache_argument, need, output_cache, report

torch = need("torch", whole_file=True)
transformers = need("transformers", whole_file=True)
import prepack  # noqa: E402
import prepack.hf as hf  # noqa: E402
from virtual_device import uncompiled  # noqa: E402

VOCAB = 512
WINDOW = 8  # shorter than most prompts below
SHAPE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


def family(name, seed=0):
    """A small random model of the family (fp32, eval), with sliding-window layers where the
    family has them: a window of WINDOW slots, shorter than the prompts."""
    torch.manual_seed(seed)
    t = transformers
    mixed = ["full_attention", "sliding_attention", "sliding_attention"]
    if name == "llama":
        m = t.LlamaForCausalLM(t.LlamaConfig(**SHAPE))
    elif name == "qwen2":
        m = t.Qwen2ForCausalLM(t.Qwen2Config(**SHAPE, use_sliding_window=True, sliding_window=WINDOW,
                                             max_window_layers=1, layer_types=mixed))
    elif name == "qwen3":
        m = t.Qwen3ForCausalLM(t.Qwen3Config(**SHAPE, head_dim=16, use_sliding_window=True,
                                             sliding_window=WINDOW, max_window_layers=1))
    elif name == "mistral":
        m = t.MistralForCausalLM(t.MistralConfig(**SHAPE, sliding_window=WINDOW))
    elif name == "gemma2":
        m = t.Gemma2ForCausalLM(t.Gemma2Config(**SHAPE, head_dim=16, sliding_window=WINDOW,
                                               layer_types=mixed[::-1]))
    elif name == "gemma3":
        m = t.Gemma3ForCausalLM(t.Gemma3TextConfig(**SHAPE, head_dim=16, sliding_window=WINDOW,
                                                   layer_types=mixed))
    elif name == "phi3":
        m = t.Phi3ForCausalLM(t.Phi3Config(**SHAPE, pad_token_id=0, sliding_window=WINDOW))
    elif name == "gpt_oss":  # attention sinks, sliding and full layers, experts
        m = t.GptOssForCausalLM(t.GptOssConfig(**dict(SHAPE, intermediate_size=64), head_dim=16,
                                               num_local_experts=4, num_experts_per_tok=2,
                                               sliding_window=WINDOW, layer_types=mixed[::-1],
                                               rope_parameters={"rope_type": "default",
                                                                "rope_theta": 150000.0}))
    elif name == "gpt2":
        m = t.GPT2LMHeadModel(t.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=3, n_head=4,
                                           n_positions=512))
    else:
        raise ValueError(name)
    return m.eval()


FAMILIES = ["llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3", "phi3", "gpt2", "gpt_oss"]
_FLAGS = {"sdpa": "_supports_sdpa", "flex_attention": "_supports_flex_attn"}


def supported(m, impl):
    """Skips where transformers itself does not run the model under impl here."""
    if not getattr(type(m), _FLAGS.get(impl, ""), True):
        pytest.skip(f"transformers' {type(m).__name__} does not support {impl}")
    if impl == "flex_attention" and getattr(m.config, "model_type", "") == "gpt_oss":
        pytest.skip("transformers runs attention sinks under flex_attention on CUDA only")
_MODELS = {}


def model(name, impl, dtype=torch.float32):
    key = (name, dtype)
    if key not in _MODELS:
        _MODELS[key] = family(name).to(dtype)
    m = _MODELS[key]
    m.config._attn_implementation = impl
    return m


def sdpa_or_eager(name, dtype=torch.float32):
    """The family's model under sdpa, or eager where transformers' class does not support sdpa
    (Gemma 2 from transformers 5.24: sdpa has no logit softcapping)."""
    m = model(name, "eager", dtype)
    return model(name, "sdpa" if getattr(type(m), "_supports_sdpa", True) else "eager", dtype)


def heavy_prompts(n=10, seed=1, top=48):
    """Heavy-tailed lengths (most short, a few long), some of one token."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(2.4, 0.9, n).astype(int), 1, top).tolist()
    lengths[0], lengths[1] = top, 1
    return [rng.integers(0, VOCAB, L).tolist() for L in lengths]


def alone(m, prompt):
    """The prompt run alone, eager attention: (last logits, transformers' own cache)."""
    impl = m.config._attn_implementation
    m.config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            out = m(input_ids=torch.tensor([prompt]), use_cache=True)
    finally:
        m.config._attn_implementation = impl
    return out.logits[0, -1], output_cache(out)


def scale_of(x):
    return x.float().abs().max().item()


def compare_prefill(m, prompts):
    """max |difference| / max |value|: (logits, batch cache, per-prompt caches) against each
    prompt alone; the batch cache's layers also against transformers' own after padded prefill
    (class, shape, positions seen, values on real columns)."""
    batch = hf.prefill(m, prompts)
    each = hf.prefill(m, prompts, cache="prompts")
    padded = hf.padded_prefill(m, prompts)
    longest = max(map(len, prompts))
    dl = db = dp = sl = sk = 0.0
    for i, p in enumerate(prompts):
        logits, own = alone(m, p)
        sl = max(sl, scale_of(logits))
        dl = max(dl, scale_of(batch.logits[i] - logits), scale_of(each.logits[i] - logits))
        for li, (mine_b, mine_p, ref) in enumerate(zip(batch.cache.layers, each.caches[i].layers,
                                                       own.layers)):
            kept = ref.keys.shape[2]  # a sliding layer keeps window - 1 positions
            assert type(mine_p) is type(ref) and mine_p.keys.shape == ref.keys.shape, (li, i)
            assert mine_p.get_seq_length() == ref.get_seq_length() == len(p)
            for a, b in ((mine_p.keys, ref.keys), (mine_p.values, ref.values)):
                dp = max(dp, scale_of(a - b))
            for a, b in ((mine_b.keys, ref.keys), (mine_b.values, ref.values)):
                db = max(db, scale_of(a[i:i + 1, :, a.shape[2] - kept:] - b))
            sk = max(sk, scale_of(ref.keys), scale_of(ref.values))
    real = padded.attention_mask.bool()
    assert torch.equal(batch.attention_mask, padded.attention_mask)
    assert torch.equal(batch.input_ids, padded.input_ids)
    for mine, ref in zip(batch.cache.layers, padded.cache.layers):
        assert type(mine) is type(ref) and mine.keys.shape == ref.keys.shape
        assert mine.get_seq_length() == ref.get_seq_length() == longest
        assert mine.get_mask_sizes(1) == ref.get_mask_sizes(1)
        cols = real[:, real.shape[1] - ref.keys.shape[2]:]  # the columns a layer keeps
        for a, b in ((mine.keys, ref.keys), (mine.values, ref.values)):
            d = (a - b).abs().amax(dim=(1, 3))[cols]
            db = max(db, d.max().item() if d.numel() else 0.0)
    return dl / sl, db / sk, dp / sk, batch


@pytest.mark.parametrize("impl", ["eager", "sdpa", "flex_attention"])
@pytest.mark.parametrize("name", FAMILIES)
def test_prefill_equals_each_prompt_alone(name, impl):
    m = model(name, impl)
    supported(m, impl)
    prompts = heavy_prompts()
    logits, batch_kv, prompt_kv, r = compare_prefill(m, prompts)
    report(f"{name} {impl}: logits {logits:.1e}, batch cache {batch_kv:.1e}, prompt caches "
           f"{prompt_kv:.1e} of their scale ({r.batch.n_rows} rows of {r.batch.width})")
    assert r.batch.n_rows < len(prompts)  # prompts really share rows
    assert logits < 1e-4 and batch_kv < 1e-4 and prompt_kv < 1e-4


@pytest.mark.parametrize("name", ["llama", "gemma2", "mistral"])
def test_bf16_within_padded_error(name):
    """bf16: prepacked rows are no further from each prompt alone than the padded batch is."""
    m = sdpa_or_eager(name, torch.bfloat16)
    prompts = heavy_prompts(seed=2)
    ours = hf.prefill(m, prompts)
    padded = hf.padded_prefill(m, prompts)
    worst_ours = worst_padded = 0.0
    for i, p in enumerate(prompts):
        logits, _ = alone(m, p)
        s = scale_of(logits)
        worst_ours = max(worst_ours, scale_of(ours.logits[i] - logits) / s)
        worst_padded = max(worst_padded, scale_of(padded.logits[i] - logits) / s)
    report(f"{name} bf16: prepacked {worst_ours:.1e}, padded {worst_padded:.1e} of the scale")
    assert ours.logits.dtype == torch.bfloat16 and torch.isfinite(ours.logits).all()
    assert worst_ours <= max(2 * worst_padded, 2 ** -7)


def generate_alone(m, prompt, **kw):
    ids = torch.tensor([prompt])
    out = m.generate(ids, attention_mask=torch.ones_like(ids), pad_token_id=0, **kw)
    return out[0, len(prompt):].tolist()


def sequences_alone(m, prompt, **kw):
    """model.generate on the prompt alone: every returned sequence's new tokens."""
    ids = torch.tensor([prompt])
    return m.generate(ids, attention_mask=torch.ones_like(ids), **kw)[:, len(prompt):].tolist()


@pytest.mark.parametrize("impl", ["eager", "sdpa", "flex_attention"])
@pytest.mark.parametrize("name", FAMILIES)
def test_greedy_generation_equals_generating_alone(name, impl):
    m = model(name, impl)
    supported(m, impl)
    m.generation_config.pad_token_id = 0
    prompts = heavy_prompts(8, seed=3)
    # flex attention uncompiled: compiled, a CPU compiles a kernel for every cache length
    with uncompiled() if impl == "flex_attention" else contextlib.nullcontext():
        got = hf.generate(m, prompts, 6, do_sample=False, decode_batches=1)
        for p, g in zip(prompts, got):
            assert g == generate_alone(m, p, max_new_tokens=6, do_sample=False), len(p)
        # Length-sorted decode batches, each from its own narrow cache: the same tokens.
        assert hf.generate(m, prompts, 6, do_sample=False, decode_batches=3) == got
        assert hf.generate(m, prompts, 6, do_sample=False) == got  # "auto"


def test_auto_decode_batches_minimise_the_modelled_cost():
    """decode_batches="auto"'s split against every split of the length-sorted prompts: the
    least of (batches) * fixed + sum over batches of (prompts) * (longest + extra)."""
    import itertools

    def cost(groups, lengths, fixed, extra):
        return sum(fixed + len(g) * (max(lengths[i] for i in g) + extra) for g in groups)

    rng = np.random.default_rng(5)
    for trial in range(60):
        n = int(rng.integers(1, 10))
        lengths = np.clip(rng.lognormal(2.5, 1.0, n).astype(int), 1, 300)
        if trial % 4 == 0:
            lengths[: n // 2] = lengths[0]  # ties
        fixed = float(rng.choice([0.0, 1.0, 30.0, 400.0, float("inf")]))
        extra = float(rng.choice([0.0, 8.0]))
        got = hf._decode_groups(lengths, fixed, extra)
        flat = np.concatenate(got)
        assert sorted(flat.tolist()) == list(range(n))
        assert all(lengths[a].max() <= lengths[b].min() for a, b in zip(got, got[1:]))
        order = sorted(range(n), key=lambda i: lengths[i])
        best = min(cost([order[a:b] for a, b in zip((0,) + cuts, cuts + (n,))], lengths, fixed,
                        extra)
                   for k in range(n) for cuts in itertools.combinations(range(1, n), k))
        assert cost(got, lengths, fixed, extra) == pytest.approx(best), (lengths, fixed, extra)
        if fixed == float("inf"):
            assert len(got) == 1


def test_default_decode_splits_only_where_nothing_sees_the_batch(monkeypatch):
    """The default, decode_batches="auto", on a CPU: length-sorted batches where the split shows
    in nothing but the time (here every distinct length its own batch: no fixed cost a batch),
    one batch under sampling, a caller's stopping criterion or logits processor, max_time,
    return_dict_in_generate and a streamer; the tokens are the same either way."""
    m = model("llama", "sdpa")
    m.generation_config.pad_token_id = 0
    prompts = heavy_prompts(6, seed=4)
    monkeypatch.setattr(hf, "_fixed_step_slots", lambda *a: 0.0)
    rows, times = [], []
    real = m.generate

    def spy(*args, **kwargs):
        rows.append(kwargs["input_ids"].shape[0])
        times.append(kwargs.get("max_time"))
        return real(*args, **kwargs)

    monkeypatch.setattr(m, "generate", spy)
    one = hf.generate(m, prompts, 4, do_sample=False, decode_batches=1)
    assert rows == [len(prompts)]
    rows.clear()
    assert hf.generate(m, prompts, 4, do_sample=False) == one
    assert sorted(rows) == sorted(np.unique([len(p) for p in prompts], return_counts=True)[1])

    class Never(transformers.StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    class Same(transformers.LogitsProcessor):
        def __call__(self, input_ids, scores):
            return scores

    for kw in (dict(do_sample=True, top_k=1),
               dict(stopping_criteria=transformers.StoppingCriteriaList([Never()])),
               dict(logits_processor=transformers.LogitsProcessorList([Same()])),
               dict(max_time=1e6)):
        rows.clear()
        got = hf.generate(m, prompts, 4, **dict(dict(do_sample=False), **kw))
        assert rows == [len(prompts)], kw
        assert got == one, kw
    rows.clear()
    out = hf.generate(m, prompts, 4, do_sample=False, return_dict_in_generate=True)
    assert rows == [len(prompts)] and out.sequences.shape[0] == len(prompts)
    # Several batches asked for: max_time bounds the whole call, each batch gets what is left.
    rows.clear(), times.clear()
    assert hf.generate(m, prompts, 4, do_sample=False, max_time=1e6, decode_batches=3) == one
    assert len(rows) == 3 and all(0 < t < 1e6 for t in times) and times == sorted(times)[::-1]


def test_generate_arguments_as_model_generate_takes_them():
    m = sdpa_or_eager("gemma2")
    m.generation_config.pad_token_id = 0
    prompts = heavy_prompts(6, seed=4)
    greedy = hf.generate(m, prompts, 5, do_sample=False)

    # EOS: a prompt whose first token is EOS stops there; the others at their own EOS.
    eos = greedy[2][0]
    got = hf.generate(m, prompts, 5, do_sample=False, eos_token_id=eos)
    assert got[2] == [eos]
    for p, g in zip(prompts, got):
        assert g == generate_alone(m, p, max_new_tokens=5, do_sample=False, eos_token_id=eos)

    # A stopping criterion: stops each sequence where it stops alone.
    class AfterToken(transformers.StoppingCriteria):
        def __init__(self, token):
            self.token = token

        def __call__(self, input_ids, scores, **kwargs):
            return input_ids[:, -1] == self.token

    stop = AfterToken(greedy[0][1])
    crit = transformers.StoppingCriteriaList([stop])
    got = hf.generate(m, prompts, 5, do_sample=False, stopping_criteria=crit)
    for p, g in zip(prompts, got):
        assert g == generate_alone(m, p, max_new_tokens=5, do_sample=False,
                                   stopping_criteria=transformers.StoppingCriteriaList([stop]))
    assert len(got[0]) == 2

    # Beam search (the cache expanded per beam), each prompt as alone.
    got = hf.generate(m, prompts, 4, num_beams=3, do_sample=False)
    for p, g in zip(prompts, got):
        assert g == generate_alone(m, p, max_new_tokens=4, num_beams=3, do_sample=False)

    # Sampling, its first token too: the same draws as model.generate on the padded batch.
    padded = hf.padded_prefill(m, prompts)
    for n_seq in (1, 3):
        torch.manual_seed(7)
        got = hf.generate(m, prompts, 5, do_sample=True, temperature=1.5,
                          num_return_sequences=n_seq)
        torch.manual_seed(7)
        want = m.generate(padded.input_ids, attention_mask=padded.attention_mask,
                          max_new_tokens=5, do_sample=True, temperature=1.5,
                          num_return_sequences=n_seq)
        assert got == want[:, padded.input_ids.shape[1]:].tolist()
        assert len(got) == len(prompts) * n_seq
    assert any(g[0] != w[0] for g, w in zip(got[::3], greedy))  # the first token was sampled

    # Several decode batches: each sequence where it is alone, returned in the prompts' order
    # (more beams than returned sequences: the cache holds 3 rows a prompt, the output 2).
    got = hf.generate(m, prompts, 4, num_beams=3, num_return_sequences=2, decode_batches=4,
                      do_sample=False)
    assert len(got) == 2 * len(prompts)
    for i, p in enumerate(prompts):
        ids = torch.tensor([p])
        want = m.generate(ids, attention_mask=torch.ones_like(ids), pad_token_id=0,
                          max_new_tokens=4, num_beams=3, num_return_sequences=2, do_sample=False)
        assert got[2 * i:2 * i + 2] == want[:, len(p):].tolist()
    with pytest.raises(ValueError, match="return_dict_in_generate and streamers take one batch"):
        hf.generate(m, prompts, 2, decode_batches=2, return_dict_in_generate=True)

    # return_dict_in_generate and scores; a streamer sees the batch, then every new token.
    class Collect(transformers.generation.streamers.BaseStreamer):
        def __init__(self):
            self.seen = []

        def put(self, value):
            self.seen.append(value.clone())

        def end(self):
            self.seen.append(None)

    streamer = Collect()
    out = hf.generate(m, prompts, 4, do_sample=False, return_dict_in_generate=True,
                      output_scores=True, streamer=streamer)
    assert out.sequences.shape == (len(prompts), padded.input_ids.shape[1] + 4)
    assert torch.equal(out.sequences[:, :padded.input_ids.shape[1]], padded.input_ids)
    assert out.sequences[:, -4:].tolist() == [g[:4] for g in greedy]
    assert len(out.scores) == 4 and out.scores[0].shape == (len(prompts), VOCAB)
    assert streamer.seen[-1] is None and len(streamer.seen) == 1 + 4 + 1
    assert torch.equal(streamer.seen[0], padded.input_ids)


@pytest.mark.parametrize("name", ["llama", "mistral", "gemma2"])
def test_generation_config_and_cache_classes(name):
    """A GenerationConfig object, use_cache=False and a static cache (named by argument or by the
    model's own generation config): each prompt's tokens as generating it alone with the same
    arguments; the static cache as large as model.generate makes it."""
    m = sdpa_or_eager(name)
    prompts = heavy_prompts(8, seed=6, top=30)

    def alone_tokens(p, **kw):
        return sequences_alone(m, p, **kw)

    gc = transformers.GenerationConfig(max_new_tokens=5, do_sample=False, repetition_penalty=3.0,
                                       pad_token_id=0)
    want = [s for p in prompts for s in alone_tokens(p, generation_config=gc)]
    assert hf.generate(m, prompts, generation_config=gc) == want
    assert all(len(w) == 5 for w in want)

    common = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    for kw in (dict(use_cache=False), dict(cache_implementation="static"),
               dict(cache_implementation="static", max_cache_len=64, num_beams=2,
                    num_return_sequences=2)):
        want = [s for p in prompts for s in alone_tokens(p, **common, **kw)]
        for batches in (1, 3):
            assert hf.generate(m, prompts, decode_batches=batches, **common, **kw) == want, kw

    # The static cache generate continues: as large as model.generate's own, the prompts in it.
    seen = []
    forward = m.forward

    @functools.wraps(forward)
    def spy(*args, **kwargs):
        seen.append(kwargs.get(cache_argument(m)))
        return forward(*args, **kwargs)

    m.forward = spy
    try:
        hf.generate(m, prompts, **common, cache_implementation="static")
    finally:
        del m.forward
    cache = seen[-1]  # the last decode step (the first is the packed prefill)
    assert isinstance(cache, transformers.StaticCache)
    longest = max(len(p) for p in prompts)
    size = longest + 6 - 1
    assert [layer.max_cache_len for layer in cache.layers] == [
        min(WINDOW, size) if layer.is_sliding else size for layer in cache.layers]
    assert cache.get_seq_length() >= longest  # the prompts' columns, then the steps run

    saved = m.generation_config.cache_implementation
    m.generation_config.cache_implementation = "static"  # as a generation_config.json may say
    try:
        want = [s for p in prompts for s in alone_tokens(p, **common)]
        assert hf.generate(m, prompts, **common) == want
    finally:
        m.generation_config.cache_implementation = saved
    with pytest.raises(ValueError, match="cache_implementation 'quantized'"):
        hf.generate(m, prompts, **common, cache_implementation="quantized")


def test_length_bounds_count_each_prompt_alone():
    """max_length and min_length bound each sequence by its own prompt's length, as generating it
    alone does (model.generate on the padded batch counts the batch's columns: asserted to
    differ, so the check can fail), under greedy and beam search, in one or several decode
    batches; a prompt not below max_length is refused by index."""
    m = sdpa_or_eager("gemma2")
    prompts = heavy_prompts(8, seed=3, top=24)
    padded = hf.padded_prefill(m, prompts)
    width = padded.input_ids.shape[1]

    def alone_tokens(p, **kw):
        return sequences_alone(m, p, pad_token_id=0, do_sample=False, **kw)

    greedy = hf.generate(m, prompts, 8, do_sample=False, pad_token_id=0)
    eos = greedy[1][1]  # prompt 1 (one token) emits it second: min_length holds it back
    cases = [dict(max_length=30), dict(max_length=30, num_beams=3, num_return_sequences=2),
             dict(max_new_tokens=8, min_length=12, eos_token_id=eos),
             # EOS forced at each sequence's own last step under max_length.
             dict(max_length=30, forced_eos_token_id=(eos + 1) % VOCAB)]
    for kw in cases:
        want = [s for p in prompts for s in alone_tokens(p, **kw)]
        for batches in (1, 3):
            assert hf.generate(m, prompts, decode_batches=batches, do_sample=False,
                               pad_token_id=0, **kw) == want, (kw, batches)
        out = m.generate(padded.input_ids, attention_mask=padded.attention_mask,
                         pad_token_id=0, do_sample=False, **kw)
        assert any(o[:len(w)] != w for o, w in zip(out[:, width:].tolist(), want)), kw
    assert len({len(w) for w in hf.generate(m, prompts, max_length=30, pad_token_id=0)}) > 1
    with pytest.raises(ValueError, match="prompt 0: length 24 is not below max_length 20"):
        hf.generate(m, prompts, max_length=20)


def test_assisted_decoding_generates_each_prompt_alone():
    """An assistant model or prompt lookup: each prompt's tokens as model.generate gives alone
    (transformers' assisted decoding takes one sequence a call and no prefilled cache)."""
    m = model("llama", "sdpa")
    torch.manual_seed(3)
    small = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**dict(SHAPE, num_hidden_layers=1))).eval()
    prompts = heavy_prompts(5, seed=3)
    common = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
    for kw in (dict(assistant_model=small), dict(prompt_lookup_num_tokens=3)):
        want = [generate_alone(m, p, max_new_tokens=6, do_sample=False, **kw) for p in prompts]
        assert hf.generate(m, prompts, **common, **kw) == want, list(kw)
    with pytest.raises(ValueError, match="assisted decoding takes one prompt a call"):
        hf.generate(m, prompts, **common, prompt_lookup_num_tokens=3,
                    return_dict_in_generate=True)


def test_processors_that_read_the_prompt_see_it_without_pads():
    """Repetition penalty, n-gram bans, sequence biases, bad words, a forced BOS and
    prefix_allowed_tokens_fn read the prompt: each prompt's tokens equal generating it alone, though the decode batch is
    left-padded with a token these processors would otherwise count (as model.generate on the
    padded batch does, asserted here so the check can fail)."""
    m = model("llama", "sdpa")
    prompts = heavy_prompts(8, seed=5, top=24)
    greedy = hf.generate(m, prompts, 6, do_sample=False, pad_token_id=0)
    pad = greedy[1][0]  # a token the model emits: penalising or banning it changes the output
    m.generation_config.pad_token_id = pad
    padded = hf.padded_prefill(m, prompts, pad_token_id=pad)
    width = padded.input_ids.shape[1]

    def alone_tokens(p, **kw):
        return sequences_alone(m, p, max_new_tokens=6, do_sample=False, **kw)

    cases = [dict(repetition_penalty=4.0), dict(no_repeat_ngram_size=2),
             # Sequences longer than prompt 1 (one token): alone, they never match it.
             dict(sequence_bias={(pad, prompts[1][0], 7): 30.0}),
             dict(bad_words_ids=[[pad, prompts[1][0], greedy[1][0]]]),
             dict(repetition_penalty=2.0, num_beams=3, num_return_sequences=2),
             # Forced at the first step of a one-token prompt (prompt 1), as alone.
             dict(forced_bos_token_id=(greedy[1][0] + 1) % VOCAB)]
    # transformers' repetition penalty skips a padded batch's left pads itself where it takes
    # prompt_ignore_length (5.24 on); every other processor here counts them.
    skips_pads = "prompt_ignore_length" in inspect.signature(
        transformers.RepetitionPenaltyLogitsProcessor).parameters
    batch_differs = 0
    for kw in cases:
        want = [s for p in prompts for s in alone_tokens(p, **kw)]
        for batches in (1, 3):
            assert hf.generate(m, prompts, 6, do_sample=False, decode_batches=batches,
                               **kw) == want, (kw, batches)
        out = m.generate(padded.input_ids, attention_mask=padded.attention_mask,
                         max_new_tokens=6, do_sample=False, **kw)
        if out[:, width:].tolist() != want:
            batch_differs += 1
        else:
            assert skips_pads and "repetition_penalty" in kw, kw
    assert batch_differs >= 4  # the pads would have changed these

    # prefix_allowed_tokens_fn: called with the prompt's index in the caller's batch and its row
    # without pads, also when the decode batches hold the prompts sorted by length.
    def allowed_for(index):
        def allowed(batch_id, sent):
            i = index if index is not None else batch_id
            assert sent[:len(prompts[i])].tolist() == prompts[i]
            return [(prompts[i][0] + k) % VOCAB for k in range(0, 40, 3)]
        return allowed

    want = [alone_tokens(p, prefix_allowed_tokens_fn=allowed_for(i))[0]
            for i, p in enumerate(prompts)]
    for batches in (1, 3):
        assert hf.generate(m, prompts, 6, do_sample=False, decode_batches=batches,
                           prefix_allowed_tokens_fn=allowed_for(None)) == want


def test_prepacked_cache_continues_with_model_generate():
    """prefill's batch cache is the form model.generate continues: append the next token."""
    m = model("qwen2", "sdpa")
    prompts = heavy_prompts(6, seed=5)
    r = hf.prefill(m, prompts)
    first = r.next_tokens()[:, None]
    ids = torch.cat([r.input_ids, first], 1)
    mask = torch.cat([r.attention_mask, torch.ones_like(first)], 1)
    out = m.generate(ids, attention_mask=mask, **{cache_argument(m): r.cache}, max_new_tokens=4,
                     do_sample=False, pad_token_id=0)
    for i, p in enumerate(prompts):
        assert [first[i, 0].item()] + out[i, ids.shape[1]:].tolist() == \
            generate_alone(m, p, max_new_tokens=5, do_sample=False)


def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<pad>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(100)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>",
                                                bos_token="<s>", eos_token="</s>",
                                                unk_token="<unk>")


def test_transformers_older_than_its_cache_api_refused_at_import(monkeypatch):
    """Before 5.14 transformers has no cache_utils.get_layer_types_and_kwargs: importing prepack.hf
    there fails at once, naming both versions, not at the first call with an import error from
    deep inside."""
    import importlib
    import sys

    # The module that `import transformers` finds now (transformers may have replaced its entry in
    # sys.modules since this file imported it).
    module = sys.modules["transformers"]
    monkeypatch.setattr(module, "__version__", "5.13.2")
    monkeypatch.delitem(sys.modules, "prepack.hf")  # both restored after the test
    monkeypatch.setattr(prepack, "hf", hf)
    with pytest.raises(ImportError, match=r"prepack.hf needs transformers >= 5\.14; this is "
                                          r"transformers 5\.13\.2"):
        importlib.import_module("prepack.hf")
    monkeypatch.setattr(module, "__version__", "5.14.0rc1")
    assert importlib.import_module("prepack.hf").prefill


def test_inputs_as_users_have_them():
    m = model("llama", "sdpa")
    tok = tiny_tokenizer()
    texts = ["w1 w2 w3 w4 w5", "w6", "w7 w8 w9"]
    want = hf.prefill(m, [tok(t)["input_ids"] for t in texts], cache=None).logits
    lists = [tok(t)["input_ids"] for t in texts]
    forms = {
        "texts with tokenizer=": dict(prompts=texts, tokenizer=tok),
        "BatchEncoding, unpadded": dict(prompts=tok(texts)),
        "numpy and torch scalars": dict(prompts=[[np.int64(x) for x in lists[0]],
                                                 [torch.tensor(x) for x in lists[1]], lists[2]]),
        "tuples and arrays": dict(prompts=(tuple(lists[0]), np.array(lists[1], np.int32),
                                           torch.tensor(lists[2]))),
    }
    for side in ("left", "right"):
        tok.padding_side = side
        enc = tok(texts, padding=True, return_tensors="pt")
        forms[f"BatchEncoding, {side} padded"] = dict(prompts=enc)
        forms[f"input_ids with attention_mask, {side}"] = dict(prompts=enc["input_ids"],
                                                              attention_mask=enc["attention_mask"])
        forms[f"padded lists, {side}"] = dict(prompts=tok(texts, padding=True))
    for what, kw in forms.items():
        got = hf.prefill(m, cache=None, **kw).logits
        assert torch.equal(got, want), what
    # One prompt as one flat sequence: what a tokenizer gives for one text, with or without its
    # mask (padded to a length too), a list of ints, a 1-D array or tensor.
    one = {"BatchEncoding of one text": dict(prompts=tok(texts[0])),
           "one text, padded": dict(prompts=tok(texts[0], padding="max_length", max_length=9)),
           "a list of ints": dict(prompts=lists[0]),
           "a 1-D array": dict(prompts=np.array(lists[0])),
           "a 1-D tensor with its mask": dict(prompts=torch.tensor([0, 0] + lists[0]),
                                              attention_mask=torch.tensor([0, 0] + [1] * 5))}
    assert len(lists[0]) == 5
    for what, kw in one.items():
        got = hf.prefill(m, cache=None, **kw).logits
        # (packed alone its row is narrower than beside the others: rounding apart)
        assert got.shape[0] == 1, what
        assert (got[0] - want[0]).abs().max() <= 1e-5 * want.abs().max(), what
    # A ragged numpy object array: a list of prompts.
    got = hf.prefill(m, np.array([lists[1], lists[2]], dtype=object), cache=None).logits
    assert got.shape[0] == 2 and (got - want[1:]).abs().max() <= 1e-5 * want.abs().max()

    # Refused before anything runs, naming what is wrong.
    enc = tok(texts, padding=True, return_tensors="pt")
    with pytest.raises(ValueError, match="2-D input_ids without attention_mask"):
        hf.prefill(m, enc["input_ids"])
    with pytest.raises(ValueError, match=r"prompt 1: token 600 at position 2 is outside the "
                                         r"vocabulary \(512\)"):
        hf.prefill(m, [[1, 2], [3, 4, 600]])
    with pytest.raises(ValueError, match="prompt 0: token -1 at position 0"):
        hf.generate(m, [[-1, 2]], 2)
    with pytest.raises(ValueError, match="prompt 1: length 0"):
        hf.prefill(m, [[1, 2], []])
    with pytest.raises(ValueError, match="prompt 1: attention_mask has no real token"):
        hf.prefill(m, torch.ones(2, 3, dtype=torch.long), attention_mask=torch.tensor(
            [[1, 1, 1], [0, 0, 0]]))
    with pytest.raises(ValueError, match="prompt 0: attention_mask is not one run"):
        hf.prefill(m, torch.ones(1, 3, dtype=torch.long), attention_mask=torch.tensor([[1, 0, 1]]))
    with pytest.raises(TypeError, match="texts need tokenizer="):
        hf.prefill(m, ["w1 w2"])
    with pytest.raises(TypeError, match="prompt 0: token 1 = 2.5 is not an integer"):
        hf.prefill(m, [[1, 2.5]])
    with pytest.raises(ValueError, match="cache: 'all'"):
        hf.prefill(m, [[1]], cache="all")
    with pytest.raises(ValueError, match="max_new_tokens 0"):
        hf.generate(m, [[1]], 0)
    # Sizes and ids that are not integers, or out of range, are named before anything runs.
    with pytest.raises(TypeError, match="prompts: None;"):
        hf.prefill(m, None)
    with pytest.raises(TypeError, match="capacity: 2.5 is not an integer"):
        hf.prefill(m, [[1, 2]], capacity=2.5)
    with pytest.raises(ValueError, match=r"capacity 0 \(at least 1\)"):
        hf.generate(m, [[1, 2]], 2, capacity=0)
    with pytest.raises(ValueError, match=rf"pad_token_id {VOCAB} is outside the vocabulary"):
        hf.prefill(m, [[1, 2]], pad_token_id=VOCAB)
    with pytest.raises(ValueError, match=r"pad_token_id -1 \(at least 0\)"):
        hf.padded_prefill(m, [[1, 2]], pad_token_id=-1)
    with pytest.raises(TypeError, match="decode_batches: 1.5 is not an integer"):
        hf.generate(m, [[1, 2]], 2, decode_batches=1.5)
    with pytest.raises(ValueError, match="decode_batches 'fast': an integer >= 1 or 'auto'"):
        hf.generate(m, [[1, 2]], 2, decode_batches="fast")
    for eos in ("a", [2, -1], 2.0):
        with pytest.raises(TypeError, match=r"eos_token_id: .*; a token id \(an integer >= 0\)"):
            hf.generate(m, [[1, 2]], 2, eos_token_id=eos)
    # The model's inputs come from the prompts: given as well, refused by name (model.generate
    # would ignore a cache given, or mix ids, embeddings and positions with the batch's).
    for name, value in (("past_key_values", transformers.DynamicCache()),
                        ("cache", transformers.DynamicCache()),
                        ("input_ids", torch.tensor([[1, 2]])),
                        ("inputs_embeds", torch.zeros(1, 2, 8)),
                        ("position_ids", torch.zeros(1, 2, dtype=torch.long))):
        with pytest.raises(TypeError, match=f"{name}: prepack.hf.generate takes no {name}"):
            hf.generate(m, [[1, 2], [3]], 2, **{name: value})
    with pytest.raises(TypeError, match="n_targets: float64 values, integers expected"):
        hf.score(m, [[1, 2, 3]], 1.5)
    with pytest.raises(ValueError, match=r"batch_rows 0 \(at least 1\)"):
        hf.score(m, [[1, 2, 3]], 1, batch_rows=0)
    assert hf.prefill(m, [[1, 2]], capacity=np.int64(4), cache=None).batch.width == 4
    with pytest.raises(ValueError, match=r"prompt 1: attention_mask holds 2 at position 0"):
        hf.prefill(m, torch.ones(2, 3, dtype=torch.long),
                   attention_mask=torch.tensor([[1, 1, 1], [2, 1, 1]]))
    # generate's pad enters the model's embedding after a sequence ends: within the vocabulary.
    with pytest.raises(ValueError, match=rf"pad_token_id {VOCAB} is outside the vocabulary"):
        hf.generate(m, [[1, 2], [3]], 2, pad_token_id=VOCAB)
    with pytest.raises(ValueError, match=r"num_beams 0 \(at least 1\)"):
        hf.generate(m, [[1, 2], [3]], 2, num_beams=0)
    # No pad_token_id and a first EOS outside the vocabulary: the pad is the next EOS that is a
    # token (model.generate would feed the first to the embedding after a sequence ends).
    first = hf.generate(m, [[5, 6, 7]], 3, do_sample=False, pad_token_id=0)[0][0]
    saved = m.generation_config.pad_token_id
    m.generation_config.pad_token_id = None
    try:
        got = hf.generate(m, [[5, 6, 7], [8], [9, 10]], 3, do_sample=False,
                          eos_token_id=[VOCAB + 5, first])
    finally:
        m.generation_config.pad_token_id = saved
    assert got[0] == [first]


def test_models_that_cannot_be_packed_are_refused_by_name():
    m = model("llama", "sdpa")
    m.config._attn_implementation = "paged|sdpa"
    try:
        with pytest.raises(ValueError, match="attn_implementation 'paged|sdpa' has no packed form"):
            hf.prefill(m, [[1, 2, 3]])
    finally:
        m.config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    bloom = transformers.BloomForCausalLM(transformers.BloomConfig(
        vocab_size=VOCAB, hidden_size=32, n_layer=1, n_head=2)).eval()
    with pytest.raises(ValueError, match=r"BloomForCausalLM \(bloom\): ALiBi derives positions"):
        hf.prefill(bloom, [[1, 2, 3]])

    # An encoder as a causal LM: bidirectional unless is_decoder=True; RoBERTa's positions start
    # at the padding index + 1 whatever position ids say.
    small = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=2)
    bert = transformers.BertLMHeadModel(transformers.BertConfig(**small)).eval()
    with pytest.raises(ValueError, match=r"BertLMHeadModel: layer 0's attention.self attends "
                                         r"both ways \(is_causal False"):
        hf.prefill(bert, [[1, 2, 3]])
    bert = transformers.BertLMHeadModel(transformers.BertConfig(**small, is_decoder=True)).eval()
    prompts = heavy_prompts(5, seed=8)
    got = hf.prefill(bert, prompts, cache=None).logits
    for i, p in enumerate(prompts):
        with torch.no_grad():
            want = bert(input_ids=torch.tensor([p])).logits[0, -1]
        assert (got[i] - want).abs().max().item() <= 1e-4 * scale_of(want)
    roberta = transformers.RobertaForCausalLM(transformers.RobertaConfig(
        **small, is_decoder=True, max_position_embeddings=64)).eval()
    with pytest.raises(ValueError, match=r"RobertaForCausalLM \(roberta\): roberta.embeddings "
                                         r"counts positions from the padding index"):
        hf.prefill(roberta, [[3, 4, 5]])


def test_block_mask_equals_torch_create_block_mask():
    """prepack's BlockMask tables against torch's own create_block_mask over the same
    mask_mod: the same dense mask, the same full and partial blocks."""
    from torch.nn.attention.flex_attention import create_block_mask

    for seed, capacity, window in ((1, None, None), (2, 300, None), (3, None, 40), (4, 700, 130)):
        prompts = heavy_prompts(40, seed=seed, top=260)
        m = model("mistral", "flex_attention")
        t = hf._target(m)
        batch = hf._pack(t, prepack.Prompts(prompts), capacity, "ffd")
        seg = torch.tensor(batch.segment_ids)
        ours = hf._block_mask(t, batch, seg, window)
        theirs = create_block_mask(ours.mask_mod, batch.n_rows, None, batch.width, batch.width,
                                   device="cpu", _compile=False)
        assert torch.equal(ours.to_dense(), theirs.to_dense()), (seed, window)
        for a, b in ((ours.full_kv_num_blocks, theirs.full_kv_num_blocks),
                     (ours.kv_num_blocks, theirs.kv_num_blocks)):
            assert torch.equal(a, b)
        w = batch.width
        slot = torch.arange(w)
        back = slot[:, None] - slot[None, :]
        want = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] >= 0) & (back >= 0)
        if window is not None:
            want &= back < window
        want |= torch.eye(w, dtype=torch.bool)
        dense = theirs.to_dense()  # block level: every open element lies in a listed block
        assert dense.shape[-1] * 128 >= w
        got = torch.stack([ours.mask_mod(torch.tensor(r), 0, slot[:, None], slot[None, :])
                           for r in range(batch.n_rows)])
        assert torch.equal(got, want)


def test_flash_varlen_equals_alone():
    if not torch.cuda.is_available():
        pytest.skip("flash attention runs on CUDA only")
    pytest.importorskip("flash_attn")
    m = family("qwen2").to("cuda", torch.bfloat16)
    m.config._attn_implementation = "flash_attention_2"
    prompts = heavy_prompts()
    r = hf.prefill(m, prompts)
    assert r.batch.n_rows == 1
    for i, p in enumerate(prompts):
        with torch.no_grad():
            want = m(input_ids=torch.tensor([p], device="cuda")).logits[0, -1]
        assert scale_of(r.logits[i] - want) / scale_of(want) < 2e-2


def flash_semantics(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                    sliding_window=None, softcap=None, **kwargs):
    """flash-attn's attention as transformers calls it, in plain torch on any device: causal
    aligned to the last keys (the queries are the last q_len positions), a window of
    sliding_window keys, the 2-D padding mask transformers gives it (its keys' columns), and with
    cu_seq_lens_q / _k (one packed row) a causal block per sequence. Returns [b, q, heads, d]."""
    b, heads, q_len, d = query.shape
    key = key.repeat_interleave(heads // key.shape[1], 1)
    value = value.repeat_interleave(heads // value.shape[1], 1)
    kv_len, dev = key.shape[2], query.device
    q_at = torch.arange(q_len, device=dev)[:, None] + (kv_len - q_len)
    k_at = torch.arange(kv_len, device=dev)[None, :]
    allowed = k_at <= q_at
    if sliding_window is not None:
        allowed = allowed & (q_at - k_at < sliding_window)
    allowed = allowed.expand(b, 1, q_len, kv_len)
    cu = kwargs.get("cu_seq_lens_q")
    if cu is not None:
        assert torch.equal(cu, kwargs["cu_seq_lens_k"]) and b == 1 and q_len == kv_len
        assert int(kwargs["max_length_q"]) == int((cu[1:] - cu[:-1]).max())
        seq = torch.bucketize(torch.arange(kv_len, device=dev), cu[1:-1], right=True)
        allowed = allowed & (seq[:, None] == seq[None, :])
    if attention_mask is not None:
        assert attention_mask.dim() == 2
        allowed = allowed & attention_mask[:, None, None, -kv_len:].bool()
    scores = query @ key.transpose(-1, -2) * (scaling if scaling is not None else d ** -0.5)
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num()
    return (weights @ value).transpose(1, 2), None


@pytest.mark.parametrize("name", ["llama", "qwen2", "mistral"])
def test_varlen_path_on_flash_semantics(name, monkeypatch):
    """The flash_attention_2 path (every prompt in one row without pads, cu_seq_lens from prepack,
    no mask; the caches gathered from that row; generate decoding from them) run on a CPU, with
    flash-attn's semantics in plain torch (flash_semantics) standing in for its CUDA kernel:
    logits and caches as each prompt alone under eager attention, the batch cache as
    transformers' own after a padded prefill, greedy tokens as model.generate alone."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._local_mapping, "flash_attention_2",
                        flash_semantics)
    m = family(name)
    m.config._attn_implementation = "flash_attention_2"
    prompts = heavy_prompts()
    logits, batch_kv, prompt_kv, r = compare_prefill(m, prompts)
    report(f"{name} varlen (flash semantics): logits {logits:.1e}, batch cache {batch_kv:.1e}, "
           f"prompt caches {prompt_kv:.1e} of their scale")
    assert r.batch.n_rows == 1 and r.batch.width == sum(map(len, prompts))
    assert logits < 1e-4 and batch_kv < 1e-4 and prompt_kv < 1e-4
    m.config._attn_implementation = "eager"
    want = [generate_alone(m, p, max_new_tokens=5, do_sample=False) for p in prompts]
    m.config._attn_implementation = "flash_attention_2"
    for k in (1, 3):
        assert hf.generate(m, prompts, 5, do_sample=False, pad_token_id=0,
                           decode_batches=k) == want, k


def test_progress_bars(capsys, monkeypatch):
    from tqdm.auto import tqdm
    update = tqdm.update
    # tqdm's update returns True when it redraws, which depends on the clock: make it redraw every
    # time, so a hook that passes that value on as the layer's output fails on every run
    monkeypatch.setattr(tqdm, "update", lambda self, n=1: update(self, n) or True)
    m = model("llama", "sdpa")
    prompts = heavy_prompts(6, seed=6)
    r = hf.prefill(m, prompts, progress=True)
    got = hf.generate(m, prompts, 3, do_sample=False, progress=True, decode_batches=2)
    err = capsys.readouterr().err
    assert "prepack.hf.prefill" in err and "3/3" in err  # a step per decoder layer
    assert "prepack.hf.generate" in err and "6/6" in err  # a step per token, per batch
    assert got == hf.generate(m, prompts, 3, do_sample=False)
    assert torch.equal(r.logits, hf.prefill(m, prompts).logits)
