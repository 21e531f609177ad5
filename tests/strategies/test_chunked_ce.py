"""chunked_ce: the causal-LM loss, chunk by chunk, equals the plain loss in value and gradients, and never holds
a [tokens, vocab] tensor."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers
from torch.utils._python_dispatch import TorchDispatchMode

from trainwise.strategies.lm.loss import can_chunk, chunked_causal_lm_loss, chunked_lm_loss, kept_logits_lm_loss
from trainwise.strategies.lm.packing import PackedCollator
from trainwise.training.data.tasks import IGNORE_INDEX

B, T, H, V = 3, 17, 16, 50


def plain(hidden, weight, labels, bias=None, reduction="mean", label_smoothing=0.0):
    logits = F.linear(hidden[:, :-1], weight, bias).float()
    target = labels[:, 1:].reshape(-1)
    return F.cross_entropy(
        logits.reshape(-1, weight.shape[0]), target, reduction=reduction, label_smoothing=label_smoothing
    )


def tensors(seed: int = 0, bias: bool = False):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=gen, requires_grad=True)
    weight = torch.randn(V, H, generator=gen, requires_grad=True)
    b = torch.randn(V, generator=gen, requires_grad=True) if bias else None
    labels = torch.randint(0, V, (B, T), generator=gen)
    labels[0, :5] = IGNORE_INDEX  # a prompt
    labels[2, -3:] = IGNORE_INDEX  # pads
    return hidden, weight, b, labels


def grads(loss, *leaves):
    return torch.autograd.grad(loss, [x for x in leaves if x is not None])


@pytest.mark.parametrize("chunk", [1, 7, 1024])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_loss_and_gradients_equal_the_plain_loss(chunk, bias, reduction, smoothing):
    hidden, weight, b, labels = tensors(bias=bias)
    ours = chunked_causal_lm_loss(hidden, weight, labels, chunk, b, reduction, smoothing)
    ref = plain(hidden, weight, labels, b, reduction, smoothing)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    for got, want in zip(grads(ours, hidden, weight, b), grads(ref, hidden, weight, b), strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_a_frozen_head_leaves_the_hidden_gradient_right():
    """A frozen head gets no gradient, and the hidden states' gradient stays right."""
    hidden, weight, _, labels = tensors()
    weight = weight.detach()
    ours = chunked_causal_lm_loss(hidden, weight, labels, chunk_tokens=4)
    (got,) = torch.autograd.grad(ours, hidden)
    (want,) = torch.autograd.grad(plain(hidden, weight, labels), hidden)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_bf16_follows_transformers_numerics():
    """The matmul in the weights' dtype, the softmax in fp32: as lm_head(hidden).float() then cross-entropy."""
    hidden, weight, _, labels = tensors()
    h16, w16 = hidden.detach().bfloat16().requires_grad_(), weight.detach().bfloat16().requires_grad_()
    ours = chunked_causal_lm_loss(h16, w16, labels, chunk_tokens=5)
    ref = plain(h16, w16, labels)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    for got, want in zip(grads(ours, h16, w16), grads(ref, h16, w16), strict=True):
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


def test_ignored_positions_change_nothing_and_get_no_gradient():
    hidden, weight, _, labels = tensors()
    loss = chunked_causal_lm_loss(hidden, weight, labels, chunk_tokens=4)
    (g,) = torch.autograd.grad(loss, hidden)
    # position t is scored against labels[t + 1]: t = 0..3 of row 0, the last 4 of row 2, every row's last
    unscored = torch.zeros(B, T, dtype=torch.bool)
    unscored[0, :4], unscored[2, -4:], unscored[:, -1] = True, True, True
    assert torch.all(g[unscored] == 0) and torch.all(g[~unscored].abs().sum(-1) > 0)
    moved = hidden.detach().clone()
    moved[unscored] = 1e4
    assert torch.equal(chunked_causal_lm_loss(moved, weight, labels, chunk_tokens=4), loss.detach())


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_nothing_scored_gives_zero_with_zero_gradients_not_nan(reduction):
    hidden, weight, _, labels = tensors()
    labels[:, 1:] = IGNORE_INDEX
    loss = chunked_causal_lm_loss(hidden, weight, labels, reduction=reduction)
    assert loss.item() == 0.0 and loss.dtype == torch.float32
    gh, gw = grads(loss, hidden, weight)
    assert not gh.any() and not gw.any()


def test_bad_arguments_are_refused():
    hidden, weight, _, labels = tensors()
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunked_causal_lm_loss(hidden, weight, labels, chunk_tokens=0)
    with pytest.raises(ValueError, match="reduction"):
        chunked_causal_lm_loss(hidden, weight, labels, reduction="none")
    with pytest.raises(ValueError, match="differ"):
        chunked_causal_lm_loss(hidden, weight, labels[:, 1:])


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor any op (forward or backward) produces."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


def largest_tensor(loss_fn, tokens: int = 256, vocab: int = 4000, hidden: int = 8) -> int:
    h = torch.randn(1, tokens, hidden, requires_grad=True)
    w = torch.randn(vocab, hidden, requires_grad=True)
    labels = torch.randint(0, vocab, (1, tokens))
    with LargestTensor() as seen:
        loss_fn(h, w, labels).backward()
    return seen.numel


def test_no_tensor_the_size_of_all_logits_is_ever_made():
    """The deterministic face of peak memory: the largest tensor made, forward and backward (benchmarks/chunked_ce.py
    measures the bytes)."""
    tokens, vocab, chunk = 256, 4000, 32
    assert largest_tensor(plain, tokens, vocab) >= (tokens - 1) * vocab
    chunked = largest_tensor(lambda h, w, y: chunked_causal_lm_loss(h, w, y, chunk_tokens=chunk), tokens, vocab)
    assert chunked == chunk * vocab


# ---- on tiny Hugging Face causal LMs ---------------------------------------------------------------------


def tiny(family: str, **extra):
    torch.manual_seed(0)
    config = {
        "gpt2": lambda: transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=300, **extra),
        "llama": lambda: transformers.LlamaConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=300, **extra
        ),
    }[family]()
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model.eval().float()  # eval: GPT-2 drops out by default, and the two losses must see the same network


def lm_batch(seed: int = 0):
    """A packed batch, so the chunked loss and the packing collate are checked together."""
    gen = torch.Generator().manual_seed(seed)
    examples = []
    for n in (9, 5, 11, 3, 2):
        ids = torch.randint(1, 300, (n,), generator=gen).tolist()
        examples.append((ids, [IGNORE_INDEX] * 2 + ids[2:]))
    return PackedCollator(pad_id=0, block=16)([examples[:2], examples[2:]])


@pytest.mark.parametrize(
    ("family", "extra"), [("gpt2", {}), ("llama", {}), ("llama", {"tie_word_embeddings": True})], ids=str
)
def test_a_models_loss_and_gradients_equal_transformers_own(family, extra):
    model = tiny(family, **extra)
    assert can_chunk(model) is None
    assert model.config.tie_word_embeddings == (family == "gpt2" or bool(extra))
    batch = lm_batch()
    ref = model(**batch.inputs, labels=batch.labels, use_cache=False).loss
    params = [p for p in model.parameters() if p.requires_grad]
    want = torch.autograd.grad(ref, params)
    for loss in (
        chunked_lm_loss(model, batch.inputs, batch.labels, chunk_tokens=5),
        kept_logits_lm_loss(model, batch.inputs, batch.labels),
    ):
        torch.testing.assert_close(loss, ref, atol=1e-5, rtol=1e-5)
        for got, exp in zip(torch.autograd.grad(loss, params), want, strict=True):
            torch.testing.assert_close(got, exp, atol=1e-5, rtol=1e-4)


def test_the_sum_reduction_counts_the_batch_loss_items():
    model, batch = tiny("llama"), lm_batch()
    with torch.no_grad():
        mean = chunked_lm_loss(model, batch.inputs, batch.labels)
        total = chunked_lm_loss(model, batch.inputs, batch.labels, reduction="sum")
    torch.testing.assert_close(total, mean * batch.loss_items)


def test_can_chunk_refuses_logits_beyond_lm_head():
    """can_chunk refuses models whose logits are more than lm_head."""
    gemma2 = transformers.Gemma2Config(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, head_dim=8, vocab_size=300
    )
    model = transformers.AutoModelForCausalLM.from_config(gemma2)
    assert "final_logit_softcapping" in can_chunk(model)
    t5 = transformers.T5Config(d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8, vocab_size=100)
    assert "encoder-decoder" in can_chunk(transformers.T5ForConditionalGeneration(t5))
