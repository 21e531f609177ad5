"""Peak memory: CUDA allocator peaks on GPU; resident memory (RSS) on CPU.

On CPU the kernel's RSS high-water mark (VmHWM, resettable) is exact and cheap; the trial reports it
minus the RSS just before the model was built. RSS is what the OS sees, not live tensor bytes:
glibc keeps freed memory for reuse, so savings of a few hundred MiB (Adafactor's missing AdamW
state) can vanish into allocator noise. `tensor_bytes` counts weights and optimizer state exactly,
and the trial reports that beside the peak.
"""

from __future__ import annotations

import resource
import sys
from collections.abc import Iterable

import psutil


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
    import torch

    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        if torch.is_tensor(t):
            storage = t.untyped_storage()
            seen[(str(t.device), storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())


def cuda_reset_peak() -> None:
    import torch

    torch.cuda.reset_peak_memory_stats()


def cuda_peaks() -> tuple[int, int]:
    import torch

    return int(torch.cuda.max_memory_allocated()), int(torch.cuda.max_memory_reserved())
