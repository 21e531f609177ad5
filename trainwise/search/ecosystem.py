"""The ecosystem's default: what a user gets without trainwise, as a row of trainwise strategies, read from the
installed libraries: a causal LM's from TRL's `SFTConfig()` (as the export's sft_train.py runs it: SFTTrainer with
TRL's own defaults), every other task's from transformers' `TrainingArguments()` (as the export's train_snippet.py runs
it: the HF Trainer). Which fields turn which strategy on is each strategy's to say (`Strategy.on_by_default`, beside
its knobs): this module names none of them.

`trainwise plan` measures that row in the same study as every other, so its plan is judged against the run the user
would otherwise start, and is never slower than it. Each field read is said in `fields`, with the strategy it maps
to, so plan.md can say where the row came from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from trainwise.core.env import package_version
from trainwise.strategies.base import LibraryDefaults


@dataclass(frozen=True)
class Default:
    """The ecosystem's default for a task: the row that reproduces it, where it came from, and for each of its
    strategies the library field that turns it on (`fields`)."""

    row: str  # the strategies, in the registry's order ('baseline' where none applies)
    source: str  # "TRL 1.16.0 SFTConfig()" / "transformers 5.23.0 TrainingArguments()"
    fields: dict[str, str] = field(default_factory=dict)  # strategy -> the library field that turns it on
    notes: tuple[str, ...] = ()  # what the row cannot reproduce (the learning rate: the study's, not the library's)
    batch: int | None = None  # the library's per-device batch size (the row runs at it where the data allows)
    max_length: int | None = None  # the library's max length (SFTConfig's; the Trainer has none)
    learning_rate: float | None = None

    @property
    def label(self) -> str:
        return f"ecosystem default ({self.source})"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def defaults_of(cls: type) -> dict[str, object]:
    """A config dataclass's field defaults, read without building it (SFTConfig() refuses bf16 on a CPU machine
    unless told use_cpu: its defaults are the fields', and its __post_init__ resolves bf16=None to `not fp16`)."""
    out: dict[str, object] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def _version(package: str) -> str:
    return package_version(package) or "?"


def default_for(task: str, device: str, valid: Callable[[str], str | None] = lambda _row: None) -> Default:
    """The ecosystem's default for `task` on `device` (cpu | cuda), as a row. `valid(row)`: why the registry or the
    device cannot run a row (None: it can); a strategy it refuses is left out and said in the notes."""
    if task == "causal-lm":
        try:
            from trl import SFTConfig  # optional: trainwise[sft]; heavy (transformers)
        except ImportError:
            found = _trainer(task, device, valid)
            return dataclasses.replace(
                found, notes=(*found.notes, "TRL is not installed: the HF Trainer's defaults stand in for SFTConfig's")
            )
        return build(task, device, defaults_of(SFTConfig), f"TRL {_version('trl')} SFTConfig()", valid, sft=True)
    return _trainer(task, device, valid)


def _trainer(task: str, device: str, valid: Callable[[str], str | None] = lambda _row: None) -> Default:
    from transformers import TrainingArguments  # heavy: transformers

    source = f"transformers {_version('transformers')} TrainingArguments()"
    return build(task, device, defaults_of(TrainingArguments), source, valid, sft=False)


def build(
    task: str, device: str, d: dict[str, object], source: str, valid: Callable[[str], str | None], sft: bool
) -> Default:
    """The row of every strategy for `task` whose own `on_by_default` says the library's defaults turn it on (no
    strategy's name is read here: each says which field turns it on), less those `valid` refuses."""
    from trainwise import strategies  # the registry

    lib = LibraryDefaults(d, sft, device)
    said: dict[str, str] = {}
    names: list[str] = []
    for s in strategies.REGISTRY.values():
        if s.on_by_default is None or task not in s.tasks or (why := s.on_by_default(lib)) is None:
            continue
        said[s.name] = why
        names.append(s.name)
    notes: list[str] = []
    kept: list[str] = []
    for n in names:
        why = valid("+".join([*kept, n]))
        if why is None:
            kept.append(n)
        else:
            notes.append(f"{n}: left out here ({why})")
    batch, length, lr = d.get("per_device_train_batch_size"), d.get("max_length"), d.get("learning_rate")
    return Default(
        "+".join(kept) or "baseline",
        source,
        said,
        tuple(notes),
        batch if isinstance(batch, int) else None,
        length if isinstance(length, int) else None,
        float(lr) if isinstance(lr, int | float) else None,
    )


def overridden(default: Default, max_length: int, lr: float, run_batch: int) -> list[str]:
    """Each field of the library's defaults the study's row of them does not keep, in words."""
    said = []
    if default.batch is not None and run_batch != default.batch:
        said.append(
            f"per_device_train_batch_size {default.batch}: run at the study's {run_batch} (the data holds fewer rows)"
        )
    if default.max_length is not None and default.max_length != max_length:
        said.append(f"max_length {default.max_length}: the study's {max_length} (every row cut at --max-length)")
    if default.learning_rate is not None and default.learning_rate != lr:
        said.append(f"learning_rate {default.learning_rate:g}: the study's {lr:g} (one rate for every row)")
    return said
