"""llama.cpp's decode step on a GGUF file, beside bench_serve's quantized/ family.

Not a dependency: run it where llama-cpp-python is installed (pip install llama-cpp-python; the
oracle venv of .ci/fetch-oracles has it). It times what llama-batched-bench's S_TG times: a
prompt of 128 tokens per sequence prefilled, then 32 steps of one new token per sequence, each
step one llama_decode on the given threads; it prints the best and median step in ms
(llama.cpp logs to stderr: add 2>/dev/null).

    python bench/llama_cpp_decode.py MODEL.gguf [--seqs 1 8] [--threads 2] [--markdown]

With --markdown the steps come as a table, to append to bench_serve's quantized report.
--no-repack keeps the weights in libllama's plain CPU buffer (llama.cpp's own --no-repack): on
CPUs with AMX its repacked AMX matrix product can crash in llama_decode
(ggml-org/llama.cpp#20824), and the repacked layouts are what users get by default.
"""
import os
import argparse
import time

import llama_cpp as L


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--seqs", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--no-repack", action="store_true",
                    help="weights in the plain CPU buffer, not repacked (use_extra_bufts off)")
    a = ap.parse_args()
    if a.markdown:
        print(f"\n### llama.cpp on {os.path.basename(a.model)} (llama-cpp-python "
              f"{L.__version__}, {a.threads} threads, {a.prompt}-token prompts, {a.steps} steps"
              f"{', weights not repacked' if a.no_repack else ''})\n")
        print("| sequences | decode step best ms | median ms |\n|---|---|---|")
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    if a.no_repack:
        mp.use_extra_bufts = False
    model = L.llama_model_load_from_file(a.model.encode(), mp)
    if not model:
        raise SystemExit(f"{a.model}: llama.cpp cannot load it")
    for npl in a.seqs:
        cp = L.llama_context_default_params()
        cp.n_ctx = npl * (a.prompt + a.steps) + 64
        cp.n_batch = cp.n_ubatch = max(512, npl)
        cp.n_threads = cp.n_threads_batch = a.threads
        cp.n_seq_max = npl
        ctx = L.llama_init_from_model(model, cp)

        def decode(tokens):  # [(token, position, sequence)]
            b = L.llama_batch_init(len(tokens), 0, 1)
            for i, (t, p, s) in enumerate(tokens):
                b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, p, 1, 1
                b.seq_id[i][0] = s
            b.n_tokens = len(tokens)
            rc = L.llama_decode(ctx, b)
            L.llama_batch_free(b)
            if rc != 0:
                raise SystemExit(f"llama_decode returned {rc}")

        for s in range(npl):
            decode([((7 * i + s) % 1000 + 10, i, s) for i in range(a.prompt)])
        times = []
        for step in range(a.steps):
            t0 = time.perf_counter()
            decode([(5 + s, a.prompt + step, s) for s in range(npl)])
            times.append(time.perf_counter() - t0)
        times.sort()
        best, median = times[0] * 1e3, times[len(times) // 2] * 1e3
        if a.markdown:
            print(f"| {npl} | {best:.2f} | {median:.2f} |")
        else:
            print(f"llama.cpp {a.model}: {npl} seqs, {a.threads} threads: decode step best "
                  f"{best:.2f} ms, median {median:.2f} ms")
        L.llama_free(ctx)
    L.llama_model_free(model)


if __name__ == "__main__":
    main()
