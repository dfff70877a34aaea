"""prepack: prepacking for LLM prefill, from Python.

Prompts of very different lengths, bin-packed into rows (first-fit-decreasing) with a
block-diagonal causal mask and position ids that restart for every prompt, prefilled at once and
unpacked into per-prompt caches; and, for engines that never pad, budgeted steps over a paged KV
pool in each engine's own form, and a serving scheduler. Everything here is prepack's C++ (the
``_prepack`` module); arrays come back as numpy arrays without a copy.

    >>> import prepack
    >>> batch = prepack.pack([[1, 2, 3, 4, 5], [6, 7], [8, 9, 10]])
    >>> batch.input_ids            # [n_rows, width] int64: [[1 2 3 4 5], [8 9 10 6 7]]
    >>> batch.mask().shape         # (2, 1, 5, 5): transformers' 4D attention_mask

``prepack.hf`` prefills a list of prompts on a Hugging Face transformers model with packed rows
and returns each prompt's last-token logits and its own cache (it imports torch and transformers
when imported itself).
"""

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
    __version__,
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
