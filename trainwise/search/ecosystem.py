"""The ecosystem's default: what a user gets without trainwise, as a row of trainwise strategies, read from the
installed libraries (never from a table of this module's): a causal LM's from TRL's `SFTConfig()` (as the export's
sft_train.py runs it: SFTTrainer with TRL's own defaults), every other task's from transformers' `TrainingArguments()`
(as the export's train_snippet.py runs it: the HF Trainer).

`trainwise plan` measures that row in the same study as every other, so its plan is judged against the run the user
would otherwise start, and is never slower than it. Each field read is said in `fields`, with the strategy it maps
to (or why it maps to none), so plan.md can say where the row came from.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass, field

# TrainingArguments(optim=...) -> the trainwise strategy that runs the same optimizer (None: the baseline's AdamW)
OPTIM = {
    "adamw_torch": None,
    "adamw_torch_fused": "adamw_fused",
    "adafactor": "adafactor",
    "adamw_bnb_8bit": "adamw_8bit",
    "adamw_8bit": "adamw_8bit",
}


@dataclass(frozen=True)
class Default:
    """The ecosystem's default for a task: the row that reproduces it, where it came from, and what each field read
    became (`fields`: field name -> 'value: the strategy it maps to, or why none')."""

    row: str  # the strategies, in the registry's order ('baseline' where none applies)
    source: str  # "TRL 1.16.0 SFTConfig()" / "transformers 5.23.0 TrainingArguments()"
    fields: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()  # what the row cannot reproduce (the learning rate: the study's, not the library's)

    @property
    def label(self) -> str:
        return f"ecosystem default ({self.source})"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def defaults_of(cls: type) -> dict[str, object]:
    """A config dataclass's field defaults, read without building it (SFTConfig() refuses bf16 on a CPU machine
    unless told use_cpu: its defaults are the fields', and its __post_init__ resolves bf16=None to `not fp16`)."""
    out: dict[str, object] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def default_for(task: str, device: str, valid: Callable[[str], str | None] = lambda _row: None) -> Default:
    """The ecosystem's default for `task` on `device` (cpu | cuda), as a row. `valid(row)`: why the registry or the
    device cannot run a row (None: it can); a strategy it refuses is left out and said in the notes."""
    if task == "causal-lm":
        try:
            from trl import SFTConfig  # optional: trainwise[sft]; heavy (transformers)
        except ImportError:
            found = _trainer(task, device, valid)
            return dataclasses.replace(
                found, notes=(*found.notes, "TRL is not installed: the HF Trainer's defaults stand in for SFTConfig's")
            )
        return _build(task, device, defaults_of(SFTConfig), f"TRL {_version('trl')} SFTConfig()", valid, sft=True)
    return _trainer(task, device, valid)


def _trainer(task: str, device: str, valid: Callable[[str], str | None] = lambda _row: None) -> Default:
    from transformers import TrainingArguments  # heavy: transformers

    source = f"transformers {_version('transformers')} TrainingArguments()"
    return _build(task, device, defaults_of(TrainingArguments), source, valid, sft=False)


def _build(
    task: str, device: str, d: dict[str, object], source: str, valid: Callable[[str], str | None], sft: bool
) -> Default:
    from trainwise import strategies  # the registry (its order, its names)

    said: dict[str, str] = {}
    names: list[str] = []

    def take(name: str | None, key: str, why: str) -> None:
        said[key] = f"{d.get(key)!r}: {name or why}"
        if name:
            names.append(name)

    fp16 = bool(d.get("fp16"))
    bf16 = d.get("bf16")
    bf16 = (not fp16) if bf16 is None else bool(bf16)  # SFTConfig.__post_init__: bf16 unless fp16
    take("bf16" if bf16 else None, "bf16", "fp32 compute")
    if fp16:
        take("fp16", "fp16", "")
    tf32 = d.get("tf32")
    take("tf32" if tf32 and device == "cuda" else None, "tf32", "not set: torch's default matmul precision")
    take("grad_ckpt" if d.get("gradient_checkpointing") else None, "gradient_checkpointing", "off")
    optim = str(d.get("optim"))
    take(OPTIM.get(optim), "optim", "torch's AdamW, as the baseline's" if optim == "adamw_torch" else "not mapped")
    take("liger" if d.get("use_liger_kernel") else None, "use_liger_kernel", "off")
    take("compile" if d.get("torch_compile") else None, "torch_compile", "off")
    if task != "image-classification":
        if sft and (d.get("packing") or d.get("padding_free")):
            take("packing", "packing", "")
        else:
            # the collator pads each batch to its longest: SFTTrainer's DataCollatorForLanguageModeling
            # (pad_to_multiple_of None on a GPU or CPU), the Trainer's DataCollatorWithPadding / ForSeq2Seq
            said["padding"] = "each batch to its longest (the collator's pad_to_multiple_of None): dynamic_pad"
            names.append("dynamic_pad")
        if str(d.get("train_sampling_strategy", "random")) == "group_by_length" or d.get("group_by_length"):
            said["train_sampling_strategy"] = "group_by_length: smart_batch"
            names.append("smart_batch")
    if sft and task == "causal-lm":
        # TRL's SFTTrainer computes its NLL through the LM head in chunks, never the [tokens, vocab] logits (loss_type
        # 'nll' in TRL 1.16: 'computes the loss the same way, without materializing the full logits')
        said["loss_type"] = f"{d.get('loss_type')!r}: chunked_ce (TRL's loss never holds the full logits)"
        names.append("chunked_ce")
    notes = [f"learning rate: the study's, not the library's {d.get('learning_rate')!r} (one rate for every row)"]
    order = list(strategies.REGISTRY)
    kept: list[str] = []
    for n in sorted(dict.fromkeys(names), key=order.index):
        why = valid("+".join([*kept, n]))
        if why is None:
            kept.append(n)
        else:
            notes.append(f"{n}: left out here ({why})")
    return Default("+".join(kept) or "baseline", source, said, tuple(notes))
