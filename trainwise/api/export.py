"""`trainwise export` as a call: a plan written as the user's own training configs and command."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainwise.api.options import ExportOptions
from trainwise.exporting.scripts import export_plan


@dataclass(frozen=True)
class Exported:
    row: str  # the plan written
    paths: list[Path]  # the files
    notes: list[str]  # what the user should know about them


def start(options: ExportOptions) -> Exported:
    return Exported(*export_plan(options.resolve(), Path(options.out)))


def export(config: str | Path | None = None, **options: Any) -> Exported:
    """`trainwise export` in Python: the CLI's options as keyword arguments (over a study file's)."""
    return start(ExportOptions.of(options, config))
