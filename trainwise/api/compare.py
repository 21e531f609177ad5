"""`trainwise compare` as a call: options (the CLI's names and defaults) -> a study on disk -> `Study`.

Prepare (every check of the input), run or resume the trials, write the reports and the options the
study ran with (study.yaml: `--config` reruns it), then the quality phase when asked. Nothing is printed:
a `Render` says how the caller shows progress and tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainwise.api.options import CompareOptions
from trainwise.api.render import Render
from trainwise.api.study import Study
from trainwise.config import StudyConfig
from trainwise.launcher import launch

STUDY_FILE = "study.yaml"  # the options a study ran with; `--config` reruns it


def run(
    cfg: StudyConfig,
    price=None,
    quality_phase: tuple[int, int] | None = None,
    render: Render = Render(),
    options: CompareOptions | None = None,
) -> Study:
    """Prepare, run (or resume) and report a study, then its quality phase (steps, seeds). RunFailed when
    the study ran and no trial produced a result. `options`, when given, are saved as the study's file."""
    from trainwise.api.quality import run_quality  # heavy: trainwise.api.quality loads numpy
    from trainwise.study import check_some_ok, prepare_study, report, run_study  # heavy: trainwise.study loads numpy

    with render.status(f"trainwise compare: validating input, preparing data and model ({cfg.task})..."):
        prepared = prepare_study(cfg, render.note)
    if options is not None:
        options.save(prepared.out / STUDY_FILE)
    with render.progress(prepared) as (on_event, on_done):
        # the reports are rewritten as each trial is stored: a killed study's finished trials are readable
        write = lambda so_far: report(prepared, so_far, price, quality_phase)  # noqa: E731
        trials = run_study(prepared, launch, on_event, on_done, write)
    done = report(prepared, trials, price, quality_phase)
    render.table(done)
    check_some_ok(done.table)
    if quality_phase is not None:
        run_quality(cfg, done.table, *quality_phase, launch, render.progress, render.quality)
    return Study(prepared.out)


def compare(config: str | Path | None = None, render: Render = Render(), **options: Any) -> Study:
    """`trainwise compare` in Python: the CLI's options as keyword arguments, with its defaults and its
    validation (a bad value is one ConfigError), over a study file's (`config=`). Returns the study
    (`.rows`, `.to_pandas()`, `.advise()`)."""
    return start(CompareOptions.of(options, config), render)


def start(options: CompareOptions, render: Render = Render()) -> Study:
    return run(*options.resolve(), render=render, options=options)
