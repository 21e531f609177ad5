"""`trainwise compare` as a call: options (the CLI's names and defaults) -> a study on disk -> `Study`.

Prepare (every check of the input), run or resume the trials, write the reports, then the quality phase
when asked. Nothing is printed: a `Render` says how the caller shows progress and tables (the CLI's is
rich on the terminal; the default shows nothing, and a notebook reads the returned `Study`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any

from trainwise.api.study import Study
from trainwise.config import StudyConfig
from trainwise.errors import ConfigError, check_names
from trainwise.strategies import DEFAULT_STRATEGIES

_STUDY: dict[str, Any] = {f.name: f.default for f in fields(StudyConfig) if f.init}  # the shared defaults


@dataclass(frozen=True)
class CompareOptions:
    """Every option of `trainwise compare`, with its default: the CLI's flags and `trainwise.compare`'s
    keyword arguments are these names (`--max-steps` is `max_steps`). Lists may be given as Python lists or
    as the CLI's comma text."""

    model: str | None = None
    model_preset: str | None = None
    task: str = _STUDY["task"]
    dataset: str | None = None
    train_file: str | None = None
    eval_file: str | None = None
    text_column: str | None = None
    target_column: str | None = None
    strategies: str | list[str] = DEFAULT_STRATEGIES
    batch_size: int = 16
    accum_steps: int = _STUDY["accum_steps"]
    max_length: int = _STUDY["max_length"]
    max_target_length: int = _STUDY["max_target_length"]
    max_steps: int = _STUDY["max_steps"]
    warmup_steps: int = _STUDY["warmup_steps"]
    repeat: int = _STUDY["repeat"]
    remeasure: bool = True
    lr: float | None = None
    seed: int = _STUDY["seed"]
    device: str = "auto"
    out: str = "runs/compare"
    trial_timeout: float = 900.0
    eval_samples: int = _STUDY["eval_samples"]
    max_train_samples: int | None = None
    retry_failed: bool = False
    retries: int = _STUDY["retries"]
    force: bool = False
    batch_sizes: str | list[int] | None = None
    num_workers: str | int | list[int] = "0"
    nproc: int = 1
    image_size: int = 32
    price_per_hour: float | None = None
    sku: str | None = None
    price_file: str | None = None
    low_priority: bool = False
    preemptions_per_hour: float = 0.5
    checkpoint_minutes: float = 30.0
    profile: bool = False
    quality_steps: int | None = None
    seeds: int = 2

    @classmethod
    def of(cls, options: dict[str, Any]) -> CompareOptions:
        """From keyword arguments or the CLI's parsed options; an unknown name is one ConfigError that
        names the closest valid one."""
        check_names("compare", options, {f.name for f in fields(cls)})
        return cls(**options)

    def resolve(self) -> tuple[StudyConfig, Any, tuple[int, int] | None]:
        """(the StudyConfig, the price or None, (quality steps, seeds) or None), every value validated."""
        from trainwise import quality
        from trainwise.cost import resolve_price

        quality.check(self.quality_steps, self.seeds)
        values = {k: v for k, v in dataclasses.asdict(self).items() if k in _STUDY}
        values["strategies"] = _words(self.strategies)
        values["batch_sizes"] = _ints(self.batch_sizes, "--batch-sizes") if self.batch_sizes else ()
        values["num_workers"] = _ints(self.num_workers, "--num-workers")
        cfg = StudyConfig(**values)
        price = resolve_price(
            self.price_per_hour,
            self.sku,
            self.price_file,
            self.low_priority,
            self.preemptions_per_hour,
            self.checkpoint_minutes,
        )
        return cfg, price, (self.quality_steps, self.seeds) if self.quality_steps else None


def _words(value: str | list[str]) -> list[str]:
    return value.split(",") if isinstance(value, str) else list(value)


def _ints(value: Any, option: str) -> tuple[int, ...]:
    """8,16,32 (text, a list or one number) -> (8, 16, 32), duplicates dropped; ConfigError otherwise."""
    items = value.split(",") if isinstance(value, str) else value if isinstance(value, list | tuple) else [value]
    try:
        values = tuple(dict.fromkeys(int(x) for x in items if str(x).strip()))
    except (TypeError, ValueError):
        raise ConfigError(f"{option} {value!r}: give whole numbers like 8,16,32") from None
    if not values:
        raise ConfigError(f"{option} {value!r}: give whole numbers like 8,16,32")
    return values


@contextlib.contextmanager
def _silent(_prepared: Any) -> Iterator[tuple[Callable, Callable]]:
    yield (lambda *_: None), (lambda *_: None)


@dataclass(frozen=True)
class Render:
    """How a caller shows a running compare; each part defaults to showing nothing.
    progress(prepared) is a context manager giving (on_event(spec, event), on_done(spec, result, stored));
    table(report) shows the study's table; quality(rows, seeds) the quality phase's verdicts;
    status(text) is a context manager shown while the input is checked and prepared; note(line) shows
    what the user should know about the input (rows skipped, a head trained new)."""

    progress: Callable = _silent
    table: Callable[[Any], None] = lambda _report: None
    quality: Callable[[list, int], None] = lambda _rows, _seeds: None
    status: Callable[[str], Any] = lambda _text: contextlib.nullcontext()
    note: Callable[[str], None] = lambda _line: None


def run(cfg: StudyConfig, price=None, quality_phase: tuple[int, int] | None = None, render: Render = Render()) -> Study:
    """Prepare, run (or resume) and report a study, then its quality phase (steps, seeds). RunFailed when
    the study ran and no trial produced a result."""
    from trainwise.api.quality import run_quality
    from trainwise.launcher import launch
    from trainwise.study import check_some_ok, prepare_study, report, run_study

    with render.status(f"trainwise compare: validating input, preparing data and model ({cfg.task})..."):
        prepared = prepare_study(cfg, render.note)
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


def compare(render: Render = Render(), **options: Any) -> Study:
    """`trainwise compare` in Python: the CLI's options as keyword arguments, with its defaults and its
    validation (a bad value is one ConfigError). Returns the study (`.rows`, `.to_pandas()`, `.advise()`)."""
    return run(*CompareOptions.of(options).resolve(), render=render)
