"""A training run's progress line on the terminal (`trainwise train`, `tune`): step i/N, loss, samples/s, the time
left."""

from __future__ import annotations

import statistics
import time
from collections import deque

from trainwise.core.units import human_seconds
from trainwise.run.events import Step


class TrainLine:
    """A training run's progress line: step i/N, loss, samples/s and the time left, from the wall time between the
    last steps as they arrive: their median step, so that an evaluation or a checkpoint between two steps does not
    read as a slow step (the time left counts steps, not the evaluations still to come)."""

    WINDOW = 20  # steps the rate is taken over

    def __init__(self) -> None:
        self.seen: deque[tuple[float, int, int]] = deque(maxlen=self.WINDOW)  # (monotonic s, step, samples)

    def line(self, e: Step, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        if self.seen and e.step <= self.seen[-1][1]:  # another run (tune's next trial), or a resumed one
            self.seen.clear()
        self.seen.append((now, e.step, e.samples or 0))
        parts = [f"step {e.step}/{e.total}", f"loss {e.loss:.4f}"]
        seen = list(self.seen)
        per_step = [(b[0] - a[0]) / (b[1] - a[1]) for a, b in zip(seen, seen[1:], strict=False) if b[1] > a[1]]
        if per_step and (step_s := statistics.median(per_step)) > 0:
            samples = [n for _, _, n in seen[1:] if n]
            if samples:
                parts.append(f"{statistics.mean(samples) / step_s:.1f} samples/s")
            if e.step < e.total:
                parts.append(f"~{human_seconds(step_s * (e.total - e.step))} left")
        return "  ".join(parts)
