"""A child process for tests/run/test_launcher.py: `python -m tests.child WHAT`.

events  prints three events (and a stray line that is not JSON), exits 0
hang    starts a grandchild that sleeps, says its pid, then sleeps itself
chatty  prints an event every 50 ms, forever
fail    writes a traceback to stderr and exits 3
killed  kills itself with SIGKILL
where   says how it started: forked by the zygote or not, its directory, a variable of its environment
rank    (each rank of a group) says its place, its store's port, its torch threads and how it started
rank1-killed  rank 1 kills itself with SIGKILL; the other ranks say their pid and wait, as in a collective
rank1-fails   rank 1 writes an exception to stderr and exits 1; the other ranks wait
ranks-hang    every rank says its pid and sleeps

`EchoJob` is a job of the one protocol (`launcher.run`) that trains nothing: its ranks say three steps
and end with a TrialResult of their own (with `big`, one longer than a pipe writes at once).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from trainwise.core.results import TrialResult, combine_ranks
from trainwise.run.events import Emit, Step
from trainwise.run.launcher import Exit, Place
from trainwise.run.ranks import Ranks


def say(event: dict) -> None:
    print(json.dumps(event), flush=True)


def main(what: str) -> int:
    if what == "events":
        for step in (1, 2, 3):
            say({"event": "step", "step": step})
        print("a library's stray print", flush=True)
        return 0
    if what == "hang":
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        say({"event": "started", "pid": grandchild.pid})
        time.sleep(600)
    if what == "chatty":
        for step in range(10**6):
            say({"event": "step", "step": step})
            time.sleep(0.05)
    if what == "fail":
        print("Traceback (most recent call last):\n  File 'x.py'", file=sys.stderr)
        print("ValueError: the last line says why\n", file=sys.stderr)
        return 3
    if what == "where":
        forked = os.environ.get("TRAINWISE_FORKED") == "1"
        say({"event": "where", "forked": forked, "cwd": os.getcwd(), "var": os.environ.get("TW_TEST_VAR")})
        return 0
    if what == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    if what.startswith("rank"):
        return rank(what, int(os.environ["RANK"]))
    return 1


def rank(what: str, me: int) -> int:
    if what == "rank":
        import torch  # heavy: torch, for this mode only

        env = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
        forked = os.environ.get("TRAINWISE_FORKED") == "1"
        agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE")  # torchrun sets it, a forked group not
        say({"event": "rank", **env, "threads": torch.get_num_threads(), "forked": forked, "agent_store": agent_store})
        return 0
    if me == 1 and what == "rank1-killed":
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    if me == 1 and what == "rank1-fails":
        time.sleep(0.5)
        print("Traceback (most recent call last):\nRuntimeError: rank 1 broke", file=sys.stderr)
        return 1
    say({"event": "waiting", "rank": me, "pid": os.getpid()})
    time.sleep(600)
    return 0


@dataclass(frozen=True)
class EchoJob:
    home: str
    ranks: int | None = None
    big: bool = False

    def place(self) -> Place:
        return Place(Path(self.home) / "job.json", Path(self.home) / "log", self.ranks, "cpu")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, blob: dict) -> EchoJob:
        return cls(**blob)

    def run(self, emit: Emit) -> TrialResult:
        me = Ranks.from_env()
        for step in (1, 2, 3):
            emit(Step(step, 3, 1.0 / step, step_s=0.5))
        env = {"pad": "x" * 6000} if self.big else {"pid": os.getpid()}
        time_s, peak = 1.0 + me.rank, 1000 * (me.rank + 1)
        return TrialResult(
            "echo",
            "ok",
            step_time_s=time_s,
            samples_per_s=8.0 / time_s,
            peak_mem_bytes=peak,
            world_size=me.world,
            env=env,
        )

    def ended(self, results: list[TrialResult | None], end: Exit) -> TrialResult:
        if self.ranks is not None:
            return combine_ranks(results, self.ranks)
        return results[0] or TrialResult("echo", "crashed", message=end.tail)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
