"""`trainwise compare` as a call: options (the CLI's names and defaults) -> a study on disk -> `Study`.

Prepare (every check of the input), run or resume the trials, write the reports and the options the
study ran with (study.yaml: `--config` reruns it), then the quality phase when asked. An --out that
already holds a study is run over, never silently replaced: the same settings resume it or add rows to
it; other settings are refused (`over_study`). A `Render` says how the caller shows progress and tables
(by default progress and notes on stderr; None: nothing).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainwise.api import from_objects
from trainwise.api.options import CompareOptions
from trainwise.api.render import STDERR, Render
from trainwise.api.study import Study
from trainwise.core.config import IMAGE_TASK
from trainwise.core.errors import ConfigError
from trainwise.report.format import headers, table_cells
from trainwise.run import launcher
from trainwise.spec.config import StudyConfig
from trainwise.study import resume
from trainwise.study.store import PAGE, RESULTS, STUDY_FILE, Store, keep_reports, read_results, write_report
from trainwise.training import tracking
from trainwise.training.data.metrics import preloaded
from trainwise.training.job import launch
from trainwise.training.tracking import compare_report_to


def run(
    cfg: StudyConfig,
    price=None,
    quality_phase: tuple[int, int] | None = None,
    render: Render | None = STDERR,
    options: CompareOptions | None = None,
) -> Study:
    """Prepare, run (or resume) and report a study, then its quality phase (steps, seeds). RunFailed when
    the study ran and no trial produced a result. `options`, when given, are saved as the study's file."""
    from trainwise.api.quality import run_quality  # heavy: trainwise.api.quality loads numpy
    from trainwise.study.aggregate import check_some_ok, report  # heavy: trainwise.study.aggregate loads numpy
    from trainwise.study.prepare import prepare_study  # heavy: trainwise.study.prepare loads numpy
    from trainwise.study.run import run_study  # heavy: trainwise.study.run loads numpy

    render = Render.of(render)
    if cfg.ray_address is None:  # (a cluster's trials start in its own workers: a local zygote would idle)
        # the trials' process starts its imports while the data is prepared (the text metrics' where asked)
        launcher.warm(preloaded(cfg.task, cfg.eval_samples))
    with render.status(f"trainwise compare: validating input, preparing data and model ({cfg.task})..."):
        prepared = prepare_study(cfg, render.note)
    if options is not None:
        options.save(prepared.out / STUDY_FILE)
    wandb = _Wandb(render) if options is not None and "wandb" in compare_report_to(options.report_to) else None
    with render.progress(prepared) as (on_event, on_done):

        def write(so_far: list) -> None:
            # the reports are rewritten as each trial is stored: a killed study's finished trials are readable
            report(prepared, so_far, price, quality_phase)
            if wandb is not None:
                wandb.log(lambda: tracking.log_trials(prepared.out, so_far))

        trials = run_study(prepared, launch, on_event, on_done, write)
    # the page is drawn once, when everything it shows is there: after the quality phase when the study has one
    done = report(prepared, trials, price, quality_phase, page=quality_phase is None)
    if wandb is not None:  # the trials stored before (a resumed study's, or a killed one's), and the table
        wandb.log(lambda: tracking.log_trials(prepared.out, trials))
        wandb.log(lambda: _log_table(prepared.out, done, wandb.logged > 0))
    render.table(done)
    check_some_ok(done.table)
    if quality_phase is not None:
        from trainwise.api.report import render as draw  # heavy: the page's figures (matplotlib)

        try:
            run_quality(cfg, done.table, *quality_phase, launch, render.progress, render.quality)
        finally:  # a quality phase that fails or is interrupted still leaves the speed study's page
            write_report(prepared.out, prepared.out / PAGE, draw(prepared.out, "html"))
    return Study(prepared.out)


class _Wandb:
    """compare's W&B logging: what it logged, and a failure said once, after which the study goes on without W&B
    (an unreachable server would otherwise cost W&B's start-up timeout at every trial). Never the loss of the
    study: its trials are stored and its reports written whatever W&B does."""

    def __init__(self, render: Render) -> None:
        self.render, self.logged, self.failed = render, 0, False

    def log(self, do: Callable[[], int | bool]) -> None:
        if self.failed:
            return
        try:
            self.logged += int(do())
        except Exception as e:  # noqa: BLE001  (wandb's own errors: a service that did not start, a full disk)
            self.failed = True
            self.render.note(f"trainwise: warning: --report-to wandb: {type(e).__name__}: {e}; no more W&B runs")


def _log_table(out: Path, done: Any, changed: bool) -> bool:
    return tracking.log_table(out, headers(done.table), table_cells(done.table), changed)


def compare(config: str | Path | None = None, render: Render | None = STDERR, **options: Any) -> Study:
    """`trainwise compare` in Python: the CLI's options as keyword arguments, with its defaults and its
    validation (a bad value is one ConfigError), over a study file's (`config=`). Returns the study
    (`.rows`, `.to_pandas()`, `.advise()`). Progress and notes go to stderr; `render=None`: silence.

    The objects you train with compare as `trainwise.plan` plans them: `trainer=` (a Trainer or SFTTrainer), or
    `model=` (the model object) with `train_dataset=`, `processing_class=` and `args=`: saved once into the study,
    its settings your arguments' (a keyword given wins), its rows the defaults and yours
    (`trainwise.api.from_objects`)."""
    objects = from_objects.pop_objects(options)
    if objects is not None:
        return from_objects.compare(objects, options, config, render, start)
    return start(CompareOptions.of(options, config), render)


def start(options: CompareOptions, render: Render | None = STDERR) -> Study:
    render = Render.of(render)
    options.resolve()  # every value checked first: a bad one is said as such, not as a change to the study
    options = over_study(options, render.note)
    return run(*options.resolve(), render=render, options=options)


def over_study(options: CompareOptions, note=lambda _line: None) -> CompareOptions:
    """The options this run runs with, over the study already in its --out (as given when there is none, or
    when it has no report yet: nothing measured is replaced). The same settings resume it, or add rows to
    it (rows, a price or a quality phase it has stay: `CompareOptions.over`). Other settings would replace
    its report: a ConfigError naming them and the ways out, unless --replace, which keeps the report aside
    (OUT/replaced/N/) first. Checked before anything is written (prepare rewrites the study's data)."""
    out = Path(options.out)
    if not (out / RESULTS).is_file():
        return options
    ways_out = (
        f"choose another --out, or pass --replace to make this run its study (its report is kept in "
        f"{out / 'replaced'}/)"
    )
    try:
        stored = _stored_options(options)
        reported = [r.row_text for r in read_results(out)]
    except ConfigError as e:  # a study file or report this trainwise cannot read (edited, or from another)
        if not options.replace:
            raise ConfigError(f"--out {out} holds a study that cannot be read ({e}): {ways_out}") from None
        return _replace(options, note)
    if stored is None:
        return options
    changed = _changed(options, stored)
    joined, notes = resume.over(options, stored, reported)
    if options.replace:
        return _replace(options, note) if changed or joined != options else options
    if changed:
        raise ConfigError(
            f"--out {out} holds a study measured with other settings ({'; '.join(changed)}) whose report this run "
            f"would replace: {ways_out}; to add rows to it, run it with its own settings: --config "
            f"{out / STUDY_FILE} --strategies ..."
        )
    for line in notes:
        note(line)
    return joined


def _replace(options: CompareOptions, note) -> CompareOptions:
    """--replace: the study in --out keeps its reports aside (OUT/replaced/N/), and this run becomes its study."""

    kept = keep_reports(Path(options.out))
    note(f"trainwise: note: {options.out}: this run replaces its study; the report it had is in {kept}")
    return options


def _stored_options(options: CompareOptions) -> CompareOptions | None:
    """The options the study in `options.out` ran with: its study file; for a study written before it kept
    one (or by advise --run before it did), what its store says of the settings that are options one to one
    (model, task, batch, lengths, steps, lr, seed, device, evaluation, ranks), the rest taken as this run's.
    None when neither says; ConfigError when its study file cannot be read."""
    out = Path(options.out)
    if (out / STUDY_FILE).is_file():
        return CompareOptions.of({}, out / STUDY_FILE)
    spec = Store.spec_of(out)
    if spec is None:
        return None
    # heavy: trainwise.training.models resolves the model (a study without its file only)
    from trainwise.training.models import resolve_model

    s = spec.settings
    same = ("task", "accum_steps", "max_length", "warmup_steps", "lr", "seed", "eval_samples", "nproc")
    values = {k: getattr(s, k) for k in same} | {"device": s.device, "profile": s.profile, "max_steps": spec.steps}
    if not options.batch_sizes:
        values["batch_size"] = s.batch_size
    if s.task == "seq2seq":
        values["max_target_length"] = s.max_target_length
    if s.task != IMAGE_TASK:  # image-classification trains the project's ResNeXt: its preset is in the spec too
        source = resolve_model(options.model, options.model_preset, options.task)
        if (source.kind, source.ref) != (s.model_kind, s.model_ref):  # said as the model options that name it
            preset = s.model_kind == "preset"
            values |= {"model": None if preset else s.model_ref, "model_preset": s.model_ref if preset else None}
    return dataclasses.replace(options, **values)


def _changed(options: CompareOptions, stored: CompareOptions) -> list[str]:
    """`trainwise.study.resume.changed`, with device auto read as the device it resolves to here (a study run with
    auto on a CPU machine and one with --device cpu measure the same)."""
    if "auto" in (options.device, stored.device) and options.device != stored.device:
        from trainwise.study.prepare import resolve_device  # heavy: trainwise.study.prepare loads numpy (and torch)

        here = resolve_device("auto")[0]
        options, stored = (
            dataclasses.replace(o, device=here if o.device == "auto" else o.device) for o in (options, stored)
        )
    return resume.changed(options, stored)
