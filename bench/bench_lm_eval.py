#!/usr/bin/env python3
"""Evaluation with prepacking: lm-evaluation-harness on an MMLU-like task, its Hugging Face
backend (--model hf, HFLM) at batch sizes auto, 32 and 64 (on a CPU also 2, its fastest on a
2-core machine) against prepack.lm_eval (--model prepack) at auto and 64, side by side in one run.

The task, written locally: --questions multiple-choice questions with heavy-tailed contexts
(log-normal, median about 60 tokens, a few near 700), four one-token answers (" A" .. " D") as
MMLU's; the model: random weights in a Llama shape (--model), saved with a byte-level BPE
tokenizer trained on the task's words (the model's vocabulary is the shape's, 32000: the LM head
costs what it costs). Each method runs in its own process: the model loaded, a warm-up on a few
questions, then the task timed (the backend's loglikelihood calls; lm_eval's own bookkeeping
around them is reported apart) and its peak memory measured: on CUDA max_memory_allocated over the
run less what was allocated before it (the weights), on CPU the growth of the process's peak
resident set (every tensor mapped on its own: MALLOC_MMAP_THRESHOLD_=64 KiB). The fastest of
--passes passes, methods alternating within a pass. Checks: every method's answers equal the
first's request by request (log-likelihoods within 1e-5 relative in fp32, 1e-2 in bf16; is_greedy
and accuracy identical in fp32); a mismatch exits 1.

  bench_lm_eval.py [--device auto|cpu|cuda] [--model large|1.3b|small|tiny] [--questions N]
                   [--methods hf:auto,hf:32,...,prepack:auto] [--passes N] [--smoke] [--out DIR]
  writes DIR/lm-eval-<device>.md and .csv (default DIR: bench/results)
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_hf import SHAPES, cpu_name, status_kb, trim  # noqa: E402

SYLLABLES = ("ka ri to ne ma su lo vi de pa ren tal ist ory ing ment con pro ver sa tion ble "
             "mi cro eco nom ics phy bio che mis try law gen eral his tor al sci ence").split()


def words(rng, n):
    return [rng.choice(SYLLABLES) + rng.choice(SYLLABLES) + (rng.choice(SYLLABLES) if
                                                             rng.random() < 0.4 else "")
            for _ in range(n)]


def build(workdir, args):
    """The tokenizer, the model (random weights, saved in the run's dtype) and the task."""
    import tokenizers
    import torch
    import transformers

    rng = random.Random(args.seed)
    corpus = [" ".join(words(rng, 60)) + "." for _ in range(400)]
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    # The answer letters after "Answer:" are one token each, as in the tokenizers MMLU is run
    # with: multiple-choice requests then share their context, which both backends exploit.
    answers = [f"\nA. yes\nB. no\nC. maybe\nD. never\nAnswer: {c}" for c in "ABCD"] * 200
    bpe.train_from_iterator(corpus + answers, tokenizers.trainers.BpeTrainer(
        vocab_size=min(2000, SHAPES[args.model]["vocab_size"]), special_tokens=["<s>", "</s>", "<pad>"]))
    bpe.post_processor = tokenizers.processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 0)])
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>",
                                               eos_token="</s>", pad_token="<pad>")
    model_dir = os.path.join(workdir, "model")
    tok.save_pretrained(model_dir)
    torch.manual_seed(args.seed)
    shape = dict(SHAPES[args.model])
    cfg = transformers.LlamaConfig(**shape, max_position_embeddings=2048, bos_token_id=0,
                                   eos_token_id=1, pad_token_id=2)
    cfg.dtype = args.dtype
    model = transformers.LlamaForCausalLM(cfg).to(getattr(torch, args.dtype))
    model.save_pretrained(model_dir)
    lengths = []
    with open(os.path.join(workdir, "mmlu_like.jsonl"), "w") as f:
        for _ in range(args.questions):
            n = max(4, min(args.longest, int(rng.lognormvariate(math.log(args.median), 0.9))))
            text = " ".join(words(rng, n))
            lengths.append(len(tok(text)["input_ids"]))
            f.write(json.dumps({"question": text, "answer": rng.randrange(4)}) + "\n")
    with open(os.path.join(workdir, "mmlu_like.yaml"), "w") as f:
        f.write(f"task: mmlu_like\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
                f"    test: {os.path.join(workdir, 'mmlu_like.jsonl')}\ntest_split: test\n"
                "output_type: multiple_choice\n"
                "doc_to_text: \"{{question}}\\nA. yes\\nB. no\\nC. maybe\\nD. never\\nAnswer:\"\n"
                "doc_to_choice: [\"A\", \"B\", \"C\", \"D\"]\ndoc_to_target: answer\n"
                "metric_list:\n  - metric: acc\n    aggregation: mean\n"
                "    higher_is_better: true\n")
    lengths.sort()
    return lengths


# -- one method, in its own process --------------------------------------------------------------


def child(args):
    import lm_eval
    import torch
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    import prepack.lm_eval as ple

    kind, bs = args.child.split(":")
    cls = HFLM if kind == "hf" else ple.PrepackLM
    device = "cuda" if args.device == "cuda" else "cpu"
    lm = cls(pretrained=os.path.join(args.workdir, "model"), device=device, dtype=args.dtype,
             batch_size=bs if bs == "auto" else int(bs))
    spent = [0.0, 0]
    inner = lm.loglikelihood

    def timed(requests, disable_tqdm=False):
        sync()
        t0 = time.perf_counter()
        out = inner(requests, disable_tqdm=True)
        sync()
        spent[0] += time.perf_counter() - t0
        spent[1] += len(requests)
        return out

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    lm.loglikelihood = timed
    tm = TaskManager(include_path=args.workdir)
    lm_eval.simple_evaluate(model=lm, tasks=["mmlu_like"], task_manager=tm, limit=8,
                            verbosity="ERROR")  # warm-up: thread pools, allocator
    spent[:] = [0.0, 0]
    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        trim()
        base = status_kb("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    t0 = time.perf_counter()
    res = lm_eval.simple_evaluate(model=lm, tasks=["mmlu_like"], task_manager=tm,
                                  log_samples=True, verbosity="ERROR")
    wall = time.perf_counter() - t0
    peak = ((torch.cuda.max_memory_allocated() - base) / 2**20 if device == "cuda"
            else (status_kb("VmHWM") - base) / 1024)
    samples = [[r[0] for r in s["resps"]] for s in res["samples"]["mmlu_like"]]
    print(json.dumps({"seconds": spent[0], "requests": spent[1], "wall": wall, "peak_mib": peak,
                      "acc": res["results"]["mmlu_like"]["acc,none"], "samples": samples}))


def run_child(args, method):
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0",
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", method, "--workdir",
           args.workdir, "--device", args.device, "--dtype", args.dtype]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"bench_lm_eval: {method} failed (exit {run.returncode}):\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def compare(args, ref, got, name):
    """Request by request against the first method; returns the largest relative difference."""
    rel = 1e-5 if args.dtype == "float32" else 1e-2
    worst = 0.0
    for qa, qb in zip(ref["samples"], got["samples"], strict=True):
        for (la, ga), (lb, gb) in zip(qa, qb, strict=True):
            d = abs(la - lb) / max(abs(la), 1e-12)
            worst = max(worst, d)
            if d > rel or (args.dtype == "float32" and ga != gb):
                sys.exit(f"bench_lm_eval: {name} differs from {args.methods[0]}: "
                         f"({lb}, {gb}) against ({la}, {ga})")
    if args.dtype == "float32" and got["acc"] != ref["acc"]:
        sys.exit(f"bench_lm_eval: {name} accuracy {got['acc']} against {ref['acc']}")
    return worst


def machine(args):
    if args.device == "cuda":
        import torch

        return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    return f"{cpu_name()}, {os.cpu_count()} threads"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--model", default=None, choices=sorted(SHAPES),
                    help="a Llama shape; default 1.3b on CUDA, large on CPU")
    ap.add_argument("--questions", type=int, default=None,
                    help="default 1000 on CUDA, 300 on CPU")
    ap.add_argument("--median", type=int, default=45, help="median words per question")
    ap.add_argument("--longest", type=int, default=500, help="the most words in a question")
    ap.add_argument("--methods", default=None,
                    help="default hf:auto,hf:32,hf:64,prepack:auto,prepack:64, and on a CPU "
                         "also hf:2 (HFLM's fastest batch size on a 2-core CPU)")
    ap.add_argument("--passes", type=int, default=None, help="default 2 on CUDA, 1 on CPU")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--smoke", action="store_true", help="a tiny model, 24 questions, one pass")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--workdir", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--dtype", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.device == "auto":
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    if args.child:
        return child(args)
    if args.smoke:
        args.model, args.questions, args.passes = "tiny", 24, 1
        args.median, args.longest = 20, 120
    args.model = args.model or ("1.3b" if args.device == "cuda" else "large")
    args.questions = args.questions or (1000 if args.device == "cuda" else 300)
    args.methods = (args.methods or "hf:auto,hf:32,hf:64" + (",hf:2" if args.device == "cpu"
                                                             else "") +
                    ",prepack:auto,prepack:64").split(",")
    args.passes = args.passes or (2 if args.device == "cuda" else 1)
    with tempfile.TemporaryDirectory() as workdir:
        args.workdir = workdir
        lengths = build(workdir, args)
        best = {}
        for p in range(args.passes):
            for m in args.methods:
                r = run_child(args, m)
                print(f"pass {p + 1} {m}: {r['requests']} requests in {r['seconds']:.2f} s, "
                      f"peak {r['peak_mib']:.0f} MiB", flush=True)
                if m not in best or r["seconds"] < best[m]["seconds"]:
                    best[m] = r
    ref = best[args.methods[0]]
    worst = {m: compare(args, ref, best[m], m) for m in args.methods[1:]}
    write_report(args, lengths, best, worst)


def write_report(args, lengths, best, worst):
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"lm-eval-{args.device}" + ("-smoke" if args.smoke else ""))
    def rate(m):
        return best[m]["requests"] / best[m]["seconds"]

    hf_all = [m for m in args.methods if m.startswith("hf:")]
    hf_named = [m for m in hf_all if m in ("hf:auto", "hf:32", "hf:64")]  # the target's baseline
    named = max(map(rate, hf_named), default=None)
    fastest = max(map(rate, hf_all), default=None)
    rows = []
    for m in args.methods:
        r = best[m]
        rows.append(dict(
            method=m.replace("hf:", "--model hf, batch ").replace("prepack:",
                                                                   "--model prepack, batch "),
            requests=r["requests"], seconds=round(r["seconds"], 3), req_per_s=round(rate(m), 1),
            vs_hf_auto_32_64=round(rate(m) / named, 2) if named else "",
            vs_fastest_hf=round(rate(m) / fastest, 2) if fastest else "",
            peak_mib=round(r["peak_mib"]), evaluate_wall_s=round(r["wall"], 2),
            acc=r["acc"], max_rel_diff=f"{worst.get(m, 0.0):.1e}"))
    with open(stem + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    med = lengths[len(lengths) // 2]
    lines = [
        f"# lm-evaluation-harness with prepacking ({args.device})", "",
        f"`bench/bench_lm_eval.py --device {args.device}"
        + (" --smoke" if args.smoke else f" --model {args.model} --questions {args.questions}")
        + "`", "",
        f"- Machine: {machine(args)}; lm_eval, torch, transformers as installed "
        f"({__import__('lm_eval').__version__}, {__import__('torch').__version__}, "
        f"{__import__('transformers').__version__}).",
        f"- Model: random weights, Llama shape `{args.model}` ({args.dtype}); task: {args.questions} "
        f"MMLU-like questions, four one-token answers; question tokens median {med}, longest "
        f"{lengths[-1]}, total {sum(lengths)}.",
        f"- Time: the backend's loglikelihood calls, fastest of {args.passes} passes; "
        f"`evaluate wall` is lm_eval's whole run. Peak memory: "
        + ("max_memory_allocated over the run less the weights." if args.device == "cuda" else
           "growth of the process's peak resident set over the run."),
        "- Answers: every method's equal the first's request by request (largest relative "
        "difference in the table), accuracies identical.", "",
        "- `vs hf auto/32/64`: requests/s over the fastest of `--model hf` at batch sizes auto, "
        "32 and 64; `vs fastest hf`: over the fastest `--model hf` run here at any batch size.",
        "",
        "| method | requests | seconds | req/s | vs hf auto/32/64 | vs fastest hf | peak MiB | "
        "evaluate wall s | acc | max rel diff |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append("| " + " | ".join(str(v) for v in r.values()) + " |")
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines[-len(rows) - 2:]))
    print(f"bench_lm_eval: report written to {stem}.md")


if __name__ == "__main__":
    main()
