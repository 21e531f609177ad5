"""report.html's figures, each answering one question in a one-line caption: time against memory with the Pareto
front, the loss at every step, where a step's time goes, where the memory goes, a sweep, the quality's seeds, the plan's
path and the batch search. matplotlib's, inlined as SVG with `svg.fonttype = "none"` (the text stays text)."""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from typing import Any

from trainwise.core.quality import QualityVerdicts
from trainwise.core.results import StudyRow
from trainwise.report.format import quality

MiB = 2**20


def _svg(fig: Any) -> str:
    """The figure as inline SVG, its text as text; the figure is closed."""
    import matplotlib.pyplot as plt  # heavy: matplotlib

    buf = io.StringIO()
    # no metadata: its date would make every drawing of the same study differ (and it names web namespaces); the
    # text as text, ids from a fixed salt (the same study draws the same file); set for this drawing only
    none = dict.fromkeys(("Creator", "Date", "Format", "Type"))
    with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": "trainwise"}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata=none)
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]  # without the XML declaration and doctype: inline in HTML


def png(fig: Any, path: Any, dpi: int = 110) -> None:
    """The figure as a PNG at `path`; the figure is closed."""
    import matplotlib.pyplot as plt  # heavy: matplotlib

    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def _figure(width: float, height: float) -> tuple[Any, Any]:
    import matplotlib  # heavy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: matplotlib

    return plt.subplots(figsize=(width, height), dpi=100)


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """The indices of the points no other point beats on both axes (lower is better on each), by x."""
    order = sorted(range(len(points)), key=lambda i: points[i])
    front, best_y = [], math.inf
    for i in order:
        if points[i][1] < best_y:
            front.append(i)
            best_y = points[i][1]
    return front


def place_labels(
    ax: Any, points: list[tuple[float, float]], texts: list[str], fontsize: float = 7.5, avoid: tuple = ()
) -> list[Any]:
    """Each point's label placed where it overlaps no other label, no point and nothing in `avoid` (display boxes:
    the legend), inside the axes: rings of candidate offsets, nearest first, a leader line once it moved away. The
    axes' limits must be set first. The gaps are measured in matplotlib's font with a 3 px margin: a browser that
    draws the SVG's text in another font keeps them apart unless its font is much wider."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    to_px = ax.transData.transform
    marks = [_box(px[0], px[1], 5) for px in (to_px(p) for p in points)]  # each point's marker, in display pixels
    taken: list[tuple[float, float, float, float]] = [_padded(b, 0) for b in avoid]
    frame = ax.get_window_extent(renderer)
    placed = []
    directions = [(1, 1), (1, -1), (-1, 1), (-1, -1), (1, 0), (-1, 0), (0, 1), (0, -1)]
    for (x, y), text in zip(points, texts, strict=True):
        label = None
        for ring in range(1, 40):
            for dx, dy in directions:
                offset = (dx * (6 + 9 * (ring - 1)), dy * (5 + 7 * (ring - 1)))
                candidate = ax.annotate(
                    text,
                    (x, y),
                    xytext=offset,
                    textcoords="offset points",
                    fontsize=fontsize,
                    ha="left" if dx > 0 else "right" if dx < 0 else "center",
                    va="bottom" if dy > 0 else "top" if dy < 0 else "center",
                    arrowprops={"arrowstyle": "-", "color": "grey", "lw": 0.5} if ring > 1 else None,
                )
                box = _padded(_text_box(candidate, renderer), 3)
                inside = frame.x0 <= box[0] and box[2] <= frame.x1 and frame.y0 <= box[1] and box[3] <= frame.y1
                if inside and not any(_overlap(box, other) for other in taken + marks):
                    label = candidate
                    taken.append(box)
                    break
                candidate.remove()
            if label is not None:
                break
        if label is None:  # no room within 40 rings (hundreds of rows): beside the point, as a last resort
            label = ax.annotate(text, (x, y), xytext=(6, 5), textcoords="offset points", fontsize=fontsize)
            taken.append(_padded(_text_box(label, renderer), 3))
        placed.append(label)
    return placed


def _text_box(label: Any, renderer: Any) -> Any:
    """The label's text alone (an Annotation's own extent takes in its leader line, which reaches its point)."""
    from matplotlib.text import Text  # heavy: matplotlib

    label.update_positions(renderer)  # where its offset puts the text (Annotation's own extent does this too)
    return Text.get_window_extent(label, renderer)


def _box(x: float, y: float, r: float) -> tuple[float, float, float, float]:
    return (x - r, y - r, x + r, y + r)


def _padded(b: Any, pad: float) -> tuple[float, float, float, float]:
    return (b.x0 - pad, b.y0 - pad, b.x1 + pad, b.y1 + pad)


def _overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def tradeoff(table: list[StudyRow]) -> tuple[str, str, str] | None:
    """Time against memory, relative to the baseline, with the Pareto front: which rows are worth a look."""
    drawn = tradeoff_figure(table)
    if drawn is None:
        return None
    off = [e.strategy for e in table if e not in _plotted(table)]
    caption = (
        "Which rows are worth a look: each row's time and peak memory relative to the baseline (red); the rows on the "
        "green line are beaten by no other row on both" + (f" (not drawn: {', '.join(off)})" if off else "") + "."
    )
    return "tradeoff", _svg(drawn[0]), caption


def _plotted(table: list[StudyRow]) -> list[StudyRow]:
    return [e for e in table if e.status == "ok" and e.rel_time is not None and e.rel_mem is not None]


def tradeoff_figure(table: list[StudyRow]) -> tuple[Any, Any, list[Any]] | None:
    """The time-memory figure, its axes and its point labels; None with fewer than two rows to draw."""
    rows = _plotted(table)
    if len(rows) < 2:
        return None
    fig, ax = _figure(8, 5.5)
    points = [(100 * (e.rel_time or 0.0), 100 * (e.rel_mem or 0.0)) for e in rows]
    front = pareto_front(points)
    for i, (e, (x, y)) in enumerate(zip(rows, points, strict=True)):
        color = "tab:red" if e.baseline else "tab:green" if i in front else "tab:blue"
        ax.scatter([x], [y], s=30, color=color, zorder=3)
    fx, fy = [points[i][0] for i in front], [points[i][1] for i in front]
    ax.step(fx, fy, where="post", color="tab:green", lw=1, alpha=0.6, label="Pareto front", zorder=2)
    ax.axvline(100, color="grey", lw=0.6, ls="--")
    ax.axhline(100, color="grey", lw=0.6, ls="--")
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    dx, dy = max(xs) - min(xs) or 10.0, max(ys) - min(ys) or 10.0
    if min(xs) > 0 and max(xs) / min(xs) > 8:  # a row far slower (an emulated bf16 at 16x): log, the rest apart
        ax.set_xscale("log")
        low, high = min(xs) / 1.5, max(xs) * 4  # room for labels on the right
        ax.set_xlim(low, high)
        ticks = [t * 10**k for k in range(-1, 6) for t in (1, 2, 5) if low <= t * 10**k <= high]
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
    else:
        ax.set_xlim(min(xs) - 0.15 * dx, max(xs) + 0.45 * dx)
    ax.set_ylim(min(ys) - 0.2 * dy, max(ys) + 0.25 * dy)
    ax.set_xlabel("training time, % of the baseline's (lower is faster)")
    ax.set_ylabel("peak memory, % of the baseline's")
    legend = ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    texts = [f"{e.strategy} ({quality(e)})" if quality(e) != "-" else e.strategy for e in rows]
    labels = place_labels(ax, points, texts, avoid=(legend.get_window_extent(fig.canvas.get_renderer()),))
    return fig, ax, labels


def losses(table: list[StudyRow]) -> tuple[str, str, str] | None:
    """The loss at every optimizer step of each row: do the rows train alike?"""
    rows = [e for e in table if e.status == "ok" and e.losses]
    if not rows:
        return None
    fig, ax = _figure(8, 4.5)
    for e in rows:
        steps = range(1, len(e.losses or []) + 1)
        ax.plot(steps, e.losses or [], lw=2.2 if e.baseline else 1.1, label=e.strategy, alpha=0.85)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    ax.legend(fontsize=7, ncol=2 if len(rows) > 6 else 1, loc="upper right")
    fig.tight_layout()
    caption = (
        "Do the rows train alike? The training loss at every optimizer step (the baseline's line is thicker); a row "
        "that changes only how a step is computed (accumulation, checkpointing, padding) lies on the baseline's."
    )
    return "losses", _svg(fig), caption


def _stacked(rows: list[StudyRow], parts: list[tuple[str, list[float], str]], xlabel: str) -> Any:
    """A horizontal bar per row, its `parts` (label, one value per row, colour) stacked left to right."""
    fig, ax = _figure(8, 0.9 + 0.32 * len(rows))
    names = [e.strategy for e in rows]
    left = [0.0] * len(rows)
    for label, widths, color in parts:
        ax.barh(names, widths, left=left, color=color, label=label)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    # above the bars: below them it sat on the axis title once a browser drew the text (tests/report/test_browser.py)
    ax.legend(fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=4, frameon=False)
    fig.tight_layout()
    return fig


def step_parts(table: list[StudyRow]) -> tuple[str, str, str] | None:
    """Where a step's time goes: waiting for data, forward and backward, the optimizer, the rest."""
    rows = [e for e in table if e.status == "ok" and e.step_time_s and e.compute_s is not None]
    if not rows:
        return None

    def ms(of: Callable[[StudyRow], float | None]) -> list[float]:
        return [1000 * (of(e) or 0.0) for e in rows]

    wait, compute, optim = ms(lambda e: e.data_wait_s), ms(lambda e: e.compute_s), ms(lambda e: e.optimizer_s)
    step = ms(lambda e: e.step_time_s)
    rest = [max(0.0, t - w - c - o) for t, w, c, o in zip(step, wait, compute, optim, strict=True)]
    parts = [
        ("data wait", wait, "tab:orange"),
        ("forward + backward", compute, "tab:blue"),
        ("optimizer", optim, "tab:green"),
        ("the rest", rest, "tab:grey"),
    ]
    xlabel = "milliseconds per optimizer step (medians of the timed steps; the rest: the mean step less them)"
    fig = _stacked(rows, parts, xlabel)
    caption = (
        "Where does a step's time go? Each row's step split into waiting for the next batch, forward and backward, "
        "the optimizer (clip, step, zero_grad) and the rest."
    )
    return "step-time", _svg(fig), caption


def memory_parts(table: list[StudyRow], estimates: dict[str, dict] | None = None) -> tuple[str, str, str] | None:
    """Where the memory goes: the model's state (weights, gradients, optimizer state) and the rest of the peak, as
    measured and, below each row that has one, as `trainwise estimate` predicts it (`estimates`: row -> its
    MemoryEstimate as a dict, on the same basis: the peak of live tensors)."""
    rows = [e for e in table if e.status == "ok" and e.peak_mem_bytes and e.state_bytes is not None]
    if not rows:
        return None
    estimates = estimates if isinstance(estimates, dict) else {}
    priced = {e.strategy: estimates[e.strategy] for e in rows if _estimate_of(e, estimates.get(e.strategy))}
    fig, ax = _figure(8, 0.9 + (0.5 if priced else 0.32) * len(rows))
    state = [(e.state_bytes or 0) / MiB for e in rows]
    rest = [max(0.0, ((e.peak_mem_bytes or 0) - (e.state_bytes or 0)) / MiB) for e in rows]
    y = list(range(len(rows)))
    height, shift = (0.38, 0.2) if priced else (0.8, 0.0)
    measured = [i - shift for i in y]
    ax.barh(measured, state, height, color="tab:purple", label="weights + gradients + optimizer state")
    ax.barh(measured, rest, height, left=state, color="tab:cyan", label="activations and temporaries")
    if priced:
        at = [i + shift for i, e in zip(y, rows, strict=True) if e.strategy in priced]
        parts = [priced[e.strategy]["parts"] for e in rows if e.strategy in priced]
        est_state = [sum(int(p.get(k, 0)) for k in ("weights", "grads", "optimizer")) / MiB for p in parts]
        peaks = [int(priced[e.strategy]["peak_bytes"]) / MiB for e in rows if e.strategy in priced]
        est_rest = [max(0.0, peak - st) for peak, st in zip(peaks, est_state, strict=True)]
        style = {"edgecolor": "black", "linewidth": 0.4, "hatch": "///"}
        ax.barh(at, est_state, height, color="#d9c8ee", label="estimated: state", **style)
        ax.barh(at, est_rest, height, left=est_state, color="#c5ecf2", label="estimated: the rest", **style)
    ax.set_yticks(y, [e.strategy for e in rows])
    ax.invert_yaxis()
    ax.set_xlabel("MiB at the peak of a training step" + (" (plain: measured; hatched: estimated)" if priced else ""))
    ax.legend(fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=4 if priced else 2, frameon=False)
    fig.tight_layout()
    kind = rows[0].mem_kind or ""
    bases = {"cuda_allocated": "live tensors on the GPU", "cpu_allocated": "live tensors (torch.profiler), not the RSS"}
    basis = bases.get(kind, f"the peak as an earlier release measured it: {kind or 'unnamed'}")
    caption = (
        "Where does the memory go? Each row's peak split into the model's state, counted from its tensors, and the "
        f"rest: activations and temporaries ({basis})."
    )
    if priced:
        missing = [e.strategy for e in rows if e.strategy not in priced]
        caption += (
            " Hatched, below each row: what `trainwise estimate` predicts for it before anything trains, at its batch "
            "and the study's longest length (a padding row's measured batches were shorter)"
            + (f"; not estimated: {', '.join(missing)}" if missing else "")
            + "."
        )
    else:
        caption += " `trainwise report STUDY --estimate` draws the estimate's prediction beside each row."
    return "memory", _svg(fig), caption


def _estimate_of(row: StudyRow, e: Any) -> bool:
    """Whether `e` is an estimate of this row: of its plan at its batch size (estimates.json left from a study that
    --replace replaced, or an earlier release's, is not drawn beside rows it was not made for)."""
    if not (isinstance(e, dict) and isinstance(e.get("parts"), dict) and isinstance(e.get("peak_bytes"), int | float)):
        return False
    made_for = e["for_row"] if isinstance(e.get("for_row"), dict) else {}
    plan, batch = made_for.get("plan"), made_for.get("batch_size")
    return (plan is None or row.plan is None or plan == row.plan) and (
        batch is None or row.batch_size is None or batch == row.batch_size
    )


def sweep_curve(table: list[StudyRow]) -> tuple[str, str, str] | None:
    """A study that swept batch sizes (--batch-sizes) or DataLoader workers (--num-workers): each row's samples/s
    at each value (batch sizes first, when it swept both: one line per row and worker count). None without one."""
    ok = [e for e in table if e.status == "ok" and e.samples_per_s and e.batch_size is not None]
    for axis in ("batch_size", "workers"):
        curves: dict[str, list[tuple[int, float]]] = {}
        for e in ok:
            other = f" ({e.workers} workers)" if axis == "batch_size" and e.workers else ""
            other = f" (batch {e.batch_size})" if axis == "workers" else other
            curves.setdefault((e.row or e.strategy) + other, []).append((getattr(e, axis) or 0, e.samples_per_s or 0.0))
        swept = {name: sorted(points) for name, points in curves.items() if len({x for x, _ in points}) >= 2}
        if swept:
            break
    else:
        return None
    if axis == "workers":  # every row swept at one batch: the batch goes in the caption, not each label
        batches = {name.rsplit(" (batch ", 1)[1] for name in swept}
        if len(batches) == 1:
            swept = {name.rsplit(" (batch ", 1)[0]: points for name, points in swept.items()}
    fig, ax = _figure(8, 4.5)
    for name, points in swept.items():
        ax.plot([x for x, _ in points], [v for _, v in points], marker="o", ms=4, lw=1.2, label=name)
    values = sorted({x for points in swept.values() for x, _ in points})
    if axis == "batch_size":
        ax.set_xscale("log", base=2)
    ax.set_xticks(values, [str(x) for x in values])
    ax.minorticks_off()
    what = "batch size (samples per optimizer step)" if axis == "batch_size" else "DataLoader worker processes"
    ax.set_xlabel(what)
    ax.set_ylabel("samples/s over the timed steps")
    ax.legend(fontsize=7, ncol=2 if len(swept) > 6 else 1, loc="best")
    fig.tight_layout()
    question = "Which batch is fastest?" if axis == "batch_size" else "Do DataLoader workers pay?"
    caption = (
        f"{question} Each row's samples/s at every {what.split(' (')[0]} the study swept; a value a row has no point "
        "at did not run there (out of memory, unsupported, or another fault: the table says)."
    )
    return ("batch" if axis == "batch_size" else "workers"), _svg(fig), caption


def quality_seeds(verdicts: QualityVerdicts) -> tuple[str, str, str] | None:
    """The quality phase: each row's metric at every seed, their mean, and the baseline's mean: does a plan cost
    quality, beyond the seeds' spread?"""
    rows = [r for r in verdicts.rows if r.values]
    if not rows:
        return None
    fig, ax = _figure(8, 0.9 + 0.4 * len(rows))
    base = next((r for r in rows if r.verdict == "reference"), None)
    for y, r in enumerate(rows):
        ax.scatter(r.values, [y] * len(r.values), s=22, color="tab:grey", alpha=0.8, zorder=3)
        ax.plot([r.mean, r.mean], [y - 0.3, y + 0.3], color="tab:red" if r is base else "black", lw=2, zorder=4)
    if base is not None:
        ax.axvline(base.mean, color="tab:red", lw=0.8, ls="--", zorder=2)
    ax.set_yticks(range(len(rows)), [f"{r.strategy} ({r.verdict or '-'})" for r in rows])
    ax.invert_yaxis()
    name = rows[0].metric_name or "metric"
    ax.set_xlabel(f"{name} on the held-out rows after {rows[0].steps} steps: each seed (dots), their mean (bar)")
    fig.tight_layout()
    caption = (
        f"Does a plan cost quality? Each row trained again with {verdicts.seeds} seeds: every seed's {name}, their "
        "mean, and the baseline's mean (dashed). A verdict is a difference beyond the seeds' spread (the paired "
        "t-test over the seeds both rows ran, two-sided at 5%)."
    )
    return "quality", _svg(fig), caption


def plan_path(plan: dict) -> tuple[str, str, str] | None:
    """A `trainwise plan` search (its plan.json): each candidate in the order tried, its predicted and measured
    time, the incumbent after it, and the plan beside the baseline, the best single row and `all`."""
    search = plan.get("search") or {}
    every = [c for c in search.get("candidates") or [] if c.get("predicted_time") is not None]
    # in the order measured (plan.json keeps them in the order proposed: round 1 proposes every combination of the
    # rows that helped, most never measured); then those the estimate pruned before they trained
    ran = [c for c in every if c.get("state") in ("measured", "failed")]
    if all(c.get("trial") is not None for c in ran):  # a plan.json of an earlier release: its list order
        ran.sort(key=lambda c: c["trial"])
    tried = ran + [c for c in every if c.get("state") == "pruned"]
    if not tried:
        return None
    skipped = search.get("skipped", len(every) - len(tried))
    lines = {ln["label"]: ln for ln in plan.get("lines") or [] if ln.get("rel_time")}
    fig, ax = _figure(8, 1.4 + 0.34 * len(tried))
    y = list(range(len(tried)))
    predicted = [100 * c["predicted_time"] for c in tried]
    ax.scatter(predicted, y, s=28, facecolors="white", edgecolors="tab:blue", zorder=4, label="predicted")
    done = [(i, 100 * c["measured_time"]) for i, c in enumerate(tried) if c.get("measured_time") is not None]
    for i, t in done:
        ax.plot([predicted[i], t], [i, i], color="tab:blue", lw=0.8, alpha=0.6, zorder=3)
    if done:
        ax.scatter([t for _, t in done], [i for i, _ in done], s=28, color="tab:blue", zorder=5, label="measured")
    off = [i for i, c in enumerate(tried) if c.get("measured_time") is None]
    if off:
        ax.scatter([predicted[i] for i in off], off, marker="x", s=30, color="tab:red", zorder=5, label="not run")
    # the incumbent after each candidate: the path the search took, from the best row it started with; it moves
    # (a horizontal step) on the row of the candidate that beat it
    start = 100 * lines["best single row"]["rel_time"] if "best single row" in lines else None
    if start is not None:
        xs, ys, best = [start], [-0.5], start
        for i, c in enumerate(tried):
            now = best
            # only a candidate that met every budget can become the incumbent (`note`: the budget it broke)
            if c.get("measured_time") is not None and c.get("state") == "measured" and not c.get("note"):
                now = min(best, 100 * c["measured_time"])
            xs += [best, now]
            ys += [i, i]
            best = now
        xs.append(best)
        ys.append(len(tried) - 0.5)
        ax.plot(xs, ys, color="tab:green", lw=1.2, alpha=0.6, label="incumbent", zorder=2)
    colors = {"baseline": "tab:red", "best single row": "tab:purple", "all": "tab:orange", "plan": "darkgreen"}
    for label, color in colors.items():
        if label in lines:
            ln = lines[label]
            ax.axvline(100 * ln["rel_time"], color=color, lw=1, ls="-" if label == "plan" else "--", zorder=1,
                       label=f"{label}: {ln['row']} ({100 * ln['rel_time']:.0f}%)")  # fmt: skip

    def name(c: dict) -> str:
        said = "" if c.get("state") == "measured" else f" ({c.get('state')})"
        if c.get("state") == "measured" and c.get("note"):
            said = " (over a budget)"
        return f"{c['trial']}. {c['row']}{said}" if c.get("trial") else f"{c['row']}{said}"

    names = [name(c) for c in tried]
    ax.set_yticks(y, names, fontsize=7)
    ax.invert_yaxis()
    xs = [*predicted, *(t for _, t in done), *(100 * ln["rel_time"] for ln in lines.values())]
    if min(xs) > 0 and max(xs) / min(xs) > 4:
        ax.set_xscale("log")
        low, high = min(xs) / 1.3, max(xs) * 1.3
        ax.set_xlim(low, high)
        ticks = [t * 10**k for k in range(-1, 4) for t in (1, 2, 5) if low <= t * 10**k <= high]
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
    ax.set_xlabel("training time per sample, % of the baseline's (lower is faster)")
    ax.legend(fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, frameon=False)
    fig.tight_layout()
    cost = f"{search.get('trials', len(done))} trials"
    if search.get("repeats"):
        cost += f" and {search['repeats']} repeated"
    if search.get("wall_s"):
        cost += f", {search['wall_s']:.0f} s"
    not_run = f"; {skipped} candidates were never measured" if skipped else ""
    said = {"baseline": "the baseline", "best single row": "the best single row", "all": "`all`"}
    named = [words for label, words in said.items() if label in lines]
    beside = " and ".join([", ".join(named[:-1]), named[-1]] if len(named) > 1 else named)
    ending = (
        f"The plan beside {beside or 'nothing else'}"
        if "plan" in lines
        else f"No plan was recommended (plan.md says why); beside {beside or 'nothing else'}"
    )
    caption = (
        f"How did the plan search get there? Each candidate in the order measured, top to bottom (then those the "
        f"memory estimate pruned before they trained): the time it was predicted from the rows measured before it "
        f"(hollow) and the time it measured (filled); the green step is the fastest measured so far, from the best "
        f"single row, after each. {ending} ({cost}; stopped: "
        f"{search.get('stopped') or '-'}{not_run})."
    )
    return "plan", _svg(fig), caption


def batch_search_figure(result: dict, title: str | None = None) -> Any:
    """find-batch's search (SearchResult as a dict): samples/s at each batch size, the sizes that did not fit, and
    the memory measured and estimated against the limit on a second axis."""
    fig, ax = _figure(8, 5)
    points = result.get("points") or []
    ok = [p for p in points if p.get("status") == "ok" and p.get("samples_per_s")]
    ax.plot([p["batch_size"] for p in ok], [p["samples_per_s"] for p in ok], "o-", color="tab:blue",
            label="samples/s")  # fmt: skip
    failed = [p for p in points if p.get("status") in ("oom", "over_limit")]
    if failed:
        ax.plot([p["batch_size"] for p in failed], [0] * len(failed), "x", color="tab:red", ms=10, label="does not fit")
    fastest, tied = result.get("fastest"), result.get("tied") or []
    best = next((p for p in ok if p["batch_size"] == fastest), None)
    if best is not None:
        said = f"tie within the noise: {', '.join(map(str, sorted(tied)))}" if len(tied) > 1 else f"fastest: {fastest}"
        ax.annotate(said, (best["batch_size"], best["samples_per_s"]), xytext=(0, 10), textcoords="offset points",
                    ha="center", fontsize=8)  # fmt: skip
    sizes = sorted({p["batch_size"] for p in points})
    if sizes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(b) for b in sizes])
        ax.minorticks_off()
    ax.set_xlabel("batch size")
    ax.set_ylabel("samples/s over the timed steps")
    if ok:
        ax.set_ylim(0, 1.18 * max(p["samples_per_s"] for p in ok))
    if title:
        ax.set_title(title, fontsize=9)
    handles, labels = ax.get_legend_handles_labels()
    measured = [p for p in points if p.get("measured_bytes")]
    estimated = [p for p in points if p.get("estimate_bytes")]
    if measured or estimated:
        ax2 = ax.twinx()
        if measured:
            ax2.plot([p["batch_size"] for p in measured], [p["measured_bytes"] / 2**30 for p in measured], "s--",
                     color="tab:grey", label="memory, measured")  # fmt: skip
        if estimated:
            ax2.plot([p["batch_size"] for p in estimated], [p["estimate_bytes"] / 2**30 for p in estimated], "^:",
                     color="tab:brown", label="memory, estimated")  # fmt: skip
        if result.get("limit_bytes"):
            ax2.axhline(result["limit_bytes"] / 2**30, color="tab:red", lw=0.8, ls=":", label="memory limit")
        ax2.set_ylabel("GiB")
        more, also = ax2.get_legend_handles_labels()
        handles, labels = handles + more, labels + also
    ax.legend(handles, labels, fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0 if not title else 1.06),
              ncol=3, frameon=False)  # fmt: skip
    fig.tight_layout()
    return fig


def batch_search_curve(result: dict) -> tuple[str, str, str] | None:
    """find-batch's samples/s against batch size, with the memory measured and estimated (find_batch.json)."""
    if not result.get("points"):
        return None
    caption = (
        "Which batch is fastest, and which fit? find-batch's samples/s at every size it measured (a red x: did not "
        "fit), and on the right axis each size's memory as measured (the process's peak) and as estimated before it "
        "ran, against the limit (dotted red)."
    )
    return "find-batch", _svg(batch_search_figure(result)), caption


FIGURES: tuple[Callable[[list[StudyRow]], tuple[str, str, str] | None], ...] = (
    tradeoff,
    losses,
    step_parts,
    sweep_curve,
)  # and memory_parts (with the rows' estimates), fourth
