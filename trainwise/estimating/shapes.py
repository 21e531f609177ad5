"""A model's shapes for the memory estimate: its dimensions read off its config (any family), the shape features the
activation model is linear in, and the plan's memory terms (trainwise.strategies' memory seams)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainwise import strategies
from trainwise.core.config import CAUSAL_LM
from trainwise.core.errors import ConfigError
from trainwise.strategies.base import MemoryTerms
from trainwise.strategies.knobs import TrialPlan
from trainwise.strategies.memory import GRAD_CKPT
from trainwise.training.models import meta_model

GiB = 1024**3


DECODER_KEYS: dict[str, str | tuple[str, ...]] = dict(
    h="hidden_size", f="intermediate_size", H="num_attention_heads", n="num_hidden_layers"
)


# the knobs each family names differently; families listed here are probed on tiny configs
FAMILY_KEYS: dict[str, dict[str, str | tuple[str, ...]]] = {
    "bert": dict(h="hidden_size", f="intermediate_size", H="num_attention_heads", n="num_hidden_layers"),
    "roberta": dict(h="hidden_size", f="intermediate_size", H="num_attention_heads", n="num_hidden_layers"),
    "distilbert": dict(h="dim", f="hidden_dim", H="n_heads", n="n_layers"),
    "t5": dict(h="d_model", f="d_ff", H="num_heads", n=("num_layers", "num_decoder_layers")),
    "bart": dict(
        h="d_model",
        f=("encoder_ffn_dim", "decoder_ffn_dim"),
        H=("encoder_attention_heads", "decoder_attention_heads"),
        n=("encoder_layers", "decoder_layers"),
    ),
    # decoder-only (causal-lm); GPT-2's n_inner is None for 4 x hidden
    "gpt2": dict(h="n_embd", f="n_inner", H="n_head", n="n_layer"),
    "llama": DECODER_KEYS,  # SmolLM2 is a Llama
    "qwen2": DECODER_KEYS,
    "mistral": DECODER_KEYS,
}


FEATURES = (
    "tok_hidden",  # micro-batch tokens x hidden, summed over layers
    "tok_ffn",  # tokens x ffn width, summed over layers
    "attn_scores",  # batch x heads x len^2 (decoder: + cross-attention), summed over layers
    "layer_hidden",  # the same three for ONE layer: what checkpointing recomputes at a time
    "layer_ffn",
    "layer_scores",
    "embed",  # tokens x hidden outside the layers (embeddings, final norms)
    "mask",  # batch x len^2 once (the expanded attention mask)
    "logits",  # target tokens x vocab (LM head + fp32 loss); a chunked causal-LM loss: its chunk x vocab
    "cross_kv",  # seq2seq: source tokens x hidden per decoder layer (cross-attention keys/values)
)


@dataclass(frozen=True)
class Shape:
    """Everything the estimate needs from a model, read off its meta-device build."""

    family: str
    seq2seq: bool
    hidden: int
    ffn: int
    heads: int
    enc_layers: int
    dec_layers: int
    vocab: int
    n_params: int  # all parameter elements (tied weights once)
    n_trainable: int
    buffer_bytes: int
    linear_elems: int  # elements of Linear weights (autocast casts these)
    largest_trainable: int  # elements of the largest trainable tensor
    adafactor_elems: int  # Adafactor state elements: rows + cols for matrices, n for vectors
    layer_params: int  # elements of the largest layer (ZeRO-3 gathers one at a time)
    encoder_saves: bool = True  # False when nothing up to the encoder's output trains (no grads flow back)
    causal: bool = False  # decoder-only LM: the input is the target, every position has logits
    linear_trainable: int | None = None  # elements of trainable Linear weights (None: all of them)
    quantized: int = 0  # elements of the weights held in 4 bits (qlora's base layers), counted in n_params too


def _get(config: Any, key: str | tuple[str, ...], default: int | None = None) -> int:
    key = key[0] if isinstance(key, tuple) else key
    value = getattr(config, key)
    return int(default if value is None and default is not None else value)


def _dims(config: Any) -> dict[str, int]:
    """hidden/ffn/heads/layers from any HF config (attribute_map covers most families)."""
    family = config.model_type
    if family in FAMILY_KEYS:
        k = FAMILY_KEYS[family]
        h, H = _get(config, k["h"]), _get(config, k["H"])
        f = _get(config, k["f"], 4 * h)
    else:
        h = int(getattr(config, "hidden_size", 0) or getattr(config, "d_model", 0))
        f = int(getattr(config, "intermediate_size", 0) or getattr(config, "d_ff", 0) or 4 * h)
        H = int(getattr(config, "num_attention_heads", 0) or 1)
    seq2seq = bool(getattr(config, "is_encoder_decoder", False))
    n_enc = int(getattr(config, "encoder_layers", 0) or getattr(config, "num_layers", 0) or 0)
    n_enc = n_enc or int(getattr(config, "num_hidden_layers", 0) or 0)
    n_dec = 0
    if seq2seq:
        n_dec = int(getattr(config, "decoder_layers", 0) or getattr(config, "num_decoder_layers", 0) or n_enc)
    if not (h and n_enc):
        raise ConfigError(f"cannot read hidden size / layer count from the {family!r} config")
    return dict(hidden=h, ffn=f, heads=H, enc_layers=n_enc, dec_layers=n_dec, vocab=int(config.vocab_size))


def shape_of(config: Any, task: str, plan: TrialPlan) -> Shape:
    """The plan's model on the meta device: its edits (freezing, LoRA, the weights' dtype) applied, as
    the loop applies them, so what trains is read off the model."""
    import torch  # heavy: torch

    from trainwise.training.loop import apply_plan  # heavy: trainwise.training.loop loads torch and transformers

    rt = strategies.runtime(plan, task, "cpu")
    model = apply_plan(meta_model(config, task, **rt.model_kwargs), rt)
    params = list({id(p): p for p in model.parameters()}.values())
    trainable = [p for p in params if p.requires_grad]
    # qlora's bitsandbytes Linear4bit layers subclass Linear; autocast does not cast their 4-bit weights
    four_bit = {
        id(m.weight): m.weight.numel() for m in model.modules() if type(m).__module__.startswith("bitsandbytes")
    }
    linear = {
        id(m.weight): m.weight.numel()
        for m in model.modules()
        if isinstance(m, torch.nn.Linear) and id(m.weight) not in four_bit
    }
    ada = sum(p.shape[0] + p.shape[1] if p.dim() == 2 else p.numel() for p in trainable)
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # under a peft wrapper
    if task == CAUSAL_LM:  # the decoder stack is what keeps activations; LoRA inside it trains through it
        encoder = inner.base_model
    else:
        encoder = inner.get_encoder() if task == "seq2seq" else getattr(inner.base_model, "encoder", None)
    upstream = [*model.get_input_embeddings().parameters(), *(encoder.parameters() if encoder is not None else [])]
    layer_params = 0
    for m in model.modules():
        if isinstance(m, torch.nn.ModuleList):
            for layer in m:
                layer_params = max(layer_params, sum(p.numel() for p in layer.parameters()))
    return Shape(
        family=config.model_type,
        seq2seq=task == "seq2seq",
        **_dims(config),
        n_params=sum(p.numel() for p in params),
        n_trainable=sum(p.numel() for p in trainable),
        buffer_bytes=sum(b.numel() * b.element_size() for b in model.buffers()),
        linear_elems=sum(linear.values()),
        largest_trainable=max((p.numel() for p in trainable), default=0),
        adafactor_elems=ada,
        layer_params=layer_params,
        encoder_saves=any(p.requires_grad for p in upstream),
        causal=task == CAUSAL_LM,
        quantized=sum(four_bit.values()),
        linear_trainable=sum(
            m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear) and m.weight.requires_grad
        ),
    )


def features(s: Shape, micro: int, src_len: int, tgt_len: int, logit_rows: int = 0) -> dict[str, float]:
    """The shape features of one micro-batch. A causal LM's logits are every input position's; a chunked loss
    holds `logit_rows` of them at a time, fewer when the batch scores fewer (for a causal LM `tgt_len` is the
    most tokens one row scores: the response's, or every position's)."""
    lm_rows = micro * src_len
    if s.causal and logit_rows:
        lm_rows = min(logit_rows, micro * min(tgt_len, src_len))
    b, Ls, Lt = micro, src_len, tgt_len if s.seq2seq else 0
    enc_layers = s.enc_layers if s.encoder_saves else 0  # a frozen encoder's activations are not kept
    enc_tokens, dec_tokens = b * Ls * enc_layers, b * Lt * s.dec_layers
    enc_scores = b * s.heads * Ls * Ls
    dec_scores = b * s.heads * (Lt * Lt + Lt * Ls)
    return {
        "tok_hidden": (enc_tokens + dec_tokens) * s.hidden,
        "tok_ffn": (enc_tokens + dec_tokens) * s.ffn,
        "attn_scores": enc_scores * enc_layers + dec_scores * s.dec_layers,
        "layer_hidden": b * max(Ls, Lt) * s.hidden,
        "layer_ffn": b * max(Ls, Lt) * s.ffn,
        "layer_scores": max(enc_scores, dec_scores),
        "embed": b * (Ls + Lt) * s.hidden,
        "mask": b * (Ls * Ls + Lt * Lt + Lt * Ls),
        "logits": (lm_rows if s.causal else b * Lt) * s.vocab,
        "cross_kv": b * Ls * s.hidden * s.dec_layers,
    }


def terms_of(plan: TrialPlan, device: str, nproc: int = 1) -> MemoryTerms:
    return strategies.memory_terms(plan, MemoryTerms(device, nproc))


def cast_bytes(s: Shape, terms: MemoryTerms) -> int:
    """Autocast's 16-bit copies of the Linear weights, kept from forward to backward. Autocast caches the copy
    of a trainable weight for the whole forward; a frozen weight's copy (LoRA's base, a frozen encoder) is
    not cached, but its matmul saves it for backward, unless checkpointing drops what the layer saved."""
    if not terms.autocast_copies:
        return 0
    trainable = s.linear_elems if s.linear_trainable is None else s.linear_trainable
    return 2 * (trainable if terms.probe.get(GRAD_CKPT.name) else s.linear_elems)
