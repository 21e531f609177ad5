"""The plan search's inputs: a study's rows as what the model reads, and the candidates it may measure.

A candidate is what it *sets*: its merged knob values (`TrialPlan`) and its batch size. Two rows that set the same
thing are one candidate (`dynamic_pad+smart_batch` sets exactly what `smart_batch` sets), named by the fewest
strategies that set it. Its features are those settings (one per knob value that differs from the baseline's), so
strategies that set the same knob share its effect instead of multiplying it. Where the registry says a strategy
overlaps another (`Strategy.overlaps`: tf32 speeds the fp32 matmuls that bf16 autocast no longer runs), its setting
beside that one is a feature of its own whose prior is no effect.

An `Observation` is one measured row (or one repeat of it): its time per sample relative to the baseline's, split
into a per-sample part (forward/backward and the data wait) and a per-step part (the optimizer and the rest of the
step), each per sample; its memory, its status, and a one-time cost (torch.compile's compile) kept apart from
its steps.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from trainwise import strategies
from trainwise.core.errors import ConfigError
from trainwise.core.results import StudyRow
from trainwise.strategies.knobs import TrialPlan

# a phase part smaller than this (relative to the baseline's step) is read as this: log space has no zero, and a
# part this small (a data wait of 0.1% of the step) moves nothing the search decides
SMALLEST_PART = 1e-3


@dataclass(frozen=True)
class Key:
    """What a candidate sets: its knob values and its batch size (samples per optimizer step before packing)."""

    plan: TrialPlan
    batch: int


@dataclass(frozen=True)
class Choice:
    """A candidate the search may measure: what it sets, the fewest strategies that set it, and its row text."""

    key: Key
    names: frozenset[str]
    row: str  # `smart_batch+freeze_embeddings@bs32`; the study's batch has no suffix
    features: frozenset[str]


@dataclass(frozen=True)
class Observation:
    """A measured row as the model reads it (times relative to the baseline's per sample)."""

    row: str
    key: Key
    names: frozenset[str]
    status: str = "ok"  # ok | oom | failed | timeout | unsupported ...
    time: float | None = None  # per sample, relative to the baseline's; None: it did not run ok
    # (per-sample part, per-step part), summing to `time`; None: the row's phases were not measured
    parts: tuple[float, float] | None = None
    weight: float = 1.0  # the trials behind the figure (a median of 3 weighs 3)
    peak_bytes: float | None = None
    rel_mem: float | None = None
    compile_s: float | None = None  # a one-time cost, never part of `time`
    why_not: str | None = None  # a budget the row breaks (None: it meets them)
    source: str = ""  # the repeat round it was measured in ("": the study)

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.time is not None and self.time > 0

    @property
    def feasible(self) -> bool:
        return self.ok and self.why_not is None


def features(plan: TrialPlan) -> frozenset[str]:
    """A plan's settings as features: `knob=value` for each knob that differs from the baseline's; a setting of a
    strategy beside one it overlaps (the registry's `overlaps`) reads `knob=value~other` (its own prior: no
    effect)."""
    changed = plan.changed()
    feats = {f"{k}={_text(v)}" for k, v in changed.items()}
    for s in strategies.REGISTRY.values():
        if not s.overlaps or not _holds(changed, s.sets):
            continue
        beside = sorted(o for o in s.overlaps if _holds(changed, strategies.REGISTRY[o].sets))
        if beside:
            for k, v in s.sets.items():
                feats.discard(f"{k}={_text(v)}")
                feats.add(f"{k}={_text(v)}~{beside[0]}")
    return frozenset(feats)


def interacting() -> frozenset[tuple[str, str]]:
    """The feature pairs of the strategies the registry says interact (`Strategy.interacts`), each sorted."""
    found = set()
    for s in strategies.REGISTRY.values():
        for other in s.interacts:
            for a in (f"{k}={_text(v)}" for k, v in s.sets.items()):
                for b in (f"{k}={_text(v)}" for k, v in strategies.REGISTRY[other].sets.items()):
                    found.add((min(a, b), max(a, b)))
    return frozenset(found)


def _holds(changed: dict, sets: Mapping[str, object]) -> bool:
    return bool(sets) and all(changed.get(k) == v for k, v in sets.items())


def _text(value: object) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def base(name: str) -> str:
    """A strategy's registry name (`freeze_layers=4` -> `freeze_layers`)."""
    return name.partition("=")[0]


def row_text(names: Iterable[str], batch: int | None = None) -> str:
    """A combination's row text, its strategies in the registry's order, with its own batch size when it has one."""
    order = list(strategies.REGISTRY)
    text = "+".join(sorted(names, key=lambda n: order.index(base(n)))) or "baseline"
    return f"{text}@bs{batch}" if batch else text


def names_of(row: strategies.Row, accum: int) -> frozenset[str]:
    """A parsed row's strategies, each with its `=N` where that is not what the bare name gives (`freeze_layers=4`
    where the default is 2; `grad_accum` at --accum-steps stays bare)."""
    out = set()
    for s, value in row.parts:
        if s.name == "baseline":
            continue
        given = s.default_value if s.default_value is not None else accum
        out.add(s.name if s.takes is None or value == given else f"{s.name}={value}")
    return frozenset(out)


def split_row(text: str) -> tuple[frozenset[str], int | None]:
    """The strategies and own batch size of a row text (`bf16+smart_batch@bs16`)."""
    body, at, size = text.partition("@bs")
    return frozenset(n for n in body.split("+") if n) - {"baseline"}, int(size) if at else None


def plan_of(names: Iterable[str], accum: int) -> TrialPlan | None:
    """The merged settings of a set of strategies (None: the registry refuses the combination)."""
    text = row_text(names)
    try:
        return strategies.parse_row(text, accum, stored=True).plan
    except ConfigError:
        return None


@dataclass
class Space:
    """Every candidate the search may measure: each valid combination of the pool's strategies at each batch size
    of the ladder, one per distinct settings (named by the fewest strategies), and each row already measured."""

    study_batch: int
    batches: tuple[int, ...]
    choices: dict[Key, Choice] = field(default_factory=dict)

    def simplest(self, names: frozenset[str], batch: int, accum: int) -> Choice | None:
        plan = plan_of(names, accum)
        return None if plan is None else self.choices.get(Key(plan, batch))


def build_space(
    pool: Iterable[str],
    valid: Callable[[frozenset[str]], str | None],
    study_batch: int,
    batches: Iterable[int],
    accum: int,
    measured: Sequence[Observation] = (),
    limit: int = 4096,
) -> Space:
    """The candidates: every subset of `pool` the registry and the options allow (`valid`), deduplicated by what it
    sets, at each batch size; subsets are taken smallest first, so a set of settings is named by its fewest
    strategies, and past `limit` distinct settings the largest are left out (a pool of 12 strategies has 4,096
    subsets; a search measures a handful). A row already `measured` keeps its own spelling (its study's row: what
    export and train read), and one outside the ladder (the ecosystem's default at its own batch) is a candidate
    too, where `valid` allows it."""
    order = list(strategies.REGISTRY)
    names = sorted(set(pool), key=lambda n: order.index(base(n)))
    space = Space(study_batch, tuple(sorted({study_batch, *batches})))
    seen: dict[TrialPlan, frozenset[str]] = {}
    subsets = (frozenset(c) for k in range(len(names) + 1) for c in itertools.combinations(names, k))
    for chosen in subsets:
        if len(seen) >= limit:
            break
        if chosen and (valid(chosen) is not None or len({base(n) for n in chosen}) < len(chosen)):
            continue
        plan = plan_of(chosen, accum)
        if plan is not None and plan not in seen:
            seen[plan] = chosen
    for plan, chosen in seen.items():
        feats = features(plan)
        for b in space.batches:
            if not chosen and b != study_batch:
                continue  # the baseline is the study's batch (`baseline@bsN` is refused)
            key = Key(plan, b)
            space.choices[key] = Choice(key, chosen, row_text(chosen, None if b == study_batch else b), feats)
    rows = {m.row for m in measured}
    for o in measured:
        if o.status != "ok" or (o.names and valid(o.names) is not None):
            continue
        found = space.choices.get(o.key)
        if found is None:
            space.choices[o.key] = Choice(o.key, o.names, o.row, features(o.key.plan))
        elif found.row not in rows:  # named as the study holds it
            space.choices[o.key] = Choice(o.key, found.names, o.row, found.features)
    return space


def ladder(study_batch: int, n_train: int | None, cap: int | None = None) -> tuple[int, ...]:
    """The batch sizes a search may try: the study's, doubled while the training rows hold a full batch of it (and,
    with `cap`, while it is at most that)."""
    sizes = [study_batch]
    while True:
        nxt = 2 * sizes[-1]
        if (n_train is not None and nxt > n_train) or (cap is not None and nxt > cap) or nxt > 1 << 16:
            return tuple(sizes)
        sizes.append(nxt)


def observation(
    row: str,
    key: Key,
    names: frozenset[str],
    *,
    status: str,
    samples_per_s: float | None,
    base_samples_per_s: float | None,
    phases: tuple[float | None, float | None, float | None, float | None] | None = None,
    weight: float = 1.0,
    peak_bytes: float | None = None,
    rel_mem: float | None = None,
    compile_s: float | None = None,
    why_not: str | None = None,
    source: str = "",
) -> Observation:
    """One measured row relative to its baseline. `phases`: the medians of a step's data wait, forward/backward,
    optimizer and whole step, in seconds: the row's time splits as they do, into the per-sample part (data and
    forward/backward) and the per-step part (the optimizer and the rest of the step)."""
    time = parts = None
    if status == "ok" and samples_per_s and base_samples_per_s:
        time = base_samples_per_s / samples_per_s
        if phases is not None and phases[0] is not None and phases[1] is not None and phases[3]:
            share = min(1.0, (phases[0] + phases[1]) / phases[3])  # (the medians split it; the totals give the time)
            parts = (max(SMALLEST_PART, time * share), max(SMALLEST_PART, time * (1.0 - share)))
    return Observation(
        row,
        key,
        names,
        status,
        time,
        parts,
        weight,
        peak_bytes,
        rel_mem,
        compile_s if compile_s else None,
        why_not,
        source,
    )


def validity(
    task: str,
    accum: int,
    caps: set[str],
    only: frozenset[str] = frozenset(),
    never: frozenset[str] = frozenset(),
    always: frozenset[str] = frozenset(),
) -> Callable[[frozenset[str]], str | None]:
    """`valid(names)`: None when the registry allows the combination on this task and device (conflicts,
    requirements, capabilities, packages) and --only / --never admit it; else why not. `always`: what the user's
    own config does whatever its fields say (the Trainer's collator pads each batch to its longest): a combination
    must set what they set too, or do what cannot be combined with them (packing in place of padding)."""

    def valid(names: frozenset[str]) -> str | None:
        bare = {base(n) for n in names}
        if only and not bare <= only or bare & never:
            return "outside --only / --never"
        if always and not always <= names:
            with_them = plan_of(names | always, accum)
            if with_them is not None and with_them != plan_of(names, accum):
                return f"without {'+'.join(sorted(always))}, which your config does whatever its fields say"
        try:
            row = strategies.parse_row(row_text(names), accum)
        except ConfigError as e:
            return str(e)
        if (wrong := row.wrong_task(task)) is not None:
            return f"{wrong.name} is not for {task}"
        if missing := row.missing_capabilities(caps):
            return f"needs {', '.join(missing)}"
        if packages := row.missing_packages():
            return f"needs {', '.join(packages)}"
        return None

    return valid


def observations(
    rows: Sequence[StudyRow],
    accum: int,
    study_batch: int,
    why_not: dict[str, str],
    source: str = "",
    reference: float | None = None,
) -> list[Observation]:
    """A study's rows as the model reads them: each relative to the study's baseline (its runs' mean), its phases
    as the two parts per sample, weighed by its ok trials. `why_not`: the budget each row breaks (advise's);
    `reference`: the baseline's samples/s where the rows hold no baseline (a repeat round's study)."""
    ref = next((r.samples_per_s for r in rows if r.baseline and r.status == "ok" and r.samples_per_s), reference)
    found = []
    for r in rows:
        parsed = strategies.parse_row(r.row_text, accum, stored=True)
        o = observation(
            r.row_text,
            Key(parsed.plan, r.batch_size or parsed.batch_size or study_batch),
            names_of(parsed, accum),
            status=r.status,
            samples_per_s=r.samples_per_s,
            base_samples_per_s=ref,
            phases=(r.data_wait_s, r.compute_s, r.optimizer_s, r.step_time_median_s or r.step_time_s),
            weight=float(max(1, r.repeats)),
            peak_bytes=r.peak_mem_bytes,
            rel_mem=r.rel_mem,
            compile_s=r.compile_s,
            why_not=why_not.get(r.row_text) if r.status == "ok" else None,
            source=source,
        )
        found.append(o)
    return found


def deviations(rows: Sequence[StudyRow]) -> list[float]:
    """What the rows measured more than once say of one trial's noise: per degree of freedom, the squared
    deviations of their trials' log step times from their mean (a row of n trials gives n - 1)."""
    out: list[float] = []
    for r in rows:
        times = [t for t in (r.step_time_s_all or []) if t and t > 0]
        if len(times) < 2:
            continue
        logs = [math.log(t) for t in times]
        mean = sum(logs) / len(logs)
        ss = sum((x - mean) ** 2 for x in logs)
        out += [ss / (len(logs) - 1)] * (len(logs) - 1)
    return out


# a single row's statuses that mean the device does not run the strategy (a failed or out-of-memory trial does not)
NOT_RUN = ("emulated", "unsupported", "inert")


def pool(found: Sequence[Observation]) -> list[str]:
    """The strategies the search may combine: each in a row that ran ok (cce, which runs only beside bf16, is in
    the pool through bf16+cce), and none whose own row did not (bf16 recorded as emulated is out, though `all` ran:
    `all` trains without what the device only emulates)."""
    order = list(strategies.REGISTRY)
    out = {n for o in found if o.ok for n in o.names}
    out -= {next(iter(o.names)) for o in found if o.status in NOT_RUN and len(o.names) == 1}
    return sorted(out, key=lambda n: order.index(base(n)))


def trial_seconds(rows: Sequence[StudyRow]) -> Callable[[float, int], float] | None:
    """What one trial of a candidate costs, in wall seconds, from the study's trials: a trial's wall time fitted as a
    fixed part (the process, the model, the data, the evaluation) plus a multiple of its step time (its steps, the
    warm-up's slower ones and the memory and FLOP steps after them), least squares over every row that ran; a
    candidate's step time is the baseline's per sample x its predicted time relative to the baseline x its batch.
    None where the study holds too few trials to fit (fewer than two step times apart, or no baseline)."""
    base_row = next((r for r in rows if r.baseline and r.status == "ok" and r.step_time_s and r.batch_size), None)
    fit = _wall_fit(rows)
    if base_row is None or fit is None:
        return None
    fixed, steps = fit
    per_sample = float(base_row.step_time_s or 0.0) / (base_row.batch_size or 1)
    return lambda t, batch: fixed + steps * t * per_sample * batch


def check_seconds(rows: Sequence[StudyRow], trials: Sequence[tuple[str, int]], study_steps: int) -> float | None:
    """What a quality check's `trials` (each a row's text and its optimizer steps) cost, in wall seconds: each one
    the study's fitted fixed part plus its steps and the speed trial's extra step times, at its row's measured step
    time. None where the study cannot say (too few trials to fit, a row it did not measure, or a row's text measured
    at several batch sizes: a --batch-sizes sweep's cells share it, and a row's own size is in its text, `@bs64`)."""
    fit = _wall_fit(rows)
    measured = [r for r in rows if r.status == "ok" and r.step_time_s]
    sizes: dict[str, set] = {}
    for r in measured:
        sizes.setdefault(r.row_text, set()).add(r.batch_size)
    pace = {r.row_text: r.step_time_s for r in measured if len(sizes[r.row_text]) == 1}
    if fit is None or any(row not in pace for row, _ in trials):
        return None
    fixed, steps = fit
    extra = max(0.0, steps - study_steps)  # the warm-up's slower steps, the memory and FLOP steps
    return sum(fixed + (n + extra) * float(pace[row] or 0.0) for row, n in trials)


def _wall_fit(rows: Sequence[StudyRow]) -> tuple[float, float] | None:
    """A trial's wall time as (fixed seconds, step times per trial), least squares over every row that ran."""
    points = [(r.step_time_s, r.wall_s) for r in rows if r.status == "ok" and r.step_time_s and r.wall_s]
    if len(points) < 2:
        return None
    xs, ys = [x for x, _ in points], [y for _, y in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return None
    steps = max(1.0, sum((x - mx) * (y - my) for x, y in points) / sxx)
    return max(0.0, my - steps * mx), steps
