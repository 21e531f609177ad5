"""trainwise estimate: a plan's peak training memory, predicted without training it.

The model is built on the meta device (shapes only, no weights). Per device (rank):

    peak = weights + optimizer + max(forward/backward phase, optimizer-step phase)

    forward/backward = activations (+ gradients left by earlier micro-batches under accumulation)
    optimizer step   = gradients + the step's temporaries

Counted exactly from the shapes and the plan's `MemoryTerms` (what each knob's memory seam wrote:
bytes per weight and gradient, the optimizer's state and step temporaries, autocast copies, ZeRO
shards and offload; see `trainwise/strategies/`). The plan's model edits (freezing, LoRA, the
weights' dtype) are applied to the meta-device model itself, so what trains is read off it.

Activations are not guessed: they are a linear model over shape features (tokens x hidden, tokens
x ffn, heads x length^2 per layer, one recomputed layer under checkpointing, logits, autocast weight
copies, gradients built during backward) whose coefficients are *measured* by a short probe: about
16 forward/backward passes of tiny configs of the same model family on this device, with the peak
of allocated tensor memory read from the allocator (CUDA) or torch.profiler (CPU). Probes are
cached per (family, device, precision, checkpointing, torch version). A family without a tiny-config
recipe is probed on its own config at 1-3 layers instead, and the estimate says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from trainwise import strategies
from trainwise.core.config import CAUSAL_LM
from trainwise.estimating.data import EstimateConfig
from trainwise.estimating.probe import NO_ACTIVATIONS, Calibration, calibrate
from trainwise.estimating.shapes import FEATURES, Shape, cast_bytes, features, shape_of, terms_of
from trainwise.strategies.base import MemoryTerms
from trainwise.strategies.knobs import TrialPlan
from trainwise.training.measure.memory import CUDA_CONTEXT_BYTES, rss_bytes
from trainwise.training.models import ModelSource, model_config


@dataclass
class MemoryEstimate:
    """Predicted peak per device, in bytes, with its parts."""

    plan: dict
    batch_size: int
    micro_batch: int
    max_length: int
    nproc: int
    parts: dict[str, int]  # weights, grads, optimizer, activations, step_temps (device side)
    phase: str  # which phase sets the peak: "forward/backward" | "optimizer step"
    peak_bytes: int  # predicted peak of allocated tensor memory on the device
    overhead_bytes: int  # runtime the process needs besides tensors (CUDA context, or CPU libraries)
    cpu_offload_bytes: int  # ZeRO offload: what moves to CPU memory
    calibration: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # the plan's knobs this estimate does not model, and why

    @property
    def total_bytes(self) -> int:
        return self.peak_bytes + self.overhead_bytes

    def fits(self, device_memory: int | None) -> bool | None:
        return None if device_memory is None else self.total_bytes <= device_memory

    def to_dict(self) -> dict:
        d = asdict(self)
        d["total_bytes"] = self.total_bytes
        return d


def state_parts(s: Shape, terms: MemoryTerms) -> tuple[dict[str, int], int]:
    """Weights, grads and optimizer state on one device, and what ZeRO offload puts in CPU memory."""
    P, T = s.n_params, s.n_trainable
    assert terms.optimizer_state is not None, "the optimizer knob always sets it"
    optim = terms.optimizer_state(s, terms.update_bytes)
    if terms.master_weights:
        optim += 4 * T  # the fp32 master weights live with the optimizer state
    optim = math.ceil(optim / terms.optimizer_shards)
    grads = math.ceil(terms.grad_bytes * T / terms.grad_shards)
    wb = terms.weight_bytes
    gathered = terms.gathered_layers * wb * s.layer_params
    weights = math.ceil(wb * P / terms.weight_shards) + (gathered if terms.weight_shards > 1 else 0)
    if s.quantized and terms.quant_bytes:  # qlora: the base layers' weights in 4 bits, the rest as they are
        weights -= math.ceil((wb - terms.quant_bytes) * s.quantized / terms.weight_shards)
    weights += s.buffer_bytes
    offloaded = 0
    if terms.offload_optimizer:
        offloaded += optim
        optim = 0
    if terms.offload_weights:
        offloaded += math.ceil(wb * P / terms.weight_shards)
        weights = gathered + s.buffer_bytes
    return {"weights": weights, "grads": grads, "optimizer": optim}, offloaded


def step_temporaries(s: Shape, terms: MemoryTerms) -> int:
    """Scratch of one optimizer step (none when the step runs on the CPU under ZeRO-Offload)."""
    if terms.offload_optimizer:
        return 0
    assert terms.step_temps is not None, "the optimizer knob always sets it"
    return terms.step_temps(s, terms.device, terms.update_bytes, terms.optimizer_shards)


def runtime_overhead(device: str) -> int:
    """Memory the process holds besides tensors: the CUDA context, or on CPU the loaded libraries."""
    if device == "cuda":
        return CUDA_CONTEXT_BYTES

    return rss_bytes()  # this process has imported torch + transformers, as a trial does


def target_length(task: str, max_length: int, max_target_length: int) -> int:
    """The target length the estimate prices a trial's rows at: a causal LM's every position may score (its
    --max-length, as EstimateConfig sets it), a seq2seq's labels are --max-target-length long."""
    return max_length if task == CAUSAL_LM else max_target_length


def estimate_plan(
    s: Shape,
    cal: Calibration,
    plan: TrialPlan,
    batch_size: int,
    max_length: int,
    max_target_length: int,
    device: str,
    nproc: int = 1,
    overhead: int | None = None,
) -> MemoryEstimate:
    terms = terms_of(plan, device, nproc)
    micro = batch_size // terms.accum_steps
    f = features(s, micro, max_length, max_target_length, terms.logit_rows)
    act = sum(cal.coefficients[k] * f[k] for k in FEATURES) * (1 + cal.residual) + cast_bytes(s, terms)
    parts, offloaded = state_parts(s, terms)
    # backward frees activations as it builds gradients, so the phase peaks at one end: all activations
    # (start) or all gradients (end). Under accumulation the window's first micro-batch left every
    # gradient allocated, and later micro-batches add their activations on top.
    fwd_bwd = act + parts["grads"] if terms.accum_steps > 1 else max(act, parts["grads"])
    temps = step_temporaries(s, terms)
    opt_step = parts["grads"] + temps
    peak = parts["weights"] + parts["optimizer"] + max(fwd_bwd, opt_step)
    parts = {**parts, "activations": int(act), "step_temps": int(temps)}
    return MemoryEstimate(
        plan=plan.to_dict(),
        batch_size=batch_size,
        micro_batch=micro,
        max_length=max_length,
        nproc=nproc,
        parts=parts,
        phase="forward/backward" if fwd_bwd >= opt_step else "optimizer step",
        peak_bytes=int(peak),
        overhead_bytes=runtime_overhead(device) if overhead is None else overhead,
        cpu_offload_bytes=int(offloaded),
        calibration={"family": cal.family, "how": cal.how, "probes": cal.probes, "device": cal.device},
        notes=terms.notes,
    )


def estimate(
    source: ModelSource,
    task: str,
    num_labels: int,
    plan: TrialPlan,
    batch_size: int,
    max_length: int,
    max_target_length: int,
    device: str,
    nproc: int = 1,
    on_probe: Callable[[int, int], None] | None = None,
) -> MemoryEstimate:
    """Build the shapes on the meta device, calibrate (or reuse the cached probe), and predict."""
    config = model_config(source, task, num_labels)
    shape = shape_of(config, task, plan)
    cal = calibrate(config, task, plan, device, on_probe)
    return estimate_plan(shape, cal, plan, batch_size, max_length, max_target_length, device, nproc)


# rows tried, in order of how little they change training, when a budget is too small
RESCUE_ROWS = [
    "bf16+grad_ckpt",
    "bf16+grad_ckpt+chunked_ce",  # causal-lm only (rows of another task's strategies are skipped)
    "bf16+grad_ckpt+adafactor",
    "bf16+grad_ckpt+freeze_embeddings",
    "bf16+grad_ckpt+freeze_encoder",
    "bf16+grad_ckpt+zero2_offload",
    "bf16+grad_ckpt+zero3_offload",
    "bf16+grad_ckpt+chunked_ce+lora",  # trains adapters, not the model: last
]


def what_fits(
    shape_for: Callable[[TrialPlan], Shape],
    cal_for: Callable[[TrialPlan], Calibration],
    cfg: EstimateConfig,
    device: str,
    budget: int,
    overhead: int,
    micro_batch: int = 1,
) -> list[tuple[str, MemoryEstimate]]:
    """The rescue rows that fit `budget` at micro-batch `micro_batch` (the batch comes back via accumulation)."""
    accum = max(1, cfg.batch_size // micro_batch)
    fits = []
    for text in RESCUE_ROWS:
        row = strategies.parse_row(text + (f"+grad_accum={accum}" if accum > 1 else ""), cfg.accum_steps)
        if row.wrong_task(cfg.task) is not None or any(m.startswith("peft") for m in row.missing_packages()):
            continue
        try:
            shape = shape_for(row.plan)
        except ValueError:  # the plan does not apply to this model (no encoder to freeze)
            continue
        size = (micro_batch * accum, cfg.max_length, cfg.max_target_length, device, cfg.nproc, overhead)
        if estimate_plan(shape, NO_ACTIVATIONS, row.plan, *size).total_bytes > budget:
            continue  # its weights, gradients and optimizer state alone do not fit: no probe can change that
        est = estimate_plan(
            shape,
            cal_for(row.plan),
            row.plan,
            micro_batch * accum,
            cfg.max_length,
            cfg.max_target_length,
            device,
            cfg.nproc,
            overhead,
        )
        if est.total_bytes <= budget:
            fits.append((f"{text}, micro-batch {micro_batch} x {accum} accumulation", est))
    return fits


def min_ranks_for_zero3(s: Shape, budget: int, overhead: int) -> int | None:
    """Fewest ranks over which bf16 ZeRO-3 brings one rank's model states under the budget (activations aside)."""
    plan = strategies.parse_row("bf16+zero3", 1).plan
    n = 1
    while n <= 4096:
        parts, _ = state_parts(s, terms_of(plan, "cuda", n))
        if sum(parts.values()) + overhead <= budget:
            return n
        n *= 2
    return None


def largest_batch(
    s: Shape,
    cal: Calibration,
    plan: TrialPlan,
    budget: int,
    max_length: int,
    max_target_length: int,
    device: str,
    overhead: int,
    limit: int = 1 << 16,
) -> int:
    """Largest effective batch (a multiple of the plan's accumulation) whose estimate fits; 0 if none."""

    def fits(b: int) -> bool:
        e = estimate_plan(s, cal, plan, b, max_length, max_target_length, device, overhead=overhead)
        return e.total_bytes <= budget

    step = terms_of(plan, device).accum_steps
    if not fits(step):
        return 0
    low, high = 1, 2  # in units of `step`
    while high * step <= limit and fits(high * step):
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid * step) else (low, mid)
    return low * step
