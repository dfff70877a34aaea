"""The real trained model end to end, text in and text out: prepack_demo --text on
SmolLM2-135M-Instruct (Q4_1 GGUF) with every method (padded, prepacked, budgeted steps with
chunked prompts, shared prefixes), --json. Checks that every method's greedy tokens and text
continuations equal prefilling each prompt alone, and that the model answers as a trained model
whose conventions (RoPE, tied embeddings, tokenizer, chat markers) were read right does: asked for
the capital of France, its continuation names Paris.
Usage: real_model_text.py PREPACK_DEMO WORKDIR"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle  # noqa: E402

SYSTEM = ("<|im_start|>system\\nYou are a helpful assistant who answers questions about geography, "
          "colors and poetry briefly and accurately.<|im_end|>\\n")
PROMPTS = [
    "The capital of France is",
    SYSTEM + "<|im_start|>user\\nWhat is the capital of France?<|im_end|>\\n<|im_start|>assistant\\n",
    SYSTEM + "<|im_start|>user\\nName three colors.<|im_end|>\\n<|im_start|>assistant\\n",
    SYSTEM + "<|im_start|>user\\nWrite a haiku about the sea.<|im_end|>\\n<|im_start|>assistant\\n",
    "def fibonacci(n):",
    "  日本の首都は",
    "Once upon a time, in a land far, far away, there lived a",
]


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    demo, work = sys.argv[1], sys.argv[2]
    model = oracle.model()
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, "prompts.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(p + "\n" for p in PROMPTS))
    r = subprocess.run([demo, "--model", model, "--text", path, "--new-tokens", "12",
                        "--budget", "24", "--policy", "fill", "--prefix", "--block-size", "8",
                        "--json"], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        oracle.fail(f"prepack_demo exited {r.returncode}: {r.stderr}")
    j = json.loads(r.stdout)
    if not j["greedy_tokens_match"]:
        oracle.fail(f"a method's tokens differ from prefilling alone: {j['methods']}")
    for name, m in j["methods"].items():
        if not m["greedy_tokens_match"] or m["max_abs_diff_logits"] > 1e-3:
            oracle.fail(f"{name}: {m}")
    if j["methods"]["budgeted"]["chunked_prompts"] == 0 or j["methods"]["prefix"]["prefixes"] == 0:
        oracle.fail("the run chunked no prompt or shared no prefix: it tests less than it says")
    texts = j["texts"]
    if len(texts) != len(PROMPTS):
        oracle.fail(f"{len(texts)} texts for {len(PROMPTS)} prompts")
    for t in texts:
        for name, c in t["methods"].items():
            if c != t["continuation"]:
                oracle.fail(f"{t['prompt']!r}: {name} continues {c!r}, alone {t['continuation']!r}")
    for i in (0, 1):
        if "Paris" not in texts[i]["continuation"]:
            oracle.fail(f"{PROMPTS[i]!r} continues {texts[i]['continuation']!r}: no Paris")
    print(f"{os.path.basename(model)}: {len(texts)} text prompts, every method's continuation "
          f"equals prefilling alone; e.g. {texts[1]['continuation']!r}")


main()
