"""How a caller shows a running verb. The application layer prints nothing itself: it calls a `Render`.

Every verb's default is `STDERR`: progress, status and the study's notes (the projected time, a re-run
waiting for the machine to quieten, rows skipped) on stderr, as the CLI shows them; the result (a study's
table, the advice) is left to the returned object. `render=None` is silence; `Render(...)` shows what it is
given and nothing else (its fields default to nothing).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from trainwise.core.units import human_seconds
from trainwise.run.events import Event


@contextlib.contextmanager
def _silent(_prepared: Any) -> Iterator[tuple[Callable, Callable]]:
    yield (lambda *_: None), (lambda *_: None)


def _nothing(*_: Any) -> None:
    return None


@dataclass(frozen=True)
class Render:
    """progress(prepared): a context manager giving (on_event(spec, event), on_done(spec, result, stored));
    table(report): a study's table; quality(rows, seeds): the quality phase's verdicts;
    status(text): a context manager shown while the input is checked and prepared (its `update(text)`, when
    it has one, says what the work is doing now); note(line): what the user should know (rows skipped, a
    head trained new, a plan's precision, the study's projected time); event(Event): a training run's
    progress (`trainwise.run.events`: Step, Eval, Checkpoint, Note); line(text): a line of a search's progress.
    A study's on_event gets the trials' typed events too (Phase, Step, Note, Projection)."""

    progress: Callable = _silent
    table: Callable[[Any], None] = _nothing
    quality: Callable[[list, int], None] = _nothing
    status: Callable[[str], Any] = lambda _text: contextlib.nullcontext()
    note: Callable[[str], None] = _nothing
    event: Callable[[Event], None] = _nothing
    line: Callable[[str], None] = _nothing

    def update(self, status: Any) -> Callable[[str], None]:
        """The status's update, or nothing (a null context has none)."""
        return getattr(status, "update", _nothing)

    @staticmethod
    def of(render: Render | None) -> Render:
        """The render a verb uses: the one given, or silence for None."""
        return SILENT if render is None else render


def _terminal() -> Any:
    from trainwise.report import terminal  # start-up: rich, loaded when there is something to show

    return terminal


def _say(line: str) -> None:
    terminal = _terminal()
    terminal.end_live()  # a note or warning never lands on the end of a live progress line
    terminal.say(line, terminal.err)


def probes(update: Callable[[str], None], what: str) -> Callable[[int, int], None]:
    """A calibration's progress for a status line (`calibrate`'s on_probe: called before probe i of n): which
    probe, and the time left at the pace of the probes so far."""
    start = time.monotonic()

    def on_probe(i: int, n: int) -> None:
        nonlocal start
        if i == 0:  # a calibration starts (advise may run several, one per plan): its own clock
            start = time.monotonic()
        text = f"{what}: probe {i + 1}/{n}"
        if i:
            text += f", ~{human_seconds((time.monotonic() - start) / i * (n - i))} left"
        update(text)

    return on_probe


SILENT = Render()
# progress bars, status and notes on stderr (rich; in a notebook, its widgets), loaded on first use
STDERR = Render(
    progress=lambda prepared: _terminal().study_progress(prepared),
    status=lambda text: _terminal().err.status(text),
    note=_say,
    event=lambda event: _terminal().train_event(event),
    line=_say,
)
