"""What an offline W&B run holds, read back from its `run-ID.wandb` file: the records `wandb sync` would upload.

The file is W&B's header (":W&B", a magic number, a version: 7 bytes) and then LevelDB's log format: 32 KiB blocks
of chunks, each a 7-byte header (CRC, length, type: full / first / middle / last) and its bytes; a record is one
protobuf `Record` (wandb.proto.wandb_internal_pb2), split over chunks when long."""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
HEADER = 7  # the file's, and each chunk's
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    out: list[bytes] = []
    part = b""
    at = HEADER
    while at + HEADER <= len(data):
        left = BLOCK - at % BLOCK
        if left < HEADER:  # the block's tail is padding
            at += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[at : at + HEADER])
        if length == 0 and kind == 0:  # zeros: the block's padding, or the file's end
            at += left
            continue
        chunk = data[at + HEADER : at + HEADER + length]
        at += HEADER + length
        if kind == FULL:
            out.append(chunk)
        elif kind == FIRST:
            part = chunk
        elif kind == MIDDLE:
            part += chunk
        elif kind == LAST:
            out.append(part + chunk)
    return out


@dataclass
class Run:
    """An offline run: its id, name, group, job type, config, history (step -> values) and summary."""

    id: str = ""
    name: str = ""
    group: str = ""
    job_type: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    history: dict[int, dict[str, Any]] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def read(path: Path) -> Run:
    from wandb.proto import wandb_internal_pb2 as pb

    run = Run()
    for blob in records(path):
        r = pb.Record()
        r.ParseFromString(blob)
        kind = r.WhichOneof("record_type")
        if kind == "run":
            run.id, run.name, run.group, run.job_type = (
                r.run.run_id,
                r.run.display_name,
                r.run.run_group,
                r.run.job_type,
            )
            run.config |= {_key(i): json.loads(i.value_json) for i in r.run.config.update}
        elif kind == "config":
            run.config |= {_key(i): json.loads(i.value_json) for i in r.config.update}
        elif kind == "history":
            values = {_key(i): json.loads(i.value_json) for i in r.history.item}
            step = r.history.step.num if r.history.HasField("step") else values.get("_step")
            run.history.setdefault(int(step), {}).update(values)
        elif kind == "summary":
            run.summary |= {_key(i): json.loads(i.value_json) for i in r.summary.update}
        elif kind == "exit":
            run.exit_code = r.exit.exit_code
    return run


def _made(path: Path) -> tuple[str, int]:
    """When a run's folder was made: its time stamp, then the suffix W&B adds to a second folder of the same run
    made in the same second (`offline-run-DATE_TIME-ID-1`), which plain sorting would put first."""
    found = re.fullmatch(r"offline-run-(\d{8}_\d{6})-[a-z0-9]+(?:-(\d+))?", path.parent.name)
    assert found, path
    return found[1], int(found[2] or 0)


def runs(out: Path) -> list[Run]:
    """Every offline run under `out`/wandb, in the order they were made: by the wall time of their first logged
    step (two runs may start in the same second), else by their folder's."""
    found = [(read(f), _made(f)) for f in out.glob("wandb/offline-run-*/run-*.wandb")]

    def first(run: Run) -> float:
        stamps = [v["_timestamp"] for v in run.history.values() if "_timestamp" in v]
        return min(stamps) if stamps else float("inf")

    return [run for run, _ in sorted(found, key=lambda rm: (rm[1][0], first(rm[0]), rm[1][1]))]
