"""Tokenization by prepack (prepack_demo --tokenize) against Hugging Face's tokenizers, built
from the same vocabulary and merges, on a UTF-8 test set: English, code, emoji, CJK, whitespace
runs, digits, contractions, chat markers.

The vocabulary is the real model's (SmolLM2: byte-level BPE, pre-tokenizer "smollm"). It is also
written, with gguf's writer, into vocabulary-only GGUF files (no tensors) that name the other
pre-tokenizers (llama-bpe with ignore_merges, qwen2, gpt-2), so each pre-tokenizer's regexes are
checked on a real vocabulary. Hugging Face's side is built as those models' tokenizer.json files
define them: ByteLevel, Split (behaviour isolated), Digits.
Usage: tokenize_hf.py PREPACK_DEMO WORKDIR"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle  # noqa: E402

np, gguf, tokenizers = oracle.need("numpy", "gguf", "tokenizers")
from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers  # noqa: E402

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
          r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
         r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    " leading space", "   three leading spaces", "trailing spaces   ", "tabs\tand\ttabs",
    "multiple\n\nnewlines\r\nand CRLF",
    "I'm sure you're right; they've said we'd go, it's John's and I'LL SEE",
    "Numbers: 1 12 123 1234 12345 3.14159 1e-10 0x1F 1,000,000",
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { a[i] += b[i]; }",
    "emoji 😀😃 🎉 👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷",
    "中文分词测试，这是一个句子。", "日本語のテキストとカタカナ", "한국어 텍스트",
    "Ünïcödé àccents çà et là, Straße, ﬁ ligature",
    "Ελληνικά και русский текст",
    "mixed東京2024年Tokyo",
    "    \n\t  \n", "!!!???...---", "a\u00a0non-breaking\u2009thin\u3000space",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "http://example.com/path?q=1&r=2#frag",
    "$$ \\frac{a}{b} $$ and ``quotes'' and \"double\"",
    "", " ", "  ", "\n", " \n\n ", "ied 4 \u00bd months", "F\u00fchrer", "   Hello\n    Hello",
    "3333333 33333333", "\U0001F680 (rocket) \U0001F636\u200d\U0001F32B\ufe0f (joined) \u2705",
]


def escape(s):
    return s.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")


def hf_tokenizer(tokens, merges, types, pre):
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) if not m.startswith(" ") else (m[0], m[1:].split(" ", 1)[1])
             for m in merges]
    tok = Tokenizer(models.BPE(vocab, pairs, ignore_merges=(pre == "llama-bpe")))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    elif pre == "gpt-2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        pattern = LLAMA3 if pre == "llama-bpe" else QWEN2
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False), byte_level])
    specials = [AddedToken(tokens[i], special=True, normalized=False)
                for i, t in enumerate(types) if t == 3 and tokens[i]]
    tok.add_special_tokens(specials)
    return tok


def vocab_only_gguf(path, reader, pre):
    """A GGUF file with the tokenizer metadata of `reader` alone, naming pre-tokenizer `pre`."""
    w = gguf.GGUFWriter(path, "llama")
    f = reader.fields
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list([bytes(f["tokenizer.ggml.tokens"].parts[i]).decode("utf-8")
                      for i in f["tokenizer.ggml.tokens"].data])
    w.add_token_types([int(f["tokenizer.ggml.token_type"].parts[i][0])
                       for i in f["tokenizer.ggml.token_type"].data])
    w.add_token_merges([bytes(f["tokenizer.ggml.merges"].parts[i]).decode("utf-8")
                        for i in f["tokenizer.ggml.merges"].data])
    w.add_bos_token_id(int(f["tokenizer.ggml.bos_token_id"].contents()))
    w.add_eos_token_id(int(f["tokenizer.ggml.eos_token_id"].contents()))
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    demo, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    model = oracle.model()
    reader = gguf.GGUFReader(model)
    f = reader.fields
    tokens = [bytes(f["tokenizer.ggml.tokens"].parts[i]).decode("utf-8")
              for i in f["tokenizer.ggml.tokens"].data]
    merges = [bytes(f["tokenizer.ggml.merges"].parts[i]).decode("utf-8")
              for i in f["tokenizer.ggml.merges"].data]
    types = [int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data]
    pre = bytes(f["tokenizer.ggml.pre"].parts[-1]).decode()
    text_file = os.path.join(work, "texts.txt")
    with open(text_file, "w", encoding="utf-8") as out:
        out.write("".join(escape(t) + "\n" for t in TEXTS))
    runs = [(pre, model)]
    for other in ("llama-bpe", "qwen2", "gpt-2"):
        path = os.path.join(work, f"vocab-{other}.gguf")
        vocab_only_gguf(path, reader, other)
        runs.append((other, path))
    for name, path in runs:
        r = subprocess.run([demo, "--model", path, "--tokenize", text_file], capture_output=True,
                           text=True, check=False)
        if r.returncode != 0:
            oracle.fail(f"{name}: prepack_demo --tokenize exited {r.returncode}: {r.stderr}")
        ours = [[int(x) for x in line.split()] for line in r.stdout.splitlines()]
        hf = hf_tokenizer(tokens, merges, types, name)
        if len(ours) != len(TEXTS):
            oracle.fail(f"{name}: {len(ours)} lines of ids for {len(TEXTS)} texts")
        for text, got in zip(TEXTS, ours):
            want = hf.encode(text, add_special_tokens=False).ids
            if got != want:
                oracle.fail(f"pre-tokenizer {name}: {text!r}\n  prepack {got}\n  tokenizers {want}")
        print(f"  {name:10s} {len(TEXTS)} texts, {sum(map(len, ours))} tokens: equal")
    print(f"tokenization equals Hugging Face tokenizers {tokenizers.__version__} "
          f"on {os.path.basename(model)}'s vocabulary")


main()
