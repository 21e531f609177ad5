"""The one way trainwise runs a child: `run(job, on_event) -> result`, for every kind of job (a compare
trial `training.job.TrialJob`, a training run `train.TrainJob`, a tune trial `tune.TuneTrial`).

A job is a dataclass that serialises (`to_dict` / `from_dict`), says where it runs (`place`: its job file,
its log, its ranks, its device), runs in the child through one function (`job.run(emit) -> result`, called
by `trainwise.run.worker`) and, in the parent, turns what came back into its result (`job.ended(results, exit)`:
the ranks' results combined, or a fault). The child speaks typed events (`trainwise.run.events`) as JSON lines
on stdout and ends with a `Result` event (each rank its own); nothing else travels back.

Backends (`BACKENDS`): a fresh process forked from the zygote ("fork", exec'd where the zygote cannot
serve), a fresh process exec'd ("exec"), and for a job with ranks, those ranks as torchrun starts them
(forked by a leader, or under torchrun itself with "exec"); "here" runs the job in this process. A Ray task
would be one more backend running the same `job.run(emit)`.

A fresh process per trial makes measurements independent (allocator state, peak RSS, compiled
kernels, accelerate's global state) and contains crashes. The child runs in its own session, bound to
this process by the lifeline (it dies with it); `run_child` hands its events to a callback, kills the
child's whole group past a timeout, on the callback's word or on Ctrl-C, and says how it ended (`Exit`).
The job turns that into its result: for a compare trial an exception or OOM is reported by the child; a
hang past the timeout is killed (`timeout`); a process that dies without a result (SIGKILL from the OS OOM
killer, a segfault) is `crashed`.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from trainwise.core.files import write_atomic
from trainwise.run import zygote
from trainwise.run.events import Emit, Event, Reader, Result, ignore
from trainwise.run.lifeline import bound_to_me
from trainwise.run.ranks import Rendezvous
from trainwise.run.worker import job_blob

GRACE_S = 5.0  # after the child exits, how long its stdout may stay open (held by something it started)


@dataclass(frozen=True)
class Exit:
    """How a child process ended."""

    code: int  # its exit status; -N: killed by signal N
    timed_out: bool  # it outlived its timeout and was killed, with everything it started
    stopped: bool  # the event callback asked to stop it: killed, with everything it started
    killed_by: (
        str | None
    )  # the signal that ended it, and for a SIGKILL not sent here, whether the OOM killer counted one
    tail: str  # why it failed, from its log: the last line (ranks: the failing rank's error, or its exit code)
    wall_s: float
    log: Path
    timeout_s: float | None = None  # the timeout it ran under


def run_child(
    module: str,
    args: list[str],
    log: Path,
    on_event: Callable[[dict], bool | None],
    *,
    ranks: int | None = None,
    device: str = "cpu",
    timeout_s: float | None = None,
    fork: bool = True,
    rendezvous: Rendezvous | None = None,
) -> Exit:
    """Run `python -m module *args` in a fresh process in its own session that dies with this one (forked
    from the zygote, else exec'd); with `ranks`, that many ranks on this machine as torchrun starts them
    (forked from the zygote by a leader that stops them all when one fails, else under torchrun itself);
    its stderr goes to `log`. Each JSON object it prints on a line of
    stdout goes to `on_event`, in this thread; when that returns True the child is stopped. The child and
    all it started are killed past `timeout_s` seconds, and when this thread is interrupted (Ctrl-C,
    SIGTERM: the child has its own session and would not see the signal). `fork=False`: exec'd (ranks:
    under torchrun), never forked. `rendezvous`: the ranks are this node's share of a group over several machines,
    under torchrun with its static rendezvous (exec'd)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", module, *args]
    if ranks is not None:
        meet = ["--standalone"] if rendezvous is None else rendezvous.torchrun_args()
        cmd[1:2] = ["-m", "torch.distributed.run", *meet, f"--nproc_per_node={ranks}", "-m"]
        fork = fork and rendezvous is None  # the zygote's leader starts the ranks of one machine only
        if device == "cpu":
            env["DS_ACCELERATOR"] = "cpu"  # DeepSpeed would look for a GPU
            env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // ranks)))
    start, ooms = time.perf_counter(), oom_kills()
    deadline = None if timeout_s is None else start + timeout_s
    with open(log, "w") as stderr:
        proc: Any = None
        if fork and zygote.enabled():  # forked from a process that imported torch already (ranks: as torchrun would)
            with contextlib.suppress(zygote.Unavailable):  # else exec'd, as with TRAINWISE_FORK=0
                proc = zygote.spawn(module, args, env, stderr, ranks)
        forked = proc is not None
        if proc is None:
            proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, preexec_fn=bound_to_me()
            )
        lines: queue.Queue[dict | None] = queue.Queue()
        threading.Thread(target=_forward, args=(proc, lines), daemon=True).start()
        try:
            ended_here = _pump(proc, lines, on_event, deadline)
            if ended_here is None:
                try:
                    proc.wait(timeout=None if deadline is None else max(0.0, deadline - time.perf_counter()))
                except subprocess.TimeoutExpired:
                    _kill_group(proc)
                    ended_here = "timeout"
        except BaseException:
            _kill_group(proc)
            raise
    code = proc.returncode
    killed_by = None
    if code < 0:
        killed_by = signal.Signals(-code).name
        if -code == signal.SIGKILL and ended_here is None:
            killed_by += killer(ooms)
    tail = last_line(log) if ranks is None else group_failure(log) if forked else rank_failure(log)
    wall = time.perf_counter() - start
    return Exit(code, ended_here == "timeout", ended_here == "stopped", killed_by, tail, wall, log, timeout_s)


def _pump(
    proc: subprocess.Popen,
    lines: queue.Queue[dict | None],
    on_event: Callable[[dict], bool | None],
    deadline: float | None,
) -> str | None:
    """Hand the child's events to `on_event` until its stdout closes; 'timeout' or 'stopped' when it was
    killed here for that."""
    exited_at = None
    while True:
        now = time.perf_counter()
        if proc.poll() is None:
            if deadline is not None and now >= deadline:
                _kill_group(proc)
                return "timeout"
        elif exited_at is None:
            exited_at = now
        elif now - exited_at > GRACE_S:  # it is gone, but something it started still holds its stdout
            return None
        wait = 1.0 if deadline is None else min(1.0, max(0.0, deadline - now))
        try:
            event = lines.get(timeout=wait)
        except queue.Empty:
            continue
        if event is None:
            return None
        if on_event(event) is True:
            _kill_group(proc)
            return "stopped"


def _forward(proc: subprocess.Popen, lines: queue.Queue[dict | None]) -> None:
    for event in events(proc):
        lines.put(event)
    lines.put(None)


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


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the child and anything it started (dataloader workers, ranks); it runs in its own session."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        # no such group: the child is gone, or was forked a moment ago and has not made its session yet (its first
        # act; a deadline that passed while a cold zygote imported kills that soon). Then it has started nothing:
        # killing it is killing all of it (else the wait below would wait for a trial that hangs, for ever)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def last_line(log: Path) -> str:
    """The last line a process wrote to its log (the exception, usually); '' when there is none."""
    try:
        text = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return text[-1] if text else ""


_RAISED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception)\b")


def group_failure(log: Path) -> str:
    """Why a forked rank group failed, from its log: the failing rank's own exception if it printed one,
    else its exit code and signal, as the group's leader wrote them (`zygote.exit_line`)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    end = next((i for i in reversed(range(len(lines))) if re.match(r"^rank \d+: exit code", lines[i])), None)
    if end is None:
        return re.sub(r"^\[rank\d+\]:\s?", "", last_line(log))
    prefix = lines[end].split(":", 1)[0].replace("rank ", "[rank") + "]:"
    own = [line[len(prefix) :].strip() for line in lines[:end] if line.startswith(prefix)]
    raised = [line for line in own if _RAISED.match(line)]
    return raised[-1] if raised else lines[end]


def rank_failure(log: Path) -> str:
    """Why torchrun's ranks failed, from its log: the failing rank's own exception if it printed one,
    else the root cause torchrun reports (rank, exit code, signal), not torchrun's banner."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    lines = [re.sub(r"^\[rank\d+\]:\s?", "", line) for line in lines]  # torchrun's per-rank prefix
    report = next((i for i, line in enumerate(lines) if "ChildFailedError" in line), len(lines))
    raised = [line for line in lines[:report] if _RAISED.match(line)]
    if raised:
        return raised[-1].strip()
    root = next((i for i, line in enumerate(lines) if line.startswith("Root Cause")), None)
    if root is None:
        return last_line(log)
    fields: dict[str, str] = {}
    for line in lines[root:]:
        key, _, value = line.strip().partition(":")
        fields.setdefault(key.strip(), value.strip())
    rank, code = fields.get("rank", "?"), fields.get("exitcode", "?")
    return f"rank {rank}: exit code {code}, {fields.get('traceback', '')}".strip()


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


# ---- the one entry: a job, run by a backend ------------------------------------------------------

R = TypeVar("R")


@dataclass(frozen=True)
class Place:
    """Where a job runs: the file the child reads it from, the log its stderr goes to, its ranks (None: one
    process) and its device."""

    file: Path
    log: Path
    ranks: int | None = None
    device: str = "cpu"
    rendezvous: Rendezvous | None = None  # the ranks are this node's of a group over several machines

    def first_rank(self) -> int:
        """The group rank of this node's first rank."""
        return 0 if self.rendezvous is None else self.rendezvous.node_rank * (self.ranks or 1)


class Job(Protocol[R]):
    """A kind of child. Serialisable (`to_dict`, and a classmethod `from_dict` the child rebuilds it with),
    run in the child by `run(emit)`, and in the parent `ended` turns the ranks' results (None for a rank
    that sent none) and how the process ended into the one result."""

    def place(self) -> Place: ...

    def to_dict(self) -> dict: ...

    def run(self, emit: Emit) -> R: ...

    def ended(self, results: list[R | None], end: Exit) -> R: ...


Listener = Callable[[Event], "bool | None"]
Backend = Callable[["Job[Any]", Callable[[dict], "bool | None"], "float | None"], Exit]


def _process(fork: bool) -> Backend:
    """A backend that runs the job in a fresh process (ranks: a group of them), forked or exec'd."""

    def start(job: Job[Any], on_line: Callable[[dict], bool | None], timeout_s: float | None) -> Exit:
        where = job.place()
        where.file.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(where.file, json.dumps(job_blob(job)))
        args = [str(where.file)]
        return run_child(
            "trainwise.run.worker", args, where.log, on_line, ranks=where.ranks, device=where.device,
            timeout_s=timeout_s, fork=fork, rendezvous=where.rendezvous,
        )  # fmt: skip

    return start


BACKENDS: dict[str, Backend] = {"fork": _process(True), "exec": _process(False)}


def run(job: Job[R], on_event: Listener = ignore, *, backend: str = "fork", timeout_s: float | None = None) -> R:
    """Run `job` and return its result. Its events go to `on_event` as they come (True from it stops the
    child); past `timeout_s` the child and all it started are killed, and the job says what that means.
    `backend`: "fork" (the zygote's child; exec'd where it cannot serve), "exec", or "here" (this process:
    its exceptions are the caller's)."""
    if backend == "here":

        def emit(event: Event) -> None:
            on_event(event)

        return job.run(emit)
    reader = Reader()
    results: dict[int, Any] = {}

    def on_line(line: dict) -> bool | None:
        event = reader.read(line)
        if isinstance(event, Result):
            results[event.rank] = event.value
            return None
        return None if event is None else on_event(event)

    end = BACKENDS[backend](job, on_line, timeout_s)
    where = job.place()
    return job.ended([results.get(where.first_rank() + r) for r in range(where.ranks or 1)], end)


def warm(also: tuple[str, ...] = ()) -> None:
    """Trials will run in this command: start the process they fork from now (its imports overlap the
    command's preparation; a no-op where children are exec'd). `also`: modules this command's trials import beyond
    every trial's (a text metric's), imported there once rather than in each trial."""
    zygote.warm(also)
