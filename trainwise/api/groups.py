"""What every verb's options share (trainwise.api.options holds one class per verb): `Options`, their one checked
construction from keyword arguments, the CLI's given flags or a study file (names, types, a `config=` YAML file), and
the groups of options several verbs share: a study's (ModelData, Shape, Training, Measurement, Scale: declared in
trainwise/spec/groups.py, given here the sweeps' text forms) and the price and the limits (Priced, Limits, declared
here), each option declared once."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

import yaml

from trainwise.core.errors import ConfigError, check_names
from trainwise.core.files import write_atomic
from trainwise.core.option import PRICE, flag, option, take, words
from trainwise.search import ranking
from trainwise.search.cost import resolve_price
from trainwise.spec import groups as spec
from trainwise.spec.config import StudyConfig

_STUDY: dict[str, Any] = {f.name: f.default for f in fields(StudyConfig) if f.init}  # the shared defaults
PATHS = ("out", "train_file", "eval_file", "price_file", "space", "study", "plan_study")  # absolute in a study file
REPLACE = (
    "Run into an --out whose study was measured with other settings (refused otherwise): this run becomes its "
    "study; the report it had is kept in OUT/replaced/N/, its trials in the store."
)
# options that name the same thing another way: one given (a flag, a keyword) drops the study file's other way, whole
# (--model-preset over a recipe's model; --dataset over a file's train_file drops its eval_file too)
REPLACES = {
    "model": ("model_preset",),
    "model_preset": ("model",),
    "dataset": ("train_file", "eval_file"),
    "train_file": ("dataset",),
}


@dataclass(frozen=True, kw_only=True)
class Options:
    """What every verb's options share: checked construction from keyword arguments or a study file."""

    VERB: ClassVar[str] = ""

    @classmethod
    def of(cls, options: Mapping[str, Any] | None = None, config: str | Path | None = None) -> Any:
        """From keyword arguments (or the CLI's given flags) over a YAML study file's keys over the defaults.
        An unknown name, a value of the wrong type or an unreadable file is one ConfigError."""
        values = read_config(config, cls) if config is not None else {}
        given = dict(options or {})
        check_names(cls.VERB, given, {f.name for f in given_fields(cls)})
        dropped = {k for name, others in REPLACES.items() if given.get(name) is not None for k in others}
        values = {k: v for k, v in values.items() if k not in dropped}
        values.update(given)
        hints = typing.get_type_hints(cls)
        for name, value in values.items():
            check_type(name, value, hints[name], f" (in {config})" if name not in given else "")
        missing = [f.name for f in given_fields(cls) if f.name not in values and f.default is dataclasses.MISSING]
        if missing:
            raise ConfigError(
                f"{cls.VERB}: --{missing[0].replace('_', '-')} is required (a flag, or a key of --config)"
            )
        return cls(**values)

    @classmethod
    def ordered(cls) -> list[dataclasses.Field]:
        """The options in --help's order (a study file's too): the model and the data first, then the verb's own,
        then the groups it shares."""
        first = {f.name for f in fields(spec.ModelData)}
        shared: tuple[type, ...] = (spec.Batch, spec.Lengths, spec.Shape, spec.Training, spec.Measurement, spec.Scale)
        shared += (Shape, Training, Measurement, Scale, Priced, Limits)

        def owner(name: str) -> type:  # the class that declares the field (re-stated: the last to)
            return next(c for c in cls.__mro__ if name in c.__dict__.get("__annotations__", {}))

        return sorted(given_fields(cls), key=lambda f: (f.name not in first, owner(f.name) in shared))

    def study_config(self, **fixed: Any) -> StudyConfig:
        """The StudyConfig of a verb: its options named like StudyConfig fields, then the verb's own values."""
        values = {k: v for k, v in dataclasses.asdict(self).items() if k in _STUDY and k not in fixed}
        if "strategies" in values:
            values["strategies"] = words(values["strategies"])
        return StudyConfig(**values, **fixed)

    def to_file(self) -> dict[str, Any]:
        """The options as a study file's keys: every one, with paths made absolute so the file reruns the
        same run from any directory."""
        once = {f.name for f in fields(self) if f.metadata.get("saved") is False}  # this run's alone (--replace)
        values = {f.name: getattr(self, f.name) for f in given_fields(self) if f.name not in once}
        order = [f.name for f in self.ordered()]
        values = {k: values[k] for k in sorted(values, key=order.index)}  # as --help
        for name in PATHS:
            if isinstance(values.get(name), str) and not values[name].lstrip().startswith("{"):  # an inline space
                values[name] = str(Path(values[name]).resolve())
        for name in ("model", "dataset"):  # a local directory (a hub id stays as given)
            if isinstance(values.get(name), str) and Path(values[name]).is_dir():
                values[name] = str(Path(values[name]).resolve())
        return values

    def save(self, path: Path) -> None:
        header = f"# trainwise {self.VERB} --config {path.name}: the options this run used (flags win over it)\n"
        write_atomic(path, header + yaml.safe_dump(self.to_file(), sort_keys=False))


def given_fields(cls: Any) -> list[dataclasses.Field]:
    """The options of a verb: its fields declared as options (not those of a library config it inherits that the
    config works out, as FindBatchConfig's sizes, or that another caller sets, as TrainConfig's checkpoints)."""
    return [f for f in fields(cls) if f.init and "help" in f.metadata]


def read_config(path: str | Path, cls: type[Options]) -> dict[str, Any]:
    """A study file: a YAML mapping of option names (`max_steps` or `max-steps`) to values."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--config {path}: no such file")
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as e:
        raise ConfigError(f"--config {path}: not a readable YAML file ({' '.join(str(e).split())[:120]})") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"--config {path}: expected option names and values (a mapping), got {type(raw).__name__}")
    known = {f.name for f in given_fields(cls)}
    values = {}
    for key, value in raw.items():
        name = str(key).replace("-", "_")
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"--config {path}: unknown key {key!r} for {cls.VERB}{hint}")
        values[name] = value
    return values


def _accepts(value: Any, hint: Any) -> bool:
    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_accepts(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin in (list, tuple):
        (item, *_) = typing.get_args(hint) or (Any,)
        return isinstance(value, list | tuple) and all(_accepts(v, item) for v in value)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _described(hint: Any) -> str:
    names = {int: "a whole number", float: "a number", bool: "true or false", str: "text", type(None): "nothing"}
    parts = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    return " or ".join(names.get(p, "a list") for p in parts)


def check_type(name: str, value: Any, hint: Any, where: str = "") -> None:
    if not _accepts(value, hint):
        raise ConfigError(f"--{name.replace('_', '-')}{where}: expected {_described(hint)}, got {value!r}")


# ---- the groups of options several verbs share ----------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Priced(Options):
    """Cost: a price per hour, or a SKU of the price table (trainwise.search.cost validates them)."""

    price_per_hour: float | None = option(
        None, "Cost: machine price in USD per hour (or --sku from the price table).", role=PRICE
    )
    sku: str | None = option(None, "Cost: a machine in the price table (built in: ND40rs_v2, seed 000).", role=PRICE)
    price_file: str | None = option(
        None, 'Cost: JSON adding/overriding SKUs: {"NAME": {"dedicated": 3.1, "low_priority": 0.6}}.', role=PRICE
    )
    low_priority: bool = flag(
        "low-priority", "Cost: the SKU's low-priority (spot) price, plus expected re-work.", role=PRICE
    )
    preemptions_per_hour: float = option(0.5, "Cost, low-priority: preemptions per hour (an assumption).", role=PRICE)

    def priced(self) -> bool:
        """Whether a price is given (a SKU, a price per hour or a price file)."""
        return any(v is not None for v in (self.price_per_hour, self.sku, self.price_file))

    def price(self, checkpoint_minutes: float = 0.0):
        values = (self.price_per_hour, self.sku, self.price_file, self.low_priority, self.preemptions_per_hour)
        return resolve_price(*values, checkpoint_minutes)


# ---- the groups of a study (trainwise/spec/groups.py, StudyConfig's) as verbs' options ------------------------------
@dataclass(frozen=True, kw_only=True)
class ModelData(spec.ModelData, Options):
    """The model and the data a study or a run trains (compare, plan, train, tune, advise --run): shown first by
    --help."""


@dataclass(frozen=True, kw_only=True)
class Shape(spec.Shape, Options):
    """What a step holds: the batch, its micro-batches and the lengths (compare, plan, train)."""


@dataclass(frozen=True, kw_only=True)
class Training(spec.Training, Options):
    """How a run trains and is evaluated, whatever the verb (compare, plan, train)."""


@dataclass(frozen=True, kw_only=True)
class Measurement(spec.Measurement, Options):
    """How a study measures its rows: the trials' steps, repeats, timeouts and re-runs (compare, plan)."""

    max_steps: int = take(spec.Measurement, "max_steps")  # a study's trials count their steps (train's may not)


@dataclass(frozen=True, kw_only=True)
class Scale(spec.Scale, Options):
    """Where a study's trials run: sweeps of batch and workers, nodes of a Ray cluster (compare, plan). The sweeps
    are given as comma text or lists (StudyConfig holds them parsed)."""

    batch_sizes: str | list[int] | None = take(StudyConfig, "batch_sizes")
    num_workers: str | int | list[int] = take(StudyConfig, "num_workers")


@dataclass(frozen=True, kw_only=True)
class Limits(Options):
    """What a pick must satisfy and what it optimises (advise, plan): trainwise.search.ranking.Constraints checks
    them."""

    objective: str = option("time", "What to optimise: time, cost or quality.")
    memory_budget: str | None = option(None, "Largest acceptable peak memory, e.g. 11GB, 900MiB.")
    max_quality_drop: float | None = option(None, "Largest acceptable quality drop, in its units.")
    max_epoch_time: str | None = option(None, "Time budget: longest acceptable epoch, e.g. 30m, 2h.")
    max_epoch_cost: float | None = option(None, "Cost budget: USD per epoch (a priced study).")

    def constraints(self) -> ranking.Constraints:
        """The limits as trainwise.search.ranking.Constraints, each value checked."""
        return ranking.Constraints.of({f.name: getattr(self, f.name) for f in fields(Limits)})


CONSTRAINTS = tuple(f.name for f in fields(Limits))  # advise's and plan's limits, by name
