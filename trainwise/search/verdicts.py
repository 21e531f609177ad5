"""The quality phase: the rows that matter, trained long enough for their quality to mean something.

A speed trial's quality is noise: 16 steps leave a 10-class model near chance. After the speed study,
`compare --quality-steps N` takes its candidates (the baseline and the rows on the Pareto front of time
and memory) and trains each for N optimizer steps with `--seeds K` seeds (the seed changes the head's
initialisation, dropout and the data order), each run a trial of the same loop in its own process,
evaluated on the held-out rows: a study of its own in `--out/quality`, resumable like any other.

Each row gets its metric and evaluation loss over the seeds (mean and range) and a verdict against the
baseline, "better"/"worse", "no significant difference" or "inconclusive", by a two-sided t-test at the 5% level:
paired where the rows ran the same seeds (they do: the seed is the repeat's), so the seed's own luck cancels,
else Welch's. A difference it does not call with 2 seeds is "inconclusive", not "no significant difference": two
seeds cannot tell an equal row from a worse one. The verdicts are
written to `--out/quality/quality.json` (by trainwise.study.store), which `advise` reads instead of the speed
trials' quality.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from trainwise.core.errors import ConfigError
from trainwise.core.quality import (  # the records, below the rooms that read them; here with the verdicts
    INCONCLUSIVE,
    NOT_SIGNIFICANT,
    QUALITY_DIR,
    QualityRow,
)
from trainwise.spec.config import StudyConfig
from trainwise.strategies.knobs import TrialPlan

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


def compare(row: list[float], baseline: list[float], paired: list[float] | None = None) -> tuple[str, str]:
    """The verdict of a row's seeds against the baseline's, and the test that gave it: two-sided at 5%, by the
    paired t-test where `paired` (the row's metric minus the baseline's, seed by seed) holds 2 or more pairs, else by
    Welch's. Not called with fewer than 3 seeds a row is INCONCLUSIVE (more seeds would decide), with more NOT
    SIGNIFICANT. The paired test calls a row that trains exactly as the baseline 1 time in 20, by construction; two
    seeds' ranges that did not overlap (the rule before) called it worse 1 time in 6 and better as often (issue 58)."""
    if paired is not None and len(paired) >= 2:
        n, t = len(paired), _t(paired)
        if n < 3 and math.isinf(t):  # two pairs apart by the same step (an accuracy moves in steps): no spread to read
            return INCONCLUSIVE, f"paired: both seeds {paired[0]:+.2f}, no spread to test over 2 seeds"
        critical = T975[n - 2] if n - 1 <= len(T975) else 1.96
        test = f"paired t={t:.2f} over {n} seeds, |t|>{critical:.2f} at 5%"
    elif len(row) < 2 or len(baseline) < 2:
        return "one seed: no verdict", "none"
    else:
        n = min(len(row), len(baseline))
        t, df, critical = welch(row, baseline)
        test = f"Welch t={t:.2f}, df={df:.1f}, |t|>{critical:.2f} at 5%"
    if abs(t) > critical:
        return ("better" if t > 0 else "worse"), test
    return (INCONCLUSIVE if n < 3 else NOT_SIGNIFICANT), test


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


def equal_samples(prepared, carried: dict[str, float] | None = None) -> dict[str, str]:
    """Every row trains on as many samples as the baseline, not for as many steps: a row whose step carries more
    samples (its own batch size, `row@bsN`, or packed rows: `carried`, the samples per step of each row over the
    baseline's, as the speed study measured them) takes as many fewer steps, which is how it would train; more
    samples would flatter its quality. Its learning rate is scaled by the square root of that ratio (the rule for
    Adam-family optimizers, Malladi et al. 2022, "On the SDEs and Scaling Rules for Adaptive Gradient Algorithms").
    Returns each scaled row's rule, in words."""
    cfg = prepared.config
    rules: dict[str, str] = {}
    specs = []
    for t in prepared.specs:
        ratio = (carried or {}).get(t.row) or t.settings.batch_size / cfg.batch_size
        if t.steps and abs(ratio - 1) > 0.05 and t.plan != TrialPlan():
            lr = t.settings.lr * math.sqrt(ratio)
            steps = max(cfg.warmup_steps + 1, round(t.steps / ratio))
            rules[t.row] = (
                f"{steps} steps at lr {lr:.3g}: its step carries {ratio:.2f}x the baseline's samples (the study's "
                f"rate {t.settings.lr:g} x sqrt({ratio:.2f}): the square-root rule for Adam-family optimizers)"
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
        row.seeds.append(spec.settings.seed)
        row.majority = r.metrics.get("majority_accuracy", row.majority)
        row.prior_loss = r.metrics.get("prior_loss", row.prior_loss)
        if r.metrics.get("eval_loss") is not None:
            row.eval_losses.append(float(r.metrics["eval_loss"]))
        if r.losses and r.train_loss is not None:
            row.first_losses.append(float(r.losses[0]))
            row.train_losses.append(float(r.train_loss))
        if spec.plan == TrialPlan():
            baseline = row
    for row in rows.values():
        if baseline is None:
            row.verdict = "no baseline: no verdict"
        elif row is baseline:
            row.verdict = "reference"
        else:
            row.delta = row.mean - baseline.mean
            row.verdict, row.test = compare(row.values, baseline.values, _paired(row, baseline, "values"))
    return list(rows.values())


# The plan's quality check: paired seeds (the candidate and the baseline trained with the same seed: the same head
# initialisation, dropout and data order), tested sequentially. MIN_SEEDS pairs first; while the check is
# undecided, one pair more, up to MAX_SEEDS.
MIN_SEEDS = 3
MAX_SEEDS = 6
# The chance the whole check rejects a row that trains exactly as the baseline does, over every look and both
# measures (Bonferroni: each look and measure tested one-sided at FALSE_REJECT / (looks x measures)). Two seeds'
# ranges that did not overlap rejected an equal row about 1 time in 6 (issue 58).
FALSE_REJECT = 0.05
# a check learned something when a row beats chance (or its training loss fell) at this one-sided level
LEARNED_LEVEL = 0.05
WORSE = "worse"
NO_LOSS = "no significant loss"
NO_VERDICT = "no verdict"


@dataclass(frozen=True)
class Check:
    """The plan's quality check of one candidate against the baseline, over paired seeds."""

    verdict: str  # WORSE | NO_LOSS | INCONCLUSIVE (one pair more would decide) | NO_VERDICT (nothing learned)
    seeds: int  # the pairs it rests on
    said: str  # how it was reached, in words
    metric_delta: float | None = None  # mean paired difference of the metric (candidate - baseline)
    loss_delta: float | None = None  # of the evaluation loss

    def to_dict(self) -> dict:
        return asdict(self)


def _critical(p: float, df: int) -> float:
    from scipy.stats import t  # heavy: scipy, only when a check runs

    return float(t.ppf(1 - p, df))


def _paired(a: QualityRow, b: QualityRow, values: str) -> list[float]:
    """a - b for each seed both rows finished (their `values` list: 'values' or 'eval_losses'); none where a row's
    list does not hold one figure per seed (an evaluation without a loss: the pairs would not be the seeds')."""
    if len(getattr(a, values)) != len(a.seeds) or len(getattr(b, values)) != len(b.seeds):
        return []
    mine = dict(zip(a.seeds, getattr(a, values), strict=True))
    theirs = dict(zip(b.seeds, getattr(b, values), strict=True))
    return [mine[s] - theirs[s] for s in sorted(mine.keys() & theirs.keys())]


def _t(diffs: list[float]) -> float:
    """The paired t statistic of mean(diffs) > 0 (infinite where every pair moved the same way by the same)."""
    mean = statistics.fmean(diffs)
    sd = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
    if sd == 0:
        return 0.0 if mean == 0 else math.copysign(math.inf, mean)
    return mean / (sd / math.sqrt(len(diffs)))


def learned(rows: list[QualityRow], metric_higher: bool = True) -> str | None:
    """None when the check learned something: a row's metric beats always answering the commonest class, or its
    evaluation loss beats the class frequencies' (classification), or its training loss fell (every task), each at
    LEARNED_LEVEL one-sided over its seeds. Else what was seen, in words."""
    for r in rows:
        n = len(r.values)
        if n < 2:
            continue
        crit = _critical(LEARNED_LEVEL, n - 1)
        if r.majority is not None and metric_higher and _t([v - r.majority for v in r.values]) > crit:
            return None
        lower = [r.prior_loss - v for v in r.eval_losses] if r.prior_loss is not None else []
        if len(lower) > 1 and _t(lower) > _critical(LEARNED_LEVEL, len(lower) - 1):
            return None
        if r.majority is None and len(r.train_losses) > 1:
            fell = [f - t for f, t in zip(r.first_losses, r.train_losses, strict=True)]
            if _t(fell) > _critical(LEARNED_LEVEL, len(fell) - 1):
                return None
    r = rows[0]
    if r.majority is not None:
        loss = f", evaluation loss {statistics.fmean(r.eval_losses):.2f}" if r.eval_losses else ""
        prior = f" (the class frequencies' {r.prior_loss:.2f})" if r.prior_loss is not None else ""
        return (
            f"no row beat always answering the commonest class ({r.majority:.1f}%){loss}{prior}: the check learned "
            f"nothing in {r.steps} steps"
        )
    return f"the training loss did not fall in {r.steps} steps: the check learned nothing"


def paired_check(candidate: QualityRow, baseline: QualityRow, drop: float | None, metric_higher: bool = True) -> Check:
    """The candidate's quality against the baseline's over their paired seeds. WORSE when the metric is lower
    beyond `drop` (--max-quality-drop, in the metric's units; 0 without one), or, without a `drop`, the evaluation
    loss higher, at FALSE_REJECT split over every look and measure; NO_LOSS when every measure's mean shows no loss
    beyond the drop, or after MAX_SEEDS pairs; else INCONCLUSIVE. NO_VERDICT when neither row learned anything."""
    sign = 1.0 if metric_higher else -1.0
    metric = [sign * -d for d in _paired(candidate, baseline, "values")]  # > 0: the candidate lost
    loss = _paired(candidate, baseline, "eval_losses")  # > 0: the candidate's loss is higher
    n = len(metric)
    m_delta = -sign * statistics.fmean(metric) if metric else None
    l_delta = statistics.fmean(loss) if loss else None
    if n < 2:
        return Check(NO_VERDICT, n, "fewer than 2 seeds of both rows finished", m_delta, l_delta)
    if (why := learned([baseline, candidate], metric_higher)) is not None:
        return Check(NO_VERDICT, n, why, m_delta, l_delta)
    allowed = drop or 0.0
    measures = [("the metric", [d - allowed for d in metric])]
    if drop is None and len(loss) == n and candidate.metric_name != "neg_eval_loss":
        measures.append(("the evaluation loss", loss))
    looks = MAX_SEEDS - MIN_SEEDS + 1
    level = FALSE_REJECT / (looks * len(measures))
    crit = _critical(level, n - 1)
    for name, diffs in measures:
        t = _t(diffs)
        if t > crit:
            return Check(WORSE, n, f"{name} worse: paired t={t:.2f} > {crit:.2f} ({n} seeds)", m_delta, l_delta)
    said = ", ".join(f"{name} t={_t(d):.2f}" for name, d in measures)
    if all(statistics.fmean(d) <= 0 for _name, d in measures):
        return Check(
            NO_LOSS, n, f"no loss on average over {n} paired seeds ({said}; worse past {crit:.2f})", m_delta, l_delta
        )
    if n >= MAX_SEEDS:
        return Check(
            NO_LOSS,
            n,
            f"not significantly worse after {n} paired seeds ({said}; worse past {crit:.2f})",
            m_delta,
            l_delta,
        )
    return Check(
        INCONCLUSIVE, n, f"a loss on average, not significant ({said}; worse past {crit:.2f})", m_delta, l_delta
    )
