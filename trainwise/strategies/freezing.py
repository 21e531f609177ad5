"""Freeze parts of the model (or all of it but LoRA adapters): no gradients, no optimizer state for them.

The estimate builds the plan's model on the meta device with these same edits, so what trains (and
so gradients and optimizer state) is counted from the model itself; the activation probe runs them
too, since frozen weights change what autograd keeps for backward.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainwise.strategies.base import (
    ENCODER_TASKS,
    PROBED,
    TEXT_TASKS,
    ExportDoc,
    Knob,
    MemoryTerms,
    Model,
    Runtime,
    Strategy,
)

if TYPE_CHECKING:
    import torch

PARTS = ("embeddings", "encoder")


def frozen_parameters(model: Model, part: str) -> list[torch.nn.Parameter]:
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


def layer_stack(model: Model) -> torch.nn.ModuleList:
    """The (encoder) stack of transformer layers: BERT encoder.layer, T5 encoder.block, BART encoder.layers;
    a decoder-only LM's one stack (Llama/Qwen2 layers, GPT-2 h)."""
    import torch  # heavy: torch

    root = model.get_encoder() if getattr(model.config, "is_encoder_decoder", False) else model.base_model
    stacks = [
        m
        for name, m in root.named_modules()
        if isinstance(m, torch.nn.ModuleList) and name.split(".")[-1] in ("layer", "layers", "block", "h")
    ]
    if not stacks:
        raise ValueError(f"{type(model).__name__}: no stack of layers found to freeze")
    return stacks[0]


def lower_layer_parameters(model: Model, n: int) -> list[torch.nn.Parameter]:
    """The embeddings and the first n layers (n = -1: the lower half)."""
    stack = layer_stack(model)
    n = len(stack) // 2 if n < 0 else n
    if n > len(stack):
        raise ValueError(f"freeze_layers={n}: the model has only {len(stack)} layers")
    params = frozen_parameters(model, "embeddings")
    return params + [p for layer in stack[:n] for p in layer.parameters()]


def freezing(select: Callable[[Model], list[torch.nn.Parameter]]) -> Callable[[Model], Model]:
    """A model edit that freezes the parameters `select` picks."""

    def edit(model: Model) -> Model:
        for p in select(model):
            p.requires_grad_(False)
        return model

    return edit


# ---- freeze a named part -------------------------------------------------------------------------------


def _freeze_runtime(value: tuple[str, ...], rt: Runtime) -> None:
    for part in value:
        rt.model_edits.append(freezing(functools.partial(frozen_parameters, part=part)))


# the snippet's form of frozen_parameters(model, "embeddings"): word, position and type embeddings and their norm
EMBEDDING_LINES = [
    "for p in model.get_input_embeddings().parameters(): p.requires_grad_(False)",
    "for name, p in model.named_parameters():",
    "    if 'embed' in name: p.requires_grad_(False)",
]


def _freeze_export(value: tuple[str, ...], doc: ExportDoc) -> None:
    for part in value:
        if part == "embeddings":
            doc.model_lines += EMBEDDING_LINES
        else:
            enc = "model.get_encoder()" if doc.task == "seq2seq" else "model.base_model.encoder"
            doc.model_lines.append(f"for p in {enc}.parameters(): p.requires_grad_(False)")
    if value:
        doc.notes.append(
            f"freeze {'+'.join(value)}: no TrainingArguments field; the snippet sets requires_grad_(False)"
        )


FREEZE: Knob[tuple[str, ...]] = Knob(
    "freeze",
    (),
    "named parts with no gradients: embeddings, encoder",
    _freeze_runtime,
    _freeze_export,
    PROBED,  # frozen weights change what autograd keeps for backward
    merge=lambda a, b: tuple(sorted({*a, *b})),
)

# ---- freeze the lower layers ------------------------------------------------------------------------


def _layers_runtime(value: int, rt: Runtime) -> None:
    if value:
        rt.model_edits.append(freezing(lambda model: lower_layer_parameters(model, value)))


def _layers_export(value: int, doc: ExportDoc) -> None:
    if not value:
        return
    n = "len(stack) // 2" if value < 0 else str(value)
    stack = "model.get_encoder().block" if doc.task == "seq2seq" else "model.base_model.encoder.layer"
    doc.model_lines += [
        f"stack = {stack}  # the layer list (BART: .layers)",
        *EMBEDDING_LINES,
        f"for layer in stack[:{n}]:",
        "    for p in layer.parameters(): p.requires_grad_(False)",
    ]
    doc.notes.append("freeze_layers: no TrainingArguments field; the snippet sets requires_grad_(False)")


FREEZE_LAYERS = Knob(
    "freeze_layers",
    0,
    "freeze the embeddings and the first N layers of the stack (-1: the lower half; 0: none)",
    _layers_runtime,
    _layers_export,
    PROBED,
)

# ---- 4-bit base weights (QLoRA) ------------------------------------------------------------------------

QUANT_TASKS = frozenset({"causal-lm"})
# QLoRA's base weights (Dettmers et al. 2023, and transformers' BitsAndBytesConfig as SFT recipes set it): NF4 in
# blocks of 64 with double quantization (the blocks' fp32 scales quantized again to 8 bits)
QUANT_KWARGS: dict[str, Any] = dict(quant_type="nf4", compress_statistics=True)
_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def compute_dtype(rt: Runtime) -> str:
    """The dtype a 4-bit layer dequantizes to and multiplies in: the row's precision (bf16 / fp16 autocast or
    bf16_pure's weights), fp32 otherwise, so a qlora row differs from its lora row in its base weights only."""
    return rt.weights_dtype or _DTYPES.get(rt.mixed_precision, "float32")


def quantize_base_4bit(model: Model, dtype: str) -> Model:
    """Every Linear layer but the output head becomes a bitsandbytes NF4 `Linear4bit` over the same weights
    (quantized here, on the CPU: ~0.5 byte per weight plus the blocks' scales), everything frozen, as
    `BitsAndBytesConfig(load_in_4bit=True, ...)` + peft's `prepare_model_for_kbit_training` leave a model.
    On the meta device (the estimate, the study's check that edits apply) the layers are swapped, not quantized."""
    import bitsandbytes as bnb  # optional: trainwise[bnb] (bitsandbytes); heavy: loads torch
    import torch  # heavy: torch

    head = model.get_output_embeddings()
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is not torch.nn.Linear or child is head:
                continue
            meta = child.weight.is_meta
            layer = bnb.nn.Linear4bit(
                child.in_features,
                child.out_features,
                bias=child.bias is not None,
                compute_dtype=getattr(torch, dtype),
                device="meta" if meta else None,
                **QUANT_KWARGS,
            )
            layer.weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False, **QUANT_KWARGS)
            if child.bias is not None:
                layer.bias = child.bias
            setattr(module, name, layer if meta else layer.to(child.weight.device))  # .to quantizes
    for p in model.parameters():
        p.requires_grad_(False)
    model.is_loaded_in_4bit = True  # what peft reads to wrap Linear4bit layers with its 4-bit LoRA layer
    return model


def _quant_runtime(value: str, rt: Runtime) -> None:
    if value == "nf4":  # the dtype is read when the edit runs: after every knob's runtime seam has written
        rt.model_edits.append(lambda model: quantize_base_4bit(model, compute_dtype(rt)))


def _quant_export(value: str, doc: ExportDoc) -> None:
    if value != "nf4":
        return
    dtype = next((d for k, d in _DTYPES.items() if doc.args.get(k)), "float32")
    if doc.model_kwargs.get("dtype") == "torch.bfloat16":  # bf16_pure
        dtype = "bfloat16"
    doc.model_kwargs["quantization_config"] = (
        f'BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, '
        f"bnb_4bit_compute_dtype=torch.{dtype})"
    )
    doc.model_kwargs.setdefault("dtype", "torch.float32")  # the unquantized rest (embeddings, norms, head) as trainwise
    doc.notes.append(
        "qlora: no TrainingArguments field; the snippet loads the model with a BitsAndBytesConfig (NF4, double "
        "quantization, compute in the row's precision; a preset is saved and reloaded, from_config cannot quantize) "
        "and wraps it with LoRA adapters"
    )


# NF4 with double quantization: 4 bits a weight, one 8-bit scale per block of 64, one fp32 scale per 256 blocks
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)


def _quant_memory(value: str, terms: MemoryTerms) -> None:
    if value == "nf4":
        terms.probe["base_quant"] = value  # the probe quantizes its tiny models: 4-bit matmuls' temporaries
        terms.quant_bytes = NF4_BYTES


BASE_QUANT = Knob(
    "base_quant",
    "none",
    "the frozen base weights: as they are, or NF4 4-bit (bitsandbytes Linear4bit) under LoRA adapters",
    _quant_runtime,
    _quant_export,
    _quant_memory,
    choices=("none", "nf4"),
)

# ---- LoRA --------------------------------------------------------------------------------------------


# a causal LM's adapters: every attention and MLP projection (QLoRA's choice), not peft's default q/v only
CAUSAL_LORA_TARGETS = {
    "llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "qwen2": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "gpt2": ["c_attn", "c_proj", "c_fc"],
}


def lora_targets(model_type: str, task: str = "") -> list[str] | None:
    """The projections peft adapts for this model type: for a causal LM of a known family its attention
    and MLP projections, otherwise the attention projections peft knows (None: it knows none)."""
    if task == "causal-lm" and model_type in CAUSAL_LORA_TARGETS:
        return CAUSAL_LORA_TARGETS[model_type]
    # optional: trainwise[lora] (peft)
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as TARGETS

    targets = TARGETS.get(model_type)
    return list(targets) if targets else None


PEFT_TASKS = {"seq2seq": "SEQ_2_SEQ_LM", "causal-lm": "CAUSAL_LM"}  # peft's TaskType names (else SEQ_CLS)


def apply_lora(model: Model, r: int, task: str) -> Model:
    """Wrap the model with LoRA adapters (peft); everything else is frozen, the task head trains."""
    from peft import LoraConfig, TaskType, get_peft_model  # optional: trainwise[lora] (peft)

    targets = lora_targets(model.config.model_type, task)
    if not targets:
        kind = model.config.model_type
        raise ValueError(
            f"lora: peft knows no attention modules to adapt in a {kind!r} model; drop lora for this model"
        )
    task_type = TaskType[PEFT_TASKS.get(task, "SEQ_CLS")]
    config = LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.0, target_modules=targets, task_type=task_type)
    return get_peft_model(model, config)


def _lora_runtime(value: int, rt: Runtime) -> None:
    if value:
        rt.model_edits.append(lambda model: apply_lora(model, value, rt.task))


def _lora_export(value: int, doc: ExportDoc) -> None:
    if not value:
        return
    peft_task = PEFT_TASKS.get(doc.task, "SEQ_CLS")
    doc.model_lines.append("from peft import LoraConfig, get_peft_model  # pip install peft")
    if doc.task == "causal-lm":  # trainwise's targets by model type; another type: peft's default (as trainwise)
        doc.model_lines += [
            "# every attention and MLP projection (QLoRA's choice), not peft's default q/v only",
            f"LORA_TARGETS = {CAUSAL_LORA_TARGETS!r}",
            f"model = get_peft_model(model, LoraConfig(r={value}, lora_alpha={2 * value}, lora_dropout=0.0, "
            f'target_modules=LORA_TARGETS.get(model.config.model_type), task_type="{peft_task}"))',
        ]
    else:
        doc.model_lines.append(
            f"model = get_peft_model(model, LoraConfig(r={value}, lora_alpha={2 * value}, "
            f'lora_dropout=0.0, task_type="{peft_task}"))  # peft picks the attention projections'
        )
    doc.notes.append("lora: no TrainingArguments field; the snippet wraps the model with peft")


LORA = Knob(
    "lora_r",
    0,
    "LoRA adapter rank on the attention projections (0: full fine-tuning)",
    _lora_runtime,
    _lora_export,
    PROBED,
)

KNOBS: list[Knob] = [FREEZE, FREEZE_LAYERS, BASE_QUANT, LORA]  # quantize before LoRA wraps the layers

STRATEGIES = [
    Strategy(
        "freeze_embeddings",
        "freeze the embedding module(s); saves their grads + optimizer state, usually small quality "
        "effect (seed 000: higher ROUGE per epoch)",
        {"freeze": ("embeddings",)},
        tasks=TEXT_TASKS,
        conflicts=frozenset({"lora"}),
        # a tied head (SmolLM2, GPT-2) is frozen with the embeddings, and these losses then skip its weight gradient:
        # freeze_embeddings + chunked_ce read 78% where each alone read 97% and 123% (BENCHMARKS §D1)
        interacts=frozenset({"chunked_ce", "liger", "cce"}),
    ),
    Strategy(
        "freeze_encoder",
        "freeze the encoder stack; large cut in grads, optimizer state and backward time "
        "(seed 000: -5 GB on BART-large), quality may drop",
        {"freeze": ("encoder",)},
        tasks=ENCODER_TASKS,  # a decoder-only LM has no encoder
        conflicts=frozenset({"lora"}),
    ),
    Strategy(
        "freeze_layers",
        "freeze the embeddings and the first N layers (freeze_layers=N, default half of them), keeping the "
        "lower layers' pretrained features; their grads and optimizer state go away, quality may drop",
        takes="freeze_layers",
        default_value=-1,
        tasks=TEXT_TASKS,
        conflicts=frozenset({"lora", "freeze_encoder"}),
    ),
    Strategy(
        "lora",
        "LoRA adapters (rank 8) on the attention query/value projections (causal LMs: every attention and MLP "
        "projection), the rest frozen (a classifier's head trains); grads and optimizer state shrink to ~1-2% of "
        "the model; adapts less than full fine-tuning",
        {"lora_r": 8},
        tasks=TEXT_TASKS,
        conflicts=frozenset({"freeze_embeddings", "freeze_encoder", "freeze_layers"}),
        packages=frozenset({"peft"}),
    ),
    Strategy(
        "qlora",
        "LoRA adapters (rank 8) over a frozen base quantized to 4-bit NF4 (bitsandbytes): base weights ~8x "
        "smaller than fp32; every matmul dequantizes first (slower), quantization error in the base",
        {"base_quant": "nf4", "lora_r": 8},
        tasks=QUANT_TASKS,
        conflicts=frozenset({"lora", "freeze_embeddings", "freeze_layers", "zero1", "zero2", "zero3"})
        | frozenset({"zero2_offload", "zero3_offload"}),  # DeepSpeed shards fp weights, not bitsandbytes' packed ones
        packages=frozenset({"bitsandbytes", "peft"}),
    ),
]
