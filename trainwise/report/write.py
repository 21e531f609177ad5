"""A study's table rendered as results.csv, report.md and chart.png (trainwise.study.store writes them)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from trainwise.core.results import StudyRow
from trainwise.report.format import has_loss_share, headers, notes, quality, table_cells

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


def csv_text(table: list[StudyRow]) -> str:
    """results.csv: one line per row, the columns a spreadsheet needs (causal LMs: and the loss-token share)."""
    rows = io.StringIO()
    columns = CSV_FIELDS + (["loss_token_share"] if has_loss_share(table) else [])  # causal-lm studies
    writer = csv.DictWriter(rows, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(e.to_dict() for e in table)
    return rows.getvalue()


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
    cols = headers(table)
    lines = [f"# {title}", "", *settings_block(study), "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in table_cells(table)]
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
