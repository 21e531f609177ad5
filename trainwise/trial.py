"""run_trial: one explicit training loop on Accelerate, measured.

Reads top to bottom: load data -> build model -> apply the plan -> train max_steps optimizer steps
(the first warmup_steps untimed) -> evaluate. Strategies never appear here by name; the loop only
reads the TrialPlan, and "off" is always a no-op (fp32 autocast disabled, accum_steps=1, ...).

The loss is computed here, not taken from the model: summed over the items of every micro-batch
and divided by the item count of the whole accumulation window, so the reported loss and the
gradients are the true mean over the effective batch (the HF Trainer 5.x reports loss x N under
accumulation for T5/BERT; this loop does not).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import get_linear_schedule_with_warmup

from trainwise.config import TrialSpec
from trainwise.data.metrics import accuracy, text_metrics
from trainwise.data.samplers import RankShard, make_batches
from trainwise.data.tasks import Batch, Collator, Encoded, EncodedDataset, encode
from trainwise.distributed import Ranks, all_sum, ds_config, group_size
from trainwise.measure import memory
from trainwise.measure.env import environment
from trainwise.measure.timing import StepTimer, summarize_steps
from trainwise.measure.trace import Tracer
from trainwise.models import ModelSource, build_model, load_tokenizer
from trainwise.plan import TrialPlan
from trainwise.results import TrialResult
from trainwise.vision import IMAGE_TASK, ImageDataset, Images, build_image_model, collate_images, read_images

Progress = Callable[[dict], None]


def read_prepared(data_dir: str) -> tuple[list[dict], list[dict], list[str]]:
    root = Path(data_dir)
    rows = [
        [json.loads(x) for x in (root / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()]
        for split in ("train", "eval")
    ]
    labels = json.loads((root / "labels.json").read_text(encoding="utf-8"))
    return rows[0], rows[1], labels


def apply_model_plan(model: Any, plan: TrialPlan) -> None:
    """The plan's edits to the model itself: activation checkpointing and frozen modules."""
    if plan.grad_ckpt:
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise ValueError(f"{type(model).__name__} does not support gradient checkpointing")
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5 name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        model.config.use_cache = False
    for part in plan.freeze:
        for p in frozen_parameters(model, part):
            p.requires_grad_(False)
    if plan.freeze_layers:
        for p in lower_layer_parameters(model, plan.freeze_layers):
            p.requires_grad_(False)


def layer_stack(model) -> torch.nn.ModuleList:
    """The (encoder) stack of transformer layers: BERT encoder.layer, T5 encoder.block, BART encoder.layers."""
    root = model.get_encoder() if getattr(model.config, "is_encoder_decoder", False) else model.base_model
    stacks = [
        m
        for name, m in root.named_modules()
        if isinstance(m, torch.nn.ModuleList) and name.split(".")[-1] in ("layer", "layers", "block")
    ]
    if not stacks:
        raise ValueError(f"{type(model).__name__}: no stack of layers found to freeze")
    return stacks[0]


def lower_layer_parameters(model, n: int) -> list[torch.nn.Parameter]:
    """The embeddings and the first n layers (n = -1: the lower half)."""
    stack = layer_stack(model)
    n = len(stack) // 2 if n < 0 else n
    if n > len(stack):
        raise ValueError(f"freeze_layers={n}: the model has only {len(stack)} layers")
    params = frozen_parameters(model, "embeddings")
    return params + [p for layer in stack[:n] for p in layer.parameters()]


def lora_targets(model_type: str) -> list[str] | None:
    """The attention projections peft adapts for this model type (None: peft knows none)."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as TARGETS

    targets = TARGETS.get(model_type)
    return list(targets) if targets else None


def apply_lora(model: Any, plan: TrialPlan, task: str) -> Any:
    """Wrap the model with LoRA adapters (peft); everything else is frozen, the task head trains."""
    if not plan.lora_r:
        return model
    from peft import LoraConfig, TaskType, get_peft_model

    targets = lora_targets(model.config.model_type)
    if not targets:
        raise ValueError(f"LoRA: no known attention modules for model type {model.config.model_type!r}")
    task_type = TaskType.SEQ_2_SEQ_LM if task == "seq2seq" else TaskType.SEQ_CLS
    config = LoraConfig(
        r=plan.lora_r, lora_alpha=2 * plan.lora_r, lora_dropout=0.0, target_modules=targets, task_type=task_type
    )
    return get_peft_model(model, config)


def frozen_parameters(model, part: str) -> list[torch.nn.Parameter]:
    """Parameters of a named part. Tied weights (T5's shared embedding / LM head) go together."""
    if part == "embeddings":
        params = list(model.get_input_embeddings().parameters())
        params += [p for n, p in model.named_parameters() if "embed" in n]
    elif part == "encoder":
        if getattr(model.config, "is_encoder_decoder", False):
            encoder = model.get_encoder()
        else:
            encoder = getattr(model.base_model, "encoder", None)
        if encoder is None:
            raise ValueError(f"{type(model).__name__} has no encoder module to freeze")
        params = list(encoder.parameters())
    else:
        raise ValueError(f"unknown part to freeze: {part}")
    return params


def make_optimizer(
    name: str, params: list[torch.nn.Parameter], lr: float, cpu_offload: bool = False, weight_decay: float = 0.0
) -> torch.optim.Optimizer:
    if not params:
        raise ValueError("every parameter is frozen: nothing to train")
    if cpu_offload and name == "adamw":
        # ZeRO-Offload steps the optimizer on the CPU: DeepSpeed's vectorised CPU Adam (a C++ op it
        # JIT-builds on first use) is the optimizer it is designed around
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(params, lr=lr, weight_decay=weight_decay, adamw_mode=True)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        # the settings HF TrainingArguments(optim="adafactor") uses: a fixed, external learning rate
        return Adafactor(
            params, lr=lr, scale_parameter=False, relative_step=False, warmup_init=False, weight_decay=weight_decay
        )
    if name == "adamw_8bit":
        import bitsandbytes as bnb  # checked at the edge: the strategy needs the package and CUDA

        return bnb.optim.AdamW8bit(params, lr=lr, weight_decay=weight_decay)
    # "adamw" leaves the implementation to torch (for-each on CUDA, per-tensor on CPU); the variants pin it
    foreach = True if name == "adamw_foreach" else None
    fused = True if name == "adamw_fused" else None
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=foreach, fused=fused)


def loss_sum(
    model, batch: Batch, task: str, decoder_inputs: Callable | None, label_smoothing: float = 0.0
) -> torch.Tensor:
    """Summed (not averaged) cross-entropy of one micro-batch, in fp32."""
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
    backward,
    task: str,
    decoder_inputs=None,
    total_items: float | None = None,
    window: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    phase: Callable[[str], contextlib.AbstractContextManager] = lambda _name: contextlib.nullcontext(),
    label_smoothing: float = 0.0,
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
            with phase("forward"):
                loss = loss_sum(model, batch, task, decoder_inputs, label_smoothing) / total_items
            with phase("backward"):
                backward(loss)
        mean_loss += loss.detach()
    return mean_loss


def train_window(
    accelerator,
    model,
    micro: list[Batch],
    accum_steps: int,
    world: int,
    task: str,
    decoder_inputs,
    phase: Callable[[str], contextlib.AbstractContextManager] = lambda _name: contextlib.nullcontext(),
    label_smoothing: float = 0.0,
):
    """Forward+backward of one optimizer step's window on this rank; returns the global mean loss.

    Each rank divides its summed loss by the window's item count over all ranks. DDP and DeepSpeed
    average gradients over the ranks and accelerate divides the loss by the accumulation steps, so
    scaling by both leaves the gradients the true mean over the global effective batch; the gradient
    all-reduce (DDP) or the ZeRO step runs on the window's last micro-batch only.
    """
    scale = accum_steps * world
    items = all_sum(sum(b.loss_items for b in micro), world)
    share = accumulate_step(
        model,
        micro,
        lambda loss: accelerator.backward(loss * scale),
        task,
        decoder_inputs,
        items,
        lambda: accelerator.accumulate(model),
        phase,
        label_smoothing,
    )
    return all_sum(float(share), world)


def _micro_batches(loader, sampler) -> Iterator[Batch]:
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def _new_accelerator(
    plan: TrialPlan, device: str, micro_batch_per_rank: int, max_grad_norm: float, random_init: bool = False
):
    """Accelerate for one trial: plain, DDP (under torchrun it wraps the model) or DeepSpeed ZeRO.

    The loop counts its own accumulation windows (`accelerator.accumulate` per micro-batch), so
    DDP skips the gradient all-reduce and DeepSpeed the step on all but a window's last micro-batch.
    """
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)  # one trial per process, but tests reuse one
    if plan.zero_stage:
        from accelerate.utils import DeepSpeedPlugin

        # cpu=False even on CPU: accelerate hands the process group to DeepSpeed (DS_ACCELERATOR=cpu)
        config = ds_config(plan, micro_batch_per_rank, max_grad_norm)
        # zero.Init (build ZeRO-3 weights already partitioned) draws a preset's random init in another
        # order, so its row would start from other weights than the baseline's; pretrained weights load
        # the same either way
        plugin = DeepSpeedPlugin(hf_ds_config=config, zero3_init_flag=plan.zero_stage == 3 and not random_init)
        return Accelerator(deepspeed_plugin=plugin, cpu=False)
    mixed = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}[plan.precision]
    return Accelerator(mixed_precision=mixed, cpu=device == "cpu", gradient_accumulation_steps=plan.accum_steps)


@torch.no_grad()
def evaluate(model, accelerator, enc: Encoded, gold: list[str], spec: TrialSpec, tokenizer, labels) -> dict:
    s = spec.settings
    model.eval()
    collate = Collator(s.task, tokenizer.pad_token_id, "longest", s.max_length, s.max_target_length)
    ds = EncodedDataset(enc)
    preds: list = []
    for start in range(0, len(ds), s.batch_size):
        batch = collate([ds[i] for i in range(start, min(start + s.batch_size, len(ds)))]).to(accelerator.device)
        with accelerator.autocast():
            if s.task == "classification":
                preds += model(**batch.inputs).logits.argmax(-1).tolist()
            else:
                out = accelerator.unwrap_model(model).generate(
                    **batch.inputs,
                    max_new_tokens=s.max_target_length,
                    num_beams=s.num_beams,
                    length_penalty=s.length_penalty,
                    do_sample=False,
                )
                preds += tokenizer.batch_decode(out, skip_special_tokens=True)
    model.train()
    if s.task == "classification":
        return {"accuracy": 100 * accuracy(preds, [labels.index(g) for g in gold])}
    return text_metrics([p.strip() for p in preds], gold)


@dataclass
class TrialData:
    """What the loop needs from a task's data: the training set, how to batch it, how to score."""

    train: torch.utils.data.Dataset
    lengths: list[int]  # per training sample (what length-aware samplers sort by)
    collate: Callable[[list], Batch]
    n_eval: int
    evaluate: Callable[[Any, Any], dict[str, float]]  # (model, accelerator) -> metrics
    channels: int = 0  # images: input channels


def _text_data(spec: TrialSpec, source: ModelSource) -> TrialData:
    s, plan = spec.settings, spec.plan
    tokenizer = load_tokenizer(source, s.tokenizer_dir)
    train_rows, eval_rows, labels = read_prepared(s.data_dir)
    label2id = {label: i for i, label in enumerate(labels)}
    train = encode(train_rows, tokenizer, s.task, s.max_length, s.max_target_length, label2id)
    eval_rows = eval_rows[: s.eval_samples]
    evals = encode(eval_rows, tokenizer, s.task, s.max_length, s.max_target_length, label2id)
    gold = [r["target"] for r in eval_rows]
    return TrialData(
        EncodedDataset(train),
        train.lengths(),
        Collator(s.task, tokenizer.pad_token_id, plan.padding, s.max_length, s.max_target_length),
        len(evals),
        lambda model, acc: evaluate(model, acc, evals, gold, spec, tokenizer, labels),
    )


def _image_data(spec: TrialSpec) -> TrialData:
    s = spec.settings
    train, evals = read_images(Path(s.data_dir) / "images.npz")
    train_ds = ImageDataset(train, train=True, seed=s.seed)
    eval_ds = ImageDataset(Images(evals.x[: s.eval_samples], evals.y[: s.eval_samples]), train=False, seed=s.seed)
    eval_ds.mean, eval_ds.std = train_ds.mean, train_ds.std  # normalised with the training statistics
    return TrialData(
        train_ds,
        [1] * len(train),
        collate_images,
        len(eval_ds),
        lambda model, acc: evaluate_images(model, acc, eval_ds, s.batch_size),
        channels=train.x.shape[-1],
    )


@torch.no_grad()
def evaluate_images(model, accelerator, ds, batch_size: int) -> dict[str, float]:
    model.eval()
    correct = 0
    for start in range(0, len(ds), batch_size):
        batch = collate_images([ds[i] for i in range(start, min(start + batch_size, len(ds)))]).to(accelerator.device)
        with accelerator.autocast():
            correct += int((model(**batch.inputs).logits.argmax(-1) == batch.labels).sum())
    model.train()
    return {"accuracy": 100 * correct / len(ds)}


def build_training(spec: TrialSpec, data: TrialData, accelerator):
    """The model with the plan applied, its optimizer and linear schedule, prepared by accelerate.

    Returns (model, optimizer, scheduler, trainable parameters, seq2seq decoder-input builder)."""
    s, plan = spec.settings, spec.plan
    model: Any
    if s.task == IMAGE_TASK:
        model = build_image_model(s.model_ref, data.channels, s.num_labels, s.seed)
    else:
        source = ModelSource(s.model_kind, s.model_ref)
        model = build_model(source, s.task, s.num_labels or 2, s.seed, attn=plan.attn)  # seq2seq: num_labels unused
    if plan.channels_last:
        model = model.to(memory_format=torch.channels_last)
    apply_model_plan(model, plan)
    model = apply_lora(model, plan, s.task)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(
        plan.optimizer, trainable, s.lr, cpu_offload=plan.offload != "none", weight_decay=s.weight_decay
    )
    model, optimizer = accelerator.prepare(model, optimizer)
    if plan.compile:
        model = torch.compile(model)  # compiles lazily: the first steps (untimed warm-up) pay for it
    # on the prepared optimizer: ZeRO-3 steps copies of the param groups, not the ones passed in
    scheduler = get_linear_schedule_with_warmup(optimizer, int(s.warmup_ratio * s.max_steps), s.max_steps)
    decoder_inputs = None
    if s.task == "seq2seq":
        decoder_inputs = accelerator.unwrap_model(model).prepare_decoder_input_ids_from_labels
    return model, optimizer, scheduler, trainable, decoder_inputs


def load_data(spec: TrialSpec) -> TrialData:
    s = spec.settings
    return _image_data(spec) if s.task == IMAGE_TASK else _text_data(spec, ModelSource(s.model_kind, s.model_ref))


def run_trial(spec: TrialSpec, progress: Progress | None = None, trace_path: Path | None = None) -> TrialResult:
    """One trial. With `trace_path`, the training steps are recorded by torch.profiler (--profile)."""
    emit = progress or (lambda _event: None)
    s, plan = spec.settings, spec.plan
    ranks = Ranks.from_env()
    torch.manual_seed(s.seed)
    emit({"event": "phase", "phase": "data"})

    # ---- data: text tokenized once, unpadded (the plan chooses padding and grouping); images as uint8
    data = load_data(spec)
    micro_bs = plan.micro_batch_size(s.batch_size)
    batches_all = make_batches(plan.sampler, data.lengths, micro_bs, s.seed)
    # data parallel: every rank draws the same global micro-batches and keeps its slice
    sampler = RankShard(batches_all, ranks.rank, ranks.world) if ranks.world > 1 else batches_all
    loader = torch.utils.data.DataLoader(
        data.train,
        batch_sampler=sampler,
        collate_fn=data.collate,
        num_workers=s.num_workers,
        pin_memory=s.device == "cuda",
        # workers live across epochs: otherwise every epoch boundary restarts them (a stall that a small
        # dataset with big batches, 3 steps per epoch, hits every third step)
        persistent_workers=s.num_workers > 0,
    )

    # ---- model, plan, optimizer ------------------------------------------------------------------
    emit({"event": "phase", "phase": "model"})
    accelerator = _new_accelerator(plan, s.device, micro_bs // ranks.world, s.max_grad_norm, s.model_kind == "preset")
    world = group_size()
    if world != ranks.world:
        raise RuntimeError(f"launched as {ranks.world} ranks but the process group has {world}")
    if s.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = plan.tf32
        torch.cuda.empty_cache()
        memory.cuda_reset_peak()
    memory.reset_peak_rss()
    rss_before = memory.rss_bytes()
    model, optimizer, scheduler, trainable, decoder_inputs = build_training(spec, data, accelerator)
    n_params = sum(numel(p) for p in accelerator.unwrap_model(model).parameters())
    sync = torch.cuda.synchronize if s.device == "cuda" else (lambda: None)

    # ---- train -----------------------------------------------------------------------------------
    emit({"event": "phase", "phase": "train"})
    batches = _micro_batches(loader, sampler)

    timer = StepTimer(sync)
    tracer = Tracer(trace_path, s.device == "cuda")
    activations_ctx = (
        (lambda: torch.autograd.graph.save_on_cpu(pin_memory=True))
        if plan.offload_activations
        else contextlib.nullcontext
    )
    samples = real_tokens = padded_tokens = 0
    losses: list[float] = []
    tracer.start()  # a no-op without --profile; with it, one trace of all training steps
    for step in range(s.max_steps):
        timer.start("data")
        with tracer.range("data"):
            micro = [next(batches).to(accelerator.device) for _ in range(plan.accum_steps)]
            if plan.channels_last:
                for b in micro:
                    b.inputs["pixel_values"] = b.inputs["pixel_values"].contiguous(memory_format=torch.channels_last)
        timer.stop()

        timer.start("compute")
        with activations_ctx():
            loss = train_window(
                accelerator, model, micro, plan.accum_steps, world, s.task, decoder_inputs, tracer.range
            )
        timer.stop()

        timer.start("optim")
        with tracer.range("optimizer"):
            if s.max_grad_norm and not plan.zero_stage:  # DeepSpeed clips in its step (gradient_clipping)
                accelerator.clip_grad_norm_(trainable, s.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            if plan.empty_cache_steps and (step + 1) % plan.empty_cache_steps == 0:
                torch.cuda.empty_cache()
        timer.stop()
        times = timer.end_step()

        losses.append(loss)
        if not math.isfinite(loss):
            raise FloatingPointError(f"loss became {loss} at step {step + 1}")
        if step >= s.warmup_steps:
            samples += sum(b.n_samples for b in micro)
            real_tokens += sum(b.real_tokens for b in micro)
            padded_tokens += sum(b.padded_tokens for b in micro)
        emit({"event": "step", "step": step + 1, "total": s.max_steps, "loss": loss, "step_s": times.total_s})
    tracer.stop()

    # weights + gradients + optimizer state, counted exactly (what strategies like adafactor or freezing
    # change; on CPU glibc keeps freed memory, so RSS can hide savings of this size)
    state_bytes = _state_bytes(model, trainable, optimizer, plan, world)
    peak_rss = reserved = None
    if s.device == "cuda":
        peak, reserved = memory.cuda_peaks()
        mem_kind = "cuda_allocated"
    else:
        peak_rss = memory.peak_rss_bytes()
        peak, mem_kind = peak_rss - rss_before, "cpu_rss_delta"

    # ---- evaluate --------------------------------------------------------------------------------
    metrics: dict[str, float] = {}
    eval_s = None
    if data.n_eval:
        emit({"event": "phase", "phase": "eval"})
        t0 = time.perf_counter()
        metrics = data.evaluate(model, accelerator)
        eval_s = time.perf_counter() - t0
    metric_name = "rougeL" if s.task == "seq2seq" else "accuracy"

    timed = timer.steps[s.warmup_steps :]
    summary = summarize_steps(timed)
    samples_per_s = samples / summary["timed_s"]
    return TrialResult(
        strategy=spec.strategy,
        status="ok",
        repeat=spec.repeat,
        plan=plan.to_dict(),
        step_time_s=summary["step_time_s"],
        step_time_p90_s=summary["step_time_p90_s"],
        data_wait_s=summary["data_wait_s"],
        compute_s=summary["compute_s"],
        optimizer_s=summary["optimizer_s"],
        warmup_s=sum(t.total_s for t in timer.steps[: s.warmup_steps]),
        # torch.compile: what the warm-up steps took beyond a steady step (the compiles happen there)
        compile_s=(
            sum(max(0.0, t.total_s - summary["step_time_s"]) for t in timer.steps[: s.warmup_steps])
            if plan.compile
            else None
        ),
        timed_steps=len(timed),
        samples_per_s=samples_per_s,
        tokens_per_s=real_tokens / summary["timed_s"],
        padding_waste=1 - real_tokens / padded_tokens,
        epoch_time_s=s.n_train / samples_per_s,
        peak_mem_bytes=int(peak),
        mem_kind=mem_kind,
        peak_reserved_bytes=reserved,
        peak_rss_bytes=peak_rss,
        state_bytes=state_bytes,
        rss_before_model_bytes=rss_before,
        train_loss=sum(losses[-5:]) / len(losses[-5:]),
        final_loss=losses[-1],
        metric_name=metric_name,
        metric=metrics.get(metric_name),
        metrics=metrics,
        eval_s=eval_s,
        n_params=n_params,
        n_trainable=sum(numel(p) for p in trainable),
        env=environment(s.device),
        world_size=world,
        timed_s=summary["timed_s"],
        rank_peak_mem_bytes=[int(peak)],
    )


def numel(p: torch.Tensor) -> int:
    """Elements of a parameter, also when ZeRO-3 has partitioned it away (ds_numel: the full count)."""
    return int(getattr(p, "ds_numel", p.numel()))


def _state_bytes(model, trainable, optimizer, plan: TrialPlan, world: int) -> int:
    """This rank's weights + gradients + optimizer state. Counted from the tensors it holds, except
    the gradients under ZeRO-2/3, which DeepSpeed keeps in its own buckets: 1/world of the full size."""
    weights = sum(  # ZeRO-3 keeps this rank's partition of each weight in ds_tensor (a view of a flat buffer)
        (p.ds_tensor if hasattr(p, "ds_tensor") else p).numel() * p.element_size() for p in model.parameters()
    )
    grads = sum(numel(p) * p.element_size() for p in trainable)
    if plan.zero_stage >= 2:
        grads //= world
    opt_state = memory.tensor_bytes(
        t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)
    )
    return weights + grads + opt_state
