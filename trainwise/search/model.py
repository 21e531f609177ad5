"""The plan search's model: a candidate's time per sample, predicted with its uncertainty from every measured row.

Time per sample, relative to the baseline's, is a per-sample part (forward/backward and the data wait) plus a
per-step part (the optimizer and the rest of a step, shared by the samples of the step). Each part is linear in
log space:

    log part = intercept + sum of the settings' effects + sum of the pairs' interactions
               + slope * b + curve * b^2 + sum of each setting's own slope * b + the batch size's own effect,
                                                                                    b = log2(batch / study batch)

Every term has a Gaussian prior (mean and sd below, each with its reason); the posterior is the Bayesian linear
(ridge) fit over every measured row, each weighed by its trials, with one trial's noise `sigma` (log) on its whole
time, and so more on a part that is a small share of it. A candidate's prediction is the two parts' posterior
summed (their lognormals matched in mean and variance); its variance is what the rows measured so far leave
unknown; two candidates' difference has the variance of their contrast (the delta method on the shared terms). A
one-time cost (compile) is not a part: the search adds it after, over the planned run.

Memory: `trainwise estimate`'s figure where the study's model can be built, scaled by the median of measured over
estimated on the rows measured; a row that ran out of memory bounds every candidate predicted to need as much.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from trainwise.search.plan_inputs import Choice, Key, Observation, features, interacting

# Priors (log space, natural log). A setting's own effect is learned from its single row, so its prior only keeps
# the fit finite: sd 1.0 allows a part e times faster or slower.
TAU_SETTING = 1.0
# A pair's interaction beyond its two settings' effects, before a row holding both is measured. The default study's
# and the causal-LM study's measured spaces (BENCHMARKS §D2) put the pairs' interactions at 0.08 (median |.|) and
# 0.37 at the largest (freeze_embeddings with chunked_ce on a tied head: each alone 97% and 123%, together 78%):
# sd 0.15 keeps such a pair worth a trial beside a leader and a typical pair close to the product.
TAU_PAIR = 0.15
# A pair the registry says interacts (`Strategy.interacts`): the largest interaction measured so far, freeze_embeddings
# with chunked_ce on a tied head (log 0.78 / (0.97 x 1.23) = -0.42, §D1), as its sd
TAU_INTERACTS = 0.5
# A doubling of the batch (b counts doublings; the logs are natural): the per-sample part's prior slope is 0 (on a
# CPU a sample costs what it costs; a GPU's larger matmuls run nearer its peak, a few to tens of percent a doubling),
# the per-step part's -ln 2 (the optimizer step and the step's fixed costs shared by twice the samples); sd 0.15 a
# doubling either way.
TAU_SLOPE = 0.15
STEP_SLOPE = -math.log(2.0)
TAU_CURVE = 0.05  # the slope's change a doubling (a GPU saturates: the gain of each doubling shrinks)
TAU_SETTING_SLOPE = 0.10  # a setting's own batch slope (padding grows with the batch unless batches are sorted)
# A batch size's own effect, beside the slope and curve, shared by every candidate at that size: the pace is not
# smooth in the batch (a kernel's tiling, a cache the activations outgrow). On one CPU study (BENCHMARKS §D4) five
# sizes, measured twice, sat 0.46 and 0.48 (sd) off a quadratic in b, one trial's noise (0.07) included: batch 32
# read 28-50% slower than the same settings at 16 in three runs of five, 64 and 128 faster than both, 256 3x slower
# than 128. Without it one bumpy pair set the slope and the slope closed the larger sizes; at 0.3 the slope still
# took enough of batch 32's bump that batch 64 did not pay for its trial (§D4). The replay spaces' three sizes cannot
# show it (a slope and a curve fit any three); there it costs the image space three trials at the median (§D2).
# Each part has its own, so on the whole time the prior comes to 0.32-0.45 by the parts' split: below what was
# measured, which holds one trial's noise. One measured doubling's gain or loss is then read as that size's own more
# than as the slope: the next doubling is predicted near the slope's prior, its interval wide, and measured if that
# is worth a trial.
TAU_LEVEL = 0.45
TAU_INTERCEPT = 2.0  # the baseline's parts are measured; the prior says nothing


@dataclass(frozen=True)
class Prediction:
    """Per candidate: the log of its time per sample relative to the baseline's, and that log's variance."""

    mean: np.ndarray
    var: np.ndarray

    def time(self) -> np.ndarray:
        """The predicted time (the lognormal's median: exp of the log's mean)."""
        return np.exp(self.mean)


class _Design:
    """The columns: the intercept, each setting, each pair of settings that a candidate holds together, the batch's
    slope and curve, each setting's own slope, each batch size's own effect (but the study's), and each repeat
    round's offset."""

    def __init__(
        self,
        feats: Sequence[frozenset[str]],
        study_batch: int,
        sources: Sequence[str] = (),
        batches: Sequence[int] = (),
    ):
        self.study_batch = study_batch
        names = sorted({f for fs in feats for f in fs})
        pairs = sorted({(a, b) for fs in feats for a in fs for b in fs if a < b})
        self.columns = ["intercept", *names, *(f"{a}&{b}" for a, b in pairs), "slope", "curve"]
        self.columns += [f"{f}@slope" for f in names]
        self.columns += [f"level:{n}" for n in sorted(set(batches) - {study_batch})]  # (the study's: the intercept)
        # each repeat round's rows share the host's speed of the moment: one offset a round (the study's rows: none)
        self.columns += [f"source:{s}" for s in sorted(set(sources) - {""})]
        self.index = {c: i for i, c in enumerate(self.columns)}
        self.names = names
        self.interacting = interacting()

    def b(self, batch: int) -> float:
        return math.log2(batch / self.study_batch)

    def row(self, feats: frozenset[str], batch: int, source: str = "") -> np.ndarray:
        x = np.zeros(len(self.columns))
        x[0] = 1.0
        if source:
            x[self.index[f"source:{source}"]] = 1.0
        b = self.b(batch)
        fs = sorted(f for f in feats if f in self.index)
        for f in fs:
            x[self.index[f]] = 1.0
            x[self.index[f"{f}@slope"]] = b
        for i, a in enumerate(fs):
            for c in fs[i + 1 :]:
                j = self.index.get(f"{a}&{c}")
                if j is not None:
                    x[j] = 1.0
        x[self.index["slope"]] = b
        x[self.index["curve"]] = b * b
        if (j := self.index.get(f"level:{batch}")) is not None:
            x[j] = 1.0
        return x

    def matrix(self, rows: Sequence[tuple[frozenset[str], int]]) -> np.ndarray:
        return np.array([self.row(f, b) for f, b in rows]).reshape(len(rows), len(self.columns))

    def prior(self, slope: float, sigma: float) -> tuple[np.ndarray, np.ndarray]:
        """Prior means and sds of the columns, for a part whose batch slope's prior mean is `slope`; a round's offset
        (how far the host's speed moved since the study) has one trial's noise, `sigma` (replayed, a wider prior, 0.3
        or 2.0, mended the drifting causal-LM space's median and cost the seq2seq space's: BENCHMARKS §D2)."""
        mean = np.zeros(len(self.columns))
        sd = np.full(len(self.columns), TAU_SETTING)
        for c, i in self.index.items():
            if c == "intercept":
                sd[i] = TAU_INTERCEPT
            elif c.startswith("source:"):
                sd[i] = sigma
            elif c == "slope":
                mean[i], sd[i] = slope, TAU_SLOPE
            elif c == "curve":
                sd[i] = TAU_CURVE
            elif c.endswith("@slope"):
                sd[i] = TAU_SETTING_SLOPE
            elif c.startswith("level:"):
                sd[i] = TAU_LEVEL
            elif "&" in c and tuple(c.split("&")) in self.interacting:  # a pair the registry says interacts
                sd[i] = TAU_INTERACTS
            elif "&" in c or "~" in c:  # a pair, or a setting beside one the registry says it overlaps
                sd[i] = TAU_PAIR
        return mean, sd


@dataclass(frozen=True)
class _Part:
    mean: np.ndarray
    cov: np.ndarray


def _fit(X: np.ndarray, y: np.ndarray, w: np.ndarray, sigma: float, prior: tuple[np.ndarray, np.ndarray]) -> _Part:
    m0, sd = prior
    precision = np.diag(1.0 / sd**2) + (X.T * (w / sigma**2)) @ X
    cov = np.linalg.inv(precision)
    mean = cov @ (m0 / sd**2 + X.T @ (w * y) / sigma**2)
    return _Part(mean, (cov + cov.T) / 2)


# a part that is a small share of a row's time reads its trial's noise larger, by the inverse of that share (a 2%
# optimizer step moves by as many milliseconds as the whole step does), up to this many times
PART_NOISE_CAP = 10.0
# a row without phases (an older study's) is split as the rows with phases predict: a guess, weighed at half a trial
IMPUTED_WEIGHT = 0.5


class TimeModel:
    """The fitted model of time per sample (see the module's docstring). `two_parts` is False when no measured row
    has its phases (an older study): the time is then one part, its batch slope's prior mean 0."""

    def __init__(self, observations: Sequence[Observation], choices: Sequence[Choice], study_batch: int, sigma: float):
        self.sigma = sigma
        ok = [o for o in observations if o.ok]
        feats = [c.features for c in choices] + [features(o.key.plan) for o in ok]
        batches = [c.key.batch for c in choices] + [o.key.batch for o in ok]
        self.design = _Design(feats, study_batch, [o.source for o in ok], batches)
        self.two_parts = any(o.parts is not None for o in ok)
        self.parts: list[_Part] = []
        if not ok:
            self.parts = [_Part(*self._prior_part(i)) for i in range(2 if self.two_parts else 1)]
            return
        X = np.array([self.design.row(features(o.key.plan), o.key.batch, o.source) for o in ok])
        w = np.array([o.weight for o in ok], dtype=float)
        total = np.log([float(o.time or 1.0) for o in ok])
        if not self.two_parts:
            self.parts = [_fit(X, total, w, sigma, self.design.prior(0.0, sigma))]
            return
        known = np.array([o.parts is not None for o in ok])
        shares = np.array([[o.parts[i] / float(o.time or 1.0) if o.parts else 0.5 for o in ok] for i in range(2)])
        ys = [total + np.log(shares[i]) for i in range(2)]
        slopes = (0.0, STEP_SLOPE)

        def fit(i: int, rows: np.ndarray, weight: np.ndarray) -> _Part:
            # a part's log reads the row's noise over its share of the time
            scale = np.minimum(1.0 / np.maximum(shares[i][rows], 1e-9), PART_NOISE_CAP) ** 2
            return _fit(X[rows], ys[i][rows], weight[rows] / scale, sigma, self.design.prior(slopes[i], sigma))

        parts = [fit(i, known, w) for i in range(2)]
        if not known.all():  # a row without phases: split as the others predict, weighed as a guess
            a, b = (np.exp(X[~known] @ p.mean) for p in parts)
            shares[0][~known], shares[1][~known] = a / (a + b), b / (a + b)
            ys = [total + np.log(shares[i]) for i in range(2)]
            everyone = np.ones(len(ok), dtype=bool)
            parts = [fit(i, everyone, np.where(known, w, w * IMPUTED_WEIGHT)) for i in range(2)]
        self.parts = parts

    def _prior_part(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        mean, sd = self.design.prior(STEP_SLOPE if i == 1 else 0.0, self.sigma)
        if self.two_parts:  # the baseline's time split evenly, for want of a figure
            mean[0] = math.log(0.5)
        return mean, np.diag(sd**2)

    def predict(self, rows: Sequence[tuple[frozenset[str], int]]) -> Prediction:
        """Each (features, batch)'s log time and its variance: the parts' lognormals summed, matched in mean and
        variance (Fenton-Wilkinson)."""
        if not rows:
            return Prediction(np.zeros(0), np.zeros(0))
        X = self.design.matrix(rows)
        means = [X @ p.mean for p in self.parts]
        variances = [np.maximum(np.einsum("ij,jk,ik->i", X, p.cov, X), 0.0) for p in self.parts]
        if len(self.parts) == 1:
            return Prediction(means[0], variances[0])
        first = sum(np.exp(m + v / 2) for m, v in zip(means, variances, strict=True))
        second = sum(np.exp(2 * m + v) * np.expm1(v) for m, v in zip(means, variances, strict=True))
        s2 = np.log1p(second / first**2)
        return Prediction(np.log(first) - s2 / 2, s2)

    def predict_keys(self, keys: Sequence[Key]) -> Prediction:
        return self.predict([(features(k.plan), k.batch) for k in keys])

    def contrast(self, rows: Sequence[tuple[frozenset[str], int]], other: tuple[frozenset[str], int]) -> np.ndarray:
        """The variance of each row's log time minus `other`'s: the terms they share cancel (the delta method on each
        part's weights, log T = log(P + S))."""
        X = self.design.matrix([*rows, other])
        means = [X @ p.mean for p in self.parts]
        total = sum(np.exp(m) for m in means)
        out = np.zeros(len(rows))
        for m, p in zip(means, self.parts, strict=True):
            g = X * (np.exp(m) / total)[:, None]  # d log T / d the part's weights, per row
            d = g[:-1] - g[-1]
            out += np.maximum(np.einsum("ij,jk,ik->i", d, p.cov, d), 0.0)
        return out


def lognormal_ei(best: float | np.ndarray, mean: np.ndarray, var: np.ndarray) -> np.ndarray:
    """Expected improvement of a lognormal time (log mean `mean`, log variance `var`) over `best` (a time):
    E[max(0, best - T)] = best * Phi(z) - exp(mean + var / 2) * Phi(z - s), z = (log best - mean) / s."""
    s = np.sqrt(np.maximum(var, 1e-12))
    z = (np.log(best) - mean) / s
    return best * _phi(z) - np.exp(mean + var / 2) * _phi(z - s)


def _phi(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + _erf(z / math.sqrt(2.0)))


_erf = np.vectorize(math.erf, otypes=[float])


@dataclass(frozen=True)
class MemoryVerdict:
    """Whether a candidate can run: its predicted peak memory and why it cannot (None: it can, as far as is known)."""

    bytes: float | None
    why_not: str | None


class MemoryModel:
    """What a candidate needs: the estimate's figure (`estimate(names, batch)`, None where it cannot say) scaled by
    the median of measured over estimated on the rows measured; a candidate is out when that breaks `budget`, or
    when a row that ran out of memory needed no more (the same settings at a batch no larger, or an estimate no
    larger)."""

    def __init__(self, estimate: Callable[[frozenset[str], int], float | None], budget: float | None):
        self.estimate, self.budget = estimate, budget

    def scale(self, observations: Sequence[Observation]) -> float:
        """The median of measured over estimated peak memory on the rows measured (1 where none says)."""
        ratios = []
        for o in observations:
            if o.ok and o.peak_bytes and self.budget is not None and (est := self.estimate(o.names, o.key.batch)):
                ratios.append(o.peak_bytes / est)
        return float(np.median(ratios)) if ratios else 1.0

    def verdict(self, choice: Choice, observations: Sequence[Observation], scale: float = 1.0) -> MemoryVerdict:
        """Whether `choice` can run, given what was measured (`observations`: the out-of-memory rows) and the
        estimate's `scale`."""
        key = choice.key
        ooms = [o for o in observations if o.status == "oom"]
        for o in ooms:
            if o.key.plan == key.plan and o.key.batch <= key.batch:
                return MemoryVerdict(None, f"{o.row} ran out of memory")
        need = None
        if self.budget is not None or ooms:
            est = self.estimate(choice.names, key.batch)
            if est is not None:
                need = est * scale
                for o in ooms:
                    theirs = self.estimate(o.names, o.key.batch)
                    if theirs is not None and est >= theirs:
                        return MemoryVerdict(need, f"the estimate needs as much as {o.row}, which ran out of memory")
        if need is not None and self.budget is not None and need > self.budget:
            return MemoryVerdict(need, f"the estimate needs {need / 2**30:.2f} GiB, more than --memory-budget")
        return MemoryVerdict(need, None)
