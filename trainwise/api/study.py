"""A study on disk, as Python: its rows, its settings, a DataFrame, advice (`trainwise.open(path)`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainwise.api.export import export
from trainwise.api.groups import CONSTRAINTS
from trainwise.api.options import AdviseOptions
from trainwise.core.errors import check_names
from trainwise.core.results import StudyRow
from trainwise.study.store import read_results, read_settings

# the columns a notebook shows first (the rest stay in to_pandas())
SHOWN = ("strategy", "status", "step_time_s", "samples_per_s", "rel_time", "peak_mem_bytes", "rel_mem", "metric")


class Study:
    """A `trainwise compare` study (its --out): `rows`, results.json's rows as StudyRow (one per row and
    batch cell, the baseline first; fields with units in their names: `step_time_s`, `peak_mem_bytes`),
    `settings` (what it ran with: model, data, device, steps, the command), `to_pandas()`, `advise(...)`,
    `export(...)`.
    ConfigError when `path` is not a finished study."""

    def __init__(self, path: str | Path):

        self.path = Path(path).resolve()  # a notebook may change its directory later
        self.rows: list[StudyRow] = read_results(self.path)

    @property
    def settings(self) -> dict:
        """results.json's `study` object ({} for a study written before it was stored)."""

        return read_settings(self.path)

    def to_pandas(self) -> Any:
        """One DataFrame row per study row and batch cell, its columns results.json's keys; nested fields
        flattened (`env.device_name`)."""
        import pandas as pd  # heavy: pandas

        return pd.json_normalize([r.to_dict() for r in self.rows])

    def advise(self, **options: Any) -> Any:
        """`trainwise advise` on this study: objective, memory_budget ("8GiB"), max_quality_drop,
        max_epoch_time ("30m"), max_epoch_cost, as the CLI's options. Returns the Advice."""
        from trainwise.api.stored import advise_study  # heavy: trainwise.api.stored loads numpy

        check_names("advise", options, CONSTRAINTS)
        return advise_study([self.path], AdviseOptions.of({"study": [str(self.path)], **options}).constraints())

    def export(self, **options: Any) -> Any:
        """`trainwise export --study` on this study: its row (default: advise's pick, or `strategies=`)
        written as TrainingArguments, accelerate and DeepSpeed configs and a train command into `out`.
        Returns what was written (`row`, `paths`, `notes`)."""

        return export(**{**options, "study": str(self.path)})

    def report(self, format: str = "html", output: str | Path | None = None, estimate: bool = False) -> Any:
        """The study's report drawn again (`trainwise report`): report.html by default, or md, csv, json;
        `output` a file, or "-" to only return the text; `estimate`: each row's memory predicted by `trainwise
        estimate` first, drawn beside the measured. Returns `trainwise.api.report.Written`."""
        from trainwise.api.report import report  # the page's figures load matplotlib when drawn

        return report(self.path, format=format, output=output, estimate=estimate)

    def _repr_html_(self) -> str:
        frame = self.to_pandas()
        return f"<p>trainwise study {self.path}</p>" + frame[[c for c in SHOWN if c in frame]].to_html(index=False)

    def __repr__(self) -> str:
        return f"Study({str(self.path)!r}, {len(self.rows)} rows)"


def open_study(path: str | Path) -> Study:
    """An existing study (the --out of `trainwise compare`)."""
    return Study(path)
