"""prepack: prepacking for LLM prefill, from Python.

Prompts of very different lengths, bin-packed into rows (first-fit-decreasing) with a
block-diagonal causal mask and position ids that restart for every prompt, prefilled at once and
unpacked into per-prompt caches; and, for engines that never pad, budgeted steps over a paged KV
pool in each engine's own form, and a serving scheduler. Everything here is prepack's C++ (the
``_prepack`` module); arrays come back as numpy arrays without a copy.

    >>> import prepack
    >>> batch = prepack.pack([[1, 2, 3, 4, 5], [6, 7], [8, 9, 10]])
    >>> batch
    PackedBatch(3 prompts in 2 rows of 5, 10 tokens)
    >>> batch.input_ids.tolist()             # [n_rows, width] int64
    [[1, 2, 3, 4, 5], [8, 9, 10, 6, 7]]
    >>> batch.position_ids.tolist()          # restarting at 0 for every prompt
    [[0, 1, 2, 3, 4], [0, 1, 2, 0, 1]]
    >>> batch.mask().shape                   # transformers' 4D attention_mask
    (2, 1, 5, 5)
    >>> batch.varlen()["cu_seqlens"].tolist()  # FlashAttention's varlen form (int32)
    [0, 5, 8, 10]

``prepack.hf`` prefills prompts on a Hugging Face transformers model with packed rows and returns
each prompt's last-token logits and caches in the form decoding needs, and generates from them in
one batch (it imports torch and transformers when imported itself).
"""

from . import _prepack
from ._prepack import (
    BlockAllocator,
    BlockPool,
    BlockTables,
    FinishedRequest,
    PackedBatch,
    Plan,
    PrefixPlan,
    Prompts,
    ScheduledStep,
    Schedule,
    Scheduler,
    StepInputs,
    budgeted_schedule,
    decode_inputs,
    fitted_plan,
    flashinfer,
    llama_cpp,
    pack,
    plan,
    prefix_plan,
    sglang,
    sequence_inputs,
    step_inputs,
    step_layout,
    trtllm,
    vllm,
)


# The module sets it at import (nanobind's stub generator leaves plain attributes out).
__version__: str = getattr(_prepack, "__version__")

__all__ = [
    "BlockAllocator",
    "BlockPool",
    "BlockTables",
    "FinishedRequest",
    "PackedBatch",
    "Plan",
    "PrefixPlan",
    "Prompts",
    "ScheduledStep",
    "Schedule",
    "Scheduler",
    "StepInputs",
    "__version__",
    "budgeted_schedule",
    "decode_inputs",
    "fitted_plan",
    "flashinfer",
    "llama_cpp",
    "pack",
    "plan",
    "prefix_plan",
    "sglang",
    "sequence_inputs",
    "step_inputs",
    "step_layout",
    "trtllm",
    "vllm",
]
