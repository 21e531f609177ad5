"""The process group a trial runs in: one process, N data-parallel ranks, or DeepSpeed ZeRO.

`trainwise compare --nproc N` (and every ZeRO row) launches a trial as N processes under
`torch.distributed.run` (torchrun). Each rank reads its place from the environment torchrun sets,
trains on its shard of every global batch, and writes its own result; the launcher combines them
(`results.combine_ranks`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from trainwise.plan import TrialPlan


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1

    @classmethod
    def from_env(cls) -> Ranks:
        return cls(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")))

    @property
    def main(self) -> bool:
        return self.rank == 0


def is_multiprocess(nproc: int, plan: TrialPlan) -> bool:
    """Whether a trial runs under torchrun: several ranks, or DeepSpeed (which needs a process group)."""
    return nproc > 1 or plan.zero_stage > 0


def group_size() -> int:
    """The world size the process group really has (1 when there is none)."""
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def all_sum(value: float | int, world: int) -> float:
    """Sum a number over the ranks (identity for one process)."""
    if world == 1:
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64)
    torch.distributed.all_reduce(t)
    return float(t.item())


def ds_config(plan: TrialPlan, micro_batch_per_rank: int, max_grad_norm: float) -> dict:
    """The DeepSpeed config of a ZeRO trial. The loop keeps its own accumulation windows and loss
    normalisation, so DeepSpeed sees one micro-batch per step; offload targets CPU memory."""
    zero: dict = {"stage": plan.zero_stage}
    if plan.offload in ("optimizer", "params"):
        zero["offload_optimizer"] = {"device": "cpu"}
    if plan.offload == "params":
        zero["offload_param"] = {"device": "cpu"}
    return {
        "train_micro_batch_size_per_gpu": micro_batch_per_rank,
        "gradient_accumulation_steps": plan.accum_steps,
        "gradient_clipping": max_grad_norm or 0.0,
        "zero_optimization": zero,
        "bf16": {"enabled": plan.precision == "bf16"},
        "fp16": {"enabled": plan.precision == "fp16"},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
