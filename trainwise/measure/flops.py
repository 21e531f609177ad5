"""MFU: the FLOPs a step executes over what this device's matmuls can do.

FLOPs per optimizer step are *counted*, not derived from a formula: torch.utils.flop_counter
(a dispatch mode that adds up the FLOPs of every matmul, convolution and attention op) over one real
step of the plan, outside the timed steps. It counts what runs, so the recomputed forward under
gradient checkpointing is included (a hardware-FLOPs utilisation for those rows), padding positions
are included (they are computed), and frozen layers' missing weight gradients are not.

The peak is *measured*, not read from a datasheet: the best of a few timed dense matmuls in the
row's compute dtype (fp32, bf16 or fp16) on this device with this thread count, cached per device
and torch version. On CPU that is what the BLAS reaches (a datasheet peak is rarely reachable there).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

DTYPES = ("fp32", "bf16", "fp16")


class Counted:
    """FLOPs counted inside a `with` block (None when the counter could not run, e.g. a compiled model)."""

    flops: int | None = None


@contextlib.contextmanager
def counting() -> Iterator[Counted]:
    from torch.utils.flop_counter import FlopCounterMode

    result = Counted()
    mode = FlopCounterMode(display=False)
    with mode:
        yield result
    result.flops = int(mode.get_total_flops())


def compute_dtype(mixed_precision: str, weights_dtype: str | None) -> str:
    """The dtype a plan's matmuls run in: its autocast, else its weights' dtype, else fp32."""
    if mixed_precision in ("bf16", "fp16"):
        return mixed_precision
    return {"bfloat16": "bf16", "float16": "fp16"}.get(weights_dtype or "", "fp32")


def _cache_file(device: str, dtype: str) -> Path:
    import torch

    from trainwise.measure.env import cpu_name

    name = torch.cuda.get_device_name() if device == "cuda" else f"{cpu_name()} x{torch.get_num_threads()} threads"
    tf32 = "-tf32" if device == "cuda" and dtype == "fp32" and torch.backends.cuda.matmul.allow_tf32 else ""
    key = "".join(c if c.isalnum() else "_" for c in f"{name}-{dtype}{tf32}-torch{torch.__version__}")
    root = os.environ.get("TRAINWISE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "trainwise")
    return Path(root) / "peak" / f"{key}.json"


def matmul_peak(device: str, dtype: str, budget_s: float = 1.0) -> float:
    """FLOP/s of this device's dense matmul in `dtype`: measured once (best of several runs), then cached,
    unless other processes used the CPUs meanwhile (a probe beside a busy process read 102 GFLOP/s for
    this machine's ~315; cached, every MFU after it would have been 3x too high): then the next trial
    measures again."""
    path = _cache_file(device, dtype)
    try:
        return float(json.loads(path.read_text())["flops_per_s"])
    except (OSError, ValueError, KeyError):
        pass
    import torch

    from trainwise.measure import contention

    before = contention.sample()
    n = 4096 if device == "cuda" else 2048
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    a = torch.randn(n, n, device=device).to(torch_dtype)
    b = torch.randn(n, n, device=device).to(torch_dtype)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    best, spent, reps = 0.0, 0.0, 1
    for _ in range(3):  # warm up: the BLAS picks its kernels, the clock ramps
        torch.mm(a, b)
    sync()
    while spent < budget_s:
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b)
        sync()
        dt = time.perf_counter() - t0
        spent += dt
        best = max(best, 2 * n**3 * reps / dt)
        if dt < 0.05:
            reps *= 2
    load = contention.between(before, contention.sample())
    if load["contended"]:
        return best
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"flops_per_s": best, "n": n, "dtype": dtype, "device": device, **load}))
    tmp.replace(path)
    return best
