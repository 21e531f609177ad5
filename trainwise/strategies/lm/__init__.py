"""What only a causal LM's fine-tuning has: packed rows, and a loss that never holds [tokens, vocab] logits (trainwise's
own chunked loss, or the CUDA kernels of Liger and Cut Cross-Entropy)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainwise.strategies.base import PROBED, ExportDoc, Knob, MemoryTerms, Runtime, Strategy, Support

if TYPE_CHECKING:
    from trainwise.core.device import DeviceFacts

LM_TASKS = frozenset({"causal-lm"})
CHUNK_TOKENS = 1024  # rows of logits alive at once: 1024 x 151,936 x 4 bytes = 0.6 GB at Qwen2's vocabulary


def _packing_runtime(value: bool, rt: Runtime) -> None:
    if not value:
        return
    rt.data_view = _packed_rows
    rt.full_rows = True
    rt.model_edits.append(packable)


def _packed_rows(data):
    """The trial's training examples packed into --max-length rows (the data's own packing of them)."""
    assert data.packed is not None, "packing applies to causal-lm only (the strategy's tasks)"
    return data.packed()


def packable(model):
    """Packed rows keep their examples apart only for the families checked, without a cache (see data/packing)."""
    from trainwise.strategies.lm.packing import can_pack  # heavy: torch (the CLI imports the registry at start-up)

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
    doc.cannot["train_snippet.py"] = (
        "the HF Trainer has no packing (no TrainingArguments field, no collator that bins examples into rows): it "
        "would train unpacked batches, other losses than the packed trial's"
    )
    doc.notes.append(
        "packing: no TrainingArguments field; sft_train.py packs as trainwise does: SFTConfig(packing=True, "
        "packing_strategy='bfd', padding_free=True) bins whole examples into --max-length rows, position ids "
        "restart per example, no example attends to another"
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
    if value == "full":
        return
    from trainwise.strategies.lm.loss import can_chunk, hidden_head_loss, install_hidden_head  # heavy: torch (as above)

    heads: list = []  # the model's HiddenHead, once the edit has installed it

    def edit(model):
        if why := can_chunk(model):
            raise ValueError(f"{STRATEGY_OF[value]}: {why}")
        if value == "liger":
            liger_kernels(model)
        heads.append(install_hidden_head(model))
        return model

    def loss(model, batch, label_smoothing: float):
        kwargs = dict(reduction="sum", label_smoothing=label_smoothing)
        return hidden_head_loss(model, heads[-1], batch.inputs, batch.labels, CHUNK_TOKENS, **kwargs)

    def fused(model, batch, label_smoothing: float):
        from trainwise.strategies.lm.loss import fused_lm_loss  # heavy: torch (as above)

        return fused_lm_loss(value, model, heads[-1], batch.inputs, batch.labels, label_smoothing)

    rt.model_edits.append(edit)
    rt.lm_loss = loss if value == "chunked" else fused


def liger_kernels(model):
    """Liger's Triton kernels in the model's layers (RMSNorm, SwiGLU MLP, RoPE), as `AutoLigerKernelForCausalLM`
    patches an instance; its fused linear cross-entropy is the loss (`fused_lm_loss`), not a patched forward, so
    the loop's summed loss over the window stays trainwise's. Liger also swaps the family's RoPE function and
    classes in transformers' modules: process-wide, which a trial's own process keeps to itself."""
    # optional: trainwise[liger] (liger-kernel; heavy: Triton, CUDA only)
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN, _apply_liger_kernel_to_instance

    kind = model.config.model_type
    if kind not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        raise ValueError(f"liger: Liger has no kernels for a {kind!r} model (it patches Llama, Qwen2, Mistral, ...)")
    if next(model.parameters()).is_meta:  # the study's check that the edit applies: nothing to patch
        return model
    kernels = dict(rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=False)
    _apply_liger_kernel_to_instance(model=model, **kernels)
    return model


def _lm_loss_export(value: str, doc: ExportDoc) -> None:
    if value == "chunked":
        doc.notes.append(
            "chunked_ce: no TrainingArguments field; sft_train.py needs none: TRL 1.16's SFTTrainer always computes "
            "its loss through a fused LM head in chunks (no [tokens, vocab] logits); train_snippet.py (the HF "
            "Trainer) has no equivalent: its model computes the full logits"
        )
    elif value == "liger":  # a TrainingArguments field (so SFTConfig's too): the Trainer patches the model with Liger
        doc.args["use_liger_kernel"] = True
    elif value == "cce":
        doc.model_lines += [
            "# cce: Cut Cross-Entropy's transformers patch ships in its git version, not in PyPI's 25.1.1:",
            "# pip install 'cut-cross-entropy[transformers] @ git+https://github.com/apple/ml-cross-entropy.git'",
            "from cut_cross_entropy.transformers import cce_patch",
            "model = cce_patch(model)",
        ]
        doc.notes.append(
            "cce: no TrainingArguments field; the snippet patches the model with Cut Cross-Entropy's cce_patch "
            "(its transformers patch: from git, not PyPI)"
        )


def _lm_loss_memory(value: str, terms: MemoryTerms) -> None:
    if value == "chunked":
        terms.probe["lm_loss"] = value  # the probe measures the chunked loss's own temporaries
        terms.logit_rows = CHUNK_TOKENS
    elif value in FUSED:
        terms.notes.append(FUSED[value])


# the fused kernels' memory, not modelled: the estimate counts their rows as the full loss (an overestimate)
FUSED = {
    "liger": "liger: not modelled: Liger's fused linear cross-entropy keeps no [tokens, vocab] logits and its "
    "RMSNorm/SwiGLU kernels save fewer activations; the activation probe runs on CPU, where Triton cannot, so the "
    "estimate counts the full loss's logits (an overestimate)",
    "cce": "cce: not modelled: Cut Cross-Entropy keeps no [tokens, vocab] logits; the activation probe runs on CPU, "
    "where Triton cannot, so the estimate counts the full loss's logits (an overestimate)",
}


def _lm_loss_support(value: str, device: DeviceFacts) -> Support | None:
    if value in FUSED and device.kind != "cuda":
        return Support("unsupported", "on CPU: needs CUDA (Triton kernels)", subject=STRATEGY_OF[value])
    return None


STRATEGY_OF = {"chunked": "chunked_ce", "liger": "liger", "cce": "cce"}

LM_LOSS = Knob(
    "lm_loss",
    "full",
    "a causal LM's loss from full [tokens, vocab] logits, or without them: chunked (trainwise), or the fused CUDA "
    "kernels of Liger (with its RMSNorm/SwiGLU/RoPE) or Cut Cross-Entropy",
    _lm_loss_runtime,
    _lm_loss_export,
    _lm_loss_memory,
    choices=("full", "chunked", "liger", "cce"),
    support=_lm_loss_support,
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
        on_by_default=lambda lib: "packing=True" if lib.sft and lib.fields.get("packing") else None,
    ),
    Strategy(
        "chunked_ce",
        f"the loss over scored positions only, {CHUNK_TOKENS} rows of logits at a time, recomputed in backward; "
        "no [tokens, vocab] fp32 logits, a second head matmul",
        {"lm_loss": "chunked"},
        tasks=LM_TASKS,
        conflicts=frozenset({"zero3", "zero3_offload"}),  # ZeRO-3 frees the gathered head weight before the loss
        # TRL 1.16's SFTTrainer computes its NLL through the LM head in chunks, never the [tokens, vocab] logits
        # (loss_type 'nll': "computes the loss the same way, without materializing the full logits")
        on_by_default=lambda lib: (
            f"loss_type={lib.fields.get('loss_type')!r}: no full logits"
            if lib.sft and lib.fields.get("loss_type") in ("nll", "chunked_nll")
            else None
        ),
    ),
    Strategy(
        "liger",
        "Liger kernels (Triton): fused linear cross-entropy (no [tokens, vocab] logits), RMSNorm, SwiGLU, RoPE; "
        "less activation memory, often faster; CUDA only, Llama/Qwen2/Mistral-like families",
        {"lm_loss": "liger"},
        tasks=LM_TASKS,
        conflicts=frozenset({"chunked_ce", "cce", "zero3", "zero3_offload"}),  # one loss; ZeRO-3 frees the head
        requires=frozenset({"cuda"}),
        packages=frozenset({"liger_kernel"}),
        on_by_default=lambda lib: "use_liger_kernel=True" if lib.fields.get("use_liger_kernel") else None,
    ),
    Strategy(
        "cce",
        "Cut Cross-Entropy (Apple, Triton): the loss without [tokens, vocab] logits, gradients of negligible "
        "entries skipped; least loss memory, no label smoothing; CUDA only",
        {"lm_loss": "cce"},
        tasks=LM_TASKS,
        conflicts=frozenset({"chunked_ce", "liger", "zero3", "zero3_offload"}),
        requires=frozenset({"cuda"}),
        packages=frozenset({"cut_cross_entropy"}),
        # "Backwards requires embeddings to be bf16 or fp16": alone (fp32) it failed on an H200
        with_one_of=frozenset({"bf16", "fp16", "bf16_pure"}),
    ),
]
