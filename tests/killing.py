"""Kill a trainwise command at random moments and resume it until it is done (issue 17's random-kill
check). Used by tests/run/test_lifeline.py (a few kills) and benchmarks/reliability.py (many)."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from trainwise.study.store import read_rows


@dataclass
class KillReport:
    kills: int = 0  # the command was killed this many times before it finished
    by_signal: dict[str, int] = field(default_factory=dict)
    orphans: list[str] = field(default_factory=list)  # processes that outlived a killed command
    reruns: list[str] = field(default_factory=list)  # trials stored, then run (and stored) again
    rows: list[tuple[str, str]] = field(default_factory=list)  # (row, status) of the finished study
    runs: int = 0  # commands started, the last one finishing


def stored(out: Path) -> dict[str, float]:
    """Every stored trial's key and when it was stored."""
    path = out / "study.sqlite"
    if not path.exists():
        return {}
    db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return dict(db.execute("SELECT key, finished_at FROM trials").fetchall())
    except sqlite3.OperationalError:  # killed before the table was made
        return {}
    finally:
        db.close()


def alive_after(processes: list[psutil.Process], within: float = 10.0) -> list[str]:
    """The processes still running `within` seconds from now (zombies count as gone)."""
    deadline = time.monotonic() + within
    alive = processes
    while time.monotonic() < deadline:
        alive = [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return []
        time.sleep(0.25)
    return [" ".join(p.cmdline())[:160] for p in alive]


def finished_rows(out: Path) -> list[tuple[str, str]]:
    return [(r["strategy"], r["status"]) for r in read_rows(out / "results.json")]


def is_trial(p: psutil.Process) -> bool:
    """A trial's process: exec'd as trainwise.run.worker (a torchrun rank), or forked by the zygote."""
    try:
        command, parent = " ".join(p.cmdline()), p.parent()
        return "trainwise.run.worker" in command or (
            parent is not None and "trainwise.run.zygote" in " ".join(parent.cmdline())
        )
    except psutil.Error:
        return False


# the moments a kill waits for, in turn: a trial of this run is up (the kill lands inside it), a row of this run was
# stored (the kill lands between a store and the next trial, or during the reports' rewrite)
MOMENTS = ("trial started", "row stored")


def _reached(moment: str, proc: subprocess.Popen, out: Path, before: dict[str, float]) -> bool:
    if moment == "row stored":
        return any(before.get(key) != at for key, at in stored(out).items())
    try:
        return any(is_trial(p) for p in psutil.Process(proc.pid).children(recursive=True))
    except psutil.Error:
        return False


def kill_until_done(argv: list[str], out: Path, kills: int, seed: int, delay: float = 0.3) -> KillReport:
    """Start `argv` (a compare into `out`); kill it `kills` times (fewer when it finishes first), each at a moment it
    can be seen to reach (MOMENTS in turn: a trial of this run is up, a row of this run is stored) plus a random
    delay of up to `delay` seconds — the process group with SIGKILL, or the command with SIGTERM, in turn; then run
    it to the end. Records orphans and trials re-run after they were stored. The kills wait for what the command
    does, not for the clock, so a fast machine and a slow one are killed at the same points (a kill at a
    wall-clock moment once missed a study that had already finished on a faster machine)."""
    rng = random.Random(seed)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    report = KillReport()
    seen: dict[str, float] = {}
    for i in range(kills + 1):
        last = i == kills
        before = stored(out)
        proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        report.runs += 1
        if last:
            proc.wait(timeout=900)
        else:
            moment, deadline = MOMENTS[i % len(MOMENTS)], time.monotonic() + 600
            while proc.poll() is None and not _reached(moment, proc, out, before) and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(rng.uniform(0.0, delay))
        if proc.poll() is None and not last:
            how = "SIGKILL of the group" if i % 2 == 0 else "SIGTERM"
            descendants = psutil.Process(proc.pid).children(recursive=True)
            if how == "SIGTERM":
                proc.send_signal(signal.SIGTERM)
            else:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
            report.kills += 1
            report.by_signal[how] = report.by_signal.get(how, 0) + 1
            report.orphans += alive_after(descendants)
        now = stored(out)
        report.reruns += [key for key, at in seen.items() if now.get(key) != at]
        seen.update(now)
        if proc.returncode == 0:
            break
    report.rows = finished_rows(out)
    return report
