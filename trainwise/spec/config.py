"""What a study and its trials are, their rows parsed with the strategy registry. `StudyConfig` is what the user
asked for (one `compare`, `train`, `tune` or `find-batch` command), validated once: its rows are parsed here. A `Cell`
is one row at one batch size and worker count; a `TrialSpec` is one trial: a row, a repeat index, the plan the row
parsed to, and the study's shared `TrialSettings` (trainwise/core/config.py), with the key a study resumes by."""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

from trainwise import strategies
from trainwise.core.config import (
    CAUSAL_LM,
    DEFAULT_LR,
    DEVICES,
    ROWS_HELP,
    SETTINGS_DEFAULTS,
    TASKS,
    Sweep,
    TrialSettings,
    check_lm_columns,
    check_nproc,
    check_seed,
)
from trainwise.core.errors import ConfigError, check_number
from trainwise.core.option import ROWS, RUN, option
from trainwise.spec.groups import Measurement, ModelData, Scale, Shape, Training
from trainwise.strategies import Row
from trainwise.strategies.knobs import TrialPlan
from trainwise.strategies.memory import ACCUM

# StudyConfig fields that say how a command runs, not what it measures: a rerun leaves them out
_NOT_OPTIONS = {"retry_failed", "force", "fit_to_device", "seed_per_repeat", "quiet_wait_s"}


@dataclass(frozen=True)
class StudyConfig(Scale, Measurement, Training, Shape, ModelData):
    """One `trainwise compare` invocation (and the one-row study `train`, `tune` and `find-batch` run). Defaults
    are the built-in offline demo study. Its options are declared once, in its groups (trainwise/spec/groups.py:
    ModelData, Shape, Training, Measurement, Scale) and its own rows and --out below; the verbs' options
    (api/options.py) inherit the same groups. Validated once, here; frozen: `dataclasses.replace` makes another."""

    out: str = option(
        "runs/compare",
        "Study directory (store, reports); the same command again resumes.",
        role=RUN,
        config_default=MISSING,
    )
    strategies: list[str] = option(
        strategies.DEFAULT_STRATEGIES,
        ROWS_HELP,
        show_default=strategies.shown(strategies.DEFAULT_STRATEGIES),
        role=ROWS,
        config_default=MISSING,
    )
    # swept dimensions: every row runs at each batch size and each DataLoader worker count (the options' comma
    # text, parsed by api/options.py)
    batch_sizes: tuple[int, ...] = option(  # empty: just batch_size
        None, "Sweep: every row at each batch size, e.g. 8,16,32,64.", config_default=()
    )
    num_workers: tuple[int, ...] = option("0", "Sweep: DataLoader worker counts, e.g. 0,1,2,4,8.", config_default=(0,))
    seed_per_repeat: bool = False  # the quality phase: repeat r trains with seed + r (a seed spread, not timing)
    # default rows: an emulated slow precision is recorded, not trained, and `all` takes the device's best
    # precision; None: True when `strategies` hold every default row (a study of the default rows, or one with
    # rows added to it); only the default rows are fitted (a row the user names is trained)
    fit_to_device: bool | None = None
    quiet_wait_s: float = 120.0  # how long to wait for the load to drop before each re-run

    rows: list[Row] = field(init=False)  # `strategies`, parsed once

    def cells(self) -> list[Cell]:
        """Every row at every swept batch size (a row's own, `bf16@bs32`, instead) and worker count, in order."""
        sweep = Sweep(len(self.batch_sizes) > 1, len(self.num_workers) > 1)
        sizes = self.batch_sizes or (self.batch_size,)
        return [
            Cell(row, b, w, sweep)
            for row in self.rows
            for b in ((row.batch_size,) if row.batch_size else sizes)
            for w in self.num_workers
        ]

    def command(self, verb: str = "compare", extra: tuple[str, ...] = ()) -> str:
        """The command line that runs this config again: every option that differs from the CLI's default
        (--out, files and local model directories made absolute, so it runs from any directory), then
        `extra` (the options that are not the config's: price, quality phase)."""

        words = ["trainwise", verb]
        first = ("out", "strategies")  # then the groups' options, model and data first, as --help lists them
        for f in sorted(fields(self), key=lambda f: f.name not in first):
            value = getattr(self, f.name)
            if not f.init or f.name in _NOT_OPTIONS:
                continue
            default: object = f.default
            if f.name == "strategies":
                value, default = ",".join(s.strip() for s in value), strategies.DEFAULT_STRATEGIES
            elif f.name == "lr":
                default = DEFAULT_LR[self.task]
            if value == default:
                continue
            flag = "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                words.append(flag if value else flag.replace("--", "--no-", 1))
                continue
            if f.name in ("out", "train_file", "eval_file") or (f.name == "model" and Path(value).is_dir()):
                value = str(Path(value).resolve())
            words += [flag, ",".join(map(str, value)) if isinstance(value, tuple) else str(value)]
        return shlex.join([*words, *extra])

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ConfigError(f"--task must be one of {', '.join(TASKS)}, not {self.task!r}")
        if self.device not in DEVICES:
            raise ConfigError(f"--device must be one of {', '.join(DEVICES)}, not {self.device!r}")
        for name in ("batch_size", "max_steps", "max_length", "max_target_length", "repeat", "accum_steps"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be > 0, got {value}")
        if not 0 <= self.retries <= 10:
            raise ConfigError(f"--retries must be between 0 and 10, got {self.retries}")
        if self.truncation not in ("", "keep_start", "keep_end"):
            raise ConfigError(f"--truncation must be keep_start or keep_end, not {self.truncation!r}")
        if self.truncation and self.task != "causal-lm":
            raise ConfigError(f"--truncation {self.truncation} applies to --task causal-lm only")
        if self.eval_samples < 0:
            raise ConfigError(f"--eval-samples must be >= 0, got {self.eval_samples}")
        if self.image_size <= 0:
            raise ConfigError(f"--image-size must be > 0, got {self.image_size}")
        if self.max_train_samples is not None and self.max_train_samples <= 0:
            raise ConfigError(f"--max-train-samples must be > 0, got {self.max_train_samples}")
        if self.warmup_steps < 0 or (self.max_steps is not None and self.warmup_steps >= self.max_steps):
            raise ConfigError(
                f"--warmup-steps must be >= 0 and < --max-steps ({self.max_steps}) so that some steps "
                f"are timed, got {self.warmup_steps}"
            )
        lr = DEFAULT_LR[self.task] if self.lr is None else self.lr
        object.__setattr__(self, "lr", lr)
        check_number("--lr", lr)
        check_number("--trial-timeout", self.trial_timeout)
        check_seed(self.seed)
        if not self.strategies or not any(s.strip() for s in self.strategies):
            raise ConfigError("--strategies: no rows given; e.g. --strategies baseline,bf16")
        if self.model and self.model_preset:
            raise ConfigError("give either --model or --model-preset, not both")
        columns = (self.prompt_column, self.response_column, self.target_column, self.messages_column)
        check_lm_columns(self.task, *columns, self.text_column)
        if self.task == CAUSAL_LM and self.max_length < 2:
            raise ConfigError(f"--max-length must be >= 2 for causal-lm (a token and the next), got {self.max_length}")
        if self.dataset and self.train_file:
            raise ConfigError("give either --dataset or --train-file, not both")
        if self.eval_file and not self.train_file:
            raise ConfigError("--eval-file needs --train-file")
        if any(b <= 0 for b in self.batch_sizes):
            raise ConfigError(f"--batch-sizes must all be > 0, got {','.join(map(str, self.batch_sizes))}")
        check_nproc(self.nproc)
        if not 1 <= self.nodes_per_trial <= 64:
            raise ConfigError(f"--nodes-per-trial must be between 1 and 64, got {self.nodes_per_trial}")
        if self.nodes_per_trial > 1 and self.ray_address is None:
            raise ConfigError("--nodes-per-trial spans the nodes of a Ray cluster: give --ray-address too")
        if not self.num_workers or any(w < 0 for w in self.num_workers):
            raise ConfigError(f"--num-workers must all be >= 0, got {','.join(map(str, self.num_workers))}")
        given = [s.strip() for s in self.strategies]
        if self.task in strategies.TASK_DEFAULTS and given[: len(strategies.DEFAULT_ROWS)] == list(
            strategies.DEFAULT_ROWS
        ):
            # the text tasks' default rows on a task with its own: that task's (rows added after them stay)
            rows = [*strategies.default_rows(self.task), *given[len(strategies.DEFAULT_ROWS) :]]
            object.__setattr__(self, "strategies", rows)
        object.__setattr__(self, "rows", strategies.parse_rows(self.strategies, self.accum_steps))
        if self.fit_to_device is None:
            fits = set(strategies.default_rows(self.task)) <= {s.strip() for s in self.strategies}
            object.__setattr__(self, "fit_to_device", fits)
        for size in self.batch_sizes or (self.batch_size,):
            for row in self.rows:
                check_accum(row, row.batch_size or size)


def check_accum(row: Row, batch_size: int) -> None:
    """A row with accumulation splits the batch into its micro-batches: it must divide evenly."""
    accum = row.plan[ACCUM]
    if batch_size % accum:
        raise ConfigError(
            f"{row.text!r} splits batch size {batch_size} into --accum-steps {accum} micro-batches: "
            "the batch size must be a multiple of the accumulation steps"
        )


@dataclass(frozen=True)
class Cell:
    """One cell of a study: a row at one batch size and DataLoader worker count."""

    row: Row
    batch_size: int
    workers: int
    sweep: Sweep = Sweep()

    def label(self) -> str:
        """The cell's name in tables: the row, plus the swept values when there is a sweep."""
        return (
            self.row.text
            + (f" @bs{self.batch_size}" if self.sweep.batch_sizes and not self.row.batch_size else "")
            + (f" @w{self.workers}" if self.sweep.workers else "")
        )

    def matches(self, spec: TrialSpec) -> bool:
        s = spec.settings
        return (spec.row, s.batch_size, s.num_workers) == (self.row.text, self.batch_size, self.workers)


@dataclass(frozen=True)
class TrialSpec:
    row: str  # the row as written (Row.text); `plan` is what it parsed to
    repeat: int
    plan: TrialPlan
    settings: TrialSettings
    extra: dict[str, str] = field(default_factory=dict)
    # a compare trial's optimizer steps, warm-up included; None where the run's own schedule says (train, tune)
    steps: int | None = None

    def to_dict(self) -> dict[str, object]:
        settings = asdict(self.settings)
        if self.steps is not None:  # where a release before issue 35 reads them (its TrialSettings requires them)
            settings["max_steps"] = self.steps
        return {
            "row": self.row,
            "repeat": self.repeat,
            "plan": self.plan.to_dict(),
            "settings": settings,
            "extra": dict(self.extra),
            "steps": self.steps,
        }

    @classmethod
    def from_dict(cls, d: dict) -> TrialSpec:
        settings = dict(d["settings"])
        placed = settings.pop("max_steps", None)  # stores written before issue 35 kept the steps in the settings
        return cls(
            row=d["row"] if "row" in d else d["strategy"],  # stores written before 0.2 said "strategy"
            repeat=int(d["repeat"]),
            plan=TrialPlan.from_dict(d["plan"]),
            settings=TrialSettings(**settings),
            extra=dict(d.get("extra", {})),
            steps=d.get("steps", placed),
        )

    def key(self) -> str:
        """Stable identity of a trial: same command -> same keys, so a re-run resumes. Fields at their
        default values are left out, so adding a field (with a default) keeps existing studies' keys."""
        settings = {k: v for k, v in asdict(self.settings).items() if SETTINGS_DEFAULTS.get(k, MISSING) != v}
        if self.steps is not None:  # where the settings held it before issue 35: existing studies keep their keys
            settings["max_steps"] = self.steps
        d = {
            "strategy": self.row,  # the name keys have always used: existing studies keep their keys
            "repeat": self.repeat,
            "plan": self.plan.changed(),
            "settings": settings,
            "extra": dict(self.extra),
        }
        blob = json.dumps(d, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]
