"""How samples are grouped and padded into batches (the baseline pads every batch to max length)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainwise.strategies.base import (
    NA,
    TEXT_TASKS,
    ExportDoc,
    Knob,
    LibraryDefaults,
    MemoryTerms,
    Runtime,
    Strategy,
    Support,
)
from trainwise.strategies.lm import LM_TASKS, packable

if TYPE_CHECKING:
    from trainwise.core.device import DeviceFacts


def _padding_runtime(value: str, rt: Runtime) -> None:
    rt.padding = value
    if value == "none":  # a batch is one row of its examples: they must not see each other (the packing check)
        rt.model_edits.append(packable)


def _padding_export(value: str, doc: ExportDoc) -> None:
    if value == "none":  # causal LM only (padding_free's task): a batch's examples flattened into one row
        doc.collator = "DataCollatorWithFlattening()"
        doc.sft["padding_free"] = True
        doc.notes.append(
            "padding_free: no TrainingArguments field; sft_train.py sets SFTConfig(padding_free=True) and "
            "train_snippet.py collates with transformers' DataCollatorWithFlattening: each batch's examples in one "
            "row, position ids restarting per example, no attention mask, no padding"
        )
        return
    if doc.task == "causal-lm":  # ids and labels built by the snippet; the collator pads both (labels with -100)
        width = f', padding="max_length", max_length={doc.max_length}' if value == "max_length" else ""
        doc.collator = f"DataCollatorForSeq2Seq(tokenizer{width})"
        if value == "max_length":  # TRL's collator pads to the longest unless asked for a multiple
            doc.sft["pad_to_multiple_of"] = doc.max_length
        else:
            doc.notes.append("dynamic padding: no TrainingArguments field; both scripts pad each batch to its longest")
        return
    if value == "max_length":
        doc.collator = "default_data_collator"
        doc.tokenize = f'padding="max_length", truncation=True, max_length={doc.max_length}'
        return
    seq2seq = doc.task == "seq2seq"
    doc.collator = "DataCollatorForSeq2Seq(tokenizer, model=model)" if seq2seq else "DataCollatorWithPadding(tokenizer)"
    doc.tokenize = f"truncation=True, max_length={doc.max_length}"  # no padding: the collator pads each batch
    doc.notes.append(
        "dynamic padding: no TrainingArguments field; the snippet's collator pads each batch to its longest"
    )


def _padding_memory(value: str, terms: MemoryTerms) -> None:
    # the estimate takes the data's longest sample when it has the data; a padding-free batch holds no more tokens
    # than the batch padded to its longest (an upper bound)
    terms.padding = "longest" if value == "none" else value


PADDING = Knob(
    "padding",
    "max_length",
    "pad every batch to --max-length, or to its longest sample, or not at all (causal LM: a batch is one row)",
    _padding_runtime,
    _padding_export,
    _padding_memory,
    choices=("max_length", "longest", "none"),
)


def _sampler_runtime(value: str, rt: Runtime) -> None:
    rt.sampler = value


def _sampler_export(value: str, doc: ExportDoc) -> None:
    if value == "random":
        return
    doc.args["train_sampling_strategy"] = "group_by_length"  # transformers 5 (was group_by_length=True)
    if value == "sortish":
        doc.notes.append(
            "sortish: transformers 5 has no sortish sampler; exported as train_sampling_strategy='group_by_length' "
            "(length-grouped batches, without the longest batch first)"
        )


SAMPLER = Knob(
    "sampler",
    "random",
    "which samples share a batch: random, length-grouped (smart batching) or sortish",
    _sampler_runtime,
    _sampler_export,
    NA("the sampler changes which samples share a batch, not its size"),
    choices=("random", "length_grouped", "sortish"),
)


def _pin_runtime(value: bool, rt: Runtime) -> None:
    rt.pin_memory = value


def _pin_export(value: bool, doc: ExportDoc) -> None:
    if doc.device == "cuda":  # the Trainer pins by default (True); on CPU export turns it off either way
        doc.args["dataloader_pin_memory"] = value


def _pin_support(value: bool, device: DeviceFacts) -> Support | None:
    if value and device.kind != "cuda":
        return Support("inert", "on CPU: batches stay in host memory, so there is no copy to a GPU to speed up")
    return None


PIN_MEMORY = Knob(
    "pin_memory",
    False,
    "CUDA: the DataLoader puts each batch in page-locked host memory (DataLoader(pin_memory=True))",
    _pin_runtime,
    _pin_export,
    NA("pinned batches are host memory, not the device memory this estimate predicts"),
    support=_pin_support,
)

KNOBS: list[Knob] = [PADDING, SAMPLER, PIN_MEMORY]


def _pads_to_longest(lib: LibraryDefaults) -> str | None:
    """The Trainer's DataCollatorWithPadding / ForSeq2Seq and SFTTrainer's collator pad each batch to its longest
    (pad_to_multiple_of None), unless TRL packs or goes padding-free, or pads to a multiple as long as its max length
    (every batch padded to it: a config that pads as the baseline does)."""
    if lib.fields.get("packing") or lib.fields.get("padding_free"):
        return None
    multiple, length = lib.fields.get("pad_to_multiple_of"), lib.fields.get("max_length")
    if isinstance(multiple, int) and isinstance(length, int) and multiple >= length:
        return None
    return "the collator pads each batch to its longest (pad_to_multiple_of None)"


STRATEGIES = [
    Strategy(
        "dynamic_pad",
        "pad each batch to its longest sample instead of max length; less padding compute, batch shapes vary",
        {"padding": "longest"},
        tasks=TEXT_TASKS,
        on_by_default=_pads_to_longest,
    ),
    Strategy(
        "smart_batch",
        "length-grouped batches (shuffled mega-batches sorted by length) + dynamic padding; "
        "least padding, batches less random",
        {"padding": "longest", "sampler": "length_grouped"},
        tasks=TEXT_TASKS,
        conflicts=frozenset({"sortish"}),
        on_by_default=lambda lib: (
            "train_sampling_strategy='group_by_length'"
            if lib.fields.get("train_sampling_strategy") == "group_by_length" or lib.fields.get("group_by_length")
            else None
        ),
    ),
    Strategy(
        "pin_memory",
        "CUDA: batches in page-locked host memory, so host-to-GPU copies are faster and overlap the step "
        "(DataLoader pin_memory=True; the Trainer's default); page-locked RAM per batch in flight; inert on CPU",
        {"pin_memory": True},
        on_by_default=lambda lib: (
            "dataloader_pin_memory=True" if lib.device == "cuda" and lib.fields.get("dataloader_pin_memory") else None
        ),
    ),
    Strategy(
        "sortish",
        "fastai / old HF Seq2Seq sortish sampler: random chunks sorted by length, longest batch first "
        "(an OOM shows at step 1) + dynamic padding; less padding, batches less random",
        {"padding": "longest", "sampler": "sortish"},
        tasks=TEXT_TASKS,
        conflicts=frozenset({"smart_batch"}),
    ),
    Strategy(
        "padding_free",
        "each batch's examples flattened into one row, position ids restarting, no padding at all (TRL's "
        "padding_free, transformers' DataCollatorWithFlattening); no padding compute with as many examples a step "
        "as the batch size, attention masked across examples (flash-attention's varlen path on a GPU)",
        {"padding": "none"},
        tasks=LM_TASKS,
        conflicts=frozenset({"packing", "dynamic_pad", "smart_batch", "sortish"}),
        on_by_default=lambda lib: (
            "padding_free=True"
            if lib.sft and lib.fields.get("padding_free") and not lib.fields.get("packing")
            else None
        ),
    ),
]
