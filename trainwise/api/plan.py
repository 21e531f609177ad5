"""`trainwise plan` as a call: the single rows (a study given with --study, or compare's rows run first), then
the search over their combinations (`trainwise.search.policy`, the policy), each round's candidates run as rows of the
same study (same baseline, noise floor and store: a killed search resumes, a fault is a row), the winner's
quality checked against the baseline over seeds, and the plan with its reasons written to OUT/plan.json and
OUT/plan.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shlex
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainwise import strategies
from trainwise.api import compare as compare_api
from trainwise.api.options import CompareOptions, PlanOptions, words
from trainwise.api.render import STDERR, Render
from trainwise.core.errors import ConfigError
from trainwise.core.files import human_bytes, write_atomic
from trainwise.core.results import StudyRow
from trainwise.core.units import parse_seconds
from trainwise.search import ecosystem
from trainwise.search.policy import (
    DEFAULT_NOISE,
    WIDE,
    Candidate,
    Measured,
    Search,
    row_text,
    search,
    simplest,
    split_row,
)
from trainwise.search.ranking import Constraints, advise, one_kind
from trainwise.search.verdicts import INCONCLUSIVE, unlearned
from trainwise.study.store import PAGE, PLAN, PLAN_MD, Store, write_report

UNMEASURED = "out: not measured (not among the study's rows)"


@dataclass
class Line:
    """A row of the plan's summary: its time and memory relative to the baseline, as measured."""

    label: str  # plan | fastest measured | best single row | ecosystem default | all | baseline
    row: str
    rel_time: float | None
    rel_mem: float | None
    samples_per_s: float | None
    peak_mem_bytes: float | None
    epoch_time_s: float | None
    tokens_per_s: float | None = None
    compile_s: float | None = None  # a one-time cost (torch.compile), charged once against the planned run
    flops_per_s: float | None = None  # counted FLOPs per second of its steps


@dataclass
class PlanResult:
    """What `trainwise plan` found (OUT/plan.json): the plan, the rows it is measured against, every strategy
    in or out with its reason, the search's candidates and cost, the quality checks, and the commands."""

    study: str
    plan: str | None  # the recommended row (None: nothing beat the baseline within the constraints)
    lines: list[Line]
    strategies: list[dict]  # {"strategy", "in": bool, "reason"}
    search: dict  # trainwise.search.policy.Search.to_dict()
    quality: dict | None  # the check of the plan against the baseline (None: not run)
    search_share_of_epoch: float | None  # the search's wall time / one projected epoch of the plan
    commands: list[str]
    notes: list[str] = field(default_factory=list)
    singles_s: float = 0.0  # wall time of the single rows (run, or read back from the store)
    quality_s: float = 0.0  # wall time of the quality checks
    rejected: str | None = None  # why no row is recommended: each candidate checked lost quality for real
    # the configuration the user gets without trainwise, measured as a row of the study (None: --no-ecosystem-default)
    ecosystem: dict | None = None
    checked: list[dict] = field(default_factory=list)  # each quality check, in order: {row, verdict, passed, why}
    peak: dict | None = None  # the best matmul peak measured in the study: {flops_per_s, mode, row}
    run_epochs: float = 1.0  # the planned run a one-time cost is charged against
    random_init: bool = False  # a size preset's random weights: a short run's quality says little
    headline: list[str] = field(default_factory=list)  # plan.md's opening lines
    # a wide floor's leaders measured again, longer (OUT/confirm): {out, steps, noise, times, pick, said}
    confirmed: dict | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def plan(config: str | Path | None = None, render: Render | None = STDERR, **options: Any) -> PlanResult:
    """`trainwise plan` in Python: the CLI's options as keyword arguments (over a study file's). Returns the
    PlanResult (`.plan`, `.lines`, `.strategies` with their reasons, `.search`), also in OUT/plan.json."""
    return start(PlanOptions.of(options, config), render)


def start(options: PlanOptions, render: Render | None = STDERR) -> PlanResult:
    render = Render.of(render)
    began = time.monotonic()
    constraints = options.constraints()
    budget_s = parse_seconds(options.max_search_time, "--max-search-time") if options.max_search_time else None
    if options.max_trials < 1:
        raise ConfigError(f"--max-trials must be >= 1, got {options.max_trials}")
    if options.run_epochs <= 0:
        raise ConfigError(f"--run-epochs must be > 0, got {options.run_epochs:g}")
    base = options.compare_options()
    cfg0, _price, _phase = base.resolve()
    if cfg0.batch_sizes or len(cfg0.num_workers) > 1:
        raise ConfigError(
            "plan searches at one batch size and worker count: leave out --batch-sizes and a --num-workers list"
        )
    only, never = _names(options.only, "--only"), _names(options.never, "--never")
    out = Path(base.out)
    from trainwise.study.prepare import resolve_device  # heavy: trainwise.study.prepare loads numpy (and torch)

    device, caps = resolve_device(cfg0.device)
    task, accum = cfg0.task, cfg0.accum_steps
    rows0 = [r.strip() for r in words(base.strategies)]
    extra: list[str] = []
    if options.study is None and _default_rows(options):
        # the device's own default rows (on a GPU: compile, charged once against the planned run, --run-epochs)
        extra += [r for r in strategies.default_rows(task, device) if r not in rows0]
    eco = None
    if options.ecosystem_default:
        eco = ecosystem.default_for(task, device, lambda row: _runnable(row, task, accum, caps))
        if eco.row != "baseline":
            # measured as given, and each of its strategies alone too (as a combination given as a row is): the
            # search can then take one out of it (grad_ckpt out of TRL's defaults) or add to it
            extra += [eco.row, *_alone(eco.row)]
    base = dataclasses.replace(base, strategies=[*rows0, *dict.fromkeys(r for r in extra if r not in rows0)])

    shown: list[Any] = []  # the last table a compare call drew: printed once, at the end (not after every round)
    said: set[str] = set()

    def once(line: str) -> None:  # a note each round's compare repeats (the model's, the data's) is said once
        if line not in said:
            said.add(line)
            render.note(line)

    quiet = dataclasses.replace(render, table=shown.append, note=once)
    compare_api.start(base, quiet)  # the single rows (and the ecosystem's default): run, or resumed from the store
    singles_s = time.monotonic() - began
    # from here on each round's compare says only its new trials (the stored ones were said above)
    quiet = dataclasses.replace(quiet, progress=_new_only(render.progress))
    rows = study_rows(out)
    order = list(strategies.REGISTRY)
    next_batch = doubling(out, cfg0.batch_size, options.batch_search)
    valid = validity(task, accum, caps, only, never)
    run_s = _run_seconds(rows, options.run_epochs)

    # what the search starts from: the single rows, `all` and the ecosystem's default, and the combinations an earlier
    # run of this search measured (a resumed search); other combinations in the study are measured again as the
    # search reaches them (read back from the store), so a search's path does not depend on rows it did not choose
    present = {r.row_text for r in rows}
    earlier = [c for c in _searched_before(out) if c.row in present]
    own = {c.row for c in earlier} | {"all"} | ({eco.row} if eco else set())
    table = measured_rows(rows, constraints, accum, run_s)
    singles = [
        m
        for m in table
        if (len(m.names) <= 1 or (m.row in own and valid(m.names) is None))  # (--only / --never bound `all` too)
        and (options.batch_search or m.batch is None)
    ]
    singles += _derived(table, singles)
    if not any(r.baseline and r.status == "ok" for r in rows):
        raise ConfigError(
            f"{out} has no baseline row that finished ok: the search measures every combination against it "
            "(add baseline to the study's rows)"
        )
    if not any(m.feasible for m in singles):
        why = next((f"{m.row}: {m.why_not}" for m in singles if m.ok and m.why_not), "no row finished ok")
        raise ConfigError(f"no row of {out} meets the constraints, so there is nothing to combine ({why})")
    noise = study_noise(rows)
    current = [r.row_text for r in rows]

    def measure(new: list[str]) -> list[Measured]:
        nonlocal current
        render.note(f"trainwise plan: measuring {', '.join(new)}")
        current = [*current, *(r for r in new if r not in current)]
        compare_api.start(dataclasses.replace(base, strategies=current), quiet)
        got = {m.row: m for m in measured_rows(study_rows(out), constraints, accum, run_s)}
        return [got[r] for r in new if r in got]

    def on_round(s: Search) -> None:
        render.note(f"trainwise plan: round {s.rounds}: incumbent {s.incumbent} after {s.trials} trial(s)")

    found = search(
        singles,
        measure,
        valid,
        order,
        noise=noise,
        mem_of=memory_of(out, constraints.memory_budget_bytes, accum, order),
        next_batch=next_batch,
        max_trials=options.max_trials,
        max_seconds=None if budget_s is None else max(0.0, budget_s - (time.monotonic() - began)),
        on_round=on_round,
        earlier=earlier,
        default=eco.row if eco else None,
        savers=_savers(singles, valid, max(noise or 0.0, DEFAULT_NOISE)),
        largest=largest_fitting(out, _capacity(device, constraints), accum, order, _n_train(out))
        if options.batch_search
        else None,
    )
    if shown:
        render.table(shown[-1])  # the study's whole table, once
    rows = study_rows(out)
    pick, confirmed = found.incumbent, None
    if found.noise > WIDE and found.fastest not in (None, "baseline"):
        # a floor too wide to tell the leaders apart: they are measured again, longer, in a study of their own
        # (only rows the search could pick: a sized row stays out under --no-batch-search, --only / --never bound it)
        def allowed(m: Measured) -> bool:
            return (options.batch_search or m.batch is None) and (len(m.names) <= 1 or valid(m.names) is None)

        confirmed = _confirm(base, rows, found, constraints, eco, run_s, quiet, allowed)
        pick = (confirmed or {}).get("pick") or pick
    ctx = Searched(options, base, rows, found, constraints, valid, only, never, eco, run_s)
    result = _result(ctx, pick)
    result.confirmed = confirmed
    if confirmed is not None:
        result.notes.append(confirmed["said"])
    result.singles_s = singles_s
    checked = time.monotonic()
    if options.quality_check and result.plan and result.plan != "baseline":
        result = _checked(ctx, result, render)
    result.quality_s = time.monotonic() - checked
    result.search = found.to_dict()
    plan_line = next((ln for ln in result.lines if ln.label == "plan"), None)
    if plan_line and plan_line.epoch_time_s:
        result.search_share_of_epoch = found.wall_s / plan_line.epoch_time_s
    result.headline = headline(result)
    write_atomic(out / PLAN, json.dumps(result.to_dict(), indent=1))
    write_atomic(out / PLAN_MD, markdown(result))
    from trainwise.api.report import render as draw  # heavy: the page's figures (matplotlib)

    try:  # the study's page again, with the search's figure
        write_report(out, out / PAGE, draw(out, "html"))
    except ConfigError as e:  # another command took the study meanwhile: the plan stands, its page waits
        render.note(f"trainwise plan: report.html not drawn again ({e}); `trainwise report {out}` draws it")
    return result


CONFIRM_STEPS = 3  # a wide floor's leaders are measured again with this many times the study's steps
CONFIRM_ROWS = 3  # at most this many leaders (and the ecosystem's default) in the confirmation


def _confirm(
    base: CompareOptions,
    rows: list[StudyRow],
    found: Search,
    constraints: Constraints,
    eco: ecosystem.Default | None,
    run_s: float | None,
    render: Render,
    allowed: Callable[[Measured], bool] = lambda _m: True,
) -> dict | None:
    """The leaders of a search whose noise floor is too wide to decide between them (past WIDE), measured again with
    CONFIRM_STEPS times the study's steps, beside the baseline (first and again last) and the ecosystem's default, in
    OUT/confirm (a study of its own: it resumes). The pick is then the simplest row within that study's floor (at
    least DEFAULT_NOISE) of its fastest, never slower than the ecosystem's default there. On a 2-core CPU a study's
    4 timed steps of SmolLM2 moved ±10-32% between identical rows; a window three times longer is what a wide floor
    asks for before a choice, not a reason to stop choosing."""
    measured = [
        m for m in measured_rows(rows, constraints, base.accum_steps, run_s) if m.feasible and m.names and allowed(m)
    ]
    if not measured:
        return None
    fastest = min(measured, key=lambda m: m.rel_time or 1.0)
    close = sorted(
        (m for m in measured if (m.rel_time or 1.0) <= (fastest.rel_time or 1.0) * (1 + found.noise)),
        key=lambda m: (m.rel_time or 1.0, len(m.names)),
    )
    leaders = [m.row for m in close[:CONFIRM_ROWS]]
    if found.incumbent and found.incumbent not in leaders:
        leaders.append(found.incumbent)
    extra = [eco.row] if eco is not None and eco.row not in (*leaders, "baseline") else []
    if len(leaders) < 2:  # one leader: nothing to choose between (the search's pick stands)
        return None
    steps = CONFIRM_STEPS * (base.max_steps or 16)
    where = Path(base.out) / "confirm"
    options = dataclasses.replace(
        base,
        out=str(where),
        strategies=["baseline", *leaders, *extra],
        max_steps=steps,
        repeat=1,
        remeasure=True,
        replace=False,
    )
    render.note(
        f"trainwise plan: the noise floor ±{found.noise:.1%} cannot tell {', '.join(leaders)} apart: measuring them "
        f"again over {steps} steps in {where}"
    )
    compare_api.start(options, render)
    again = study_rows(where)
    noise = max(study_noise(again) or 0.0, DEFAULT_NOISE)
    again_rows = measured_rows(again, constraints, base.accum_steps, run_s)
    default = next((m for m in again_rows if eco is not None and m.row == eco.row), None)
    # the ecosystem's default is a candidate there too: the pick is never slower than it
    table = [m for m in again_rows if m.row in leaders or m is default]
    chosen = simplest(table, noise, default)
    times = {m.row: m.rel_time for m in table}
    said = (
        f"confirmed over {steps} steps in {where} (its floor ±{noise:.1%}): "
        + ", ".join(f"{r} {_pct(t)}" for r, t in times.items())
        + (f"; the pick: {chosen.row}" if chosen else "; none of them ran ok: the search's pick stands")
    )
    return {
        "out": str(where),
        "steps": steps,
        "noise": noise,
        "times": times,
        "pick": chosen.row if chosen else None,
        "said": said,
    }


def _new_only(progress: Callable) -> Callable:
    """A study's progress that leaves out the trials read back from its store (a round of the search adds one or two
    rows to a study of many: its stored rows were said when they ran)."""

    @contextlib.contextmanager
    def shown(prepared: Any) -> Iterator[tuple[Callable, Callable]]:
        with progress(prepared) as (on_event, on_done):
            yield on_event, lambda spec, result, stored: None if stored else on_done(spec, result, stored)

    return shown


def _alone(row: str) -> list[str]:
    """A combination's strategies as rows of their own (one that runs only beside another, cce, is left out: its
    effect is read off the combination)."""
    names = [n.strip() for n in row.partition("@bs")[0].split("+")]
    return [n for n in names if n and n != "baseline" and not strategies.REGISTRY[n.partition("=")[0]].with_one_of]


def _capacity(device: str, constraints: Constraints) -> int | None:
    """The memory a GPU plan's batch may fill: the device's, or --memory-budget when smaller (None on a CPU: its RAM
    does not bind a batch the way a GPU's memory does, and a batch as large as it allows would take minutes a step)."""
    if device != "cuda":
        return None
    import torch  # heavy: torch

    total = int(torch.cuda.get_device_properties(0).total_memory)
    budget = constraints.memory_budget_bytes
    return min(total, budget) if budget else total


def _n_train(out: Path) -> int | None:
    spec = Store.spec_of(out)
    return spec.settings.n_train if spec is not None else None


def _default_rows(options: PlanOptions) -> bool:
    """Whether the plan runs the default rows (--strategies not given)."""
    given = [r.strip() for r in words(options.strategies)]
    return given == list(strategies.DEFAULT_ROWS) or given == list(strategies.default_rows(options.task))


def _runnable(row: str, task: str, accum: int, caps: set[str]) -> str | None:
    """Why `row` cannot run on this task, device and environment (None: it can)."""
    try:
        parsed = strategies.parse_row(row, accum)
    except ConfigError as e:
        return str(e)
    if (wrong := parsed.wrong_task(task)) is not None:
        return f"{wrong.name} is not for {task}"
    if missing := parsed.missing_capabilities(caps):
        return f"needs {', '.join(missing)}"
    if packages := parsed.missing_packages():
        return f"needs {', '.join(packages)}"
    return None


def _run_seconds(rows: list[StudyRow], epochs: float) -> float | None:
    """The planned run at the baseline's pace, in seconds (what a one-time cost is charged against)."""
    base = next((r for r in rows if r.baseline and r.status == "ok" and r.epoch_time_s), None)
    return base.epoch_time_s * epochs if base is not None and base.epoch_time_s else None


def _derived(table: list[Measured], singles: list[Measured]) -> list[Measured]:
    """A strategy that runs only beside another (cce beside bf16 or fp16) has no row of its own: its effect is read
    off the row that holds it with one of them (bf16+cce over bf16), as a single row the search combines, never
    picks."""
    alone = {m.names: m for m in singles if m.ok and len(m.names) == 1 and m.batch is None}
    base = alone.get(frozenset()) or next((m for m in table if not m.names and m.ok), None)
    found = []
    for m in table:
        if not m.ok or m.batch is not None or len(m.names) != 2:
            continue
        for name in m.names:
            needs = strategies.REGISTRY[name].with_one_of
            other = m.names - {name}
            if not needs or not other <= needs or frozenset({name}) in alone or other not in alone:
                continue
            with_ = alone[other]
            if not with_.rel_time or not m.rel_time:
                continue
            parts = None
            if m.parts and with_.parts and base is not None and base.parts:
                parts = tuple(
                    p * b / w if w > 0 else p for p, b, w in zip(m.parts, base.parts, with_.parts, strict=True)
                )
            rel_mem = m.rel_mem / with_.rel_mem if m.rel_mem and with_.rel_mem else None
            rel = m.rel_time / with_.rel_time
            found.append(Measured(name, frozenset({name}), rel, rel_mem, m.peak_bytes, parts=parts, derived=True))
            alone[frozenset({name})] = found[-1]
    return found


def _savers(singles: list[Measured], valid, noise: float):
    """`savers(names)`: the strategies whose single row used less memory than the baseline beyond the floor, that
    the registry lets join `names`, the most saving first (what lets a batch that ran out of memory fit)."""
    saving = sorted(
        (m for m in singles if len(m.names) == 1 and m.ok and m.rel_mem is not None and m.rel_mem < 1 - noise),
        key=lambda m: m.rel_mem or 1.0,
    )

    def of(names: frozenset[str]) -> list[str]:
        return [n for m in saving for n in m.names if n not in names and valid(names | {n}) is None]

    return of


def validity(
    task: str, accum: int, caps: set[str], only: frozenset[str] = frozenset(), never: frozenset[str] = frozenset()
) -> Callable[[frozenset[str]], str | None]:
    """`valid(names)`: None when the registry allows the combination on this task and device (conflicts,
    requirements, capabilities, packages) and --only / --never admit it; else why not."""
    order = list(strategies.REGISTRY)

    def valid(names: frozenset[str]) -> str | None:
        if only and not names <= only or names & never:
            return "outside --only / --never"
        try:
            row = strategies.parse_row("+".join(sorted(names, key=order.index)), accum)
        except ConfigError as e:
            return str(e)
        if row.wrong_task(task) or row.missing_capabilities(caps) or row.missing_packages():
            return "this task, device or environment cannot run it"
        return None

    return valid


def doubling(out: Path, batch_size: int, on: bool = True) -> Callable[[int | None], int | None]:
    """`next_batch(batch)`: twice the batch (None: the study's `batch_size`), while the study's training rows hold
    a full batch of it; None when `on` is False (--no-batch-search)."""
    spec = Store.spec_of(out)
    n_train = spec.settings.n_train if spec is not None else None

    def next_batch(batch: int | None) -> int | None:
        bigger = 2 * (batch or batch_size)
        return bigger if on and (n_train is None or bigger <= n_train) else None

    return next_batch


def study_noise(rows: list[StudyRow]) -> float | None:
    """The study's noise floor, from its baseline row (None: it has none)."""
    return next((r.noise_floor for r in rows if r.baseline and r.noise_floor is not None), None)


def _searched_before(out: Path) -> list[Candidate]:
    """The candidates an earlier `trainwise plan` in `out` measured (its plan.json), none when there is none."""
    try:
        earlier = json.loads((out / PLAN).read_text())
        known = {f.name for f in dataclasses.fields(Candidate)}
        return [
            Candidate(**{k: v for k, v in c.items() if k in known})
            for c in earlier["search"]["candidates"]
            if c["state"] in ("measured", "failed")
        ]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def _names(text: str | None, flag: str) -> frozenset[str]:
    if not text:
        return frozenset()
    names = frozenset(words(text))
    unknown = sorted(n for n in names if n not in strategies.REGISTRY or n == "baseline")
    if unknown:
        raise ConfigError(f"{flag}: unknown strategy {unknown[0]!r}; valid names: {strategies.valid_names()}")
    return names


def memory_of(out: Path, budget: int | None, accum: int, order: list[str]):
    """`trainwise estimate`'s peak (tensors + runtime, what --memory-budget bounds) of a combination on the study's
    model, batch and lengths, and why it does not fit (None: it fits, or nothing can be said: no budget, or a
    model the estimate cannot build here). Pruning happens before a candidate trains."""

    def nothing(_names: frozenset[str], _batch: int | None = None) -> tuple[float | None, str | None]:
        return None, None

    if budget is None:
        return nothing
    # heavy: the estimate builds the model on the meta device (torch, transformers)
    from trainwise.api.estimates import estimate_basis, price

    found = estimate_basis(out)
    if found is None:
        return nothing

    def of(names: frozenset[str], batch: int | None = None) -> tuple[float | None, str | None]:
        plan = strategies.parse_row("+".join(sorted(names, key=order.index)), accum).plan
        try:
            est = price(found, plan, batch or found[0].batch_size)
        except ConfigError:  # a plan the estimate does not model: measured, not pruned
            return None, None
        need = est.peak_bytes + est.overhead_bytes
        if need > budget:
            return need, f"the estimate needs {human_bytes(need)}, more than --memory-budget {human_bytes(budget)}"
        return need, None

    return of


def largest_fitting(out: Path, capacity: int | None, accum: int, order: list[str], cap: int | None = None):
    """`largest(names, batch)`: the largest power-of-two multiple of `batch` (the study's when None) at which
    `trainwise estimate`'s peak of the combination fits `capacity` (90% of it: the allocator's fragmentation and
    the CUDA context), at most `cap` (the training rows); None where the estimate cannot say or nothing larger
    fits. What bounds a GPU's batch is its memory: a search that only doubles spends a trial a size to get there."""

    def nothing(_names: frozenset[str], _batch: int | None = None) -> int | None:
        return None

    if capacity is None:
        return nothing
    from trainwise.api.estimates import estimate_basis, price  # heavy: the estimate (torch, transformers)

    found = estimate_basis(out)
    if found is None:
        return nothing

    def of(names: frozenset[str], batch: int | None = None) -> int | None:
        plan = strategies.parse_row("+".join(sorted(names, key=order.index)), accum).plan
        size, best = batch or found[0].batch_size, None
        while cap is None or 2 * size <= cap:
            size *= 2
            try:
                est = price(found, plan, size)
            except ConfigError:
                return best
            if est.peak_bytes + est.overhead_bytes > 0.9 * capacity:
                return best
            best = size
            if size >= 1 << 16:
                return best
        return best

    return of


def study_rows(out: Path) -> list[StudyRow]:
    """The study's rows the search reads: on a cluster of several device kinds, those of one kind (advise's)."""
    from trainwise.study.store import read_results  # heavy: trainwise.study.store

    return one_kind(read_results(out))[0]


def measured_rows(
    rows: list[StudyRow], constraints: Constraints, accum: int, run_s: float | None = None
) -> list[Measured]:
    """The study's rows as the search reads them, with advise's feasibility under the constraints. `run_s`: the
    planned run at the baseline's pace, in seconds; a row's one-time cost (torch.compile's compile) is charged once
    against it (its time relative to the baseline's per sample, plus the cost over that run)."""
    ranked = {v.strategy: v for v in advise(rows, constraints).verdicts}
    base = next((r for r in rows if r.baseline and r.status == "ok" and r.step_time_s), None)
    found = []
    for r in rows:
        text = r.row_text
        row = strategies.parse_row(text, accum, stored=True)
        names = frozenset() if r.baseline else frozenset(s.name for s, _ in row.parts)
        v = ranked.get(r.strategy)
        why = None if v is None or v.feasible or r.status != "ok" else v.reason
        rel = r.rel_time if r.status == "ok" else None
        parts = phases(r, base)
        if rel is not None and r.compile_s and run_s:
            rel += r.compile_s / run_s
            parts = None  # (the phases are a step's; the charge is the run's: the row composes by its ratio)
        found.append(Measured(text, names, rel, r.rel_mem, r.peak_mem_bytes, r.status, why, parts, row.batch_size))
    return found


def phases(r: StudyRow, base: StudyRow | None) -> tuple[float, ...] | None:
    """A row's step in phases (data wait, forward/backward, optimizer, the rest) over the baseline's step time,
    per sample: each phase times the baseline's samples per step over the row's. A step that carries more samples
    (a larger batch, or packed rows: on an H200 a packed step took the baseline's 0.25 s and held 8x its samples)
    has its phases shrunk by as much, so the phases sum to the row's time relative to the baseline's per sample
    and compose with what a strategy does to a step's cost (bf16 halving it) by multiplying: bf16 with packing is
    predicted near bf16's 49% x packing's 12%, not at bf16's 49% (per step, which left it unmeasured)."""
    parts = (r.data_wait_s, r.compute_s, r.optimizer_s)
    if base is None or not base.step_time_s or r.status != "ok" or not r.step_time_s or None in parts:
        return None
    known = [float(p or 0.0) for p in parts]
    mine, theirs = _samples_per_step(r), _samples_per_step(base)
    per_sample = theirs / mine if mine and theirs else (base.batch_size or 1) / (r.batch_size or base.batch_size or 1)
    return tuple(per_sample * p / base.step_time_s for p in [*known, max(0.0, r.step_time_s - sum(known))])


def _samples_per_step(r: StudyRow) -> float | None:
    """The samples an optimizer step of the row carried (its throughput times its step, both from its totals)."""
    return r.samples_per_s * r.step_time_s if r.samples_per_s and r.step_time_s else None


def _line(label: str, r: StudyRow | None) -> Line | None:
    if r is None:
        return None
    flops = r.flops_per_step / r.step_time_s if r.flops_per_step and r.step_time_s else None
    return Line(
        label,
        r.row_text,
        r.rel_time,
        r.rel_mem,
        r.samples_per_s,
        r.peak_mem_bytes,
        r.epoch_time_s,
        r.tokens_per_s,
        r.compile_s,
        flops,
    )


@dataclass(frozen=True)
class Searched:
    """What a plan is read from once its search ended: the options, the study's options and rows, the search, the
    budgets and the registry's verdict on combinations, the ecosystem's row and the planned run's seconds."""

    options: PlanOptions
    base: CompareOptions
    rows: list[StudyRow]
    found: Search
    constraints: Constraints
    valid: Callable[[frozenset[str]], str | None]
    only: frozenset[str] = frozenset()
    never: frozenset[str] = frozenset()
    eco: ecosystem.Default | None = None
    run_s: float | None = None


def _result(ctx: Searched, chosen: str | None) -> PlanResult:
    options, base, rows, found, constraints = ctx.options, ctx.base, ctx.rows, ctx.found, ctx.constraints
    valid, only, never, eco, run_s = ctx.valid, ctx.only, ctx.never, ctx.eco, ctx.run_s
    by_row = {r.row_text: r for r in rows}
    measured = {m.row: m for m in measured_rows(rows, constraints, base.accum_steps, run_s)}
    singles = [m for m in measured.values() if len(m.names) == 1 and m.feasible and m.batch is None]
    best_single = min(singles, key=lambda m: m.rel_time or 1.0, default=None)
    lines = [
        _line("plan", by_row.get(chosen or "")),
        _line("fastest measured", by_row.get(found.fastest or "")) if found.fastest not in (chosen, None) else None,
        _line("best single row", by_row.get(best_single.row) if best_single else None),
        _line("ecosystem default", by_row.get(eco.row)) if eco is not None else None,
        _line("all", by_row.get("all")),
        _line("baseline", next((r for r in rows if r.baseline), None)),
    ]
    plan_row = measured.get(chosen or "")
    plan_names, plan_batch = (plan_row.names, plan_row.batch) if plan_row else (frozenset(), None)
    noise = found.noise
    reasons = []
    for name in strategies.REGISTRY:
        if name == "baseline":
            continue
        alone = measured.get(name)
        if name in plan_names:
            without = measured.get(row_text(plan_names - {name}, list(strategies.REGISTRY), plan_batch) or "baseline")
            said = (
                f"in: alone {_pct(alone.rel_time)} time, {_pct(alone.rel_mem)} memory" if alone and alone.ok else "in"
            )
            if without is not None and without.ok and plan_row is not None and plan_row.rel_time:
                said += f"; the plan without it measured {_pct(without.rel_time)} (beyond the floor ±{noise:.1%})"
            reasons.append({"strategy": name, "in": True, "reason": said})
            continue
        if alone is None:
            why = (
                "--never"
                if name in never
                else "not in --only"
                if only and name not in only
                else "not measured (not among the study's rows)"
            )
        elif not alone.ok:
            why = f"{alone.status} on this device"
        elif alone.why_not:
            why = f"breaks a budget alone: {alone.why_not}"
        elif name in never:
            why = "--never"
        elif only and name not in only:
            why = "not in --only"
        elif plan_names and valid(plan_names | {name}) is not None:
            why = f"{_pct(alone.rel_time)} time alone, but the registry forbids it with the plan"
        else:
            tried = measured.get(row_text(plan_names | {name}, list(strategies.REGISTRY), plan_batch))
            mem = (
                "memory does not bind"
                if constraints.memory_budget_bytes is None
                else f"memory does not bind under {human_bytes(constraints.memory_budget_bytes)}"
            )
            if tried is not None and tried.ok:
                why = (
                    f"the plan with it measured {_pct(tried.rel_time)} time, no gain beyond the noise floor "
                    f"±{noise:.1%}"
                )
            elif (alone.rel_time or 1) > 1 + noise:
                why = f"{_pct(alone.rel_time)} time alone: slower than the baseline, and {mem}"
            elif (alone.rel_time or 1) >= 1 - noise:
                why = f"{_pct(alone.rel_time)} time alone: inside the noise floor ±{noise:.1%}, and {mem}"
            else:
                why = f"{_pct(alone.rel_time)} time alone, but no measured combination with it beat the plan"
        reasons.append({"strategy": name, "in": False, "reason": f"out: {why}" if why else UNMEASURED})
    commands = []
    if chosen and chosen != "baseline":
        q = shlex.quote
        commands = [
            f"trainwise export --study {q(str(Path(base.out).resolve()))} --strategies {q(chosen)} --out runs/export",
            f"trainwise train --plan {q(str(Path(base.out).resolve()))} --strategies {q(chosen)} --out runs/train",
        ]
    notes = [f"search stopped: {found.stopped}"]
    if found.fastest and chosen and found.fastest != chosen and chosen in measured and found.fastest in measured:
        notes.append(
            f"the plan is the simplest row within the noise floor ±{noise:.1%} of the fastest measured, "
            f"{found.fastest} ({_pct(measured[found.fastest].rel_time)} against {_pct(measured[chosen].rel_time)}): "
            "a strategy is in only where it pays beyond the floor"
        )
    if plan_row and plan_batch:
        at_study = measured.get(row_text(plan_names, list(strategies.REGISTRY)))
        was = f"{_pct(at_study.rel_time)} at {base.batch_size}, " if at_study and at_study.ok else ""
        notes.append(
            f"batch size {plan_batch}, not the study's {base.batch_size}: {was}{_pct(plan_row.rel_time)} of "
            "the baseline's time per sample at it"
        )
    compiled = by_row.get(chosen or "")
    if compiled is not None and compiled.compile_s and run_s:
        notes.append(
            f"compile: {compiled.compile_s:.0f} s once, charged against a planned run of {options.run_epochs:g} "
            f"epoch(s) ({run_s:.0f} s at the baseline's pace; --run-epochs says how long yours is)"
        )
    if chosen == "baseline" or chosen is None:
        notes.append("no strategy or combination beat the baseline beyond the noise floor within the constraints")
    if eco is not None:
        notes += [f"ecosystem default ({eco.source}): {n}" for n in eco.notes]
    peaks = [r for r in rows if r.status == "ok" and r.peak_flops_per_s]
    top = max(peaks, key=lambda r: r.peak_flops_per_s or 0.0, default=None)
    peak = {"flops_per_s": top.peak_flops_per_s, "mode": top.peak_mode, "row": top.row_text} if top else None
    setting = Store.spec_of(Path(base.out))
    random_init = (
        setting is not None and setting.settings.model_kind == "preset" and base.task != "image-classification"
    )
    return PlanResult(
        str(base.out),
        chosen,
        [ln for ln in lines if ln],
        reasons,
        found.to_dict(),
        None,
        None,
        commands,
        notes,
        ecosystem=eco.to_dict() if eco is not None else None,
        peak=peak,
        run_epochs=options.run_epochs,
        random_init=random_init,
    )


def _own(search: dict) -> str:
    """The study's own floor beside the search's, when the search judged by a wider one."""
    own = search.get("study_noise")
    return (
        f" (the study's ±{own:.1%}; the search assumes at least ±{DEFAULT_NOISE:.0%})"
        if own and own < search["noise"]
        else ""
    )


def _signed(x: float | None) -> str:
    return "?" if x is None else f"{x:+.2f}"


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x:.0%}"


MAX_CHECKS = 3  # candidates whose quality is checked, in turn, before the search says no plan keeps it
MORE_SEEDS = 4  # an inconclusive 2-seed verdict is decided over this many (Welch's t-test)


def _checked(ctx: Searched, result: PlanResult, render: Render) -> PlanResult:
    """The plan's quality against the baseline, over seeds; where it loses beyond --max-quality-drop, the next-fastest
    candidates in turn (MAX_CHECKS in all), and the user gets the fastest that keeps quality. An inconclusive
    verdict (2 seeds whose ranges overlap) is decided over MORE_SEEDS. A size preset's random weights train too
    little in a check to say anything of fine-tuning: its verdict is shown, never a reason to reject."""
    options, base, noise = ctx.options, ctx.base, ctx.found.noise
    measured = [
        m for m in measured_rows(ctx.rows, ctx.constraints, base.accum_steps, ctx.run_s) if m.feasible and m.names
    ]
    order = [result.plan] + [
        m.row
        for m in sorted(measured, key=lambda m: (m.rel_time or 1.0, len(m.names)))
        if m.row != result.plan and (m.rel_time or 1.0) < 1 - noise
    ]
    checks: list[dict] = []
    for row in order[:MAX_CHECKS]:
        assert row is not None
        q = _quality(options, base, row, render, max(2, options.seeds))
        if q and q.get("verdict") == INCONCLUSIVE and max(2, options.seeds) < MORE_SEEDS:
            render.note(f"trainwise plan: 2 seeds cannot decide {row}'s quality: {MORE_SEEDS} seeds")
            q = _quality(options, base, row, render, MORE_SEEDS)
        why = rejection(row, q, options.max_quality_drop, result.random_init)
        checks.append({"row": row, "quality": q, "passed": why is None, "why": why or ""})
        if why is None:
            new = result if row == result.plan else _result(ctx, row)
            new.quality, new.checked, new.singles_s = q, checks, result.singles_s
            if row != result.plan:
                new.notes.append(
                    f"{len(checks) - 1} faster candidate(s) lost quality in the check: {row} is the fastest that "
                    "keeps it"
                )
            return new
        render.note(f"trainwise plan: {why}")
    said = "; ".join(c["why"] for c in checks)
    result.quality, result.checked = (checks[0]["quality"] if checks else None), checks
    result.rejected = said
    result.notes.append(said)
    result.commands = []  # nothing to carry out: the export and train commands were a rejected row's
    result.lines = [
        dataclasses.replace(ln, label="fastest, not recommended") if ln.label == "plan" else ln for ln in result.lines
    ]
    result.plan = None
    return result


def rejection(row: str, q: dict | None, drop: float | None, random_init: bool = False) -> str | None:
    """Why a checked row is not recommended: its quality check found a loss the seeds say is real, beyond
    --max-quality-drop (or any, without one); None when it passes (a random-init preset's check never rejects)."""
    if not q or len(q.get("values") or []) < 2:  # no verdict at all: its longer run failed, or one seed finished
        return f"{row}'s quality check gave no verdict ({(q or {}).get('verdict') or 'no trial finished'})"
    lost = -q["delta"] if q.get("delta") is not None else None
    if random_init or lost is None or q.get("verdict") != "worse" or (drop is not None and lost <= drop):
        return None
    bound = f"more than --max-quality-drop {drop:g}" if drop is not None else "and no --max-quality-drop allows it"
    said = f"{row} lost {lost:.2f} {q.get('metric_name', '')} against the baseline over seeds, {bound}"
    if split_row(row)[1]:  # a row at its own batch: as many samples, fewer optimizer steps, the rate scaled
        said += f" (at batch {split_row(row)[1]}: as many samples in fewer steps, {q.get('lr_rule', 'its rate')})"
    return said


def judge_quality(result: PlanResult, drop: float | None) -> None:
    """A plan whose quality check found a loss the seeds say is real is not recommended (`result.plan` None, a note
    says why): beyond --max-quality-drop, or any loss without one; never for a random-init preset."""
    if result.plan is None:
        return
    said = rejection(result.plan, result.quality, drop, result.random_init)
    if said is None:
        return
    said += ": not recommended"
    result.notes.append(said)
    result.rejected = said
    result.commands = []
    result.lines = [
        dataclasses.replace(ln, label="fastest, not recommended") if ln.label == "plan" else ln for ln in result.lines
    ]
    result.plan = None


def _quality(options: PlanOptions, base: CompareOptions, row: str, render: Render, seeds: int) -> dict | None:
    """`row` against the baseline, trained longer over seeds (compare's quality phase on two rows). A row at a larger
    batch trains on as many samples, in fewer steps, at the rate a user would scale it to (quality.equal_samples)."""
    from trainwise.run.launcher import launch  # heavy: the trial machinery, only when a check runs
    from trainwise.search import verdicts as quality  # heavy: numpy (the statistics)
    from trainwise.study.prepare import prepare_study  # heavy: trainwise.study.prepare loads numpy (and torch)
    from trainwise.study.run import run_study  # heavy: trainwise.study.run loads numpy

    steps = options.quality_steps or 4 * (base.max_steps or 16)
    cfg, _price, _q = base.resolve()
    prepared = prepare_study(quality.quality_config(cfg, ["baseline", row], steps, seeds))
    rules = quality.equal_samples(prepared)  # a plan at its own batch size: as many samples as the baseline
    own = next((t for t in prepared.specs if t.row == row), None)
    if own and own.settings.batch_size != cfg.batch_size:
        render.note(
            f"trainwise plan: {row} trains {own.steps} steps: the baseline's {steps} x {cfg.batch_size} samples, "
            f"{rules.get(row, 'at the study rate')}"
        )
    render.note(f"trainwise plan: quality check: {row} against the baseline, {steps} steps x {seeds} seeds")
    with render.progress(prepared) as (on_event, on_done):
        trials = run_study(prepared, launch, on_event, on_done)
    s = prepared.specs[0].settings
    found = quality.verdicts(trials, s.model_kind == "preset" and s.task != "image-classification")
    mine = next((q for q in found if q.strategy == row), None)
    if mine is None:
        return None
    return {**mine.to_dict(), "lr_rule": rules.get(row, "")}


def headline(r: PlanResult) -> list[str]:
    """plan.md's opening lines: the plan against the baseline and the ecosystem's default (time, memory, quality),
    its throughput and MFU beside the measured peak, and the search's cost where it exceeds an epoch of the plan."""
    lines = {ln.label: ln for ln in r.lines}
    plan = lines.get("plan")
    if plan is None or not plan.rel_time:
        return []
    out = [
        f"{1 / plan.rel_time:.2f}x the baseline's speed ({_pct(plan.rel_time)} of its time per sample), "
        f"{_pct(plan.rel_mem)} of its memory"
    ]
    eco = lines.get("ecosystem default")
    if eco is not None and eco.rel_time and r.ecosystem:
        faster = eco.rel_time / plan.rel_time
        mem = (
            f", {plan.peak_mem_bytes / eco.peak_mem_bytes:.0%} of its memory"
            if eco.peak_mem_bytes and plan.peak_mem_bytes
            else ""
        )
        out.append(
            f"{faster:.2f}x the speed of what you get without trainwise, {r.ecosystem['source']} "
            f"(`{eco.row}`, measured in this study){mem}"
        )
    q = r.quality
    if q and r.random_init:
        out.append(
            f"quality: {q['metric_name']} {q['mean']:.2f} vs the baseline's {q['mean'] - (q['delta'] or 0):.2f} over "
            f"{len(q['values'])} seeds x {q['steps']} steps ({q['verdict']}); random weights (a size preset): so short "
            "a run says little of fine-tuning, so the plan is recommended on time and memory"
        )
    elif q:
        out.append(
            f"quality: {q['metric_name']} {q['mean']:.2f} (delta {_signed(q['delta'])} vs the baseline) over "
            f"{len(q['values'])} seeds x {q['steps']} steps: {q['verdict']}"
        )
        base_mean = q["mean"] - (q["delta"] or 0.0)
        if (said := unlearned([q["mean"], base_mean], q.get("majority"))) is not None:
            out.append(f"but {said}")
    if plan.tokens_per_s:
        out.append(f"{plan.tokens_per_s:,.0f} non-pad tokens/s, {plan.samples_per_s or 0:,.1f} samples/s")
    if plan.flops_per_s and r.peak and r.peak.get("flops_per_s"):
        top = r.peak["flops_per_s"]
        out.append(
            f"{plan.flops_per_s / 1e12:.3g} TFLOP/s (counted FLOPs): {plan.flops_per_s / top:.1%} of the device's "
            f"best measured matmul peak here, {top / 1e12:.3g} TFLOP/s ({r.peak.get('mode')}, measured by "
            f"{r.peak.get('row')})"
        )
    if r.confirmed and r.confirmed.get("times"):
        c = r.confirmed
        out.append(
            f"measured again over {c['steps']} steps (the study's floor was too wide to choose; this one's "
            f"±{c['noise']:.1%}): " + ", ".join(f"{row} {_pct(t)}" for row, t in c["times"].items())
        )
    share = r.search_share_of_epoch
    if share is not None and share > 1:
        out.append(
            f"the search cost more than a projected epoch of the plan ({share:.0%}): it pays for a run of at least "
            f"{share:.0f} epochs of this data"
        )
    return out


def markdown(r: PlanResult) -> str:
    """OUT/plan.md: the plan, its reasons, the candidates and the search's cost."""
    out = [
        f"# trainwise plan: {r.study}",
        "",
        f"**Plan: `{r.plan}`**"
        if r.plan
        else f"**No plan recommended: {r.rejected}**"
        if r.rejected
        else ("**No plan beat the baseline.**"),
        "",
    ]
    if r.headline:
        out += [*(f"- {h}" for h in r.headline), ""]
    out += [
        "| | row | time % | mem % | samples/s | tokens/s | peak mem | epoch (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for ln in r.lines:
        tokens = f"{ln.tokens_per_s:,.0f}" if ln.tokens_per_s else "-"
        out.append(
            f"| {ln.label} | `{ln.row}` | {_pct(ln.rel_time)} | {_pct(ln.rel_mem)} | "
            f"{ln.samples_per_s or 0:.1f} | {tokens} | {human_bytes(ln.peak_mem_bytes or 0)} | "
            f"{ln.epoch_time_s or 0:.1f} |"
        )
    if r.ecosystem:
        e = r.ecosystem
        fields_ = "; ".join(f"{k} ({v})" for k, v in e["fields"].items())
        out += ["", f"The ecosystem default is {e['source']} read from the installed library: {fields_}."]
    if r.checked:
        out += ["", "## Quality", ""]
        for c in r.checked:
            q = c["quality"] or {}
            if q:
                rule = f", {q['lr_rule']}" if q.get("lr_rule") else ""
                out.append(
                    f"- `{c['row']}`: {q['metric_name']} {q['mean']:.2f} (delta {_signed(q['delta'])} vs the "
                    f"baseline) over {len(q['values'])} seeds x {q['steps']} steps{rule}: {q['verdict']}"
                    + ("" if c["passed"] else f": rejected ({c['why']})")
                )
            else:
                out.append(f"- `{c['row']}`: no verdict (its check finished no trial)")
        if r.random_init:
            out.append(
                "- random weights (a size preset): a check this short says little of fine-tuning; its verdict is "
                "shown, never a reason to reject"
            )
    elif r.quality:
        q = r.quality
        out += [
            "",
            f"Quality over {len(q['values'])} seeds x {q['steps']} steps: {q['metric_name']} {q['mean']:.2f} "
            f"(delta {_signed(q['delta'])} vs the baseline): {q['verdict']}",
        ]
    unmeasured = [x["strategy"] for x in r.strategies if x["reason"] == UNMEASURED]
    out += ["", "## Strategies", ""]
    out += [f"- `{x['strategy']}`: {x['reason']}" for x in r.strategies if x["reason"] != UNMEASURED]
    if unmeasured:
        out.append(f"- not among the study's rows, so not searched: {', '.join(unmeasured)}")
    s = r.search
    out += [
        "",
        "## Candidates",
        "",
        "Every candidate the search proposed, in the order proposed; `miss` is measured / predicted time (above 1: "
        "the prediction was optimistic).",
        "",
        "| round | trial | row | why | predicted time % | measured time % | miss | state |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in s["candidates"]:
        meas = _pct(c["measured_time"]) if c["measured_time"] is not None else "-"
        miss = f"{c['miss']:.2f}" if c.get("miss") is not None else "-"
        note = f" ({c['note']})" if c["note"] else ""
        out.append(
            f"| {c['round']} | {c.get('trial') or '-'} | `{c['row']}` | {c['reason']} | {_pct(c['predicted_time'])} | "
            f"{meas} | {miss} | {c['state']}{note} |"
        )
    skipped = sum(c["state"] == "skipped" for c in s["candidates"])
    misses = sorted(c["miss"] for c in s["candidates"] if c.get("miss") is not None)
    predicted = (
        f"predictions missed by {misses[len(misses) // 2]:.2f}x at the median (from {misses[0]:.2f}x to "
        f"{misses[-1]:.2f}x over {len(misses)} measured); "
        if misses
        else ""
    )
    share = f", {r.search_share_of_epoch:.1%} of one projected epoch of the plan" if r.search_share_of_epoch else ""
    out += [
        "",
        f"Time: the single rows {r.singles_s:.0f} s, the search {s['trials']} trial(s) in {s['rounds']} round(s), "
        f"{s['wall_s']:.0f} s{share}, the quality check {r.quality_s:.0f} s; "
        f"{skipped} predicted candidate(s) never measured (listed above); {predicted}"
        f"noise floor ±{s['noise']:.1%}{_own(s)}; stopped: {s['stopped']}.",
    ]
    if r.commands:
        out += ["", "## Carry it out", "", "```sh", *r.commands, "```"]
    if r.notes:
        out += ["", *[f"- {n}" for n in r.notes]]
    return "\n".join(out) + "\n"
