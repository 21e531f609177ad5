"""Peak memory: CUDA allocator peaks on GPU; resident memory (RSS) on CPU.

On CPU the kernel's RSS high-water mark (VmHWM, resettable) is exact and cheap; the trial reports it
minus the RSS just before the model was built. RSS is what the OS sees, not live tensor bytes:
glibc keeps freed memory for reuse, so savings of a few hundred MiB (Adafactor's missing AdamW
state) can vanish into allocator noise. `tensor_bytes` counts weights and optimizer state exactly,
and the trial reports that beside the peak.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import tempfile
from collections.abc import Iterable, Iterator

import psutil

CUDA_CONTEXT_BYTES = 512 * 1024**2  # CUDA context + cuBLAS workspace, ~0.5 GiB on recent drivers


def rss_bytes() -> int:
    return int(psutil.Process().memory_info().rss)


def reset_peak_rss() -> bool:
    """Reset the kernel's RSS high-water mark (Linux: "5" > /proc/self/clear_refs resets VmHWM).

    Makes the peak exact for a phase even in a process that peaked earlier (tests, benchmarks).
    Returns False where unsupported; the lifetime peak is then used, which is what a fresh trial
    process has anyway.
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """Peak RSS since the last reset (VmHWM), else since the process started (ru_maxrss)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def tensor_bytes(tensors: Iterable) -> int:
    """Bytes of the distinct storages behind these tensors, on any device (tied weights counted once)."""
    import torch  # heavy: torch

    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        if torch.is_tensor(t):
            storage = t.untyped_storage()
            seen[(str(t.device), storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())


def cuda_reset_peak() -> None:
    import torch  # heavy: torch

    torch.cuda.reset_peak_memory_stats()


def cuda_peaks() -> tuple[int, int]:
    import torch  # heavy: torch

    return int(torch.cuda.max_memory_allocated()), int(torch.cuda.max_memory_reserved())


class AllocatedPeak:
    """Peak bytes of live tensors allocated inside a `with` block (CUDA or CPU).

    CUDA: the caching allocator's max_memory_allocated, minus what was allocated on entry.
    CPU: torch.profiler's memory events (every CPU tensor allocation and free, with the running
    total), the CPU analogue of max_memory_allocated: exact tensor bytes, no allocator retention.
    The profiler slows the block down; use it for measurement probes, never for timed trials.
    `peak_bytes` is the peak over the block of (allocated now - allocated on entry).
    """

    def __init__(self, device: str):
        self.device = device
        self.peak_bytes = 0

    def __enter__(self) -> AllocatedPeak:
        import torch  # heavy: torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._start = torch.cuda.memory_allocated()
        else:
            from torch.profiler import ProfilerActivity, profile  # heavy: torch

            self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            with _quiet_native_output():
                self._prof.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        import torch  # heavy: torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            self.peak_bytes = int(torch.cuda.max_memory_allocated() - self._start)
            return
        with _quiet_native_output():
            self._prof.__exit__(*exc)
        if exc[0] is None:
            self.peak_bytes = _profiler_peak(self._prof)


@contextlib.contextmanager
def _quiet_native_output() -> Iterator[None]:
    """Silence the profiler's native start/stop lines ("USDT: ... profiler_start") on fds 1 and 2."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)


def _profiler_peak(prof) -> int:
    """Max of the running allocation total over the profiler's CPU [memory] events."""

    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    finally:
        os.unlink(path)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    mem = sorted(
        (e for e in events if e.get("name") == "[memory]" and e["args"].get("Device Type", 0) == 0),
        key=lambda e: e["ts"],
    )
    if not mem:
        return 0
    # The reporter's own running total ("Total Allocated") drifts across profiler sessions in one
    # process (blocks freed between sessions stay in its table), so sum this window's events instead.
    running = peak = 0
    for e in mem:
        running += e["args"]["Bytes"]
        peak = max(peak, running)
    return int(peak)
