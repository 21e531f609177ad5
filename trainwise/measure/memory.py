"""Peak memory: CUDA allocator peaks on GPU; the process's peak RSS on CPU.

On CPU the kernel's high-water mark (`ru_maxrss`, Linux: KiB) is exact and cheap. The training
peak reported is that minus the RSS measured just before the model was built, so libraries and
data loaded in every trial alike do not dilute the comparison; the total is kept beside it.
"""

from __future__ import annotations

import resource
import sys

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


def cuda_reset_peak() -> None:
    import torch

    torch.cuda.reset_peak_memory_stats()


def cuda_peaks() -> tuple[int, int]:
    import torch

    return int(torch.cuda.max_memory_allocated()), int(torch.cuda.max_memory_reserved())
