"""The command line. Thin: each verb validates its input into a config and calls the library.

Bad input (a ConfigError, or a usage error from the parser) prints one line and exits with 2.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import sys
from pathlib import Path
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
from trainwise.config import StudyConfig, TrialSpec
from trainwise.errors import ConfigError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Measure which training strategies to turn on for this model, data and hardware, and what each costs.",
)
# Piped or in CI, rich would wrap the table at 80 columns; give it room instead.
out_console = Console() if sys.stdout.isatty() else Console(width=180)  # pipes and files: the whole table
err_console = Console(stderr=True)

# cost options shared by compare and train (trainwise.cost validates them)
PricePerHour = Annotated[
    float | None, typer.Option(help="Cost: machine price in USD per hour (or --sku from the price table).")
]
Sku = Annotated[str | None, typer.Option(help="Cost: a machine in the price table (built in: ND40rs_v2, seed 000).")]
PriceFile = Annotated[
    str | None,
    typer.Option(help='Cost: JSON adding/overriding SKUs: {"NAME": {"dedicated": 3.1, "low_priority": 0.6}}.'),
]
LowPriority = Annotated[
    bool, typer.Option("--low-priority", help="Cost: the SKU's low-priority (spot) price, plus expected re-work.")
]
Preemptions = Annotated[float, typer.Option(help="Cost, low-priority: preemptions per hour (an assumption).")]


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
            "bert-tiny, minilm-l6, bert-base; image-classification: resnext-tiny (default), "
            "resnext-small, resnext29-8x16d, resnext29-8x64d."
        ),
    ] = None,
    task: Annotated[
        str, typer.Option(help="classification, seq2seq or image-classification (ResNeXt; seed 003).")
    ] = _default("task"),
    dataset: Annotated[
        str | None,
        typer.Option(
            help="Built-in offline dataset (stdlib-topic for classification, "
            "stdlib-summarize for seq2seq, digits for image-classification: the defaults) or a HF dataset name."
        ),
    ] = None,
    train_file: Annotated[
        str | None,
        typer.Option(
            help="Training data: .csv, .json or .jsonl; image-classification: a CIFAR-10 "
            "cifar-10-batches-py directory or an image folder (one sub-directory per class)."
        ),
    ] = None,
    eval_file: Annotated[
        str | None, typer.Option(help="Evaluation data (default: a deterministic 10% of --train-file).")
    ] = None,
    text_column: Annotated[str | None, typer.Option(help="Input text column of the files \\[default: text].")] = None,
    target_column: Annotated[
        str | None, typer.Option(help="Label (classification) or target text (seq2seq) column \\[default: target].")
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
    lr: Annotated[
        float | None,
        typer.Option(
            help="Peak learning rate (linear decay to 0) \\[default: 5e-05 (fine-tuning text), "
            "0.002 (image-classification, from scratch)]."
        ),
    ] = None,
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
    batch_sizes: Annotated[
        str | None,
        typer.Option(help="Sweep: run every row at each of these batch sizes, e.g. 8,16,32,64 (an OOM is a cell)."),
    ] = None,
    num_workers: Annotated[
        str, typer.Option(help="Sweep: DataLoader worker counts, e.g. 0,1,2,4,8 (data wait shown per step).")
    ] = "0",
    nproc: Annotated[
        int,
        typer.Option(
            help="Data-parallel processes per trial (torchrun; gloo on CPU, one GPU each on CUDA). --batch-size "
            "stays the global batch, split over the ranks. ZeRO rows partition over them."
        ),
    ] = 1,
    image_size: Annotated[
        int, typer.Option(help="image-classification: image folders are resized to this square size.")
    ] = 32,
    price_per_hour: PricePerHour = None,
    sku: Sku = None,
    price_file: PriceFile = None,
    low_priority: LowPriority = False,
    preemptions_per_hour: Preemptions = 0.5,
    checkpoint_minutes: Annotated[
        float, typer.Option(help="Cost, low-priority: minutes between checkpoints (half is lost per preemption).")
    ] = 30.0,
    profile: Annotated[
        bool,
        typer.Option(
            help="Write a torch.profiler Chrome/Perfetto trace of each trial's training steps (trace.json in its "
            "trial directory); phases are NVTX ranges on CUDA for nsys. Adds profiler overhead to the times."
        ),
    ] = False,
) -> None:
    """Run one trial per strategy row on the same model and data; print the comparison table."""
    from trainwise.cost import resolve_price

    price = resolve_price(price_per_hour, sku, price_file, low_priority, preemptions_per_hour, checkpoint_minutes)
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
        batch_sizes=_int_list(batch_sizes, "--batch-sizes") if batch_sizes else (),
        num_workers=_int_list(num_workers, "--num-workers"),
        nproc=nproc,
        profile=profile,
        image_size=image_size,
    )
    run_compare(cfg, price=price)


def _int_list(text: str, option: str) -> tuple[int, ...]:
    try:
        values = tuple(dict.fromkeys(int(x) for x in text.split(",") if x.strip()))
    except ValueError:
        raise ConfigError(f"{option} {text!r}: give whole numbers like 8,16,32") from None
    if not values:
        raise ConfigError(f"{option} {text!r}: give whole numbers like 8,16,32")
    return values


def run_compare(cfg: StudyConfig, console: Console | None = None, price=None) -> None:
    """Prepare, run (or resume) and report a study; shared by `compare` and `advise --run`."""
    console = console or out_console
    from trainwise.launcher import launch
    from trainwise.report.format import add_cost, cells, footnotes, headers, notes
    from trainwise.report.write import write_reports
    from trainwise.study import aggregate, prepare_study, run_study

    with err_console.status(f"trainwise compare: validating input, preparing data and model ({cfg.task})..."):
        prepared = prepare_study(cfg)
    s = prepared.specs[0].settings
    sweep = cfg.sweep()
    err_console.print(
        f"model {s.model_label} ({s.model_kind})  "
        f"device {s.device}  train rows {s.n_train}  batch {','.join(str(b) for b in sorted({b for b, _ in sweep}))}"
        f"  steps {s.max_steps} ({s.warmup_steps} untimed)"
        + (f"  ranks {s.nproc}" if s.nproc > 1 else "")
        + f"  trials {len(prepared.specs)}  out {prepared.out}"
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
    if price is not None:
        add_cost(table, price)
    title = f"trainwise compare: {s.model_label} / {s.task} / {s.device}"
    paths = write_reports(prepared.out, table, title)
    grid = Table(title=title, header_style="bold")
    for h in headers(table):
        grid.add_column(h, overflow="fold", no_wrap=h == "strategy")
    marks = footnotes(table)
    for e in table:
        grid.add_row(*cells(e, marks.get(e["strategy"])), style=None if e["status"] == "ok" else "red")
    console.print(grid)
    for line in notes(table):
        console.print(f"  {line}", markup=False, highlight=False)
    console.print("  files: " + ", ".join(str(p) for p in paths), markup=False, highlight=False)


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
    run: Annotated[
        bool,
        typer.Option("--run", help="Run (or resume) the study into STUDY first, as compare would, with these options."),
    ] = False,
    model: Annotated[str | None, typer.Option(help="--run: as in compare.")] = None,
    model_preset: Annotated[str | None, typer.Option(help="--run: as in compare.")] = None,
    task: Annotated[str, typer.Option(help="--run: as in compare.")] = _default("task"),
    dataset: Annotated[str | None, typer.Option(help="--run: as in compare.")] = None,
    train_file: Annotated[str | None, typer.Option(help="--run: as in compare.")] = None,
    strategies_: Annotated[
        str, typer.Option("--strategies", help="--run: the rows to compare.")
    ] = strategies.DEFAULT_STRATEGIES,
    batch_size: Annotated[int, typer.Option(help="--run: as in compare.")] = _default("batch_size"),
    max_length: Annotated[int, typer.Option(help="--run: as in compare.")] = _default("max_length"),
    max_steps: Annotated[int, typer.Option(help="--run: as in compare.")] = _default("max_steps"),
    device: Annotated[str, typer.Option(help="--run: as in compare.")] = "auto",
) -> None:
    """Rank a study's rows: Pareto-optimal plans under your constraints, and why each wins or loses.

    STUDY is a finished `trainwise compare` directory, or with --run one to run (or resume) first.
    """
    import dataclasses
    from dataclasses import asdict

    from trainwise.advise import Constraints, parse_bytes
    from trainwise.advise import advise as advise_rows

    budget = parse_bytes(memory_budget) if memory_budget is not None else None
    constraints = Constraints(objective, budget, max_quality_drop)
    if run:
        cfg = StudyConfig(
            out=study,
            strategies=strategies_.split(","),
            task=task,
            model=model,
            model_preset=model_preset,
            dataset=dataset,
            train_file=train_file,
            batch_size=batch_size,
            max_length=max_length,
            max_steps=max_steps,
            warmup_steps=min(_default("warmup_steps"), max_steps - 1),
            device=device,
        )
        run_compare(cfg, err_console if as_json else out_console)
    path = Path(study) / "results.json"
    if not path.is_file():
        raise ConfigError(f"{study}: no results.json; run `trainwise compare --out {study}` first, or add --run")
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not a trainwise results file ({e})") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "strategy" in r for r in rows):
        raise ConfigError(f"{path}: not a trainwise results file (expected a list of rows with 'strategy')")
    result = advise_rows(rows, constraints)
    hints: dict[str, str] = {}
    if budget is not None:
        with err_console.status("estimating the batch sizes each plan fits (calibration probe on first use)..."):
            hints = _batch_hints(Path(study), rows, budget)
        result.verdicts = [
            dataclasses.replace(v, reason=f"{v.reason}; {hints[v.strategy]}") if v.strategy in hints else v
            for v in result.verdicts
        ]
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


MODEL_HELP = (
    "Local HF model dir or hub id (offline: a dir, or 'all-MiniLM-L6-v2' from the bundled package). "
    "Default: all-MiniLM-L6-v2 for classification, preset t5-small for seq2seq."
)
BUNDLED_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"  # trainwise resolves it to the bundled copy offline
PRESET_HELP = (
    "A size preset (random weights): t5-tiny, t5-small, t5-base, bart-tiny, bart-base, bert-tiny, minilm-l6, bert-base."
)


@app.command()
def estimate(
    model: Annotated[str | None, typer.Option(help=MODEL_HELP)] = None,
    model_preset: Annotated[str | None, typer.Option(help=PRESET_HELP)] = None,
    task: Annotated[str, typer.Option(help="classification or seq2seq.")] = "classification",
    num_labels: Annotated[int, typer.Option(help="Classes of the classification head.")] = 2,
    strategies_: Annotated[
        str,
        typer.Option("--strategies", help="Comma list of plans to estimate, each a '+' combination (see compare)."),
    ] = "baseline,bf16,grad_ckpt,adafactor,grad_accum,bf16+grad_ckpt",
    batch_size: Annotated[int, typer.Option(help="Effective batch size per device (per optimizer step).")] = 16,
    accum_steps: Annotated[int, typer.Option(help="grad_accum: micro-batches per step.")] = 4,
    max_length: Annotated[int, typer.Option(help="Input tokens per sample (padding to it is assumed).")] = 128,
    max_target_length: Annotated[int, typer.Option(help="Target tokens per sample (seq2seq).")] = 48,
    nproc: Annotated[int, typer.Option(help="Data-parallel ranks (ZeRO partitions over them).")] = 1,
    zero: Annotated[int, typer.Option(help="DeepSpeed ZeRO stage for every plan: 0 (off), 1, 2 or 3.")] = 0,
    offload: Annotated[
        str, typer.Option(help="ZeRO offload to CPU: none, optimizer (stage>=1), params (stage 3).")
    ] = "none",
    device: Annotated[str, typer.Option(help="Device to estimate for: auto, cpu or cuda.")] = "auto",
    device_memory: Annotated[
        str | None, typer.Option(help="Memory of one device, e.g. 24GB or 80GiB; adds a fits column.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the estimates as JSON.")] = False,
) -> None:
    """Predict each plan's peak training memory without training: a breakdown, and whether it fits.

    Shapes come from the model built on the meta device (no weights are loaded). Activations come from
    a measured calibration probe (about 16 tiny forward/backward passes of the model family on this
    machine, ~5-10 s, cached), never from a guess.
    """
    from trainwise.advise import parse_bytes
    from trainwise.estimate import (
        EstimateConfig,
        calibrate,
        min_ranks_for_zero3,
        model_config,
        runtime_overhead,
        shape_of,
        what_fits,
    )
    from trainwise.estimate import estimate_plan as predict
    from trainwise.models import resolve_model
    from trainwise.report.format import human_bytes

    budget = parse_bytes(device_memory, "--device-memory") if device_memory is not None else None
    cfg = EstimateConfig(
        rows=tuple(strategies.parse_list(strategies_)),
        task=task,
        batch_size=batch_size,
        accum_steps=accum_steps,
        max_length=max_length,
        max_target_length=max_target_length,
        num_labels=num_labels,
        nproc=nproc,
        zero_stage=zero,
        offload=offload,
        device=device,
        device_memory=budget,
    )
    import torch

    target = "cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu"
    probe_device = target if target == "cpu" or torch.cuda.is_available() else "cpu"
    source = resolve_model(model, model_preset, task)
    config = model_config(source, task, num_labels)
    shapes: dict = {}
    cals: dict = {}

    def shape_for(plan):
        key = (plan.freeze, plan.lora_r)
        if key not in shapes:
            shapes[key] = shape_of(config, task, plan)
        return shapes[key]

    from transformers import AutoModelForSeq2SeqLM  # noqa: F401  (loaded before the runtime is measured)

    overhead = runtime_overhead(target)  # before any probe grows this process
    with err_console.status("calibrating...") as status:

        def cal_for(plan):
            key = (plan.precision, plan.grad_ckpt, plan.freeze, plan.lora_r)
            if key not in cals:
                label = f"{config.model_type} {plan.precision}{' +ckpt' if plan.grad_ckpt else ''}"

                def on_probe(i: int, n: int) -> None:
                    status.update(f"calibrating activations: measured probe {i + 1}/{n} ({label}, {probe_device})")

                cals[key] = calibrate(config, task, plan, probe_device, on_probe)
            return cals[key]

        results = []
        for row in cfg.rows:
            plan = cfg.plan(row)
            try:
                shape = shape_for(plan)
            except ValueError as err:
                raise ConfigError(f"{row}: {err}") from None
            est = predict(
                shape, cal_for(plan), plan, batch_size, max_length, max_target_length, target, nproc, overhead
            )
            results.append((row, est))
        base_shape = shape_for(cfg.plan("baseline"))
        rescue = []
        if budget is not None and not any(e.fits(budget) for _, e in results):
            rescue = what_fits(shape_for, cal_for, cfg, target, budget, overhead)

    name = source.display()
    if as_json:
        payload = {
            "model": name,
            "device": target,
            "device_memory": budget,
            "n_params": base_shape.n_params,
            "estimates": [{"strategy": r, **e.to_dict(), "fits": e.fits(budget)} for r, e in results],
            "calibration": [asdict_(c) for c in cals.values()],
            "would_fit": [{"plan": label, **e.to_dict()} for label, e in rescue],
        }
        out_console.print_json(json.dumps(payload))
        return
    title = (
        f"trainwise estimate: {name} ({base_shape.n_params / 1e6:.1f}M params) / {task} / {target}, "
        f"batch {batch_size}, length {max_length}"
        + (f"/{max_target_length}" if task == "seq2seq" else "")
        + (f", ZeRO-{zero} x{nproc}" if zero else f", {nproc} ranks" if nproc > 1 else "")
    )
    grid = Table(title=title, header_style="bold")
    heads = ["plan", "micro x accum", "weights", "grads", "optimizer", "activations", "step temps", "peak", "total"]
    for h in heads + (["fits " + human_bytes(budget)] if budget is not None else []):
        grid.add_column(h, overflow="fold")
    for row, e in results:
        p = e.parts
        cells = [
            row,
            f"{e.micro_batch} x {e.plan['accum_steps']}",
            *(human_bytes(p[k]) for k in ("weights", "grads", "optimizer", "activations", "step_temps")),
            human_bytes(e.peak_bytes),
            human_bytes(e.total_bytes),
        ]
        if budget is not None:
            cells.append("yes" if e.fits(budget) else "NO")
        grid.add_row(*cells, style=None if budget is None or e.fits(budget) else "red")
    out_console.print(grid)

    def say(line: str) -> None:
        out_console.print(f"  {line}", markup=False, highlight=False)

    say(
        f"peak = weights + optimizer + max(activations [+ grads under accumulation], grads + step temps); "
        f"total adds {human_bytes(overhead)} runtime ("
        + ("CUDA context, assumed" if target == "cuda" else "this process's RSS with torch + transformers loaded")
        + ")."
    )
    for c in cals.values():
        source_note = "tiny configs of the family" if c.how == "tiny-config probe" else "its own config at 1-3 layers"
        say(
            f"activations: calibrated by a measured probe, {c.probes} forward/backward passes of {source_note} "
            f"on {c.device} ({c.family}, {c.precision}{', checkpointing' if c.grad_ckpt else ''}; "
            f"fit error {100 * c.residual:.1f}%; cached)."
        )
        if c.how != "tiny-config probe":
            say(f"family {c.family!r} has no tiny-config recipe: fell back to probing its own config.")
    if probe_device != target:
        say("no GPU here: activations were probed on CPU; CUDA attention kernels (flash / memory-efficient) keep less.")
    say("padding to --max-length is assumed; dynamic padding needs less on real data.")
    if any(e.cpu_offload_bytes for _, e in results):
        say(f"ZeRO offload keeps {human_bytes(max(e.cpu_offload_bytes for _, e in results))} in CPU memory per rank.")
    if budget is not None and not any(e.fits(budget) for _, e in results):
        weights_only = 4 * base_shape.n_params + overhead
        if overhead >= budget:
            say(f"impossible: the runtime alone ({human_bytes(overhead)}) does not fit {human_bytes(budget)}.")
            return
        if weights_only > budget:
            say(
                f"impossible as asked: the fp32 weights alone need {human_bytes(4 * base_shape.n_params)} "
                f"(+{human_bytes(overhead)} runtime), more than {human_bytes(budget)}."
            )
        else:
            say(f"no plan above fits {human_bytes(budget)}.")
        if rescue:
            say("would fit: " + "; ".join(f"{label} ({human_bytes(e.total_bytes)})" for label, e in rescue[:3]))
        else:
            need = min_ranks_for_zero3(base_shape, cfg.plan("bf16"), budget, overhead)
            more = f"ZeRO-3 over >= {need} devices" if need else "a smaller model"
            say(
                f"nothing in the catalogue fits on {nproc} device(s): needs {more}, or LoRA (not in the catalogue yet)."
            )


@app.command()
def export(
    out: Annotated[str, typer.Option(help="Directory to write the files into.")] = "runs/export",
    study: Annotated[
        str | None,
        typer.Option(help="Take model and settings from this compare study; the plan defaults to advise's pick."),
    ] = None,
    strategies_: Annotated[
        str | None, typer.Option("--strategies", help="The plan to export, one '+' combination, e.g. bf16+grad_ckpt.")
    ] = None,
    model: Annotated[str | None, typer.Option(help=MODEL_HELP)] = None,
    model_preset: Annotated[str | None, typer.Option(help=PRESET_HELP)] = None,
    task: Annotated[str, typer.Option(help="classification or seq2seq.")] = "classification",
    batch_size: Annotated[int, typer.Option(help="Effective batch size per device.")] = 16,
    accum_steps: Annotated[int, typer.Option(help="grad_accum: micro-batches per step.")] = 4,
    max_length: Annotated[int, typer.Option(help="Max input tokens.")] = 128,
    max_target_length: Annotated[int, typer.Option(help="Max target tokens (seq2seq).")] = 48,
    lr: Annotated[float, typer.Option(help="Peak learning rate (linear decay).")] = 5e-5,
    max_steps: Annotated[int, typer.Option(help="Optimizer steps of the exported run.")] = 1000,
    nproc: Annotated[int, typer.Option(help="Processes (data-parallel ranks) for the accelerate config.")] = 1,
    zero: Annotated[int, typer.Option(help="DeepSpeed ZeRO stage: 0 (off), 1, 2 or 3.")] = 0,
    offload: Annotated[str, typer.Option(help="ZeRO offload: none, optimizer, params.")] = "none",
    device: Annotated[str, typer.Option(help="Where the exported run trains: cuda or cpu.")] = "cuda",
) -> None:
    """Write a plan as TrainingArguments JSON + Python snippet, accelerate config, ds_config.json (ZeRO) and
    the equivalent `trainwise train` command."""
    from pathlib import Path

    from trainwise.estimate import EstimateConfig
    from trainwise.export import RunSettings, write_export
    from trainwise.models import resolve_model

    if device not in ("cuda", "cpu"):
        raise ConfigError(f"--device must be cuda or cpu, not {device!r}")
    if max_steps <= 0 or lr <= 0:
        raise ConfigError("--max-steps and --lr must be > 0")
    model_is_preset = False
    if study is not None:
        settings, recommended = _study_settings(Path(study))
        row = strategies_ or recommended
        model_ref = settings["model_label"] if settings["model_kind"] == "preset" else settings["model_ref"]
        if settings["model_label"] == "all-MiniLM-L6-v2":  # the bundled copy's path is this machine's venv
            model_ref = BUNDLED_HUB_ID
        model_is_preset = settings["model_kind"] == "preset"
        task, batch_size, accum_steps = settings["task"], settings["batch_size"], settings["accum_steps"]
        max_length, max_target_length, lr = settings["max_length"], settings["max_target_length"], settings["lr"]
    else:
        if strategies_ is None:
            raise ConfigError("--strategies is required without --study (e.g. --strategies bf16+grad_ckpt)")
        row = strategies_
        source = resolve_model(model, model_preset, task)
        model_is_preset = source.kind == "preset"
        model_ref = BUNDLED_HUB_ID if source.label == "all-MiniLM-L6-v2" else source.ref
    if "," in row:
        raise ConfigError(f"--strategies {row!r}: export takes one plan (a '+' combination), not a list")
    cfg = EstimateConfig(
        rows=(row,),
        task=task,
        batch_size=batch_size,
        accum_steps=accum_steps,
        max_length=max_length,
        max_target_length=max_target_length,
        nproc=nproc,
        zero_stage=zero,
        offload=offload,
        device=device,
    )
    plan = cfg.plan(row)
    if device == "cpu" and plan.precision == "fp16":
        raise ConfigError(
            f"{row!r} uses fp16, which needs CUDA: on CPU the HF Trainer silently trains in fp32; use bf16"
        )
    run = RunSettings(
        model=model_ref,
        task=task,
        batch_size=batch_size,
        max_length=max_length,
        max_target_length=max_target_length,
        lr=lr,
        max_steps=max_steps,
        nproc=nproc,
        device=device,
        model_is_preset=model_is_preset,
        row=row,
    )
    paths = write_export(plan, run, Path(out))
    out_console.print(
        f"exported plan {row!r} ({plan.precision}, micro-batch {plan.micro_batch_size(batch_size)} x "
        f"{plan.accum_steps}):",
        markup=False,
        highlight=False,
    )
    for p in paths:
        out_console.print(f"  {p}", markup=False, highlight=False)


def _stored_settings(study: Path) -> dict | None:
    """The settings every trial of a study shares, from its SQLite store (None: no store or no trial)."""
    import sqlite3

    db = study / "study.sqlite"
    if not db.is_file():
        return None
    con = sqlite3.connect(db)
    try:
        found = con.execute("SELECT spec FROM trials LIMIT 1").fetchone()
    finally:
        con.close()
    return None if found is None else json.loads(found[0])["settings"]


def _batch_hints(study: Path, rows: list[dict], budget: int) -> dict[str, str]:
    """Per memory-saving row: up to which batch the baseline fits the budget (so when the row is needed).

    From `trainwise estimate` on the study's model and lengths; empty when the study's model cannot be
    built here (a hub id offline), since the hints are an addition to the measured advice.
    """

    from trainwise.estimate import calibrate, largest_batch, model_config, runtime_overhead, shape_of
    from trainwise.models import ModelSource
    from trainwise.plan import TrialPlan

    s = _stored_settings(study)
    if s is None:
        return {}
    try:
        config = model_config(ModelSource(s["model_kind"], s["model_ref"]), s["task"], s["num_labels"] or 2)
    except ConfigError:
        return {}
    overhead = runtime_overhead(s["device"])

    def fit(plan: TrialPlan) -> int:
        shape = shape_of(config, s["task"], plan)
        cal = calibrate(config, s["task"], plan, "cpu" if s["device"] == "cpu" else s["device"])
        return largest_batch(shape, cal, plan, budget, s["max_length"], s["max_target_length"], s["device"], overhead)

    baseline = fit(TrialPlan())
    hints = {}
    for row in rows:
        plan = TrialPlan.from_dict(row["plan"]) if row.get("plan") else None
        if plan is None or row["strategy"].split(" @")[0] == "baseline":
            continue
        saves = plan.grad_ckpt or plan.accum_steps > 1 or plan.optimizer != "adamw" or plan.freeze
        if not saves:
            continue
        own = fit(plan)
        if baseline >= s["batch_size"]:
            hints[row["strategy"]] = (
                f"not needed for memory at batch {s['batch_size']}: baseline fits up to ~{baseline}"
            )
        else:
            hints[row["strategy"]] = f"only needed when batch > {baseline}; fits up to ~{own} (estimate)"
    return hints


def _study_settings(study: Path, flag: str = "--study") -> tuple[dict, str]:
    """A compare study's shared settings and advise's recommended row (objective time)."""

    from trainwise.advise import Constraints
    from trainwise.advise import advise as advise_rows

    results = study / "results.json"
    if not (study / "study.sqlite").is_file() or not results.is_file():
        raise ConfigError(f"{flag} {study}: not a finished trainwise compare study (no study.sqlite/results.json)")
    settings = _stored_settings(study)
    if settings is None:
        raise ConfigError(f"{flag} {study}: the study has no trials")
    advice = advise_rows(json.loads(results.read_text(encoding="utf-8")), Constraints())
    if advice.recommended is None:
        raise ConfigError(f"{flag} {study}: no row finished ok; pass --strategies")
    return settings, advice.recommended


@app.command("find-batch")
def find_batch(
    strategies_: Annotated[
        str, typer.Option("--strategies", help="The plan to size, one '+' combination, e.g. bf16+grad_ckpt.")
    ] = "baseline",
    model: Annotated[str | None, typer.Option(help=MODEL_HELP)] = None,
    model_preset: Annotated[str | None, typer.Option(help=PRESET_HELP)] = None,
    task: Annotated[str, typer.Option(help="classification or seq2seq.")] = "classification",
    dataset: Annotated[str | None, typer.Option(help="Built-in dataset or HF dataset name (as in compare).")] = None,
    train_file: Annotated[str | None, typer.Option(help="Training data: .csv, .json or .jsonl.")] = None,
    text_column: Annotated[str | None, typer.Option(help="Input text column \\[default: text].")] = None,
    target_column: Annotated[str | None, typer.Option(help="Label / target column \\[default: target].")] = None,
    candidates: Annotated[str, typer.Option(help="Batch sizes to try, ascending (comma list).")] = "4,8,16,32,64,128",
    accum_steps: Annotated[int, typer.Option(help="grad_accum: micro-batches per step.")] = 4,
    max_length: Annotated[int, typer.Option(help="Max input tokens.")] = 128,
    max_target_length: Annotated[int, typer.Option(help="Max target tokens (seq2seq).")] = 48,
    steps: Annotated[int, typer.Option(help="Optimizer steps per size, the first untimed.")] = 4,
    memory_limit: Annotated[
        str | None,
        typer.Option(help="Fit limit, e.g. 8GB. Default: CUDA memory, or on CPU the available RAM minus 10%."),
    ] = None,
    refine: Annotated[int, typer.Option(help="Bisection steps between the largest fit and the first failure.")] = 2,
    use_estimate: Annotated[
        bool, typer.Option("--estimate/--no-estimate", help="Skip sizes the memory estimate says cannot fit.")
    ] = True,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    out: Annotated[str, typer.Option(help="Directory for find_batch.json / .png and the trials.")] = "runs/find-batch",
    trial_timeout: Annotated[float, typer.Option(help="Seconds before a size's trial is killed.")] = 900.0,
) -> None:
    """Find the fastest batch size that fits: climb the candidates, measure samples/s, bisect at the edge."""
    import dataclasses

    from trainwise.advise import parse_bytes
    from trainwise.estimate import calibrate, estimate_plan, model_config, runtime_overhead, shape_of
    from trainwise.find_batch import default_limit, search, write_outputs
    from trainwise.launcher import launch
    from trainwise.models import ModelSource
    from trainwise.report.format import human_bytes
    from trainwise.study import prepare_study

    try:
        sizes = sorted({int(x) for x in candidates.split(",") if x.strip()})
    except ValueError:
        raise ConfigError(f"--candidates {candidates!r}: give batch sizes like 8,16,32") from None
    if not sizes or sizes[0] <= 0:
        raise ConfigError(f"--candidates {candidates!r}: give positive batch sizes like 8,16,32")
    if "," in strategies_:
        raise ConfigError(f"--strategies {strategies_!r}: find-batch sizes one plan (a '+' combination)")
    if steps < 2:
        raise ConfigError(f"--steps must be >= 2 (the first is untimed), got {steps}")
    limit_arg = parse_bytes(memory_limit, "--memory-limit") if memory_limit is not None else None
    plan_accum = strategies.build_plan(strategies_, accum_steps).accum_steps
    usable = [b for b in sizes if b % plan_accum == 0]
    if not usable:
        raise ConfigError(f"no candidate is a multiple of --accum-steps {plan_accum}")
    cfg = StudyConfig(
        out=out,
        strategies=[strategies_],
        task=task,
        model=model,
        model_preset=model_preset,
        dataset=dataset,
        train_file=train_file,
        text_column=text_column,
        target_column=target_column,
        batch_size=usable[0],
        accum_steps=accum_steps,
        max_length=max_length,
        max_target_length=max_target_length,
        max_steps=steps,
        warmup_steps=1,
        eval_samples=0,
        device=device,
    )
    with err_console.status("trainwise find-batch: validating input, preparing data and model..."):
        prepared = prepare_study(cfg)
    base = prepared.specs[0]
    s = base.settings
    limit = limit_arg if limit_arg is not None else default_limit(s.device)
    too_big = [b for b in usable if b > s.n_train]
    usable = [b for b in usable if b <= s.n_train]
    if not usable:
        raise ConfigError(f"every candidate is larger than the {s.n_train} training rows")

    model_state: dict = {}  # shapes, calibration and runtime: once per search, not once per size

    def estimate_total(b: int) -> int | None:
        if not use_estimate:
            return None
        if not model_state:
            config = model_config(ModelSource(s.model_kind, s.model_ref), task, s.num_labels or 2)
            model_state["shape"] = shape_of(config, task, base.plan)
            model_state["cal"] = calibrate(config, task, base.plan, s.device)
            model_state["overhead"] = runtime_overhead(s.device)
        e = estimate_plan(
            model_state["shape"],
            model_state["cal"],
            base.plan,
            b,
            max_length,
            max_target_length,
            s.device,
            overhead=model_state["overhead"],
        )
        return e.total_bytes

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), console=err_console) as progress:
        bar = progress.add_task("")

        def run(b: int):
            spec = dataclasses.replace(base, settings=dataclasses.replace(s, batch_size=b))

            def on_event(e: dict) -> None:
                if e.get("event") == "step":
                    progress.update(bar, description=f"batch {b}: step {e['step']}/{e['total']}, {e['step_s']:.2f} s")

            progress.update(bar, description=f"batch {b}: starting")
            r = launch(spec, prepared.out / "trials" / f"bs{b}", trial_timeout, on_event)
            what = f"{r.samples_per_s:.1f} samples/s" if r.status == "ok" else r.status
            progress.console.print(f"  batch {b}: {what}", markup=False, highlight=False)
            return r

        def estimate_with_status(b: int) -> int | None:
            progress.update(bar, description=f"batch {b}: estimating memory (calibration probe on first use)")
            return estimate_total(b)

        result = search(usable, limit, run, s.device, estimate_with_status, refine, multiple_of=plan_accum)
    title = f"trainwise find-batch: {s.model_label} / {strategies_} / {s.device}, limit {human_bytes(limit)}"
    paths = write_outputs(result, prepared.out, title)
    grid = Table(title=title, header_style="bold")
    for h in ("batch", "status", "samples/s", "step time", "measured", "estimate", "note"):
        grid.add_column(h, overflow="fold")
    for p in result.points:
        mark = " (fastest)" if p.batch_size == result.fastest else ""
        grid.add_row(
            f"{p.batch_size}{mark}",
            p.status,
            "-" if p.samples_per_s is None else f"{p.samples_per_s:.1f}",
            "-" if p.step_time_s is None else f"{p.step_time_s:.3f} s",
            human_bytes(p.measured_bytes),
            human_bytes(p.estimate_bytes),
            p.note,
            style=None if p.fits else "dim",
        )
    out_console.print(grid)
    mem_kind = "reserved + CUDA context" if s.device == "cuda" else "peak RSS of the trial process"
    out_console.print(f"  measured = {mem_kind}; estimate = trainwise estimate (tensors + runtime).", markup=False)
    if too_big:
        out_console.print(f"  not tried: {too_big} (more than the {s.n_train} training rows)", markup=False)
    if result.fastest is None:
        out_console.print(
            "  nothing fitted: try a smaller candidate or a memory-saving plan (see `trainwise estimate`)"
        )
    else:
        out_console.print(
            f"  fastest: batch {result.fastest}; largest that fits: {result.largest_fit}", markup=False, highlight=False
        )
    out_console.print("  files: " + ", ".join(str(p) for p in paths), markup=False, highlight=False)


def asdict_(obj) -> dict:
    from dataclasses import asdict

    return asdict(obj)


@app.command()
def train(
    strategies_: Annotated[
        str | None,
        typer.Option(
            "--strategies",
            help="The plan: one '+' combination, e.g. bf16+grad_ckpt \\[default: baseline]; with "
            "--plan, a row of that study.",
        ),
    ] = None,
    plan_study: Annotated[
        str | None,
        typer.Option(
            "--plan",
            help="A compare study directory: train the plan advise recommends there (or the row --strategies "
            "names) with the study's model, data, batch, lengths, lr and seed.",
        ),
    ] = None,
    model: Annotated[str | None, typer.Option(help="As in compare.")] = None,
    model_preset: Annotated[str | None, typer.Option(help="As in compare.")] = None,
    task: Annotated[str, typer.Option(help="classification, seq2seq or image-classification.")] = _default("task"),
    dataset: Annotated[str | None, typer.Option(help="As in compare.")] = None,
    train_file: Annotated[str | None, typer.Option(help="As in compare.")] = None,
    eval_file: Annotated[str | None, typer.Option(help="As in compare.")] = None,
    text_column: Annotated[str | None, typer.Option(help="As in compare.")] = None,
    target_column: Annotated[str | None, typer.Option(help="As in compare.")] = None,
    batch_size: Annotated[int, typer.Option(help="Effective batch size.")] = _default("batch_size"),
    accum_steps: Annotated[int, typer.Option(help="grad_accum: micro-batches per step.")] = _default("accum_steps"),
    max_length: Annotated[int, typer.Option(help="Max input tokens.")] = _default("max_length"),
    max_target_length: Annotated[int, typer.Option(help="Max target tokens (seq2seq).")] = _default(
        "max_target_length"
    ),
    lr: Annotated[float | None, typer.Option(help="Peak learning rate, linear decay to 0 over the run.")] = None,
    seed: Annotated[int, typer.Option(help="Seed for weights, batches and dropout.")] = _default("seed"),
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    epochs: Annotated[int, typer.Option(help="Passes over the training data.")] = 1,
    max_steps: Annotated[int | None, typer.Option(help="Stop after this many optimizer steps.")] = None,
    eval_every: Annotated[int, typer.Option(help="Evaluate every K optimizer steps (and at the end).")] = 50,
    save_every: Annotated[int, typer.Option(help="Checkpoint every K optimizer steps (and at the end).")] = 50,
    patience: Annotated[
        int | None, typer.Option(help="Early stopping: stop after this many evaluations without improvement.")
    ] = None,
    min_delta: Annotated[float, typer.Option(help="Early stopping: the smallest change that counts.")] = 0.0,
    monitor: Annotated[
        str, typer.Option(help="metric (accuracy / ROUGE-L, higher is better) or loss (train loss, lower).")
    ] = "metric",
    eval_samples: Annotated[int, typer.Option(help="Evaluation samples per evaluation.")] = _default("eval_samples"),
    max_train_samples: Annotated[int | None, typer.Option(help="Use only the first N training rows.")] = None,
    out: Annotated[str, typer.Option(help="Run directory: checkpoints/, best/, train_result.json.")] = "runs/train",
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the last whole checkpoint in --out.")] = False,
    report_to: Annotated[
        str | None,
        typer.Option(
            help="Log the curves to tensorboard and/or mlflow (comma list): <out>/tensorboard, and an MLflow file "
            "store at <out>/mlruns (or MLFLOW_TRACKING_URI). Needs trainwise\\[report]."
        ),
    ] = None,
    price_per_hour: PricePerHour = None,
    sku: Sku = None,
    price_file: PriceFile = None,
    low_priority: LowPriority = False,
    preemptions_per_hour: Preemptions = 0.5,
) -> None:
    """Train for real with one plan: periodic eval, best checkpoint, early stopping, resumable checkpoints."""
    from trainwise.cost import resolve_price
    from trainwise.tracking import Tracker, parse_report_to
    from trainwise.train import TrainConfig, run_train

    tc = TrainConfig(epochs, max_steps, eval_every, save_every, patience, min_delta, monitor)
    backends = parse_report_to(report_to)
    price = resolve_price(price_per_hour, sku, price_file, low_priority, preemptions_per_hour, 0.0)
    if strategies_ is not None and "," in strategies_:
        raise ConfigError(f"--strategies {strategies_!r}: train runs one plan (a '+' combination)")
    if plan_study is not None:
        given = [n for n, v in (("--model", model), ("--model-preset", model_preset), ("--dataset", dataset)) if v]
        given += [n for n, v in (("--train-file", train_file), ("--eval-file", eval_file), ("--lr", lr)) if v]
        if given:
            raise ConfigError(f"--plan takes the model, data and settings from the study: leave out {', '.join(given)}")
        spec = _study_spec(Path(plan_study), strategies_)
        strategies_ = spec.strategy
        _one_process(strategies_, spec.plan.zero_stage, spec.settings.nproc, "train")  # the study's ranks
    else:
        strategies_ = strategies_ or "baseline"
        _one_process(strategies_, strategies.build_plan(strategies_, accum_steps).zero_stage, 1, "train")
        spec = _train_spec(
            strategies_,
            StudyConfig(
                out=out,
                strategies=[strategies_],
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
                max_steps=2,  # replaced by the run's own schedule
                warmup_steps=0,
                lr=lr,
                seed=seed,
                device=device,
                eval_samples=eval_samples,
                max_train_samples=max_train_samples,
            ),
        )
    from trainwise.worker import _emitter

    fault = _emitter("train", batch_size)  # the test seam: TRAINWISE_FAULT="train:kill@STEP"

    def emit(event: dict) -> None:
        if event.get("event") == "eval":
            shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in event.items() if k != "event"}
            err_console.print(f"  eval {shown}", markup=False, highlight=False)
        elif event.get("event") == "step" and (event["step"] % 10 == 0 or event["step"] == event["total"]):
            err_console.print(f"  step {event['step']}/{event['total']}  loss {event['loss']:.4f}", highlight=False)
        with contextlib.redirect_stdout(io.StringIO()):
            fault(event)

    tracker = None
    if backends:
        # the spec's max_steps is a placeholder: the train config's (its cap) replaces it
        params = {"plan": strategies_, **dataclasses.asdict(spec.settings), **dataclasses.asdict(tc)}
        Path(out).mkdir(parents=True, exist_ok=True)
        tracker = Tracker(backends, Path(out), f"{Path(out).name} {strategies_}", params)

    def emit_all(event: dict) -> None:
        if tracker is not None:
            tracker.log(event)
        emit(event)

    warn = lambda msg: err_console.print(f"trainwise: warning: {msg}")  # noqa: E731
    try:
        r = run_train(spec, tc, Path(out), resume, emit_all, warn)
    except BaseException:
        if tracker is not None:
            tracker.close(failed=True)
        raise
    if tracker is not None:
        keep = ("steps", "planned_steps", "final_loss", "best_step", "best_value", "wall_s", "compute_saved")
        tracker.close({k: getattr(r, k) for k in keep})
    lines = [
        f"trained {r.steps}/{r.planned_steps} steps in {r.wall_s:.0f} s"
        + (f" (resumed from {r.resumed_from})" if r.resumed_from else ""),
        f"final train loss {r.final_loss:.4f}",
    ]
    if r.best_value is not None:
        lines.append(f"best {r.monitor} {r.best_value:.4f} at step {r.best_step} (model in {out}/best/)")
    if r.stopped_early:
        lines.append(
            f"early stop: no improvement > {min_delta:g} in {patience} evaluations; "
            f"{100 * r.compute_saved:.0f}% of the planned steps not spent"
        )
    if price is not None:
        # the checkpoint interval of this run, in time: save_every steps at the measured pace
        per_step = r.wall_s / max(1, r.steps)
        price = dataclasses.replace(price, checkpoint_hours=tc.save_every * per_step / 3600)
        rework = f" (x{price.rework_factor():.3f} expected re-work)" if price.low_priority else ""
        lines.append(f"cost ${price.cost(r.wall_s):.4g} at {price.label}{rework}")
    for line in lines:
        out_console.print(line, markup=False, highlight=False)


@app.command()
def tune(
    space: Annotated[str, typer.Option(help="Search space, YAML: lr: {low: 1e-5, high: 1e-3, log: true} ...")],
    search: Annotated[
        str,
        typer.Option(
            help="random or tpe (Optuna, median pruning), or pbt (Ray Tune population-based training: lr, weight "
            "decay and label smoothing mutate during training; needs trainwise\\[ray])."
        ),
    ] = "tpe",
    trials: Annotated[
        int,
        typer.Option(
            help="random/tpe: finished trials to reach (re-running continues the study). pbt: the population size."
        ),
    ] = 8,
    strategies_: Annotated[str, typer.Option("--strategies", help="The plan every trial trains with.")] = "baseline",
    model: Annotated[str | None, typer.Option(help="As in compare.")] = None,
    model_preset: Annotated[str | None, typer.Option(help="As in compare.")] = None,
    task: Annotated[str, typer.Option(help="classification, seq2seq or image-classification.")] = _default("task"),
    dataset: Annotated[str | None, typer.Option(help="As in compare.")] = None,
    train_file: Annotated[str | None, typer.Option(help="As in compare.")] = None,
    batch_size: Annotated[int, typer.Option(help="Batch size when the space does not tune it.")] = _default(
        "batch_size"
    ),
    max_length: Annotated[int, typer.Option(help="Max input tokens.")] = _default("max_length"),
    max_steps: Annotated[int, typer.Option(help="Optimizer steps per trial (the budget unit).")] = 60,
    eval_every: Annotated[int, typer.Option(help="Evaluate (and maybe prune) every K steps.")] = 20,
    monitor: Annotated[str, typer.Option(help="metric (maximise) or loss (minimise).")] = "metric",
    eval_samples: Annotated[int, typer.Option(help="Evaluation samples.")] = _default("eval_samples"),
    max_train_samples: Annotated[int | None, typer.Option(help="Use only the first N training rows.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the data, the models and the sampler.")] = _default("seed"),
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    out: Annotated[
        str, typer.Option(help="Study directory: tune.sqlite or pbt/, trials/, tune_result.json.")
    ] = "runs/tune",
    ray_address: Annotated[
        str | None,
        typer.Option(
            help="pbt: run the members on this Ray cluster (e.g. ray://head:10001 or auto); --out must then be "
            "storage every node sees (a shared path or s3://...). Default: a local Ray on this machine."
        ),
    ] = None,
    cpus_per_trial: Annotated[
        float | None, typer.Option(help="pbt: CPUs per member (default: this machine's cores / population, >= 1).")
    ] = None,
    price_per_hour: PricePerHour = None,
    sku: Sku = None,
    price_file: PriceFile = None,
    low_priority: LowPriority = False,
    preemptions_per_hour: Preemptions = 0.5,
) -> None:
    """Search learning rate, batch size, weight decay, warm-up, label smoothing (and seq2seq decoding: num_beams,
    length_penalty): Optuna random search or TPE
    (resumable, with pruning), or population-based training with Ray Tune."""
    from trainwise.cost import resolve_price
    from trainwise.study import prepare_study
    from trainwise.train import TrainConfig
    from trainwise.tune import check_search, check_task, load_space, run_tune

    check_search(search)
    if trials <= 0:
        raise ConfigError(f"--trials must be > 0, got {trials}")
    if search != "pbt" and (ray_address is not None or cpus_per_trial is not None):
        raise ConfigError("--ray-address and --cpus-per-trial are for --search pbt")
    if cpus_per_trial is not None and cpus_per_trial <= 0:
        raise ConfigError(f"--cpus-per-trial must be > 0, got {cpus_per_trial:g}")
    if search == "pbt" and trials < 2:
        raise ConfigError(f"--search pbt needs a population (--trials) of at least 2, got {trials}")
    if search == "pbt" and max_steps < 2 * eval_every:
        raise ConfigError(f"--search pbt perturbs every --eval-every steps: --max-steps must be >= 2 x {eval_every}")
    params = load_space(space)
    check_task(params, task)
    _one_process(strategies_, strategies.build_plan(strategies_, _default("accum_steps")).zero_stage, 1, "tune")
    price = resolve_price(price_per_hour, sku, price_file, low_priority, preemptions_per_hour, 0.0)
    if search == "pbt":
        from trainwise.pbt import EXPERIMENT, check_pbt

        check_pbt(params, ray_address)
        if (Path(out) / EXPERIMENT).exists():
            # Ray can restore the experiment, but its synchronous PBT then waits forever for members
            # it does not restart (seen with Ray 2.60); a half-done population is not resumed
            raise ConfigError(f"{out} already holds a PBT study; PBT studies do not resume: use another --out")
        # a member checkpoints at every evaluation, which is where PBT exploits and explores
        tc = TrainConfig(10**6, max_steps, eval_every, eval_every, None, 0.0, monitor, keep=1)
    else:
        # every trial trains --max-steps steps (the budget unit), however many epochs that takes
        tc = TrainConfig(10**6, max_steps, eval_every, max_steps, None, 0.0, monitor, checkpoints=False)
    cfg = StudyConfig(
        out=out,
        strategies=[strategies_],
        task=task,
        model=model,
        model_preset=model_preset,
        dataset=dataset,
        train_file=train_file,
        batch_size=batch_size,
        max_length=max_length,
        max_steps=2,
        warmup_steps=0,
        seed=seed,
        device=device,
        eval_samples=eval_samples,
        max_train_samples=max_train_samples,
    )
    with err_console.status("trainwise tune: validating input, preparing data and model..."):
        prepared = prepare_study(cfg)
    spec = prepared.specs[0]
    train_args = dataclasses.asdict(tc)

    def on_trial(r: dict) -> None:
        value = "-" if r["value"] is None else f"{r['value']:.4f}"
        params_text = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in r["params"].items())
        err_console.print(
            f"  trial {r['number']}: {r['state']}  {value}  {r['steps']} steps  {params_text}", highlight=False
        )

    if search == "pbt":
        from trainwise.pbt import run_pbt

        cpus = cpus_per_trial or max(1.0, float((os.cpu_count() or 1) // trials))
        gpus = 1.0 if spec.settings.device == "cuda" else 0.0

        def on_report(r: dict) -> None:
            shown = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in r["config"].items())
            err_console.print(
                f"  member {r['member']} step {r['step']}: {r['objective']:.4f}  {shown}", highlight=False
            )

        result = run_pbt(spec, params, trials, Path(out), train_args, on_report, seed, ray_address, cpus, gpus)
    else:
        result = run_tune(spec, params, search, trials, Path(out), train_args, on_trial, seed)
    report = dataclasses.asdict(result)
    if price is not None:
        # the work a preemption loses: a whole Optuna trial (it has no checkpoints, so it starts over), or
        # one evaluation interval of the population (members run side by side and checkpoint at each)
        if search == "pbt":
            interval_s = result.machine_s * eval_every / max_steps
        else:
            interval_s = result.machine_s / max(1, len(result.trials))
        price = dataclasses.replace(price, checkpoint_hours=interval_s / 3600)
        report["cost"] = {"usd": price.cost(result.machine_s), "price": price.label, "rework": price.rework_factor()}
    (Path(out) / "tune_result.json").write_text(json.dumps(report, indent=1))
    unit = "member" if search == "pbt" else "trial"
    grid = Table(title=f"trainwise tune: {search}, {len(result.trials)} {unit}s", header_style="bold")
    for h in (unit, "state", f"best {monitor}", "steps", "params" if search != "pbt" else "final params"):
        grid.add_column(h, overflow="fold")
    for r in result.trials:
        value = "-" if r["value"] is None else f"{r['value']:.4f}"
        grid.add_row(str(r["number"]), r["state"], value, str(r["steps"]), json.dumps(r["params"]))
    out_console.print(grid)
    if result.mutations:
        out_console.print(f"{len(result.mutations)} exploit/explore steps (all in {out}/tune_result.json):")
        for m in result.mutations[:10]:
            changed = ", ".join(
                f"{k} {_g(m['old'].get(k))} -> {_g(v)}" for k, v in m["new"].items() if m["old"].get(k) != v
            )
            at = "at the end" if m["step"] is None else f"step {m['step']}"
            out_console.print(
                f"  {at}: member {m['member']} continues from member {m['from']}'s checkpoint, {changed}",
                markup=False,
                highlight=False,
            )
    failed = [r for r in result.trials if r["state"] == "fail" and r.get("error")]
    if failed:
        err_console.print(f"trainwise: warning: {len(failed)} {unit}(s) failed: {failed[0]['error']}")
    spent = _spent(result)
    lines = [
        f"best {monitor} {result.best_value} with {json.dumps(result.best_params)}; {spent} optimizer steps spent, "
        f"{result.machine_s:.0f} s of machine time (best-so-far curve in {out}/tune_result.json)"
    ]
    if price is not None:
        rework = f" (x{price.rework_factor():.3f} expected re-work)" if price.low_priority else ""
        lines.append(f"cost ${report['cost']['usd']:.4g} at {price.label}{rework}")
    for line in lines:
        out_console.print(line, markup=False, highlight=False)


def _train_spec(row: str, cfg: StudyConfig) -> TrialSpec:
    """The one trial spec `train` runs, prepared as compare prepares its rows."""
    from trainwise.study import prepare_study

    with err_console.status("trainwise train: validating input, preparing data and model..."):
        prepared = prepare_study(cfg)
    if prepared.unsupported:
        raise ConfigError(f"{row!r}: {next(iter(prepared.unsupported.values()))}")
    return prepared.specs[0]


def _study_spec(study: Path, row: str | None) -> TrialSpec:
    """A compare study's trial spec for `row` (default: advise's pick), for `train --plan`."""
    import sqlite3

    _, recommended = _study_settings(study, "--plan")
    if row is None:
        err_console.print(f"trainwise train: {recommended!r}, the plan advise recommends in {study}", highlight=False)
    row = row or recommended
    con = sqlite3.connect(study / "study.sqlite")
    try:
        found = con.execute("SELECT spec FROM trials WHERE strategy = ? LIMIT 1", (row,)).fetchone()
        rows = [r for (r,) in con.execute("SELECT DISTINCT strategy FROM trials")]
    finally:
        con.close()
    if found is None:
        raise ConfigError(f"--plan {study}: no row {row!r}; its rows: {', '.join(rows)}")
    return TrialSpec.from_dict(json.loads(found[0]))


def _one_process(row: str, zero_stage: int, nproc: int, verb: str) -> None:
    """train and tune run one process: data parallelism and ZeRO are compare's (`--nproc`) for now."""
    if nproc > 1 or zero_stage:
        raise ConfigError(
            f"{row!r} needs {max(2, nproc)} ranks (data parallel / ZeRO); {verb} runs one process: measure it "
            "with `trainwise compare --nproc N`"
        )


def _spent(result) -> int:
    return result.curve[-1][0] if result.curve else sum(r["steps"] for r in result.trials)


def _g(v) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


@app.command("strategies")
def list_strategies() -> None:
    """List every strategy with its one-line effect and cost."""
    from trainwise.strategies.base import IMAGE_TASKS, TEXT_TASKS

    ALL_TASKS = TEXT_TASKS | IMAGE_TASKS  # noqa: N806
    grid = Table(header_style="bold")
    for h in ("name", "effect; cost", "conflicts", "requires"):
        grid.add_column(h, overflow="fold")
    for st in strategies.REGISTRY.values():
        needs = sorted(st.requires) + [f"pkg {p}" for p in sorted(st.packages)]
        if st.tasks != ALL_TASKS:
            needs.append("tasks " + "/".join(sorted(st.tasks)))
        if st.with_value is not None:
            needs.append(f"takes {st.name}=N")
        grid.add_row(st.name, st.summary, ", ".join(sorted(st.conflicts)) or "-", ", ".join(needs) or "-")
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
