"""Numerics and kernels: the precision of weights and compute, TF32, the attention implementation,
torch.compile and the image memory layout."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainwise.strategies.base import (
    IMAGE_TASKS,
    NA,
    PROBED,
    TEXT_TASKS,
    ExportDoc,
    Knob,
    LibraryDefaults,
    MemoryTerms,
    Runtime,
    Strategy,
    Support,
)

if TYPE_CHECKING:
    from trainwise.core.device import DeviceFacts

# ---- precision -----------------------------------------------------------------------------------
# fp32: everything fp32. bf16 / fp16: autocast computes in 16 bits from fp32 weights (the master copy);
# fp16 adds a dynamic GradScaler. bf16_pure: the weights themselves are bf16, so gradients and AdamW's
# state are too, with no fp32 copy anywhere (torchtune's default).
AUTOCAST = {"fp32": "no", "bf16": "bf16", "fp16": "fp16", "bf16_pure": "no"}


def _bf16_inputs(model):
    """bf16 weights take bf16 inputs: floating inputs (image pixels) are cast as they enter the model."""
    import torch  # heavy: torch

    def cast(_module, args, kwargs):
        def bf16(x):
            return x.to(torch.bfloat16) if torch.is_tensor(x) and x.is_floating_point() else x

        return tuple(bf16(a) for a in args), {k: bf16(v) for k, v in kwargs.items()}

    model.register_forward_pre_hook(cast, with_kwargs=True)
    return model


def _precision_runtime(value: str, rt: Runtime) -> None:
    rt.mixed_precision = AUTOCAST[value]
    if value == "bf16_pure":
        rt.weights_dtype = "bfloat16"
        rt.model_edits.append(_bf16_inputs)


def _precision_export(value: str, doc: ExportDoc) -> None:
    doc.args["bf16"] = value == "bf16"
    doc.args["fp16"] = value == "fp16"
    doc.accelerate["mixed_precision"] = AUTOCAST[value]
    if value == "bf16_pure":
        doc.model_kwargs["dtype"] = "torch.bfloat16"
        doc.notes.append(
            "bf16_pure: no TrainingArguments field (bf16=True would autocast over fp32 weights); the snippet "
            "loads the model in bfloat16 and leaves bf16=False, so weights, gradients and AdamW state are bf16"
        )


def _precision_memory(value: str, terms: MemoryTerms) -> None:
    terms.probe["precision"] = value
    if value in ("bf16", "fp16"):
        terms.autocast_copies = True
    elif value == "bf16_pure":
        terms.weight_bytes = terms.grad_bytes = terms.update_bytes = 2


# what each precision needs to run natively: CPU flags (any of them), and the CUDA compute capability
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
FP16_CPU_FLAGS = ("avx512_fp16", "amx_fp16")
BF16_CUDA = (8, 0)  # Ampere: bf16 tensor cores (before: emulated through fp32)
FP16_CUDA = (7, 0)  # Volta: fp16 tensor cores
TF32_CUDA = (8, 0)  # Ampere: TF32 tensor cores (before: the switch does nothing)


def _cc(cap: tuple[int, int]) -> str:
    return f"{cap[0]}.{cap[1]}"


def _precision_support(value: str, device: DeviceFacts) -> Support | None:
    """bf16 / fp16 on this device, from its CPU flags or its CUDA compute capability."""
    if value == "fp32":
        return None
    wants = "fp16" if value == "fp16" else "bf16"
    if device.kind == "cuda":
        cap = device.capability or (0, 0)
        need = FP16_CUDA if wants == "fp16" else BF16_CUDA
        if cap >= need:
            return Support("native", f"on this GPU (compute capability {_cc(cap)}: {wants} tensor cores)")
        return Support(
            "emulated",
            f"on this GPU (compute capability {_cc(cap)}; {wants} tensor cores from {_cc(need)}: none here); on a GPU "
            f"from {'Volta' if wants == 'fp16' else 'Ampere'} on it is the usual win",
        )
    if wants == "fp16":
        return Support("unsupported", "on CPU: fp16 with a GradScaler is trained on CUDA only (never silently fp32)")
    flags = BF16_CPU_FLAGS
    have = [f for f in flags if f in device.cpu_flags]
    if have:
        return Support("native", f"on this CPU ({' / '.join(have)})")
    return Support(
        "emulated",
        f"on this CPU (no {' / '.join(flags)}: bf16 matmuls are emulated); on a CPU with AMX or avx512_bf16, "
        "or a GPU from Ampere on, it is the usual win",
    )


PRECISION = Knob(
    "precision",
    "fp32",
    "weights and compute: fp32, autocast bf16 / fp16 over fp32 weights, or bf16 weights (bf16_pure)",
    _precision_runtime,
    _precision_export,
    _precision_memory,
    choices=tuple(AUTOCAST),
    support=_precision_support,
)


# ---- TF32, attention, compile, channels_last -------------------------------------------------------------


def _tf32_runtime(value: bool, rt: Runtime) -> None:
    if rt.device != "cuda":
        return  # a CUDA switch; the strategy requires CUDA, so on CPU the value is always False

    def switch() -> None:
        import torch  # heavy: torch

        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = value

    rt.backend[f"tf32 {'on' if value else 'off'}"] = switch  # set either way: the baseline is strict fp32


def _tf32_export(value: bool, doc: ExportDoc) -> None:
    if value:
        doc.args["tf32"] = True


def _tf32_support(value: bool, device: DeviceFacts) -> Support | None:
    if not value:
        return None
    if device.kind != "cuda":
        return Support("unsupported", "on CPU: TF32 is a CUDA tensor-core format")
    cap = device.capability or (0, 0)
    if cap >= TF32_CUDA:
        return Support("native", f"on this GPU (compute capability {_cc(cap)}: TF32 tensor cores)")
    return Support(
        "inert",
        f"on this GPU (compute capability {_cc(cap)}; TF32 from {_cc(TF32_CUDA)}): the switch does nothing, "
        "matmuls stay fp32",
    )


TF32 = Knob(
    "tf32",
    False,
    "CUDA: TF32 tensor-core matmuls and convolutions for fp32",
    _tf32_runtime,
    _tf32_export,
    NA("TF32 changes the precision inside matmuls, not what is kept in memory"),
    support=_tf32_support,
)


def _attn_runtime(value: str, rt: Runtime) -> None:
    if value != "default":
        rt.model_kwargs["attn_implementation"] = value


def _attn_export(value: str, doc: ExportDoc) -> None:
    if value != "default":
        doc.model_kwargs["attn_implementation"] = repr(value)
        doc.notes.append(f"attention {value}: no TrainingArguments field; the snippet passes attn_implementation")


ATTN = Knob(
    "attn",
    "default",
    "attn_implementation; default: what transformers picks for the model",
    _attn_runtime,
    _attn_export,
    PROBED,  # the activation probe runs the same attention kernels
    choices=("default", "sdpa", "eager"),
)


def _compile_runtime(value: bool, rt: Runtime) -> None:
    if value:
        import torch  # heavy: torch

        rt.prepared_edits.append(torch.compile)  # lazily: the first (untimed) steps pay for the compile


def _compile_export(value: bool, doc: ExportDoc) -> None:
    if value:
        doc.args["torch_compile"] = True


COMPILE = Knob(
    "compile",
    False,
    "torch.compile the model (compile time reported apart from step time)",
    _compile_runtime,
    _compile_export,
    NA("not modelled: the estimate is for eager execution (compiled kernels usually keep fewer activations)"),
)


def _channels_last_runtime(value: bool, rt: Runtime) -> None:
    if not value:
        return
    import torch  # heavy: torch

    def layout(batch):
        batch.inputs["pixel_values"] = batch.inputs["pixel_values"].contiguous(memory_format=torch.channels_last)
        return batch

    rt.model_edits.append(lambda model: model.to(memory_format=torch.channels_last))
    rt.batch_edits.append(layout)


def _channels_last_export(value: bool, doc: ExportDoc) -> None:
    if value:
        doc.model_lines.append("model = model.to(memory_format=torch.channels_last)")
        doc.notes.append("channels_last: no TrainingArguments field; the snippet converts the model")


CHANNELS_LAST = Knob(
    "channels_last",
    False,
    "images: NHWC memory format for the convolutions",
    _channels_last_runtime,
    _channels_last_export,
    NA("the estimate models transformer text models, not the image path"),
)

KNOBS: list[Knob] = [PRECISION, TF32, ATTN, COMPILE, CHANNELS_LAST]


def _bf16_by_default(lib: LibraryDefaults) -> str | None:
    """TRL's SFTConfig leaves bf16 None and resolves it to `not fp16` (on unless fp16 is asked for)."""
    bf16, fp16 = lib.fields.get("bf16"), lib.fields.get("fp16")
    if bf16 is None and not fp16:
        return "bf16=None, resolved to not fp16"
    return "bf16=True" if bf16 else None


def _field(name: str):
    """A strategy the library turns on by a truthy field of its own name."""
    return lambda lib: f"{name}={lib.fields.get(name)!r}" if lib.fields.get(name) else None


STRATEGIES = [
    Strategy(
        "bf16",
        "bf16 autocast for matmuls/activations; less activation memory, faster where bf16 units exist "
        "(Ampere+ GPUs, CPUs with AMX), emulated and many times slower where they do not; small numeric drift",
        {"precision": "bf16"},
        conflicts=frozenset({"fp16", "bf16_pure"}),
        requires=frozenset({"bf16"}),
        on_by_default=_bf16_by_default,
    ),
    Strategy(
        "bf16_pure",
        "weights, gradients and optimizer state in bf16 with no fp32 master copy (torchtune's default); "
        "about half the state memory and less activation memory, but small updates round away: quality risk",
        {"precision": "bf16_pure"},
        conflicts=frozenset({"bf16", "fp16", "zero1", "zero2", "zero3", "zero2_offload", "zero3_offload"}),
        requires=frozenset({"bf16"}),
    ),
    Strategy(
        "fp16",
        "fp16 autocast + dynamic GradScaler; ~2x faster on tensor-core GPUs, less activation memory; "
        "CUDA only (reported 'unsupported' on CPU, never silently fp32)",
        {"precision": "fp16"},
        conflicts=frozenset({"bf16"}),
        requires=frozenset({"cuda", "fp16"}),
        on_by_default=_field("fp16"),
    ),
    Strategy(
        "tf32",
        "TF32 tensor cores for fp32 matmuls/convolutions (Ampere+); ~2-3x faster fp32 matmuls, 10-bit "
        "mantissa inside them; CUDA only",
        {"tf32": True},
        requires=frozenset({"cuda"}),
        on_by_default=_field("tf32"),
        overlaps=frozenset({"bf16", "fp16", "bf16_pure"}),  # their matmuls run in 16 bits, not TF32
    ),
    Strategy(
        "sdpa",
        "attention through torch scaled_dot_product_attention (flash / memory-efficient kernels on CUDA); "
        "the transformers 5 default where a model supports it, so vs baseline often ~100%",
        {"attn": "sdpa"},
        tasks=TEXT_TASKS,
        conflicts=frozenset({"eager_attn"}),
    ),
    Strategy(
        "eager_attn",
        "attention as plain matmul + softmax (the pre-2.0 path, every model has it); materialises the "
        "L x L score matrix: the reference sdpa is measured against",
        {"attn": "eager"},
        tasks=TEXT_TASKS,
        conflicts=frozenset({"sdpa"}),
    ),
    Strategy(
        "compile",
        "torch.compile the model: fused kernels, usually faster steady steps on GPUs (on a 2-core CPU it measured "
        "slower: time it on yours); the compile itself (tens of seconds, again for each new input shape) is "
        "reported apart as compile (s)",
        {"compile": True},
        on_by_default=_field("torch_compile"),
    ),
    Strategy(
        "channels_last",
        "images: NHWC memory format for the convolutions (what cuDNN's fast kernels, tensor cores "
        "and oneDNN prefer); a layout change, no numeric change",
        {"channels_last": True},
        tasks=IMAGE_TASKS,
    ),
]
