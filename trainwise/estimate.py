"""trainwise estimate: a plan's peak training memory, predicted without training it.

The model is built on the meta device (shapes only, no weights). Per device (rank):

    peak = weights + optimizer + max(forward/backward phase, optimizer-step phase)

    forward/backward = activations (+ gradients left by earlier micro-batches under accumulation)
    optimizer step   = gradients + the step's temporaries

Counted exactly from the shapes: weights (fp32: autocast keeps fp32 weights, they are the master
copy; DeepSpeed mixed precision keeps 16-bit weights + fp32 master), gradients (one per trainable
parameter, in the weights' dtype), optimizer state (AdamW 8 B/param, Adafactor row+column factors,
8-bit AdamW 2 B/param), ZeRO partitioning over `nproc` ranks and offload to CPU, optimizer-step
temporaries (the for-each AdamW of CUDA makes a copy of every state; the per-tensor loop of CPU,
two copies of the largest tensor).

Activations are not guessed: they are a linear model over shape features (tokens x hidden, tokens
x ffn, heads x length^2 per layer, one recomputed layer under checkpointing, logits, autocast weight
copies, gradients built during backward) whose coefficients are *measured* by a short probe: about
16 forward/backward passes of tiny configs of the same model family on this device, with the peak
of allocated tensor memory read from the allocator (CUDA) or torch.profiler (CPU). Probes are
cached per (family, device, precision, checkpointing, torch version). A family without a tiny-config
recipe is probed on its own config at 1-3 layers instead, and the estimate says so.
"""

from __future__ import annotations

import gc
import hashlib
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainwise.errors import ConfigError
from trainwise.models import ModelSource, _load_config, _preset_config
from trainwise.plan import TrialPlan

GiB = 1024**3
# the knobs each family names differently; families listed here are probed on tiny configs
FAMILY_KEYS: dict[str, dict[str, str | tuple[str, ...]]] = {
    "bert": dict(h="hidden_size", f="intermediate_size", H="num_attention_heads", n="num_hidden_layers"),
    "roberta": dict(h="hidden_size", f="intermediate_size", H="num_attention_heads", n="num_hidden_layers"),
    "t5": dict(h="d_model", f="d_ff", H="num_heads", n=("num_layers", "num_decoder_layers")),
    "bart": dict(
        h="d_model",
        f=("encoder_ffn_dim", "decoder_ffn_dim"),
        H=("encoder_attention_heads", "decoder_attention_heads"),
        n=("encoder_layers", "decoder_layers"),
    ),
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
    "logits",  # target tokens x vocab (seq2seq LM head + fp32 loss)
    "cross_kv",  # seq2seq: source tokens x hidden per decoder layer (cross-attention keys/values)
)
CALIBRATION_VERSION = 4  # bump when FEATURES or the probe change: cached fits are then re-probed


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


@dataclass
class Calibration:
    family: str
    device: str
    precision: str
    grad_ckpt: bool
    coefficients: dict[str, float]  # bytes per feature unit
    probes: int
    seconds: float
    how: str  # "tiny-config probe" | "own-config probe"
    residual: float  # median relative error of the fit over the probe points
    freeze: tuple[str, ...] = ()


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


def _get(config: Any, key: str | tuple[str, ...]) -> int:
    key = key[0] if isinstance(key, tuple) else key
    return int(getattr(config, key))


def _dims(config: Any) -> dict[str, int]:
    """hidden/ffn/heads/layers from any HF config (attribute_map covers most families)."""
    family = config.model_type
    if family in FAMILY_KEYS:
        k = FAMILY_KEYS[family]
        h, f, H = _get(config, k["h"]), _get(config, k["f"]), _get(config, k["H"])
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


def model_config(source: ModelSource, task: str, num_labels: int):
    if source.kind == "preset":
        return _preset_config(source.ref, num_labels)
    config = _load_config(source)
    if task == "classification":
        config.num_labels = num_labels
    return config


def meta_model(config: Any, task: str):
    """The model with every tensor on the meta device: real shapes, no memory, no init time."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    auto = AutoModelForSeq2SeqLM if task == "seq2seq" else AutoModelForSequenceClassification
    with torch.device("meta"):
        return auto.from_config(config)


def shape_of(config: Any, task: str, plan: TrialPlan) -> Shape:
    import torch

    from trainwise.trial import apply_lora, apply_model_plan

    model = meta_model(config, task)
    apply_model_plan(model, plan.with_(grad_ckpt=False))  # freezing changes what trains
    model = apply_lora(model, plan, task)  # so does LoRA (peft builds its adapters on meta too)
    params = list({id(p): p for p in model.parameters()}.values())
    trainable = [p for p in params if p.requires_grad]
    linear = {id(m.weight): m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)}
    ada = sum(p.shape[0] + p.shape[1] if p.dim() == 2 else p.numel() for p in trainable)
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # under a peft wrapper
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
    )


def features(s: Shape, micro: int, src_len: int, tgt_len: int, plan: TrialPlan) -> dict[str, float]:
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
        "logits": b * Lt * s.vocab,
        "cross_kv": b * Ls * s.hidden * s.dec_layers,
    }


def cast_bytes(s: Shape, plan: TrialPlan) -> int:
    """Autocast's 16-bit copies of the Linear weights, kept from forward to backward (not under ZeRO,
    whose engine casts the module itself)."""
    return 2 * s.linear_elems if plan.precision != "fp32" and not plan.zero_stage else 0


# ---- calibration probe ---------------------------------------------------------------------------


def _cache_dir() -> Path:
    root = os.environ.get("TRAINWISE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "trainwise")
    return Path(root) / "calibration"


def _tiny_config(base: Any, h: int, f: int, H: int, n: int, vocab: int) -> Any:
    import copy

    config = copy.deepcopy(base)
    keys = FAMILY_KEYS[config.model_type]
    for name, value in (("h", h), ("f", f), ("H", H), ("n", n)):
        key = keys[name]
        for k in key if isinstance(key, tuple) else (key,):
            setattr(config, k, value)
    if config.model_type == "t5":
        config.d_kv = h // H
    config.vocab_size = vocab
    if hasattr(config, "max_position_embeddings"):
        config.max_position_embeddings = max(int(config.max_position_embeddings or 0), 512)
    return config


def _own_config(base: Any, n: int) -> Any:
    import copy

    config = copy.deepcopy(base)
    for key in ("num_hidden_layers", "encoder_layers", "decoder_layers", "num_layers", "num_decoder_layers"):
        if hasattr(config, key) and isinstance(getattr(config, key), int):
            setattr(config, key, n)
    return config


def probe_point(config: Any, task: str, plan: TrialPlan, micro: int, src_len: int, tgt_len: int, device: str):
    """One measured forward+backward: (shape features, activation bytes).

    Activation bytes = the peak of allocated memory above weights + state, minus the autocast weight
    copies (counted exactly elsewhere). The design keeps activations far above the gradients, so the
    peak is the activation peak at the start of backward, not the gradients' build-up at its end.
    """
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoModelForSequenceClassification

    from trainwise.data.tasks import Batch
    from trainwise.measure.memory import AllocatedPeak
    from trainwise.trial import _new_accelerator, accumulate_step, apply_lora, apply_model_plan

    torch.manual_seed(0)
    auto = AutoModelForSeq2SeqLM if task == "seq2seq" else AutoModelForSequenceClassification
    model = auto.from_config(config)
    apply_model_plan(model, plan)
    model = apply_lora(model, plan, task)
    model.train()
    # one micro-batch, one process: ZeRO and accumulation are arithmetic on top of the probe
    accelerator = _new_accelerator(plan.with_(accum_steps=1, zero_stage=0, offload="none"), device, micro, 1.0)
    model = accelerator.prepare(model)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, config.vocab_size, (micro, src_len), generator=gen)
    if task == "seq2seq":
        labels = torch.randint(5, config.vocab_size, (micro, tgt_len), generator=gen)
        items = labels.numel()
    else:
        labels = torch.randint(0, max(2, config.num_labels), (micro,), generator=gen)
        items = micro
    # padded rows, like real batches: an all-ones mask lets attention skip building the 4-D mask
    lengths = torch.randint(src_len // 2, src_len + 1, (micro,), generator=gen)
    lengths[0] = src_len
    mask = (torch.arange(src_len)[None, :] < lengths[:, None]).long()
    batch = Batch({"input_ids": ids, "attention_mask": mask}, labels, micro, 0, 0, items)
    batch = batch.to(accelerator.device)
    decoder_inputs = (
        accelerator.unwrap_model(model).prepare_decoder_input_ids_from_labels if task == "seq2seq" else None
    )
    accumulate_step(model, [batch], accelerator.backward, task, decoder_inputs)  # lazy inits happen here
    model.zero_grad(set_to_none=True)
    gc.collect()  # earlier probes' models are cyclic garbage: freed inside the window, they'd read as negative
    gc.disable()
    try:
        with AllocatedPeak(device) as peak:
            accumulate_step(model, [batch], accelerator.backward, task, decoder_inputs)
    finally:
        gc.enable()
    shape = shape_of(config, task, plan)
    del model, batch
    return features(shape, micro, src_len, tgt_len, plan), peak.peak_bytes - cast_bytes(shape, plan)


def _fit(rows: list[tuple[dict[str, float], int]]) -> tuple[dict[str, float], float]:
    """Non-negative least squares on relative error (every probe point weighs the same)."""
    import numpy as np
    from scipy.optimize import nnls

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
    """Measured activation coefficients for this family, device, precision and checkpointing (cached)."""
    import torch

    family = config.model_type
    how = "tiny-config probe" if family in FAMILY_KEYS else "own-config probe"
    # frozen weights change what autograd saves (no inputs kept for their weight grads): probed too
    probe_plan = TrialPlan(precision=plan.precision, grad_ckpt=plan.grad_ckpt, freeze=plan.freeze, lora_r=plan.lora_r)
    ckpt = "ckpt" if plan.grad_ckpt else "nockpt"
    frozen = "-frozen-" + "+".join(plan.freeze) if plan.freeze else ""
    frozen += f"-lora{plan.lora_r}" if plan.lora_r else ""
    key = f"v{CALIBRATION_VERSION}-{family}-{task}-{device}-{plan.precision}-{ckpt}{frozen}-torch{torch.__version__}"
    if how == "own-config probe":
        volatile = {"architectures", "transformers_version", "torch_dtype", "dtype", "id2label", "label2id"}
        arch = {k: v for k, v in config.to_dict().items() if k not in volatile and not k.startswith("_")}
        blob = json.dumps(arch, sort_keys=True, default=str).encode()
        key += "-" + hashlib.sha256(blob).hexdigest()[:12]  # str hash() is salted per process
    path = _cache_dir() / f"{key}.json"
    if path.exists():
        stored = json.loads(path.read_text())
        return Calibration(**{**stored, "freeze": tuple(stored.get("freeze", ()))})
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
    cal = Calibration(
        family,
        device,
        plan.precision,
        plan.grad_ckpt,
        coefficients,
        len(rows),
        time.perf_counter() - t0,
        how,
        residual,
        freeze=plan.freeze,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(cal)))
    tmp.replace(path)
    return cal


# ---- the estimate --------------------------------------------------------------------------------

OPTIMIZER_BYTES_PER_PARAM = {
    "adamw": 8.0,
    "adamw_foreach": 8.0,
    "adamw_fused": 8.0,
    "adamw_8bit": 2.0,
}  # adafactor: from the factored shapes


def optimizer_bytes(s: Shape, optimizer: str) -> int:
    if optimizer == "adafactor":
        return 4 * s.adafactor_elems
    if optimizer not in OPTIMIZER_BYTES_PER_PARAM:
        raise ConfigError(f"no memory model for optimizer {optimizer!r}")
    return int(OPTIMIZER_BYTES_PER_PARAM[optimizer] * s.n_trainable)


def state_parts(s: Shape, plan: TrialPlan, nproc: int) -> tuple[dict[str, int], int]:
    """Weights, grads and optimizer state on one device, and what ZeRO offload puts in CPU memory.

    Without ZeRO: fp32 weights and grads (autocast computes in 16 bits from fp32 weights). Under
    ZeRO the DeepSpeed engine holds 16-bit weights and grads with mixed precision and adds an fp32
    master copy to the optimizer state; stage 1 partitions optimizer state over the ranks, stage 2
    also the grads, stage 3 also the weights (plus one gathered layer at a time).
    """
    P, T = s.n_params, s.n_trainable
    optim = optimizer_bytes(s, plan.optimizer)
    if plan.zero_stage == 0:
        return {"weights": 4 * P + s.buffer_bytes, "grads": 4 * T, "optimizer": optim}, 0
    half = plan.precision != "fp32"
    wb = 2 if half else 4
    if half:
        optim += 4 * T  # the fp32 master weights live with the optimizer state
    n = max(1, nproc)
    weights = wb * P + s.buffer_bytes
    grads = wb * T
    if plan.zero_stage >= 1:
        optim = math.ceil(optim / n)
    if plan.zero_stage >= 2:
        grads = math.ceil(grads / n)
    if plan.zero_stage >= 3:
        weights = math.ceil(wb * P / n) + 2 * wb * s.layer_params + s.buffer_bytes
    offloaded = 0
    if plan.offload in ("optimizer", "params"):
        offloaded += optim
        optim = 0
    if plan.offload == "params":
        offloaded += math.ceil(wb * P / n)
        weights = 2 * wb * s.layer_params + s.buffer_bytes
    return {"weights": weights, "grads": grads, "optimizer": optim}, offloaded


def step_temporaries(s: Shape, plan: TrialPlan, device: str, nproc: int) -> int:
    """Scratch of one optimizer step: CUDA's for-each AdamW copies every state once, CPU's loop the largest."""
    if plan.offload != "none":
        return 0
    if plan.optimizer == "adamw_fused":
        return 0  # one fused kernel updates in place
    if plan.optimizer == "adamw_foreach" or (device == "cuda" and plan.optimizer == "adamw"):
        n = max(1, nproc) if plan.zero_stage >= 1 else 1
        return math.ceil(4 * s.n_trainable / n)
    # AdamW: sqrt(v) and its quotient; HF Adafactor: the factored update and its negation (measured: 2x
    # the embedding on bart-base, where the optimizer step is the peak)
    per_tensor = {"adamw": 2, "adafactor": 2, "adamw_8bit": 1}.get(plan.optimizer, 2)
    return per_tensor * 4 * s.largest_trainable


def runtime_overhead(device: str) -> int:
    """Memory the process holds besides tensors: the CUDA context, or on CPU the loaded libraries."""
    if device == "cuda":
        return 512 * 1024**2  # CUDA context + cuBLAS workspace, ~0.5 GiB on recent drivers
    from trainwise.measure.memory import rss_bytes

    return rss_bytes()  # this process has imported torch + transformers, as a trial does


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
    micro = plan.micro_batch_size(batch_size)
    f = features(s, micro, max_length, max_target_length, plan)
    act = sum(cal.coefficients[k] * f[k] for k in FEATURES) + cast_bytes(s, plan)
    parts, offloaded = state_parts(s, plan, nproc)
    # backward frees activations as it builds gradients, so the phase peaks at one end: all activations
    # (start) or all gradients (end). Under accumulation the window's first micro-batch left every
    # gradient allocated, and later micro-batches add their activations on top.
    fwd_bwd = act + parts["grads"] if plan.accum_steps > 1 else max(act, parts["grads"])
    temps = step_temporaries(s, plan, device, nproc)
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
class EstimateConfig:
    """One `trainwise estimate` invocation, validated once here."""

    rows: tuple[str, ...]
    task: str = "classification"
    batch_size: int = 16
    accum_steps: int = 4
    max_length: int = 128
    max_target_length: int = 48
    num_labels: int = 2
    nproc: int = 1
    zero_stage: int = 0
    offload: str = "none"
    device: str = "auto"  # the device to estimate for
    device_memory: int | None = None

    def __post_init__(self) -> None:
        from trainwise import strategies
        from trainwise.config import DEVICES, TEXT_TASKS, check_accum

        if self.task not in TEXT_TASKS:
            raise ConfigError(
                f"--task must be one of {', '.join(TEXT_TASKS)}, not {self.task!r} (the estimate models transformers)"
            )
        if self.device not in DEVICES:
            raise ConfigError(f"--device must be one of {', '.join(DEVICES)}, not {self.device!r}")
        for name in ("batch_size", "accum_steps", "max_length", "max_target_length", "nproc"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be > 0, got {getattr(self, name)}")
        if self.num_labels < 2:
            raise ConfigError(f"--num-labels must be >= 2, got {self.num_labels}")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ConfigError(f"--zero must be 0, 1, 2 or 3, not {self.zero_stage}")
        if self.offload not in ("none", "optimizer", "params"):
            raise ConfigError(f"--offload must be none, optimizer or params, not {self.offload!r}")
        if self.offload == "optimizer" and self.zero_stage < 1:
            raise ConfigError("--offload optimizer needs --zero 1, 2 or 3")
        if self.offload == "params" and self.zero_stage != 3:
            raise ConfigError("--offload params needs --zero 3")
        for row in self.rows:
            for st in strategies.parse_spec(row):
                if self.task not in st.tasks:
                    raise ConfigError(f"strategy {st.name!r} applies to {', '.join(sorted(st.tasks))}, not {self.task}")
            plan = strategies.build_plan(row, 2)
            if plan.zero_stage and self.zero_stage and plan.zero_stage != self.zero_stage:
                raise ConfigError(f"{row!r} is ZeRO-{plan.zero_stage}, but --zero {self.zero_stage} was given")
            if strategies.build_plan(row, 2).lora_r:  # the estimate builds the adapters (on meta) with peft
                missing = [m for m in strategies.missing_packages(row) if m.startswith("peft")]
                if missing:
                    raise ConfigError(f"strategy {row!r} needs {missing[0]}")
            check_accum([row], self.batch_size, self.accum_steps)

    def plan(self, row: str) -> TrialPlan:
        from trainwise import strategies

        plan = strategies.build_plan(row, self.accum_steps)
        if self.zero_stage:  # --zero/--offload apply ZeRO to every row; a zero* strategy carries its own
            plan = plan.with_(zero_stage=self.zero_stage, offload=self.offload)
        return plan


# plans tried, in order of how little they change training, when a budget is too small
RESCUE_PLANS: list[tuple[str, dict]] = [
    ("bf16+grad_ckpt", {}),
    ("bf16+grad_ckpt+adafactor", {}),
    ("bf16+grad_ckpt+freeze_embeddings", {}),
    ("bf16+grad_ckpt+freeze_encoder", {}),
    ("bf16+grad_ckpt (ZeRO-2, optimizer offload)", {"zero_stage": 2, "offload": "optimizer"}),
    ("bf16+grad_ckpt (ZeRO-3, offload params)", {"zero_stage": 3, "offload": "params"}),
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
    """The rescue plans that fit `budget` at micro-batch `micro_batch` (the batch comes back via accumulation)."""
    from trainwise import strategies

    fits = []
    for label, extra in RESCUE_PLANS:
        spec = label.split(" ")[0]
        accum = max(1, cfg.batch_size // micro_batch)
        plan = strategies.build_plan(spec, 1).with_(accum_steps=accum, **extra)
        batch = micro_batch * accum
        if spec.endswith("freeze_encoder") and not _has_encoder(shape_for, plan):
            continue
        est = estimate_plan(
            shape_for(plan),
            cal_for(plan),
            plan,
            batch,
            cfg.max_length,
            cfg.max_target_length,
            device,
            cfg.nproc,
            overhead,
        )
        if est.total_bytes <= budget:
            fits.append((f"{label}, micro-batch {micro_batch} x {accum} accumulation", est))
    return fits


def _has_encoder(shape_for: Callable[[TrialPlan], Shape], plan: TrialPlan) -> bool:
    try:
        shape_for(plan)
    except ValueError:
        return False
    return True


def min_ranks_for_zero3(s: Shape, plan: TrialPlan, budget: int, overhead: int) -> int | None:
    """Fewest ranks over which ZeRO-3 brings one rank's model states under the budget (activations aside)."""
    n = 1
    while n <= 4096:
        parts, _ = state_parts(s, plan.with_(zero_stage=3, offload="none"), n)
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

    step = plan.accum_steps
    if not fits(step):
        return 0
    low, high = 1, 2  # in units of `step`
    while high * step <= limit and fits(high * step):
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid * step) else (low, mid)
    return low * step
