"""Faults a child can meet, shared by every kind of job: what counts as out of memory, and the test seam that
injects a fault at a chosen step.

Test seam: TRAINWISE_FAULT="TARGET:KIND@STEP" injects a fault into the job whose target is TARGET (a compare
trial's strategy, or "bs=N" for its batch size N; "train" for a training run, in every rank; "tune#N" for tune's
trial number N; a shell pattern matches by `fnmatch`: "*+*", any combination) at that optimizer step; KIND is
raise | oom | kill | hang.
"""

from __future__ import annotations

import fnmatch
import os
import signal
import time
from dataclasses import dataclass

from trainwise.run.events import Emit, Event, Step

OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory")


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in OOM_MARKERS)


@dataclass(frozen=True)
class Fault:
    """A fault TRAINWISE_FAULT asks for: `kind` at optimizer step `step`."""

    kind: str
    step: int

    @classmethod
    def asked(cls, target: str, batch_size: int) -> Fault | None:
        """The fault TRAINWISE_FAULT injects into the job of `target` (or of batch size `batch_size`), if any."""
        spec = os.environ.get("TRAINWISE_FAULT", "")
        name, _, rest = spec.partition(":")
        if not rest or not any(fnmatch.fnmatchcase(t, name) for t in (target, f"bs={batch_size}")):
            return None
        kind, _, step = rest.partition("@")
        return cls(kind, int(step or 1))

    def at(self, event: Event) -> None:
        """Act when `event` is the step the fault is set for."""
        if not isinstance(event, Step) or event.step != self.step:
            return
        if self.kind == "raise":
            raise RuntimeError(f"injected fault at step {self.step}")
        if self.kind == "oom":
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.kind == "hang":
            time.sleep(10**6)


def seamed(emit: Emit, target: str, batch_size: int) -> Emit:
    """`emit`, followed by the fault TRAINWISE_FAULT injects into this job (the event is said first)."""
    fault = Fault.asked(target, batch_size)
    if fault is None:
        return emit

    def both(event: Event) -> None:
        emit(event)
        fault.at(event)

    return both
