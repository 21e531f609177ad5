"""trainwise estimate: a plan's peak training memory, predicted without training it.

The model is built on the meta device (shapes only, no weights). Per device (rank):

    peak = weights + optimizer + max(forward/backward phase, optimizer-step phase)

    forward/backward = activations (+ gradients left by earlier micro-batches under accumulation)
    optimizer step   = gradients + the step's temporaries

Counted exactly from the shapes and the plan's `MemoryTerms` (what each knob's memory seam wrote:
bytes per weight and gradient, the optimizer's state and step temporaries, autocast copies, ZeRO
shards and offload; see `trainwise/strategies/`). The plan's model edits (freezing, LoRA, the
weights' dtype) are applied to the meta-device model itself, so what trains is read off it.

Activations are not guessed: they are a linear model over shape features (tokens x hidden, tokens
x ffn, heads x length^2 per layer, one recomputed layer under checkpointing, logits, autocast weight
copies, gradients built during backward) whose coefficients are *measured* by a short probe: about
16 forward/backward passes of tiny configs of the same model family on this device, with the peak
of allocated tensor memory read from the allocator (CUDA) or torch.profiler (CPU). Probes are
cached per (family, device, precision, checkpointing, torch version). A family without a tiny-config
recipe is probed on its own config at 1-3 layers instead, and the estimate says so.
"""

from __future__ import annotations

import copy
import gc
import hashlib
import json
import math
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainwise import strategies
from trainwise.core.config import (
    CAUSAL_LM,
    DEVICES,
    TEXT_TASKS,
    StudyConfig,
    check_accum,
    check_lm_columns,
    check_nproc,
)
from trainwise.core.errors import ConfigError
from trainwise.core.files import write_atomic
from trainwise.core.option import option, take
from trainwise.run.ranks import unwrap
from trainwise.strategies import Row
from trainwise.strategies.base import MemoryTerms
from trainwise.strategies.knobs import TrialPlan
from trainwise.strategies.lm import PACKING
from trainwise.strategies.memory import GRAD_CKPT
from trainwise.strategies.scale import FLAGS, ZERO
from trainwise.training.data.chat import check_chat_template
from trainwise.training.data.sources import read_task_data, tokenizer_corpus
from trainwise.training.measure.memory import CUDA_CONTEXT_BYTES, AllocatedPeak, rss_bytes
from trainwise.training.models import ModelSource, load_tokenizer, meta_model, model_config, train_tokenizer

GiB = 1024**3
TEXT_TASK_HELP = "classification, seq2seq or causal-lm (decoder-only LMs)."  # the tasks the estimate models
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
# (hidden, ffn, heads, layers, vocab, micro-batch, source length, target length): varied so that
# every feature is separable; tiny enough that the whole probe takes seconds on a CPU
PROBE_DESIGN = [
    (64, 256, 2, 1, 512, 8, 128, 64),
    (64, 128, 4, 2, 8192, 4, 256, 128),
    (128, 512, 4, 1, 2048, 16, 64, 32),
    (96, 192, 2, 3, 512, 8, 64, 32),
    (128, 256, 8, 2, 8192, 4, 128, 64),
    (64, 256, 4, 3, 2048, 16, 128, 32),
    (128, 512, 2, 2, 512, 8, 256, 64),
    (96, 384, 4, 1, 8192, 16, 256, 128),
    (64, 128, 2, 2, 2048, 16, 64, 128),
    (128, 256, 4, 3, 512, 4, 192, 96),
    (96, 384, 8, 2, 8192, 8, 96, 48),
    (64, 256, 8, 1, 2048, 4, 256, 32),
    (128, 512, 8, 3, 512, 16, 96, 64),
    (96, 192, 4, 1, 8192, 4, 128, 128),
    (64, 128, 4, 3, 2048, 8, 192, 96),
    (128, 256, 2, 1, 8192, 16, 192, 32),
]
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
LOOSE_FIT = 0.05  # a median probe error above this is said beside the estimate
CALIBRATION_VERSION = 6  # bump when FEATURES or the probe change: cached fits are then re-probed


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


@dataclass
class Calibration:
    family: str
    device: str
    probe: dict[str, Any]  # the knob values probed (precision, checkpointing, freezing, LoRA, attention)
    coefficients: dict[str, float]  # bytes per feature unit
    probes: int
    seconds: float
    how: str  # "tiny-config probe" | "own-config probe"
    # median relative error of the fit over the probe points; activations are raised by it, so the estimate (meant to
    # keep a run from OOM) errs high by the fit's typical error: chunked_ce's fit is 9.2% (its logits chunk), the
    # baseline's 0.3%
    residual: float
    cached: bool = field(default=False, compare=False)  # read from the cache, not measured by this process

    def provenance(self) -> str:
        """'calibrated now in 6.1 s' when this process measured it, 'cached' when it was read from the cache."""
        return "cached" if self.cached else f"calibrated now in {self.seconds:.1f} s"

    def describe(self) -> str:
        """The probed plan in words: 'bf16, grad_ckpt=True'."""
        return ", ".join(
            f"{k}={v}" if k != "precision" else str(v) for k, v in self.probe.items() if v or k == "precision"
        )


@dataclass
class MemoryEstimate:
    """Predicted peak per device, in bytes, with its parts."""

    plan: dict
    batch_size: int
    micro_batch: int
    max_length: int
    nproc: int
    parts: dict[str, int]  # weights, grads, optimizer, activations, step_temps (device side)
    phase: str  # which phase sets the peak: "forward/backward" | "optimizer step"
    peak_bytes: int  # predicted peak of allocated tensor memory on the device
    overhead_bytes: int  # runtime the process needs besides tensors (CUDA context, or CPU libraries)
    cpu_offload_bytes: int  # ZeRO offload: what moves to CPU memory
    calibration: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # the plan's knobs this estimate does not model, and why

    @property
    def total_bytes(self) -> int:
        return self.peak_bytes + self.overhead_bytes

    def fits(self, device_memory: int | None) -> bool | None:
        return None if device_memory is None else self.total_bytes <= device_memory

    def to_dict(self) -> dict:
        d = asdict(self)
        d["total_bytes"] = self.total_bytes
        return d


# ---- shapes ------------------------------------------------------------------------------------


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


# ---- calibration probe ---------------------------------------------------------------------------


def _cache_dir() -> Path:
    root = os.environ.get("TRAINWISE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "trainwise")
    return Path(root) / "calibration"


def _tiny_config(base: Any, h: int, f: int, H: int, n: int, vocab: int) -> Any:

    config = copy.deepcopy(base)
    keys = FAMILY_KEYS[config.model_type]
    for name, value in (("h", h), ("f", f), ("H", H), ("n", n)):
        key = keys[name]
        for k in key if isinstance(key, tuple) else (key,):
            setattr(config, k, value)
    if config.model_type == "t5":
        config.d_kv = h // H
    if getattr(config, "num_key_value_heads", None):  # grouped-query attention: keep the family's ratio
        kv = max(1, H * int(base.num_key_value_heads) // int(base.num_attention_heads))
        while H % kv:
            kv -= 1
        config.num_key_value_heads = kv
    if getattr(config, "head_dim", None):  # Llama/Qwen2 store it: it must follow the new width
        config.head_dim = h // H
    _resize_layer_types(config, n)
    config.vocab_size = vocab
    if hasattr(config, "max_position_embeddings"):
        config.max_position_embeddings = max(int(config.max_position_embeddings or 0), 512)
    return config


def _own_config(base: Any, n: int) -> Any:

    config = copy.deepcopy(base)
    for key in ("num_hidden_layers", "encoder_layers", "decoder_layers", "num_layers", "num_decoder_layers"):
        if hasattr(config, key) and isinstance(getattr(config, key), int):
            setattr(config, key, n)
    _resize_layer_types(config, n)
    return config


def _resize_layer_types(config: Any, n: int) -> None:
    """Configs that list each layer's kind (Qwen2, Gemma: full or sliding attention) index it per layer:
    a config cut to n layers keeps the pattern's first n."""
    kinds = getattr(config, "layer_types", None)
    if isinstance(kinds, list) and kinds:
        config.layer_types = [kinds[i % len(kinds)] for i in range(n)]


def probe_point(config: Any, task: str, plan: TrialPlan, micro: int, src_len: int, tgt_len: int, device: str):
    """One measured forward+backward of the plan's model (its activation-relevant knobs): (features, bytes).

    Activation bytes = the peak of allocated memory above weights + state, minus the autocast weight
    copies (counted exactly elsewhere). The design keeps activations far above the gradients, so the
    peak is the activation peak at the start of backward, not the gradients' build-up at its end.
    """
    import torch  # heavy: torch

    from trainwise.training.data.tasks import IGNORE_INDEX, Batch  # heavy: trainwise.training.data.tasks loads torch

    # heavy: trainwise.training.loop loads torch and transformers
    from trainwise.training.loop import accumulate_step, apply_plan, new_accelerator
    from trainwise.training.models import auto_class  # heavy: transformers (auto_class imports it)

    torch.manual_seed(0)
    rt = strategies.runtime(plan, task, device)
    model = apply_plan(auto_class(task).from_config(config, **rt.model_kwargs), rt)
    model.train()
    accelerator = new_accelerator(rt, micro, 1.0)  # one micro-batch, one process: ZeRO and accumulation are
    model = accelerator.prepare(model)  # arithmetic on top of the probe
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, config.vocab_size, (micro, src_len), generator=gen)
    # padded rows, like real batches: an all-ones mask lets attention skip building the 4-D mask
    lengths = torch.randint(src_len // 2, src_len + 1, (micro,), generator=gen)
    lengths[0] = src_len
    mask = (torch.arange(src_len)[None, :] < lengths[:, None]).long()
    inputs = {"input_ids": ids, "attention_mask": mask}
    if task == "seq2seq":
        labels = torch.randint(5, config.vocab_size, (micro, tgt_len), generator=gen)
        items = labels.numel()
    elif task == CAUSAL_LM:  # every real token carries loss (the worst case for a chunked loss)
        labels = ids.masked_fill(mask == 0, IGNORE_INDEX)
        if rt.full_rows:  # full rows of a few examples each, position ids restarting, no mask (as PackedCollator)
            starts = torch.zeros_like(ids)
            starts[:, :: max(1, src_len // 3)] = 1
            position_ids = torch.arange(src_len).expand(micro, -1) - (starts.cumsum(1) - 1) * max(1, src_len // 3)
            inputs, labels = {"input_ids": ids, "position_ids": position_ids}, ids.clone()
        items = int((labels[:, 1:] != IGNORE_INDEX).sum())
    else:
        labels = torch.randint(0, max(2, config.num_labels), (micro,), generator=gen)
        items = micro
    batch = Batch(inputs, labels, micro, 0, 0, items)
    batch = batch.to(accelerator.device)
    decoder_inputs = unwrap(model).prepare_decoder_input_ids_from_labels if task == "seq2seq" else None
    step = (model, [batch], accelerator.backward, task, decoder_inputs)
    accumulate_step(*step, lm_loss=rt.lm_loss)  # lazy inits happen here
    model.zero_grad(set_to_none=True)
    gc.collect()  # earlier probes' models are cyclic garbage: freed inside the window, they'd read as negative
    gc.disable()
    try:
        with AllocatedPeak(device) as peak:
            accumulate_step(*step, lm_loss=rt.lm_loss)
    finally:
        gc.enable()
    shape, terms = shape_of(config, task, plan), terms_of(plan, device)
    del model, batch, step
    scored = src_len if task == CAUSAL_LM else tgt_len  # the probe's causal rows score every token
    return features(shape, micro, src_len, scored, terms.logit_rows), peak.peak_bytes - cast_bytes(shape, terms)


def _fit(rows: list[tuple[dict[str, float], int]]) -> tuple[dict[str, float], float]:
    """Non-negative least squares on relative error (every probe point weighs the same)."""
    import numpy as np  # heavy: numpy
    from scipy.optimize import nnls  # heavy: scipy

    X = np.array([[f[k] for k in FEATURES] for f, _ in rows], dtype=float)
    y = np.array([max(1.0, float(v)) for _, v in rows])
    Xw, yw = X / y[:, None], np.ones_like(y)
    scale = np.where(Xw.max(axis=0) > 0, Xw.max(axis=0), 1.0)
    coef, _ = nnls(Xw / scale, yw)
    coef = coef / scale
    errors = np.abs(X @ coef - y) / y
    return {k: float(c) for k, c in zip(FEATURES, coef, strict=True)}, float(np.median(errors))


def calibrate(
    config: Any, task: str, plan: TrialPlan, device: str, on_probe: Callable[[int, int], None] | None = None
) -> Calibration:
    """Measured activation coefficients for this family, device and the plan's activation-relevant knobs
    (those whose memory seam asks the probe to reproduce them), cached."""
    import torch  # heavy: torch

    family = config.model_type
    how = "tiny-config probe" if family in FAMILY_KEYS else "own-config probe"
    probe_plan = TrialPlan(terms_of(plan, device).probe)
    probe = {k: v for k, v in probe_plan.to_dict().items() if k in terms_of(plan, device).probe}  # JSON-ready
    knobs = "-".join(f"{k}={v}" for k, v in sorted(probe_plan.changed().items())) or "baseline"
    key = f"v{CALIBRATION_VERSION}-{family}-{task}-{device}-{knobs}-torch{torch.__version__}"
    if how == "own-config probe":
        volatile = {"architectures", "transformers_version", "torch_dtype", "dtype", "id2label", "label2id"}
        arch = {k: v for k, v in config.to_dict().items() if k not in volatile and not k.startswith("_")}
        blob = json.dumps(arch, sort_keys=True, default=str).encode()
        key += "-" + hashlib.sha256(blob).hexdigest()[:12]  # str hash() is salted per process
    path = _cache_dir() / f"{key.replace('/', '_')}.json"
    if path.exists():
        return Calibration(**{**json.loads(path.read_text()), "cached": True})
    t0 = time.perf_counter()
    rows = []
    for i, (h, f, H, n, vocab, b, Ls, Lt) in enumerate(PROBE_DESIGN):
        if on_probe:
            on_probe(i, len(PROBE_DESIGN))
        if how == "tiny-config probe":
            probe_config = _tiny_config(config, h, f, H, n, vocab)
        else:  # keep the user's architecture, shrink depth and batch: slower, but no recipe is needed
            probe_config = _own_config(config, n)
            b, Ls, Lt = max(1, b // 4), Ls, Lt
        rows.append(probe_point(probe_config, task, probe_plan, b, Ls, Lt, device))
    coefficients, residual = _fit(rows)
    cal = Calibration(family, device, probe, coefficients, len(rows), time.perf_counter() - t0, how, residual)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({k: v for k, v in asdict(cal).items() if k != "cached"}, default=list))
    return cal


# ---- the estimate --------------------------------------------------------------------------------


def state_parts(s: Shape, terms: MemoryTerms) -> tuple[dict[str, int], int]:
    """Weights, grads and optimizer state on one device, and what ZeRO offload puts in CPU memory."""
    P, T = s.n_params, s.n_trainable
    assert terms.optimizer_state is not None, "the optimizer knob always sets it"
    optim = terms.optimizer_state(s, terms.update_bytes)
    if terms.master_weights:
        optim += 4 * T  # the fp32 master weights live with the optimizer state
    optim = math.ceil(optim / terms.optimizer_shards)
    grads = math.ceil(terms.grad_bytes * T / terms.grad_shards)
    wb = terms.weight_bytes
    gathered = terms.gathered_layers * wb * s.layer_params
    weights = math.ceil(wb * P / terms.weight_shards) + (gathered if terms.weight_shards > 1 else 0)
    if s.quantized and terms.quant_bytes:  # qlora: the base layers' weights in 4 bits, the rest as they are
        weights -= math.ceil((wb - terms.quant_bytes) * s.quantized / terms.weight_shards)
    weights += s.buffer_bytes
    offloaded = 0
    if terms.offload_optimizer:
        offloaded += optim
        optim = 0
    if terms.offload_weights:
        offloaded += math.ceil(wb * P / terms.weight_shards)
        weights = gathered + s.buffer_bytes
    return {"weights": weights, "grads": grads, "optimizer": optim}, offloaded


def step_temporaries(s: Shape, terms: MemoryTerms) -> int:
    """Scratch of one optimizer step (none when the step runs on the CPU under ZeRO-Offload)."""
    if terms.offload_optimizer:
        return 0
    assert terms.step_temps is not None, "the optimizer knob always sets it"
    return terms.step_temps(s, terms.device, terms.update_bytes, terms.optimizer_shards)


def runtime_overhead(device: str) -> int:
    """Memory the process holds besides tensors: the CUDA context, or on CPU the loaded libraries."""
    if device == "cuda":
        return CUDA_CONTEXT_BYTES

    return rss_bytes()  # this process has imported torch + transformers, as a trial does


def target_length(task: str, max_length: int, max_target_length: int) -> int:
    """The target length the estimate prices a trial's rows at: a causal LM's every position may score (its
    --max-length, as EstimateConfig sets it), a seq2seq's labels are --max-target-length long."""
    return max_length if task == CAUSAL_LM else max_target_length


def estimate_plan(
    s: Shape,
    cal: Calibration,
    plan: TrialPlan,
    batch_size: int,
    max_length: int,
    max_target_length: int,
    device: str,
    nproc: int = 1,
    overhead: int | None = None,
) -> MemoryEstimate:
    terms = terms_of(plan, device, nproc)
    micro = batch_size // terms.accum_steps
    f = features(s, micro, max_length, max_target_length, terms.logit_rows)
    act = sum(cal.coefficients[k] * f[k] for k in FEATURES) * (1 + cal.residual) + cast_bytes(s, terms)
    parts, offloaded = state_parts(s, terms)
    # backward frees activations as it builds gradients, so the phase peaks at one end: all activations
    # (start) or all gradients (end). Under accumulation the window's first micro-batch left every
    # gradient allocated, and later micro-batches add their activations on top.
    fwd_bwd = act + parts["grads"] if terms.accum_steps > 1 else max(act, parts["grads"])
    temps = step_temporaries(s, terms)
    opt_step = parts["grads"] + temps
    peak = parts["weights"] + parts["optimizer"] + max(fwd_bwd, opt_step)
    parts = {**parts, "activations": int(act), "step_temps": int(temps)}
    return MemoryEstimate(
        plan=plan.to_dict(),
        batch_size=batch_size,
        micro_batch=micro,
        max_length=max_length,
        nproc=nproc,
        parts=parts,
        phase="forward/backward" if fwd_bwd >= opt_step else "optimizer step",
        peak_bytes=int(peak),
        overhead_bytes=runtime_overhead(device) if overhead is None else overhead,
        cpu_offload_bytes=int(offloaded),
        calibration={"family": cal.family, "how": cal.how, "probes": cal.probes, "device": cal.device},
        notes=terms.notes,
    )


def estimate(
    source: ModelSource,
    task: str,
    num_labels: int,
    plan: TrialPlan,
    batch_size: int,
    max_length: int,
    max_target_length: int,
    device: str,
    nproc: int = 1,
    on_probe: Callable[[int, int], None] | None = None,
) -> MemoryEstimate:
    """Build the shapes on the meta device, calibrate (or reuse the cached probe), and predict."""
    config = model_config(source, task, num_labels)
    shape = shape_of(config, task, plan)
    cal = calibrate(config, task, plan, device, on_probe)
    return estimate_plan(shape, cal, plan, batch_size, max_length, max_target_length, device, nproc)


# ---- input, plans, and what would fit ------------------------------------------------------------


@dataclass(frozen=True)
class DataFacts:
    """What an estimate takes from the user's data, read the way `compare` reads it: the classes, and the
    longest training sequences after truncation (what a dynamically padded batch grows to)."""

    where: str
    rows: int
    num_labels: int
    longest: int  # input tokens
    longest_target: int  # seq2seq: target tokens; causal-lm: the most tokens one example scores
    skipped: tuple[str, ...] = ()  # what reading the data left out, a line each (as compare prints it)

    @classmethod
    def read(cls, cfg: EstimateConfig, source: ModelSource) -> DataFacts:

        # heavy: trainwise.training.data.tasks loads torch
        from trainwise.training.data.tasks import (
            IGNORE_INDEX,
            encode,
        )

        data = read_task_data(
            cfg.task,
            cfg.dataset,
            cfg.train_file,
            None,
            cfg.text_column,
            cfg.target_column,
            prompt_column=cfg.prompt_column,
            response_column=cfg.response_column,
            messages_column=cfg.messages_column,
        )
        if data.data_format == "chat" and source.kind == "preset":  # as compare refuses it, before training one
            check_chat_template(None, source.display())
        train, labels = data.train, data.labels
        with tempfile.TemporaryDirectory(prefix="trainwise-estimate-") as tmp:
            if source.kind == "preset":  # compare trains the preset's tokenizer on the data: so does this
                train_tokenizer(tokenizer_corpus(train), source.ref, Path(tmp))
            tokenizer = load_tokenizer(source, tmp if source.kind == "preset" else None)
            if data.data_format == "chat":
                check_chat_template(tokenizer, source.display())
            label2id = {x: i for i, x in enumerate(labels)}
            enc = encode(train, tokenizer, cfg.task, cfg.max_length, cfg.max_target_length, label2id, data.data_format)
        # seq2seq: target token ids; causal-lm: labels aligned with the inputs, -100 where nothing is scored
        targets = [sum(y != IGNORE_INDEX for y in t) for t in enc.labels if isinstance(t, list)] or [0]
        where = cfg.train_file or cfg.dataset or ""
        return cls(where, len(train), len(labels) or 2, max(enc.lengths()), max(targets), tuple(data.notes()))

    def lengths(self, plan: TrialPlan, cfg: EstimateConfig) -> tuple[int, int]:
        """The widest batch a plan pads to: --max-length, or the longest example under dynamic padding."""
        terms = terms_of(plan, "cpu")
        if cfg.task == CAUSAL_LM:  # (width, the most tokens a row scores)
            if terms.probe.get(PACKING.name):
                return cfg.max_length, cfg.max_length  # full rows of several examples: any position may score
            width = cfg.max_length if terms.padding == "max_length" else min(self.longest, cfg.max_length)
            return width, min(self.longest_target, width)
        if terms.padding == "max_length":
            return cfg.max_length, cfg.max_target_length
        return min(self.longest, cfg.max_length), min(self.longest_target, cfg.max_target_length)


@dataclass(frozen=True)
class EstimateConfig:
    """One `trainwise estimate` invocation, validated once here; its rows parsed once."""

    # the plans to estimate (the option: compare's --strategies, here with the estimate's default rows)
    rows: tuple[str, ...] = take(
        StudyConfig,
        "strategies",
        default=strategies.ESTIMATE_STRATEGIES,
        show_default=strategies.shown(strategies.ESTIMATE_STRATEGIES),
        config_default=MISSING,
    )
    task: str = take(StudyConfig, "task", help=TEXT_TASK_HELP)  # the estimate models transformers
    batch_size: int = take(StudyConfig, "batch_size", help="Effective batch size per device (per optimizer step).")
    accum_steps: int = take(StudyConfig, "accum_steps")
    max_length: int = take(StudyConfig, "max_length", help="Input tokens per sample (padding to it is assumed).")
    max_target_length: int = take(StudyConfig, "max_target_length")
    num_labels: int | None = option(None, "Classes of the head, without data \\[default: 2].")  # None: 2, or the data's
    nproc: int = take(StudyConfig, "nproc", help="Data-parallel ranks (ZeRO partitions over them).")
    # the user's data (like compare's): classes and lengths come from it
    dataset: str | None = take(StudyConfig, "dataset")
    train_file: str | None = take(StudyConfig, "train_file")
    text_column: str | None = take(StudyConfig, "text_column")
    target_column: str | None = take(StudyConfig, "target_column")
    prompt_column: str | None = take(StudyConfig, "prompt_column")  # causal-lm prompt/response data (as compare's)
    response_column: str | None = take(StudyConfig, "response_column")
    messages_column: str | None = take(StudyConfig, "messages_column")  # causal-lm chat transcripts
    zero_stage: int = option(0, "Add DeepSpeed ZeRO stage 1, 2 or 3 to the plan(s) (0: as written).")
    offload: str = option("none", "With --zero: none, optimizer (stage 2) or params (stage 3) to CPU.")
    device: str = take(StudyConfig, "device", help="Device to estimate for: auto, cpu or cuda.")
    # the option is text (24GB), parsed to bytes by api/options.py
    device_memory: int | None = option(None, "Memory of one device, e.g. 24GB; adds a fits column.")
    parsed: tuple[Row, ...] = field(init=False)

    def __post_init__(self) -> None:
        if self.task not in TEXT_TASKS:
            raise ConfigError(
                f"--task must be one of {', '.join(TEXT_TASKS)}, not {self.task!r} (the estimate models transformers)"
            )
        if self.device not in DEVICES:
            raise ConfigError(f"--device must be one of {', '.join(DEVICES)}, not {self.device!r}")
        check_nproc(self.nproc)
        for name in ("batch_size", "accum_steps", "max_length", "max_target_length"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be > 0, got {getattr(self, name)}")
        if self.num_labels is not None and self.num_labels < 2:
            raise ConfigError(f"--num-labels must be >= 2, got {self.num_labels}")
        columns = (self.prompt_column, self.response_column, self.target_column, self.messages_column)
        check_lm_columns(self.task, *columns, self.text_column)
        if self.task == CAUSAL_LM:
            if self.num_labels is not None:
                raise ConfigError("--num-labels is for classification; a causal LM's head is its vocabulary")
            # a causal LM's targets are its inputs: a row scores at most --max-length tokens
            object.__setattr__(self, "max_target_length", self.max_length)
        if self.dataset and self.train_file:
            raise ConfigError("give either --dataset or --train-file, not both")
        if self.num_labels is not None and (self.dataset or self.train_file):
            raise ConfigError("--num-labels comes from the data when --dataset or --train-file is given")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ConfigError(f"--zero must be 0, 1, 2 or 3, not {self.zero_stage}")
        if self.offload not in ("none", "optimizer", "params"):
            raise ConfigError(f"--offload must be none, optimizer or params, not {self.offload!r}")
        zero = None
        if self.zero_stage or self.offload != "none":
            zero = FLAGS.get((self.zero_stage, self.offload))
            if zero is None:
                valid = ", ".join(f"--zero {z}" + (f" --offload {o}" if o != "none" else "") for z, o in FLAGS)
                raise ConfigError(f"--zero {self.zero_stage} --offload {self.offload}: choose one of {valid}")
        parsed = []
        for text in self.rows:
            row = strategies.parse_row(text, self.accum_steps)
            own = next((s.name for s, _ in row.parts if s.name in ZERO), None)
            if zero is not None and own is not None and own != zero:
                raise ConfigError(f"{text!r} is {own}, but --zero/--offload ask for {zero}")
            if zero is not None and own is None:
                row = strategies.parse_row(zero if row.is_baseline else f"{text}+{zero}", self.accum_steps)
            wrong = row.wrong_task(self.task)
            if wrong is not None:
                raise ConfigError(
                    f"strategy {wrong.name!r} applies to {', '.join(sorted(wrong.tasks))}, not {self.task}"
                )
            missing = [m for m in row.missing_packages() if m.startswith("peft")]  # LoRA is built (on meta)
            if missing:
                raise ConfigError(f"strategy {text!r} needs {missing[0]}")
            check_accum(row, row.batch_size or self.batch_size)  # a `row@bsN` is priced at its own batch
            parsed.append(row)
        object.__setattr__(self, "parsed", tuple(parsed))


# a lower bound of any row's estimate (activations are a non-negative fit): what_fits skips the probes of rows whose
# model states alone break the budget (an impossible --device-memory calibrated five rows for a minute on 2 cores)
NO_ACTIVATIONS = Calibration("", "", {}, dict.fromkeys(FEATURES, 0.0), 0, 0.0, "", 0.0)

# rows tried, in order of how little they change training, when a budget is too small
RESCUE_ROWS = [
    "bf16+grad_ckpt",
    "bf16+grad_ckpt+chunked_ce",  # causal-lm only (rows of another task's strategies are skipped)
    "bf16+grad_ckpt+adafactor",
    "bf16+grad_ckpt+freeze_embeddings",
    "bf16+grad_ckpt+freeze_encoder",
    "bf16+grad_ckpt+zero2_offload",
    "bf16+grad_ckpt+zero3_offload",
    "bf16+grad_ckpt+chunked_ce+lora",  # trains adapters, not the model: last
]


def what_fits(
    shape_for: Callable[[TrialPlan], Shape],
    cal_for: Callable[[TrialPlan], Calibration],
    cfg: EstimateConfig,
    device: str,
    budget: int,
    overhead: int,
    micro_batch: int = 1,
) -> list[tuple[str, MemoryEstimate]]:
    """The rescue rows that fit `budget` at micro-batch `micro_batch` (the batch comes back via accumulation)."""
    accum = max(1, cfg.batch_size // micro_batch)
    fits = []
    for text in RESCUE_ROWS:
        row = strategies.parse_row(text + (f"+grad_accum={accum}" if accum > 1 else ""), cfg.accum_steps)
        if row.wrong_task(cfg.task) is not None or any(m.startswith("peft") for m in row.missing_packages()):
            continue
        try:
            shape = shape_for(row.plan)
        except ValueError:  # the plan does not apply to this model (no encoder to freeze)
            continue
        size = (micro_batch * accum, cfg.max_length, cfg.max_target_length, device, cfg.nproc, overhead)
        if estimate_plan(shape, NO_ACTIVATIONS, row.plan, *size).total_bytes > budget:
            continue  # its weights, gradients and optimizer state alone do not fit: no probe can change that
        est = estimate_plan(
            shape,
            cal_for(row.plan),
            row.plan,
            micro_batch * accum,
            cfg.max_length,
            cfg.max_target_length,
            device,
            cfg.nproc,
            overhead,
        )
        if est.total_bytes <= budget:
            fits.append((f"{text}, micro-batch {micro_batch} x {accum} accumulation", est))
    return fits


def min_ranks_for_zero3(s: Shape, budget: int, overhead: int) -> int | None:
    """Fewest ranks over which bf16 ZeRO-3 brings one rank's model states under the budget (activations aside)."""
    plan = strategies.parse_row("bf16+zero3", 1).plan
    n = 1
    while n <= 4096:
        parts, _ = state_parts(s, terms_of(plan, "cuda", n))
        if sum(parts.values()) + overhead <= budget:
            return n
        n *= 2
    return None


def largest_batch(
    s: Shape,
    cal: Calibration,
    plan: TrialPlan,
    budget: int,
    max_length: int,
    max_target_length: int,
    device: str,
    overhead: int,
    limit: int = 1 << 16,
) -> int:
    """Largest effective batch (a multiple of the plan's accumulation) whose estimate fits; 0 if none."""

    def fits(b: int) -> bool:
        e = estimate_plan(s, cal, plan, b, max_length, max_target_length, device, overhead=overhead)
        return e.total_bytes <= budget

    step = terms_of(plan, device).accum_steps
    if not fits(step):
        return 0
    low, high = 1, 2  # in units of `step`
    while high * step <= limit and fits(high * step):
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid * step) else (low, mid)
    return low * step
