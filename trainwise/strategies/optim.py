"""The optimizer: what it is built as, its name for TrainingArguments, and its memory (one table)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainwise.strategies.base import ExportDoc, Knob, LibraryDefaults, MemoryTerms, Runtime, Strategy


def _adamw(foreach: bool | None = None, fused: bool | None = None):
    def build(params: list, lr: float, weight_decay: float) -> Any:
        import torch  # heavy: torch

        # foreach/fused None: torch picks (for-each on CUDA, per-tensor on CPU); the variants pin it
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=foreach, fused=fused)

    return build


def _adafactor(params: list, lr: float, weight_decay: float) -> Any:
    from transformers.optimization import Adafactor  # heavy: transformers

    # the settings HF TrainingArguments(optim="adafactor") uses: a fixed, external learning rate
    return Adafactor(
        params, lr=lr, scale_parameter=False, relative_step=False, warmup_init=False, weight_decay=weight_decay
    )


def _adamw_8bit(params: list, lr: float, weight_decay: float) -> Any:
    import bitsandbytes as bnb  # checked at the edge: the strategy needs the package and CUDA

    return bnb.optim.AdamW8bit(params, lr=lr, weight_decay=weight_decay)


def _per_tensor(copies: int, bytes_each: int | None = None) -> Callable[[Any, str, int, int], int]:
    """A per-tensor step loop: `copies` temporaries the size of the largest trainable tensor."""
    return lambda s, _device, wb, _shards: copies * (bytes_each or wb) * s.largest_trainable


def _foreach(s: Any, _device: str, wb: int, shards: int) -> int:
    """A for-each step: a copy of every (local) state tensor at once."""
    return math.ceil(wb * s.n_trainable / shards)


@dataclass(frozen=True)
class Optim:
    build: Callable[[list, float, float], Any]  # (trainable parameters, lr, weight decay) -> optimizer
    hf_name: str  # TrainingArguments(optim=...)
    state: Callable[[Any, int], int]  # (Shape, bytes per updated weight) -> state bytes
    temps: Callable[[Any, str, int, int], int]  # (Shape, device, bytes per updated weight, state shards) -> bytes
    note: str = ""  # what the export cannot say exactly


def _adamw_temps(s: Any, device: str, wb: int, shards: int) -> int:
    # torch's default AdamW is for-each on CUDA; on CPU a per-tensor loop (sqrt(v) and its quotient)
    return _foreach(s, device, wb, shards) if device == "cuda" else _per_tensor(2)(s, device, wb, shards)


OPTIMIZERS: dict[str, Optim] = {
    "adamw": Optim(_adamw(), "adamw_torch", lambda s, wb: 2 * wb * s.n_trainable, _adamw_temps),
    "adamw_foreach": Optim(
        _adamw(foreach=True),
        "adamw_torch",
        lambda s, wb: 2 * wb * s.n_trainable,
        _foreach,
        "adamw_foreach: exported as optim='adamw_torch', which is torch's for-each AdamW on CUDA (its default "
        "there); TrainingArguments cannot pin it",
    ),
    "adamw_fused": Optim(
        _adamw(fused=True), "adamw_torch_fused", lambda s, wb: 2 * wb * s.n_trainable, lambda *_: 0
    ),  # one fused kernel updates in place
    # 8-bit AdamW: two 1-byte states per parameter (plus small per-block scales)
    "adamw_8bit": Optim(_adamw_8bit, "adamw_bnb_8bit", lambda s, _wb: 2 * s.n_trainable, _per_tensor(1, 4)),
    # Adafactor: factored fp32 second moments (rows + columns); its step makes the update and its negation
    # (measured: 2x the embedding on bart-base, where the optimizer step is the peak)
    "adafactor": Optim(_adafactor, "adafactor", lambda s, _wb: 4 * s.adafactor_elems, _per_tensor(2, 4)),
}


def _optimizer_runtime(value: str, rt: Runtime) -> None:
    rt.optimizer = OPTIMIZERS[value].build


def _optimizer_export(value: str, doc: ExportDoc) -> None:
    doc.args["optim"] = OPTIMIZERS[value].hf_name
    if OPTIMIZERS[value].note:
        doc.notes.append(OPTIMIZERS[value].note)


def _optimizer_memory(value: str, terms: MemoryTerms) -> None:
    terms.optimizer_state = OPTIMIZERS[value].state
    terms.step_temps = OPTIMIZERS[value].temps


OPTIMIZER = Knob(
    "optimizer",
    "adamw",
    "the optimizer (AdamW: torch picks the implementation; the variants pin it)",
    _optimizer_runtime,
    _optimizer_export,
    _optimizer_memory,
    choices=tuple(OPTIMIZERS),
)

KNOBS: list[Knob] = [OPTIMIZER]

NAMES = ("adafactor", "adamw_foreach", "adamw_fused", "adamw_8bit")  # the optimizer strategies (one at a time)
_OTHERS = set(NAMES)


def _optimizer(name: str, summary: str, own_name: bool = True, **kw: Any) -> Strategy:
    """An optimizer strategy; `own_name`: TrainingArguments(optim=...) names it alone (adamw_foreach's
    'adamw_torch' is also the baseline's AdamW: the library's default names no variant of it)."""
    hf = OPTIMIZERS[name].hf_name

    def by_default(lib: LibraryDefaults) -> str | None:
        return f"optim={hf!r}" if own_name and lib.fields.get("optim") == hf else None

    return Strategy(
        name, summary, {"optimizer": name}, conflicts=frozenset(_OTHERS - {name}), on_by_default=by_default, **kw
    )


STRATEGIES = [
    _optimizer(
        "adafactor",
        "Adafactor (factored second moments, no first moment) instead of AdamW; optimizer state "
        "~8 bytes/param -> ~0, may converge differently",
    ),
    _optimizer(
        "adamw_foreach",
        "AdamW updating all tensors per op (multi-tensor kernels); fewer kernel launches, faster on GPU; "
        "a temporary copy of every state during the step",
        own_name=False,
    ),
    _optimizer(
        "adamw_fused",
        "AdamW as one fused kernel per step (torch fused=True, CPU and CUDA); fastest optimizer step, "
        "no temporaries; same math",
    ),
    _optimizer(
        "adamw_8bit",
        "bitsandbytes 8-bit AdamW: optimizer state 8 -> ~2 bytes/param; CUDA only, slight numeric drift",
        requires=frozenset({"cuda"}),
        packages=frozenset({"bitsandbytes"}),
    ),
]
