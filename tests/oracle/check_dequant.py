"""Checks prepack's dequantization of every tensor of GGUF files against gguf (llama.cpp's own
Python package, gguf.quants.dequantize), bit for bit.
Usage: check_dequant.py GGUF_TENSORS_TOOL (FILE... | --model)
  --model: the real trained model (oracle.model())"""
import importlib.metadata
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle  # noqa: E402

np, gguf = oracle.need("numpy", "gguf")


def ours(tool, path, name, n):
    r = subprocess.run([tool, path, name], capture_output=True, check=False)
    if r.returncode != 0:
        oracle.fail(f"{path}: {name}: gguf_tensors exited {r.returncode}: {r.stderr.decode()}")
    got = np.frombuffer(r.stdout, dtype=np.float32)
    if got.size != n:
        oracle.fail(f"{path}: {name}: {got.size} values, expected {n}")
    return got


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    tool, files = sys.argv[1], sys.argv[2:]
    if files == ["--model"]:
        files = [oracle.model()]
    checked, by_type = 0, {}
    for path in files:
        reader = gguf.GGUFReader(path)
        for t in reader.tensors:
            want = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).ravel()
            got = ours(tool, path, t.name, want.size)
            bad = np.flatnonzero(want.view(np.uint32) != got.view(np.uint32))
            if bad.size:
                i = bad[0]
                oracle.fail(f"{os.path.basename(path)}: {t.name} ({t.tensor_type.name}): {bad.size} "
                            f"of {want.size} values differ; first at {i}: prepack {got[i]!r}, "
                            f"gguf {want[i]!r}")
            checked += want.size
            by_type[t.tensor_type.name] = by_type.get(t.tensor_type.name, 0) + 1
    kinds = ", ".join(f"{k} x {v}" for k, v in sorted(by_type.items()))
    version = importlib.metadata.version("gguf")
    print(f"dequantization equals gguf {version} bit for bit: {checked} values, tensors {kinds}")


main()
