"""THE training loop. `compare`'s trials, `train`, `tune`'s trials and PBT's members all run it.

    parts = build(spec, data, total_steps)      # model, optimizer, schedule: the plan applied
    stream = Stream(data, parts)                # micro-batches: the plan's sampler and padding
    run(parts, stream, until, on_step, phases)  # optimizer steps

`train` adds evaluation, checkpoints and early stopping in `on_step`; `compare` adds timing through
`phases`. What a plan does comes from `trainwise.strategies.runtime(plan)`, a `Runtime` written by
the knobs; strategies never appear here by name, and an unused one is a no-op (an empty list of
edits, autocast "no", one micro-batch per step).

The loss is computed here, not taken from the model: summed over the items of every micro-batch and
divided by the item count of the whole accumulation window (over every rank), so the reported loss
and the gradients are the true mean over the effective batch (the HF Trainer 5.x reports loss x N
under accumulation for T5/BERT; this loop does not).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import DeepSpeedPlugin

from trainwise import strategies
from trainwise.run.ranks import Ranks, all_sum, group_size, unwrap
from trainwise.spec.config import TrialSpec
from trainwise.strategies.base import Runtime
from trainwise.strategies.batching.samplers import RandomBatches, RankShard, make_batches
from trainwise.training.data.prepared import TrialData
from trainwise.training.data.tasks import Batch, shifted_loss_sum
from trainwise.training.models import ModelSource, build_model
from trainwise.training.vision import IMAGE_TASK, build_image_model


class Phases:
    """Where the loop reports its phases: `timed` ones (data, compute, optim: compare times them) and
    `traced` ranges (data, forward, backward, optimizer: --profile records them). Here: nothing."""

    def timed(self, name: str) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def traced(self, name: str) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


NO_PHASES = Phases()


@dataclass
class Parts:
    """A run's training parts, built once from its spec and plan."""

    spec: TrialSpec
    rt: Runtime
    accelerator: Any
    model: Any
    optimizer: Any
    scheduler: Any
    trainable: list[torch.nn.Parameter]
    world: int
    decoder_inputs: Callable | None = None  # seq2seq: labels -> decoder input ids
    step: int = 0  # optimizer steps taken
    lr: float = 0.0  # the learning rate of the last step taken
    n_params: int = field(default=0)

    @property
    def raw_model(self) -> Any:
        """The model without accelerate's / DDP's / compile's wrapping (what is saved and evaluated)."""
        return unwrap(self.model)


def new_accelerator(rt: Runtime, micro_batch_per_rank: int, max_grad_norm: float, random_init: bool = False):
    """Accelerate for one run: plain, DDP (under torchrun it wraps the model) or DeepSpeed ZeRO.

    The loop counts its own accumulation windows (`accelerator.accumulate` per micro-batch), so DDP
    skips the gradient all-reduce and DeepSpeed the step on all but a window's last micro-batch.
    """
    if rt.device == "cpu":
        # accelerate consults DeepSpeed when it is installed; on CPU DeepSpeed's auto-detection prints a
        # warning ("unable to detect" a GPU) into train's output. Saying the device up front is quiet.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")

    AcceleratorState._reset_state(reset_partial_state=True)  # one run per process, but tests reuse one
    if rt.deepspeed is not None:
        if rt.device == "cpu":
            _without_shm_all_reduce()
        config = {
            **rt.deepspeed,
            # the loop keeps its own accumulation windows and loss normalisation
            "train_micro_batch_size_per_gpu": micro_batch_per_rank,
            "gradient_accumulation_steps": rt.accum_steps,
            "gradient_clipping": max_grad_norm or 0.0,
            "bf16": {"enabled": rt.mixed_precision == "bf16"},
            "fp16": {"enabled": rt.mixed_precision == "fp16"},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
        }
        # zero.Init (build ZeRO-3 weights already partitioned) draws a preset's random init in another
        # order, so its row would start from other weights than the baseline's; pretrained weights load
        # the same either way. cpu=False even on CPU: accelerate hands the process group to DeepSpeed
        # (DS_ACCELERATOR=cpu).
        plugin = DeepSpeedPlugin(hf_ds_config=config, zero3_init_flag=rt.zero3_init and not random_init)
        return Accelerator(deepspeed_plugin=plugin, cpu=False)
    return Accelerator(
        mixed_precision=rt.mixed_precision, cpu=rt.device == "cpu", gradient_accumulation_steps=rt.accum_steps
    )


def _without_shm_all_reduce() -> None:
    """DeepSpeed on CPU builds and loads its shared-memory all-reduce (`deepspeed_shm_comm`, a C++ op: 55 s of
    compiling on 2 cores on a new machine) when its process group starts, for its inference all-reduce only:
    ZeRO training reduces through torch.distributed (gloo) either way. Marked incompatible before the group
    starts, DeepSpeed skips the build (`deepspeed.comm.torch.build_shm_op`)."""
    import deepspeed.ops  # heavy: deepspeed (accelerate imports it for a ZeRO plan anyway)

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def apply_plan(model: Any, rt: Runtime) -> Any:
    """The plan's edits of a built model (checkpointing, freezing, LoRA, layout), then its weights' dtype.
    The estimate runs the same function on a meta-device model and on its probes."""
    for edit in rt.model_edits:
        model = edit(model)
    if rt.weights_dtype is not None:
        model = model.to(getattr(torch, rt.weights_dtype))
    return model


def build(spec: TrialSpec, data: TrialData, total_steps: int) -> Parts:
    """The plan applied: model, optimizer and linear schedule over `total_steps`, prepared by accelerate."""
    s = spec.settings
    ranks = Ranks.from_env()
    rt = strategies.runtime(spec.plan, s.task, s.device)
    torch.manual_seed(s.seed)
    random.seed(s.seed)
    np.random.seed(s.seed)
    for switch in rt.backend.values():
        switch()
    micro_per_rank = s.batch_size // rt.accum_steps // ranks.world
    accelerator = new_accelerator(rt, micro_per_rank, s.max_grad_norm, s.model_kind == "preset")
    world = group_size()
    if world != ranks.world:
        raise RuntimeError(f"launched as {ranks.world} ranks but the process group has {world}")
    model: Any
    if s.task == IMAGE_TASK:
        model = build_image_model(s.model_ref, data.channels, s.num_labels, s.seed)
    else:  # seq2seq: num_labels unused
        model = build_model(
            ModelSource(s.model_kind, s.model_ref), s.task, s.num_labels or 2, s.seed, **rt.model_kwargs
        )
    model = apply_plan(model, rt)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise ValueError("every parameter is frozen: nothing to train")
    assert rt.optimizer is not None, "the optimizer knob always sets one"
    optimizer = rt.optimizer(trainable, s.lr, s.weight_decay)
    model, optimizer = accelerator.prepare(model, optimizer)
    for edit in rt.prepared_edits:
        model = edit(model)
    # on the prepared optimizer: ZeRO-3 steps copies of the param groups, not the ones passed in
    warmup = int(s.warmup_ratio * total_steps)
    schedule = functools.partial(linear_warmup_decay, warmup=warmup, total=total_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    parts = Parts(spec, rt, accelerator, model, optimizer, scheduler, trainable, world)
    if s.task == "seq2seq":
        parts.decoder_inputs = parts.raw_model.prepare_decoder_input_ids_from_labels
    parts.n_params = sum(numel(p) for p in parts.raw_model.parameters())
    return parts


def linear_warmup_decay(step: int, warmup: int, total: int) -> float:
    """transformers' `get_linear_schedule_with_warmup` factor, written here: its module imports peft, and peft
    imports bitsandbytes, about 3 s in every process that imports the loop (torchrun ranks, CLI subprocesses)."""
    if step < warmup:
        return step / max(1, warmup)
    return max(0.0, (total - step) / max(1, total - warmup))


def numel(p: torch.Tensor) -> int:
    """Elements of a parameter, also when ZeRO-3 has partitioned it away (ds_numel: the full count)."""
    return int(getattr(p, "ds_numel", p.numel()))


# ---- batches ---------------------------------------------------------------------------------------------


def steps_per_epoch(spec: TrialSpec, n_samples: int) -> int:
    """Optimizer steps in one pass over `n_samples` (the last partial batch is dropped)."""
    s = spec.settings
    accum = strategies.runtime(spec.plan, s.task, s.device).accum_steps
    return n_samples // (s.batch_size // accum) // accum


class _From:
    """A batch sampler that starts at a position (micro-batches into the run) and goes on epoch after epoch.
    The DataLoader draws indices from it in this process, so its workers (persistent) never see the skip."""

    def __init__(self, inner: RandomBatches | RankShard, position: int):
        self.inner = inner
        self.epoch, self.skip = divmod(position, len(inner))

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Iterator[list[int]]:
        self.inner.set_epoch(self.epoch)
        skip, self.epoch, self.skip = self.skip, self.epoch + 1, 0
        for i, batch in enumerate(self.inner):
            if i >= skip:
                yield batch


class Stream:
    """The run's micro-batches from `position` on (micro-batches already consumed): the plan's sampler
    and padding, this rank's shard of every global batch, on the device with the plan's batch edits."""

    def __init__(self, data: TrialData, parts: Parts, position: int = 0):
        s, rt = parts.spec.settings, parts.rt
        ranks = Ranks.from_env()
        self.rt, self.device, self.position = rt, parts.accelerator.device, position
        # a plan's own view of the data (packing: rows of --max-length tokens of whole examples), else the examples
        if rt.data_view is not None:
            train, lengths, collate = rt.data_view(data)
            if len(lengths) < s.batch_size:  # the study checks its own batch size; find-batch tries larger ones
                raise ValueError(
                    f"the training examples fill {len(lengths)} rows of {s.max_length} tokens, fewer than the batch "
                    f"size {s.batch_size}"
                )
        else:
            train, lengths, collate = data.train, data.lengths, data.collate(rt.padding)
        batches = make_batches(rt.sampler, lengths, s.batch_size // rt.accum_steps, s.seed)
        # data parallel: every rank draws the same global micro-batches and keeps its slice
        shard = RankShard(batches, ranks.rank, ranks.world) if ranks.world > 1 else batches
        self.loader = torch.utils.data.DataLoader(
            train,
            batch_sampler=_From(shard, position),
            collate_fn=collate,
            num_workers=s.num_workers,
            pin_memory=s.device == "cuda" and rt.pin_memory,  # the pin_memory strategy (PyTorch's default: off)
            # workers live across epochs: otherwise every epoch boundary restarts them (a stall that a small
            # dataset with big batches, 3 steps per epoch, hits every third step)
            persistent_workers=s.num_workers > 0,
            # its own generator: a DataLoader iterator draws a base seed, which must not come from the global
            # RNG that dropout uses (a resumed run creates its iterator at another moment)
            generator=torch.Generator().manual_seed(s.seed),
        )
        self._it: Iterator[Batch] | None = None

    def _next(self) -> Batch:
        if self._it is None:
            self._it = iter(self.loader)
        try:
            batch = next(self._it)
        except StopIteration:  # the next epoch
            self._it = iter(self.loader)
            batch = next(self._it)
        self.position += 1
        batch = batch.to(self.device)
        for edit in self.rt.batch_edits:
            batch = edit(batch)
        return batch

    def window(self) -> list[Batch]:
        """The micro-batches of one optimizer step."""
        return [self._next() for _ in range(self.rt.accum_steps)]


# ---- the step ----------------------------------------------------------------------------------------------


def loss_sum(
    model,
    batch: Batch,
    task: str,
    decoder_inputs: Callable | None,
    label_smoothing: float = 0.0,
    lm_loss: Callable | None = None,
):
    """Summed (not averaged) cross-entropy of one micro-batch, in fp32. A causal LM's: over the tokens
    whose (shifted) label is not -100, so the window's sum / its loss tokens is HF's `.loss`; `lm_loss`
    (the plan's, e.g. chunked) computes that same sum its own way."""
    if task == "causal-lm":
        if lm_loss is not None:
            return lm_loss(model, batch, label_smoothing)
        return shifted_loss_sum(model(**batch.inputs).logits, batch.labels, label_smoothing)
    if task != "seq2seq":  # classification of text or images
        logits = model(**batch.inputs).logits
        return F.cross_entropy(logits.float(), batch.labels, reduction="sum", label_smoothing=label_smoothing)
    assert decoder_inputs is not None
    logits = model(**batch.inputs, decoder_input_ids=decoder_inputs(labels=batch.labels)).logits
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]),
        batch.labels.reshape(-1),
        ignore_index=-100,
        reduction="sum",
        label_smoothing=label_smoothing,
    )


def accumulate_step(
    model,
    micro_batches: list[Batch],
    backward: Callable,
    task: str,
    decoder_inputs: Callable | None = None,
    total_items: float | None = None,
    window: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    phases: Phases = NO_PHASES,
    label_smoothing: float = 0.0,
    lm_loss: Callable | None = None,
) -> torch.Tensor:
    """Forward+backward over one effective batch; grads hold the mean over all its loss items.

    `total_items` is the item count of the whole window (over every rank under data parallelism; by
    default this process's micro-batches); `window()` wraps each micro-batch (gradient sync only on
    the last one). Returns the (detached) sum of this process's share of the mean loss.
    """
    total_items = total_items or sum(b.loss_items for b in micro_batches)
    assert total_items > 0, "a batch with nothing to learn from"
    mean_loss = torch.zeros((), device=micro_batches[0].labels.device)
    for batch in micro_batches:
        with window():
            with phases.traced("forward"):
                loss = loss_sum(model, batch, task, decoder_inputs, label_smoothing, lm_loss) / total_items
            with phases.traced("backward"):
                backward(loss)
        mean_loss += loss.detach()
    return mean_loss


def train_window(p: Parts, micro: list[Batch], phases: Phases = NO_PHASES) -> float:
    """Forward+backward of one optimizer step's window on this rank; returns the global mean loss.

    Each rank divides its summed loss by the window's item count over all ranks. DDP and DeepSpeed
    average gradients over the ranks and accelerate divides the loss by the accumulation steps, so
    scaling by both leaves the gradients the true mean over the global effective batch; the gradient
    all-reduce (DDP) or the ZeRO step runs on the window's last micro-batch only.
    """
    scale = p.rt.accum_steps * p.world
    items = all_sum(sum(b.loss_items for b in micro), p.world)
    share = accumulate_step(
        p.model,
        micro,
        lambda loss: p.accelerator.backward(loss * scale),
        p.spec.settings.task,
        p.decoder_inputs,
        items,
        lambda: p.accelerator.accumulate(p.model),
        phases,
        p.spec.settings.label_smoothing,
        p.rt.lm_loss,
    )
    return all_sum(float(share), p.world)


def train_step(p: Parts, micro: list[Batch], phases: Phases = NO_PHASES) -> float:
    """One optimizer step: the window's forward+backward, clip, step, schedule, zero_grad, after-step actions."""
    with phases.timed("compute"), p.rt.step_context():
        loss = train_window(p, micro, phases)
    with phases.timed("optim"), phases.traced("optimizer"):
        clip = p.spec.settings.max_grad_norm
        if clip and p.rt.deepspeed is None:  # DeepSpeed clips in its own step (gradient_clipping)
            p.accelerator.clip_grad_norm_(p.trainable, clip)
        p.lr = p.optimizer.param_groups[0]["lr"]
        p.optimizer.step()
        p.scheduler.step()
        p.optimizer.zero_grad(set_to_none=True)
        p.step += 1
        for action in p.rt.after_step:
            action(p.step)
    if not math.isfinite(loss):
        raise FloatingPointError(f"loss became {loss} at step {p.step}")
    return loss


OnStep = Callable[[float, list[Batch]], bool | None]  # (loss, the window's micro-batches) -> stop now?


def run(p: Parts, stream: Stream, until: int, on_step: OnStep, phases: Phases = NO_PHASES) -> None:
    """Optimizer steps until `p.step` reaches `until`, or until `on_step` returns True."""
    while p.step < until:
        with phases.timed("data"), phases.traced("data"):
            micro = stream.window()
        loss = train_step(p, micro, phases)
        if on_step(loss, micro):
            break
