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
    Strategy(
        "tf32",
        "TF32 tensor cores for fp32 matmuls/convolutions (Ampere+); ~2-3x faster fp32 matmuls, 10-bit "
        "mantissa inside them; CUDA only",
        lambda plan, _n: plan.with_(tf32=True),
        requires=frozenset({"cuda"}),
    ),
]
