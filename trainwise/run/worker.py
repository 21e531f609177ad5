"""The child's side of the one protocol: `python -m trainwise.run.worker JOB.json`, for every kind of job (a
compare trial, a training run's ranks, a tune trial) and every process backend (forked by the zygote,
exec'd, torchrun's ranks).

JOB.json names the job's class and its fields (`job_blob`); the child rebuilds the job and calls
`job.run(emit)`, the one entry point a job has. Events go to stdout as JSON lines (rank 0's only: one
progress stream however many ranks); the job's typed result goes last, as a `Result` event, from every
rank. A child that dies before it (killed, a segfault, an exception its job does not turn into a result)
is classified by the parent (`launcher.run` -> the job's `ended`).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from trainwise.run.events import Emit, Event, Result, lines
from trainwise.run.lifeline import die_with_parent
from trainwise.run.ranks import Ranks


def job_blob(job: Any) -> dict:
    """What a child needs to rebuild `job`: its class and its fields."""
    kind = type(job)
    return {"job": f"{kind.__module__}:{kind.__qualname__}", "args": job.to_dict()}


def job_of(blob: dict) -> Any:
    """The job `job_blob` wrote (its module imported here, in the child)."""
    module, _, name = blob["job"].partition(":")
    return getattr(importlib.import_module(module), name).from_dict(blob["args"])


def send(event: Event) -> None:
    """Write `event` to stdout, each of its lines in one write (ranks share the pipe: no interleaving)."""
    with contextlib.suppress(ValueError):  # stdout closed: nothing to flush
        sys.stdout.flush()
    for data in lines(event):
        while data:
            data = data[os.write(1, data) :]


def progress(main_rank: bool) -> Emit:
    """A child's progress: on stdout from the main rank, nowhere from the others (they say the same)."""

    def emit(event: Event) -> None:
        if main_rank:
            send(event)

    return emit


def main(argv: list[str]) -> int:
    die_with_parent()  # a child never outlives the command (or torchrun) that started it
    job = job_of(json.loads(Path(argv[0]).read_text()))
    ranks = Ranks.from_env()
    result = job.run(progress(ranks.main))
    send(Result(result, ranks.rank))
    # under torchrun a failed rank exits non-zero, so torchrun stops the ranks waiting on it in a collective
    return 1 if ranks.world > 1 and getattr(result, "status", "ok") != "ok" else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
