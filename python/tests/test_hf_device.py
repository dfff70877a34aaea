"""prepack.hf on a model on a CUDA device, checked on a machine without one: the model's
parameters and buffers report cuda:0 and compute on the CPU (virtual_device.py), and every
operation that mixes them with host tensors, or reads them through numpy, fails as on CUDA.

For every decoder family and each attention path (eager, sdpa, flex attention uncompiled and the
flash varlen path, whose kernel is flash-attn's semantics in plain torch), prefill (batch cache,
per-prompt caches, none), score and generate (greedy, sampled, with prompt-reading processors,
several sequences per prompt, the dict output, several decode batches) run with everything on the
model's device:
- no operation mixes devices (the mode raises as CUDA does);
- what crosses from the host is O(tokens): token ids, positions, slot indices; never a mask
  (the largest copy is smaller than one packed row's width squared);
- what they return lies on the model's device;
- the values equal the same calls on the CPU model, the greedy tokens exactly.

Under flex attention, the block mask's tensors and those its mask_mod and transformers' score_mod
hold must be on the device too (compiled CUDA code needs them there)."""
import numpy as np
import pytest

from conftest import need, report

torch = need("torch", whole_file=True)
transformers = need("transformers", whole_file=True)
import prepack.hf as hf  # noqa: E402
from test_hf import (FAMILIES, family, flash_semantics, heavy_prompts,  # noqa: E402
                     supported)
from virtual_device import (OnDevice, host, to_device, uncompiled,  # noqa: E402
                            virtual_cuda)

KERNELS = ["eager", "sdpa", "flex_attention", "flash_attention_2"]


def on_device(x):
    return isinstance(x, OnDevice)


def cache_tensors(cache):
    return [t for layer in cache.layers for t in (layer.keys, layer.values)]


def calls(prompts):
    """(name, call(model)) for every call checked, each returning host-comparable results and the
    tensors that must lie on the device."""
    n = len(prompts)
    sequences = [p + [7, 11] for p in prompts]

    def prefill_batch(m):
        r = hf.prefill(m, prompts)
        out = [r.logits, r.attention_mask, r.input_ids, *cache_tensors(r.cache)]
        return out, out

    def prefill_prompts(m):
        r = hf.prefill(m, prompts, cache="prompts")
        out = [r.logits, *[t for c in r.caches for t in cache_tensors(c)]]
        return out, out

    def prefill_none(m):
        r = hf.prefill(m, prompts, cache=None)
        return [r.logits], [r.logits]

    def greedy(m):
        one = hf.generate(m, prompts, 6, do_sample=False)
        split = hf.generate(m, prompts, 6, do_sample=False, decode_batches=3)
        assert one == split
        return one, []

    def processors(m):
        return hf.generate(m, prompts, 6, do_sample=False, repetition_penalty=1.3,
                           no_repeat_ngram_size=2, min_new_tokens=3, forced_eos_token_id=5,
                           bad_words_ids=[[9]]), []

    def sampled(m):
        torch.manual_seed(3)
        return hf.generate(m, prompts, 5, do_sample=True, top_k=20, num_return_sequences=2), []

    def as_dict(m):
        out = hf.generate(m, prompts, 4, do_sample=False, return_dict_in_generate=True,
                          output_scores=True)
        return [out.sequences, *out.scores], [out.sequences, *out.scores]

    def scored(m):
        s = hf.score(m, sequences, 2)
        assert len(s) == n
        return [(x.logprobs, x.greedy) for x in s], []

    def device_inputs(m):
        # a tokenizer's padded batch, already on the model's device
        longest = max(map(len, prompts))
        ids = torch.zeros(n, longest, dtype=torch.int64)
        mask = torch.zeros(n, longest, dtype=torch.int64)
        for i, p in enumerate(prompts):
            ids[i, longest - len(p):] = torch.tensor(p)
            mask[i, longest - len(p):] = 1
        d = m.device
        r = hf.prefill(m, ids.to(d), attention_mask=mask.to(d), cache=None)
        g = hf.generate(m, ids.to(d), 3, attention_mask=mask.to(d), do_sample=False)
        return [r.logits, g], [r.logits]

    return [("prefill batch", prefill_batch), ("prefill prompts", prefill_prompts),
            ("prefill none", prefill_none), ("score", scored), ("greedy", greedy),
            ("processors", processors), ("sampled", sampled), ("dict", as_dict),
            ("device inputs", device_inputs)]


def same(a, b, what):
    """a (from the device) equals b (from the CPU), tensors within 1e-6 of their scale."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype, what
        scale = max(b.float().abs().max().item(), 1e-30) if b.numel() else 1.0
        err = (a.float() - b.float()).abs().max().item() if b.numel() else 0.0
        assert err <= 1e-6 * scale, f"{what}: {err} of {scale}"
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), what
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{what}[{i}]")
    else:
        assert a == b, f"{what}: {a!r} against {b!r}"


@pytest.mark.parametrize("impl", KERNELS)
@pytest.mark.parametrize("name", FAMILIES)
def test_everything_on_the_models_device(name, impl, monkeypatch):
    if impl == "flash_attention_2":
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._local_mapping, "flash_attention_2",
                            flash_semantics)
    m = family(name)
    supported(m, impl)
    m.config._attn_implementation = impl
    prompts = heavy_prompts(8, seed=4)
    checks = calls(prompts)
    want = []
    with uncompiled():  # the same uncompiled flex kernel as on the virtual device
        for what, call in checks:
            torch.manual_seed(0)
            want.append(call(m)[0])
        width = hf.prefill(m, prompts, cache=None).batch.width
    grid = 2 * len(prompts) * max(map(len, prompts))
    to_device(m)
    assert m.device.type == "cuda"
    largest = 0
    for (what, call), expected in zip(checks, want):
        with virtual_cuda() as mode:
            torch.manual_seed(0)
            got, placed = call(m)
        assert all(on_device(t) for t in placed), f"{what}: a result on the host"
        same(host(got), expected, f"{name} {impl} {what}")
        largest = max(largest, mode.largest_h2d())
        # nothing larger than generate's left-padded token grid (two sequences per prompt)
        assert mode.largest_h2d() <= grid, (what, sorted(mode.h2d, key=lambda c: c[1])[-1])
    report(f"{name} {impl} on a virtual CUDA device: {len(checks)} calls as on the CPU, largest "
           f"host-to-device copy {largest} elements (a row's mask: {width * width})")
    assert grid < width * width


def test_the_stand_in_catches_what_cuda_refuses():
    """The checks above can fail: a host tensor in a device operation, numpy of a device tensor
    and a host-built mask copied over are each caught."""
    m = to_device(family("llama"))
    with virtual_cuda() as mode:
        x = torch.ones(3, 4, device="cuda")
        with pytest.raises(RuntimeError, match="same device"):
            x + torch.ones(3, 4)
        with pytest.raises(TypeError, match="numpy"):
            np.asarray(x)
        with pytest.raises(RuntimeError, match="same device"):
            m(input_ids=torch.tensor([[1, 2, 3]]))  # host ids into a device model
        x = x + torch.tensor(2.0)  # host scalars are taken, as on CUDA
        mask = torch.ones(1, 1, 64, 64, dtype=torch.bool).tril().to("cuda")
        assert on_device(mask) and on_device(x) and not on_device(x.cpu())
        torch.empty(1, 1, 80, 80, device="cuda").copy_(torch.ones(1, 1, 80, 80))
    assert sorted(n for _, n in mode.h2d)[-2:] == [64 * 64, 80 * 80]
    assert mode.d2h == [(mode.d2h[0][0], 12)]



@pytest.fixture
def cuda_runtime(monkeypatch):
    """The CUDA runtime's answers stubbed for the benchmarks' own calls (synchronize: nothing to
    wait for; memory counters: 0; one device), and Module.to("cuda") as to_device."""
    for name, value in (("is_available", lambda: True), ("device_count", lambda: 1),
                        ("current_device", lambda: 0), ("synchronize", lambda *a: None),
                        ("memory_allocated", lambda *a: 0), ("max_memory_allocated", lambda *a: 0),
                        ("reset_peak_memory_stats", lambda *a: None),
                        ("empty_cache", lambda: None), ("get_device_name", lambda *a: "virtual")):
        monkeypatch.setattr(torch.cuda, name, value)
    to = torch.nn.Module.to

    def module_to(self, *args, **kwargs):
        device = args[0] if args else kwargs.get("device")
        if device is not None and str(device).startswith("cuda"):
            return to_device(self)
        return to(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "to", module_to)


def bench_module(name):
    import importlib
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


def test_the_gpu_benchmark_runs_its_cuda_path(tmp_path, monkeypatch, cuda_runtime):
    """bench/bench_hf.py --device cuda (what bench/gpu_hf.sh runs on a GPU), end to end on the
    virtual device with a tiny model: bf16, every prepack row, the padded baselines,
    transformers' padding-free forward under sdpa, the checks and the report. Not run here:
    flex_attention (compiled) and transformers' continuous batching (CUDA streams and graphs:
    only its configuration is made); their rows stay empty."""
    import sys

    bench_hf = bench_module("bench_hf")
    padding_free = bench_hf.padding_free_method
    monkeypatch.setattr(bench_hf, "padding_free_method", lambda t, m, p: (
        (None, None, None) if m.config._attn_implementation == "flex_attention"
        else padding_free(t, m, p)))
    # transformers' continuous batching: its configuration made as the benchmark makes it (the
    # arguments change between releases), its CUDA run left out
    continuous = bench_hf.continuous_method
    monkeypatch.setattr(bench_hf, "continuous_method",
                        lambda *a: continuous(*a) and (None, None, None))
    monkeypatch.setattr(sys, "argv", [
        "bench_hf.py", "--device", "cuda", "--model", "tiny", "--prompts", "12", "--passes", "1",
        "--new-tokens", "4", "--kernels", "sdpa,eager", "--threads",
        str(torch.get_num_threads()), "--out", str(tmp_path)])
    with virtual_cuda() as mode:
        bench_hf.main()
    text = (tmp_path / "hf-cuda.md").read_text()
    for row in ("| padded |", "| sorted padded (16) |", "| prepack sdpa |", "| prepack eager |",
                "| padding-free sdpa |"):
        assert row in text, row
    assert "bfloat16" in text and "of the forward (target at most 15%)" in text
    # nothing larger than the padded baseline's token grid (12 prompts of at most 512 tokens)
    # crosses from the host: no mask of the packed rows
    assert mode.largest_h2d() <= 12 * 512


def test_the_evaluation_benchmark_runs_its_cuda_path(tmp_path, monkeypatch, cuda_runtime):
    """bench/bench_lm_eval.py --device cuda (gpu_hf.sh's second step), its smoke run on the
    virtual device: lm-evaluation-harness's own HFLM at batch 32 and --model prepack at auto load
    the model onto the device, answer every request, and agree request by request (the
    benchmark's own check, bf16); each method runs in this process instead of a child."""
    import contextlib
    import copy
    import io
    import json
    import sys

    need("lm_eval")
    bench = bench_module("bench_lm_eval")
    load = transformers.AutoModelForCausalLM.from_pretrained.__func__

    def from_pretrained(cls, *args, **kwargs):
        kwargs.pop("device_map", None)  # loaded on the host (in worker threads), then moved
        return to_device(load(cls, *args, **kwargs))

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        classmethod(from_pretrained))
    modes = []

    def run_child(args, method):
        args = copy.copy(args)
        args.child = method
        out = io.StringIO()
        with contextlib.redirect_stdout(out), virtual_cuda() as mode:
            bench.child(args)
        modes.append(mode)
        return json.loads(out.getvalue().strip().splitlines()[-1])

    monkeypatch.setattr(bench, "run_child", run_child)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(sys, "argv", ["bench_lm_eval.py", "--device", "cuda", "--smoke",
                                      "--methods", "hf:32,prepack:auto",
                                      "--out", str(tmp_path)])
    bench.main()
    text = (tmp_path / "lm-eval-cuda-smoke.md").read_text()
    for row in ("| --model prepack, batch auto | 96 |", "| --model hf, batch 32 | 96 |"):
        assert row in text, row
    assert len(modes) == 2 and all(m.h2d for m in modes)
