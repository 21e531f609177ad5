"""`trainwise estimate` as a call: each plan's peak training memory, predicted without training (the model
and the calibration are `trainwise.estimating`); when none fits the device memory, why, and what would."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trainwise.api import from_objects
from trainwise.api.options import EstimateOptions
from trainwise.api.render import STDERR, Render, probes
from trainwise.core.errors import ConfigError
from trainwise.estimating.data import DataFacts, EstimateConfig
from trainwise.estimating.peak import MemoryEstimate, estimate_plan, min_ranks_for_zero3, runtime_overhead, what_fits
from trainwise.estimating.probe import LOOSE_FIT, Calibration, calibrate
from trainwise.estimating.shapes import Shape, shape_of, terms_of
from trainwise.report.format import human_bytes
from trainwise.strategies.knobs import TrialPlan
from trainwise.training.models import model_config, resolve_model


def start(options: EstimateOptions, render: Render | None = STDERR) -> EstimateReport:
    render = Render.of(render)
    cfg = options.resolve()
    with render.status("calibrating...") as status:
        return run_estimate(options.model, options.model_preset, cfg, render.update(status))


def estimate(config: str | Path | None = None, render: Render | None = STDERR, **options: Any) -> EstimateReport:
    """`trainwise estimate` in Python: the CLI's options as keyword arguments (over a study file's).
    Returns the report (`.estimates`, `.to_json()`). `trainer=`, or `model=` (the object) with `train_dataset=`,
    `processing_class=` and `args=`: the estimate of your own training, the baseline and yours (your arguments'
    strategies), at your arguments' settings (`trainwise.api.from_objects`)."""
    objects = from_objects.pop_objects(options)
    if objects is not None:
        return from_objects.estimate(objects, options, config, render, start)
    return start(EstimateOptions.of(options, config), render)


@dataclass
class EstimateReport:
    """What `trainwise estimate` prints: the estimates, what would fit, and the notes that explain them."""

    title: str
    model: str
    device: str
    n_params: int
    budget: int | None
    estimates: list[tuple[str, MemoryEstimate]]
    calibrations: list[Calibration]
    rescue: list[tuple[str, MemoryEstimate]]
    notes: list[str]

    def to_json(self) -> dict:
        return {
            "model": self.model,
            "device": self.device,
            "device_memory": self.budget,
            "n_params": self.n_params,
            "estimates": [{"strategy": r, **e.to_dict(), "fits": e.fits(self.budget)} for r, e in self.estimates],
            "calibration": [asdict(c) for c in self.calibrations],
            "would_fit": [{"plan": label, **e.to_dict()} for label, e in self.rescue],
            "notes": self.notes,
        }


def run_estimate(
    model: str | None, model_preset: str | None, cfg: EstimateConfig, on_status: Callable[[str], None]
) -> EstimateReport:
    """Estimate every row of `cfg`; when none fits the device memory, say why and what would."""
    import torch  # heavy: torch

    target = "cuda" if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()) else "cpu"
    probe_device = target if target == "cpu" or torch.cuda.is_available() else "cpu"
    source = resolve_model(model, model_preset, cfg.task, (cfg.max_length, cfg.max_target_length))
    facts = None
    if cfg.dataset or cfg.train_file:
        on_status("reading the data (classes, token lengths)...")
        facts = DataFacts.read(cfg, source)
    num_labels = facts.num_labels if facts else cfg.num_labels or 2
    config = model_config(source, cfg.task, num_labels)
    shapes: dict[TrialPlan, Shape] = {}
    cals: dict[str, Calibration] = {}

    def shape_for(plan: TrialPlan) -> Shape:
        if plan not in shapes:
            shapes[plan] = shape_of(config, cfg.task, plan)
        return shapes[plan]

    def cal_for(plan: TrialPlan) -> Calibration:
        key = json.dumps(terms_of(plan, probe_device).probe, sort_keys=True, default=list)
        if key not in cals:
            what = f"calibrating activations ({config.model_type}, {probe_device}, once: then cached)"
            cals[key] = calibrate(config, cfg.task, plan, probe_device, probes(on_status, what))
        return cals[key]

    from transformers import AutoModelForSeq2SeqLM  # noqa: F401  (loaded before the runtime is measured)

    overhead = runtime_overhead(target)  # before any probe grows this process
    estimates = []
    for row in cfg.parsed:
        try:
            shape = shape_for(row.plan)
        except ValueError as err:
            raise ConfigError(f"{row.text}: {err}") from None
        lengths = facts.lengths(row.plan, cfg) if facts else (cfg.max_length, cfg.max_target_length)
        batch = row.batch_size or cfg.batch_size  # a `row@bsN` (a plan's) at its own batch
        est = estimate_plan(shape, cal_for(row.plan), row.plan, batch, *lengths, target, cfg.nproc, overhead)
        estimates.append((row.text, est))
    base_shape = shape_for(TrialPlan())
    budget = cfg.budget
    fits_none = budget is not None and not any(e.fits(budget) for _, e in estimates)
    rescue = what_fits(shape_for, cal_for, cfg, target, budget, overhead) if fits_none and budget else []
    runtime_what = (
        "CUDA context, assumed" if target == "cuda" else "this process's RSS with torch + transformers loaded"
    )
    notes = [
        "peak = weights + optimizer + max(activations [+ grads under accumulation], grads + step temps); total "
        f"adds {human_bytes(overhead)} runtime ({runtime_what})."
    ]
    for c in cals.values():
        source_note = "tiny configs of the family" if c.how == "tiny-config probe" else "its own config at 1-3 layers"
        notes.append(
            f"activations: calibrated by a measured probe, {c.probes} forward/backward passes of {source_note} "
            f"on {c.device} ({c.family}, {c.describe()}; fit error {100 * c.residual:.1f}%, added to them as a "
            f"margin; {c.provenance()})."
        )
        if c.residual > LOOSE_FIT:
            notes.append(
                f"the activation fit for {c.describe()} is loose ({100 * c.residual:.1f}% median error on its probes, "
                "some probes above that): near the limit, measure with trainwise find-batch."
            )
        if c.how != "tiny-config probe":
            notes.append(f"family {c.family!r} has no tiny-config recipe: fell back to probing its own config.")
    if probe_device != target:
        notes.append(
            "no GPU here: activations were probed on CPU; CUDA attention kernels (flash / memory-efficient) keep less."
        )
    if facts is None:
        dynamic = [row.text for row in cfg.parsed if terms_of(row.plan, target).padding != "max_length"]
        notes.append(
            "padding to --max-length is assumed"
            + (
                f" (also for {', '.join(dynamic)}: the worst case; give --train-file for the data's longest)"
                if dynamic
                else ""
            )
            + "."
        )
    else:
        target_part = f", targets {facts.longest_target}" if cfg.task == "seq2seq" else ""
        notes.append(
            f"data: {facts.where}, {facts.rows} training rows"
            + (f", {facts.num_labels} classes" if cfg.task == "classification" else "")
            + f"; longest input {facts.longest} tokens{target_part} after truncation: rows with dynamic padding "
            "are estimated for a batch that holds it, the others for padding to --max-length."
        )
        notes += [f"data: {line}" for line in facts.skipped]
    for text, e in estimates:
        notes += [f"{text}: {n}" for n in e.notes]
    if any(e.cpu_offload_bytes for _, e in estimates):
        notes.append(
            f"ZeRO offload keeps {human_bytes(max(e.cpu_offload_bytes for _, e in estimates))} in CPU memory per rank."
        )
    if fits_none and budget is not None:
        notes += _impossible(base_shape, budget, overhead, rescue, cfg.nproc)
    title = (
        f"trainwise estimate: {source.display()} ({base_shape.n_params / 1e6:.1f}M params) / {cfg.task} / {target}, "
        f"batch {cfg.batch_size}, length {cfg.max_length}"
        + (f"/{cfg.max_target_length}" if cfg.task == "seq2seq" else "")
        + (f", {cfg.nproc} ranks" if cfg.nproc > 1 else "")
    )
    return EstimateReport(
        title, source.display(), target, base_shape.n_params, budget, estimates, list(cals.values()), rescue, notes
    )


def _impossible(base: Shape, budget: int, overhead: int, rescue: list, nproc: int) -> list[str]:

    if overhead >= budget:
        return [f"impossible: the runtime alone ({human_bytes(overhead)}) does not fit {human_bytes(budget)}."]
    lines = []
    if 4 * base.n_params + overhead > budget:
        lines.append(
            f"impossible as asked: the fp32 weights alone need {human_bytes(4 * base.n_params)} "
            f"(+{human_bytes(overhead)} runtime), more than {human_bytes(budget)}."
        )
    else:
        lines.append(f"no plan above fits {human_bytes(budget)}.")
    if rescue:
        lines.append("would fit: " + "; ".join(f"{label} ({human_bytes(e.total_bytes)})" for label, e in rescue[:3]))
    else:
        need = min_ranks_for_zero3(base, budget, overhead)
        more = f"ZeRO-3 over >= {need} devices" if need else "a smaller model"
        lines.append(f"nothing in the catalogue fits on {nproc} device(s): needs {more}, or a LoRA plan.")
    return lines
