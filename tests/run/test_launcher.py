"""The process layer under the one child protocol (`launcher.run(job)` runs every child over `run_child`), which
starts a compare trial, a training run's ranks and a tune trial: events come back as they are printed, a child
past its timeout or stopped by its listener dies with everything it started, and a failure says why in one
line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.killing import alive_after
from trainwise.run.launcher import run_child

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _importable(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # `python -m tests.child` from any directory


def test_a_child_that_prints_events_and_exits_0(tmp_path):
    seen: list[dict] = []
    end = run_child("tests.child", ["events"], tmp_path / "log", seen.append, timeout_s=60)
    assert [e["step"] for e in seen] == [1, 2, 3]  # the stray print skipped
    assert (end.code, end.timed_out, end.stopped, end.killed_by) == (0, False, False, None)
    assert end.log == tmp_path / "log" and 0 < end.wall_s < 60


def test_a_timed_out_child_is_killed_with_all_it_started(tmp_path):
    started: list[int] = []
    t0 = time.perf_counter()
    end = run_child("tests.child", ["hang"], tmp_path / "log", lambda e: started.append(e["pid"]), timeout_s=1.5)
    assert end.timed_out and not end.stopped and end.code == -signal.SIGKILL
    assert end.killed_by == "SIGKILL"  # killed here: no guess about the out-of-memory killer
    assert 1.5 <= time.perf_counter() - t0 < 10
    assert started and alive_after([psutil.Process(started[0])]) == []  # the grandchild died with its group


def test_a_listener_returning_true_stops_the_child(tmp_path):
    seen: list[dict] = []

    def on_event(event: dict) -> bool:
        seen.append(event)
        return len(seen) == 3

    end = run_child("tests.child", ["chatty"], tmp_path / "log", on_event, timeout_s=60)
    assert end.stopped and not end.timed_out and end.code == -signal.SIGKILL and len(seen) == 3


def test_an_interrupted_launcher_kills_the_child_and_its_group(tmp_path):
    started: list[int] = []

    def on_event(event: dict) -> None:
        started.append(event["pid"])
        raise KeyboardInterrupt  # Ctrl-C while the child runs

    with pytest.raises(KeyboardInterrupt):
        run_child("tests.child", ["hang"], tmp_path / "log", on_event, timeout_s=60)
    assert started and alive_after([psutil.Process(started[0])]) == []


def test_a_failing_child_reports_its_exit_code_and_last_log_line(tmp_path):
    end = run_child("tests.child", ["fail"], tmp_path / "log", lambda e: None, timeout_s=60)
    assert (end.code, end.timed_out, end.killed_by) == (3, False, None)
    assert end.tail == "ValueError: the last line says why"


def test_an_outside_kill_names_the_signal_and_likely_sender(tmp_path):
    """A child killed from outside names the signal and who may have sent it."""
    end = run_child("tests.child", ["killed"], tmp_path / "log", lambda e: None, timeout_s=60)
    assert end.code == -signal.SIGKILL and not end.timed_out
    assert end.killed_by is not None and end.killed_by.startswith("SIGKILL (")
    assert "out-of-memory killer" in end.killed_by


def test_a_forked_child_has_the_callers_env_and_cwd(tmp_path, monkeypatch):
    """The zygote forks one-process children on Linux; each gets the environment and directory of the call
    (not the zygote's, which started earlier); TRAINWISE_FORK=0, or a zygote that cannot serve, execs."""
    from trainwise.run import zygote

    def where() -> dict:
        seen: list[dict] = []
        end = run_child("tests.child", ["where"], tmp_path / "log", seen.append, timeout_s=120)
        assert end.code == 0, (tmp_path / "log").read_text()
        return seen[0]

    monkeypatch.chdir(tmp_path)
    for value in ("first", "second"):  # set after the zygote started (by the first call) too
        monkeypatch.setenv("TW_TEST_VAR", value)
        assert where() == {"event": "where", "forked": True, "cwd": str(tmp_path), "var": value}
    monkeypatch.setenv("TRAINWISE_FORK", "0")
    assert where()["forked"] is False
    monkeypatch.delenv("TRAINWISE_FORK")

    def cannot(*_args, **_kw):
        raise zygote.Unavailable("the zygote is gone")

    monkeypatch.setattr(zygote, "spawn", cannot)
    assert where() == {"event": "where", "forked": False, "cwd": str(tmp_path), "var": "second"}


def test_a_warm_zygote_imports_early_and_a_probe_waits(tmp_path, monkeypatch):
    """`launcher.warm()` starts the zygote at once (its imports overlap the command's preparation) and returns
    without waiting; `settle()`, which every timed probe calls first, returns once it says it is ready."""
    from trainwise.run import launcher, zygote

    monkeypatch.setattr(zygote, "_zygote", None)  # this test's own, not one an earlier test started
    began = time.monotonic()
    launcher.warm()
    assert time.monotonic() - began < 2 and zygote._zygote is not None
    assert not zygote._zygote.ready.is_set()  # its imports take seconds: warm() did not wait for them
    zygote.settle()
    assert zygote._zygote.ready.is_set() and zygote._zygote.alive
    end = run_child("tests.child", ["where"], tmp_path / "log", lambda e: None, timeout_s=120)
    assert end.code == 0


def test_a_zygote_elsewhere_imports_from_the_callers_cwd(tmp_path, monkeypatch):
    """A zygote warmed early may start in another directory (a notebook's, a test's); its child runs
    `python -m module` as if exec'd from the caller's directory: that directory first on its path. The modules a
    command's trials import beyond every trial's (`also`: the text metrics'), asked at its start or of it running
    (`load`: a later command's), are imported in the zygote, once: its child finds them loaded; one not installed is
    left to the trial that imports it."""
    from trainwise.run import zygote

    started, caller = tmp_path / "started", tmp_path / "caller"
    started.mkdir(), caller.mkdir()
    (caller / "only_here.py").write_text(
        "import sys\nprint('imported from', __file__, *(m for m in ('sacrebleu', 'rouge_score.rouge_scorer') "
        "if m in sys.modules))\n"
    )
    monkeypatch.chdir(started)
    elsewhere = zygote.Zygote(also=("sacrebleu", "no_such_module_here"))
    elsewhere.load(("sacrebleu", "rouge_score.rouge_scorer"))  # a later command's: what it lacks, once running
    monkeypatch.chdir(caller)
    with open(tmp_path / "log", "w") as log:
        child = elsewhere.spawn("only_here", [], dict(os.environ), log)
        assert child.wait(timeout=120) == 0, (tmp_path / "log").read_text()
    said = child.stdout.read()
    assert str(caller / "only_here.py") in said and said.split()[-2:] == ["sacrebleu", "rouge_score.rouge_scorer"]


def test_the_text_metrics_are_preloaded_only_where_asked_and_scored(monkeypatch):
    """A study's zygote imports the text metrics only where TRAINWISE_PRELOAD_METRICS=1 (the suite's) and its trials
    score generated text: by default a forked trial's RSS holds only what it imports itself (BENCHMARKS §S4)."""
    from trainwise.training.data.metrics import PRELOAD_ENV, TEXT_METRIC_MODULES, preloaded

    monkeypatch.delenv(PRELOAD_ENV, raising=False)
    assert preloaded("seq2seq", 16) == ()
    monkeypatch.setenv(PRELOAD_ENV, "1")
    assert preloaded("seq2seq", 16) == preloaded("causal-lm", 4) == TEXT_METRIC_MODULES
    assert preloaded("classification", 16) == preloaded("seq2seq", 0) == preloaded("image-classification", 8) == ()


def test_a_zygote_that_never_reads_is_unavailable_at_once(tmp_path):
    """A zygote that refuses to serve (CUDA initialised by an import: it returns before its first read) resets
    the connection under the caller's request; the caller must see it gone, not wait for a fork (on an H200
    a doctor waited so until it was killed)."""
    from trainwise.run import zygote

    gone = zygote.Zygote([sys.executable, "-c", "import sys, time; time.sleep(1)"])  # never reads the socket
    began = time.monotonic()
    with open(tmp_path / "log", "w") as log, pytest.raises(zygote.Unavailable, match="gone"):
        gone.spawn("tests.child", ["where"], dict(os.environ), log)
    assert time.monotonic() - began < 60


def test_a_zygote_whose_command_ended_with_messages_unread_ends_quietly():
    """A command interrupted as a trial ended closes its end with the zygote's last message unread: the zygote's
    next read is reset (ECONNRESET), its next send refused (EPIPE). Either is the command gone: the zygote returns,
    where it printed a ConnectionResetError traceback under an interrupted `make demo`'s line."""
    import socket

    from trainwise.run import zygote

    for unread in (True, False):
        theirs, ours = socket.socketpair()
        if unread:
            ours.sendall(b"a reply the command never read")
        theirs.close()
        zygote._serve(ours)  # returns (raised ConnectionResetError before)
        ours.close()
    theirs, ours = socket.socketpair()
    theirs.close()
    assert zygote._told(ours, {"pid": 1}) is False
    ours.close()


# ---- ranks on one machine: forked from the zygote as torchrun would start them -------------------------------
def _pids(events: list[dict]) -> list[psutil.Process]:
    return [psutil.Process(e["pid"]) for e in events if "pid" in e]


def test_ranks_fork_with_torchruns_env_and_thread_count(tmp_path, monkeypatch):
    """Each rank has its place, one store port for all and `forked` in its env record; OMP_NUM_THREADS set
    for this call sizes torch's pool though OpenMP read the zygote's environment (two values: at least one
    differs from what the zygote started with)."""
    for threads in (3, 1):
        monkeypatch.setenv("OMP_NUM_THREADS", str(threads))
        seen: list[dict] = []
        end = run_child("tests.child", ["rank"], tmp_path / "log", seen.append, ranks=2, timeout_s=120)
        assert end.code == 0, (tmp_path / "log").read_text()
        assert sorted((e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"]) for e in seen) == [("0", "0", "2"), ("1", "1", "2")]
        assert len({e["MASTER_PORT"] for e in seen}) == 1 and seen[0]["MASTER_ADDR"] == "127.0.0.1"
        assert [(e["threads"], e["forked"], e["agent_store"]) for e in seen] == [(threads, True, None)] * 2


def test_a_signalled_rank_ends_its_group_and_says_which(tmp_path):
    """A rank killed by a signal ends its group at once and says which."""
    waiting: list[psutil.Process] = []
    t0 = time.perf_counter()
    end = run_child("tests.child", ["rank1-killed"], tmp_path / "log", lambda e: waiting.extend(_pids([e])), ranks=2)
    assert time.perf_counter() - t0 < 30  # not the other rank's 600 s wait
    assert end.code == -signal.SIGKILL and not end.timed_out and end.killed_by.startswith("SIGKILL (")
    assert end.tail == "rank 1: exit code -9 (SIGKILL)"
    assert waiting and alive_after(waiting) == []  # rank 0, waiting as in a collective, was killed


def test_a_failing_rank_is_named_by_its_own_exception(tmp_path):
    end = run_child("tests.child", ["rank1-fails"], tmp_path / "log", lambda e: None, ranks=2, timeout_s=60)
    assert (end.code, end.timed_out, end.killed_by) == (1, False, None)
    assert end.tail == "RuntimeError: rank 1 broke"
    assert "[rank1]:RuntimeError: rank 1 broke" in (tmp_path / "log").read_text()


def test_a_rank_group_past_its_timeout_is_killed_entirely(tmp_path):
    run_child("tests.child", ["events"], tmp_path / "log", lambda e: None)  # the zygote started: not in the timeout
    waiting: list[psutil.Process] = []
    on_event = lambda e: waiting.extend(_pids([e]))  # noqa: E731
    end = run_child("tests.child", ["ranks-hang"], tmp_path / "log", on_event, ranks=2, timeout_s=4)
    assert end.timed_out and end.code == -signal.SIGKILL
    assert len(waiting) == 2 and alive_after(waiting, within=2) == []


def test_ranks_run_under_torchrun_with_trainwise_fork_0(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINWISE_FORK", "0")
    seen: list[dict] = []
    end = run_child("tests.child", ["rank"], tmp_path / "log", seen.append, ranks=2, timeout_s=180)
    assert end.code == 0, (tmp_path / "log").read_text()
    assert sorted(e["RANK"] for e in seen) == ["0", "1"] and not any(e["forked"] for e in seen)
    assert all(e["agent_store"] is not None for e in seen)  # torchrun's agent says whether ranks use its store


def test_a_child_not_yet_leading_its_group_is_still_killed():
    """A deadline that passed while a cold zygote imported kills a trial forked a moment before, which may not
    have made its session yet: the group kill finds no group, and the child itself must die (a hanging trial
    was once waited for, for ever: `tune --trial-timeout 0.5` with a cold zygote)."""
    import threading

    from trainwise.run.launcher import _kill_group

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # in this test's group
    killer = threading.Thread(target=_kill_group, args=(child,), daemon=True)
    killer.start()
    killer.join(timeout=30)
    alive = killer.is_alive()
    if alive:
        child.kill()
    assert not alive and child.returncode == -signal.SIGKILL


def test_a_forked_child_sees_the_callers_pythonpath(tmp_path, monkeypatch):
    """A zygote started earlier, elsewhere and without the caller's PYTHONPATH (another test's, a notebook's): a
    forked child still imports a module only that path holds, as an exec'd one would (a fresh clone's suite failed
    so when its zygote was first started from a test's directory)."""
    from trainwise.run import zygote

    monkeypatch.setattr(zygote, "_zygote", None)  # a zygote of this test's own
    monkeypatch.delenv("PYTHONPATH")
    monkeypatch.chdir(tmp_path)
    zygote.warm()
    zygote.settle()
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    seen: list[dict] = []
    try:
        end = run_child("tests.child", ["where"], tmp_path / "log", seen.append, timeout_s=120)
        assert end.code == 0, (tmp_path / "log").read_text()
        assert seen[0]["forked"] is True
    finally:
        if zygote._zygote is not None:
            zygote._zygote.proc.kill()
