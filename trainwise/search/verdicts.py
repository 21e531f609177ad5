"""The quality phase: the rows that matter, trained long enough for their quality to mean something.

A speed trial's quality is noise: 16 steps leave a 10-class model near chance. After the speed study,
`compare --quality-steps N` takes its candidates (the baseline and the rows on the Pareto front of time
and memory) and trains each for N optimizer steps with `--seeds K` seeds (the seed changes the head's
initialisation, dropout and the data order), each run a trial of the same loop in its own process,
evaluated on the held-out rows: a study of its own in `--out/quality`, resumable like any other.

Each row gets its metric and evaluation loss over the seeds (mean and range) and a verdict against the
baseline, "better"/"worse", "no significant difference" or "inconclusive". With 2 seeds a difference is called only
when the seeds' ranges do not overlap (a coarse test, and the table says so); ranges that overlap are
"inconclusive", not "no significant difference": two seeds cannot tell an equal row from a worse one (a digits plan
at 6.25 and 11.88 against the baseline's 23.13 and 11.88 only touched). With 3 or more seeds per row, by Welch's
t-test at the 5% level (two-sided; the seeds' variances need not be equal). The verdicts are
written to `--out/quality/quality.json` (by trainwise.study.store), which `advise` reads instead of the speed
trials' quality.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from trainwise.core.config import StudyConfig
from trainwise.core.errors import ConfigError
from trainwise.strategies.knobs import TrialPlan

QUALITY_DIR = "quality"
NOT_SIGNIFICANT = "no significant difference"
INCONCLUSIVE = "inconclusive"  # 2 seeds whose ranges overlap: more seeds would decide


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
    test: str = ""  # how the verdict was reached (range overlap with 2 seeds, Welch's t-test with 3 or more)
    majority: float | None = None  # accuracy: what always answering the commonest held-out class scores

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


# Student's t, two-sided 95% (the 0.975 quantile), for 1..30 degrees of freedom; the normal's beyond
# fmt: off
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
# fmt: on


def welch(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """Welch's t-test of mean(a) - mean(b): (t, degrees of freedom, the 95% two-sided critical t). The
    degrees of freedom (Welch-Satterthwaite) are rounded down for the table: slightly conservative."""
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    diff = statistics.fmean(a) - statistics.fmean(b)
    if va + vb == 0:  # every seed gave the same figure in both rows
        return (0.0 if diff == 0 else float("inf") * (1 if diff > 0 else -1)), float("inf"), 1.96
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    critical = T975[max(1, int(df)) - 1] if df < len(T975) + 1 else 1.96
    return diff / (va + vb) ** 0.5, df, critical


def compare(row: list[float], baseline: list[float]) -> tuple[str, str]:
    """The verdict of a row's seeds against the baseline's, and the test that gave it."""
    if len(row) < 2 or len(baseline) < 2:
        return "one seed: no verdict", "none"
    if len(row) >= 3 and len(baseline) >= 3:
        t, df, critical = welch(row, baseline)
        test = f"Welch t={t:.2f}, df={df:.1f}, |t|>{critical:.2f} at 5%"
        return ("better" if t > 0 else "worse") if abs(t) > critical else NOT_SIGNIFICANT, test
    test = "seeds' ranges overlap?"
    if min(row) > max(baseline):
        return "better", test
    return ("worse" if max(row) < min(baseline) else INCONCLUSIVE), test


def check(steps: int | None, seeds: int) -> None:
    if steps is not None and steps < 2:
        raise ConfigError(f"--quality-steps must be >= 2 optimizer steps, got {steps}")
    if seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {seeds}")


def quality_config(cfg: StudyConfig, rows: list[str], steps: int, seeds: int) -> StudyConfig:
    """The quality study: the same model, data and settings, the chosen rows, longer, one trial per seed."""
    return dataclasses.replace(
        cfg,
        out=str(Path(cfg.out) / QUALITY_DIR),
        strategies=rows,
        max_steps=steps,
        warmup_steps=min(cfg.warmup_steps, steps - 1),
        repeat=seeds,
        seed_per_repeat=True,
        remeasure=False,
        retries=0,  # quality, not timing: a run under load trains the same
        batch_sizes=(),
        num_workers=(cfg.num_workers[0],),
    )


def equal_samples(prepared) -> dict[str, str]:
    """A row at its own batch size (`row@bsN`) trains on as many samples as the baseline, not for as many steps:
    fewer, larger steps are what it would train with, and more samples would flatter its quality. It trains the way
    a user would train at that batch: the learning rate scaled by the square root of the batch's ratio (the rule for
    Adam-family optimizers, Malladi et al. 2022, "On the SDEs and Scaling Rules for Adaptive Gradient Algorithms"),
    not held to the study's rate with a quarter of its steps. Returns each sized row's rule, in words."""
    cfg = prepared.config
    rules: dict[str, str] = {}
    specs = []
    for t in prepared.specs:
        if t.steps and t.settings.batch_size != cfg.batch_size:  # a quality study sweeps no batch: a sized row
            ratio = t.settings.batch_size / cfg.batch_size
            lr = t.settings.lr * math.sqrt(ratio)
            steps = max(cfg.warmup_steps + 1, round(t.steps / ratio))
            rules[t.row] = (
                f"lr {lr:.3g} (the study's {t.settings.lr:g} x sqrt({t.settings.batch_size}/{cfg.batch_size}): the "
                "square-root rule for Adam-family optimizers)"
            )
            t = dataclasses.replace(t, steps=steps, settings=dataclasses.replace(t.settings, lr=lr))
        specs.append(t)
    prepared.specs[:] = specs
    return rules


def verdicts(trials: list, random_init: bool) -> list[QualityRow]:
    """Per row (in first-seen order) its seeds' metric and evaluation loss, and the verdict vs the baseline."""
    rows: dict[str, QualityRow] = {}
    baseline = None
    for spec, r in trials:
        if r.status != "ok" or r.metric is None:
            continue
        row = rows.setdefault(spec.row, QualityRow(spec.row, r.metric_name or "", [], [], spec.steps or 0, random_init))
        row.values.append(float(r.metric))
        row.majority = r.metrics.get("majority_accuracy", row.majority)
        if r.metrics.get("eval_loss") is not None:
            row.eval_losses.append(float(r.metrics["eval_loss"]))
        if spec.plan == TrialPlan():
            baseline = row
    for row in rows.values():
        if baseline is None:
            row.verdict = "no baseline: no verdict"
        elif row is baseline:
            row.verdict = "reference"
        else:
            row.delta = row.mean - baseline.mean
            row.verdict, row.test = compare(row.values, baseline.values)
    return list(rows.values())


def unlearned(means: list[float], majority: float | None) -> str | None:
    """A line when no candidate's mean beats always answering the commonest class: the phase was too short
    for the task, so its verdicts compare nothing."""
    if majority is None or not means or max(means) > majority + 0.5:
        return None
    return (
        f"no candidate beats always answering the commonest class ({majority:.1f}%): the phase did not learn the "
        "task, so these verdicts compare nothing; raise --quality-steps (or --lr)"
    )
