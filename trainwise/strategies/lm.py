"""What only a causal LM's fine-tuning has: packed rows, and a loss that never holds [tokens, vocab] logits."""

from __future__ import annotations

from trainwise.strategies.base import PROBED, ExportDoc, Knob, MemoryTerms, Runtime, Strategy

LM_TASKS = frozenset({"causal-lm"})
CHUNK_TOKENS = 1024  # rows of logits alive at once: 1024 x 151,936 x 4 bytes = 0.6 GB at Qwen2's vocabulary


def _packing_runtime(value: bool, rt: Runtime) -> None:
    if not value:
        return
    rt.packing = True
    rt.model_edits.append(_packable)


def _packable(model):
    """Packed rows keep their examples apart only for the families checked, without a cache (see data/packing)."""
    from trainwise.data.packing import can_pack  # heavy: torch (the CLI imports the registry at start-up)

    if why := can_pack(model.config):
        raise ValueError(f"packing: {why}")
    model.config.use_cache = False  # a cache, even in train mode, would let packed examples see each other
    return model


def _packing_export(value: bool, doc: ExportDoc) -> None:
    if not value:
        return
    # TRL 1.16: bfd packing bins whole examples best-fit decreasing into max_length rows (bfd never cuts one that
    # fits) and implies padding_free: the collator sends position ids restarting per example and no attention mask,
    # so transformers keeps the examples apart (sdpa / eager), and sets the label at each example's start to -100
    doc.sft.update(packing=True, packing_strategy="bfd", padding_free=True)
    doc.notes.append(
        "packing: no TrainingArguments field; train_snippet.py (the HF Trainer) trains unpacked rows, sft_train.py "
        "packs as trainwise does: SFTConfig(packing=True, packing_strategy='bfd', padding_free=True) bins whole "
        "examples into --max-length rows, position ids restart per example, no example attends to another"
    )


PACKING = Knob(
    "packing",
    False,
    "examples packed into full --max-length rows, each attending only to itself",
    _packing_runtime,
    _packing_export,
    PROBED,  # the probe runs packed rows (position ids, no attention mask); a row is always --max-length wide
)


def _lm_loss_runtime(value: str, rt: Runtime) -> None:
    if value != "chunked":
        return
    from trainwise.lm_loss import can_chunk, hidden_head_loss, install_hidden_head  # heavy: torch (as above)

    heads: list = []  # the model's HiddenHead, once the edit has installed it

    def edit(model):
        if why := can_chunk(model):
            raise ValueError(f"chunked_ce: {why}")
        heads.append(install_hidden_head(model))
        return model

    def loss(model, batch, label_smoothing: float):
        kwargs = dict(reduction="sum", label_smoothing=label_smoothing)
        return hidden_head_loss(model, heads[-1], batch.inputs, batch.labels, CHUNK_TOKENS, **kwargs)

    rt.model_edits.append(edit)
    rt.lm_loss = loss


def _lm_loss_export(value: str, doc: ExportDoc) -> None:
    if value == "chunked":
        doc.notes.append(
            "chunked_ce: no TrainingArguments field; sft_train.py needs none: TRL 1.16's SFTTrainer always computes "
            "its loss through a fused LM head in chunks (no [tokens, vocab] logits); train_snippet.py (the HF "
            "Trainer) has no equivalent: its model computes the full logits"
        )


def _lm_loss_memory(value: str, terms: MemoryTerms) -> None:
    if value == "chunked":
        terms.probe["lm_loss"] = value  # the probe measures the chunked loss's own temporaries
        terms.logit_rows = CHUNK_TOKENS


LM_LOSS = Knob(
    "lm_loss",
    "full",
    "a causal LM's loss from full [tokens, vocab] logits, or chunked over the scored positions only",
    _lm_loss_runtime,
    _lm_loss_export,
    _lm_loss_memory,
    choices=("full", "chunked"),
)

KNOBS: list[Knob] = [PACKING, LM_LOSS]

STRATEGIES = [
    Strategy(
        "packing",
        "examples packed into full rows (best-fit, none cut), position ids restarting, no cross-attention; "
        "no padding compute, a step holds more examples",
        {"packing": True},
        tasks=LM_TASKS,
        conflicts=frozenset({"dynamic_pad", "smart_batch", "sortish"}),
    ),
    Strategy(
        "chunked_ce",
        f"the loss over scored positions only, {CHUNK_TOKENS} rows of logits at a time, recomputed in backward; "
        "no [tokens, vocab] fp32 logits, a second head matmul",
        {"lm_loss": "chunked"},
        tasks=LM_TASKS,
        conflicts=frozenset({"zero3", "zero3_offload"}),  # ZeRO-3 frees the gathered head weight before the loss
    ),
]
