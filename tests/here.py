"""`trainwise ARGV` run in the test's own process, answered as `subprocess.run` answers: a command that is not
killed needs no interpreter of its own, and its trials and ranks fork from the session's warm zygote instead of
a new one (a fresh `python -m trainwise.cli` spends ~6 s importing torch, then ~6 s more starting a zygote)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path


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


def ray_env(tmp: Path) -> tuple[dict[str, str], Path]:
    """The environment of a test's Ray cluster and its drivers: token authentication with a token made in `tmp` (a
    new machine has no ~/.ray/auth_token, and one left there by an earlier Ray run must neither make a test pass nor
    be touched: HOME is `tmp`/home, returned), offline, no inherited token or address."""
    import secrets

    home = tmp / "home"
    home.mkdir(exist_ok=True)
    token = tmp / "ray_auth_token"
    token.write_text(secrets.token_hex(32))
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_TOKEN", "RAY_ADDRESS")}
    env |= {"HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "HOME": str(home)}
    return env, home


def free_port(host: str = "127.0.0.1") -> int:
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def ray_node(env: dict[str, str], *flags: str, timeout: float = 120.0, cpus: str | None = None):
    """A Ray node of this test's own (`ray start --block` in a process group of its own, its own temp dir), up
    when the block is entered and killed with its whole group when it is left: never a host-wide `ray stop`,
    which would also stop any other Ray on the machine (and takes ~8 s where a kill takes 0.1 s). `cpus`: the CPUs
    it is held to (taskset's list, e.g. "0")."""
    import shutil
    import signal
    import tempfile
    import time

    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    # a short path of its own: Ray's socket paths under it must stay within the 107 characters a socket allows
    temp = tempfile.mkdtemp(prefix="tw-ray-")
    command = [ray_cli, "start", "--block", f"--temp-dir={temp}", "--disable-usage-stats", *flags]
    if cpus is not None:  # held to these CPUs (taskset), its workers and trials with it: nodes that do not share cores
        command = ["taskset", "-c", cpus, *command]
    node = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    said: list[str] = []
    try:
        deadline = time.monotonic() + timeout
        assert node.stdout is not None
        for line in node.stdout:  # `--block` keeps it running once the node is up, after this line
            said.append(line)
            if "Ray runtime started" in line or time.monotonic() > deadline:
                break
        assert said and "Ray runtime started" in said[-1], "".join(said)[-2000:]
        yield node
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, signal.SIGKILL)
        node.wait()
        shutil.rmtree(temp, ignore_errors=True)
