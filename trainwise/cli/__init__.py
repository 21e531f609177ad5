"""The command line: each verb parses its options into a config, calls one library function and prints.

Bad input (a ConfigError, or a usage error from the parser) prints one line and exits with 2.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Annotated

import typer

# typer (pinned in requirements.lock) vendors click; its usage errors are these classes.
from typer._click.exceptions import ClickException, NoArgsIsHelpError

from trainwise import strategies as catalogue
from trainwise.cli import options as o
from trainwise.cli.options import default, price, study_config
from trainwise.errors import ConfigError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Measure which training strategies to turn on for this model, data and hardware, and what each costs.",
)
Opt = typer.Option


@app.command()
def compare(
    ctx: typer.Context,
    model: o.Model = None,
    model_preset: o.Preset = None,
    task: o.Task = default("task"),
    dataset: o.Dataset = None,
    train_file: o.TrainFile = None,
    eval_file: o.EvalFile = None,
    text_column: o.TextColumn = None,
    target_column: o.TargetColumn = None,
    strategies: o.Rows = catalogue.DEFAULT_STRATEGIES,
    batch_size: o.BatchSize = 16,
    accum_steps: o.AccumSteps = default("accum_steps"),
    max_length: o.MaxLength = default("max_length"),
    max_target_length: o.MaxTargetLength = default("max_target_length"),
    max_steps: Annotated[int, Opt(help="Optimizer steps per trial, warm-up included.")] = default("max_steps"),
    warmup_steps: Annotated[int, Opt(help="First steps excluded from timing.")] = default("warmup_steps"),
    repeat: Annotated[int, Opt(help="Trials per row; the table shows medians.")] = default("repeat"),
    remeasure: Annotated[bool, Opt(help="With --repeat 1: the baseline again last (noise floor, drift).")] = True,
    lr: o.Lr = None,
    seed: o.Seed = default("seed"),
    device: o.Device = "auto",
    out: Annotated[str, Opt(help="Study directory (store, reports); the same command again resumes.")] = "runs/compare",
    trial_timeout: o.TrialTimeout = 900.0,
    eval_samples: o.EvalSamples = default("eval_samples"),
    max_train_samples: o.MaxTrainSamples = None,
    retry_failed: Annotated[bool, Opt(help="On resume, run again the rows that did not end 'ok'.")] = False,
    retries: Annotated[int, Opt(help="Re-runs of a trial timed under load, once quiet.")] = default("retries"),
    force: o.Force = False,
    batch_sizes: Annotated[str | None, Opt(help="Sweep: every row at each batch size, e.g. 8,16,32,64.")] = None,
    num_workers: Annotated[str, Opt(help="Sweep: DataLoader worker counts, e.g. 0,1,2,4,8.")] = "0",
    nproc: o.Nproc = 1,
    image_size: o.ImageSize = 32,
    price_per_hour: o.PricePerHour = None,
    sku: o.Sku = None,
    price_file: o.PriceFile = None,
    low_priority: o.LowPriority = False,
    preemptions_per_hour: o.Preemptions = 0.5,
    checkpoint_minutes: Annotated[float, Opt(help="Cost, low-priority: minutes between checkpoints.")] = 30.0,
    profile: Annotated[bool, Opt(help="A torch.profiler trace of each trial's steps (adds overhead).")] = False,
    quality_steps: Annotated[int | None, Opt(help="Then train the Pareto rows this long for quality.")] = None,
    seeds: Annotated[int, Opt(help="Quality phase: seeds per row (the spread of the verdicts).")] = 2,
) -> None:
    """Run one trial per strategy row on the same model and data; print the comparison table."""
    from trainwise.api.compare import CompareOptions

    run_compare(*CompareOptions.of(ctx.params).resolve())


def run_compare(cfg, cost=None, steps_seeds: tuple[int, int] | None = None, console=None) -> None:
    """The library's compare, shown on the terminal: progress, the table, the quality phase's verdicts."""
    from functools import partial

    from trainwise.api.compare import Render, run
    from trainwise.report import terminal

    render = Render(terminal.study_progress, partial(terminal.compare_table, console=console), terminal.quality_table)
    note = partial(terminal.say, console=terminal.err)
    run(cfg, cost, steps_seeds, dataclasses.replace(render, status=terminal.err.status, note=note))


@app.command()
def advise(
    ctx: typer.Context,
    study: Annotated[list[str], typer.Argument(metavar="STUDY", help="Study dirs: `trainwise compare` --out.")],
    objective: Annotated[str, Opt(help="What to optimise: time, cost or quality.")] = "time",
    memory_budget: Annotated[str | None, Opt(help="Largest acceptable peak memory, e.g. 11GB, 900MiB.")] = None,
    max_quality_drop: Annotated[float | None, Opt(help="Largest acceptable quality drop, in its units.")] = None,
    max_epoch_time: Annotated[str | None, Opt(help="Time budget: longest acceptable epoch, e.g. 30m, 2h.")] = None,
    max_epoch_cost: Annotated[float | None, Opt(help="Cost budget: USD per epoch (a priced study).")] = None,
    as_json: Annotated[bool, Opt("--json", help="Print the advice as JSON.")] = False,
    run: Annotated[bool, Opt("--run", help="Run (or resume) the study into STUDY first, as compare.")] = False,
    model: o.Model = None,
    model_preset: o.Preset = None,
    task: o.Task = default("task"),
    dataset: o.Dataset = None,
    train_file: o.TrainFile = None,
    strategies: o.Rows = catalogue.DEFAULT_STRATEGIES,
    batch_size: o.BatchSize = default("batch_size"),
    max_length: o.MaxLength = default("max_length"),
    max_steps: Annotated[int, Opt(help="--run: optimizer steps per trial.")] = default("max_steps"),
    device: o.Device = "auto",
) -> None:
    """Rank a study's rows: Pareto-optimal plans under your constraints, and why each wins or loses.

    STUDY: a `trainwise compare` --out (--run: run or resume it first); several, each priced, rank by cost too.
    """
    from trainwise.advise import Constraints, partial_note
    from trainwise.api.advise import advise_study
    from trainwise.report import terminal

    constraints, paths = Constraints.of(ctx.params), [Path(s) for s in study]
    if run and len(paths) > 1:
        raise ConfigError("--run runs one study: give one STUDY with --run")
    if run:
        cfg = study_config(ctx.params, out=study[0], warmup_steps=min(default("warmup_steps"), max_steps - 1))
        run_compare(cfg, console=terminal.err if as_json else terminal.out)
    with terminal.err.status("advising (a budget adds batch hints: an estimate, a probe on first use)..."):
        result = advise_study(paths, constraints)
    for partial in filter(None, map(partial_note, paths)):
        terminal.say(f"trainwise: note: {partial}", terminal.err)
    if as_json:
        return terminal.out.print_json(json.dumps(dataclasses.asdict(result)))
    terminal.advise_table(result, ", ".join(study), objective)


@app.command()
def estimate(
    ctx: typer.Context,
    model: o.Model = None,
    model_preset: o.Preset = None,
    task: o.TextTask = "classification",
    dataset: o.Dataset = None,
    train_file: o.TrainFile = None,
    text_column: o.TextColumn = None,
    target_column: o.TargetColumn = None,
    num_labels: Annotated[int | None, Opt(help="Classes of the head, without data \\[default: 2].")] = None,
    strategies: o.EstimateRows = catalogue.ESTIMATE_STRATEGIES,
    batch_size: Annotated[int, Opt(help="Effective batch size per device (per optimizer step).")] = 16,
    accum_steps: o.AccumSteps = 4,
    max_length: Annotated[int, Opt(help="Input tokens per sample (padding to it is assumed).")] = 128,
    max_target_length: o.MaxTargetLength = 48,
    nproc: Annotated[int, Opt(help="Data-parallel ranks (ZeRO partitions over them).")] = 1,
    zero: o.Zero = 0,
    offload: o.Offload = "none",
    device: Annotated[str, Opt(help="Device to estimate for: auto, cpu or cuda.")] = "auto",
    device_memory: Annotated[str | None, Opt(help="Memory of one device, e.g. 24GB; adds a fits column.")] = None,
    as_json: Annotated[bool, Opt("--json", help="Print the estimates as JSON.")] = False,
) -> None:
    """Predict each plan's peak training memory without training: a breakdown, and whether it fits.

    Shapes come from the model built on the meta device (no weights are loaded). Activations come from
    a measured calibration probe (about 16 tiny forward/backward passes of the model family on this
    machine, ~5-10 s, cached), never from a guess. With the data compare trains on (--train-file or
    --dataset) the classes and, for dynamically padded rows, the lengths come from it.
    """
    from trainwise.estimate import EstimateConfig, run_estimate
    from trainwise.report import terminal

    cfg = EstimateConfig.of(ctx.params)
    with terminal.err.status("calibrating...") as status:
        report = run_estimate(model, model_preset, cfg, status.update)
    terminal.out.print_json(json.dumps(report.to_json())) if as_json else terminal.estimate_table(report)


@app.command()
def export(
    ctx: typer.Context,
    out: Annotated[str, Opt(help="Directory to write the files into.")] = "runs/export",
    study: Annotated[str | None, Opt(help="Model and settings from this study; the plan: advise's pick.")] = None,
    strategies: Annotated[str | None, Opt(help="The plan to export, one '+' combination, e.g. bf16+grad_ckpt.")] = None,
    model: o.Model = None,
    model_preset: o.Preset = None,
    task: o.TextTask = "classification",
    batch_size: o.BatchSize = 16,
    accum_steps: o.AccumSteps = 4,
    max_length: o.MaxLength = 128,
    max_target_length: o.MaxTargetLength = 48,
    lr: Annotated[float, Opt(help="Peak learning rate (linear decay).")] = 5e-5,
    max_steps: Annotated[int | None, Opt(help="Steps of the exported run \\[default: the study's, else 1000].")] = None,
    nproc: Annotated[int | None, Opt(help="Data-parallel ranks \\[default: the study's, else 1].")] = None,
    zero: o.Zero = 0,
    offload: o.Offload = "none",
    device: Annotated[str, Opt(help="Where the exported run trains: cuda or cpu.")] = "cuda",
    force: o.Force = False,
) -> None:
    """Write a plan as TrainingArguments JSON + Python snippet, accelerate config, ds_config.json (ZeRO) and
    the equivalent `trainwise train` command."""
    from trainwise.export import ExportConfig, export_plan
    from trainwise.report.terminal import export_report

    export_report(*export_plan(ExportConfig.of(ctx.params), Path(out)))


@app.command("find-batch")
def find_batch(
    ctx: typer.Context,
    strategies: o.Plan = "baseline",
    model: o.Model = None,
    model_preset: o.Preset = None,
    task: o.TextTask = "classification",
    dataset: o.Dataset = None,
    train_file: o.TrainFile = None,
    text_column: o.TextColumn = None,
    target_column: o.TargetColumn = None,
    candidates: Annotated[str, Opt(help="Batch sizes to try, ascending (comma list).")] = "4,8,16,32,64,128",
    accum_steps: o.AccumSteps = 4,
    max_length: o.MaxLength = 128,
    max_target_length: o.MaxTargetLength = 48,
    steps: Annotated[int, Opt(help="Optimizer steps per size, the first untimed.")] = 4,
    memory_limit: Annotated[str | None, Opt(help="Fit limit, e.g. 8GB (default: the device's, or RAM - 10%).")] = None,
    refine: Annotated[int, Opt(help="Bisection steps between the largest fit and the first failure.")] = 2,
    use_estimate: Annotated[bool, Opt("--estimate/--no-estimate", help="Skip sizes the estimate rules out.")] = True,
    device: o.Device = "auto",
    out: Annotated[str, Opt(help="Directory for find_batch.json / .png and the trials.")] = "runs/find-batch",
    trial_timeout: o.TrialTimeout = 900.0,
) -> None:
    """Find the fastest batch size that fits: climb the candidates, measure samples/s, bisect at the edge."""
    from trainwise.find_batch import FindBatchConfig
    from trainwise.find_batch import find_batch as search
    from trainwise.launcher import launch
    from trainwise.report import terminal
    from trainwise.units import parse_bytes

    limit = parse_bytes(memory_limit, "--memory-limit") if memory_limit is not None else None
    fb = FindBatchConfig(candidates, steps, limit, refine, use_estimate)

    def config(batch: int):
        return study_config(ctx.params, batch_size=batch, max_steps=steps, warmup_steps=1, eval_samples=0)

    with terminal.err.status("trainwise find-batch: ...") as status:
        report = search(strategies, accum_steps, config, fb, launch, status.update, terminal.indented)
    terminal.find_batch_table(report)


@app.command()
def train(
    ctx: typer.Context,
    strategies: Annotated[str | None, Opt(help="The plan (a+b) \\[default: baseline]; --plan: a row.")] = None,
    plan_study: Annotated[str | None, Opt("--plan", help="Train a study's row (advise's pick) as it ran.")] = None,
    model: o.Model = None,
    model_preset: o.Preset = None,
    task: o.Task = default("task"),
    dataset: o.Dataset = None,
    train_file: o.TrainFile = None,
    eval_file: o.EvalFile = None,
    text_column: o.TextColumn = None,
    target_column: o.TargetColumn = None,
    batch_size: o.BatchSize = default("batch_size"),
    accum_steps: o.AccumSteps = default("accum_steps"),
    max_length: o.MaxLength = default("max_length"),
    max_target_length: o.MaxTargetLength = default("max_target_length"),
    lr: o.Lr = None,
    seed: o.Seed = default("seed"),
    device: o.Device = "auto",
    num_workers: Annotated[int, Opt(help="DataLoader worker processes.")] = 0,
    epochs: Annotated[int, Opt(help="Passes over the training data.")] = 1,
    max_steps: Annotated[int | None, Opt(help="Stop after this many optimizer steps.")] = None,
    eval_every: Annotated[int, Opt(help="Evaluate every K optimizer steps (and at the end).")] = 50,
    save_every: Annotated[int, Opt(help="Checkpoint every K optimizer steps (and at the end).")] = 50,
    keep_checkpoints: Annotated[int, Opt(help="Checkpoints kept (the last N), besides best/ and final/.")] = 2,
    patience: Annotated[int | None, Opt(help="Early stopping: evaluations without improvement.")] = None,
    min_delta: Annotated[float, Opt(help="Early stopping: the smallest change that counts.")] = 0.0,
    monitor: Annotated[str, Opt(help="metric (accuracy / ROUGE-L, maximised), eval_loss or train_loss.")] = "metric",
    eval_samples: o.EvalSamples = default("eval_samples"),
    max_train_samples: o.MaxTrainSamples = None,
    nproc: o.Nproc = 1,
    out: Annotated[str, Opt(help="Run directory: checkpoints/, best/, train_result.json.")] = "runs/train",
    force: o.Force = False,
    resume: Annotated[bool, Opt("--resume", help="Continue from the last whole checkpoint in --out.")] = False,
    report_to: Annotated[str | None, Opt(help="tensorboard and/or mlflow (comma list); trainwise\\[report].")] = None,
    price_per_hour: o.PricePerHour = None,
    sku: o.Sku = None,
    price_file: o.PriceFile = None,
    low_priority: o.LowPriority = False,
    preemptions_per_hour: o.Preemptions = 0.5,
) -> None:
    """Train for real with one plan: periodic eval, best checkpoint, early stopping, resumable checkpoints."""
    from trainwise.api.advise import study_spec
    from trainwise.config import TrainConfig
    from trainwise.report import terminal
    from trainwise.study import prepare_study
    from trainwise.tracking import parse_report_to

    tc = TrainConfig(epochs, max_steps, eval_every, save_every, patience, min_delta, monitor, keep_checkpoints)
    backends, cost = parse_report_to(report_to), price(ctx.params, 0.0)
    if strategies is not None and "," in strategies:
        raise ConfigError(f"--strategies {strategies!r}: train runs one plan (a '+' combination)")
    if plan_study is not None:
        spec = study_spec(Path(plan_study), strategies, lambda note: terminal.say(note, terminal.err), ctx.params)
    else:  # max_steps: a placeholder, the run's own schedule replaces it
        rows = [strategies or "baseline"]
        cfg = study_config(ctx.params, strategies=rows, max_steps=2, warmup_steps=0, num_workers=(num_workers,))
        with terminal.err.status("trainwise train: validating input, preparing data and model..."):
            prepared = prepare_study(cfg, lambda note: terminal.say(note, terminal.err))
        if prepared.unsupported:
            raise ConfigError(f"{cfg.rows[0].text!r}: {next(iter(prepared.unsupported.values()))}")
        spec = prepared.specs[0]
        terminal.precision_note(prepared.verdicts.get(spec.row))  # trained as asked; why it may be slow
    from trainwise import train as run  # torch: after every check of the input

    warn = lambda msg: terminal.say(f"trainwise: warning: {msg}", terminal.err)  # noqa: E731
    r = run.train_any(run.TrainJob(spec, tc, Path(out), resume, backends, terminal.train_event, warn))
    for line in run.summary(r, tc, cost):
        terminal.say(line)


@app.command()
def tune(
    ctx: typer.Context,
    space: Annotated[str, Opt(help="Search space, YAML: lr: {low: 1e-5, high: 1e-3, log: true} ...")],
    search: Annotated[str, Opt(help="random or tpe (Optuna, pruning), or pbt (Ray Tune; trainwise\\[ray]).")] = "tpe",
    trials: Annotated[int, Opt(help="random/tpe: finished trials to reach; pbt: the population.")] = 8,
    strategies: Annotated[str, Opt(help="The plan every trial trains with.")] = "baseline",
    model: o.Model = None,
    model_preset: o.Preset = None,
    task: o.Task = default("task"),
    dataset: o.Dataset = None,
    train_file: o.TrainFile = None,
    eval_file: o.EvalFile = None,
    text_column: o.TextColumn = None,
    target_column: o.TargetColumn = None,
    batch_size: Annotated[int, Opt(help="Batch size when the space does not tune it.")] = default("batch_size"),
    max_length: o.MaxLength = default("max_length"),
    max_steps: Annotated[int, Opt(help="Optimizer steps per trial (the budget unit).")] = 60,
    eval_every: Annotated[int, Opt(help="Evaluate (and maybe prune) every K steps.")] = 20,
    monitor: Annotated[str, Opt(help="metric (maximised), eval_loss or train_loss (minimised).")] = "metric",
    eval_samples: o.EvalSamples = default("eval_samples"),
    max_train_samples: o.MaxTrainSamples = None,
    seed: o.Seed = default("seed"),
    device: o.Device = "auto",
    out: Annotated[str, Opt(help="Study directory: tune.sqlite or pbt/, trials/, tune_result.json.")] = "runs/tune",
    ray_address: Annotated[str | None, Opt(help="pbt: a Ray cluster (ray://head:10001 or auto).")] = None,
    cpus_per_trial: Annotated[float | None, Opt(help="pbt: CPUs per member (default: cores / population).")] = None,
    trial_timeout: Annotated[float, Opt(help="random/tpe: seconds before a trial is killed ('timeout').")] = 900.0,
    price_per_hour: o.PricePerHour = None,
    sku: o.Sku = None,
    price_file: o.PriceFile = None,
    low_priority: o.LowPriority = False,
    preemptions_per_hour: o.Preemptions = 0.5,
) -> None:
    """Search lr, batch size, weight decay, warm-up, label smoothing (seq2seq: decoding): Optuna random
    search or TPE (resumable, with pruning), or population-based training with Ray Tune."""
    from trainwise.report import terminal
    from trainwise.tune import TuneConfig, check_some_complete
    from trainwise.tune import tune as search_space

    cfg = TuneConfig.of(ctx.params)
    cost = price(ctx.params, 0.0)
    study = study_config(ctx.params, strategies=[strategies], max_steps=2, warmup_steps=0)
    with terminal.err.status("trainwise tune: ...") as status:
        result, report = search_space(cfg, study, cost, status.update, lambda line: terminal.say(line, terminal.err))
    terminal.tune_table(result, report, search, monitor, out)
    check_some_complete(result)  # exit 1 when no trial produced a value


@app.command("strategies")
def list_strategies(markdown: Annotated[bool, Opt("--markdown", help="Print docs/strategies.md.")] = False) -> None:
    """List every strategy with its one-line effect and cost."""
    from trainwise.report import terminal

    print(catalogue.markdown(), end="") if markdown else terminal.strategies_table()


@app.command()
def doctor(
    device: Annotated[str, Opt(help="auto, cpu or cuda: the device to check.")] = "auto",
    out: Annotated[str, Opt(help="Where the checks' trials and doctor.json are written.")] = "runs/doctor",
    as_json: Annotated[bool, Opt("--json", help="Print the report as JSON.")] = False,
) -> None:
    """What works here: every strategy tried 2 steps on a tiny preset, the device's facts, measured peaks and
    versions (what a bug report quotes). Exit 1 when a strategy the device supports failed."""
    from trainwise.doctor import run_doctor
    from trainwise.report import terminal

    with terminal.doctor_progress() as (on_event, on_done):
        report = run_doctor(device, Path(out), on_event, on_done)
    terminal.out.print_json(json.dumps(report.to_dict())) if as_json else terminal.doctor_table(report)
    report.check_failed()


@app.command()
def env(device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto") -> None:
    """Print the environment trainwise records beside every figure."""
    from trainwise.measure.env import environment
    from trainwise.report import terminal
    from trainwise.study import resolve_device

    resolved, caps = resolve_device(device)
    terminal.out.print_json(json.dumps({**environment(resolved), "capabilities": sorted(caps)}))


def _interrupted() -> int:
    from trainwise import lifeline

    print(lifeline.interrupted_line(), file=sys.stderr)
    return 130


def main(argv: list[str] | None = None) -> int:
    from trainwise.files import exit_line
    from trainwise.lifeline import signals_interrupt

    signals_interrupt()  # SIGTERM / SIGHUP: clean up (kill the running trial) like Ctrl-C
    command = typer.main.get_command(app)
    try:
        code = command.main(args=argv, prog_name="trainwise", standalone_mode=False)
    except NoArgsIsHelpError as e:
        print(e.format_message(), file=sys.stderr)  # the help text, several lines on purpose
        return 2
    except (typer.Abort, KeyboardInterrupt):
        return _interrupted()
    except typer.Exit as e:
        return int(e.exit_code)
    except Exception as e:  # bad input: 2; a run whose every trial failed: 1; a write the machine refused: 3
        line, code = exit_line(e) if not isinstance(e, ClickException) else (e.format_message(), 2)
        print(f"trainwise: error: {' '.join(line.split())}", file=sys.stderr)
        return code
    if code == 130:  # typer turns Ctrl-C (and lifeline's SIGTERM / SIGHUP) into a silent exit code 130
        return _interrupted()
    return code if isinstance(code, int) else 0
