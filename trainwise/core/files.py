"""Writing the files a command leaves behind, and what happens when the machine refuses a write.

Every file is replaced whole: written aside under a temporary name, then renamed, so a reader or a kill
never sees half of one. A write that the environment refuses (a full disk, a quota, a read-only file
system, an output directory removed while the command ran) becomes `OutputFailed`: the CLI prints it
as one line naming the file and the space left, and exits with `OUTPUT_EXIT`. The temporary files of
the failed write are removed; what was stored before (the study's store, the last whole checkpoint)
stays, so the same command resumes once there is room.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

from trainwise.core.errors import ConfigError, OutputFailed, RunFailed

OUTPUT_EXIT = 3  # the exit code of a command whose writes the environment refused

_ERRNOS = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
}
# how libraries that do not raise OSError say the same (safetensors, SQLite, torch.save, a child's message)
_TEXTS = (
    ("no space left on device", "no space left on device"),
    ("os error 28", "no space left on device"),
    ("database or disk is full", "no space left on device"),
    ("disk quota exceeded", "disk quota exceeded"),
    ("read-only file system", "read-only file system"),
    ("attempt to write a readonly database", "read-only file system"),
)


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}" if abs(n) < 10 else f"{n:.0f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def refusal_in(text: str) -> str | None:
    """The environment's refusal a message reports (a trial's or a rank's last error line), or None."""
    low = text.lower()
    return next((reason for needle, reason in _TEXTS if needle in low), None)


FULL_BYTES = 1 << 20  # less than this free: the disk is full (a process that died there left no word why)
_SPACE = ("no space left on device", "disk quota exceeded")
_OURS = re.compile(r"OutputFailed: (.+?) writing ")  # a child's one line, in its traceback or its message


def refusal(exc: BaseException, while_writing: bool = True) -> str | None:
    """Why the environment refused a write, when that is what `exc` (or an exception it came from) is:
    'no space left on device', 'disk quota exceeded', 'read-only file system', and, around code known to
    be writing, 'permission denied' or 'the directory was removed' (a missing parent of the file
    written: the same errors from reading an input are the user's input, not the machine's refusal);
    None for any other failure."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if (
            isinstance(e, OSError)
            and e.errno in _ERRNOS
            and (while_writing or e.errno not in (errno.EACCES, errno.EPERM))
        ):
            return _ERRNOS[e.errno]
        if while_writing and isinstance(e, FileNotFoundError) and e.filename and not Path(e.filename).parent.exists():
            return "the directory was removed"
        if found := refusal_in(str(e)):
            return found
        todo += [e.__cause__, e.__context__]
    return None


def free_space(path: Path) -> int | None:
    """Bytes free to this user on the file system that holds `path` (or its nearest existing parent)."""
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return None


def refused_by(message: str, where: Path, died: bool = False) -> str | None:
    """Why a child process (a trial, a training rank) failed, when the machine refused its writes into
    `where`: its own OutputFailed line, or a full-disk message while `where`'s disk is full (a full
    /dev/shm or /tmp is the trial's failure, not --out's), or a death without a word (`died`) there."""
    if ours := _OURS.search(message):
        return ours.group(1)
    room = free_space(where)
    if room is None or room >= FULL_BYTES:
        return None
    return refusal_in(message) or ("no space left on device" if died else None)


def failed(path: Path, reason: str, hint: str = "") -> OutputFailed:
    """The one-line error for a refused write of `path`, with the space left there and what to do."""
    room = free_space(path)
    where = f" ({human_bytes(room)} free)" if room is not None and reason in _SPACE else ""
    todo = {
        "read-only file system": "choose a writable --out",
        "permission denied": "choose a writable --out",
        "the directory was removed": "run the same command again (it starts afresh where --out was)",
    }.get(reason, hint or "make room and run the same command again")
    return OutputFailed(f"{reason} writing {path}{where}; {todo}")


def remove(*paths: Path) -> None:
    """Remove files or directories, whichever they are, if they exist."""
    for p in paths:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                p.unlink()


@contextlib.contextmanager
def writing(path: Path, *leftovers: Path, hint: str = "") -> Iterator[None]:
    """Around the code that writes `path`: on any failure the `leftovers` (its temporary files or
    directories) are removed; a failure the environment caused is raised as OutputFailed."""
    try:
        yield
    except BaseException as e:
        remove(*leftovers)
        reason = None if isinstance(e, OutputFailed | KeyboardInterrupt) else refusal(e)
        if reason is None:
            raise
        raise failed(path, reason, hint) from e


def tmp_of(path: Path) -> Path:
    """The temporary sibling a file is written as before it is renamed into place (one per process)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def write_atomic(path: Path, data: str | bytes) -> None:
    """`path` replaced whole by `data` (text is UTF-8); left alone when it holds `data` already, so that
    a command run again (after a full disk, say) does not need room for a second copy of its data."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with contextlib.suppress(OSError):
        if path.stat().st_size == len(raw) and path.read_bytes() == raw:
            return
    tmp = tmp_of(path)
    with writing(path, tmp):
        tmp.write_bytes(raw)
        tmp.replace(path)


def plain_modes(directory: Path) -> None:
    """Every file under `directory` gets the mode a plainly written file gets (0666 less the umask):
    safetensors writes its files 0600, so a model directory's weights were unreadable to the users and
    services its config and tokenizer were readable to."""
    umask = os.umask(0)
    os.umask(umask)
    for path in directory.rglob("*"):
        if path.is_file():
            path.chmod(0o666 & ~umask)


def tree_bytes(path: Path) -> int:
    """The bytes the files under `path` take (0 when it does not exist); a file hard-linked from two
    places under it is counted once."""
    if path.is_file():
        return path.stat().st_size
    seen: set[tuple[int, int]] = set()
    total = 0
    for p in path.rglob("*") if path.is_dir() else ():
        with contextlib.suppress(OSError):
            st = p.lstat()
            if p.is_file() and not p.is_symlink() and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def exit_line(e: Exception) -> tuple[str, int]:
    """The one line and the exit code of a command that ended with `e`: bad input 2, work that failed as
    a whole 1, a write the environment refused 3 (raised from the library as OutputFailed, or met
    unwrapped); any other exception is a defect and raised again, traceback and all."""
    if isinstance(e, ConfigError | RunFailed | OutputFailed):
        code = 2 if isinstance(e, ConfigError) else 1 if isinstance(e, RunFailed) else OUTPUT_EXIT
        return " ".join(str(e).split()), code
    reason = refusal(e, while_writing=False)
    if reason is None:
        raise e
    where = next(
        (getattr(x, "filename", None) for x in (e, e.__cause__, e.__context__) if getattr(x, "filename", None)), None
    )
    return " ".join(
        str(failed(Path(where), reason) if where else f"{reason} ({type(e).__name__}: {e})").split()
    ), OUTPUT_EXIT


MARK = ".trainwise"  # in every --out trainwise writes: what is there is ours to replace


@contextlib.contextmanager
def hold(out: Path, part: str | None = None) -> Iterator[None]:
    """Run a command's trials (or its training) in `out` alone: a second trainwise command on the same
    --out, while this one runs, is refused in one line rather than sharing trial directories and the
    store. An advisory lock (flock) on the folder's mark file; the kernel drops it when the holder dies.
    `part`: the command holds only its part of `out` (a training run's node other than the first, which
    shares the folder with the node that holds it): a lock file of that part's own."""
    out.mkdir(parents=True, exist_ok=True)
    lock = out / MARK if part is None else out / f".trainwise-{part}.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by the trial processes
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"--out {out} is in use by another trainwise command running now; wait for it to end, "
                "or choose another --out"
            ) from None
        if os.fstat(fd).st_size == 0 and part is None:
            with writing(out / MARK):
                os.write(fd, b"written by trainwise\n")
        yield
    finally:
        os.close(fd)
