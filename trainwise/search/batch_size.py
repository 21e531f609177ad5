"""find-batch: the fastest batch size that fits, found by measured throughput.

Batch finders (Lightning's Tuner, accelerate's find_executable_batch_size) stop at the largest batch
that fits. Larger is not always faster: this search climbs the candidate sizes, skips those the
memory estimate says cannot fit, runs each remaining one as a short measured trial in its own
process (an out-of-memory kills only that process; the search records it and goes on), bisects
between the largest fit and the first failure, then picks the size with the highest samples/s.

"Fits" on CUDA: no OOM and the trial's reserved memory + CUDA context under the limit. On CPU, where
an OOM means the kernel's OOM killer, fitting is judged against `--memory-limit` (default: the
available RAM minus a margin) with the trial's peak RSS. Beside the process's total each size shows
the peak of live tensors, measured and estimated: the one quantity `compare` and `estimate` share.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import psutil

from trainwise import strategies
from trainwise.core.errors import ConfigError
from trainwise.core.files import hold, write_atomic, writing
from trainwise.core.option import option
from trainwise.core.results import TrialResult
from trainwise.core.units import parse_bytes
from trainwise.estimating.peak import estimate_plan, runtime_overhead, target_length
from trainwise.estimating.probe import calibrate
from trainwise.estimating.shapes import shape_of
from trainwise.report.format import human_bytes
from trainwise.run.events import Event, Note, Step
from trainwise.spec.config import StudyConfig
from trainwise.study.store import FIND_BATCH, PAGE, RESULTS, page_of, read_results, read_settings
from trainwise.training.measure.memory import CUDA_CONTEXT_BYTES
from trainwise.training.models import ModelSource, model_config


@dataclass
class BatchPoint:
    batch_size: int
    status: str  # ok | oom | over_limit | skipped | error | timeout | crashed
    note: str = ""
    samples_per_s: float | None = None
    step_time_s: float | None = None
    measured_bytes: int | None = None  # the process's total: CPU peak RSS; CUDA reserved + context
    estimate_bytes: int | None = None  # predicted total (tensors + runtime), when an estimate was made
    tensor_bytes: int | None = None  # measured peak of live tensors (compare's peak mem)
    estimate_tensor_bytes: int | None = None  # the estimate of the same (estimate's peak)
    timed_steps: int = 0
    noise: float | None = None  # relative: how far samples/s may stray by noise alone (None: too few steps)

    @property
    def fits(self) -> bool:
        return self.status == "ok"


@dataclass
class SearchResult:
    points: list[BatchPoint]  # every size looked at, ascending
    largest_fit: int | None
    fastest: int | None
    limit_bytes: int
    tied: list[int] = field(default_factory=list)  # sizes within the noise of the fastest, itself first
    device: str | None = None  # cpu | cuda: what the memory figures are (None: written before it was recorded)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> SearchResult:
        """A find_batch.json read back (fields an earlier release did not write take their defaults)."""
        known = {f.name for f in fields(BatchPoint)}
        points = [BatchPoint(**{k: v for k, v in p.items() if k in known}) for p in d["points"]]
        tied = list(d.get("tied") or [])
        return cls(points, d.get("largest_fit"), d.get("fastest"), int(d["limit_bytes"]), tied, d.get("device"))

    def mark(self, batch_size: int) -> str:
        """What the table says beside a size: ' (fastest)', or ' (tie)' for each size of a tie."""
        if len(self.tied) > 1:
            return " (tie)" if batch_size in self.tied else ""
        return " (fastest)" if batch_size == self.fastest else ""

    def verdict(self) -> str:
        """The pick in one line: the fastest size, or a tie named as one, and the noise it was judged with."""
        if self.fastest is None:
            return "nothing fitted: try a smaller candidate or a memory-saving plan (see `trainwise estimate`)"
        speed = {p.batch_size: p for p in self.points}
        best = speed[self.fastest]
        noise = _noise_said([speed[b] for b in self.tied] or [best])
        largest = f"; largest that fits: {self.largest_fit}"
        if len(self.tied) > 1:
            sizes = ", ".join(map(str, sorted(self.tied)))
            rates = ", ".join(f"{speed[b].samples_per_s:.1f}" for b in sorted(self.tied))
            return f"fastest: a tie within the noise between batches {sizes} ({rates} samples/s; {noise}){largest}"
        others = [p for p in self.points if p.fits and p.samples_per_s and p is not best]
        lead = ""
        if others:
            runner = max(others, key=lambda p: p.samples_per_s or 0.0)
            gap = (best.samples_per_s or 0.0) / (runner.samples_per_s or 1.0) - 1
            lead = f", {100 * gap:.1f}% ahead of batch {runner.batch_size}"
        return f"fastest: batch {best.batch_size} ({best.samples_per_s:.1f} samples/s{lead}; {noise}){largest}"


def point_noise(r: TrialResult) -> float | None:
    """How far a size's samples/s may stray by noise alone, relative: `compare`'s noise floor for one repeat
    (twice the standard error of the difference of two median steps, from the step-to-step variation)."""
    from trainwise.study.aggregate import noise_floor  # heavy: trainwise.study.aggregate loads numpy

    return noise_floor(r, [])[0]


def ties(points: list[BatchPoint]) -> list[int]:
    """The fastest size and every size whose samples/s is within the noise of it (the larger of the two
    sizes' noise); without a noise figure (one timed step), only the sizes that measured the same at the
    precision shown (0.1 samples/s)."""
    ok = [p for p in points if p.fits and p.samples_per_s]
    if not ok:
        return []
    best = max(ok, key=lambda p: p.samples_per_s or 0.0)
    top = best.samples_per_s or 0.0

    def tied(p: BatchPoint) -> bool:
        floors = [n for n in (best.noise, p.noise) if n is not None]
        if p is best or f"{p.samples_per_s:.1f}" == f"{top:.1f}":
            return True
        return bool(floors) and (top - (p.samples_per_s or 0.0)) / top <= max(floors)

    return [best.batch_size, *(p.batch_size for p in ok if p is not best and tied(p))]


def _noise_said(points: list[BatchPoint]) -> str:
    known = [p.noise for p in points if p.noise is not None]
    if not known:
        steps = min(p.timed_steps for p in points)
        return (
            f"noise not measured: {steps} timed step{'s' if steps != 1 else ''} per size; --steps 3 or more measures "
            "it, and only equal figures are called a tie"
        )
    steps = min(p.timed_steps for p in points)
    return f"noise ±{100 * max(known):.1f}% (from each size's {steps}+ timed steps, as compare's noise floor)"


def measured_bytes(result: TrialResult, device: str) -> int | None:

    if device == "cuda":
        return None if result.peak_reserved_bytes is None else result.peak_reserved_bytes + CUDA_CONTEXT_BYTES
    return result.peak_rss_bytes


def search(
    candidates: list[int],
    limit: int,
    run: Callable[[int], TrialResult],
    device: str,
    estimate: Callable[[int], Any] | None = None,
    refine: int = 2,
    multiple_of: int = 1,
) -> SearchResult:
    """Climb `candidates` (ascending), stop at the first size that does not fit, bisect, pick the fastest."""
    points: dict[int, BatchPoint] = {}

    def try_size(b: int) -> BatchPoint:
        est = estimate(b) if estimate else None  # a MemoryEstimate (total_bytes, peak_bytes)
        total, tensors = (est.total_bytes, est.peak_bytes) if est is not None else (None, None)
        if total is not None and total > limit:
            return BatchPoint(
                b,
                "skipped",
                f"estimate {total / 2**30:.2f} GiB > limit",
                estimate_bytes=total,
                estimate_tensor_bytes=tensors,
            )
        r = run(b)
        point = BatchPoint(b, r.status, r.message, estimate_bytes=total, estimate_tensor_bytes=tensors)
        if r.status == "ok":
            point.samples_per_s, point.step_time_s = r.samples_per_s, r.step_time_s
            point.timed_steps, point.noise = r.timed_steps, point_noise(r)
            point.measured_bytes, point.tensor_bytes = measured_bytes(r, device), r.peak_mem_bytes
            if point.measured_bytes is not None and point.measured_bytes > limit:
                point.status, point.note = "over_limit", f"measured {point.measured_bytes / 2**30:.2f} GiB > limit"
        return point

    first_fail: int | None = None
    for b in sorted(set(candidates)):
        if first_fail is not None:
            points[b] = BatchPoint(b, "skipped", f"larger than {first_fail}, which did not fit")
            continue
        points[b] = try_size(b)
        if points[b].status in ("oom", "over_limit", "skipped"):
            first_fail = b
    # bisect between the largest size that fit and the first that did not
    for _ in range(refine):
        fits = [b for b, p in points.items() if p.fits]
        if first_fail is None or not fits:
            break
        low = max(b for b in fits if b < first_fail) if any(b < first_fail for b in fits) else None
        if low is None:
            break
        mid = (low + first_fail) // 2
        mid -= mid % multiple_of
        if mid <= low or mid in points:
            break
        points[mid] = try_size(mid)
        if not points[mid].fits:
            first_fail = mid
    ordered = [points[b] for b in sorted(points)]
    ok = [p for p in ordered if p.fits and p.samples_per_s]
    return SearchResult(
        points=ordered,
        largest_fit=max((p.batch_size for p in ok), default=None),
        fastest=max(ok, key=lambda p: p.samples_per_s or 0).batch_size if ok else None,
        limit_bytes=limit,
        tied=ties(ordered),
        device=device,
    )


def default_limit(device: str) -> int:
    """CUDA: the device's memory. CPU: available RAM minus 10% (at least 1 GiB) for everything else."""
    if device == "cuda":
        import torch  # heavy: torch

        return int(torch.cuda.get_device_properties(0).total_memory)

    available = int(psutil.virtual_memory().available)
    return available - max(2**30, available // 10)


@dataclass(frozen=True)
class FindBatchConfig:
    """The search's own options (the model, data and plan come as a StudyConfig), validated here."""

    candidates: str = option("4,8,16,32,64,128", "Batch sizes to try, ascending (comma list).")
    steps: int = option(4, "Optimizer steps per size, the first untimed.")
    # the option's text (8GB), parsed to bytes into `limit`
    memory_limit: str | None = option(None, "Fit limit, e.g. 8GB (default: the device's, or RAM - 10%).")
    refine: int = option(2, "Bisection steps between the largest fit and the first failure.")
    use_estimate: bool = option(True, "Skip sizes the estimate rules out.", "--estimate/--no-estimate")
    sizes: tuple[int, ...] = field(init=False)
    limit: int | None = field(init=False)  # memory_limit in bytes (None: the device's)

    def __post_init__(self) -> None:
        memory = self.memory_limit
        object.__setattr__(self, "limit", parse_bytes(memory, "--memory-limit") if memory is not None else None)
        try:
            sizes = sorted({int(x) for x in self.candidates.split(",") if x.strip()})
        except ValueError:
            raise ConfigError(f"--candidates {self.candidates!r}: give batch sizes like 8,16,32") from None
        if not sizes or sizes[0] <= 0:
            raise ConfigError(f"--candidates {self.candidates!r}: give positive batch sizes like 8,16,32")
        if self.steps < 2:
            raise ConfigError(f"--steps must be >= 2 (the first is untimed), got {self.steps}")
        if self.refine < 0:
            raise ConfigError(f"--refine must be >= 0 bisection steps, got {self.refine}")
        object.__setattr__(self, "sizes", tuple(sizes))


@dataclass
class FindBatchReport:
    title: str
    result: SearchResult
    paths: list[Path]
    device: str
    too_big: list[int]  # candidates larger than the training data
    n_train: int


def find_batch(
    row_text: str,
    accum_steps: int,
    config: Callable[[int], StudyConfig],
    fb: FindBatchConfig,
    launch: Callable,
    on_status: Callable[[str], None],
    on_point: Callable[[str], None],
) -> FindBatchReport:
    """Prepare the study once (`config(batch size)`: a study of the one row), then search the candidates."""
    from trainwise.study.prepare import prepare_study  # heavy: trainwise.study.prepare loads numpy
    from trainwise.study.run import refused  # heavy: trainwise.study.run loads numpy

    rows = strategies.parse_rows(row_text, accum_steps)
    if len(rows) != 1:
        raise ConfigError(f"--strategies {row_text!r}: find-batch sizes one plan (a '+' combination)")
    row = rows[0]
    if row.batch_size:
        raise ConfigError(
            f"--strategies {row_text!r}: find-batch searches the batch size; leave out @bs{row.batch_size}"
        )
    accum = strategies.runtime(row.plan, "classification", "cpu").accum_steps
    usable = [b for b in fb.sizes if b % accum == 0]
    if not usable:
        raise ConfigError(f"no candidate is a multiple of --accum-steps {accum}")
    on_status("validating input, preparing data and model...")
    prepared = prepare_study(config(usable[0]), on_point)
    base = prepared.specs[0]
    s = base.settings
    limit = fb.limit if fb.limit is not None else default_limit(s.device)
    too_big = [b for b in usable if b > s.n_train]
    usable = [b for b in usable if b <= s.n_train]
    if not usable:
        raise ConfigError(f"every candidate is larger than the {s.n_train} training rows")
    model_state: dict = {}  # shapes, calibration and runtime: once per search, not once per size

    def estimate_of(b: int) -> Any:
        if not fb.use_estimate:
            return None
        on_status(f"batch {b}: estimating memory (calibration probe on first use)")
        if not model_state:
            cfg = model_config(ModelSource(s.model_kind, s.model_ref), s.task, s.num_labels or 2)
            model_state["shape"] = shape_of(cfg, s.task, base.plan)
            model_state["cal"] = calibrate(cfg, s.task, base.plan, s.device)
            model_state["overhead"] = runtime_overhead(s.device)
        return estimate_plan(
            model_state["shape"],
            model_state["cal"],
            base.plan,
            b,
            s.max_length,
            target_length(s.task, s.max_length, s.max_target_length),
            s.device,
            overhead=model_state["overhead"],
        )

    def run(b: int) -> TrialResult:
        spec = dataclasses.replace(base, settings=dataclasses.replace(s, batch_size=b))

        def on_event(e: Event) -> None:
            if isinstance(e, Step):
                on_status(f"batch {b}: step {e.step}/{e.total}, {e.step_s or 0.0:.2f} s")
            elif isinstance(e, Note):  # the launcher's word (on a cluster: which node the probe runs on)
                on_point(f"batch {b}: {e.text}")

        on_status(f"batch {b}: starting")
        trial_dir = prepared.out / "trials" / f"bs{b}"
        r = launch(spec, trial_dir, prepared.config.trial_timeout, on_event)
        refused(r, trial_dir)  # a full disk is not "does not fit": the search stops with one line
        on_point(f"batch {b}: " + (f"{r.samples_per_s:.1f} samples/s" if r.status == "ok" else r.status))
        return r

    result = search(usable, limit, run, s.device, estimate_of, fb.refine, multiple_of=accum)
    title = f"trainwise find-batch: {s.model_label} / {row.text} / {s.device}, limit {human_bytes(limit)}"
    return FindBatchReport(title, result, write_outputs(result, prepared.out, title), s.device, too_big, s.n_train)


def write_outputs(result: SearchResult, out: Path, title: str) -> list[Path]:
    """find_batch.json (the search, read back by `trainwise report`), find_batch.png and report.html (the page: the
    verdict, every size's figures and the curve), each written whole."""
    from trainwise.report.figures import batch_search_figure, png  # heavy: matplotlib
    from trainwise.report.html import batch_page  # (beside the figures it shows)

    out.mkdir(parents=True, exist_ok=True)
    data, page = out / FIND_BATCH, out / PAGE
    with hold(out):  # one command at a time in --out (a compare's study there: its page is drawn again, with this)
        write_atomic(data, json.dumps({**result.to_dict(), "title": title}, indent=1))  # `trainwise report` reads it
        chart, tmp = out / "find_batch.png", out / ".find_batch.tmp.png"
        with writing(chart, tmp):
            png(batch_search_figure(result.to_dict(), title), tmp)
            tmp.replace(chart)
        if (out / RESULTS).is_file():
            settings = read_settings(out)
            text = page_of(out, read_results(out), str(settings.get("title") or title), settings)
        else:
            text = batch_page(result, title)
        write_atomic(page, text)
    return [data, chart, page]
