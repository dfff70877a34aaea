"""Shared by prepack's Python tests: the C++ side of the comparisons (forms_cpp, built by CMake
and named by PREPACK_FORMS_CPP), and what a test does when an optional package is absent: skip
with the reason, or fail when PREPACK_REQUIRE_ORACLES=1 (CI)."""
import importlib
import json
import os
import subprocess

import numpy as np
import pytest

REQUIRED = os.environ.get("PREPACK_REQUIRE_ORACLES") == "1"


def need(module, whole_file=False):
    """Imports `module`, or skips (fails in CI) saying it is absent. With whole_file (at a test
    file's top), the reason carries "prepack-skip:", which CTest reads as the test skipped."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        reason = (f"Python package '{module}' is not installed ({e}); .ci/fetch-oracles installs "
                  f"it into the cache's venv")
        if REQUIRED:
            pytest.fail(f"prepack-oracle: required, but {reason}", pytrace=False)
        pytest.skip(f"prepack-skip: {reason}" if whole_file else reason,
                    allow_module_level=whole_file)


@pytest.fixture(scope="session")
def cpp():
    """Runs a scenario through prepack's C++ API (python/tests/forms_cpp.cpp) and returns its
    JSON answer."""
    exe = os.environ.get("PREPACK_FORMS_CPP")
    if not exe or not os.path.exists(exe):
        reason = "PREPACK_FORMS_CPP (the forms_cpp test driver CMake builds) is not set"
        if REQUIRED:
            pytest.fail(reason)
        pytest.skip(reason)

    def run(scenario):
        out = subprocess.run([exe], input=json.dumps(scenario), capture_output=True, text=True,
                             check=True)
        return json.loads(out.stdout)

    return run


def random_prompts(rng, n, lo, hi, vocab=1000):
    return [rng.integers(0, vocab, size=int(rng.integers(lo, hi + 1))).tolist() for _ in range(n)]


def equal(a, b, what):
    """a and b hold the same values in the same order (a numpy array against JSON's lists)."""
    a = np.asarray(a).reshape(-1)
    b = np.asarray(b).reshape(-1)
    assert a.size == b.size, f"{what}: {a.size} values against {b.size}"
    assert np.array_equal(a, b), f"{what}: first difference at {np.flatnonzero(a != b)[:1]}"


def real_model_file():
    """The real trained model .ci/fetch-oracles puts in the cache (SmolLM2-135M-Instruct, Q4_1
    GGUF), or PREPACK_TEST_MODEL; skips the file (fails in CI) when it is absent."""
    cache = os.environ.get("PREPACK_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "prepack")
    path = os.environ.get("PREPACK_TEST_MODEL") or os.path.join(
        cache, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.isfile(path):
        reason = f"the real model {path} is absent; .ci/fetch-oracles fetches it"
        if REQUIRED:
            pytest.fail(f"prepack-oracle: required, but {reason}", pytrace=False)
        pytest.skip(f"prepack-skip: {reason}", allow_module_level=True)
    return path


_REPORT = []


def report(line):
    """A line for the run's summary (what an oracle test checked: counts, worst error), printed
    after the tests however pytest captures output, so the CI log carries it."""
    _REPORT.append(line.strip())


def pytest_terminal_summary(terminalreporter):
    if _REPORT:
        terminalreporter.section("what the oracles checked")
        for line in _REPORT:
            terminalreporter.write_line(line)


def cache_argument(model):
    """The keyword under which transformers' model takes its KV cache: ``cache`` from
    transformers 5.24 (``past_key_values`` there is deprecated), ``past_key_values`` before."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters \
        else "past_key_values"


def output_cache(out):
    """The cache in a transformers model output: ``out.cache`` from 5.24, ``past_key_values``
    before (the old name still answers there, with a deprecation warning)."""
    return out.get("cache", out.get("past_key_values"))
