"""The command line. Thin: each verb validates its input into a config and calls the library.

Bad input (a ConfigError, or a usage error from the parser) prints one line and exits with 2.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

# typer (pinned in requirements.lock) vendors click; its usage errors are these classes.
from typer._click.exceptions import ClickException, NoArgsIsHelpError

from trainwise import strategies
from trainwise.config import StudyConfig
from trainwise.errors import ConfigError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Measure which training strategies to turn on for this model, data and hardware, and what each costs.",
)
# Piped or in CI, rich would wrap the table at 80 columns; give it room instead.
out_console = Console() if sys.stdout.isatty() else Console(width=150)
err_console = Console(stderr=True)


def _default(name: str):
    """CLI defaults come from StudyConfig, so the two cannot drift apart."""
    return StudyConfig.__dataclass_fields__[name].default


@app.command()
def compare(
    model: Annotated[
        str | None,
        typer.Option(
            help="Local HF model dir or hub id (offline: a dir, or "
            "'all-MiniLM-L6-v2' from the bundled package). Default: "
            "all-MiniLM-L6-v2 for classification, preset t5-small for seq2seq."
        ),
    ] = None,
    model_preset: Annotated[
        str | None,
        typer.Option(
            help="Build an architecture from its config with random "
            "weights: t5-tiny, t5-small, t5-base, bart-tiny, bart-base, "
            "bert-tiny, minilm-l6, bert-base."
        ),
    ] = None,
    task: Annotated[str, typer.Option(help="classification or seq2seq.")] = _default("task"),
    dataset: Annotated[
        str | None,
        typer.Option(
            help="Built-in offline dataset (stdlib-topic for classification, "
            "stdlib-summarize for seq2seq: the default) or a HF dataset name."
        ),
    ] = None,
    train_file: Annotated[str | None, typer.Option(help="Training data: .csv, .json or .jsonl.")] = None,
    eval_file: Annotated[
        str | None, typer.Option(help="Evaluation data (default: a deterministic 10% of --train-file).")
    ] = None,
    text_column: Annotated[str | None, typer.Option(help="Input text column of the files [default: text].")] = None,
    target_column: Annotated[
        str | None, typer.Option(help="Label (classification) or target text (seq2seq) column [default: target].")
    ] = None,
    strategies_: Annotated[
        str,
        typer.Option(
            "--strategies",
            help="Comma list of rows; a row combines strategies "
            "with '+', e.g. bf16+grad_ckpt. 'all' = "
            f"{strategies.ALIASES['all']}. See `trainwise strategies`.",
        ),
    ] = strategies.DEFAULT_STRATEGIES,
    batch_size: Annotated[
        int, typer.Option(help="Effective batch size (samples per optimizer step) of every row.")
    ] = 16,
    accum_steps: Annotated[int, typer.Option(help="grad_accum: micro-batches per step (each batch/N).")] = _default(
        "accum_steps"
    ),
    max_length: Annotated[int, typer.Option(help="Max input tokens; the baseline pads to it.")] = _default(
        "max_length"
    ),
    max_target_length: Annotated[int, typer.Option(help="Max target tokens (seq2seq).")] = _default(
        "max_target_length"
    ),
    max_steps: Annotated[int, typer.Option(help="Optimizer steps per trial, warm-up included.")] = _default(
        "max_steps"
    ),
    warmup_steps: Annotated[int, typer.Option(help="First steps excluded from timing.")] = _default("warmup_steps"),
    repeat: Annotated[int, typer.Option(help="Trials per row; the table shows medians.")] = _default("repeat"),
    lr: Annotated[float, typer.Option(help="Peak learning rate (linear decay to 0).")] = _default("lr"),
    seed: Annotated[int, typer.Option(help="Seed for weights, batches and data order.")] = _default("seed"),
    device: Annotated[
        str,
        typer.Option(
            help="auto, cpu or cuda. With auto, rows the device cannot run are "
            "recorded 'unsupported'; with an explicit device they are an error."
        ),
    ] = "auto",
    out: Annotated[
        str,
        typer.Option(
            help="Study directory: SQLite store, results.json/.csv, report.md, "
            "chart.png. Re-running the same command resumes."
        ),
    ] = "runs/compare",
    trial_timeout: Annotated[
        float, typer.Option(help="Seconds before a trial is killed and recorded 'timeout'.")
    ] = 900.0,
    eval_samples: Annotated[int, typer.Option(help="Evaluation samples per trial (0: no evaluation).")] = _default(
        "eval_samples"
    ),
    max_train_samples: Annotated[int | None, typer.Option(help="Use only the first N training rows.")] = None,
    retry_failed: Annotated[bool, typer.Option(help="On resume, run again the rows that did not end 'ok'.")] = _default(
        "retry_failed"
    ),
) -> None:
    """Run one trial per strategy row on the same model and data; print the comparison table."""
    from trainwise.launcher import launch
    from trainwise.report.format import HEADERS, cells, footnotes, notes
    from trainwise.report.write import write_reports
    from trainwise.study import aggregate, prepare_study, run_study

    cfg = StudyConfig(
        out=out,
        strategies=[s for s in strategies_.split(",")],
        task=task,
        model=model,
        model_preset=model_preset,
        dataset=dataset,
        train_file=train_file,
        eval_file=eval_file,
        text_column=text_column,
        target_column=target_column,
        batch_size=batch_size,
        accum_steps=accum_steps,
        max_length=max_length,
        max_target_length=max_target_length,
        max_steps=max_steps,
        warmup_steps=warmup_steps,
        repeat=repeat,
        lr=lr,
        seed=seed,
        device=device,
        trial_timeout=trial_timeout,
        eval_samples=eval_samples,
        max_train_samples=max_train_samples,
        retry_failed=retry_failed,
    )
    with err_console.status(f"trainwise compare: validating input, preparing data and model ({task})..."):
        prepared = prepare_study(cfg)
    s = prepared.specs[0].settings
    err_console.print(
        f"model {s.model_label} ({s.model_kind})  "
        f"device {s.device}  train rows {s.n_train}  batch {s.batch_size}  steps {s.max_steps} "
        f"({s.warmup_steps} untimed)  trials {len(prepared.specs)}  out {prepared.out}"
    )
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
    ) as progress:
        study_bar = progress.add_task("study", total=len(prepared.specs))
        trial_bar = progress.add_task("", total=s.max_steps, visible=False)

        def on_event(spec, e: dict) -> None:
            name = f"{spec.strategy} #{spec.repeat + 1}"
            if e.get("event") == "phase" and e["phase"] == "data":  # a new trial: fresh bar and clock
                progress.reset(trial_bar, description=f"{name}: data", visible=True)
            elif e.get("event") == "phase":
                progress.update(trial_bar, description=f"{name}: {e['phase']}")
            elif e.get("event") == "step":
                progress.update(
                    trial_bar,
                    completed=e["step"],
                    description=f"{name}: loss {e['loss']:.3f}, {e['step_s']:.2f} s/step",
                )

        def on_done(spec, r, cached: bool) -> None:
            progress.update(trial_bar, visible=False)
            progress.advance(study_bar)
            what = f"{r.step_time_s:.3f} s/step, {r.samples_per_s:.1f} samples/s" if r.status == "ok" else r.message
            progress.console.print(
                f"  {'(stored) ' if cached else ''}{spec.strategy} #{spec.repeat + 1}: {r.status}  {what}",
                markup=False,
                highlight=False,
            )

        results = run_study(prepared, launch, on_event, on_done)
    table = aggregate(prepared.rows, results)
    title = f"trainwise compare: {s.model_label} / {s.task} / {s.device}"
    paths = write_reports(prepared.out, table, title)
    grid = Table(title=title, header_style="bold")
    for h in HEADERS:
        grid.add_column(h, overflow="fold")
    marks = footnotes(table)
    for e in table:
        grid.add_row(*cells(e, marks.get(e["strategy"])), style=None if e["status"] == "ok" else "red")
    out_console.print(grid)
    for line in notes(table):
        out_console.print(f"  {line}", markup=False, highlight=False)
    out_console.print("  files: " + ", ".join(str(p) for p in paths), markup=False, highlight=False)


@app.command()
def advise(
    study: Annotated[str, typer.Argument(help="A study directory written by `trainwise compare` (its --out).")],
    objective: Annotated[str, typer.Option(help="What to optimise: time, cost or quality.")] = "time",
    memory_budget: Annotated[
        str | None, typer.Option(help="Largest acceptable peak memory, e.g. 11GB, 11GiB, 900MiB.")
    ] = None,
    max_quality_drop: Annotated[
        float | None,
        typer.Option(help="Largest acceptable drop of the quality metric below the reference row, in its units."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the advice as JSON.")] = False,
) -> None:
    """Rank a finished study's rows: Pareto-optimal plans under your constraints, and why each wins or loses."""
    from dataclasses import asdict
    from pathlib import Path

    from trainwise.advise import Constraints, parse_bytes
    from trainwise.advise import advise as advise_rows

    budget = parse_bytes(memory_budget) if memory_budget is not None else None
    constraints = Constraints(objective, budget, max_quality_drop)
    path = Path(study) / "results.json"
    if not path.is_file():
        raise ConfigError(f"{study}: no results.json; run `trainwise compare --out {study}` first")
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not a trainwise results file ({e})") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "strategy" in r for r in rows):
        raise ConfigError(f"{path}: not a trainwise results file (expected a list of rows with 'strategy')")
    result = advise_rows(rows, constraints)
    if as_json:
        out_console.print_json(json.dumps(asdict(result)))
        return
    grid = Table(title=f"trainwise advise: {study} (objective: {objective})", header_style="bold")
    for h in ("rank", "strategy", "verdict", "time", "memory", "quality", "why"):
        grid.add_column(h, overflow="fold")
    for i, v in enumerate(result.verdicts, 1):
        verdict = "pareto" if v.pareto else "feasible" if v.feasible else "excluded" if v.status == "ok" else v.status
        grid.add_row(
            str(i),
            v.strategy,
            verdict,
            "-" if v.rel_time is None else f"{100 * v.rel_time:.0f}%",
            "-" if v.rel_mem is None else f"{100 * v.rel_mem:.0f}%",
            "-" if v.quality_delta is None else f"{v.quality_delta:+.2f}",
            v.reason,
            style=None if v.feasible else "dim",
        )
    out_console.print(grid)
    for line in result.notes:
        out_console.print(f"  note: {line}", markup=False, highlight=False)
    ref = f" (time and memory relative to {result.reference})" if result.reference else ""
    out_console.print(
        f"  recommended: {result.recommended or 'nothing meets the constraints'}{ref}", markup=False, highlight=False
    )


@app.command("strategies")
def list_strategies() -> None:
    """List every strategy with its one-line effect and cost."""
    grid = Table(header_style="bold")
    for h in ("name", "effect; cost", "conflicts", "requires"):
        grid.add_column(h, overflow="fold")
    for st in strategies.REGISTRY.values():
        grid.add_row(st.name, st.summary, ", ".join(sorted(st.conflicts)) or "-", ", ".join(sorted(st.requires)) or "-")
    for alias, spec in strategies.ALIASES.items():
        grid.add_row(alias, f"the seed studies' 'All Applied' row: {spec}", "-", "-")
    out_console.print(grid)


@app.command()
def env(device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto") -> None:
    """Print the environment trainwise records beside every figure."""
    from trainwise.measure.env import environment
    from trainwise.study import resolve_device

    resolved, caps = resolve_device(device)
    out_console.print_json(json.dumps({**environment(resolved), "capabilities": sorted(caps)}))


def _one_line(msg: str) -> str:
    return " ".join(msg.split())


def main(argv: list[str] | None = None) -> int:
    command = typer.main.get_command(app)
    try:
        code = command.main(args=argv, prog_name="trainwise", standalone_mode=False)
    except ConfigError as e:
        print(f"trainwise: error: {_one_line(str(e))}", file=sys.stderr)
        return 2
    except NoArgsIsHelpError as e:
        print(e.format_message(), file=sys.stderr)  # the help text, several lines on purpose
        return 2
    except ClickException as e:
        print(f"trainwise: error: {_one_line(e.format_message())}", file=sys.stderr)
        return 2
    except (typer.Abort, KeyboardInterrupt):
        print("trainwise: interrupted", file=sys.stderr)
        return 130
    except typer.Exit as e:
        return int(e.exit_code)
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
