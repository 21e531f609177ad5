"""Write results.json, results.csv, report.md and chart.png into the study's --out directory."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from trainwise.files import writing
from trainwise.report.format import cells, footnotes, has_loss_share, has_rss, headers, notes, quality
from trainwise.results import StudyRow

STUDY_FILE = "study.yaml"  # the options a study ran with (`compare --config` reruns it; trainwise.api writes it)
PROGRESS = "progress.json"  # how many of the study's trials the reports hold, and which (their store keys)

CSV_FIELDS = [
    "strategy",
    "cost_per_epoch",
    "status",
    "message",
    "repeats",
    "step_time_s",
    "step_time_p90_s",
    "data_wait_s",
    "compute_s",
    "optimizer_s",
    "samples_per_s",
    "tokens_per_s",
    "padding_waste",
    "epoch_time_s",
    "peak_mem_bytes",
    "mem_kind",
    "peak_rss_bytes",
    "state_bytes",
    "flops_per_step",
    "mfu",
    "train_loss",
    "metric_name",
    "metric",
    "wall_s",
    "rel_time",
    "rel_mem",
    "contended",
    "discarded_runs",
    "precision_ratio",
    "support_note",
]


def write_reports(
    out: Path,
    table: list[StudyRow],
    title: str,
    done: int | None = None,
    total: int | None = None,
    study: dict | None = None,
    trials: list[str] | None = None,
) -> list[Path]:
    """Every file replaced whole: all of them are written aside first and renamed into place only when
    each was written, so a reader, a kill or a full disk never leaves half of one (a set of reports that
    disagree only if a rename itself fails, which needs no space). `study` (the run's settings:
    `study_settings`) opens report.md, sits beside the rows in results.json and captions the chart.
    `progress.json` says how many of the study's trials are in them (a killed study's reports are
    partial), and which: `trials`, their keys in the store (which may hold trials of other settings)."""
    paths = [out / "results.json", out / "results.csv", out / "report.md", out / "chart.png"]
    entries = [e.to_dict() for e in table]
    rows = io.StringIO()
    columns = CSV_FIELDS + (["loss_token_share"] if has_loss_share(table) else [])  # causal-lm studies
    writer = csv.DictWriter(rows, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(entries)
    texts = {
        paths[0]: json.dumps({"study": study or {}, "rows": entries}, indent=1, default=str),
        paths[1]: rows.getvalue(),
        paths[2]: markdown(table, title, study),
    }
    if done is not None and total is not None:
        texts[out / PROGRESS] = json.dumps({"done": done, "total": total, "trials": trials or []})
    tmps = {path: path.with_name(f".{path.stem}.tmp{path.suffix}") for path in [*texts, paths[3]]}
    for path, text in texts.items():
        with writing(path, *tmps.values()):
            tmps[path].write_text(text, encoding="utf-8")
    with writing(paths[3], *tmps.values()):
        chart(table, tmps[paths[3]], title, caption(study))
    for path, tmp in tmps.items():
        with writing(path, *tmps.values()):
            tmp.replace(path)
    return paths


def read_rows(path: Path) -> Any:
    """The rows of a results.json as the file holds them (`rows_of` its content): dicts, keys as written.
    Typed (StudyRow): `trainwise.advise.read_results` on the study's directory."""
    return rows_of(json.loads(path.read_text(encoding="utf-8")))


def rows_of(payload: Any) -> Any:
    """A results.json's rows: its `rows` beside the `study` settings, or the bare list a study wrote
    before the settings were stored; anything else is returned whole for the caller to refuse."""
    if isinstance(payload, dict) and isinstance(payload.get("rows"), list):
        return payload["rows"]
    return payload


def read_progress(study: Path) -> tuple[int, int] | None:
    """(trials done, trials in the study), or None when the study does not say (written before it did)."""
    try:
        progress = json.loads((study / PROGRESS).read_text(encoding="utf-8"))
        return int(progress["done"]), int(progress["total"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None


def read_trial_keys(study: Path) -> list[str] | None:
    """The store keys of the trials a study's reports hold, or None when it does not say (written before)."""
    try:
        keys = json.loads((study / PROGRESS).read_text(encoding="utf-8"))["trials"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    return [str(k) for k in keys] if isinstance(keys, list) and keys else None


def settings_block(study: dict | None) -> list[str]:
    """The run a report describes, in markdown lines: what a reader with only report.md needs to judge
    the figures and to run the study again."""
    if not study:
        return []
    lines = ["## The run", ""]
    lines += [f"- **{name}**: {study[key]}" for key, name in SETTINGS if study.get(key) not in (None, "", [])]
    if study.get("command"):
        lines += ["", "Run it again (the same command resumes from the store in --out):", "", "```sh"]
        lines += [study["command"], "```"]
    return [*lines, "", "## Results", ""]


# (key in results.json's `study` object, its name in report.md), in the order a reader needs them
SETTINGS = (
    ("model", "model"),
    ("data", "data"),
    ("task", "task"),
    ("device", "device"),
    ("environment", "environment"),
    ("strategies", "rows"),
    ("batch", "batch"),
    ("lengths", "lengths"),
    ("steps", "steps"),
    ("lr", "learning rate"),
    ("seed", "seed"),
    ("repeats", "repeats"),
    ("price", "price"),
    ("commit", "commit"),
)


def caption(study: dict | None) -> str:
    """The chart's caption: the model, data, device and steps it was measured with."""
    if not study:
        return ""
    return "\n".join(
        f"{name}: {study[key]}"
        for key, name in (("model", "model"), ("data", "data"), ("device", "device"), ("steps", "steps"))
        if study.get(key)
    )


def markdown(table: list[StudyRow], title: str, study: dict | None = None) -> str:
    marks = footnotes(table)
    cols = headers(table)
    lines = [f"# {title}", "", *settings_block(study), "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += [
        "| "
        + " | ".join(
            c.replace("|", "/") for c in cells(e, marks.get(e.strategy), has_rss(table), has_loss_share(table))
        )
        + " |"
        for e in table
    ]
    env: dict = next((e.env for e in table if e.env), {})
    lines += ["", *[f"- {n}" for n in notes(table)]]
    if env:
        keys = ("device_name", "torch", "transformers", "accelerate", "commit")
        lines.append("- environment: " + ", ".join(f"{k} {env.get(k)}" for k in keys))
    return "\n".join(lines) + "\n"


def chart(table: list[StudyRow], path: Path, title: str, caption: str = "") -> None:
    """Time vs memory relative to the baseline, each strategy a point labelled with its quality."""
    import matplotlib  # heavy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: matplotlib

    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=110)
    pts = [
        (e, t, m) for e in table if e.status == "ok" and (t := e.rel_time) is not None and (m := e.rel_mem) is not None
    ]
    for e, t, m in pts:
        x, y = 100 * t, 100 * m
        ax.scatter([x], [y], s=45, color="tab:red" if e.baseline else "tab:blue")
        ax.annotate(f"{e.strategy}\n{quality(e)}", (x, y), textcoords="offset points", xytext=(6, 4), fontsize=7)
    ax.axvline(100, color="grey", lw=0.6, ls="--")
    ax.axhline(100, color="grey", lw=0.6, ls="--")
    ax.set_xlabel("training time, % of baseline (lower is faster)")
    ax.set_ylabel("peak memory, % of baseline")
    failed = [e.strategy for e in table if e.status != "ok"]
    ax.set_title(title + (f"\nnot plotted: {', '.join(failed)}" if failed else ""), fontsize=9)
    if not pts:
        ax.text(0.5, 0.5, "no rows relative to a successful baseline", ha="center", transform=ax.transAxes)
    if caption:
        fig.text(0.01, 0.01, caption, fontsize=6.5, color="dimgrey", va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.04 + 0.025 * caption.count("\n"), 1, 1) if caption else None)
    fig.savefig(path)
    plt.close(fig)
