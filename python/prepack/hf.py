"""Prepacked prefill on Hugging Face transformers causal LMs: the Prepacking paper's system in
its own setting.

``prefill(model, prompts)`` packs the prompts into rows (first-fit-decreasing), runs the model
once over the rows with a block-diagonal causal 4D attention mask and position ids that restart
at 0 for every prompt, and returns each prompt's last-token logits and its own KV cache as the
model's cache type (``DynamicCache``), exactly what running the prompt alone gives, up to float
rounding. ``generate`` continues every prompt greedily from those caches; ``padded_prefill`` is
the baseline (what ``model.generate`` does: left padding and a 2D mask).

The mask is transformers' own 4D convention (``PackedBatch.fill_mask``): additive, in the model's
dtype, 0 where a query may attend and ``torch.finfo(dtype).min`` elsewhere (a finite minimum:
eager attention adds the mask to the scores, and an infinity or an empty row gives NaN), every
pad query attending to its own slot. It works under ``attn_implementation`` "eager" and "sdpa".
Kernels that ignore a 4D mask (flash_attention_2 reads position ids instead) are refused.

Only the model's forward pass runs in torch; planning, packing, the mask and the unpacking of
every cache are prepack's C++. Importing this module imports torch and transformers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Union

import torch

from . import _prepack

__all__ = ["PrefillResult", "pack_inputs", "prefill", "unpack_caches", "generate", "padded_prefill"]

_MASKED_ATTENTION = ("eager", "sdpa")


@dataclass
class PrefillResult:
    """What a prefill gives, prompt by prompt, in the prompts' order."""

    logits: torch.Tensor
    """[n_prompts, vocab]: each prompt's last-token logits, in the model's dtype."""
    caches: List[Any]
    """n_prompts caches of the model's type (DynamicCache), prompt i's holding exactly its
    length positions: keys and values [1, kv_heads, length, head_dim] in every layer."""
    batch: Optional[_prepack.PackedBatch] = None
    """The packed rows that were run (None for padded_prefill)."""

    def next_tokens(self) -> torch.Tensor:
        """[n_prompts] int64: the greedy next token of every prompt."""
        return self.logits.argmax(dim=-1)


def _as_prompts(prompts) -> _prepack.Prompts:
    if isinstance(prompts, _prepack.Prompts):
        return prompts
    if isinstance(prompts, torch.Tensor):
        prompts = list(prompts)
    return _prepack.Prompts([p.tolist() if isinstance(p, torch.Tensor) else p for p in prompts])


def _check_attention(model) -> None:
    impl = getattr(model.config, "_attn_implementation", None)
    if impl is not None and impl not in _MASKED_ATTENTION:
        raise ValueError(
            f"attn_implementation {impl!r} does not take a 4D attention mask: load the model "
            f"with attn_implementation 'eager' or 'sdpa' to prefill packed rows")


def _dtype(model) -> torch.dtype:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def pack_inputs(model, prompts, *, capacity: Optional[int] = None, method: str = "ffd"):
    """Packs prompts for ``model``: returns (PackedBatch, inputs), inputs a dict of torch
    tensors on the model's device for ``model(**inputs)``: input_ids and position_ids [n_rows,
    width] int64, attention_mask [n_rows, 1, width, width] in the model's dtype (see the module
    docstring). ValueError as prepack.pack does ("prompt 7: length 0")."""
    batch = _prepack.pack(_as_prompts(prompts), capacity=capacity, method=method)
    device = model.device
    mask = torch.empty((batch.n_rows, 1, batch.width, batch.width), dtype=_dtype(model))
    batch.fill_mask(mask)
    inputs = {
        "input_ids": torch.tensor(batch.input_ids, device=device),
        "position_ids": torch.tensor(batch.position_ids, device=device),
        "attention_mask": mask.to(device),
    }
    return batch, inputs


def _layers(cache):
    """(keys, values) of every layer of a transformers cache (DynamicCache and its kin)."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


def _new_cache(model):
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:  # transformers before the config argument
        return DynamicCache()


def unpack_caches(model, batch: _prepack.PackedBatch, past, torch_slicing: bool = False):
    """Every prompt's cache out of the packed rows' ``past_key_values``: a list of the model's
    cache type (DynamicCache), prompt i's holding keys and values [1, kv_heads, length_i,
    head_dim] in every layer. On CPU tensors prepack's unpacker copies them (one C++ call per
    layer and K / V: PackedBatch.unpack); elsewhere (a GPU) each prompt's slice is copied in
    torch. Frees each packed layer once it is copied (``past`` is emptied)."""
    n = batch.n_prompts
    caches = [_new_cache(model) for _ in range(n)]
    rows = batch.prompt_row.tolist()
    offsets = batch.prompt_offset.tolist()
    lengths = batch.prompt_length.tolist()
    layers = past.layers if hasattr(past, "layers") else None
    for li, (k, v) in enumerate(_layers(past)):
        if k.device.type == "cpu" and not torch_slicing:
            ks = batch.unpack(k, axis=2)  # n tensors [kv_heads, length, head_dim]
            vs = batch.unpack(v, axis=2)
        else:
            ks = [k[r, :, o:o + L].clone() for r, o, L in zip(rows, offsets, lengths)]
            vs = [v[r, :, o:o + L].clone() for r, o, L in zip(rows, offsets, lengths)]
        if layers is not None:
            layers[li].keys = layers[li].values = None
        for i in range(n):
            caches[i].update(ks[i].unsqueeze(0), vs[i].unsqueeze(0), li)
    return caches


@torch.no_grad()
def prefill(model, prompts, *, capacity: Optional[int] = None, method: str = "ffd",
            return_caches: bool = True) -> PrefillResult:
    """Prefills prompts (a sequence of token-id sequences: lists, arrays, tensors, or a
    prepack.Prompts) on a transformers causal LM with prepacked rows, in one forward pass.

    capacity: slots per row (default: the longest prompt, as in the paper); method: 'ffd'
    (first-fit-decreasing) or 'bfd'. Returns a PrefillResult: logits [n_prompts, vocab] of each
    prompt's last token and, with return_caches, each prompt's cache (DynamicCache of exactly its
    positions), equal to running the prompt alone up to float rounding. Only last-token rows go
    through the LM head (a pre-hook on the output embeddings gathers them). ValueError for an
    empty prompt, a capacity below a prompt, or an attention implementation that ignores 4D
    masks.
    """
    _check_attention(model)
    batch, inputs = pack_inputs(model, prompts, capacity=capacity, method=method)
    last = torch.tensor(batch.last_token, device=model.device)

    def gather_last(module, args):
        hidden = args[0]  # [n_rows, width, hidden]
        return (hidden.reshape(-1, hidden.shape[-1])[last].unsqueeze(0),) + tuple(args[1:])

    hook = model.get_output_embeddings().register_forward_pre_hook(gather_last)
    try:
        out = model(**inputs, use_cache=return_caches)
    finally:
        hook.remove()
    logits = out.logits[0]
    caches = unpack_caches(model, batch, out.past_key_values) if return_caches else []
    return PrefillResult(logits=logits, caches=caches, batch=batch)


@torch.no_grad()
def padded_prefill(model, prompts, *, pad_token_id: int = 0,
                   return_caches: bool = True) -> PrefillResult:
    """The baseline: the prompts padded on the left to the longest, a 2D attention mask and
    position ids from it, as ``model.generate`` prefills a batch; logits of the last slot only.
    Returns per-prompt caches too (each prompt's positions cut out of its padded row)."""
    lists = [list(p) for p in _as_prompts(prompts)]
    width = max(len(p) for p in lists)
    ids = torch.full((len(lists), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(lists), width), dtype=torch.long)
    for i, p in enumerate(lists):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
                position_ids=position_ids.to(model.device), use_cache=return_caches,
                logits_to_keep=1)
    caches = []
    if return_caches:
        caches = [_new_cache(model) for _ in lists]
        for li, (k, v) in enumerate(_layers(out.past_key_values)):
            for i, p in enumerate(lists):
                caches[i].update(k[i:i + 1, :, width - len(p):].clone(),
                                 v[i:i + 1, :, width - len(p):].clone(), li)
    return PrefillResult(logits=out.logits[:, -1], caches=caches)


@torch.no_grad()
def generate(model, prompts, max_new_tokens: int, *, capacity: Optional[int] = None,
             method: str = "ffd", **generate_kwargs) -> List[List[int]]:
    """Greedy continuations of every prompt: a prepacked prefill, the first token from its
    logits, then ``model.generate`` continuing each prompt from its own cache (which covers the
    prompt; transformers computes only the tokens past the cache). Returns max_new_tokens token
    ids per prompt (fewer when generation stops at an end-of-sequence token)."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens {max_new_tokens} (at least 1)")
    ps = _as_prompts(prompts)
    result = prefill(model, ps, capacity=capacity, method=method)
    first = result.next_tokens().tolist()
    out = []
    generate_kwargs.setdefault("do_sample", False)
    for i in range(len(ps)):
        prompt = ps[i].tolist()
        if max_new_tokens == 1:
            out.append([first[i]])
            continue
        ids = torch.tensor([prompt + [first[i]]], device=model.device)
        g = model.generate(ids, attention_mask=torch.ones_like(ids),
                           past_key_values=result.caches[i], max_new_tokens=max_new_tokens - 1,
                           **generate_kwargs)
        out.append(g[0, len(prompt):].tolist())
    return out
