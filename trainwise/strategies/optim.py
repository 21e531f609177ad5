"""Optimizer choice."""

from trainwise.strategies.base import Strategy

STRATEGIES = [
    Strategy(
        "adafactor",
        "Adafactor (factored second moments, no first moment) instead of AdamW; optimizer state "
        "~8 bytes/param -> ~0, may converge differently",
        lambda plan, _n: plan.with_(optimizer="adafactor"),
        conflicts=frozenset({"adamw_foreach", "adamw_fused", "adamw_8bit"}),
    ),
    Strategy(
        "adamw_foreach",
        "AdamW updating all tensors per op (multi-tensor kernels); fewer kernel launches, faster on GPU; "
        "a temporary copy of every state during the step",
        lambda plan, _n: plan.with_(optimizer="adamw_foreach"),
        conflicts=frozenset({"adafactor", "adamw_fused", "adamw_8bit"}),
    ),
    Strategy(
        "adamw_fused",
        "AdamW as one fused kernel per step (torch fused=True, CPU and CUDA); fastest optimizer step, "
        "no temporaries; same math",
        lambda plan, _n: plan.with_(optimizer="adamw_fused"),
        conflicts=frozenset({"adafactor", "adamw_foreach", "adamw_8bit"}),
    ),
    Strategy(
        "adamw_8bit",
        "bitsandbytes 8-bit AdamW: optimizer state 8 -> ~2 bytes/param; CUDA only, slight numeric drift",
        lambda plan, _n: plan.with_(optimizer="adamw_8bit"),
        conflicts=frozenset({"adafactor", "adamw_foreach", "adamw_fused"}),
        requires=frozenset({"cuda"}),
        packages=frozenset({"bitsandbytes"}),
    ),
]
