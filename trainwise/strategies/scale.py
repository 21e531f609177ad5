"""DeepSpeed ZeRO: partition the training state over the data-parallel ranks (`--nproc`).

Run through Accelerate's DeepSpeed plugin, under torchrun (on CPU with DS_ACCELERATOR=cpu and gloo).
With one rank ZeRO partitions nothing; it is still a row, so its overhead shows.
"""

from trainwise.strategies.base import Strategy

ZERO = ("zero1", "zero2", "zero3", "zero2_offload", "zero3_offload")
_OTHER_OPTIMIZERS = frozenset({"adafactor", "adamw_foreach", "adamw_fused", "adamw_8bit"})


def _zero(name: str, stage: int, offload: str, summary: str) -> Strategy:
    conflicts = frozenset(ZERO) - {name}
    if offload != "none":  # the offloaded step runs DeepSpeed's CPU Adam
        conflicts |= _OTHER_OPTIMIZERS
    return Strategy(
        name,
        summary,
        lambda plan, _n: plan.with_(zero_stage=stage, offload=offload),
        conflicts=conflicts,
        packages=frozenset({"deepspeed"}),
    )


STRATEGIES = [
    _zero("zero1", 1, "none", "ZeRO-1: optimizer state split over --nproc ranks; state memory -(N-1)/N x 8 B/param"),
    _zero("zero2", 2, "none", "ZeRO-2: + gradients split over ranks; reduce-scatter instead of all-reduce"),
    _zero("zero3", 3, "none", "ZeRO-3: + weights split, gathered layer by layer; most memory saved, most traffic"),
    _zero(
        "zero2_offload",
        2,
        "optimizer",
        "ZeRO-2 + optimizer state and step on the CPU (DeepSpeed CPU Adam); device memory down, step slower",
    ),
    _zero(
        "zero3_offload",
        3,
        "params",
        "ZeRO-3 + weights and optimizer in CPU memory; fits the largest models, slowest",
    ),
]
