"""Formatting of the comparison table's cells, shared by the terminal and markdown reports."""

from __future__ import annotations

import dataclasses

from trainwise.core.files import human_bytes
from trainwise.core.results import StudyRow

HEADERS = [
    "strategy",
    "status",
    "step (s)",
    "data (s)",
    "optim (s)",
    "samples/s",
    "epoch (s)",
    "time %",
    "peak mem",
    "mem %",
    "state",
    "pad waste",
    "loss",
    "quality",
]


def headers(table: list[StudyRow]) -> list[str]:
    """The table's columns: HEADERS with RSS after peak mem on CPU, then MFU, and $/epoch when the study
    was priced (see add_cost)."""
    cols = list(HEADERS)
    if has_rss(table):
        cols.insert(cols.index("mem %") + 1, "RSS")
    if has_loss_share(table):
        cols.insert(cols.index("pad waste") + 1, "loss tok")
        cols.insert(cols.index("loss tok") + 1, "loss tok/s")
    return cols + ["MFU"] + (["$/epoch"] if any(e.priced for e in table) else [])


def has_rss(table: list[StudyRow]) -> bool:
    return any(e.mem_kind == "cpu_allocated" for e in table)


def has_loss_share(table: list[StudyRow]) -> bool:
    """A causal-lm study: the table shows the share of tokens that carry loss."""
    return any(e.loss_token_share is not None for e in table)


def supervised_tokens_per_s(e: StudyRow) -> float | None:
    """A causal LM's tokens that carry loss, per second: what fine-tuning learns from (packing raises it)."""
    if e.tokens_per_s is None or e.loss_token_share is None:
        return None
    return e.tokens_per_s * e.loss_token_share


def add_cost(table: list[StudyRow], price) -> list[StudyRow]:
    """The rows with their projected epoch priced (trainwise.search.cost.Price; re-work included for low-priority)."""
    note = price.label + (
        f", x{price.rework_factor():.3f} expected re-work ({price.preemptions_per_hour:g} preemptions/h, "
        f"checkpoint every {60 * price.checkpoint_hours:g} min, restart {60 * price.restart_hours:g} min)"
        if price.low_priority
        else ""
    )
    priced = []
    for e in table:
        device = e.env.get("device_name")
        mismatch = price.mismatch(str(device)) if device else None
        priced.append(
            dataclasses.replace(
                e,
                cost_per_epoch=price.cost(e.epoch_time_s) if e.epoch_time_s is not None else None,
                cost_note=note + (f"; note: {mismatch}" if mismatch else ""),
            )
        )
    return priced


def _seconds(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}" if x >= 100 else f"{x:.1f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def quality(e: StudyRow) -> str:
    if e.metric is None:
        return "-"
    mark = " (random init)" if e.random_init else ""
    if e.metric_name == "accuracy":
        return f"acc {e.metric:.1f}%{mark}"
    if e.metric_name == "neg_eval_loss":  # a causal LM: perplexity, and the evaluation loss the metric negates
        ppl = (e.metrics or {}).get("perplexity")
        shown = "-" if ppl is None else f"{ppl:.1f}" if ppl < 1000 else f"{ppl:,.0f}"
        rouge = (e.metrics or {}).get("rougeL")  # prompt/response data: greedy answers vs the references
        return f"ppl {shown} (loss {-e.metric:.3f})" + ("" if rouge is None else f" R-L {rouge:.1f}") + mark
    return f"R-L {e.metric:.1f} / BLEU {(e.metrics or {}).get('bleu', 0):.1f}{mark}"


RANDOM_INIT_NOTE = (
    "random init: quality not meaningful — the model is a size preset with random weights, so its quality "
    "after a short trial measures learning from scratch, not what fine-tuning a pretrained model reaches; "
    "pass --model with pretrained weights (a local directory, a hub id, all-MiniLM-L6-v2) to compare quality."
)


def footnotes(table: list[StudyRow]) -> dict[str, int]:
    """Footnote number of every row that did not end ok, in table order."""
    failed = [e.strategy for e in table if e.status != "ok"]
    return {name: i for i, name in enumerate(failed, 1)}


def _fixed(x: float | None, digits: int) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def table_cells(table: list[StudyRow]) -> list[list[str]]:
    """Every row's cells, as the terminal, report.md, report.html and W&B show the table: with its footnote marks,
    and the RSS and loss-share columns where a row has them."""
    marks, rss, share = footnotes(table), has_rss(table), has_loss_share(table)
    return [cells(e, marks.get(e.strategy), rss, share) for e in table]


def cells(e: StudyRow, note: int | None = None, with_rss: bool = False, with_loss_share: bool = False) -> list[str]:
    """A row's cells under `headers(table)` (`with_rss`: the table has the RSS column; `with_loss_share`: the
    loss tok column, has_loss_share)."""
    ok = e.status == "ok"
    row = [
        e.strategy,
        e.status if note is None else f"{e.status} [{note}]",
        _fixed(e.step_time_s, 3) if ok else "-",
        _fixed(e.data_wait_s, 3) if ok else "-",
        _fixed(e.optimizer_s, 3) if ok else "-",
        _fixed(e.samples_per_s, 1) if ok else "-",
        _seconds(e.epoch_time_s) if ok else "-",
        _time_cell(e),
        human_bytes(e.peak_mem_bytes) if ok else "-",
        _pct(e.rel_mem),
    ]
    rest = [
        human_bytes(e.state_bytes) if ok else "-",
        _pct(e.padding_waste) if ok else "-",
        *(
            [_pct(e.loss_token_share) if ok else "-", _fixed(supervised_tokens_per_s(e), 0) if ok else "-"]
            if with_loss_share
            else []
        ),
        _fixed(e.train_loss, 3) if ok else "-",
        quality(e) if ok else "-",
        _mfu(e.mfu) if ok else "-",
    ] + ([f"{e.cost_per_epoch:.4g}" if e.cost_per_epoch is not None else "-"] if e.priced else [])
    rss = [human_bytes(e.peak_rss_bytes) if ok else "-"] if with_rss else []
    return row + rss + rest


def _time_cell(e: StudyRow) -> str:
    """time %: relative to the baseline; '≈ baseline' inside the noise floor; '(loaded)' when timed under
    load; for a row recorded from the precision micro-benchmark (not trained), that ratio, marked."""
    if e.status == "emulated" and e.precision_ratio:
        return f"~{100 * e.precision_ratio:.0f}% (linear)"
    if e.status != "ok":
        return "-"
    cell = "≈ baseline" if e.within_noise else _pct(e.rel_time)
    return cell + (" (loaded)" if e.contended else " (uncertain)" if e.uncertain else "")


def _mfu(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%" if x < 0.1 else f"{100 * x:.0f}%"


def _clock_fell(mhz: list | None) -> bool:
    return bool(mhz and mhz[0] and mhz[1] < 0.9 * mhz[0])


def _peak_label(e: StudyRow) -> str:
    """The probe's mode, e.g. fp32, autocast-bf16, weights-bf16 (stores from before it: the dtype)."""
    return e.peak_mode or e.compute_dtype or "?"


def _mfu_notes(table: list[StudyRow]) -> list[str]:
    ok = [e for e in table if e.status == "ok"]
    counted = [e for e in ok if e.mfu is not None]
    lines = [f"{e.strategy}: {e.mfu_note}" for e in ok if e.mfu_note]
    if not counted:
        return lines
    peaks = sorted({(_peak_label(e), e.peak_flops_per_s) for e in counted if e.peak_flops_per_s})
    return [
        "MFU: FLOPs of a step counted by torch.utils.flop_counter (matmuls, convolutions, attention; on one "
        "extra step, scaled to the average step by padded positions) / step time / this device's peak for a "
        "linear layer run as the row runs its matmuls, measured by a probe ("
        + ", ".join(f"{d} {p / 1e9:.0f} GFLOP/s" for d, p in peaks)
        + "; cached). Recomputed forwards (grad_ckpt) and padding count as executed FLOPs.",
        *lines,
    ]


def majority_note(entries: list[StudyRow]) -> str | None:
    """For accuracy: what always answering the held-out rows' commonest class scores, and a warning when
    no row beats it (the model has not learned the task yet: its quality figures compare nothing)."""
    shares = {(e.metrics or {}).get("majority_accuracy") for e in entries} - {None}
    scores = [e.metric for e in entries if e.metric is not None and e.metric_name == "accuracy"]
    if len(shares) != 1 or not scores:
        return None
    share = float(shares.pop() or 0.0)
    line = f"accuracy: always answering the commonest class scores {share:.1f}% on these held-out rows"
    if max(scores) <= share + 0.5:
        line += "; no row beats it: the model has not learned the task yet (train longer, or raise --lr)"
    return line


def notes(table: list[StudyRow]) -> list[str]:
    base = next((e for e in table if e.baseline), None)
    marks = footnotes(table)
    lines = [f"[{marks[e.strategy]}] {e.strategy}: {e.status}: {e.message}" for e in table if e.strategy in marks]
    if base is None or base.status != "ok":
        lines.append("No successful baseline row: time % and mem % are not available.")
    floor = next((e for e in table if e.noise_floor is not None), None)
    if floor is not None and floor.noise_floor is not None:
        close = [e.strategy for e in table if e.within_noise]
        lines.append(
            f"noise floor ±{100 * floor.noise_floor:.1f}% ({floor.noise_source}): time % reads "
            f"'≈ baseline' inside it" + (f" ({', '.join(close)})" if close else "; no row is inside it")
        )
    loaded = [e for e in table if e.status == "ok" and e.contended]
    if loaded:
        lines.append(
            "measured under load — timings unreliable, no verdict on their time % (other processes' share of "
            "the CPUs during the timed steps, after every re-run --retries allowed; run again on a quiet "
            "machine): " + ", ".join(f"{e.strategy} {_pct(e.other_cpu_share)}" for e in loaded)
        )
    uncertain = [e for e in table if e.uncertain]
    if uncertain:
        lines.append(
            "uncertain: other processes used the CPUs while these rows or the baseline were timed (under the "
            "share that flags a trial as loaded), enough to explain their difference from the baseline (a step's "
            "threads wait for the most loaded core: others taking a share s of n CPUs, on one core, make it up to "
            "c/(1-c) longer, c = s x n); no verdict on their time %, run them again on a quiet machine: "
            + ", ".join(
                f"{e.strategy} {_pct(max(e.other_cpu_share or 0.0, (base.other_cpu_share or 0.0) if base else 0.0))}"
                " of the CPUs"
                for e in uncertain
            )
        )
    rerun = [e for e in table if e.discarded_runs]
    if rerun:
        lines.append(
            "re-measured: runs timed under load were discarded and run again once the machine was quiet ("
            + ", ".join(f"{e.strategy} {e.discarded_runs}" for e in rerun)
            + "); the noise floor and time % use the clean runs"
        )
    lines += [f"{e.strategy}: {e.support_note}" for e in table if e.status == "ok" and e.support_note]
    throttled = [(e, e.cpu_mhz) for e in table if e.status == "ok" and e.cpu_mhz and _clock_fell(e.cpu_mhz)]
    if throttled:
        lines.append(
            "the CPU clock fell during the timed steps (throttling: slower steps with no other process): "
            + ", ".join(f"{e.strategy} {mhz[0]:.0f} -> {mhz[1]:.0f} MHz" for e, mhz in throttled)
        )
    if (line := majority_note([e for e in table if e.status == "ok"])) is not None:
        lines.append(line)
    if has_loss_share(table):
        lines.append(
            "loss tok: the share of the training set's tokens that carry loss, counted over every example as "
            "encoded at --max-length, not over the batches a trial drew (the response tokens of prompt/response "
            "data, the assistant turns of chat data, every token of raw text); quality: perplexity "
            "exp(eval loss) on the held-out rows and the eval loss, mean cross-entropy per loss token (the metric is "
            "minus it: higher is better); R-L (prompt/response and chat data): ROUGE-L x100 of greedy answers (at "
            "most --max-target-length tokens) against the reference responses (chat: the last assistant turns); "
            "loss tok/s: tokens/s x loss tok, the tokens learned from per second."
        )
    kinds = {e.mem_kind for e in table if e.mem_kind}
    if "cpu_allocated" in kinds:
        lines.append(
            "peak mem (CPU): the peak of live tensor bytes in a training step (the allocator's peak, what "
            "`trainwise estimate` predicts), read by torch.profiler on one extra step on the trial's largest "
            "batch after the timed ones; RSS: the trial process's peak resident memory (what the OS sees: "
            "libraries, data, and memory glibc keeps after tensors are freed)."
        )
    if "cpu_rss_delta" in kinds:
        lines.append(
            "peak mem (CPU): the trial process's peak RSS minus its RSS just before the model was built "
            "(glibc keeps freed memory, so savings under ~15% can hide in it; 'state' is counted exactly)."
        )
    if "cuda_allocated" in kinds:
        lines.append("peak mem (CUDA): torch.cuda.max_memory_allocated over the training steps.")
    lines.append("state: weights + gradients + optimizer state bytes, counted from the tensors.")
    lines += _mfu_notes(table)
    if any(e.random_init and e.metric is not None for e in table):
        lines.append(RANDOM_INIT_NOTE)
    priced = next((e for e in table if e.cost_note), None)
    if priced:
        lines.append(f"$/epoch: USD for one projected epoch at {priced.cost_note}.")
    traces = [e for e in table if e.trace]
    if traces:
        lines.append(
            "--profile: times include the profiler's overhead; traces (chrome://tracing, ui.perfetto.dev): "
            + "; ".join(f"{e.strategy}: {e.trace}" for e in traces)
        )
    for e in table:
        if e.status == "ok" and e.compile_s is not None:
            lines.append(
                f"{e.strategy}: torch.compile took {e.compile_s:.1f} s in the untimed warm-up steps "
                "(not in step time; a new input shape compiles again, see p90 in results.csv)."
            )
        if e.status != "ok":
            continue
        ds = e.plan.get("zero_stage")
        ds_note = "; DeepSpeed steps inside backward (its step is in step (s), optim (s) ~0)" if ds else ""
        peaks = e.rank_peak_mem_bytes or []
        if (e.world_size or 1) > 1 and peaks:
            lines.append(
                f"{e.strategy}: {e.world_size} ranks, peak mem per rank "
                f"{', '.join(human_bytes(p) for p in peaks)} (total {human_bytes(sum(peaks))}){ds_note}."
            )
        elif ds_note:
            lines.append(f"{e.strategy}:{ds_note[1:]}.")
    if any((e.world_size or 1) > 1 for e in table):
        lines.append(
            "ranks: time is the slowest rank's, samples/s all ranks', peak mem the largest rank's, state per rank."
        )
    lines.append(
        "step (s): timed seconds / timed steps; samples/s: samples / timed seconds (every time figure of a "
        "row comes from these totals); "
        "time %: baseline samples/s / row samples/s; data (s): median wait for the next batch per step "
        "(DataLoader); optim (s): median clip + optimizer step + zero_grad; epoch (s): training samples / "
        "samples/s; loss: true mean over the last 5 optimizer steps."
    )
    return lines


# find-batch's process memory column: what the limit is judged on, by device (a search written before the device was
# recorded: either)
PROCESS = {"cuda": ("reserved+ctx", "reserved memory + CUDA context"), "cpu": ("RSS", "the trial process's peak RSS")}
EITHER = ("process", "the process's memory (RSS on a CPU, reserved + context on a GPU)")


def batch_cells(result) -> tuple[list[str], list[list[str]]]:
    """find-batch's table (a find_batch.SearchResult): its headers and each size's cells, for the terminal, the page
    and report.md alike."""
    process = PROCESS.get(result.device or "", EITHER)[0]
    cols = ["batch", "status", "samples/s", "step time", "tensors", "est. tensors", process, "est. total", "note"]
    rows = [
        [
            f"{p.batch_size}{result.mark(p.batch_size)}",
            p.status,
            "-" if p.samples_per_s is None else f"{p.samples_per_s:.1f}",
            "-" if p.step_time_s is None else f"{p.step_time_s:.3f} s",
            human_bytes(p.tensor_bytes),
            human_bytes(p.estimate_tensor_bytes),
            human_bytes(p.measured_bytes),
            human_bytes(p.estimate_bytes),
            p.note,
        ]
        for p in result.points
    ]
    return cols, rows


def batch_legend(result) -> str:
    """What find-batch's memory columns are."""
    process, kind = PROCESS.get(result.device or "", EITHER)
    return (
        "tensors: peak of live tensors, measured (compare's peak mem) and estimated (trainwise estimate's peak); "
        f"{process}: {kind}, what the limit is judged on; est. total: the estimate's tensors + runtime."
    )
