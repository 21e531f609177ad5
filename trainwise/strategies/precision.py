"""Numeric precision of forward/backward (weights and optimizer states stay fp32)."""

from trainwise.strategies.base import Strategy

STRATEGIES = [
    Strategy(
        "bf16",
        "bf16 autocast for matmuls/activations; less activation memory, faster where bf16 units exist "
        "(~25% on this CPU), small numeric drift",
        lambda plan, _n: plan.with_(precision="bf16"),
        conflicts=frozenset({"fp16"}),
        requires=frozenset({"bf16"}),
    ),
    Strategy(
        "fp16",
        "fp16 autocast + dynamic GradScaler; ~2x faster on tensor-core GPUs, less activation memory; "
        "CUDA only (reported 'unsupported' on CPU, never silently fp32)",
        lambda plan, _n: plan.with_(precision="fp16"),
        conflicts=frozenset({"bf16"}),
        requires=frozenset({"cuda", "fp16"}),
    ),
]
