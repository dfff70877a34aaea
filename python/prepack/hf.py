"""Prepacked prefill and batched generation on Hugging Face transformers causal LMs: the
Prepacking paper's system in its own setting.

``prefill(model, prompts)`` packs the prompts into rows (first-fit-decreasing), runs the model
once over the rows with each prompt in its own causal block and position ids restarting at 0,
and returns every prompt's last-token logits and its cache in the form decoding needs: one
left-padded batch cache (a ``DynamicCache`` with its 2-D attention mask, what ``model.generate``
continues) or, when asked, one cache per prompt. Each equals running the prompt alone, up to float
rounding. ``generate(model, prompts)`` is one prepacked prefill and one batched
``model.generate`` over all prompts, every generate argument honoured.

How the rows are attended, by the model's ``attn_implementation``:

- ``eager``: the block-diagonal causal mask as an additive 4-D mask in the model's dtype (0 /
  ``finfo.min``, every pad query open to its own slot so no softmax row is empty), built on the
  model's device from prepack's segment ids;
- ``sdpa``: the same mask as booleans;
- ``flex_attention``: a ``BlockMask`` from prepack's block-sparse tables (``block_mask``): no dense
  mask anywhere, attention computed only in the blocks the mask opens;
- ``flash_attention_2`` / ``_3``: every prompt in one row without pads, attended through the
  varlen kernel with ``cu_seqlens`` from prepack.

Sliding-window layers (Mistral, Qwen2 / Qwen3 sliding layers, Gemma 2 / 3 local layers, ...) get
their own windowed mask (a dict of masks by layer type where a model mixes types) and caches that
keep what transformers' own cache keeps for them (the last window - 1 positions). Layer types come
from transformers itself (``cache_utils.get_layer_types_and_kwargs``); a model whose positions
come from the attention mask (ALiBi: BLOOM, MPT, Falcon with alibi), that takes no position ids,
or has layers other than full or sliding attention is refused with an error naming it.

Planning, packing, the block tables and the gather indices are prepack's C++; the mask, the forward
pass and the gathers run in torch on the model's device. Importing this module imports torch and
transformers.

Prompts may be given as token-id sequences (lists, tuples, numpy arrays, torch tensors, of
Python, numpy or torch integers), a ``prepack.Prompts``, a tokenizer's ``BatchEncoding`` (or any
mapping with ``input_ids`` and ``attention_mask``), a padded 2-D ``input_ids`` with its
``attention_mask`` (left or right padding stripped), or texts with ``tokenizer=``. Token ids are
checked against the model's vocabulary before anything runs on the device.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import operator
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import transformers
from packaging.version import Version  # a dependency of transformers

from . import _prepack

# The oldest transformers whose cache API prepack.hf uses (cache_utils.get_layer_types_and_kwargs).
_TRANSFORMERS_MIN = (5, 14)

if Version(transformers.__version__).release < _TRANSFORMERS_MIN:
    raise ImportError(f"prepack.hf needs transformers >= {'.'.join(map(str, _TRANSFORMERS_MIN))}; "
                      f"this is transformers {transformers.__version__} (pip install -U "
                      f"transformers)")

__all__ = [
    "PrefillResult",
    "Score",
    "as_prompts",
    "generate",
    "pack_inputs",
    "padded_prefill",
    "prefill",
    "score",
]

# attn_implementation -> how packed rows are attended (see the module docstring).
_KERNELS = {
    "eager": "mask",
    "sdpa": "mask",
    "flex_attention": "block",
    "flash_attention_2": "varlen",
    "flash_attention_3": "varlen",
}
# The class attribute with which transformers says a model supports a kernel.
_SUPPORT_FLAGS = {
    "sdpa": "_supports_sdpa",
    "flex_attention": "_supports_flex_attn",
    "flash_attention_2": "_supports_flash_attn",
    "flash_attention_3": "_supports_flash_attn",
}
_LAYER_TYPES = ("full_attention", "sliding_attention")
_FLEX_BLOCK = 128  # FlexAttention's default block size
# Families whose transformers code does not take a BlockMask as its attention_mask.
_NO_BLOCK_MASK = {
    "doge": "its dynamic mask attention builds its own mask and drops a BlockMask",
    "lfm2": "its forward builds the convolution layers' mask from attention_mask's dimensions",
    "lfm2_moe": "its forward builds the convolution layers' mask from attention_mask's dimensions",
}

# Families whose forward cannot take packed rows, for a reason no general check sees.
_REFUSED = {
    "xlm": "its forward builds its own causal mask from the sequence lengths (its attention_mask "
           "is a [batch, length] padding mask), so prompts cannot have their own blocks in a row",
    "dory": "its recurrent loops keep extra cache layers that its forward adds to a cache only "
            "when the cache holds exactly one layer per decoder layer",
}


# -- the model ---------------------------------------------------------------------------------


@dataclass
class _Target:
    """What prepack needs to know of a model, read once per call."""

    kernel: str  # "mask", "block" or "varlen"
    impl: str  # the model's attn_implementation
    dtype: torch.dtype
    device: torch.device
    vocab_size: int
    layer_types: List[str]  # [n_layers]  transformers' type of each cached layer
    windows: Dict[str, Optional[int]]  # layer type -> its sliding window (None: full)
    cache_argument: str  # the cache's keyword in forward and generate: cache or past_key_values


def _text_config(model):
    cfg = model.config
    get = getattr(cfg, "get_text_config", None)
    return get(decoder=True) if get is not None else cfg


def _target(model) -> _Target:
    cfg = _text_config(model)
    name = type(model).__name__
    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    if impl not in _KERNELS:
        raise ValueError(
            f"{name}: attn_implementation {impl!r} has no packed form; load the model with "
            f"attn_implementation one of {', '.join(repr(k) for k in _KERNELS)}")
    flag = _SUPPORT_FLAGS.get(impl)
    if flag is not None and getattr(type(model), flag, True) is False:
        raise ValueError(f"{name} does not support attn_implementation {impl!r} (transformers' "
                         f"{flag} is False); load it with one it supports")
    if getattr(model.config, "is_encoder_decoder", False):
        raise ValueError(f"{name}: an encoder-decoder model; prepack prefills decoder-only LMs")
    if not getattr(cfg, "is_causal", True) or getattr(cfg, "use_bidirectional_attention", False):
        raise ValueError(f"{name}: its attention is not causal, so prompts cannot share a row")
    model_type = getattr(cfg, "model_type", "")
    if impl == "flex_attention" and model_type in _NO_BLOCK_MASK:
        raise ValueError(f"{name} ({model_type}) under flex_attention: "
                         f"{_NO_BLOCK_MASK[model_type]}; load it with attn_implementation 'sdpa' "
                         f"or 'eager'")
    if model_type in _REFUSED:
        raise ValueError(f"{name} ({model_type}): {_REFUSED[model_type]}")
    if model_type in ("bloom", "mpt") or getattr(cfg, "alibi", False):
        raise ValueError(
            f"{name} ({model_type}): ALiBi derives positions from the attention mask, not from "
            f"position ids, so prompts cannot restart at position 0 inside a row")
    params = inspect.signature(model.forward).parameters
    if "position_ids" not in params:
        raise ValueError(f"{name}: its forward takes no position_ids, so prompts cannot restart "
                         f"at position 0 inside a row")
    for path, module in model.named_modules():
        # RoBERTa-style embeddings (fairseq's make_positions): alone, a prompt's positions start
        # at padding_idx + 1 and skip tokens equal to the padding index.
        if hasattr(module, "create_position_ids_from_input_ids"):
            raise ValueError(f"{name} ({model_type}): {path} counts positions from the padding "
                             f"index in the token ids, not from position ids starting at 0")
    cache_argument = _cache_argument(params)
    if cache_argument is None:
        raise ValueError(f"{name}: its forward takes no cache (neither cache nor past_key_values: "
                         f"it keeps no KV cache and builds its own causal mask), so prompts "
                         f"cannot share a row")
    for i, layer in enumerate(_decoder_layers(model)):
        # An encoder used as a decoder (BERT, RoBERTa, ... without is_decoder=True) attends both
        # ways; transformers marks each attention module's direction with is_causal.
        bidirectional = [p for p, m in layer.named_modules()
                         if getattr(m, "is_causal", None) is False]
        if bidirectional:
            raise ValueError(f"{name}: layer {i}'s {bidirectional[0]} attends both ways "
                             f"(is_causal False; an encoder without is_decoder=True?), so "
                             f"prompts cannot share a row")
        # Recurrent and state-space blocks (RecurrentGemma, Mamba, LFM2's short convolutions)
        # carry a convolution over the sequence from one prompt into the next.
        convs = [p for p, m in layer.named_modules() if isinstance(m, torch.nn.Conv1d)]
        if convs:
            raise ValueError(f"{name}: layer {i}'s {convs[0]} is a convolution over the "
                             f"sequence, so prompts cannot share a row")
    from transformers.cache_utils import get_layer_types_and_kwargs

    layer_types, kwargs = get_layer_types_and_kwargs(cfg)
    # One set for every layer before transformers 5.19, one a layer from 5.19.
    layer_kwargs: Sequence[Mapping[str, Any]] = \
        [kwargs] * len(layer_types) if isinstance(kwargs, Mapping) else kwargs
    windows: Dict[str, Optional[int]] = {}
    for i, (t, kw) in enumerate(zip(layer_types, layer_kwargs)):
        if t not in _LAYER_TYPES:
            raise ValueError(f"{name}: layer {i} is {t!r}; prepack packs {' and '.join(_LAYER_TYPES)} "
                             f"layers only")
        w = int(kw["sliding_window"]) if t == "sliding_attention" else None
        if windows.setdefault(t, w) != w:
            raise ValueError(f"{name}: {t} layers with different windows ({windows[t]}, {w})")
    emb = model.get_input_embeddings()
    vocab = getattr(emb, "num_embeddings", None) or cfg.vocab_size
    device = emb.weight.device if hasattr(emb, "weight") else model.device
    return _Target(kernel=_KERNELS[impl], impl=impl, dtype=_dtype(model), device=device,
                   vocab_size=int(vocab), layer_types=list(layer_types), windows=windows,
                   cache_argument=cache_argument)


def _cache_argument(params) -> Optional[str]:
    """The name under which the model's forward (and so its generate) takes the KV cache:
    ``cache`` from transformers 5.24, ``past_key_values`` before (still accepted there, with a
    deprecation warning); None when it takes neither."""
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    return None


def _output_cache(out):
    """The cache a model's output holds: ``out.cache`` from transformers 5.24,
    ``out.past_key_values`` before (read as keys: the newer versions warn on the old attribute)."""
    return out.get("cache", out.get("past_key_values"))


def _integer(name: str, value, minimum: int, below: Optional[int] = None) -> int:
    """value as an int: a Python, numpy or 0-d torch integer (not a bool) in [minimum, below);
    TypeError / ValueError naming the argument and its value otherwise."""
    try:
        if isinstance(value, (bool, np.bool_)):
            raise TypeError
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: {value!r} is not an integer") from None
    if v < minimum:
        raise ValueError(f"{name} {v} (at least {minimum})")
    if below is not None and v >= below:
        raise ValueError(f"{name} {v} is outside the vocabulary ({below})")
    return v


def _capacity(capacity) -> Optional[int]:
    return None if capacity is None else _integer("capacity", capacity, 1)


def _dtype(model) -> torch.dtype:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


# -- prompts as users have them ----------------------------------------------------------------


def as_prompts(prompts, *, attention_mask=None, tokenizer=None,
               vocab_size: Optional[int] = None) -> _prepack.Prompts:
    """Prompts in every form users have them, as a prepack.Prompts (int32 token ids):

    - token-id sequences: lists, tuples, numpy arrays or torch tensors of Python, numpy or torch
      integers, or a prepack.Prompts (returned as is); one flat sequence (a 1-D tensor or array,
      a list of integers: what a tokenizer gives for one text) is one prompt;
    - a tokenizer's BatchEncoding, or any mapping with ``input_ids`` (and ``attention_mask``);
    - ``input_ids`` as a padded 2-D tensor or array with ``attention_mask`` (1 on real tokens; left
      or right padding is stripped); without a mask a 2-D input is refused, since its pads would
      be prefilled as tokens;
    - a text or a list of texts, with ``tokenizer=`` (tokenized with its special tokens).

    vocab_size: when given, every token id is checked to be in [0, vocab_size) ("prompt 3: token
    51234 at position 17 is outside the vocabulary (32000)"). TypeError / ValueError name the
    prompt and the value. O(tokens), no per-token Python loop.
    """
    out = _as_prompts(prompts, attention_mask, tokenizer)
    if len(out) == 0:
        raise ValueError("no prompts")
    if vocab_size is not None:
        out.check_vocabulary(vocab_size)
    return out


def _as_prompts(prompts, attention_mask, tokenizer) -> _prepack.Prompts:
    if prompts is None:
        raise TypeError("prompts: None; token-id sequences, a BatchEncoding, padded input_ids "
                        "with attention_mask, or texts with tokenizer= expected")
    if isinstance(prompts, _prepack.Prompts):
        if attention_mask is not None:
            raise ValueError("attention_mask: prompts given as prepack.Prompts have no pads")
        return prompts
    if isinstance(prompts, Mapping) or hasattr(prompts, "input_ids") and hasattr(prompts, "keys"):
        if "input_ids" not in prompts:
            raise TypeError(f"prompts: a mapping without 'input_ids' (keys: {list(prompts.keys())})")
        mask = attention_mask if attention_mask is not None else prompts.get("attention_mask")
        return _as_prompts(prompts["input_ids"], mask, None)
    if isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and prompts
                                    and all(isinstance(p, str) for p in prompts)):
        texts = [prompts] if isinstance(prompts, str) else list(prompts)
        if tokenizer is None:
            raise TypeError("prompts: texts need tokenizer= (the model's tokenizer)")
        return _prepack.Prompts(tokenizer(texts, add_special_tokens=True)["input_ids"])
    if isinstance(prompts, np.ndarray) and prompts.dtype == object and prompts.ndim == 1:
        return _as_prompts(list(prompts), attention_mask, None)  # ragged: a list of prompts
    if _one_prompt(prompts):
        # One sequence of token ids (what a tokenizer gives for one text): one prompt.
        if attention_mask is None:
            return _prepack.Prompts([prompts])
        m = attention_mask.detach().cpu().numpy() if isinstance(attention_mask, torch.Tensor) \
            else np.asarray(attention_mask)
        ids = _prepack.Prompts([prompts]).flat()[0]  # checked and converted as any prompt
        return _as_prompts(ids[None], m if m.ndim == 2 else m[None], None)
    if isinstance(prompts, (torch.Tensor, np.ndarray)):
        a = prompts.detach().cpu().numpy() if isinstance(prompts, torch.Tensor) else prompts
        if a.ndim != 2:
            raise ValueError(f"prompts: a {a.ndim}-D {type(prompts).__name__}; a padded 2-D "
                             f"input_ids (with attention_mask) or a list of prompts expected")
        if attention_mask is None:
            raise ValueError(
                "prompts: a 2-D input_ids without attention_mask; its pads would be prefilled as "
                "tokens. Pass attention_mask= (torch.ones_like(input_ids) if nothing is padded), "
                "or a list of prompts")
        return _strip_pads(a, attention_mask)
    if attention_mask is not None:
        # A tokenizer's lists: padded to one length (a 2-D array), or unpadded with all-ones masks.
        try:
            padded = np.asarray(prompts)
        except ValueError:  # ragged
            padded = np.zeros(0)
        if padded.ndim == 2:
            return _strip_pads(padded, attention_mask)
        ps = _prepack.Prompts(prompts)
        masks = list(attention_mask)
        if len(masks) != len(ps):
            raise ValueError(f"attention_mask: {len(masks)} rows for {len(ps)} prompts")
        for i, m in enumerate(masks):
            m = np.asarray(m)
            if m.shape != (len(ps[i]),) or not (m != 0).all():
                raise ValueError(f"prompt {i}: attention_mask {m.tolist()[:8]} does not cover "
                                 f"its {len(ps[i])} tokens with ones")
        return ps
    return _prepack.Prompts(prompts)


def _one_prompt(prompts) -> bool:
    """A single prompt: a 1-D tensor or array, or a non-empty list or tuple of integer scalars
    (Python, numpy or 0-D torch / numpy)."""
    if isinstance(prompts, (torch.Tensor, np.ndarray)):
        return prompts.ndim == 1
    return isinstance(prompts, (list, tuple)) and len(prompts) > 0 and all(
        isinstance(x, (int, np.integer)) and not isinstance(x, bool)
        or isinstance(x, (torch.Tensor, np.ndarray)) and x.ndim == 0 for x in prompts)


def _strip_pads(ids: np.ndarray, attention_mask) -> _prepack.Prompts:
    if not np.issubdtype(ids.dtype, np.integer):
        raise TypeError(f"input_ids: dtype {ids.dtype}, integer token ids expected")
    m = attention_mask.detach().cpu().numpy() if isinstance(attention_mask, torch.Tensor) \
        else np.asarray(attention_mask)
    if m.shape != ids.shape:
        raise ValueError(f"attention_mask: shape {tuple(m.shape)}, input_ids has {tuple(ids.shape)}")
    odd = np.argwhere((m != 0) & (m != 1))
    if odd.size:
        r, c = (int(x) for x in odd[0])
        raise ValueError(f"prompt {r}: attention_mask holds {m[r, c].item()!r} at position {c} "
                         f"(0 or 1 expected)")
    m = m != 0
    lengths = m.sum(axis=1)
    empty = np.flatnonzero(lengths == 0)
    if empty.size:
        raise ValueError(f"prompt {int(empty[0])}: attention_mask has no real token (length 0)")
    # Left or right padding: each row's real tokens are one run, the `lengths` columns from its
    # first real token.
    first = m.argmax(axis=1)
    cols = np.arange(m.shape[1])
    run = (cols[None, :] >= first[:, None]) & (cols[None, :] < (first + lengths)[:, None])
    holes = np.flatnonzero((run != m).any(axis=1))
    if holes.size:
        raise ValueError(f"prompt {int(holes[0])}: attention_mask is not one run of real tokens "
                         f"(neither left nor right padding)")
    return _prepack.Prompts.from_flat(ids[m], lengths)


# -- packed rows and their masks ---------------------------------------------------------------


def _attention(t: _Target, batch: _prepack.PackedBatch):
    """The attention_mask argument for the packed rows: one mask, or a dict by layer type where
    the model has layers of different windows; None for the varlen kernels."""
    if t.kernel == "varlen":
        return None
    seg = torch.tensor(batch.segment_ids, device=t.device)
    build = _dense_mask if t.kernel == "mask" else _block_mask
    masks = {}
    for kind in dict.fromkeys(t.layer_types):
        masks[kind] = build(t, batch, seg, t.windows[kind])
    if len(set(t.windows.values())) == 1:
        return next(iter(masks.values()))
    return masks


def _dense_mask(t: _Target, batch, seg: torch.Tensor, window: Optional[int]) -> torch.Tensor:
    """[n_rows, 1, width, width] on the model's device: bool for sdpa, additive in the model's
    dtype for eager. A query attends keys of its own prompt at or before it (less than window
    slots back); a pad query its own slot."""
    w = seg.shape[1]
    slot = torch.arange(w, device=seg.device)
    back = slot[:, None] - slot[None, :]  # [w, w] query slot - key slot
    causal = back >= 0 if window is None else (back >= 0) & (back < window)
    allowed = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] >= 0) & causal
    allowed |= torch.eye(w, dtype=torch.bool, device=seg.device)
    allowed = allowed[:, None]
    if t.impl == "sdpa":
        return allowed
    return torch.zeros(allowed.shape, dtype=t.dtype, device=seg.device).masked_fill_(
        ~allowed, torch.finfo(t.dtype).min)


def _block_mask(t: _Target, batch, seg: torch.Tensor, window: Optional[int]):
    """FlexAttention's BlockMask from prepack's block-sparse tables; mask_mod (evaluated in the
    partial blocks only) reads the segment ids, padded to whole blocks."""
    from torch.nn.attention.flex_attention import BlockMask

    tables = batch.block_mask(_FLEX_BLOCK, window or 0)
    n_blocks = tables["kv_num_blocks"].shape[1]
    w = seg.shape[1]
    seg_p = torch.full((seg.shape[0], n_blocks * _FLEX_BLOCK), -1, dtype=seg.dtype, device=seg.device)
    seg_p[:, :w] = seg

    def mask_mod(b, h, q, kv):
        sq = seg_p[b, q]
        ok = (sq == seg_p[b, kv]) & (sq >= 0) & (kv <= q)
        if window is not None:
            ok = ok & (q - kv < window)
        return ok | (q == kv)

    def dev(name):
        return torch.tensor(tables[name], device=seg.device)[:, None]

    return BlockMask.from_kv_blocks(dev("kv_num_blocks"), dev("kv_indices"),
                                    dev("full_kv_num_blocks"), dev("full_kv_indices"),
                                    BLOCK_SIZE=_FLEX_BLOCK, mask_mod=mask_mod, seq_lengths=(w, w),
                                    compute_q_blocks=False)


def _pack(t: _Target, prompts: _prepack.Prompts, capacity, method) -> _prepack.PackedBatch:
    if t.kernel == "varlen":  # every prompt in one row, no pad: the varlen kernel's form
        return _prepack.pack(prompts, capacity=prompts.total_tokens, method="ffd")
    return _prepack.pack(prompts, capacity=capacity, method=method)


def _model_inputs(t: _Target, batch: _prepack.PackedBatch) -> Dict[str, Any]:
    inputs: Dict[str, Any] = {
        "input_ids": torch.tensor(batch.input_ids, device=t.device),
        "position_ids": torch.tensor(batch.position_ids, device=t.device),
        "attention_mask": _attention(t, batch),
    }
    if t.kernel == "varlen":
        cu = torch.tensor(batch.row_cu_seqlens(0), dtype=torch.int32, device=t.device)
        longest = int(batch.prompt_length.max())
        inputs.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest,
                      max_length_k=longest)
    return inputs


def pack_inputs(model, prompts, *, capacity: Optional[int] = None, method: str = "ffd",
                attention_mask=None, tokenizer=None):
    """Packs prompts for ``model``: returns (PackedBatch, inputs), inputs the keyword arguments of
    ``model(**inputs)`` on the model's device: input_ids and position_ids [n_rows, width] int64
    and attention_mask as the model's attention implementation takes it (module docstring), plus
    cu_seq_lens_q / _k and max_length_q / _k for the flash kernels. Prompts in any form
    ``as_prompts`` takes. O(slots) on the host, the mask O(n_rows width^2) on the device (eager,
    sdpa) or O(n_rows (width / 128)^2) (flex)."""
    t = _target(model)
    ps = as_prompts(prompts, attention_mask=attention_mask, tokenizer=tokenizer,
                    vocab_size=t.vocab_size)
    batch = _pack(t, ps, _capacity(capacity), method)
    return batch, _model_inputs(t, batch)


def _decoder_layers(model) -> List[torch.nn.Module]:
    """The model's decoder layers: the first ModuleList of its decoder (transformers'
    get_decoder(): the language model of a multimodal one) with as many modules as the config
    has layers; none found: []."""
    n = getattr(_text_config(model), "num_hidden_layers", None)
    get = getattr(model, "get_decoder", None)
    try:
        decoder = get() if get is not None else model
    except (AttributeError, NotImplementedError):
        decoder = model
    decoder = decoder if isinstance(decoder, torch.nn.Module) else model
    lists = [m for m in decoder.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n]
    return list(lists[0]) if lists else []


def _forward(model, t: _Target, batch, want_cache: bool, logits_of: Optional[np.ndarray],
             progress: bool = False):
    """One forward pass over the packed rows. Returns (logits [len(logits_of), vocab] or None,
    the rows' cache: a plain DynamicCache whose every layer holds all the rows' slots).
    progress: a tqdm bar advancing a step per decoder layer."""
    from transformers import DynamicCache

    inputs = _model_inputs(t, batch)
    cache = DynamicCache() if want_cache else None  # full layers: nothing cut to a window
    rows = torch.tensor(logits_of if logits_of is not None else np.zeros(0, np.int64),
                        device=t.device)

    def gather_rows(module, args):
        hidden = args[0]  # [n_rows, width, hidden]
        return (hidden.reshape(-1, hidden.shape[-1])[rows.to(hidden.device)].unsqueeze(0),) + \
            tuple(args[1:])

    hooks = [model.get_output_embeddings().register_forward_pre_hook(gather_rows)]
    bar = None
    if progress:
        layers = _decoder_layers(model)
        shown = _Progress(len(layers),
                          f"prepack.hf.prefill ({batch.n_rows} rows of {batch.width})")
        bar = shown

        def tick(*_) -> None:  # a forward hook that returns a value replaces the layer's output
            shown.bar.update(1)

        hooks += [layer.register_forward_hook(tick) for layer in layers]
    try:
        out = model(**inputs, **{t.cache_argument: cache}, use_cache=want_cache)
    finally:
        for h in hooks:
            h.remove()
        if bar is not None:
            bar.bar.close()
    logits = out.logits[0] if logits_of is not None else None
    return logits, cache


# -- caches in the form decoding needs ---------------------------------------------------------


def _layer_kv(cache):
    """(keys, values) of every layer of a transformers cache."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def _fill_layer(layer, k: torch.Tensor, v: torch.Tensor, seen: int) -> None:
    """Sets a transformers cache layer to hold k and v [batch, kv_heads, kept, head_dim] after
    `seen` positions, as its own update() would leave it (a sliding layer keeps the last window -
    1 positions and counts every position seen)."""
    layer.lazy_initialization(k, v)
    layer.keys, layer.values = k, v
    if hasattr(layer, "cumulative_length"):
        layer.cumulative_length = seen


def _new_cache(model):
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


@dataclass
class _CacheForm:
    """The cache class a decode continues, from generate's ``cache_implementation``: a
    DynamicCache (None, "dynamic", "offloaded") or a StaticCache of ``length`` slots a layer
    ("static", "offloaded_static")."""

    static: bool = False
    offloading: bool = False
    length: int = 0

    def new(self, model):
        from transformers import DynamicCache, StaticCache

        config = _text_config(model)
        if self.static:
            return StaticCache(config=config, max_cache_len=self.length,
                               offloading=self.offloading)
        return DynamicCache(config=config, offloading=self.offloading)

    def fill(self, layer, k: torch.Tensor, v: torch.Tensor, seen: int) -> None:
        """Sets the layer to hold k and v (the last positions of `seen`) as transformers' own
        prefill of `seen` positions leaves it."""
        if not self.static:
            _fill_layer(layer, k, v, seen)
            return
        if layer.is_sliding and seen >= layer.max_cache_len:
            # A full static sliding layer holds the last `window` positions; its first one is
            # rolled out before the next step reads the layer: zeros stand in for it.
            lead = layer.max_cache_len - k.shape[2]
            k = torch.cat([k.new_zeros(*k.shape[:2], lead, k.shape[3]), k], 2)
            v = torch.cat([v.new_zeros(*v.shape[:2], lead, v.shape[3]), v], 2)
        layer.update(k, v)
        layer.cumulative_length.fill_(seen)
        if hasattr(layer, "cumulative_length_int"):
            layer.cumulative_length_int = seen


def _cache_form(name: Optional[str]) -> _CacheForm:
    """The _CacheForm for generate's cache_implementation (a static one's length still to set),
    refusing what a prefilled cache cannot become by name."""
    from transformers.generation.configuration_utils import ALL_STATIC_CACHE_IMPLEMENTATIONS

    if name in (None, "dynamic", "offloaded"):
        return _CacheForm(offloading=name == "offloaded")
    if name in ALL_STATIC_CACHE_IMPLEMENTATIONS:
        return _CacheForm(static=True, offloading="offloaded" in name)
    raise ValueError(f"cache_implementation {name!r}: prepack.hf.generate continues its prefill "
                     f"in a dynamic or static cache (None, 'dynamic', 'offloaded', 'static', "
                     f"'offloaded_static')")


def _kv_index(slots: torch.Tensor, heads: int, width: int) -> torch.Tensor:
    """[..., heads, n] row indices into a layer of the rows' cache seen as [n_rows * heads * width,
    head_dim], for the flat packed slots [..., n] (row * width + slot) and every head."""
    h = torch.arange(heads, device=slots.device)
    return ((slots // width)[..., None, :] * heads + h[:, None]) * width + (slots % width)[..., None, :]


class _Gather:
    """Gathers each layer of the packed rows' cache [n_rows, kv_heads, width, head_dim] into a
    destination with one index_select per layer and K / V: the index, built from prepack's flat
    slots, is expanded over the heads once per (device, heads) and reused for every layer."""

    def __init__(self, slots: np.ndarray, width: int):
        self.slots = torch.from_numpy(np.ascontiguousarray(slots, dtype=np.int64))  # [...]
        self.width = width
        self._index: Dict[Tuple[torch.device, int], torch.Tensor] = {}

    def index(self, device, heads: int) -> torch.Tensor:
        key = (device, heads)
        if key not in self._index:
            self._index[key] = _kv_index(self.slots.to(device), heads, self.width)
        return self._index[key]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        heads, d = x.shape[1], x.shape[-1]
        idx = self.index(x.device, heads)
        return x.contiguous().view(-1, d).index_select(0, idx.reshape(-1)).view(*idx.shape, d)


def _batch_cache(model, t: _Target, rows_cache, batch, present: np.ndarray, columns: int,
                 expand: int = 1, free: bool = True, packed: Optional[np.ndarray] = None,
                 form: Optional[_CacheForm] = None):
    """The left-padded batch cache: [n * expand, kv_heads, kept, head_dim] per layer, prompt i
    (rows i * expand .. i * expand + expand - 1) holding its prefilled tokens right-aligned in
    `columns` columns (sliding layers the last window - 1 of them). present[i]: prompt i's index
    in the packed batch, or -1 if it has no prefilled token (its columns are all pads). free:
    each of the rows' layers is dropped once gathered. packed: batch.left_padded_slots(), when
    the caller has it already. form: the cache class (a DynamicCache by default)."""
    slots = np.zeros((len(present), columns), np.int64)  # pads gather slot 0: finite, masked
    if (present >= 0).any():
        # [n_packed, longest packed], -1 on pads; a prompt of at most `columns` tokens lies in
        # the last `columns` columns.
        if packed is None:
            packed = batch.left_padded_slots()
        rows = packed[present[present >= 0]]
        if rows.shape[1] > columns:
            rows = rows[:, rows.shape[1] - columns:]
        slots[present >= 0, columns - rows.shape[1]:] = np.maximum(rows, 0)
    if expand > 1:
        slots = np.repeat(slots, expand, axis=0)
    gathers = {}
    for kind, w in t.windows.items():
        keep = columns if w is None else min(columns, w - 1)
        gathers[kind] = _Gather(slots[:, columns - keep:], batch.width)
    form = form or _CacheForm()
    cache = form.new(model)
    layers = rows_cache.layers
    for i, (layer, kind) in enumerate(zip(cache.layers, t.layer_types)):
        k, v = layers[i].keys, layers[i].values
        g = gathers[kind]
        form.fill(layer, g(k), g(v), columns)
        if free:
            layers[i].keys = layers[i].values = None  # the rows' layer is no longer needed
    return cache


def _prompt_caches(model, t: _Target, rows_cache, batch) -> List[Any]:
    """One DynamicCache per prompt, prompt i's layers [1, kv_heads, kept_i, head_dim], views of
    one gathered buffer per layer and K / V (sliding layers keep the last window - 1 positions)."""
    n = batch.n_prompts
    lengths = batch.prompt_length.astype(np.int64)
    caches = [_new_cache(model) for _ in range(n)]
    plans = {}
    for kind, w in t.windows.items():
        last = None if w is None else w - 1
        kept = lengths if last is None else np.minimum(lengths, last)
        plans[kind] = (_PromptGather(batch.prompt_slots(last), kept, batch.width), kept)
    layers = rows_cache.layers
    for li, kind in enumerate(t.layer_types):
        g, kept = plans[kind]
        ks, vs = g(layers[li].keys), g(layers[li].values)
        for i in range(n):
            _fill_layer(caches[i].layers[li], ks[i], vs[i], int(lengths[i]))
        layers[li].keys = layers[li].values = None
    return caches


class _PromptGather:
    """Gathers every prompt's kept tokens of a layer into one buffer ordered (prompt, head,
    token), so that prompt i's [1, kv_heads, kept_i, head_dim] is a contiguous view of it."""

    def __init__(self, slots: np.ndarray, kept: np.ndarray, width: int):
        self.slots = torch.from_numpy(np.ascontiguousarray(slots, dtype=np.int64))
        self.kept = torch.from_numpy(np.ascontiguousarray(kept, dtype=np.int64))
        self.width = width
        self._index: Dict[Tuple[torch.device, int], torch.Tensor] = {}

    def index(self, device, heads: int) -> torch.Tensor:
        key = (device, heads)
        if key not in self._index:
            s, kept = self.slots.to(device), self.kept.to(device)
            start = torch.cumsum(kept, 0) - kept  # [n] first entry of prompt i
            owner = torch.repeat_interleave(torch.arange(len(kept), device=device), kept)
            t = torch.arange(len(s), device=device) - start[owner]  # token within its prompt
            h = torch.arange(heads, device=device)
            src = _kv_index(s, heads, self.width).T  # [n, heads]
            dst = start[owner][:, None] * heads + h * kept[owner][:, None] + t[:, None]
            index = torch.empty(len(s) * heads, dtype=torch.int64, device=device)
            index[dst.reshape(-1)] = src.reshape(-1)
            self._index[key] = index
        return self._index[key]

    def __call__(self, x: torch.Tensor) -> List[torch.Tensor]:
        heads, d = x.shape[1], x.shape[-1]
        flat = x.contiguous().view(-1, d).index_select(0, self.index(x.device, heads))
        parts = torch.split(flat, (self.kept * heads).tolist())
        return [p.view(1, heads, int(k), d) for p, k in zip(parts, self.kept.tolist())]


def _left_padded(tokens: np.ndarray, lengths: np.ndarray, columns: int, pad_id: int, device):
    """(input_ids, attention_mask) [n, columns] int64, each prompt right-aligned (left padding)."""
    n = len(lengths)
    ids = np.full((n, columns), pad_id, np.int64)
    mask = np.zeros((n, columns), np.int64)
    owner = np.repeat(np.arange(n), lengths)
    col = columns - np.repeat(lengths, lengths) + (np.arange(len(tokens)) -
                                                   np.repeat(np.cumsum(lengths) - lengths, lengths))
    ids[owner, col] = tokens
    mask[owner, col] = 1
    return torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)


# -- prefill -----------------------------------------------------------------------------------


@dataclass
class PrefillResult:
    """What a prefill gives, prompt by prompt, in the prompts' order."""

    logits: Optional[torch.Tensor]
    """[n_prompts, vocab]: each prompt's last-token logits, in the model's dtype."""
    cache: Any = None
    """cache="batch": the left-padded batch cache (DynamicCache, layers [n_prompts, kv_heads,
    longest, head_dim], sliding layers the last window - 1 columns), as ``model.generate`` leaves
    it after prefilling ``input_ids`` with ``attention_mask``."""
    attention_mask: Optional[torch.Tensor] = None
    """[n_prompts, longest] int64: 1 on each prompt's columns of the batch cache, 0 on pads."""
    input_ids: Optional[torch.Tensor] = None
    """[n_prompts, longest] int64: the prompts left-padded with pad_id, as the cache holds them."""
    caches: List[Any] = field(default_factory=list)
    """cache="prompts": one DynamicCache per prompt, prompt i's layers [1, kv_heads, length_i,
    head_dim] (sliding layers the last window - 1 positions)."""
    batch: Optional[_prepack.PackedBatch] = None
    """The packed rows that were run (None for padded_prefill)."""

    def next_tokens(self) -> torch.Tensor:
        """[n_prompts] int64: the greedy next token of every prompt."""
        if self.logits is None:
            raise ValueError("no logits: the prefill ran without the LM head")
        return self.logits.argmax(dim=-1)


@torch.no_grad()
def prefill(model, prompts, *, cache: Optional[str] = "batch", capacity: Optional[int] = None,
            method: str = "ffd", attention_mask=None, tokenizer=None, pad_token_id: int = 0,
            progress: bool = False) -> PrefillResult:
    """Prefills prompts on a transformers causal LM with prepacked rows, in one forward pass.

    prompts: in any form ``as_prompts`` takes (token-id sequences, a BatchEncoding, padded
    input_ids with attention_mask, texts with tokenizer=). capacity: slots per row (default the
    longest prompt, as in the paper); method: 'ffd' (first-fit-decreasing) or 'bfd'. Ignored by
    the flash kernels, which take every prompt in one row.

    cache: "batch" (default) returns the left-padded batch cache with its attention_mask and
    input_ids, what ``model.generate`` continues (append each prompt's next token to input_ids
    and a 1 to attention_mask); "prompts" one cache per prompt; None no cache (the forward pass
    keeps none). Logits: each prompt's last token's, the LM head applied to those rows only.
    Every result equals running the prompt alone, up to float rounding.

    Cost: the forward pass over n_rows * width slots (about the prompts' total), the mask
    (module docstring), and per layer one gather of n_prompts * longest (batch) or total tokens
    (prompts) K and V rows on the model's device; the packed rows' cache of a layer is freed as
    soon as it is gathered. progress: a tqdm bar over the decoder layers.

    ValueError for an empty prompt, a token outside the vocabulary, a capacity below a prompt or
    below 1, a pad_token_id outside the vocabulary, a cache form other than the three, or a model
    prepack cannot pack (an error naming it); TypeError for a capacity or pad_token_id that is not
    an integer.
    """
    if cache not in ("batch", "prompts", None):
        raise ValueError(f"cache: {cache!r}, expected 'batch', 'prompts' or None")
    t = _target(model)
    capacity = _capacity(capacity)
    pad_token_id = _integer("pad_token_id", pad_token_id, 0, t.vocab_size)
    ps = as_prompts(prompts, attention_mask=attention_mask, tokenizer=tokenizer,
                    vocab_size=t.vocab_size)
    batch = _pack(t, ps, capacity, method)
    logits, rows = _forward(model, t, batch, cache is not None, batch.last_token, progress)
    result = PrefillResult(logits=logits, batch=batch)
    if cache == "batch":
        longest = int(batch.prompt_length.max())
        result.cache = _batch_cache(model, t, rows, batch, np.arange(len(ps)), longest)
        tokens, lengths = ps.flat()
        result.input_ids, result.attention_mask = _left_padded(tokens, lengths, longest,
                                                               pad_token_id, t.device)
    elif cache == "prompts":
        result.caches = _prompt_caches(model, t, rows, batch)
    return result


@torch.no_grad()
def padded_prefill(model, prompts, *, pad_token_id: int = 0, attention_mask=None,
                   tokenizer=None) -> PrefillResult:
    """The baseline: the prompts padded on the left to the longest, a 2D attention mask and
    position ids from it, as ``model.generate`` prefills a batch; logits of the last slot only.
    Returns the model's own batch cache with its input_ids and attention_mask."""
    t = _target(model)
    pad_token_id = _integer("pad_token_id", pad_token_id, 0, t.vocab_size)
    ps = as_prompts(prompts, attention_mask=attention_mask, tokenizer=tokenizer,
                    vocab_size=t.vocab_size)
    tokens, lengths = ps.flat()
    ids, mask = _left_padded(tokens, lengths, int(lengths.max()), pad_token_id, t.device)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=True,
                logits_to_keep=1)
    return PrefillResult(logits=out.logits[:, -1], cache=_output_cache(out), attention_mask=mask,
                         input_ids=ids)


# -- scoring -----------------------------------------------------------------------------------


@dataclass
class Score:
    """The log-probabilities of one sequence's target tokens (its last k), each given every token
    before it."""

    logprobs: torch.Tensor
    """[k] each target token's log-probability, in softmax_dtype, on the CPU."""
    greedy: torch.Tensor
    """[k] bool: whether each target token is the model's most likely token there."""

    @property
    def total(self) -> float:
        """The targets' summed log-probability: the sequence's log-likelihood of its last k
        tokens."""
        return float(self.logprobs.sum())

    @property
    def is_greedy(self) -> bool:
        """Whether greedy decoding from the context would produce every target token."""
        return bool(self.greedy.all())


@torch.no_grad()
def score(model, sequences, n_targets, *, capacity: Optional[int] = None, method: str = "ffd",
          batch_rows: Optional[int] = None, softmax_dtype: Optional[torch.dtype] = torch.float32,
          progress: bool = False) -> List[Score]:
    """Scores the last ``n_targets`` tokens of every sequence, each given all tokens before it
    (a context and its continuation: what an evaluation harness's log-likelihood requests ask),
    with prepacked rows.

    Every sequence but its last token is packed into rows of ``capacity`` slots (default the
    longest; first-fit-decreasing, or 'bfd'), ``batch_rows`` rows per forward pass (default all
    in one); the LM head runs only on the target positions, then a log-softmax in
    ``softmax_dtype`` (None: the model's dtype). Sequences whose inputs are equal (the same
    context with one-token continuations, as multiple-choice tasks ask) are run once.

    sequences: token-id sequences in any form ``as_prompts`` takes. n_targets: an int, or one
    per sequence, each at least 1 and less than the sequence's length. Returns one Score per
    sequence, in order. Each equals scoring the sequence alone, up to float rounding.

    Cost: one forward pass over the packed rows (about the distinct inputs' tokens, O(tokens)
    host work to pack them), the LM head and log-softmax over the target positions only:
    memory O(batch_rows * capacity * hidden + targets * vocab) per forward pass. ValueError for
    a sequence of fewer than 2 tokens, a target count outside [1, length - 1], capacity below a
    sequence's input, batch_rows < 1, or a model prepack cannot pack.
    """
    t = _target(model)
    ps = as_prompts(sequences, vocab_size=t.vocab_size)
    tokens, lengths = ps.flat()
    n = len(lengths)
    k = np.asarray(n_targets)
    if k.dtype == np.bool_ or not np.issubdtype(k.dtype, np.integer):
        raise TypeError(f"n_targets: {k.dtype} values, integers expected")
    k = k.astype(np.int64)
    if k.ndim == 0:
        k = np.full(n, int(k), np.int64)
    if k.shape != (n,):
        raise ValueError(f"n_targets: {k.shape[0]} counts for {n} sequences")
    bad = np.flatnonzero((k < 1) | (k >= lengths))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"sequence {i}: {int(k[i])} targets of {int(lengths[i])} tokens "
                         f"(at least 1, and at least one token before them)")
    if batch_rows is not None:
        batch_rows = _integer("batch_rows", batch_rows, 1)
    capacity = _capacity(capacity)
    if capacity is not None and int(lengths.max()) - 1 > capacity:
        i = int(np.argmax(lengths))
        raise ValueError(f"sequence {i}: its input of {int(lengths[i]) - 1} tokens exceeds "
                         f"capacity {capacity}")
    starts = np.cumsum(lengths) - lengths
    # The distinct inputs (each sequence but its last token), and how many last positions of
    # each are scored: the most any of its sequences asks.
    unique: Dict[bytes, int] = {}
    which = np.empty(n, np.int64)
    for i in range(n):
        key = tokens[starts[i]:starts[i] + lengths[i] - 1].tobytes()
        which[i] = unique.setdefault(key, len(unique))
    first = np.full(len(unique), n, np.int64)
    np.minimum.at(first, which, np.arange(n))
    need = np.zeros(len(unique), np.int64)
    np.maximum.at(need, which, k)
    u_len = lengths[first] - 1
    u_start = starts[first]
    if t.kernel == "varlen":
        plan_rows = [np.arange(len(unique))]
    else:
        plan = _prepack.plan(u_len, capacity=capacity, method=method)
        per = plan.n_rows if batch_rows is None else int(batch_rows)
        rb, rp = plan.row_begin, plan.row_prompts
        plan_rows = [rp[rb[r]:rb[min(r + per, plan.n_rows)]]
                     for r in range(0, plan.n_rows, per)]
        capacity = plan.capacity
    members = np.argsort(which, kind="stable")  # sequences grouped by input
    m_begin = np.searchsorted(which[members], np.arange(len(unique) + 1))
    out: List[Optional[Score]] = [None] * n
    bar = _Progress(len(plan_rows), "prepack.hf.score") if progress else None
    try:
        for us in plan_rows:
            us = np.sort(us)
            flat = np.concatenate([tokens[u_start[u]:u_start[u] + u_len[u]] for u in us])
            batch = _pack(t, _prepack.Prompts.from_flat(flat, u_len[us]), capacity, method)
            # Rows of the LM head: each input's last need[u] slots, in input order.
            nu = need[us]
            row0 = np.cumsum(nu) - nu
            slots = np.repeat(batch.last_token - nu + 1, nu) + \
                (np.arange(int(nu.sum())) - np.repeat(row0, nu))
            logits, _ = _forward(model, t, batch, False, slots)
            logp = torch.log_softmax(logits, dim=-1, dtype=softmax_dtype)
            # Every sequence of these inputs: its k targets, the last k of its input's rows.
            seqs = np.concatenate([members[m_begin[u]:m_begin[u + 1]] for u in us])
            pos = np.searchsorted(us, which[seqs])
            ks = k[seqs]
            end = row0[pos] + nu[pos]  # one past each sequence's input's last row
            rows = np.repeat(end - ks, ks) + (np.arange(int(ks.sum())) -
                                              np.repeat(np.cumsum(ks) - ks, ks))
            target = np.concatenate([tokens[starts[i] + lengths[i] - k[i]:starts[i] + lengths[i]]
                                     for i in seqs]).astype(np.int64)
            r = torch.from_numpy(rows).to(logp.device)
            tg = torch.from_numpy(target).to(logp.device)
            lp = logp[r, tg].cpu()
            gr = (logp[r].argmax(dim=-1) == tg).cpu()
            for i, a, b in zip(seqs.tolist(), (np.cumsum(ks) - ks).tolist(), np.cumsum(ks).tolist()):
                out[i] = Score(lp[a:b], gr[a:b])
            if bar is not None:
                bar.bar.update(1)
    finally:
        if bar is not None:
            bar.bar.close()
    return out  # type: ignore[return-value]


# -- generation --------------------------------------------------------------------------------


# Inputs of the model that generate makes from the prompts: given as well, model.generate would
# ignore them or mix them with the prefilled batch.
_MODEL_INPUTS = ("input_ids", "inputs", "inputs_embeds", "past_key_values", "cache",
                 "position_ids", "cache_position", "token_type_ids", "labels",
                 "decoder_input_ids")


class _Progress:
    """A stopping criterion that stops nothing and advances a tqdm bar a step per token."""

    def __init__(self, total: Optional[int], desc: str):
        try:
            from tqdm.auto import tqdm
        except ImportError as e:
            raise ImportError("progress=True needs tqdm (pip install tqdm)") from e
        self.bar = tqdm(total=total, desc=desc, unit="tok")

    def __call__(self, input_ids, scores, **kwargs):
        self.bar.update(1)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


@torch.no_grad()
def generate(model, prompts, max_new_tokens: Optional[int] = None, *, attention_mask=None,
             tokenizer=None, capacity: Optional[int] = None, method: str = "ffd",
             decode_batches: Union[int, str] = "auto", progress: bool = False,
             **generate_kwargs):
    """Continues every prompt: one prepacked prefill, then a batched ``model.generate`` from the
    left-padded batch cache: over all prompts in one batch on a GPU, in the length-sorted batches
    a decode step costs least in on a CPU (``decode_batches``).

    The prefill covers every prompt but its last token; generate runs that token first, so its
    logits pass through the generation config's processors like every other (sampling,
    repetition penalties, ...), and every generate argument works as in ``model.generate``:
    sampling, beams, ``num_return_sequences``, EOS and ``stopping_criteria`` / ``stop_strings``
    (with ``tokenizer=``), streamers, ``return_dict_in_generate`` and its scores. ``max_length``
    and ``min_length`` count each prompt's own tokens, as alone (with return_dict_in_generate or
    a streamer, max_length counts the left-padded batch's columns, as ``model.generate`` on a
    padded batch does: prefer ``max_new_tokens``). The processors that read the prompt
    (repetition penalty, ``no_repeat_ngram_size``, ``sequence_bias``, ``bad_words_ids``,
    ``forced_bos_token_id``, ``prefix_allowed_tokens_fn``) see each row without its left pads,
    so they act as on the prompt alone (``model.generate`` on a padded batch counts the pads);
    ``prefix_allowed_tokens_fn`` gets the prompt's index in ``prompts``. Stopping criteria and
    logits processors passed in see the padded rows.
    ``max_time`` bounds the whole call: the prefill and each decode batch count against it.
    ``generation_config`` is passed on; ``cache_implementation`` picks the class of the prefilled
    cache generate continues: a DynamicCache (None, "dynamic", "offloaded") or a StaticCache as
    large as ``model.generate`` makes it ("static", "offloaded_static"; ``max_cache_len``
    honoured); ``use_cache=False`` decodes from the prefilled cache all the same (the same
    tokens as recomputing every step, at the cost of a cached decode).

    decode_batches: "auto" (default, below), 1 or k > 1. 1 decodes every prompt in one batch, whose
    cache is as wide as the longest prompt. k > 1 sorts the prompts by length and decodes k batches
    of about n / k prompts one after another, each from its own cache only as wide as its longest
    prompt, all gathered from the one packed prefill: a decode step reads and copies each cache
    whole (for the concatenation and, under sdpa with grouped-query heads, once per query head), so
    where that traffic dominates a step (a CPU, heavy-tailed prompts) several narrow batches decode
    faster; where a step's fixed cost dominates (a GPU), one batch does. Outputs are the same (token
    lists only: return_dict_in_generate and streamers take one batch). "auto": on a CPU, the
    length-sorted batches that minimise a decode step's modelled cost, each batch a fixed cost (a
    pass over the weights) plus one per cached slot (its sequences times its columns, full-attention
    layers' keys and values, copied once for the concatenation and twice per query head; constants
    fitted on 2 CPU cores, see docs/python.md), chosen exactly over every split by length (O(L^2), L
    distinct lengths), so prompts of one length decode in one batch. It changes the time only: one
    batch on a GPU, and wherever the batching shows in the output or to what the caller passed:
    sampling (one batch draws as ``model.generate`` on the padded batch with the same seed; a split
    draws otherwise), return_dict_in_generate, a streamer, the caller's stopping_criteria or
    logits_processor (they get the batch's rows) and max_time (it bounds the whole call). With
    k > 1, sampled outputs depend on the batching.

    Returns, by default, a list of the new tokens of every returned sequence (n_prompts *
    num_return_sequences lists, prompt-major), each ending where generating it alone would stop
    (its EOS included); with ``return_dict_in_generate=True``, ``model.generate``'s own output for
    the left-padded batch (sequences [n * num_return_sequences, longest + new], scores, ...).
    Greedy fp32 output equals ``model.generate`` on each prompt alone, token for token.

    progress: a tqdm bar over the new tokens. Cost: the prefill (see prefill) plus the decode of
    ``model.generate``: per step, one forward of every sequence over its batch's cache.
    ValueError as prefill, and for decode_batches < 1 or > 1 with return_dict_in_generate or a
    streamer, for a cache_implementation the prefill cannot become ("quantized"), num_beams or
    num_return_sequences below 1, a pad_token_id outside the vocabulary (without one, the first
    EOS in the vocabulary pads, else 0) and a prompt not below max_length (without
    max_new_tokens); TypeError for a model input it makes from the prompts given too (input_ids,
    inputs_embeds, past_key_values or cache, position_ids, cache_position, token_type_ids,
    labels).

    Assisted decoding (``assistant_model``, ``prompt_lookup_num_tokens``, ``assistant_early_exit``)
    and ``token_healing`` run ``model.generate`` on each prompt alone, without the prefill:
    transformers' assisted decoding takes one sequence a call and does not continue a prefilled
    cache, and token healing rewrites the prompt's tail before generating.
    """
    began = time.monotonic()
    for name in _MODEL_INPUTS:
        if name in generate_kwargs:
            is_cache = name in ("past_key_values", "cache")
            why = ("it prefills the prompts' cache itself and continues no other (continue "
                   "prefill(...).cache with model.generate)" if is_cache else
                   "it makes the model's inputs from prompts (token ids, positions, the mask and "
                   "the prefilled cache)")
            raise TypeError(f"{name}: prepack.hf.generate takes no {name}: {why}")
    t = _target(model)
    ps = as_prompts(prompts, attention_mask=attention_mask, tokenizer=tokenizer,
                    vocab_size=t.vocab_size)
    if max_new_tokens is not None:
        generate_kwargs["max_new_tokens"] = _integer("max_new_tokens", max_new_tokens, 1)
    capacity = _capacity(capacity)
    auto = isinstance(decode_batches, str)
    if auto and decode_batches != "auto":
        raise ValueError(f"decode_batches {decode_batches!r}: an integer >= 1 or 'auto'")
    decode_batches = 1 if auto else _integer("decode_batches", decode_batches, 1)
    config, _ = model._prepare_generation_config(generate_kwargs.get("generation_config"),
                                                 **{k: v for k, v in generate_kwargs.items()
                                                    if k != "generation_config"})
    # The decode continues the prefilled cache, made in the class cache_implementation names
    # and passed to model.generate in its place (model.generate refuses both together).
    cache_form = _cache_form(config.cache_implementation)  # refused by name before anything runs
    if config.cache_implementation is not None or config.use_cache is False:
        generate_kwargs.update(cache_implementation=None, use_cache=True)
        generate_kwargs.pop("max_cache_len", None)
    n_batches = min(decode_batches, len(ps))
    # Assisted decoding takes one sequence a call and, in transformers, does not continue a
    # prefilled cache (from one its tokens differ from greedy decoding's): each prompt is
    # generated alone, from its prompt.
    # Token healing rewrites each prompt's tail before generating (re-tokenised, its last token
    # regenerated): the prefill of the prompt as given does not hold; each prompt runs alone too.
    assisted = (generate_kwargs.get("assistant_model") is not None
                or bool(getattr(config, "prompt_lookup_num_tokens", None))
                or bool(getattr(config, "assistant_early_exit", None)))
    healing = bool(getattr(config, "token_healing", False))
    alone = assisted or healing
    if alone:
        n_batches = len(ps)
    if n_batches > 1 and (config.return_dict_in_generate or generate_kwargs.get("streamer")):
        why = ("assisted decoding takes one prompt a call" if assisted else
               "token healing rewrites each prompt, generated alone" if healing else
               f"decode_batches {decode_batches}")
        raise ValueError(f"{why}: return_dict_in_generate and streamers take one batch "
                         f"(decode_batches=1)")
    if tokenizer is not None:
        generate_kwargs.setdefault("tokenizer", tokenizer)
    # generate expands the prompts (and so must the cache) num_beams times under beam search,
    # num_return_sequences times otherwise; it returns num_return_sequences per prompt.
    def setting(name):
        value = getattr(config, name)
        return 1 if value is None else _integer(name, value, 1)

    returned, beams = setting("num_return_sequences"), setting("num_beams")
    expand = max(beams, returned)
    # The pad fills the decode batch's left columns and follows finished sequences into the
    # model's embedding: a token of the vocabulary. Without one, the first EOS that is one (as
    # model.generate takes EOS), else 0.
    given = config.eos_token_id
    eos = [] if given is None else given.reshape(-1).tolist() if isinstance(
        given, torch.Tensor) else list(given) if isinstance(given, (list, tuple)) else [given]
    if not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= 0
               for x in eos):
        raise TypeError(f"eos_token_id: {given!r}; a token id (an integer >= 0) or a list of "
                        f"them expected")
    pad_id = config.pad_token_id
    if pad_id is None:
        pad_id = next((int(e) for e in eos if 0 <= int(e) < t.vocab_size), 0)
        generate_kwargs["pad_token_id"] = pad_id
    pad_id = _integer("pad_token_id", pad_id.item() if isinstance(pad_id, torch.Tensor)
                      else pad_id, 0, t.vocab_size)

    tokens, lengths = ps.flat()
    # New tokens a decode batch generates. Without max_new_tokens, max_length bounds each
    # sequence as it bounds the prompt alone (max_length - its length new tokens), where
    # model.generate on a padded batch would count the batch's columns: the batch runs to its
    # shortest prompt's bound and each sequence is cut at its own (return_dict_in_generate and
    # streamers show the padded batch: there max_length counts its columns).
    room = None
    if config.max_new_tokens is None and not (config.return_dict_in_generate
                                              or generate_kwargs.get("streamer")):
        room = int(config.max_length) - lengths.astype(np.int64)
        over = np.flatnonzero(room <= 0)
        if len(over):
            i = int(over[0])
            raise ValueError(f"prompt {i}: length {int(lengths[i])} is not below max_length "
                             f"{config.max_length} (model.generate refuses it alone): set "
                             f"max_new_tokens")
        generate_kwargs.pop("max_length", None)
    # Every prompt but its last token, packed and prefilled once.
    heads = lengths - 1
    present = np.full(len(ps), -1, np.int64)
    present[heads > 0] = np.arange(int((heads > 0).sum()))
    rows = None
    if (heads > 0).any() and not alone:
        keep = np.ones(len(tokens), bool)
        keep[np.cumsum(lengths) - 1] = False
        batch = _pack(t, _prepack.Prompts.from_flat(tokens[keep], heads[heads > 0]), capacity,
                      method)
        _, rows = _forward(model, t, batch, True, None, progress)
        packed = batch.left_padded_slots()
    # The decode batches: prompt indices, by length when there are several. "auto" splits only
    # where the split changes nothing but the time: no sampling (its draws follow the batch's
    # rows: one batch draws as model.generate on the padded batch), no streamer or returned
    # batch, no stopping criteria or logits processors of the caller's (they get the batch's
    # rows by position), no max_time (it bounds the whole call).
    if (auto and rows is not None and t.device.type == "cpu" and len(ps) > 1
            and not (config.return_dict_in_generate or generate_kwargs.get("streamer")
                     or config.do_sample
                     or generate_kwargs.get("stopping_criteria")
                     or generate_kwargs.get("logits_processor")
                     or config.max_time is not None)):
        fixed = _fixed_step_slots(model, t, rows) / expand
        groups = _decode_groups(lengths, fixed, (config.max_new_tokens or 0) / 2)
    else:
        order = np.argsort(lengths, kind="stable") if n_batches > 1 else np.arange(len(ps))
        groups = [g for g in np.array_split(order, n_batches)]
    if room is not None and beams > 1:
        # A beam search's result depends on its length bound, not only its prefix: each decode
        # batch holds prompts of one length, so each runs to its own max_length.
        groups = [g[lengths[g] == n] for g in groups for n in np.unique(lengths[g])]
    steps = [config.max_new_tokens if room is None else int(room[g].max()) for g in groups]
    caches: List[Any] = [None] * len(groups)
    if rows is not None:
        for k, g in enumerate(groups):
            columns = int(lengths[g].max()) - 1
            if columns > 0:
                # model.generate's own size for a static cache: its max_length - 1.
                last = columns + 1 + steps[k] if steps[k] is not None else config.max_length
                form = dataclasses.replace(cache_form,
                                           length=max(last - 1, config.max_cache_len or 0))
                caches[k] = _batch_cache(model, t, rows, batch, present[g], columns, expand,
                                         free=k == len(groups) - 1, packed=packed, form=form)
        del rows
    starts = np.cumsum(lengths) - lengths
    total = sum(steps) if all(n is not None for n in steps) else None
    bar = _Progress(total, "prepack.hf.generate") if progress else None
    out: List[Any] = [None] * len(ps)
    try:
        for k, g in enumerate(groups):
            columns = int(lengths[g].max())
            flat = np.concatenate([tokens[starts[i]:starts[i] + lengths[i]] for i in g])
            ids, mask = _left_padded(flat, lengths[g], columns, pad_id, t.device)
            kwargs = dict(generate_kwargs)
            if config.max_time is not None:
                # max_time bounds the whole call, as it bounds model.generate's: the prefill and
                # the batches before this one count against it.
                kwargs["max_time"] = max(float(config.max_time) - (time.monotonic() - began), 0.0)
            if room is not None:
                kwargs["max_new_tokens"] = steps[k]
            if caches[k] is not None:
                kwargs[t.cache_argument] = caches[k]
                caches[k] = None
            if kwargs.get("prefix_allowed_tokens_fn") is not None:
                kwargs["prefix_allowed_tokens_fn"] = _prefix_fn(
                    kwargs["prefix_allowed_tokens_fn"], g, lengths[g], columns, expand, beams)
            if bar is not None:
                from transformers import StoppingCriteriaList

                kwargs["stopping_criteria"] = StoppingCriteriaList(
                    [*(kwargs.get("stopping_criteria") or []), bar])
            with _unpadded_processors(model, lengths[g], columns,
                                      None if room is None else int(config.max_length)):
                result = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
            if config.return_dict_in_generate:
                return result
            new = _new_tokens(result, columns, config, generate_kwargs)
            for j, i in enumerate(g):
                out[i] = new[j * returned:(j + 1) * returned]
                if room is not None:
                    out[i] = [seq[:int(room[i])] for seq in out[i]]
    finally:
        if bar is not None:
            bar.bar.close()
    return [seq for per_prompt in out for seq in per_prompt]


def _fixed_step_slots(model, t: _Target, rows_cache) -> float:
    """A decode step's cost per batch that does not grow with its cache, in cached slots: one
    pass over the weights (their bytes, the input embedding left out unless the output layer
    reads it, streamed 3.7x cheaper a byte than the cache) and about 0.35 ms of dispatch a layer
    (2.2 MB at the 6.3 GB/s the cache traffic ran at), against a slot's traffic, its
    full-attention keys and values copied once for the concatenation and twice per query head
    (sdpa's and eager's repeat over grouped heads). Fitted on 2 CPU cores: a step of
    bench/bench_hf.py's large shape, 64 heavy-tailed prompts, took 0.53 s in one batch and 0.285 s
    in four, and its tiny, small and large shapes 1.0, 9.7 and 22 ms at one sequence. inf where no
    layer's cache grows with the prompt (all sliding)."""
    full = [i for i, kind in enumerate(t.layer_types) if t.windows[kind] is None]
    layers = rows_cache.layers
    slot = sum(x.shape[1] * x.shape[-1] * x.element_size()
               for i in full for x in (layers[i].keys, layers[i].values))
    if slot == 0:
        return float("inf")
    kv_heads = layers[full[0]].keys.shape[1]
    heads = getattr(_text_config(model), "num_attention_heads", None)
    repeat = heads / kv_heads if isinstance(heads, int) and heads >= kv_heads > 0 else 1.0
    weight = sum(p.numel() * p.element_size() for p in model.parameters())
    emb, out = model.get_input_embeddings(), model.get_output_embeddings()
    if getattr(emb, "weight", None) is not None and getattr(out, "weight", None) is not emb.weight:
        weight -= emb.weight.numel() * emb.weight.element_size()
    return (weight / 3.7 + 2.2e6 * len(t.layer_types)) / (slot * (1 + 2 * repeat))


def _decode_groups(lengths: np.ndarray, fixed: float, extra: float) -> List[np.ndarray]:
    """Prompt indices in length-sorted groups minimising len(groups) * fixed + the sum over
    groups of (its prompts) * (its longest length + extra): exact over every split between
    distinct lengths (a group boundary inside one length never helps), O(L^2) for L of them."""
    order = np.argsort(lengths, kind="stable")
    width, count = np.unique(lengths[order], return_counts=True)
    ahead = np.concatenate([[0], np.cumsum(count)]).astype(np.float64)
    best = np.zeros(len(width) + 1)
    cut = np.zeros(len(width) + 1, np.int64)
    for j in range(1, len(width) + 1):
        cost = best[:j] + fixed + (ahead[j] - ahead[:j]) * (float(width[j - 1]) + extra)
        cut[j] = int(np.argmin(cost))
        best[j] = cost[cut[j]]
    bounds, j = [], len(width)
    while j > 0:
        bounds.append(int(ahead[j]))
        j = int(cut[j])
    return np.split(order, sorted(bounds)[:-1])


class _Unpadded:
    """One of generate's logits processors that reads the prompt (repetition penalty, n-gram
    bans, sequence biases, bad words), called as if no row had left pads: the pad columns are
    filled, row by row, with a token that changes nothing for that processor, so each row is
    processed as its prompt alone would be. ``fill`` is "first" (the row's first real token: the
    repetition penalty reads the set of tokens seen, which it leaves unchanged) or "never" (-1,
    which no n-gram, sequence or bad word matches); "length" (min_length) bans EOS in each row
    shorter than min_length without its pads; "bos" (forced_bos_token_id) forces BOS at the first
    step of each row of one token without its pads, as alone; "eos" (forced_eos_token_id under a
    max_length that bounds each row on its own) forces EOS at each row's own last step. Cost per
    step: one [rows, longest pad] select, or for "bos" / "eos" one [rows, vocab] select against
    a forced row made once."""

    def __init__(self, inner, pads: torch.Tensor, fill: str, max_length: Optional[int] = None):
        self.inner, self.pads, self.fill, self.max_length = inner, pads, fill, max_length
        self.width = int(pads.max())
        self._rows: Dict[Tuple[torch.device, int], Tuple[torch.Tensor, torch.Tensor]] = {}
        self._row: Optional[Tuple[Tuple[torch.device, torch.dtype, int], torch.Tensor]] = None

    def _forced(self, scores: torch.Tensor) -> torch.Tensor:
        """[vocab]: -inf but 0 on the forced token(s), made once per device, dtype and vocab."""
        key = (scores.device, scores.dtype, scores.shape[-1])
        if self._row is None or self._row[0] != key:
            row = torch.full(scores.shape[-1:], -math.inf, dtype=scores.dtype,
                             device=scores.device)
            row[self.inner.bos_token_id if self.fill == "bos" else
                self.inner.eos_token_id.to(scores.device)] = 0
            self._row = (key, row)
        return self._row[1]

    def _row_pads(self, device, rows: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """(pads [rows], pad columns [rows, width]) for generate's rows (each prompt's rows
        together), made once per device and row count."""
        key = (device, rows)
        if key not in self._rows:
            pads = self.pads.to(device).repeat_interleave(rows // len(self.pads))
            cols = torch.arange(self.width, device=device)[None, :] < pads[:, None]
            self._rows[key] = pads, cols
        return self._rows[key]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        pads, pad = self._row_pads(input_ids.device, input_ids.shape[0])
        if self.fill == "length":  # MinLengthLogitsProcessor, each row's own length
            short = input_ids.shape[-1] - pads < self.inner.min_length
            eos = torch.isin(torch.arange(scores.shape[-1], device=scores.device),
                             self.inner.eos_token_id.to(scores.device))
            return torch.where(short[:, None] & eos[None, :], -float("inf"), scores)
        if self.fill in ("bos", "eos"):
            # ForcedBOSTokenLogitsProcessor: a one-token row's first step;
            # ForcedEOSTokenLogitsProcessor: each row's own last step under max_length.
            own = input_ids.shape[-1] - pads
            last = 1 if self.fill == "bos" else int(self.max_length or 0) - 1
            at: torch.Tensor = own == last
            return torch.where(at[:, None], self._forced(scores)[None, :], scores)
        if self.fill == "first":
            filler = input_ids.gather(1, pads[:, None])
        else:
            filler = torch.full_like(pads[:, None], -1)
        head = torch.where(pad, filler, input_ids[:, :self.width])
        return self.inner(torch.cat([head, input_ids[:, self.width:]], 1), scores)


def _unpadded_processors(model, lengths: np.ndarray, columns: int,
                         max_length: Optional[int] = None):
    """A context in which ``model.generate`` builds its prompt-reading logits processors as
    ``_Unpadded`` ones (same processors, same order) for a batch left-padded to ``columns``.
    max_length: each row's own bound on its length, where the batch runs to its shortest
    prompt's (the forced EOS then comes at each row's own last step). Nothing changes where no
    row is padded."""
    from transformers.generation import logits_process as lp

    fills = {lp.RepetitionPenaltyLogitsProcessor: "first",
             lp.NoRepeatNGramLogitsProcessor: "never",
             lp.SequenceBiasLogitsProcessor: "never",
             lp.NoBadWordsLogitsProcessor: "never",
             lp.MinLengthLogitsProcessor: "length",
             lp.ForcedBOSTokenLogitsProcessor: "bos"}
    if max_length is not None:
        fills[lp.ForcedEOSTokenLogitsProcessor] = "eos"
    pads = torch.from_numpy(columns - lengths.astype(np.int64))

    @contextlib.contextmanager
    def scope():
        if not pads.any():
            yield
            return
        own = vars(model).get("_get_logits_processor")
        build = model._get_logits_processor

        def get_logits_processor(*args, **kwargs):
            procs = build(*args, **kwargs)
            return type(procs)(_Unpadded(p, pads, fills[type(p)], max_length)
                               if type(p) in fills else p for p in procs)

        model._get_logits_processor = get_logits_processor
        try:
            yield
        finally:
            if own is None:
                del model._get_logits_processor
            else:
                model._get_logits_processor = own

    return scope()


def _prefix_fn(fn, group: np.ndarray, lengths: np.ndarray, columns: int, expand: int,
               num_beams: int):
    """``prefix_allowed_tokens_fn`` for one decode batch: called with the batch index that
    ``model.generate`` on all the prompts, in the caller's order, would pass, and the row
    without its left pads."""

    def allowed(batch_id: int, sent: torch.Tensor):
        row = batch_id * num_beams
        p, within = divmod(row, expand)
        caller = (int(group[p]) * expand + within) // num_beams
        return fn(caller, sent[columns - int(lengths[p]):])

    return allowed


def _new_tokens(sequences: torch.Tensor, columns: int, config, kwargs) -> List[List[int]]:
    """Each sequence's new tokens up to where generating it alone stops: its first EOS
    (included), or the first step a stopping criterion or stop string fires (evaluated again on
    each sequence's prefix, as generate evaluated it)."""
    new = sequences[:, columns:]
    n, steps = new.shape
    stop = torch.full((n,), steps, dtype=torch.long)
    eos = config.eos_token_id
    if eos is not None:
        eos_ids = torch.tensor(eos if isinstance(eos, (list, tuple)) else [eos],
                               device=new.device).reshape(-1)
        hit = torch.isin(new, eos_ids).cpu()
        first = torch.where(hit.any(1), hit.int().argmax(1) + 1, steps)
        stop = torch.minimum(stop, first)
    criteria = list(kwargs.get("stopping_criteria") or [])
    if kwargs.get("stop_strings"):
        from transformers import StopStringCriteria

        criteria.append(StopStringCriteria(kwargs["tokenizer"], config.stop_strings))
    if criteria:
        done = torch.zeros(n, dtype=torch.bool)
        for s in range(steps):
            fired = torch.zeros(n, dtype=torch.bool, device=sequences.device)
            for c in criteria:
                fired |= c(sequences[:, :columns + s + 1], None).to(sequences.device)
            fired = fired.cpu() & ~done
            stop = torch.where(fired, torch.minimum(stop, torch.tensor(s + 1)), stop)
            done |= fired
    rows = new.cpu().tolist()
    return [row[:int(k)] for row, k in zip(rows, stop.tolist())]
