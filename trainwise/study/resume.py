"""A study run again into its --out: what its options measure (each value written one way), what differs from the
study stored there (and would replace its report), and this run over it (the report never loses a row, a price or a
quality phase the new run does not ask for). Over a verb's options (trainwise.api.options.CompareOptions: `options`)."""

from __future__ import annotations

import dataclasses
from dataclasses import fields
from typing import Any

from trainwise.core.config import DEFAULT_LR, IMAGE_TASK
from trainwise.core.option import PRICE, QUALITY, ints, words


def measured(options: Any) -> dict[str, Any]:
    """The options that define what the study measures (those with no `role`), each written one way, so
    that two spellings of one value compare equal (a list or comma text, a relative or absolute path, lr
    unset or the task's default); an option the study does not read is left out."""
    roles = {f.name: f.metadata.get("role") for f in fields(options)}
    values = {k: v for k, v in options.to_file().items() if roles[k] is None}
    # the batch sizes the rows run at: a sweep's, or --batch-size
    values["batch_sizes"] = ints(options.batch_sizes, "--batch-sizes") if options.batch_sizes else (options.batch_size,)
    values["num_workers"] = ints(options.num_workers, "--num-workers")
    values["lr"] = DEFAULT_LR[options.task] if options.lr is None else options.lr
    unread = {
        "batch_size": True,  # in batch_sizes
        "max_target_length": options.task != "seq2seq",
        "truncation": not options.truncation,  # a study before issue 59's field reads as trainwise's cut
        "image_size": options.task != IMAGE_TASK,
        "remeasure": options.repeat > 1,
    }
    return {k: v for k, v in values.items() if not unread.get(k)}


def changed(options: Any, stored: Any) -> list[str]:
    """What differs from the study `stored` describes and would replace its report, as 'max_steps 16 → 4':
    an option that defines the measurement, a price where both give one, a quality phase where both run one."""
    old, now = measured(stored), measured(options)
    pairs = [(k, old.get(k), now.get(k)) for k in dict.fromkeys([*old, *now])]
    if options.priced() and stored.priced():
        pairs += [(f.name, getattr(stored, f.name), getattr(options, f.name)) for f in _of_role(options, PRICE)]
    if options.quality_steps is not None and stored.quality_steps is not None:
        pairs += [(f.name, getattr(stored, f.name), getattr(options, f.name)) for f in _of_role(options, QUALITY)]
    return [f"{k} {_said(old)} → {_said(new)}" for k, old, new in pairs if old != new]


def over(options: Any, stored: Any, reported: list[str]) -> tuple[Any, list[str]]:
    """This run over the study already in its --out (`stored`, whose report has the rows `reported`), and a
    note for each thing the study keeps: its report never loses a row, a price or a quality phase that this
    run does not ask for (rows are added; --replace runs exactly what is asked)."""
    rows = [r.strip() for r in words(options.strategies)]
    reported = list(dict.fromkeys(reported))  # in the report's order, then this run's new rows
    kept = [r for r in reported if r not in rows]
    changes: dict[str, Any] = {"strategies": [*reported, *(r for r in rows if r not in reported)]} if kept else {}
    notes = []
    if kept:
        notes.append(f"{options.out} holds rows this run does not name: {', '.join(kept)}; they stay in its report")
    if stored.priced() and not options.priced():
        changes |= {f.name: getattr(stored, f.name) for f in _of_role(options, PRICE)}
        label = stored.price(stored.checkpoint_minutes).label
        notes.append(f"{options.out} is priced: its report stays priced ({label})")
    if stored.quality_steps is not None and options.quality_steps is None:
        changes |= {f.name: getattr(stored, f.name) for f in _of_role(options, QUALITY)}
        notes.append(
            f"{options.out} has a quality phase: it runs too (--quality-steps {stored.quality_steps}, "
            f"--seeds {stored.seeds}; its finished trials come from its store)"
        )
    return dataclasses.replace(options, **changes), [f"trainwise: note: {n}" for n in notes]


def _of_role(options: Any, role: str) -> list[dataclasses.Field]:
    return [f for f in fields(options) if f.metadata.get("role") == role]


def _said(value: Any) -> str:
    """An option's value as a line says it: a list as the CLI's comma text, nothing as 'none'."""
    if isinstance(value, list | tuple):
        return ",".join(map(str, value)) or "none"
    return "none" if value is None else str(value)
