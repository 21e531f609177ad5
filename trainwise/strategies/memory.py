"""Strategies that trade compute for activation memory."""

from __future__ import annotations

from trainwise.strategies.base import NA, PROBED, ExportDoc, Knob, MemoryTerms, Model, Runtime, Strategy

# ---- gradient accumulation -----------------------------------------------------------------------------


def _accum_runtime(value: int, rt: Runtime) -> None:
    rt.accum_steps = value


def _accum_export(value: int, doc: ExportDoc) -> None:
    doc.args["gradient_accumulation_steps"] = value
    doc.args["per_device_train_batch_size"] = doc.batch_size // (value * doc.nproc)
    # not in accelerate_config.yaml: `accelerate launch` rejects the key there (the Trainer takes it from the
    # arguments; a DeepSpeed config says "auto")


def _accum_memory(value: int, terms: MemoryTerms) -> None:
    terms.accum_steps = value


ACCUM = Knob(
    "accum_steps",
    1,
    "micro-batches per optimizer step (each batch / N samples)",
    _accum_runtime,
    _accum_export,
    _accum_memory,
)

# ---- activation checkpointing --------------------------------------------------------------------------


def enable_checkpointing(model: Model) -> Model:
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(f"{type(model).__name__} does not support gradient checkpointing")
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5 name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.config.use_cache = False
    return model


def _ckpt_runtime(value: bool, rt: Runtime) -> None:
    if value:
        rt.model_edits.append(enable_checkpointing)


def _ckpt_export(value: bool, doc: ExportDoc) -> None:
    if value:  # transformers 5 names (gradient_checkpointing* are deprecated aliases)
        doc.args["activation_checkpointing"] = True
        doc.args["activation_checkpointing_kwargs"] = {"use_reentrant": False}


GRAD_CKPT = Knob(
    "grad_ckpt",
    False,
    "recompute activations in backward (non-reentrant activation checkpointing)",
    _ckpt_runtime,
    _ckpt_export,
    PROBED,  # the probe measures what checkpointing keeps
)

# ---- activation offload and cache release (CUDA) ---------------------------------------------------------


def _offload_act_runtime(value: bool, rt: Runtime) -> None:
    if value:
        import torch  # heavy: torch

        rt.step_contexts.append(lambda: torch.autograd.graph.save_on_cpu(pin_memory=True))


def _offload_act_export(value: bool, doc: ExportDoc) -> None:
    if value:
        doc.train_contexts.append("torch.autograd.graph.save_on_cpu(pin_memory=True)")
        doc.notes.append(
            "offload_activations: no TrainingArguments field; the snippet trains under "
            "torch.autograd.graph.save_on_cpu(pin_memory=True)"
        )


OFFLOAD_ACTIVATIONS = Knob(
    "offload_activations",
    False,
    "CUDA: keep the activations saved for backward in pinned CPU memory",
    _offload_act_runtime,
    _offload_act_export,
    NA("not modelled: saved activations move to pinned CPU memory, so the device peak is below this estimate"),
)


def _empty_cache_runtime(value: int, rt: Runtime) -> None:
    if value:
        import torch  # heavy: torch

        def release(step: int) -> None:
            if step % value == 0:
                torch.cuda.empty_cache()

        rt.after_step.append(release)


def _empty_cache_export(value: int, doc: ExportDoc) -> None:
    if value:
        doc.args["torch_empty_cache_steps"] = value


EMPTY_CACHE = Knob(
    "empty_cache_steps",
    0,
    "CUDA: torch.cuda.empty_cache() every N optimizer steps (0: never)",
    _empty_cache_runtime,
    _empty_cache_export,
    NA("releasing cached blocks lowers reserved memory, not the allocated peak this estimate predicts"),
)

KNOBS: list[Knob] = [ACCUM, GRAD_CKPT, OFFLOAD_ACTIVATIONS, EMPTY_CACHE]

STRATEGIES = [
    Strategy(
        "grad_accum",
        "same effective batch as batch/N x N micro-steps (grad_accum=N, default --accum-steps); activation "
        "memory ~1/N, step time up a little (smaller, less efficient matmuls)",
        takes="accum_steps",
        min_value=2,
    ),
    Strategy(
        "grad_ckpt",
        "recompute activations in backward; ~-40..-60% activation memory, ~+20..40% step time",
        {"grad_ckpt": True},
        # TRL's SFTConfig turns it on (gradient_checkpointing=True); TrainingArguments leaves it off
        on_by_default=lambda lib: "gradient_checkpointing=True" if lib.fields.get("gradient_checkpointing") else None,
    ),
    Strategy(
        "offload_activations",
        "keep the activations saved for backward in pinned CPU memory (torch save_on_cpu); activation "
        "memory on the GPU down, step time up with PCIe traffic",
        {"offload_activations": True},
        conflicts=frozenset({"grad_ckpt"}),
        requires=frozenset({"cuda"}),
    ),
    Strategy(
        "empty_cache",
        "torch.cuda.empty_cache() every N steps (empty_cache=N, default 4; HF torch_empty_cache_steps) for "
        "lower reserved memory and fragmentation; slower steps after each release",
        takes="empty_cache_steps",
        default_value=4,
        requires=frozenset({"cuda"}),
    ),
]
