"""What else used the machine while a trial's timed steps ran (issue 14: contention detected).

Timings from a shared machine are only as good as the quiet they were taken in. Around the timed steps
the trial reads the kernel's CPU accounting (/proc/stat: the busy and stolen time of every CPU it may run
on) and its own CPU time (its process and its children, e.g. DataLoader workers, via psutil); the difference is what
other processes used. A trial where others took more than CONTENDED_SHARE of the machine's CPU time, or
the hypervisor stole more than STOLEN_SHARE, is flagged: its timings are unreliable.

The CPUs' clock is read too (cpufreq's scaling_cur_freq, else /proc/cpuinfo's "cpu MHz"), at the start
and the end of the timed steps: a clock that fell (thermal or power throttling) slows every step without
any other process; results.json keeps both. (On virtual machines the reported clock is often constant.)

GPU: other processes on the device (NVML) are not read yet; the flag is about the CPUs.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

# other processes' share of all CPUs' time during the timed steps. A step's threads meet at every operator, so a
# share s of n CPUs can slow it by up to c / (1 - c), c = s x n (study/aggregate.load_bound): on 2 cores 22.7%
# slowed a plan search's step 1.57x and left it unflagged at the 25% used before, which stopped the batch search
# at 1.29x the exhaustive best (BENCHMARKS §D1); the quiet rows of that study read 0.7-2%
CONTENDED_SHARE = 0.10
STOLEN_SHARE = 0.10  # the hypervisor's
# /proc/stat counts in ticks of 10 ms: over a shorter window than this the share is too coarse to judge
# (2 timed steps of 10 ms read "contended" at any blip, and a re-run, and a noise floor without it, followed)
MIN_WINDOW_S = 0.5


@dataclass(frozen=True)
class CpuSample:
    at_s: float  # monotonic clock
    busy_s: float  # all CPUs' busy time (user, nice, system, irq, softirq), seconds
    steal_s: float  # time the hypervisor ran something else on our virtual CPUs
    own_s: float  # this process's and its children's CPU time
    mhz: float | None = None  # the CPUs' mean clock, where the kernel reports it


def sample() -> CpuSample | None:
    """Now, or None where /proc/stat cannot be read (not Linux)."""

    try:
        stat = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    mine = allowed()
    # a process held to some of the CPUs (taskset, a container's cpuset, a Ray node pinned to its cores) is slowed
    # only by what runs on those: the others' load is read there
    names = {f"cpu{i}" for i in mine} if len(mine) < (os.cpu_count() or len(mine)) else {"cpu"}
    rows = [line.split() for line in stat if line.split()[:1] and line.split()[0] in names]
    if not rows or any(len(r) < 9 for r in rows):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (sum(int(r[i]) for r in rows) for i in range(1, 9))
    me = psutil.Process()
    if "LOCAL_RANK" in os.environ:  # a rank under torchrun: the other ranks are this trial, not contention
        me = me.parent() or me
    own = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):  # gone meanwhile
            own += sum(child.cpu_times()[:2])
    return CpuSample(time.monotonic(), (user + nice + system + irq + softirq) / tick, steal / tick, own, cpu_mhz())


def allowed() -> set[int]:
    """The CPUs this process may run on (all of them where the platform cannot say)."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def cpu_mhz() -> float | None:
    """The CPUs' mean current clock in MHz: cpufreq where the kernel has it, else /proc/cpuinfo, else None."""
    freqs = []
    for f in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_cur_freq"):
        with contextlib.suppress(OSError, ValueError):
            freqs.append(int(f.read_text()) / 1000)
    if not freqs:
        with contextlib.suppress(OSError):
            freqs = [
                float(line.split(":", 1)[1])
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("cpu MHz")
            ]
    return round(sum(freqs) / len(freqs), 1) if freqs else None


def between(
    a: CpuSample | None,
    b: CpuSample | None,
    cpus: int | None = None,
    also: tuple[tuple[CpuSample, CpuSample], ...] = (),
) -> dict:
    """The load others put on the machine between two samples (and over the windows `also`, timed steps
    taken later: one reading over them all): the TrialResult fields."""
    if a is None or b is None or b.at_s <= a.at_s or any(y.at_s <= x.at_s for x, y in also):
        return {"other_cpu_share": None, "steal_share": None, "contended": None, "cpu_mhz": None}
    windows = [(a, b), *also]
    span = sum(y.at_s - x.at_s for x, y in windows)
    capacity = span * (cpus or len(allowed()) or 1)
    others = max(0.0, sum((y.busy_s - x.busy_s) - (y.own_s - x.own_s) for x, y in windows)) / capacity
    stolen = max(0.0, sum(y.steal_s - x.steal_s for x, y in windows)) / capacity
    judged = span >= MIN_WINDOW_S
    return {
        "other_cpu_share": round(min(1.0, others), 4),
        "steal_share": round(min(1.0, stolen), 4),
        "contended": (others > CONTENDED_SHARE or stolen > STOLEN_SHARE) if judged else None,
        "cpu_mhz": [a.mhz, b.mhz] if a.mhz is not None and b.mhz is not None else None,
    }


def loaded(load: dict) -> bool:
    """Whether `between`'s reading says others took the CPUs: judged contended, or, over a window too short to
    judge (contended None), a share above the flag's anyway (a bf16 probe read 1.0x fp32 with 69% of the CPUs
    taken, was cached as clean, and the study trained an emulated bf16 row at 16x the baseline's time)."""
    if load.get("contended"):
        return True
    share, stolen = load.get("other_cpu_share") or 0.0, load.get("steal_share") or 0.0
    return load.get("contended") is None and (share > CONTENDED_SHARE or stolen > STOLEN_SHARE)


QUIET_SHARE = CONTENDED_SHARE / 2  # a re-run waits for less than half the load that flags a trial


def wait_quiet(max_wait_s: float, window_s: float = 2.0, cpus: int | None = None) -> bool:
    """Wait until other processes use under QUIET_SHARE of the CPUs over a `window_s` window (and the
    hypervisor steals under STOLEN_SHARE), at most `max_wait_s`; True when it is quiet. Where the load
    cannot be read (not Linux) it returns at once: there is nothing to wait for."""
    deadline = time.monotonic() + max_wait_s
    while True:
        before = sample()
        if before is None:
            return True
        time.sleep(window_s)
        load = between(before, sample(), cpus)
        if (load["other_cpu_share"] or 0.0) < QUIET_SHARE and (load["steal_share"] or 0.0) < STOLEN_SHARE:
            return True
        if time.monotonic() >= deadline:
            return False
