"""prepack.lm_eval against lm-evaluation-harness's own Hugging Face backend (HFLM, --model hf):
the same tasks run through both, offline (a small random model and a byte-level BPE tokenizer
saved to a temporary directory, task YAMLs over local JSON lines written here), compared request
by request: log-likelihoods within 1e-5 relative (fp32), is_greedy, generations and metrics
identical. Three tasks: multiple choice with heavy-tailed contexts (one-token letter answers and
multi-token text answers), rolling perplexity over documents longer than max_length, generation
with stop sequences met inside tokens. Then the bad inputs, batch sizes, a sliding-window family,
the command line."""
import json
import math
import os
import subprocess
import sys

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from conftest import need  # noqa: E402

torch = need("torch", whole_file=True)
transformers = need("transformers", whole_file=True)
lm_eval = need("lm_eval", whole_file=True)
tokenizers = need("tokenizers", whole_file=True)
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

import prepack.lm_eval as ple  # noqa: E402

MAX_LENGTH = 96  # the models' context for the harness: the rolling task's documents exceed it
WORDS = ("the of and to in is was for on that with as by at from his an were are which this be "
         "not or have one had first new after who two time been but they city also its year "
         "school during other their more most all there some world when into only over season "
         "number where later about state war may would made film used between while under team "
         "known through three can history river game both part since final then him such series "
         "called many north work being national until family same well age her both before high "
         "second these under early south like back took area county won including them against "
         "house population album music each could band station old public include de village").split()


def _text(rng, n_words):
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def _heavy_tailed(rng, n, median, longest):
    """n word counts, log-normal around median, capped at longest: many short, a few long."""
    return [max(2, min(longest, int(rng.lognormvariate(math.log(median), 0.8)))) for _ in range(n)]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A saved random Llama, its tokenizer, the task data and YAMLs: everything offline."""
    import random

    d = tmp_path_factory.mktemp("lm_eval")
    rng = random.Random(7)
    corpus = [_text(rng, 40) + "." for _ in range(300)]
    # Byte-level BPE whose alphabet is the corpus's characters only: a random model's tokens are
    # then words and pieces of words (text a stop sequence can be met in), not stray bytes.
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    bpe.train_from_iterator(corpus, tokenizers.trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<s>", "</s>", "<pad>"], initial_alphabet=[]))
    bpe.post_processor = tokenizers.processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 0)])
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>",
                                               eos_token="</s>", pad_token="<pad>")
    tok.save_pretrained(d / "llama")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=512,
                                   bos_token_id=0, eos_token_id=1, pad_token_id=2)
    transformers.LlamaForCausalLM(cfg).save_pretrained(d / "llama")
    tok.save_pretrained(d / "mistral")
    torch.manual_seed(1)
    mcfg = transformers.MistralConfig(**{k: getattr(cfg, k) for k in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "max_position_embeddings", "bos_token_id",
        "eos_token_id", "pad_token_id")}, sliding_window=12)
    transformers.MistralForCausalLM(mcfg).save_pretrained(d / "mistral")

    def write(name, rows):
        with open(d / f"{name}.jsonl", "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")

    n_mc = 24
    write("mc", [{"question": _text(rng, w), "choices": ["A", "B", "C", "D"],
                  "answers": [_text(rng, rng.randint(1, 4)) for _ in range(4)],
                  "answer": rng.randrange(4)}
                 for w in _heavy_tailed(rng, n_mc, 8, 60)])
    write("ppl", [{"text": _text(rng, w)} for w in _heavy_tailed(rng, 10, 25, 160)])
    write("gen", [{"question": _text(rng, w), "answer": _text(rng, 2)}
                  for w in _heavy_tailed(rng, 16, 8, 50)])
    common = (f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {{path}}\n"
              f"test_split: test\n")
    tasks = {
        "pp_mc_letters": ("mc", "output_type: multiple_choice\n"
                          "doc_to_text: \"{{question}}\\nAnswer:\"\n"
                          "doc_to_choice: \"{{choices}}\"\ndoc_to_target: answer\n"
                          "metric_list:\n  - metric: acc\n  - metric: acc_norm\n"),
        "pp_mc_texts": ("mc", "output_type: multiple_choice\n"
                        "doc_to_text: \"{{question}}?\"\n"
                        "doc_to_choice: \"{{answers}}\"\ndoc_to_target: answer\n"
                        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n"),
        "pp_ppl": ("ppl", "output_type: loglikelihood_rolling\ndoc_to_text: \"\"\n"
                   "doc_to_target: \"{{text}}\"\n"
                   "metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n"
                   "  - metric: bits_per_byte\n"),
        "pp_gen": ("gen", "output_type: generate_until\ndoc_to_text: \"{{question}}:\"\n"
                   "doc_to_target: \"{{answer}}\"\n"
                   "generation_kwargs:\n  until: [\"e\", \"\\n\", \" s\"]\n  max_gen_toks: 12\n"
                   "  do_sample: false\n"
                   "metric_list:\n  - metric: exact_match\n"),
    }
    for name, (data, body) in tasks.items():
        (d / f"{name}.yaml").write_text(f"task: {name}\n" +
                                        common.format(path=d / f"{data}.jsonl") + body)
    return d


def _args(workdir, family="llama", **extra):
    return dict(pretrained=str(workdir / family), device="cpu", dtype="float32",
                max_length=MAX_LENGTH, **extra)


def _run(lm, workdir, tasks):
    return lm_eval.simple_evaluate(model=lm, tasks=tasks, log_samples=True,
                                   task_manager=TaskManager(include_path=str(workdir)),
                                   random_seed=0, numpy_random_seed=0, torch_random_seed=0,
                                   fewshot_random_seed=0)


def _compare(ours, theirs, tasks):
    """Request by request: log-likelihoods within 1e-5 relative, is_greedy and texts equal; then
    every metric (within 1e-5 relative; accuracies equal)."""
    n_requests = 0
    for task in tasks:
        a, b = ours["samples"][task], theirs["samples"][task]
        assert [s["doc_id"] for s in a] == [s["doc_id"] for s in b]
        for sa, sb in zip(a, b):
            for ra, rb in zip(sa["resps"], sb["resps"], strict=True):
                n_requests += 1
                ra, rb = ra[0], rb[0]
                if isinstance(rb, str):
                    assert ra == rb, (task, sa["doc_id"], ra, rb)
                elif isinstance(rb, (tuple, list)):  # (log-likelihood, is_greedy)
                    assert ra[0] == pytest.approx(rb[0], rel=1e-5, abs=1e-6), (task, sa["doc_id"])
                    assert ra[1] == rb[1], (task, sa["doc_id"], ra, rb)
                else:  # a rolling log-likelihood
                    assert ra == pytest.approx(rb, rel=1e-5), (task, sa["doc_id"])
        ma, mb = ours["results"][task], theirs["results"][task]
        for key, vb in mb.items():
            if isinstance(vb, float) and not key.endswith("_stderr,none"):
                if key.startswith(("acc", "exact_match")):
                    assert ma[key] == vb, (task, key)
                else:
                    assert ma[key] == pytest.approx(vb, rel=1e-5), (task, key)
    return n_requests


TASKS = ["pp_mc_letters", "pp_mc_texts", "pp_ppl", "pp_gen"]


@pytest.fixture(scope="module")
def hf_results(workdir):
    return _run(HFLM(**_args(workdir, batch_size=8)), workdir, TASKS)


def test_tasks_equal_hf_backend(workdir, hf_results):
    ours = _run(ple.PrepackLM(**_args(workdir, batch_size=8)), workdir, TASKS)
    n = _compare(ours, hf_results, TASKS)
    assert n == 24 * 4 * 2 + 10 + 16
    # The generation task met its stop sequences (inside tokens) and ran to max_gen_toks both.
    texts = [s["resps"][0][0] for s in hf_results["samples"]["pp_gen"]]
    assert any(len(t) < 4 for t in texts) and any(len(t) > 12 for t in texts), texts
    assert all(stop not in t for t in texts for stop in ("e", "\n", " s"))


@pytest.mark.parametrize("batch_size", [1, 3, "auto"])
def test_batch_sizes(workdir, hf_results, batch_size):
    """Rows per forward pass change the packing, not the answers."""
    tasks = ["pp_mc_texts", "pp_ppl"]
    ours = _run(ple.PrepackLM(**_args(workdir, batch_size=batch_size)), workdir, tasks)
    _compare(ours, hf_results, tasks)


def test_capacity(workdir, hf_results):
    """Rows narrower than the longest request widen to it; wider rows hold more requests."""
    tasks = ["pp_mc_letters", "pp_ppl"]
    for capacity in (8, 300):
        ours = _run(ple.PrepackLM(**_args(workdir, batch_size=2, capacity=capacity)), workdir,
                    tasks)
        _compare(ours, hf_results, tasks)


def test_sliding_window_family(workdir):
    """Mistral with a 12-token window, shorter than most requests, against HFLM on it."""
    tasks = ["pp_mc_texts", "pp_ppl", "pp_gen"]
    theirs = _run(HFLM(**_args(workdir, "mistral", batch_size=8)), workdir, tasks)
    ours = _run(ple.PrepackLM(**_args(workdir, "mistral", batch_size=8)), workdir, tasks)
    _compare(ours, theirs, tasks)


def _ll(lm, pairs):
    return lm.loglikelihood([Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)],
                            disable_tqdm=True)


@pytest.fixture(scope="module")
def pair(workdir):
    return (HFLM(**_args(workdir, batch_size=4)), ple.PrepackLM(**_args(workdir, batch_size=4)))


def test_edge_requests(pair, caplog):
    """An empty context (the prefix token conditions), a request past max_length (left-truncated
    as HFLM truncates it, with its warning), a continuation exactly max_length long: as HFLM."""
    theirs, ours = pair
    long_ctx = " ".join(["the river"] * 80)
    pairs = [("", " the city"), ("", "the"), (long_ctx, " and the school"),
             ("a", " " + " ".join(["war"] * (MAX_LENGTH - 1))), ("the", " of")]
    n_tokens = len(ours.tok_encode(long_ctx))
    assert n_tokens > MAX_LENGTH
    b = _ll(theirs, pairs)
    caplog.clear()
    with caplog.at_level("WARNING"):
        a = _ll(ours, pairs)
    assert any("Truncating" in r.getMessage() for r in caplog.records)
    for x, y in zip(a, b, strict=True):
        assert x[0] == pytest.approx(y[0], rel=1e-5) and x[1] == y[1]


def test_bad_requests(pair):
    """A continuation longer than max_length, an empty continuation: a ValueError naming the
    request, before any forward pass (HFLM stops on an assert)."""
    _, ours = pair
    too_long = " " + " ".join(["war"] * (MAX_LENGTH + 5))
    with pytest.raises(ValueError, match=r"request 1: continuation of \d+ tokens exceeds "
                                         rf"max_length {MAX_LENGTH}"):
        _ll(ours, [("the", " of"), ("the", too_long)])
    with pytest.raises(ValueError, match=r"request 0: empty continuation"):
        ours._loglikelihood_tokens([(("the", ""), [0, 5], [])])
    with pytest.raises(ValueError, match="capacity 0"):
        ple.PrepackLM(pretrained=ours.model, tokenizer=ours.tokenizer, capacity=0)


def test_generate_edge_requests(pair):
    """Sampling arguments pass through; a context past max_length - max_gen_toks is
    left-truncated as HFLM truncates it; the same greedy texts."""
    theirs, ours = pair
    long_ctx = " ".join(["the river"] * 60)
    reqs = [Instance("generate_until", {}, (c, {"until": [" s"], "max_gen_toks": 10}), i)
            for i, c in enumerate(["the", long_ctx, "of the war", "a"])]
    assert ours.generate_until(reqs, disable_tqdm=True) == \
        theirs.generate_until(reqs, disable_tqdm=True)


def test_generate_empty_context(workdir):
    """A tokenizer that adds no BOS gives an empty context no tokens: it is generated from the
    prefix token, as HFLM generates from a context that is that token's text."""
    gen = {"until": ["\n"], "max_gen_toks": 8}
    ours = ple.PrepackLM(**_args(workdir, batch_size=4, add_bos_token=False))
    theirs = HFLM(**_args(workdir, batch_size=4, add_bos_token=False))
    assert ours.tok_batch_encode([""])[1].sum() == 0  # nothing to condition on
    contexts = ["", "the war", "of the"]
    got = ours.generate_until([Instance("generate_until", {}, (c, gen), i)
                               for i, c in enumerate(contexts)], disable_tqdm=True)
    want = theirs.generate_until([Instance("generate_until", {}, (c or "<s>", gen), i)
                                  for i, c in enumerate(contexts)], disable_tqdm=True)
    assert got == want and got[0]


def test_refuses_what_it_cannot_pack(workdir):
    """A model prepack cannot pack (ALiBi positions) is refused when the backend is built."""
    torch.manual_seed(0)
    bloom = transformers.BloomForCausalLM(transformers.BloomConfig(
        vocab_size=400, hidden_size=32, n_layer=1, n_head=2)).eval()
    tok = transformers.AutoTokenizer.from_pretrained(workdir / "llama")
    with pytest.raises(ValueError, match="ALiBi"):
        ple.PrepackLM(pretrained=bloom, tokenizer=tok)


def test_command_line(workdir, hf_results, tmp_path):
    """python -m prepack.lm_eval is lm_eval's command line with --model prepack registered."""
    args = ",".join(f"{k}={v}" for k, v in _args(workdir).items() if k != "device")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run([sys.executable, "-m", "prepack.lm_eval", "--model", "prepack", "--model_args",
                    args, "--tasks", "pp_mc_letters", "--include_path", str(workdir),
                    "--batch_size", "8", "--device", "cpu", "--output_path", str(tmp_path), "--seed", "0"],
                   check=True, env=env, capture_output=True, timeout=600)
    [result] = list(tmp_path.rglob("results*.json"))
    got = json.loads(result.read_text())["results"]["pp_mc_letters"]
    assert got["acc,none"] == hf_results["results"]["pp_mc_letters"]["acc,none"]
    assert got["acc_norm,none"] == hf_results["results"]["pp_mc_letters"]["acc_norm,none"]
