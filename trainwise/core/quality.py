"""The quality phase's records (OUT/quality/quality.json: written and read by trainwise.study.store, shown by
trainwise.report, judged by trainwise.search.verdicts): per row its seeds' metric and its verdict against the
baseline."""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import asdict, dataclass

QUALITY_DIR = "quality"
NOT_SIGNIFICANT = "no significant difference"
INCONCLUSIVE = "inconclusive"  # 2 seeds not called different: more seeds would decide


@dataclass
class QualityRow:
    strategy: str  # the row's text
    metric_name: str
    values: list[float]  # the metric, one per seed
    eval_losses: list[float]  # the evaluation loss, one per seed
    steps: int
    random_init: bool
    delta: float | None = None  # mean metric - the baseline's
    verdict: str = ""  # "reference" | NOT_SIGNIFICANT | INCONCLUSIVE | "better" | "worse" | "one seed: no verdict"
    test: str = ""  # how the verdict was reached (the paired t-test over the seeds both rows ran, else Welch's)
    majority: float | None = None  # accuracy: what always answering the commonest held-out class scores
    seeds: list[int] = dataclasses.field(default_factory=list)  # the seed of each value (paired with the baseline's)
    prior_loss: float | None = None  # classification: the held-out labels' entropy (the loss of their frequencies)
    first_losses: list[float] = dataclasses.field(default_factory=list)  # each seed's training loss at its first step
    train_losses: list[float] = dataclasses.field(default_factory=list)  # each seed's over its last steps

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    @property
    def eval_loss(self) -> float | None:
        return statistics.fmean(self.eval_losses) if self.eval_losses else None

    def to_dict(self) -> dict:
        return {**asdict(self), "mean": self.mean, "low": self.low, "high": self.high, "eval_loss": self.eval_loss}


@dataclass(frozen=True)
class QualityVerdicts:
    """The quality phase's verdicts (OUT/quality/quality.json, read and written by trainwise.study.store):
    per row its seeds' metric and the verdict against the baseline."""

    seeds: int
    rows: list[QualityRow]

    def to_dict(self) -> dict:
        return {"seeds": self.seeds, "rows": [r.to_dict() for r in self.rows]}

    @classmethod
    def from_dict(cls, d: dict) -> QualityVerdicts:
        names = {f.name for f in dataclasses.fields(QualityRow)}  # mean/low/high/eval_loss: derived
        unsaid = {"metric_name": "", "eval_losses": [], "random_init": False}  # a hand-written file may leave out
        rows = [QualityRow(**{**unsaid, **{k: v for k, v in r.items() if k in names}}) for r in d["rows"]]
        return cls(int(d["seeds"]), rows)


def unlearned(means: list[float], majority: float | None) -> str | None:
    """A line when no candidate's mean beats always answering the commonest class: the phase was too short
    for the task, so its verdicts compare nothing."""
    if majority is None or not means or max(means) > majority + 0.5:
        return None
    return (
        f"no candidate beats always answering the commonest class ({majority:.1f}%): the phase did not learn the "
        "task, so these verdicts compare nothing; raise --quality-steps (or --lr)"
    )
