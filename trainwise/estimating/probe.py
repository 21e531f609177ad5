"""The activation model's coefficients, measured: about 16 forward/backward passes of tiny configs of the same family on
this device, the peak of allocated tensor memory read from the allocator (CUDA) or torch.profiler (CPU); cached per
(family, device, precision, checkpointing, torch version)."""

from __future__ import annotations

import copy
import gc
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainwise import strategies
from trainwise.core.config import CAUSAL_LM
from trainwise.core.files import write_atomic
from trainwise.estimating.shapes import FAMILY_KEYS, FEATURES, cast_bytes, features, shape_of, terms_of
from trainwise.run.ranks import unwrap
from trainwise.strategies.knobs import TrialPlan
from trainwise.training.measure.memory import AllocatedPeak

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


LOOSE_FIT = 0.05  # a median probe error above this is said beside the estimate


CALIBRATION_VERSION = 6  # bump when FEATURES or the probe change: cached fits are then re-probed


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
    # Each of the 16 probe points collects the last one's cyclic garbage; with torch and transformers loaded a full
    # collection walked millions of objects (0.35 s a point, about half a calibration's 10 s). Frozen, the objects
    # alive now are not walked again. A process that froze its own (a zygote's child) keeps its freeze as it was.
    ours = gc.get_freeze_count() == 0
    if ours:
        gc.collect()
        gc.freeze()
    try:
        for i, (h, f, H, n, vocab, b, Ls, Lt) in enumerate(PROBE_DESIGN):
            if on_probe:
                on_probe(i, len(PROBE_DESIGN))
            if how == "tiny-config probe":
                probe_config = _tiny_config(config, h, f, H, n, vocab)
            else:  # keep the user's architecture, shrink depth and batch: slower, but no recipe is needed
                probe_config = _own_config(config, n)
                b, Ls, Lt = max(1, b // 4), Ls, Lt
            rows.append(probe_point(probe_config, task, probe_plan, b, Ls, Lt, device))
    finally:
        if ours:
            gc.unfreeze()
    coefficients, residual = _fit(rows)
    cal = Calibration(family, device, probe, coefficients, len(rows), time.perf_counter() - t0, how, residual)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({k: v for k, v in asdict(cal).items() if k != "cached"}, default=list))
    return cal


# a lower bound of any row's estimate (activations are a non-negative fit): what_fits skips the probes of rows whose
# model states alone break the budget (an impossible --device-memory calibrated five rows for a minute on 2 cores)
NO_ACTIVATIONS = Calibration("", "", {}, dict.fromkeys(FEATURES, 0.0), 0, 0.0, "", 0.0)
