"""MFU: the FLOPs a step executes over what this device's matmuls can do.

FLOPs per optimizer step are *counted*, not derived from a formula: torch.utils.flop_counter
(a dispatch mode that adds up the FLOPs of every matmul, convolution and attention op) over one real
step of the plan, outside the timed steps. It counts what runs, so the recomputed forward under
gradient checkpointing is included (a hardware-FLOPs utilisation for those rows), padding positions
are included (they are computed), and frozen layers' missing weight gradients are not.

The peak is *measured*, not read from a datasheet: the best of a few timed linear layers run the way
the row's matmuls run (fp32, under bf16/fp16 autocast, or on bf16 weights), sized to the device so the
probe stays under ~1 s even where a precision is emulated, cached per device, thread count and torch
version. On CPU that is what oneDNN/the BLAS reaches (a datasheet peak is rarely reachable there).
A row whose counted FLOPs/s exceed the peak has a wrong peak: it shows no MFU and says so.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from trainwise.training.measure import device as dev  # a module: tests replace dev.best_linear


class Counted:
    """FLOPs counted inside a `with` block (None when the counter could not run, e.g. a compiled model)."""

    flops: int | None = None


@contextlib.contextmanager
def counting() -> Iterator[Counted]:
    from torch.utils.flop_counter import FlopCounterMode  # heavy: torch

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


def linear_mode(mixed_precision: str, weights_dtype: str | None) -> str:
    """How a plan's matmuls run, for the peak probe: under autocast over fp32 weights, on 16-bit
    weights, or fp32 (trainwise.training.measure.device's linear modes)."""
    if mixed_precision in ("bf16", "fp16"):
        return f"autocast-{mixed_precision}"
    if weights_dtype in ("bfloat16", "float16"):
        return f"weights-{compute_dtype(mixed_precision, weights_dtype)}"
    return "fp32"


def matmul_peak(device: str, mode: str, budget_s: float = 1.0) -> float:
    """FLOP/s of this device's linear layer run the way the plan runs its matmuls (`linear_mode`): an
    autocast bf16 linear goes through oneDNN, which on a CPU without native bf16 is ~30x faster than a
    matmul of bf16 tensors; timing the latter read 0.29 GFLOP/s and put a row's MFU at 1348%. The layer
    is sized to the device (trainwise.training.measure.device.best_linear: a few ms on a slow path, large enough
    to fill a GPU), best of repeated runs within `budget_s`, cached per device, threads, mode and torch
    version (not when the machine was busy meanwhile)."""

    def measure() -> dict:
        best, n = dev.best_linear(device, mode, budget_s)
        return {"flops_per_s": best, "n": n}

    return float(dev.cached("peak", device, f"linear-{probe_mode(device, mode)}", measure)["flops_per_s"])


def probe_mode(device: str, mode: str) -> str:
    """`mode` as the peak probe ran it: fp32 on a GPU with TF32 matmuls on (the tf32 row) is `fp32-tf32`, its
    own peak (8x fp32's on an H200) and its own label in the MFU note."""
    return mode + ("-tf32" if device == "cuda" and mode == "fp32" and _tf32_on() else "")


def _tf32_on() -> bool:
    import torch  # heavy: torch

    return bool(torch.backends.cuda.matmul.allow_tf32)
