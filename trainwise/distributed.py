"""The process group a trial runs in: one process, N data-parallel ranks, or DeepSpeed ZeRO.

`trainwise compare --nproc N` (and every ZeRO row) launches a trial as N processes under
`torch.distributed.run` (torchrun). Each rank reads its place from the environment torchrun sets,
trains on its shard of every global batch, and sends its own result; the launcher combines them
(`results.combine_ranks`). The DeepSpeed config is the loop's (`trainwise.loop.new_accelerator`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainwise import strategies

if TYPE_CHECKING:
    from trainwise.config import TrialSpec


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


def is_multiprocess(spec: TrialSpec) -> bool:
    """Whether a trial runs under torchrun: several ranks, or a plan that needs a process group (DeepSpeed)."""

    s = spec.settings
    return s.nproc > 1 or strategies.runtime(spec.plan, s.task, s.device).needs_ranks


def group_size() -> int:
    """The world size the process group really has (1 when there is none)."""
    import torch  # heavy: torch

    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def all_sum(value: float | int, world: int) -> float:
    """Sum a number over the ranks (identity for one process)."""
    if world == 1:
        return float(value)
    import torch  # heavy: torch

    t = torch.tensor([float(value)], dtype=torch.float64)
    torch.distributed.all_reduce(t)
    return float(t.item())
