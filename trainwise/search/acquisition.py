"""The plan search: one rule for what to measure next, repeats where they decide, and the pick by a test.

1. The first trial is the greedy stack, as an engineer writes it: every strategy that helped alone beyond twice the
   noise, fastest first, each kept where the registry lets it join and it sets something the stack does not already
   set.
2. Then each trial is the candidate with the largest expected improvement (EI) over the incumbent (the measured
   candidate with the lowest posterior time) under the model (`trainwise.search.model`), while that EI is at least
   MIN_GAIN of the incumbent's time, until --max-trials or --max-search-time are spent. Where the planned run and a
   trial's seconds are known (`run_s`, `trial_s`), a trial must also pay for itself: the candidate is the one whose
   EI over the planned run exceeds its own trial's seconds by the most, and none is measured once none does. A
   candidate's batch is at most twice the largest batch measured so far (the model's batch terms are local).
3. Repeats: while measured candidates are not significantly slower than the fastest (one-sided, Z_TIE, on their
   contrast), the fastest and the row the pick would take are measured again, a round of two trials (at most
   REPEAT_ROUNDS rounds over the search's life), while what the round may save pays for its trials.
4. The pick is the simplest candidate (the fewest strategies, then the study's batch) not significantly slower than
   the fastest and expected to lose less than ROUND to it (a tie the repeats did not settle goes to the fastest); each
   reference row (the ecosystem's default, the user's own config) is tested against each measured candidate the same
   way.

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
from trainwise.search.plan_inputs import Choice, Key, Observation, Space, base, features

# A trial is worth running while its expected improvement is at least this share of the incumbent's time. Replayed
# on the measured spaces (BENCHMARKS §D2), 1% reaches the best within 3% at the median and 10% at the 90th percentile
# on the default-study, seq2seq and image spaces (the causal-LM file, measured on a host that sped up 1.6x between
# rounds, misses both); 2% or 3% saves the image space two or three trials and loses the seq2seq space's 90th
# percentile (1.16).
MIN_GAIN = 0.01
# "Significantly slower": one-sided at 95% (z 1.645) on the posterior contrast of two candidates' log times.
Z_TIE = 1.645
# What a repeat round must be expected to save to run, and what the pick may lose to the fastest at most: a simpler row
# is taken over the fastest only while what it may lose is below it (a tie the rounds did not settle goes to the
# fastest). 3 MIN_GAIN: a trial's worth for each trial of a round as it was, the fastest, the row the pick would take
# and a baseline run. A round now runs no baseline (the model gives each round an offset, so a baseline run in it set
# that offset and nothing the pick reads): replayed, dropping it kept every space's 90th percentile and saved 3 trials
# of 15 on the seq2seq space (its median pick as measured 1.013, from 1.000); 2 MIN_GAIN saved no more trials and sent
# a 1% tie to the fastest (BENCHMARKS §D2).
ROUND = 3 * MIN_GAIN
# rounds of repeats over a search's life: on a CPU whose trials move ±5-10%, four runs of a row halve its interval,
# enough to tell apart leaders 6% apart (the pick then loses at most that)
REPEAT_ROUNDS = 3
# the noise of one trial (log time) before a study says its own: the §D2 spaces' rows, three trials each, moved
# 4.8-9.4% (median sd; the files in benchmarks/spaces/, but the causal-LM one's 24%, its rounds' drift);
# SIGMA_WEIGHT trials' worth of it, pooled with the study's repeated trials
SIGMA_PRIOR = 0.08
SIGMA_WEIGHT = 4.0
# what a prediction misses beyond the model's own uncertainty and the noise, before any miss is measured: none,
# worth MODEL_ERROR_WEIGHT misses (a composition the model cannot express, a short trial's batches)
MODEL_ERROR_PRIOR = 0.0
MODEL_ERROR_WEIGHT = 2.0


@dataclass
class Candidate:
    """A trial of the search: why it was chosen, what it predicted (median and 90% interval), what it measured."""

    row: str
    reason: str
    predicted_time: float | None = None  # relative to the baseline (the lognormal's median)
    predicted_low: float | None = None
    predicted_high: float | None = None
    expected_gain: float | None = None  # EI over the incumbent, a share of its time
    state: str = "proposed"  # measured | failed
    measured_time: float | None = None
    measured_mem: float | None = None
    note: str = ""
    batch: int | None = None
    trial: int | None = None
    miss: float | None = None  # measured / predicted time (> 1: the prediction was optimistic)


@dataclass
class Search:
    """What a search did: every trial, the pick and the fastest, the measured candidates' posterior times, and why
    it stopped."""

    noise: float  # one trial's noise at the end (log time: the prior pooled with the repeated trials)
    incumbent: str | None  # the pick
    model_error: float = 0.0  # what the predictions missed beyond their own uncertainty and the noise (log)
    candidates: list[Candidate] = field(default_factory=list)
    stopped: str = ""
    trials: int = 0  # search trials (the repeats are counted apart)
    repeats: int = 0  # trials of the repeat rounds
    wall_s: float = 0.0
    fastest: str | None = None
    study_noise: float | None = None
    # measured candidates' posterior times: row -> [median, low, high] (90%), the fastest first
    times: dict[str, list[float]] = field(default_factory=dict)
    contenders: list[str] = field(default_factory=list)  # not significantly slower than the fastest
    skipped: int = 0  # candidates never measured
    # each reference (the ecosystem's default, the user's own config) against each measured candidate: reference row
    # -> candidate row -> {row (the reference's), ratio (its time over the candidate's), low, high (90%), faster (the
    # candidate is significantly faster)}
    versus: dict[str, dict[str, dict]] = field(default_factory=dict)

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
    # the seconds one trial of a candidate takes, from its time per sample relative to the baseline and its batch (the
    # study's trials, fitted by the driver); with run_s, a trial is run only while its expected saving pays for it
    trial_s: Callable[[float, int], float] | None = None
    earlier: Sequence[Candidate] = ()  # what an earlier run of this search measured (a resumed search's budget)
    rounds_done: int = 0  # repeat rounds an earlier run of this search measured
    study_noise: float | None = None  # the study's own floor (shown)
    references: tuple[str, ...] = ()  # rows each candidate is tested against (the ecosystem's default, yours)
    on_trial: Callable[[Search, Candidate], None] = lambda _s, _c: None


def noise(deviations: Sequence[float]) -> float:
    """One trial's noise (log time): SIGMA_PRIOR worth SIGMA_WEIGHT trials, pooled with the squared log deviations of
    repeated trials (`deviations`, one degree of freedom each)."""
    return math.sqrt((SIGMA_WEIGHT * SIGMA_PRIOR**2 + sum(deviations)) / (SIGMA_WEIGHT + len(deviations)))


def model_error(misses: Sequence[tuple[float, float]], sigma: float) -> float:
    """What the model's predictions miss beyond what it said it did not know and beyond one trial's noise (log): each
    miss of a trial (log measured / predicted, the prediction's variance) gives max(0, miss^2 - variance - sigma^2),
    pooled with MODEL_ERROR_PRIOR worth MODEL_ERROR_WEIGHT misses. It widens each prediction of a row not measured."""
    total = MODEL_ERROR_WEIGHT * MODEL_ERROR_PRIOR**2 + sum(max(0.0, r * r - v - sigma * sigma) for r, v in misses)
    return math.sqrt(total / (MODEL_ERROR_WEIGHT + len(misses)))


def simplicity(c: Choice, study_batch: int) -> tuple[int, bool]:
    """How much a row changes: its strategies, then a batch size of its own."""
    return len(c.names), c.key.batch != study_batch


def greedy(
    helpers: Sequence[str], valid: Callable[[frozenset[str]], str | None], accum: int, space: Space
) -> frozenset[str]:
    """The stack an engineer writes first: each helper (the fastest first) that the registry lets join the ones
    before it and that sets something they do not (dynamic_pad after smart_batch sets nothing new; tf32 beside
    bf16 overlaps it); one refused for want of another (cce before bf16) joins once that one is in."""
    stack: frozenset[str] = frozenset()
    waiting: list[str] = []

    def joins(n: str) -> bool:
        if valid(stack | {n}) is not None or strategies.REGISTRY[base(n)].overlaps & {base(m) for m in stack}:
            return False
        before = space.simplest(stack, space.study_batch, accum)
        after = space.simplest(stack | {n}, space.study_batch, accum)
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


class _State:
    """A search in progress: the observations so far, the noise they show, the model fitted to them."""

    def __init__(self, start: Sequence[Observation], how: Searching, deviations: Sequence[float]):
        self.how = how
        self.obs = list(start)
        self.devs = list(deviations)
        self.misses: list[tuple[float, float]] = []
        self.choices = list(how.space.choices.values())
        self.sigma = noise(self.devs)
        self.error = 0.0
        self.model = self.fit()

    def fit(self) -> TimeModel:
        self.sigma = noise(self.devs)
        self.error = model_error(self.misses, self.sigma)
        self.model = TimeModel(self.obs, self.choices, self.how.space.study_batch, self.sigma)
        return self.model

    def charge(self, key: Key) -> float:
        """A one-time cost over the planned run (compile), relative to the baseline's time: the candidate's own
        compile where measured, else the median of the compiling rows'."""
        if not self.how.run_s or "compile=True" not in features(key.plan):
            return 0.0
        own = [o.compile_s for o in self.obs if o.key == key and o.compile_s]
        alike = [o.compile_s for o in self.obs if o.compile_s and "compile=True" in features(o.key.plan)]
        found = own or alike
        return float(np.median(found)) / self.how.run_s if found else 0.0

    def cost(self, runs: Sequence[tuple[float, int]]) -> np.ndarray | None:
        """The seconds a trial of each (time relative to the baseline, batch) takes; None where unpriced."""
        if self.how.trial_s is None:
            return None
        return np.array([self.how.trial_s(t, b) for t, b in runs], dtype=float)

    def measured(self) -> tuple[list[Choice], np.ndarray]:
        """The measured candidates that meet the budgets, and their posterior log times (a one-time cost added)."""
        ok = {o.key for o in self.obs if o.feasible}
        mine = [c for c in self.choices if c.key in ok]
        pred = self.model.predict([(c.features, c.key.batch) for c in mine])
        extra = np.array([self.charge(c.key) for c in mine])
        return mine, (np.log(np.exp(pred.mean) + extra) if mine else pred.mean)

    def rivals(self, mine: list[Choice], mean: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
        """The fastest, and each candidate's z (its posterior excess over the fastest, on their contrast's sd) and
        its contrast's variance."""
        i = int(np.argmin(mean))
        var = self.model.contrast([(c.features, c.key.batch) for c in mine], (mine[i].features, mine[i].key.batch))
        return i, (mean - mean[i]) / np.sqrt(var + 1e-12), var

    def add_round(self, got: Sequence[Observation]) -> None:
        """A round of repeats: its rows, each measured again (together, at the host's speed of the moment), also say
        how much one trial moves: each row's deviation from the mean of its earlier trials, less the round's shared
        offset, with n - 1 degrees of freedom among n rows."""
        found = []
        for o in got:
            before = [x for x in self.obs if x.key == o.key and x.ok and x.time and x.source == ""]
            if o.ok and o.time and before:
                weight = sum(x.weight for x in before)
                mean = sum(x.weight * math.log(x.time or 1.0) for x in before) / weight
                found.append((math.log(o.time) - mean, 1 + 1 / weight))
        if len(found) >= 2:
            offset = sum(d for d, _ in found) / len(found)
            n = len(found)
            self.devs += [(d - offset) ** 2 * n / (n - 1) / scale for d, scale in found]
        self.obs.extend(got)


def search(start: Sequence[Observation], how: Searching, deviations: Sequence[float] = ()) -> Search:
    """Measure candidates of `how.space` by expected improvement from the observations in `start` (the study's rows),
    then repeat the leaders and pick (see the module's docstring). `deviations`: squared log deviations of repeated
    trials the study already holds (its baseline's runs)."""
    began = how.clock()
    space = how.space
    state = _State(start, how, deviations)
    result = Search(state.sigma, None, study_noise=how.study_noise, candidates=list(how.earlier))
    result.trials = len(how.earlier)
    tried: set[Key] = {o.key for o in state.obs}
    stack = greedy(_helpers(state), how.valid, how.accum, space)
    first = space.simplest(stack, space.study_batch, how.accum) if len(stack) >= 2 else None
    while True:
        model = state.fit()
        mine, mean = state.measured()
        if not mine:
            result.stopped = "no measured row meets the constraints"
            break
        best = float(np.exp(mean.min()))
        if result.trials >= how.max_trials:
            result.stopped = f"--max-trials {how.max_trials} spent"
            break
        if how.max_seconds is not None and how.clock() - began >= how.max_seconds:
            result.stopped = "--max-search-time spent"
            break
        top = max((o.key.batch for o in state.obs if o.ok), default=space.study_batch)
        waiting = [c for c in state.choices if c.key not in tried and c.key.batch <= 2 * top]
        if how.memory is not None:
            scale = how.memory.scale(state.obs)
            waiting = [c for c in waiting if how.memory.verdict(c, state.obs, scale).why_not is None]
        if not waiting:
            result.stopped = "every candidate within reach is measured"
            break
        pred = model.predict([(c.features, c.key.batch) for c in waiting])
        unknown = pred.var + state.error**2  # (a row not measured: the model's own misses widen it)
        gain = _ei(best, pred.mean, unknown, np.array([state.charge(c.key) for c in waiting]))
        cost = state.cost([(float(np.exp(m)), c.key.batch) for m, c in zip(pred.mean, waiting, strict=True)])
        j = next((k for k, c in enumerate(waiting) if first is not None and c.key == first.key), None)
        if j is not None:
            reason = "the greedy stack: every strategy that helped alone, where the registry lets it join"
        elif cost is None or how.run_s is None:
            j = int(np.argmax(gain))
            if gain[j] / best < MIN_GAIN:
                result.stopped = (
                    f"no candidate's expected improvement reaches {MIN_GAIN:.0%} of the incumbent's time "
                    f"(the largest: {gain[j] / best:.2%}, {waiting[j].row})"
                )
                break
            reason = f"the largest expected improvement: {gain[j] / best:.1%} of the incumbent's time"
        else:
            net = np.where(gain / best >= MIN_GAIN, gain * how.run_s - cost, -np.inf)
            j = int(np.argmax(net))
            if not net[j] > 0:
                k = int(np.argmax(gain))
                result.stopped = (
                    f"no candidate's expected saving on the planned run pays for its trial (the largest expected "
                    f"improvement: {gain[k] / best:.2%} of the incumbent's time, {gain[k] * how.run_s:.1f} s of "
                    f"{how.run_s:.0f} s, for a trial of {cost[k]:.0f} s: {waiting[k].row})"
                )
                break
            reason = (
                f"the largest expected improvement net of its trial: {gain[j] / best:.1%} of the incumbent's time, "
                f"{gain[j] * how.run_s:.1f} s of the planned run for a trial of {cost[j]:.0f} s"
            )
        first = None
        chosen, sd = waiting[j], math.sqrt(unknown[j])
        result.trials += 1
        cand = Candidate(
            chosen.row,
            reason,
            float(np.exp(pred.mean[j])),
            float(np.exp(pred.mean[j] - Z_TIE * sd)),
            float(np.exp(pred.mean[j] + Z_TIE * sd)),
            float(gain[j] / best),
            batch=chosen.key.batch if chosen.key.batch != space.study_batch else None,
            trial=result.trials,
        )
        result.candidates.append(cand)
        got = [o for o in how.measure([chosen.row]) if o.key == chosen.key]
        tried.add(chosen.key)
        cand.state, cand.note = "failed", "no result"
        for o in got:
            state.obs.append(o)
            cand.state = "measured" if o.ok else "failed"
            cand.measured_time, cand.measured_mem = o.time, o.rel_mem
            cand.note = o.why_not or ("" if o.ok else o.status)
            if o.ok and o.time and cand.predicted_time:
                cand.miss = o.time / cand.predicted_time
                state.misses.append((math.log(o.time) - float(pred.mean[j]), float(pred.var[j])))
        how.on_trial(result, cand)
    if how.repeat is not None:
        _repeats(state, how, result, began)
    state.fit()
    _pick(state, result)
    result.noise, result.model_error = state.sigma, state.error
    result.skipped = sum(1 for c in state.choices if c.key not in tried)
    result.wall_s = how.clock() - began
    return result


def _ei(best: float, mean: np.ndarray, var: np.ndarray, extra: np.ndarray) -> np.ndarray:
    """EI of a time plus a one-time charge (`extra`): the time's EI against what the charge leaves of the incumbent."""
    room = best - extra
    gain = np.zeros_like(mean)
    ok = room > 0
    if ok.any():
        gain[ok] = lognormal_ei(room[ok], mean[ok], var[ok])
    return gain


def _helpers(state: _State) -> list[str]:
    """The strategies whose single row (at the study's batch) measured faster than the baseline beyond twice the
    noise, the fastest first; a strategy that runs only beside another (cce, beside bf16) where its row beat that
    one's alone as much."""
    space, valid = state.how.space, state.how.valid
    bar = math.exp(-2 * state.sigma)
    at_study = [o for o in state.obs if o.feasible and o.key.batch == space.study_batch and o.time]
    alone = {next(iter(o.names)): float(o.time or 1.0) for o in at_study if len(o.names) == 1}
    found = {n: t for n, t in alone.items() if t < bar and valid(frozenset({n})) is None}
    for o in at_study:
        if len(o.names) != 2:
            continue
        for n in o.names:
            other = next(iter(o.names - {n}))
            if strategies.REGISTRY[base(n)].with_one_of and other in alone and (o.time or 1.0) < alone[other] * bar:
                found[n] = min(found.get(n, 1.0), float(o.time or 1.0) / alone[other])
    return sorted(found, key=lambda n: found[n])


def _repeats(state: _State, how: Searching, result: Search, began: float) -> None:
    """While the pick is not settled, measure it again beside the fastest (a round of its own, no baseline run): the
    round is worth its two trials while what the pick may lose to the fastest (or, where it is the fastest, what the
    closest rival may beat it by) is expected at MIN_GAIN of its time per trial or more, the rule a trial of the search
    is held to, and, priced, while that much of the planned run pays for the round's trials. Stops there, or when the
    rounds or --max-search-time are spent."""
    assert how.repeat is not None
    study_batch = how.space.study_batch
    for _ in range(max(0, REPEAT_ROUNDS - how.rounds_done)):
        if how.max_seconds is not None and how.clock() - began >= how.max_seconds:
            return
        state.fit()
        mine, mean = state.measured()
        named = [k for k, c in enumerate(mine) if c.names]  # (the baseline is the reference: nothing to repeat)
        if len(named) < 2:
            return
        mine, mean = [mine[k] for k in named], mean[named]
        i, z, var = state.rivals(mine, mean)
        close = [k for k in range(len(mine)) if k != i and z[k] < Z_TIE]
        pick = _simplest(mine, mean, [i, *close], study_batch)
        rival: int | None
        if pick != i:  # what the pick may lose to the fastest
            rival, at_stake = pick, _excess(float(mean[pick] - mean[i]), float(var[pick]))
        else:  # what the closest rival may beat the fastest by
            rival = min(close, key=lambda k: mean[k], default=None)
            at_stake = 0.0 if rival is None else _excess(float(mean[i] - mean[rival]), float(var[rival]))
        if rival is None or at_stake < ROUND:
            return
        # (priced: what the round may save over the planned run must pay for its two trials)
        runs = [(float(np.exp(mean[k])), mine[k].key.batch) for k in (i, rival)]
        cost = state.cost(runs)
        if cost is not None and how.run_s is not None and at_stake * runs[0][0] * how.run_s <= cost.sum():
            return
        rows = [mine[i].row, mine[rival].row]
        got = how.repeat(rows)
        result.repeats += len(got)
        state.add_round(got)
        for c in result.candidates:
            if c.row in rows and c.state == "measured":
                c.note = (c.note + "; " if c.note else "") + "measured again"


def _simplest(mine: list[Choice], mean: np.ndarray, among: Sequence[int], study_batch: int) -> int:
    """Of the candidates `among` (indices into `mine`), the simplest (`simplicity`), the fastest of equals: the row
    the pick takes (`_pick`) and the one a repeat round settles against the fastest (`_repeats`)."""
    return min(among, key=lambda k: (simplicity(mine[k], study_batch), mean[k]))


def _excess(mean: float, var: float) -> float:
    """E[max(0, e^d - 1)] for d ~ N(mean, var): what a row whose log time exceeds another's by d loses, expected."""
    mean, var = float(mean), float(var)
    s = math.sqrt(max(var, 1e-12))
    return math.exp(mean + var / 2) * _phi((mean + var) / s) - _phi(mean / s)


def _phi(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def _pick(state: _State, result: Search) -> None:
    """The simplest candidate not significantly slower than the fastest (by their posterior contrast) whose expected
    loss to it is under ROUND, the posterior times, and the reference against each."""
    mine, mean = state.measured()
    if not mine:
        return
    i, z, var = state.rivals(mine, mean)
    # (a tie the repeats did not settle, where the simpler row may still lose a round's worth, goes to the fastest)
    close = [k for k in range(len(mine)) if k == i or (z[k] < Z_TIE and _excess(mean[k] - mean[i], var[k]) < ROUND)]
    k = _simplest(mine, mean, close, state.how.space.study_batch)
    result.fastest, result.incumbent = mine[i].row, mine[k].row
    result.contenders = [mine[c].row for c in sorted(close, key=lambda c: mean[c]) if c != i]
    own = state.model.predict([(c.features, c.key.batch) for c in mine]).var
    for c in sorted(range(len(mine)), key=lambda c: mean[c]):
        sd = math.sqrt(own[c])
        result.times[mine[c].row] = [float(np.exp(mean[c] + s * Z_TIE * sd)) for s in (0, -1, 1)]
    for reference in state.how.references:
        ref = next((o for o in state.obs if o.row == reference and o.ok), None)
        if ref is not None:
            result.versus[reference] = _versus(state, ref, mine, mean)


def _versus(state: _State, ref: Observation, mine: list[Choice], mean: np.ndarray) -> dict[str, dict]:
    """A reference row against each measured candidate: its time over theirs, with a 90% interval (one-sided
    Z_TIE each way) on their posterior contrast."""
    out = {}
    theirs = (features(ref.key.plan), ref.key.batch)
    their_mean = math.log(math.exp(float(state.model.predict([theirs]).mean[0])) + state.charge(ref.key))
    var = state.model.contrast([(c.features, c.key.batch) for c in mine], theirs)
    for c, row in enumerate(mine):
        d, sd = their_mean - float(mean[c]), math.sqrt(float(var[c]) + 1e-12)
        out[row.row] = {
            "row": ref.row,
            "ratio": math.exp(d),
            "low": math.exp(d - Z_TIE * sd),
            "high": math.exp(d + Z_TIE * sd),
            "faster": d - Z_TIE * sd > 0,
        }
    return out
