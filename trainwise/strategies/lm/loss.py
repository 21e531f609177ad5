"""Causal-LM loss without the full [tokens, vocab] fp32 logits (`chunked_ce`).

A causal LM's plain loss materialises logits for every position ([B*T, V], upcast to fp32), then log-softmax
and its gradient, each as large again: at V=151936 and 4096 tokens that is 2.5 GB per copy. Here the loss
keeps only positions whose shifted label is scored, and walks them in chunks of `chunk_tokens`: each chunk's
logits live only inside the loop, in the forward and again (recomputed) in the backward, so the peak is a
few [chunk, V] fp32 tensors, at the price of one more h @ W.T matmul per chunk in the backward.

Numerics follow transformers' own path: the lm_head matmul runs in the weights' dtype, the softmax and the
cross-entropy in fp32 (`ForCausalLMLoss` upcasts the logits); W's gradient is accumulated over chunks in fp32.

With no scored position at all (every shifted label -100, e.g. a micro-batch of prompts only) the loss is 0,
with zero gradients, not NaN as `F.cross_entropy(..., reduction="mean")` gives: gradient accumulation may meet
such a micro-batch, and it should add nothing rather than poison the step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trainwise.core.batch import IGNORE_INDEX


def _logits(h: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return F.linear(h, weight, bias).float()


def _exp_shifted_(logits: Tensor) -> Tensor:
    """exp(logits - row max) in place (no second [chunk, V] tensor); returns the row max [chunk, 1]."""
    top = logits.amax(-1, keepdim=True)
    logits.sub_(top).exp_()
    return top


def _cross_entropy_sum(logits: Tensor, target: Tensor, smoothing: float) -> Tensor:
    """F.cross_entropy(logits, target, reduction="sum", label_smoothing=smoothing), overwriting `logits`."""
    picked = logits.gather(1, target[:, None]).squeeze(1)
    mean = logits.mean(-1) if smoothing else None
    top = _exp_shifted_(logits).squeeze(1)  # logits now hold exp(logits - top)
    lse = top + logits.sum(-1).log()
    loss = (1.0 - smoothing) * (lse - picked).sum()
    if mean is not None:
        loss = loss + smoothing * (lse - mean).sum()
    return loss


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of (h @ W.T + b) against `target`, one chunk of rows at a time; saves no logits."""

    @staticmethod
    def forward(ctx, h, weight, bias, target, chunk: int, smoothing: float):
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        for s in range(0, h.shape[0], chunk):
            total += _cross_entropy_sum(_logits(h[s : s + chunk], weight, bias), target[s : s + chunk], smoothing)
        ctx.save_for_backward(h, weight, bias, target)
        ctx.chunk, ctx.smoothing = chunk, smoothing
        return total

    @staticmethod
    def backward(ctx, grad_out):
        h, weight, bias, target = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(h) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_b else None
        vocab, eps = weight.shape[0], ctx.smoothing
        rows = torch.arange(min(ctx.chunk, h.shape[0]), device=h.device)
        for s in range(0, h.shape[0], ctx.chunk):
            hc, y = h[s : s + ctx.chunk], target[s : s + ctx.chunk]
            g = _logits(hc, weight, bias)  # d loss / d logits = softmax - smoothed one-hot, built in place
            _exp_shifted_(g)
            g.div_(g.sum(-1, keepdim=True))
            g[rows[: len(y)], y] -= 1.0 - eps
            if eps:
                g -= eps / vocab
            g = g.mul_(grad_out).to(h.dtype)
            if grad_h is not None:
                grad_h[s : s + ctx.chunk] = g @ weight
            if grad_w is not None and g.dtype == grad_w.dtype:
                grad_w.addmm_(g.T, hc)  # in place: no [V, H] temporary per chunk
            elif grad_w is not None:
                grad_w += g.T @ hc
            if grad_b is not None:
                grad_b += g.float().sum(0)
        grad_w = grad_w.to(weight.dtype) if grad_w is not None else None
        grad_b = grad_b.to(bias.dtype) if grad_b is not None else None
        return grad_h, grad_w, grad_b, None, None, None


def chunked_causal_lm_loss(
    hidden: Tensor,
    lm_head_weight: Tensor,
    labels: Tensor,
    chunk_tokens: int = 1024,
    bias: Tensor | None = None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Tensor:
    """The causal-LM cross-entropy of hidden [B, T, H] through lm_head W [V, H] against labels [B, T].

    Shifts like transformers (hidden[:, :-1] scores labels[:, 1:]), ignores -100; `reduction` "mean" (over the
    scored positions) or "sum" (what a loop dividing by the window's item count wants). Same value and gradients
    (w.r.t. hidden, W, bias) as `F.cross_entropy(logits.float(), ...)`, computed `chunk_tokens` rows at a time.
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be at least 1, got {chunk_tokens}")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    if hidden.shape[:2] != labels.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and labels {tuple(labels.shape)} differ in [B, T]")
    h = hidden[:, :-1].reshape(-1, hidden.shape[-1])
    target = labels[:, 1:].reshape(-1)
    kept = (target != IGNORE_INDEX).nonzero().squeeze(1)
    if kept.numel() == 0:  # nothing scored: 0 with zero gradients (see the module doc)
        return (hidden[:, :0].sum() + lm_head_weight[:0].sum()).float()
    total = _ChunkedCrossEntropy.apply(
        h.index_select(0, kept), lm_head_weight, bias, target[kept], chunk_tokens, label_smoothing
    )
    return total / kept.numel() if reduction == "mean" else total


# ---- on a Hugging Face causal LM -------------------------------------------------------------------------

_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def can_chunk(model) -> str | None:
    """None if the model's logits are just lm_head(hidden), so the chunked loss equals its own; else a reason."""
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        return "an encoder-decoder: the chunked loss is for decoder-only causal LMs"
    if not isinstance(model.get_output_embeddings(), nn.Linear):
        return "the output head is not a Linear layer"
    for name in _LOGIT_TRANSFORMS:
        value = getattr(config, name, None)
        if value is not None and value != 1:
            return f"the model transforms its logits ({name}={value}), which the chunked loss would skip"
    return None


def chunked_lm_loss(
    model,
    inputs: dict[str, Tensor],
    labels: Tensor,
    chunk_tokens: int = 1024,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Tensor:
    """The loss of `model(**inputs, labels=labels)` without its logits: decoder hidden states, then the chunked loss.

    Tied embeddings work (the head's weight is the embedding's tensor, and gets both gradients).
    """
    hidden = model.get_decoder()(**{"use_cache": False, **inputs})[0]
    head = model.get_output_embeddings()
    return chunked_causal_lm_loss(hidden, head.weight, labels, chunk_tokens, head.bias, reduction, label_smoothing)


def kept_logits_lm_loss(model, inputs: dict[str, Tensor], labels: Tensor, reduction: str = "mean") -> Tensor:
    """The alternative with transformers' own `logits_to_keep` (a [B, T] boolean mask, transformers >= 5):
    logits only at scored positions, all at once. Saves the unscored share (prompts, pads), not the rest."""
    keep = torch.zeros_like(labels, dtype=torch.bool)
    keep[:, :-1] = labels[:, 1:] != IGNORE_INDEX
    logits = model(**{"use_cache": False, **inputs}, logits_to_keep=keep).logits
    target = labels[:, 1:][keep[:, :-1]]
    if target.numel() == 0:
        return logits.float().sum() * 0.0  # nothing scored: 0, as chunked_causal_lm_loss
    return F.cross_entropy(logits.float(), target, reduction=reduction)


# ---- inside a training loop that only calls the model's top-level forward ----------------------------------


class HiddenHead(nn.Linear):
    """The model's output head, able to hand back its input: while `passthrough` is on, `model(...).logits` are
    the decoder's hidden states [B, T, H] and no [B, T, V] logits are made. It is the same Linear otherwise:
    same parameters (tied embeddings stay tied) and state-dict keys, so a saved model is a plain one.

    The forward still goes through the model's (and DDP's / accelerate's) own `forward`, which a loop that
    called `get_decoder()` directly would bypass; the loss is then `chunked_causal_lm_loss` over `weight`."""

    passthrough: bool = False

    @classmethod
    def around(cls, head: nn.Linear) -> HiddenHead:
        new = cls.__new__(cls)
        new.__dict__.update(head.__dict__)  # the same Parameters and hooks: no copy, ties kept
        return new

    def forward(self, x: Tensor) -> Tensor:
        return x if self.passthrough else super().forward(x)


def install_hidden_head(model) -> HiddenHead:
    """Replace the model's output Linear with a `HiddenHead` over the same parameters; return it."""
    head = model.get_output_embeddings()
    if isinstance(head, HiddenHead):
        return head
    hidden = HiddenHead.around(head)
    model.set_output_embeddings(hidden)
    return hidden


def hidden_head_loss(
    model, head: HiddenHead, inputs: dict[str, Tensor], labels: Tensor, chunk_tokens: int = 1024, **kwargs
) -> Tensor:
    """`model`'s causal-LM loss through its top-level forward with `head` passing hidden states through, then
    the chunked loss over the head's weight (kwargs: reduction, label_smoothing)."""
    head.passthrough = True
    try:
        hidden = model(**inputs).logits
    finally:
        head.passthrough = False
    return chunked_causal_lm_loss(hidden, head.weight, labels, chunk_tokens, head.bias, **kwargs)


# ---- the fused CUDA kernels (liger, cce) -------------------------------------------------------------------


def fused_lm_loss(
    kernel: str, model, head: HiddenHead, inputs: dict[str, Tensor], labels: Tensor, label_smoothing: float = 0.0
) -> Tensor:
    """The summed causal-LM loss through `kernel`'s fused linear cross-entropy ("liger": Liger's, "cce": Cut
    Cross-Entropy's) over the scored positions: the model's hidden states (its head passing them through) and
    the head's weight, never the [tokens, vocab] logits. Triton kernels: CUDA only (the strategies require it).
    Under autocast the kernel gets the autocast dtype, as the head's matmul would."""
    head.passthrough = True
    try:
        hidden = model(**inputs).logits
    finally:
        head.passthrough = False
    h = hidden[:, :-1].reshape(-1, hidden.shape[-1])
    target = labels[:, 1:].reshape(-1)
    kept = (target != IGNORE_INDEX).nonzero().squeeze(1)
    if kept.numel() == 0:  # nothing scored: 0 with zero gradients, as chunked_causal_lm_loss
        return (hidden[:, :0].sum() + head.weight[:0].sum()).float()
    h, target = h.index_select(0, kept), target[kept]
    if kernel == "liger":
        # optional: trainwise[liger] (liger-kernel; heavy: Triton)
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        flce = LigerFusedLinearCrossEntropyLoss(reduction="sum", label_smoothing=label_smoothing)
        return flce(head.weight, h, target, head.bias).float()
    if kernel != "cce":
        raise ValueError(f"unknown fused loss kernel {kernel!r}")
    if label_smoothing:
        raise ValueError("cce: Cut Cross-Entropy has no label smoothing; drop it or use liger / chunked_ce")
    if head.bias is not None:
        raise ValueError("cce: Cut Cross-Entropy takes no output-head bias")
    from cut_cross_entropy import linear_cross_entropy  # optional: trainwise[cce] (cut-cross-entropy; heavy: Triton)

    dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else head.weight.dtype
    return linear_cross_entropy(h.to(dtype), head.weight.to(dtype), target, reduction="sum").float()
