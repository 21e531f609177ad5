"""The process group a trial runs in: one process, N data-parallel ranks, or DeepSpeed ZeRO.

`trainwise compare --nproc N` (and every ZeRO row) launches a trial as N processes under
`torch.distributed.run` (torchrun). Each rank reads its place from the environment torchrun sets,
trains on its shard of every global batch, and sends its own result; the launcher combines them
(`results.combine_ranks`). The DeepSpeed config is the loop's (`trainwise.training.loop.new_accelerator`).
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainwise import strategies
from trainwise.core.errors import ConfigError

if TYPE_CHECKING:
    from trainwise.spec.config import TrialSpec


def unwrap(model: Any) -> Any:
    """The model inside DDP's / DataParallel's / a DeepSpeed engine's wrapper, a torch.compile wrapper kept on top:
    what accelerate's `unwrap_model` returns, without importing deepspeed to ask (3 s of every trial's start on
    2 CPU cores): a model can only be in a DeepSpeed engine when deepspeed is already imported."""
    import torch  # heavy: torch

    wrappers: tuple[type, ...] = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    if "deepspeed" in sys.modules:
        wrappers += (sys.modules["deepspeed"].DeepSpeedEngine,)
    compiled = model if hasattr(model, "_orig_mod") and isinstance(model, torch.nn.Module) else None
    if compiled is not None:
        model = compiled._orig_mod
    while isinstance(model, wrappers):
        model = model.module  # type: ignore[attr-defined]  # isinstance on a tuple of types narrows to object
    if compiled is not None:
        compiled._orig_mod = model
        return compiled
    return model


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
    return s.nproc > 1 or s.nnodes > 1 or strategies.runtime(spec.plan, s.task, s.device).needs_ranks


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


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks of a run over several machines meet: torchrun's static rendezvous (the master's address and
    port, the node count and this node's rank; c10d's host-name discovery is a known source of hangs). Each node
    runs the same `trainwise train` with its own --node-rank; the ranks there are `nproc` of the whole group."""

    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int

    def check_batch(self, batch_size: int, ranks_here: int, plan: str, accum_steps: int, task: str) -> Rendezvous:
        """This meeting, once the run's batch splits over every rank of every node: each micro-batch of `plan`
        evenly (ConfigError: one line, before a node starts)."""
        world = self.nnodes * ranks_here
        rows = strategies.parse_rows(plan, accum_steps)
        accum = strategies.runtime(rows[0].plan, task, "cpu").accum_steps if len(rows) == 1 else 1
        if (batch_size // accum) % world or batch_size % accum:
            raise ConfigError(
                f"--batch-size {batch_size}: each micro-batch of {batch_size // accum} must split evenly "
                f"over {world} ranks on {self.nnodes} nodes; use a multiple of {accum * world}"
            )
        return self

    def torchrun_args(self) -> list[str]:
        return [
            f"--nnodes={self.nnodes}",
            f"--node_rank={self.node_rank}",
            f"--master_addr={self.master_addr}",
            f"--master_port={self.master_port}",
        ]

    def to_dict(self) -> dict:
        return {"nnodes": self.nnodes, "node_rank": self.node_rank, "addr": self.master_addr, "port": self.master_port}

    @classmethod
    def from_dict(cls, d: dict | None) -> Rendezvous | None:
        return None if d is None else cls(int(d["nnodes"]), int(d["node_rank"]), str(d["addr"]), int(d["port"]))

    @classmethod
    def resolve(
        cls, nnodes: int | None, node_rank: int | None, master_addr: str | None, master_port: int | None
    ) -> Rendezvous | None:
        """Where a run's ranks meet when it spans several machines: the values given, else Slurm's and torchrun's
        environment (SLURM_NNODES, SLURM_NODEID, MASTER_ADDR, MASTER_PORT), checked (ConfigError: one line); None
        on one machine."""
        env = os.environ
        # Slurm's count only inside an srun step (one task per node): a batch script's own step runs on one node
        slurm = "SLURM_STEP_ID" in env
        nnodes = nnodes if nnodes is not None else _env_int("SLURM_NNODES", 1) if slurm else 1
        if nnodes < 1:
            raise ConfigError(f"--nnodes must be >= 1, got {nnodes}")
        if nnodes == 1:
            if node_rank not in (None, 0):
                raise ConfigError(f"--node-rank {node_rank} with one node: give --nnodes too")
            return None
        node_rank = node_rank if node_rank is not None else _env_int("SLURM_NODEID", None) if slurm else None
        if node_rank is None or not 0 <= node_rank < nnodes:
            raise ConfigError(f"--node-rank: give this machine's place, 0 to {nnodes - 1} (--nnodes {nnodes})")
        addr = master_addr or env.get("MASTER_ADDR")
        if not addr:
            raise ConfigError(
                "--nnodes > 1 needs --master-addr (node 0's address, the same on each node) or MASTER_ADDR"
            )
        try:  # torchrun would retry an address it cannot resolve for its whole rendezvous timeout
            socket.getaddrinfo(addr, None)
        except OSError as e:
            raise ConfigError(f"--master-addr {addr}: cannot resolve it ({e.strerror or e})") from None
        port = master_port if master_port is not None else _env_int("MASTER_PORT", 29500)
        if not 0 < port < 65536:
            raise ConfigError(f"--master-port must be a port number, got {port}")
        return cls(nnodes, node_rank, addr, port)


def _env_int(name: str, default: Any) -> Any:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    if not value.isdigit():
        raise ConfigError(f"${name}={value!r}: expected a whole number")
    return int(value)


def several_nodes() -> bool:
    """In a rank: whether the group spans more than this machine (torchrun's LOCAL_WORLD_SIZE below WORLD_SIZE)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return world > int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
