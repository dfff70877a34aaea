"""prepack.plan / pack / PackedBatch: against independent numpy computations of the
definitions, against prepack's C++ API on the same inputs (forms_cpp), and every bad input."""
import numpy as np
import pytest

import prepack
from conftest import equal, need, random_prompts


def ffd_rows(lengths, cap, best=False):
    """First-fit-decreasing (or best-fit) by the book: (row, offset) of every prompt."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    free, where = [], {}
    for i in order:
        fits = [r for r in range(len(free)) if free[r] >= lengths[i]]
        if fits:
            r = min(fits, key=lambda r: (free[r], r)) if best else fits[0]
        else:
            free.append(cap)
            r = len(free) - 1
        where[i] = (r, cap - free[r])
        free[r] -= lengths[i]
    return where, len(free)


@pytest.mark.parametrize("method", ["ffd", "bfd"])
def test_plans_are_the_packers_by_the_book(method):
    rng = np.random.default_rng(1)
    for trial in range(40):
        lengths = rng.integers(1, 200, size=int(rng.integers(1, 60))).tolist()
        cap = None if trial % 2 else max(lengths) + int(rng.integers(0, 50))
        p = prepack.plan(lengths, capacity=cap, method=method)
        where, n_rows = ffd_rows(lengths, cap or max(lengths), best=method == "bfd")
        assert p.n_rows == n_rows and p.capacity == (cap or max(lengths))
        assert [(int(r), int(o)) for r, o in zip(p.row, p.offset)] == [where[i] for i in range(len(lengths))]
        assert p.useful_tokens == sum(lengths) and p.slots == n_rows * p.capacity


def expected_rows(prompts, batch):
    """input_ids, position_ids, segment_ids from the plan's (row, offset) alone."""
    R, W = batch.n_rows, batch.width
    ids = np.zeros((R, W), np.int64)
    pos = np.zeros((R, W), np.int64)
    seg = np.full((R, W), -1, np.int64)
    for i, p in enumerate(prompts):
        r, o = batch.prompt_row[i], batch.prompt_offset[i]
        ids[r, o:o + len(p)] = p
        pos[r, o:o + len(p)] = np.arange(len(p))
        seg[r, o:o + len(p)] = i
    return ids, pos, seg


def expected_mask(seg):
    W = seg.shape[1]
    q = np.arange(W)[:, None]
    k = np.arange(W)[None, :]
    same = (seg[:, :, None] == seg[:, None, :]) & (k <= q)[None] & (seg[:, :, None] >= 0)
    pad_self = (seg[:, :, None] < 0) & (q == k)[None]
    return (same | pad_self)[:, None]


def test_pack_lays_prompts_out_by_their_plan():
    rng = np.random.default_rng(2)
    for trial in range(30):
        prompts = random_prompts(rng, int(rng.integers(1, 40)), 1, 120)
        b = prepack.pack(prompts)
        ids, pos, seg = expected_rows(prompts, b)
        assert b.input_ids.dtype == np.int64 and b.input_ids.shape == (b.n_rows, b.width)
        assert np.array_equal(b.input_ids, ids)
        assert np.array_equal(b.position_ids, pos)
        assert np.array_equal(b.segment_ids, seg)
        last = [b.prompt_row[i] * b.width + b.prompt_offset[i] + len(p) - 1 for i, p in enumerate(prompts)]
        assert b.last_token.tolist() == last
        # The same batch from Prompts, from flat int32 and int64 arrays with lengths, and from
        # numpy arrays per prompt.
        flat = np.concatenate([np.asarray(p, np.int64) for p in prompts])
        lens = np.array([len(p) for p in prompts])
        for other in (prepack.pack(prepack.Prompts(prompts)),
                      prepack.pack(flat, lengths=lens),
                      prepack.pack(flat.astype(np.int32), lengths=lens.astype(np.int32)),
                      prepack.pack([np.asarray(p, np.int32) for p in prompts])):
            assert np.array_equal(other.input_ids, b.input_ids)
            assert np.array_equal(other.position_ids, b.position_ids)


def test_masks_varlen_and_row_cu_seqlens_match_the_definitions():
    rng = np.random.default_rng(3)
    for trial in range(20):
        prompts = random_prompts(rng, int(rng.integers(1, 25)), 1, 60)
        b = prepack.pack(prompts, capacity=int(max(map(len, prompts)) + rng.integers(0, 9)))
        want = expected_mask(b.segment_ids)
        low = {np.float32: np.finfo(np.float32).min, np.float64: np.finfo(np.float64).min,
               np.float16: np.finfo(np.float16).min}
        for dt, lo in low.items():
            m = b.mask(dtype=dt)
            assert m.dtype == dt and m.shape == (b.n_rows, 1, b.width, b.width)
            assert np.array_equal(m, np.where(want, dt(0), lo))
        assert np.array_equal(b.mask(kind="bool"), want)
        # Every query row opens at least one key: no softmax row is empty.
        assert want.any(axis=-1).all()
        # varlen: prompts in row-major slot order.
        v = b.varlen()
        order = sorted(range(len(prompts)), key=lambda i: (b.prompt_row[i], b.prompt_offset[i]))
        assert v["seq_prompt"].tolist() == order
        assert v["cu_seqlens"].dtype == np.int32
        assert v["cu_seqlens"].tolist() == np.concatenate([[0], np.cumsum([len(prompts[i]) for i in order])]).tolist()
        assert v["max_seqlen"] == max(map(len, prompts))
        assert np.array_equal(v["input_ids"], b.input_ids.reshape(-1)[v["slot"]])
        for r in range(b.n_rows):
            cu = b.row_cu_seqlens(r)
            ins = [i for i in order if b.prompt_row[i] == r]
            assert cu.tolist() == [b.prompt_offset[ins[0]]] + [b.prompt_offset[i] + len(prompts[i]) for i in ins]


def test_unpack_gives_every_prompt_its_slots():
    rng = np.random.default_rng(4)
    prompts = random_prompts(rng, 17, 1, 50)
    b = prepack.pack(prompts)
    R, W = b.n_rows, b.width
    cases = [
        (rng.standard_normal((R, W)).astype(np.float32), 1),
        (rng.integers(-100, 100, (R, W, 5)).astype(np.int8), 1),
        (rng.standard_normal((R, W, 3, 4)).astype(np.float16), 1),
        (rng.standard_normal((R, 3, W, 4)), 2),
        (np.ascontiguousarray(rng.standard_normal((W, R, 6)).astype(np.float32)).transpose(1, 0, 2), 1),
    ]
    for values, axis in cases:
        out = b.unpack(values, axis=axis)
        assert len(out) == len(prompts)
        for i, p in enumerate(prompts):
            r, o = b.prompt_row[i], b.prompt_offset[i]
            want = values[r, o:o + len(p)] if axis == 1 else values[r, :, o:o + len(p)]
            assert out[i].dtype == values.dtype and np.array_equal(out[i], want)
            assert out[i].flags.c_contiguous and not np.shares_memory(out[i], values)


def test_arrays_are_views_without_copies():
    b = prepack.pack([[1, 2, 3], [4, 5]])
    a1, a2 = b.input_ids, b.input_ids
    assert np.shares_memory(a1, a2) and not a1.flags.writeable
    v = b.varlen()
    assert not v["cu_seqlens"].flags.owndata  # handed over from C++, not copied into numpy


def test_torch_tensors_in_and_out():
    torch = need("torch")
    prompts = [[5, 6, 7, 8], [1, 2], [9]]
    b = prepack.pack([torch.tensor(p) for p in prompts])
    assert np.array_equal(b.input_ids, prepack.pack(prompts).input_ids)
    flat = torch.tensor(sum(prompts, []), dtype=torch.int32)
    assert np.array_equal(prepack.pack(flat, lengths=torch.tensor([4, 2, 1])).input_ids, b.input_ids)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        m = torch.empty((b.n_rows, 1, b.width, b.width), dtype=dtype)
        b.fill_mask(m)
        want = torch.from_numpy(expected_mask(b.segment_ids))
        assert torch.equal(m, torch.where(want, torch.zeros((), dtype=dtype),
                                          torch.tensor(torch.finfo(dtype).min, dtype=dtype)))
        assert torch.isfinite(m).all()
    kv = torch.randn(b.n_rows, 2, b.width, 4, dtype=torch.bfloat16)
    out = b.unpack(kv, axis=2)
    for i, p in enumerate(prompts):
        r, o = int(b.prompt_row[i]), int(b.prompt_offset[i])
        assert isinstance(out[i], torch.Tensor) and torch.equal(out[i], kv[r, :, o:o + len(p)])


def test_same_as_the_cpp_api(cpp):
    rng = np.random.default_rng(5)
    for method in ("ffd", "bfd"):
        prompts = random_prompts(rng, 23, 1, 70)
        c = cpp({"kind": "pack", "prompts": prompts, "method": method, "capacity": 80})
        b = prepack.pack(prompts, method=method, capacity=80)
        assert (b.n_rows, b.width) == (c["n_rows"], c["width"])
        for name in ("input_ids", "position_ids", "segment_ids", "last_token", "prompt_row", "prompt_offset"):
            equal(getattr(b, name), c[name], name)
        v = b.varlen()
        equal(v["cu_seqlens"], c["cu_seqlens"], "cu_seqlens")
        assert v["max_seqlen"] == c["max_seqlen"]
        equal(b.mask(), np.asarray(c["mask"], np.float32), "mask")


def test_bad_input_raises_with_the_cpp_message():
    cases = [
        (lambda: prepack.plan([3, 0, 2]), ValueError, "prompt 1: length 0"),
        (lambda: prepack.plan([3, -4]), ValueError, "prompt 1: length -4"),
        (lambda: prepack.plan([]), ValueError, "empty batch: no prompts to plan"),
        (lambda: prepack.plan([5, 9], capacity=8), ValueError, "prompt 1: length 9 exceeds capacity 8"),
        (lambda: prepack.plan([1.5, 2]), TypeError, "lengths: float64 values, integers expected"),
        (lambda: prepack.plan("abc"), TypeError, "lengths"),
        (lambda: prepack.plan([[1, 2]]), ValueError, "lengths: 2-dimensional"),
        (lambda: prepack.plan([2**70]), (ValueError, TypeError, OverflowError), "lengths"),
        (lambda: prepack.plan([3], method="first"), ValueError, "method: 'first', expected one of"),
        (lambda: prepack.pack([[1, 2], []]), ValueError, "prompt 1: length 0"),
        (lambda: prepack.pack([[1, "x"]]), TypeError, "prompt 0: token 1 = 'x' is not an integer"),
        (lambda: prepack.pack([[1, 2**40]]), ValueError, "prompt 0: token 1 = 1099511627776 does not fit the int32 token type"),
        (lambda: prepack.pack("abc"), TypeError, "prompts: a string"),
        (lambda: prepack.pack(np.arange(5), lengths=[2, 2]), ValueError, "token count 5 does not match the lengths' total 4"),
        (lambda: prepack.pack([[1, 2]], plan=prepack.plan([3])), ValueError, "prompt 0: 2 tokens, the plan says length 3"),
        (lambda: prepack.fitted_plan([4, 4], max_pad=-1), ValueError, "max_pad -1"),
        (lambda: prepack.pack([[1, 2]]).unpack(np.zeros((2, 2))), ValueError, "unpack: 2 rows x 2 slots, the batch has 1 x 2"),
        (lambda: prepack.pack([[1, 2]]).unpack(np.zeros((1, 2)), axis=2), ValueError, "unpack: axis 2"),
        (lambda: prepack.pack([[1, 2]]).mask(dtype=np.int32), TypeError, "float32, float64, float16 or bfloat16"),
        (lambda: prepack.pack([[1, 2]]).fill_mask(np.zeros((1, 1, 2, 3), np.float32)), ValueError, "mask: out has shape (1, 1, 2, 3), the batch needs (1, 1, 2, 2)"),
        (lambda: prepack.pack([[1, 2]]).token_batch(seq_ids=[1, 2]), ValueError, "sequence ids: 2 for 1 prompts"),
    ]
    for call, error, message in cases:
        with pytest.raises(error) as e:
            call()
        assert message in str(e.value), (message, str(e.value))
