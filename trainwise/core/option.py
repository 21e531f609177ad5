"""An option, declared once: a field carries its help, its CLI flags and its default (`option`), so that the
CLI's flag, the Python API's keyword argument and a study file's key are made from the one declaration. Options
are declared in the groups several verbs share (trainwise/spec/groups.py: ModelData, Shape, Training, ...) or in
the library config that reads them (TuneConfig, FindBatchConfig, ...), and a verb's options inherit those classes:

    max_steps: int | None = option(16, "Optimizer steps per trial, warm-up included.")   # spec/groups.py
    class CompareOptions(Scale, Measurement, Training, Shape, ModelData, Priced): ...   # api/options.py

A class that offers an option it does not inherit, or offers it with its own default (`default=`), its own words
(`help=`) or another type (the CLI's text for a config's parsed value), re-states the field with `take`, which
copies the declaration and names it in the metadata's `source`; `config_default=` is the library config's value
where it is not the option's (the CLI's text `"0"` is the config's `(0,)`; MISSING where the config needs it
given). tests/api/test_options.py checks that the CLI, the API and the configs agree.
"""

from __future__ import annotations

from dataclasses import MISSING, Field, field, fields
from typing import Any

from trainwise.core.errors import ConfigError

# What an option is to the study already in compare's --out (its `role`). An option with none defines the
# measurement (model, data, batch, lengths, steps, device, seed, ...): another value is another study, refused
# over a study's report unless --replace. ROWS adds rows to the study; PRICE and QUALITY add to its report (a run
# that gives none keeps the study's); RUN says how this run runs, not what it measures.
ROWS, PRICE, QUALITY, RUN = "rows", "price", "quality", "run"
_SAME: Any = object()  # config_default not given: the config's default is the option's


def option(
    default: Any = MISSING,
    help: str = "",
    *flags: str,
    show_default: Any = None,
    config_default: Any = _SAME,
    **more: Any,
) -> Any:
    """The field of an option: its default, its help, its CLI flags (when not the field's name) and more
    metadata (`role`, `saved`, `argument`, `metavar`). `config_default`: the field's own default where it is
    not the option's (MISSING: the config's caller gives it)."""
    meta = {"help": help, "flags": flags, "show_default": show_default, "default": default, **more}
    return field(default=default if config_default is _SAME else config_default, metadata=meta)


def flag(name: str, help: str, **more: Any) -> Any:
    """A switch that is off unless given (`--force`), with no --no- form."""
    return option(False, help, f"--{name}", **more)


def declared(config: type, name: str) -> Field:
    """The field `name` of `config` that is an option (TypeError otherwise: a programming error)."""
    found = next((f for f in fields(config) if f.name == name), None)
    if found is None or "help" not in found.metadata:
        raise TypeError(f"{config.__name__}.{name} is not an option")
    return found


def take(
    config: type,
    name: str,
    *,
    default: Any = _SAME,
    help: str | None = None,
    config_default: Any = _SAME,
    **more: Any,
) -> Any:
    """The option `config.name` as a field of another class (a verb's options, or another library config that
    reads it too), with the declaration's help, flags and default. `default=`: this verb's own default (marked
    `verb_default`); `help=`: this verb's own words for it (marked `verb_help`); `more`: other metadata (`role`,
    `show_default`); `config_default`: as `option`'s. The declaration is named in the metadata's `source`."""
    source = declared(config, name)
    meta = dict(source.metadata)
    meta.setdefault("source", f"{config.__name__}.{name}")
    if default is not _SAME:
        meta |= {"default": default, "verb_default": True}
    if help is not None:
        meta |= {"help": help, "verb_help": True}
    meta |= more
    value = meta["default"] if config_default is _SAME else config_default
    return field(default=value, metadata=meta)


def words(value: str | list[str] | tuple[str, ...]) -> list[str]:
    return value.split(",") if isinstance(value, str) else list(value)


def ints(value: Any, option: str) -> tuple[int, ...]:
    """8,16,32 (text, a list or one number) -> (8, 16, 32), duplicates dropped; ConfigError otherwise."""
    items = value.split(",") if isinstance(value, str) else value if isinstance(value, list | tuple) else [value]
    try:
        values = tuple(dict.fromkeys(int(x) for x in items if str(x).strip()))
    except (TypeError, ValueError):
        raise ConfigError(f"{option} {value!r}: give whole numbers like 8,16,32") from None
    if not values:
        raise ConfigError(f"{option} {value!r}: give whole numbers like 8,16,32")
    return values
