"""What a running job says, typed: the events a child (a compare trial, a training run, a tune trial) or a
driver (a study's notes and projected time) emits, and the `Result` a child ends with.

Everything that listens (the terminal, the API's `Render`, the study's clock, the trackers, tune's pruner,
PBT's reporter) reads these dataclasses, never dicts. On the wire (a child's stdout) each is one JSON
object a line: `to_dict()` writes it, `event_of(dict)` reads it back. A line longer than the pipe's atomic
write is cut into `part` lines (`lines`) that a `Reader` joins again, so that ranks sharing one stdout
never interleave their results.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainwise.core.results import TrainResult, TrialResult, TuneTrialResult


@dataclass(frozen=True)
class Phase:
    """A compare trial enters a phase: data, model, train, eval, measure."""

    phase: str

    def to_dict(self) -> dict:
        return {"event": "phase", "phase": self.phase}


@dataclass(frozen=True)
class Step:
    """One optimizer step: its loss, and the step's seconds (a compare trial) or learning rate and samples over
    every rank (training: the progress line's samples/s)."""

    step: int
    total: int
    loss: float
    step_s: float | None = None
    lr: float | None = None
    samples: int | None = None

    def to_dict(self) -> dict:
        d = {"event": "step", "step": self.step, "total": self.total, "loss": self.loss}
        extra = (("step_s", self.step_s), ("lr", self.lr), ("samples", self.samples))
        return d | {k: v for k, v in extra if v is not None}


@dataclass(frozen=True)
class Eval:
    """An evaluation of a training run at `step`: train_loss, the task's metrics, and `best` (a new best
    of the monitored value) when a value is monitored."""

    step: int
    values: dict[str, Any] = field(default_factory=dict)

    @property
    def record(self) -> dict[str, Any]:
        """The evaluation as train_result.json's `evals` keep it: the step first."""
        return {"step": self.step, **self.values}

    def to_dict(self) -> dict:
        return {"event": "eval", **self.record}


@dataclass(frozen=True)
class Checkpoint:
    """A training run wrote a whole checkpoint at `step` into `path`."""

    step: int
    path: str

    def to_dict(self) -> dict:
        return {"event": "checkpoint", "step": self.step, "path": self.path}


@dataclass(frozen=True)
class Note:
    """What the user should know, in one line (a re-run under load, where a run writes)."""

    text: str

    def to_dict(self) -> dict:
        return {"event": "note", "text": self.text}


@dataclass(frozen=True)
class Warn:
    """A one-line warning of a training run (a damaged checkpoint skipped, a resume with nothing to resume)."""

    text: str

    def to_dict(self) -> dict:
        return {"event": "warning", "text": self.text}


@dataclass(frozen=True)
class Projection:
    """A study's projected time left; `text`, the first time, says what it rests on."""

    remaining_s: float
    text: str | None = None

    def to_dict(self) -> dict:
        return {"event": "projection", "remaining_s": self.remaining_s} | ({"text": self.text} if self.text else {})


Value = TrialResult | TrainResult | TuneTrialResult
ValueType = type[TrialResult] | type[TrainResult] | type[TuneTrialResult]
KINDS: dict[str, ValueType] = {"trial": TrialResult, "train": TrainResult, "tune_trial": TuneTrialResult}


@dataclass(frozen=True)
class Result:
    """The last thing a child says: its job's typed result (every rank says its own)."""

    value: Value
    rank: int = 0

    def to_dict(self) -> dict:
        kind = next(k for k, t in KINDS.items() if isinstance(self.value, t))
        return {"event": "result", "rank": self.rank, "kind": kind, "result": self.value.to_dict()}


Event = Phase | Step | Eval | Checkpoint | Note | Warn | Projection | Result
Emit = Callable[[Event], None]


def ignore(_event: Event) -> None:
    """A listener that hears nothing."""


def event_of(d: dict) -> Event:
    """The event a wire dict says (`to_dict`'s inverse); ValueError for one that is no event of trainwise's."""
    kind = d.get("event")
    rest = {k: v for k, v in d.items() if k != "event"}
    if kind == "phase":
        return Phase(d["phase"])
    if kind == "step":
        return Step(**rest)
    if kind == "eval":
        return Eval(rest.pop("step"), rest)
    if kind == "checkpoint":
        return Checkpoint(**rest)
    if kind == "note":
        return Note(d["text"])
    if kind == "warning":
        return Warn(d["text"])
    if kind == "projection":
        return Projection(**rest)
    if kind == "result" and d.get("kind") in KINDS:
        return Result(KINDS[d["kind"]].from_dict(d["result"]), int(d["rank"]))
    raise ValueError(f"not an event of trainwise's: {kind!r}")


PIPE_BUF = 4096  # POSIX: a write of at most this many bytes to a pipe is never interleaved with another's
_PIECE = 1800  # characters of a long line per part (escaped, at most twice that, plus the part's keys)
_parts = itertools.count()


def lines(event: Event) -> list[bytes]:
    """The event as the lines a child writes, each one write to its stdout: one line, or for a line longer
    than a pipe writes at once, `part` lines that `Reader` joins."""
    line = json.dumps(event.to_dict())
    # each line starts on a line of its own: text a library left on stdout without a newline stays apart
    if len(line) + 1 < PIPE_BUF:
        return [("\n" + line + "\n").encode()]
    pieces = [line[i : i + _PIECE] for i in range(0, len(line), _PIECE)]
    key = f"{os.getpid()}-{next(_parts)}"
    return [
        ("\n" + json.dumps({"event": "part", "id": key, "i": i, "n": len(pieces), "data": p}) + "\n").encode()
        for i, p in enumerate(pieces)
    ]


class Reader:
    """Wire dicts in, events out: joins `part` lines; skips what is no event of trainwise's (a library's
    stray JSON line)."""

    def __init__(self) -> None:
        self.partial: dict[str, dict[int, str]] = {}

    def read(self, d: dict) -> Event | None:
        if d.get("event") == "part":
            key = str(d["id"])
            got = self.partial.setdefault(key, {})
            got[int(d["i"])] = str(d["data"])
            if len(got) < int(d["n"]):
                return None
            del self.partial[key]
            d = json.loads("".join(got[i] for i in sorted(got)))
        try:
            return event_of(d)
        except (ValueError, KeyError, TypeError):
            return None
