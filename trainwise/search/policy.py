"""The plan search's policy: from the rows a study has measured, which combinations of strategies to measure
next, and when to stop. Pure (no files, no trials): `search` calls `measure(rows)` for each round, so the
driver (`trainwise.api.plan`) runs them as rows of one study and a test can run it on made-up figures.

Time is predicted phase by phase: a step is data wait + forward/backward + optimizer + the rest, each measured
on every row; a combination's phase is its anchor's (the largest subset already measured as a whole, else the
baseline) times each added strategy's measured ratio on that phase, and its time the sum. So a strategy that
saves a fixed cost (freeze_embeddings: the embeddings' optimizer step, 2% of a padded step, inside the noise,
but a quarter of a smart-batched one) is credited where it pays, and what the search learns about two
strategies' overlap carries into every superset. Rows without phases fall back to the product of the ratios.

Memory comes from `mem_of` (the driver's: `trainwise estimate` where it can build the model), so a candidate
that cannot fit is pruned before it trains. A combination is only built if the registry allows it (`valid`):
conflicts, requirements, tasks, packages.

When fewer than two single rows helped, round 1 has nothing to combine: the fastest single row is screened with each
other strategy (measured, whatever is predicted, when nothing else is predicted ahead; at the batch size it leads
at) until a combination leads, since a pair can gain what neither gains alone (freeze_embeddings with chunked_ce on
a tied-head causal LM).

Batch size: every row runs at the study's batch size, and from the first round the search also tries the
incumbent at the next batch (`next_batch`: twice the size) as a row of its own (`bf16+smart_batch@bs16`), while
that is faster per sample and fits. A batch's effect is learned from what was measured at it (the median over
the combinations measured at both sizes); before anything was (at that size or half of it), the leader is tried
there once whatever the noise floor, and a doubling that gained beyond the floor is predicted to gain as much again.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace

# the least noise the search assumes, relative to the baseline's time. A study's floor comes from one pair of
# baseline runs (or one run's step-to-step spread), which underestimates how far a row moves from one trial to the
# next: the default study's rows repeated 3 times spread 6-23% (BENCHMARKS §S1), an inert pin_memory row read 82%
# (§K1), and a search that believed a ±2% floor kept measuring rows it could not tell apart (§D1)
DEFAULT_NOISE = 0.05
BEAM = 2  # candidates measured per round
POOL = 7  # at most this many strategies combined in the first round (2^7 subsets predicted, not measured)
# a floor wider than this does not raise the bar further: a study whose baseline moved ±25% between its two runs
# still measures a candidate predicted 5% ahead (a wide floor is a reason to measure, not to stop; the search
# stopped after one trial at 1.45x the exhaustive best on such a study)
WIDE = 0.10


@dataclass(frozen=True)
class Measured:
    """A row of the study as the search reads it: its time and memory relative to the baseline, and whether
    it fits the budgets (`feasible`; `why_not` when it does not)."""

    row: str
    names: frozenset[str]
    rel_time: float | None  # baseline samples/s / the row's: > 1 is slower; None when it did not run ok
    rel_mem: float | None
    peak_bytes: float | None = None
    status: str = "ok"
    why_not: str | None = None  # a budget it breaks (None: feasible)
    # a step's phases (data wait, forward/backward, optimizer, the rest) over the baseline's step time; None:
    # not measured
    parts: tuple[float, ...] | None = None
    batch: int | None = None  # the row's own batch size (`row@bsN`); None: the study's
    # a strategy's effect read off a row that holds it with what it needs beside it (cce's off bf16+cce): it informs
    # predictions as a single row does, and is never a plan itself (no such row runs)
    derived: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.rel_time is not None

    @property
    def feasible(self) -> bool:
        return self.ok and self.why_not is None and not self.derived


@dataclass
class Candidate:
    """A combination the search considered: what it predicted, and what it measured when it ran."""

    row: str
    round: int
    reason: str  # why it was proposed
    predicted_time: float  # relative to the baseline
    predicted_bytes: float | None = None  # the memory the estimate predicts (None: not predicted)
    state: str = "proposed"  # proposed | measured | pruned | skipped | failed
    measured_time: float | None = None
    measured_mem: float | None = None
    note: str = ""
    batch: int | None = None  # its own batch size (None: the study's)
    trial: int | None = None  # its place among the search's trials (1: measured first); None: not measured
    gap: int = 0  # strategies (and a batch size) its prediction composes beyond what was measured as a whole
    miss: float | None = None  # measured / predicted time (> 1: the prediction was optimistic); None: not measured


@dataclass
class Search:
    """What a search did: every candidate, the incumbent it ended with and why it stopped."""

    noise: float  # the floor the search judges by: the study's, at least DEFAULT_NOISE
    incumbent: str | None
    candidates: list[Candidate] = field(default_factory=list)
    stopped: str = ""
    trials: int = 0  # rows the search measured (the single rows it started from are not counted)
    wall_s: float = 0.0
    rounds: int = 0
    study_noise: float | None = None  # the study's own noise floor (None: it has none)
    # how far the predictions missed, per strategy composed (log of measured / predicted), where they said slower
    # than measured: a candidate predicted within that of the incumbent is measured (0: no such miss yet)
    error: float = 0.0
    fastest: str | None = None  # the fastest feasible row measured (the pick is the simplest within the floor of it)

    def to_dict(self) -> dict:
        return asdict(self)


def row_text(names: Iterable[str], order: list[str], batch: int | None = None) -> str:
    """A combination's row text, its strategies in the registry's order (one spelling per combination), and its
    own batch size when it has one (`bf16+smart_batch@bs16`)."""
    text = "+".join(sorted(names, key=order.index))
    return f"{text}@bs{batch}" if batch else text


def split_row(text: str) -> tuple[frozenset[str], int | None]:
    """The strategies and own batch size of a row text written by `row_text`."""
    body, at, size = text.partition("@bs")
    names = frozenset(body.split("+")) - {"baseline"}
    return names, int(size) if at else None


def batch_scale(measured: dict[frozenset[str], Measured], sized: dict, batch: int, noise: float) -> float:
    """What running at `batch` does to a combination's time: the median ratio over the combinations measured both
    at the study's batch and at `batch`; else, when the batch below it was measured, that batch's ratio times the
    gain of its own doubling again (none when it gained none); else just under 1 (no figure: `search` tries the
    leader there once)."""
    ratios = sorted(
        m.rel_time / measured[names].rel_time
        for (names, b), m in sized.items()
        if b == batch and m.ok and names in measured and measured[names].ok and measured[names].rel_time
    )
    if ratios:  # the median (of an even count, the middle two's mean: the upper one read 4->8 as 0.98 of 0.84, 0.98)
        mid = len(ratios) // 2
        return ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2
    below = batch // 2
    if below and any(b == below for _n, b in sized):
        last = batch_scale(measured, sized, below, noise)
        # the gain of the last doubling (from the study's batch, or from the one below it that was measured)
        before = batch_scale(measured, sized, below // 2, noise) if any(b == below // 2 for _n, b in sized) else 1.0
        step = last / before
        return last * step if step < 1 - noise else last
    return 1 - noise / 2


def _compose(anchor: Measured | None, rest: frozenset[str], measured: dict, single: dict[str, float]) -> float:
    """`anchor`'s time with the strategies of `rest` added, each by its own measured effect: phase by phase where
    the baseline, the anchor and every added row have phases, else by the product of their overall ratios."""
    base = measured.get(frozenset())
    alone = [measured.get(frozenset({n})) for n in rest]
    start = anchor or base
    if start and start.parts and base and base.parts and all(a and a.parts for a in alone):
        phases = list(start.parts)
        for a in alone:
            assert a is not None and a.parts is not None
            phases = [p * (x / b) if b > 0 else p for p, x, b in zip(phases, a.parts, base.parts, strict=True)]
        return sum(phases)
    return ((anchor.rel_time or 1.0) if anchor else 1.0) * math.prod(single[n] for n in rest)


def anchor(names: frozenset[str], measured: dict[frozenset[str], Measured]) -> Measured | None:
    """The largest subset of `names` measured as a whole (a combination, or the baseline), the fastest of equals."""
    anchors = [m for s, m in measured.items() if s <= names and m.ok and (len(s) > 1 or not s)]
    return max(anchors, key=lambda m: (len(m.names), -(m.rel_time or 0)), default=None)


def predict(names: frozenset[str], measured: dict[frozenset[str], Measured], single: dict[str, float]) -> float:
    """The combination's time relative to the baseline: phase by phase from its anchor (the largest subset
    measured as a whole, else the baseline) and each added strategy's ratio on that phase, where every row
    involved has phases; else the anchor's time times the added strategies' overall ratios. Then each pair of its
    strategies that was measured as a pair and is not inside the anchor adds what it did beyond its two parts
    (its measured time over its time composed from them): freeze_embeddings with chunked_ce on SmolLM2, whose head
    is tied, read 78% where each alone read 97% and 123% (§D1), and a triple holding that pair is predicted with it.
    Phases are per sample (`trainwise.api.plan.phases`): what a strategy does to a step's cost (bf16) and what it
    does to the samples a step carries (packing, a batch size) multiply."""
    best = anchor(names, measured)
    inside = best.names if best else frozenset()
    time_ = _compose(best, names - inside, measured, single)
    for pair in map(frozenset, itertools.combinations(sorted(names), 2)):
        both = measured.get(pair)
        if pair <= inside or both is None or not both.ok or not both.rel_time or not pair <= single.keys():
            continue
        if (parts := _compose(None, pair, measured, single)) > 0:
            time_ *= both.rel_time / parts
    return time_


def greedy(pool: list[str], valid: Callable[[frozenset[str]], str | None]) -> frozenset[str]:
    """The stack an engineer writes first: every strategy of `pool` (the fastest first) that the registry lets
    join the ones before it; one refused for lack of another (cce before bf16) joins as soon as that one is in, before
    the slower strategies are looked at (liger, which conflicts with cce, then stays out)."""
    stack: frozenset[str] = frozenset()
    waiting: list[str] = []
    for n in pool:
        if valid(stack | {n}) is not None:
            waiting.append(n)
            continue
        stack |= {n}
        joined = True
        while joined:  # those refused before may join now, in their order
            joined = False
            for w in list(waiting):
                if valid(stack | {w}) is None:
                    stack, joined = stack | {w}, True
                    waiting.remove(w)
    return stack


def simplest(rows: Iterable[Measured], noise: float, floor_of: Measured | None = None) -> Measured | None:
    """The pick among measured rows that meet the budgets: the fewest strategies among those within the noise floor
    of the fastest (a strategy is in a plan only where it pays beyond the floor), then the faster; never slower
    than `floor_of` (the ecosystem's default, when measured)."""
    fits = [m for m in rows if m.feasible]
    fastest = min(fits, key=lambda m: (m.rel_time, m.rel_mem or 1.0), default=None)
    if fastest is None:
        return None
    limit = (fastest.rel_time or 1.0) * (1 + noise)
    if floor_of is not None and floor_of.feasible and floor_of.rel_time:
        limit = min(limit, floor_of.rel_time)
    close = [m for m in fits if (m.rel_time or 1.0) <= limit] or [fastest]
    return min(close, key=lambda m: (len(m.names), m.rel_time, m.rel_mem or 1.0))


def search(
    singles: list[Measured],
    measure: Callable[[list[str]], list[Measured]],
    valid: Callable[[frozenset[str]], str | None],
    order: list[str],
    noise: float | None = None,
    mem_of: Callable[[frozenset[str], int | None], tuple[float | None, str | None]] = lambda _n, _b: (None, None),
    max_trials: int = 12,
    max_seconds: float | None = None,
    on_round: Callable[[Search], None] = lambda _s: None,
    clock: Callable[[], float] = time.monotonic,
    earlier: list[Candidate] | tuple[Candidate, ...] = (),
    next_batch: Callable[[int | None], int | None] = lambda _batch: None,
    default: str | None = None,
    savers: Callable[[frozenset[str]], list[str]] | None = None,
    largest: Callable[[frozenset[str], int | None], int | None] | None = None,
) -> Search:
    """Search combinations of the strategies in `singles` (one-strategy rows already measured; the baseline's rel_time
    is 1). Round 1 measures the greedy stack first (every row that helped beyond the noise floor, the fastest first,
    minus those the registry forbids beside it), predicts every other valid combination of those rows (and, when
    the baseline breaks a budget, of the rows that save memory), prunes those the estimate says do not fit
    (`mem_of(names, batch) -> (bytes, why_not)`), and measures the best predicted to beat the incumbent (the
    fastest measured row that meets the budgets) by half the noise floor (the study's, at least DEFAULT_NOISE and
    at most WIDE for this purpose), BEAM a round. Every prediction that misses is recorded; where predictions said
    slower than measured, a candidate predicted within that miss (per strategy composed) of the bar is measured too.
    The incumbent at the next batch size is tried once where nothing was run at that size or half of it; where it
    runs out of memory there, it is tried with each strategy that saves memory (`savers(names)`) instead. When
    fewer than two rows helped (nothing to combine), the fastest single row is screened: measured with each other
    strategy, BEAM a round in the order predicted, when nothing else is predicted ahead and at the batch size it
    leads at, until a combination leads. Each later round proposes the incumbent plus or minus one strategy and the
    unmeasured combinations again, with predictions anchored on what was measured (and on each measured pair's gain
    beyond its parts). When nothing is left ahead, the incumbent without each of its strategies is measured where
    that is predicted within the floor of it (is it needed?). It stops when nothing left is
    worth measuring, or when `max_trials` rows or `max_seconds` are spent. The pick (`incumbent`) is then the
    simplest measured row within the noise floor of the fastest, never slower than `default` (the row text of the
    ecosystem's default, when it is among `singles`). `earlier`: the candidates an earlier run of this search
    measured (a resumed search): they stay in its record, are not proposed again, and count against `max_trials`
    (the budget is the search's, not a run's).
    `next_batch(batch)`: the batch size to try the incumbent at after `batch` (None: the study's), None for none;
    `mem_of(names, batch)` then prices it at that size. `largest(names, batch)`: the largest batch the estimate
    says fits the device (None: no figure); where it is past the next doubling, the incumbent is tried there once
    too, beside the doubling (a GPU's memory, not a doubling at a time, is what bounds the batch)."""
    began = clock()
    study_noise = noise
    noise = DEFAULT_NOISE if noise is None else max(noise, DEFAULT_NOISE)
    measured: dict[frozenset[str], Measured] = {m.names: m for m in singles if m.batch is None}
    sized: dict[tuple[frozenset[str], int], Measured] = {(m.names, m.batch): m for m in singles if m.batch}
    single = {
        n: m.rel_time for m in singles if m.ok and len(m.names) == 1 and m.rel_time and m.batch is None for n in m.names
    }
    base_row = next((m for m in singles if m.row == default), None) if default else None
    result = Search(noise, None, study_noise=study_noise)
    bar_noise = min(noise, max(WIDE, DEFAULT_NOISE))

    def everything() -> list[Measured]:
        return [*measured.values(), *sized.values()]

    def incumbent() -> Measured | None:
        fits = [m for m in everything() if m.feasible]
        return min(fits, key=lambda m: (m.rel_time, m.rel_mem or 1.0), default=None)

    base_fits = any(m.feasible and not m.names for m in measured.values())
    helpers = sorted((n for n in single if single[n] < 1 - noise), key=lambda n: single[n])
    saving = [] if base_fits else [n for n in single if (measured[frozenset({n})].rel_mem or 1) < 1 - noise]
    pool = list(dict.fromkeys([*helpers, *saving]))[:POOL]
    # fewer than two rows helped: nothing to combine, so the search screens the pairs of the fastest single row
    # (or of the single row leading at a larger batch size) while no combination leads
    lead = None
    if len(pool) < 2:
        lead = min(
            (m for m in measured.values() if len(m.names) == 1 and m.feasible),
            key=lambda m: m.rel_time or 1.0,
            default=None,
        )
    seen: dict[str, Candidate] = {c.row: c for c in earlier}
    result.candidates += list(earlier)
    result.trials = len(earlier)

    def predicted(names: frozenset[str], batch: int | None) -> tuple[float, int]:
        """The prediction, and how many strategies (and a batch size) it composes beyond what was measured."""
        if not batch:
            if names in measured and measured[names].ok:
                return measured[names].rel_time or 1.0, 0
            found = anchor(names, measured)
            return predict(names, measured, single), len(names - (found.names if found else frozenset()))
        # (judged by the bar's floor: a doubling that gained 12% on a ±14% floor is followed, not stopped at)
        scale = batch_scale(measured, sized, batch, bar_noise)
        scale = scale if scale > 0 else 1 - noise / 2  # (a row of no time: no figure)
        # what was measured at this size, brought back to the study's by the size's scale, anchors and informs a
        # prediction there as rows at the study's size do: a pair screened at a doubled size carries its gain
        known = dict(measured)
        for (n, b), m in sized.items():
            # (phases at another size are not the study's: such an anchor composes by the ratios' product)
            if b == batch and (n not in known or not known[n].ok) and m.ok and m.rel_time:
                known[n] = replace(m, rel_time=m.rel_time / scale, parts=None, batch=None)
        own = known.get(names)
        if own is not None and own.ok and own.rel_time:
            return own.rel_time * scale, 1
        found = anchor(names, known)
        return predict(names, known, single) * scale, 1 + len(names - (found.names if found else frozenset()))

    def consider(names: frozenset[str], reason: str, round_: int, batch: int | None = None) -> Candidate | None:
        text = row_text(names, order, batch)
        known = (names, batch) in sized if batch else names in measured or len(names) < 2
        if text in seen or known or not names or not names <= set(single):
            return seen.get(text)
        if valid(names) is not None:
            return None  # the registry forbids it: never built, never shown as a candidate
        time_, gap = predicted(names, batch)
        c = Candidate(text, round_, reason, time_, batch=batch, gap=gap)
        c.predicted_bytes, over = mem_of(names, batch)
        if over is not None:
            c.state, c.note = "pruned", over
        seen[text] = c
        result.candidates.append(c)
        return c

    def hearsay(batch: int | None) -> bool:
        """Whether the doubling into `batch` is known from one pair only, and moved inside the floor: one ratio of
        two noisy trials (on a ±6% floor one pair read 4->8 as 2%, where 23 pairs of the same space read 13% at the
        median, from -3% to +24%), too little to call the batch search done. The next doubling is then measured
        once, after what is predicted ahead of the incumbent."""
        if not batch:
            return False
        pairs = sum(
            1
            for (n, b), m in sized.items()
            if b == batch and m.ok and n in measured and measured[n].ok and measured[n].rel_time
        )
        if any(b == batch // 2 for _n, b in sized):
            below = batch_scale(measured, sized, batch // 2, bar_noise)
        elif next_batch(None) == batch:  # the doubling from the study's batch
            below = 1.0
        else:  # reached by a leap (the estimate's largest fitting batch): not one doubling's reading
            return False
        if below <= 0:
            return False
        step = batch_scale(measured, sized, batch, bar_noise) / below
        return pairs == 1 and abs(1 - step) < bar_noise

    def band(c: Candidate) -> float:
        """How much slower than the bar a candidate may be predicted and still be measured: the misses where
        predictions said slower than measured, per strategy composed, times its own composed strategies."""
        return math.exp(result.error * max(1, c.gap))

    stack = greedy(pool, valid) if len(pool) >= 2 else frozenset()
    forced: list[Candidate] = []  # measured in round 1 whatever is predicted: the stack an engineer writes first
    top = consider(stack, "the greedy stack: every row that helped, minus conflicts", 1) if len(stack) >= 2 else None
    if top is not None and top.state == "proposed":  # (one measured before, or pruned, is not forced again)
        forced.append(top)
    for size in range(2, len(pool) + 1):
        for combo in itertools.combinations(pool, size):
            consider(frozenset(combo), "a combination of rows that helped", 1)

    unpriced: set[str] = set()
    leapt: set[frozenset[str]] = set()  # the combinations already tried at the estimate's largest fitting batch
    round_ = 1
    pruning = False  # the last rounds: is each strategy of the incumbent inside the floor needed?
    while True:
        best = incumbent()
        # measured when predicted to beat the incumbent by half the noise floor: a gain predicted smaller would not
        # be told from noise once measured, even if real; one predicted at half the floor may measure beyond it
        # (a prediction misses by more than that). Asking for the whole floor stopped a causal-LM search at 1.27x
        # its best; asking for any gain took it 6 trials where half the floor took 4 to the same pick (§D1).
        bar = (best.rel_time or 1.0) * (1 - bar_noise / 2) if best else math.inf
        # from round 2 on; from the first in a continued search, or where a combination (`all`) leads singles that
        # left nothing to combine (the screen is only of a single row's pairs)
        if best is not None and (round_ > 1 or earlier or (lead is not None and len(best.names) > 1)):
            for n in sorted(set(single) - best.names, key=order.index):
                consider(best.names | {n}, f"{best.row} + {n}", round_, best.batch)
            for n in sorted(best.names, key=order.index):
                consider(best.names - {n}, f"{best.row} - {n}", round_, best.batch)
        hunch: list[Candidate] = []  # the incumbent doubled where one pair's reading is all that says it gains nothing
        first = []  # this round's incumbent at a doubled batch size with no figure to predict it from
        # (not beside the greedy stack: it is measured to become the incumbent, and the doubling follows it)
        if best is not None and not forced and (bigger := next_batch(best.batch)) is not None:
            doubled = consider(best.names, f"{best.row} at batch size {bigger}", round_, bigger)
            # nothing run at that size or at half of it (a row that failed there counts: it is a figure): tried
            # once whatever the floor; after that, the last doubling's gain predicts the next
            if doubled is not None and not {bigger, bigger // 2} & {b for _n, b in sized}:
                first.append(doubled)
                unpriced.add(doubled.row)  # its figure is a prior, not a prediction: its miss says nothing
            elif doubled is not None and doubled.state == "proposed" and hearsay(best.batch):
                hunch.append(doubled)  # measured, but after the candidates predicted ahead (it is no prediction)
                unpriced.add(doubled.row)
            most = largest(best.names, best.batch) if largest is not None else None
            if most is not None and most > bigger and best.names not in leapt:
                leapt.add(best.names)
                far = consider(best.names, f"{best.row} at the estimate's largest fitting batch {most}", round_, most)
                if far is not None and far.state == "proposed":
                    first.append(far)
                    unpriced.add(far.row)
            # out of memory there: the incumbent with each strategy that saves memory, at that size (the batch
            # search goes on until memory binds with every saving it can take, not at the first OOM)
            oom = sized.get((best.names, bigger))
            if oom is not None and oom.status == "oom" and savers is not None:
                for n in savers(best.names):
                    c = consider(
                        best.names | {n}, f"{best.row} + {n} (saves memory) at batch size {bigger}", round_, bigger
                    )
                    if c is not None and c.state == "proposed" and c not in first:
                        first.append(c)
                        if not any(b == bigger and m.ok for (_n, b), m in sized.items()):
                            unpriced.add(c.row)  # priced by a prior (nothing ran there): its miss says nothing
        waiting = [c for c in result.candidates if c.state == "proposed"]
        for c in waiting:
            c.predicted_time, c.gap = predicted(*split_row(c.row))
        ahead = sorted(
            (c for c in waiting if c.predicted_time < bar * band(c) or c in first or c in forced or c in hunch),
            key=lambda c: (c not in forced, c not in first[:1], c in hunch, c.predicted_time),
        )
        screen = None  # the single row whose pairs are screened (while no combination leads)
        if lead is not None and best is not None and len(best.names) <= 1:
            screen = best if best.names else lead
        if not ahead and screen is not None and not pruning:
            # the screen: the single rows left nothing to combine, so when nothing else is predicted ahead the fastest
            # of them (at the batch size it leads at; even when the baseline leads) is measured with each other
            # strategy, whatever is predicted, until a combination leads; a pair can gain what neither part gains
            # alone (a tied head frozen spares chunked_ce its weight gradient), and from the pair that leads the
            # search goes on as from any incumbent, anchored on the pairs measured
            for n in sorted(set(single) - screen.names, key=order.index):
                pair = consider(screen.names | {n}, f"screen: {screen.row} + {n}", round_, screen.batch)
                if pair is not None and pair.state == "proposed":
                    pair.reason = f"screen: {screen.row} + {n}"
                    ahead.append(pair)
            ahead.sort(key=lambda c: c.predicted_time)
        if not ahead and best is not None and len(best.names) > 1:
            # is each strategy of the incumbent needed? The incumbent without it is measured where that is predicted
            # within the floor of the incumbent (the pick is the simplest row within the floor of the fastest: a
            # strategy is in only where it pays beyond it; tf32 beside bf16 pays nothing, whatever it does alone)
            for n in sorted(best.names, key=order.index):
                c = consider(best.names - {n}, f"{best.row} - {n}", round_, best.batch)
                if c is not None and c.state == "proposed" and c.predicted_time <= (best.rel_time or 1.0) * (1 + noise):
                    c.reason = f"{best.row} - {n}: is {n} needed? (predicted within the floor without it)"
                    ahead.append(c)
            pruning = pruning or bool(ahead)
        if not ahead:
            result.stopped = "no candidate left is predicted to beat the incumbent by half the noise floor " + (
                f"±{noise:.1%}"
                if bar_noise == noise
                else f"(±{bar_noise:.1%} of its ±{noise:.1%}: a wide floor is no reason to stop)"
            )
            if result.error:
                result.stopped += (
                    f", within the predictions' measured miss ({math.exp(result.error) - 1:.0%} per strategy)"
                )
            if screen is not None and any(c.reason.startswith(f"screen: {screen.row} + ") for c in result.candidates):
                result.stopped += f", and {screen.row} was screened with each other strategy it may take"
            break
        if result.trials >= max_trials:
            result.stopped = f"--max-trials {max_trials} spent"
            break
        if max_seconds is not None and clock() - began >= max_seconds:
            result.stopped = f"--max-search-time {max_seconds:g} s spent"
            break
        chosen = ahead[: min(max(BEAM, len(forced)), max_trials - result.trials)]
        for i, c in enumerate(chosen, start=result.trials + 1):
            c.trial = i
        for c in chosen:  # one the measure returned no row for is not asked for again
            c.state, c.note = "failed", "no result"
        for m in measure([c.row for c in chosen]):
            if m.batch:
                sized[(m.names, m.batch)] = m
            else:
                measured[m.names] = m
            c = seen[m.row]
            c.state = "measured" if m.ok else "failed"
            c.measured_time, c.measured_mem, c.note = m.rel_time, m.rel_mem, m.why_not or ("" if m.ok else m.status)
            if m.ok and m.rel_time and c.predicted_time > 0 and c.row not in unpriced:
                c.miss = m.rel_time / c.predicted_time
        forced = []
        result.error = _error(result.candidates)
        result.trials += len(chosen)
        result.rounds = round_
        after = incumbent()
        result.incumbent = after.row if after else None
        on_round(result)
        round_ += 1
    fastest = incumbent()
    final = simplest(everything(), noise, base_row)
    result.fastest = fastest.row if fastest else None
    result.incumbent = final.row if final else None
    result.wall_s = clock() - began
    for c in result.candidates:
        if c.state == "proposed":
            c.state = "skipped"
    return result


def _error(candidates: list[Candidate]) -> float:
    """The median miss per strategy composed (log), over the predictions that said slower than measured (those that
    said faster widen nothing: a candidate predicted a little behind the incumbent is not likely ahead)."""
    misses = sorted(-math.log(c.miss) / max(1, c.gap) for c in candidates if c.miss is not None and c.miss < 1)
    return misses[(len(misses) - 1) // 2] if misses else 0.0  # the lower median: two misses take the smaller
