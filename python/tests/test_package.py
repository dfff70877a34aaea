"""The package as Python users expect it: its doctests run, its stubs parse and type-check
(mypy, where installed; CI installs it), every class has a repr, index arrays are int32 or int64
(what torch.from_numpy and every index API take), and negative counts get an error naming the
argument."""
import ast
import doctest
import glob
import os
import subprocess
import sys

import numpy as np
import pytest

import prepack
from conftest import need

PACKAGE = os.path.dirname(prepack.__file__)


def test_doctests_run():
    result = doctest.testmod(prepack, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 5 and result.failed == 0


def test_stubs_parse():
    stubs = glob.glob(os.path.join(PACKAGE, "_prepack", "*.pyi"))
    assert len(stubs) >= 6
    for path in stubs:
        with open(path) as f:
            ast.parse(f.read(), path)  # SyntaxError names the file and line


def test_stubs_and_package_type_check():
    need("mypy")
    env = dict(os.environ, MYPYPATH=os.path.dirname(PACKAGE))
    out = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--ignore-missing-imports",
                          "--follow-imports=silent", "-p", "prepack"], capture_output=True,
                         text=True, env=env, cwd=os.path.dirname(PACKAGE))
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_class_has_a_repr():
    classes = [getattr(prepack, n) for n in prepack.__all__ if isinstance(getattr(prepack, n), type)]
    assert len(classes) >= 12
    bare = [c.__name__ for c in classes if "__repr__" not in c.__dict__]
    assert not bare, f"classes without a repr: {bare}"
    alloc = prepack.BlockAllocator(8)
    alloc.allocate(3)
    assert repr(alloc) == "BlockAllocator(8 blocks, 5 free)"
    assert repr(prepack.Prompts([[1, 2], [3]])) == "Prompts(2 prompts, 3 tokens)"


def test_index_arrays_are_int32_or_int64():
    lengths = [5, 2, 3, 7]
    plan = prepack.plan(lengths)
    batch = prepack.pack([[1] * n for n in lengths])
    sched = prepack.budgeted_schedule(lengths, budget=6)
    arrays = {}
    for obj in (plan, batch, sched):
        for name in dir(obj):
            if name.startswith("_"):
                continue
            value = getattr(obj, name)
            if isinstance(value, np.ndarray):
                arrays[f"{type(obj).__name__}.{name}"] = value
    assert {"Plan.row", "Plan.row_begin", "Plan.row_prompts", "PackedBatch.row_begin"} <= set(arrays)
    wrong = {k: str(v.dtype) for k, v in arrays.items()
             if v.dtype.kind in "iu" and v.dtype not in (np.int32, np.int64, np.int8)}
    assert not wrong, wrong


def test_negative_counts_name_the_argument():
    cases = [
        (lambda: prepack.budgeted_schedule([3, 4], budget=-1), "budget -1 (a count, at least 0)"),
        (lambda: prepack.BlockAllocator(4).allocate(-1), "n -1 (a count, at least 0)"),
        (lambda: prepack.BlockAllocator(-2), "n_blocks -2 (a count, at least 0)"),
        (lambda: prepack.Scheduler(n_blocks=-1), "n_blocks -1 (a count, at least 0)"),
        (lambda: prepack.BlockPool(8, -16), "block_size -16 (a count, at least 0)"),
        (lambda: prepack.pack([[1, 2]]).row_cu_seqlens(-1), "row -1 (a count, at least 0)"),
        (lambda: prepack.pack([[1, 2]]).left_padded_slots(-3), "columns -3 (at least 0)"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            call()
    assert prepack.BlockAllocator(np.int64(4)).n_blocks == 4  # numpy integers are counts too
