"""advise: pure function from a study's rows and the user's constraints to ranked plans.

No measurement happens here. Input is the aggregated rows of a study (results.json); output is
every row with a verdict (feasible? on the Pareto front of time, memory and quality? why it wins
or loses) ranked by the objective, and the recommended row. Rows are compared with a reference:
the baseline when it ran, else the best row for the objective (a study without a baseline can
still be advised on).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from trainwise.core.errors import ConfigError, check_number
from trainwise.core.quality import INCONCLUSIVE, NOT_SIGNIFICANT, QualityVerdicts, unlearned
from trainwise.core.results import StudyRow
from trainwise.core.units import parse_bytes, parse_seconds
from trainwise.report.format import RANDOM_INIT_NOTE, human_bytes
from trainwise.training.measure.memory import CUDA_CONTEXT_BYTES

OBJECTIVES = ("time", "cost", "quality")


@dataclass(frozen=True)
class Constraints:
    objective: str = "time"
    memory_budget_bytes: int | None = None
    max_quality_drop: float | None = None  # in the metric's own units (accuracy points, ROUGE points)
    max_epoch_s: float | None = None  # time budget: the projected epoch of a row
    max_epoch_usd: float | None = None  # cost budget: a row's $/epoch (a priced study)

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"--objective must be one of {', '.join(OBJECTIVES)}, not {self.objective!r}")
        if self.max_quality_drop is not None:
            check_number("--max-quality-drop", self.max_quality_drop, inclusive=True)
        if self.max_epoch_usd is not None:
            check_number("--max-epoch-cost", self.max_epoch_usd)

    @classmethod
    def of(cls, params: dict) -> Constraints:
        """From the `advise` command's options."""
        memory, epoch = params.get("memory_budget"), params.get("max_epoch_time")
        return cls(
            params.get("objective", "time"),
            parse_bytes(memory) if memory is not None else None,
            params.get("max_quality_drop"),
            parse_seconds(epoch, "--max-epoch-time") if epoch is not None else None,
            params.get("max_epoch_cost"),
        )


@dataclass
class Verdict:
    strategy: str
    status: str
    feasible: bool
    pareto: bool
    reason: str
    rel_time: float | None = None  # vs the reference row
    rel_mem: float | None = None
    quality_delta: float | None = None  # metric - reference metric (a speed trial's too: see quality_measured)
    cost_per_epoch: float | None = None  # USD, when the row's study was priced
    quality: str = "-"  # the quality column: the quality phase's difference ("-4.06"), else the speed trials' figures
    quality_measured: bool = False  # quality_delta is the quality phase's (tested over seeds), not a short trial's


@dataclass
class Advice:
    reference: str | None  # the row everything is relative to
    verdicts: list[Verdict]  # ranked: feasible Pareto rows first, by objective
    recommended: str | None
    notes: list[str]


def _time(row: StudyRow) -> float:
    return 1.0 / (row.samples_per_s or 0.0)  # seconds per sample: epoch time up to a constant (advise: ok rows)


def _mem(row: StudyRow) -> float:
    return row.peak_mem_bytes or 0


def needs(row: StudyRow) -> int:
    """What a row needs of a device, on the basis `trainwise estimate`'s total uses: the peak of live
    tensors plus the runtime (CUDA: the context; CPU: the trial process's RSS before the model was built,
    i.e. torch + transformers + the data). Compared with --memory-budget."""

    runtime = CUDA_CONTEXT_BYTES if row.mem_kind == "cuda_allocated" else row.rss_before_model_bytes or 0
    return int(_mem(row)) + int(runtime)


def _dominates(a: StudyRow, b: StudyRow, quality: Callable[[StudyRow], float | None]) -> bool:
    """a is no worse than b in time, memory and quality (`quality`: counted_quality), and better in one. A row
    without a quality figure (not trained by the quality phase) never dominates one with it: it cannot be shown
    no worse; one with a quality figure may dominate one without (b's quality is unknown, so nothing is shown
    to favour it)."""
    qa, qb = quality(a), quality(b)
    if qa is None and qb is not None:
        return False
    q_no_worse = qb is None or (qa is not None and qa >= qb)
    q_better = qa is not None and qb is not None and qa > qb
    ca, cb = a.cost_per_epoch, b.cost_per_epoch  # rows priced differently (several studies)
    c_no_worse = ca is None or cb is None or ca <= cb
    c_better = ca is not None and cb is not None and ca < cb
    no_worse = _time(a) <= _time(b) and _mem(a) <= _mem(b) and q_no_worse and c_no_worse
    better = _time(a) < _time(b) or _mem(a) < _mem(b) or q_better or c_better
    return no_worse and better


def _objective_key(objective: str, quality: Callable[[StudyRow], float | None]) -> Callable[[StudyRow], tuple]:
    if objective == "quality":
        return lambda r: (-(q if (q := quality(r)) is not None else float("-inf")), _time(r))
    if objective == "cost":  # $/epoch where priced (advise refuses a mix); on one price it ranks like time
        return lambda r: (r.cost_per_epoch or 0.0, _time(r), _mem(r))
    return lambda r: (_time(r), _mem(r))


def _duration(seconds: float) -> str:
    return (
        f"{seconds:.0f} s"
        if seconds < 120
        else f"{seconds / 60:.1f} min"
        if seconds < 7200
        else f"{seconds / 3600:.1f} h"
    )


def _pct(x: float) -> str:
    return f"{100 * (x - 1):+.0f}%"


def one_kind(rows: list[StudyRow]) -> tuple[list[StudyRow], str | None]:
    """A study over several device kinds (a Ray cluster) ranked within one: the first row's kind (its baseline's
    first), and a note naming the rows left out; rows of one kind (or none) as they are."""
    kinds = list(dict.fromkeys(r.device_kind for r in rows if r.device_kind))
    if len(kinds) <= 1:
        return rows, None
    first = next((r.device_kind for r in rows if r.baseline and r.device_kind), kinds[0])
    others = [r.strategy for r in rows if r.device_kind not in (first, None)]
    note = (
        f"ranked on {first} only: a row is compared only with a baseline of its own device kind, so the "
        f"{len(others)} row(s) measured on {', '.join(k for k in kinds if k != first)} are not ranked against these"
    )
    return [r for r in rows if r.device_kind in (first, None)], note


def advise(rows: list[StudyRow], constraints: Constraints) -> Advice:
    rows, kind_note = one_kind(rows)
    ok = [r for r in rows if r.status == "ok" and r.samples_per_s and r.peak_mem_bytes]
    notes: list[str] = [kind_note] if kind_note else []
    prices = {r.cost_note for r in ok if r.cost_per_epoch is not None}
    if constraints.objective == "cost" and len(prices) <= 1:
        notes.append(
            "cost ranks like time here: every row ran at the same price per hour (advise several studies, "
            "each priced for its machine, to rank by cost across devices)"
        )
    if constraints.objective == "cost" and prices and (bare := [r.strategy for r in ok if r.cost_per_epoch is None]):
        raise ConfigError(
            f"--objective cost: {', '.join(bare)} have no price; price their study with compare --out STUDY "
            "--price-per-hour P (or --sku), which re-reports it from the store without re-running"
        )
    if not ok:
        verdicts = [Verdict(r.strategy, r.status, False, False, f"no result: {r.message}") for r in rows]
        return Advice(None, verdicts, None, ["no row finished ok; nothing to advise on", *notes])

    if any(r.random_init and r.metric is not None for r in ok):
        notes.append(RANDOM_INIT_NOTE)
    reference = next((r for r in ok if r.baseline), None) or min(
        ok, key=_objective_key(constraints.objective, lambda r: r.metric)
    )

    def quality(r: StudyRow) -> float | None:
        return counted_quality(r, reference)

    key = _objective_key(constraints.objective, quality)
    if not reference.baseline:
        notes.append(
            f"no successful baseline row: figures are relative to {reference.strategy!r}, "
            f"the best row for {constraints.objective}"
        )
    budget = constraints.memory_budget_bytes
    ref_q = reference.metric

    if constraints.max_epoch_usd is not None and not any(r.cost_per_epoch is not None for r in ok):
        raise ConfigError(
            "--max-epoch-cost: the study has no prices; run compare with --price-per-hour or --sku (or --price-file)"
        )

    def infeasible_reason(r: StudyRow) -> str | None:
        epoch, usd = r.epoch_time_s, r.cost_per_epoch
        if constraints.max_epoch_s is not None and epoch is not None and epoch > constraints.max_epoch_s:
            return f"an epoch takes {_duration(epoch)}, more than --max-epoch-time {_duration(constraints.max_epoch_s)}"
        if constraints.max_epoch_usd is not None and usd is not None and usd > constraints.max_epoch_usd:
            return f"an epoch costs ${usd:.4g}, more than --max-epoch-cost ${constraints.max_epoch_usd:g}"
        if budget is not None and needs(r) > budget:
            return (
                f"needs {human_bytes(needs(r))} (peak tensors {human_bytes(r.peak_mem_bytes)} + runtime), "
                f"more than the budget {human_bytes(budget)}"
            )
        drop, q = constraints.max_quality_drop, quality(r)
        if drop is not None and ref_q is not None and r.metric is not None and q is not None and ref_q - q > drop:
            return f"{r.metric_name} {r.metric:.2f} is more than {drop:g} below the reference ({ref_q:.2f})" + (
                "" if r.quality_verdict else _short_drop(r, reference)
            )
        return None

    feasible = [r for r in ok if infeasible_reason(r) is None]
    front = [r for r in feasible if not any(_dominates(o, r, quality) for o in feasible if o is not r)]
    if budget is not None and not feasible:
        smallest = min(ok, key=needs)
        notes.append(
            f"nothing fits {human_bytes(budget)}: the smallest row, {smallest.strategy!r}, needs "
            f"{human_bytes(needs(smallest))}; try a smaller batch, grad_ckpt + grad_accum, "
            "freezing, or (issue 3) ZeRO offload / LoRA"
        )

    judged = any(r.quality_verdict for r in ok)  # quality from the quality phase (with_quality)
    verdicts = []
    for r in sorted(ok, key=key):
        rel_t, rel_m = _time(r) / _time(reference), _mem(r) / _mem(reference)
        dq = r.metric - ref_q if r.metric is not None and ref_q is not None else None
        column, said = quality_shown(r, reference)
        effect = f"{_pct(rel_t)} time, {_pct(rel_m)} memory" + (f", {said}" if said else "")
        why = infeasible_reason(r)
        if why:
            reason = f"excluded: {why}"
        elif r in front:
            reason = f"Pareto-optimal: {effect}"
        else:
            by = next((o for o in feasible if o.metric is not None and _dominates(o, r, quality)), None) or next(
                o for o in feasible if _dominates(o, r, quality)
            )  # a row whose quality is known is the better witness
            worse = (
                "no worse quality"
                if r.metric is not None
                else "its quality measured"
                if by.metric is not None
                else "neither's quality known"
            )
            dearer = ", no dearer" if by.cost_per_epoch is not None and len(prices) > 1 else ""
            reason = f"dominated by {by.strategy} (no slower, no more memory{dearer}, {worse}): {effect}"
        if r is reference:
            reason = f"reference row; {reason}"
        if judged and r.metric is None:
            reason += "; quality unknown (not trained by the quality phase)"
        if r.contended:
            reason += "; timed under load (unreliable)"
        elif r.uncertain:
            reason += "; its time difference from the baseline is within what other processes' load could explain"
        if r.support_note:  # its precision is emulated or inert on this device: why its time is what it is
            reason += f"; {r.support_note}"
        measured = dq is not None and bool(r.quality_verdict)
        verdicts.append(
            Verdict(
                r.strategy, "ok", why is None, r in front, reason, rel_t, rel_m, dq, r.cost_per_epoch, column, measured
            )
        )
    verdicts.sort(key=lambda v: (not v.pareto, not v.feasible))  # stable: keeps the objective order inside
    for r in rows:
        if r not in ok:
            reason = f"did not run to completion ({r.status}): {r.message}"
            verdicts.append(Verdict(r.strategy, r.status, False, False, reason))
    best = min(front, key=key) if front else None
    loaded = [r.strategy for r in ok if r.contended]
    if loaded:
        notes.append(
            f"timed under load, so their times are unreliable: {', '.join(loaded)}; run the study again on a "
            "quiet machine before trusting a ranking by time or cost"
        )
    if judged and best is not None and best.metric is None:
        notes.append(
            f"the recommended row {best.strategy!r} has no quality verdict (the rows that would dominate it "
            "were excluded): give compare --strategies with it and --quality-steps before relying on its quality"
        )
    if best is not None and (caution := quality_caution(best, reference)) is not None:
        notes.append(caution)
        pick = next(v for v in verdicts if v.strategy == best.strategy)
        pick.reason += "; caution: its quality is a short trial's, below the reference's (see the note)"
    if best is not None and best is not reference and best.within_noise and constraints.objective != "quality":
        notes.append(
            f"{best.strategy!r} is within the noise floor (±{100 * (best.noise_floor or 0.0):.1f}%) of "
            f"{reference.strategy!r} in time: its lead may be noise (--repeat 3 narrows it)"
        )
    return Advice(reference.strategy, verdicts, best.strategy if best else None, notes)


def quality_noise(row: StudyRow, reference: StudyRow) -> float | None:
    """How far two rows' accuracy may differ by the held-out sample alone, in points: one standard error of
    the difference of two proportions over the study's `eval_samples` held-out rows (None: another metric,
    or the count is unknown). The rows are scored on the same samples, so this errs towards noise."""
    n = row.eval_samples
    if row.metric_name != "accuracy" or not n or row.metric is None or reference.metric is None:
        return None
    p, q = row.metric / 100, reference.metric / 100
    return 100 * ((p * (1 - p) + q * (1 - q)) / n) ** 0.5


def _trial(row: StudyRow) -> str:
    return f"a {row.trial_steps}-step trial" if row.trial_steps else "a speed trial"


def _figure(row: StudyRow, value: float) -> str:
    return f"{value:.1f}%" if row.metric_name == "accuracy" else f"{value:.2f}"


QUALITY_PHASE = "run the quality phase: --quality-steps N --seeds 3"
# a speed trial's quality difference counts (excludes, dominates, ranks) only beyond this many standard errors of
# the held-out noise: about the 5% level the quality phase tests at, and still a lower bound on a short trial's
# noise (another seed or data order moves it more). quality_caution warns from one standard error.
COUNTED_BEYOND_SE = 2.0


def _short_drop(row: StudyRow, reference: StudyRow) -> str:
    """Why a speed trial's drop excludes a row: it is beyond the held-out noise, or there is no noise estimate."""
    noise = quality_noise(row, reference)
    beyond = (
        f"beyond {COUNTED_BEYOND_SE:g}x its held-out noise (±{noise:.2f})"
        if noise is not None
        else "with no noise estimate"
    )
    return f" in {_trial(row)}, {beyond} ({QUALITY_PHASE} to measure it)"


def counted_quality(row: StudyRow, reference: StudyRow) -> float | None:
    """The quality advise ranks, excludes (--max-quality-drop) and compares (Pareto) a row by: its metric,
    except that a speed trial's difference from the reference (no quality phase verdict) within
    COUNTED_BEYOND_SE standard errors of the held-out noise (quality_noise) counts as none: the row gets the
    reference's metric, as with_quality does for a difference the quality phase does not call. A few steps'
    quality that close is no reason to prefer or exclude a row. Without a noise estimate (another metric, or
    the held-out count unknown) the metric counts as it is."""
    if row.quality_verdict or row.metric is None or reference.metric is None:
        return row.metric
    noise = quality_noise(row, reference)
    within = noise is not None and abs(row.metric - reference.metric) <= COUNTED_BEYOND_SE * noise
    return reference.metric if within else row.metric


def quality_shown(row: StudyRow, reference: StudyRow) -> tuple[str, str]:
    """A row's quality as advise shows it: the quality column and the words in its reason. A difference the
    quality phase measured is signed ("-4.06", "-4.06 accuracy"); a speed trial's is never shown as a gain or
    a loss, only as the two figures and what they are ("accuracy 62.5% vs 52.5% (a 16-step trial: not a
    measured difference; run the quality phase: ...)"). ("-", "") without a quality figure."""
    if row.metric is None or reference.metric is None:
        return "-", ""
    if row.quality_verdict:
        dq = row.metric - reference.metric
        return f"{dq:+.2f}", f"{dq:+.2f} {row.metric_name}"
    steps = f"{row.trial_steps} steps" if row.trial_steps else "speed trial"
    mine = _figure(row, row.metric)
    if row is reference:
        return f"{mine} ({steps})", f"{row.metric_name} {mine} ({_trial(row)})"
    theirs = _figure(reference, reference.metric)
    what = "" if mine == theirs else f": not a measured difference; {QUALITY_PHASE}"  # no difference shown: no hint
    return f"{mine} vs {theirs} ({steps})", f"{row.metric_name} {mine} vs {theirs} ({_trial(row)}{what})"


def quality_caution(best: StudyRow, reference: StudyRow) -> str | None:
    """A caution when the pick's quality is below the reference's beyond the noise and that quality comes
    from the speed trials (a few steps each; no quality phase judged it): a weak signal either way, which
    the quality phase (compare --quality-steps, over seeds) measures before the pick is adopted."""
    if best is reference or best.quality_verdict or best.metric is None:
        return None
    if reference.metric is None or reference.quality_verdict:
        return None
    drop, noise = reference.metric - best.metric, quality_noise(best, reference)
    if drop < 0.005 or (noise is not None and drop <= noise):  # not shown (2 decimals), or within the noise
        return None
    steps = f"{best.trial_steps}-step " if best.trial_steps else ""
    within = (
        f"more than the held-out noise (±{noise:.2f}: one standard error over {best.eval_samples} samples)"
        if noise is not None
        else "with no noise estimate for this metric"
    )
    return (
        f"caution: {best.strategy!r} scored {drop:.2f} {best.metric_name} points below {reference.strategy!r} "
        f"({best.metric:.2f} vs {reference.metric:.2f}) in the {steps}speed trials, {within}; a short trial's "
        "quality is a weak signal: before adopting it, run the study's compare again with --quality-steps N "
        "(e.g. 200) --seeds 3, whose quality phase trains the candidates longer over seeds and tests the difference"
    )


def pick(rows: list[StudyRow], name: str | None, where: str) -> StudyRow:
    """A study's row by its table name or its row text, or the one advise recommends (objective time, no
    constraints) when `name` is None; ConfigError naming `where` (e.g. "--study runs/x") when there is none."""
    if name is None:
        advice = advise(rows, Constraints())
        if advice.recommended is None:
            raise ConfigError(f"{where}: no row finished ok; pass --strategies")
        name = advice.recommended
    found = next((r for r in rows if r.strategy == name), None) or next((r for r in rows if r.row == name), None)
    if found is None:
        raise ConfigError(f"{where}: no row {name!r}; its rows: {', '.join(r.strategy for r in rows)}")
    return found


def with_quality(rows: list[StudyRow], verdicts: QualityVerdicts) -> tuple[list[StudyRow], str]:
    """Rows whose quality is the quality phase's (quality/quality.json), not the speed trials': a row's
    metric becomes its seeds' mean, or the baseline's when the difference is not significant (so it
    neither dominates nor is excluded by --max-quality-drop on noise); rows the phase did not train
    have no quality. Returns the rows and a note saying so."""

    by_row = {q.strategy: q for q in verdicts.rows}
    reference = next((q for q in verdicts.rows if q.verdict == "reference"), None)
    out = []
    for r in rows:
        q = by_row.get(r.row_text)
        if q is None:
            out.append(dataclasses.replace(r, metric=None))
            continue
        # an uncalled difference counts as none: "no significant difference", and two seeds that cannot decide
        metric = reference.mean if q.verdict in (NOT_SIGNIFICANT, INCONCLUSIVE) and reference is not None else q.mean
        verdict = f"{q.verdict} ({q.low:.2f}-{q.high:.2f} over {len(q.values)} seeds)"
        out.append(dataclasses.replace(r, metric=metric, quality_verdict=verdict))
    steps = verdicts.rows[0].steps if verdicts.rows else 0
    note = (
        f"quality from the quality phase ({steps} steps x {verdicts.seeds} seeds) for "
        + ", ".join(by_row)
        + "; a difference its test does not call (the paired t over the seeds, 5%) counts as "
        "none; the other rows' short-trial quality is not used"
    )

    means = [q.mean for q in verdicts.rows]
    majority = verdicts.rows[0].majority if verdicts.rows else None
    if (line := unlearned(means, majority)) is not None:
        note += f"; but {line}"
    return out, note
