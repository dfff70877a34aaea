"""The model variants prepack loads, each as its own ecosystem writes it, checked against an
independent NumPy forward pass (float64) written from that ecosystem's definition:

  llama3.gguf    llama, Q/K rows permuted as llama.cpp's converter does, rope_freqs tensor (Llama 3
                 scaling, computed as convert_hf_to_gguf.py does), F16 matrices; llama.cpp's RoPE
                 (adjacent pairs, frequency i divided by rope_freqs[i])
  linear.gguf    llama, rope.scaling.type linear (factor 4), Q8_0 matrices
  qwen3.gguf     qwen3: per-head Q/K RMSNorm, head dim 24 (not hidden / heads), tied embeddings,
                 Q4_0 matrices; NeoX RoPE (rotate-half)
  qwen2.gguf     qwen2: Q/K/V biases, Q5_1 matrices
  hf-llama3/     LlamaForCausalLM with rope_scaling {rope_type: llama3}, F32 safetensors; inverse
                 frequencies as transformers' _compute_llama3_parameters computes them
  hf-qwen3/      Qwen3ForCausalLM, F32 safetensors
GGUF files are written by gguf's GGUFWriter, their tensors named by gguf's own TensorNameMap (the
names llama.cpp's converter gives), and read back by GGUFReader; the safetensors files by
this script from the format's definition. Passes when prepack_demo's last-token logits agree
within 1e-3 of their scale on every model.
Usage: variants_numpy.py PREPACK_DEMO WORKDIR"""
import json
import math
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle  # noqa: E402

np, gguf = oracle.need("numpy", "gguf")
T = gguf.GGMLQuantizationType
rng = np.random.default_rng(2025)


# ---- random models in Hugging Face's names and torch order ([out][in]) ----

def hf_weights(c):
    D, H, KV, hd, F, V = c["hidden"], c["heads"], c["kv_heads"], c["head_dim"], c["ffn"], c["vocab"]
    w = {"model.embed_tokens.weight": rng.uniform(-1, 1, (V, D)),
         "model.norm.weight": rng.uniform(0.8, 1.2, D) * (4 if c["tied"] else 1)}
    if not c["tied"]:
        w["lm_head.weight"] = rng.uniform(-1, 1, (V, D)) * 4 / math.sqrt(D)
    for layer in range(c["layers"]):
        p = f"model.layers.{layer}."
        s = 1 / math.sqrt(D)
        w[p + "input_layernorm.weight"] = rng.uniform(0.8, 1.2, D)
        w[p + "self_attn.q_proj.weight"] = rng.uniform(-s, s, (H * hd, D)) * 1.7
        w[p + "self_attn.k_proj.weight"] = rng.uniform(-s, s, (KV * hd, D)) * 1.7
        w[p + "self_attn.v_proj.weight"] = rng.uniform(-s, s, (KV * hd, D)) * 1.7
        if c.get("bias"):
            for n, m in (("q", H * hd), ("k", KV * hd), ("v", KV * hd)):
                w[p + f"self_attn.{n}_proj.bias"] = rng.uniform(-0.5, 0.5, m)
        if c.get("qk_norm"):
            w[p + "self_attn.q_norm.weight"] = rng.uniform(0.5, 1.5, hd)
            w[p + "self_attn.k_norm.weight"] = rng.uniform(0.5, 1.5, hd)
        w[p + "self_attn.o_proj.weight"] = rng.uniform(-s, s, (D, H * hd))
        w[p + "post_attention_layernorm.weight"] = rng.uniform(0.8, 1.2, D)
        w[p + "mlp.gate_proj.weight"] = rng.uniform(-s, s, (F, D)) * 1.7
        w[p + "mlp.up_proj.weight"] = rng.uniform(-s, s, (F, D)) * 1.7
        w[p + "mlp.down_proj.weight"] = rng.uniform(-1, 1, (D, F)) / math.sqrt(F)
    return w


# ---- the NumPy forward pass ----

def rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, pos, inv_freq, pairs):
    """x [T][heads][d]. pairs: llama.cpp's normal mode (dims 2i, 2i+1); else rotate-half
    (dims i, i + d/2), as Hugging Face and llama.cpp's NeoX mode rotate."""
    ang = pos[:, None] * inv_freq[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    half = x.shape[-1] // 2
    out = x.copy()
    a, b = (x[..., 0:2 * half:2], x[..., 1:2 * half:2]) if pairs else (x[..., :half], x[..., half:2 * half])
    ra, rb = a * c - b * s, b * c + a * s
    if pairs:
        out[..., 0:2 * half:2], out[..., 1:2 * half:2] = ra, rb
    else:
        out[..., :half], out[..., half:2 * half] = ra, rb
    return out


def forward(c, get, tokens, inv_freq, pairs):
    """Last-token logits; get(name) gives a tensor in Hugging Face's name and torch order."""
    H, KV, hd, eps = c["heads"], c["kv_heads"], c["head_dim"], c["eps"]
    n = len(tokens)
    pos = np.arange(n, dtype=np.float64)
    x = get("model.embed_tokens.weight")[tokens]
    causal = np.triu(np.full((n, n), -np.inf), 1)
    for layer in range(c["layers"]):
        p = f"model.layers.{layer}."
        h = rms(x, get(p + "input_layernorm.weight"), eps)

        def proj(name, heads):
            y = h @ get(p + f"self_attn.{name}_proj.weight").T
            if c.get("bias"):
                y = y + get(p + f"self_attn.{name}_proj.bias")
            return y.reshape(n, heads, hd)
        q, k, v = proj("q", H), proj("k", KV), proj("v", KV)
        if c.get("qk_norm"):
            q = rms(q, get(p + "self_attn.q_norm.weight"), eps)
            k = rms(k, get(p + "self_attn.k_norm.weight"), eps)
        q, k = rope(q, pos, inv_freq, pairs), rope(k, pos, inv_freq, pairs)
        att = np.empty((n, H, hd))
        for head in range(H):
            g = head // (H // KV)
            sc = q[:, head] @ k[:, g].T / math.sqrt(hd) + causal
            sc = np.exp(sc - sc.max(axis=1, keepdims=True))
            att[:, head] = (sc / sc.sum(axis=1, keepdims=True)) @ v[:, g]
        x = x + att.reshape(n, H * hd) @ get(p + "self_attn.o_proj.weight").T
        h = rms(x, get(p + "post_attention_layernorm.weight"), eps)
        gate = h @ get(p + "mlp.gate_proj.weight").T
        up = h @ get(p + "mlp.up_proj.weight").T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ get(p + "mlp.down_proj.weight").T
    h = rms(x[-1], get("model.norm.weight"), eps)
    head = get("model.embed_tokens.weight") if c["tied"] else get("lm_head.weight")
    return head @ h


def plain_inv_freq(c):
    d = c["head_dim"] // 2 * 2
    return 1.0 / c["theta"] ** (np.arange(0, d, 2, dtype=np.float64) / d)


def hf_llama3_inv_freq(c, rs):
    """transformers' _compute_llama3_parameters."""
    inv_freq = plain_inv_freq(c)
    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, inv_freq_llama)


def converter_rope_freqs(c, rs):
    """llama.cpp's convert_hf_to_gguf.py (LlamaModel): the rope_freqs tensor of Llama 3."""
    freqs = plain_inv_freq(c)
    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


# ---- writers ----

def gguf_name(hf, arch):
    """The GGUF name of a Hugging Face tensor, from gguf's own map (llama.cpp's converter's),
    not from our reading of it."""
    archs = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2,
             "qwen3": gguf.MODEL_ARCH.QWEN3}
    name = gguf.get_tensor_name_map(archs[arch], 64).get_name(hf, try_suffixes=(".weight", ".bias"))
    if name is None:
        oracle.fail(f"gguf has no {arch} name for {hf}")
    return name


def permute(w, n_head):
    """convert_hf_to_gguf.py's LlamaModel.permute of Q and K rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, arch, c, w, qtype, rope_freqs=None, linear=None):
    g = gguf.GGUFWriter(path, arch)
    g.add_name(os.path.basename(path))
    g.add_context_length(4096)
    g.add_embedding_length(c["hidden"])
    g.add_block_count(c["layers"])
    g.add_feed_forward_length(c["ffn"])
    g.add_head_count(c["heads"])
    g.add_head_count_kv(c["kv_heads"])
    g.add_key_length(c["head_dim"])
    g.add_value_length(c["head_dim"])
    g.add_rope_dimension_count(c["head_dim"])
    g.add_layer_norm_rms_eps(c["eps"])
    g.add_rope_freq_base(c["theta"])
    if linear is not None:
        g.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        g.add_rope_scaling_factor(linear)
    for name, x in w.items():
        if arch == "llama" and name.endswith("q_proj.weight"):
            x = permute(x, c["heads"])
        if arch == "llama" and name.endswith("k_proj.weight"):
            x = permute(x, c["kv_heads"])
        if x.ndim == 2 and qtype not in (T.F32, T.F16):
            g.add_tensor(gguf_name(name, arch), gguf.quants.quantize(x.astype(np.float32), qtype),
                         raw_dtype=qtype)
        elif x.ndim == 2 and qtype == T.F16:
            g.add_tensor(gguf_name(name, arch), x.astype(np.float16))
        else:
            g.add_tensor(gguf_name(name, arch), x.astype(np.float32))
    if rope_freqs is not None:
        g.add_tensor("rope_freqs.weight", rope_freqs)
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()


def gguf_getter(path):
    r = gguf.GGUFReader(path)
    t = {x.name: x for x in r.tensors}
    field = r.fields["general.architecture"]
    arch = bytes(field.parts[field.data[0]]).decode()
    cache = {}

    def get(hf):
        if hf not in cache:
            x = t[gguf_name(hf, arch)]
            cache[hf] = gguf.quants.dequantize(x.data, x.tensor_type).astype(np.float64)
        return cache[hf]
    freqs = t.get("rope_freqs.weight")
    return get, (None if freqs is None else np.array(freqs.data, dtype=np.float64))


def write_safetensors(path, w):
    """The safetensors format: an 8-byte little-endian header size, a JSON header (name ->
    dtype, shape, data_offsets), then the tensors' bytes."""
    header, blobs, off = {}, [], 0
    for name, x in w.items():
        b = np.ascontiguousarray(x, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(x.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write_hf(d, arch, c, w, rope_scaling=None):
    os.makedirs(d, exist_ok=True)
    cfg = {"architectures": [arch], "hidden_size": c["hidden"], "num_hidden_layers": c["layers"],
           "num_attention_heads": c["heads"], "num_key_value_heads": c["kv_heads"],
           "head_dim": c["head_dim"], "intermediate_size": c["ffn"], "vocab_size": c["vocab"],
           "rms_norm_eps": c["eps"], "rope_theta": c["theta"], "tie_word_embeddings": c["tied"],
           "attention_bias": bool(c.get("bias")), "rope_scaling": rope_scaling}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    write_safetensors(os.path.join(d, "model.safetensors"), w)


# ---- the check ----

def check(demo, work, name, path, c, get, inv_freq, pairs):
    prompts = [list(rng.integers(0, c["vocab"], n)) for n in (1, 9, 40, 97)]
    pfile, lfile = os.path.join(work, name + ".prompts"), os.path.join(work, name + ".logits")
    with open(pfile, "w") as f:
        f.write("".join(" ".join(str(int(t)) for t in p) + "\n" for p in prompts))
    r = subprocess.run([demo, "--model", path, "--prompts", pfile, "--logits", lfile,
                        "--new-tokens", "1"], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        oracle.fail(f"{name}: prepack_demo exited {r.returncode}: {r.stdout}{r.stderr}")
    ours = np.fromfile(lfile, dtype=np.float32).reshape(len(prompts), c["vocab"])
    worst = 0.0
    for i, p in enumerate(prompts):
        want = forward(c, get, np.array(p), inv_freq, pairs)
        d = float(np.abs(ours[i] - want).max()) / max(1.0, float(np.abs(want).max()))
        worst = max(worst, d)
        if d > 1e-3:
            oracle.fail(f"{name}: prompt {i} ({len(p)} tokens): logits differ by {d:.3g} of "
                        f"their scale")
    print(f"  {name:12s} logits within {worst:.2g} of their scale")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    demo, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    base = {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "head_dim": 16, "ffn": 96,
            "vocab": 160, "eps": 1e-5, "theta": 500000.0, "tied": False}
    rs = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 256}
    print("each variant against NumPy (bound 1e-3 of the logits' scale):")

    c = dict(base)
    w = hf_weights(c)
    path = os.path.join(work, "llama3.gguf")
    write_gguf(path, "llama", c, w, T.F16, rope_freqs=converter_rope_freqs(c, rs))
    get, freqs = gguf_getter(path)
    check(demo, work, "llama3.gguf", path, c, get, plain_inv_freq(c) / freqs, True)

    w = hf_weights(c)
    path = os.path.join(work, "linear.gguf")
    write_gguf(path, "llama", c, w, T.Q8_0, linear=4.0)
    get, _ = gguf_getter(path)
    check(demo, work, "linear.gguf", path, c, get, plain_inv_freq(c) / 4.0, True)

    c = dict(base, head_dim=24, qk_norm=True, tied=True, theta=1000000.0)
    w = hf_weights(c)
    path = os.path.join(work, "qwen3.gguf")
    write_gguf(path, "qwen3", c, w, T.Q4_0)
    get, _ = gguf_getter(path)
    check(demo, work, "qwen3.gguf", path, c, get, plain_inv_freq(c), False)

    c = dict(base, bias=True, tied=True, theta=1000000.0)
    w = hf_weights(c)
    path = os.path.join(work, "qwen2.gguf")
    write_gguf(path, "qwen2", c, w, T.Q5_1)
    get, _ = gguf_getter(path)
    check(demo, work, "qwen2.gguf", path, c, get, plain_inv_freq(c), False)

    c = dict(base)
    w = hf_weights(c)
    path = os.path.join(work, "hf-llama3")
    write_hf(path, "LlamaForCausalLM", c, w, rs)
    check(demo, work, "hf-llama3", path, c, w.__getitem__, hf_llama3_inv_freq(c, rs), False)

    c = dict(base, head_dim=24, qk_norm=True, tied=True)
    w = hf_weights(c)
    path = os.path.join(work, "hf-qwen3")
    write_hf(path, "Qwen3ForCausalLM", c, w)
    check(demo, work, "hf-qwen3", path, c, w.__getitem__, plain_inv_freq(c), False)


main()
