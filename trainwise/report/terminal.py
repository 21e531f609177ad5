"""What the verbs print on a terminal: progress while a study runs, and each verb's table (rich)."""

from __future__ import annotations

import contextlib
import json
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from trainwise import strategies as catalogue
from trainwise.core.quality import unlearned
from trainwise.core.units import human_seconds
from trainwise.report.format import (
    RANDOM_INIT_NOTE,
    batch_cells,
    batch_legend,
    headers,
    human_bytes,
    notes,
    table_cells,
)
from trainwise.report.progress import TrainLine
from trainwise.run.events import Eval, Event, Note, Phase, Projection, Step

# Piped or in CI, rich would wrap the table at 80 columns; give it room instead.
out = Console() if sys.stdout.isatty() else Console(width=240)  # pipes and files: the whole table
err = Console(stderr=True)


def say(line: str, console: Console | None = None) -> None:
    """One plain line (no markup, no highlighting: paths and brackets print as they are)."""
    (console or out).print(line, markup=False, highlight=False, soft_wrap=True)  # one line, however long


def indented(line: str) -> None:
    say(f"  {line}", err)


def _grid(title: str, columns: list[str]) -> Table:
    grid = Table(title=title, header_style="bold")
    for h in columns:
        grid.add_column(h, overflow="fold", no_wrap=h == "strategy")
    return grid


# ---- compare ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def study_progress(prepared: Any) -> Iterator[tuple[Callable, Callable]]:
    """A bar for the study and one for the running trial; yields (on_event, on_done) for run_study."""
    s = prepared.specs[0].settings
    sizes = sorted({c.batch_size for c in prepared.cells})
    say(
        f"model {s.model_label} ({s.model_kind})  device {s.device}  train rows {s.n_train}  "
        f"batch {','.join(map(str, sizes))}  steps {prepared.specs[0].steps} ({s.warmup_steps} untimed)"
        + (f"  ranks {s.nproc}" if s.nproc > 1 else "")
        + f"  trials {len(prepared.specs)}  out {prepared.out}",
        err,
    )
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[left]}"),  # the study's: projected from its first timed steps
    )
    with Progress(*columns, console=err) as progress:
        study_bar = progress.add_task("study", total=len(prepared.specs), left="")
        trial_bar = progress.add_task("", total=prepared.specs[0].steps, visible=False, left="")

        def name(spec: Any) -> str:
            kind = spec.extra.get("device_kind")  # a cluster's baseline, once per kind of device
            return f"{prepared.cell_of(spec).label()}{f' [{kind}]' if kind else ''} #{spec.repeat + 1}"

        def on_event(spec: Any, e: Event) -> None:
            if isinstance(e, Phase) and e.phase == "data":  # a new trial: fresh bar and clock
                progress.reset(trial_bar, description=f"{name(spec)}: data", visible=True)
            elif isinstance(e, Phase):
                progress.update(trial_bar, description=f"{name(spec)}: {e.phase}")
            elif isinstance(e, Step):
                text = f"{name(spec)}: loss {e.loss:.3f}, {e.step_s or 0.0:.2f} s/step"
                progress.update(trial_bar, completed=e.step, description=text)
            elif isinstance(e, Note):  # the study's own word (a re-run under load), not the trial's
                say(f"  {name(spec)}: {e.text}", progress.console)
            elif isinstance(e, Projection):  # the study's time: once as a note, then as time left
                if e.text:
                    say(e.text, progress.console)
                progress.update(study_bar, left=f"~{human_seconds(e.remaining_s)} left")

        def on_done(spec: Any, r: Any, cached: bool) -> None:
            progress.update(trial_bar, visible=False)
            bar = progress.tasks[study_bar]
            if bar.total is not None and bar.completed >= bar.total:  # a cluster's baseline on one more kind
                progress.update(study_bar, total=bar.completed + 1)
            progress.advance(study_bar)
            what = f"{r.step_time_s:.3f} s/step, {r.samples_per_s:.1f} samples/s" if r.status == "ok" else r.message
            say(f"  {'(stored) ' if cached else ''}{name(spec)}: {r.status}  {what}", progress.console)

        yield on_event, on_done


_train_line = TrainLine()
_live = False  # a progress line is on the terminal, not ended yet


def end_live() -> None:
    """End train's live progress line, if one is on the terminal: what is said next starts a line of its own."""
    global _live
    if _live:
        err.file.write("\n")
        err.file.flush()
        _live = False


def train_event(event: Event) -> None:
    """train's progress: on a terminal one live line (step i/N, loss, samples/s, time left), redrawn at every
    step; piped, that line every 10th step and at the last; every evaluation and note on a line of its own."""
    global _live
    if isinstance(event, Step):
        line = _train_line.line(event)
        if err.is_terminal:
            err.file.write("\r\x1b[2K  " + line)
            err.file.flush()
            _live = event.step < event.total
            if not _live:
                err.file.write("\n")
        elif event.step % 10 == 0 or event.step == event.total:
            say(f"  {line}", err)
    elif isinstance(event, Eval):
        end_live()
        shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in event.record.items()}
        say(f"  eval {shown}", err)
    elif isinstance(event, Note):
        end_live()
        say(f"trainwise train: {event.text}", err)


def compare_table(report: Any, console: Console | None = None) -> None:
    console = console or out
    grid = _grid(report.title, headers(report.table))
    for e, row in zip(report.table, table_cells(report.table), strict=True):
        grid.add_row(*row, style=None if e.status == "ok" else "red")
    console.print(grid)
    for line in notes(report.table):
        say(f"  {line}", console)
    say("  files: " + ", ".join(str(p) for p in report.paths), console)


# ---- advise, estimate, find-batch, tune ---------------------------------------------------------------------


def advise_table(advice: Any, study: str, objective: str) -> None:
    grid = _grid(f"trainwise advise: {study} (objective: {objective})", ["rank", "strategy", "verdict"])
    priced = any(v.cost_per_epoch is not None for v in advice.verdicts)
    for h in ("time", "memory", "quality", *(["$/epoch"] if priced else []), "why"):
        grid.add_column(h, overflow="fold")
    for i, v in enumerate(advice.verdicts, 1):
        verdict = "pareto" if v.pareto else "feasible" if v.feasible else "excluded" if v.status == "ok" else v.status
        cost = ["-" if v.cost_per_epoch is None else f"{v.cost_per_epoch:.4g}"] if priced else []
        grid.add_row(
            str(i),
            v.strategy,
            verdict,
            "-" if v.rel_time is None else f"{100 * v.rel_time:.0f}%",
            "-" if v.rel_mem is None else f"{100 * v.rel_mem:.0f}%",
            v.quality,  # a speed trial's quality is never shown as a gain or a loss (advise.quality_shown)
            *cost,
            v.reason,
            style=None if v.feasible else "dim",
        )
    out.print(grid)
    for line in advice.notes:
        say(f"  note: {line}")
    ref = f" (time and memory relative to {advice.reference})" if advice.reference else ""
    say(f"  recommended: {advice.recommended or 'nothing meets the constraints'}{ref}")


def estimate_table(report: Any) -> None:
    heads = ["plan", "micro x accum", "weights", "grads", "optimizer", "activations", "step temps", "peak", "total"]
    budget = report.budget
    grid = _grid(report.title, heads + (["fits " + human_bytes(budget)] if budget is not None else []))
    for row, e in report.estimates:
        p = e.parts
        row_cells = [
            row,
            f"{e.micro_batch} x {e.batch_size // e.micro_batch}",
            *(human_bytes(p[k]) for k in ("weights", "grads", "optimizer", "activations", "step_temps")),
            human_bytes(e.peak_bytes),
            human_bytes(e.total_bytes),
        ]
        if budget is not None:
            row_cells.append("yes" if e.fits(budget) else "NO")
        grid.add_row(*row_cells, style=None if budget is None or e.fits(budget) else "red")
    out.print(grid)
    for line in report.notes:
        say(f"  {line}")


def export_report(row: str, paths: list, notes: list[str]) -> None:
    say(f"exported plan {row!r}:")
    for p in paths:
        say(f"  {p}")
    for note in notes:
        say(f"  {note}" if note.startswith(("data:", "batch:")) else f"  note: {note}")


def quality_table(rows: list, seeds: int) -> None:
    """The quality phase: each candidate's metric and evaluation loss over the seeds, and its verdict."""

    if not rows:
        return
    name = rows[0].metric_name
    title = f"trainwise compare: quality phase, {rows[0].steps} steps x {seeds} seed(s)"
    grid = _grid(title, ["strategy", f"{name} mean", "seeds' range", "eval loss", "vs baseline", "verdict"])
    for r in rows:
        grid.add_row(
            r.strategy,
            f"{r.mean:.2f}",
            f"{r.low:.2f} - {r.high:.2f}",
            "-" if r.eval_loss is None else f"{r.eval_loss:.3f}",
            "-" if r.delta is None else f"{r.delta:+.2f}",
            r.verdict,
        )
    out.print(grid)
    test = (
        "by the paired t-test over the seeds (two-sided, 5%; quality.json has each t)"
        if seeds >= 3
        else "by the paired t-test over the 2 seeds (two-sided, 5%: it calls only a large, steady difference; "
        "--seeds 3 or more decides more)"
    )
    say(
        f"  a difference is called {test}; advise reads these verdicts (quality/quality.json) instead of "
        "the speed trials' quality."
    )
    if rows[0].majority is not None:
        say(f"  always answering the commonest class scores {rows[0].majority:.1f}% on these held-out rows")
    if (line := unlearned([r.mean for r in rows], rows[0].majority)) is not None:
        say(f"  warning: {line}")
    if rows[0].random_init:
        say(f"  {RANDOM_INIT_NOTE}")


def find_batch_table(report: Any) -> None:
    result = report.result
    cols, rows = batch_cells(result)
    grid = _grid(report.title, cols)
    for p, row in zip(result.points, rows, strict=True):
        grid.add_row(*row, style=None if p.fits else "dim")
    out.print(grid)
    say(f"  {batch_legend(result)}")
    if report.too_big:
        say(f"  not tried: {report.too_big} (more than the {report.n_train} training rows)")
    say(f"  {result.verdict()}")
    say("  files: " + ", ".join(str(p) for p in report.paths))


def _g(v: object) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def tune_table(result: Any, report: dict, search: str, monitor: str, out_dir: str) -> None:
    unit = "member" if search == "pbt" else "trial"
    grid = _grid(f"trainwise tune: {search}, {len(result.trials)} {unit}s", [unit, "state", f"best {monitor}", "steps"])
    grid.add_column("params" if search != "pbt" else "final params", overflow="fold")
    for r in result.trials:
        value = "-" if r["value"] is None else f"{r['value']:.4f}"
        grid.add_row(str(r["number"]), r["state"], value, str(r["steps"]), json.dumps(r["params"]))
    out.print(grid)
    if result.mutations:
        say(f"{len(result.mutations)} exploit/explore steps (all in {out_dir}/tune_result.json):")
        for m in result.mutations[:10]:
            changed = ", ".join(
                f"{k} {_g(m['old'].get(k))} -> {_g(v)}" for k, v in m["new"].items() if m["old"].get(k) != v
            )
            at = "at the end" if m["step"] is None else f"step {m['step']}"
            say(f"  {at}: member {m['member']} continues from member {m['from']}'s checkpoint, {changed}")
    failed = [r for r in result.trials if r["state"] == "fail" and r.get("error")]
    if failed:
        say(f"trainwise: warning: {len(failed)} {unit}(s) failed: {failed[0]['error']}", err)
    spent = result.curve[-1][0] if result.curve else sum(r["steps"] for r in result.trials)
    say(
        f"best {monitor} {result.best_value} with {json.dumps(result.best_params)}; {spent} optimizer steps spent, "
        f"{result.machine_s:.0f} s of machine time (best-so-far curve in {out_dir}/tune_result.json)"
    )
    if report.get("tie_note"):
        say(f"trainwise: warning: {report['tie_note']}", err)
    if report.get("train_command"):
        say(f"train the best {unit}'s settings: {report['train_command']}")
    if report.get("train_command_note"):
        say(f"  note: {report['train_command_note']}")
    if "cost" in report:
        cost = report["cost"]
        rework = f" (x{cost['rework']:.3f} expected re-work)" if cost["low_priority"] else ""
        say(f"cost ${cost['usd']:.4g} at {cost['price']}{rework}")


def strategies_table() -> None:

    grid = _grid("", ["name", "effect; cost", "conflicts", "requires"])
    for st in catalogue.REGISTRY.values():
        needs = sorted(st.requires) + [f"pkg {p}" for p in sorted(st.packages)]
        if st.tasks != catalogue.ALL_TASKS:
            needs.append("tasks " + "/".join(sorted(st.tasks)))
        if st.takes is not None:
            needs.append(f"takes {st.name}=N")
        grid.add_row(st.name, st.summary, ", ".join(sorted(st.conflicts)) or "-", ", ".join(needs) or "-")
    for alias, spec in catalogue.ALIASES.items():
        grid.add_row(alias, f"the seed studies' 'All Applied' row: {spec}", "-", "-")
    out.print(grid)


def recipes_table(found: list) -> None:
    """`trainwise recipes`: one block per shipped study file."""
    for r in found:
        out.print(f"[bold]{r.name}[/bold]  (trainwise {r.verb} --recipe {r.name})")
        for label, text in (
            ("question", r.question),
            ("rows", r.rows),
            ("here", r.offline),
            ("published", r.published),
            ("to publish", r.to_publish),
        ):
            out.print(f"  {label + ':':11s} {text}", highlight=False)
        out.print("")


def doctor_table(report: Any) -> None:
    d, e = report.device, report.environment
    cap = f"  compute capability {d['capability']}" if d.get("capability") else ""
    flags = f"  flags {' '.join(d['cpu_flags']) or '-'}" + (" (injected)" if d.get("injected") else "")
    say(f"device {d['kind']}: {d['name']}{cap}  memory {human_bytes(d['memory_bytes'])}{flags}")
    say(
        "peaks (a linear layer, measured): "
        + ", ".join(f"{mode} {v / 1e9:.0f} GFLOP/s" for mode, v in report.peaks_flops_per_s.items())
    )
    say("16-bit linear vs fp32: " + ", ".join(f"{p} {r:.2f}x the time" for p, r in report.precision_ratios.items()))
    libs = [f"{k.removesuffix('_version')} {v}" for k, v in e.items() if k.endswith("_version") and v]
    say(f"versions: python {e['python']}, " + ", ".join(libs) + (f", CUDA {e['cuda']}" if e.get("cuda") else ""))
    grid = _grid(f"trainwise doctor: {d['name']} ({report.wall_s:.0f} s)", ["strategy", "task", "verdict", "detail"])
    for c in report.checks:
        grid.add_row(c.strategy, c.task, c.verdict, c.detail)
    out.print(grid)
    counts = Counter(c.verdict for c in report.checks)
    say(", ".join(f"{n} {v}" for v, n in counts.most_common()) + f"; {report.path}")
