#!/usr/bin/env python3
"""The Prepacking paper's table in its own setting: Hugging Face transformers on a GPU (bf16)
or a CPU (fp32), heavy-tailed prompts, every way of running them side by side in one run.

Methods (rows of the table):
  padded            the prompts left-padded to the longest, a 2-D mask: model(...) and
                    model.generate, as users batch with transformers
  sorted padded     the paper's length-ordered baseline: prompts sorted by length, padded
                    batches of --sorted-batch prompts, one after the other
  prepack <kernel>  prepack.hf.prefill / prepack.hf.generate under each attention kernel given
                    (eager, sdpa, flex_attention; flash_attention_2 where installed), generate
                    with its default decode batches ("auto": on a CPU length-sorted batches,
                    on a GPU one); under sdpa also --decode-batches (default on a CPU: 1, the
                    one-batch decode beside the default's)
  padding-free      transformers' own padding-free forward (one row, position ids restarting,
                    no mask, no cache) under sdpa and flex_attention: prefill only
  continuous        transformers' continuous batching (model.generate_batch, paged cache)

Phases (columns): prefill without caches (the forward pass alone, last-token logits), time to
first token (the caches ready for decoding in the form generation continues, and the first
token), and --new-tokens tokens of greedy generation for every prompt; peak memory of each
phase. Time: the fastest of --passes passes after a warm-up, methods alternating within a pass,
CUDA-synchronised. Peak memory: on CUDA torch.cuda.max_memory_allocated over the phase less what
was allocated before it (the weights); on CPU the growth of the process's peak resident set,
measured in a child process per method with every tensor mapped on its own
(MALLOC_MMAP_THRESHOLD_=64 KiB). Checks, every pass: prepack's first tokens and the logits they
come from agree with padded's (exit 1 if the logits differ by more than 1e-3 of their scale in
fp32), and in fp32 its generated tokens equal padded generate's.

  bench_hf.py [--device auto|cpu|cuda] [--model large|1.3b|7b|small|tiny|DIR]
              [--prompts 64,256] [--new-tokens 32] [--kernels sdpa,eager,flex_attention]
              [--quick] [--smoke] [--overhead --build BUILD] [--out DIR]
  writes DIR/hf-<device>.md and hf-<device>.csv (default DIR: bench/results)
"""
from __future__ import annotations

import argparse
import csv
import ctypes
import gc
import json
import os
import platform
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# Model shapes (random weights; Llama architecture).
SHAPES = {
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=160, vocab_size=1000),
    "small": dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                  num_key_value_heads=4, intermediate_size=1408, vocab_size=32000),
    "large": dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16,
                  num_key_value_heads=4, intermediate_size=2816, vocab_size=32000),
    # Sheared-LLaMA-1.3B's and Llama-2-7B's shapes, the paper's models.
    "1.3b": dict(hidden_size=2048, num_hidden_layers=24, num_attention_heads=16,
                 num_key_value_heads=16, intermediate_size=5504, vocab_size=32000),
    "7b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32, intermediate_size=11008, vocab_size=32000),
}


# -- machine ------------------------------------------------------------------------------------


def status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def trim():
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def cpu_seconds():
    """(CPU time of every process on the machine, of this process and its children), seconds."""
    with open("/proc/stat") as f:
        parts = f.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in parts[:8])
    tick = os.sysconf("SC_CLK_TCK")
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ((user + nice + system + irq + softirq + steal) / tick,
            own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime)


class Meter:
    """Times a call (CUDA-synchronised) and measures its peak memory on CUDA."""

    def __init__(self, torch, device):
        self.torch, self.cuda = torch, device.type == "cuda"

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def run(self, fn):
        """(result, seconds, peak MiB over what was allocated before; None on CPU)."""
        torch = self.torch
        if self.cuda:
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        out = fn()
        self.sync()
        seconds = time.perf_counter() - t0
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if self.cuda else None
        return out, seconds, peak


def cpu_peak_mib(fn):
    """The growth of this process's peak resident set during fn(), in MiB (what fn returns is
    kept until the reading)."""
    trim()
    base = status_kb("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    keep = fn()
    grown = (status_kb("VmHWM") - base) / 1024
    del keep
    return grown


# -- workload and model -------------------------------------------------------------------------


def heavy_prompts(n, vocab, seed):
    """Heavy-tailed prompt lengths as the paper's benchmarks have them: log-normal, median 48
    tokens, at most 512 (the longest of 64-256 prompts 290-360)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(48), 0.9, n).astype(int), 4, 512)
    return [rng.integers(0, vocab, int(L)).tolist() for L in lengths]


def make_model(args, torch, transformers, attn):
    if args.model in SHAPES:
        torch.manual_seed(1)
        cfg = transformers.LlamaConfig(max_position_embeddings=4096, rms_norm_eps=1e-5,
                                       **SHAPES[args.model])
        model = transformers.LlamaForCausalLM(cfg).to(args.dtype)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=args.dtype)
    model.config._attn_implementation = attn
    model.generation_config.pad_token_id = 0
    return model.to(args.device).eval()


# -- methods ------------------------------------------------------------------------------------


def padded_inputs(torch, prompts, device):
    width = max(map(len, prompts))
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    return ids.to(device), mask.to(device)


def padded_method(torch, model, prompts, new_tokens, groups=None):
    """(prefill, ttft, generate) callables of padded batches: one, or sorted groups."""
    batches = [prompts] if groups is None else groups
    inputs = [padded_inputs(torch, b, model.device) for b in batches]

    def forward(use_cache):
        out = []
        for ids, mask in inputs:
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            r = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=use_cache,
                      logits_to_keep=1)
            out.append((r.logits[:, -1], r.get("cache", r.get("past_key_values"))))
        return out

    def prefill():
        return torch.cat([lo for lo, _ in forward(False)])

    def ttft():
        out = forward(True)
        return torch.cat([lo for lo, _ in out]).argmax(-1), [c for _, c in out]

    def generate():
        seqs = []
        for ids, mask in inputs:
            g = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens,
                               min_new_tokens=new_tokens, do_sample=False)
            seqs += g[:, ids.shape[1]:].tolist()
        return seqs

    return prefill, ttft, generate


def prepack_method(torch, hf, model, prompts, new_tokens, with_generate=True, decode_batches=None):
    def prefill():
        return hf.prefill(model, prompts, cache=None).logits

    def ttft():
        r = hf.prefill(model, prompts)
        return r.next_tokens(), r

    def generate():
        kw = {} if decode_batches is None else dict(decode_batches=decode_batches)
        return hf.generate(model, prompts, new_tokens, min_new_tokens=new_tokens,
                           do_sample=False, **kw)

    return prefill, ttft, generate if with_generate else None


def padding_free_method(torch, model, prompts):
    """transformers' own padding-free forward: every prompt in one row, position ids restarting
    at 0 (transformers finds the sequences from them), no mask, no cache; last-token logits."""
    import numpy as np

    flat = torch.tensor([t for p in prompts for t in p], device=model.device)[None]
    pos = torch.tensor([i for p in prompts for i in range(len(p))], device=model.device)[None]
    last = torch.tensor(np.cumsum([len(p) for p in prompts]) - 1, device=model.device)

    def prefill():
        return model(input_ids=flat, position_ids=pos, use_cache=False, logits_to_keep=last).logits[0]

    return prefill, None, None


def continuous_method(transformers, model, prompts, new_tokens):
    import inspect

    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    # Its paged cache sized to the workload (every request's pages, prompt and new tokens), not
    # to most of the free memory, its default. The page size is block_size before transformers
    # 5.19.
    page = 256
    blocks = sum(-(-(len(p) + new_tokens) // page) for p in prompts) + len(prompts)
    size = ("page_size" if "page_size" in inspect.signature(ContinuousBatchingConfig).parameters
            else "block_size")
    cb = ContinuousBatchingConfig(**{size: page}, num_blocks=blocks)

    def run(n):
        gc_ = transformers.GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                            eos_token_id=-1, pad_token_id=0)
        out = model.generate_batch(inputs=prompts, generation_config=gc_,
                                   continuous_batching_config=cb, progress_bar=False)
        return [out[k].generated_tokens for k in sorted(out, key=lambda k: int(k.split("_")[-1]))]

    return None, (lambda: run(1)), (lambda: run(new_tokens))


# -- the run ------------------------------------------------------------------------------------


def methods_for(args, torch, transformers, hf, prompts, only=None):
    """{name: (model, (prefill, ttft, generate))}; a phase None where the method has none. only:
    the one method of that name (the models of the others are not built)."""
    out = {}
    models = {}

    def make(attn):
        if attn not in models:
            models[attn] = make_model(args, torch, transformers, attn)
        return models[attn]

    def want(name):
        return only is None or name == only

    base = make("sdpa") if (only is None or not only.startswith(("prepack", "padding-free"))
                            or "sdpa" in only) else None
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    groups = [[prompts[i] for i in order[k:k + args.sorted_batch]]
              for k in range(0, len(prompts), args.sorted_batch)]
    if want("padded"):
        out["padded"] = (base, padded_method(torch, base, prompts, args.new_tokens))
    name = f"sorted padded ({args.sorted_batch})"
    if want(name):
        out[name] = (base, padded_method(torch, base, [p for g in groups for p in g],
                                         args.new_tokens, groups))
    for k in args.kernels:
        # flex decode recompiles for every new cache length on a CPU: prefill and TTFT only.
        gen = not (k == "flex_attention" and args.device.type == "cpu")
        if want(f"prepack {k}"):
            m = make(k)
            out[f"prepack {k}"] = (m, prepack_method(torch, hf, m, prompts, args.new_tokens, gen))
        name = (f"prepack sdpa, {args.decode_batches} decode "
                f"batch{'' if args.decode_batches == 1 else 'es'}")
        if k == "sdpa" and args.decode_batches is not None and want(name):
            m = make(k)
            out[name] = (m, prepack_method(torch, hf, m, prompts, args.new_tokens, True,
                                           args.decode_batches))
    if not args.smoke:
        for k in ("sdpa", "flex_attention"):
            if want(f"padding-free {k}"):
                m = make(k)
                out[f"padding-free {k}"] = (m, padding_free_method(torch, m, prompts))
        if want("continuous") and hasattr(make("sdpa"), "generate_batch"):
            out["continuous"] = (make("sdpa"), continuous_method(transformers, make("sdpa"),
                                                                 prompts, args.new_tokens))
    return out


PHASES = ("prefill", "ttft", "generate")


def time_methods(args, torch, transformers, hf, prompts):
    meter = Meter(torch, args.device)
    methods = methods_for(args, torch, transformers, hf, prompts)
    best = {(m, ph): float("inf") for m in methods for ph in PHASES}
    peak = {}
    results = {}
    with torch.no_grad():
        for name, (_, phases) in methods.items():  # warm-up (compiles flex kernels)
            for fn in phases:
                if fn is not None:
                    fn()
                    meter.sync()
        for _ in range(args.passes):
            for name, (_, phases) in methods.items():
                for ph, fn in zip(PHASES, phases):
                    if fn is None:
                        continue
                    trim()
                    out, s, mib = meter.run(fn)
                    best[name, ph] = min(best[name, ph], s)
                    if mib is not None:
                        peak[name, ph] = max(peak.get((name, ph), 0.0), mib)
                    results[name, ph] = out
                    del out
    check(args, torch, methods, results)
    return methods, best, peak


def check(args, torch, methods, results):
    """prepack's logits and tokens against padded's (fp32: equal tokens; logits within 1e-3)."""
    ref = results[("padded", "prefill")].float()
    scale = ref.abs().max().item()
    first = results[("padded", "ttft")][0]
    want = results.get(("padded", "generate"))
    for name in methods:
        if not name.startswith("prepack"):
            continue
        diff = (results[(name, "prefill")].float() - ref).abs().max().item() / scale
        agree = (results[(name, "ttft")][0] == first).float().mean().item()
        print(f"check {name}: logits within {diff:.1e} of padded's scale, first tokens "
              f"{agree:.0%} equal", flush=True)
        if args.dtype == torch.float32 and diff > 1e-3:
            sys.exit(f"bench_hf: {name}: logits differ from padded's by {diff:.2e} of their scale")
        got = results.get((name, "generate"))
        if args.dtype == torch.float32 and got is not None and want is not None and got != want:
            sys.exit(f"bench_hf: {name}: generated tokens differ from padded generate's")


def memory_child(args, torch, transformers, hf, prompts):
    """Prints {phase: MiB} of one method (--memory-child NAME), each phase run once after a
    warm-up of the prefill."""
    methods = methods_for(args, torch, transformers, hf, prompts, only=args.memory_child)
    _, phases = methods[args.memory_child]
    out = {}
    with torch.no_grad():
        for ph, fn in zip(PHASES, phases):
            if fn is not None:
                fn()  # warm-up: thread pools, compiled kernels
                out[ph] = cpu_peak_mib(fn)
    print(json.dumps(out))


def cpu_memory(args, names):
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    peak = {}
    for name in names:
        cmd = [sys.executable, os.path.abspath(__file__), "--memory-child", name] + args.argv
        run = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if run.returncode != 0:  # reported, not fatal: the timings stand
            print(f"bench_hf: the memory of {name} could not be measured (exit {run.returncode}): "
                  f"{run.stderr.strip().splitlines()[-1:] }", file=sys.stderr)
            continue
        for ph, mib in json.loads(run.stdout.strip().splitlines()[-1]).items():
            peak[name, ph] = mib
    return peak


# -- calling overhead (CPU, against bench_plan's C++ timings) -------------------------------------


def overhead_rows(args):
    """Runs overhead_child in a fresh process (no torch loaded) and returns its rows."""
    cmd = [sys.executable, os.path.abspath(__file__), "--overhead-child", "--build", args.build]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")  # numpy's BLAS threads idle, not spinning
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    rows = json.loads(out.strip().splitlines()[-1])
    for r in rows:
        print(f"{r['call']}: Python {r['python_s'] * 1e6:.1f} us, C++ {r['cpp_s'] * 1e6:.1f} us: "
              f"{r['ratio']:.3f}x", flush=True)
    return rows


def workload(build, profile, batch, seed, max_len, vocab, lengths_only=False):
    exe = os.path.join(build, "bench", "bench_workload")
    cmd = [exe, "--profile", profile, "--batch", str(batch), "--seed", str(seed),
           "--max-len", str(max_len), "--vocab", str(vocab)]
    if lengths_only:
        cmd.append("--lengths-only")
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def overhead_child(args):
    import numpy as np

    import prepack

    bench_plan = os.path.join(args.build, "bench", "bench_plan")
    lengths = np.array(workload(args.build, "heavy-cut", 100000, 1, 512, 32000, True)["lengths"],
                       np.int64)
    tokens = (np.arange(int(lengths.sum())) % 32000).astype(np.int32)
    w = workload(args.build, "heavy-cut", 64, 1, 512, 32000)
    items = prepack.Prompts(w["prompts"])
    alloc = prepack.BlockAllocator(4096)
    tables = prepack.BlockTables.from_lists(
        [alloc.allocate(-(-L // 16)).tolist() for L in w["lengths"]], 16)
    sched = prepack.budgeted_schedule(w["lengths"], budget=512, policy="fill")

    def best_python(fn, repeat, number):
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            best = min(best, (time.perf_counter() - t0) / number)
        return best

    def best_cpp(name):
        out = subprocess.run([bench_plan, f"--benchmark_filter=^{name}/", "--benchmark_repetitions=5",
                              "--benchmark_format=json", "--benchmark_min_time=0.2"],
                             check=True, capture_output=True, text=True).stdout
        runs = [b for b in json.loads(out)["benchmarks"] if b.get("run_type") == "iteration"]
        unit = {"ms": 1e-3, "us": 1e-6, "ns": 1e-9}[runs[0]["time_unit"]]
        return min(b["real_time"] for b in runs) * unit

    calls = [
        ("pack of 10^5 prompts", "BM_PythonPack",
         lambda: prepack.pack(tokens, lengths=lengths), (5, 3)),
        ("step inputs of a 512-token step", "BM_PythonStepInputs",
         lambda: prepack.step_inputs(sched, 0, items, tables, 4096), (7, 2000)),
    ]
    rows = []
    for what, cpp_name, fn, (repeat, number) in calls:
        py, cpp = float("inf"), float("inf")
        for _ in range(3):  # alternate, to see the same machine
            cpp = min(cpp, best_cpp(cpp_name))
            py = min(py, best_python(fn, repeat, number))
        rows.append({"call": what, "python_s": py, "cpp_s": cpp, "ratio": py / cpp})
    print(json.dumps(rows))


# -- report -------------------------------------------------------------------------------------


def unpack_share(args, torch, hf, model, prompts):
    """(packed forward with its cache, the gather into the batch cache) in seconds, fastest of
    --passes: what building the cache decoding needs costs over the forward pass."""
    meter = Meter(torch, args.device)
    t = hf._target(model)
    ps = hf.as_prompts(prompts)
    fwd = gat = float("inf")
    longest = max(map(len, prompts))
    import numpy as np

    with torch.no_grad():
        for _ in range(args.passes + 1):
            batch = hf._pack(t, ps, None, "ffd")
            (_, rows), s1, _ = meter.run(lambda: hf._forward(model, t, batch, True,
                                                             batch.last_token))
            _, s2, _ = meter.run(lambda: hf._batch_cache(model, t, rows, batch,
                                                         np.arange(len(ps)), longest))
            fwd, gat = min(fwd, s1), min(gat, s2)
            del rows
    return fwd, gat


def cpu_name():
    """The CPU's model name and its widest vector instructions (the kernels differ by them)."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    name = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    isa = ("AVX-512, AMX" if {"avx512f", "amx_tile"} <= flags else "AVX-512" if "avx512f" in flags
           else "AVX2" if "avx2" in flags else None)
    return f"{name} ({isa})" if isa else name


def write_report(args, rows, overhead, other_share, shares):
    os.makedirs(args.out, exist_ok=True)
    tag = args.device.type
    with open(os.path.join(args.out, f"hf-{tag}.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    dev = (args.torch.cuda.get_device_name(0) if tag == "cuda"
           else f"{cpu_name()}, {args.threads} threads")
    lines = [f"## Hugging Face transformers on {tag.upper()}: padded, length-sorted, prepack and "
             f"transformers' own batching, side by side", "",
             f"{dev}; torch {args.torch.__version__}, transformers {args.transformers_version}, "
             f"{str(args.dtype).replace('torch.', '')}; model {args.model} (random weights, Llama "
             f"architecture); heavy-tailed prompts (log-normal, median 48 tokens); greedy "
             f"generation of {args.new_tokens} tokens per prompt. Fastest of {args.passes} passes "
             f"after a warm-up, methods alternating"
             + (f"; other processes took {other_share:.1%} of the CPU during the run" if tag == "cpu"
                else "")
             + ". Peak memory: what the phase allocates over the weights "
             + ("(torch.cuda.max_memory_allocated)." if tag == "cuda" else
                "(growth of the peak resident set, in a child process per method, every tensor "
                "mapped on its own)."),
             "",
             "| prompts (tokens, longest) | method | prefill s | TTFT s | generate s | prefill MiB "
             "| TTFT MiB | generate MiB | TTFT vs padded | generate vs padded |",
             "|---|---|---|---|---|---|---|---|---|---|"]

    def f(x, fmt):
        return "—" if x is None else format(x, fmt)

    for r in rows:
        lines.append(
            f"| {r['prompts']} ({r['tokens']}, {r['longest']}) | {r['method']} | "
            f"{f(r['prefill_s'], '.3f')} | {f(r['ttft_s'], '.3f')} | {f(r['generate_s'], '.3f')} | "
            f"{f(r['prefill_mib'], '.0f')} | {f(r['ttft_mib'], '.0f')} | "
            f"{f(r['generate_mib'], '.0f')} | {f(r['ttft_x'], '.2f')}x | "
            f"{f(r['generate_x'], '.2f')}x |".replace("—x", "—"))
    lines += ["", "Unpacking (the per-layer gathers into the batch cache) against the packed "
              "forward pass with its cache, prepack sdpa:", ""]
    for n, (fwd, gat) in shares.items():
        lines.append(f"- {n} prompts: forward {fwd:.3f} s, gather {gat:.3f} s: "
                     f"**{gat / fwd:.1%}** of the forward (target at most 15%)")
    targets = ((6, 3, 3, 4) if tag == "cuda" else (3, 2, None, None))
    lines += ["", f"Targets ({'H200 class, bf16, 1.3B shape, 256 prompts' if tag == 'cuda' else '2 threads, fp32'}): "
              f"time to first token >= {targets[0]}x padded, generation >= {targets[1]}x padded"
              + (f" and >= {targets[2]}x continuous batching, peak memory <= 1/{targets[3]} of "
                 f"padded" if targets[2] else "") + ":"]
    for n in sorted({r["prompts"] for r in rows}):
        by = {r["method"]: r for r in rows if r["prompts"] == n}
        pad = by["padded"]
        for name, r in by.items():
            if not name.startswith("prepack") or r["ttft_s"] is None:
                continue
            parts = [f"TTFT {r['ttft_x']:.2f}x"]
            ok = r["ttft_x"] >= targets[0]
            if r["generate_s"] is not None:
                parts.append(f"generate {r['generate_x']:.2f}x")
                ok = ok and r["generate_x"] >= targets[1]
                cont = by.get("continuous")
                if targets[2] and cont and cont["generate_s"]:
                    x = cont["generate_s"] / r["generate_s"]
                    parts.append(f"{x:.2f}x continuous batching")
                    ok = ok and x >= targets[2]
            if targets[3] and r["ttft_mib"] and pad["ttft_mib"]:
                x = pad["ttft_mib"] / r["ttft_mib"]
                parts.append(f"TTFT memory 1/{x:.1f} of padded")
                ok = ok and x >= targets[3]
            lines.append(f"- {n} prompts, {name}: {', '.join(parts)}: {'met' if ok else 'missed'}")
    if overhead:
        lines += ["", "### Calling overhead (Python against the same C++ call, same run)", "",
                  "| call | Python | C++ | ratio |", "|---|---|---|---|"]
        for o in overhead:
            lines.append(f"| {o['call']} | {o['python_s'] * 1e6:.1f} us | {o['cpp_s'] * 1e6:.1f} us | "
                         f"{o['ratio']:.3f}x |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, f"hf-{tag}.md"), "w") as fh:
        fh.write(text)
    print(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--model", default=None, help="a shape (tiny, small, large, 1.3b, 7b) or a "
                    "model directory; default 1.3b on CUDA, large on CPU")
    ap.add_argument("--prompts", default=None, help="prompt counts; default 64,256 on CUDA, 64 on CPU")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--kernels", default="sdpa,eager,flex_attention")
    ap.add_argument("--sorted-batch", type=int, default=16)
    ap.add_argument("--decode-batches", type=lambda v: v if v == "auto" else int(v), default=None,
                    help="also prepack sdpa decoding this many length-sorted batches (default "
                    "1 on a CPU, beside the library's default 'auto'; none on CUDA, where 'auto' "
                    "is one batch)")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--quick", action="store_true", help="one pass, sdpa only")
    ap.add_argument("--smoke", action="store_true", help="a tiny model, seconds (the test)")
    ap.add_argument("--overhead", action="store_true",
                    help="also the calling overhead against bench_plan (needs --build)")
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build", "release"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--overhead-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.argv = [a for a in sys.argv[1:]]
    if args.overhead_child:
        return overhead_child(args)
    try:
        import torch
        import transformers
    except ImportError as e:  # the smoke test: skipped where they are absent, failed in CI
        print(f"prepack-skip: bench_hf needs torch and transformers ({e}); .ci/fetch-oracles "
              f"installs them")
        sys.exit(1 if os.environ.get("PREPACK_REQUIRE_ORACLES") == "1" else 0)
    import prepack.hf as hf

    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    args.device = torch.device("cuda" if cuda else "cpu")
    args.dtype = torch.bfloat16 if cuda else torch.float32
    if args.decode_batches is None and not cuda:
        args.decode_batches = 1  # one decode batch, beside the default's length-sorted batches
    args.model = args.model or ("1.3b" if cuda else "large")
    counts = args.prompts or ("64,256" if cuda else "64")
    args.kernels = args.kernels.split(",")
    if cuda and "flash_attention_2" not in args.kernels:
        try:
            import flash_attn  # noqa: F401

            args.kernels.append("flash_attention_2")
        except ImportError:
            pass
    if args.quick:
        args.passes, args.kernels = 1, ["sdpa"]
    if args.smoke:
        args.model, counts, args.passes, args.new_tokens = "tiny", "12", 1, 4
        args.kernels = ["sdpa", "eager"]
    torch.set_num_threads(args.threads)
    vocab = SHAPES[args.model]["vocab_size"] if args.model in SHAPES else None
    if args.memory_child:
        n = int(os.environ["BENCH_HF_PROMPTS"])
        return memory_child(args, torch, transformers, hf,
                            heavy_prompts(n, vocab or 32000, args.seed))
    args.torch, args.transformers_version = torch, transformers.__version__
    args.out = args.out or os.path.join(HERE, "results")
    busy0, own0 = cpu_seconds()
    wall0 = time.time()
    overhead = overhead_rows(args) if args.overhead else []
    rows, shares = [], {}
    for n in (int(x) for x in counts.split(",")):
        prompts = heavy_prompts(n, vocab or 32000, args.seed)
        methods, best, peak = time_methods(args, torch, transformers, hf, prompts)
        if not cuda:
            os.environ["BENCH_HF_PROMPTS"] = str(n)
            # Each method's memory is measured in a process of its own (torch and transformers
            # imported afresh: seconds each); the smoke run measures two, enough to run the path.
            peak = cpu_memory(args, ["padded", "prepack sdpa"] if args.smoke else list(methods))
        if "sdpa" in args.kernels:
            shares[n] = unpack_share(args, torch, hf, methods["prepack sdpa"][0], prompts)
        pad = {ph: best["padded", ph] for ph in PHASES}
        for name in methods:
            r = {"prompts": n, "tokens": sum(map(len, prompts)),
                 "longest": max(map(len, prompts)), "method": name}
            for ph in PHASES:
                s = best[name, ph]
                r[f"{ph}_s"] = None if s == float("inf") else s
                r[f"{ph}_mib"] = peak.get((name, ph))
            r["ttft_x"] = pad["ttft"] / r["ttft_s"] if r["ttft_s"] else None
            r["generate_x"] = pad["generate"] / r["generate_s"] if r["generate_s"] else None
            rows.append(r)
            print(f"{n} prompts, {name}: " + ", ".join(
                f"{ph} {r[f'{ph}_s']:.3f} s" for ph in PHASES if r[f"{ph}_s"] is not None),
                flush=True)
        trim()
        # the report so far, rewritten after each prompt count: a run cut short (a time limit on
        # a lent GPU) keeps the counts it finished
        busy1, own1 = cpu_seconds()
        wall = max(time.time() - wall0, 1e-9)
        other = max(0.0, (busy1 - busy0) - (own1 - own0)) / (wall * (os.cpu_count() or 1))
        write_report(args, rows, overhead, other, shares)
        print(f"report written to {args.out}/hf-{args.device.type}.md ({n} prompts done, "
              f"{wall:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
