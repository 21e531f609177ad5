"""report.html: a study's report as one self-contained page (trainwise.study.store writes it beside report.md).

The settings, the table with its relative columns and notes, and figures that each answer one question in a
one-line caption: time against memory with the Pareto front, the loss at every step, where a step's time goes,
where the memory goes. Figures are matplotlib's, inlined as SVG with `svg.fonttype = "none"`: the text stays
text (searchable, small), and nothing is fetched: no script, font or image from anywhere, so the file opens
offline and can be mailed whole.
"""

from __future__ import annotations

import functools
import html
from collections.abc import Callable
from typing import Any

from trainwise.core.quality import QualityVerdicts
from trainwise.core.results import StudyRow
from trainwise.report.figures import FIGURES, batch_search_curve, memory_parts, plan_path, quality_seeds
from trainwise.report.format import batch_cells, batch_legend, headers, notes, table_cells
from trainwise.report.write import SETTINGS

MiB = 2**20
STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1200px;
       padding: 0 1em; color: #1d1d1f; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; }
dl { display: grid; grid-template-columns: max-content auto; gap: 0.2em 1em; }
dt { font-weight: 600; } dd { margin: 0; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: right; white-space: nowrap; }
th:first-child, td:first-child { text-align: left; }
tr.baseline td { background: #fdf1f1; }
.partial { background: #fff4d6; border: 1px solid #e0b000; padding: 0.5em 1em; }
figure { margin: 1.5em 0; } figcaption { font-size: 0.9em; color: #444; margin-top: 0.3em; }
pre { background: #f5f5f5; padding: 0.5em; overflow-x: auto; }
.scroll { overflow-x: auto; max-width: 100%; }
.plan { background: #eef7ee; border: 1px solid #7cb87c; padding: 0.5em 1em; }
"""


def report_html(
    table: list[StudyRow],
    title: str,
    study: dict | None = None,
    partial: str | None = None,
    verdicts: QualityVerdicts | None = None,
    estimates: dict[str, dict] | None = None,
    plan: dict | None = None,
    batch_search: dict | None = None,
    not_read: list[str] | None = None,
) -> str:
    """The page: its settings, table, notes and figures (those the study has the figures for). Beside the rows,
    what else the study's directory holds is drawn when given: the quality phase's `verdicts`, the memory
    `estimates` of its rows (row -> `trainwise estimate`'s MemoryEstimate as a dict: `trainwise report --estimate`
    writes them), a `plan` search (plan.json) and a `batch_search` (find-batch's find_batch.json); `not_read`: a
    line for each such file that could not be read, said under the figures."""
    if plan is not None:  # a study a plan searched: the page is the plan's, its study's table below
        said = "the search is running" if plan.get("in_progress") else plan.get("plan") or "no plan recommended"
        title = f"trainwise plan: {said} ({title})"
    parts = [f"<h1>{_e(title)}</h1>"]
    if partial:
        parts.append(f'<p class="partial">{_e(partial)}</p>')
    if plan is not None:
        said = plan.get("headline") or []
        lead = f"Plan: {plan['plan']}" if plan.get("plan") else f"No plan recommended: {plan.get('rejected') or ''}"
        parts += [f'<div class="plan"><p><strong>{_e(lead)}</strong></p>', "<ul>"]
        parts += [f"<li>{_e(line)}</li>" for line in said] + ["</ul></div>"]
    parts += _settings(study)
    rows = table_cells(table)
    parts += ["<h2>Results</h2>", _html_table(headers(table), rows, ["baseline" if e.baseline else "" for e in table])]
    parts += ["<ul>", *[f"<li>{_e(n)}</li>" for n in notes(table)], "</ul>"]
    makers: list[tuple[str, Callable[[], tuple[str, str, str] | None]]] = [
        (make.__name__, functools.partial(make, table)) for make in FIGURES
    ]
    makers.insert(3, ("memory_parts", functools.partial(memory_parts, table, estimates or {})))
    if verdicts is not None:
        makers.append(("quality_seeds", functools.partial(quality_seeds, verdicts)))
    if plan is not None:
        makers.append(("plan_path", functools.partial(plan_path, plan)))
    if batch_search is not None:
        makers.append(("batch_search", functools.partial(batch_search_curve, batch_search)))
    return _page(title, parts + _figures(makers, not_read or []))


def _figures(makers: list[tuple[str, Callable[[], tuple[str, str, str] | None]]], failed: list[str]) -> list[str]:
    """The figures section: each maker's figure with its caption; one that cannot be drawn, and each line in
    `failed` (a file that could not be read), said as such, never the loss of the page."""
    figures, failed = [], list(failed)
    for name, draw in makers:
        try:
            if (drawn := draw()) is not None:
                figures.append(drawn)
        except Exception as e:  # a figure that cannot be drawn is said, never the loss of the study's report
            failed.append(f"{name}: {type(e).__name__}: {e}")
    if not (figures or failed):
        return []
    parts = ["<h2>Figures</h2>"]
    parts += [
        f'<figure id="{name}">{svg}<figcaption>{_e(caption)}</figcaption></figure>' for name, svg, caption in figures
    ]
    return parts + [f"<p>Not drawn: {_e(line)}</p>" for line in failed]


def batch_page(result: Any, title: str) -> str:
    """find-batch's page (a find_batch.SearchResult): the verdict, every size's figures and the curve."""
    cols, rows = batch_cells(result)
    parts = [
        f"<h1>{_e(title)}</h1>",
        f"<p><strong>{_e(result.verdict())}</strong></p>",
        "<h2>Every size looked at</h2>",
        _html_table(cols, rows),
        f"<ul><li>{_e(batch_legend(result))}</li></ul>",
    ]
    return _page(title, parts + _figures([("batch_search", lambda: batch_search_curve(result.to_dict()))], []))


def _page(title: str, parts: list[str]) -> str:
    head = f'<meta charset="utf-8"><title>{_e(title)}</title><style>{STYLE}</style>'
    return f'<!DOCTYPE html>\n<html lang="en"><head>{head}</head><body>\n' + "\n".join(parts) + "\n</body></html>\n"


def _html_table(cols: list[str], rows: list[list[str]], classes: list[str] | None = None) -> str:
    """A table of text cells (`classes`: each row's CSS class, "" for none)."""
    head = "".join(f"<th>{_e(c)}</th>" for c in cols)
    body = []
    for row, css in zip(rows, classes or [""] * len(rows), strict=True):
        attr = f' class="{css}"' if css else ""
        body.append(f"<tr{attr}>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>")
    # a wide table scrolls inside the page (a plan's study has a row for every candidate and 20 columns)
    table = f"<table><thead><tr>{head}</tr></thead><tbody>" + "".join(body) + "</tbody></table>"
    return f'<div class="scroll">{table}</div>'


def _e(text: Any) -> str:
    return html.escape(str(text))


def _settings(study: dict | None) -> list[str]:
    if not study:
        return []
    rows = [
        f"<dt>{_e(name)}</dt><dd>{_e(study[key])}</dd>"
        for key, name in SETTINGS
        if study.get(key) not in (None, "", [])
    ]
    out = ["<h2>The run</h2>", "<dl>", *rows, "</dl>"]
    if study.get("command"):
        out += ["<p>Run it again (the same command resumes from the store in --out):</p>"]
        out += [f"<pre>{_e(study['command'])}</pre>"]
    return out
