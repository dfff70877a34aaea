"""prepack.hf on a real trained model: SmolLM2-135M-Instruct, loaded by transformers' own GGUF
loader from the file the oracle tests use, with its own tokenizer: text prompts prefilled in
packed rows give every prompt the logits and cache of running it alone, and the same greedy
continuations, under eager and sdpa attention."""
import os

import pytest

from conftest import need, output_cache, real_model_file, report

torch = need("torch", whole_file=True)
transformers = need("transformers", whole_file=True)
need("gguf", whole_file=True)
path = real_model_file()
import prepack.hf as hf  # noqa: E402

TEXTS = [
    "The capital of France is",
    "Once upon a time, there was a",
    "def fibonacci(n):\n    ",
    "Water boils at",
    "List three primary colors:",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "In 1969, the first humans to walk on the Moon were",
    "Translate to French: good morning ->",
    "A haiku about autumn leaves:\n",
    "The derivative of x squared is",
    "Q: What is 12 times 12?\nA:",
    "Photosynthesis is the process by which plants",
]


@pytest.fixture(scope="module")
def model_and_tokenizer():
    d, f = os.path.split(path)
    tok = transformers.AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    return model.eval(), tok


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_real_model_prepacked_equals_alone(model_and_tokenizer, impl):
    model, tok = model_and_tokenizer
    model.config._attn_implementation = impl
    prompts = [tok(t)["input_ids"] for t in TEXTS]
    result = hf.prefill(model, prompts, cache="prompts")
    assert result.batch.n_rows < len(prompts)
    dl = sl = dk = sk = 0.0
    for i, p in enumerate(prompts):
        with torch.no_grad():
            out = model(input_ids=torch.tensor([p]), use_cache=True)
        dl = max(dl, (result.logits[i] - out.logits[0, -1]).abs().max().item())
        sl = max(sl, out.logits[0, -1].abs().max().item())
        for (k1, v1), (k2, v2) in zip(hf._layer_kv(result.caches[i]),
                                      hf._layer_kv(output_cache(out))):
            dk = max(dk, (k1 - k2).abs().max().item(), (v1 - v2).abs().max().item())
            sk = max(sk, k2.abs().max().item(), v2.abs().max().item())
    report(f"{impl}: logits {dl / sl:.2e}, KV {dk / sk:.2e} of their scale")
    assert dl / sl < 1e-4 and dk / sk < 1e-4
    got = hf.generate(model, TEXTS[:6], 8, tokenizer=tok)  # texts, tokenized as above
    for p, g in zip(prompts[:6], got):
        ids = torch.tensor([p])
        want = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                              do_sample=False, pad_token_id=tok.eos_token_id)[0, len(p):].tolist()
        assert g == want
    assert "Paris" in tok.decode(got[0])


def test_token_healing_generates_each_prompt_alone(model_and_tokenizer):
    """token_healing rewrites each prompt's tail before generating (re-tokenised, BOS replaced),
    so the prefill of the prompt as given cannot be continued (continuing it, the first prompt
    generated a chat turn's header): each prompt's tokens as model.generate gives alone."""
    model, tok = model_and_tokenizer
    model.config._attn_implementation = "sdpa"
    texts = ["The link is http", "Water boils at", "A list: 1. apples, 2"]
    prompts = [tok(t)["input_ids"] for t in texts]
    common = dict(max_new_tokens=5, do_sample=False, pad_token_id=tok.eos_token_id)
    want = []
    for p in prompts:
        ids = torch.tensor([p])
        try:
            out = model.generate(ids, attention_mask=torch.ones_like(ids), tokenizer=tok,
                                 token_healing=True, **common)
        except ValueError as e:  # transformers before 5.19 heals with a tokenizer that pads
            pytest.skip(f"transformers' own token healing fails on this tokenizer: {e}")
        want.append(out[0, len(p):].tolist())
    assert hf.generate(model, prompts, tokenizer=tok, token_healing=True, **common) == want
