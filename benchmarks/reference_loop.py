"""The reference a plan is judged against (issue 53): a plain PyTorch loop an engineer writes by hand, for a causal
LM's shape on fully packed rows, in three forms:

- fp32: AdamW (torch's default implementation), clipping at 1.0;
- bf16: autocast bf16 over fp32 weights, fused AdamW;
- bf16_compile: the same, the model under torch.compile (its compile reported apart, not in the step time).

Every row is B x L real tokens (random ids: the speed does not depend on their values), labels the inputs shifted
inside the model's own loss, sdpa attention. Reported per form: the median step time over the timed steps and its
spread, tokens/s, TFLOP/s by the PaLM count (6 N + 12 layers x hidden x L FLOPs per token, N the parameters
without the embedding; the same count for every form) and MFU against a bf16 matmul measured here (an 8192^3 matmul
on a GPU, 2048^3 on a CPU), and the peak allocated memory on CUDA. One JSON line per form, and the whole as --json.

    .venv/bin/python benchmarks/reference_loop.py --device cuda --batch 16 --length 512 --json ref.json
    .venv/bin/python benchmarks/reference_loop.py --device cpu --batch 4 --length 64 --steps 6 --warmup 2   # a dry run

benchmarks/device_session.sh runs it beside `trainwise plan` on the same shape (its `reference` and `lmplan` steps).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FORMS = ("fp32", "bf16", "bf16_compile")


def build(preset: str, device: str, seed: int):
    """The preset's architecture with random weights (trainwise's own preset table), sdpa attention, in fp32."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainwise.training.models import preset_config_kwargs

    family, kwargs = preset_config_kwargs(preset)
    config = AutoConfig.for_model(family, **kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to(device)
    model.config.use_cache = False
    return model


def palm_flops_per_token(model, length: int) -> float:
    """6 N + 12 L H T per token (PaLM's appendix B): N the parameters outside the embedding, L layers, H the hidden
    size, T the sequence length (the attention's score and value matmuls)."""
    c = model.config
    embed = c.vocab_size * c.hidden_size
    n = sum(p.numel() for p in model.parameters()) - (0 if c.tie_word_embeddings else embed) - embed
    n += embed  # the LM head's matmul is a weight use per token: counted once (tied or not)
    return 6 * n + 12 * c.num_hidden_layers * c.hidden_size * length


def matmul_peak(device: str, size: int, budget_s: float = 2.0) -> float:
    """bf16 FLOP/s of a square matmul, the best of the repeats that fit in `budget_s`."""
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    best, start = float("inf"), time.perf_counter()
    while time.perf_counter() - start < budget_s:
        t = time.perf_counter()
        a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return 2 * size**3 / best


def run(form: str, args: argparse.Namespace) -> dict:
    device = args.device
    model = build(args.preset, device, args.seed)
    fused = form != "fp32"
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5, fused=fused if fused else None)
    step_model = model
    if form == "bf16_compile":
        step_model = torch.compile(model)
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    vocab = model.config.vocab_size

    def batch() -> torch.Tensor:
        return torch.randint(0, vocab, (args.batch, args.length), generator=gen).to(device)

    def step() -> float:
        ids = batch()
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=form != "fp32"):
            loss = step_model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    began = time.perf_counter()
    warm = [step() for _ in range(args.warmup)]
    times = [step() for _ in range(args.steps)]
    median = statistics.median(times)
    compile_s = max(0.0, sum(warm) - args.warmup * median) if form == "bf16_compile" else None
    tokens = args.batch * args.length
    flops = palm_flops_per_token(model, args.length) * tokens / median
    out = {
        "form": form,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "preset": args.preset,
        "batch": args.batch,
        "length": args.length,
        "steps": args.steps,
        "step_s": median,
        "step_s_min": min(times),
        "step_s_max": max(times),
        "tokens_per_s": tokens / median,
        "tflops": flops / 1e12,
        "compile_s": compile_s,
        "wall_s": time.perf_counter() - began,
        "peak_allocated_bytes": torch.cuda.max_memory_allocated() if device == "cuda" else None,
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--preset", default="smollm2-135m")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--forms", default=",".join(FORMS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    peak = matmul_peak(args.device, 8192 if args.device == "cuda" else 2048)
    print(json.dumps({"bf16_matmul_peak_tflops": peak / 1e12, "device": args.device}), flush=True)
    found = []
    for form in args.forms.split(","):
        r = run(form, args)
        gc.collect()  # the form's model and optimizer, before the next one's
        if args.device == "cuda":
            torch.cuda.empty_cache()
        r["mfu_vs_bf16_peak"] = r["tflops"] * 1e12 / peak
        found.append(r)
        print(json.dumps(r), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"bf16_matmul_peak_tflops": peak / 1e12, "forms": found}, indent=1))


if __name__ == "__main__":
    main()
