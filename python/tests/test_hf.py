"""prepack.hf on transformers' own models: every prompt's last-token logits and cache from one
prepacked forward pass equal running the prompt alone, under eager and sdpa attention, and
greedy continuations from those caches equal generating alone."""
import pytest

from conftest import need, report

torch = need("torch", whole_file=True)
transformers = need("transformers", whole_file=True)
import prepack.hf as hf  # noqa: E402

VOCAB = 512


def tiny_llama(impl, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=160,
                                   num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=1024, rms_norm_eps=1e-5)
    cfg._attn_implementation = impl
    return transformers.LlamaForCausalLM(cfg).to(dtype).eval()


def heavy_prompts(n=24, seed=1, top=160):
    g = torch.Generator().manual_seed(seed)
    lengths = (torch.distributions.LogNormal(3.3, 0.9).sample((n,)).long().clamp(1, top)).tolist()
    return [torch.randint(0, VOCAB, (L,), generator=g).tolist() for L in lengths]


def alone(model, prompt):
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt]), use_cache=True)
    return out.logits[0, -1], hf._layers(out.past_key_values)


def worst_against_alone(model, prompts, result):
    """max |difference| / max |value| over every prompt, for the logits and for the KV."""
    dl = dk = sl = sk = 0.0
    for i, p in enumerate(prompts):
        logits, layers = alone(model, p)
        dl = max(dl, (result.logits[i].float() - logits.float()).abs().max().item())
        sl = max(sl, logits.float().abs().max().item())
        mine = hf._layers(result.caches[i])
        assert len(mine) == len(layers)
        for (k1, v1), (k2, v2) in zip(mine, layers):
            assert k1.shape == k2.shape == (1, 2, len(p), 16)
            dk = max(dk, (k1.float() - k2.float()).abs().max().item(), (v1.float() - v2.float()).abs().max().item())
            sk = max(sk, k2.float().abs().max().item(), v2.float().abs().max().item())
    return dl / sl, dk / sk


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_prepacked_prefill_equals_each_prompt_alone(impl):
    model = tiny_llama(impl)
    prompts = heavy_prompts()
    result = hf.prefill(model, prompts)
    assert result.batch.n_rows < len(prompts)  # prompts really share rows
    assert result.logits.shape == (len(prompts), VOCAB)
    assert torch.isfinite(result.logits).all()
    logits, kv = worst_against_alone(model, prompts, result)
    report(f"{impl}: logits {logits:.2e}, KV {kv:.2e} of their scale")
    assert logits < 1e-4 and kv < 1e-4
    # Rows wider than the longest prompt, best-fit, and the slicing path for non-CPU caches.
    for kw in ({"capacity": 200}, {"method": "bfd"}):
        r = hf.prefill(model, prompts, **kw)
        assert (r.logits - result.logits).abs().max().item() < 1e-4
    sliced = hf.unpack_caches(model, result.batch,
                               model(**hf.pack_inputs(model, prompts)[1], use_cache=True).past_key_values,
                               torch_slicing=True)
    for a, b in zip(sliced, result.caches):
        for (k1, v1), (k2, v2) in zip(hf._layers(a), hf._layers(b)):
            assert torch.equal(k1, k2) and torch.equal(v1, v2)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_greedy_continuations_equal_generating_alone(impl):
    model = tiny_llama(impl, seed=3)
    prompts = heavy_prompts(10, seed=4)
    got = hf.generate(model, prompts, 8)
    for p, g in zip(prompts, got):
        ids = torch.tensor([p])
        want = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                              do_sample=False, pad_token_id=0)[0, len(p):].tolist()
        assert g == want


def test_padded_baseline_and_bf16():
    model = tiny_llama("sdpa")
    prompts = heavy_prompts(12, seed=5)
    padded = hf.padded_prefill(model, prompts)
    logits, kv = worst_against_alone(model, prompts, padded)
    assert logits < 1e-4 and kv < 1e-4
    # bf16: the mask in the model's dtype with bf16's own finite minimum; no NaN, and the
    # prepacked logits within bf16's rounding of running alone.
    m16 = tiny_llama("eager", dtype=torch.bfloat16)
    r = hf.prefill(m16, prompts)
    assert r.logits.dtype == torch.bfloat16 and torch.isfinite(r.logits).all()
    logits, kv = worst_against_alone(m16, prompts, r)
    assert logits < 0.05 and kv < 0.05


def test_kernels_that_ignore_4d_masks_are_refused():
    model = tiny_llama("eager")
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="does not take a 4D attention mask"):
        hf.prefill(model, [[1, 2, 3]])
    with pytest.raises(ValueError, match="prompt 1: length 0"):
        hf.prefill(tiny_llama("eager"), [[1, 2], []])
