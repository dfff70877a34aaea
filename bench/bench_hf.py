#!/usr/bin/env python3
"""The Prepacking paper's benchmark in its own setting: Hugging Face transformers on CPU torch,
transformers' padded prefill (what ``model.generate`` runs first: prompts left-padded to the
longest, a 2D attention mask, logits of the last slot) against ``prepack.hf.prefill`` (the
prompts bin-packed into rows, one forward pass, every prompt's cache unpacked), on the seeded
workloads bench_prefill runs (bench_workload prints them), side by side in one run.

Time: each method's fastest of --passes passes (after a warm-up), methods alternating. Peak
memory: the growth of the process's peak resident set during a call (Linux: VmHWM reset through
/proc/self/clear_refs before it, VmRSS before it), i.e. the activations, the mask and the caches
the call leaves; the model's weights are not counted. glibc keeps freed memory for reuse (and the
threshold above which it maps a block of its own grows as blocks are freed), which makes that
growth depend on what ran before; so memory is measured in a child process per model with
MALLOC_MMAP_THRESHOLD_ fixed at 64 KiB (every tensor its own mapping, returned when freed), two
calls per method after a warm-up, the largest taken. Every pass checks that the two methods'
last-token logits agree (exit 1 otherwise).

With --overhead it also measures the package's calling overhead, in a fresh child process (no
torch loaded, as bench_plan's is fresh): prepack.pack of 10^5 prompts (flat int32 tokens and
lengths) and prepack.step_inputs of a 512-token step, against the same C++ calls timed by
bench_plan (BM_PythonPack, BM_PythonStepInputs), alternated.

  bench_hf.py --build build/release [--models large,smollm2] [--quick] [--overhead]
              [--out DIR]       writes DIR/hf.md, hf.csv and, with gnuplot, hf.png
"""
from __future__ import annotations

import argparse
import csv
import ctypes
import gc
import json
import os
import resource
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


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


def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def cpu_seconds():
    """(CPU time of every process on the machine, of this process), in seconds."""
    with open("/proc/stat") as f:
        parts = f.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in parts[:8])
    tick = os.sysconf("SC_CLK_TCK")
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ((user + nice + system + irq + softirq + steal) / tick,
            own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime)


def workload(build, profile, batch, seed, max_len, vocab, lengths_only=False):
    exe = os.path.join(build, "bench", "bench_workload")
    cmd = [exe, "--profile", profile, "--batch", str(batch), "--seed", str(seed),
           "--max-len", str(max_len), "--vocab", str(vocab)]
    if lengths_only:
        cmd.append("--lengths-only")
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def make_model(name, torch, transformers, args):
    if name in ("large", "tiny"):
        torch.manual_seed(1)
        shape = dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16,
                     num_key_value_heads=4, intermediate_size=2816, vocab_size=32000)
        if name == "tiny":
            shape = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=160, vocab_size=1000)
        cfg = transformers.LlamaConfig(max_position_embeddings=4096, rms_norm_eps=1e-5, **shape)
        cfg._attn_implementation = args.attn
        return transformers.LlamaForCausalLM(cfg).eval(), shape["vocab_size"]
    if name == "smollm2":
        path = args.model_file
        d, f = os.path.split(path)
        model = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32,
                                                                  attn_implementation=args.attn)
        return model.eval(), model.config.vocab_size
    raise SystemExit(f"bench_hf: unknown model {name!r} (large, smollm2, tiny)")


def padded(model, prompts, torch):
    """transformers' padded prefill, as generate() runs it: left padding, a 2D mask, position
    ids from it, logits of the last slot; the padded cache stays alive as generate keeps it."""
    width = max(map(len, prompts))
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                    logits_to_keep=1)
    return out.logits[:, -1], out


def peak_mib(fn):
    """The growth of the peak resident set during fn(), in MiB (what fn returns is kept until
    the reading)."""
    trim()
    base = status_kb("VmRSS")
    reset_peak()
    keep = fn()
    grown = (status_kb("VmHWM") - base) / 1024
    del keep
    return grown


def model_workloads(args, name, torch, transformers):
    model, vocab = make_model(name, torch, transformers, args)
    for spec in args.workloads.split(","):
        profile, batch = spec.rsplit("/", 1)
        w = workload(args.build, profile, int(batch), args.seed, args.max_len, vocab)
        yield model, profile, int(batch), w["prompts"]


def memory_child(args, torch, transformers, hf):
    """Prints {workload/batch: {padded: MiB, prepacked: MiB}} for one model (see the module
    docstring: run with MALLOC_MMAP_THRESHOLD_ fixed)."""
    out = {}
    for model, profile, batch, prompts in model_workloads(args, args.models, torch, transformers):
        calls = {"padded": lambda: padded(model, prompts, torch),
                 "prepacked": lambda: hf.prefill(model, prompts)}
        for fn in calls.values():  # warm-up
            fn()
        out[f"{profile}/{batch}"] = {k: max(peak_mib(fn), peak_mib(fn)) for k, fn in calls.items()}
    print(json.dumps(out))


def memory_of(args, name):
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    cmd = [sys.executable, os.path.abspath(__file__), "--memory-child", "--build", args.build,
           "--models", name, "--workloads", args.workloads, "--attn", args.attn,
           "--seed", str(args.seed), "--max-len", str(args.max_len),
           "--threads", str(args.threads), "--model-file", args.model_file]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def prefill_rows(args, torch, transformers, hf):
    rows = []
    for name in args.models.split(","):
        memory = memory_of(args, name)
        for model, profile, batch, prompts in model_workloads(args, name, torch, transformers):
            useful = sum(map(len, prompts))
            width = max(map(len, prompts))
            calls = {"padded": lambda: padded(model, prompts, torch)[0],
                     "prepacked": lambda: hf.prefill(model, prompts).logits}
            for fn in calls.values():  # warm-up
                fn()
            best = {k: float("inf") for k in calls}
            worst = 0.0
            for _ in range(args.passes):  # alternate the methods, pass by pass
                logits = {}
                for k, fn in calls.items():
                    t0 = time.perf_counter()
                    logits[k] = fn()
                    best[k] = min(best[k], time.perf_counter() - t0)
                scale = logits["padded"].abs().max().item()
                worst = max(worst, (logits["padded"] - logits["prepacked"]).abs().max().item() / scale)
            r = hf.pack_inputs(model, prompts)[0]
            mem = memory[f"{profile}/{batch}"]
            row = {
                "model": name, "attn": args.attn, "workload": profile, "batch": batch,
                "tokens": useful, "padded_slots": len(prompts) * width,
                "packed_slots": r.n_slots, "rows": r.n_rows,
                "padded_s": best["padded"], "prepacked_s": best["prepacked"],
                "padded_mib": mem["padded"], "prepacked_mib": mem["prepacked"],
                "logits_rel_diff": worst,
            }
            row["speedup"] = row["padded_s"] / row["prepacked_s"]
            row["memory_ratio"] = row["padded_mib"] / max(row["prepacked_mib"], 1e-9)
            rows.append(row)
            print(f"{name:8} {args.attn:5} {profile:10} {batch:>3}: padded {row['padded_s']:.3f} s "
                  f"{row['padded_mib']:.1f} MiB, prepacked {row['prepacked_s']:.3f} s "
                  f"{row['prepacked_mib']:.1f} MiB: {row['speedup']:.2f}x faster, "
                  f"{row['memory_ratio']:.2f}x less memory (logits within {worst:.1e})", flush=True)
            if worst > 1e-3:
                print(f"bench_hf: {name} {profile}/{batch}: prepacked logits differ from padded "
                      f"by {worst:.2e} of their scale", file=sys.stderr)
                sys.exit(1)
        trim()
    return rows


def overhead_rows(args):
    """Runs overhead_child in a fresh process and returns its rows."""
    cmd = [sys.executable, os.path.abspath(__file__), "--overhead-child", "--build", args.build]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")  # numpy's BLAS threads idle, not spinning
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    rows = json.loads(out.strip().splitlines()[-1])
    for r in rows:
        print(f"{r['call']}: Python {r['python_s'] * 1e6:.1f} us, C++ {r['cpp_s'] * 1e6:.1f} us: "
              f"{r['ratio']:.3f}x", flush=True)
    return rows


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


def write_report(args, rows, overhead, other_share):
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "hf.csv"), "w", newline="") as f:
        if rows:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    lines = ["## Hugging Face transformers: padded prefill against prepack.hf.prefill", "",
             f"CPU torch {args.torch_version}, transformers {args.transformers_version}, "
             f"{args.threads} threads, attn_implementation {args.attn}; fastest of {args.passes} "
             f"passes each, methods alternating; other processes took {other_share:.1%} of the "
             f"CPU during the run. Peak memory: growth of the peak resident set during the call "
             f"(activations, mask and the caches it returns; not the weights), measured in a child "
             f"process with every tensor mapped on its own (MALLOC_MMAP_THRESHOLD_=64 KiB).", "",
             "| model | workload | batch | tokens | padded slots | packed slots (rows) | padded s | "
             "prepacked s | speedup | padded MiB | prepacked MiB | memory ratio | logits diff |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['workload']} | {r['batch']} | {r['tokens']} | {r['padded_slots']} | "
            f"{r['packed_slots']} ({r['rows']}) | {r['padded_s']:.3f} | {r['prepacked_s']:.3f} | "
            f"{r['speedup']:.2f}x | {r['padded_mib']:.1f} | {r['prepacked_mib']:.1f} | "
            f"{r['memory_ratio']:.2f}x | {r['logits_rel_diff']:.1e} |")
    target = [r for r in rows if r["workload"] == "heavy-cut" and r["batch"] == 32]
    if target:
        lines += ["", "Targets (heavy-cut, batch 32): at least 3x faster and 3x less peak memory:"]
        for r in target:
            ok = r["speedup"] >= 3 and r["memory_ratio"] >= 3
            lines.append(f"- {r['model']}: {r['speedup']:.2f}x faster, {r['memory_ratio']:.2f}x less "
                         f"memory: {'met' if ok else 'missed'}")
    if overhead:
        lines += ["", "### Calling overhead (Python against the same C++ call, same run)", "",
                  "| call | Python | C++ | ratio |", "|---|---|---|---|"]
        for o in overhead:
            lines.append(f"| {o['call']} | {o['python_s'] * 1e6:.1f} us | {o['cpp_s'] * 1e6:.1f} us | "
                         f"{o['ratio']:.3f}x |")
        ok = all(o["ratio"] <= 1.2 for o in overhead)
        lines.append(f"\nTarget: within 1.2x of the C++ calls: {'met' if ok else 'missed'}")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "hf.md"), "w") as f:
        f.write(text)
    print(text)
    if rows and shutil.which("gnuplot"):
        data = os.path.join(args.out, "hf.dat")
        with open(data, "w") as f:
            for r in rows:
                f.write(f"\"{r['model']} {r['workload']}/{r['batch']}\" {r['speedup']:.3f} "
                        f"{r['memory_ratio']:.3f}\n")
        script = f"""set terminal pngcairo size 900,420 font ",10"
set output "{os.path.join(args.out, 'hf.png')}"
set title "transformers on CPU: prepack.hf.prefill over padded prefill (same run)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set ylabel "padded / prepacked"
set yrange [0:*]
set grid ytics
set key top left
plot "{data}" using 2:xtic(1) title "speed-up", "" using 3 title "less peak memory"
"""
        subprocess.run(["gnuplot"], input=script, text=True, check=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build", "release"),
                    help="the CMake build with bench_workload and bench_plan")
    ap.add_argument("--models", default="large,smollm2")
    ap.add_argument("--workloads", default="heavy-cut/32,heavy-cut/8,mild/32")
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--model-file", default=None, help="the SmolLM2 GGUF (default: the oracle cache's)")
    ap.add_argument("--quick", action="store_true", help="one workload, two passes")
    ap.add_argument("--smoke", action="store_true", help="a tiny model, a few seconds (the test)")
    ap.add_argument("--overhead", action="store_true", help="also the calling overhead")
    ap.add_argument("--out", default=None)
    ap.add_argument("--memory-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--overhead-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
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

    torch.set_num_threads(args.threads)
    if args.model_file is None:
        cache = os.environ.get("PREPACK_CACHE") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "prepack")
        args.model_file = os.path.join(cache, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    if args.quick:
        args.workloads, args.passes = "heavy-cut/32", 2
    if args.smoke:
        args.models, args.workloads, args.passes, args.max_len = "tiny", "heavy-cut/8", 2, 64
    if args.memory_child:
        return memory_child(args, torch, transformers, hf)
    args.out = args.out or os.path.join(args.build, "report")
    args.torch_version, args.transformers_version = torch.__version__, transformers.__version__
    busy0, own0 = cpu_seconds()
    wall0 = time.time()
    overhead = overhead_rows(args) if args.overhead else []
    rows = prefill_rows(args, torch, transformers, hf)
    busy1, own1 = cpu_seconds()
    wall = max(time.time() - wall0, 1e-9)
    other = max(0.0, (busy1 - busy0) - (own1 - own0)) / (wall * (os.cpu_count() or 1))
    write_report(args, rows, overhead, other)
    print(f"report written to {args.out}/hf.md")


if __name__ == "__main__":
    main()
