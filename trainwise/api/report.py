"""`trainwise report STUDY` as a call: a study's reports drawn again from its results.json, as report.html (the
page, with its figures), report.md, results.csv or results.json in today's form. Any study trainwise wrote opens:
one killed mid-way (its stored rows, said to be partial) and one an earlier release wrote (the bare list of rows,
rows without the fields added since)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainwise.api.options import ReportOptions
from trainwise.report.html import report_html
from trainwise.report.write import csv_text, markdown
from trainwise.study.store import (
    PAGE,
    RESULTS,
    partial_note,
    read_quality,
    read_results,
    read_settings,
    write_report,
)

FILES = {"html": PAGE, "md": "report.md", "csv": "results.csv", "json": RESULTS}


@dataclass(frozen=True)
class Written:
    """A report drawn again: its text, and where it was written (None: it is for the caller to print)."""

    text: str
    path: Path | None


def render(study: Path, fmt: str) -> str:
    """The study's report in `fmt` (one of FILES), from its results.json."""
    rows = read_results(study, runs=False)  # one ConfigError when STUDY holds no results.json
    settings = read_settings(study)
    partial = partial_note(study)
    if fmt == "html":
        return report_html(rows, _title(study, settings), settings, partial, read_quality(study))
    if fmt == "md":
        text = markdown(rows, _title(study, settings), settings)
        return text + (f"\n- {partial}\n" if partial else "")
    if fmt == "csv":
        return csv_text(rows)
    return json.dumps({"study": settings, "rows": [r.to_dict() for r in rows]}, indent=1, default=str)


def _title(study: Path, settings: dict) -> str:
    """The title the study was written with: stored in its settings, else report.md's heading (a study of an
    earlier release), else its directory's name."""
    if settings.get("title"):
        return str(settings["title"])
    md = study / "report.md"
    first = md.read_text(encoding="utf-8").partition("\n")[0] if md.is_file() else ""
    return first[2:] if first.startswith("# ") else f"trainwise compare: {study.resolve().name}"


def start(options: ReportOptions) -> Written:
    study = Path(options.study)
    text = render(study, options.format)
    if options.output == "-":
        return Written(text, None)
    path = Path(options.output) if options.output else study / FILES[options.format]
    return Written(text, write_report(study, path, text))


def report(study: str | Path, format: str = "html", output: str | Path | None = None, **options: Any) -> Written:
    """`trainwise report` in Python (also `trainwise.open(study).report(...)`): the text drawn, and where it was
    written (None with `output="-"`)."""
    values = {"study": str(study), "format": format, "output": None if output is None else str(output), **options}
    return start(ReportOptions.of(values))
