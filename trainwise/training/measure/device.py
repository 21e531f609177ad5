"""What this device can do: its facts (name, CPU flags, CUDA compute capability, memory) and the
micro-benchmarks that confirm them (a linear layer in a precision against fp32; the peak of the
operation a plan's matmuls run, for MFU).

The facts decide a precision's verdict (`trainwise.strategies.precision.support`); a timed linear layer
confirms it in about 0.1-0.3 s. Tests and "what would a V100 say" inject the facts:
TRAINWISE_CPU_FLAGS (space-separated flags that replace /proc/cpuinfo's) and TRAINWISE_CUDA_CAPABILITY
("7.0") replace what the machine reports.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from trainwise.core.device import PRECISION_FLAGS, DeviceFacts
from trainwise.core.env import cpu_name
from trainwise.core.errors import OutputFailed
from trainwise.core.files import write_atomic
from trainwise.training.measure import contention


def cpu_flags() -> frozenset[str]:
    """The CPU's precision-relevant flags (/proc/cpuinfo), or TRAINWISE_CPU_FLAGS where set."""
    given = os.environ.get("TRAINWISE_CPU_FLAGS")
    if given is not None:
        return frozenset(given.split())
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split()) & frozenset(PRECISION_FLAGS)
    return frozenset()


def facts(device: str) -> DeviceFacts:
    """This machine's `device` ("cpu" or "cuda"), with the injected facts where they are set."""

    injected = "TRAINWISE_CPU_FLAGS" in os.environ or "TRAINWISE_CUDA_CAPABILITY" in os.environ
    if device != "cuda":
        return DeviceFacts("cpu", cpu_name(), cpu_flags(), None, psutil.virtual_memory().total, injected)
    import torch  # heavy: torch

    if not torch.cuda.is_available():  # asked about CUDA where none is visible: what the environment says
        return DeviceFacts("cuda", "no CUDA device visible", cpu_flags(), cuda_capability(None), None, injected)
    props = torch.cuda.get_device_properties(0)
    cap = cuda_capability(torch.cuda.get_device_capability())
    return DeviceFacts("cuda", props.name, cpu_flags(), cap, props.total_memory, injected)


def cuda_capability(reported: tuple[int, int] | None) -> tuple[int, int] | None:
    """The GPU's compute capability, or TRAINWISE_CUDA_CAPABILITY ("7.0") where set."""
    given = os.environ.get("TRAINWISE_CUDA_CAPABILITY")
    if not given:
        return reported
    major, _, minor = given.partition(".")
    return int(major), int(minor or 0)


def _sync(device: str):
    import torch  # heavy: torch

    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def _linear_runner(device: str, n: int, mode: str):
    """A callable that runs one n x n x n linear layer as a plan's matmuls run it: `mode` is "fp32",
    an autocast dtype ("autocast-bf16", "autocast-fp16") over fp32 weights, or 16-bit weights and inputs
    ("weights-bf16")."""
    import torch  # heavy: torch
    import torch.nn.functional as F  # heavy: torch

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    kind, _, dtype = mode.partition("-")
    x = torch.randn(n, n, device=device)
    w = torch.randn(n, n, device=device)
    b = torch.randn(n, device=device)
    if kind == "weights":
        x, w, b = x.to(dtypes[dtype]), w.to(dtypes[dtype]), b.to(dtypes[dtype])
    if kind == "autocast":
        ctx = torch.autocast(device_type=device, dtype=dtypes[dtype])

        def run() -> None:
            with ctx:
                F.linear(x, w, b)

        return run
    return lambda: F.linear(x, w, b)


def best_linear(device: str, mode: str, budget_s: float = 0.5, n: int | None = None) -> tuple[float, int]:
    """FLOP/s of the fastest timed linear layer in `mode` and its size n. Without `n` the layer is sized to
    the device: n starts at 128 and doubles while one run takes under 20 ms (and the size cap and half
    the budget allow), so a CPU that emulates the precision (a 2048^2 bf16 matmul took 59 s on one) is
    measured on a small layer in milliseconds, and a GPU on one large enough to fill it. Then the best of
    repeated runs until `budget_s` is spent."""
    sync = _sync(device)
    cap = 8192 if device == "cuda" else 2048
    start = time.perf_counter()
    size = n or 128
    while True:
        run = _linear_runner(device, size, mode)
        run()  # the first call picks the kernels
        sync()
        t0 = time.perf_counter()
        run()
        sync()
        dt = time.perf_counter() - t0
        if n or dt >= 0.02 or 2 * size > cap or time.perf_counter() - start + 8 * dt > budget_s / 2:
            break
        size *= 2
    best, reps = 2 * size**3 / max(dt, 1e-9), 1
    while time.perf_counter() - start < budget_s:
        t0 = time.perf_counter()
        for _ in range(reps):
            run()
        sync()
        dt = time.perf_counter() - t0
        best = max(best, 2 * size**3 * reps / max(dt, 1e-9))
        if dt < 0.02:
            reps *= 2
    if device == "cuda":  # the study's own process: give the probe's memory back before the trials run
        import torch  # heavy: torch

        del run
        torch.cuda.empty_cache()
    return best, size


LINEAR_MODES = {"bf16": "autocast-bf16", "fp16": "autocast-fp16", "bf16_pure": "weights-bf16"}


def precision_ratio(device: str, precision: str, budget_s: float = 0.15) -> float:
    """How many times slower (>1) or faster (<1) a linear layer runs in `precision` ("bf16", "fp16",
    "bf16_pure") than in fp32 on this device: the same layer (sized on the 16-bit one), timed side by
    side, ~0.3 s once per device (cached)."""

    def measure() -> dict:
        low, n = best_linear(device, LINEAR_MODES[precision], budget_s)
        fp32, _ = best_linear(device, "fp32", budget_s, n=n)
        return {"ratio": fp32 / low, "n": n}

    return float(cached("precision", device, precision, measure)["ratio"])


def cached(kind: str, device: str, what: str, measure: Callable[[], dict]) -> dict:
    """A micro-benchmark's result, measured once per (device, threads, `what`, torch version) and kept in
    TRAINWISE_CACHE (default ~/.cache/trainwise)/`kind`/, unless other processes used the CPUs while it
    ran (a probe beside a busy process read a third of this machine's peak; cached, every MFU after it
    would have been 3x too high): then it is used once and measured again next time. Returns the
    measurement's dict with "cached": True when it was read from the cache."""
    import torch  # heavy: torch

    name = torch.cuda.get_device_name() if device == "cuda" else f"{cpu_name()} x{torch.get_num_threads()} threads"
    key = "".join(c if c.isalnum() else "_" for c in f"{name}-{what}-torch{torch.__version__}")
    root = os.environ.get("TRAINWISE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "trainwise")
    path = Path(root) / kind / f"{key}.json"
    with contextlib.suppress(OSError, ValueError):
        return {**json.loads(path.read_text()), "cached": True}
    from trainwise.run import zygote  # the command's zygote may be importing torch on the other CPU: not beside a probe

    zygote.settle()
    before = contention.sample()
    result = measure()
    load = contention.between(before, contention.sample())
    result = {**result, "device": device, "what": what, **load}
    if not contention.loaded(load):
        with contextlib.suppress(OSError, OutputFailed):  # a cache that cannot be written: measured next time
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, json.dumps(result))
    return {**result, "cached": False}
