"""Per-step timing split into data wait, forward+backward, and optimizer time.

Every boundary calls `sync()` (CUDA synchronize on GPU, a no-op on CPU) so a phase's time is the
device's time, not the launch time. A row's time figures all come from ONE statistic, the totals
of the timed steps: step (s) is timed seconds / steps, samples/s is samples / timed seconds, and epoch
time, time % and $/epoch follow from samples/s, so they always agree (a median step beside a
total-over-total rate did not: a loaded baseline read 2.689 s/step beside 6.4 samples/s, where
32 / 2.689 = 11.9). Totals, not medians: rows whose batches vary in length (dynamic padding, smart
batching) have a few long steps that a median would leave out of their epoch. Trials timed under load
are measured again (trainwise.study.run), and the median, p90 and IQR stay beside them for the noise.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]) of a non-empty list."""
    assert values, "percentile of nothing"
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo, hi = int(pos), min(int(pos) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass
class StepTimes:
    data_s: float = 0.0
    compute_s: float = 0.0
    optim_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.data_s + self.compute_s + self.optim_s


@dataclass
class StepTimer:
    """Accumulate phase times within a step (`with timer.phase("data"): ...`); `end_step` closes the step."""

    sync: Callable[[], None]
    steps: list[StepTimes] = field(default_factory=list)
    _current: StepTimes = field(default_factory=StepTimes)
    _t0: float = 0.0
    _name: str = ""

    def start(self, name: str) -> None:
        self.sync()
        self._name, self._t0 = name, time.perf_counter()

    def stop(self) -> None:
        self.sync()
        elapsed = time.perf_counter() - self._t0
        attr = f"{self._name}_s"
        setattr(self._current, attr, getattr(self._current, attr) + elapsed)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.start(name)
        try:
            yield
        finally:
            self.stop()

    def end_step(self) -> StepTimes:
        done, self._current = self._current, StepTimes()
        self.steps.append(done)
        return done


def summarize_steps(steps: list[StepTimes], samples: int = 0, real_tokens: int = 0) -> dict[str, float]:
    """The timed steps' figures: `samples` and `real_tokens` (non-pad) over all of them, over their time."""
    totals = [s.total_s for s in steps]
    timed = sum(totals)
    return {
        "step_time_s": timed / len(steps),
        "step_time_median_s": statistics.median(totals),
        "samples_per_s": samples / timed,
        "tokens_per_s": real_tokens / timed,
        "step_time_p90_s": percentile(totals, 90),
        "step_time_iqr_s": percentile(totals, 75) - percentile(totals, 25),  # the step-to-step noise
        "data_wait_s": statistics.median([s.data_s for s in steps]),
        "compute_s": statistics.median([s.compute_s for s in steps]),
        "optimizer_s": statistics.median([s.optim_s for s in steps]),
        "timed_s": sum(totals),
    }
