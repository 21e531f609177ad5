"""What `trainwise plan` answers (OUT/plan.json, `trainwise.plan(...)`): the plan, the rows it is measured against,
each strategy in or out with its measured reason, the search's record, the quality checks and the commands that carry
the plan out. Built from the study's rows and the search; rendered by `trainwise.report.plan`."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainwise import strategies
from trainwise.core.files import human_bytes
from trainwise.core.results import StudyRow
from trainwise.core.units import human_seconds
from trainwise.search.acquisition import Search
from trainwise.search.plan_inputs import base, check_seconds, row_text, split_row

UNMEASURED = "out: not measured (not among the study's rows)"


@dataclass
class Line:
    """A row of the plan's summary: its time and memory relative to the baseline, as measured in the study."""

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
    """What `trainwise plan` found (OUT/plan.json)."""

    study: str
    plan: str | None  # the recommended row (None: nothing recommended; `rejected` says why)
    lines: list[Line]
    strategies: list[dict]  # {"strategy", "in": bool, "reason"}
    search: dict  # trainwise.search.acquisition.Search.to_dict()
    quality: dict | None = None  # the plan's check against the baseline (None: not run)
    search_share_of_epoch: float | None = None  # the search's wall time / one projected epoch of the plan
    commands: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    singles_s: float = 0.0  # wall time of the single rows (run, or read back from the store)
    quality_s: float = 0.0  # wall time of the quality checks
    rejected: str | None = None  # why no row is recommended
    # the configuration the user gets without trainwise, measured as a row of the study (None: --no-ecosystem-default)
    ecosystem: dict | None = None
    # the plan against it by the search's model: {row, ratio (its time over the plan's), low, high, faster}
    versus_default: dict | None = None
    checked: list[dict] = field(default_factory=list)  # each quality check, in order: {row, check, passed, why}
    peak: dict | None = None  # the best matmul peak measured in the study: {flops_per_s, mode, row}
    run_epochs: float = 1.0  # the planned run a one-time cost is charged against
    random_init: bool = False  # a size preset's random weights
    headline: list[str] = field(default_factory=list)  # plan.md's opening lines
    # plan --from-config: the user's file, its row, the file written back and its changes, the plan against it
    yours: dict | None = None
    # `trainwise.plan(trainer=...)`: the plan as the caller's objects (not in plan.json)
    args: Any = field(default=None, repr=False, compare=False)  # a new TrainingArguments / SFTConfig of their class
    data_collator: Any = field(default=None, repr=False, compare=False)  # the collator the plan needs

    def to_dict(self) -> dict:
        out = asdict(dataclasses.replace(self, args=None, data_collator=None))
        del out["args"], out["data_collator"]
        return out


def line(label: str, r: StudyRow | None) -> Line | None:
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


def pct(x: float | None) -> str:
    return "?" if x is None else f"{x:.0%}"


@dataclass(frozen=True)
class Context:
    """What a plan is read from once its search ended."""

    out: Path
    rows: list[StudyRow]
    found: Search
    study_batch: int
    valid: Callable[[frozenset[str]], str | None]
    only: frozenset[str] = frozenset()
    never: frozenset[str] = frozenset()
    memory_budget: int | None = None
    eco_row: str | None = None
    eco: dict | None = None
    eco_notes: tuple[str, ...] = ()
    run_s: float | None = None
    run_epochs: float = 1.0
    random_init: bool = False
    yours_row: str | None = None  # the user's own config as a row (plan --from-config)


def summarize(ctx: Context, chosen: str | None) -> PlanResult:
    """The plan's result for the row `chosen`: its lines, every strategy's reason, notes and commands."""
    by_row = {r.row_text: r for r in ctx.rows}
    found = ctx.found
    singles = [
        r
        for r in ctx.rows
        if r.status == "ok" and not r.baseline and "+" not in r.row_text and "@" not in r.row_text and r.row != "all"
    ]
    best_single = min(singles, key=lambda r: r.rel_time or 1.0, default=None)
    lines = [
        line("plan", by_row.get(chosen or "")),
        line("fastest measured", by_row.get(found.fastest or "")) if found.fastest not in (chosen, None) else None,
        line("best single row", best_single),
        line("yours", by_row.get(ctx.yours_row or "")) if ctx.yours_row else None,
        line("ecosystem default", by_row.get(ctx.eco_row or "")) if ctx.eco_row else None,
        line("all", by_row.get("all")),
        line("baseline", next((r for r in ctx.rows if r.baseline), None)),
    ]
    reasons = _reasons(ctx, chosen)
    commands = []
    if chosen and chosen != "baseline":
        q, study = shlex.quote, shlex.quote(str(ctx.out.resolve()))
        commands = [
            f"trainwise export --study {study} --strategies {q(chosen)} --out runs/export",
            f"trainwise train --plan {study} --strategies {q(chosen)} --out runs/train",
        ]
    notes = [f"search stopped: {found.stopped}"]
    if found.fastest and chosen and found.fastest != chosen:
        t = found.times
        notes.append(
            f"the plan is the simplest row not significantly slower than the fastest, {found.fastest} "
            f"({pct(t.get(found.fastest, [None])[0])} against {pct(t.get(chosen, [None])[0])}, posterior medians): "
            "a strategy is in only where it pays beyond the noise"
        )
    names, batch = split_row(chosen or "")
    if chosen and batch and batch != ctx.study_batch:
        at_study = by_row.get(row_text(names))
        was = f"{pct(at_study.rel_time)} at {ctx.study_batch}, " if at_study and at_study.status == "ok" else ""
        plan_row = by_row.get(chosen)
        notes.append(
            f"batch size {batch}, not the study's {ctx.study_batch}: {was}"
            f"{pct(plan_row.rel_time if plan_row else None)} of the baseline's time per sample at it"
        )
    compiled = by_row.get(chosen or "")
    if compiled is not None and compiled.compile_s and ctx.run_s:
        notes.append(
            f"compile: {compiled.compile_s:.0f} s once, charged against a planned run of {ctx.run_epochs:g} "
            f"epoch(s) ({ctx.run_s:.0f} s at the baseline's pace; --run-epochs says how long yours is)"
        )
    if chosen in ("baseline", None):
        notes.append("no strategy or combination beat the baseline beyond the noise within the constraints")
    if ctx.eco is not None:
        notes += [f"ecosystem default ({ctx.eco['source']}): {n}" for n in ctx.eco_notes]
    peaks = [r for r in ctx.rows if r.status == "ok" and r.peak_flops_per_s]
    top = max(peaks, key=lambda r: r.peak_flops_per_s or 0.0, default=None)
    peak = {"flops_per_s": top.peak_flops_per_s, "mode": top.peak_mode, "row": top.row_text} if top else None
    return PlanResult(
        str(ctx.out),
        chosen,
        [ln for ln in lines if ln],
        reasons,
        found.to_dict(),
        commands=commands,
        notes=notes,
        ecosystem=ctx.eco,
        peak=peak,
        run_epochs=ctx.run_epochs,
        random_init=ctx.random_init,
    )


def _reasons(ctx: Context, chosen: str | None) -> list[dict]:
    """For every strategy, in or out of the plan, and the measured reason."""
    by_row = {r.row_text: r for r in ctx.rows}
    times = ctx.found.times
    plan_names, plan_batch = split_row(chosen or "")
    bare = {base(n): n for n in plan_names}  # (freeze_layers=4 is freeze_layers in the plan)
    at = plan_batch if plan_batch and plan_batch != ctx.study_batch else None
    plan_time = times[chosen][0] if chosen in times else None
    out = []
    for name in strategies.REGISTRY:
        if name == "baseline":
            continue
        alone = by_row.get(name)
        if name in bare:
            name = bare[name]
            said = (
                f"in: alone {pct(alone.rel_time)} time, {pct(alone.rel_mem)} memory"
                if alone and alone.rel_time
                else "in"
            )
            without = row_text(plan_names - {name}, at)
            if without in times and plan_time:
                said += f"; the plan without it: {pct(times[without][0])} (posterior median)"
            out.append({"strategy": name, "in": True, "reason": said})
            continue
        if alone is None:
            why = "--never" if name in ctx.never else "not in --only" if ctx.only and name not in ctx.only else None
        elif alone.status != "ok":
            why = f"{alone.status} on this device"
        elif name in ctx.never:
            why = "--never"
        elif ctx.only and name not in ctx.only:
            why = "not in --only"
        elif plan_names and ctx.valid(plan_names | {name}) is not None:
            why = f"{pct(alone.rel_time)} time alone, but the registry forbids it with the plan"
        else:
            with_it = row_text(plan_names | {name}, at)
            mem = (
                "memory does not bind"
                if ctx.memory_budget is None
                else f"memory does not bind under {human_bytes(ctx.memory_budget)}"
            )
            if with_it in times:
                why = f"the plan with it: {pct(times[with_it][0])} (posterior median), no faster beyond the noise"
            elif (alone.rel_time or 1) > 1:
                why = f"{pct(alone.rel_time)} time alone: slower than the baseline, and {mem}"
            else:
                why = f"{pct(alone.rel_time)} time alone, but no combination with it was predicted to beat the plan"
        out.append({"strategy": name, "in": False, "reason": f"out: {why}" if why else UNMEASURED})
    return out


def check_note(ctx: Context, row: str, steps: int, seeds: int, trials: list[tuple[str, int]], study_steps: int) -> str:
    """The quality check about to run (`trials`: each a row and its steps), with what it will cost, and whether that
    is more than the planned run it protects."""
    line = f"trainwise plan: quality check: {row} against the baseline, {steps} steps x {seeds} paired seeds"
    cost = check_seconds(ctx.rows, trials, study_steps)
    if cost is None:
        return line
    run = ctx.run_s * ctx.found.times[row][0] if ctx.run_s and row in ctx.found.times else None
    more = (
        f": more than the planned run it protects ({human_seconds(run)} at the plan's pace, --run-epochs "
        f"{ctx.run_epochs:g}); --no-quality-check plans on speed alone"
        if run and cost > run
        else ""
    )
    return f"{line}, about {human_seconds(cost)}{more}"
