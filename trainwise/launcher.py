"""Run every trial in a fresh process; whatever happens to it becomes a TrialResult.

A fresh process per trial makes measurements independent (allocator state, peak RSS, compiled
kernels, accelerate's global state) and contains crashes: an exception or OOM is reported by the
worker; a hang past the timeout is killed (`timeout`); a process that dies without a result
(SIGKILL from the OS OOM killer, a segfault) is `crashed`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trainwise.config import TrialSpec
from trainwise.distributed import is_multiprocess
from trainwise.lifeline import bound_to_me
from trainwise.results import TrialResult, combine_ranks


def _tail(path: Path, lines: int = 1) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def rank_failure(log: Path) -> str:
    """Why torchrun's ranks failed, from its log: the failing rank's own exception if it printed one,
    else the root cause torchrun reports (rank, exit code, signal), not torchrun's banner."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    lines = [re.sub(r"^\[rank\d+\]:\s?", "", line) for line in lines]  # torchrun's per-rank prefix
    report = next((i for i, line in enumerate(lines) if "ChildFailedError" in line), len(lines))
    raised = [line for line in lines[:report] if re.match(r"^[A-Za-z_][\w.]*(Error|Exception)\b", line)]
    if raised:
        return raised[-1].strip()
    root = next((i for i, line in enumerate(lines) if line.startswith("Root Cause")), None)
    if root is None:
        return _tail(log)
    fields: dict[str, str] = {}
    for line in lines[root:]:
        key, _, value = line.strip().partition(":")
        fields.setdefault(key.strip(), value.strip())
    rank, code = fields.get("rank", "?"), fields.get("exitcode", "?")
    return f"rank {rank}: exit code {code}, {fields.get('traceback', '')}".strip()


def launch(spec: TrialSpec, trial_dir: Path, timeout_s: float, on_event: Callable[[dict], None]) -> TrialResult:
    trial_dir.mkdir(parents=True, exist_ok=True)
    spec_path, result_path, log_path = (trial_dir / n for n in ("spec.json", "result.json", "stderr.log"))
    result_path.unlink(missing_ok=True)
    spec_path.write_text(json.dumps(spec.to_dict(), indent=1))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    nproc = spec.settings.nproc
    multi = is_multiprocess(spec)
    cmd = [sys.executable, "-m", "trainwise.worker", str(spec_path), str(result_path)]
    if multi:
        for old in trial_dir.glob("result.rank*.json"):
            old.unlink()
        cmd[1:2] = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m"]
        if spec.settings.device == "cpu":
            env["DS_ACCELERATOR"] = "cpu"  # DeepSpeed would look for a GPU
            env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    start, ooms = time.perf_counter(), oom_kills()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=env,
            preexec_fn=bound_to_me(),  # its own session, and it dies with this process
        )
        reader = threading.Thread(target=_read_events, args=(proc, on_event), daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
        except BaseException:  # Ctrl-C: the child has its own session and would not see the signal
            _kill_group(proc)
            raise
        reader.join(timeout=5)
    wall = time.perf_counter() - start

    base: dict[str, Any] = {
        "strategy": spec.row,
        "repeat": spec.repeat,
        "plan": spec.plan.to_dict(),
        "wall_s": wall,
    }
    if timed_out:
        return TrialResult(status="timeout", message=f"no result within --trial-timeout {timeout_s:g}s; killed", **base)
    if multi:
        ranks = [rank_result_path(result_path, r) for r in range(nproc)]
        if any(p.exists() for p in ranks):
            parts = [TrialResult.from_dict(json.loads(p.read_text())) if p.exists() else None for p in ranks]
            result = combine_ranks(parts, nproc)
            result.wall_s = wall
            return result
    elif result_path.exists():
        result = TrialResult.from_dict(json.loads(result_path.read_text()))
        result.wall_s = wall
        return result
    code = proc.returncode
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        message = f"trial process killed by {name}{killer(ooms) if -code == signal.SIGKILL else ''}"
    else:
        why = rank_failure(log_path) if multi else _tail(log_path)
        message = f"trial process exited with code {code} and no result: {why[:300]}"
    return TrialResult(status="crashed", message=message, **base)


def oom_kills() -> int | None:
    """The kernel's count of out-of-memory kills so far (/proc/vmstat), None where it cannot be read."""
    try:
        for line in Path("/proc/vmstat").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def killer(before: int | None) -> str:
    """Who sent a SIGKILL: the out-of-memory killer only when the kernel counted a kill meanwhile."""
    after = oom_kills()
    if before is None or after is None:
        return " (the out-of-memory killer, or another process)"
    if after > before:
        return " (the kernel's out-of-memory killer: it counted a kill during the trial)"
    return " (not the out-of-memory killer, which counted no kill: another process, or a scheduler)"


def rank_result_path(result_path: Path, rank: int) -> Path:
    """Where rank `rank` of a multi-process trial writes its result."""
    return result_path.with_name(f"{result_path.stem}.rank{rank}{result_path.suffix}")


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the trial and anything it started (dataloader workers); it runs in its own session."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def events(proc: subprocess.Popen) -> Iterator[dict]:
    """The progress events a child prints on stdout, one JSON object a line (libraries' stray prints
    skipped); trials, tune trials and training ranks all speak this way."""
    assert proc.stdout is not None
    for line in proc.stdout:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict):
            yield event


def _read_events(proc: subprocess.Popen, on_event: Callable[[dict], None]) -> None:
    for event in events(proc):
        on_event(event)
