"""A warm start for trial processes: a fresh process per trial, without paying torch's import each time.

Importing torch and transformers takes a trial process 2-4 s on 2 CPU cores, as long as a tiny trial
trains. The zygote is one process per command that imports them once and then only forks: each trial
is a child forked from it, so it starts clean (no allocator state, no compiled kernels, no training
state: the zygote never runs a tensor op, never touches CUDA) with the imports already done. The child
runs `python -m module args` as it would have been exec'd (runpy), in its own session, with the caller's
environment and directory, stdout and stderr on the descriptors the caller passed, and dies with the
zygote, which dies with the command (lifeline). `launcher.run_child` uses it for one-process children
(trials, tune trials) and for the data-parallel ranks of one machine on Linux; TRAINWISE_FORK=0 turns it
off (every child exec'd from scratch, ranks under torchrun).

Ranks: for {"ranks": N} the zygote forks a group leader, which does on one node what torchrun's agent
does: it forks N ranks into its own session with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR/MASTER_PORT on a free port; rank 0 hosts the store), their stdout on the caller's descriptor,
their stderr into the log with torchrun's `[rankN]:` prefix; when a rank fails it kills the others at once
(they would wait in a collective), writes `rank R: exit code C (SIGNAME)` to the log and ends as that rank
did (exit code C, or killed by the same signal). Killing the leader's process group kills every rank.

Protocol over a socket pair (one JSON object per message, length-prefixed): the caller sends
{"module", "args", "env", "cwd", "ranks"} with two descriptors (stdout, stderr) and gets {"pid"}; when a
child ends the zygote sends {"pid", "status"} (the exit code, or -N when signal N killed it).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.util
import json
import os
import resource
import runpy
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Iterator
from typing import IO

import psutil

from trainwise.run.lifeline import bound_to_me, die_with_parent

PRELOAD = ("torch", "transformers", "trainwise.training.trial")  # what every trial imports (not the __main__ modules)
# what LoRA/qlora trials import (peft, and with it bitsandbytes: ~2.4 s), when installed: once here, not per trial
OPTIONAL_PRELOAD = ("peft",)
_HEADER = struct.Struct("!I")


class Unavailable(RuntimeError):
    """The zygote could not fork a child (it died, or refused to serve): the caller execs it instead."""


_broken = False  # the zygote could not serve once in this command: exec from then on


def enabled() -> bool:
    return sys.platform.startswith("linux") and os.environ.get("TRAINWISE_FORK", "1") != "0" and not _broken


def _send(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    payload = _HEADER.pack(len(data)) + data
    if fds:
        socket.send_fds(sock, [payload], fds)
    else:
        sock.sendall(payload)


def _recv_exact(sock: socket.socket, n: int, fds: list[int]) -> bytes | None:
    chunks = b""
    while len(chunks) < n:
        data, got, _flags, _addr = socket.recv_fds(sock, n - len(chunks), 4)
        fds += got
        if not data:
            return None
        chunks += data
    return chunks


def _recv(sock: socket.socket) -> tuple[dict, list[int]] | None:
    fds: list[int] = []
    header = _recv_exact(sock, _HEADER.size, fds)
    if header is None:
        return None
    body = _recv_exact(sock, _HEADER.unpack(header)[0], fds)
    return (json.loads(body), fds) if body is not None else None


# ---- the caller's side ----------------------------------------------------------------------------------------
class Forked:
    """A child forked by the zygote, used as the launcher uses a Popen: pid, stdout, poll, wait, returncode."""

    def __init__(self, zygote: Zygote, pid: int, stdout: IO[str]):
        self.zygote, self.pid, self.stdout = zygote, pid, stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.status(self.pid, block=False)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        while self.returncode is None:
            self.returncode = self.zygote.status(self.pid, block=True, timeout=timeout)
        return self.returncode


class Zygote:
    """The caller's handle on the zygote process: started on first use, one per command."""

    def __init__(self, command: list[str] | None = None, also: tuple[str, ...] = ()) -> None:
        """`command` (tests): what runs in place of the zygote, given the socket's descriptor as its last word;
        `also`: modules the zygote imports beyond PRELOAD, where installed."""
        ours, theirs = socket.socketpair()
        self.proc = subprocess.Popen(
            [*(command or [sys.executable, "-m", "trainwise.run.zygote", *also]), str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            preexec_fn=bound_to_me(),
        )
        theirs.close()
        self.sock = ours
        self.lock = threading.Lock()  # one fork request at a time: the next {"pid"} reply is its answer
        self.changed = threading.Condition()
        self.exits: dict[int, int] = {}
        self.started: list[int] = []
        self.alive = True
        self.ready = threading.Event()  # its imports done (or it is gone): it only forks from now on
        self.also = set(also)  # the modules beyond PRELOAD it was asked to import (at its start, or since)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        # a zygote that ends with a request unread (it refused to serve: CUDA initialised by an import) resets
        # the connection: that is its end too, or a spawn would wait for a reply that never comes
        with contextlib.suppress(OSError):
            while (got := _recv(self.sock)) is not None:
                message, _ = got
                if message.get("ready"):
                    self.ready.set()
                    continue
                with self.changed:
                    if "status" in message:
                        self.exits[message["pid"]] = message["status"]
                    else:
                        self.started.append(message["pid"])
                    self.changed.notify_all()
        with self.changed:
            self.alive = False
            self.changed.notify_all()
        self.ready.set()

    def load(self, modules: tuple[str, ...]) -> None:
        """Have the running zygote import `modules` too (those it has not been asked for yet), before its next fork:
        the requests are read in order, and it forks nothing while it imports."""
        more = [m for m in modules if m not in self.also]
        if more:
            with self.lock:
                _send(self.sock, {"import": more})
            self.also.update(more)

    def spawn(self, module: str, args: list[str], env: dict[str, str], stderr: IO, ranks: int | None = None) -> Forked:
        read, write = os.pipe()
        try:
            with self.lock, self.changed:
                request = {"module": module, "args": args, "env": env, "cwd": os.getcwd(), "ranks": ranks}
                _send(self.sock, request, [write, stderr.fileno()])
                if not self.changed.wait_for(lambda: self.started or not self.alive, timeout=600):
                    raise Unavailable("the zygote did not fork within 600 s")
                if not self.started:
                    raise Unavailable("the zygote is gone")
                pid = self.started.pop(0)
        finally:
            os.close(write)
        return Forked(self, pid, open(read, encoding="utf-8", errors="replace"))

    def status(self, pid: int, block: bool, timeout: float | None = None) -> int | None:
        with self.changed:
            ended = lambda: pid in self.exits or not self.alive  # noqa: E731
            if block and not self.changed.wait_for(ended, timeout=timeout):
                raise subprocess.TimeoutExpired(f"pid {pid}", timeout or 0)
            if pid in self.exits:
                return self.exits.pop(pid)
            return None if self.alive else -signal.SIGKILL  # the zygote died: so did its children


_zygote: Zygote | None = None
_start_lock = threading.Lock()


def warm(also: tuple[str, ...] = ()) -> None:
    """Start this command's zygote now, without waiting for it: its imports (~8 s on 2 CPU cores) overlap the
    command's own preparation instead of delaying its first trial. `also`: modules it imports beyond PRELOAD, where
    installed (the text metrics' rouge-score and its nltk, where asked: trainwise.training.data.metrics.preloaded)."""
    if enabled():
        with contextlib.suppress(OSError):  # (a zygote gone: the next spawn starts one with them, or execs)
            _started(also).load(also)


def settle(timeout: float = 120.0) -> None:
    """Wait until a zygote that is starting has done its imports (a timed probe must not share the CPUs with
    them: its child's CPU time counts as this process's own, so no load check would see it)."""
    if _zygote is not None and _zygote.proc.poll() is None:
        _zygote.ready.wait(timeout)


def _started(also: tuple[str, ...] = ()) -> Zygote:
    """This command's zygote; one started again (the last one died) imports every module asked of the last."""
    global _zygote
    with _start_lock:
        if _zygote is None or _zygote.proc.poll() is not None:
            asked = tuple(dict.fromkeys([*(sorted(_zygote.also) if _zygote is not None else []), *also]))
            _zygote = Zygote(also=asked)
        return _zygote


def spawn(module: str, args: list[str], env: dict[str, str], stderr: IO, ranks: int | None = None) -> Forked:
    """`python -m module args` as a child of this command's zygote (started on first use); with `ranks`,
    a group of that many ranks on this machine, as torchrun would start them (the handle is their leader's).
    Unavailable when the zygote cannot serve; it is not started again in this command."""
    global _broken
    try:
        return _started().spawn(module, args, env, stderr, ranks)
    except (Unavailable, OSError) as e:
        _broken = True
        raise Unavailable(str(e)) from e


# ---- the zygote ------------------------------------------------------------------------------------------------
def _child(request: dict, out_fd: int, err_fd: int, sock: socket.socket | None) -> None:
    """In the forked child: become `python -m module args`, then exit with its status. A rank (sock None)
    stays in its leader's session and process group."""

    code = 1
    try:
        if sock is not None:
            sock.close()
            os.setsid()

        die_with_parent()
        for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        os.close(out_fd)
        os.close(err_fd)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115  (line-buffered: events go out at once)
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        os.chdir(request["cwd"])
        if request["cwd"] not in sys.path:
            # `python -m` puts its directory first on the path: the caller's too, beside the zygote's (started early,
            # it may have started in another directory: a test's, a notebook's)
            sys.path.insert(0, request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ["TRAINWISE_FORKED"] = "1"  # the trial's env record says how its process started
        # the caller's PYTHONPATH, as an exec'd child's path would hold it (the zygote's was read when it started,
        # maybe before the caller set it: a module only there, a test's helper, was not found in a fork)
        for entry in reversed([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]):
            if entry not in sys.path:
                sys.path.insert(1, entry)
        if threads := os.environ.get("OMP_NUM_THREADS", "").strip():
            import torch  # heavy: torch (imported by the preload already)

            # OpenMP read OMP_NUM_THREADS when the zygote loaded it: a value set for this child needs saying
            with contextlib.suppress(ValueError, RuntimeError):
                torch.set_num_threads(max(1, int(threads)))
        sys.argv = [request["module"], *request["args"]]
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        if isinstance(e.code, int) or e.code is None:
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def rank_env(env: dict[str, str], rank: int, world: int, port: int, run_id: str) -> dict[str, str]:
    """The environment torchrun's agent gives rank `rank` of `world` on a single node (less its agent store:
    rank 0's init hosts the TCP store at MASTER_PORT, as with a plain `env://` launch)."""
    return {
        **env,
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "GROUP_RANK": "0",
        "ROLE_RANK": str(rank),
        "ROLE_NAME": "default",
        "LOCAL_WORLD_SIZE": str(world),
        "WORLD_SIZE": str(world),
        "GROUP_WORLD_SIZE": "1",
        "ROLE_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }


def free_port() -> int:
    """A TCP port free on this machine now (torchrun --standalone picks its store's port the same way)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def exit_line(rank: int, status: int) -> str:
    """The line the leader writes for the rank that ended the group (the launcher's one-line reason)."""
    if status < 0:
        return f"rank {rank}: exit code {status} ({signal.Signals(-status).name})"
    return f"rank {rank}: exit code {status}"


def _group(request: dict, out_fd: int, err_fd: int, sock: socket.socket) -> None:
    """In the forked leader: run `request["ranks"]` ranks, torchrun's agent on one node; end as the first
    rank that failed did (every rank killed then), or 0."""
    status = 1
    try:
        sock.close()
        os.setsid()  # the ranks join this session and process group: killing it kills them all
        die_with_parent()
        for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        world, port, run_id = request["ranks"], free_port(), uuid.uuid4().hex[:12]
        pipes: dict[int, int] = {}  # each rank's stderr (read end) -> its rank
        pids: dict[int, int] = {}  # pid -> rank
        for rank in range(world):
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                for fd in (read, err_fd, *pipes):  # the rank's stderr is its pipe to the leader
                    os.close(fd)
                env = rank_env(request["env"], rank, world, port, run_id)
                _child({**request, "env": env}, out_fd, write, None)
            os.close(write)
            pipes[read], pids[pid] = rank, rank
        os.close(out_fd)  # the caller's stdout ends when the last rank's does
        status = _supervise(pids, pipes, err_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.write(err_fd, traceback.format_exc().encode())
    _end_as(status)


def _supervise(pids: dict[int, int], pipes: dict[int, int], err_fd: int) -> int:
    """Copy the ranks' stderr into the log a line at a time, `[rankN]:` first; wait for them; at the first
    that fails, kill the others with all they started. Returns the group's status."""
    partial = dict.fromkeys(pipes, b"")
    failed: tuple[int, int] | None = None
    grace_until = float("inf")

    def copy(fd: int, data: bytes) -> None:
        *lines, partial[fd] = (partial[fd] + data).split(b"\n")
        prefix = f"[rank{pipes[fd]}]:".encode()
        for line in lines:
            os.write(err_fd, prefix + line + b"\n")

    while pids or (pipes and time.monotonic() < grace_until):
        ready, _, _ = select.select(list(pipes), [], [], 0.05)
        for fd in ready:
            data = os.read(fd, 65536)
            if data:
                copy(fd, data)
                continue
            if partial[fd]:
                copy(fd, b"\n")
            os.close(fd)
            del pipes[fd]
        while pids:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            rank, code = pids.pop(pid, None), os.waitstatus_to_exitcode(wait_status)
            if rank is None:
                continue
            if code != 0 and failed is None:
                failed = (rank, code)
                _kill_ranks(pids)
        if not pids and grace_until == float("inf"):  # something a rank started may hold its stderr: not long
            grace_until = time.monotonic() + 2.0
    if failed is None:
        return 0
    os.write(err_fd, (exit_line(*failed) + "\n").encode())
    return failed[1]


def _kill_ranks(pids: dict[int, int]) -> None:
    """SIGKILL each rank left and everything it started (DataLoader workers), as torchrun stops them."""
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            rank = psutil.Process(pid)
            for p in [*rank.children(recursive=True), rank]:
                with contextlib.suppress(psutil.Error):
                    p.kill()


def _end_as(status: int) -> None:
    """Exit with `status`: -N by signal N (the same signal, without a core file), else that exit code."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if status < 0:
        with contextlib.suppress(Exception):
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        with contextlib.suppress(Exception):  # SIGKILL's cannot be set, and needs not be
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        os._exit(128 - status)
    os._exit(status)


def _serve(sock: socket.socket) -> None:
    children: set[int] = set()
    while True:
        ready, _, _ = select.select([sock], [], [], 0.05)
        if ready:
            try:
                got = _recv(sock)
            except OSError:  # reset: the command ended with our messages unread (interrupted while a trial ended)
                got = None
            if got is None:  # the command is gone: so are we (and, by their lifeline, the children)
                return
            request, fds = got
            if "import" in request:  # Zygote.load: more modules for the children to come (no fork, no reply)
                with _loading():
                    _imported(request["import"])
                continue
            pid = os.fork()
            if pid == 0:
                (_group if request.get("ranks") else _child)(request, fds[0], fds[1], sock)
            for fd in fds:
                os.close(fd)
            children.add(pid)
            if not _told(sock, {"pid": pid}):
                return
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                if not _told(sock, {"pid": pid, "status": os.waitstatus_to_exitcode(status)}):
                    return


def _imported(modules: list[str]) -> None:
    """`modules` imported here, where installed (one that is not is the error of the trial that imports it)."""
    for name in modules:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def _told(sock: socket.socket, message: dict) -> bool:
    """Send `message` to the command; False where it is gone (its end closed: the zygote ends without a word, an
    interrupted `make demo` printed this process's ConnectionResetError traceback under its own line, 2026-11-28)."""
    try:
        _send(sock, message)
    except OSError:
        return False
    return True


@contextlib.contextmanager
def _loading() -> Iterator[None]:
    """The zygote's imports (at its start, or a later command's): with the collector off, then frozen. Imports make
    next to no cyclic garbage, but each full collection walks the growing heap (with it on, the preload took 8.6-10.5 s
    against 6.0-8.5 s, three runs each, 2-core EPYC); what is loaded is never garbage, and frozen a child's full
    collections neither walk it (0.35 s each with torch and transformers loaded) nor write to its shared pages."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
    gc.freeze()


def _preload(also: list[str]) -> None:
    """The zygote's imports: PRELOAD, the optional ones where they are safe, and this command's own (`also`)."""
    for name in PRELOAD:
        importlib.import_module(name)
    import torch  # heavy: torch (imported by the preload already)

    from trainwise.core.env import git_commit  # after the preload: the zygote starts light, then loads

    # the commit of the code loaded here (cached): a forked trial runs it, so it reports it, not what HEAD is when it
    # starts (a study of 27 min recorded the commit made while it ran)
    git_commit()

    # peft imports bitsandbytes when it is installed, and bitsandbytes initialises CUDA when a GPU is visible
    # (an H200, 2026-11-26): the zygote could then fork no child, so there the LoRA trials import peft themselves
    # (a CUDA build only: asking is_available where NVML cannot answer initialises the driver itself)
    if not (importlib.util.find_spec("bitsandbytes") and torch.version.cuda is not None):
        for name in OPTIONAL_PRELOAD:
            with contextlib.suppress(ImportError):  # an optional extra (trainwise[lora]) not installed
                importlib.import_module(name)
    _imported(also)  # this command's trials' own (warm(also))


def main(argv: list[str]) -> int:

    die_with_parent()
    sock = socket.socket(fileno=int(argv[-1]))  # (the words before it: modules to import beyond PRELOAD)
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # a CUDA check by an import must not init CUDA
    with _loading():
        _preload(argv[:-1])
    import torch  # heavy: torch (imported by the preload already)

    if torch.cuda.is_initialized():  # a forked child cannot use a CUDA context made before the fork
        return 3  # the socket closes: the caller execs its children instead
    _send(sock, {"ready": True})
    _serve(sock)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
