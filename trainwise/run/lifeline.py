"""No orphans: every process trainwise starts dies with the process that started it.

A trial, a tune trial or a training run over ranks runs in its own session (so that killing it kills
its DataLoader workers and ranks too), which also means a signal to the study's process group does not
reach it. So each child asks the kernel for SIGKILL when its parent dies (Linux `PR_SET_PDEATHSIG`),
set between fork and exec; torchrun's ranks ask the same of torchrun, so the chain study -> torchrun ->
ranks unwinds whatever kills the top (SIGKILL included). DataLoader workers already watch their parent.
On other systems this is a no-op: the launcher still kills the child's group on SIGINT/SIGTERM/SIGHUP.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
received: str | None = None  # the name of the signal that interrupted this command, if one did
_libc = None
if sys.platform.startswith("linux"):
    try:  # loaded once here: a child between fork and exec should not dlopen
        _libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        _libc = None


def die_with_parent(parent_pid: int | None = None) -> None:
    """Get SIGKILL when the parent dies; if `parent_pid` is given and is already gone, exit at once."""
    if _libc is None:
        return
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if parent_pid is not None and os.getppid() != parent_pid:  # it died before the prctl
        os._exit(1)


def bound_to_me() -> Callable[[], None]:
    """A `preexec_fn` for Popen: the child gets its own session and dies with this process."""
    parent = os.getpid()

    def preexec() -> None:
        os.setsid()
        die_with_parent(parent)

    return preexec


def signals_interrupt() -> None:
    """SIGTERM and SIGHUP end a trainwise command like Ctrl-C does, so the launcher's cleanup runs (it
    kills the running trial's process group) instead of Python dying at once and leaving the trial."""

    def interrupt(signum, _frame) -> None:
        global received
        received = signal.Signals(signum).name
        raise KeyboardInterrupt(received)

    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers (trainwise's main called from a thread: leave them)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)


def interrupted_line() -> str:
    """What a command interrupted by Ctrl-C, SIGTERM or SIGHUP says (the running trial was killed with it)."""
    return f"trainwise: interrupted ({received or 'SIGINT'})"
