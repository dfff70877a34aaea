"""An independent forward pass of the real model in NumPy (float64), over the weights gguf
dequantizes, written from llama.cpp's definition of the llama architecture as it runs a GGUF
file (weights as stored: Q and K rows in llama.cpp's order, RoPE rotating adjacent pairs, as
ggml's "normal" RoPE mode does), checked against prepack_demo's last-token logits.

Usage: forward_numpy.py PREPACK_DEMO WORKDIR
Passes when every prompt's last-token logits agree within 1e-3 of the logits' scale and the
arg-max token agrees (unless the top two are within that bound), both with the file's quantized
projections held as stored (the demo's default) and dequantized at load (--widen), and the two
agree within 1e-5 of the logits' scale (the same function; only fp32 rounding may differ). Then
the model requantized to IQ4_XS and to Q4_K_M by llama.cpp's own quantizer (llama_model_quantize,
from llama-cpp-python), as a user's downloads of those are: rows whose width is not a multiple of
256 (SmolLM2's 576) fall back to IQ4_NL and Q5_0 there, so the files hold IQ4_NL, IQ4_XS, Q4_K,
Q5_0, Q5_K, Q6_K and Q8_0 tensors between them; their held logits must agree with NumPy's within
1e-4 of the scale (fewer and shorter prompts, and no widened run: the sanitizer builds run this
test too, and the widened decoding of those types is checked bit for bit by check_dequant.py)."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle  # noqa: E402

np, gguf = oracle.need("numpy", "gguf")


def field(reader, key):
    f = reader.fields[key]
    return f.contents()


def load(path):
    r = gguf.GGUFReader(path)
    arch = field(r, "general.architecture")
    if arch != "llama":
        oracle.fail(f"{path}: architecture {arch}: this oracle runs llama")
    cfg = {k: field(r, f"llama.{k}") for k in (
        "block_count", "embedding_length", "attention.head_count", "attention.head_count_kv",
        "rope.freq_base", "attention.layer_norm_rms_epsilon")}
    w = {t.name: gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)
         for t in r.tensors}
    return cfg, w


def rope_pairs(x, pos, base):
    """ggml's normal RoPE: dimensions (2i, 2i+1) rotated by pos * base^(-2i/d). x: [T][H][d]."""
    d = x.shape[-1]
    theta = pos[:, None] * base ** (-np.arange(0, d, 2) / d)  # [T][d/2]
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * c - b * s
    out[..., 1::2] = a * s + b * c
    return out


def rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def last_logits(cfg, w, tokens):
    L, D = cfg["block_count"], cfg["embedding_length"]
    H, KV = cfg["attention.head_count"], cfg["attention.head_count_kv"]
    eps, base = cfg["attention.layer_norm_rms_epsilon"], cfg["rope.freq_base"]
    hd = D // H
    T = len(tokens)
    pos = np.arange(T, dtype=np.float64)
    x = w["token_embd.weight"][tokens]  # [T][D]
    causal = np.triu(np.full((T, T), -np.inf), 1)
    for layer in range(L):
        p = f"blk.{layer}."
        h = rms(x, w[p + "attn_norm.weight"], eps)
        q = (h @ w[p + "attn_q.weight"].T).reshape(T, H, hd)
        k = (h @ w[p + "attn_k.weight"].T).reshape(T, KV, hd)
        v = (h @ w[p + "attn_v.weight"].T).reshape(T, KV, hd)
        q, k = rope_pairs(q, pos, base), rope_pairs(k, pos, base)
        out = np.empty((T, H, hd))
        for head in range(H):
            g = head // (H // KV)
            s = q[:, head, :] @ k[:, g, :].T / np.sqrt(hd) + causal
            s = np.exp(s - s.max(axis=1, keepdims=True))
            out[:, head, :] = (s / s.sum(axis=1, keepdims=True)) @ v[:, g, :]
        x = x + out.reshape(T, D) @ w[p + "attn_output.weight"].T
        h = rms(x, w[p + "ffn_norm.weight"], eps)
        gate, up = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "ffn_down.weight"].T
    h = rms(x[-1:], w["output_norm.weight"], eps)
    head = w.get("output.weight", w["token_embd.weight"])
    return (h @ head.T)[0]


def requantized(src, work, ftype):
    """src requantized to llama_ftype `ftype` ("IQ4_XS") by libllama (llama-cpp-python's
    llama_model_quantize)."""
    import ctypes
    llama = oracle.need("llama_cpp")
    dst = os.path.join(work, f"requantized-{ftype}.gguf")
    p = llama.llama_model_quantize_default_params()
    p.ftype = getattr(llama, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    p.nthread = 2
    p.allow_requantize = True
    rc = llama.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p))
    if rc != 0:
        oracle.fail(f"llama_model_quantize {src} -> {ftype} returned {rc}")
    return dst


def check(demo, path, work, lengths=(1, 7, 23, 40), modes=("held", "widened"), bound=1e-3):
    """prepack_demo's last-token logits of `path` (`modes`), against NumPy's within `bound` of
    their scale: random prompts of `lengths` and one of common tokens."""
    cfg, w = load(path)
    types = sorted({gguf.GGMLQuantizationType(t.tensor_type).name
                    for t in gguf.GGUFReader(path).tensors})
    vocab = w["token_embd.weight"].shape[0]
    rng = np.random.default_rng(22)
    prompts = [list(rng.integers(0, vocab, n)) for n in lengths]
    prompts.append([1, 504, 3458, 282, 4649, 314, 3714, 30])  # a common-token prompt
    pfile = os.path.join(work, "prompts.txt")
    with open(pfile, "w") as f:
        for p in prompts:
            f.write(" ".join(str(int(t)) for t in p) + "\n")
    wants = [last_logits(cfg, w, np.array(p)) for p in prompts]
    got = {}
    name = f"{os.path.basename(path)} ({', '.join(types)})"
    for mode, flags in ((m, ["--widen"] if m == "widened" else []) for m in modes):
        lfile = os.path.join(work, f"logits_{mode}.f32")
        r = subprocess.run([demo, "--model", path, "--prompts", pfile, "--logits", lfile,
                            "--new-tokens", "1"] + flags, capture_output=True, text=True,
                           check=False)
        if r.returncode != 0:
            oracle.fail(f"{name}: prepack_demo {mode} exited {r.returncode}: {r.stdout}{r.stderr}")
        ours = np.fromfile(lfile, dtype=np.float32).reshape(len(prompts), vocab)
        got[mode] = ours
        worst = 0.0
        for i, p in enumerate(prompts):
            want = wants[i]
            scale = max(1.0, float(np.abs(want).max()))
            diff = float(np.abs(ours[i] - want).max()) / scale
            worst = max(worst, diff)
            top = np.sort(want)[-2:]
            if diff > bound:
                oracle.fail(f"{name}: {mode}: prompt {i} ({len(p)} tokens): logits differ by "
                            f"{diff:.3g} of their scale")
            if int(np.argmax(ours[i])) != int(np.argmax(want)) and top[1] - top[0] > bound * scale:
                oracle.fail(f"{name}: {mode}: prompt {i}: arg-max {int(np.argmax(ours[i]))}, "
                            f"NumPy {int(np.argmax(want))}")
        print(f"{mode}: last-token logits equal NumPy's forward pass of {name} within "
              f"{worst:.3g} of their scale ({len(prompts)} prompts, bound {bound:g})")
    if "widened" not in got:
        return w, pfile
    scale = max(1.0, float(np.abs(got["widened"]).max()))
    between = float(np.abs(got["held"] - got["widened"]).max()) / scale
    if between > 1e-5:
        oracle.fail(f"{name}: held and widened projections differ by {between:.3g} of the "
                    "logits' scale")
    print(f"held against widened: {between:.3g} of the logits' scale (bound 1e-5)")
    return w, pfile


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    demo, work = sys.argv[1], sys.argv[2]
    path = oracle.model()
    os.makedirs(work, exist_ok=True)
    w, pfile = check(demo, path, work)
    # Memory: under a limit of 3/4 of the weights in fp32, --widen is refused with the advice
    # that holding the file's projections fits, and the default (held) runs under it.
    fp32 = 4 * sum(int(np.prod(t.shape)) for t in w.values())
    limit = str(int(0.75 * fp32 / 2**20))
    args = [demo, "--model", path, "--prompts", pfile, "--new-tokens", "1", "--memory-limit", limit]
    r = subprocess.run(args + ["--widen"], capture_output=True, text=True, check=False)
    if r.returncode != 2 or "without --widen it fits" not in r.stderr:
        oracle.fail(f"--widen under --memory-limit {limit}: exit {r.returncode}, {r.stderr}")
    r = subprocess.run(args, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        oracle.fail(f"held under --memory-limit {limit}: exit {r.returncode}, {r.stderr}")
    print(f"under --memory-limit {limit} (MiB): --widen refused naming what fits, held runs")
    for ftype in ("IQ4_XS", "Q4_K_M"):
        check(demo, requantized(path, work, ftype), work, lengths=(7, 23), modes=("held",),
              bound=1e-4)


main()
