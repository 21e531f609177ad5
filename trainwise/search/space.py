"""What `trainwise tune` searches over, shared by its Optuna search (trainwise.search.hyperparams) and its
population-based
training (trainwise.search.pbt): the tunable settings and their domains, a search-space file, sampling, applying
sampled values to a trial's spec, and the search's result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from trainwise import strategies
from trainwise.core.errors import ConfigError
from trainwise.spec.config import TrialSpec


@dataclass(frozen=True)
class Domain:
    """What values a tunable takes: its kind and the bounds any value in a space file must respect."""

    kind: str  # "float" | "int"
    low: float = -math.inf
    low_inclusive: bool = True
    high: float = math.inf
    high_inclusive: bool = True

    def check(self, path: str, name: str, value: object) -> float | int:
        """`value` as a number of this domain; ConfigError naming the file, the parameter and the value.
        A string that reads as a number is one: YAML 1.1 loads `1e-5` (no dot) as the string '1e-5'."""
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                value = float(value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"--space {path}: {name}: {value!r} is not a number")
        if not math.isfinite(value):
            raise ConfigError(f"--space {path}: {name}: {value!r} is not a finite number")
        if self.kind == "int" and value != int(value):
            raise ConfigError(f"--space {path}: {name}: {value!r} is not a whole number")
        above = value >= self.low if self.low_inclusive else value > self.low
        below = value <= self.high if self.high_inclusive else value < self.high
        if not (above and below):
            raise ConfigError(f"--space {path}: {name}: {value!r} is out of range (must be {self.describe()})")
        return int(value) if self.kind == "int" else float(value)

    def describe(self) -> str:
        parts = []
        if self.low > -math.inf:
            parts.append(f"{'>=' if self.low_inclusive else '>'} {self.low:g}")
        if self.high < math.inf:
            parts.append(f"{'<=' if self.high_inclusive else '<'} {self.high:g}")
        return " and ".join(parts) or "finite"


# parameter -> the values it takes. Ranges come from the space file, within these domains.
PARAMS = {
    "lr": Domain("float", 0.0, low_inclusive=False),
    "batch_size": Domain("int", 1),
    "weight_decay": Domain("float", 0.0),
    "warmup_ratio": Domain("float", 0.0, high=1.0, high_inclusive=False),
    "label_smoothing": Domain("float", 0.0, high=1.0, high_inclusive=False),
    # seq2seq decoding at evaluation (what ROUGE/BLEU is measured with)
    "num_beams": Domain("int", 1, high=64),
    "length_penalty": Domain("float"),
}
DECODING = ("num_beams", "length_penalty")
SEARCHES = ("random", "tpe", "pbt")


@dataclass(frozen=True)
class Param:
    name: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: tuple | None = None


def load_space(path: str) -> list[Param]:
    """Parse and validate a search space file (YAML or JSON), or the same mapping written inline (`{lr: {low:
    1e-5, high: 1e-3}}`: a study file, a shipped recipe, that carries its space):

    lr: {low: 1.0e-5, high: 1.0e-3, log: true}
    batch_size: {choices: [8, 16, 32]}
    weight_decay: {low: 0.0, high: 0.1}
    """

    p = Path(path)
    inline = path.lstrip().startswith("{")
    if not inline and not p.is_file():
        raise ConfigError(f"--space {path}: not found")
    try:
        raw = yaml.safe_load(path if inline else p.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"--space {path}: not YAML ({' '.join(str(e).split())})") from None
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"--space {path}: expected a mapping of parameters, e.g. lr: {{low: 1e-5, high: 1e-3}}")
    space = []
    for name, spec in raw.items():
        if name not in PARAMS:
            raise ConfigError(f"--space {path}: unknown parameter {name!r}; known: {', '.join(PARAMS)}")
        if not isinstance(spec, dict):
            raise ConfigError(f"--space {path}: {name} needs {{low, high[, log]}} or {{choices: [...]}}")
        domain = PARAMS[name]
        fields = {"choices"} if "choices" in spec else {"low", "high", "log"}
        unknown = sorted(map(str, set(spec) - fields))
        if unknown:
            raise ConfigError(f"--space {path}: {name}: unknown field {unknown[0]!r}; use {', '.join(sorted(fields))}")
        if "choices" in spec:
            choices = spec["choices"]
            if not isinstance(choices, list) or not choices:
                raise ConfigError(f"--space {path}: {name}: choices must be a non-empty list")
            space.append(Param(name, choices=tuple(domain.check(path, name, choice) for choice in choices)))
            continue
        if "low" not in spec or "high" not in spec:
            raise ConfigError(f"--space {path}: {name} needs numeric low and high")
        low, high = domain.check(path, name, spec["low"]), domain.check(path, name, spec["high"])
        if not low < high:
            raise ConfigError(f"--space {path}: {name}: empty range (low {low:g} >= high {high:g})")
        log = bool(spec.get("log", False))
        if log and low <= 0:
            raise ConfigError(f"--space {path}: {name}: a log-scale range must be > 0, got [{low:g}, {high:g}]")
        space.append(Param(name, low, high, log))
    return space


def check_search(search: str) -> None:
    if search not in SEARCHES:
        raise ConfigError(f"--search must be one of {', '.join(SEARCHES)}, not {search!r}")


def check_task(space: list[Param], task: str) -> None:
    decoding = [p.name for p in space if p.name in DECODING]
    if decoding and task != "seq2seq":
        raise ConfigError(f"{', '.join(decoding)}: decoding parameters apply to --task seq2seq only, not {task}")


def sample(trial, space: list[Param]) -> dict:
    values = {}
    for p in space:
        if p.choices is not None:
            values[p.name] = trial.suggest_categorical(p.name, list(p.choices))
            continue
        assert p.low is not None and p.high is not None, "load_space gives ranges their bounds"
        if PARAMS[p.name].kind == "int":
            values[p.name] = trial.suggest_int(p.name, int(p.low), int(p.high), log=p.log)
        else:
            values[p.name] = trial.suggest_float(p.name, p.low, p.high, log=p.log)
    return values


def apply(spec: TrialSpec, values: dict) -> TrialSpec:
    """The trial's spec: the sampled values in its settings (batch_size stays a multiple of accum)."""

    s = spec.settings
    changes = dict(values)
    if "batch_size" in changes:
        b = int(changes["batch_size"])
        accum = strategies.runtime(spec.plan, s.task, s.device).accum_steps
        if b % accum:
            raise ConfigError(f"batch_size {b} is not a multiple of the plan's accumulation {accum}")
        changes["batch_size"] = b
    return dataclasses.replace(spec, settings=dataclasses.replace(s, **changes))


@dataclass
class TuneResult:
    best_value: float | None
    best_params: dict
    trials: list[dict]  # number, state, value, params, steps
    curve: list[tuple[int, float]]  # (cumulative optimizer steps, best value so far)
    mutations: list[dict] = field(default_factory=list)  # pbt: exploit/explore decisions
    machine_s: float = 0.0  # the time the machine was busy with the study (every session of it)
