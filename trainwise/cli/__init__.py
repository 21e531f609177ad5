"""The command line: a shell over `trainwise.api`. Each verb's flags are made from its options dataclass
(trainwise/api/options.py, which inherits each option's one declaration: trainwise/spec/groups.py, the library
configs, trainwise/core/option.py), parsed into it over a `--config FILE.yaml`, handed to one library call, and what it
returns is rendered here.

Bad input (a ConfigError, or a usage error from the parser) prints one line and exits with 2.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import sys
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any

import typer

# typer (pinned in requirements.lock) vendors click; its usage errors and parameter sources are these.
from typer._click.core import ParameterSource
from typer._click.exceptions import ClickException, NoArgsIsHelpError

from trainwise import strategies as catalogue
from trainwise.api import compare as compare_api
from trainwise.api import env as env_api
from trainwise.api import estimate as estimate_api
from trainwise.api import export as export_api
from trainwise.api import find_batch as find_batch_api
from trainwise.api import options as api
from trainwise.api import recipes
from trainwise.api import train as train_api
from trainwise.api import tune as tune_api
from trainwise.api.render import STDERR
from trainwise.core.config import monitor_name
from trainwise.core.errors import ConfigError
from trainwise.core.files import exit_line
from trainwise.run import lifeline
from trainwise.search.hyperparams import check_some_complete

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Measure which training strategies to turn on for this model, data and hardware, and what each costs.",
)
RECIPE = "A shipped study file by name, e.g. seed-001 (`trainwise recipes` lists them); flags given win."
CONFIG = "A YAML file of this command's options (keys: the option names, e.g. max_steps: 8); flags given win."
FROM_LINE = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
GIVEN: set[str] = set()  # the options the running command named on its line (a flag wins over --from-config's file)


def _cli_type(hint: Any) -> Any:
    """The type the parser reads: a value that may be text or a list (`strategies`) is the CLI's text."""
    if typing.get_origin(hint) not in (typing.Union, types.UnionType):
        return hint
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    kind = str if len(args) > 1 else args[0]
    return kind | None if type(None) in typing.get_args(hint) else kind


def _parameter(f: dataclasses.Field, hint: Any) -> inspect.Parameter:
    meta = f.metadata
    if meta.get("argument"):
        info: Any = typer.Argument(help=meta["help"], metavar=meta.get("metavar"), show_default=False)
    else:
        shown = meta.get("show_default")
        info = typer.Option(*meta.get("flags", ()), help=meta["help"], show_default=True if shown is None else shown)
    default = f.default
    if default is dataclasses.MISSING:  # required: an argument by the parser, an option by Options.of (or a file)
        default = inspect.Parameter.empty if meta.get("argument") else None
        hint = hint if meta.get("argument") else hint | None
    return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[hint, info])


def verb(options: type[api.Options], name: str | None = None, json_help: str | None = None, with_recipe: bool = False):
    """Register a handler `(options, as_json) -> None` as a command whose flags are the options' fields
    (the model and data first, then the verb's own, then the other groups it shares), with --config (and
    --json when it prints JSON, --recipe when a shipped study file can run it)."""

    def register(handler: Callable[[Any, bool], None]) -> Callable[[Any, bool], None]:
        hints = typing.get_type_hints(options)
        params = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)]
        params += [_parameter(f, _cli_type(hints[f.name])) for f in options.ordered()]
        extra: list[tuple[str, Any, Any]] = [("config", None, Annotated[str | None, typer.Option(help=CONFIG)])]
        if with_recipe:
            extra.append(("recipe", None, Annotated[str | None, typer.Option(help=RECIPE)]))
        if json_help:
            extra.append(("as_json", False, Annotated[bool, typer.Option("--json", help=json_help)]))
        params += [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=d, annotation=a) for k, d, a in extra]

        def command(ctx: typer.Context, **values: Any) -> None:
            config, as_json, recipe = values.pop("config"), values.pop("as_json", False), values.pop("recipe", None)
            if recipe is not None:
                if config is not None:
                    raise ConfigError("--recipe and --config: give one (a recipe is a study file trainwise ships)")
                config = recipes.recipe(recipe, options.VERB).path
            given = {k: v for k, v in values.items() if ctx.get_parameter_source(k) in FROM_LINE}
            GIVEN.clear()
            GIVEN.update(given if config is None else {})
            handler(options.of(given, config), as_json)

        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        command.__doc__ = handler.__doc__
        app.command(name or handler.__name__.replace("_", "-"))(command)
        return handler

    return register


def _terminal():
    """The terminal module and the API's default render (progress, status and notes on stderr)."""
    from trainwise.report import terminal  # start-up: rich, loaded when there is something to show

    return terminal, STDERR


def _study_render(console=None):
    """The terminal's render of a running study: the API's, with the table (on `console`) and the quality
    phase's verdicts, which the CLI prints and a notebook reads from the returned study."""
    terminal, render = _terminal()
    table = functools.partial(terminal.compare_table, console=console)
    return terminal, dataclasses.replace(render, table=table, quality=terminal.quality_table)


@verb(api.CompareOptions, with_recipe=True)
def compare(o: api.CompareOptions, _json: bool) -> None:
    """Run one trial per strategy row on the same model and data; print the comparison table."""
    compare_api.start(o, _study_render()[1])


@verb(api.AdviseOptions, json_help="Print the advice as JSON.")
def advise(o: api.AdviseOptions, as_json: bool) -> None:
    """Rank a study's rows: Pareto-optimal plans under your constraints, and why each wins or loses.

    STUDY: a `trainwise compare` --out (--run: run or resume it first); several, each priced, rank by cost too.
    """
    from trainwise.api.advise import start  # heavy: loads numpy (the study store's statistics)
    from trainwise.report import terminal  # start-up: rich

    result = start(o, _study_render(terminal.err if as_json else terminal.out)[1])
    if as_json:
        return terminal.out.print_json(json.dumps(dataclasses.asdict(result)))
    terminal.advise_table(result, ", ".join(o.study), o.objective)


@verb(api.PlanOptions, json_help="Print the plan as JSON.", with_recipe=True)
def plan(o: api.PlanOptions, as_json: bool) -> None:
    """Which strategies to turn on, measured: the single rows first (compare's, or --study's), beside what you get
    without trainwise (TRL's or the Trainer's defaults); then, as rows of the same study (it resumes), the greedy
    stack and each candidate (a combination the registry allows, at the study's batch or doubled) with the largest
    expected improvement under a model fitted to every row measured, while one is worth a trial; the leaders
    measured again, two trials a round, until they separate; the simplest not significantly slower than the
    fastest, its quality checked against the baseline over paired seeds. Writes OUT/plan.md, OUT/plan.json and
    the study's report.html with the search's path (docs/plan.md states the method).
    """
    from trainwise.api import plan as plan_api  # heavy: the study machinery
    from trainwise.report import terminal  # start-up: rich
    from trainwise.report.plan import markdown  # (beside the verb it renders)

    # (the flags named on the line win over --from-config's file, a value equal to the default included)
    result = plan_api.start(o, _study_render(terminal.err if as_json else terminal.out)[1], GIVEN or None)
    if as_json:
        return terminal.out.print_json(json.dumps(result.to_dict()))
    terminal.out.print(markdown(result.to_dict()), markup=False, highlight=False, soft_wrap=True)


@verb(api.EstimateOptions, json_help="Print the estimates as JSON.")
def estimate(o: api.EstimateOptions, as_json: bool) -> None:
    """Predict each plan's peak training memory without training: a breakdown, and whether it fits.

    Shapes come from the model built on the meta device (no weights are loaded). Activations come from
    a measured calibration probe (about 16 tiny forward/backward passes of the model family on this
    machine, ~5-10 s, cached), never from a guess. With the data compare trains on (--train-file or
    --dataset) the classes and, for dynamically padded rows, the lengths come from it.
    """
    terminal, render = _terminal()
    report = estimate_api.start(o, render)
    terminal.out.print_json(json.dumps(report.to_json())) if as_json else terminal.estimate_table(report)


@verb(api.ExportOptions)
def export(o: api.ExportOptions, _json: bool) -> None:
    """Write a plan as TrainingArguments JSON + Python snippet, accelerate config, ds_config.json (ZeRO) and
    the equivalent `trainwise train` command; for causal-lm also TRL's SFTConfig JSON + SFTTrainer script."""
    from trainwise.report.terminal import export_report  # start-up: rich

    done = export_api.start(o)
    export_report(done.row, done.paths, done.notes)


@verb(api.FindBatchOptions, name="find-batch")
def find_batch(o: api.FindBatchOptions, _json: bool) -> None:
    """Find the fastest batch size that fits: climb the candidates, measure samples/s, bisect at the edge."""
    terminal, render = _terminal()
    terminal.find_batch_table(find_batch_api.start(o, dataclasses.replace(render, line=terminal.indented)))


@verb(api.TrainOptions)
def train(o: api.TrainOptions, _json: bool) -> None:
    """Train for real with one plan: periodic eval, best checkpoint, early stopping, resumable checkpoints."""
    terminal, render = _terminal()
    r = train_api.start(o, render)
    from trainwise.training.fit import summary  # torch: loaded by the run, after every check of the input

    for line in summary(r, o.train_config(), o.price()):
        terminal.say(line)


@verb(api.TuneOptions, with_recipe=True)
def tune(o: api.TuneOptions, _json: bool) -> None:
    """Search lr, batch size, weight decay, warm-up, label smoothing (seq2seq: decoding): Optuna random
    search or TPE (resumable, with pruning), or population-based training with Ray Tune."""
    terminal, render = _terminal()
    result, report = tune_api.start(o, render)
    terminal.tune_table(result, report, o.search, monitor_name(o.monitor, o.task), o.out)
    check_some_complete(result)  # exit 1 when no trial produced a value


@verb(api.ReportOptions)
def report(o: api.ReportOptions, _json: bool) -> None:
    """Draw a study's reports again from its results.json: report.html (its table and figures: time against
    memory with the Pareto front, the loss at every step, where a step's time and memory go), report.md,
    results.csv or results.json. Also a study killed mid-way (said to be partial) or written by an earlier release.
    """
    from trainwise.api.report import start  # heavy: the study store

    done = start(o)
    if done.path is None:
        sys.stdout.write(done.text)
    else:
        print(done.path)


@app.command("recipes")
def list_recipes() -> None:
    """List the shipped study files (the five case studies): the question each asked, its rows, and its model
    and data here and in the published run. Run one with `trainwise compare --recipe NAME`."""
    from trainwise.report import terminal  # start-up: rich

    terminal.recipes_table(recipes.all_recipes())


@app.command("strategies")
def list_strategies(
    markdown: Annotated[bool, typer.Option("--markdown", help="Print docs/strategies.md.")] = False,
) -> None:
    """List every strategy with its one-line effect and cost."""
    from trainwise.report import terminal  # start-up: rich

    print(catalogue.markdown(), end="") if markdown else terminal.strategies_table()


@verb(api.DoctorOptions, json_help="Print the report as JSON.")
def doctor(o: api.DoctorOptions, as_json: bool) -> None:
    """What works here: every strategy tried 2 steps on a tiny preset, the device's facts, measured peaks and
    versions (what a bug report quotes). Exit 1 when a strategy the device supports failed."""
    from trainwise.api.doctor import start  # heavy: loads numpy

    terminal, render = _terminal()
    report = start(o, render)
    terminal.out.print_json(json.dumps(report.to_dict())) if as_json else terminal.doctor_table(report)
    report.check_failed()


@verb(api.EnvOptions)
def env(o: api.EnvOptions, _json: bool) -> None:
    """Print the environment trainwise records beside every figure."""
    from trainwise.report import terminal  # start-up: rich

    terminal.out.print_json(json.dumps(env_api.start(o)))


def _interrupted() -> int:
    print(lifeline.interrupted_line(), file=sys.stderr)
    return 130


def main(argv: list[str] | None = None) -> int:
    lifeline.signals_interrupt()  # SIGTERM / SIGHUP: clean up (kill the running trial) like Ctrl-C
    command = typer.main.get_command(app)
    try:
        code = command.main(args=argv, prog_name="trainwise", standalone_mode=False)
    except NoArgsIsHelpError as e:
        print(e.format_message(), file=sys.stderr)  # the help text, several lines on purpose
        return 2
    except (typer.Abort, KeyboardInterrupt):
        _end_live()
        return _interrupted()
    except typer.Exit as e:
        return int(e.exit_code)
    except Exception as e:  # bad input: 2; a run whose every trial failed: 1; a write the machine refused: 3
        line, code = exit_line(e) if not isinstance(e, ClickException) else (e.format_message(), 2)
        _end_live()
        print(f"trainwise: error: {' '.join(line.split())}", file=sys.stderr)
        return code
    if code == 130:  # typer turns Ctrl-C (and lifeline's SIGTERM / SIGHUP) into a silent exit code 130
        _end_live()
        return _interrupted()
    return code if isinstance(code, int) else 0


def _end_live() -> None:
    """A live progress line on the terminal (train's) ends before the error or interrupt line is printed."""
    if (terminal := sys.modules.get("trainwise.report.terminal")) is not None:  # loaded only if it showed something
        terminal.end_live()
