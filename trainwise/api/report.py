"""`trainwise report STUDY` as a call: a study's reports drawn again from its results.json, as report.html (the
page, with its figures), report.md, results.csv or results.json in today's form. Any study trainwise wrote opens:
one killed mid-way (its stored rows, said to be partial) and one an earlier release wrote (the bare list of rows,
rows without the fields added since)."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainwise.api.options import ReportOptions
from trainwise.api.render import STDERR, Render, probes
from trainwise.core.errors import ConfigError, read_json
from trainwise.report.format import batch_cells, batch_legend
from trainwise.report.html import batch_page
from trainwise.report.write import csv_text, markdown
from trainwise.search.batch_size import SearchResult
from trainwise.study.store import (
    FIND_BATCH,
    PAGE,
    RESULTS,
    hold,
    page_of,
    partial_note,
    read_results,
    read_settings,
    write_estimates,
    write_report,
)

FILES = {"html": PAGE, "md": "report.md", "csv": "results.csv", "json": RESULTS}


@dataclass(frozen=True)
class Written:
    """A report drawn again: its text, and where it was written (None: it is for the caller to print)."""

    text: str
    path: Path | None


def read_find_batch(out: Path):
    """A find-batch search written in `out` (find_batch.json), typed, with the title it was written with; None
    when there is none (ConfigError when the file is not one)."""
    path = out / FIND_BATCH
    if not path.is_file():
        return None
    data = read_json(path, "a trainwise find-batch file")
    try:
        return SearchResult.from_dict(data), str(data.get("title") or f"trainwise find-batch: {out.resolve().name}")
    except (KeyError, TypeError, ValueError, AttributeError):
        raise ConfigError(f"{path}: not a trainwise find-batch file (expected points and limit_bytes)") from None


def render(study: Path, fmt: str) -> str:
    """The study's report in `fmt` (one of FILES), from its results.json; a find-batch search's from its
    find_batch.json (its own --out holds no rows)."""
    if not (study / RESULTS).is_file() and (found := read_find_batch(study)) is not None:
        if fmt == "json":  # the file as it is (validated above): every key kept, this release's or a later one's
            return (study / FIND_BATCH).read_text(encoding="utf-8")
        return _find_batch(found[0], found[1], fmt)
    rows = read_results(study, runs=False)  # one ConfigError when STUDY holds no results.json
    settings = read_settings(study)
    partial = partial_note(study)
    if fmt == "html":
        return page_of(study, rows, _title(study, settings), settings, partial)
    if fmt == "md":
        text = markdown(rows, _title(study, settings), settings)
        return text + (f"\n- {partial}\n" if partial else "")
    if fmt == "csv":
        return csv_text(rows)
    return json.dumps({"study": settings, "rows": [r.to_dict() for r in rows]}, indent=1, default=str)


def _find_batch(result: Any, title: str, fmt: str) -> str:
    if fmt == "html":
        return batch_page(result, title)
    cols, rows = batch_cells(result)
    if fmt == "csv":
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows([cols, *rows])
        return buf.getvalue()
    lines = [f"# {title}", "", f"**{result.verdict()}**", "", "| " + " | ".join(cols) + " |"]
    lines += ["|" + "---|" * len(cols), *("| " + " | ".join(r) + " |" for r in rows)]
    lines += ["", f"- {batch_legend(result)}"]
    return "\n".join(lines) + "\n"


def _title(study: Path, settings: dict) -> str:
    """The title the study was written with: stored in its settings, else report.md's heading (a study of an
    earlier release), else its directory's name."""
    if settings.get("title"):
        return str(settings["title"])
    md = study / "report.md"
    first = md.read_text(encoding="utf-8").partition("\n")[0] if md.is_file() else ""
    return first[2:] if first.startswith("# ") else f"trainwise compare: {study.resolve().name}"


def start(options: ReportOptions, render_to: Render | None = STDERR) -> Written:
    study = Path(options.study)
    batch_only = not (study / RESULTS).is_file() and (study / FIND_BATCH).is_file()
    if options.estimate and batch_only:
        raise ConfigError(f"--estimate: {study} is a find-batch search, whose page already draws its estimate")
    if options.estimate and options.format != "html":
        raise ConfigError(f"--estimate draws the estimate on the page: use it with --format html, not {options.format}")
    if options.estimate:
        estimate(study, Render.of(render_to))
    text = render(study, options.format)
    if options.output == "-":
        return Written(text, None)
    own = FIND_BATCH if batch_only and options.format == "json" else FILES[options.format]
    path = Path(options.output) if options.output else study / own
    return Written(text, write_report(study, path, text))


def estimate(study: Path, render: Render) -> Path:
    """`--estimate`: each row's memory as `trainwise estimate` predicts it, written to STUDY/estimates.json for
    the page to draw beside the measured; a row it cannot price is one note."""
    from trainwise.api.stored import memory_estimates  # heavy: the estimate (torch, transformers)

    rows = read_results(study, runs=False)
    with render.status("trainwise report: estimating each row's memory...") as status:
        estimates, missed = memory_estimates(study, rows, probes(render.update(status), "calibrating the estimate"))
    for line in missed:
        render.note(f"trainwise report: not estimated: {line}")
    with hold(study):
        return write_estimates(study, estimates)


def report(
    study: str | Path,
    format: str = "html",
    output: str | Path | None = None,
    render: Render | None = STDERR,
    **options: Any,
) -> Written:
    """`trainwise report` in Python (also `trainwise.open(study).report(...)`): the text drawn, and where it was
    written (None with `output="-"`). `estimate=True` predicts each row's memory first (drawn beside the measured)."""
    values = {"study": str(study), "format": format, "output": None if output is None else str(output), **options}
    return start(ReportOptions.of(values), render)
