"""Write results.json, results.csv, report.md and chart.png into the study's --out directory."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from trainwise.report.format import cells, footnotes, has_rss, headers, notes, quality

PROGRESS = "progress.json"  # how many of the study's trials the reports hold

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


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def write_reports(
    out: Path, table: list[dict], title: str, done: int | None = None, total: int | None = None
) -> list[Path]:
    """Every file replaced whole (written aside, then renamed): a reader, or a kill, never sees half of one.
    `progress.json` says how many of the study's trials are in them (a killed study's reports are partial)."""
    paths = [out / "results.json", out / "results.csv", out / "report.md", out / "chart.png"]
    _atomic(paths[0], json.dumps(table, indent=1, default=str))
    rows = io.StringIO()
    writer = csv.DictWriter(rows, fieldnames=CSV_FIELDS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(table)
    _atomic(paths[1], rows.getvalue())
    _atomic(paths[2], markdown(table, title))
    tmp = paths[3].with_name(".chart.tmp.png")
    chart(table, tmp, title)
    tmp.replace(paths[3])
    if done is not None and total is not None:
        _atomic(out / PROGRESS, json.dumps({"done": done, "total": total}))
    return paths


def read_progress(study: Path) -> tuple[int, int] | None:
    """(trials done, trials in the study), or None when the study does not say (written before it did)."""
    try:
        progress = json.loads((study / PROGRESS).read_text(encoding="utf-8"))
        return int(progress["done"]), int(progress["total"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None


def markdown(table: list[dict], title: str) -> str:
    marks = footnotes(table)
    cols = headers(table)
    lines = [f"# {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += [
        "| " + " | ".join(c.replace("|", "/") for c in cells(e, marks.get(e["strategy"]), has_rss(table))) + " |"
        for e in table
    ]
    env: dict = next((e["env"] for e in table if e.get("env")), {})
    lines += ["", *[f"- {n}" for n in notes(table)]]
    if env:
        keys = ("device_name", "torch", "transformers", "accelerate", "commit")
        lines.append("- environment: " + ", ".join(f"{k} {env.get(k)}" for k in keys))
    return "\n".join(lines) + "\n"


def chart(table: list[dict], path: Path, title: str) -> None:
    """Time vs memory relative to the baseline, each strategy a point labelled with its quality."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=110)
    pts = [e for e in table if e["status"] == "ok" and e["rel_time"] is not None and e["rel_mem"] is not None]
    for e in pts:
        x, y = 100 * e["rel_time"], 100 * e["rel_mem"]
        ax.scatter([x], [y], s=45, color="tab:red" if e.get("baseline") else "tab:blue")
        ax.annotate(f"{e['strategy']}\n{quality(e)}", (x, y), textcoords="offset points", xytext=(6, 4), fontsize=7)
    ax.axvline(100, color="grey", lw=0.6, ls="--")
    ax.axhline(100, color="grey", lw=0.6, ls="--")
    ax.set_xlabel("training time, % of baseline (lower is faster)")
    ax.set_ylabel("peak memory, % of baseline")
    failed = [e["strategy"] for e in table if e["status"] != "ok"]
    ax.set_title(title + (f"\nnot plotted: {', '.join(failed)}" if failed else ""), fontsize=9)
    if not pts:
        ax.text(0.5, 0.5, "no rows relative to a successful baseline", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
