"""The catalogue's building blocks: a Knob (one field of the plan, and everything it does) and a
Strategy (a named, documented setting of knobs).

A knob's three seams say what a value does
- to the run: `runtime` writes into the `Runtime` that `trainwise.training.loop` builds the training from,
- to the exported files: `export` writes into an `ExportDoc` (TrainingArguments, snippet, configs),
- to the memory estimate: `memory` writes into the `MemoryTerms` that `trainwise.estimating` evaluates,
or, for a seam that does not apply, why not: `NA("reason")`, which export and estimate print.
Nothing outside a knob's own module interprets its value; the loop, export and estimate only read
what the seams wrote. `tests/strategies/test_knobs.py` walks every knob over every seam.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from trainwise.core.device import DeviceFacts

V = TypeVar("V")

# Capabilities a device may offer; `requires` names a subset of these.
CAPABILITIES = ("cuda", "bf16", "fp16")
# Tasks: text ones (tokenized sequences: padding, attention, layers to freeze) and images.
TEXT_TASKS = frozenset({"classification", "seq2seq", "causal-lm"})
ENCODER_TASKS = frozenset({"classification", "seq2seq"})  # models with an encoder stack (not decoder-only LMs)
IMAGE_TASKS = frozenset({"image-classification"})
ALL_TASKS = TEXT_TASKS | IMAGE_TASKS
# Optional packages a strategy may need (import name -> the trainwise extra that installs it).
PACKAGE_EXTRAS = {
    "bitsandbytes": "bnb",
    "peft": "lora",
    "deepspeed": "deepspeed",
    "liger_kernel": "liger",
    "cut_cross_entropy": "cce",
}

Model = Any  # a torch.nn.Module (kept loose: the HF models, peft wrappers and compiled modules all pass)
OptimizerFactory = Callable[[list, float, float], Any]  # (trainable parameters, lr, weight decay) -> optimizer


@dataclass(frozen=True)
class NA:
    """A seam that does not apply to a knob, and why; export and estimate print the reason."""

    reason: str


@dataclass
class Runtime:
    """What `trainwise.training.loop` builds a run from. Every knob's runtime seam writes its part; the loop
    reads nothing else about the plan."""

    task: str
    device: str
    mixed_precision: str = "no"  # accelerate's autocast setting: no | bf16 | fp16 (with a GradScaler)
    accum_steps: int = 1  # micro-batches per optimizer step
    padding: str = "max_length"  # the collator's: max_length | longest
    sampler: str = "random"  # trainwise.strategies.batching.samplers: random | length_grouped | sortish
    pin_memory: bool = False  # DataLoader(pin_memory=) on CUDA: batches in page-locked host memory
    model_kwargs: dict[str, Any] = field(default_factory=dict)  # for from_pretrained / from_config
    model_edits: list[Callable[[Model], Model]] = field(default_factory=list)  # in order, before accelerate
    weights_dtype: str | None = None  # cast the weights after the edits (torch dtype name); None: keep fp32
    prepared_edits: list[Callable[[Model], Model]] = field(default_factory=list)  # after accelerate.prepare
    optimizer: OptimizerFactory | None = None
    deepspeed: dict | None = None  # the plan's part of a DeepSpeed config (ZeRO); the loop adds batch and clip
    zero3_init: bool = False  # build ZeRO-3 weights already partitioned (pretrained weights only)
    grads_sharded: bool = False  # DeepSpeed keeps 1/world of the gradients in its own buckets
    batch_edits: list[Callable[[Any], Any]] = field(default_factory=list)  # a Batch on the device -> Batch
    step_contexts: list[Callable[[], contextlib.AbstractContextManager]] = field(default_factory=list)
    after_step: list[Callable[[int], None]] = field(default_factory=list)  # (optimizer steps so far) -> None
    backend: dict[str, Callable[[], None]] = field(default_factory=dict)  # process-wide switches by name, set first
    needs_ranks: bool = False  # runs under torchrun even with one process (DeepSpeed needs a process group)
    # what the sampler draws from, where it is not one example per row: (the trial's data) -> (dataset, row lengths,
    # collate function); a causal LM's packed rows (packing's runtime seam sets it). None: the examples themselves
    data_view: Callable[[Any], tuple[Any, list[int], Callable[[list], Any]]] | None = None
    full_rows: bool = False  # every row is --max-length tokens of several examples (packed), as the estimate probes
    # causal LM: (model, Batch, label smoothing) -> the summed loss; None: cross-entropy of the model's logits
    lm_loss: Callable[[Model, Any, float], Any] | None = None

    def step_context(self) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        for make in self.step_contexts:
            stack.enter_context(make())
        return stack


@dataclass
class ExportDoc:
    """The exported files of a plan, written by the knobs' export seams (`trainwise.exporting.scripts` renders them)."""

    task: str
    device: str
    nproc: int
    batch_size: int  # global: samples per optimizer step over every rank
    max_length: int
    args: dict[str, Any]  # transformers.TrainingArguments keyword arguments
    model_kwargs: dict[str, str] = field(default_factory=dict)  # source text of from_pretrained arguments
    model_lines: list[str] = field(default_factory=list)  # snippet lines applied to `model` once loaded
    collator: str = "default_data_collator"
    tokenize: str = ""  # the tokenizer's keyword arguments in the snippet (source text): how it pads
    train_contexts: list[str] = field(default_factory=list)  # `with ...:` around trainer.train()
    accelerate: dict[str, Any] = field(default_factory=dict)
    ds_config: dict | None = None
    notes: list[str] = field(default_factory=list)  # what TrainingArguments cannot say, and what is done instead
    # causal LM: TRL's SFTConfig keyword arguments beyond the TrainingArguments in `args` (packing, padding)
    sft: dict[str, Any] = field(default_factory=dict)
    # a script that cannot run the plan as trainwise does -> why (its file is not written: export never writes a
    # script that trains something else; with no script left, export refuses)
    cannot: dict[str, str] = field(default_factory=dict)


@dataclass
class MemoryTerms:
    """What the memory estimate is computed from, written by the knobs' memory seams
    (`trainwise.estimating` evaluates them against the model's shapes). Bytes are per parameter."""

    device: str
    nproc: int
    accum_steps: int = 1
    weight_bytes: int = 4  # fp32 weights (autocast computes in 16 bits from fp32 weights)
    grad_bytes: int = 4
    update_bytes: int = 4  # the weights the optimizer updates (its state has their dtype), e.g. the fp32 master
    # (Shape, update_bytes) -> optimizer state bytes; (Shape, device, update_bytes, state shards) -> the scratch
    # bytes of one optimizer step. Set by the optimizer knob.
    optimizer_state: Callable[[Any, int], int] | None = None
    step_temps: Callable[[Any, str, int, int], int] | None = None
    autocast_copies: bool = False  # autocast keeps 16-bit copies of the Linear weights from forward to backward
    master_weights: bool = False  # an fp32 copy of the weights beside 16-bit ones (DeepSpeed mixed precision)
    optimizer_shards: int = 1  # ZeRO: over how many ranks the optimizer state is split
    grad_shards: int = 1
    weight_shards: int = 1
    gathered_layers: int = 0  # ZeRO-3: layers held whole at a time (gathered for compute)
    offload_optimizer: bool = False  # optimizer state (and its step) in CPU memory
    offload_weights: bool = False
    quant_bytes: float = 0.0  # bytes per weight of the 4-bit (NF4) base layers, scales included (0: none quantized)
    logit_rows: int = 0  # causal LM: rows of [tokens, vocab] logits alive at once (0: every token's, the full loss)
    padding: str = "max_length"  # "longest": a batch is as wide as its longest sample (the data's longest, at peak)
    probe: dict[str, Any] = field(default_factory=dict)  # knob values the activation probe must reproduce
    notes: list[str] = field(default_factory=list)  # NA reasons of the plan's knobs


SUPPORT = ("native", "emulated", "inert", "unsupported")


@dataclass(frozen=True)
class Support:
    """How a knob's value fares on a device (a precision the hardware lacks): `native` runs as meant;
    `emulated` runs, in software and slowly; `inert` runs and changes nothing; `unsupported` cannot run.
    `ratio`: a linear layer's time in this precision over fp32 here, measured (None: not measured)."""

    status: str  # one of SUPPORT
    reason: str  # why, naming the device fact it comes from
    ratio: float | None = None
    subject: str = ""  # what is judged: the precision (bf16, bf16_pure, fp16) or tf32

    def __post_init__(self) -> None:
        assert self.status in SUPPORT, self.status

    def line(self) -> str:
        """`bf16 emulated on this CPU (no avx512_bf16 / amx_bf16: ...): a linear layer 26.0x slower than fp32 here`."""
        ratio = "" if self.ratio is None else f": a linear layer {_times(self.ratio)} than fp32 here"
        return f"{self.subject} {self.status} {self.reason}{ratio}"


def _times(ratio: float) -> str:
    return f"{ratio:.1f}x slower" if ratio >= 1 else f"{1 / ratio:.1f}x faster"


@dataclass(frozen=True)
class Probed:
    """The memory seam of a knob that changes what autograd keeps for backward (checkpointing, freezing,
    LoRA, attention kernels): the estimate's activation probe runs the model with the knob's value."""


PROBED = Probed()


@dataclass(frozen=True)
class Knob(Generic[V]):
    """One field of the plan and its behaviour at every seam (or NA and why)."""

    name: str
    default: V
    doc: str  # what the field means, one line
    runtime: Callable[[V, Runtime], None]
    export: Callable[[V, ExportDoc], None] | NA
    memory: Callable[[V, MemoryTerms], None] | Probed | NA
    choices: tuple | None = None  # the values it takes (None: any of the default's type)
    merge: Callable[[V, V], V] | None = None  # how two strategies' values combine (None: they must agree)
    # how a value fares on a device (precisions the hardware may lack); None: any value runs as meant
    support: Callable[[V, DeviceFacts], Support | None] | None = None

    def check(self, value: object) -> None:
        """Internal invariant: values come from strategies and stored plans, never straight from a user."""
        if self.choices is not None:
            assert value in self.choices, f"{self.name}: {value!r} not in {self.choices}"
        else:
            assert isinstance(value, type(self.default)), f"{self.name}: {value!r} is not {type(self.default)}"


@dataclass(frozen=True)
class LibraryDefaults:
    """What a user gets without trainwise: the field defaults of the installed transformers' `TrainingArguments()`,
    or of TRL's `SFTConfig()` (`sft`: TRL's SFTTrainer runs them, with its collator and its loss)."""

    fields: Mapping[str, object]
    sft: bool = False
    device: str = "cpu"  # where they run (the Trainer pins batches only where there is a GPU to copy them to)


@dataclass(frozen=True)
class Strategy:
    """A named setting of knobs with its one-line effect and cost (shown by `trainwise strategies`)."""

    name: str
    summary: str  # "effect; cost" in one line
    sets: Mapping[str, object] = field(default_factory=dict)  # knob name -> value
    takes: str | None = None  # the knob `name=N` sets (freeze_layers=4)
    default_value: int | None = None  # N when not written; None for grad_accum: the study's --accum-steps
    min_value: int = 1
    conflicts: frozenset[str] = frozenset()
    requires: frozenset[str] = frozenset()  # device capabilities
    packages: frozenset[str] = frozenset()  # import names, each a key of PACKAGE_EXTRAS
    tasks: frozenset[str] = ALL_TASKS
    # strategies one of which its row must hold (cce's kernels take 16-bit embeddings: bf16 or fp16 beside it)
    with_one_of: frozenset[str] = frozenset()
    # whether the library's defaults already turn it on, and by which field ("gradient_checkpointing=True"); None:
    # they do not. trainwise.search.ecosystem asks every strategy, so the ecosystem's default is a row of them
    on_by_default: Callable[[LibraryDefaults], str | None] | None = None
    # strategies that already do what this one does (tf32 speeds the fp32 matmuls that bf16 autocast no longer runs):
    # beside one of them the plan search predicts its setting to change nothing until a row holding both is measured
    overlaps: frozenset[str] = frozenset()
    # strategies it may gain (or lose) with far beyond the product of the two alone (freezing a tied embedding also
    # freezes the LM head, and a loss computed in chunks then skips the head's weight gradient): the plan search's
    # prior for the pair is wide, so a pair that gains only together is worth a trial
    interacts: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        unknown = self.requires - set(CAPABILITIES)
        assert not unknown, f"{self.name}: unknown capabilities {unknown}"
        assert self.packages <= set(PACKAGE_EXTRAS), f"{self.name}: packages without an extra"
        assert self.tasks <= ALL_TASKS, f"{self.name}: unknown tasks"

    def settings(self, value: int | None) -> dict[str, object]:
        """The knob values this strategy sets, given its `=N` value (already defaulted and validated)."""
        out = dict(self.sets)
        if self.takes is not None:
            assert value is not None, f"{self.name} needs its value"
            out[self.takes] = value
        return out
