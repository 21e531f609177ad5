"""A training run's checkpoints (trainwise.training.fit): a directory `ckpt-<step>` holding the model (safetensors),
the optimizer's tensors (safetensors) and its structure, the scheduler, the sampler position and the RNG states, plus
a `manifest.json` with a sha256 of every file. Written under a temporary name and renamed into place, and only then does
the `latest` pointer (itself written then renamed) move to it, so a kill at any moment leaves the previous checkpoint
as latest; read back verified, falling back to the previous good one."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import socket
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from trainwise.core.errors import ConfigError, OutputFailed
from trainwise.core.files import failed, plain_modes, write_atomic, writing
from trainwise.run.ranks import Ranks, all_sum

LATEST = "latest"


@dataclass
class TrainState:
    """Everything besides tensors that a resumed run needs; stored in extra.json (its "trainer" entry)."""

    step: int = 0
    micro: int = 0  # micro-batches consumed in total (the sampler position)
    losses: list[float] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    stopper: dict = field(default_factory=dict)
    fingerprint: str = ""
    base: str = ""  # the fingerprint without the hyper-parameters PBT mutates (see `adopt`)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _optimizer_tensors(state: dict) -> tuple[dict[str, torch.Tensor], dict]:
    tensors: dict[str, torch.Tensor] = {}
    rest: dict = {"param_groups": state["param_groups"], "state": {}}
    for idx, entry in state["state"].items():
        rest["state"][str(idx)] = {}
        for name, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{idx}.{name}"] = value.detach().cpu().contiguous()
            else:
                rest["state"][str(idx)][name] = value
    return tensors, rest


def _optimizer_state(tensors: dict[str, torch.Tensor], rest: dict) -> dict:
    state: dict = {int(i): dict(v) for i, v in rest["state"].items()}
    for key, value in tensors.items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = value
    return {"state": state, "param_groups": rest["param_groups"]}


def check_shared(out: Path) -> None:
    """Every rank: refuse, on every node at once, a run over several machines whose --out is not one shared folder
    (rank 0 writes a word there that each rank must read back): a checkpoint is written by all ranks into one
    directory that rank 0 then renames, and `--resume` reads it back on every node. Every rank reaches the same
    collectives whatever happens (a rank that raised before them would leave the others waiting)."""
    token = uuid.uuid4().hex
    probe = out / f".trainwise-shared-{token[:12]}"  # a name of this run's own: no stale cached entry
    written = True
    if Ranks.from_env().main:
        try:
            write_atomic(probe, token)
        except (OSError, OutputFailed):
            written = False
    said: list = [token if written else None, probe.name]
    torch.distributed.broadcast_object_list(said, src=0)
    if said[0] is None:
        raise failed(out, "rank 0 could not write there", RESUME_HINT)
    probe = out / said[1]
    try:
        seen = probe.read_text() == said[0]
    except OSError:
        seen = False
    world = int(os.environ.get("WORLD_SIZE", "1"))
    every = all_sum(int(seen), world) == world
    _barrier()  # every rank has read it: rank 0 removes it
    if Ranks.from_env().main:
        probe.unlink(missing_ok=True)
    if not every:
        raise ConfigError(
            f"--out {out} is not one folder shared by every node (a rank on host {socket.gethostname()} or another "
            "cannot read what rank 0 wrote there): a run over several machines writes its checkpoints there from "
            "every rank and resumes from them on every node; put --out on shared storage (NFS, a cluster file "
            "system) at the same path on each node"
        )


def _barrier() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


def save_checkpoint(root: Path, model, optimizer, scheduler, state: TrainState, engine=None) -> Path:
    """Write a checkpoint (every rank calls it). One process, or data-parallel ranks whose weights and
    optimizer state are replicas: rank 0 writes them as safetensors. ZeRO (`engine`, DeepSpeed's): every
    rank writes its partition through the engine into `zero/`. Rank 0 then adds the schedule, the RNG
    states and the manifest, and renames the whole into place."""
    ranks = Ranks.from_env()
    final = root / f"ckpt-{state.step:08d}"
    tmp = root / (f".tmp-{final.name}-{os.getpid()}" if ranks.world == 1 else f".tmp-{final.name}-ranks")
    if ranks.main:
        if not root.parent.is_dir():  # --out removed while training: not recreated empty
            raise failed(root.parent, "the directory was removed")
        root.mkdir(exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    _barrier()
    if engine is not None:
        engine.save_checkpoint(str(tmp / "zero"), tag="state")
    _barrier()
    if ranks.main:
        with writing(final, tmp, hint=RESUME_HINT):
            _write_checkpoint(tmp, final, root, model, optimizer, scheduler, state, engine)
    _barrier()
    return final


RESUME_HINT = "make room and run the same command with --resume: it continues from the last whole checkpoint"


def _write_checkpoint(tmp: Path, final: Path, root: Path, model, optimizer, scheduler, state, engine) -> None:
    """Rank 0's part of a checkpoint: the files into `tmp`, then renamed to `final`, then `latest` moved."""

    extra: dict = {
        "scheduler": scheduler.state_dict(),
        "python_rng": random.getstate(),
        "trainer": asdict(state),
    }
    if engine is None:
        save_model(model, str(tmp / "model.safetensors"))
        tensors, extra["optimizer"] = _optimizer_tensors(optimizer.state_dict())
        save_file(tensors, str(tmp / "optimizer.safetensors"))
    save_file({"torch": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
    (tmp / "extra.json").write_text(json.dumps(extra))
    files = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())
    manifest = {"files": {name: _sha(tmp / name) for name in files}, "step": state.step}
    (tmp / "manifest.json").write_text(json.dumps(manifest))
    plain_modes(tmp)
    for p in tmp.rglob("*"):  # on disk before the rename makes it visible
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    write_atomic(root / LATEST, final.name)


def verify(ckpt: Path) -> str | None:
    """None if the checkpoint is whole, else what is wrong with it."""
    manifest_path = ckpt / "manifest.json"
    if not manifest_path.is_file():
        return "no manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError:
        return "manifest.json is not JSON"
    for name, digest in manifest.get("files", {}).items():
        path = ckpt / name
        if not path.is_file():
            return f"{name} is missing"
        if _sha(path) != digest:
            return f"{name} does not match its checksum"
    return None


def find_resumable(root: Path, warn: Callable[[str], None]) -> Path | None:
    """The latest whole checkpoint: the `latest` pointer's, else the newest one that verifies."""
    if not root.is_dir():
        return None
    candidates = sorted((p for p in root.glob("ckpt-*") if p.is_dir()), reverse=True)
    pointer = root / LATEST
    if pointer.is_file() and (root / pointer.read_text().strip()).is_dir():
        first = root / pointer.read_text().strip()
        candidates = [first] + [c for c in candidates if c != first]
    for ckpt in candidates:
        problem = verify(ckpt)
        if problem is None:
            return ckpt
        warn(f"checkpoint {ckpt.name} is damaged ({problem}); falling back to the previous one")
    return None


def load_checkpoint(ckpt: Path, model, optimizer, scheduler, engine=None) -> TrainState:
    """Every rank loads the checkpoint: the replicas from the safetensors, or (ZeRO) its own partition."""

    extra = json.loads((ckpt / "extra.json").read_text())
    if (ckpt / "zero").is_dir() != (engine is not None):
        raise ConfigError(f"{ckpt} was written by a run {'with' if engine is None else 'without'} ZeRO")
    if engine is None:
        load_model(model, str(ckpt / "model.safetensors"))
        optimizer.load_state_dict(_optimizer_state(load_file(str(ckpt / "optimizer.safetensors")), extra["optimizer"]))
    else:
        engine.load_checkpoint(str(ckpt / "zero"), tag="state", load_lr_scheduler_states=False)
    scheduler.load_state_dict(extra["scheduler"])
    torch.set_rng_state(load_file(str(ckpt / "rng.safetensors"))["torch"])
    version, internal, gauss = extra["python_rng"]
    random.setstate((version, tuple(internal), gauss))
    return TrainState(**extra["trainer"])


def prune(root: Path, keep: int, protect: set[str]) -> None:
    ckpts = sorted(p for p in root.glob("ckpt-*") if p.is_dir())
    for old in ckpts[:-keep]:
        if old.name not in protect:
            shutil.rmtree(old, ignore_errors=True)
