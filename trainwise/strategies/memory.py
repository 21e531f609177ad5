"""Strategies that trade compute for activation memory."""

from trainwise.strategies.base import Strategy

STRATEGIES = [
    Strategy(
        "grad_accum",
        "same effective batch as batch/N x N micro-steps; activation memory ~1/N, "
        "step time up a little (smaller, less efficient matmuls)",
        lambda plan, n: plan.with_(accum_steps=n),
    ),
    Strategy(
        "grad_ckpt",
        "recompute activations in backward; ~-40..-60% activation memory, ~+20..40% step time",
        lambda plan, _n: plan.with_(grad_ckpt=True),
    ),
]
