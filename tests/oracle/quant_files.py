"""Writes one GGUF file per ggml type prepack reads, with gguf's own writer, for
check_dequant.py: OUTDIR/<TYPE>.gguf, each holding
  quantized  [3][512]  random normal values quantized by gguf.quants.quantize (where gguf can
                       quantize the type: F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)
  random     [5][512]  random blocks: every quant bit random, every fp16 scale a finite random
                       value of either sign (so all code paths of the block are exercised)
Usage: quant_files.py OUTDIR"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle  # noqa: E402

np, gguf = oracle.need("numpy", "gguf")
T = gguf.GGMLQuantizationType
# Byte offsets of each block's fp16 scales (ggml-common.h's block_* structs).
SCALES = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "IQ4_NL": [0], "IQ4_XS": [0],
}
QUANTIZABLE = {"F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"}


def random_blocks(rng, name, rows, cols):
    qtype = T[name]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = cols // block
    raw = rng.integers(0, 256, size=(rows, n_blocks, size), dtype=np.uint8)
    for off in SCALES.get(name, []):
        scale = (rng.standard_normal((rows, n_blocks)) * 0.05).astype(np.float16)
        raw[:, :, off:off + 2] = scale.view(np.uint8).reshape(rows, n_blocks, 2)
    if name in ("F16", "BF16"):  # finite values of every magnitude, subnormals included
        span = (-20, 9) if name == "F16" else (-60, 60)
        vals = rng.standard_normal((rows, cols)) * np.exp(rng.uniform(*span, (rows, cols)))
        return gguf.quants.quantize(vals.astype(np.float32), qtype)
    return raw.reshape(rows, n_blocks * size)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: quant_files.py OUTDIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(2404)
    for name in ["F16", "BF16"] + list(SCALES):
        qtype = T[name]
        w = gguf.GGUFWriter(os.path.join(out, f"{name}.gguf"), "llama")
        if name in QUANTIZABLE:
            x = rng.standard_normal((3, 512)).astype(np.float32)
            w.add_tensor("quantized", gguf.quants.quantize(x, qtype), raw_dtype=qtype)
        w.add_tensor("random", random_blocks(rng, name, 5, 512), raw_dtype=qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    print(f"wrote {len(SCALES) + 2} files to {out}")


main()
