"""Issue 27: a full disk (or a read-only / removed --out) is one line with an exit code of its own (3),
nothing half-written is left, the store stays whole and the same command resumes once there is room.

The end-to-end tests mount a small tmpfs (root only: CI runs as root) and fill it; the rest inject the
errors the libraries raise (OSError, safetensors', SQLite's, a trial's message) in process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests import here
from trainwise.core.errors import OutputFailed
from trainwise.core.files import OUTPUT_EXIT, exit_line, refusal, write_atomic, writing
from trainwise.core.results import StudyRow, TrialResult

BERT = ["--model-preset", "bert-tiny", "--batch-size", "8", "--max-length", "32", "--eval-samples", "8"]


@contextlib.contextmanager
def small_fs(where: Path, size: str):
    """A tmpfs of `size` mounted at `where` for the test (root only)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root); the in-process tests cover the rest")
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(fs: Path) -> Path:
    """Take every free byte of the file system."""
    path = fs / "fill"
    with open(path, "wb") as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 65536)
            f.flush()
    return path


def one_line(proc: subprocess.CompletedProcess, out: Path) -> str:
    assert proc.returncode == OUTPUT_EXIT, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("trainwise: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "no space left on device writing " + str(out) in errors[0] and "free)" in errors[0]
    return errors[0]


def leftovers(out: Path) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if ".tmp" in p.name)


@pytest.mark.slow
def test_compare_is_one_line_and_resumes_when_there_is_room(tmp_path, cls_csv):
    """Compare on a full disk is one line and resumes when there is room."""
    with small_fs(tmp_path / "fs", "4m") as fs:
        out = fs / "study"
        argv = ["compare", *BERT, "--train-file", str(cls_csv), "--max-steps", "3", "--warmup-steps", "1"]
        argv += ["--no-remeasure", "--retries", "0", "--out", str(out)]
        assert here.trainwise(*argv, "--strategies", "baseline").returncode == 0
        reports = {p: (out / p).read_bytes() for p in ("results.json", "report.md", "progress.json")}

        filler = fill(fs)
        line = one_line(here.trainwise(*argv, "--strategies", "baseline,grad_ckpt"), out)
        assert leftovers(out) == [], "no temporary file is left behind"
        with sqlite3.connect(out / "study.sqlite") as db:
            stored = db.execute("SELECT strategy, status FROM trials").fetchall()
        assert stored == [("baseline", "ok")], f"the store is whole and holds no row of the refused trial ({line})"
        assert {p: (out / p).read_bytes() for p in reports} == reports, "the reports are the last whole set"

        filler.unlink()  # room again: the same command finishes the study from the store
        again = here.trainwise(*argv, "--strategies", "baseline,grad_ckpt")
        assert again.returncode == 0, again.stderr[-2000:]
        assert again.stderr.count("(stored)") == 1
        rows = json.loads((out / "results.json").read_text())["rows"]
        assert [(r["strategy"], r["status"]) for r in rows] == [("baseline", "ok"), ("grad_ckpt", "ok")]
        progress = json.loads((out / "progress.json").read_text())
        assert (progress["done"], progress["total"], len(progress["trials"])) == (2, 2, 2)


@pytest.mark.slow
def test_train_resumes_from_the_last_whole_checkpoint(tmp_path, cls_csv):
    """Train on a full disk is one line, and resume continues from the last whole checkpoint."""
    with small_fs(tmp_path / "fs", "24m") as fs:
        out = fs / "run"
        argv = ["train", *BERT, "--train-file", str(cls_csv), "--max-steps", "6", "--save-every", "2"]
        argv += ["--eval-every", "2", "--out", str(out)]
        killed = here.trainwise(
            *argv, env={"TRAINWISE_FAULT": "train:kill@5"}, fresh=True
        )  # after the step-4 checkpoint
        assert killed.returncode != 0 and (out / "checkpoints" / "ckpt-00000004").is_dir()
        assert "writing to " + str(out) in killed.stderr and "the last 2 kept (--keep-checkpoints)" in killed.stderr

        filler = fill(fs)
        line = one_line(here.trainwise(*argv, "--resume"), out)
        assert "--resume" in line, "the line says how to continue"
        assert leftovers(out) == [] and not list((out / "checkpoints").glob(".tmp-*"))
        assert (out / "checkpoints" / "latest").read_text() == "ckpt-00000004", "the last whole checkpoint stays"

        filler.unlink()
        done = here.trainwise(*argv, "--resume")
        assert done.returncode == 0, done.stderr[-2000:]
        assert "trained 6/6 steps" in done.stdout and "(resumed from ckpt-00000004)" in done.stdout
        assert "disk: " in done.stdout and "checkpoints/" in done.stdout
        kept = sorted(p.name for p in (out / "checkpoints").glob("ckpt-*"))
        assert kept == ["ckpt-00000004", "ckpt-00000006"], "the last --keep-checkpoints 2 are kept"


# ---- in process: every form the refusal takes -----------------------------------------------------------


class SafetensorError(Exception):
    """What safetensors raises (not an OSError)."""


@pytest.mark.parametrize(
    "error, reason",
    [
        (OSError(errno.ENOSPC, "No space left on device"), "no space left on device"),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), "disk quota exceeded"),
        (OSError(errno.EROFS, "Read-only file system"), "read-only file system"),
        (PermissionError(errno.EACCES, "Permission denied"), "permission denied"),
        (SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"), "no space"),
        (sqlite3.OperationalError("database or disk is full"), "no space left on device"),
        (RuntimeError("wrapped"), None),
        (ValueError("a bug"), None),
    ],
)
def test_environment_refusals_are_told_from_other_failures(error, reason):
    found = refusal(error)
    assert (found is None) if reason is None else found.startswith(reason)
    chained = RuntimeError("PytorchStreamWriter failed writing file")
    chained.__cause__ = error
    assert refusal(chained) == found, "found through the chain of causes"


def test_a_removed_output_directory_is_a_refusal_too(tmp_path):
    gone = tmp_path / "gone"
    with pytest.raises(OutputFailed, match=f"the directory was removed writing {gone}/x.json;"):
        write_atomic(gone / "x.json", "{}")


def test_writing_removes_its_temporary_files_and_names_the_file(tmp_path):
    target, tmp = tmp_path / "chart.png", tmp_path / ".chart.tmp.png"
    with pytest.raises(OutputFailed) as caught, writing(target, tmp):
        tmp.write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert not tmp.exists()
    line, code = exit_line(caught.value)
    assert code == OUTPUT_EXIT and line.startswith(f"no space left on device writing {target} (") and "free)" in line
    with pytest.raises(KeyError), writing(target, tmp):  # any other failure: raised as it is
        raise KeyError("a bug")


def test_an_unwrapped_refusal_is_one_cli_line_with_the_file(tmp_path):
    line, code = exit_line(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "f.bin")))
    assert code == OUTPUT_EXIT and f"writing {tmp_path / 'f.bin'}" in line
    with pytest.raises(ValueError):
        exit_line(ValueError("a bug keeps its traceback"))


def test_unwritable_reports_leave_the_previous_set_whole(tmp_path, monkeypatch):
    from trainwise.study import store

    rows = [StudyRow("baseline", status="error", message="m")]
    store.write_reports(tmp_path, rows, "t", 1, 2, {"model": "m"})
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store, "chart", full)
    with pytest.raises(OutputFailed, match="chart.png"):
        store.write_reports(tmp_path, [*rows, dataclasses.replace(rows[0], strategy="bf16")], "t", 2, 2, {"model": "m"})
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before, "no half set, no temporary file"


OURS = "trainwise.core.errors.OutputFailed: permission denied writing /o/trials/k/job.json; choose a writable --out"
SHM = "RuntimeError: unable to write to file </torch_1_2>: No space left on device (28)"


@pytest.mark.parametrize(
    "status, message, free, refused",
    [
        ("error", "OSError: [Errno 28] No space left on device", 1000, True),
        ("error", SHM, 10**9, False),  # a full /dev/shm (a DataLoader worker's) is the trial's failure: a row
        ("crashed", f"trial process exited with code 1 and no result: {OURS}", 10**9, True),
        ("crashed", "trial process exited with code 1 and no result: ", 1000, True),
        ("crashed", "trial process exited with code 1 and no result: ", 10**9, False),
        ("error", "RuntimeError: injected fault at step 1", 1000, False),
        ("oom", "out of memory", 1000, False),
    ],
)
def test_a_trial_the_disk_refused_stops_the_study(tmp_path, monkeypatch, status, message, free, refused):
    """A trial the disk refused stops the study instead of becoming a row."""
    from trainwise.core import files
    from trainwise.study import run as study

    monkeypatch.setattr(files, "free_space", lambda _p: free)
    result = TrialResult("baseline", status, 0, message, {})
    if refused:
        with pytest.raises(OutputFailed, match=f" writing {tmp_path}"):
            study.refused(result, tmp_path)
    else:
        study.refused(result, tmp_path)


def test_out_removed_mid_study_stops_it_in_one_line(tmp_path, cls_csv):
    """A trial would recreate --out empty and the store would commit into the removed file: the study
    stops at the next trial instead, with exit 3's line."""
    import shutil

    from tests.conftest import tiny_study
    from trainwise.study.run import run_study

    study = tiny_study(tmp_path / "out", cls_csv, "classification", ["baseline", "bf16"], eval_samples=0)
    ran = []

    def launch(spec, trial_dir, timeout, on_event):
        ran.append(spec.row)
        shutil.rmtree(study.out)  # the user removes --out while the first trial runs
        return TrialResult(spec.row, "ok", spec.repeat, "", spec.plan.to_dict())

    with pytest.raises(OutputFailed, match="the directory was removed writing .*out; run the same command again"):
        run_study(study, launch, lambda *_: None, lambda *_: None)
    assert ran == ["baseline"] and not study.out.exists(), "nothing recreated, no further trial"


def test_an_unreadable_input_is_not_a_refused_write():
    """EACCES or a missing file met outside a write is the user's input (no exit 3 'writing' line)."""
    with pytest.raises(PermissionError):
        exit_line(PermissionError(errno.EACCES, "Permission denied", "/data/space.yaml"))
    with pytest.raises(FileNotFoundError):
        exit_line(FileNotFoundError(errno.ENOENT, "No such file or directory", "/gone/dir/f.png"))
    assert exit_line(OSError(errno.EROFS, "Read-only file system", "/ro/x"))[0].startswith("read-only file system")
