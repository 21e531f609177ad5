"""The plan search: one rule for what to measure next, repeats where they decide, and the pick by a test.

1. The first trial is the greedy stack, as an engineer writes it: every strategy that helped alone beyond the noise,
   fastest first, each kept where the registry lets it join and it sets something the stack does not already set.
2. Then, each trial is the candidate with the largest expected improvement (EI) over the incumbent (the measured
   candidate with the lowest posterior time) under the model (`trainwise.search.model`), while that EI is at least
   MIN_GAIN of the incumbent's time, and until --max-trials or --max-search-time are spent. A candidate's batch may
   be at most twice the largest batch measured so far (the model's batch terms are local).
3. Repeats: while measured candidates are not significantly slower than the fastest (one-sided, Z_TIE), the fastest
   and the closest of them are measured again beside the baseline (REPEAT_ROWS, REPEAT_ROUNDS).
4. The pick is the simplest candidate (fewest strategies, the study's batch) not significantly slower than the
   fastest.

Pure: no files, no trials. `measure(rows)` and `repeat(rows)` return observations, so the driver
(`trainwise.api.plan`) runs them as rows of a study, and a test or the replay benchmark serves them from made-up or
measured figures.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from trainwise import strategies
from trainwise.search.model import MemoryModel, TimeModel, lognormal_ei
from trainwise.search.plan_inputs import Choice, Key, Observation, Space, features, row_text

# A trial is worth running while its expected improvement is at least this share of the incumbent's time. Replayed
# on four measured spaces (BENCHMARKS §D2), 1% reached the best within noise in a third of the trials or fewer; a
# smaller share bought trials that rarely changed the pick.
MIN_GAIN = 0.01
# "Significantly slower": one-sided at 95% (z 1.645) on the posterior difference of two candidates' log times.
Z_TIE = 1.645
REPEAT_ROWS = 3  # the fastest and at most two others within reach of it, measured again a round
# at most this many rounds of repeats: on a CPU whose trials move ±5-10%, four runs of a row halve its interval;
# enough to tell apart leaders 6% apart (the pick then loses at most that)
REPEAT_ROUNDS = 3
# the noise of one trial (log time) before a study says its own: the §D2 spaces' rows, three trials each, moved
# 2-9% (median sd); SIGMA_WEIGHT trials' worth of it, pooled with what the study's repeats and misses show
SIGMA_PRIOR = 0.05
SIGMA_WEIGHT = 4.0
# what a prediction misses beyond the model's own uncertainty, before any miss is measured: none, worth 2 misses (a
# composition the model cannot express, a short trial's batches; the §D2 spaces' first misses, both ways)
MODEL_ERROR_PRIOR = 0.0
MODEL_ERROR_WEIGHT = 2.0


@dataclass
class Candidate:
    """A candidate the search measured or considered: what it predicted (median and 90% interval), what it measured,
    and why it was chosen."""

    row: str
    reason: str
    predicted_time: float | None = None  # relative to the baseline (the lognormal's median)
    predicted_low: float | None = None
    predicted_high: float | None = None
    expected_gain: float | None = None  # EI over the incumbent, a share of its time
    state: str = "proposed"  # proposed | measured | failed | repeated | pruned
    measured_time: float | None = None
    measured_mem: float | None = None
    note: str = ""
    batch: int | None = None
    trial: int | None = None
    miss: float | None = None  # measured / predicted time (> 1: the prediction was optimistic)
    round: int = 0  # kept for plan.json readers: the trial's number


@dataclass
class Search:
    """What a search did: every candidate it measured, the pick and the fastest, their posterior times, and why it
    stopped."""

    noise: float  # one trial's noise at the end (log time: the prior pooled with the repeats)
    incumbent: str | None  # the pick
    model_error: float = 0.0  # what the predictions missed beyond their own uncertainty and the noise (log)
    candidates: list[Candidate] = field(default_factory=list)
    stopped: str = ""
    trials: int = 0  # search trials (the repeats are counted apart)
    repeats: int = 0  # trials of the repeat rounds (the baseline's included)
    wall_s: float = 0.0
    rounds: int = 0
    fastest: str | None = None
    study_noise: float | None = None
    # measured candidates' posterior times: row -> [median, low, high] (90%), the pick's rivals first
    times: dict[str, list[float]] = field(default_factory=dict)
    contenders: list[str] = field(default_factory=list)  # not significantly slower than the fastest
    skipped: int = 0  # candidates never measured
    # the reference (the ecosystem's default) against the pick: {row, ratio (its time over the pick's), low, high
    # (90%), faster (the pick is significantly faster)}; None: no reference measured
    versus: dict | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Searching:
    """What one search call works from: the space, the budget, the callbacks."""

    space: Space
    valid: Callable[[frozenset[str]], str | None]  # the registry and --only / --never
    accum: int = 1
    measure: Callable[[list[str]], list[Observation]] = lambda _rows: []
    repeat: Callable[[list[str]], list[Observation]] | None = None
    memory: MemoryModel | None = None
    max_trials: int = 8
    max_seconds: float | None = None
    clock: Callable[[], float] = time.monotonic
    run_s: float | None = None  # the planned run at the baseline's pace (a one-time cost is charged against it)
    earlier: Sequence[Candidate] = ()  # what an earlier run of this search measured (a resumed search's budget)
    study_noise: float | None = None  # the study's own floor (shown)
    reference: str | None = None  # the row the pick is tested against (the ecosystem's default)
    on_trial: Callable[[Search], None] = lambda _s: None


def noise(deviations: Sequence[float]) -> float:
    """One trial's noise (log time): SIGMA_PRIOR worth SIGMA_WEIGHT trials, pooled with the squared log deviations of
    repeated trials (`deviations`, one degree of freedom each)."""
    return math.sqrt((SIGMA_WEIGHT * SIGMA_PRIOR**2 + sum(deviations)) / (SIGMA_WEIGHT + len(deviations)))


def model_error(misses: Sequence[tuple[float, float]], sigma: float) -> float:
    """What the model's predictions miss beyond what it said it did not know and beyond one trial's noise (log): each
    miss (log measured / predicted, the prediction's variance) gives max(0, miss^2 - variance - sigma^2), pooled with
    MODEL_ERROR_PRIOR worth MODEL_ERROR_WEIGHT misses. It widens every prediction of a row not yet measured."""
    total = MODEL_ERROR_WEIGHT * MODEL_ERROR_PRIOR**2 + sum(max(0.0, r * r - v - sigma * sigma) for r, v in misses)
    return math.sqrt(total / (MODEL_ERROR_WEIGHT + len(misses)))


def simplicity(choice_names: frozenset[str], batch: int, study_batch: int) -> int:
    """How much a row changes: its strategies, and one for a batch size of its own."""
    return len(choice_names) + (batch != study_batch)


def greedy(
    helpers: Sequence[str], valid: Callable[[frozenset[str]], str | None], accum: int, space: Space
) -> frozenset[str]:
    """The stack an engineer writes first: each helper (the fastest first) that the registry lets join the ones
    before it and that sets something they do not (dynamic_pad after smart_batch sets nothing new; tf32 beside
    bf16 overlaps it); one refused for want of another (cce before bf16) joins once that one is in."""
    stack: frozenset[str] = frozenset()
    waiting: list[str] = []

    def joins(n: str) -> bool:
        if valid(stack | {n}) is not None or strategies.REGISTRY[n].overlaps & stack:
            return False
        before, after = (
            space.simplest(stack, space.study_batch, accum),
            space.simplest(stack | {n}, space.study_batch, accum),
        )
        return after is not None and (before is None or before.key != after.key)

    for n in helpers:
        if not joins(n):
            waiting.append(n)
            continue
        stack |= {n}
        for w in list(waiting):
            if joins(w):
                stack |= {w}
                waiting.remove(w)
    return stack


def search(start: Sequence[Observation], how: Searching, deviations: Sequence[float] = ()) -> Search:
    """Measure candidates of `how.space` by expected improvement from the observations in `start` (the study's rows),
    then repeat the leaders and pick (see the module's docstring). `deviations`: squared log deviations of repeated
    trials the study already holds (its baseline's runs)."""
    began = how.clock()
    space = how.space
    obs = list(start)
    devs = list(deviations)
    misses: list[tuple[float, float]] = []
    result = Search(noise(devs), None, study_noise=how.study_noise)
    result.candidates = list(how.earlier)
    result.trials = len(how.earlier)
    measured: set[Key] = {o.key for o in obs}
    choices = list(space.choices.values())

    def pickable(c: Choice) -> bool:
        return how.valid(c.names) is None if c.names else True

    def fit() -> TimeModel:
        result.noise = noise(devs)
        result.model_error = model_error(misses, result.noise)
        return TimeModel(obs, choices, space.study_batch, result.noise)

    def charge_of(key: Key) -> float:
        """A one-time cost over the planned run (compile), relative to the baseline's time: the candidate's own
        compile where measured, else the median of the compiling rows'."""
        if not how.run_s or "compile=True" not in features(key.plan):
            return 0.0
        own = [o.compile_s for o in obs if o.key == key and o.compile_s]
        alike = [o.compile_s for o in obs if o.compile_s and "compile=True" in features(o.key.plan)]
        found = own or alike
        return float(np.median(found)) / how.run_s if found else 0.0

    def charge(c: Choice) -> float:
        return charge_of(c.key)

    def best_measured(model: TimeModel) -> tuple[list[Choice], np.ndarray, np.ndarray]:
        """The measured candidates that may be picked (feasible, allowed), and their posterior log times (a one-time
        cost added) and variances."""
        ok_keys = {o.key for o in obs if o.feasible}
        mine = [c for c in choices if c.key in ok_keys and pickable(c)]
        pred = model.predict([(c.features, c.key.batch) for c in mine])
        extra = np.array([charge(c) for c in mine])
        mean = np.log(np.exp(pred.mean) + extra) if len(mine) else pred.mean
        return mine, mean, pred.var

    helpers = _helpers(obs, space, how)
    stack = greedy(helpers, how.valid, how.accum, space) if len(helpers) >= 2 else frozenset()
    first = space.simplest(stack, space.study_batch, how.accum) if len(stack) >= 2 else None
    if first is not None and (first.key in measured or (how.memory and how.memory.verdict(first, obs).why_not)):
        first = None

    stopped = ""
    while True:
        model = fit()
        mine, mean, var = best_measured(model)
        if not mine:
            stopped = "no measured row meets the constraints"
            break
        i = int(np.argmin(mean))
        best = float(np.exp(mean[i]))
        result.fastest = mine[i].row
        if result.trials >= how.max_trials:
            stopped = f"--max-trials {how.max_trials} spent"
            break
        if how.max_seconds is not None and how.clock() - began >= how.max_seconds:
            stopped = f"--max-search-time {how.max_seconds:g} s spent"
            break
        top = max((o.key.batch for o in obs if o.ok), default=space.study_batch)
        waiting = [c for c in choices if c.key not in measured and c.key.batch <= 2 * top]
        if how.memory is not None:
            scale = how.memory.scale(obs)
            waiting = [c for c in waiting if how.memory.verdict(c, obs, scale).why_not is None]
        if not waiting:
            stopped = "every candidate within reach is measured"
            break
        pred = model.predict([(c.features, c.key.batch) for c in waiting])
        extra = np.array([charge(c) for c in waiting])
        unknown = pred.var + result.model_error**2  # (a row not measured: the model's own misses widen it)
        gain = _ei_shifted(best, pred.mean, unknown, extra)
        if first is not None:
            j = next(k for k, c in enumerate(waiting) if c.key == first.key)
            reason = "the greedy stack: every strategy that helped alone, where the registry lets it join"
            first = None
        else:
            j = int(np.argmax(gain))
            if gain[j] / best < MIN_GAIN:
                stopped = (
                    f"no candidate's expected improvement reaches {MIN_GAIN:.0%} of the incumbent's time "
                    f"(the largest: {gain[j] / best:.2%}, {waiting[j].row})"
                )
                break
            reason = f"the largest expected improvement: {gain[j] / best:.1%} of the incumbent's time"
        chosen = waiting[j]
        sd = math.sqrt(unknown[j])
        cand = Candidate(
            chosen.row,
            reason,
            float(np.exp(pred.mean[j])),
            float(np.exp(pred.mean[j] - Z_TIE * sd)),
            float(np.exp(pred.mean[j] + Z_TIE * sd)),
            float(gain[j] / best),
            batch=chosen.key.batch if chosen.key.batch != space.study_batch else None,
        )
        result.trials += 1
        cand.trial = cand.round = result.trials
        result.candidates.append(cand)
        got = [o for o in how.measure([chosen.row]) if o.key == chosen.key or o.row == chosen.row]
        measured.add(chosen.key)
        if not got:
            cand.state, cand.note = "failed", "no result"
        for o in got:
            obs.append(o)
            cand.state = "measured" if o.ok else "failed"
            cand.measured_time, cand.measured_mem = o.time, o.rel_mem
            cand.note = o.why_not or ("" if o.ok else o.status)
            if o.ok and o.time:
                cand.miss = o.time / cand.predicted_time if cand.predicted_time else None
                misses.append((math.log(o.time) - float(pred.mean[j]), float(pred.var[j])))  # (the model's own)
        result.rounds = result.trials
        result.incumbent = result.fastest
        how.on_trial(result)

    result.stopped = stopped
    if how.repeat is not None:
        _repeats(obs, devs, how, result, fit, best_measured)
    model = fit()
    mine, mean, var = best_measured(model)
    _pick(result, mine, mean, var, space.study_batch)
    ref = next((o for o in obs if o.row == how.reference and o.ok), None) if how.reference else None
    if ref is not None and result.incumbent in result.times:
        k = next(i for i, c in enumerate(mine) if c.row == result.incumbent)
        theirs = model.predict([(features(ref.key.plan), ref.key.batch)])
        d = math.log(math.exp(float(theirs.mean[0])) + charge_of(ref.key)) - float(mean[k])
        sd = math.sqrt(float(theirs.var[0]) + float(var[k]))  # (the two share terms: this overstates the spread)
        result.versus = {
            "row": ref.row,
            "ratio": math.exp(d),
            "low": math.exp(d - Z_TIE * sd),
            "high": math.exp(d + Z_TIE * sd),
            "faster": d - Z_TIE * sd > 0,
        }
    result.skipped = sum(1 for c in choices if c.key not in measured)
    result.wall_s = how.clock() - began
    return result


def _ei_shifted(best: float, mean: np.ndarray, var: np.ndarray, extra: np.ndarray) -> np.ndarray:
    """EI of a time plus a one-time charge (`extra`): the time's EI against what the charge leaves of the incumbent."""
    room = best - extra
    gain = np.zeros_like(mean)
    ok = room > 0
    if ok.any():
        gain[ok] = lognormal_ei(room[ok], mean[ok], var[ok])
    return gain


def _helpers(obs: Sequence[Observation], space: Space, how: Searching) -> list[str]:
    """The strategies whose single row (at the study's batch) measured faster than the baseline beyond twice the
    noise, the fastest first."""
    sigma = noise([])
    found: dict[str, float] = {}
    for o in obs:
        if o.feasible and len(o.names) == 1 and o.key.batch == space.study_batch and o.time is not None:
            (name,) = o.names
            if o.time < math.exp(-2 * sigma) and how.valid(o.names) is None:
                found[name] = min(o.time, found.get(name, o.time))
    # a strategy that runs only beside another (cce, beside bf16) helped where its row beat that one's alone
    alone = {next(iter(o.names)): o.time for o in obs if o.feasible and len(o.names) == 1 and o.time}
    for o in obs:
        if not o.feasible or len(o.names) != 2 or o.key.batch != space.study_batch or not o.time:
            continue
        for n in o.names:
            other = next(iter(o.names - {n}))
            if strategies.REGISTRY[n].with_one_of and other in alone and o.time < alone[other] * math.exp(-2 * sigma):
                found[n] = min(found.get(n, 1.0), o.time / alone[other])
    return sorted(found, key=lambda n: found[n])


def _repeats(obs: list[Observation], devs: list[float], how: Searching, result: Search, fit, best_measured) -> None:
    """Measure again, beside the baseline, the fastest and those not significantly slower than it, until none is
    left within reach or the rounds are spent; each repeat's squared log deviation from the row's earlier trials
    joins `devs` (one trial's noise)."""
    assert how.repeat is not None
    for _ in range(REPEAT_ROUNDS):
        model = fit()
        mine, mean, var = best_measured(model)
        if len(mine) < 2:
            break
        i = int(np.argmin(mean))
        z = (mean - mean[i]) / np.sqrt(var + var[i] + 1e-12)
        close = sorted((k for k in range(len(mine)) if k != i and z[k] < Z_TIE), key=lambda k: mean[k])
        if not close:
            break
        rows = [mine[i].row, *(mine[k].row for k in close[: REPEAT_ROWS - 1])]
        earlier = {r: [math.log(o.time) for o in obs if o.row == r and o.ok and o.time] for r in rows}
        got = how.repeat(rows)
        result.repeats += len(got) + 1  # (and the baseline, once: the rows of a round share it)
        for o in got:
            if o.ok and o.time:
                before = earlier.get(o.row) or []
                if before:  # a new trial against the mean of n earlier ones: variance sigma^2 (1 + 1/n)
                    dev = math.log(o.time) - sum(before) / len(before)
                    devs.append(dev * dev / (1 + 1 / len(before)))
                obs.append(o)
        for c in result.candidates:
            if c.row in rows and c.state == "measured":
                c.note = (c.note + "; " if c.note else "") + "measured again"


def _pick(result: Search, mine: list[Choice], mean: np.ndarray, var: np.ndarray, study_batch: int) -> None:
    """The simplest candidate not significantly slower than the fastest (by posterior means)."""
    if not mine:
        return
    i = int(np.argmin(mean))
    z = (mean - mean[i]) / np.sqrt(var + var[i] + 1e-12)
    close = [k for k in range(len(mine)) if z[k] < Z_TIE]
    k = min(close, key=lambda k: (simplicity(mine[k].names, mine[k].key.batch, study_batch), mean[k]))
    result.fastest, result.incumbent = mine[i].row, mine[k].row
    result.contenders = [mine[c].row for c in sorted(close, key=lambda c: mean[c]) if c != i]
    order = sorted(range(len(mine)), key=lambda c: mean[c])
    for c in order:
        sd = math.sqrt(var[c])
        result.times[mine[c].row] = [
            float(np.exp(mean[c])),
            float(np.exp(mean[c] - Z_TIE * sd)),
            float(np.exp(mean[c] + Z_TIE * sd)),
        ]


def posterior(model: TimeModel, choice: Choice) -> tuple[float, float]:
    """A candidate's posterior log time and its variance."""
    p = model.predict([(choice.features, choice.key.batch)])
    return float(p.mean[0]), float(p.var[0])


def row_of(names: frozenset[str], batch: int, study_batch: int) -> str:
    return row_text(names, None if batch == study_batch else batch)
