"""Peak memory: CUDA allocator peaks on GPU; the process's peak RSS on CPU.

On CPU the kernel's RSS high-water mark (VmHWM) is exact and cheap, but by default glibc keeps
freed memory for reuse, so RSS lags the live tensor bytes and savings of a few hundred MiB (e.g.
Adafactor's missing AdamW state) vanish into allocator noise. `exact_cpu_allocator(True)` makes
glibc return every freed block over 128 KiB to the OS, so RSS tracks live memory; it is slower
(~+35% step time measured here), so the trial measures memory with it during the untimed warm-up
steps only, and times the steps with glibc's steady-state settings (`exact_cpu_allocator(False)`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import resource
import sys
from functools import cache

import psutil

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters


@cache
def _glibc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def exact_cpu_allocator(exact: bool) -> bool:
    """Switch glibc between RSS-tracks-live-memory (exact) and its fast steady state.

    The fast setting fixes the thresholds at the values glibc's dynamic tuning converges to on
    64-bit Linux (mmap 32 MiB, trim 2x that). Returns False where glibc is not available.
    """
    libc = _glibc()
    if libc is None:
        return False
    mmap, trim = (128 * 1024, 128 * 1024) if exact else (32 * 1024 * 1024, 64 * 1024 * 1024)
    libc.mallopt(_M_MMAP_THRESHOLD, mmap)
    libc.mallopt(_M_TRIM_THRESHOLD, trim)
    if exact:
        libc.malloc_trim(0)
    return True


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


def cuda_reset_peak() -> None:
    import torch

    torch.cuda.reset_peak_memory_stats()


def cuda_peaks() -> tuple[int, int]:
    import torch

    return int(torch.cuda.max_memory_allocated()), int(torch.cuda.max_memory_reserved())
