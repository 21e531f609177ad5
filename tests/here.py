"""`trainwise ARGV` run in the test's own process, answered as `subprocess.run` answers: a command that is not
killed needs no interpreter of its own, and its trials and ranks fork from the session's warm zygote instead of
a new one (a fresh `python -m trainwise.cli` spends ~6 s importing torch, then ~6 s more starting a zygote)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys


def trainwise(*argv: str, env: dict[str, str] | None = None, fresh: bool = False) -> subprocess.CompletedProcess:
    """Exit code, stdout and stderr of `trainwise.cli.main(argv)` (with `fresh`: of `python -m trainwise.cli` in a
    process of its own). `env` is set around the call, and the whole environment is put back after it (what the
    command set for itself, such as DS_ACCELERATOR, too). Never a fault that kills this process: a `train:kill@N` of
    a one-process run needs `fresh`. Python warnings and the log lines of libraries whose handlers were made before
    the call do not reach the returned stderr: a check that a command prints no third-party line needs `fresh`."""
    from trainwise.cli import main

    if fresh:  # a process of its own: a run its fault kills, or a check of all it prints
        full = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
        command = [sys.executable, "-m", "trainwise.cli", *argv]
        return subprocess.run(command, capture_output=True, text=True, env=full, timeout=600)
    before = dict(os.environ)
    out, err = io.StringIO(), io.StringIO()
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(argv))
    finally:
        os.environ.clear()
        os.environ.update(before)
    return subprocess.CompletedProcess(["trainwise", *argv], code, out.getvalue(), err.getvalue())
