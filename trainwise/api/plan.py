"""`trainwise plan` as a call: the single rows (a study given with --study, or compare's rows run first), then
the search over their combinations (`trainwise.plan`, the policy), each round's candidates run as rows of the
same study (same baseline, noise floor and store: a killed search resumes, a fault is a row), the winner's
quality checked against the baseline over seeds, and the plan with its reasons written to OUT/plan.json and
OUT/plan.md.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainwise import strategies
from trainwise.advise import Constraints, advise, one_kind
from trainwise.api import compare as compare_api
from trainwise.api.options import CompareOptions, PlanOptions, words
from trainwise.api.render import STDERR, Render
from trainwise.errors import ConfigError
from trainwise.files import human_bytes, write_atomic
from trainwise.plan import DEFAULT_NOISE, Candidate, Measured, Search, row_text, search, split_row
from trainwise.results import StudyRow
from trainwise.study.store import PAGE, PLAN, PLAN_MD, Store, write_report
from trainwise.units import parse_seconds

UNMEASURED = "out: not measured (not among the study's rows)"


@dataclass
class Line:
    """A row of the plan's summary: its time and memory relative to the baseline, as measured."""

    label: str  # plan | best single row | all | baseline
    row: str
    rel_time: float | None
    rel_mem: float | None
    samples_per_s: float | None
    peak_mem_bytes: float | None
    epoch_time_s: float | None


@dataclass
class PlanResult:
    """What `trainwise plan` found (OUT/plan.json): the plan, the rows it is measured against, every strategy
    in or out with its reason, the search's candidates and cost, the quality check, and the commands."""

    study: str
    plan: str | None  # the recommended row (None: nothing beat the baseline within the constraints)
    lines: list[Line]
    strategies: list[dict]  # {"strategy", "in": bool, "reason"}
    search: dict  # trainwise.plan.Search.to_dict()
    quality: dict | None  # the check of the plan against the baseline (None: not run)
    search_share_of_epoch: float | None  # the search's wall time / one projected epoch of the plan
    commands: list[str]
    notes: list[str] = field(default_factory=list)
    singles_s: float = 0.0  # wall time of the single rows (run, or read back from the store)
    quality_s: float = 0.0  # wall time of the quality check
    rejected: str | None = None  # why the fastest row is not the plan: its quality check found a real loss

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
    base = options.compare_options()
    cfg0, _price, _phase = base.resolve()
    if cfg0.batch_sizes or len(cfg0.num_workers) > 1:
        raise ConfigError(
            "plan searches at one batch size and worker count: leave out --batch-sizes and a --num-workers list"
        )
    only, never = _names(options.only, "--only"), _names(options.never, "--never")
    out = Path(base.out)

    compare_api.start(base, render)  # the single rows: run, or resumed from the store
    singles_s = time.monotonic() - began
    rows = study_rows(out)
    task, accum = cfg0.task, cfg0.accum_steps
    from trainwise.study.prepare import resolve_device  # heavy: trainwise.study.prepare loads numpy (and torch)

    caps = resolve_device(cfg0.device)[1]
    order = list(strategies.REGISTRY)
    next_batch = doubling(out, cfg0.batch_size, options.batch_search)
    valid = validity(task, accum, caps, only, never)

    # what the search starts from: the single rows and `all`, and the combinations an earlier run of this search
    # measured (a resumed search); other combinations in the study are measured again as the search reaches
    # them (read back from the store), so a search's path does not depend on rows it did not choose
    present = {r.row_text for r in rows}
    earlier = [c for c in _searched_before(out) if c.row in present]
    own = {c.row for c in earlier}
    singles = [
        m
        for m in measured_rows(rows, constraints, accum)
        if (len(m.names) <= 1 or m.row in own | {"all"}) and (options.batch_search or m.batch is None)
    ]
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
        compare_api.start(dataclasses.replace(base, strategies=current), render)
        got = {m.row: m for m in measured_rows(study_rows(out), constraints, accum)}
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
    )
    rows = study_rows(out)
    result = _result(options, base, rows, found, constraints, valid, only, never)
    result.singles_s = singles_s
    checked = time.monotonic()
    if options.quality_check and result.plan and result.plan != "baseline":
        result.quality = _quality(options, base, result.plan, render)
        judge_quality(result, options.max_quality_drop)
    result.quality_s = time.monotonic() - checked
    result.search = found.to_dict()
    plan_line = next((ln for ln in result.lines if ln.label == "plan"), None)
    if plan_line and plan_line.epoch_time_s:
        result.search_share_of_epoch = found.wall_s / plan_line.epoch_time_s
    write_atomic(out / PLAN, json.dumps(result.to_dict(), indent=1))
    write_atomic(out / PLAN_MD, markdown(result))
    from trainwise.api.report import render as draw  # heavy: the page's figures (matplotlib)

    try:  # the study's page again, with the search's figure
        write_report(out, out / PAGE, draw(out, "html"))
    except ConfigError as e:  # another command took the study meanwhile: the plan stands, its page waits
        render.note(f"trainwise plan: report.html not drawn again ({e}); `trainwise report {out}` draws it")
    return result


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
    from trainwise.api.studies import estimate_basis, price

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


def study_rows(out: Path) -> list[StudyRow]:
    """The study's rows the search reads: on a cluster of several device kinds, those of one kind (advise's)."""
    from trainwise.study.store import read_results  # heavy: trainwise.study.store

    return one_kind(read_results(out))[0]


def measured_rows(rows: list[StudyRow], constraints: Constraints, accum: int) -> list[Measured]:
    """The study's rows as the search reads them, with advise's feasibility under the constraints."""
    ranked = {v.strategy: v for v in advise(rows, constraints).verdicts}
    base = next((r for r in rows if r.baseline and r.status == "ok" and r.step_time_s), None)
    found = []
    for r in rows:
        text = r.row_text
        row = strategies.parse_row(text, accum)
        names = frozenset() if r.baseline else frozenset(s.name for s, _ in row.parts)
        v = ranked.get(r.strategy)
        why = None if v is None or v.feasible or r.status != "ok" else v.reason
        rel = r.rel_time if r.status == "ok" else None
        found.append(
            Measured(text, names, rel, r.rel_mem, r.peak_mem_bytes, r.status, why, phases(r, base), row.batch_size)
        )
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
    return Line(label, r.row_text, r.rel_time, r.rel_mem, r.samples_per_s, r.peak_mem_bytes, r.epoch_time_s)


def _result(
    options: PlanOptions,
    base: CompareOptions,
    rows: list[StudyRow],
    found: Search,
    constraints: Constraints,
    valid,
    only: frozenset[str],
    never: frozenset[str],
) -> PlanResult:
    by_row = {r.row_text: r for r in rows}
    measured = {m.row: m for m in measured_rows(rows, constraints, base.accum_steps)}
    chosen = found.incumbent
    singles = [m for m in measured.values() if len(m.names) == 1 and m.feasible and m.batch is None]
    best_single = min(singles, key=lambda m: m.rel_time or 1.0, default=None)
    lines = [
        _line("plan", by_row.get(chosen or "")),
        _line("best single row", by_row.get(best_single.row) if best_single else None),
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
            reasons.append(
                {
                    "strategy": name,
                    "in": True,
                    "reason": f"in: alone {_pct(alone.rel_time)} time, {_pct(alone.rel_mem)} memory"
                    if alone and alone.ok
                    else "in",
                }
            )
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
    if plan_row and plan_batch:
        at_study = measured.get(row_text(plan_names, list(strategies.REGISTRY)))
        was = f"{_pct(at_study.rel_time)} at {base.batch_size}, " if at_study and at_study.ok else ""
        notes.append(
            f"batch size {plan_batch}, not the study's {base.batch_size}: {was}{_pct(plan_row.rel_time)} of "
            "the baseline's time per sample at it; its quality check trains on as many samples as the baseline's"
        )
    if chosen == "baseline" or chosen is None:
        notes.append("no strategy or combination beat the baseline beyond the noise floor within the constraints")
    return PlanResult(
        str(base.out), chosen, [ln for ln in lines if ln], reasons, found.to_dict(), None, None, commands, notes
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


def _quality(options: PlanOptions, base: CompareOptions, row: str, render: Render) -> dict | None:
    """The plan against the baseline, trained longer over seeds (compare's quality phase on two rows)."""
    from trainwise import quality  # heavy: numpy (the statistics)
    from trainwise.launcher import launch  # heavy: the trial machinery, only when a check runs
    from trainwise.study.prepare import prepare_study  # heavy: trainwise.study.prepare loads numpy (and torch)
    from trainwise.study.run import run_study  # heavy: trainwise.study.run loads numpy

    steps = options.quality_steps or 4 * (base.max_steps or 16)
    seeds = max(2, options.seeds)
    cfg, _price, _q = base.resolve()
    prepared = prepare_study(quality.quality_config(cfg, ["baseline", row], steps, seeds))
    quality.equal_samples(prepared)  # a plan at its own batch size: as many samples as the baseline
    own = next((t for t in prepared.specs if t.row == row), None)
    if own and own.settings.batch_size != cfg.batch_size:
        render.note(
            f"trainwise plan: {row} trains {own.steps} steps: the baseline's {steps} x {cfg.batch_size} samples"
        )
    render.note(f"trainwise plan: quality check: {row} against the baseline, {steps} steps x {seeds} seeds")
    with render.progress(prepared) as (on_event, on_done):
        trials = run_study(prepared, launch, on_event, on_done)
    s = prepared.specs[0].settings
    found = quality.verdicts(trials, s.model_kind == "preset" and s.task != "image-classification")
    mine = next((q for q in found if q.strategy == row), None)
    return mine.to_dict() if mine else None


def judge_quality(result: PlanResult, drop: float | None) -> None:
    """A plan whose quality check found a loss the seeds say is real is not recommended (`result.plan` None, a note
    says why): beyond --max-quality-drop, or any loss without one."""
    q = result.quality or {}
    lost = -q["delta"] if q.get("delta") is not None else None
    if result.plan is None or lost is None or q.get("verdict") != "worse" or (drop is not None and lost <= drop):
        return
    bound = f"more than --max-quality-drop {drop:g}" if drop is not None else "and no --max-quality-drop allows it"
    said = f"{result.plan} lost {lost:.2f} {q.get('metric_name', '')} against the baseline over seeds, {bound}: "
    said += "not recommended"
    if split_row(result.plan)[1]:  # a plan at its own batch: as many samples, fewer optimizer steps
        said += f" (at batch {split_row(result.plan)[1]} it took fewer optimizer steps on as many samples: raise --lr, "
        said += "or pass --no-batch-search)"
    result.notes.append(said)
    result.rejected = said
    result.commands = []  # nothing to carry out: the export and train commands were the rejected row's
    result.lines = [
        dataclasses.replace(ln, label="fastest, not recommended") if ln.label == "plan" else ln for ln in result.lines
    ]
    result.plan = None


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
    out += ["| | row | time % | mem % | samples/s | peak mem | epoch (s) |", "|---|---|---|---|---|---|---|"]
    for ln in r.lines:
        out.append(
            f"| {ln.label} | `{ln.row}` | {_pct(ln.rel_time)} | {_pct(ln.rel_mem)} | "
            f"{ln.samples_per_s or 0:.1f} | {human_bytes(ln.peak_mem_bytes or 0)} | {ln.epoch_time_s or 0:.1f} |"
        )
    if r.quality:
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
        "| round | row | why | predicted time % | measured time % | state |",
        "|---|---|---|---|---|---|",
    ]
    for c in s["candidates"]:
        if c["state"] in ("measured", "failed", "pruned") or c["round"] > 1 or c["reason"].startswith("screen:"):
            meas = _pct(c["measured_time"]) if c["measured_time"] is not None else "-"
            note = f" ({c['note']})" if c["note"] else ""
            out.append(
                f"| {c['round']} | `{c['row']}` | {c['reason']} | {_pct(c['predicted_time'])} | {meas} | "
                f"{c['state']}{note} |"
            )
    skipped = sum(c["state"] == "skipped" for c in s["candidates"])
    share = f", {r.search_share_of_epoch:.1%} of one projected epoch of the plan" if r.search_share_of_epoch else ""
    out += [
        "",
        f"Time: the single rows {r.singles_s:.0f} s, the search {s['trials']} trial(s) in {s['rounds']} round(s), "
        f"{s['wall_s']:.0f} s{share}, the quality check {r.quality_s:.0f} s; "
        f"{skipped} predicted candidate(s) never measured; noise floor ±{s['noise']:.1%}{_own(s)}; "
        f"stopped: {s['stopped']}.",
    ]
    if r.commands:
        out += ["", "## Carry it out", "", "```sh", *r.commands, "```"]
    if r.notes:
        out += ["", *[f"- {n}" for n in r.notes]]
    return "\n".join(out) + "\n"
