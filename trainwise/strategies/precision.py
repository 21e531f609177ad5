"""Numerics and kernels: precision of forward/backward (weights and optimizer states stay fp32),
attention implementation, and torch.compile."""

from trainwise.strategies.base import IMAGE_TASKS, TEXT_TASKS, Strategy

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
    Strategy(
        "sdpa",
        "attention through torch scaled_dot_product_attention (flash / memory-efficient kernels on CUDA); "
        "the transformers 5 default where a model supports it, so vs baseline often ~100%",
        lambda plan, _n: plan.with_(attn="sdpa"),
        tasks=TEXT_TASKS,
        conflicts=frozenset({"eager_attn"}),
    ),
    Strategy(
        "eager_attn",
        "attention as plain matmul + softmax (the pre-2.0 path, every model has it); materialises the "
        "L x L score matrix: the reference sdpa is measured against",
        lambda plan, _n: plan.with_(attn="eager"),
        tasks=TEXT_TASKS,
        conflicts=frozenset({"sdpa"}),
    ),
    Strategy(
        "compile",
        "torch.compile the model: fused kernels, faster steady steps; the compile itself (tens of seconds, "
        "again for each new input shape) is reported apart as compile (s)",
        lambda plan, _n: plan.with_(compile=True),
    ),
    Strategy(
        "channels_last",
        "images: NHWC memory format for the convolutions (what cuDNN's fast kernels, tensor cores "
        "and oneDNN prefer); a layout change, no numeric change",
        lambda plan, _n: plan.with_(channels_last=True),
        tasks=IMAGE_TASKS,
    ),
]
