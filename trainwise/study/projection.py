"""How long a study takes, projected from its first trial's first timed steps: said once as a note (with a
shorter study to run instead when it is long) and kept up to date as the study's time remaining.

The arithmetic is pure (`Pace`, `Shape`, `note`, `remaining_s`); `Clock` applies it to a running study,
fed by the study's loop with the trials' events and a clock it is given.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from trainwise import strategies
from trainwise.core.units import human_seconds
from trainwise.run.events import Event, Projection, Step

LONG_S = 600.0  # a study projected longer than this is offered a shorter one
AFTER_STEPS = 2  # after its timed steps a trial measures memory and FLOPs on two more steps
# the short list, beside the baseline: one row per lever a study measures (padding, precision, memory), each
# as cheap as the baseline or cheaper to run; rows that are emulated or unsupported here are left out
SHORT_ROWS = strategies.SHORT_ROWS


@dataclass(frozen=True)
class Pace:
    """What a trial's time is projected from, measured on the study's first trial."""

    step_s: float  # seconds per optimizer step, timed (not a warm-up step)
    start_s: float  # the rest of a trial: process start, data, model, the warm-up steps' extra time
    row: str  # the row it was measured on

    @classmethod
    def of(cls, row: str, elapsed_s: float, step: int, step_s: float) -> Pace:
        """From the first timed step of a trial: step number `step` took `step_s` and ended `elapsed_s` after
        the trial was launched."""
        return cls(step_s, max(0.0, elapsed_s - step * step_s), row)

    def trial_s(self, steps: int) -> float:
        return self.start_s + (steps + AFTER_STEPS) * self.step_s


@dataclass(frozen=True)
class Shape:
    """The study a projection is of: its rows, and how many trials each row is."""

    rows: tuple[str, ...]
    per_row: int  # trials per row: batch cells x worker counts x repeats
    extra: int  # trials besides the rows' (the baseline again, last)
    steps: int  # optimizer steps per trial
    warmup: int  # of them, not timed
    slow: frozenset[str] = field(default_factory=frozenset)  # rows left out of the short list (emulated here)

    def trials(self, rows: tuple[str, ...] | None = None) -> int:
        return len(self.rows if rows is None else rows) * self.per_row + self.extra

    def short_rows(self) -> tuple[str, ...] | None:
        """The short list: the baseline and the study's rows among SHORT_ROWS that run natively here (topped
        up with its first other rows to three); None when it would not leave a row out."""
        fast = [r for r in self.rows if r not in self.slow]
        rows = [r for r in fast if r == "baseline"] + [r for r in SHORT_ROWS if r in fast]
        rows += [r for r in fast if r not in rows][: max(0, 3 - len(rows))]
        return tuple(rows) if len(rows) < len(self.rows) else None

    def short_steps(self) -> int | None:
        """A smaller --max-steps that still times four steps, when it saves a quarter of the steps."""
        steps = max(self.warmup + 4, self.steps // 2)
        return steps if steps <= 0.75 * self.steps else None


def note(pace: Pace, shape: Shape, to_run: int) -> str:
    """The projection in one line: the study's time and what it rests on; when longer than LONG_S, the
    shorter studies to run instead (the short list, fewer steps, both) with their own projections."""
    total = to_run * pace.trial_s(shape.steps)
    line = (
        f"trainwise: note: this study will take about {human_seconds(total)}: {_trials(to_run)} of {shape.steps} "
        f"steps at {pace.step_s:.2f} s/step (measured on {pace.row}) and {pace.start_s:.0f} s of start-up each"
    )
    if total <= LONG_S:
        return line
    rows, steps = shape.short_rows(), shape.short_steps()
    shorter = []
    if rows is not None:
        n = shape.trials(rows)
        shorter.append(
            f"--strategies {','.join(rows)} ({_trials(n)}, about {human_seconds(n * pace.trial_s(shape.steps))})"
        )
    if steps is not None:
        shorter.append(f"--max-steps {steps} (about {human_seconds(to_run * pace.trial_s(steps))})")
    if rows is not None and steps is not None:
        shorter.append(f"both (about {human_seconds(shape.trials(rows) * pace.trial_s(steps))})")
    if not shorter:
        return line
    return f"{line}; for a shorter study, stop it (Ctrl-C) and run it again with " + ", or ".join(shorter)


def _trials(n: int) -> str:
    return f"{n} trial" + ("s" if n != 1 else "")


def remaining_s(pace: Pace, steps: int, left: int, walls: list[float], elapsed_s: float | None = None) -> float:
    """Seconds until the study ends: `left` trials still to run, each as long as the trials run so far took
    (their mean) or, before one has ended, as projected; and what the running trial, `elapsed_s` into it
    (None: none is running), has left."""
    per_trial = statistics.fmean(walls) if walls else pace.trial_s(steps)
    running = 0.0 if elapsed_s is None else max(0.0, per_trial - elapsed_s)
    return running + left * per_trial


class Clock:
    """A running study's projection. `started(row)` when a trial is launched, `step(event)` with each of
    its events, `ended()` when it is stored; each returns the event to pass on (None: nothing new): a
    `Projection` of the time left, with the note (`text`) the first time. The note rests on the
    first timed step; the time left, on the median of every timed step so far (one step can be a stall)."""

    def __init__(self, shape: Shape, to_run: int, now: Callable[[], float] = time.monotonic):
        self.shape, self.left, self.now = shape, to_run, now
        self.pace: Pace | None = None
        self.walls: list[float] = []
        self.timed: list[float] = []  # every timed step's seconds, of every trial so far
        self.row, self.t0 = "", 0.0

    def started(self, row: str) -> None:
        self.row, self.t0 = row, self.now()
        self.left -= 1

    def step(self, event: Event) -> Projection | None:
        if not isinstance(event, Step) or event.step <= self.shape.warmup or event.step_s is None:
            return None
        elapsed = self.now() - self.t0
        self.timed.append(event.step_s)
        text = None
        if self.pace is None:
            self.pace = Pace.of(self.row, elapsed, event.step, event.step_s)
            text = note(self.pace, self.shape, self.left + 1)
        else:
            self.pace = dataclasses.replace(self.pace, step_s=statistics.median(self.timed))
        remaining = remaining_s(self.pace, self.shape.steps, self.left, self.walls, elapsed)
        return Projection(remaining, text)

    def ended(self) -> Projection | None:
        self.walls.append(self.now() - self.t0)
        if self.pace is None:  # the trial ended before a timed step (it failed): nothing to project from
            return None
        return Projection(remaining_s(self.pace, self.shape.steps, self.left, self.walls))
