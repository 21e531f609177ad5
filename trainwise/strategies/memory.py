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
    Strategy(
        "offload_activations",
        "keep the activations saved for backward in pinned CPU memory (torch save_on_cpu); activation "
        "memory on the GPU down, step time up with PCIe traffic",
        lambda plan, _n: plan.with_(offload_activations=True),
        conflicts=frozenset({"grad_ckpt"}),
        requires=frozenset({"cuda"}),
    ),
    Strategy(
        "empty_cache",
        "torch.cuda.empty_cache() every N steps (empty_cache=N, default 4; HF torch_empty_cache_steps) for "
        "lower reserved memory and fragmentation; slower steps after each release",
        lambda plan, _n: plan.with_(empty_cache_steps=4),
        requires=frozenset({"cuda"}),
        with_value=lambda plan, n: plan.with_(empty_cache_steps=n),
    ),
]
