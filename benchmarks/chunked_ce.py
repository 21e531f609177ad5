"""Peak memory of the causal-LM loss, plain vs chunked (trainwise/strategies/lm/loss.py), forward + backward, on CPU.

Each variant runs in a fresh process; its figure is the process's RSS high-water mark (resource.getrusage)
after one forward+backward minus the RSS once the inputs exist (hidden states, lm_head weight, labels),
so it is what the loss itself adds, gradients of hidden and W included. The setting is Qwen2.5-0.5B's head
(vocab 151936, hidden 896) over 4096 tokens, fp32, a quarter of them an unscored prompt.

    .venv/bin/python benchmarks/chunked_ce.py [--tokens 4096] [--vocab 151936] [--hidden 896]

Variants: plain (logits for every position, as `model(..., labels=...)`), kept (logits only at scored
positions, as transformers' `logits_to_keep` boolean mask), trl (TRL 1.16's fused LM head, what its SFTTrainer
computes on a device without Triton), chunked-1024 and chunked-256 (chunk_tokens).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from trainwise.strategies.lm.loss import chunked_causal_lm_loss

VARIANTS = ["plain", "kept", "trl", "chunked-1024", "chunked-256"]


def loss_of(variant: str, hidden, weight, labels):
    if variant == "plain":
        logits = F.linear(hidden[:, :-1], weight).float()
        return F.cross_entropy(logits.reshape(-1, weight.shape[0]), labels[:, 1:].reshape(-1))
    if variant == "kept":
        keep = labels[:, 1:] != -100
        logits = F.linear(hidden[:, :-1][keep], weight).float()
        return F.cross_entropy(logits, labels[:, 1:][keep])
    if variant == "trl":  # TRL 1.16's fused LM head as SFTTrainer runs it without Triton: every position scored
        from trl.kernels.chunked_logprob import ChunkedLogProbFunction
        from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE

        h, y = hidden[:, :-1].reshape(-1, hidden.shape[-1]), labels[:, 1:].reshape(-1)
        mask = y != -100
        outputs = ("log_probs",)
        log_probs = ChunkedLogProbFunction.apply(
            h, weight, None, y.clamp(min=0), 1.0, _CHUNKED_LOGPROB_CHUNK_SIZE, None, 1.0, outputs
        )[0]
        return -(log_probs * mask).sum() / mask.sum()
    return chunked_causal_lm_loss(hidden, weight, labels, chunk_tokens=int(variant.split("-")[1]))


def max_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def one(variant: str, tokens: int, vocab: int, hidden_size: int) -> dict:
    """Run in the child: one forward+backward, and what it added to the RSS high-water mark."""
    if variant == "trl":  # the library's import is not the loss's memory
        import trl.kernels.chunked_logprob  # noqa: F401
        import trl.trainer.utils  # noqa: F401
    torch.manual_seed(0)
    hidden = torch.randn(1, tokens, hidden_size, requires_grad=True)
    weight = torch.randn(vocab, hidden_size).mul_(0.02).requires_grad_()  # in place: no setup peak above the inputs
    labels = torch.randint(0, vocab, (1, tokens))
    labels[:, : tokens // 4] = -100  # the prompt
    before = rss_bytes()
    start = time.perf_counter()
    loss = loss_of(variant, hidden, weight, labels)
    loss.backward()
    seconds = time.perf_counter() - start
    return {"variant": variant, "loss": float(loss), "added_bytes": max_rss_bytes() - before, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one(args.child, args.tokens, args.vocab, args.hidden)))
        return
    size = ["--tokens", str(args.tokens), "--vocab", str(args.vocab), "--hidden", str(args.hidden)]
    logits_gb = args.tokens * args.vocab * 4 / 1e9
    print(f"tokens {args.tokens}, vocab {args.vocab}, hidden {args.hidden}, fp32")
    print(f"one [tokens, vocab] fp32 tensor = {logits_gb:.2f} GB")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'variant':<14}{'peak added':>12}{'time':>9}  loss")
    for variant in VARIANTS:
        child = [sys.executable, __file__, "--child", variant, *size]
        row = json.loads(subprocess.run(child, check=True, capture_output=True, text=True).stdout)
        print(f"{variant:<14}{row['added_bytes'] / 1e9:>9.2f} GB{row['seconds']:>8.1f}s  {row['loss']:.6f}")


if __name__ == "__main__":
    main()
