"""prepack.hf.generate's decode batches on this machine: 32-token greedy generation timed at
decode_batches="auto" and at fixed k, side by side in one run, with the length-sorted split
"auto" chose. What to run before refitting the cost model behind "auto" (prepack/hf.py,
_fixed_step_slots) on another CPU.

    PYTHONPATH=build/release/python python bench/decode_sweep.py --threads 2
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_hf  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="large", choices=sorted(bench_hf.SHAPES))
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--values", default="auto,1,2,3,4,6,8")
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    values = [v if v == "auto" else int(v) for v in args.values.split(",")]

    try:
        import torch
        import transformers
    except ImportError as e:  # the smoke test: skipped where they are absent, failed in CI
        print(f"prepack-skip: decode_sweep needs torch and transformers ({e})")
        sys.exit(1 if os.environ.get("PREPACK_REQUIRE_ORACLES") == "1" else 0)
    import prepack.hf as hf

    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    args.dtype, args.device = torch.float32, torch.device("cpu")
    model = bench_hf.make_model(args, torch, transformers, args.attn)
    prompts = bench_hf.heavy_prompts(args.prompts, model.config.vocab_size, args.seed)
    chosen = []
    decode_groups = hf._decode_groups

    def watched(lengths, fixed, extra):
        groups = decode_groups(lengths, fixed, extra)
        chosen.append([len(g) for g in groups])
        return groups

    hf._decode_groups = watched
    best, first = {}, None
    for p in range(args.passes):
        for v in values:  # alternating, so a slow spell hits every value alike
            t = time.perf_counter()
            out = hf.generate(model, prompts, args.new_tokens, min_new_tokens=args.new_tokens,
                              do_sample=False, decode_batches=v)
            best[v] = min(best.get(v, float("inf")), time.perf_counter() - t)
            first = first or out
            if out != first:
                raise SystemExit(f"decode_batches={v}: tokens differ from {values[0]}")
    hf._decode_groups = decode_groups
    print(f"{bench_hf.cpu_name()}, {args.threads} threads; torch {torch.__version__}, "
          f"transformers {transformers.__version__}; model {args.model}, {args.attn}, "
          f"{args.prompts} prompts ({sum(map(len, prompts))} tokens, longest "
          f"{max(map(len, prompts))}), {args.new_tokens} new tokens; fastest of {args.passes}")
    if chosen:
        print(f"auto decodes {len(chosen[0])} batches of {chosen[0]} prompts")
    print("\n| decode_batches | generate s | vs 1 batch |")
    print("|---|---|---|")
    ref = best.get(1)
    for v in values:
        ratio = f"{ref / best[v]:.2f}x" if ref else "-"
        print(f"| {v} | {best[v]:.2f} | {ratio} |")


if __name__ == "__main__":
    main()
