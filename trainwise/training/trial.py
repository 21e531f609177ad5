"""run_trial: `compare`'s measured trial, the loop of `trainwise.training.loop` with timers and memory probes.

Reads top to bottom: load data -> build the plan's training parts -> run the spec's `steps` optimizer steps
(the first warmup_steps untimed) -> evaluate. What a strategy does is the loop's business; this
module only measures it.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from trainwise.core.env import environment
from trainwise.core.results import TrialResult, utilisation
from trainwise.run.events import Emit, Phase, Step, ignore
from trainwise.spec.config import TrialSpec
from trainwise.training import loop
from trainwise.training.data.prepared import load_data
from trainwise.training.measure import contention, flops, memory
from trainwise.training.measure.timing import StepTimer, summarize_steps
from trainwise.training.measure.trace import Tracer


class Measured(loop.Phases):
    """The loop's phases timed (StepTimer: data, compute, optim) and traced (--profile ranges)."""

    def __init__(self, timer: StepTimer, tracer: Tracer):
        self.timer, self.tracer = timer, tracer

    def timed(self, name: str) -> contextlib.AbstractContextManager:
        return self.timer.phase(name)

    def traced(self, name: str) -> contextlib.AbstractContextManager:
        return self.tracer.range(name)


def _steps(spec: TrialSpec) -> int:
    """A compare trial's optimizer steps (its spec says them: prepare_study sets them from --max-steps)."""
    if spec.steps is None:
        raise ValueError(f"trial {spec.row!r}: its spec gives no step count (a training run's spec, not a trial's)")
    return spec.steps


def run_trial(spec: TrialSpec, progress: Emit | None = None, trace_path: Path | None = None) -> TrialResult:
    """One trial; its progress (phases, steps) goes to `progress`. With `trace_path`, the training steps are
    recorded by torch.profiler (--profile)."""
    emit = progress or ignore
    s = spec.settings
    emit(Phase("data"))
    data = load_data(spec)  # text tokenized once, unpadded (the plan chooses padding and grouping)

    emit(Phase("model"))
    if s.device == "cuda":
        torch.cuda.empty_cache()
        memory.cuda_reset_peak()
    memory.reset_peak_rss()
    rss_before = memory.rss_bytes()
    steps = _steps(spec)
    parts = loop.build(spec, data, steps)
    stream = loop.Stream(data, parts)

    emit(Phase("train"))
    timer = StepTimer(torch.cuda.synchronize if s.device == "cuda" else (lambda: None))
    tracer = Tracer(trace_path, s.device == "cuda")
    counts = {"samples": 0, "real": 0, "padded": 0}
    losses: list[float] = []

    load = [contention.sample()] if s.warmup_steps == 0 else []  # what else ran during the timed steps
    largest: list = []  # the window with the most padded tokens: its step is the trial's memory peak

    def on_step(loss: float, micro: list) -> None:
        times = timer.end_step()
        if not largest or sum(b.padded_tokens for b in micro) > sum(b.padded_tokens for b in largest):
            largest[:] = micro
        if parts.step == s.warmup_steps:  # the last untimed step: the timed ones start now
            load.append(contention.sample())
        losses.append(loss)
        if parts.step > s.warmup_steps:
            _count(counts, micro)
        emit(Step(parts.step, steps, loss, step_s=times.total_s))

    tracer.start()  # a no-op without --profile; with it, one trace of all training steps
    loop.run(parts, stream, steps, on_step, Measured(timer, tracer))
    timed_end = contention.sample()
    tracer.stop()

    # weights + gradients + optimizer state, counted exactly (what strategies like adafactor or freezing
    # change; on CPU glibc keeps freed memory, so RSS can hide savings of this size)
    state_bytes = _state_bytes(parts)
    peak_rss = reserved = None
    if s.device == "cuda":
        peak, reserved = memory.cuda_peaks()
    else:
        peak_rss = memory.peak_rss_bytes()

    metrics: dict[str, float] = {}
    eval_s = None
    if data.n_eval:
        emit(Phase("eval"))
        t0 = time.perf_counter()
        metrics = data.evaluate(parts.model, parts.accelerator)
        eval_s = time.perf_counter() - t0

    # after the evaluation (so the loss and the quality are those of the study's steps): more timed steps when
    # the timed window was too short to judge what else ran during it
    # the study's own timed steps: what the padding and the FLOPs per step are reported over (the same batches on
    # every run; the steps added below depend on how fast this run was)
    ours, our_steps = dict(counts), len(timer.steps) - s.warmup_steps
    also = _autorange(parts, stream, timer, counts, s.warmup_steps)
    loaded = contention.between(load[0] if load else None, timed_end, also=also)

    # after the timed steps and the evaluation (so neither is slowed nor changed): more steps on the
    # largest window, one profiled for the peak of live tensors (CPU), one counted for FLOPs
    emit(Phase("measure"))
    measured = measure_step(parts, largest, s.device)
    if s.device != "cuda":
        peak = measured.peak_bytes
    mem_kind = "cuda_allocated" if s.device == "cuda" else "cpu_allocated"

    timed = timer.steps[s.warmup_steps :]
    summary = summarize_steps(timed, counts["samples"], counts["real"])
    samples_per_s = summary["samples_per_s"]
    flops_per_step = measured.per_step(ours["padded"], our_steps)
    # MFU: the FLOPs of the steps the time is over (with any added ones), not only the study's
    timed_flops = measured.per_step(counts["padded"], len(timed))
    mfu, mfu_note = utilisation(timed_flops, summary["step_time_s"], measured.peak_flops_per_s)
    return TrialResult(
        strategy=spec.row,
        status="ok",
        repeat=spec.repeat,
        plan=spec.plan.to_dict(),
        step_time_s=summary["step_time_s"],
        step_time_median_s=summary["step_time_median_s"],
        step_time_p90_s=summary["step_time_p90_s"],
        step_time_iqr_s=summary["step_time_iqr_s"],
        data_wait_s=summary["data_wait_s"],
        compute_s=summary["compute_s"],
        optimizer_s=summary["optimizer_s"],
        warmup_s=sum(t.total_s for t in timer.steps[: s.warmup_steps]),
        # torch.compile: what the warm-up steps took beyond a steady step (the compiles happen there)
        compile_s=(
            sum(max(0.0, t.total_s - summary["step_time_s"]) for t in timer.steps[: s.warmup_steps])
            if parts.rt.prepared_edits
            else None
        ),
        timed_steps=len(timed),
        added_steps=len(timer.steps) - steps,
        samples_per_s=samples_per_s,
        tokens_per_s=summary["tokens_per_s"],
        padding_waste=1 - ours["real"] / ours["padded"],
        loss_token_share=data.loss_token_share,  # the training set's, not the sample's: the same for every row
        # an epoch of what this row trains: unpacked rows under TRL's cut hold only the examples it keeps
        epoch_time_s=(data.examples if data.examples is not None and parts.rt.data_view is None else s.n_train)
        / samples_per_s,
        peak_mem_bytes=int(peak),
        mem_kind=mem_kind,
        flops_per_step=flops_per_step,
        peak_flops_per_s=measured.peak_flops_per_s,
        peak_mode=measured.mode,
        mfu=mfu,
        compute_dtype=measured.dtype,
        mfu_note="; ".join(filter(None, [measured.note, mfu_note])),
        peak_reserved_bytes=reserved,
        peak_rss_bytes=peak_rss,
        state_bytes=state_bytes,
        rss_before_model_bytes=rss_before,
        train_loss=sum(losses[-5:]) / len(losses[-5:]),
        final_loss=losses[-1],
        losses=losses,
        metric_name=data.metric,
        metric=metrics.get(data.metric),
        metrics=metrics,
        eval_s=eval_s,
        n_params=parts.n_params,
        n_trainable=sum(loop.numel(p) for p in parts.trainable),
        env=environment(s.device),
        world_size=parts.world,
        timed_s=summary["timed_s"],
        rank_peak_mem_bytes=[int(peak)],
        **loaded,
    )


def _count(counts: dict, micro: list) -> None:
    """A timed step's samples and its real and padded tokens, added to the trial's totals."""
    counts["samples"] += sum(b.n_samples for b in micro)
    counts["real"] += sum(b.real_tokens for b in micro)
    counts["padded"] += sum(b.padded_tokens for b in micro)


AUTORANGE_MAX_STEPS = 2000  # at most this many steps added to reach a window that can be judged


def _autorange(parts: loop.Parts, stream: loop.Stream, timer: StepTimer, counts: dict, warmup: int) -> tuple:
    """Timed steps added until the timed window reaches what a contention reading can judge
    (contention.MIN_WINDOW_S, with a margin), as timeit's autorange adds loops: the window of a tiny model's
    few steps lasts a fraction of a second, too short to see another process take the CPUs. They run after the
    evaluation, on the run's next batches, and count in the step time, not in the loss. One process only: the
    ranks of a data-parallel trial would have to agree on the count. TRAINWISE_AUTORANGE=0 adds none (a smoke run
    whose timing nobody reads, such as the test suite's: `contended` is then null on a short window). Returns the
    added window's samples."""
    goal = 1.2 * contention.MIN_WINDOW_S
    if parts.world > 1 or len(timer.steps) <= warmup or os.environ.get("TRAINWISE_AUTORANGE") == "0":
        return ()

    def on_step(_loss: float, micro: list) -> None:
        timer.end_step()
        _count(counts, micro)

    windows = []
    added = 0
    kept, before = len(timer.steps), dict(counts)
    try:
        # sized on the steps so far, then again: warm steps run faster than the first ones, and may fall short
        while (window := sum(t.total_s for t in timer.steps[warmup:])) < goal and added < AUTORANGE_MAX_STEPS:
            per_step = max(window / (len(timer.steps) - warmup), 1e-6)
            more = min(AUTORANGE_MAX_STEPS - added, max(1, math.ceil((goal - window) / per_step)))
            start = contention.sample()
            loop.run(parts, stream, parts.step + more, on_step, Measured(timer, Tracer(None, False)))
            end = contention.sample()
            added += more
            if start is not None and end is not None:
                windows.append((start, end))
    except Exception:  # noqa: BLE001  (an added step failed: an OOM on a longer batch; the study's steps stand)
        del timer.steps[kept:]
        counts.update(before)
        return ()
    return tuple(windows)


@dataclass
class StepMeasure:
    """Extra optimizer steps on one window, measured: the peak of live tensors (CPU) and the FLOPs."""

    peak_bytes: int
    flops: int | None  # of this one step
    tokens: int  # padded positions in its window (what the FLOPs scale with)
    peak_flops_per_s: float  # the device's linear layer run as the plan runs its matmuls, measured
    dtype: str
    mode: str  # how the peak was probed (trainwise.training.measure.flops.linear_mode)
    note: str = ""

    def per_step(self, padded_tokens: int, steps: int) -> float | None:
        """FLOPs of an average timed step: this step's, scaled by the padded positions computed."""
        return self.flops * padded_tokens / self.tokens / steps if self.flops and self.tokens and steps else None


def measure_step(parts: loop.Parts, window: list, device: str) -> StepMeasure:
    """Live tensors at the step's start (weights, buffers, optimizer state: counted; gradients are freed
    between steps) plus the peak of what the step allocates (torch.profiler's memory events, CPU; on
    CUDA the trial's max_memory_allocated is used instead), and the FLOPs torch's counter sees."""
    parts.model.train()
    weights, _, opt_state = _state_parts(parts)
    at_start = weights + memory.tensor_bytes(parts.raw_model.buffers()) + opt_state

    grown = 0
    if device != "cuda":  # CUDA: the trial's max_memory_allocated already holds the peak
        with memory.AllocatedPeak(device) as peak:
            loop.train_step(parts, window)
        grown = peak.peak_bytes
    # FLOPs on a step of their own: under the counter (a dispatch mode) checkpointing keeps its
    # activations (grad_ckpt's step measured 1.2 GiB instead of 253 MiB), so memory is not read there
    n, note = None, ""
    if parts.rt.prepared_edits:  # torch.compile: the counter would make dynamo trace and compile again
        note = "FLOPs not counted: torch.compile'd model"
    else:
        try:
            with flops.counting() as counted:
                loop.train_step(parts, window)
            n = counted.flops
        except Exception as err:  # the counter cannot follow every op (DeepSpeed's hooks, custom kernels)
            parts.optimizer.zero_grad(set_to_none=True)
            note = f"FLOPs not counted ({type(err).__name__}: {err})"
    dtype = flops.compute_dtype(parts.rt.mixed_precision, parts.rt.weights_dtype)
    mode = flops.linear_mode(parts.rt.mixed_precision, parts.rt.weights_dtype)
    tokens = sum(b.padded_tokens for b in window)
    top = flops.matmul_peak(device, mode)
    return StepMeasure(at_start + grown, n, tokens, top, dtype, flops.probe_mode(device, mode), note)


def _state_bytes(parts: loop.Parts) -> int:
    return sum(_state_parts(parts))


def _state_parts(parts: loop.Parts) -> tuple[int, int, int]:
    """This rank's weights + gradients + optimizer state. Counted from the tensors it holds, except
    the gradients under ZeRO-2/3, which DeepSpeed keeps in its own buckets: 1/world of the full size."""
    weights = sum(  # ZeRO-3 keeps this rank's partition of each weight in ds_tensor (a view of a flat buffer)
        (p.ds_tensor if hasattr(p, "ds_tensor") else p).numel() * p.element_size() for p in parts.model.parameters()
    )
    grads = sum(loop.numel(p) * p.element_size() for p in parts.trainable)
    if parts.rt.grads_sharded:
        grads //= parts.world
    opt_state = memory.tensor_bytes(
        t for state in parts.optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)
    )
    return weights, grads, opt_state
